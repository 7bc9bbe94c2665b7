//! Host integration tests against the oracle's goldens (tests/fixtures).

mod conformance;
mod decoder;
mod deploy;
mod generate;
mod generate_image;
mod merge;
mod plugins;
mod server;
mod support;
