//! plugin-api test fixture `testkit-v1-2`. A plugin as built against plugin-api 1.2: it exports the frozen 1.2 table, with `decoder_spec` and `prefill_program` and without `encoder_graph_for`.

#![forbid(unsafe_code)]

use mlxcel_testkit_toy::{Toy, Variant};

/// The fixture's identity.
#[derive(Debug)]
pub struct V1_2;

impl Variant for V1_2 {
    const NAME: &'static str = "testkit-v1-2";
    const ARCHITECTURE: &'static str = "ToyV12ForConditionalGeneration";
    const MODEL_TYPE: &'static str = "toy_v1_2";
}

mlxcel_plugin_api::export_plugin!(Toy<V1_2>, api = v1_2);
