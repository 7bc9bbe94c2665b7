//! The typed view of a Molmo (v1) checkpoint: `config.json` in either form it is found in, and
//! `preprocessor_config.json`.
//!
//! - **Nested** (mlx-vlm's, and the MLX community's): `text_config` and `vision_config` with
//!   Molmo's own names (`d_model`, `n_heads`, `mlp_hidden_size`, `image_emb_dim`, ...). Absent
//!   keys take mlx-vlm's `TextConfig` / `VisionConfig` defaults, which are Molmo-7B-D's.
//! - **Flat** (allenai's on the Hub): the text fields at the top under transformers' names
//!   (`hidden_size`, `num_attention_heads`, `intermediate_size` counting the fused up and gate
//!   rows, `qkv_bias`, ...); the vision tower is not described at all (the remote code fixes
//!   it), so it takes the same defaults.
//!
//! What the graphs cannot honour is refused here, naming the field: another pooling or padding
//! embedding, grouped heads in the ViT, a position table that would be interpolated, an odd
//! patch grid, the OLMo decoder variants (`attention_layer_norm`, `norm_after`, `clip_qkv`), an
//! unbiased or tied decoder, a token table whose rows differ from the head's.
//!
//! The image tokens' ids are not in `config.json`: Molmo's tokenizer appends `<im_start>`,
//! `<im_end>`, `<im_patch>`, `<im_col>` and `<|image|>` right after the base token table
//! (`embedding_size`), the first rows of the additional vocabulary. The ids are derived so, and
//! held to the tokenizer's on every prompt (the host counts `<im_patch>` in the tokenized
//! prompt; the contract checks every image token).

use mlxcel_family_common::clip::{CLIP_MEAN, CLIP_STD};
use mlxcel_family_common::{Identity, WeightDtype, processor_section};
use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Everything the family varies on, parsed once and handed back to every entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MolmoConfig {
    pub model_type: String,
    pub architecture: String,
    pub weights: WeightDtype,
    pub tokens: Tokens,
    /// The text decoder's width, which the projector projects to.
    pub text_hidden_size: usize,
    pub vision: VisionConfig,
    pub processor: ProcessorConfig,
}

/// The image tokens' ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    pub image_start: u32,
    pub image_end: u32,
    pub image_patch: u32,
    pub image_col: u32,
}

impl Tokens {
    /// Molmo's order after the base table of `embedding_size` rows.
    fn after(embedding_size: u32) -> Self {
        Tokens {
            image_start: embedding_size,
            image_end: embedding_size + 1,
            image_patch: embedding_size + 2,
            image_col: embedding_size + 3,
        }
    }
}

/// The ViT, the pooling and the projector (`vision_config`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    /// The crop edge in pixels (square).
    pub image_size: usize,
    pub patch_size: usize,
    pub emb_dim: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub layers: usize,
    pub mlp_dim: usize,
    pub norm_eps: f64,
    /// The projector's hidden width (`hidden_size`).
    pub projector_dim: usize,
    /// Layers whose outputs are concatenated, as indices from the start (the config's negative
    /// ones resolved); only up to the deepest one runs.
    pub feature_layers: Vec<usize>,
}

impl VisionConfig {
    /// Patches along a crop's side.
    pub fn side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Values in one patch row: patch x patch pixels of three channels.
    pub fn patch_width(&self) -> usize {
        3 * self.patch_size * self.patch_size
    }

    /// Pooled features per crop (2x2 patches each).
    pub fn pooled(&self) -> usize {
        (self.side() / 2).pow(2)
    }

    /// The layers that run: up to the deepest feature layer.
    pub fn layers_run(&self) -> usize {
        self.feature_layers.iter().max().map_or(0, |&l| l + 1)
    }
}

/// The image processor (`MolmoImageProcessor`'s settings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessorConfig {
    pub max_crops: usize,
    /// `overlap_margins`: patches each crop shares with the one before and the one after.
    pub margins: [usize; 2],
    pub crop_size: usize,
    pub patch_size: usize,
    /// Pooled features per crop side (`image_token_length_h` = `_w`).
    pub tokens_side: usize,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl ProcessorConfig {
    /// Patches per crop side.
    pub fn crop_patches(&self) -> usize {
        self.crop_size / self.patch_size
    }

    /// Patches of a crop not shared with a neighbour.
    pub fn window_patches(&self) -> usize {
        self.crop_patches() - self.margins[0] - self.margins[1]
    }
}

