//! plugin-api test fixture `testkit-panicking-identity`. A plugin whose `identity` panics: it cannot be loaded.

#![forbid(unsafe_code)]

use mlxcel_testkit_toy::{Toy, Variant};

/// The fixture's identity.
#[derive(Debug)]
pub struct PanickingIdentity;

impl Variant for PanickingIdentity {
    const NAME: &'static str = "testkit-panicking-identity";
    const ARCHITECTURE: &'static str = "ToyPanickingIdentityForConditionalGeneration";
    const MODEL_TYPE: &'static str = "toy_panicking_identity";
    const PANIC_IN_IDENTITY: bool = true;
}

mlxcel_plugin_api::export_plugin!(Toy<PanickingIdentity>);
