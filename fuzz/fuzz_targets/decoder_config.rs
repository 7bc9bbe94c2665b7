//! A checkpoint's `config.json` through the decoder library (`mlxcel-decoder`): with the preset
//! its text `model_type` names and with every preset's spec, its `quantization` section, and,
//! after a NUL, a decoder spec as a plugin sends it (`DecoderSpec::from_json`, `validate`) to
//! read the config with. Of a config that parses, what the host derives from it: the token
//! table, each attention kind's rotary frequencies and visibility.

#![no_main]

use mlxcel_decoder::{DecoderSpec, TextConfig, presets};

/// Rotary frequencies are one `f32` per pair of a head's dims; a config may declare any width.
const MAX_HEAD_DIM: usize = 1 << 16;

fn derive(cfg: &TextConfig) {
    let _ = cfg.table_rows();
    for kind in cfg.kinds() {
        if cfg.head_dim <= MAX_HEAD_DIM {
            assert_eq!(cfg.inv_freq(kind).len(), cfg.head_dim / 2);
        }
        let _ = (cfg.visible(kind, 3, 1), cfg.visible_with(kind, 1, 3, true));
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some(files) = mlxcel_fuzz::text_parts(data, 2) else { return };
    let config = files[0];
    if let Ok(cfg) = TextConfig::parse(config) {
        derive(&cfg);
    }
    for spec in presets::all() {
        if let Ok(cfg) = TextConfig::parse_with(config, Some(&spec)) {
            derive(&cfg);
        }
    }
    if let Ok(root) = serde_json::from_str::<serde_json::Value>(config) {
        let _ = mlxcel_decoder::QuantConfig::from_config(&root);
    }
    if let Some(spec) = files.get(1)
        && let Ok(spec) = DecoderSpec::from_json(spec)
    {
        let json = spec.to_json();
        let again =
            DecoderSpec::from_json(&json).unwrap_or_else(|e| panic!("to_json wrote what from_json refuses: {e}"));
        assert_eq!(again, spec);
        if let Ok(cfg) = TextConfig::parse_with(config, Some(&spec)) {
            derive(&cfg);
        }
    }
});
