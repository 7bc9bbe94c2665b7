//! Host integration tests against the oracle's goldens (tests/fixtures).

mod decoder;
mod gemma3;
mod generate;
mod generate_image;
mod llava;
mod plugins;
mod qwen2_vl;
mod server;
