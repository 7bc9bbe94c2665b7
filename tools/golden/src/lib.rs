//! Golden tensors written by the reference oracle (`tools/oracle`) and tolerance-explicit comparison.
//!
//! A fixture is a directory `tests/fixtures/<name>/` holding a tiny Hugging Face checkpoint and, per prompt
//! variant, `goldens/<variant>.safetensors` (one tensor per stage, batch dimension dropped) plus
//! `goldens/<variant>.json` (prompt, token ids, greedy tokens, margins and family metadata).
//!
//! ```no_run
//! use mlxcel_golden::{Fixture, Tolerance};
//!
//! let fixture = Fixture::named("qwen2")?;
//! let golden = fixture.golden("short")?;
//! let logits: Vec<f32> = vec![0.0; golden.tensor("logits")?.len()]; // from the implementation under test
//! golden.check_f32("logits", &logits, Tolerance::abs(1e-4))?;
//! # Ok::<(), mlxcel_golden::Error>(())
//! ```
//!
//! A failed comparison reports the first divergent coordinate: stage, flat index (and the index per axis),
//! got, want, the maximum absolute difference and how many elements are over tolerance.
#![forbid(unsafe_code)]

mod compare;
mod error;
mod fixture;
mod tensor;

pub use compare::{Divergence, Report, Tolerance, compare_f32, compare_i64};
pub use error::Error;
pub use fixture::{Fixture, Golden, fixtures_root};
pub use tensor::{Tensor, TensorData};
