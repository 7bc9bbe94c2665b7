//! The Qwen2.5-VL family plugin for mlxcel-host.
//!
//! Accepts `Qwen2_5_VLForConditionalGeneration` (`model_type` `qwen2_5_vl`). The reference is
//! transformers' `models/qwen2_5_vl` (`modeling_qwen2_5_vl.py` for the vision tower and
//! `get_rope_index`; its processor is Qwen2-VL's), at the version the fixture's provenance
//! records.
//!
//! - `config.rs`: the typed `config.json`, the vision tower's fields beside the shared ones;
//! - `vision.rs`: the windowed vision tower as StableHLO, per bucket of patch rows.
//!
//! The processor, `<|image_pad|>` expansion and the M-RoPE contract are the Qwen-VL families'
//! shared ones (`mlxcel_family_common::qwen_vl`): for images, Qwen2.5-VL's `get_rope_index`
//! gives the positions Qwen2-VL's does (an image's one frame is temporal position 0, whatever
//! `tokens_per_second` is). Video is not served: the host sends this plugin images only.

#![forbid(unsafe_code)]

mod config;
mod vision;

use mlxcel_family_common::qwen_vl::{contract, processor, prompt};
use mlxcel_plugin_api::decoder::DecoderSpec;
use mlxcel_plugin_api::{
    Capability, ConfigSummary, ContractRequest, DType, EncoderCompute, EncoderGraph, EncoderGraphRequest,
    EncoderTarget, FamilyPlugin, LayoutRequest, MediaItem, Modality, ParsedConfig, PluginError, PluginIdentity,
    PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
};

pub use config::Qwen25VlConfig;

/// The family.
#[derive(Debug)]
pub struct Qwen25Vl;

impl FamilyPlugin for Qwen25Vl {
    type Config = Qwen25VlConfig;

    fn identity() -> PluginIdentity {
        PluginIdentity::new(
            "qwen2-5-vl",
            env!("CARGO_PKG_VERSION"),
            &["Qwen2_5_VLForConditionalGeneration"],
            &["qwen2_5_vl"],
            &[Modality::Image],
            &[Capability::Image, Capability::MultiImage],
            &["https://github.com/huggingface/transformers/tree/v5.24.0/src/transformers/models/qwen2_5_vl"],
        )
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<Qwen25VlConfig>, PluginError> {
        let config = Qwen25VlConfig::parse(config_json, processor_json)?;
        let q = &config.qwen;
        let summary = ConfigSummary::new(
            &q.model_type,
            &q.architecture,
            &[Modality::Image],
            q.text_hidden_size,
            &q.special_tokens(),
        );
        Ok(ParsedConfig { summary, config })
    }

    fn prompt_layout(config: &Qwen25VlConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        prompt::layout(&config.qwen, request)
    }

    fn preprocess(
        config: &Qwen25VlConfig,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        processor::preprocess(&config.qwen, item, options)
    }

    fn encoder_buckets(config: &Qwen25VlConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        mlxcel_family_common::qwen_vl::vision::buckets(&config.qwen, &vision::signature(config), modality, "qwen2-5-vl")
    }

    fn encoder_graph(
        config: &Qwen25VlConfig,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError> {
        vision::graph(config, request, target, compute)
    }

    fn prefill_program(config: &Qwen25VlConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        contract::contract(&config.qwen, request, &contract::Layout::default())
    }

    fn encoder_parameters(config: &Qwen25VlConfig) -> Vec<(String, Vec<usize>)> {
        vision::parameters(config)
    }

    fn encoder_weight_dtype(config: &Qwen25VlConfig) -> DType {
        config.qwen.weights.dtype()
    }

    /// The Qwen-VL families' text decoder (`mlxcel_family_common::qwen_vl::decoder_spec`).
    fn decoder_spec(_config: &Qwen25VlConfig) -> Result<Option<DecoderSpec>, PluginError> {
        Ok(Some(mlxcel_family_common::qwen_vl::decoder_spec(["qwen2_5_vl_text", "qwen2_5_vl"])))
    }
}

mlxcel_plugin_api::export_plugin!(Qwen25Vl);

/// Fixture access for the unit tests.
#[cfg(test)]
mod testing {
    use crate::config::Qwen25VlConfig;

    pub(crate) fn fixture_config() -> Qwen25VlConfig {
        let dir = mlxcel_golden::Fixture::named("qwen2_5_vl").expect("the qwen2_5_vl fixture");
        let read = |name: &str| std::fs::read_to_string(dir.dir().join(name)).expect("read");
        Qwen25VlConfig::parse(&read("config.json"), &read("processor_config.json")).expect("parse")
    }
}
