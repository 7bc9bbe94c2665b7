//! Builder tests: emitted text, and shape errors caught at build time.

use crate::{Compare, Elem, Module, NumericContract, Reduce, RmsStyle, Rows, Type};

/// The op of every SSA definition in `text`, in order.
fn op_names(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| l.trim_start().starts_with("%v"))
        .filter_map(|l| l.split(" = ").nth(1))
        .map(|r| r.split_whitespace().next().unwrap_or(""))
        .collect()
}

/// The operations a rounding to bf16 is written out in (`NumericContract::round`).
const ROUND_BF16: [&str; 12] = [
    "stablehlo.bitcast_convert",
    "stablehlo.constant",
    "stablehlo.shift_right_logical",
    "stablehlo.constant",
    "stablehlo.and",
    "stablehlo.constant",
    "stablehlo.add",
    "stablehlo.add",
    "stablehlo.constant",
    "stablehlo.and",
    "stablehlo.bitcast_convert",
    "stablehlo.convert",
];

/// [`op_names`] with each written-out rounding to bf16 as one `round bf16`.
fn op_names_rounded(text: &str) -> Vec<&str> {
    let ops = op_names(text);
    let mut out = Vec::new();
    let mut i = 0;
    while i < ops.len() {
        if ops[i..].starts_with(&ROUND_BF16) {
            out.push("round bf16");
            i += ROUND_BF16.len();
        } else {
            out.push(ops[i]);
            i += 1;
        }
    }
    out
}

fn t(shape: &[usize]) -> Type {
    Type::new(Elem::F32, shape)
}

#[test]
fn a_small_function_renders_as_stablehlo() {
    let mut m = Module::new("m");
    let w = m.param("layer.weight", t(&[3, 2]));
    let (mut f, args) = m.func("f", &[t(&[4, 2])]);
    let wv = f.load(&w);
    let y = f.dot_general(&args[0], &wv, (&[], &[]), (&[1], &[1]));
    let s = f.reduce(&y, &[1], Reduce::Sum);
    m.add_func(f, &[s]);
    let text = m.finish().expect("valid");
    let want = r#"module @m {
  util.global private @p0 = #flow.parameter.named<"model"::"layer.weight"> : tensor<3x2xf32>
  func.func @f(%v0: tensor<4x2xf32>) -> (tensor<4xf32>) {
    %v1 = util.global.load @p0 : tensor<3x2xf32>
    %v2 = stablehlo.dot_general %v0, %v1, contracting_dims = [1] x [1] : (tensor<4x2xf32>, tensor<3x2xf32>) -> tensor<4x3xf32>
    %v3 = stablehlo.constant dense<0.00000000000000000e0> : tensor<f32>
    %v4 = stablehlo.reduce(%v2 init: %v3) applies stablehlo.add across dimensions = [1] : (tensor<4x3xf32>, tensor<f32>) -> tensor<4xf32>
    return %v4 : tensor<4xf32>
  }
}
"#;
    assert_eq!(text, want);
}

#[test]
fn shape_errors_are_reported_with_the_op() {
    type Build = Box<dyn Fn(&mut crate::Func, &[crate::Value])>;
    let cases: Vec<(&str, Build)> = vec![
        ("add", Box::new(|f, a| drop(f.add(&a[0], &a[1])))),
        ("dot_general", Box::new(|f, a| drop(f.dot_general(&a[0], &a[1], (&[], &[]), (&[1], &[1]))))),
        ("reshape", Box::new(|f, a| drop(f.reshape(&a[0], &[5])))),
        ("broadcast_in_dim", Box::new(|f, a| drop(f.broadcast(&a[0], &[4, 3], &[0, 1])))),
        ("slice", Box::new(|f, a| drop(f.slice(&a[0], &[0, 0], &[5, 2])))),
        ("transpose", Box::new(|f, a| drop(f.transpose(&a[0], &[0, 0])))),
        ("compare", Box::new(|f, a| drop(f.compare(Compare::Lt, &a[0], &a[1])))),
        ("dynamic_slice", Box::new(|f, a| drop(f.dynamic_slice(&a[0], &[], &[1, 1])))),
    ];
    for (op, build) in cases {
        let m = Module::new("m");
        let (mut f, args) = m.func("f", &[t(&[4, 2]), t(&[3, 3])]);
        build(&mut f, &args);
        let mut m = m;
        m.add_func(f, &[]);
        let err = m.finish().expect_err(op);
        assert_eq!(err.op, op, "{err}");
        assert_eq!(err.func, "f");
    }
}

#[test]
fn only_the_first_error_is_kept() {
    let mut m = Module::new("m");
    let (mut f, a) = m.func("f", &[t(&[2]), t(&[3])]);
    let bad = f.add(&a[0], &a[1]);
    let _ = f.reshape(&bad, &[7]);
    m.add_func(f, &[]);
    assert_eq!(m.finish().expect_err("fails").op, "add");
}

#[test]
fn constants_are_bit_exact() {
    let m = Module::new("m");
    let (mut f, _) = m.func("f", &[]);
    let c = f.constant_f32(&[2], &[1.0, -0.1]);
    let s = f.constant_f32(&[], &[0.5]);
    let mut m = m;
    m.add_func(f, &[c, s]);
    let text = m.finish().expect("valid");
    // 1.0 = 0x3F800000, -0.1 = 0xBDCCCCCD, little-endian bytes.
    assert!(text.contains("dense<\"0x0000803FCDCCCCBD\"> : tensor<2xf32>"), "{text}");
    assert!(text.contains("dense<0x3F000000> : tensor<f32>"), "{text}");
}

#[test]
fn state_globals_get_distinct_initialisers() {
    let mut m = Module::new("m");
    let a = m.state("a", t(&[2]), 0.0);
    let b = m.state("b", t(&[2]), 0.0);
    let (mut f, _) = m.func("f", &[]);
    let (va, vb) = (f.load(&a), f.load(&b));
    m.add_func(f, &[va, vb]);
    let text = m.finish().expect("valid");
    let inits: Vec<&str> =
        text.lines().filter(|l| l.contains("mutable")).map(|l| l.split("dense<").nth(1).unwrap_or("")).collect();
    assert_eq!(inits.len(), 2);
    assert_ne!(inits[0], inits[1], "{text}");
}

