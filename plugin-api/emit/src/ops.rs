//! The StableHLO operations, each checking its operands' types and shapes.

use crate::{Elem, Func, Type, Value};

/// Comparison directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compare {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// Reductions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Max,
}

fn list(xs: &[usize]) -> String {
    xs.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")
}

/// Formats a float so MLIR parses it back to the same f32/f64.
fn float_literal(x: f64) -> String {
    if x.is_nan() {
        "0x7FC00000".into()
    } else if x.is_infinite() {
        if x > 0.0 { "0x7F800000".into() } else { "0xFF800000".into() }
    } else {
        // MLIR float literals need a decimal point; 17 digits round-trip f64.
        format!("{x:.17e}")
    }
}

impl Func {
    /// A tensor of `ty` filled with `x`.
    pub fn splat(&mut self, ty: &Type, x: f64) -> Value {
        let lit = if ty.elem.is_float() {
            // Infinities need the hex form at the element's width.
            match (ty.elem, x.is_infinite()) {
                (Elem::F32, _) => float_literal(x),
                (_, false) => float_literal(x),
                (Elem::BF16, true) => (if x > 0.0 { "0x7F80" } else { "0xFF80" }).into(),
                (_, true) => (if x > 0.0 { "0x7C00" } else { "0xFC00" }).into(),
            }
        } else if ty.elem == Elem::I1 {
            (if x != 0.0 { "true" } else { "false" }).into()
        } else {
            format!("{}", x as i64)
        };
        self.emit(ty.clone(), format!("stablehlo.constant dense<{lit}> : {ty}"))
    }

    /// A constant f32 tensor from `data` (row-major).
    pub fn constant_f32(&mut self, shape: &[usize], data: &[f32]) -> Value {
        let ty = Type::new(Elem::F32, shape);
        if ty.elements() != data.len() {
            return self.fail("constant", format!("{} values for {ty}", data.len()), ty);
        }
        // Hex is exact: the constant is bit-for-bit what was computed. A
        // scalar takes a hex literal, anything else the raw little-endian buffer.
        let lit = if shape.is_empty() {
            format!("0x{:08X}", data[0].to_bits())
        } else {
            format!("\"0x{}\"", data.iter().map(|x| hex_le(x.to_bits())).collect::<String>())
        };
        self.emit(ty.clone(), format!("stablehlo.constant dense<{lit}> : {ty}"))
    }

    /// Counts 0, 1, ... along `dim`.
    pub fn iota(&mut self, ty: &Type, dim: usize) -> Value {
        if dim >= ty.rank() {
            return self.fail("iota", format!("dim {dim} of {ty}"), ty.clone());
        }
        self.emit(ty.clone(), format!("stablehlo.iota dim = {dim} : {ty}"))
    }

    fn unary(&mut self, op: &str, x: &Value) -> Value {
        if !x.ty.elem.is_float() && op != "negate" {
            return self.fail(op, format!("needs a float operand, got {}", x.ty), x.ty.clone());
        }
        self.emit(x.ty.clone(), format!("stablehlo.{op} {} : {}", x.name(), x.ty))
    }

    pub fn exp(&mut self, x: &Value) -> Value {
        self.unary("exponential", x)
    }
    pub fn rsqrt(&mut self, x: &Value) -> Value {
        self.unary("rsqrt", x)
    }
    pub fn sqrt(&mut self, x: &Value) -> Value {
        self.unary("sqrt", x)
    }
    pub fn logistic(&mut self, x: &Value) -> Value {
        self.unary("logistic", x)
    }
    pub fn tanh(&mut self, x: &Value) -> Value {
        self.unary("tanh", x)
    }
    pub fn cos(&mut self, x: &Value) -> Value {
        self.unary("cosine", x)
    }
    pub fn sin(&mut self, x: &Value) -> Value {
        self.unary("sine", x)
    }
    pub fn neg(&mut self, x: &Value) -> Value {
        self.unary("negate", x)
    }
    /// To the nearest integer, ties to even.
    pub fn round_even(&mut self, x: &Value) -> Value {
        self.unary("round_nearest_even", x)
    }
    pub fn abs(&mut self, x: &Value) -> Value {
        self.unary("abs", x)
    }

