//! The Molmo (v1) family plugin for mlxcel-host.
//!
//! Accepts `MolmoForCausalLM` (`model_type` `molmo`): allenai's checkpoints (the Hub's flat
//! config and `model.transformer.` / `model.vision_backbone.` weights) and mlx-vlm's form (the
//! nested config, and the MLX community's `language_model.model.` / `vision_tower.` weights).
//! Transformers has no Molmo; the reference is mlx-vlm's `models/molmo` (`processing_molmo.py`
//! for the crops and the token layout, `vision.py` for the tower, `molmo.py` for the merge,
//! `language.py` for the decoder) at the version the fixture's provenance records, and the
//! only one: the qualification rests on it alone.
//!
//! - `config.rs`: the typed `config.json` (both forms) and processor config;
//! - `processor.rs`: an image to its global crop and overlapping crops, the padding masks, and
//!   which pooled feature each `<im_patch>` token takes (Pillow's arithmetic);
//! - `vision.rs`: the ViT, the padding embeddings, the attention pooling and the projector;
//! - here: the image blocks before the prompt, the additive contract, and the decoder: Qwen2's
//!   blocks (biased q/k/v, SwiGLU, RMSNorm) in the original Molmo weight layout.

#![forbid(unsafe_code)]

mod config;
mod processor;
mod vision;

use mlxcel_family_common::Image;
use mlxcel_plugin_api::decoder::presets;
use mlxcel_plugin_api::decoder::spec::{DecoderSpec, WeightLayout};
use mlxcel_plugin_api::{
    AttentionMask, Capability, ConfigSummary, ContractRequest, DType, EncoderCompute, EncoderGraph,
    EncoderGraphRequest, EncoderTarget, ErrorCode, FamilyPlugin, ItemLayout, LayoutRequest, MediaGrid, MediaItem,
    Modality, ParsedConfig, PlaceMode, PluginError, PluginIdentity, Positions, PrefillProgram, PreprocessOptions,
    Preprocessed, ProgramPlacement, PromptLayout, RVec, ShapeBucket, Tensor, TensorSpec, TokenSet,
};

pub use config::MolmoConfig;
use config::{TEXT_ALIASES, Tokens, text_defaults};

/// The family.
#[derive(Debug)]
pub struct Molmo;

impl FamilyPlugin for Molmo {
    type Config = MolmoConfig;

