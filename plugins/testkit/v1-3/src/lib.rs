//! plugin-api test fixture `testkit-v1-3`. A plugin as built against plugin-api 1.3: it exports the frozen 1.3 table, with `encoder_graph_for` and without `encoder_graph_compute`.

#![forbid(unsafe_code)]

use mlxcel_testkit_toy::{Toy, Variant};

/// The fixture's identity.
#[derive(Debug)]
pub struct V1_3;

impl Variant for V1_3 {
    const NAME: &'static str = "testkit-v1-3";
    const ARCHITECTURE: &'static str = "ToyV13ForConditionalGeneration";
    const MODEL_TYPE: &'static str = "toy_v1_3";
}

mlxcel_plugin_api::export_plugin!(Toy<V1_3>, api = v1_3);
