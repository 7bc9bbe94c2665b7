//! `mlxcel-host` as a library: the text decoders and, as they land, the
//! engine and the server. The binary in `main.rs` is glue over this.

#![forbid(unsafe_code)]

pub mod decoder;
pub mod engine;
pub mod grammar;
pub mod sampling;
pub mod text;
