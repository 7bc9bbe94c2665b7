//! plugin-api test fixture `testkit-panicking`. A plugin whose `preprocess` panics for 6-pixel-wide images and works otherwise.

#![forbid(unsafe_code)]

use mlxcel_testkit_toy::{Toy, Variant};

/// The fixture's identity.
#[derive(Debug)]
pub struct Panicking;

impl Variant for Panicking {
    const NAME: &'static str = "testkit-panicking";
    const ARCHITECTURE: &'static str = "ToyPanickingForConditionalGeneration";
    const MODEL_TYPE: &'static str = "toy_panicking";
    const PANIC_ON_WIDTH: Option<u32> = Some(6);
}

mlxcel_plugin_api::export_plugin!(Toy<Panicking>);
