//! plugin-api test fixture `testkit-v1-1`. A plugin as built against plugin-api 1.1: it exports the frozen 1.1 table, with `check_checkpoint` and without `decoder_spec`.

#![forbid(unsafe_code)]

use mlxcel_testkit_toy::{Toy, Variant};

/// The fixture's identity.
#[derive(Debug)]
pub struct V1_1;

impl Variant for V1_1 {
    const NAME: &'static str = "testkit-v1-1";
    const ARCHITECTURE: &'static str = "ToyV11ForConditionalGeneration";
    const MODEL_TYPE: &'static str = "toy_v1_1";
}

mlxcel_plugin_api::export_plugin!(Toy<V1_1>, api = v1_1);
