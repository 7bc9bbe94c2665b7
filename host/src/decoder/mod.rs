//! Text decoders on a device: the bundle `mlxcel-decoder` emits for a
//! checkpoint, compiled once per (checkpoint, dtype, capacity, slots,
//! target), and the Rust API that prefills and decodes over its
//! device-resident KV slots. Which architectures exist, and their graphs,
//! live in `mlxcel-decoder`.

mod bundle;

pub use bundle::{
    Decoder, DecoderError, DecoderOptions, Extras, Fingerprint, Logits, Positions, checkpoint_index, chunk_spans,
    contract_flags, span, weights_identity,
};
pub use mlxcel_decoder::{BundleShape, TextConfig, config, graph};
