//! The cases: identical seeded operands through MLX and through the emitted graph, compared.
#![forbid(unsafe_code)]

use anyhow::{Result, anyhow};
use mlx_rs::{Array, fast, nn, ops};
use mlxcel_emit::{AffineWeight, Bf16Dot, Elem, Func, Module, NumericContract, RmsStyle, Type, Value};

use crate::compare::{Bound, Expect, Level, Outcome, judge_typed};
use crate::iree::{Input, Iree, Out, Weights};
use crate::mlx::{array, array_bf16, dtype_name, values, words};
use crate::reference;
use crate::rng::{Rng, round_bf16};

/// f32's unit roundoff, 2^-24.
const U: f64 = 1.0 / 16_777_216.0;

/// What the elementwise activations are held to against MLX's: 8 ulp at 1 absolute (a
/// cancellation in `1 + tanh` or `1 + exp` costs an ulp of 1 times |x| / 2), 64 ulp relative
/// (exp and tanh are each a few ulp from correctly rounded, differently on each side).
const ACTIVATION: Bound = Bound { abs: 8.0 * 2.0 * U, rel: 64.0 * U };

#[derive(Debug)]
pub struct Case {
    pub name: String,
    pub outcome: Outcome,
}

#[derive(Debug)]
pub struct Mutation {
    pub name: String,
    pub detected: bool,
    pub detail: String,
}

#[derive(Debug, Default)]
pub struct Report {
    pub cases: Vec<Case>,
    pub mutations: Vec<Mutation>,
    /// Notes printed with the cases (which decomposition a case uses).
    pub notes: Vec<String>,
}

/// MLX's result: values and dtype.
struct Theirs {
    dtype: String,
    values: Vec<f32>,
}

fn theirs(a: &Array) -> Result<Theirs> {
    Ok(Theirs { dtype: dtype_name(a), values: values(a)? })
}

fn compare(ours: &Out, mlx: &Theirs, canonical: Option<&[f32]>, shape: &[usize], expect: Expect) -> Outcome {
    let dtypes = (ours.dtype != mlx.dtype).then(|| (ours.dtype.clone(), mlx.dtype.clone()));
    judge_typed(&ours.values, &mlx.values, canonical, shape, expect, dtypes)
}

impl Report {
    fn case(
        &mut self,
        name: String,
        ours: &Out,
        mlx: &Theirs,
        canonical: Option<&[f32]>,
        shape: &[usize],
        expect: Expect,
    ) {
        let outcome = compare(ours, mlx, canonical, shape, expect);
        self.cases.push(Case { name, outcome });
    }

    /// Whether MLX's own result is the sequential, products-rounded decomposition.
    fn note_mlx_order(&mut self, what: &str, mlx: &Theirs, sequential: &[f32]) {
        let same = crate::compare::first_divergence(&mlx.values, sequential, &[mlx.values.len()]).is_none();
        self.notes.push(format!(
            "{what}: MLX's result {} the sequential decomposition with each product rounded (no fma)",
            if same { "is bit-identical to" } else { "differs from" }
        ));
    }

    /// A mutant of a case, held to that case's claim: it must fail.
    fn mutation(
        &mut self,
        name: String,
        ours: &Out,
        mlx: &Theirs,
        canonical: Option<&[f32]>,
        shape: &[usize],
        expect: Expect,
    ) {
        let outcome = compare(ours, mlx, canonical, shape, expect);
        self.mutations.push(Mutation { name, detected: !outcome.passed, detail: outcome.describe() });
    }
}

fn finish(m: Module) -> Result<String> {
    m.finish().map_err(|e| anyhow!("emitting: {e}"))
}

fn f32s(shape: &[usize]) -> Type {
    Type::new(Elem::F32, shape)
}

fn one(mut outs: Vec<Out>) -> Result<Out> {
    outs.pop().ok_or_else(|| anyhow!("no result"))
}

/// The bound on the difference of two f32 contractions of the same `k` products
/// `a[r, i] * w[o, i]` summed in any two orders: each is within `gamma_(k+1) * sum |a w|` of the
/// exact sum (Higham 3.1, with one more rounding for the product), so they differ by at most
/// twice that. `on_a` and `on_w` bound how far each side's operands may already differ (an
/// activation, a dequantization): they carry in `sum |w| (on_a.abs + on_a.rel |a|)` and
/// `sum |a| (on_w.abs + on_w.rel |w|)`. The largest over all outputs, as an absolute bound.
fn contraction_bound(a: &[f32], w: &[f32], rows: usize, out: usize, k: usize, on_a: Bound, on_w: Bound) -> Bound {
    let mut worst = 0f64;
    for r in 0..rows {
        for o in 0..out {
            let (mut s, mut e) = (0f64, 0f64);
            for i in 0..k {
                let (x, y) = ((a[r * k + i] as f64).abs(), (w[o * k + i] as f64).abs());
                s += x * y;
                e += y * (on_a.abs + on_a.rel * x) + x * (on_w.abs + on_w.rel * y);
            }
            worst = worst.max(2.0 * (k as f64 + 1.0) * U * s + e);
        }
    }
    Bound { abs: worst, rel: 0.0 }
}

