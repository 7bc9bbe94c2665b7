//! Small programs compiled from StableHLO and run on both CPU drivers,
//! checked against results computed by hand in the test.

use mlxcel_shim::{Arg, HostTensor};

use crate::support::{DRIVERS, assert_close, compile, compile_with, session};

const ATTENTION: &str = r#"
module @attn {
  func.func @step(%q: tensor<1x4xf32>, %k: tensor<3x4xf32>, %v: tensor<3x4xf32>) -> tensor<1x4xf32> {
    %s = stablehlo.dot_general %q, %k, contracting_dims = [1] x [1] : (tensor<1x4xf32>, tensor<3x4xf32>) -> tensor<1x3xf32>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %mx = stablehlo.reduce(%s init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<1x3xf32>, tensor<f32>) -> tensor<1xf32>
    %mxb = stablehlo.broadcast_in_dim %mx, dims = [0] : (tensor<1xf32>) -> tensor<1x3xf32>
    %d = stablehlo.subtract %s, %mxb : tensor<1x3xf32>
    %e = stablehlo.exponential %d : tensor<1x3xf32>
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %sum = stablehlo.reduce(%e init: %zero) applies stablehlo.add across dimensions = [1] : (tensor<1x3xf32>, tensor<f32>) -> tensor<1xf32>
    %sumb = stablehlo.broadcast_in_dim %sum, dims = [0] : (tensor<1xf32>) -> tensor<1x3xf32>
    %p = stablehlo.divide %e, %sumb : tensor<1x3xf32>
    %o = stablehlo.dot_general %p, %v, contracting_dims = [1] x [0] : (tensor<1x3xf32>, tensor<3x4xf32>) -> tensor<1x4xf32>
    return %o : tensor<1x4xf32>
  }
  func.func @scale_i32(%x: tensor<5xi32>, %by: tensor<i32>) -> tensor<5xi32> {
    %b = stablehlo.broadcast_in_dim %by, dims = [] : (tensor<i32>) -> tensor<5xi32>
    %r = stablehlo.multiply %x, %b : tensor<5xi32>
    return %r : tensor<5xi32>
  }
}
"#;

/// softmax(q k^T) v, in f64, the way one writes it on paper.
fn attention_by_hand(q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
    let scores: Vec<f64> =
        (0..3).map(|j| (0..4).map(|c| f64::from(q[c]) * f64::from(k[j * 4 + c])).sum::<f64>()).collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = exps.iter().sum();
    (0..4).map(|c| (0..3).map(|j| exps[j] / total * f64::from(v[j * 4 + c])).sum::<f64>() as f32).collect()
}

#[test]
fn attention_step_matches_hand_computation_on_both_drivers() {
    let artifact = compile("attn", ATTENTION);
    let q = [0.5f32, -1.0, 0.25, 2.0];
    let k = [1.0f32, 0.0, 0.5, 0.25, -0.5, 1.0, 0.0, 0.75, 0.3, 0.3, -0.2, 0.1];
    let v = [1.0f32, 2.0, 3.0, 4.0, -1.0, 0.5, 0.0, 2.0, 0.25, 0.75, -3.0, 1.0];
    let want = attention_by_hand(&q, &k, &v);
    for driver in DRIVERS {
        let s = session(driver, &artifact);
        let q = HostTensor::from_slice(vec![1, 4], &q).expect("q");
        let k = HostTensor::from_slice(vec![3, 4], &k).expect("k");
        let v = HostTensor::from_slice(vec![3, 4], &v).expect("v");
        let out = s.call("attn.step", &[Arg::from(&q), (&k).into(), (&v).into()]).expect("runs");
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].desc().shape, vec![1, 4]);
        let got = out[0].to_host().expect("read").to_vec::<f32>().expect("f32");
        assert_close(&got, &want, 1e-6);
    }
}

#[test]
fn integer_and_scalar_tensors_round_trip() {
    let artifact = compile("attn", ATTENTION);
    for driver in DRIVERS {
        let s = session(driver, &artifact);
        let x = HostTensor::from_slice(vec![5], &[1i32, -2, 3, 40, 0]).expect("x");
        let by = HostTensor::scalar(-3i32);
        let out = s.call("attn.scale_i32", &[(&x).into(), (&by).into()]).expect("runs");
        assert_eq!(out[0].to_host().expect("read").to_vec::<i32>().expect("i32"), vec![-3, 6, -9, -120, 0]);
    }
}