    fn binary(&mut self, op: &str, a: &Value, b: &Value) -> Value {
        if a.ty != b.ty {
            return self.fail(op, format!("operands differ: {} and {}", a.ty, b.ty), a.ty.clone());
        }
        self.emit(a.ty.clone(), format!("stablehlo.{op} {}, {} : {}", a.name(), b.name(), a.ty))
    }

    pub fn add(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("add", a, b)
    }
    pub fn sub(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("subtract", a, b)
    }
    pub fn mul(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("multiply", a, b)
    }
    /// Bitwise and of integers.
    pub fn and(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("and", a, b)
    }
    /// `a >> b`, shifting zeros in.
    pub fn shift_right_logical(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("shift_right_logical", a, b)
    }
    /// `a >> b`, shifting the sign in.
    pub fn shift_right_arithmetic(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("shift_right_arithmetic", a, b)
    }
    pub fn div(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("divide", a, b)
    }

    /// `a * b + c` rounded once (a fused multiply-add), elementwise over floats of one type.
    /// StableHLO has no such operation, and a multiply then an add round twice, so it is said
    /// as `math.fma` in a `linalg.map`, which the CPU backend lowers to the FMA instruction.
    pub fn fma(&mut self, a: &Value, b: &Value, c: &Value) -> Value {
        if a.ty != b.ty || a.ty != c.ty || !a.ty.elem.is_float() {
            return self.fail("fma", format!("{}, {}, {}", a.ty, b.ty, c.ty), a.ty.clone());
        }
        let init = self.splat(&a.ty, 0.0);
        let t = &a.ty;
        self.emit(
            t.clone(),
            format!(
                "linalg.map {{ math.fma }} ins({}, {}, {} : {t}, {t}, {t}) outs({} : {t})",
                a.name(),
                b.name(),
                c.name(),
                init.name()
            ),
        )
    }
    pub fn max(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("maximum", a, b)
    }
    pub fn min(&mut self, a: &Value, b: &Value) -> Value {
        self.binary("minimum", a, b)
    }

    /// Elementwise comparison, giving booleans.
    pub fn compare(&mut self, dir: Compare, a: &Value, b: &Value) -> Value {
        let out = a.ty.with_elem(Elem::I1);
        if a.ty != b.ty {
            return self.fail("compare", format!("operands differ: {} and {}", a.ty, b.ty), out);
        }
        let d = match dir {
            Compare::Eq => "EQ",
            Compare::Ne => "NE",
            Compare::Lt => "LT",
            Compare::Le => "LE",
            Compare::Gt => "GT",
            Compare::Ge => "GE",
        };
        self.emit(
            out.clone(),
            format!("stablehlo.compare {d}, {}, {} : ({}, {}) -> {out}", a.name(), b.name(), a.ty, b.ty),
        )
    }

    /// `pred ? a : b`, elementwise.
    pub fn select(&mut self, pred: &Value, a: &Value, b: &Value) -> Value {
        if pred.ty != a.ty.with_elem(Elem::I1) || a.ty != b.ty {
            return self.fail("select", format!("{}, {}, {}", pred.ty, a.ty, b.ty), a.ty.clone());
        }
        self.emit(
            a.ty.clone(),
            format!("stablehlo.select {}, {}, {} : {}, {}", pred.name(), a.name(), b.name(), pred.ty, a.ty),
        )
    }

    /// Converts the element type (rounding to nearest even for floats).
    pub fn convert(&mut self, x: &Value, elem: Elem) -> Value {
        if x.ty.elem == elem {
            return x.clone();
        }
        let out = x.ty.with_elem(elem);
        self.emit(out.clone(), format!("stablehlo.convert {} : ({}) -> {out}", x.name(), x.ty))
    }

    /// Reinterprets the bits of each element as `elem` of the same width (`i4` as `ui4`).
    pub fn bitcast_convert(&mut self, x: &Value, elem: Elem) -> Value {
        let out = x.ty.with_elem(elem);
        if x.ty.elem.bits() != elem.bits() {
            return self.fail("bitcast_convert", format!("{} to {elem}: widths differ", x.ty), out);
        }
        self.emit(out.clone(), format!("stablehlo.bitcast_convert {} : ({}) -> {out}", x.name(), x.ty))
    }

