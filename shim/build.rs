//! Compiles the IREE io-parameters runtime sources that eerie-sys 0.5.0 leaves
//! out of its static library (parameter index, safetensors/gguf/irpa parsers,
//! the `io_parameters` VM module), from eerie-sys's own vendored IREE tree so
//! headers and ABI match the runtime we link.

use std::{env, path::PathBuf, process::Command};

/// The IREE sources we add, relative to `iree/runtime/src`.
const IO_SOURCES: &[&str] = &[
    "iree/io/parameter_index.c",
    "iree/io/parameter_provider.c",
    "iree/io/parameter_index_provider.c",
    "iree/io/formats/safetensors/safetensors_parser.c",
    "iree/io/formats/gguf/gguf_parser.c",
    "iree/io/formats/irpa/irpa_parser.c",
    "iree/io/formats/parser_registry.c",
    "iree/base/internal/json.c",
    "iree/hal/utils/file_cache.c",
    "iree/modules/io/parameters/module.c",
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=MLXCEL_EERIE_SYS_DIR");
    let root = match env::var_os("MLXCEL_EERIE_SYS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => eerie_sys_dir(),
    };
    let src = root.join("iree/runtime/src");
    let mut build = cc::Build::new();
    build
        .include(&src)
        .std("gnu11")
        // The same configuration eerie-sys's CMake build uses for the runtime.
        .define("IREE_ALLOCATOR_SYSTEM_CTL", "iree_allocator_libc_ctl")
        .define("IREE_THREADING_ENABLE", "1")
        .flag_if_supported("-fvisibility=hidden")
        .warnings(false);
    for file in IO_SOURCES {
        let path = src.join(file);
        if !path.is_file() {
            panic!("mlxcel-shim build: {} is missing from eerie-sys's vendored IREE tree", path.display());
        }
        build.file(path);
    }
    build.compile("mlxcel_iree_io");
}

/// Finds eerie-sys's source directory through `cargo metadata`, which knows
/// where the resolved package lives (registry, vendor dir or a patch).
fn eerie_sys_dir() -> PathBuf {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let target = env::var("TARGET").expect("cargo sets TARGET");
    // --filter-platform keeps --offline from asking for Windows-only crates.
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", &target])
        .arg("--manifest-path")
        .arg(manifest.join("Cargo.toml"))
        .output()
        .expect("mlxcel-shim build: could not run cargo metadata");
    if !output.status.success() {
        panic!(
            "mlxcel-shim build: cargo metadata failed (set MLXCEL_EERIE_SYS_DIR to eerie-sys's source): {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("mlxcel-shim build: cargo metadata printed invalid json");
    metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "eerie-sys")
        .and_then(|p| p["manifest_path"].as_str())
        .map(|m| PathBuf::from(m).parent().expect("manifest path has a parent").to_path_buf())
        .expect("mlxcel-shim build: eerie-sys is not in cargo metadata")
}