/// Mutation-sensitive: the bf16 contract widens both matmul operands to f32
/// and rounds the result once; removing either cast changes this text.
#[test]
fn bf16_linear_widens_then_rounds_once() {
    let bf = |s: &[usize]| Type::new(Elem::BF16, s);
    let mut m = Module::new("m");
    let w = m.param("w", bf(&[3, 2]));
    let (mut f, a) = m.func("f", &[bf(&[4, 2])]);
    let wv = f.load(&w);
    let y = NumericContract::bf16(crate::Bf16Dot::Pairs).linear(&mut f, &a[0], &wv, None);
    m.add_func(f, &[y]);
    let text = m.finish().expect("valid");
    let ops = op_names_rounded(&text);
    assert_eq!(
        ops,
        [
            "util.global.load",
            "stablehlo.convert",
            "stablehlo.convert",
            "stablehlo.dot_general",
            "stablehlo.transpose",
            "round bf16"
        ]
    );
    // The weight is the left operand (see `linear`), the result transposed back.
    assert!(text.contains("(tensor<3x2xf32>, tensor<4x2xf32>) -> tensor<3x4xf32>"), "accumulates in f32: {text}");
    assert!(text.contains("(tensor<3x4xf32>) -> tensor<4x3xf32>"), "transposed back: {text}");
    assert!(text.contains("(tensor<4x3xf32>) -> tensor<4x3xbf16>"), "rounds to bf16: {text}");
}

/// A bf16 batched matmul accumulates in f32 inside one `dot_general` whose result is f32 (the
/// operands are not converted to f32 apart from it), then rounds once; a narrowing result and
/// mixed operands are refused.
#[test]
fn bf16_matmul_widens_inside_the_contraction() {
    let bf = |s: &[usize]| Type::new(Elem::BF16, s);
    let mut m = Module::new("m");
    let (mut f, a) = m.func("f", &[bf(&[2, 4, 8]), bf(&[2, 5, 8])]);
    let y = NumericContract::bf16(crate::Bf16Dot::Pairs).matmul(&mut f, &a[0], &a[1], (&[0], &[0]), (&[2], &[2]));
    m.add_func(f, &[y]);
    let text = m.finish().expect("valid");
    assert_eq!(op_names_rounded(&text), ["stablehlo.dot_general", "round bf16"], "{text}");
    assert!(
        text.contains("(tensor<2x4x8xbf16>, tensor<2x5x8xbf16>) -> tensor<2x4x5xf32>"),
        "bf16 operands, f32 result: {text}"
    );

    let refused = |a_elem: Elem, b_elem: Elem, out: Elem| {
        let mut m = Module::new("m");
        let (mut f, a) = m.func("f", &[Type::new(a_elem, &[4, 8]), Type::new(b_elem, &[5, 8])]);
        let _ = f.dot_general_to(&a[0], &a[1], (&[], &[]), (&[1], &[1]), out);
        m.add_func(f, &[]);
        m.finish().expect_err("refused").op
    };
    assert_eq!(refused(Elem::F32, Elem::F32, Elem::BF16), "dot_general", "a narrowing result");
    assert_eq!(refused(Elem::BF16, Elem::F32, Elem::F32), "dot_general", "mixed operands");
}

/// The two RMSNorm orders differ exactly where Llama and Gemma differ.
#[test]
fn rms_norm_styles_round_at_their_own_points() {
    let render = |style| {
        let mut m = Module::new("m");
        let (mut f, a) = m.func("f", &[Type::new(Elem::BF16, &[2, 4]), Type::new(Elem::BF16, &[4])]);
        let y = NumericContract::bf16(crate::Bf16Dot::Pairs).rms_norm(&mut f, &a[0], &a[1], 1e-6, style);
        m.add_func(f, &[y]);
        m.finish().expect("valid")
    };
    let plain = render(RmsStyle::Plain);
    let gemma = render(RmsStyle::OnePlus);
    // Each rounding to bf16 is written out on the f32 bits (one right shift each).
    let roundings = |s: &str| s.matches("stablehlo.shift_right_logical").count();
    assert_eq!(roundings(&plain), 2, "the norm rounded, then its product with the weight: {plain}");
    assert_eq!(roundings(&gemma), 1, "rounded once: {gemma}");
    assert!(
        plain.contains("(tensor<2x4xbf16>) -> tensor<2x4xf32>"),
        "the rounded norm widened for the product: {plain}"
    );
    assert!(gemma.contains("dense<1.00000000000000000e0> : tensor<4xf32>"), "(1 + w) in f32: {gemma}");
}

/// Mutation-sensitive: under bf16 activations a rounding to bf16 is written out on the f32 bits
/// (to nearest even: `bits + 0x7fff + lowest kept bit`, the low 16 bits cleared) before the
/// conversion, and an elementwise operation in the activations computes in f32 and rounds so;
/// under f32 activations neither emits anything but the operation.
#[test]
fn bf16_roundings_are_written_out_on_the_bits() {
    let render = |c: NumericContract, elem: Elem| {
        let mut m = Module::new("m");
        let (mut f, a) = m.func("f", &[Type::new(elem, &[2, 4]), Type::new(elem, &[2, 4])]);
        let s = c.residual(&mut f, &a[0], &a[1]);
        let y = c.act_mul(&mut f, &s, &a[1]);
        m.add_func(f, &[y]);
        m.finish().expect("valid")
    };
    let bf16 = render(NumericContract::bf16(crate::Bf16Dot::Pairs), Elem::BF16);
    assert_eq!(bf16.matches("stablehlo.shift_right_logical").count(), 2, "{bf16}");
    assert!(bf16.contains("dense<32767> : tensor<2x4xi32>"), "{bf16}");
    assert!(bf16.contains("dense<-65536> : tensor<2x4xi32>"), "{bf16}");
    assert!(bf16.contains("stablehlo.add") && bf16.contains("stablehlo.multiply"), "{bf16}");
    assert!(bf16.contains("stablehlo.multiply %") && bf16.contains(": tensor<2x4xf32>"), "computed in f32: {bf16}");
    let ops = op_names(&bf16);
    assert_eq!(ops.iter().filter(|o| **o == "stablehlo.bitcast_convert").count(), 4, "{ops:?}");
    let f32 = render(NumericContract::f32(), Elem::F32);
    let ops = op_names(&f32);
    assert_eq!(ops, vec!["stablehlo.add", "stablehlo.multiply"], "{f32}");
}

#[test]
fn contract_fingerprints_differ() {
    assert_ne!(NumericContract::f32().fingerprint(), NumericContract::bf16(crate::Bf16Dot::Pairs).fingerprint());
    assert_ne!(NumericContract::f32().fingerprint(), NumericContract::bf16(crate::Bf16Dot::InOrder).fingerprint());
    let mut next = NumericContract::f32();
    next.version += 1;
    assert_ne!(next.fingerprint(), NumericContract::f32().fingerprint());
}

