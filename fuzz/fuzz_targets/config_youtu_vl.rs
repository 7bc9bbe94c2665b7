//! The youtu_vl family's `config.json` and processor config through its `parse_config`, then
//! the entries the host calls on every checkpoint (see `mlxcel_fuzz::family_config`).

#![no_main]

use mlxcel_family_youtu_vl::YoutuVl;

libfuzzer_sys::fuzz_target!(|data: &[u8]| mlxcel_fuzz::family_config::<YoutuVl>(data));
