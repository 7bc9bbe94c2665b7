//! The gemma3n family's `config.json` and processor config through its `parse_config`, then
//! the entries the host calls on every checkpoint (see `mlxcel_fuzz::family_config`).

#![no_main]

use mlxcel_family_gemma3n::Gemma3n;

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_config::<Gemma3n>(data));