    /// Broadcasts `x` into `shape`, operand dim i going to `dims[i]`.
    pub fn broadcast(&mut self, x: &Value, shape: &[usize], dims: &[usize]) -> Value {
        let out = x.ty.with_shape(shape);
        let ok = dims.len() == x.ty.rank()
            && dims.windows(2).all(|w| w[0] < w[1])
            && dims.iter().zip(&x.ty.shape).all(|(&d, &n)| d < shape.len() && (n == 1 || n == shape[d]));
        if !ok {
            return self.fail("broadcast_in_dim", format!("{} to {shape:?} with dims {dims:?}", x.ty), out);
        }
        self.emit(
            out.clone(),
            format!("stablehlo.broadcast_in_dim {}, dims = [{}] : ({}) -> {out}", x.name(), list(dims), x.ty),
        )
    }

    /// Broadcasts `x` to `shape` by aligning trailing dimensions (numpy style).
    pub fn broadcast_to(&mut self, x: &Value, shape: &[usize]) -> Value {
        if x.ty.rank() > shape.len() {
            return self.fail("broadcast_to", format!("{} to {shape:?}", x.ty), x.ty.with_shape(shape));
        }
        let offset = shape.len() - x.ty.rank();
        let dims: Vec<usize> = (offset..shape.len()).collect();
        if x.ty.shape == shape {
            return x.clone();
        }
        self.broadcast(x, shape, &dims)
    }

    pub fn reshape(&mut self, x: &Value, shape: &[usize]) -> Value {
        let out = x.ty.with_shape(shape);
        if out.elements() != x.ty.elements() {
            return self.fail("reshape", format!("{} to {shape:?}", x.ty), out);
        }
        if out == x.ty {
            return x.clone();
        }
        self.emit(out.clone(), format!("stablehlo.reshape {} : ({}) -> {out}", x.name(), x.ty))
    }

    /// Permutes dimensions: result dim i is operand dim `perm[i]`.
    pub fn transpose(&mut self, x: &Value, perm: &[usize]) -> Value {
        let mut sorted = perm.to_vec();
        sorted.sort();
        if sorted != (0..x.ty.rank()).collect::<Vec<_>>() {
            return self.fail("transpose", format!("{} by {perm:?}", x.ty), x.ty.clone());
        }
        let shape: Vec<usize> = perm.iter().map(|&p| x.ty.shape[p]).collect();
        let out = x.ty.with_shape(&shape);
        self.emit(
            out.clone(),
            format!("stablehlo.transpose {}, dims = [{}] : ({}) -> {out}", x.name(), list(perm), x.ty),
        )
    }

    /// Static slice `[start, limit)` per dimension, stride 1.
    pub fn slice(&mut self, x: &Value, start: &[usize], limit: &[usize]) -> Value {
        let ok = start.len() == x.ty.rank()
            && limit.len() == x.ty.rank()
            && start.iter().zip(limit).zip(&x.ty.shape).all(|((s, l), n)| s <= l && l <= n);
        let shape: Vec<usize> = start.iter().zip(limit).map(|(s, l)| l.saturating_sub(*s)).collect();
        let out = x.ty.with_shape(&shape);
        if !ok {
            return self.fail("slice", format!("{} [{start:?}, {limit:?})", x.ty), out);
        }
        let ranges: Vec<String> = start.iter().zip(limit).map(|(s, l)| format!("{s}:{l}")).collect();
        self.emit(out.clone(), format!("stablehlo.slice {} [{}] : ({}) -> {out}", x.name(), ranges.join(", "), x.ty))
    }

    /// Each element of a rank-1 `x`, as a rank-0 value (runtime indices from an argument).
    pub fn scalars(&mut self, x: &Value) -> Vec<Value> {
        if x.ty.rank() != 1 {
            self.fail("scalars", format!("{} is not rank 1", x.ty), Type::scalar(x.ty.elem));
            return Vec::new();
        }
        (0..x.ty.shape[0])
            .map(|i| {
                let one = self.slice(x, &[i], &[i + 1]);
                self.reshape(&one, &[])
            })
            .collect()
    }

    fn check_indices(&mut self, op: &str, x: &Value, indices: &[Value]) -> bool {
        if indices.len() != x.ty.rank() || indices.iter().any(|i| i.ty != Type::scalar(Elem::I32)) {
            self.fail(op, format!("{} indices for {}; each must be tensor<i32>", indices.len(), x.ty), x.ty.clone());
            return false;
        }
        true
    }