/// mlx-vlm's `TextConfig` defaults (Molmo-7B-D's), under the names the decoder reads.
pub(crate) fn text_defaults() -> Map<String, Value> {
    let v = serde_json::json!({
        "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
        "intermediate_size": 37888, "vocab_size": 152064, "additional_vocab_size": 128, "rms_norm_eps": 1e-5,
        "rope_theta": 1_000_000.0, "tie_word_embeddings": false,
    });
    v.as_object().cloned().unwrap_or_default()
}

/// Molmo's names for the decoder's fields: `alias -> field`.
pub(crate) const TEXT_ALIASES: [(&str, &str); 7] = [
    ("d_model", "hidden_size"),
    ("n_heads", "num_attention_heads"),
    ("n_kv_heads", "num_key_value_heads"),
    ("n_layers", "num_hidden_layers"),
    ("mlp_hidden_size", "intermediate_size"),
    ("layer_norm_eps", "rms_norm_eps"),
    ("weight_tying", "tie_word_embeddings"),
];

/// The largest `max_crops` accepted (each crop is a ViT pass).
const MAX_CROPS: usize = 64;

fn err(message: impl Into<String>) -> PluginError {
    PluginError::invalid(message.into())
}

/// A field of `section` as `T`, or `default` when absent or null.
fn field<T: serde::de::DeserializeOwned>(
    section: &Map<String, Value>,
    name: &str,
    default: T,
) -> Result<T, PluginError> {
    match section.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| err(format!("config.json: `{name}`: {e}"))),
    }
}

/// Refuses `name` unless absent, null or `ok`.
fn only(section: &Map<String, Value>, name: &str, ok: &Value, why: &str) -> Result<(), PluginError> {
    match section.get(name) {
        None | Some(Value::Null) => Ok(()),
        Some(v) if v == ok => Ok(()),
        Some(v) => Err(err(format!("config.json: `{name}` = {v} is not implemented ({why})"))),
    }
}

impl MolmoConfig {
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let root: Value = serde_json::from_str(config_json).map_err(|e| err(format!("config.json: {e}")))?;
        let Value::Object(root) = root else { return Err(err("config.json is not an object")) };
        let identity: Identity =
            serde_json::from_value(Value::Object(root.clone())).map_err(|e| err(format!("config.json: {e}")))?;
        let weights = identity.weight_dtype().map_err(err)?;
        let empty = Map::new();
        let nested = root.contains_key("text_config") || root.contains_key("vision_config");
        let text = match root.get("text_config") {
            Some(Value::Object(t)) => t,
            Some(other) => return Err(err(format!("config.json: `text_config` is not an object: {other}"))),
            None if nested => &empty,
            None => &root,
        };
        let vision = match root.get("vision_config") {
            Some(Value::Object(v)) => v,
            Some(other) => return Err(err(format!("config.json: `vision_config` is not an object: {other}"))),
            None => &empty,
        };
        let text_type = text.get("model_type").and_then(Value::as_str).unwrap_or("molmo");
        if text_type != "molmo" {
            return Err(PluginError::unsupported(format!(
                "config.json: the text model `{text_type}` is not Molmo's decoder (Qwen2-style blocks in the original \
                 Molmo layout); no other text architecture is implemented"
            )));
        }
        check_text(text)?;
        let hidden = match (text.get("d_model"), text.get("hidden_size")) {
            (Some(a), Some(b)) if a != b => {
                return Err(err(format!("config.json: `d_model` ({a}) and `hidden_size` ({b}) disagree")));
            }
            (Some(v), _) | (None, Some(v)) => {
                v.as_u64().ok_or_else(|| err(format!("config.json: the text width {v} is not a count")))? as usize
            }
            (None, None) => 3584,
        };
        let vocab: u64 = field(text, "vocab_size", 152_064)?;
        let embedding: u64 = field(text, "embedding_size", vocab)?;
        if embedding != vocab {
            return Err(err(format!(
                "config.json: `embedding_size` {embedding} differs from `vocab_size` {vocab}; a token table with rows \
                 the head does not predict is not implemented"
            )));
        }
        let extra: u64 = field(text, "additional_vocab_size", 128)?;
        if extra < 4 {
            return Err(err(format!(
                "config.json: `additional_vocab_size` {extra} has no room for the four image tokens"
            )));
        }
        let embedding = u32::try_from(embedding).map_err(|_| err("config.json: `embedding_size` is too large"))?;
        let vision = parse_vision(vision, hidden)?;
        let processor = parse_processor(processor_json, &vision)?;
        Ok(MolmoConfig {
            model_type: identity.model_type.clone(),
            architecture: identity.architecture(),
            weights,
            tokens: Tokens::after(embedding),
            text_hidden_size: hidden,
            vision,
            processor,
        })
    }
}

