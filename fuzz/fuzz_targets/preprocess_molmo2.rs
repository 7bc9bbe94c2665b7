//! One image through the molmo2 family's `preprocess` with the `tests/fixtures/molmo2`
//! config: encoded bytes or decoded RGB, with fuzzed pixel bounds (see
//! `mlxcel_fuzz::family_preprocess`).

#![no_main]

use std::sync::LazyLock;

use mlxcel_family_molmo2::Molmo2;
use mlxcel_plugin_api::FamilyPlugin;

static CONFIG: LazyLock<<Molmo2 as FamilyPlugin>::Config> =
    LazyLock::new(|| mlxcel_fuzz::fixture_config::<Molmo2>("molmo2", "processor_config.json"));

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_preprocess::<Molmo2>(&CONFIG, data));