    /// A `sizes` window of `x` starting at runtime `indices` (clamped in range).
    pub fn dynamic_slice(&mut self, x: &Value, indices: &[Value], sizes: &[usize]) -> Value {
        let out = x.ty.with_shape(sizes);
        if !self.check_indices("dynamic_slice", x, indices) {
            return self.fresh(out);
        }
        if sizes.len() != x.ty.rank() || sizes.iter().zip(&x.ty.shape).any(|(s, n)| s > n) {
            return self.fail("dynamic_slice", format!("sizes {sizes:?} of {}", x.ty), out);
        }
        let idx: Vec<String> = indices.iter().map(Value::name).collect();
        let itys = vec!["tensor<i32>"; indices.len()].join(", ");
        self.emit(
            out.clone(),
            format!(
                "stablehlo.dynamic_slice {}, {}, sizes = [{}] : ({}, {itys}) -> {out}",
                x.name(),
                idx.join(", "),
                list(sizes),
                x.ty
            ),
        )
    }

    /// `x` with `update` written at runtime `indices` (clamped in range).
    pub fn dynamic_update_slice(&mut self, x: &Value, update: &Value, indices: &[Value]) -> Value {
        if !self.check_indices("dynamic_update_slice", x, indices) {
            return self.fresh(x.ty.clone());
        }
        let ok = update.ty.elem == x.ty.elem
            && update.ty.rank() == x.ty.rank()
            && update.ty.shape.iter().zip(&x.ty.shape).all(|(u, n)| u <= n);
        if !ok {
            return self.fail("dynamic_update_slice", format!("{} into {}", update.ty, x.ty), x.ty.clone());
        }
        let idx: Vec<String> = indices.iter().map(Value::name).collect();
        let itys = vec!["tensor<i32>"; indices.len()].join(", ");
        self.emit(
            x.ty.clone(),
            format!(
                "stablehlo.dynamic_update_slice {}, {}, {} : ({}, {}, {itys}) -> {}",
                x.name(),
                update.name(),
                idx.join(", "),
                x.ty,
                update.ty,
                x.ty
            ),
        )
    }

    /// Joins tensors along `dim`.
    pub fn concat(&mut self, xs: &[Value], dim: usize) -> Value {
        let Some(first) = xs.first() else {
            return self.fail("concatenate", "no operands".into(), Type::scalar(Elem::F32));
        };
        let mut shape = first.ty.shape.clone();
        if dim >= shape.len() {
            return self.fail("concatenate", format!("dim {dim} of {}", first.ty), first.ty.clone());
        }
        for x in &xs[1..] {
            let same_elsewhere = x.ty.rank() == shape.len()
                && x.ty.elem == first.ty.elem
                && x.ty.shape.iter().zip(&first.ty.shape).enumerate().all(|(i, (a, b))| i == dim || a == b);
            if !same_elsewhere {
                return self.fail("concatenate", format!("{} with {}", first.ty, x.ty), first.ty.clone());
            }
            shape[dim] += x.ty.shape[dim];
        }
        let out = first.ty.with_shape(&shape);
        let names: Vec<String> = xs.iter().map(Value::name).collect();
        let tys: Vec<String> = xs.iter().map(|x| x.ty.to_string()).collect();
        self.emit(
            out.clone(),
            format!("stablehlo.concatenate {}, dim = {dim} : ({}) -> {out}", names.join(", "), tys.join(", ")),
        )
    }

    /// `dot_general`: result dims are the batch dims, then `a`'s free dims,
    /// then `b`'s. The result element type is `a`'s (both must agree);
    /// accumulation precision is the numeric contract's business.
    pub fn dot_general(
        &mut self,
        a: &Value,
        b: &Value,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
    ) -> Value {
        self.dot_general_to(a, b, batch, contract, a.ty.elem)
    }

