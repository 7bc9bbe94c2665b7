//! Preprocessing shared by the family plugins, written once so every family resizes,
//! rescales and patchifies with the same arithmetic as the reference processors.
//!
//! - [`image`]: decoded RGB images, PNG decoding, Pillow-exact resampling, rescale and
//!   normalise (transformers' PIL backend);
//! - [`patches`]: the Qwen-VL processors' `smart_resize` and merge-ordered patchify;
//! - [`clip`]: the CLIP-style processors' shortest-edge resize and centre crop.

#![forbid(unsafe_code)]

pub mod clip;
pub mod image;
pub mod patches;

pub use clip::{ShortestEdgeError, center_crop, shortest_edge_size};
pub use image::{Image, ImageError, Normalize, Resample, png_dimensions};
pub use patches::{PatchGrid, Patchify, ResizeError, smart_resize};
