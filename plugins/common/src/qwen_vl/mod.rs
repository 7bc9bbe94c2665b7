//! The Qwen-VL families' shared pieces, written once for Qwen2-VL and Qwen2.5-VL (whose
//! processors, prompt layouts and M-RoPE contracts are the same; only their vision towers
//! differ): the config fields outside the tower, the image processor, `<|image_pad|>`
//! expansion, the prepared-prefill contract, and the vision graphs' buckets and masks.
//! Youtu-VL, whose tower is Qwen2.5-VL's windowed one over SigLIP2 layers, takes the processor's
//! resize, the `<|image_pad|>` expansion and the vision-graph buckets, inputs and masks too,
//! through [`PatchRows`].
//!
//! The reference is transformers' `models/qwen2_vl` (`image_processing_pil_qwen2_vl.py`,
//! `get_rope_index`), which `models/qwen2_5_vl` reuses for images.

pub mod config;
pub mod contract;
pub mod processor;
pub mod prompt;
pub mod vision;

pub use config::{Geometry, PatchRows, ProcessorConfig, QwenVl};
use mlxcel_plugin_api::decoder::{DecoderSpec, presets};

/// The text decoder of a Qwen-VL checkpoint: the qwen2 preset, reading the Hub's flat config
/// too (the text fields beside `vision_config` under the family's `model_type`) with the
/// defaults of transformers 5.24's `Qwen2VLTextConfig` and `Qwen2_5_VLTextConfig`, which agree
/// (their `default_theta` is 1e6). `model_types`: the text config's and the family's.
pub fn decoder_spec(model_types: [&str; 2]) -> DecoderSpec {
    let mut spec = presets::qwen2();
    spec.model_types = model_types.map(String::from).to_vec();
    let defaults = serde_json::json!({
        "vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
        "num_attention_heads": 64, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
    });
    spec.config_defaults.extend(defaults.as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
    spec
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::decoder::TextConfig;

    use super::*;

    /// Qwen2-VL-2B's and Qwen2.5-VL-3B's configs on the Hub are flat: the text fields beside
    /// `vision_config`, the M-RoPE sections in a legacy `rope_scaling` of type `mrope`. With the
    /// family's spec that reads to the same decoder as transformers 5's nested form; the
    /// presets alone refuse it.
    #[test]
    fn the_hubs_flat_config_reads_to_the_nested_forms_decoder() {
        for (name, types) in
            [("qwen2_vl", ["qwen2_vl_text", "qwen2_vl"]), ("qwen2_5_vl", ["qwen2_5_vl_text", "qwen2_5_vl"])]
        {
            let dir = mlxcel_golden::Fixture::named(name).expect("fixture");
            let nested = std::fs::read_to_string(dir.dir().join("config.json")).expect("config");
            let mut flat: serde_json::Value = serde_json::from_str(&nested).expect("json");
            let text = flat.as_object_mut().expect("object").remove("text_config").expect("text_config");
            for (key, value) in text.as_object().expect("object") {
                match key.as_str() {
                    "model_type" | "tie_word_embeddings" => {}
                    "rope_parameters" => {
                        flat["rope_theta"] = value["rope_theta"].clone();
                        flat["rope_scaling"] =
                            serde_json::json!({"type": "mrope", "mrope_section": value["mrope_section"].clone()});
                    }
                    _ => flat[key.as_str()] = value.clone(),
                }
            }
            let spec = decoder_spec(types);
            let want = TextConfig::parse_with(&nested, Some(&spec)).expect("the nested form reads with the spec");
            let got =
                TextConfig::parse_with(&flat.to_string(), Some(&spec)).expect("the flat form reads with the spec");
            assert_eq!(got, want, "{name}");
            assert!(TextConfig::parse(&flat.to_string()).is_err(), "no preset reads model_type {name}");
            assert_eq!(QwenVl::parse(&flat.to_string(), "").expect("flat").mrope_section, [2, 3, 3]);
        }
    }
}

/// Fixture access for the unit tests: every Qwen-VL fixture the shared pieces serve.
#[cfg(test)]
pub(crate) mod testing {
    use mlxcel_golden::{Fixture, Golden};
    use mlxcel_plugin_api::{MediaGrid, MediaItem};

    use super::QwenVl;

    pub(crate) const FIXTURES: [&str; 3] = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"];

    /// The variants every Qwen-VL fixture has.
    pub(crate) const VARIANTS: [&str; 4] = ["image", "long", "two_images", "text_only"];

    /// The grids the reference processor gave a variant's images (`image_grid_thw`).
    pub(crate) fn grids(name: &str, variant: &str) -> Vec<[u32; 3]> {
        let golden = golden(name, variant);
        if !golden.has("image_grid_thw") {
            return Vec::new();
        }
        let dims = golden.tensor("image_grid_thw").expect("grid").to_i64().expect("integers");
        dims.chunks_exact(3).map(|d| [d[0] as u32, d[1] as u32, d[2] as u32]).collect()
    }

    fn fixture(name: &str) -> Fixture {
        Fixture::named(name).expect("the fixture")
    }

    pub(crate) fn fixture_config(name: &str) -> QwenVl {
        let dir = fixture(name);
        let read = |file: &str| std::fs::read_to_string(dir.dir().join(file)).expect("read");
        QwenVl::parse(&read("config.json"), &read("processor_config.json")).expect("parse")
    }

    pub(crate) fn golden(name: &str, variant: &str) -> Golden {
        fixture(name).golden(variant).expect("golden")
    }

    pub(crate) fn grid(config: &QwenVl, dims: [u32; 3]) -> MediaGrid {
        let merge = config.geometry.spatial_merge_size as u32;
        MediaGrid { dims: dims.to_vec().into(), feature_tokens: dims[0] * dims[1] * dims[2] / (merge * merge) }
    }

    /// A fixture input as the encoded file.
    pub(crate) fn image_item(name: &str, path: &str) -> MediaItem {
        MediaItem::EncodedImage(std::fs::read(fixture(name).dir().join(path)).expect("read image").into())
    }
}
