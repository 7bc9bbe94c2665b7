//! `mlxcel-emit`: a small typed builder for StableHLO text. Values carry
//! their element type and static shape, every op checks its operands, and
//! the first shape error is reported by [`Module::finish`] with the op that
//! caused it, so a malformed graph is caught while it is being built rather
//! than by the compiler. [`contract`] holds the numeric contract: the
//! versioned description of where values are materialised and accumulated,
//! with helpers for the operations whose rounding matters.

#![forbid(unsafe_code)]

pub mod contract;
mod ops;

use std::fmt;

pub use contract::{
    AffineWeight, Bf16Dot, CONTRACT_VERSION, ContractDescriptor, NumericContract, PAIRS_BLOCK_INPUTS,
    QLINEAR_FUSED_MAX_ROWS, RmsStyle, Rows, TILED_KEY_SEPARATOR, Tiles, WEIGHT_TILE_ROWS, weight_tile_rows,
};
pub use ops::{Compare, Reduce};

/// Element types the builder emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Elem {
    F32,
    BF16,
    F16,
    I64,
    I32,
    /// Booleans (comparison results).
    I1,
    /// Signless 4- and 8-bit integers: how a module declares MLX's packed quantized weights
    /// (the bytes of a `uint32` word array read as 8 four-bit or 4 eight-bit values, least
    /// significant first, which is IREE's packing of sub-byte elements).
    I4,
    I8,
    /// Unsigned views of the above (`bitcast_convert` from them), so `convert` zero-extends.
    U4,
    U8,
}

impl Elem {
    pub fn mlir(self) -> &'static str {
        match self {
            Elem::F32 => "f32",
            Elem::BF16 => "bf16",
            Elem::F16 => "f16",
            Elem::I64 => "i64",
            Elem::I32 => "i32",
            Elem::I1 => "i1",
            Elem::I4 => "i4",
            Elem::I8 => "i8",
            Elem::U4 => "ui4",
            Elem::U8 => "ui8",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::BF16 | Elem::F16)
    }

    /// Bits per element.
    pub fn bits(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 32,
            Elem::BF16 | Elem::F16 => 16,
            Elem::I64 => 64,
            Elem::I1 => 1,
            Elem::I4 | Elem::U4 => 4,
            Elem::I8 | Elem::U8 => 8,
        }
    }

    /// Parses a safetensors dtype name (`F32`, `BF16`, ...).
    pub fn from_safetensors(s: &str) -> Option<Elem> {
        Some(match s {
            "F32" => Elem::F32,
            "BF16" => Elem::BF16,
            "F16" => Elem::F16,
            "I64" => Elem::I64,
            "I32" => Elem::I32,
            "BOOL" => Elem::I1,
            _ => return None,
        })
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mlir())
    }
}

/// A ranked tensor type with a static shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Type {
    pub elem: Elem,
    pub shape: Vec<usize>,
}

impl Type {
    pub fn new(elem: Elem, shape: &[usize]) -> Self {
        Type { elem, shape: shape.to_vec() }
    }

    pub fn scalar(elem: Elem) -> Self {
        Type { elem, shape: Vec::new() }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn with_elem(&self, elem: Elem) -> Self {
        Type { elem, shape: self.shape.clone() }
    }

    pub fn with_shape(&self, shape: &[usize]) -> Self {
        Type { elem: self.elem, shape: shape.to_vec() }
    }

    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tensor<")?;
        for d in &self.shape {
            write!(f, "{d}x")?;
        }
        write!(f, "{}>", self.elem)
    }
}

/// An SSA value inside a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    id: u32,
    ty: Type,
}

impl Value {
    pub fn ty(&self) -> &Type {
        &self.ty
    }

    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    pub fn elem(&self) -> Elem {
        self.ty.elem
    }

    fn name(&self) -> String {
        format!("%v{}", self.id)
    }
}

/// A module-level global: a named parameter or mutable state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Global {
    symbol: String,
    ty: Type,
    mutable: bool,
}

impl Global {
    pub fn ty(&self) -> &Type {
        &self.ty
    }
}

/// The first error found while building.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("emitting {func}: {op}: {message}")]
pub struct EmitError {
    pub func: String,
    pub op: String,
    pub message: String,
}

/// A parameter the module reads, by checkpoint key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamUse {
    pub key: String,
    pub ty: Type,
}

/// A module under construction.
#[derive(Debug)]
pub struct Module {
    name: String,
    globals: Vec<String>,
    params: Vec<ParamUse>,
    funcs: Vec<String>,
    error: Option<EmitError>,
    next_global: u32,
}

impl Module {
    pub fn new(name: &str) -> Self {
        Module {
            name: name.to_owned(),
            globals: Vec::new(),
            params: Vec::new(),
            funcs: Vec::new(),
            error: None,
            next_global: 0,
        }
    }

