//! The shim's one error type: every failure names what went wrong and, where
//! the user can act on it, what to do.

use std::path::PathBuf;

use crate::tensor::DType;

/// Everything that can go wrong compiling, loading or running a module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "the IREE compiler library was not found (looked in {searched}); run tools/dev/setup.sh, or set MLXCEL_IREE_COMPILER to libIREECompiler.so from iree-base-compiler=={wanted}"
    )]
    CompilerNotFound { searched: String, wanted: &'static str },

    #[error("could not load the IREE compiler library {path}: {reason}")]
    CompilerLoad { path: PathBuf, reason: String },

    #[error("the IREE compiler at {path} is {found}, but this build needs {wanted}; run tools/dev/setup.sh")]
    CompilerVersion { path: PathBuf, found: String, wanted: &'static str },

    #[error("compiling {what} failed:\n{diagnostics}")]
    Compile { what: String, diagnostics: String },

    #[error("compile cache at {path}: {reason}")]
    Cache { path: PathBuf, reason: String },

    #[error(
        "the compile cache at {dir} is read-only and holds no usable entry for {name}; build it ahead with `mlxcel-host compile` and the same model, shape and device flags"
    )]
    ReadOnlyMiss { dir: PathBuf, name: String },

    #[error("{path} was compiled by IREE {found}, this runtime is IREE {wanted}; delete it or recompile from the MLIR")]
    ArtifactVersion { path: PathBuf, found: String, wanted: String },

    #[error(
        "compiled module {name} was emitted under another numeric contract; it states {found}, this run needs {expected}"
    )]
    ContractMismatch { name: String, found: String, expected: String },

    #[error("{path} is not a valid compiled artifact: {reason}")]
    ArtifactCorrupt { path: PathBuf, reason: String },

    #[error("cannot read checkpoint file {path}: {source}")]
    CheckpointIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("checkpoint file {path} is not valid safetensors: {reason}")]
    CheckpointFormat { path: PathBuf, reason: String },

    #[error("checkpoint tensor {key:?} is {found}, but the module declares {wanted}")]
    ParameterMismatch { key: String, found: String, wanted: String },

    #[error("the module reads parameter {key:?}, which is not in the checkpoint ({files})")]
    ParameterMissing { key: String, files: String },

    #[error("the alias {alias:?} for {key:?} is already a key of another checkpoint tensor")]
    ParameterAlias { alias: String, key: String },

    #[error("the module reads parameter scope {scope:?}, but only {provided:?} is provided")]
    ParameterScope { scope: String, provided: String },

    #[error("unknown HAL driver {0:?}; this build has local-sync and local-task{1}")]
    UnknownDriver(String, &'static str),

    #[error("function {name:?} is not exported by the loaded modules (exported: {exported})")]
    FunctionNotFound { name: String, exported: String },

    #[error("{function}: expected {expected} arguments, got {got}")]
    ArgumentCount { function: String, expected: usize, got: usize },

    #[error("{context}: dtype is {got}, expected {want}")]
    DTypeMismatch { context: String, got: DType, want: DType },

    #[error("{context}: rank is {got}, expected {want}")]
    RankMismatch { context: String, got: usize, want: usize },

    #[error("{context}: shape is {got:?}, expected {want:?}")]
    ShapeMismatch { context: String, got: Vec<usize>, want: Vec<usize> },

    #[error("{context}: {got} bytes given, dtype {dtype} and shape {shape:?} need {want}")]
    ByteCount { context: String, dtype: DType, shape: Vec<usize>, got: usize, want: usize },

    #[error("{context}: shape {shape:?} overflows the addressable size")]
    ShapeOverflow { context: String, shape: Vec<usize> },

    #[error("unsupported IREE element type 0x{0:08x}")]
    UnsupportedElementType(u32),

    #[error("IREE {operation}: {message}")]
    Iree { operation: &'static str, message: String },
}

/// Results of the shim.
pub type Result<T, E = Error> = std::result::Result<T, E>;
