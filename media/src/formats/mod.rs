//! One module per format: the header readers are pure Rust and always built (the pixel limit
//! is checked before a decoder is chosen); the decoders behind a feature link native code.

pub(crate) mod gif_header;
pub(crate) mod jpeg_header;
pub(crate) mod png;
pub(crate) mod webp_header;

#[cfg(feature = "gif")]
pub(crate) mod gif;
#[cfg(feature = "jpeg")]
pub(crate) mod jpeg;
#[cfg(feature = "webp")]
pub(crate) mod webp;
