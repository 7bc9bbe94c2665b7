//! The text decoder's view of a Hugging Face `config.json`: a serde mirror
//! of the fields the graph needs, validated together with the
//! architecture's [`DecoderSpec`] (a preset, or a family plugin's own) into
//! [`TextConfig`], which says everything the graph varies on (norm order,
//! activation, per-layer attention kind and rotary frequencies) so one graph
//! serves every spec.

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;

pub use mlxcel_emit::RmsStyle;

use crate::presets;
use crate::spec::{AttentionKind, AttnScale, DecoderSpec, EmbedScale, NormPlacement, QkvBias, WeightLayout};

/// The attention a layer does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LayerKind {
    /// Causal over the whole context.
    Full,
    /// Causal over the last `sliding_window` positions.
    Sliding,
}

impl LayerKind {
    fn parse(s: &str) -> Option<LayerKind> {
        match s {
            "full_attention" => Some(LayerKind::Full),
            "sliding_attention" => Some(LayerKind::Sliding),
            _ => None,
        }
    }

    /// The HF name, for rope_parameters keys and mask names.
    pub fn hf_name(self) -> &'static str {
        match self {
            LayerKind::Full => "full_attention",
            LayerKind::Sliding => "sliding_attention",
        }
    }
}

/// The MLP's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Silu,
    /// `gelu_pytorch_tanh`.
    GeluTanh,
}

/// How rotary frequencies are derived from the base.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `1 / theta ** (2i / d)`.
    Default,
    /// The default frequencies divided by `factor`.
    Linear { factor: f32 },
    /// Llama 3.1's smoothed low/high frequency scaling.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_context: f32 },
}

/// One rotary embedding: base and scaling.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// `rope_parameters` (transformers 5), flat or keyed by layer type, or the legacy
/// `rope_scaling` (which spells the type `type`, and Qwen2-VL's M-RoPE `mrope`).
#[derive(Clone, Debug, Deserialize)]
struct RawRope {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    #[serde(rename = "type")]
    legacy_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
    mrope_section: Option<Vec<usize>>,
    #[serde(default)]
    mrope_interleaved: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum RawRopeParameters {
    // First: a flat object also deserialises as `RawRope` (all optional).
    PerLayerType(BTreeMap<String, RawRope>),
    Flat(RawRope),
}

/// `intermediate_size`: one width for every layer, or one per layer (Gemma 3n's).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum RawIntermediate {
    One(usize),
    PerLayer(Vec<usize>),
}

#[derive(Clone, Debug, Deserialize)]
struct RawConfig {
    hidden_size: usize,
    intermediate_size: RawIntermediate,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    vocab_size: usize,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    rope_theta: Option<f64>,
    rope_parameters: Option<RawRopeParameters>,
    /// Legacy (transformers 4) rotary fields: the scaling, and the sliding layers' base.
    rope_scaling: Option<RawRope>,
    rope_local_base_freq: Option<f64>,
    /// Legacy layer pattern (transformers 4 writes the first, 5 the second beside `layer_types`).
    sliding_window_pattern: Option<usize>,
    #[serde(rename = "_sliding_window_pattern")]
    saved_sliding_window_pattern: Option<usize>,
    #[serde(default)]
    use_sliding_window: bool,
    sliding_window: Option<usize>,
    layer_types: Option<Vec<String>>,
    query_pre_attn_scalar: Option<f64>,
    attn_logit_softcapping: Option<f64>,
    final_logit_softcapping: Option<f64>,
    #[serde(default)]
    use_bidirectional_attention: bool,
    /// Rows of the token table beyond `vocab_size` (Molmo's `additional_vocab_size`).
    additional_vocab_size: Option<usize>,
    /// Multi-head latent attention's sizes (DeepSeek-V2's names); `q_lora_rank` null means
    /// queries are one full-rank projection.
    kv_lora_rank: Option<usize>,
    q_lora_rank: Option<usize>,
    qk_nope_head_dim: Option<usize>,
    qk_rope_head_dim: Option<usize>,
    v_head_dim: Option<usize>,
    rope_interleave: Option<bool>,
    /// Derived by transformers (`qk_nope_head_dim + qk_rope_head_dim`) and saved beside them.
    qk_head_dim: Option<usize>,
    /// The augmentations' sizes ([`crate::spec::Augmentations`]).
    altup_num_inputs: Option<usize>,
    altup_active_idx: Option<usize>,
    altup_correct_scale: Option<bool>,
    laurel_rank: Option<usize>,
    hidden_size_per_layer_input: Option<usize>,
    vocab_size_per_layer_input: Option<usize>,
    num_kv_shared_layers: Option<usize>,
    activation_sparsity_pattern: Option<Vec<f64>>,
}

/// AltUp's streams ([`crate::spec::Augmentations::altup`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AltUp {
    /// Streams, the active one included.
    pub inputs: usize,
    /// The stream the layers run on.
    pub active: usize,
    /// The active stream's correction is scaled by `correct_output_scale` before it gates the
    /// per-layer input.
    pub correct_scale: bool,
}

/// Per-layer inputs ([`crate::spec::Augmentations::per_layer_inputs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerLayerInputs {
    /// Values per layer and row.
    pub hidden: usize,
    /// Rows of the per-layer token table; larger token ids read row 0.
    pub vocab: usize,
}

/// Multi-head latent attention's sizes ([`crate::spec::AttentionKind::MultiHeadLatent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mla {
    /// The rank of the queries' low-rank projection (`q_a_proj`, `q_a_layernorm`, `q_b_proj`);
    /// `None`: one full-rank `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// The width of the shared latent the cache holds.
    pub kv_lora_rank: usize,
    /// Per head: query and key values without rotary embedding.
    pub nope: usize,
    /// Per head: rotated query values, and the one rotated key every head shares.
    pub rope: usize,
    /// Per head: value width.
    pub v: usize,
    /// The rotary embedding turns adjacent pairs (`rope_interleave`), not the two halves.
    pub interleaved: bool,
}

impl Mla {
    /// One query head's width: `nope + rope`.
    pub fn q_head_dim(&self) -> usize {
        self.nope + self.rope
    }

