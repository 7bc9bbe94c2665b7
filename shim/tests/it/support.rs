//! Shared helpers: one compiler per process, compiling test MLIR, writing
//! safetensors files.

use std::{path::Path, sync::OnceLock};

use mlxcel_shim::{Artifact, CompileCache, CompileRequest, Compiler, Device, Driver, Session, Target};

pub(crate) const DRIVERS: [Driver; 2] = [Driver::LocalSync, Driver::LocalTask];

pub(crate) fn compiler() -> &'static Compiler {
    static COMPILER: OnceLock<Compiler> = OnceLock::new();
    COMPILER.get_or_init(|| Compiler::locate().expect("the IREE compiler (run tools/dev/setup.sh)"))
}

/// Compiles without the cache, for the host CPU.
pub(crate) fn compile(name: &str, mlir: &str) -> Artifact {
    compile_with(name, mlir, &[])
}

/// Compiles without the cache, for the host CPU, with extra compiler flags.
pub(crate) fn compile_with(name: &str, mlir: &str, flags: &[String]) -> Artifact {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = CompileCache::new(dir.path());
    let target = Target::host_cpu();
    let request = CompileRequest { name, mlir, target: &target, flags, key_parts: &[], contract: None };
    cache.get_or_compile(compiler(), &request).expect("compiles").0
}

pub(crate) fn session(driver: Driver, artifact: &Artifact) -> Session {
    let device = Device::new(driver).expect("device");
    Session::new(&device, None, &[artifact]).expect("session")
}

/// Writes a safetensors file of f32 tensors.
pub(crate) fn write_safetensors(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(k, s, d)| (k.to_string(), s.clone(), d.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(k, s, b)| {
            (k.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).expect("view"))
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("write safetensors");
}

pub(crate) fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol, "element {i}: got {g}, want {w} (tolerance {tol})");
    }
}
