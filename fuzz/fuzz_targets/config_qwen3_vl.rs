//! The qwen3_vl family's `config.json` and processor config through its `parse_config`, then
//! the entries the host calls on every checkpoint (see `mlxcel_fuzz::family_config`).

#![no_main]

use mlxcel_family_qwen3_vl::Qwen3Vl;

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_config::<Qwen3Vl>(data));