/// The text fields the decoder spec does not read, held to what it builds.
fn check_text(text: &Map<String, Value>) -> Result<(), PluginError> {
    only(text, "act_output_multiplier", &serde_json::json!(0.5), "the SwiGLU halves the fused projection")?;
    only(text, "qkv_bias", &Value::Bool(true), "Molmo's q/k/v projection is biased")?;
    only(text, "attention_layer_norm", &Value::Bool(false), "q/k norms are the OLMo-based Molmo-7B-O's")?;
    only(text, "norm_after", &Value::Bool(false), "norms after the blocks are OLMo's")?;
    only(text, "layer_norm_type", &Value::String("rms".into()), "the decoder's norms are RMSNorm")?;
    only(text, "rope", &Value::Bool(true), "the decoder rotates q and k")?;
    only(text, "rope_impl", &Value::String("interleave".into()), "the reference rotates halves, its default")?;
    only(text, "block_type", &Value::String("sequential".into()), "the decoder's blocks are sequential")?;
    only(text, "moe_num_experts", &Value::from(0), "MolmoE's mixture of experts is not implemented")?;
    if let Some(v) = text.get("clip_qkv").filter(|v| !v.is_null()) {
        return Err(err(format!("config.json: `clip_qkv` = {v} is not implemented (q/k/v are not clipped)")));
    }
    for tied in ["weight_tying", "tie_word_embeddings"] {
        only(text, tied, &Value::Bool(false), "the head is untied (`ff_out`)")?;
    }
    Ok(())
}

