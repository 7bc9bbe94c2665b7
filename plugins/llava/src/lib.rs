//! The LLaVA family plugin for mlxcel-host.
//!
//! Accepts `LlavaForConditionalGeneration` (`model_type` `llava`): a CLIP vision tower, an
//! MLP projector and a text decoder the host runs (Llama for LLaVA 1.5). The reference is
//! transformers' `models/llava` (`modeling_llava.py`, `processing_llava.py`) and
//! `models/clip` (`modeling_clip.py`, `image_processing_pil_clip.py`), at the version the
//! fixture's provenance records.
//!
//! - `config.rs`: the typed `config.json` and processor config;
//! - `processor.rs`: images to `pixel_values` (shortest-edge resize, centre crop, normalise);
//! - `prompt.rs`: `<image>` expansion;
//! - `vision.rs`: the CLIP tower and the projector as StableHLO;
//! - `contract.rs`: placements, 1-D positions and the causal mask.

#![forbid(unsafe_code)]

mod config;
mod contract;
mod processor;
mod prompt;
mod vision;

use mlxcel_plugin_api::{
    Capability, ConfigSummary, ContractRequest, DType, EncoderCompute, EncoderGraph, EncoderGraphRequest,
    EncoderTarget, FamilyPlugin, LayoutRequest, MediaItem, Modality, ParsedConfig, PluginError, PluginIdentity,
    PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
};

pub use config::LlavaConfig;

/// The family.
#[derive(Debug)]
pub struct Llava;

impl FamilyPlugin for Llava {
    type Config = LlavaConfig;

    fn identity() -> PluginIdentity {
        PluginIdentity::new(
            "llava",
            env!("CARGO_PKG_VERSION"),
            &["LlavaForConditionalGeneration"],
            &["llava"],
            &[Modality::Image],
            &[Capability::Image, Capability::MultiImage],
            &[
                "https://github.com/huggingface/transformers/tree/v5.24.0/src/transformers/models/llava",
                "https://github.com/huggingface/transformers/tree/v5.24.0/src/transformers/models/clip",
            ],
        )
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<LlavaConfig>, PluginError> {
        let config = LlavaConfig::parse(config_json, processor_json)?;
        let summary = ConfigSummary::new(
            &config.model_type,
            &config.architecture,
            &[Modality::Image],
            config.text_hidden_size,
            &[("image", config.image_token_id)],
        );
        Ok(ParsedConfig { summary, config })
    }

    fn prompt_layout(config: &LlavaConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        prompt::layout(config, request)
    }

    fn preprocess(
        config: &LlavaConfig,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        processor::preprocess(config, item, options)
    }

    fn encoder_buckets(config: &LlavaConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        vision::buckets(config, modality)
    }

    fn encoder_graph(
        config: &LlavaConfig,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError> {
        mlxcel_family_common::vit::f32_only(compute, "llava")?;
        vision::graph(config, request, target)
    }

    fn prefill_program(config: &LlavaConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        contract::contract(config, request)
    }

    fn encoder_parameters(config: &LlavaConfig) -> Vec<(String, Vec<usize>)> {
        vision::parameters(config)
    }

    fn encoder_weight_dtype(config: &LlavaConfig) -> DType {
        config.weights.dtype()
    }
}

mlxcel_plugin_api::export_plugin!(Llava);

/// Fixture access for the unit tests.
#[cfg(test)]
mod testing {
    use mlxcel_golden::{Fixture, Golden};
    use mlxcel_plugin_api::MediaItem;

    use crate::config::LlavaConfig;

    /// Each variant with its number of images.
    pub(crate) const VARIANT_IMAGES: [(&str, usize); 4] =
        [("image", 1), ("long", 1), ("two_images", 2), ("text_only", 0)];

    fn fixture() -> Fixture {
        Fixture::named("llava").expect("the llava fixture")
    }

    pub(crate) fn fixture_json(name: &str) -> String {
        std::fs::read_to_string(fixture().dir().join(name)).expect("read")
    }

    pub(crate) fn fixture_config() -> LlavaConfig {
        LlavaConfig::parse(&fixture_json("config.json"), &fixture_json("processor_config.json")).expect("parse")
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
    use mlxcel_plugin_api::{CheckpointIndex, TensorSpec};

    use super::*;
    use crate::testing::fixture_config;

    /// The fixture checkpoint's tensor index, read from its safetensors header.
    fn fixture_index() -> CheckpointIndex {
        let fixture = mlxcel_golden::Fixture::named("llava").expect("fixture");
        let tensors = fixture
            .checkpoint_tensors()
            .expect("the checkpoint's header")
            .into_iter()
            .map(|(k, (dtype, shape))| {
                let dtype = if dtype == "F32" { mlxcel_plugin_api::DType::F32 } else { mlxcel_plugin_api::DType::BF16 };
                let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
                TensorSpec::new(k.as_str(), dtype, &shape)
            })
            .collect();
        CheckpointIndex { tensors }
    }

    fn report(config: &LlavaConfig, index: &CheckpointIndex) -> Vec<String> {
        Llava::check_checkpoint(config, index).expect("report").problems.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn the_fixture_checkpoint_has_every_encoder_parameter() {
        assert_eq!(report(&fixture_config(), &fixture_index()), Vec::<String>::new());
    }

    /// The hub's LLaVA checkpoints keep the tower under `vision_tower.vision_model.`,
    /// transformers 5 under `vision_tower.`: the tensors decide, never a version string.
    #[test]
    fn the_tower_is_found_in_either_checkpoint_layout_and_misfits_are_named() {
        let mut hub = fixture_index();
        for t in hub.tensors.iter_mut() {
            if let Some(rest) = t.name.as_str().strip_prefix("vision_tower.") {
                t.name = format!("vision_tower.vision_model.{rest}").into();
            }
        }
        assert_eq!(report(&fixture_config(), &hub), Vec::<String>::new());

        let mut both = fixture_index();
        both.tensors.extend(hub.tensors.iter().filter(|t| t.name.as_str().contains("vision_model")).cloned());
        let problems = report(&fixture_config(), &both);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(
            problems[0].contains("more than one root (`vision_tower.`, `vision_tower.vision_model.`)"),
            "{problems:?}"
        );

        let mut config = fixture_config();
        config.text_hidden_size = 32;
        let problems = report(&config, &fixture_index());
        assert!(
            problems
                .iter()
                .any(|p| p == "`multi_modal_projector.linear_1.weight` has shape [64, 32], the config needs [32, 32]"),
            "{problems:#?}"
        );
    }
}
