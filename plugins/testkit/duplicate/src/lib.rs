//! plugin-api test fixture `testkit-duplicate`. A plugin that claims the same architecture as `testkit-good`.

#![forbid(unsafe_code)]

use mlxcel_testkit_toy::{Toy, Variant};

/// The fixture's identity.
#[derive(Debug)]
pub struct Duplicate;

impl Variant for Duplicate {
    const NAME: &'static str = "testkit-duplicate";
    const ARCHITECTURE: &'static str = "ToyGoodForConditionalGeneration";
    const MODEL_TYPE: &'static str = "toy_duplicate";
}

mlxcel_plugin_api::export_plugin!(Toy<Duplicate>);
