//! What the family plugins share, written once: preprocessing with the same arithmetic as the
//! reference processors, and the encoder blocks their vision towers are built from.
//!
//! - [`image`]: decoded RGB images (decoding is `mlxcel-media`'s, built here for PNG only),
//!   Pillow-exact resampling, rescale and normalise (transformers' PIL backend), and torch's
//!   float bilinear resize rounded back to 8 bits (the torchvision backend's, for Molmo2);
//! - [`patches`]: the Qwen-VL processors' `smart_resize` and merge-ordered patchify;
//! - [`qwen_vl`]: the Qwen-VL families' config, processor, prompt layout, M-RoPE contract and
//!   vision-graph buckets and masks;
//! - [`contract`]: the 1-D contract of families whose encoder rows replace their image tokens in
//!   order (`masked_scatter`);
//! - [`clip`]: the CLIP-style processors' shortest-edge resize and centre crop;
//! - [`tiling`]: Molmo's choice of overlapping crops for an image (Molmo and Molmo2);
//! - [`config`]: the processor config's section, nested or flat, into a family's serde mirror;
//! - [`vit`]: the vision-tower blocks of the encoder graphs (weights by logical name, linears,
//!   layer norms, the pre-norm SigLIP/CLIP encoder layer, optionally with 2-D rotary embedding
//!   and an attention mask, the patch merger, the patch-grid average pool).

#![forbid(unsafe_code)]

pub mod audio;
pub mod clip;
pub mod config;
pub mod contract;
pub mod image;
pub mod patches;
pub mod qwen_vl;
pub mod tiling;
pub mod vit;

pub use clip::{ShortestEdgeError, center_crop, shortest_edge_size};
pub use config::{Identity, PerChannel, Steps, WeightDtype, processor_section};
pub use image::{Image, ImageError, Normalize, Resample};
pub use patches::{PatchGrid, Patchify, ResizeError, smart_resize};
