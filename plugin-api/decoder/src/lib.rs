//! `mlxcel-decoder`: text decoders without a device. A checkpoint's
//! `config.json` is read through a [`spec::DecoderSpec`] (one of the
//! [`presets`], or a family plugin's own) into a
//! [`TextConfig`], and [`graph::emit`] builds the decoder bundle's StableHLO
//! from it, its weights located and checked by the one resolver
//! ([`weights::DecoderWeights`]); the host compiles that bundle and owns its KV slots. The host
//! and family plugins link this crate, so no architecture is named outside it.

#![forbid(unsafe_code)]

pub mod config;
pub mod graph;
pub mod prefill;
pub mod presets;
pub mod spec;
pub mod weights;

pub use config::{ConfigError, TextConfig};
pub use graph::{BundleShape, GraphError, KvLayout};
pub use spec::{DecoderSpec, SPEC_SCHEMA, SpecError};
pub use weights::{
    AffineLayout, DecoderWeights, Index, LayerTensor, Linear, QuantConfig, Quantization, StoredLayout, Tensor,
    TensorInfo, WeightsError, channels_last, check_affine, dense_problems, resolve_names, resolve_root, split_logical,
    stored_layout,
};