#[test]
fn device_results_feed_the_next_call_without_host_copies() {
    let artifact = compile("attn", ATTENTION);
    let s = session(mlxcel_shim::Driver::LocalSync, &artifact);
    let x = HostTensor::from_slice(vec![5], &[1i32, 2, 3, 4, 5]).expect("x");
    let two = HostTensor::scalar(2i32);
    let mut current = s.call("attn.scale_i32", &[(&x).into(), (&two).into()]).expect("runs").remove(0);
    for _ in 0..3 {
        current = s.call("attn.scale_i32", &[(&current).into(), (&two).into()]).expect("runs").remove(0);
    }
    assert_eq!(current.to_host().expect("read").to_vec::<i32>().expect("i32"), vec![16, 32, 48, 64, 80]);
}

#[test]
fn compile_errors_carry_the_compiler_diagnostics() {
    let target = mlxcel_shim::Target::host_cpu();
    let bad = "func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = stablehlo.add %x, %undefined : tensor<4xf32>\n  return %y : tensor<4xf32>\n}";
    let err = crate::support::compiler().compile("broken", bad, &target, &[]).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("compiling broken failed"), "{text}");
    assert!(text.contains("undeclared SSA value"), "the diagnostic says what is wrong: {text}");
}

#[test]
fn a_compile_loads_its_tuning_spec_before_its_own_executables() {
    // Compiles run with MLIR threading on; the spec must be loaded by the compile's one-dispatch
    // module first (see `load_tuning_spec`), so a spec that cannot be loaded fails there.
    let target = mlxcel_shim::Target::host_cpu();
    let add = "func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = stablehlo.add %x, %x : tensor<4xf32>\n  return %y : tensor<4xf32>\n}";
    let flags = ["--iree-codegen-tuning-spec-path=/nonexistent/spec.mlir".to_owned()];
    let err = crate::support::compiler().compile("spec-first", add, &target, &flags).unwrap_err().to_string();
    assert!(err.contains("Failed to load tuning spec"), "{err}");
    assert!(err.contains("@load_tuning_spec"), "the one-dispatch module loads the spec first: {err}");
    assert!(!err.contains("@f("), "the module itself never reached its configuration: {err}");
}

#[test]
fn an_asynchronous_call_runs_while_another_device_is_used_and_gives_the_same_results() {
    let flags = ["--iree-execution-model=async-external".to_owned()];
    let asynchronous = compile_with("attn", ATTENTION, &flags);
    let synchronous = compile("attn", ATTENTION);
    let q = [0.5f32, -1.0, 0.25, 2.0];
    let k = [1.0f32, 0.0, 0.5, 0.25, -0.5, 1.0, 0.0, 0.75, 0.3, 0.3, -0.2, 0.1];
    let v = [1.0f32, 2.0, 3.0, 4.0, -1.0, 0.5, 0.0, 2.0, 0.25, 0.75, -3.0, 1.0];
    let want = attention_by_hand(&q, &k, &v);
    let (q, k, v) = (
        HostTensor::from_slice(vec![1, 4], &q).expect("q"),
        HostTensor::from_slice(vec![3, 4], &k).expect("k"),
        HostTensor::from_slice(vec![3, 4], &v).expect("v"),
    );
    for driver in DRIVERS {
        let encoder = session(driver, &asynchronous);
        let decoder = session(driver, &synchronous);
        let step = encoder.function("attn.step").expect("exported");
        assert!(step.asynchronous, "compiled with the asynchronous ABI");
        assert!(!decoder.function("attn.step").expect("exported").asynchronous);

        let running = encoder.start("attn.step", &[(&q).into(), (&k).into(), (&v).into()]).expect("starts");
        // The other device is used while the call may still run.
        let x = HostTensor::from_slice(vec![5], &[1i32, -2, 3, 40, 0]).expect("x");
        let by = HostTensor::scalar(-3i32);
        let scaled = decoder.call("attn.scale_i32", &[(&x).into(), (&by).into()]).expect("runs");
        assert_eq!(scaled[0].to_host().expect("read").to_vec::<i32>().expect("i32"), vec![-3, 6, -9, -120, 0]);
        while !running.wait(std::time::Duration::from_millis(5)).expect("waits") {}
        assert!(running.is_done().expect("queries"));
        let out = running.finish().expect("results");
        assert_close(&out[0].to_host().expect("read").to_vec::<f32>().expect("f32"), &want, 1e-6);

        // Dropped unfinished, a call is waited for; the session goes on.
        drop(encoder.start("attn.step", &[(&q).into(), (&k).into(), (&v).into()]).expect("starts"));
        let out = encoder.call("attn.step", &[(&q).into(), (&k).into(), (&v).into()]).expect("runs");
        assert_close(&out[0].to_host().expect("read").to_vec::<f32>().expect("f32"), &want, 1e-6);
        // Arguments are checked before anything starts.
        let err = encoder.start("attn.step", &[(&q).into(), (&k).into()]).unwrap_err();
        assert!(err.to_string().contains("argument"), "{err}");
    }
}

