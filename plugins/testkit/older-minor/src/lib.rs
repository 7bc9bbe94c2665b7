//! plugin-api test fixture `testkit-older-minor`. A plugin as built against plugin-api 1.0: it exports the frozen 1.0 table, without `check_checkpoint`.

#![forbid(unsafe_code)]

use mlxcel_testkit_toy::{Toy, Variant};

/// The fixture's identity.
#[derive(Debug)]
pub struct OlderMinor;

impl Variant for OlderMinor {
    const NAME: &'static str = "testkit-older-minor";
    const ARCHITECTURE: &'static str = "ToyOlderForConditionalGeneration";
    const MODEL_TYPE: &'static str = "toy_older";
}

mlxcel_plugin_api::export_plugin!(Toy<OlderMinor>, api = v1_0);
