//! Host integration tests against the oracle's goldens (tests/fixtures).

mod decoder;
mod generate;
mod generate_image;
mod llava;
mod plugins;
mod qwen2_vl;
mod server;
