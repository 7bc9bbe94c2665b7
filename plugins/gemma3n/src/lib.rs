//! The Gemma 3n family plugin for mlxcel-host: audio in.
//!
//! Accepts `Gemma3nForConditionalGeneration` (`model_type` `gemma3n`). The reference is
//! transformers' `models/gemma3n` at the version the fixture's provenance records:
//! `feature_extraction_gemma3n.py` (the log-mel features), `processing_gemma3n.py` (the audio
//! block), `modeling_gemma3n.py` (`Gemma3nAudioEncoder` and its blocks, the audio
//! `Gemma3nMultimodalEmbedder`, `Gemma3nModel.forward`'s merge) and `configuration_gemma3n.py`.
//! The vision tower (MobileNetV5) is not implemented: images are unsupported.
//!
//! - `config.rs`: the typed `config.json` audio side and the feature extractor's settings;
//! - `processor.rs`: a WAV clip (or decoded samples) to log-mel `input_features` and their mask;
//! - `prompt.rs`: `<audio_soft_token>` to the processor's whole audio block;
//! - `audio.rs`: the subsampling convolutions, the conformer, the reduction and the audio
//!   embedder as StableHLO, per bucket of mel frames;
//! - `contract.rs`: `sqrt(hidden)` text scaling, the clip's rows and its `<end_of_audio>` row
//!   placed, causal mask, 1-D positions.

#![forbid(unsafe_code)]

mod audio;
mod config;
mod contract;
mod processor;
mod prompt;

use mlxcel_plugin_api::decoder::spec::DecoderSpec;
use mlxcel_plugin_api::{
    Capability, ConfigSummary, ContractRequest, DType, EncoderCompute, EncoderGraph, EncoderGraphRequest,
    EncoderTarget, FamilyPlugin, LayoutRequest, MediaItem, Modality, ParsedConfig, PluginError, PluginIdentity,
    PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
};

pub use config::Gemma3nConfig;

/// The family.
#[derive(Debug)]
pub struct Gemma3n;

impl FamilyPlugin for Gemma3n {
    type Config = Gemma3nConfig;

