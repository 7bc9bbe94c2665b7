//! One image through the gemma3 family's `preprocess` with the `tests/fixtures/gemma3`
//! config: encoded bytes or decoded RGB, with fuzzed pixel bounds (see
//! `mlxcel_fuzz::family_preprocess`).

#![no_main]

use std::sync::LazyLock;

use mlxcel_family_gemma3::Gemma3;
use mlxcel_plugin_api::FamilyPlugin;

static CONFIG: LazyLock<<Gemma3 as FamilyPlugin>::Config> =
    LazyLock::new(|| mlxcel_fuzz::fixture_config::<Gemma3>("gemma3", "processor_config.json"));

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_preprocess::<Gemma3>(&CONFIG, data));
