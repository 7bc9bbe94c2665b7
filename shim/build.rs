//! Compiles the IREE io-parameters runtime sources that eerie-sys 0.5.0 leaves
//! out of its static library (parameter index, safetensors/gguf/irpa parsers,
//! the `io_parameters` VM module), from eerie-sys's own vendored IREE tree so
//! headers and ABI match the runtime we link, and the one C helper of our own
//! (`csrc/parameter_alias.c`), compiled against those headers.

use std::{
    env,
    path::{Path, PathBuf},
};

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
        Some(dir) => Ok(PathBuf::from(dir)),
        None => eerie_sys_dir(),
    };
    let src = match root {
        Ok(root) => root.join("iree/runtime/src"),
        Err(message) => return fail(&message),
    };
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
            return fail(&format!(
                "{} is missing from eerie-sys's vendored IREE tree; set MLXCEL_EERIE_SYS_DIR to an eerie-sys 0.5.0 \
                 source directory, or delete .deps/eerie-sys and re-run tools/dev/setup.sh",
                path.display()
            ));
        }
        build.file(path);
    }
    // Our own C: the one helper that copies an index entry under a second key.
    println!("cargo:rerun-if-changed=csrc/parameter_alias.c");
    build.file("csrc/parameter_alias.c");
    if let Err(e) = build.try_compile("mlxcel_iree_io") {
        fail(&format!(
            "compiling IREE's io-parameters sources failed ({e}); check that gcc is installed (Debian's build-essential)"
        ));
    }
}

/// Ends the build with one sentence instead of a panic's backtrace.
fn fail(message: &str) {
    println!("cargo::error=mlxcel-shim build: {message}");
}

/// Finds eerie-sys's source directory: the path the workspace manifest
/// patches eerie-sys to (`[patch.crates-io]`, placed by tools/dev/setup.sh).
///
/// Reading the manifest needs nothing downloaded. Asking cargo instead
/// (`cargo metadata --offline`) resolved the whole workspace, dev-dependencies
/// included, and failed on a machine whose registry held only what the build
/// being run had fetched (issue 15); without `--offline` a build script would
/// reach for the network.
fn eerie_sys_dir() -> Result<PathBuf, String> {
    let manifest_dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|_| "cargo did not set CARGO_MANIFEST_DIR")?);
    let workspace = manifest_dir.parent().ok_or("the crate directory has no parent")?;
    let manifest = workspace.join("Cargo.toml");
    println!("cargo:rerun-if-changed={}", manifest.display());
    let text = std::fs::read_to_string(&manifest).map_err(|e| format!("cannot read {}: {e}", manifest.display()))?;
    let doc: toml::Table = text.parse().map_err(|e| format!("{} is not valid TOML: {e}", manifest.display()))?;
    let path = doc
        .get("patch")
        .and_then(|p| p.get("crates-io"))
        .and_then(|p| p.get("eerie-sys"))
        .and_then(|p| p.get("path"))
        .and_then(|p| p.as_str())
        .ok_or_else(|| {
            format!(
                "{} does not patch eerie-sys to a path ([patch.crates-io] eerie-sys = {{ path = ... }}); \
                 set MLXCEL_EERIE_SYS_DIR to eerie-sys's source directory",
                manifest.display()
            )
        })?;
    let dir = absolute(workspace, Path::new(path));
    if !dir.join("Cargo.toml").is_file() {
        return Err(format!("{} holds no eerie-sys source; run tools/dev/setup.sh, which places it", dir.display()));
    }
    Ok(dir)
}

fn absolute(base: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() { path.to_path_buf() } else { base.join(path) }
}