    /// One cache row: the latent, then the rotated key.
    pub fn cache_row(&self) -> usize {
        self.kv_lora_rank + self.rope
    }
}

/// Multimodal rotary embedding (Qwen2-VL family): three position streams
/// (temporal, height, width) share the rotary dimensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MRope {
    /// Rotary pairs per stream; sums to head_dim / 2.
    pub section: [usize; 3],
    /// Qwen3-VL interleaves the streams (t h w t h w ...) instead of giving
    /// each a contiguous run of pairs.
    pub interleaved: bool,
}

impl MRope {
    /// Which stream drives rotary pair `j` (0-based, of head_dim / 2).
    pub fn stream(&self, j: usize) -> usize {
        let [t, h, w] = self.section;
        if self.interleaved {
            match j % 3 {
                1 if j < 3 * h => 1,
                2 if j < 3 * w => 2,
                _ => 0,
            }
        } else if j < t {
            0
        } else if j < t + h {
            1
        } else {
            2
        }
    }
}

/// A decoder configuration, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct TextConfig {
    /// The spec the config was read with.
    pub spec: DecoderSpec,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f64,
    /// Logits per row: the LM head's rows.
    pub vocab: usize,
    /// Token-table rows beyond `vocab`, held in a table of their own (the Molmo layout's
    /// `additional_vocab_size`): embeddings of tokens the head never predicts.
    pub extra_vocab: usize,
    pub tied_embeddings: bool,
    pub qkv_bias: bool,
    /// RMSNorm on q and k before RoPE.
    pub qk_norm: bool,
    /// The q/k norm runs over the whole projection, not per head (OLMo).
    pub qk_norm_whole: bool,
    /// Norms after attention and after the MLP as well as before (Gemma).
    pub sandwich_norms: bool,
    /// Norms after attention and after the MLP instead of before (OLMo 2's, Molmo2's `norm_after`).
    pub post_norms: bool,
    pub norm_style: RmsStyle,
    pub activation: Activation,
    /// Embeddings are multiplied by this (Gemma: sqrt(hidden), in f32).
    pub embed_scale: Option<f32>,
    /// Attention scores are multiplied by this.
    pub attn_scale: f64,
    /// Each layer's attention kind.
    pub layer_kinds: Vec<LayerKind>,
    pub sliding_window: Option<usize>,
    /// The rotary embedding of each attention kind in use.
    pub rope: BTreeMap<LayerKind, Rope>,
    /// Three-stream positions (Qwen2-VL, Qwen2.5-VL, Qwen3-VL).
    pub mrope: Option<MRope>,
    /// Layers after which prepared prompts may add per-row features: layers
    /// `0..injected_layers` (the spec's).
    pub injected_layers: usize,
    /// The final logits are `tanh(logits / c) * c` (Gemma's `final_logit_softcapping`).
    pub final_softcap: Option<f64>,
    /// MLX's affine quantization as `config.json`'s root records it (which linears it applies
    /// to is read from the checkpoint's tensors).
    pub quantization: Option<crate::QuantConfig>,
    /// Multi-head latent attention's sizes; `None` for grouped-query attention. With it,
    /// `head_dim` is the rotary width (`qk_rope_head_dim`, as transformers sets it).
    pub mla: Option<Mla>,
    /// Each layer's MLP width (`intermediate` is the first's).
    pub intermediates: Vec<usize>,
    /// A scaleless RMSNorm on values.
    pub v_norm: bool,
    pub altup: Option<AltUp>,
    /// LAuReL's rank.
    pub laurel_rank: Option<usize>,
    pub per_layer_inputs: Option<PerLayerInputs>,
    /// Per layer: the earlier layer whose keys and values it attends over instead of its own
    /// (KV sharing); `None` for a layer that computes and caches its own.
    pub kv_source: Vec<Option<usize>>,
    /// Per layer: the activation sparsity target (0: dense).
    pub sparsity: Vec<f64>,
}

/// Why a config cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid config: {reason}")]
    Invalid { path: String, reason: String },
    #[error("model_type {model_type:?} has no text decoder preset (presets read: {supported})")]
    Unsupported { model_type: String, supported: String },
    #[error("the decoder spec {spec:?} reads model_type {reads}, not the checkpoint's {model_type:?}")]
    SpecMismatch { spec: String, reads: String, model_type: String },
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
}

