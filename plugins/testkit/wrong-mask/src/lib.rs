//! plugin-api test fixture `testkit-wrong-mask`. Loads and answers like the good fixture, but
//! its prefill contract leaves image blocks causal: the conformance kit must fail it at the
//! mask stage.

#![forbid(unsafe_code)]

use mlxcel_testkit_toy::{Toy, Variant};

/// The fixture's identity.
#[derive(Debug)]
pub struct WrongMask;

impl Variant for WrongMask {
    const NAME: &'static str = "testkit-wrong-mask";
    const ARCHITECTURE: &'static str = "ToyWrongMaskForConditionalGeneration";
    const MODEL_TYPE: &'static str = "toy_wrong_mask";
    const CAUSAL_IMAGE_BLOCKS: bool = true;
}

mlxcel_plugin_api::export_plugin!(Toy<WrongMask>);