/// Mutation-sensitive: bf16 SiLU widens, computes x / (1 + exp(-x)) and
/// rounds once, as torch's kernel does.
#[test]
fn bf16_silu_rounds_once() {
    let mut m = Module::new("m");
    let (mut f, a) = m.func("f", &[Type::new(Elem::BF16, &[4])]);
    let y = NumericContract::bf16(crate::Bf16Dot::Pairs).silu(&mut f, &a[0]);
    m.add_func(f, &[y]);
    let text = m.finish().expect("valid");
    let ops = op_names_rounded(&text);
    assert_eq!(
        ops,
        [
            "stablehlo.convert",
            "stablehlo.negate",
            "stablehlo.exponential",
            "stablehlo.constant",
            "stablehlo.add",
            "stablehlo.divide",
            "round bf16"
        ]
    );
}

/// Renders one contract activation on a bf16 `[4]` argument.
fn bf16_activation(act: impl Fn(&NumericContract, &mut crate::Func, &crate::Value) -> crate::Value) -> String {
    let mut m = Module::new("m");
    let (mut f, a) = m.func("f", &[Type::new(Elem::BF16, &[4])]);
    let y = act(&NumericContract::bf16(crate::Bf16Dot::Pairs), &mut f, &a[0]);
    m.add_func(f, &[y]);
    m.finish().expect("valid")
}

/// Mutation-sensitive: exact GELU widens, evaluates erf by Abramowitz and Stegun 7.1.26
/// (`1 - (r t) exp(-z^2)`, `r` by Horner), and rounds once.
#[test]
fn bf16_gelu_erf_follows_torchs_polynomial_and_rounds_once() {
    let text = bf16_activation(NumericContract::gelu_erf);
    let horner = ["stablehlo.multiply", "stablehlo.constant", "stablehlo.add"];
    let mut want = vec![
        "stablehlo.convert",
        "stablehlo.constant",
        "stablehlo.multiply",
        "stablehlo.abs",
        "stablehlo.constant",
        "stablehlo.constant",
        "stablehlo.multiply",
        "stablehlo.add",
        "stablehlo.divide",
        "stablehlo.constant",
    ];
    for _ in 0..4 {
        want.extend(horner);
    }
    want.extend([
        "stablehlo.multiply",
        "stablehlo.multiply",
        "stablehlo.negate",
        "stablehlo.exponential",
        "stablehlo.multiply",
        "stablehlo.subtract",
        "stablehlo.constant",
        "stablehlo.compare",
        "stablehlo.negate",
        "stablehlo.select",
        "stablehlo.constant",
        "stablehlo.multiply",
        "stablehlo.constant",
        "stablehlo.add",
        "stablehlo.multiply",
        "round bf16",
    ]);
    assert_eq!(op_names_rounded(&text), want, "{text}");
    // Each coefficient in Horner order, then 1/sqrt(2) scaling the input, all in f32.
    let literal = |v: f64| format!("dense<{v:.17e}> : tensor<4xf32>");
    let mut at = 0;
    for v in crate::contract::ERF_A {
        let found = text[at..].find(&literal(v)).unwrap_or_else(|| panic!("{v} after byte {at}: {text}"));
        at += found;
    }
    assert!(text.contains(&literal(crate::contract::ERF_P)), "{text}");
    assert!(text.contains(&literal(std::f64::consts::FRAC_1_SQRT_2)), "{text}");
    assert!(text.contains("stablehlo.compare LT"), "the sign comes from z < 0: {text}");
    assert!(text.contains("(tensor<4xf32>) -> tensor<4xbf16>"), "rounds to bf16: {text}");
}

/// Mutation-sensitive: quick GELU is `x * (1 / (1 + exp(-1.702 x)))` as torch's three bf16
/// tensor operations: `1.702 x` rounded, the sigmoid in f32 rounded, the product rounded.
#[test]
fn bf16_quick_gelu_uses_torchs_sigmoid_and_rounds_after_each_tensor_op() {
    let text = bf16_activation(NumericContract::quick_gelu);
    assert_eq!(
        op_names_rounded(&text),
        [
            "stablehlo.convert",
            "stablehlo.constant",
            "stablehlo.multiply",
            "round bf16",
            "stablehlo.convert",
            "stablehlo.negate",
            "stablehlo.exponential",
            "stablehlo.constant",
            "stablehlo.add",
            "stablehlo.divide",
            "round bf16",
            "stablehlo.convert",
            "stablehlo.convert",
            "stablehlo.multiply",
            "round bf16"
        ],
        "{text}"
    );
    assert!(text.contains(&format!("dense<{:.17e}> : tensor<4xf32>", 1.702)), "{text}");
    // The divide is 1 / (1 + e), not e / (1 + e) or x / (1 + e).
    let lines: Vec<&str> = text.lines().collect();
    let divide = lines.iter().find(|l| l.contains("stablehlo.divide")).expect("divide");
    let one = lines.iter().rev().find(|l| l.contains("dense<1.00000000000000000e0>")).expect("one");
    let one_name = one.trim().split(' ').next().expect("name");
    assert!(divide.contains(&format!("divide {one_name}, ")), "{divide}");
}

#[test]
fn the_contract_version_names_the_activations_it_defines() {
    assert_eq!(crate::CONTRACT_VERSION, 19);
    assert_eq!(NumericContract::f32().fingerprint(), "numeric-contract=v19:act=f32:acc=f32");
    assert_eq!(
        NumericContract::bf16(crate::Bf16Dot::InOrder).fingerprint(),
        "numeric-contract=v19:act=bf16:acc=f32:bf16-dot=in-order"
    );
}

/// A bf16-scaled 4-bit weight `[3, 64]` in groups of 32, and a function over `x`.
fn affine_module(rows: usize) -> (Module, crate::Func, Vec<crate::Value>, crate::AffineWeight) {
    let mut m = Module::new("m");
    let q = m.param("w.weight", Type::new(Elem::I4, &[3, 64]));
    let s = m.param("w.scales", Type::new(Elem::BF16, &[3, 2]));
    let b = m.param("w.biases", Type::new(Elem::BF16, &[3, 2]));
    let (mut f, a) = m.func("f", &[Type::new(Elem::BF16, &[rows, 64])]);
    let w = crate::AffineWeight { q: f.load(&q), scales: f.load(&s), biases: f.load(&b), group_size: 32 };
    (m, f, a, w)
}

