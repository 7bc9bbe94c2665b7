//! Text decoders: the graph of each architecture, compiled into one bundle
//! per (checkpoint, dtype, capacity, slots, target), and the Rust API that
//! prefills and decodes over its device-resident KV slots.

mod bundle;
pub mod config;
pub mod graph;

pub use bundle::{Decoder, DecoderError, DecoderOptions, Extras, Fingerprint, Logits, Positions};
pub use config::{Arch, TextConfig};
pub use graph::BundleShape;
