//! The Molmo2 family plugin for mlxcel-host.
//!
//! Accepts `Molmo2ForConditionalGeneration` (`model_type` `molmo2`). The reference is
//! transformers' `models/molmo2` (`image_processing_molmo2.py` and `processing_molmo2.py` for
//! the crops, the pooling table and the image blocks, `modeling_molmo2.py` for the ViT, the
//! adapter, the merge and the mask, `conversion_mapping.py` for the checkpoint layout) at the
//! version the fixture's provenance records.
//!
//! - `config.rs`: the typed `config.json` (legacy `vit_config` too) and processor fields;
//! - `processor.rs`: an image to its global crop and overlapping high-resolution crops,
//!   patchified, and the pooling index table (torchvision's bilinear arithmetic);
//! - `prompt.rs`: `<|image|>` to the low- and high-resolution blocks;
//! - `vision.rs`: the ViT, the indexed attention pooling and the SwiGLU projector as StableHLO;
//! - `contract.rs`: features added at `<im_patch>`, the bidirectional image block, 1-D positions;
//! - the decoder: Qwen3's blocks (q/k norms per head) in the Molmo weight layout (fused
//!   `att_proj` and `ff_proj`, the additional vocabulary in its own table), this plugin's spec.

#![forbid(unsafe_code)]

mod config;
mod contract;
mod processor;
mod prompt;
mod vision;

use mlxcel_family_common::Image;
use mlxcel_plugin_api::decoder::presets;
use mlxcel_plugin_api::decoder::spec::{Attention, DecoderSpec, NormPlacement, Norms, QkNormScope, WeightLayout};
use mlxcel_plugin_api::{
    Capability, ConfigSummary, ContractRequest, DType, EncoderCompute, EncoderGraph, EncoderGraphRequest,
    EncoderTarget, ErrorCode, FamilyPlugin, LayoutRequest, MediaGrid, MediaItem, Modality, ParsedConfig, PluginError,
    PluginIdentity, PrefillProgram, PreprocessOptions, Preprocessed, PromptLayout, ShapeBucket, Tensor, TensorSpec,
};

pub use config::Molmo2Config;

/// The family.
#[derive(Debug)]
pub struct Molmo2;

impl FamilyPlugin for Molmo2 {
    type Config = Molmo2Config;