    /// [`Func::dot_general`] with a result of element type `out`: operands of one float type
    /// narrower than `out` are widened to it inside the contraction, which is how IREE lowers
    /// it (`arith.extf` of each operand in the `linalg` body), so it computes what converting
    /// both operands first computes. Said in the operation, the widening stays inside the
    /// contraction's dispatch: a converted operand can otherwise be written out whole first
    /// (a bf16 KV cache read as f32 each decode step).
    pub fn dot_general_to(
        &mut self,
        a: &Value,
        b: &Value,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
        out_elem: Elem,
    ) -> Value {
        let dims_ok = batch.0.len() == batch.1.len()
            && contract.0.len() == contract.1.len()
            && batch.0.iter().chain(contract.0).all(|&d| d < a.ty.rank())
            && batch.1.iter().chain(contract.1).all(|&d| d < b.ty.rank())
            && batch.0.iter().zip(batch.1).all(|(&i, &j)| a.ty.shape[i] == b.ty.shape[j])
            && contract.0.iter().zip(contract.1).all(|(&i, &j)| a.ty.shape[i] == b.ty.shape[j]);
        let mut shape: Vec<usize> = batch.0.iter().map(|&d| a.ty.shape[d]).collect();
        if dims_ok {
            let free = |t: &Type, used: &[usize]| -> Vec<usize> {
                (0..t.rank()).filter(|d| !used.contains(d)).map(|d| t.shape[d]).collect()
            };
            let used_a: Vec<usize> = batch.0.iter().chain(contract.0).copied().collect();
            let used_b: Vec<usize> = batch.1.iter().chain(contract.1).copied().collect();
            shape.extend(free(&a.ty, &used_a));
            shape.extend(free(&b.ty, &used_b));
        }
        let out = Type::new(out_elem, &shape);
        let widening_ok = out_elem == a.ty.elem
            || (a.ty.elem.is_float() && out_elem.is_float() && out_elem.bits() > a.ty.elem.bits());
        if !dims_ok || a.ty.elem != b.ty.elem || !widening_ok {
            return self.fail(
                "dot_general",
                format!("{} . {} -> {out_elem} with batch {batch:?} contracting {contract:?}", a.ty, b.ty),
                out,
            );
        }
        let batching = if batch.0.is_empty() {
            String::new()
        } else {
            format!("batching_dims = [{}] x [{}], ", list(batch.0), list(batch.1))
        };
        self.emit(
            out.clone(),
            format!(
                "stablehlo.dot_general {}, {}, {batching}contracting_dims = [{}] x [{}] : ({}, {}) -> {out}",
                a.name(),
                b.name(),
                list(contract.0),
                list(contract.1),
                a.ty,
                b.ty
            ),
        )
    }

    /// `linalg.mmt4d`: `lhs [m1, k1, m0, k0]` times `rhs [n1, k1, n0, k0]` into
    /// `[m1, n1, m0, n0]` in `acc`, each operand widened to it inside the operation (so a 16-bit
    /// `rhs` is read as it is stored). One of the two linalg operations a graph emits (the other is
    /// [`Func::fma`]'s): StableHLO has no contraction over pre-tiled operands, and IREE compiles
    /// `linalg.mmt4d` with its tile-by-tile codegen (one vector lane per output column), or its
    /// mmt4d microkernel where a module enables it.
    pub fn mmt4d(&mut self, lhs: &Value, rhs: &Value, acc: Elem) -> Value {
        let (a, b) = (&lhs.ty.shape, &rhs.ty.shape);
        let shape = match (a.as_slice(), b.as_slice()) {
            (&[m1, _, m0, _], &[n1, _, n0, _]) => vec![m1, n1, m0, n0],
            _ => vec![],
        };
        let out = Type::new(acc, &shape);
        let fits = shape.len() == 4 && a[1] == b[1] && a[3] == b[3];
        let widens =
            [lhs.ty.elem, rhs.ty.elem].iter().all(|e| e.is_float() && e.bits() <= acc.bits()) && acc.is_float();
        if !fits || !widens {
            return self.fail("mmt4d", format!("{} . {} into {acc}", lhs.ty, rhs.ty), out);
        }
        let init = self.splat(&out, 0.0);
        self.emit(
            out.clone(),
            format!(
                "linalg.mmt4d ins({}, {} : {}, {}) outs({} : {out}) -> {out}",
                lhs.name(),
                rhs.name(),
                lhs.ty,
                rhs.ty,
                init.name()
            ),
        )
    }