/// Mutation-sensitive: dequantization zero-extends the integers (an unsigned view, then a
/// convert), widens scales and biases exactly, and rounds `q * scale` before `+ bias`, in f32.
#[test]
fn dequantization_is_q_times_scale_then_plus_bias_in_the_accumulator() {
    let (mut m, mut f, _, w) = affine_module(1);
    let d = NumericContract::bf16(crate::Bf16Dot::Pairs).dequantize(&mut f, &w);
    assert_eq!(d.ty(), &Type::new(Elem::F32, &[3, 2, 32]));
    m.add_func(f, &[d]);
    let text = m.finish().expect("valid");
    let body: Vec<&str> = op_names(&text).into_iter().filter(|o| *o != "util.global.load").collect();
    assert_eq!(
        body,
        [
            "stablehlo.reshape",
            "stablehlo.bitcast_convert",
            "stablehlo.convert",
            "stablehlo.convert",
            "stablehlo.broadcast_in_dim",
            "stablehlo.convert",
            "stablehlo.broadcast_in_dim",
            "stablehlo.multiply",
            "stablehlo.add",
        ]
    );
    assert!(text.contains("(tensor<3x2x32xi4>) -> tensor<3x2x32xui4>"), "unsigned view: {text}");
    assert!(text.contains("(tensor<3x2x32xui4>) -> tensor<3x2x32xf32>"), "zero-extended to f32: {text}");
    assert!(text.contains("(tensor<3x2xbf16>) -> tensor<3x2xf32>"), "scales widened: {text}");
    // The product's result is the sum's first operand.
    let lines: Vec<&str> = text.lines().collect();
    let product = lines.iter().find(|l| l.contains("stablehlo.multiply")).expect("multiply");
    let name = product.trim().split(' ').next().expect("name");
    let sum = lines.iter().find(|l| l.contains("stablehlo.add")).expect("add");
    assert!(sum.contains(&format!("add {name}, ")), "{sum}");
}

/// Mutation-sensitive: a quantized linear over up to 8 rows reduces over `[rows, out, groups,
/// group_size]` in f32 and rounds once; more rows contract the dequantized weight with
/// `dot_general`, also in f32, also rounded once.
#[test]
fn quantized_linear_accumulates_in_f32_and_rounds_once() {
    for (rows, contraction) in [
        (1usize, "stablehlo.reduce"),
        (2, "stablehlo.reduce"),
        (8, "stablehlo.reduce"),
        (9, "stablehlo.dot_general"),
        (24, "stablehlo.dot_general"),
    ] {
        let (mut m, mut f, a, w) = affine_module(rows);
        let y = NumericContract::bf16(crate::Bf16Dot::Pairs).qlinear(&mut f, &a[0], &w, None);
        assert_eq!(y.ty(), &Type::new(Elem::BF16, &[rows, 3]));
        m.add_func(f, &[y]);
        let text = m.finish().expect("valid");
        let ops = op_names(&text);
        let contractions = ops.iter().filter(|o| o.starts_with(contraction)).count();
        assert_eq!(contractions, 1, "{rows} rows: {ops:?}");
        let converts_to_bf16 =
            text.lines().filter(|l| l.contains("stablehlo.convert") && l.ends_with("xbf16>")).count();
        assert_eq!(converts_to_bf16, 1, "rounded once: {text}");
        if rows <= crate::contract::QLINEAR_FUSED_MAX_ROWS {
            let reduced = format!("across dimensions = [2, 3] : (tensor<{rows}x3x2x32xf32>");
            assert!(text.contains(&reduced), "reduced in f32: {text}");
        } else {
            let contracted = format!("(tensor<{rows}x64xf32>, tensor<3x64xf32>) -> tensor<{rows}x3xf32>");
            assert!(text.contains(&contracted), "in f32: {text}");
        }
    }
}

/// A bf16-scaled 4-bit weight `[8, 64]` in groups of 32, served in row tiles of 4
/// (`[2, 64, 4, 1]`, scales and biases `[2, 2, 4, 1]`), and a function over `x`.
fn tiled_affine_module(rows: usize) -> (Module, crate::Func, Vec<crate::Value>, crate::AffineWeight) {
    let mut m = Module::new("m");
    let q = m.param("w.weight|tile4", Type::new(Elem::I4, &[2, 64, 4, 1]));
    let s = m.param("w.scales|tile4", Type::new(Elem::BF16, &[2, 2, 4, 1]));
    let b = m.param("w.biases|tile4", Type::new(Elem::BF16, &[2, 2, 4, 1]));
    let (mut f, a) = m.func("f", &[Type::new(Elem::F32, &[rows, 64])]);
    let w = crate::AffineWeight { q: f.load(&q), scales: f.load(&s), biases: f.load(&b), group_size: 32 };
    (m, f, a, w)
}

/// Mutation-sensitive: a weight in row tiles dequantizes into `[out / t, groups, group_size, t]`,
/// each tile row's scale and bias broadcast over its group's inputs; a decode step (up to 8
/// rows) sums each group over its inputs, then the groups, in f32 (the order of the two
/// reductions is the contract's association); more rows and a prompt's contract the dequantized
/// tiles with `linalg.mmt4d`. Each rounds once.
#[test]
fn a_quantized_weight_in_row_tiles_sums_groups_then_their_sums() {
    let (mut m, mut f, _, w) = tiled_affine_module(1);
    assert_eq!(w.shape(), [8, 64]);
    assert_eq!(w.tile_rows(), Some(4));
    let d = NumericContract::f32().dequantize(&mut f, &w);
    assert_eq!(d.ty(), &Type::new(Elem::F32, &[2, 2, 32, 4]));
    m.add_func(f, &[d]);
    let text = m.finish().expect("valid");
    assert!(text.contains("(tensor<2x64x4x1xi4>) -> tensor<2x2x32x4xi4>"), "{text}");
    assert!(text.contains("dims = [0, 1, 3] : (tensor<2x2x4xf32>) -> tensor<2x2x32x4xf32>"), "{text}");
    for (rows, kind, reductions) in [
        (
            1usize,
            Rows::ByCount,
            vec!["across dimensions = [2] : (tensor<2x2x32x4xf32>", "across dimensions = [1] : (tensor<2x2x4xf32>"],
        ),
        (
            4,
            Rows::ByCount,
            vec!["across dimensions = [3] : (tensor<4x2x2x32x4xf32>", "across dimensions = [2] : (tensor<4x2x2x4xf32>"],
        ),
        (9, Rows::ByCount, vec![]),
        (4, Rows::Prompt, vec![]),
    ] {
        let (mut m, mut f, a, w) = tiled_affine_module(rows);
        let y = NumericContract::bf16(crate::Bf16Dot::InOrder).qlinear_rows(&mut f, &a[0], &w, None, kind);
        assert_eq!(y.ty(), &Type::new(Elem::BF16, &[rows, 8]));
        m.add_func(f, &[y]);
        let text = m.finish().expect("valid");
        let converts_to_bf16 =
            text.lines().filter(|l| l.contains("stablehlo.convert") && l.ends_with("xbf16>")).count();
        assert_eq!(converts_to_bf16, 1, "rounded once: {text}");
        let at: Vec<usize> = reductions.iter().map(|r| text.find(r).unwrap_or(usize::MAX)).collect();
        if reductions.is_empty() {
            assert!(text.contains("linalg.mmt4d"), "{rows} rows, {kind:?}: {text}");
            assert!(text.contains("tensor<2x64x4x1xf32>"), "the dequantized tiles: {text}");
        } else {
            assert!(at[0] < at[1] && at[1] < usize::MAX, "{rows} rows: groups, then their sums: {text}");
            assert!(!text.contains("linalg.mmt4d"), "{text}");
        }
    }
}