    fn identity() -> PluginIdentity {
        PluginIdentity::new(
            "molmo2",
            env!("CARGO_PKG_VERSION"),
            &["Molmo2ForConditionalGeneration"],
            &["molmo2"],
            &[Modality::Image],
            &[Capability::Image, Capability::MultiImage],
            &["https://github.com/huggingface/transformers/tree/v5.24.0/src/transformers/models/molmo2"],
        )
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<Molmo2Config>, PluginError> {
        let config = Molmo2Config::parse(config_json, processor_json)?;
        let t = &config.tokens;
        let summary = ConfigSummary::new(
            &config.model_type,
            &config.architecture,
            &[Modality::Image],
            config.text_hidden_size as u32,
            &[
                ("image_patch", t.image_patch),
                ("image_start", t.image_start),
                ("image_low_res_start", t.low_res_image_start),
                ("image_end", t.image_end),
                ("image_col", t.image_col),
                // The processor starts every prompt with the tokenizer's bos_token (else its
                // eos_token), never with an id of config.json: the host finds it so.
                (mlxcel_plugin_api::PROMPT_START, mlxcel_plugin_api::PROMPT_START_UNKNOWN),
            ],
        );
        Ok(ParsedConfig { summary, config })
    }

    fn prompt_layout(config: &Molmo2Config, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        prompt::layout(config, request)
    }

    fn preprocess(
        config: &Molmo2Config,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        preprocess(config, item, options)
    }

    fn encoder_buckets(config: &Molmo2Config, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        vision::buckets(config, modality)
    }

    fn encoder_graph(
        config: &Molmo2Config,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError> {
        mlxcel_family_common::vit::f32_only(compute, "molmo2")?;
        vision::graph(config, request, target)
    }

    fn prefill_program(config: &Molmo2Config, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        contract::contract(config, request)
    }

    fn encoder_parameters(config: &Molmo2Config) -> Vec<(String, Vec<usize>)> {
        vision::parameters(config)
    }

    fn encoder_weight_dtype(config: &Molmo2Config) -> DType {
        config.weights.dtype()
    }

    /// Qwen3's blocks (q/k norms, no q/k/v bias unless the config's `attention_bias`, SwiGLU,
    /// plain RMSNorm, untied head) reading `molmo2_text` in the Molmo weight layout, with
    /// `Molmo2TextConfig`'s defaults and its `attribute_map` (`qkv_bias`, `layer_norm_eps`);
    /// the q/k norm over the whole projection for `qk_norm_type` `olmo` (Molmo2-O, OLMo-based),
    /// and the norms after the blocks for `norm_after`. The variants it does not build were
    /// refused with the config.
    fn decoder_spec(config: &Molmo2Config) -> Result<Option<DecoderSpec>, PluginError> {
        let qwen3 = presets::qwen3();
        let defaults = serde_json::json!({
            "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "vocab_size": 151936, "additional_vocab_size": 128, "attention_bias": false, "num_hidden_layers": 36,
            "intermediate_size": 12288, "hidden_act": "silu", "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
        });
        let aliases = [("qkv_bias", "attention_bias"), ("layer_norm_eps", "rms_norm_eps")];
        let scope = if config.qk_norm_whole { QkNormScope::Whole } else { QkNormScope::PerHead };
        let placement = if config.norm_after { NormPlacement::Post } else { NormPlacement::Pre };
        Ok(Some(DecoderSpec {
            name: "molmo2_text".into(),
            attention: Attention { qk_norm_scope: scope, ..qwen3.attention },
            norms: Norms { placement, ..qwen3.norms },
            model_types: vec!["molmo2_text".into()],
            config_defaults: defaults.as_object().cloned().unwrap_or_default(),
            weights: WeightLayout::Molmo,
            config_aliases: aliases.iter().map(|&(a, f)| (a.to_owned(), f.to_owned())).collect(),
            ..qwen3
        }))
    }
}

/// One image to its crops and pooling table: `pixel_values [1 + crops, P, 3*p*p]` and
/// `pooled_patches_idx [T, k]` (i32, indices into this image's own patches), its grid
/// `[h, w, H, W]` (the pooled global crop and high-resolution canvas) with `h*w + H*W`
/// feature rows.
fn preprocess(
    config: &Molmo2Config,
    item: &MediaItem,
    options: &PreprocessOptions,
) -> Result<Preprocessed, PluginError> {
    let image = Image::from_item(item, "molmo2")?;
    let p = config.processor()?;
    let area = u64::from(image.width()) * u64::from(image.height());
    if let Some(max) = options.max_pixels.into_option()
        && area > max
    {
        return Err(PluginError::too_large(format!(
            "a {}x{} image ({area} pixels) is over the limit of {max} pixels",
            image.width(),
            image.height()
        )));
    }
    let crops = processor::crops(&image, &p).map_err(PluginError::invalid)?;
    if crops.pooling.chunks(crops.pool).any(|row| row.iter().all(|&i| i < 0)) {
        // The graph places the first rows; a row the reference would drop would shift them.
        return Err(PluginError::new(ErrorCode::Internal, "a pooling row has no patch"));
    }
    let tokens = crops.pooling.len() / crops.pool;
    let [h, w, rows, cols] = crops.grid;
    if h * w + rows * cols != tokens {
        return Err(PluginError::new(
            ErrorCode::Internal,
            format!("{tokens} pooled rows for a grid of {:?}", crops.grid),
        ));
    }
    let pixels = Tensor::from_f32(
        vision::PIXEL_VALUES,
        &[crops.crops as u64, crops.patches_per_crop as u64, crops.pixels_per_patch as u64],
        &crops.pixel_values,
    )?;
    let pooling = Tensor::from_bytes(
        TensorSpec::new(vision::POOLING, DType::I32, &[tokens as u64, crops.pool as u64]),
        crops.pooling.iter().flat_map(|i| i.to_le_bytes()).collect(),
    )?;
    let dims = crops.grid.map(|d| d as u32);
    Ok(Preprocessed {
        tensors: vec![pixels, pooling].into(),
        grid: MediaGrid { dims: dims.to_vec().into(), feature_tokens: tokens as u32 },
    })
}

mlxcel_plugin_api::export_plugin!(Molmo2);

/// Fixture access for the unit tests.
#[cfg(test)]
mod testing {
    use mlxcel_golden::{Fixture, Golden};

    use crate::config::Molmo2Config;

    /// Each variant with its image count.
    pub(crate) const VARIANT_IMAGES: [(&str, usize); 4] =
        [("image", 1), ("two_images", 2), ("long", 1), ("text_only", 0)];

    pub(crate) fn fixture() -> Fixture {
        Fixture::named("molmo2").expect("the molmo2 fixture")
    }

    /// The fixture's `config.json` and `processor_config.json`.
    pub(crate) fn fixture_json() -> (String, String) {
        let dir = fixture();
        let read = |name: &str| std::fs::read_to_string(dir.dir().join(name)).expect("read");
        (read("config.json"), read("processor_config.json"))
    }

    pub(crate) fn fixture_config() -> Molmo2Config {
        let (config, processor) = fixture_json();
        Molmo2Config::parse(&config, &processor).expect("parse")
    }

    pub(crate) fn golden(variant: &str) -> Golden {
        fixture().golden(variant).expect("golden")
    }

    /// The fixture checkpoint's tensors, from its safetensors header.
    pub(crate) fn fixture_index() -> mlxcel_plugin_api::decoder::Index {
        let tensors = fixture().checkpoint_tensors().expect("the checkpoint's header");
        tensors
            .into_iter()
            .map(|(k, (dtype, shape))| (k, mlxcel_plugin_api::decoder::TensorInfo { dtype, shape }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::decoder::graph::emit;
    use mlxcel_plugin_api::decoder::{BundleShape, DecoderWeights, TextConfig};
    use mlxcel_plugin_api::{CheckpointIndex, TensorSpec};

    use super::*;
    use crate::testing::{fixture_config, fixture_index, fixture_json};

    /// The spec reads the fixture's text config (the additional vocabulary too), and every
    /// tensor the decoder graph declares is found in the checkpoint's own layout.
    #[test]
    fn the_decoder_reads_the_fixture_in_the_molmo_layout() {
        let (config_json, _) = fixture_json();
        let spec = Molmo2::decoder_spec(&fixture_config()).expect("spec").expect("molmo2 brings one");
        let text = TextConfig::parse_with(&config_json, Some(&spec)).expect("the fixture reads");
        assert_eq!((text.vocab, text.extra_vocab, text.table_rows()), (387, 32, 419));
        assert!(text.qk_norm && !text.qkv_bias && !text.tied_embeddings);
        let index = fixture_index();
        let names = DecoderWeights::resolve(&index, &text).expect("resolve");
        assert_eq!((names.root.as_str(), names.lm_head.as_deref()), ("model.transformer.", Some("lm_head.weight")));
        let shape = BundleShape { chunk: 32, capacity: 64, slots: 1 };
        let mlir = emit(&text, &names, &index, shape, mlxcel_emit::NumericContract::f32(), mlxcel_emit::Elem::F32)
            .expect("every declared tensor is in the checkpoint");
        assert!(mlir.contains("model.transformer.blocks.1.self_attn.att_proj.weight"));
        assert!(mlir.contains("model.transformer.wte.new_embedding"));
    }

    /// The config class's `attribute_map` names are read; the two spellings disagreeing is refused.
    #[test]
    fn legacy_text_field_names_are_read_and_a_disagreement_refused() {
        let (config_json, _) = fixture_json();
        let spec = Molmo2::decoder_spec(&fixture_config()).expect("spec").expect("spec");
        let mut v: serde_json::Value = serde_json::from_str(&config_json).expect("json");
        let text = v["text_config"].as_object_mut().expect("text");
        let eps = text.remove("rms_norm_eps").expect("eps");
        text.insert("layer_norm_eps".into(), eps);
        text.remove("attention_bias");
        text.insert("qkv_bias".into(), true.into());
        let c = TextConfig::parse_with(&v.to_string(), Some(&spec)).expect("legacy names");
        assert!((c.rms_eps - 1e-6).abs() < 1e-12 && c.qkv_bias);
        v["text_config"]["attention_bias"] = false.into();
        let err = TextConfig::parse_with(&v.to_string(), Some(&spec)).expect_err("ambiguous");
        assert!(err.to_string().contains("`qkv_bias` (true) and `attention_bias` (false)"), "{err}");
    }

    #[test]
    fn text_variants_are_read_into_the_spec_or_refused() {
        let (config_json, processor) = fixture_json();
        let mut v: serde_json::Value = serde_json::from_str(&config_json).expect("json");
        v["text_config"]["qk_norm_type"] = "olmo".into();
        v["text_config"]["norm_after"] = true.into();
        let olmo = Molmo2Config::parse(&v.to_string(), &processor).expect("olmo");
        let spec = Molmo2::decoder_spec(&olmo).expect("spec").expect("spec");
        assert_eq!((spec.attention.qk_norm_scope, spec.norms.placement), (QkNormScope::Whole, NormPlacement::Post));
        let text = TextConfig::parse_with(&v.to_string(), Some(&spec)).expect("reads");
        assert!(text.qk_norm_whole && text.post_norms);
        v["text_config"]["qk_norm_type"] = "gemma".into();
        let err = Molmo2Config::parse(&v.to_string(), &processor).expect_err("unknown");
        assert!(err.message.contains("qk_norm_type `gemma`"), "{err}");
        let mut v: serde_json::Value = serde_json::from_str(&config_json).expect("json");
        v["text_config"]["rope_parameters"] =
            serde_json::json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4});
        v["text_config"]["rope_scaling_layers"] = serde_json::json!([0]);
        let err = Molmo2Config::parse(&v.to_string(), &processor).expect_err("partly scaled");
        assert!(err.message.contains("rope_scaling_layers"), "{err}");
    }

    #[test]
    fn the_checkpoint_check_finds_every_encoder_weight_in_the_fixture() {
        let config = fixture_config();
        let tensors: Vec<TensorSpec> = fixture_index()
            .into_iter()
            .map(|(k, t)| TensorSpec::new(k, DType::F32, &t.shape.iter().map(|&d| d as u64).collect::<Vec<_>>()))
            .collect();
        let report = Molmo2::check_checkpoint(&config, &CheckpointIndex { tensors: tensors.into() }).expect("check");
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }
}
