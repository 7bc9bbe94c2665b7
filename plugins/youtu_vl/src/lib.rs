//! The Youtu-VL family plugin for mlxcel-host.
//!
//! Accepts `YoutuVLForConditionalGeneration` (`model_type` `youtu_vl`). transformers has no
//! Youtu-VL, so the reference is mlx-vlm 0.7.10's `models/youtu_vl` (`vision.py` for the tower,
//! `youtu_vl.py` for the merge, `config.py` for the defaults); its processor is remote code
//! that no reference ships, so preprocessing is a documented stand-in ([`processor`]).
//!
//! - `config.rs`: the typed, flat `config.json` and the stand-in processor's settings;
//! - `processor.rs`: images to merge-ordered SigLIP2 patch rows;
//! - `vision.rs`: the SigLIP2 tower with Qwen2.5-VL's window attention and 2-D rotary
//!   embedding, and the patch merger, as StableHLO per bucket of patch rows.
//!
//! The chat template renders `<|vision_start|><|image_pad|><|vision_end|>` per image, and each
//! `<|image_pad|>` becomes one per merged 2x2 unit (the Qwen-VL expansion,
//! `mlxcel_family_common::qwen_vl::prompt`). The merger's rows replace those tokens in order,
//! unscaled, at plain 1-D positions under a causal mask (`mlxcel_family_common::contract`): the
//! text model's rotary embedding is 1-D. The text model is Youtu-LLM, Llama's blocks with
//! multi-head latent attention (the decoder library's `youtu` preset read with mlx-vlm's
//! defaults). Video is not served: the host sends this plugin images only.

#![forbid(unsafe_code)]

mod config;
mod processor;
mod vision;

use mlxcel_family_common::contract::replace_in_order;
use mlxcel_family_common::qwen_vl::prompt;
use mlxcel_family_common::qwen_vl::vision::{FEATURES, buckets};
use mlxcel_plugin_api::decoder::{DecoderSpec, presets};
use mlxcel_plugin_api::{
    Capability, ConfigSummary, ContractRequest, DType, EncoderCompute, EncoderGraph, EncoderGraphRequest,
    EncoderTarget, FamilyPlugin, LayoutRequest, MediaItem, Modality, ParsedConfig, PluginError, PluginIdentity,
    PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket,
};

pub use config::YoutuVlConfig;

/// The family.
#[derive(Debug)]
pub struct YoutuVl;

impl FamilyPlugin for YoutuVl {
    type Config = YoutuVlConfig;