/// `x [1, depth, 16, 1]` against `w [n1, depth, 8, 1]` by `linalg.mmt4d` into f32.
/// `linalg.mmt4d` of x `[m1, depth, m0, k0]` (elements `x_elem`) by w `[n1, depth, n0, k0]`
/// (`w_elem`) into f32 `[m1, n1, m0, n0]`.
fn mmt4d(
    m1: usize,
    depth: usize,
    n1: usize,
    (m0, n0, k0): (usize, usize, usize),
    x_elem: &str,
    w_elem: &str,
) -> String {
    let x = format!("tensor<{m1}x{depth}x{m0}x{k0}x{x_elem}>");
    let w = format!("tensor<{n1}x{depth}x{n0}x{k0}x{w_elem}>");
    let o = format!("tensor<{m1}x{n1}x{m0}x{n0}xf32>");
    format!(
        "func.func @main(%x: {x}, %w: {w}) -> {o} {{
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : {o}
  %a = linalg.fill ins(%z : f32) outs(%e : {o}) -> {o}
  %r = linalg.mmt4d ins(%x, %w : {x}, {w}) outs(%a : {o}) -> {o}
  return %r : {o}
}}"
    )
}

/// Compiles `mlir` for `target` with `spec` (a tuning spec's file) and `flags`: the artifact
/// and the configurations IREE chose for its dispatches, as text.
fn configured(
    dir: &std::path::Path,
    name: &str,
    target: &mlxcel_shim::Target,
    spec: &std::path::Path,
    flags: &[&str],
    mlir: &str,
) -> (mlxcel_shim::Artifact, String) {
    use mlxcel_shim::{CompileCache, CompileRequest};
    let dump = dir.join(format!("configs-{name}"));
    let mut all = vec![
        format!("--iree-codegen-tuning-spec-path={}", spec.display()),
        format!("--iree-hal-dump-executable-configurations-to={}", dump.display()),
    ];
    all.extend(flags.iter().map(|f| f.to_string()));
    let cache = CompileCache::new(dir.join(format!("cache-{name}")));
    let request = CompileRequest { name, mlir, target, flags: &all, key_parts: &[], contract: None };
    let artifact = cache.get_or_compile(crate::support::compiler(), &request).expect("compiles").0;
    let text: String = std::fs::read_dir(&dump)
        .expect("configurations dumped")
        .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("read"))
        .collect();
    (artifact, text)
}

/// Runs `artifact`'s mmt4d (as `mmt4d` writes it, with operands of elements `x_elem` and
/// `w_elem`) on small integers, whose every product and sum is exact in f32 whatever the order,
/// and requires the result computed here.
fn assert_exact_mmt4d(
    artifact: &mlxcel_shim::Artifact,
    (m1, depth, n1): (usize, usize, usize),
    tile: (usize, usize, usize),
    (x_elem, w_elem): (&str, &str),
) {
    use mlxcel_shim::{DType, Device, Driver, Session};
    let (m0, n0, k0) = tile;
    let x: Vec<f32> = (0..m1 * depth * m0 * k0).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
    let w: Vec<f32> = (0..n1 * depth * n0 * k0).map(|i| ((i * 3) % 7) as f32 - 3.0).collect();
    let mut want = vec![0f32; m1 * n1 * m0 * n0];
    for (i, out) in want.iter_mut().enumerate() {
        let (m1i, n1i, m0i, n0i) = (i / (n1 * m0 * n0), i / (m0 * n0) % n1, i / n0 % m0, i % n0);
        *out = (0..depth * k0)
            .map(|kk| {
                let (k1, k0i) = (kk / k0, kk % k0);
                x[((m1i * depth + k1) * m0 + m0i) * k0 + k0i] * w[((n1i * depth + k1) * n0 + n0i) * k0 + k0i]
            })
            .sum();
    }
    // Small integers are bf16 values whose bits are the top half of their f32 bits.
    let tensor = |shape: Vec<usize>, v: &[f32], elem: &str| {
        if elem == "bf16" {
            let bytes = v.iter().flat_map(|f| ((f.to_bits() >> 16) as u16).to_le_bytes()).collect();
            HostTensor::from_bytes(DType::BF16, shape, bytes).expect("bf16")
        } else {
            HostTensor::from_slice(shape, v).expect("f32")
        }
    };
    let xs = tensor(vec![m1, depth, m0, k0], &x, x_elem);
    let ws = tensor(vec![n1, depth, n0, k0], &w, w_elem);
    let device = Device::new(Driver::LocalTask).expect("device");
    let s = Session::new(&device, None, &[artifact]).expect("session");
    let got = s.call("module.main", &[(&xs).into(), (&ws).into()]).expect("runs").remove(0);
    assert_eq!(got.to_host().expect("read").to_vec::<f32>().expect("f32"), want);
}

