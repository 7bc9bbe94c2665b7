//! Plugin manifest TOML through `Manifest::parse` (the loader's parser and its validation); a
//! manifest that parses must write back (`to_toml`) to text that parses to the same manifest.

#![no_main]

use std::path::Path;

use mlxcel_plugin_api::Manifest;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let path = Path::new("fuzz.toml");
    let Ok(manifest) = Manifest::parse(text, path) else { return };
    let _ = (manifest.plugin_api(), manifest.modalities(), manifest.capabilities().count());
    let written = manifest.to_toml();
    let again =
        Manifest::parse(&written, path).unwrap_or_else(|e| panic!("to_toml wrote what parse refuses: {e}\n{written}"));
    assert_eq!(again, manifest, "to_toml then parse changed the manifest:\n{written}");
});
