//! `mlxcel-shim`: the only crate that calls IREE through `unsafe`. It turns
//! StableHLO text into VMFB modules (with an on-disk compile cache), serves
//! weights to them as IREE parameters straight from a checkpoint's
//! safetensors files, and runs them on a HAL device. Tensors cross the
//! boundary only through typed descriptors checked in Rust first.

pub mod artifact;
pub mod cache;
pub mod checkpoint;
pub mod compiler;
pub mod error;
mod ffi;
mod lock;
pub mod runtime;
pub mod tensor;

pub use artifact::{Artifact, ParameterDecl};
pub use cache::{CacheOutcome, CompileCache, CompileRequest};
pub use checkpoint::Checkpoint;
pub use compiler::{Compiler, IREE_VERSION, Target, llvm_cpu_tuning_spec};
pub use error::{Error, Result};
pub use runtime::{Arg, Device, DeviceTensor, Driver, Invocation, Parameters, Session};
pub use tensor::{DType, HostTensor, TensorDesc};