/// Mutation-sensitive: a prompt's rows (a prefill call) contract as `x @ w^T` and the
/// dequantized quantized weight at every count, the forms a chunk's many rows take, where a
/// decode step's few rows take the weight on the left and the fused reduction.
#[test]
fn a_prompts_rows_take_the_many_rows_form_at_every_count() {
    for rows in [1usize, 4, 8, 16] {
        let mut m = Module::new("m");
        let w = m.param("w", Type::new(Elem::F32, &[3, 64]));
        let (mut f, a) = m.func("f", &[Type::new(Elem::F32, &[rows, 64])]);
        let wv = f.load(&w);
        let y = NumericContract::f32().linear_rows(&mut f, &a[0], &wv, None, crate::Rows::Prompt);
        m.add_func(f, &[y]);
        let text = m.finish().expect("valid");
        let x_left = format!("(tensor<{rows}x64xf32>, tensor<3x64xf32>) -> tensor<{rows}x3xf32>");
        assert!(text.contains(&x_left), "{rows} rows, x on the left: {text}");
        assert!(!op_names(&text).contains(&"stablehlo.transpose"), "{rows} rows: {text}");

        let (mut m, mut f, a, w) = affine_module(rows);
        let y = NumericContract::bf16(crate::Bf16Dot::Pairs).qlinear_rows(&mut f, &a[0], &w, None, crate::Rows::Prompt);
        m.add_func(f, &[y]);
        let text = m.finish().expect("valid");
        let contracted = format!("(tensor<{rows}x64xf32>, tensor<3x64xf32>) -> tensor<{rows}x3xf32>");
        assert!(text.contains(&contracted), "{rows} quantized rows, the dequantized weight contracted: {text}");
        assert!(!op_names(&text).contains(&"stablehlo.reduce"), "{rows} quantized rows: {text}");
    }
}

/// The descriptor names the sources, the dtypes, the rounding points and the backend, states the
/// dequantization only for quantized sources, and is stable (its JSON keys every artifact).
#[test]
fn the_contract_descriptor_states_every_choice_and_is_stable() {
    let dense = NumericContract::f32().descriptor(vec!["bf16".into()], Elem::F32, "IREE x llvm-cpu:host".into());
    assert_eq!(dense.dequantization, None);
    assert_eq!(dense.to_json(), dense.clone().to_json());
    assert!(
        dense
            .to_json()
            .starts_with("{\"version\":19,\"sources\":[\"bf16\"],\"activations\":\"f32\",\"accumulate\":\"f32\"")
    );
    assert_eq!(dense.bf16_dot, None, "f32 activations sum no bf16 products");
    assert!(!dense.to_json().contains("\"bf16_dot\":"), "{}", dense.to_json());
    for (dot, named) in
        [(crate::Bf16Dot::Pairs, "\"bf16_dot\":\"pairs\""), (crate::Bf16Dot::InOrder, "\"bf16_dot\":\"in-order\"")]
    {
        let d = NumericContract::bf16(dot).descriptor(vec!["bf16".into()], Elem::F32, "IREE x llvm-cpu:host".into());
        assert!(d.to_json().contains(named), "{}", d.to_json());
    }
    assert!(dense.rounding.iter().any(|r| r.starts_with("qlinear")));
    let q = NumericContract::f32().descriptor(
        vec!["affine bits=4 group_size=64 scales=f32".into(), "f32".into()],
        Elem::F32,
        "IREE x llvm-cpu:host".into(),
    );
    assert!(
        q.dequantization.as_deref().is_some_and(|d| d.contains("w = f32(q) * f32(scale), rounded, then + f32(bias)"))
    );
    assert_ne!(q.to_json(), dense.to_json());
    let other_backend = NumericContract::f32().descriptor(vec!["bf16".into()], Elem::F32, "IREE y".into());
    assert_ne!(other_backend.to_json(), dense.to_json());
}

/// Mutation-sensitive: a linear over a weight in row tiles under f32 activations takes `x` in
/// f32, tiles its rows (`[rows / m0, in, m0, 1]`, `m0` the largest divisor of the rows up to 16;
/// rows with none from 8 up padded to a multiple of 16), contracts with `linalg.mmt4d` reading
/// the bf16 weight as stored, adds the bias in f32 and rounds once.
#[test]
fn a_tiled_linear_contracts_the_stored_weight_by_mmt4d_in_f32_and_rounds_once() {
    for (rows, m0) in [(1usize, 1usize), (8, 8), (64, 16), (24, 12), (40, 10), (21, 16), (577, 16)] {
        let mut m = Module::new("m");
        let c = NumericContract::f32();
        let tiles = c.tiles(Elem::BF16, 64, 64).expect("bf16 rows fill tiles of 32");
        assert_eq!(tiles, crate::Tiles::f32(32));
        let w = m.param(&tiles.key("w.weight"), Type::new(Elem::BF16, &tiles.shape(64, 64)));
        let b = m.param("w.bias", Type::new(Elem::BF16, &[64]));
        let (mut f, a) = m.func("f", &[Type::new(Elem::F32, &[1, rows, 64])]);
        let (wv, bv) = (f.load(&w), f.load(&b));
        let y = c.linear_tiled(&mut f, &a[0], &wv, Some(&bv));
        assert_eq!(y.ty(), &Type::new(Elem::F32, &[1, rows, 64]));
        m.add_func(f, &[y]);
        let text = m.finish().expect("valid");
        assert!(text.contains("\"model\"::\"w.weight|tile32\"> : tensor<2x64x32x1xbf16>"), "{text}");
        let line = text.lines().find(|l| l.contains("linalg.mmt4d")).expect("an mmt4d");
        let m1 = rows.div_ceil(m0);
        let types = format!(": tensor<{m1}x64x{m0}x1xf32>, tensor<2x64x32x1xbf16>) outs(");
        assert!(line.contains(&types), "{rows} rows: x in f32 tiles, the weight as stored: {line}");
        assert!(line.ends_with(&format!("-> tensor<{m1}x2x{m0}x32xf32>")), "accumulates in f32: {line}");
        let ops = op_names(&text);
        assert_eq!(ops.iter().filter(|o| **o == "linalg.mmt4d").count(), 1, "{ops:?}");
        assert!(!ops.contains(&"stablehlo.dot_general"), "{ops:?}");
        assert!(text.contains("(tensor<64xbf16>) -> tensor<64xf32>"), "bias widened: {text}");
        assert!(text.contains("stablehlo.add"), "bias added: {text}");
        let padded = rows.next_multiple_of(16) > rows && rows % m0 != 0;
        assert_eq!(padded, ops.contains(&"stablehlo.slice"), "{rows} rows padded, their outputs dropped: {ops:?}");
    }
}