fn parse_rope(r: &RawRope, fallback_theta: Option<f64>) -> Result<Rope, String> {
    let theta = r.rope_theta.or(fallback_theta).ok_or("no rope_theta")?;
    let need = |v: Option<f64>, name: &str| v.map(|v| v as f32).ok_or(format!("rope_parameters lack {name}"));
    // `mrope` is the legacy spelling of default frequencies with sections (read apart).
    let kind = r.rope_type.as_deref().or(r.legacy_type.as_deref()).unwrap_or("default");
    let scaling = match if kind == "mrope" { "default" } else { kind } {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear { factor: need(r.factor, "factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: need(r.factor, "factor")?,
            low_freq_factor: need(r.low_freq_factor, "low_freq_factor")?,
            high_freq_factor: need(r.high_freq_factor, "high_freq_factor")?,
            original_context: need(r.original_max_position_embeddings, "original_max_position_embeddings")?,
        },
        other => return Err(format!("rope_type {other:?} is not implemented (default, linear, llama3)")),
    };
    Ok(Rope { theta, scaling })
}

/// The augmentations a config sizes, as read with a spec.
struct Augmented {
    altup: Option<AltUp>,
    laurel_rank: Option<usize>,
    per_layer_inputs: Option<PerLayerInputs>,
    kv_source: Vec<Option<usize>>,
    sparsity: Vec<f64>,
}

/// The spec's augmentations with their sizes from `raw`; a size given for one the spec does
/// not have is refused, as is a size the graph cannot use.
fn augmentations(raw: &RawConfig, spec: &DecoderSpec, kinds: &[LayerKind]) -> Result<Augmented, String> {
    let a = spec.augmentations;
    let layers = raw.num_hidden_layers;
    let unused = [
        ("altup_num_inputs", !a.altup && raw.altup_num_inputs.is_some()),
        ("altup_active_idx", !a.altup && raw.altup_active_idx.is_some()),
        ("laurel_rank", !a.laurel && raw.laurel_rank.is_some()),
        ("hidden_size_per_layer_input", !a.per_layer_inputs && raw.hidden_size_per_layer_input.is_some()),
        ("num_kv_shared_layers", !a.kv_sharing && raw.num_kv_shared_layers.is_some_and(|n| n > 0)),
        (
            "activation_sparsity_pattern",
            !a.activation_sparsity
                && raw.activation_sparsity_pattern.as_ref().is_some_and(|p| p.iter().any(|&s| s != 0.0)),
        ),
    ];
    if let Some((field, _)) = unused.iter().find(|(_, refused)| *refused) {
        return Err(format!("`{field}` is not implemented for {}", spec.name));
    }
    if (a.laurel || a.per_layer_inputs) && !a.altup {
        return Err(format!("{}: LAuReL and per-layer inputs are implemented inside AltUp layers only", spec.name));
    }
    let positive = |v: Option<usize>, field: &str| match v {
        Some(n) if n > 0 => Ok(n),
        _ => Err(format!("{} needs a positive `{field}`", spec.name)),
    };
    let altup = match a.altup {
        false => None,
        true => {
            let inputs = positive(raw.altup_num_inputs, "altup_num_inputs")?;
            let active = raw.altup_active_idx.ok_or_else(|| format!("{} needs `altup_active_idx`", spec.name))?;
            if active >= inputs {
                return Err(format!("altup_active_idx {active} is not one of {inputs} streams"));
            }
            // The per-layer input is added to streams 1.. (transformers' `corrected[1:]`), which
            // are the inactive ones only when stream 0 is active.
            if active != 0 {
                return Err(format!("altup_active_idx {active} is not implemented (0 is)"));
            }
            let correct_scale =
                raw.altup_correct_scale.ok_or_else(|| format!("{} needs `altup_correct_scale`", spec.name))?;
            Some(AltUp { inputs, active, correct_scale })
        }
    };
    let laurel_rank = a.laurel.then(|| positive(raw.laurel_rank, "laurel_rank")).transpose()?;
    let per_layer_inputs = match a.per_layer_inputs {
        false => None,
        true => Some(PerLayerInputs {
            hidden: positive(raw.hidden_size_per_layer_input, "hidden_size_per_layer_input")?,
            vocab: positive(raw.vocab_size_per_layer_input, "vocab_size_per_layer_input")?,
        }),
    };
    // As transformers' `kv_sharing_modes`: the last `n` layers reuse the cache of the last
    // earlier layer of their kind.
    let shared = if a.kv_sharing { raw.num_kv_shared_layers.unwrap_or(0) } else { 0 };
    if shared >= layers && shared > 0 {
        return Err(format!("num_kv_shared_layers {shared} leaves no layer to compute keys and values"));
    }
    let first_shared = layers - shared;
    let mut kv_source = vec![None; layers];
    for (l, source) in kv_source.iter_mut().enumerate().skip(first_shared) {
        let producer = (0..first_shared).rev().find(|&p| kinds[p] == kinds[l]).ok_or_else(|| {
            format!(
                "layer {l} shares keys and values of its kind ({}), which no earlier layer computes",
                kinds[l].hf_name()
            )
        })?;
        *source = Some(producer);
    }
    // transformers' default: the first 10 layers at 0.95 when there are more than 10.
    let sparsity = match (&raw.activation_sparsity_pattern, a.activation_sparsity) {
        (_, false) => vec![0.0; layers],
        (Some(p), true) if p.len() == layers => p.clone(),
        (Some(p), true) => return Err(format!("{} activation sparsity targets for {layers} layers", p.len())),
        (None, true) => {
            let sparse = if layers > 10 { 10 } else { 0 };
            (0..layers).map(|i| if i < sparse { 0.95 } else { 0.0 }).collect()
        }
    };
    if let Some(s) = sparsity.iter().find(|s| !(0.0..1.0).contains(*s)) {
        return Err(format!("activation sparsity target {s} is not in [0, 1)"));
    }
    Ok(Augmented { altup, laurel_rank, per_layer_inputs, kv_source, sparsity })
}

/// Multi-head latent attention's sizes from `raw`, refusing what the graph does not implement.
fn mla_sizes(raw: &RawConfig, heads: usize, name: &str) -> Result<Mla, String> {
    let need = |v: Option<usize>, field: &str| match v {
        Some(n) if n > 0 => Ok(n),
        _ => Err(format!("{name} needs a positive `{field}`")),
    };
    let m = Mla {
        q_lora_rank: match raw.q_lora_rank {
            Some(0) => return Err("q_lora_rank is 0".into()),
            rank => rank,
        },
        kv_lora_rank: need(raw.kv_lora_rank, "kv_lora_rank")?,
        nope: need(raw.qk_nope_head_dim, "qk_nope_head_dim")?,
        rope: need(raw.qk_rope_head_dim, "qk_rope_head_dim")?,
        v: need(raw.v_head_dim, "v_head_dim")?,
        interleaved: raw.rope_interleave.ok_or_else(|| format!("{name} needs `rope_interleave`"))?,
    };
    // transformers expands one key and value per query head from the latent and then repeats
    // them by `heads / kv_heads`: only one key/value head per query head is well-formed.
    if let Some(kv) = raw.num_key_value_heads.filter(|&kv| kv != heads) {
        return Err(format!("multi-head latent attention with {kv} key/value heads for {heads} query heads"));
    }
    if raw.attention_bias {
        return Err("attention_bias is not implemented for multi-head latent attention".into());
    }
    // transformers' Youtu-LLM gives the two latent norms torch's default epsilon (1e-6), and
    // mlx-vlm gives them `rms_norm_eps`: the references agree only at 1e-6.
    if raw.rms_norm_eps != 1e-6 {
        return Err(format!(
            "rms_norm_eps = {} is not implemented for multi-head latent attention (its latent norms' epsilon \
             differs between the references unless it is 1e-6)",
            raw.rms_norm_eps
        ));
    }
    if raw.qk_head_dim.is_some_and(|d| d != m.q_head_dim()) {
        return Err(format!(
            "qk_head_dim {:?} is not qk_nope_head_dim + qk_rope_head_dim = {}",
            raw.qk_head_dim,
            m.q_head_dim()
        ));
    }
    if raw.head_dim.is_some_and(|d| d != m.rope) {
        return Err(format!("head_dim {:?} is not qk_rope_head_dim {}", raw.head_dim, m.rope));
    }
    Ok(m)
}

impl TextConfig {
    /// Reads `<dir>/config.json` with `spec`, or with the preset for its model type.
    pub fn load(dir: &Path, spec: Option<&DecoderSpec>) -> Result<Self, ConfigError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|source| ConfigError::Io { path: path.display().to_string(), source })?;
        TextConfig::parse_with(&text, spec).map_err(|e| match e {
            ConfigError::Invalid { reason, .. } => ConfigError::Invalid { path: path.display().to_string(), reason },
            other => other,
        })
    }

    /// Parses a text model's config, or a VLM's (its `text_config`, with the
    /// root's `tie_word_embeddings` where the text config has none), with the
    /// preset for its text `model_type`.
    pub fn parse(json: &str) -> Result<Self, ConfigError> {
        TextConfig::parse_with(json, None)
    }

    /// As [`TextConfig::parse`], with `spec` (a family plugin's) instead of a preset when
    /// given; the spec must read the config's text `model_type`.
    pub fn parse_with(json: &str, spec: Option<&DecoderSpec>) -> Result<Self, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid { path: "config.json".into(), reason };
        let mut root: serde_json::Value = serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?;
        let quantization = crate::QuantConfig::from_config(&root).map_err(invalid)?;
        let value = match root.get_mut("text_config").map(serde_json::Value::take) {
            Some(mut text) => {
                if text.get("tie_word_embeddings").is_none_or(serde_json::Value::is_null)
                    && let Some(tie) = root.get("tie_word_embeddings")
                {
                    text["tie_word_embeddings"] = tie.clone();
                }
                text
            }
            None => root,
        };
        let mut value = value;
        let model_type = value.get("model_type").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned();
        let preset = match spec {
            Some(spec) => {
                spec.validate()?;
                if !spec.reads(&model_type) {
                    return Err(ConfigError::SpecMismatch {
                        spec: spec.name.clone(),
                        reads: spec.model_types.join(", "),
                        model_type,
                    });
                }
                spec.clone()
            }
            None => presets::for_model_type(&model_type).ok_or_else(|| ConfigError::Unsupported {
                model_type: model_type.clone(),
                supported: presets::model_types(),
            })?,
        };
        // A sparse config (a VLM's text_config on the Hub) leaves fields to the config class's
        // defaults, which the spec carries; an explicit null stays null, as in transformers.
        if let Some(fields) = value.as_object_mut() {
            for (alias, field) in &preset.config_aliases {
                let Some(v) = fields.remove(alias) else { continue };
                match fields.get(field) {
                    Some(given) if *given != v => {
                        return Err(invalid(format!(
                            "`{alias}` ({v}) and `{field}` ({given}) are the same field and disagree"
                        )));
                    }
                    _ => {
                        fields.insert(field.clone(), v);
                    }
                }
            }
            for (key, default) in &preset.config_defaults {
                fields.entry(key.clone()).or_insert_with(|| default.clone());
            }
        }
        let raw: RawConfig = serde_json::from_value(value).map_err(|e| invalid(e.to_string()))?;
        let attention = preset.attention;
        let act_name = raw.hidden_activation.as_deref().or(raw.hidden_act.as_deref()).unwrap_or("silu");
        let activation = match act_name {
            "silu" => Activation::Silu,
            "gelu_pytorch_tanh" => Activation::GeluTanh,
            other => return Err(invalid(format!("activation {other:?} is not implemented (silu, gelu_pytorch_tanh)"))),
        };
        if raw.mlp_bias {
            return Err(invalid("mlp_bias is not implemented (the MLP's projections are unbiased)".into()));
        }
        // transformers 5.24's Gemma 3 reads this and never applies it; no spec caps scores.
        if let Some(v) = raw.attn_logit_softcapping {
            return Err(invalid(format!("attn_logit_softcapping = {v} is not implemented")));
        }
        let final_softcap = match raw.final_logit_softcapping {
            Some(c) if !preset.head.final_softcapping => {
                return Err(invalid(format!("final_logit_softcapping = {c} is not implemented for {}", preset.name)));
            }
            Some(c) if !(c.is_finite() && c > 0.0) => {
                return Err(invalid(format!("final_logit_softcapping = {c} is not a positive cap")));
            }
            cap => cap,
        };
        if raw.use_bidirectional_attention {
            return Err(invalid("use_bidirectional_attention is not implemented".into()));
        }
        if raw.use_sliding_window && !attention.sliding_layers {
            return Err(invalid("use_sliding_window is not implemented for this decoder".into()));
        }
        let pattern = raw.sliding_window_pattern.or(raw.saved_sliding_window_pattern);
        let layer_kinds = match (&raw.layer_types, attention.sliding_pattern) {
            (Some(types), _) => types
                .iter()
                .map(|t| LayerKind::parse(t).ok_or_else(|| invalid(format!("layer type {t:?} is not implemented"))))
                .collect::<Result<Vec<_>, _>>()?,
            // As transformers derives them: layer i slides unless (i + 1) is a multiple of the pattern.
            (None, Some(default)) => {
                let n = pattern.unwrap_or(default);
                if n == 0 {
                    return Err(invalid("sliding_window_pattern is 0".into()));
                }
                (0..raw.num_hidden_layers)
                    .map(|i| if (i + 1) % n == 0 { LayerKind::Full } else { LayerKind::Sliding })
                    .collect()
            }
            (None, None) => {
                if let Some(n) = raw.sliding_window_pattern {
                    return Err(invalid(format!(
                        "sliding_window_pattern = {n} is not implemented for {}",
                        preset.name
                    )));
                }
                vec![LayerKind::Full; raw.num_hidden_layers]
            }
        };
        if layer_kinds.len() != raw.num_hidden_layers {
            return Err(invalid(format!("{} layer_types for {} layers", layer_kinds.len(), raw.num_hidden_layers)));
        }
        let aug = augmentations(&raw, &preset, &layer_kinds).map_err(invalid)?;
        let sliding = layer_kinds.contains(&LayerKind::Sliding);
        if sliding && !attention.sliding_layers {
            return Err(invalid("sliding_attention layers are not implemented for this decoder".into()));
        }
        let sliding_window = if sliding {
            Some(
                raw.sliding_window
                    .filter(|&w| w > 0)
                    .ok_or_else(|| invalid("sliding layers need sliding_window".into()))?,
            )
        } else {
            None
        };
        if raw.rope_local_base_freq.is_some() && !attention.rope_per_kind {
            return Err(invalid(format!("rope_local_base_freq is not implemented for {}", preset.name)));
        }
        if raw.rope_parameters.is_some() && raw.rope_scaling.is_some() {
            return Err(invalid(
                "both rope_parameters and the legacy rope_scaling are given; which applies is ambiguous".into(),
            ));
        }
        let mut rope = BTreeMap::new();
        let kinds: std::collections::BTreeSet<LayerKind> = layer_kinds.iter().copied().collect();
        for kind in kinds {
            let r = match (&raw.rope_parameters, &raw.rope_scaling) {
                (Some(RawRopeParameters::PerLayerType(map)), _) => map
                    .get(kind.hf_name())
                    .ok_or_else(|| invalid(format!("rope_parameters has no entry for {}", kind.hf_name())))
                    .and_then(|r| parse_rope(r, raw.rope_theta).map_err(invalid))?,
                (Some(RawRopeParameters::Flat(r)), _) => parse_rope(r, raw.rope_theta).map_err(invalid)?,
                // The legacy fields of an architecture whose layer kinds have their own rotary
                // embeddings (Gemma 3): the scaling belongs to full layers, sliding layers take
                // `rope_local_base_freq` and default frequencies.
                (None, _) if attention.rope_per_kind && kind == LayerKind::Sliding => Rope {
                    theta: raw.rope_local_base_freq.ok_or_else(|| invalid("no rope_local_base_freq".into()))?,
                    scaling: RopeScaling::Default,
                },
                (None, Some(scaling)) => parse_rope(scaling, raw.rope_theta).map_err(invalid)?,
                (None, None) => Rope {
                    theta: raw.rope_theta.ok_or_else(|| invalid("no rope_theta".into()))?,
                    scaling: RopeScaling::Default,
                },
            };
            rope.insert(kind, r);
        }
        let heads = raw.num_attention_heads;
        let mla = match attention.kind {
            AttentionKind::GroupedQuery => {
                let given = [
                    ("kv_lora_rank", raw.kv_lora_rank.is_some()),
                    ("q_lora_rank", raw.q_lora_rank.is_some()),
                    ("qk_nope_head_dim", raw.qk_nope_head_dim.is_some()),
                    ("qk_rope_head_dim", raw.qk_rope_head_dim.is_some()),
                    ("v_head_dim", raw.v_head_dim.is_some()),
                    ("rope_interleave", raw.rope_interleave == Some(true)),
                ];
                if let Some((field, _)) = given.iter().find(|(_, given)| *given) {
                    return Err(invalid(format!(
                        "`{field}` is multi-head latent attention's; {} has grouped-query attention",
                        preset.name
                    )));
                }
                None
            }
            AttentionKind::MultiHeadLatent => Some(mla_sizes(&raw, heads, &preset.name).map_err(invalid)?),
        };
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(invalid(format!("{heads} attention heads do not group over {kv_heads} key/value heads")));
        }
        let head_dim = match &mla {
            Some(m) => m.rope,
            None => raw.head_dim.unwrap_or(raw.hidden_size / heads),
        };
        if !head_dim.is_multiple_of(2) {
            return Err(invalid(format!("head_dim {head_dim} is odd; rotary embedding needs pairs")));
        }
        let flat = match (&raw.rope_parameters, &raw.rope_scaling) {
            (Some(RawRopeParameters::Flat(r)), _) | (None, Some(r)) => Some(r),
            _ => None,
        };
        let mrope = match flat {
            Some(RawRope { mrope_section: Some(sec), mrope_interleaved, .. }) => {
                let section: [usize; 3] = sec
                    .as_slice()
                    .try_into()
                    .map_err(|_| invalid(format!("mrope_section {sec:?} is not 3 numbers")))?;
                if section.iter().sum::<usize>() != head_dim / 2 {
                    return Err(invalid(format!(
                        "mrope_section {sec:?} does not sum to head_dim / 2 = {}",
                        head_dim / 2
                    )));
                }
                Some(MRope { section, interleaved: *mrope_interleaved })
            }
            _ => None,
        };
        if mla.is_some() && (mrope.is_some() || attention.qk_norm) {
            return Err(invalid(format!(
                "{}: M-RoPE and q/k norms are not implemented for multi-head latent attention",
                preset.name
            )));
        }
        let attn_scale = match (attention.scale, raw.query_pre_attn_scalar) {
            (AttnScale::InverseSqrtQueryPreAttnScalar, Some(s)) => s.powf(-0.5),
            (AttnScale::InverseSqrtQueryPreAttnScalar, None) => {
                return Err(invalid(format!("{} needs query_pre_attn_scalar", preset.name)));
            }
            // MLA's scores are over the query head, the no-rope and rotated parts together.
            (AttnScale::One, _) => 1.0,
            (AttnScale::InverseSqrtHeadDim, _) => match &mla {
                Some(m) => (m.q_head_dim() as f64).powf(-0.5),
                None => (head_dim as f64).powf(-0.5),
            },
        };
        let sandwich_norms = preset.norms.placement == NormPlacement::Sandwich;
        let post_norms = preset.norms.placement == NormPlacement::Post;
        let tied_embeddings = raw.tie_word_embeddings.unwrap_or(preset.head.tied_by_default);
        let extra_vocab = match (preset.weights, raw.additional_vocab_size) {
            (WeightLayout::Molmo, Some(n)) => n,
            (WeightLayout::Molmo, None) => {
                return Err(invalid(format!("{} needs additional_vocab_size", preset.name)));
            }
            (WeightLayout::Transformers, None | Some(0)) => 0,
            (WeightLayout::Transformers, Some(n)) => {
                return Err(invalid(format!(
                    "additional_vocab_size = {n} is not implemented for {} (its token table has no second part)",
                    preset.name
                )));
            }
        };
        if preset.weights == WeightLayout::Molmo && tied_embeddings {
            // The tied head would be the stacked table, predicting the additional rows too.
            return Err(invalid(format!("tie_word_embeddings is not implemented for {}", preset.name)));
        }
        if raw.num_hidden_layers == 0 {
            return Err(invalid("num_hidden_layers is 0".into()));
        }
        let intermediates = match &raw.intermediate_size {
            RawIntermediate::One(i) => vec![*i; raw.num_hidden_layers],
            RawIntermediate::PerLayer(sizes) if sizes.len() == raw.num_hidden_layers && !sizes.is_empty() => {
                sizes.clone()
            }
            RawIntermediate::PerLayer(sizes) => {
                return Err(invalid(format!(
                    "{} intermediate sizes for {} layers",
                    sizes.len(),
                    raw.num_hidden_layers
                )));
            }
        };
        let intermediates = match preset.intermediate_counts_fused {
            true if intermediates.iter().any(|i| !i.is_multiple_of(2)) => {
                return Err(invalid(format!(
                    "intermediate_size {} counts the fused up and gate rows for {}, and is odd",
                    intermediates[0], preset.name
                )));
            }
            true => intermediates.iter().map(|i| i / 2).collect(),
            false => intermediates,
        };
        let intermediate = intermediates[0];
        Ok(TextConfig {
            hidden: raw.hidden_size,
            intermediate,
            layers: raw.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            rms_eps: raw.rms_norm_eps,
            vocab: raw.vocab_size,
            extra_vocab,
            tied_embeddings,
            qkv_bias: attention.qkv_bias == QkvBias::Always || raw.attention_bias,
            qk_norm: attention.qk_norm,
            qk_norm_whole: attention.qk_norm && attention.qk_norm_scope == crate::spec::QkNormScope::Whole,
            sandwich_norms,
            post_norms,
            norm_style: preset.norms.style,
            activation,
            // torch.tensor(hidden ** 0.5) is an f32 tensor.
            embed_scale: match preset.embedding.scale {
                EmbedScale::None => None,
                EmbedScale::SqrtHidden => Some((raw.hidden_size as f64).sqrt() as f32),
            },
            attn_scale,
            layer_kinds,
            sliding_window,
            rope,
            mrope,
            injected_layers: preset.injected_layers,
            final_softcap,
            quantization,
            mla,
            intermediates,
            v_norm: attention.v_norm,
            altup: aug.altup,
            laurel_rank: aug.laurel_rank,
            per_layer_inputs: aug.per_layer_inputs,
            kv_source: aug.kv_source,
            sparsity: aug.sparsity,
            spec: preset,
        })
    }

    /// Rows of the token table: the head's vocabulary plus the extra rows; a token id at or
    /// past this has no embedding.
    pub fn table_rows(&self) -> usize {
        self.vocab + self.extra_vocab
    }

    /// The layers that compute and cache keys and values, in order (every layer unless some
    /// share): a layer's cache layer is its index here.
    pub fn cached_layers(&self) -> Vec<usize> {
        (0..self.layers).filter(|&l| self.kv_source[l].is_none()).collect()
    }

    /// The cache layer layer `l` reads: its own, or its KV source's.
    pub fn cache_layer(&self, l: usize) -> usize {
        let owner = self.kv_source[l].unwrap_or(l);
        self.kv_source[..owner].iter().filter(|s| s.is_none()).count()
    }

    /// The attention kinds in use, in mask order.
    pub fn kinds(&self) -> Vec<LayerKind> {
        self.rope.keys().copied().collect()
    }

    /// The rotary inverse frequencies of `kind` exactly as transformers
    /// computes them: in f32, operation by operation, python scalars
    /// rounded to f32.
    pub fn inv_freq(&self, kind: LayerKind) -> Vec<f32> {
        let Some(rope) = self.rope.get(&kind) else { return Vec::new() };
        let d = self.head_dim as f32;
        let base = rope.theta as f32;
        let plain = (0..self.head_dim / 2).map(|i| 1.0f32 / base.powf((2 * i) as f32 / d));
        match rope.scaling {
            RopeScaling::Default => plain.collect(),
            RopeScaling::Linear { factor } => plain.map(|inv| inv / factor).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor: low, high_freq_factor: high, original_context: old } => {
                plain
                    .map(|inv| {
                        let (low_wavelen, high_wavelen) = (old / low, old / high);
                        let wavelen = (2.0 * std::f64::consts::PI) as f32 / inv;
                        let scaled = if wavelen > low_wavelen { inv / factor } else { inv };
                        let smooth = (old / wavelen - low) / (high - low);
                        let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                        // torch: ~(wavelen < high) * ~(wavelen > low); wavelen is never NaN here.
                        let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                        if medium { smoothed } else { scaled }
                    })
                    .collect()
            }
        }
    }

    /// Whether position `kv` is visible from position `q` in a `kind` layer.
    pub fn visible(&self, kind: LayerKind, q: usize, kv: usize) -> bool {
        self.visible_with(kind, q, kv, false)
    }

    /// As [`TextConfig::visible`], when `q` and `kv` may share a
    /// bidirectional block: as transformers composes Gemma3's masks, full
    /// layers see `causal OR same block`, sliding layers
    /// `(causal OR same block) AND kv > q - window`.
    pub fn visible_with(&self, kind: LayerKind, q: usize, kv: usize, same_block: bool) -> bool {
        let in_window = match (kind, self.sliding_window) {
            (LayerKind::Sliding, Some(w)) => kv + w > q,
            _ => true,
        };
        (kv <= q || same_block) && in_window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(model_type: &str, extra: serde_json::Value) -> String {
        let mut v = serde_json::json!({
            "model_type": model_type, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4, "rms_norm_eps": 1e-6,
            "vocab_size": 8, "rope_theta": 10000.0, "layer_types": ["full_attention"],
            "query_pre_attn_scalar": 4,
        });
        v.as_object_mut().expect("object").extend(extra.as_object().expect("object").clone());
        v.to_string()
    }

    fn fixture_config(name: &str) -> serde_json::Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name).join("config.json");
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture config")).expect("json")
    }

    fn drop(v: &mut serde_json::Value, keys: &[&str]) {
        let map = v.as_object_mut().expect("object");
        for k in keys {
            map.remove(*k);
        }
    }

    /// A spec whose config counts the fused up-and-gate rows reads half of `intermediate_size`
    /// as the MLP's width, and refuses an odd count.
    #[test]
    fn an_intermediate_size_counting_the_fused_rows_is_halved() {
        let mut spec = presets::qwen2();
        spec.model_types = vec!["qwen2".into()];
        spec.intermediate_counts_fused = true;
        let c = TextConfig::parse_with(&config("qwen2", serde_json::json!({})), Some(&spec)).expect("fused");
        assert_eq!(c.intermediate, 8);
        let odd = config("qwen2", serde_json::json!({"intermediate_size": 15}));
        let err = TextConfig::parse_with(&odd, Some(&spec)).expect_err("odd");
        assert!(err.to_string().contains("intermediate_size 15"), "{err}");
        let plain = TextConfig::parse_with(&config("qwen2", serde_json::json!({})), None).expect("preset");
        assert_eq!(plain.intermediate, 16);
    }

    /// The Hub's gemma3_text config (transformers 4): no `layer_types`, the pattern as an int,
    /// the full layers' rotary scaling in `rope_scaling`, the sliding layers' base in
    /// `rope_local_base_freq`. It reads to exactly the transformers 5 fixture's config.
    #[test]
    fn a_hub_gemma3_text_config_reads_as_transformers_5_writes_it() {
        let saved = fixture_config("gemma3_text");
        let mut hub = saved.clone();
        drop(&mut hub, &["layer_types", "rope_parameters", "_sliding_window_pattern"]);
        hub["sliding_window_pattern"] = 2.into();
        hub["rope_theta"] = 1000000.0.into();
        hub["rope_local_base_freq"] = 10000.0.into();
        hub["rope_scaling"] = serde_json::json!({"factor": 8.0, "rope_type": "linear"});
        let want = TextConfig::parse(&saved.to_string()).expect("the fixture");
        assert_eq!(TextConfig::parse(&hub.to_string()).expect("the hub form"), want);

        // No pattern at all: transformers' default of 6 (here: 8 layers, the sixth full).
        let mut sparse = hub.clone();
        drop(&mut sparse, &["sliding_window_pattern", "rope_local_base_freq", "rope_theta"]);
        sparse["num_hidden_layers"] = 8.into();
        let c = TextConfig::parse(&sparse.to_string()).expect("sparse");
        let full: Vec<usize> = (0..8).filter(|&i| c.layer_kinds[i] == LayerKind::Full).collect();
        assert_eq!(full, [5], "{:?}", c.layer_kinds);
        // The class's rotary bases: 1e6 (with the scaling) for full layers, 1e4 for sliding ones.
        assert_eq!(c.rope[&LayerKind::Full], Rope { theta: 1e6, scaling: RopeScaling::Linear { factor: 8.0 } });
        assert_eq!(c.rope[&LayerKind::Sliding], Rope { theta: 1e4, scaling: RopeScaling::Default });
    }

    /// Llama 3.1 on the Hub: `rope_theta` and `rope_scaling` beside each other.
    #[test]
    fn a_hub_llama_config_reads_its_legacy_rope_scaling() {
        let saved = fixture_config("llama");
        let mut hub = saved.clone();
        let rope = hub["rope_parameters"].clone();
        drop(&mut hub, &["rope_parameters"]);
        hub["rope_theta"] = rope["rope_theta"].clone();
        let mut scaling = rope.clone();
        drop(&mut scaling, &["rope_theta"]);
        hub["rope_scaling"] = scaling;
        let want = TextConfig::parse(&saved.to_string()).expect("the fixture");
        assert_eq!(TextConfig::parse(&hub.to_string()).expect("the hub form"), want);

        let mut both = hub.clone();
        both["rope_parameters"] = rope;
        let err = TextConfig::parse(&both.to_string()).expect_err("two rope fields");
        assert!(err.to_string().contains("ambiguous"), "{err}");
        let mut bias = saved.clone();
        bias["mlp_bias"] = true.into();
        assert!(TextConfig::parse(&bias.to_string()).is_err(), "a biased MLP is refused");
    }

    /// LLaVA 1.5's text config on the Hub gives its model type and vocabulary only; the rest
    /// is `LlamaConfig`'s defaults.
    #[test]
    fn a_sparse_text_config_takes_the_config_class_defaults() {
        let c = TextConfig::parse(
            r#"{"model_type": "llava", "text_config": {"model_type": "llama", "vocab_size": 32064}}"#,
        )
        .expect("sparse");
        assert_eq!(
            (c.hidden, c.intermediate, c.layers, c.heads, c.kv_heads, c.head_dim),
            (4096, 11008, 32, 32, 32, 128)
        );
        assert_eq!((c.vocab, c.rms_eps, c.tied_embeddings), (32064, 1e-6, false));
        assert_eq!(c.rope[&LayerKind::Full], Rope { theta: 10000.0, scaling: RopeScaling::Default });
        // An explicit null is the config's own (num_key_value_heads None: one per head).
        let null =
            TextConfig::parse(r#"{"model_type": "llama", "num_key_value_heads": null, "num_attention_heads": 8}"#)
                .expect("null");
        assert_eq!(null.kv_heads, 8);
    }

    /// Multi-head latent attention reads its sizes, keeps `head_dim` as the rotary width and
    /// scales scores over the whole query head; what it does not implement is refused, and a
    /// grouped-query decoder refuses latent-attention fields rather than ignore them.
    #[test]
    fn latent_attention_reads_its_sizes_and_refuses_what_it_does_not_implement() {
        let saved = fixture_config("youtu");
        let c = TextConfig::parse(&saved.to_string()).expect("youtu");
        let m = c.mla.expect("latent attention");
        assert_eq!(
            (m.q_lora_rank, m.kv_lora_rank, m.nope, m.rope, m.v, m.interleaved),
            (Some(24), 16, 16, 8, 16, true)
        );
        assert_eq!((c.head_dim, c.attn_scale), (8, 24f64.powf(-0.5)));
        let kv = crate::KvLayout::of(&c, mlxcel_emit::Elem::F32);
        assert_eq!((kv.planes, kv.row.as_slice()), (1, &[1, 24][..]));

        let refused = |change: serde_json::Value, says: &str| {
            let mut v = saved.clone();
            v.as_object_mut().expect("object").extend(change.as_object().expect("object").clone());
            let err = TextConfig::parse(&v.to_string()).expect_err(says);
            assert!(err.to_string().contains(says), "{err}");
        };
        refused(serde_json::json!({"num_key_value_heads": 2}), "2 key/value heads for 4 query heads");
        refused(serde_json::json!({"attention_bias": true}), "attention_bias");
        refused(serde_json::json!({"rms_norm_eps": 1e-5}), "rms_norm_eps");
        refused(serde_json::json!({"qk_head_dim": 32}), "qk_head_dim");
        refused(serde_json::json!({"q_lora_rank": 0}), "q_lora_rank is 0");
        refused(
            serde_json::json!({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}),
            "yarn",
        );
        let mut sparse = saved.clone();
        drop(&mut sparse, &["kv_lora_rank"]);
        sparse["kv_lora_rank"] = serde_json::Value::Null;
        assert!(TextConfig::parse(&sparse.to_string()).is_err(), "a null latent rank is refused");
        // A null q_lora_rank is transformers' full-rank query projection.
        let mut full = saved.clone();
        full["q_lora_rank"] = serde_json::Value::Null;
        assert_eq!(TextConfig::parse(&full.to_string()).expect("full-rank q").mla.expect("mla").q_lora_rank, None);

        let gqa = config("llama", serde_json::json!({"kv_lora_rank": 16}));
        let err = TextConfig::parse(&gqa).expect_err("llama has no latent attention");
        assert!(err.to_string().contains("`kv_lora_rank` is multi-head latent attention's"), "{err}");
    }

    /// Gemma 3n's augmentations read their sizes: the KV-sharing layers point at the last
    /// earlier layer of their kind and own no cache layer; transformers' default sparsity applies
    /// when the config gives none; a spec without the augmentations refuses their sizes.
    #[test]
    fn augmentations_read_their_sizes_and_other_specs_refuse_them() {
        let text = fixture_config("gemma3n")["text_config"].clone();
        let c = TextConfig::parse(&text.to_string()).expect("gemma3n_text");
        assert_eq!(c.altup, Some(AltUp { inputs: 2, active: 0, correct_scale: true }));
        assert_eq!((c.laurel_rank, c.per_layer_inputs), (Some(8), Some(PerLayerInputs { hidden: 8, vocab: 392 })));
        // sliding, full, sliding, full; the last two share.
        assert_eq!(c.kv_source, [None, None, Some(0), Some(1)]);
        assert_eq!((c.cached_layers(), c.cache_layer(2), c.cache_layer(3)), (vec![0, 1], 0, 1));
        assert_eq!(c.sparsity, [0.95, 0.0, 0.0, 0.0]);
        assert_eq!((c.attn_scale, c.v_norm, c.final_softcap), (1.0, true, Some(30.0)));

        let mut deep = text.clone();
        deep["num_hidden_layers"] = 12.into();
        drop(&mut deep, &["layer_types", "activation_sparsity_pattern", "intermediate_size"]);
        deep["intermediate_size"] = 128.into();
        let c = TextConfig::parse(&deep.to_string()).expect("defaults");
        assert_eq!(c.sparsity.iter().filter(|&&s| s == 0.95).count(), 10);
        assert_eq!(c.layer_kinds.iter().filter(|&&k| k == LayerKind::Full).count(), 2, "every fifth is full");
        assert_eq!(c.intermediates, vec![128; 12]);

        let mut odd = text.clone();
        odd["altup_active_idx"] = 1.into();
        assert!(TextConfig::parse(&odd.to_string()).is_err(), "only stream 0 active is implemented");
        let mut short = text.clone();
        short["intermediate_size"] = serde_json::json!([128, 128]);
        assert!(TextConfig::parse(&short.to_string()).is_err(), "one width per layer");
        // Found by fuzzing (config_youtu_vl): no layers indexed an empty width list.
        let none = config("llama", serde_json::json!({"num_hidden_layers": 0, "layer_types": []}));
        let err = TextConfig::parse(&none).expect_err("no layers");
        assert!(err.to_string().contains("num_hidden_layers is 0"), "{err}");
        let err = TextConfig::parse(&config("llama", serde_json::json!({"laurel_rank": 8}))).expect_err("llama");
        assert!(err.to_string().contains("`laurel_rank` is not implemented for llama"), "{err}");
    }

    #[test]
    fn a_final_cap_is_read_where_the_spec_takes_one_and_refused_elsewhere() {
        let cap = serde_json::json!({"final_logit_softcapping": 30.0});
        let gemma = TextConfig::parse(&config("gemma3_text", cap.clone())).expect("gemma3_text takes a cap");
        assert_eq!(gemma.final_softcap, Some(30.0));
        let err = TextConfig::parse(&config("llama", cap)).expect_err("llama has no cap");
        assert!(err.to_string().contains("final_logit_softcapping = 30 is not implemented for llama"), "{err}");
        let zero = serde_json::json!({"final_logit_softcapping": 0.0});
        assert!(TextConfig::parse(&config("gemma3_text", zero)).is_err(), "a zero cap divides by zero");
        let attn = serde_json::json!({"attn_logit_softcapping": 50.0});
        assert!(TextConfig::parse(&config("gemma3_text", attn)).is_err(), "attention capping is refused");
        let none = serde_json::json!({"final_logit_softcapping": null});
        assert_eq!(TextConfig::parse(&config("llama", none)).expect("a null cap is none").final_softcap, None);
    }
}