    fn identity() -> PluginIdentity {
        PluginIdentity::new(
            "gemma3n",
            env!("CARGO_PKG_VERSION"),
            &["Gemma3nForConditionalGeneration"],
            &["gemma3n"],
            &[Modality::Audio],
            &[Capability::Audio],
            &["https://github.com/huggingface/transformers/tree/v5.24.0/src/transformers/models/gemma3n"],
        )
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<Gemma3nConfig>, PluginError> {
        let config = Gemma3nConfig::parse(config_json, processor_json)?;
        let summary = ConfigSummary::new(
            &config.model_type,
            &config.architecture,
            &[Modality::Audio],
            config.text_hidden_size,
            &[
                ("audio_soft", config.audio_token_id),
                ("audio_start", config.boa_token_id),
                ("audio_end", config.eoa_token_id),
            ],
        );
        Ok(ParsedConfig { summary, config })
    }

    fn prompt_layout(config: &Gemma3nConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        prompt::layout(config, request)
    }

    fn preprocess(
        config: &Gemma3nConfig,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        processor::preprocess(config, item, options)
    }

    fn encoder_buckets(config: &Gemma3nConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        audio::buckets(config, modality)
    }

    fn encoder_graph(
        config: &Gemma3nConfig,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError> {
        mlxcel_family_common::vit::f32_only(compute, "gemma3n")?;
        audio::graph(config, request, target)
    }

    fn prefill_program(config: &Gemma3nConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        contract::contract(config, request)
    }

    fn encoder_parameters(config: &Gemma3nConfig) -> Vec<(String, Vec<usize>)> {
        audio::parameters(config)
    }

    fn encoder_weight_dtype(config: &Gemma3nConfig) -> DType {
        config.weights.dtype()
    }

    /// None: the text model (`gemma3n_text`: AltUp, LAuReL, per-layer inputs, KV-shared layers)
    /// comes from the decoder library's preset for its `model_type`, not from this plugin.
    fn decoder_spec(_config: &Gemma3nConfig) -> Result<Option<DecoderSpec>, PluginError> {
        Ok(None)
    }
}

mlxcel_plugin_api::export_plugin!(Gemma3n);

/// Fixture access for the unit tests.
#[cfg(test)]
mod testing {
    use mlxcel_golden::{Fixture, Golden};
    use mlxcel_plugin_api::MediaItem;

    use crate::config::Gemma3nConfig;

    /// Each variant with its clip count.
    pub(crate) const VARIANT_CLIPS: [(&str, usize); 4] =
        [("audio", 1), ("two_audios", 2), ("long", 1), ("text_only", 0)];

    fn fixture() -> Fixture {
        Fixture::named("gemma3n").expect("the gemma3n fixture")
    }

    /// The fixture's `config.json` and `processor_config.json`.
    pub(crate) fn fixture_json() -> (String, String) {
        let dir = fixture();
        let read = |name: &str| std::fs::read_to_string(dir.dir().join(name)).expect("read");
        (read("config.json"), read("processor_config.json"))
    }

    pub(crate) fn fixture_config() -> Gemma3nConfig {
        let (config, processor) = fixture_json();
        Gemma3nConfig::parse(&config, &processor).expect("parse")
    }

    pub(crate) fn golden(variant: &str) -> Golden {
        fixture().golden(variant).expect("golden")
    }

    /// A fixture input as the encoded file.
    pub(crate) fn audio_item(path: &str) -> MediaItem {
        MediaItem::EncodedAudio(std::fs::read(fixture().dir().join(path)).expect("read audio").into())
    }
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{CheckpointIndex, TensorSpec};

    use super::*;
    use crate::testing::{fixture_config, fixture_json};

    #[test]
    fn the_fixture_checkpoint_holds_every_encoder_weight() {
        let config = fixture_config();
        let tensors: Vec<TensorSpec> = mlxcel_golden::Fixture::named("gemma3n")
            .expect("fixture")
            .checkpoint_tensors()
            .expect("tensors")
            .into_iter()
            .map(|(name, (_, shape))| {
                TensorSpec::new(name, DType::F32, &shape.iter().map(|&d| d as u64).collect::<Vec<_>>())
            })
            .collect();
        let report =
            Gemma3n::check_checkpoint(&config, &CheckpointIndex { tensors: tensors.clone().into() }).expect("report");
        assert!(report.problems.is_empty(), "{:?}", report.problems);
        let without: Vec<TensorSpec> =
            tensors.into_iter().filter(|t| t.name.as_str() != "model.embed_audio.hard_embedding_norm.weight").collect();
        let report = Gemma3n::check_checkpoint(&config, &CheckpointIndex { tensors: without.into() }).expect("report");
        let problems: Vec<&str> = report.problems.iter().map(|p| p.as_str()).collect();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("hard_embedding_norm.weight"), "{problems:?}");
    }

    #[test]
    fn identity_and_summary_name_the_audio_side_only() {
        let id = Gemma3n::identity();
        assert_eq!(
            (id.name.as_str(), id.modalities.as_slice(), id.capabilities.as_slice()),
            ("gemma3n", &[Modality::Audio][..], &[Capability::Audio][..])
        );
        let (config, processor) = fixture_json();
        let parsed = Gemma3n::parse_config(&config, &processor).expect("parse");
        let roles: Vec<(&str, u32)> = parsed.summary.special_tokens.iter().map(|t| (t.role.as_str(), t.id)).collect();
        assert_eq!(roles, [("audio_soft", 401), ("audio_start", 391), ("audio_end", 400)]);
        assert_eq!(parsed.summary.text_hidden_size, 64);
        assert!(Gemma3n::decoder_spec(&parsed.config).expect("spec").is_none());
    }
}
