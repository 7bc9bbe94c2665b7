//! One image through the qwen3_vl family's `preprocess` with the `tests/fixtures/qwen3_vl`
//! config: encoded bytes or decoded RGB, with fuzzed pixel bounds (see
//! `mlxcel_fuzz::family_preprocess`).

#![no_main]

use std::sync::LazyLock;

use mlxcel_family_qwen3_vl::Qwen3Vl;
use mlxcel_plugin_api::FamilyPlugin;

static CONFIG: LazyLock<<Qwen3Vl as FamilyPlugin>::Config> =
    LazyLock::new(|| mlxcel_fuzz::fixture_config::<Qwen3Vl>("qwen3_vl", "processor_config.json"));

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_preprocess::<Qwen3Vl>(&CONFIG, data));
