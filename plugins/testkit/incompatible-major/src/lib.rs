//! plugin-api test fixture `testkit-incompatible-major`. A plugin that declares plugin-api 2.0, which a 1.x host must refuse before any call.

#![forbid(unsafe_code)]

use mlxcel_testkit_toy::{Toy, Variant};

/// The fixture's identity.
#[derive(Debug)]
pub struct IncompatibleMajor;

impl Variant for IncompatibleMajor {
    const NAME: &'static str = "testkit-incompatible-major";
    const ARCHITECTURE: &'static str = "ToyMajorForConditionalGeneration";
    const MODEL_TYPE: &'static str = "toy_major";
}

mlxcel_plugin_api::export_plugin!(Toy<IncompatibleMajor>, declare_version = (2, 0));