/// The canonical decomposition IREE's contractions reach on this target.
const FMA_ORDER: &str = "each output a sequential fused multiply-add over k from 0";

const EXACT: Bound = Bound { abs: 0.0, rel: 0.0 };

/// 1 and 2: affine dequantize and quantized matmul, group sizes 32, 64, 128 x bits 4, 8.
pub fn quantized(iree: &Iree, report: &mut Report) -> Result<()> {
    let (out, inputs) = (64usize, 512usize);
    report
        .notes
        .push(format!("1, 2: compiled with a quantized decoder bundle's flags: {}", quantized_flags().join(" ")));
    for group in [32usize, 64, 128] {
        for bits in [4usize, 8] {
            let mut rng = Rng::new(1000 + (group * 10 + bits) as u64);
            let w = rng.normals(out * inputs, 0.5);
            let (wq, scales, biases) = ops::quantize(array(&w, &[out, inputs]), group as i32, bits as i32)?;
            let (packed, s, b) = (words(&wq)?, values(&scales)?, values(&biases)?);
            let q = reference::unpack(&packed, bits, out, inputs);
            let canon = reference::dequantize(&q, &s, &b, inputs, group);
            let groups = inputs / group;
            let weights = Weights {
                u32s: vec![("q".into(), vec![out, inputs * bits / 32], packed.clone())],
                f32s: vec![
                    ("scales".into(), vec![out, groups], s.clone()),
                    ("biases".into(), vec![out, groups], b.clone()),
                ],
            };
            let tag = format!("g{group}_b{bits}");

            // 1. dequantize.
            let mlx = theirs(&ops::dequantize(&wq, &scales, &biases, group as i32, bits as i32)?)?;
            let shape = [out, inputs];
            let name = format!("dq_{tag}");
            let ours = one(iree.run(
                &name,
                &dequantize_module(&name, out, inputs, group, bits, false)?,
                &[],
                Some(&weights),
                &[],
            )?)?;
            let label =
                |what: &str| format!("{what} group_size={group} bits={bits} [{out}x{inputs}] f32 scales/biases");
            report.case(label("1. dequantize"), &ours, &mlx, Some(&canon), &shape, Expect::Production);
            // Mutants: (q + b / s) * s emitted and run; a fused multiply-add (one rounding) as
            // the Rust decomposition, held to the same claim.
            let name = format!("dq_shifted_{tag}");
            let shifted = one(iree.run(
                &name,
                &dequantize_module(&name, out, inputs, group, bits, true)?,
                &[],
                Some(&weights),
                &[],
            )?)?;
            report.mutation(
                label("dequantize as (q + bias/scale)*scale, emitted"),
                &shifted,
                &mlx,
                Some(&canon),
                &shape,
                Expect::Production,
            );
            let fused =
                Out { dtype: "f32".into(), values: reference::mutant_dequantize_fused(&q, &s, &b, inputs, group) };
            report.mutation(
                label("dequantize as fma(q, scale, bias)"),
                &fused,
                &mlx,
                Some(&canon),
                &shape,
                Expect::Production,
            );

            // 2. quantized matmul: decode of 1 and of 8 streams, prefill (24 rows).
            let max_bias = b.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
            for rows in [1usize, 8, 24] {
                let x = rng.normals(rows * inputs, 1.0);
                let mlx = theirs(&ops::quantized_matmul(
                    array(&x, &[rows, inputs]),
                    &wq,
                    &scales,
                    &biases,
                    true,
                    group as i32,
                    bits as i32,
                )?)?;
                let name = format!("qmm_{tag}_r{rows}");
                let flags = quantized_flags();
                let mlir = qlinear_module(&name, rows, out, inputs, group, bits)?;
                let ours = one(iree.run(
                    &name,
                    &mlir,
                    &flags,
                    Some(&weights),
                    &[Input::F32(vec![rows, inputs], x.clone())],
                )?)?;
                let canon_y = reference::linear_fma(&x, &canon, rows, out, inputs);
                // Either side's dequantized weight may be one rounding of q*s and one of the sum away.
                let on_w = Bound { abs: U * max_bias, rel: 2.0 * U };
                let bound = contraction_bound(&x, &canon, rows, out, inputs, EXACT, on_w);
                report.case(
                    format!("2. quantized_matmul (transpose) vs qlinear group_size={group} bits={bits} x[{rows}x{inputs}] w[{out}x{inputs}]"),
                    &ours,
                    &mlx,
                    Some(&canon_y),
                    &[rows, out],
                    Expect::Close(bound),
                );
            }
        }
    }
    Ok(())
}