    /// Rows of a table stored in tiles, `[n / t, d / k, t, k]` (see [`Func::mmt4d`]'s right
    /// operand), picked by `indices` `[k]` (i32): `[k, d]`, as [`Func::gather_rows`] picks them
    /// from the `[n, d]` table.
    pub fn gather_tiled_rows(&mut self, table: &Value, indices: &Value) -> Value {
        let (n, depth, t, k) = match (table.ty.shape.as_slice(), indices.ty.shape.as_slice()) {
            (&[_, depth, t, k], &[n]) => (n, depth, t, k),
            _ => (0, 0, 0, 0),
        };
        let out = table.ty.with_shape(&[n, depth * k]);
        if t == 0 || indices.ty.elem != Elem::I32 {
            return self.fail("gather", format!("tiled rows of {} by {}", table.ty, indices.ty), out);
        }
        // Start indices (row / t, 0, row % t, 0): one slice of d / k groups of k values.
        let tile = self.splat(&indices.ty, t as f64);
        // Token ids are not negative, so the truncating division is the floor.
        let major = self.div(indices, &tile);
        let whole = self.mul(&major, &tile);
        let minor = self.sub(indices, &whole);
        let zero = self.splat(&indices.ty, 0.0);
        let cols: Vec<Value> = [&major, &zero, &minor, &zero].iter().map(|c| self.reshape(c, &[n, 1])).collect();
        let idx = self.concat(&cols, 1);
        let groups = table.ty.with_shape(&[n, depth, k]);
        let rows = self.emit(
            groups.clone(),
            format!(
                "\"stablehlo.gather\"({}, {}) {{dimension_numbers = #stablehlo.gather<offset_dims = [1, 2], collapsed_slice_dims = [0, 2], start_index_map = [0, 1, 2, 3], index_vector_dim = 1>, slice_sizes = array<i64: 1, {depth}, 1, {k}>, indices_are_sorted = false}} : ({}, {}) -> {groups}",
                table.name(),
                idx.name(),
                table.ty,
                idx.ty
            ),
        );
        self.reshape(&rows, &[n, depth * k])
    }

    /// Sums or maxes over `dims` (removed from the shape).
    pub fn reduce(&mut self, x: &Value, dims: &[usize], kind: Reduce) -> Value {
        let shape: Vec<usize> = (0..x.ty.rank()).filter(|d| !dims.contains(d)).map(|d| x.ty.shape[d]).collect();
        let out = x.ty.with_shape(&shape);
        if dims.iter().any(|&d| d >= x.ty.rank()) || dims.is_empty() {
            return self.fail("reduce", format!("dims {dims:?} of {}", x.ty), out);
        }
        let scalar = Type::scalar(x.ty.elem);
        let (init, op) = match kind {
            Reduce::Sum => (0.0, "add"),
            Reduce::Max => (f64::NEG_INFINITY, "maximum"),
        };
        let init = self.splat(&scalar, init);
        self.emit(
            out.clone(),
            format!(
                "stablehlo.reduce({} init: {}) applies stablehlo.{op} across dimensions = [{}] : ({}, {scalar}) -> {out}",
                x.name(),
                init.name(),
                list(dims),
                x.ty
            ),
        )
    }

    /// Rows of `table` `[n, d]` picked by `indices` `[t]` (i32): `[t, d]`.
    pub fn gather_rows(&mut self, table: &Value, indices: &Value) -> Value {
        let (t, d) = (indices.ty.shape.first().copied().unwrap_or(0), table.ty.shape.get(1).copied().unwrap_or(0));
        let out = table.ty.with_shape(&[t, d]);
        if table.ty.rank() != 2 || indices.ty.rank() != 1 || indices.ty.elem != Elem::I32 {
            return self.fail("gather", format!("rows of {} by {}", table.ty, indices.ty), out);
        }
        let idx = self.reshape(indices, &[t, 1]);
        self.emit(
            out.clone(),
            format!(
                "\"stablehlo.gather\"({}, {}) {{dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, {d}>, indices_are_sorted = false}} : ({}, {}) -> {out}",
                table.name(),
                idx.name(),
                table.ty,
                idx.ty
            ),
        )
    }
}

/// Little-endian hex of an f32's bits, for dense hex-string constants.
fn hex_le(bits: u32) -> String {
    bits.to_le_bytes().iter().map(|b| format!("{b:02X}")).collect()
}