fn parse_vision(v: &Map<String, Value>, text_hidden: usize) -> Result<VisionConfig, PluginError> {
    let size: [usize; 2] = field(v, "image_default_input_size", [336, 336])?;
    let patch: usize = field(v, "image_patch_size", 14)?;
    if size[0] != size[1] || patch == 0 || !size[0].is_multiple_of(patch) {
        return Err(err(format!(
            "config.json: a {size:?} crop of {patch}-pixel patches is not implemented (square, whole patches)"
        )));
    }
    let side = size[0] / patch;
    if !side.is_multiple_of(2) {
        return Err(err(format!("config.json: {side} patches per side do not pool in 2x2 groups without padding")));
    }
    let emb: usize = field(v, "image_emb_dim", 1024)?;
    let heads: usize = field(v, "image_num_heads", 16)?;
    let kv_heads: usize = field(v, "image_num_key_value_heads", heads)?;
    let head_dim: usize = field(v, "image_head_dim", 64)?;
    if kv_heads != heads || heads * head_dim != emb {
        return Err(err(format!(
            "config.json: {heads} vision heads of {head_dim} with {kv_heads} key/value heads over a width of {emb} are \
             not implemented (as many key/value heads, heads x head_dim = image_emb_dim)"
        )));
    }
    let layers: usize = field(v, "image_num_layers", 23)?;
    let positions: usize = field(v, "image_num_pos", 577)?;
    if positions != side * side + 1 {
        return Err(err(format!(
            "config.json: `image_num_pos` {positions} is not 1 + {side}x{side}; an interpolated position table is \
             not implemented"
        )));
    }
    let pixels: usize = field(v, "intermediate_size", 3 * patch * patch)?;
    if pixels != 3 * patch * patch {
        return Err(err(format!(
            "config.json: `intermediate_size` {pixels} is not a patch's {} values",
            3 * patch * patch
        )));
    }
    only(v, "image_pos_patch_size", &Value::from(patch), "positions per patch")?;
    only(v, "image_mlp_activations", &Value::String("gelu".into()), "the reference's fast GELU")?;
    only(v, "image_pooling_2d", &Value::String("attention-meanq".into()), "attention pooling, mean query")?;
    only(v, "image_padding_embed", &Value::String("pad_and_partial_pad".into()), "the two padding embeddings")?;
    only(v, "image_pooling_h", &Value::from(2), "2x2 pooling")?;
    only(v, "image_pooling_w", &Value::from(2), "2x2 pooling")?;
    if v.get("image_padding_embed").is_some_and(Value::is_null) {
        return Err(err("config.json: `image_padding_embed` null is not implemented (the two padding embeddings)"));
    }
    let d_model: usize = field(v, "d_model", text_hidden)?;
    if d_model != text_hidden {
        return Err(err(format!(
            "config.json: the projector's `d_model` {d_model} is not the text width {text_hidden}"
        )));
    }
    let raw_layers: Vec<i64> = field(v, "vit_layers", vec![-2, -9])?;
    if raw_layers.is_empty() {
        return Err(err("config.json: `vit_layers` is empty"));
    }
    let feature_layers = raw_layers
        .iter()
        .map(|&l| {
            let i = if l < 0 { layers as i64 + l } else { l };
            usize::try_from(i)
                .ok()
                .filter(|&i| i < layers)
                .ok_or_else(|| err(format!("config.json: `vit_layers` names layer {l} of {layers}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(VisionConfig {
        image_size: size[0],
        patch_size: patch,
        emb_dim: emb,
        heads,
        head_dim,
        layers,
        mlp_dim: field(v, "image_mlp_dim", 4096)?,
        norm_eps: field(v, "image_norm_eps", 1e-5)?,
        projector_dim: field(v, "hidden_size", 18944)?,
        feature_layers,
    })
}

/// `MolmoImageProcessor`'s fields, flat in `preprocessor_config.json`; absent ones take its
/// defaults. The reference normalises and masks padding whatever `do_normalize` and
/// `image_padding_mask` say, so other values are refused rather than ignored.
fn parse_processor(json: &str, vision: &VisionConfig) -> Result<ProcessorConfig, PluginError> {
    let p: Map<String, Value> =
        processor_section(json).map_err(|e| err(format!("the processor config is not an object: {e}")))?;
    if let Some(kind) = p.get("image_processor_type").and_then(Value::as_str)
        && kind != "MolmoImageProcessor"
    {
        return Err(err(format!("the processor config's image_processor_type `{kind}` is not MolmoImageProcessor")));
    }
    let bad = |m: String| err(format!("the processor config: {m}"));
    only(&p, "do_normalize", &Value::Bool(true), "the reference always normalises")?;
    only(&p, "image_padding_mask", &Value::Bool(true), "the reference always masks padding")?;
    let max_crops: usize = field(&p, "max_crops", 12)?;
    let margins: [usize; 2] = field(&p, "overlap_margins", [4, 4])?;
    let base: [usize; 2] = field(&p, "base_image_input_size", [336, 336])?;
    let patch: usize = field(&p, "image_patch_size", 14)?;
    let th: usize = field(&p, "image_token_length_h", 12)?;
    let tw: usize = field(&p, "image_token_length_w", 12)?;
    if base != [vision.image_size; 2] || patch != vision.patch_size {
        return Err(bad(format!(
            "{base:?} crops of {patch}-pixel patches, where the ViT takes {0}x{0} of {1}",
            vision.image_size, vision.patch_size
        )));
    }
    if th != vision.side() / 2 || tw != th {
        return Err(bad(format!("{th}x{tw} tokens per crop, where the pooling makes {0}x{0}", vision.side() / 2)));
    }
    if max_crops == 0 || max_crops > MAX_CROPS {
        return Err(bad(format!("`max_crops` {max_crops} is not in 1..={MAX_CROPS}")));
    }
    if margins[0] + margins[1] >= vision.side() || !margins[0].is_multiple_of(2) || !margins[1].is_multiple_of(2) {
        return Err(bad(format!(
            "`overlap_margins` {margins:?} do not leave whole pooled windows of a {}-patch crop",
            vision.side()
        )));
    }
    let per_channel = |name: &str, default: [f32; 3]| -> Result<[f32; 3], PluginError> {
        let v: Option<Vec<f64>> = field(&p, name, None)?;
        match v {
            None => Ok(default),
            Some(v) if v.len() == 3 => Ok([v[0] as f32, v[1] as f32, v[2] as f32]),
            Some(v) => Err(bad(format!("`{name}` {v:?} is not three values"))),
        }
    };
    Ok(ProcessorConfig {
        max_crops,
        margins,
        crop_size: base[0],
        patch_size: patch,
        tokens_side: th,
        // `MolmoImageProcessor`'s defaults: OpenAI CLIP's.
        mean: per_channel("image_mean", CLIP_MEAN.map(|x| x as f32))?,
        std: per_channel("image_std", CLIP_STD.map(|x| x as f32))?,
    })
}
