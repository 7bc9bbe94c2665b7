//! One image through the molmo family's `preprocess` with the `tests/fixtures/molmo`
//! config: encoded bytes or decoded RGB, with fuzzed pixel bounds (see
//! `mlxcel_fuzz::family_preprocess`).

#![no_main]

use std::sync::LazyLock;

use mlxcel_family_molmo::Molmo;
use mlxcel_plugin_api::FamilyPlugin;

static CONFIG: LazyLock<<Molmo as FamilyPlugin>::Config> =
    LazyLock::new(|| mlxcel_fuzz::fixture_config::<Molmo>("molmo", "preprocessor_config.json"));

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_preprocess::<Molmo>(&CONFIG, data));
