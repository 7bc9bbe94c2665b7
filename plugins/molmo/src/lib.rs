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
    AttentionMask, Capability, ConfigSummary, ContractRequest, DType, EncoderGraph, EncoderGraphRequest, ErrorCode,
    FamilyPlugin, ItemLayout, LayoutRequest, MediaGrid, MediaItem, Modality, ParsedConfig, PlaceMode, PluginError,
    PluginIdentity, Positions, PrefillProgram, PreprocessOptions, Preprocessed, ProgramPlacement, PromptLayout, RVec,
    ShapeBucket, Tensor, TensorSpec, TokenSet,
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

    fn encoder_graph(config: &MolmoConfig, request: &EncoderGraphRequest) -> Result<EncoderGraph, PluginError> {
        vision::graph(config, request)
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
