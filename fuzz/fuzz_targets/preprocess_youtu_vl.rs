//! One image through the youtu_vl family's `preprocess` with the `tests/fixtures/youtu_vl`
//! config (which has no processor config: the plugin's defaults): encoded bytes or decoded RGB,
//! with fuzzed pixel bounds (see `mlxcel_fuzz::family_preprocess`).

#![no_main]

use std::sync::LazyLock;

use mlxcel_family_youtu_vl::YoutuVl;
use mlxcel_plugin_api::FamilyPlugin;

static CONFIG: LazyLock<<YoutuVl as FamilyPlugin>::Config> =
    LazyLock::new(|| mlxcel_fuzz::fixture_config::<YoutuVl>("youtu_vl", ""));

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_preprocess::<YoutuVl>(&CONFIG, data));