/// Mutation-sensitive: under bf16 activations a bf16 weight is served in tiles of 16 rows by 2
/// inputs, `x` stays bf16 in the same tiles (`[rows / m0, in / 2, m0, 2]`), `linalg.mmt4d`
/// accumulates the two bf16 operands in f32, and the bias is added in f32 before the one rounding
/// to bf16. f32 and f16 weights are not tiled under bf16 activations, nor matrices that do not
/// fill the tiles.
#[test]
fn a_bf16_tiled_linear_contracts_bf16_operands_in_tiles_of_16_by_2_into_f32_and_rounds_once() {
    let c = NumericContract::bf16(crate::Bf16Dot::Pairs);
    assert_eq!(c.tiles(Elem::BF16, 64, 64), Some(crate::Tiles::BF16));
    assert_eq!(c.tiles(Elem::BF16, 24, 64), None, "24 rows do not fill tiles of 16");
    assert_eq!(c.tiles(Elem::BF16, 64, 63), None, "63 inputs do not fill pairs");
    assert_eq!(c.tiles(Elem::F16, 64, 64), None);
    assert_eq!(c.tiles(Elem::F32, 64, 64), None);
    assert_eq!(NumericContract::f32().tiles(Elem::F32, 64, 64), Some(crate::Tiles::f32(16)), "f32 weights, f32 tiles");
    for (rows, m0) in [(1usize, 1usize), (8, 8), (16, 16), (64, 16)] {
        let mut m = Module::new("m");
        let tiles = crate::Tiles::BF16;
        let w = m.param(&tiles.key("w.weight"), Type::new(Elem::BF16, &tiles.shape(64, 64)));
        let b = m.param("w.bias", Type::new(Elem::BF16, &[64]));
        let (mut f, a) = m.func("f", &[Type::new(Elem::BF16, &[1, rows, 64])]);
        let (wv, bv) = (f.load(&w), f.load(&b));
        let y = c.linear_tiled(&mut f, &a[0], &wv, Some(&bv));
        assert_eq!(y.ty(), &Type::new(Elem::BF16, &[1, rows, 64]));
        m.add_func(f, &[y]);
        let text = m.finish().expect("valid");
        assert!(text.contains("\"model\"::\"w.weight|tile16x2\"> : tensor<4x32x16x2xbf16>"), "{text}");
        let line = text.lines().find(|l| l.contains("linalg.mmt4d")).expect("an mmt4d");
        let m1 = rows / m0;
        let types = format!(": tensor<{m1}x32x{m0}x2xbf16>, tensor<4x32x16x2xbf16>) outs(");
        assert!(line.contains(&types), "{rows} rows: x in bf16 tiles, the weight as stored: {line}");
        assert!(line.ends_with(&format!("-> tensor<{m1}x4x{m0}x16xf32>")), "accumulates in f32: {line}");
        let to_bf16 = text.lines().filter(|l| l.contains("stablehlo.convert") && l.ends_with("xbf16>")).count();
        assert_eq!(to_bf16, 1, "rounded once: {text}");
        let to_f32 = text.lines().filter(|l| l.contains("stablehlo.convert") && l.ends_with("xf32>")).count();
        assert_eq!(to_f32, 1, "only the bias is widened ahead: {text}");
        assert!(text.contains("(tensor<64xbf16>) -> tensor<64xf32>"), "bias widened: {text}");
    }
}

/// Mutation-sensitive: a bf16 linear summed in pairs over more than [`crate::PAIRS_BLOCK_INPUTS`]
/// inputs, over a prompt's rows or more than 16 by count (an encoder's), contracts each block of
/// them apart, from zero, and adds the blocks' sums in order in f32 before the one rounding
/// (torch's oneDNN gemm); a decode step's rows (up to 16 by count) keep one contraction over all
/// inputs whatever their count, and so does the in-order sum. Whether the blocks are torch's is
/// held by `decoder::bf16_linear_sums_as_torch` in the host's tests.
#[test]
fn a_bf16_linear_summed_in_pairs_restarts_every_block_of_inputs_over_a_prompts_rows() {
    let render = |c: NumericContract, tiles: crate::Tiles, rows: usize, inputs: usize, kind: crate::Rows| {
        let mut m = Module::new("m");
        let w = m.param(&tiles.key("w.weight"), Type::new(Elem::BF16, &tiles.shape(64, inputs)));
        let (mut f, a) = m.func("f", &[Type::new(Elem::BF16, &[rows, inputs])]);
        let wv = f.load(&w);
        let y = c.linear_tiled_rows(&mut f, &a[0], &wv, None, kind);
        m.add_func(f, &[y]);
        m.finish().expect("valid")
    };
    let pairs = NumericContract::bf16(crate::Bf16Dot::Pairs);
    let (prompt, by_count) = (crate::Rows::Prompt, crate::Rows::ByCount);
    assert_eq!(crate::PAIRS_BLOCK_INPUTS, 1024);
    let cases = [
        (8usize, 1024usize, prompt, 1usize),
        (8, 2560, prompt, 3),
        (1, 2560, prompt, 3),
        (64, 1536, by_count, 2),
        (1, 2560, by_count, 1),
        (16, 2560, by_count, 1),
    ];
    for (rows, inputs, kind, blocks) in cases {
        let text = render(pairs, crate::Tiles::BF16, rows, inputs, kind);
        let mmt4d: Vec<&str> = text.lines().filter(|l| l.contains("linalg.mmt4d")).collect();
        assert_eq!(mmt4d.len(), blocks, "{rows} rows ({kind:?}) by {inputs} inputs: {text}");
        if blocks > 1 {
            // Depths of the blocks in pairs: 512 each, the last what is left.
            let last = (inputs / 2 - 1) % 512 + 1;
            assert!(mmt4d[0].contains("x512x16x2xbf16>) outs("), "{}", mmt4d[0]);
            assert!(mmt4d[blocks - 1].contains(&format!("x{last}x16x2xbf16>) outs(")), "{}", mmt4d[blocks - 1]);
            let adds = text.lines().filter(|l| l.contains("stablehlo.add") && l.ends_with("xf32>")).count();
            assert_eq!(adds, blocks - 1, "the blocks' sums added in f32: {text}");
        }
    }
    let in_order = render(NumericContract::bf16(crate::Bf16Dot::InOrder), crate::Tiles::f32(32), 8, 2560, prompt);
    assert_eq!(in_order.lines().filter(|l| l.contains("linalg.mmt4d")).count(), 1, "{in_order}");
}