/// The compiler flags of a quantized decoder bundle, as host/src/decoder/bundle.rs sets them:
/// no const-expr hoisting, aggressive dispatch fusion (the dequantization fused into each row's
/// reduction), reassociated fp reductions, a 64 KiB stack limit.
fn quantized_flags() -> Vec<String> {
    [
        "--iree-opt-const-expr-hoisting=false",
        "--iree-dispatch-creation-enable-aggressive-fusion",
        "--iree-llvmcpu-reassociate-fp-reductions=true",
        "--iree-llvmcpu-stack-allocation-limit=65536",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn dequantize_module(
    name: &str,
    out: usize,
    inputs: usize,
    group: usize,
    bits: usize,
    shifted: bool,
) -> Result<String> {
    let mut m = Module::new(name);
    let (qe, ue) = if bits == 4 { (Elem::I4, Elem::U4) } else { (Elem::I8, Elem::U8) };
    let groups = inputs / group;
    let q = m.param("q", Type::new(qe, &[out, inputs]));
    let s = m.param("scales", f32s(&[out, groups]));
    let b = m.param("biases", f32s(&[out, groups]));
    let (mut f, _) = m.func("f", &[]);
    let w = AffineWeight { q: f.load(&q), scales: f.load(&s), biases: f.load(&b), group_size: group };
    let d = if shifted {
        let shape = [out, groups, group];
        let q = f.reshape(&w.q, &shape);
        let q = f.bitcast_convert(&q, ue);
        let q = f.convert(&q, Elem::F32);
        let s = f.broadcast(&w.scales, &shape, &[0, 1]);
        let b = f.broadcast(&w.biases, &shape, &[0, 1]);
        let bs = f.div(&b, &s);
        let t = f.add(&q, &bs);
        f.mul(&t, &s)
    } else {
        NumericContract::f32().dequantize(&mut f, &w)
    };
    let d = f.reshape(&d, &[out, inputs]);
    m.add_func(f, &[d]);
    finish(m)
}

fn qlinear_module(name: &str, rows: usize, out: usize, inputs: usize, group: usize, bits: usize) -> Result<String> {
    let mut m = Module::new(name);
    let qe = if bits == 4 { Elem::I4 } else { Elem::I8 };
    let groups = inputs / group;
    let q = m.param("q", Type::new(qe, &[out, inputs]));
    let s = m.param("scales", f32s(&[out, groups]));
    let b = m.param("biases", f32s(&[out, groups]));
    let (mut f, a) = m.func("f", &[f32s(&[rows, inputs])]);
    let w = AffineWeight { q: f.load(&q), scales: f.load(&s), biases: f.load(&b), group_size: group };
    let y = NumericContract::f32().qlinear(&mut f, &a[0], &w, None);
    m.add_func(f, &[y]);
    finish(m)
}

/// A module `f(args...) -> body(args)`.
fn module(name: &str, args: &[Type], body: impl FnOnce(&mut Func, &[Value]) -> Value) -> Result<String> {
    let mut m = Module::new(name);
    let (mut f, a) = m.func("f", args);
    let y = body(&mut f, &a);
    m.add_func(f, &[y]);
    finish(m)
}

fn contract(activations: Elem, accumulate: Elem) -> NumericContract {
    NumericContract { activations, accumulate, ..NumericContract::f32() }
}

/// 3. dense matmul vs `linear`: f32 (decode and prefill row counts) and bf16 operands.
pub fn dense(iree: &Iree, report: &mut Report) -> Result<()> {
    let (out, k) = (128usize, 256usize);
    let mut rng = Rng::new(3);
    let w = rng.normals(out * k, 0.1);
    for rows in [1usize, 24] {
        let x = rng.normals(rows * k, 1.0);
        let mlx = theirs(&ops::matmul(array(&x, &[rows, k]), array(&w, &[out, k]).t())?)?;
        let name = format!("linear_f32_r{rows}");
        let mlir = module(&name, &[f32s(&[rows, k]), f32s(&[out, k])], |f, a| {
            NumericContract::f32().linear(f, &a[0], &a[1], None)
        })?;
        let ours = one(iree.run(
            &name,
            &mlir,
            &[],
            None,
            &[Input::F32(vec![rows, k], x.clone()), Input::F32(vec![out, k], w.clone())],
        )?)?;
        // IREE's llvm-cpu contraction on this target: sequential over k, a fused multiply-add
        // each step. MLX's (the wheel's reference BLAS): sequential, each product rounded.
        let canon = reference::linear_fma(&x, &w, rows, out, k);
        report.note_mlx_order(&format!("3. matmul f32 x[{rows}x{k}]"), &mlx, &reference::linear(&x, &w, rows, out, k));
        report.case(
            format!("3. matmul(x, w^T) vs linear f32 x[{rows}x{k}] w[{out}x{k}] (canonical: {FMA_ORDER})"),
            &ours,
            &mlx,
            Some(&canon),
            &[rows, out],
            Expect::Observed(Level::Canonical, contraction_bound(&x, &w, rows, out, k, EXACT, EXACT)),
        );
        if rows == 24 {
            // Mutant: the k reduction reassociated as two halves added (split-k).
            let half = k / 2;
            let mlir = module("linear_split_k", &[f32s(&[rows, k]), f32s(&[out, k])], |f, a| {
                let c = NumericContract::f32();
                let (x0, x1) = (f.slice(&a[0], &[0, 0], &[rows, half]), f.slice(&a[0], &[0, half], &[rows, k]));
                let (w0, w1) = (f.slice(&a[1], &[0, 0], &[out, half]), f.slice(&a[1], &[0, half], &[out, k]));
                let y0 = c.linear(f, &x0, &w0, None);
                let y1 = c.linear(f, &x1, &w1, None);
                f.add(&y0, &y1)
            })?;
            let split = one(iree.run(
                "linear_split_k",
                &mlir,
                &[],
                None,
                &[Input::F32(vec![rows, k], x.clone()), Input::F32(vec![out, k], w.clone())],
            )?)?;
            report.mutation(
                "f32 linear with its k reduction split in two halves".into(),
                &split,
                &mlx,
                Some(&canon),
                &[rows, out],
                Expect::Canonical,
            );
        }
    }
    // bf16 operands: MLX returns bf16; ours widens to f32, contracts, rounds once.
    let rows = 24;
    let x: Vec<f32> = rng.normals(rows * k, 1.0).into_iter().map(round_bf16).collect();
    let wb: Vec<f32> = w.iter().copied().map(round_bf16).collect();
    let mlx = theirs(&ops::matmul(array_bf16(&x, &[rows, k])?, array_bf16(&wb, &[out, k])?.t())?)?;
    let bf = |s: &[usize]| Type::new(Elem::BF16, s);
    let inputs = [Input::BF16(vec![rows, k], x.clone()), Input::BF16(vec![out, k], wb.clone())];
    let canon: Vec<f32> = reference::linear(&x, &wb, rows, out, k).into_iter().map(round_bf16).collect();
    // The f32 sums differ by the contraction bound; each rounded to bf16, one bf16 ulp more
    // (at most 2^-7 relative).
    let mut bound = contraction_bound(&x, &wb, rows, out, k, EXACT, EXACT);
    bound.rel = 1.0 / 128.0;
    let shape = [rows, out];
    let run = |name: &str, c: NumericContract| -> Result<Out> {
        let mlir = module(name, &[bf(&[rows, k]), bf(&[out, k])], |f, a| c.linear(f, &a[0], &a[1], None))?;
        one(iree.run(name, &mlir, &[], None, &inputs)?)
    };
    let ours = run("linear_bf16", NumericContract::bf16(Bf16Dot::InOrder))?;
    let label = format!("3. matmul(x, w^T) vs linear bf16 operands, f32 accumulator x[{rows}x{k}] w[{out}x{k}]");
    // Exact on this target: both sides' f32 sums round to the same bf16 (observed; the f32
    // sums differ, see the f32 cases).
    report.case(label, &ours, &mlx, Some(&canon), &shape, Expect::Observed(Level::Production, bound));
    let acc = run("linear_bf16_acc_bf16", contract(Elem::BF16, Elem::BF16))?;
    report.mutation("bf16 linear accumulating in bf16".into(), &acc, &mlx, Some(&canon), &shape, Expect::Production);
    report.mutation(
        "bf16 linear accumulating in bf16, against the closeness bound".into(),
        &acc,
        &mlx,
        Some(&canon),
        &shape,
        Expect::Close(bound),
    );
    let nocast = run("linear_bf16_no_rounding", NumericContract::f32())?;
    report.mutation(
        "bf16 linear without its rounding cast to bf16".into(),
        &nocast,
        &mlx,
        Some(&canon),
        &shape,
        Expect::Production,
    );
    Ok(())
}

/// 4. RMSNorm (plain) and LayerNorm.
pub fn norms(iree: &Iree, report: &mut Report) -> Result<()> {
    let (rows, n) = (24usize, 256usize);
    let mut rng = Rng::new(4);
    let x = rng.normals(rows * n, 1.0);
    let w: Vec<f32> = rng.normals(n, 0.1).into_iter().map(|v| 1.0 + v).collect();
    let b = rng.normals(n, 0.1);
    let eps = 1e-5f32;
    let inputs = [Input::F32(vec![rows, n], x.clone()), Input::F32(vec![n], w.clone())];
    let shape = [rows, n];

    let mlx = theirs(&fast::rms_norm(array(&x, &shape), Some(&array(&w, &[n])), eps)?)?;
    // The mean of squares is an n-term sum (gamma_n relative, all terms positive), rsqrt a few
    // ulp, two products: relative, (n + 16) u.
    let bound = Bound { abs: 0.0, rel: (n as f64 + 16.0) * U };
    let run = |name: &str, c: NumericContract| -> Result<Out> {
        let mlir =
            module(name, &[f32s(&shape), f32s(&[n])], |f, a| c.rms_norm(f, &a[0], &a[1], eps as f64, RmsStyle::Plain))?;
        one(iree.run(name, &mlir, &[], None, &inputs)?)
    };
    let ours = run("rms_norm", NumericContract::f32())?;
    // Exact on this target (observed): the same order of the mean of squares on both sides.
    report.case(
        format!("4. fast::rms_norm vs rms_norm (plain) f32 [{rows}x{n}] eps=1e-5"),
        &ours,
        &mlx,
        None,
        &shape,
        Expect::Observed(Level::Production, bound),
    );
    // Mutant: the sum of squares reassociated as two halves added.
    let mlir = module("rms_norm_split_sum", &[f32s(&shape), f32s(&[n])], |f, a| {
        let sq = f.mul(&a[0], &a[0]);
        let lo = f.slice(&sq, &[0, 0], &[rows, n / 2]);
        let hi = f.slice(&sq, &[0, n / 2], &[rows, n]);
        let lo = f.reduce(&lo, &[1], mlxcel_emit::Reduce::Sum);
        let hi = f.reduce(&hi, &[1], mlxcel_emit::Reduce::Sum);
        let sum = f.add(&lo, &hi);
        let k = f.splat(sum.ty(), 1.0 / n as f64);
        let mean = f.mul(&sum, &k);
        let e = f.splat(mean.ty(), eps as f64);
        let r = f.add(&mean, &e);
        let r = f.rsqrt(&r);
        let rb = f.broadcast(&r, &shape, &[0]);
        let normed = f.mul(&a[0], &rb);
        let wb = f.broadcast_to(&a[1], &shape);
        f.mul(&wb, &normed)
    })?;
    let mutant = one(iree.run("rms_norm_split_sum", &mlir, &[], None, &inputs)?)?;
    report.mutation(
        "rms_norm with its sum of squares split in two halves".into(),
        &mutant,
        &mlx,
        None,
        &shape,
        Expect::Production,
    );
    let acc = run("rms_norm_acc_bf16", contract(Elem::F32, Elem::BF16))?;
    report.mutation("rms_norm accumulating in bf16".into(), &acc, &mlx, None, &shape, Expect::Production);
    report.mutation(
        "rms_norm accumulating in bf16, against the closeness bound".into(),
        &acc,
        &mlx,
        None,
        &shape,
        Expect::Close(bound),
    );

    let xs: Vec<f32> = x.iter().map(|v| v + 0.5).collect();
    let mlx = theirs(&fast::layer_norm(array(&xs, &shape), &array(&w, &[n]), &array(&b, &[n]), eps)?)?;
    let mlir = module("layer_norm", &[f32s(&shape), f32s(&[n]), f32s(&[n])], |f, a| {
        NumericContract::f32().layer_norm(f, &a[0], &a[1], &a[2], eps as f64)
    })?;
    let ours = one(iree.run(
        "layer_norm",
        &mlir,
        &[],
        None,
        &[Input::F32(vec![rows, n], xs), Input::F32(vec![n], w.clone()), Input::F32(vec![n], b.clone())],
    )?)?;
    // Mean and variance are n-term sums; the bias add can cancel, so the bound is absolute:
    // (n + 16) u times the largest |normalised * w| + |b| (taken from MLX's output and b).
    let big = mlx.values.iter().fold(0f64, |m, &v| m.max((v as f64).abs()))
        + b.iter().fold(0f64, |m, &v| m.max((v as f64).abs()));
    let bound = Bound { abs: (n as f64 + 16.0) * U * big, rel: 0.0 };
    report.case(
        format!("4. fast::layer_norm vs layer_norm f32 [{rows}x{n}] eps=1e-5"),
        &ours,
        &mlx,
        None,
        &shape,
        Expect::Close(bound),
    );
    Ok(())
}

/// 5. silu and gelu (tanh approximation), alone and followed by a projection.
pub fn activations(iree: &Iree, report: &mut Report) -> Result<()> {
    let (rows, k, out) = (24usize, 256usize, 128usize);
    let mut rng = Rng::new(5);
    let x = rng.normals(rows * k, 2.0);
    let w = rng.normals(out * k, 0.1);
    let shape = [rows, k];
    type Act = fn(&NumericContract, &mut Func, &Value) -> Value;
    let acts: [(&str, &str, Act); 2] = [
        ("silu", "nn::silu", NumericContract::silu),
        ("gelu_tanh", "nn::gelu_approximate", NumericContract::gelu_tanh),
    ];
    for (ours_name, mlx_name, act) in acts {
        let mlx_act =
            if ours_name == "silu" { nn::silu(array(&x, &shape))? } else { nn::gelu_approximate(array(&x, &shape))? };
        let mlx = theirs(&mlx_act)?;
        let mlir = module(ours_name, &[f32s(&shape)], |f, a| act(&NumericContract::f32(), f, &a[0]))?;
        let ours = one(iree.run(ours_name, &mlir, &[], None, &[Input::F32(shape.to_vec(), x.clone())])?)?;
        report.case(
            format!("5. {mlx_name} vs {ours_name} f32 [{rows}x{k}]"),
            &ours,
            &mlx,
            None,
            &shape,
            Expect::Close(ACTIVATION),
        );

        let mlx_act_values = mlx.values.clone();
        let mlx = theirs(&ops::matmul(&mlx_act, array(&w, &[out, k]).t())?)?;
        let name = format!("{ours_name}_proj");
        let mlir = module(&name, &[f32s(&shape), f32s(&[out, k])], |f, a| {
            let c = NumericContract::f32();
            let h = act(&c, f, &a[0]);
            c.linear(f, &h, &a[1], None)
        })?;
        let ours = one(iree.run(
            &name,
            &mlir,
            &[],
            None,
            &[Input::F32(shape.to_vec(), x.clone()), Input::F32(vec![out, k], w.clone())],
        )?)?;
        let bound = contraction_bound(&mlx_act_values, &w, rows, out, k, ACTIVATION, EXACT);
        report.case(
            format!("5. {mlx_name}(x) @ w^T vs {ours_name} + linear f32 x[{rows}x{k}] w[{out}x{k}]"),
            &ours,
            &mlx,
            None,
            &[rows, out],
            Expect::Close(bound),
        );
    }
    Ok(())
}

/// 6. residual add.
pub fn residual(iree: &Iree, report: &mut Report) -> Result<()> {
    let shape = [24usize, 256];
    let mut rng = Rng::new(6);
    let (x, d) = (rng.normals(24 * 256, 1.0), rng.normals(24 * 256, 0.3));
    let mlx = theirs(&ops::add(array(&x, &shape), array(&d, &shape))?)?;
    let canon = reference::add(&x, &d);
    let inputs = [Input::F32(shape.to_vec(), x), Input::F32(shape.to_vec(), d)];
    let mlir =
        module("residual", &[f32s(&shape), f32s(&shape)], |f, a| NumericContract::f32().residual(f, &a[0], &a[1]))?;
    let ours = one(iree.run("residual", &mlir, &[], None, &inputs)?)?;
    report.case("6. add vs residual f32 [24x256]".into(), &ours, &mlx, Some(&canon), &shape, Expect::Production);
    let mlir = module("residual_bf16_delta", &[f32s(&shape), f32s(&shape)], |f, a| {
        let r = f.convert(&a[1], Elem::BF16);
        let r = f.convert(&r, Elem::F32);
        NumericContract::f32().residual(f, &a[0], &r)
    })?;
    let mutant = one(iree.run("residual_bf16_delta", &mlir, &[], None, &inputs)?)?;
    report.mutation(
        "residual with the delta rounded to bf16 first".into(),
        &mutant,
        &mlx,
        Some(&canon),
        &shape,
        Expect::Production,
    );
    Ok(())
}

/// 7. `softmax(q k^T * scale)` (MLX `precise`) vs `matmul`, the scale, `softmax`.
pub fn attention(iree: &Iree, report: &mut Report) -> Result<()> {
    let (heads, len, d) = (2usize, 24usize, 64usize);
    let scale = 1.0 / (d as f32).sqrt();
    let mut rng = Rng::new(7);
    let (q, k) = (rng.normals(heads * len * d, 1.0), rng.normals(heads * len * d, 1.0));
    let shape = [heads, len, d];
    let scores = ops::multiply(
        ops::matmul(array(&q, &shape), array(&k, &shape).transpose_axes(&[0, 2, 1])?)?,
        Array::from_f32(scale),
    )?;
    let mlx = theirs(&ops::softmax_axis(&scores, -1, true)?)?;
    let inputs = [Input::F32(shape.to_vec(), q.clone()), Input::F32(shape.to_vec(), k.clone())];
    let run = |name: &str, c: NumericContract| -> Result<Out> {
        let mlir = module(name, &[f32s(&shape), f32s(&shape)], |f, a| {
            let s = c.matmul(f, &a[0], &a[1], (&[0], &[0]), (&[2], &[2]));
            let sc = f.splat(s.ty(), scale as f64);
            let s = f.mul(&s, &sc);
            c.softmax(f, &s)
        })?;
        one(iree.run(name, &mlir, &[], None, &inputs)?)
    };
    // A score differs by at most the contraction bound (times the exact scale); a
    // probability's relative error is at most twice the largest score error, plus the
    // exponentials', the (len)-term sum's and the division's roundings, 64 + len ulp.
    let mut max_ds = 0f64;
    for h in 0..heads {
        let off = h * len * d;
        let b = contraction_bound(&q[off..off + len * d], &k[off..off + len * d], len, len, d, EXACT, EXACT);
        max_ds = max_ds.max(b.abs * scale as f64);
    }
    let bound = Bound { abs: 0.0, rel: 2.0 * max_ds + (64.0 + len as f64) * U };
    let out_shape = [heads, len, len];
    let ours = run("attention", NumericContract::f32())?;
    report.case(
        format!("7. softmax(q k^T * 1/8, precise) vs matmul, scale, softmax f32 q,k[{heads}x{len}x{d}]"),
        &ours,
        &mlx,
        None,
        &out_shape,
        Expect::Close(bound),
    );
    let acc = run("attention_acc_bf16", contract(Elem::F32, Elem::BF16))?;
    report.mutation("attention accumulating in bf16".into(), &acc, &mlx, None, &out_shape, Expect::Close(bound));
    Ok(())
}

/// 8. cumulative sum: MLX `cumsum` vs a scan emitted from mlxcel-emit's ops (it has no scan op).
pub fn scan(iree: &Iree, report: &mut Report) -> Result<()> {
    let (rows, n) = (4usize, 64usize);
    let x = Rng::new(8).normals(rows * n, 1.0);
    let shape = [rows, n];
    let mlx = theirs(&ops::cumsum(array(&x, &shape), 1, false, true)?)?;
    let canon = reference::cumsum(&x, rows, n);
    let inputs = [Input::F32(shape.to_vec(), x.clone())];

    // (a) a matmul with a lower-triangular ones matrix through the contract.
    let tri: Vec<f32> = (0..n * n).map(|i| if i % n <= i / n { 1.0 } else { 0.0 }).collect();
    let mlir = module("cumsum_tri", &[f32s(&shape)], |f, a| {
        let l = f.constant_f32(&[n, n], &tri);
        NumericContract::f32().matmul(f, &a[0], &l, (&[], &[]), (&[1], &[1]))
    })?;
    let ours = one(iree.run("cumsum_tri", &mlir, &[], None, &inputs)?)?;
    let bound = contraction_bound(&x, &tri, rows, n, n, EXACT, EXACT);
    // Exact on this target: IREE's sequential fused multiply-adds over k (see case 3) add each
    // x_s * 1 exactly as MLX's sequential scan adds x_s, and the zeros change nothing.
    report.case(
        format!("8. cumsum vs matmul with lower-triangular ones (contract matmul) f32 [{rows}x{n}]"),
        &ours,
        &mlx,
        Some(&canon),
        &shape,
        Expect::Observed(Level::Production, bound),
    );

    // (b) the sequential chain y_t = y_(t-1) + x_t (slices, adds, a concatenation).
    let mlir = module("cumsum_chain", &[f32s(&shape)], |f, a| {
        let mut acc = f.slice(&a[0], &[0, 0], &[rows, 1]);
        let mut cols = vec![acc.clone()];
        for t in 1..n {
            let xt = f.slice(&a[0], &[0, t], &[rows, t + 1]);
            acc = f.add(&acc, &xt);
            cols.push(acc.clone());
        }
        f.concat(&cols, 1)
    })?;
    let ours = one(iree.run("cumsum_chain", &mlir, &[], None, &inputs)?)?;
    report.case(
        format!("8. cumsum vs sequential chain of adds (slice/add/concatenate) f32 [{rows}x{n}]"),
        &ours,
        &mlx,
        Some(&canon),
        &shape,
        Expect::Production,
    );
    // Mutant: the chain reassociated as a Hillis-Steele scan.
    let mlir = module("cumsum_tree", &[f32s(&shape)], |f, a| {
        let mut y = a[0].clone();
        let mut step = 1;
        while step < n {
            let head = f.slice(&y, &[0, 0], &[rows, step]);
            let tail = f.slice(&y, &[0, step], &[rows, n]);
            let prev = f.slice(&y, &[0, 0], &[rows, n - step]);
            let sum = f.add(&tail, &prev);
            y = f.concat(&[head, sum], 1);
            step *= 2;
        }
        y
    })?;
    let tree = one(iree.run("cumsum_tree", &mlir, &[], None, &inputs)?)?;
    report.mutation(
        "cumsum reassociated as a Hillis-Steele scan, emitted".into(),
        &tree,
        &mlx,
        Some(&canon),
        &shape,
        Expect::Production,
    );
    Ok(())
}

/// Case 9, conv2d of the Gemma3n SSCP stem: 1 to 128 channels, 3x3, stride 2, padding 1, over a
/// log-mel input of batch 1, 1 channel, T=64, F=128 (NCHW as Hugging Face holds it; NHWC x
/// OHWI for MLX). mlxcel-emit has no convolution, so the `stablehlo.convolution` text is written here.
pub fn conv(iree: &Iree, report: &mut Report) -> Result<()> {
    let (t, fr, co) = (64usize, 128usize, 128usize);
    let (ot, of) = (t / 2, fr / 2);
    let mut rng = Rng::new(9);
    let x = rng.normals(t * fr, 1.0);
    let w = rng.normals(co * 9, 1.0 / 3.0);
    // With one input channel, NCHW [1, 1, T, F] and NHWC [1, T, F, 1] are the same bytes.
    let mlx = theirs(&ops::conv2d(array(&x, &[1, t, fr, 1]), array(&w, &[co, 3, 3, 1]), (2, 2), (1, 1), None, None)?)?;
    let xt = format!("tensor<1x{t}x{fr}x1xf32>");
    let wt = format!("tensor<{co}x3x3x1xf32>");
    let yt = format!("tensor<1x{ot}x{of}x{co}xf32>");
    let mlir = format!(
        "module @conv {{\n  func.func @f(%x: {xt}, %w: {wt}) -> ({yt}) {{\n    %y = stablehlo.convolution(%x, %w) \
         dim_numbers = [b, 0, 1, f]x[o, 0, 1, i]->[b, 0, 1, f], window = {{stride = [2, 2], pad = [[1, 1], [1, 1]]}} \
         {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : ({xt}, {wt}) -> {yt}\n    return %y : {yt}\n  }}\n}}\n"
    );
    let ours = one(iree.run(
        "conv",
        &mlir,
        &[],
        None,
        &[Input::F32(vec![1, t, fr, 1], x.clone()), Input::F32(vec![co, 3, 3, 1], w.clone())],
    )?)?;
    // Canonical: each output a sequential sum over (kh, kw) of rounded products, padding skipped.
    // The bound: a contraction of the 9 taps, so the patches as rows.
    let mut patches = vec![0f32; ot * of * 9];
    for oh in 0..ot {
        for ow in 0..of {
            for kh in 0..3 {
                for kw in 0..3 {
                    let (ih, iw) = ((2 * oh + kh) as isize - 1, (2 * ow + kw) as isize - 1);
                    if ih >= 0 && iw >= 0 && (ih as usize) < t && (iw as usize) < fr {
                        patches[(oh * of + ow) * 9 + kh * 3 + kw] = x[ih as usize * fr + iw as usize];
                    }
                }
            }
        }
    }
    let canon = reference::linear_fma(&patches, &w, ot * of, co, 9);
    report.note_mlx_order("9. conv2d", &mlx, &reference::linear(&patches, &w, ot * of, co, 9));
    report.notes.push(
        "9. conv2d: mlxcel-emit has no convolution; the oracle writes the stablehlo.convolution text itself".into(),
    );
    report.case(format!("9. conv2d NHWC x OHWI vs stablehlo.convolution f32 x[1x{t}x{fr}x1] w[{co}x3x3x1] stride 2 pad 1 -> [1x{ot}x{of}x{co}] (canonical: {FMA_ORDER}, over (kh, kw))"), &ours, &mlx, Some(&canon), &[1, ot, of, co], Expect::Observed(Level::Canonical, contraction_bound(&patches, &w, ot * of, co, 9, EXACT, EXACT)));
    Ok(())
}