    fn identity() -> PluginIdentity {
        PluginIdentity::new(
            "molmo",
            env!("CARGO_PKG_VERSION"),
            &["MolmoForCausalLM"],
            &["molmo"],
            &[Modality::Image],
            &[Capability::Image],
            &["https://github.com/Blaizzy/mlx-vlm/tree/v0.7.10/mlx_vlm/models/molmo"],
        )
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<MolmoConfig>, PluginError> {
        let config = MolmoConfig::parse(config_json, processor_json)?;
        let t = &config.tokens;
        let summary = ConfigSummary::new(
            &config.model_type,
            &config.architecture,
            &[Modality::Image],
            config.text_hidden_size as u32,
            &[
                ("image_start", t.image_start),
                ("image_end", t.image_end),
                ("image_patch", t.image_patch),
                ("image_col", t.image_col),
            ],
        );
        Ok(ParsedConfig { summary, config })
    }

    fn prompt_layout(config: &MolmoConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        layout(config, request)
    }

    fn preprocess(
        config: &MolmoConfig,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        preprocess(config, item, options)
    }

    fn encoder_buckets(config: &MolmoConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        vision::buckets(config, modality)
    }

    fn encoder_graph(
        config: &MolmoConfig,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError> {
        mlxcel_family_common::vit::f32_only(compute, "molmo")?;
        vision::graph(config, request, target)
    }

    fn prefill_program(config: &MolmoConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        contract(config, request)
    }

    fn encoder_parameters(config: &MolmoConfig) -> Vec<(String, Vec<usize>)> {
        vision::parameters(config)
    }

    fn encoder_weight_dtype(config: &MolmoConfig) -> DType {
        config.weights.dtype()
    }

    /// Qwen2's blocks (biased q/k/v, SwiGLU, plain RMSNorm, rotate-half rotary, untied head)
    /// in the original Molmo layout: the fused `att_proj` and `ff_proj` (up rows, then gate
    /// rows), the additional vocabulary in `wte.new_embedding`, the head as `ff_out`. The
    /// config's `intermediate_size` / `mlp_hidden_size` counts the fused rows. Molmo's own
    /// field names are read through aliases, mlx-vlm's defaults fill the rest.
    fn decoder_spec(_config: &MolmoConfig) -> Result<Option<DecoderSpec>, PluginError> {
        let qwen2 = presets::qwen2();
        Ok(Some(DecoderSpec {
            name: "molmo".into(),
            model_types: vec!["molmo".into()],
            config_defaults: text_defaults(),
            weights: WeightLayout::Molmo,
            config_aliases: TEXT_ALIASES.iter().map(|&(a, f)| (a.to_owned(), f.to_owned())).collect(),
            intermediate_counts_fused: true,
            ..qwen2
        }))
    }
}

/// One image to its crops: `pixel_values [1 + crops, P, 3*p*p]`, `image_masks [1 + crops, P]`
/// and `feature_order [T]` (i32), its grid the tiling `[rows, cols]` with `T` feature rows.
fn preprocess(
    config: &MolmoConfig,
    item: &MediaItem,
    options: &PreprocessOptions,
) -> Result<Preprocessed, PluginError> {
    let image = Image::from_item(item, "molmo")?;
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
    let v = &config.vision;
    let processed = processor::process(&image, &config.processor).map_err(PluginError::invalid)?;
    let patches = (v.side() * v.side()) as u64;
    let crops = processed.crops as u64;
    let tokens = processed.feature_order.len();
    let pixels =
        Tensor::from_f32(vision::PIXEL_VALUES, &[crops, patches, v.patch_width() as u64], &processed.pixel_values)?;
    let masks = Tensor::from_f32(vision::IMAGE_MASKS, &[crops, patches], &processed.image_masks)?;
    let order = Tensor::from_bytes(
        TensorSpec::new(vision::FEATURE_ORDER, DType::I32, &[tokens as u64]),
        processed.feature_order.iter().flat_map(|i| i.to_le_bytes()).collect(),
    )?;
    Ok(Preprocessed {
        tensors: vec![pixels, masks, order].into(),
        grid: MediaGrid { dims: processed.tiling.iter().map(|&d| d as u32).collect(), feature_tokens: tokens as u32 },
    })
}

const PATCH: &str = "<im_patch>";
const COL: &str = "<im_col>";
const START: &str = "<im_start>";
const END: &str = "<im_end>";

/// An image's blocks for its tiling, as ids of `tokens` (`None`: as the special tokens' text):
/// the global crop's `tokens_side` rows of as many patches, then the canvas's pooled rows,
/// each row closed by `<im_col>`, each block in `<im_start>` ... `<im_end>`.
fn blocks(config: &MolmoConfig, tiling: [usize; 2]) -> Vec<[usize; 2]> {
    let p = &config.processor;
    let [h, w] = processor::canvas_patches(p, tiling);
    vec![[p.tokens_side, p.tokens_side], [h.div_ceil(2), w.div_ceil(2)]]
}

fn block_ids(tokens: &Tokens, [rows, cols]: [usize; 2]) -> Vec<u32> {
    let mut ids = vec![tokens.image_start];
    for _ in 0..rows {
        ids.extend(std::iter::repeat_n(tokens.image_patch, cols));
        ids.push(tokens.image_col);
    }
    ids.push(tokens.image_end);
    ids
}

fn tiling_of(grid: &MediaGrid, index: usize) -> Result<[usize; 2], PluginError> {
    match grid.dims.as_slice() {
        &[rows, cols] => Ok([rows as usize, cols as usize]),
        other => Err(PluginError::invalid(format!("item {index}: grid {other:?} is not a tiling [rows, cols]"))),
    }
}

/// The processor puts the image's blocks before the whole prompt (the chat template renders
/// nothing for an image); one image per prompt, as the reference's processor takes.
fn layout(config: &MolmoConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
    let mut text = String::new();
    let mut items = Vec::with_capacity(request.items.len());
    if request.items.len() > 1 {
        return Err(PluginError::unsupported(format!(
            "{} images in one prompt; Molmo's processor takes one",
            request.items.len()
        )));
    }
    for (index, item) in request.items.iter().enumerate() {
        if item.modality != Modality::Image {
            return Err(PluginError::unsupported(format!("item {index}: molmo lays out images only")));
        }
        let tiling = tiling_of(&item.grid, index)?;
        let mut expansion = String::new();
        let mut patches = 0;
        for [rows, cols] in blocks(config, tiling) {
            let row = format!("{}{COL}", PATCH.repeat(cols));
            expansion.push_str(&format!("{START}{}{END}", row.repeat(rows)));
            patches += rows * cols;
        }
        if patches != item.grid.feature_tokens as usize {
            return Err(PluginError::invalid(format!(
                "item {index}: a tiling of {patches} patches with {} feature rows",
                item.grid.feature_tokens
            )));
        }
        text.push_str(&expansion);
        items.push(ItemLayout {
            feature_token_id: config.tokens.image_patch,
            feature_tokens: item.grid.feature_tokens,
            expansion: expansion.into(),
        });
    }
    text.push_str(request.prompt.as_str());
    Ok(PromptLayout { text: text.into(), items: items.into() })
}

/// `get_input_embeddings`: the image's features are **added** to the embeddings of its
/// `<im_patch>` tokens, in order; the mask is causal throughout and positions are `0..n`. The
/// image blocks must open the prompt exactly as the layout spelled them: a tokenizer whose
/// image tokens have other ids than Molmo's (after the base table) is refused here.
fn contract(config: &MolmoConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
    let ids = request.token_ids.as_slice();
    let n = u32::try_from(ids.len()).map_err(|_| PluginError::too_large("the prompt is too long"))?;
    let mut placements = Vec::with_capacity(request.items.len());
    let mut at = 0usize;
    for (index, item) in request.items.iter().enumerate() {
        let tiling = tiling_of(&item.grid, index)?;
        let mut indices = Vec::with_capacity(item.grid.feature_tokens as usize);
        for block in blocks(config, tiling) {
            let want = block_ids(&config.tokens, block);
            let got = ids.get(at..at + want.len());
            if got != Some(want.as_slice()) {
                return Err(PluginError::new(
                    ErrorCode::Internal,
                    format!(
                        "the prompt's image block at token {at} is not Molmo's <im_start> {} / <im_patch> {} / <im_col> {} \
                         / <im_end> {} layout: the tokenizer gives the image tokens other ids than the ones after the \
                         base table",
                        config.tokens.image_start,
                        config.tokens.image_patch,
                        config.tokens.image_col,
                        config.tokens.image_end
                    ),
                ));
            }
            indices.extend(
                want.iter()
                    .enumerate()
                    .filter(|(_, id)| **id == config.tokens.image_patch)
                    .map(|(i, _)| (at + i) as u32),
            );
            at += want.len();
        }
        if indices.len() != item.grid.feature_tokens as usize {
            return Err(PluginError::invalid(format!(
                "item {index}: {} <im_patch> tokens for {} feature rows",
                indices.len(),
                item.grid.feature_tokens
            )));
        }
        placements.push(ProgramPlacement {
            item: index as u32,
            encoder_output: vision::FEATURES.into(),
            mode: PlaceMode::Add,
            tokens: TokenSet::List { indices: indices.into() },
        });
    }
    if ids[at..].contains(&config.tokens.image_patch) {
        return Err(PluginError::invalid("the prompt's text holds an <im_patch> token no image fills"));
    }
    Ok(PrefillProgram {
        text_scale: 1.0,
        placements: placements.into(),
        positions: Positions::sequential(n),
        mask: AttentionMask::causal(),
        injections: RVec::new(),
    })
}

mlxcel_plugin_api::export_plugin!(Molmo);

/// Fixture access for the unit tests.
#[cfg(test)]
mod testing {
    use mlxcel_golden::{Fixture, Golden};

    use crate::config::MolmoConfig;

    pub(crate) fn fixture() -> Fixture {
        Fixture::named("molmo").expect("the molmo fixture")
    }

    pub(crate) fn read(fixture: &str, name: &str) -> String {
        let dir = Fixture::named(fixture).expect("fixture");
        std::fs::read_to_string(dir.dir().join(name)).unwrap_or_default()
    }

    pub(crate) fn fixture_config() -> MolmoConfig {
        MolmoConfig::parse(&read("molmo", "config.json"), &read("molmo", "preprocessor_config.json")).expect("parse")
    }

    pub(crate) fn golden(variant: &str) -> Golden {
        fixture().golden(variant).expect("golden")
    }

    /// A fixture checkpoint's tensors, from its safetensors header.
    pub(crate) fn index(fixture: &str) -> mlxcel_plugin_api::decoder::Index {
        let tensors = Fixture::named(fixture).and_then(|f| f.checkpoint_tensors()).expect("the checkpoint's header");
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
    use mlxcel_plugin_api::{CheckpointIndex, ItemMeta};

    use super::*;
    use crate::testing::{fixture_config, golden, index, read};

    /// The spec reads the nested config (Molmo's names, the fused width halved), and every
    /// tensor the decoder graph declares is found in allenai's names and in the MLX
    /// community's, the head as `ff_out` under the root.
    #[test]
    fn the_decoder_reads_both_weight_namings() {
        let spec = Molmo::decoder_spec(&fixture_config()).expect("spec").expect("molmo brings one");
        let text = TextConfig::parse_with(&read("molmo", "config.json"), Some(&spec)).expect("reads");
        assert_eq!((text.hidden, text.intermediate, text.layers, text.heads, text.kv_heads), (64, 128, 2, 4, 2));
        assert_eq!((text.vocab, text.extra_vocab, text.table_rows()), (385, 16, 401));
        assert!(text.qkv_bias && !text.qk_norm && !text.tied_embeddings);
        assert!((text.rms_eps - 1e-6).abs() < 1e-12);
        for (fixture, root) in [("molmo", "model.transformer."), ("molmo_mlx", "language_model.model.")] {
            let index = index(fixture);
            let names = DecoderWeights::resolve(&index, &text).expect("resolve");
            assert!(names.original_names, "{fixture}");
            assert_eq!(names.root, root);
            assert_eq!(names.lm_head.as_deref(), Some(format!("{root}ff_out.weight").as_str()));
            let shape = BundleShape { chunk: 32, capacity: 64, slots: 1 };
            let mlir = emit(&text, &names, &index, shape, mlxcel_emit::NumericContract::f32(), mlxcel_emit::Elem::F32)
                .expect("every declared tensor is in the checkpoint");
            assert!(mlir.contains(&format!("{root}blocks.1.att_proj.bias")), "{fixture}");
            assert!(mlir.contains(&format!("{root}blocks.0.ff_proj.weight")), "{fixture}");
        }
    }

    /// allenai's Hub config for Molmo-7B-D (flat, transformers' names, no vision section)
    /// reads as the same decoder and tower as mlx-vlm's nested defaults.
    #[test]
    fn the_hub_flat_config_reads_as_the_nested_defaults() {
        let hub = serde_json::json!({
            "architectures": ["MolmoForCausalLM"], "attention_layer_norm": false, "clip_qkv": null,
            "embedding_size": 152064, "hidden_size": 3584, "initializer_range": 0.02, "intermediate_size": 37888,
            "layer_norm_eps": 1e-06, "layer_norm_type": "rms", "max_position_embeddings": 4096,
            "model_type": "molmo", "norm_after": false, "num_attention_heads": 28, "num_hidden_layers": 28,
            "num_key_value_heads": 4, "qkv_bias": true, "rope_theta": 1000000.0, "tie_word_embeddings": false,
            "torch_dtype": "float32", "use_cache": true, "use_position_ids": true, "vocab_size": 152064,
            "weight_tying": false,
        })
        .to_string();
        let nested = serde_json::json!({
            "model_type": "molmo", "architectures": ["MolmoForCausalLM"],
            "text_config": {"model_type": "molmo", "layer_norm_eps": 1e-6}, "vision_config": {"model_type": "molmo"},
        })
        .to_string();
        let a = MolmoConfig::parse(&hub, "").expect("hub");
        let b = MolmoConfig::parse(&nested, "").expect("nested");
        assert_eq!(a.vision, b.vision);
        assert_eq!(a.processor, b.processor);
        assert_eq!((a.text_hidden_size, a.tokens.image_patch), (3584, 152_066));
        assert_eq!(a.vision.feature_layers, vec![21, 14]);
        let spec = Molmo::decoder_spec(&a).expect("spec").expect("spec");
        let (ta, tb) = (
            TextConfig::parse_with(&hub, Some(&spec)).expect("hub text"),
            TextConfig::parse_with(&nested, Some(&spec)).expect("nested text"),
        );
        assert_eq!(
            (ta.hidden, ta.intermediate, ta.layers, ta.heads, ta.kv_heads, ta.vocab, ta.extra_vocab),
            (3584, 18944, 28, 28, 4, 152064, 128)
        );
        assert_eq!(
            (ta.hidden, ta.intermediate, ta.layers, ta.heads, ta.kv_heads, ta.vocab, ta.extra_vocab, ta.rms_eps),
            (tb.hidden, tb.intermediate, tb.layers, tb.heads, tb.kv_heads, tb.vocab, tb.extra_vocab, tb.rms_eps)
        );
    }

    /// What the graphs cannot honour is refused, naming the field.
    #[test]
    fn unimplemented_variants_are_refused_naming_the_field() {
        let config = read("molmo", "config.json");
        let processor = read("molmo", "preprocessor_config.json");
        let with = |section: &str, key: &str, value: serde_json::Value| {
            let mut v: serde_json::Value = serde_json::from_str(&config).expect("json");
            v[section][key] = value;
            MolmoConfig::parse(&v.to_string(), &processor).expect_err(key).message.to_string()
        };
        for (section, key, value, says) in [
            ("text_config", "qkv_bias", serde_json::json!(false), "qkv_bias"),
            ("text_config", "attention_layer_norm", serde_json::json!(true), "Molmo-7B-O"),
            ("text_config", "norm_after", serde_json::json!(true), "norm_after"),
            ("text_config", "clip_qkv", serde_json::json!(8.0), "clip_qkv"),
            ("text_config", "weight_tying", serde_json::json!(true), "weight_tying"),
            ("text_config", "embedding_size", serde_json::json!(400), "embedding_size"),
            ("text_config", "act_output_multiplier", serde_json::json!(1.0), "act_output_multiplier"),
            ("text_config", "rope_impl", serde_json::json!("cockatoo"), "rope_impl"),
            ("text_config", "model_type", serde_json::json!("olmoe"), "olmoe"),
            ("vision_config", "image_pooling_2d", serde_json::json!("attention"), "image_pooling_2d"),
            ("vision_config", "image_padding_embed", serde_json::json!("regress"), "image_padding_embed"),
            ("vision_config", "image_num_pos", serde_json::json!(50), "image_num_pos"),
            ("vision_config", "vit_layers", serde_json::json!([-4]), "vit_layers"),
            ("vision_config", "image_num_key_value_heads", serde_json::json!(1), "key/value heads"),
        ] {
            let message = with(section, key, value);
            assert!(message.contains(says), "{key}: {message}");
        }
        let mut p: serde_json::Value = serde_json::from_str(&processor).expect("json");
        p["do_normalize"] = false.into();
        let err = MolmoConfig::parse(&config, &p.to_string()).expect_err("do_normalize");
        assert!(err.message.contains("do_normalize"), "{err}");
        p["do_normalize"] = true.into();
        p["image_token_length_w"] = 3.into();
        let err = MolmoConfig::parse(&config, &p.to_string()).expect_err("tokens");
        assert!(err.message.contains("tokens per crop"), "{err}");
    }

    /// The contract places the golden's image rows at its `<im_patch>` tokens, and refuses a
    /// prompt whose image block has other ids than the config's.
    #[test]
    fn the_contract_holds_the_image_block_to_the_derived_ids() {
        let config = fixture_config();
        let g = golden("image");
        let ids: Vec<u32> = g.input_ids().expect("ids").iter().map(|&i| i as u32).collect();
        let sizes = g.meta()["image_sizes"][0].as_array().expect("size").clone();
        let (w, h) = (sizes[0].as_u64().expect("w") as usize, sizes[1].as_u64().expect("h") as usize);
        let tiling = processor::tiling(&config.processor, w, h);
        let tokens = processor::patch_tokens(&config.processor, tiling);
        let item = ItemMeta {
            modality: Modality::Image,
            grid: MediaGrid { dims: tiling.iter().map(|&d| d as u32).collect(), feature_tokens: tokens as u32 },
        };
        let request = ContractRequest { token_ids: ids.clone().into(), items: vec![item.clone()].into() };
        let program = contract(&config, &request).expect("contract");
        let TokenSet::List { indices } = &program.placements[0].tokens else { panic!("a list") };
        let want: Vec<u32> = (0..ids.len() as u32).filter(|&i| ids[i as usize] == config.tokens.image_patch).collect();
        assert_eq!(indices.as_slice(), want.as_slice());
        let mut shifted = ids.clone();
        shifted[0] += 100;
        let request = ContractRequest { token_ids: shifted.into(), items: vec![item].into() };
        let err = contract(&config, &request).expect_err("other ids");
        assert!(err.message.contains("other ids"), "{err}");
        let layout = layout(&config, &LayoutRequest { prompt: "User: hi".into(), items: RVec::new() }).expect("text");
        assert_eq!(layout.text.as_str(), "User: hi");
    }

    #[test]
    fn the_checkpoint_check_finds_every_encoder_weight_in_each_form() {
        let config = fixture_config();
        for fixture in ["molmo", "molmo_mlx"] {
            let tensors: Vec<TensorSpec> = index(fixture)
                .into_iter()
                .map(|(k, t)| TensorSpec::new(k, DType::F32, &t.shape.iter().map(|&d| d as u64).collect::<Vec<_>>()))
                .collect();
            let report = Molmo::check_checkpoint(&config, &CheckpointIndex { tensors: tensors.into() }).expect("check");
            assert!(report.problems.is_empty(), "{fixture}: {:?}", report.problems);
        }
    }
}
