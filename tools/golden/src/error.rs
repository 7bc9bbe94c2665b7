//! The crate's error type.

use std::path::PathBuf;

use crate::compare::Divergence;

/// Everything that can go wrong loading a golden or comparing against it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid json in {path}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("invalid safetensors file {path}")]
    SafeTensors {
        path: PathBuf,
        #[source]
        source: safetensors::SafeTensorError,
    },
    #[error("{path}: golden format {found:?} is not the supported {expected}")]
    Format { path: PathBuf, found: Option<String>, expected: &'static str },
    #[error("variant {variant}: no stage {stage} (stages: {available})")]
    MissingStage { variant: String, stage: String, available: String },
    #[error("variant {variant}: no metadata field {field}")]
    MissingField { variant: String, field: String },
    #[error("stage {stage}: stored as {found}, read as {expected}")]
    Dtype { stage: String, expected: &'static str, found: String },
    #[error("stage {stage}: {got} values compared with {want} golden values (shape {shape:?})")]
    Length { stage: String, got: usize, want: usize, shape: Vec<usize> },
    #[error("{0}")]
    Mismatch(Box<Divergence>),
}
