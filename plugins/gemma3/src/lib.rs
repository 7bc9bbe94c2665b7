//! The Gemma3 family plugin for mlxcel-host.
//!
//! Accepts `Gemma3ForConditionalGeneration` (`model_type` `gemma3`). The reference is
//! transformers' `models/gemma3` (`image_processing_pil_gemma3.py` and `processing_gemma3.py`
//! for the processor and the image block, `modeling_gemma3.py` for the projector, the merge and
//! the masks) and `models/siglip/modeling_siglip.py` for the vision tower, at the version the
//! fixture's provenance records. Text-only `gemma3_text` checkpoints need no plugin: the host's
//! token path serves them.
//!
//! - `config.rs`: the typed `config.json` and processor config (pan-and-scan refused);
//! - `processor.rs`: images to `pixel_values` at the tower's fixed size (Pillow bilinear);
//! - `prompt.rs`: `<start_of_image>` to the processor's whole image block;
//! - `vision.rs`: the SigLIP tower and the average-pool projector as StableHLO;
//! - `contract.rs`: `sqrt(hidden)` text scaling, placements, bidirectional image blocks, 1-D
//!   positions.

#![forbid(unsafe_code)]

mod config;
mod contract;
mod processor;
mod prompt;
mod vision;

use mlxcel_plugin_api::decoder::presets;
use mlxcel_plugin_api::decoder::spec::{DecoderSpec, Head};
use mlxcel_plugin_api::{
    Capability, ConfigSummary, ContractRequest, DType, EncoderCompute, EncoderGraph, EncoderGraphRequest,
    EncoderTarget, FamilyPlugin, LayoutRequest, MediaItem, Modality, ParsedConfig, PluginError, PluginIdentity,
    PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
};

pub use config::Gemma3Config;

/// The family.
#[derive(Debug)]
pub struct Gemma3;

impl FamilyPlugin for Gemma3 {
    type Config = Gemma3Config;