/// Mutation-sensitive: under bf16 pairs the softmax is torch's AVX-512 form (Sleef's `expf` by
/// fused multiply-adds, the exponentials' 16 lanes summed by one `mmt4d` and halved, times the
/// reciprocal); every other contract keeps the backend's `exp` and division.
#[test]
fn the_bf16_pairs_softmax_is_torchs_avx512_form() {
    let render = |c: NumericContract, n: usize| {
        let mut m = Module::new("m");
        let (mut f, a) = m.func("f", &[Type::new(Elem::BF16, &[3, n])]);
        let y = c.softmax(&mut f, &a[0]);
        m.add_func(f, &[y]);
        m.finish().expect("valid")
    };
    let count = |text: &str, op: &str| text.lines().filter(|l| l.contains(op)).count();
    let torch = render(NumericContract::bf16(crate::Bf16Dot::Pairs), 40);
    assert_eq!(count(&torch, "math.fma"), 8, "two steps of the reduction, six of the polynomial: {torch}");
    assert_eq!(count(&torch, "stablehlo.exponential"), 0, "{torch}");
    assert_eq!(count(&torch, "linalg.mmt4d"), 1, "{torch}");
    assert!(torch.contains("tensor<1x3x1x16xf32>"), "16 lanes a row: {torch}");
    assert!(torch.contains("tensor<3x3x16x1xf32>"), "40 inputs padded to 3 vectors: {torch}");
    // Fewer inputs than a vector: one at a time, no lanes.
    let short = render(NumericContract::bf16(crate::Bf16Dot::Pairs), 5);
    assert_eq!(count(&short, "linalg.mmt4d"), 0, "{short}");
    for c in [NumericContract::bf16(crate::Bf16Dot::InOrder), NumericContract::f32()] {
        let text = render(c, 40);
        assert_eq!((count(&text, "math.fma"), count(&text, "stablehlo.exponential")), (0, 1), "{text}");
        assert!(count(&text, "stablehlo.divide") >= 1, "{text}");
    }
}

/// Mutation-sensitive: attention's products over a prompt's rows, summed in pairs, contract each
/// head's second operand in bf16 tiles (padded to whole tiles) with the linears' blocks; a
/// decode step's, and every other contract's, keep one `dot_general` in the backend's order.
#[test]
fn a_prompts_attention_products_sum_in_pairs_per_head() {
    let render = |c: NumericContract, n: usize, m: usize, p: usize, k: usize, kind: crate::Rows| {
        let mut m_ = Module::new("m");
        let (mut f, a) = m_.func("f", &[Type::new(Elem::BF16, &[n, m, k]), Type::new(Elem::BF16, &[n, p, k])]);
        let y = c.matmul_nt_rows(&mut f, &a[0], &a[1], kind);
        assert_eq!(y.ty(), &Type::new(c.activations, &[n, m, p]));
        m_.add_func(f, &[y]);
        m_.finish().expect("valid")
    };
    let count = |text: &str, op: &str| text.lines().filter(|l| l.contains(op)).count();
    let pairs = NumericContract::bf16(crate::Bf16Dot::Pairs);
    let (prompt, by_count) = (crate::Rows::Prompt, crate::Rows::ByCount);
    assert!(pairs.attends_in_pairs(prompt) && !pairs.attends_in_pairs(by_count));
    // Scores: 2 heads, 40 keys padded to 48 (3 tiles), 128 wide (one block).
    let scores = render(pairs, 2, 12, 40, 128, prompt);
    assert_eq!(count(&scores, "linalg.mmt4d"), 2, "{scores}");
    assert!(scores.contains("tensor<3x64x16x2xbf16>) outs("), "{scores}");
    assert_eq!(count(&scores, "stablehlo.dot_general"), 0, "{scores}");
    // Outputs: 1600 keys, two blocks of pairs per head.
    let outputs = render(pairs, 1, 12, 128, 1600, prompt);
    assert_eq!(count(&outputs, "linalg.mmt4d"), 2, "{outputs}");
    assert!(outputs.contains("tensor<8x512x16x2xbf16>) outs(") && outputs.contains("tensor<8x288x16x2xbf16>) outs("));
    for (c, kind) in
        [(pairs, by_count), (NumericContract::bf16(crate::Bf16Dot::InOrder), prompt), (NumericContract::f32(), prompt)]
    {
        let text = render(c, 2, 12, 40, 128, kind);
        assert_eq!((count(&text, "linalg.mmt4d"), count(&text, "stablehlo.dot_general")), (0, 1), "{kind:?}: {text}");
    }
}

/// Mutation-sensitive: summed in order ([`crate::Bf16Dot::InOrder`], CPUs without AVX512-BF16),
/// bf16 activations take the f32 contract's tiles of 32 rows by one input, `x` widened to f32
/// exactly ahead of the contraction, and round once; the two sums have distinct fingerprints.
#[test]
fn a_bf16_linear_summed_in_order_takes_the_f32_tiles_and_rounds_once() {
    let c = NumericContract::bf16(crate::Bf16Dot::InOrder);
    assert_ne!(c.fingerprint(), NumericContract::bf16(crate::Bf16Dot::Pairs).fingerprint());
    assert_eq!(crate::Bf16Dot::for_cpu(true), crate::Bf16Dot::Pairs);
    assert_eq!(crate::Bf16Dot::for_cpu(false), crate::Bf16Dot::InOrder);
    assert_eq!(c.tiles(Elem::BF16, 64, 64), Some(crate::Tiles::f32(32)));
    assert_eq!(c.tiles(Elem::BF16, 48, 64), None, "48 rows do not fill tiles of 32");
    let mut m = Module::new("m");
    let tiles = crate::Tiles::f32(32);
    let w = m.param(&tiles.key("w.weight"), Type::new(Elem::BF16, &tiles.shape(64, 64)));
    let (mut f, a) = m.func("f", &[Type::new(Elem::BF16, &[1, 64, 64])]);
    let wv = f.load(&w);
    let y = c.linear_tiled(&mut f, &a[0], &wv, None);
    assert_eq!(y.ty(), &Type::new(Elem::BF16, &[1, 64, 64]));
    m.add_func(f, &[y]);
    let text = m.finish().expect("valid");
    assert!(text.contains("\"model\"::\"w.weight|tile32\"> : tensor<2x64x32x1xbf16>"), "{text}");
    let line = text.lines().find(|l| l.contains("linalg.mmt4d")).expect("an mmt4d");
    assert!(line.contains(": tensor<4x64x16x1xf32>, tensor<2x64x32x1xbf16>) outs("), "x widened, f32 tiles: {line}");
    assert!(text.contains("(tensor<1x64x64xbf16>) -> tensor<1x64x64xf32>"), "x widened exactly: {text}");
    let to_bf16 = text.lines().filter(|l| l.contains("stablehlo.convert") && l.ends_with("xbf16>")).count();
    assert_eq!(to_bf16, 1, "rounded once: {text}");
}