    /// Declares a weight read from the checkpoint by `key` (IREE parameter
    /// scope `model`). Declaring the same key twice returns one global.
    pub fn param(&mut self, key: &str, ty: Type) -> Global {
        if let Some(i) = self.params.iter().position(|p| p.key == key) {
            if self.params[i].ty != ty && self.error.is_none() {
                self.error = Some(EmitError {
                    func: "<module>".into(),
                    op: "param".into(),
                    message: format!("{key:?} declared as {} and as {ty}", self.params[i].ty),
                });
            }
            return Global { symbol: format!("p{i}"), ty, mutable: false };
        }
        let symbol = format!("p{}", self.params.len());
        self.globals.push(format!(
            "  util.global private @{symbol} = #flow.parameter.named<\"model\"::\"{}\"> : {ty}",
            key.replace('"', "\\\"")
        ));
        self.params.push(ParamUse { key: key.to_owned(), ty: ty.clone() });
        Global { symbol, ty, mutable: false }
    }

    /// Declares mutable state initialised to `init` everywhere. Each state
    /// global gets a distinct initialiser (`init` plus a tiny offset per
    /// global) because IREE 3.13 fuses identically initialised globals that
    /// only `dynamic_update_slice` writes; prefer one packed global anyway.
    pub fn state(&mut self, name: &str, ty: Type, init: f64) -> Global {
        let n = self.next_global;
        self.next_global += 1;
        let symbol = format!("s{n}_{name}");
        let value =
            if ty.elem.is_float() { format!("{:.17e}", init + (n as f64) * 1e-30) } else { format!("{}", init as i64) };
        self.globals.push(format!("  util.global private mutable @{symbol} = dense<{value}> : {ty}"));
        Global { symbol, ty, mutable: true }
    }

    /// The parameters declared so far.
    pub fn params(&self) -> &[ParamUse] {
        &self.params
    }

    /// Starts a public function with the given argument types.
    pub fn func(&self, name: &str, args: &[Type]) -> (Func, Vec<Value>) {
        let values: Vec<Value> = args.iter().enumerate().map(|(i, t)| Value { id: i as u32, ty: t.clone() }).collect();
        let f =
            Func { name: name.to_owned(), args: args.to_vec(), body: Vec::new(), next: args.len() as u32, error: None };
        (f, values)
    }

    /// Adds a finished function returning `results`.
    pub fn add_func(&mut self, mut f: Func, results: &[Value]) {
        if let Some(e) = f.error.take() {
            self.error.get_or_insert(e);
            return;
        }
        let args: Vec<String> = f.args.iter().enumerate().map(|(i, t)| format!("%v{i}: {t}")).collect();
        let rtypes: Vec<String> = results.iter().map(|v| v.ty.to_string()).collect();
        let mut text = format!("  func.func @{}({}) -> ({}) {{\n", f.name, args.join(", "), rtypes.join(", "));
        for line in &f.body {
            text.push_str("    ");
            text.push_str(line);
            text.push('\n');
        }
        if results.is_empty() {
            text.push_str("    return\n  }\n");
        } else {
            let names: Vec<String> = results.iter().map(Value::name).collect();
            text.push_str(&format!("    return {} : {}\n  }}\n", names.join(", "), rtypes.join(", ")));
        }
        self.funcs.push(text);
    }

    /// The module's MLIR text, or the first error.
    pub fn finish(self) -> Result<String, EmitError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let mut out = format!("module @{} {{\n", self.name);
        for g in &self.globals {
            out.push_str(g);
            out.push('\n');
        }
        for f in &self.funcs {
            out.push_str(f);
        }
        out.push_str("}\n");
        Ok(out)
    }
}

/// A function body under construction. Ops append lines and return typed
/// values; after the first error every op is a no-op returning a placeholder.
#[derive(Debug)]
pub struct Func {
    name: String,
    args: Vec<Type>,
    body: Vec<String>,
    next: u32,
    error: Option<EmitError>,
}

impl Func {
    fn fresh(&mut self, ty: Type) -> Value {
        let v = Value { id: self.next, ty };
        self.next += 1;
        v
    }

    /// Emits `line` (with `{out}` replaced by the result name) for a result of `ty`.
    fn emit(&mut self, ty: Type, line: String) -> Value {
        let v = self.fresh(ty);
        if self.error.is_none() {
            self.body.push(format!("{} = {line}", v.name()));
        }
        v
    }

    fn fail(&mut self, op: &str, message: String, ty: Type) -> Value {
        if self.error.is_none() {
            self.error = Some(EmitError { func: self.name.clone(), op: op.to_owned(), message });
        }
        self.fresh(ty)
    }

    /// Whether an error has been recorded.
    pub fn failed(&self) -> bool {
        self.error.is_some()
    }

    /// Reads a global.
    pub fn load(&mut self, g: &Global) -> Value {
        self.emit(g.ty.clone(), format!("util.global.load @{} : {}", g.symbol, g.ty))
    }

    /// Writes mutable state.
    pub fn store(&mut self, g: &Global, v: &Value) {
        if !g.mutable {
            self.fail("store", format!("@{} is not mutable", g.symbol), g.ty.clone());
            return;
        }
        if v.ty != g.ty {
            self.fail("store", format!("{} into @{} of {}", v.ty, g.symbol, g.ty), g.ty.clone());
            return;
        }
        if self.error.is_none() {
            self.body.push(format!("util.global.store {}, @{} : {}", v.name(), g.symbol, g.ty));
        }
    }
}

#[cfg(test)]
mod tests;
