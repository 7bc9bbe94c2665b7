//! The Qwen2-VL family plugin for mlxcel-host.
//!
//! Accepts `Qwen2VLForConditionalGeneration` (`model_type` `qwen2_vl`). The reference is
//! transformers' `models/qwen2_vl` (`image_processing_pil_qwen2_vl.py` for the processor,
//! `modeling_qwen2_vl.py` for the vision tower and `get_rope_index`), at the version the
//! fixture's provenance records.
//!
//! - `config.rs`: the typed `config.json` and processor config;
//! - `processor.rs`: images to `pixel_values`, `image_grid_thw` and the per-row encoder inputs;
//! - `prompt.rs`: `<|image_pad|>` expansion;
//! - `vision.rs`: the vision tower as StableHLO, per bucket of patch rows;
//! - `contract.rs`: placements, the causal mask and M-RoPE positions.

#![forbid(unsafe_code)]

mod config;
mod contract;
mod processor;
mod prompt;
mod vision;

use mlxcel_plugin_api::decoder::{DecoderSpec, presets};
use mlxcel_plugin_api::{
    Capability, ConfigSummary, ContractRequest, DType, EncoderGraph, EncoderGraphRequest, FamilyPlugin, LayoutRequest,
    MediaItem, Modality, ParsedConfig, PluginError, PluginIdentity, PrefillProgram, PreprocessOptions, Preprocessed,
    PromptLayout, ShapeBucket,
};

pub use config::Qwen2VlConfig;

/// The family.
#[derive(Debug)]
pub struct Qwen2Vl;

impl FamilyPlugin for Qwen2Vl {
    type Config = Qwen2VlConfig;

    fn identity() -> PluginIdentity {
        PluginIdentity::new(
            "qwen2-vl",
            env!("CARGO_PKG_VERSION"),
            &["Qwen2VLForConditionalGeneration"],
            &["qwen2_vl"],
            &[Modality::Image],
            &[Capability::Image, Capability::MultiImage],
            &["https://github.com/huggingface/transformers/tree/v5.24.0/src/transformers/models/qwen2_vl"],
        )
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<Qwen2VlConfig>, PluginError> {
        let config = Qwen2VlConfig::parse(config_json, processor_json)?;
        let summary = ConfigSummary::new(
            &config.model_type,
            &config.architecture,
            &[Modality::Image],
            config.text_hidden_size,
            &[
                ("image_pad", config.image_token_id),
                ("video_pad", config.video_token_id),
                ("vision_start", config.vision_start_token_id),
                ("vision_end", config.vision_end_token_id),
            ],
        );
        Ok(ParsedConfig { summary, config })
    }

    fn prompt_layout(config: &Qwen2VlConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        prompt::layout(config, request)
    }

    fn preprocess(
        config: &Qwen2VlConfig,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        processor::preprocess(config, item, options)
    }

    fn encoder_buckets(config: &Qwen2VlConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        vision::buckets(config, modality)
    }

    fn encoder_graph(config: &Qwen2VlConfig, request: &EncoderGraphRequest) -> Result<EncoderGraph, PluginError> {
        vision::graph(config, request)
    }

    fn prefill_program(config: &Qwen2VlConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        contract::contract(config, request)
    }

    fn encoder_parameters(config: &Qwen2VlConfig) -> Vec<(String, Vec<usize>)> {
        vision::parameters(config)
    }

    fn encoder_weight_dtype(config: &Qwen2VlConfig) -> DType {
        config.weights.dtype()
    }

    /// The qwen2 preset, reading the Hub's flat config too (the text fields beside
    /// `vision_config`, `model_type` `qwen2_vl`) with `Qwen2VLTextConfig`'s defaults.
    fn decoder_spec(_config: &Qwen2VlConfig) -> Result<Option<DecoderSpec>, PluginError> {
        let mut spec = presets::qwen2();
        spec.model_types = vec!["qwen2_vl_text".into(), "qwen2_vl".into()];
        // transformers 5.24 `Qwen2VLTextConfig` (its `default_theta` is 1e6).
        let defaults = serde_json::json!({
            "vocab_size": 152064, "hidden_size": 8192, "intermediate_size": 29568, "num_hidden_layers": 80,
            "num_attention_heads": 64, "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
        });
        spec.config_defaults.extend(defaults.as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
        Ok(Some(spec))
    }
}

mlxcel_plugin_api::export_plugin!(Qwen2Vl);

/// Fixture access for the unit tests.
#[cfg(test)]
mod testing {
    use mlxcel_golden::{Fixture, Golden};
    use mlxcel_plugin_api::{MediaGrid, MediaItem};

    use crate::config::Qwen2VlConfig;

    /// Each variant with the grids the reference processor gave its images (`image_grid_thw`).
    pub(crate) const VARIANT_GRIDS: [(&str, &[[u32; 3]]); 4] =
        [("image", &[[1, 4, 8]]), ("long", &[[1, 4, 8]]), ("two_images", &[[1, 4, 8], [1, 6, 4]]), ("text_only", &[])];

    fn fixture() -> Fixture {
        Fixture::named("qwen2_vl").expect("the qwen2_vl fixture")
    }

    pub(crate) fn fixture_config() -> Qwen2VlConfig {
        let dir = fixture();
        let read = |name: &str| std::fs::read_to_string(dir.dir().join(name)).expect("read");
        Qwen2VlConfig::parse(&read("config.json"), &read("processor_config.json")).expect("parse")
    }

    pub(crate) fn golden(variant: &str) -> Golden {
        fixture().golden(variant).expect("golden")
    }

    pub(crate) fn grid(config: &Qwen2VlConfig, dims: [u32; 3]) -> MediaGrid {
        let merge = config.vision.spatial_merge_size as u32;
        MediaGrid { dims: dims.to_vec().into(), feature_tokens: dims[0] * dims[1] * dims[2] / (merge * merge) }
    }

    /// A fixture input as the encoded file.
    pub(crate) fn image_item(path: &str) -> MediaItem {
        MediaItem::EncodedImage(std::fs::read(fixture().dir().join(path)).expect("read image").into())
    }
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::decoder::TextConfig;

    use super::*;

    /// Qwen2-VL-2B's config on the Hub is flat: the text fields beside `vision_config`, the
    /// M-RoPE sections in a legacy `rope_scaling` of type `mrope`. With the family's spec it
    /// reads to the same decoder as transformers 5's nested form; the presets alone refuse it.
    #[test]
    fn the_hubs_flat_config_reads_to_the_nested_forms_decoder() {
        let dir = mlxcel_golden::Fixture::named("qwen2_vl").expect("fixture");
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
        let config = Qwen2VlConfig::parse(&nested, "").expect("parse");
        let spec = Qwen2Vl::decoder_spec(&config).expect("spec").expect("qwen2-vl brings one");
        let want = TextConfig::parse(&nested).expect("the nested form reads with the preset");
        let got = TextConfig::parse_with(&flat.to_string(), Some(&spec)).expect("the flat form reads with the spec");
        assert_eq!(TextConfig { spec: want.spec.clone(), ..got }, want);
        assert!(TextConfig::parse(&flat.to_string()).is_err(), "no preset reads model_type qwen2_vl");
        // The plugin's own config reader takes the flat form too.
        assert_eq!(Qwen2VlConfig::parse(&flat.to_string(), "").expect("flat").mrope_section, config.mrope_section);
    }
}