/// Mutation-sensitive: a 16-bit weight's tiles are two vectors of f32 outputs of the target: 16
/// rows on a CPU with 256-bit vectors (AVX2), 32 with 512-bit ones and where the width is not
/// known, under f32 activations and bf16 summed in order alike; an f32 weight's are one vector
/// (two in a graph of many rows only); the tiled linear contracts what is
/// declared, and bf16 summed in pairs keeps the microkernel's tile.
#[test]
fn the_weight_tiles_are_two_vectors_of_the_target() {
    assert_eq!(crate::weight_tile_rows(Some(256)), 16);
    assert_eq!(crate::weight_tile_rows(Some(512)), 32);
    assert_eq!(crate::weight_tile_rows(None), 32);
    assert_eq!(NumericContract::f32().tile_rows, 32, "the default is the widest");
    let avx2 = NumericContract::f32().for_vectors(Some(256));
    assert_eq!(avx2.tiles(Elem::BF16, 48, 64), Some(crate::Tiles::f32(16)), "48 rows fill tiles of 16");
    assert_eq!(avx2.tiles(Elem::F32, 48, 64), Some(crate::Tiles::f32(8)), "f32 weights: one vector of them");
    assert_eq!(NumericContract::f32().for_vectors(Some(512)).tiles(Elem::F32, 48, 64), Some(crate::Tiles::f32(16)));
    assert_eq!(avx2.tiles(Elem::F32, 44, 64), None, "44 rows do not fill tiles of 8");
    assert_eq!(avx2.for_many_rows().tiles(Elem::F32, 48, 64), Some(crate::Tiles::f32(16)), "many rows only: two");
    assert_eq!(avx2.for_many_rows().tiles(Elem::BF16, 48, 64), Some(crate::Tiles::f32(16)));
    assert_eq!(NumericContract::f32().for_vectors(Some(512)).tiles(Elem::BF16, 48, 64), None);
    let in_order = NumericContract::bf16(crate::Bf16Dot::InOrder).for_vectors(Some(256));
    assert_eq!(in_order.tiles(Elem::BF16, 64, 64), Some(crate::Tiles::f32(16)));
    let pairs = NumericContract::bf16(crate::Bf16Dot::Pairs).for_vectors(Some(256));
    assert_eq!(pairs.tiles(Elem::BF16, 64, 64), Some(crate::Tiles::BF16));
    let mut m = Module::new("m");
    let tiles = avx2.tiles(Elem::F16, 64, 64).expect("f16 rows fill tiles of 16");
    let w = m.param(&tiles.key("w.weight"), Type::new(Elem::F16, &tiles.shape(64, 64)));
    let (mut f, a) = m.func("f", &[Type::new(Elem::F32, &[8, 64])]);
    let wv = f.load(&w);
    let y = avx2.linear_tiled(&mut f, &a[0], &wv, None);
    assert_eq!(y.ty(), &Type::new(Elem::F32, &[8, 64]));
    m.add_func(f, &[y]);
    let text = m.finish().expect("valid");
    assert!(text.contains("\"model\"::\"w.weight|tile16\"> : tensor<4x64x16x1xf16>"), "{text}");
    let line = text.lines().find(|l| l.contains("linalg.mmt4d")).expect("an mmt4d");
    assert!(line.contains(": tensor<1x64x8x1xf32>, tensor<4x64x16x1xf16>) outs("), "{line}");
    assert!(line.ends_with("-> tensor<1x4x8x16xf32>"), "{line}");
}

/// Rows of a tiled table are gathered at `(row / t, :, row % t, :)`, in tiles one input deep and
/// two deep alike.
#[test]
fn rows_of_a_tiled_table_are_gathered_across_the_tile() {
    for (tiles, shape) in [(crate::Tiles::f32(32), "4x8x32x1"), (crate::Tiles::BF16, "8x4x16x2")] {
        let mut m = Module::new("m");
        let w = m.param(&tiles.key("embed.weight"), Type::new(Elem::BF16, &tiles.shape(128, 8)));
        let (mut f, a) = m.func("f", &[Type::new(Elem::I32, &[5])]);
        let table = f.load(&w);
        let rows = f.gather_tiled_rows(&table, &a[0]);
        assert_eq!(rows.ty(), &Type::new(Elem::BF16, &[5, 8]));
        m.add_func(f, &[rows]);
        let text = m.finish().expect("valid");
        assert!(text.contains(&format!("tensor<{shape}xbf16>")), "{text}");
        assert!(text.contains("collapsed_slice_dims = [0, 2], start_index_map = [0, 1, 2, 3]"), "{text}");
        let (depth, k) = (8 / tiles.depth, tiles.depth);
        assert!(text.contains(&format!("slice_sizes = array<i64: 1, {depth}, 1, {k}>")), "{text}");
        assert!(text.contains(&format!("stablehlo.constant dense<{}> : tensor<5xi32>", tiles.rows)), "{text}");
        assert!(text.contains("stablehlo.divide") && text.contains("stablehlo.subtract"), "{text}");
    }
}

/// Mutation-sensitive: a bf16 tensor times a constant (attention's score scale) is computed as
/// torch multiplies a tensor by a Python number: widened, multiplied by the scale as an f32
/// constant (never rounded to bf16: 32^-0.5 is 0.17677669 there and 0.17578125 in bf16, which
/// made two thirds of Qwen3's logits differ from transformers in bf16), rounded once. Under f32
/// activations it is one multiply.
#[test]
fn bf16_act_scale_multiplies_by_the_f32_scale_and_rounds_once() {
    let s = 32f64.powf(-0.5);
    let mut m = Module::new("m");
    let (mut f, a) = m.func("f", &[Type::new(Elem::BF16, &[4])]);
    let y = NumericContract::bf16(crate::Bf16Dot::Pairs).act_scale(&mut f, &a[0], s);
    m.add_func(f, &[y]);
    let text = m.finish().expect("valid");
    assert_eq!(
        op_names_rounded(&text),
        ["stablehlo.convert", "stablehlo.constant", "stablehlo.multiply", "round bf16"]
    );
    let constant = text.lines().find(|l| l.contains("stablehlo.constant")).expect("the scale");
    assert!(constant.ends_with("xf32>"), "the scale is an f32 constant: {constant}");
    let value: f64 =
        constant.split("dense<").nth(1).and_then(|v| v.split('>').next()).expect("literal").parse().expect("a number");
    assert_eq!(value as f32, s as f32, "the scale is not rounded below f32: {constant}");

    let mut m = Module::new("m");
    let (mut f, a) = m.func("f", &[t(&[4])]);
    let y = NumericContract::f32().act_scale(&mut f, &a[0], s);
    m.add_func(f, &[y]);
    let text = m.finish().expect("valid");
    assert_eq!(op_names(&text), ["stablehlo.constant", "stablehlo.multiply"]);
}
