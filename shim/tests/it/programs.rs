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
fn deep_mmt4d(depth: usize, n1: usize) -> String {
    let x = format!("tensor<1x{depth}x16x1xf32>");
    let w = format!("tensor<{n1}x{depth}x8x1xf32>");
    let o = format!("tensor<1x{n1}x16x8xf32>");
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

#[test]
fn the_avx2_spec_spreads_a_deep_f32_contraction_over_four_by_four_tiles_and_computes_it_exactly() {
    use mlxcel_shim::{CompileCache, CompileRequest, Device, Driver, Session, Target, llvm_cpu_tuning_spec};
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = dir.path().join("avx2.mlir");
    std::fs::write(&spec, llvm_cpu_tuning_spec(Some(256))).expect("spec");
    // Code for an AVX2 CPU, whatever this one is, with the AVX2 spec in place of the target's.
    let target = Target::Cpu { cpu: "haswell".into() };
    let configured = |depth: usize| {
        let dump = dir.path().join(format!("configs-{depth}"));
        let flags = [
            format!("--iree-codegen-tuning-spec-path={}", spec.display()),
            format!("--iree-hal-dump-executable-configurations-to={}", dump.display()),
        ];
        let cache = CompileCache::new(dir.path().join(format!("cache-{depth}")));
        let mlir = deep_mmt4d(depth, 8);
        let request = CompileRequest {
            name: "deep",
            mlir: &mlir,
            target: &target,
            flags: &flags,
            key_parts: &[],
            contract: None,
        };
        let artifact = cache.get_or_compile(crate::support::compiler(), &request).expect("compiles").0;
        let text: String = std::fs::read_dir(&dump)
            .expect("configurations dumped")
            .map(|e| std::fs::read_to_string(e.expect("entry").path()).expect("read"))
            .collect();
        (artifact, text.contains("distribution = [4, 4, 0, 0, 0, 0]"))
    };
    let (artifact, spread) = configured(4096);
    assert!(spread, "the matcher applies from 4096 inputs");
    assert!(!configured(2048).1, "IREE's default below");

    // Small integers: every product and sum is exact, so the result is known whatever the order.
    let depth = 4096;
    let x: Vec<f32> = (0..depth * 16).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
    let w: Vec<f32> = (0..8 * depth * 8).map(|i| ((i * 3) % 7) as f32 - 3.0).collect();
    let mut want = vec![0f32; 8 * 16 * 8];
    for n1 in 0..8 {
        for m0 in 0..16 {
            for n0 in 0..8 {
                let sum: f32 = (0..depth).map(|k| x[k * 16 + m0] * w[(n1 * depth + k) * 8 + n0]).sum();
                want[(n1 * 16 + m0) * 8 + n0] = sum;
            }
        }
    }
    let device = Device::new(Driver::LocalTask).expect("device");
    let s = Session::new(&device, None, &[&artifact]).expect("session");
    let xs = HostTensor::from_slice(vec![1, depth, 16, 1], &x).expect("x");
    let ws = HostTensor::from_slice(vec![8, depth, 8, 1], &w).expect("w");
    let got = s.call("module.main", &[(&xs).into(), (&ws).into()]).expect("runs").remove(0);
    assert_eq!(got.to_host().expect("read").to_vec::<f32>().expect("f32"), want);
}