    fn identity() -> PluginIdentity {
        PluginIdentity::new(
            "gemma3",
            env!("CARGO_PKG_VERSION"),
            &["Gemma3ForConditionalGeneration"],
            &["gemma3"],
            &[Modality::Image],
            &[Capability::Image, Capability::MultiImage],
            &[
                "https://github.com/huggingface/transformers/tree/v5.24.0/src/transformers/models/gemma3",
                "https://github.com/huggingface/transformers/tree/v5.24.0/src/transformers/models/siglip",
            ],
        )
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<Gemma3Config>, PluginError> {
        let config = Gemma3Config::parse(config_json, processor_json)?;
        let summary = ConfigSummary::new(
            &config.model_type,
            &config.architecture,
            &[Modality::Image],
            config.text_hidden_size,
            &[
                ("image_soft", config.image_token_id),
                ("image_start", config.boi_token_id),
                ("image_end", config.eoi_token_id),
            ],
        );
        Ok(ParsedConfig { summary, config })
    }

    fn prompt_layout(config: &Gemma3Config, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        prompt::layout(config, request)
    }

    fn preprocess(
        config: &Gemma3Config,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        processor::preprocess(config, item, options)
    }

    fn encoder_buckets(config: &Gemma3Config, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        vision::buckets(config, modality)
    }

    fn encoder_graph(
        config: &Gemma3Config,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError> {
        mlxcel_family_common::vit::f32_only(compute, "gemma3")?;
        vision::graph(config, request, target)
    }

    fn prefill_program(config: &Gemma3Config, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        contract::contract(config, request)
    }

    fn encoder_parameters(config: &Gemma3Config) -> Vec<(String, Vec<usize>)> {
        vision::parameters(config)
    }

    fn encoder_weight_dtype(config: &Gemma3Config) -> DType {
        config.weights.dtype()
    }

    /// The gemma3_text preset without its final-logit cap: Gemma3ForConditionalGeneration
    /// never applies `text_config.final_logit_softcapping` (transformers 5.24; only
    /// Gemma3ForCausalLM does), so a checkpoint that sets one is refused rather than decoded
    /// otherwise than the reference decodes it.
    fn decoder_spec(_config: &Gemma3Config) -> Result<Option<DecoderSpec>, PluginError> {
        let text = presets::gemma3_text();
        Ok(Some(DecoderSpec { head: Head { final_softcapping: false, ..text.head }, ..text }))
    }
}

mlxcel_plugin_api::export_plugin!(Gemma3);

/// Fixture access for the unit tests.
#[cfg(test)]
mod testing {
    use mlxcel_golden::{Fixture, Golden};
    use mlxcel_plugin_api::MediaItem;

    use crate::config::Gemma3Config;

    /// Each variant with its image count.
    pub(crate) const VARIANT_IMAGES: [(&str, usize); 4] =
        [("image", 1), ("two_images", 2), ("long", 1), ("text_only", 0)];

    fn fixture() -> Fixture {
        Fixture::named("gemma3").expect("the gemma3 fixture")
    }

    /// The fixture's `config.json` and `processor_config.json`.
    pub(crate) fn fixture_json() -> (String, String) {
        let dir = fixture();
        let read = |name: &str| std::fs::read_to_string(dir.dir().join(name)).expect("read");
        (read("config.json"), read("processor_config.json"))
    }

    pub(crate) fn fixture_config() -> Gemma3Config {
        let (config, processor) = fixture_json();
        Gemma3Config::parse(&config, &processor).expect("parse")
    }

    pub(crate) fn golden(variant: &str) -> Golden {
        fixture().golden(variant).expect("golden")
    }

    /// A fixture input as the encoded file.
    pub(crate) fn image_item(path: &str) -> MediaItem {
        MediaItem::EncodedImage(std::fs::read(fixture().dir().join(path)).expect("read image").into())
    }
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::CheckpointIndex;
    use mlxcel_plugin_api::decoder::TextConfig;

    use super::*;
    use crate::testing::fixture_json;

    /// The family's decoder reads the fixture's text config as the preset does, and refuses a
    /// final-logit cap the reference would not apply.
    #[test]
    fn the_decoder_spec_reads_the_text_config_and_refuses_a_final_cap() {
        let (config_json, processor) = fixture_json();
        let config = Gemma3Config::parse(&config_json, &processor).expect("parse");
        let spec = Gemma3::decoder_spec(&config).expect("spec").expect("gemma3 brings one");
        let text = TextConfig::parse_with(&config_json, Some(&spec)).expect("the fixture reads");
        let preset = TextConfig::parse(&config_json).expect("the preset reads it too");
        assert_eq!(
            (text.hidden, text.layer_kinds.clone(), text.embed_scale),
            (preset.hidden, preset.layer_kinds, preset.embed_scale)
        );
        let mut capped: serde_json::Value = serde_json::from_str(&config_json).expect("json");
        capped["text_config"]["final_logit_softcapping"] = 30.0.into();
        let err = TextConfig::parse_with(&capped.to_string(), Some(&spec)).expect_err("refused");
        assert!(err.to_string().contains("final_logit_softcapping = 30"), "{err}");
    }

    #[test]
    fn the_checkpoint_check_names_missing_and_misshapen_tensors() {
        let (config, processor) = fixture_json();
        let config = Gemma3Config::parse(&config, &processor).expect("parse");
        let mut tensors: Vec<mlxcel_plugin_api::TensorSpec> = vision::parameters(&config)
            .into_iter()
            .map(|(k, s)| {
                // The checkpoint keys of transformers' layout: each module at the top.
                mlxcel_plugin_api::TensorSpec::new(
                    k.replacen('/', ".", 1),
                    mlxcel_plugin_api::DType::F32,
                    &s.iter().map(|&d| d as u64).collect::<Vec<_>>(),
                )
            })
            .collect();
        let ok = Gemma3::check_checkpoint(&config, &CheckpointIndex { tensors: tensors.clone().into() }).expect("ok");
        assert!(ok.problems.is_empty(), "{:?}", ok.problems);
        let whole = tensors.clone();
        tensors.retain(|t| t.name.as_str() != "vision_tower.post_layernorm.bias");
        let report =
            Gemma3::check_checkpoint(&config, &CheckpointIndex { tensors: tensors.clone().into() }).expect("report");
        let problems: Vec<&str> = report.problems.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            problems,
            ["the checkpoint's `vision_tower` under `vision_tower.` lacks `vision_tower.post_layernorm.bias`"],
            "a module missing a tensor is named with it"
        );
        let mut tensors = whole;
        tensors[0] = mlxcel_plugin_api::TensorSpec::new(tensors[0].name.as_str(), mlxcel_plugin_api::DType::F32, &[1]);
        let report = Gemma3::check_checkpoint(&config, &CheckpointIndex { tensors: tensors.into() }).expect("report");
        let problems: Vec<&str> = report.problems.iter().map(|p| p.as_str()).collect();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("`vision_tower.embeddings.patch_embedding.weight` has shape [1]"), "{problems:?}");
    }
}
