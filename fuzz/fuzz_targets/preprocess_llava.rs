//! One image through the llava family's `preprocess` with the `tests/fixtures/llava`
//! config: encoded bytes or decoded RGB, with fuzzed pixel bounds (see
//! `mlxcel_fuzz::family_preprocess`).

#![no_main]

use std::sync::LazyLock;

use mlxcel_family_llava::Llava;
use mlxcel_plugin_api::FamilyPlugin;

static CONFIG: LazyLock<<Llava as FamilyPlugin>::Config> =
    LazyLock::new(|| mlxcel_fuzz::fixture_config::<Llava>("llava", "processor_config.json"));

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_preprocess::<Llava>(&CONFIG, data));