#[test]
fn the_avx2_spec_spreads_a_deep_f32_contraction_over_four_by_four_tiles_and_computes_it_exactly() {
    use mlxcel_shim::{Target, llvm_cpu_tuning_spec};
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = dir.path().join("avx2.mlir");
    std::fs::write(&spec, llvm_cpu_tuning_spec(Some(256))).expect("spec");
    // Code for an AVX2 CPU, whatever this one is, with the AVX2 spec in place of the target's.
    let target = Target::Cpu { cpu: "haswell".into() };
    let deep = |depth: usize| mmt4d(1, depth, 8, (16, 8, 1), "f32", "f32");
    let spread = |text: &str| text.contains("distribution = [4, 4, 0, 0, 0, 0]");
    let (artifact, text) = configured(dir.path(), "deep", &target, &spec, &[], &deep(4096));
    assert!(spread(&text), "the matcher applies from 4096 inputs");
    assert!(!spread(&configured(dir.path(), "shallow", &target, &spec, &[], &deep(2048)).1), "IREE's default below");
    assert_exact_mmt4d(&artifact, (1, 4096, 8), (16, 8, 1), ("f32", "f32"));
}

#[test]
fn the_spec_reads_each_deep_weight_tile_once_for_every_row_tile_of_a_prompt_chunk() {
    use mlxcel_shim::{Target, llvm_cpu_tuning_spec};
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = dir.path().join("avx512.mlir");
    std::fs::write(&spec, llvm_cpu_tuning_spec(Some(512))).expect("spec");
    let once = |text: &str| text.contains("distribution = [8, 1, 0, 0, 0, 0]");

    // f32 activations against 32-row tiles of bf16 weights: the matcher names the shapes, not
    // the CPU, so AVX2 code (which this machine runs whatever it is) holds it.
    let haswell = Target::Cpu { cpu: "haswell".into() };
    let (artifact, text) =
        configured(dir.path(), "f32-bf16", &haswell, &spec, &[], &mmt4d(4, 4096, 2, (16, 32, 1), "f32", "bf16"));
    assert!(once(&text), "4 row tiles against 4096 inputs: one workgroup per weight tile");
    assert_exact_mmt4d(&artifact, (4, 4096, 2), (16, 32, 1), ("f32", "bf16"));
    let shallow = mmt4d(4, 2048, 2, (16, 32, 1), "f32", "bf16");
    assert!(!once(&configured(dir.path(), "f32-shallow", &haswell, &spec, &[], &shallow).1), "IREE's default below");
    let f32_weights = mmt4d(4, 4096, 2, (16, 32, 1), "f32", "f32");
    assert!(once(&configured(dir.path(), "f32-f32", &haswell, &spec, &[], &f32_weights).1), "f32 weights alike");
    let tall = mmt4d(16, 4096, 2, (16, 32, 1), "f32", "f32");
    assert!(!once(&configured(dir.path(), "f32-tall", &haswell, &spec, &[], &tall).1), "an encoder's rows keep IREE's");

    // bf16 pairs through IREE's microkernel, on an AVX512-BF16 CPU (compiled on any).
    let zen4 = Target::Cpu { cpu: "znver4".into() };
    let ukernel = ["--iree-llvmcpu-enable-ukernels=mmt4d"];
    let pairs = mmt4d(4, 2048, 2, (16, 16, 2), "bf16", "bf16");
    let (artifact, text) = configured(dir.path(), "pairs", &zen4, &spec, &ukernel, &pairs);
    assert!(once(&text), "4 row tiles against 4096 inputs in pairs");
    let shallow = mmt4d(4, 1024, 2, (16, 16, 2), "bf16", "bf16");
    assert!(!once(&configured(dir.path(), "pairs-shallow", &zen4, &spec, &ukernel, &shallow).1));
    if Target::host_cpu().has_avx512_bf16() {
        assert_exact_mmt4d(&artifact, (4, 2048, 2), (16, 16, 2), ("bf16", "bf16"));
    }
}
