//! Integration tests of the shim against the real IREE compiler and runtime:
//! programs checked against hand-computed results on both CPU drivers,
//! stateful modules, parameters from safetensors, validation and caching.

mod cache;
mod descriptors;
mod parameters;
mod programs;
mod state;
mod support;
