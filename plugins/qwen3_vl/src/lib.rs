//! The Qwen3-VL family plugin for mlxcel-host.
//!
//! Accepts `Qwen3VLForConditionalGeneration` (`model_type` `qwen3_vl`). The reference is
//! transformers' `models/qwen3_vl` (`modeling_qwen3_vl.py` for the vision tower, `get_rope_index`
//! and the DeepStack injection; its image processor is Qwen2-VL's with patch 16), at the version
//! the fixture's provenance records.
//!
//! - `config.rs`: the typed `config.json`, the vision tower's fields beside the shared ones;
//! - `processor.rs`: the shared processor plus each patch row's taps into the learned position
//!   table;
//! - `vision.rs`: the vision tower as StableHLO, per bucket of patch rows, with its DeepStack
//!   outputs.
//!
//! The rest is the Qwen-VL families' shared code (`mlxcel_family_common::qwen_vl`): prompt
//! expansion and the M-RoPE contract, here with the sections interleaved over the rotary
//! dimensions (Qwen3-VL's text rotary embedding always interleaves them) and the k-th DeepStack
//! output added to text layer k's output at the image tokens. Video is not served: the host
//! sends this plugin images only.

#![forbid(unsafe_code)]

mod config;
mod processor;
mod vision;

use mlxcel_family_common::qwen_vl::{contract, prompt};
use mlxcel_plugin_api::decoder::{DecoderSpec, presets};
use mlxcel_plugin_api::{
    Capability, ConfigSummary, ContractRequest, DType, EncoderCompute, EncoderGraph, EncoderGraphRequest,
    EncoderTarget, FamilyPlugin, LayoutRequest, MediaItem, Modality, ParsedConfig, PluginError, PluginIdentity,
    PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
};

pub use config::Qwen3VlConfig;

/// The family.
#[derive(Debug)]
pub struct Qwen3Vl;

/// The contract's family-specific part: interleaved sections, one DeepStack output per
/// injected text layer.
fn layout(config: &Qwen3VlConfig) -> contract::Layout {
    contract::Layout {
        interleaved: true,
        injected: (0..config.vision.deepstack_visual_indexes.len()).map(vision::deepstack_output).collect(),
    }
}

impl FamilyPlugin for Qwen3Vl {
    type Config = Qwen3VlConfig;

    fn identity() -> PluginIdentity {
        PluginIdentity::new(
            "qwen3-vl",
            env!("CARGO_PKG_VERSION"),
            &["Qwen3VLForConditionalGeneration"],
            &["qwen3_vl"],
            &[Modality::Image],
            &[Capability::Image, Capability::MultiImage],
            &["https://github.com/huggingface/transformers/tree/v5.24.0/src/transformers/models/qwen3_vl"],
        )
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<Qwen3VlConfig>, PluginError> {
        let config = Qwen3VlConfig::parse(config_json, processor_json)?;
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

    fn prompt_layout(config: &Qwen3VlConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        prompt::layout(&config.qwen, request)
    }

    fn preprocess(
        config: &Qwen3VlConfig,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        processor::preprocess(config, item, options)
    }

    fn encoder_buckets(config: &Qwen3VlConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        mlxcel_family_common::qwen_vl::vision::buckets(&config.qwen, &vision::signature(config), modality, "qwen3-vl")
    }

    fn encoder_graph(
        config: &Qwen3VlConfig,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError> {
        mlxcel_family_common::vit::f32_only(compute, "qwen3_vl")?;
        vision::graph(config, request, target)
    }

    fn prefill_program(config: &Qwen3VlConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        contract::contract(&config.qwen, request, &layout(config))
    }

    fn encoder_parameters(config: &Qwen3VlConfig) -> Vec<(String, Vec<usize>)> {
        vision::parameters(config)
    }

    fn encoder_weight_dtype(config: &Qwen3VlConfig) -> DType {
        config.qwen.weights.dtype()
    }

    /// The qwen3 preset (per-head q/k norms) under Qwen3-VL's model types, with
    /// `Qwen3VLTextConfig`'s defaults (transformers 5.24; its `default_theta` is 5e5) and one
    /// injected layer per DeepStack output.
    fn decoder_spec(config: &Qwen3VlConfig) -> Result<Option<DecoderSpec>, PluginError> {
        let mut spec = presets::qwen3();
        spec.model_types = vec!["qwen3_vl_text".into(), "qwen3_vl".into()];
        let defaults = serde_json::json!({
            "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "rms_norm_eps": 1e-6,
            "rope_theta": 500000.0, "attention_bias": false,
        });
        spec.config_defaults.extend(defaults.as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
        spec.injected_layers = config.vision.deepstack_visual_indexes.len();
        Ok(Some(spec))
    }
}

mlxcel_plugin_api::export_plugin!(Qwen3Vl);

/// Fixture access for the unit tests.
#[cfg(test)]
mod testing {
    use crate::config::Qwen3VlConfig;

    pub(crate) fn fixture_config() -> Qwen3VlConfig {
        let dir = mlxcel_golden::Fixture::named("qwen3_vl").expect("the qwen3_vl fixture");
        let read = |name: &str| std::fs::read_to_string(dir.dir().join(name)).expect("read");
        Qwen3VlConfig::parse(&read("config.json"), &read("processor_config.json")).expect("parse")
    }
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::{ItemMeta, MediaGrid, Positions, TokenSet};

    use super::*;
    use crate::testing::fixture_config;

    /// Each image's DeepStack outputs go to text layers 0, 1, ... at exactly the tokens its
    /// features replace, and the positions are interleaved. (That dropping them diverges from
    /// the reference is `plugins verify` on the fixture: without them the logits differ by 3.1
    /// and the greedy tokens at the first or seventh.)
    #[test]
    fn each_images_deepstack_rows_go_to_the_first_layers_at_its_tokens() {
        let config = fixture_config();
        let golden = mlxcel_golden::Fixture::named("qwen3_vl").expect("fixture").golden("two_images").expect("golden");
        let ids: Vec<u32> = golden.input_ids().expect("ids").iter().map(|&i| i as u32).collect();
        let grid = |h: u32, w: u32| MediaGrid { dims: vec![1, h, w].into(), feature_tokens: h * w / 4 };
        let items = [grid(4, 6), grid(6, 4)].map(|grid| ItemMeta { modality: Modality::Image, grid });
        let request = ContractRequest { token_ids: ids.into(), items: items.to_vec().into() };
        let program = Qwen3Vl::prefill_program(&config, &request).expect("program");
        assert!(matches!(program.positions, Positions::MRope { interleaved: true, .. }));
        assert_eq!(program.injections.len(), 2 * 2);
        for p in program.placements.iter() {
            let mine: Vec<_> = program.injections.iter().filter(|i| i.item == p.item).collect();
            let layers: Vec<(u32, &str)> = mine.iter().map(|i| (i.decoder_layer, i.encoder_output.as_str())).collect();
            assert_eq!(layers, [(0, "deepstack_features.0"), (1, "deepstack_features.1")]);
            assert!(mine.iter().all(|i| i.tokens == p.tokens && matches!(i.tokens, TokenSet::Span { .. })));
        }
        let spec = Qwen3Vl::decoder_spec(&config).expect("spec").expect("qwen3-vl brings one");
        assert_eq!((spec.injected_layers, spec.name.as_str()), (2, "qwen3"));
    }
}