    fn identity() -> PluginIdentity {
        PluginIdentity::new(
            "youtu-vl",
            env!("CARGO_PKG_VERSION"),
            &["YoutuVLForConditionalGeneration"],
            &["youtu_vl"],
            &[Modality::Image],
            &[Capability::Image, Capability::MultiImage],
            &["https://github.com/Blaizzy/mlx-vlm/tree/v0.7.10/mlx_vlm/models/youtu_vl"],
        )
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<YoutuVlConfig>, PluginError> {
        let config = YoutuVlConfig::parse(config_json, processor_json)?;
        let summary = ConfigSummary::new(
            &config.model_type,
            &config.architecture,
            &[Modality::Image],
            config.text_hidden_size,
            &config.special_tokens(),
        );
        Ok(ParsedConfig { summary, config })
    }

    fn prompt_layout(config: &YoutuVlConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        prompt::layout(config, request)
    }

    fn preprocess(
        config: &YoutuVlConfig,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        processor::preprocess(config, item, options)
    }

    fn encoder_buckets(config: &YoutuVlConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        buckets(config, &vision::signature(config), modality, "youtu-vl")
    }

    fn encoder_graph(
        config: &YoutuVlConfig,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError> {
        mlxcel_family_common::vit::f32_only(compute, "youtu_vl")?;
        vision::graph(config, request, target)
    }

    fn prefill_program(config: &YoutuVlConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        replace_in_order(request, config.image_token_id, FEATURES)
    }

    fn encoder_parameters(config: &YoutuVlConfig) -> Vec<(String, Vec<usize>)> {
        vision::parameters(config)
    }

    fn encoder_weight_dtype(config: &YoutuVlConfig) -> DType {
        config.weights.dtype()
    }

    /// Youtu-LLM as the decoder library's `youtu` preset builds it, reading the checkpoint's
    /// flat config (`model_type` `youtu_vl`) with the defaults of mlx-vlm 0.7.10's
    /// `youtu_vl.TextConfig`, which differ from transformers' `YoutuConfig` (a 4B model's widths,
    /// rope theta 500000, a larger vocabulary).
    fn decoder_spec(_config: &YoutuVlConfig) -> Result<Option<DecoderSpec>, PluginError> {
        let mut spec = presets::youtu();
        spec.model_types = vec!["youtu_vl".into()];
        let defaults = serde_json::json!({
            "vocab_size": 283386, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 40,
            "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-6, "kv_lora_rank": 512,
            "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
            "rope_theta": 500000.0, "rope_interleave": true, "tie_word_embeddings": true, "attention_bias": false,
            "mlp_bias": false,
        });
        spec.config_defaults = defaults.as_object().cloned().unwrap_or_default();
        Ok(Some(spec))
    }
}

mlxcel_plugin_api::export_plugin!(YoutuVl);

/// Fixture access for the unit tests.
#[cfg(test)]
mod testing {
    use mlxcel_golden::{Fixture, Golden};
    use mlxcel_plugin_api::MediaItem;

    use crate::config::YoutuVlConfig;

    pub(crate) fn fixture() -> Fixture {
        Fixture::named("youtu_vl").expect("the youtu_vl fixture")
    }

    pub(crate) fn fixture_config_json() -> String {
        std::fs::read_to_string(fixture().dir().join("config.json")).expect("config.json")
    }

    /// The fixture's config; it has no processor config, so the stand-in's defaults apply.
    pub(crate) fn fixture_config() -> YoutuVlConfig {
        YoutuVlConfig::parse(&fixture_config_json(), "").expect("parse")
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
    use mlxcel_plugin_api::decoder::TextConfig;
    use mlxcel_plugin_api::decoder::spec::AttentionKind;
    use mlxcel_plugin_api::{ItemMeta, Positions, RVec};

    use super::*;
    use crate::testing::{fixture_config, fixture_config_json, golden};

    const VARIANTS: [(&str, usize); 4] = [("image", 1), ("long", 1), ("two_images", 2), ("text_only", 0)];

    fn items(variant: &str) -> RVec<ItemMeta> {
        let config = fixture_config();
        let golden = golden(variant);
        let paths = golden.field("images").ok().and_then(|v| v.as_array().cloned()).unwrap_or_default();
        paths
            .iter()
            .map(|path| {
                let item = testing::image_item(path.as_str().expect("path"));
                let out = YoutuVl::preprocess(&config, &item, &PreprocessOptions::default()).expect("preprocess");
                ItemMeta { modality: Modality::Image, grid: out.grid }
            })
            .collect()
    }

    /// The expanded prompt tokenizes to the golden `input_ids`: its pad runs are the golden's, and
    /// the text around them is the golden's expanded prompt.
    #[test]
    fn each_placeholder_expands_as_the_goldens_expanded_prompt() {
        let config = fixture_config();
        for (variant, images) in VARIANTS {
            let golden = golden(variant);
            let items = items(variant);
            assert_eq!(items.len(), images, "{variant}");
            let request = LayoutRequest { prompt: golden.prompt().expect("prompt").into(), items };
            let layout = YoutuVl::prompt_layout(&config, &request).expect("layout");
            let want = golden.field("expanded_prompt").expect("expanded").as_str().expect("text");
            assert_eq!(layout.text.as_str(), want, "{variant}");
        }
    }

    #[test]
    fn positions_are_one_d_and_features_replace_the_image_pads() {
        let config = fixture_config();
        for (variant, _) in VARIANTS {
            let golden = golden(variant);
            let ids: RVec<u32> = golden.input_ids().expect("ids").iter().map(|&i| i as u32).collect();
            let request = ContractRequest { token_ids: ids.clone(), items: items(variant) };
            let program = YoutuVl::prefill_program(&config, &request).expect("program");
            let Positions::OneD { ids: positions, next_position } = &program.positions else { panic!("1-D positions") };
            golden.check_i64("position_ids", positions).expect(variant);
            assert_eq!(*next_position, ids.len() as i64, "{variant}");
            let placed: u32 = program.placements.iter().map(|p| p.span().expect("a span").1).sum();
            assert_eq!(placed as usize, ids.iter().filter(|&&t| t == config.image_token_id).count(), "{variant}");
            assert_eq!(program.text_scale, 1.0);
        }
    }

    /// The spec reads the fixture's flat config into the MLA decoder the reference builds, and a
    /// sparse config with mlx-vlm's defaults.
    #[test]
    fn the_decoder_spec_reads_the_flat_config_with_the_references_defaults() {
        let spec = YoutuVl::decoder_spec(&fixture_config()).expect("spec").expect("some");
        assert_eq!(spec.attention.kind, AttentionKind::MultiHeadLatent);
        let text = TextConfig::parse_with(&fixture_config_json(), Some(&spec)).expect("the fixture's config");
        assert_eq!((text.hidden, text.layers, text.vocab, text.tied_embeddings), (64, 2, 400, true));
        let sparse = TextConfig::parse_with(r#"{"model_type": "youtu_vl"}"#, Some(&spec)).expect("sparse");
        assert_eq!((sparse.hidden, sparse.layers, sparse.heads, sparse.vocab), (2560, 40, 32, 283386));
    }
}
