//! plugin-api test fixture `testkit-good`. The well-behaved fixture: every entry works.

#![forbid(unsafe_code)]

use mlxcel_testkit_toy::{Toy, Variant};

/// The fixture's identity.
#[derive(Debug)]
pub struct Good;

impl Variant for Good {
    const NAME: &'static str = "testkit-good";
    const ARCHITECTURE: &'static str = "ToyGoodForConditionalGeneration";
    const MODEL_TYPE: &'static str = "toy_good";
}

mlxcel_plugin_api::export_plugin!(Toy<Good>);
