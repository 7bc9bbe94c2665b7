//! One audio clip through the gemma3n family's `preprocess` with the `tests/fixtures/gemma3n`
//! config: WAV decoding and the log-mel features, with a fuzzed clip limit (see
//! `mlxcel_fuzz::family_audio`).

#![no_main]

use std::sync::LazyLock;

use mlxcel_family_gemma3n::Gemma3n;
use mlxcel_plugin_api::FamilyPlugin;

static CONFIG: LazyLock<<Gemma3n as FamilyPlugin>::Config> =
    LazyLock::new(|| mlxcel_fuzz::fixture_config::<Gemma3n>("gemma3n", "processor_config.json"));

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_audio::<Gemma3n>(&CONFIG, data));
