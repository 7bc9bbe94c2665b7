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
    Capability, CheckpointIndex, CheckpointReport, ConfigSummary, ContractRequest, EncoderGraph, EncoderGraphRequest,
    FamilyPlugin, LayoutRequest, MediaItem, Modality, ParsedConfig, PluginError, PluginIdentity, PrefillContract,
    PreprocessOptions, Preprocessed, PromptLayout, RString, RVec, ShapeBucket, SpecialToken,
};

pub use config::LlavaConfig;

/// The family.
#[derive(Debug)]
pub struct Llava;

impl FamilyPlugin for Llava {
    type Config = LlavaConfig;

    fn identity() -> PluginIdentity {
        let reference = |model: &str| {
            RString::from(format!(
                "https://github.com/huggingface/transformers/tree/v5.24.0/src/transformers/models/{model}"
            ))
        };
        PluginIdentity {
            name: "llava".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            architectures: RVec::from(vec![RString::from("LlavaForConditionalGeneration")]),
            model_types: RVec::from(vec![RString::from("llava")]),
            modalities: RVec::from(vec![Modality::Image]),
            capabilities: RVec::from(vec![Capability::Image, Capability::MultiImage]),
            references: RVec::from(vec![reference("llava"), reference("clip")]),
        }
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<LlavaConfig>, PluginError> {
        let config = LlavaConfig::parse(config_json, processor_json)?;
        let summary = ConfigSummary {
            model_type: config.model_type.as_str().into(),
            architecture: config.architecture.as_str().into(),
            modalities: RVec::from(vec![Modality::Image]),
            text_hidden_size: config.text_hidden_size,
            special_tokens: RVec::from(vec![SpecialToken { role: "image".into(), id: config.image_token_id }]),
        };
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

    fn encoder_graph(config: &LlavaConfig, request: &EncoderGraphRequest) -> Result<EncoderGraph, PluginError> {
        vision::graph(config, request)
    }

    fn prefill_contract(config: &LlavaConfig, request: &ContractRequest) -> Result<PrefillContract, PluginError> {
        contract::contract(config, request)
    }

    fn check_checkpoint(config: &LlavaConfig, index: &CheckpointIndex) -> Result<CheckpointReport, PluginError> {
        Ok(checkpoint_report(config, index))
    }
}

/// Every encoder parameter the checkpoint lacks or holds in another shape or dtype. A missing
/// tower weight found under the other checkpoint layout is named with it.
fn checkpoint_report(config: &LlavaConfig, index: &CheckpointIndex) -> CheckpointReport {
    let present = |key: &str| index.tensors.iter().any(|t| t.name.as_str() == key);
    CheckpointReport::f32_parameters(index, vision::parameters(config), |key| {
        // Name the other tower layout when that is what the checkpoint has.
        let other = key
            .strip_prefix(config.vision_prefix.as_str())
            .map(|rest| format!("{}{rest}", config::other_vision_prefix(&config.vision_prefix)))
            .filter(|other| present(other));
        match other {
            Some(other) => format!(
                "the checkpoint has no `{key}` but has `{other}`: its tower is saved in the other layout than \
                 config.json's transformers_version implies"
            ),
            None => format!("the checkpoint has no `{key}`"),
        }
    })
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
        let path = mlxcel_golden::Fixture::named("llava").expect("fixture").dir().join("model.safetensors");
        let bytes = std::fs::read(path).expect("read");
        let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
        let tensors = header
            .as_object()
            .expect("object")
            .iter()
            .filter(|(k, _)| *k != "__metadata__")
            .map(|(k, v)| {
                let dtype =
                    if v["dtype"] == "F32" { mlxcel_plugin_api::DType::F32 } else { mlxcel_plugin_api::DType::BF16 };
                let shape: Vec<u64> = v["shape"].as_array().expect("shape").iter().filter_map(|d| d.as_u64()).collect();
                TensorSpec::new(k.as_str(), dtype, &shape)
            })
            .collect();
        CheckpointIndex { tensors }
    }

    fn report(config: &LlavaConfig, index: &CheckpointIndex) -> Vec<String> {
        checkpoint_report(config, index).problems.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn the_fixture_checkpoint_has_every_encoder_parameter() {
        assert_eq!(report(&fixture_config(), &fixture_index()), Vec::<String>::new());
    }

    #[test]
    fn a_checkpoint_in_the_other_layout_is_named() {
        let mut config = fixture_config();
        config.vision_prefix = "vision_tower.vision_model.".into();
        let problems = report(&config, &fixture_index());
        assert_eq!(problems.len(), 3 + 2 + 2 * 16, "{problems:#?}");
        assert_eq!(
            problems[0],
            "the checkpoint has no `vision_tower.vision_model.embeddings.class_embedding` but has \
             `vision_tower.embeddings.class_embedding`: its tower is saved in the other layout than config.json's \
             transformers_version implies"
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
