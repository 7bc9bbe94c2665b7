//! One image through the qwen2_vl family's `preprocess` with the `tests/fixtures/qwen2_vl`
//! config: encoded bytes or decoded RGB, with fuzzed pixel bounds (see
//! `mlxcel_fuzz::family_preprocess`).

#![no_main]

use std::sync::LazyLock;

use mlxcel_family_qwen2_vl::Qwen2Vl;
use mlxcel_plugin_api::FamilyPlugin;

static CONFIG: LazyLock<<Qwen2Vl as FamilyPlugin>::Config> =
    LazyLock::new(|| mlxcel_fuzz::fixture_config::<Qwen2Vl>("qwen2_vl", "processor_config.json"));

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_preprocess::<Qwen2Vl>(&CONFIG, data));
