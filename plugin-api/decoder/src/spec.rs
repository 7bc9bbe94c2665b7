//! A text decoder as declared data: which of the library's blocks it is
//! built from. A [`DecoderSpec`] says what an architecture fixes that its
//! `config.json` leaves unsaid (which projections carry biases, where the
//! norms sit, how embeddings and attention scores are scaled);
//! [`crate::TextConfig::parse_with`] combines it with the config's sizes into
//! the validated config the graph is built from.
//!
//! The library's own architectures are the [`crate::presets`]. A family
//! plugin may bring its own spec across the plugin ABI (since plugin-api
//! 1.2), serialised as JSON in this schema: every field is required unless
//! marked, and an unknown field is an error, never ignored, because every
//! field here changes the math.

use serde::{Deserialize, Serialize};

pub use mlxcel_emit::RmsStyle;

/// The schema version of [`DecoderSpec`]'s serialised form. Bumped when a
/// field changes meaning or a required field is added; a spec of another
/// schema is refused rather than half understood.
pub const SPEC_SCHEMA: u32 = 1;

/// A decoder: its embedding, norms, attention, MLP and head blocks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecoderSpec {
    /// [`SPEC_SCHEMA`] when the spec was written.
    pub schema: u32,
    /// The architecture's name, for messages, the compile-cache fingerprint
    /// and MLIR dumps.
    pub name: String,
    /// The text `model_type` values the spec reads (a vision-language
    /// checkpoint's `text_config.model_type`).
    pub model_types: Vec<String>,
    pub embedding: Embedding,
    pub norms: Norms,
    pub attention: Attention,
    pub mlp: Mlp,
    pub head: Head,
    /// The config class's defaults (transformers' `<Arch>Config`), for the
    /// fields a sparse config leaves out: a key absent from the config takes
    /// this value; one present, null included, is the config's.
    #[serde(default)]
    pub config_defaults: serde_json::Map<String, serde_json::Value>,
    /// Prepared prompts may add one per-row feature tensor to the hidden
    /// state after each of layers `0..injected_layers` (Qwen3-VL's DeepStack).
    /// A family that injects says how many from its own config.
    #[serde(default)]
    pub injected_layers: usize,
    /// How the checkpoint lays the decoder's tensors out; transformers' layout when absent.
    /// Left out of the JSON when it is the default, so a spec without it reads the same on
    /// hosts that predate it, and one with it is refused there as an unknown field.
    #[serde(default, skip_serializing_if = "WeightLayout::is_default")]
    pub weights: WeightLayout,
    /// Config fields the config class also reads under another name (transformers'
    /// `attribute_map`, for example `qkv_bias` for `attention_bias`): `alias -> field`. A
    /// config giving only the alias is read as if it gave the field; giving both with
    /// different values is refused as ambiguous.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub config_aliases: std::collections::BTreeMap<String, String>,
    /// The config's `intermediate_size` counts the rows of the fused up-and-gate projection
    /// (the original Molmo configs' `mlp_hidden_size`, OLMo's convention), twice the MLP's
    /// width; otherwise it is the width. Left out of the JSON when false.
    #[serde(default, skip_serializing_if = "is_false")]
    pub intermediate_counts_fused: bool,
    /// Blocks around each layer beyond the plain residual stream (Gemma 3n's); none unless
    /// named. Left out of the JSON when none is.
    #[serde(default, skip_serializing_if = "Augmentations::is_none")]
    pub augmentations: Augmentations,
}

/// Blocks a layer may carry beyond attention and the MLP, each read with its sizes from the
/// config (Gemma 3n's names). A spec without one refuses a config that sizes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Augmentations {
    /// AltUp (`altup_num_inputs`, `altup_active_idx`, `altup_correct_scale`): the hidden state
    /// is several streams; each layer predicts every stream from all of them (`altup.predict`),
    /// runs on the active one, and corrects the others by what it changed (`altup.correct`). The
    /// extra streams start as projections of the embeddings (`altup_projections`) and end
    /// averaged with the active one after projecting back (`altup_unembed_projections`), each
    /// rescaled to the active stream's magnitude.
    #[serde(default, skip_serializing_if = "is_false")]
    pub altup: bool,
    /// LAuReL (`laurel_rank`): a low-rank residual branch beside attention, averaged in with a
    /// `1/sqrt(2)` scale.
    #[serde(default, skip_serializing_if = "is_false")]
    pub laurel: bool,
    /// Per-layer inputs (`hidden_size_per_layer_input`, `vocab_size_per_layer_input`): a second
    /// token table holds a small embedding per layer, combined with a projection of the input
    /// embeddings and gated into the AltUp streams after each layer. A prompt prefilled from
    /// embeddings also gives its rows' token ids.
    #[serde(default, skip_serializing_if = "is_false")]
    pub per_layer_inputs: bool,
    /// KV sharing (`num_kv_shared_layers`): the last layers compute no keys or values and
    /// attend over those of the last earlier layer of their kind; the cache holds only the
    /// layers that compute them.
    #[serde(default, skip_serializing_if = "is_false")]
    pub kv_sharing: bool,
    /// Activation sparsity (`activation_sparsity_pattern`, one target per layer): the MLP's gate
    /// keeps only what lies above `mean + std * Phi^-1(target)` of its row.
    #[serde(default, skip_serializing_if = "is_false")]
    pub activation_sparsity: bool,
}

impl Augmentations {
    fn is_none(&self) -> bool {
        *self == Augmentations::default()
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Where a checkpoint keeps a decoder's tensors, and in which pieces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightLayout {
    /// transformers' layout: `embed_tokens`, `layers.N.self_attn.{q,k,v,o}_proj`,
    /// `layers.N.mlp.{gate,up,down}_proj`, `norm`, `lm_head`.
    #[default]
    Transformers,
    /// The original Molmo (OLMo) layout, which transformers' Molmo2 converts on load and
    /// writes back on save: `wte.embedding` with the config's `additional_vocab_size` rows in
    /// `wte.new_embedding` (the token table is the two stacked), `blocks.N.attn_norm`, one fused
    /// `self_attn.att_proj` holding the q, k and v rows in that order, `self_attn.attn_out`,
    /// `ff_norm`, one fused `mlp.ff_proj` holding the up rows then the gate rows, `mlp.ff_out`,
    /// `ln_f`, and an untied `lm_head` over the base vocabulary. The fused projections are
    /// computed as one matmul each and split after it. The two parts of the token table may be
    /// split at any row (transformers 5.24 saves Molmo2's as two equal halves): the table is
    /// the two stacked.
    Molmo,
}

impl WeightLayout {
    fn is_default(&self) -> bool {
        *self == WeightLayout::Transformers
    }
}

/// The token embedding block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Embedding {
    pub scale: EmbedScale,
}

/// What token embeddings are multiplied by before the first layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EmbedScale {
    /// Nothing.
    None,
    /// `sqrt(hidden_size)`, computed in f32 and cast to the activation dtype.
    SqrtHidden,
}

/// Where the norms sit and how their weight applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Norms {
    pub style: RmsStyle,
    pub placement: NormPlacement,
}

/// The norms of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormPlacement {
    /// One norm before attention and one before the MLP.
    Pre,
    /// As `pre`, plus one on each block's output before its residual add.
    Sandwich,
    /// Only one on each block's output before its residual add, none before
    /// (OLMo 2's; Molmo2's `norm_after`).
    Post,
}

/// The attention block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Attention {
    pub kind: AttentionKind,
    pub qkv_bias: QkvBias,
    /// RMSNorm on q and k before the rotary embedding.
    pub qk_norm: bool,
    /// What the q/k norm normalizes: each head (Qwen3's), or the whole
    /// projection before it is split into heads (OLMo's). Left out of the JSON
    /// when per head.
    #[serde(default, skip_serializing_if = "QkNormScope::is_default")]
    pub qk_norm_scope: QkNormScope,
    pub scale: AttnScale,
    /// Sliding-window layers (`layer_types`, `use_sliding_window`) are part
    /// of the architecture; a spec without them refuses a config that asks.
    pub sliding_layers: bool,
    /// When the config gives no `layer_types`: layer `i` slides unless
    /// `(i + 1) % n == 0`, `n` the config's `sliding_window_pattern` or this
    /// default (Gemma 3's 6). `None`: every layer is full, and a config's
    /// `sliding_window_pattern` is refused.
    pub sliding_pattern: Option<usize>,
    /// A scaleless RMSNorm on each head's values (Gemma 3n's `v_norm`). Left out of the JSON
    /// when absent.
    #[serde(default, skip_serializing_if = "is_false")]
    pub v_norm: bool,
    /// Sliding and full layers have rotary embeddings of their own:
    /// `rope_parameters` keyed by layer type, or, in the legacy fields,
    /// `rope_theta` with `rope_scaling` for full layers and
    /// `rope_local_base_freq` for sliding ones. Otherwise one rotary embedding
    /// serves every layer, and `rope_local_base_freq` is refused.
    pub rope_per_kind: bool,
}

/// How queries meet keys and what the cache holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKind {
    /// Grouped-query attention with the config's rotary embedding (1-D, or
    /// M-RoPE when `mrope_section` is given); the cache holds each layer's
    /// keys and values.
    GroupedQuery,
    /// Multi-head latent attention (DeepSeek-V2's, Youtu-LLM's): queries through an optional
    /// low-rank projection (`q_lora_rank`), keys and values through one shared latent of
    /// `kv_lora_rank` values plus one rotary key of `qk_rope_head_dim` shared by every head
    /// (`kv_a_proj_with_mqa`), each head's no-rope key and value projected from the latent
    /// (`kv_b_proj`); `rope_interleave` rotates adjacent pairs. The cache holds each layer's
    /// normed latent and rotated key, one row of `kv_lora_rank + qk_rope_head_dim` values per
    /// position, never the expanded keys and values.
    MultiHeadLatent,
}

/// What a q/k RMSNorm normalizes over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNormScope {
    /// Each head's `head_dim` values (weights `[head_dim]`).
    #[default]
    PerHead,
    /// The whole projection, `heads * head_dim` values (weights of that size).
    Whole,
}

impl QkNormScope {
    fn is_default(&self) -> bool {
        *self == QkNormScope::PerHead
    }
}

/// Whether q, k and v carry biases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QkvBias {
    /// When the config's `attention_bias` says so.
    FromConfig,
    /// Always.
    Always,
}

/// How attention scores are scaled before the softmax.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttnScale {
    /// `head_dim ** -0.5`.
    InverseSqrtHeadDim,
    /// `query_pre_attn_scalar ** -0.5`, which the config must give.
    InverseSqrtQueryPreAttnScalar,
    /// Unscaled (Gemma 3n's, whose q/k norms keep scores in range).
    One,
}

/// The feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mlp {
    /// `down(act(gate(x)) * up(x))` with the config's activation.
    Gated,
}

/// The LM head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Head {
    /// The head is the embedding table when the config's
    /// `tie_word_embeddings` does not say.
    pub tied_by_default: bool,
    /// The config's `final_logit_softcapping`, when set, caps the logits
    /// (`tanh(logits / c) * c`); a spec without it refuses a config that sets it.
    pub final_softcapping: bool,
}

/// Why a spec cannot be used.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("the decoder spec is not valid JSON for schema {SPEC_SCHEMA}: {0}")]
    Json(String),
    #[error("the decoder spec has schema {found}; this library reads schema {SPEC_SCHEMA}")]
    Schema { found: u32 },
    #[error("the decoder spec {name:?} is incomplete: {reason}")]
    Incomplete { name: String, reason: &'static str },
}

impl DecoderSpec {
    /// Reads a serialised spec and validates it.
    pub fn from_json(json: &str) -> Result<Self, SpecError> {
        // The schema first, so a newer spec is named as such rather than as an unknown field.
        #[derive(Deserialize)]
        struct Schema {
            schema: u32,
        }
        let Schema { schema } = serde_json::from_str(json).map_err(|e| SpecError::Json(e.to_string()))?;
        if schema != SPEC_SCHEMA {
            return Err(SpecError::Schema { found: schema });
        }
        let spec: DecoderSpec = serde_json::from_str(json).map_err(|e| SpecError::Json(e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// The spec as JSON in [`SPEC_SCHEMA`].
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("invariant: a spec serialises")
    }

    /// Checks what the types cannot: the schema, a name, a model type.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.schema != SPEC_SCHEMA {
            return Err(SpecError::Schema { found: self.schema });
        }
        let incomplete = |reason| Err(SpecError::Incomplete { name: self.name.clone(), reason });
        if self.name.is_empty() {
            return incomplete("it has no name");
        }
        if self.model_types.is_empty() || self.model_types.iter().any(String::is_empty) {
            return incomplete("it reads no model_type");
        }
        Ok(())
    }

    /// Whether this spec reads a text config of `model_type`.
    pub fn reads(&self, model_type: &str) -> bool {
        self.model_types.iter().any(|t| t == model_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    #[test]
    fn every_preset_round_trips_through_its_json() {
        for p in presets::all() {
            assert_eq!(DecoderSpec::from_json(&p.to_json()).as_ref(), Ok(&p), "{}", p.name);
        }
    }

    #[test]
    fn an_unknown_field_another_schema_or_an_empty_spec_is_refused() {
        let mut v: serde_json::Value = serde_json::from_str(&presets::llama().to_json()).expect("json");
        v["attention"]["softcap"] = 30.0.into();
        let err = DecoderSpec::from_json(&v.to_string()).expect_err("unknown field");
        assert!(err.to_string().contains("unknown field `softcap`"), "{err}");

        v = serde_json::from_str(&presets::llama().to_json()).expect("json");
        v["schema"] = 2.into();
        v["new_block"] = true.into();
        assert_eq!(DecoderSpec::from_json(&v.to_string()), Err(SpecError::Schema { found: 2 }));

        v = serde_json::from_str(&presets::llama().to_json()).expect("json");
        v["model_types"] = serde_json::json!([]);
        assert!(matches!(DecoderSpec::from_json(&v.to_string()), Err(SpecError::Incomplete { .. })));
        v["model_types"] = serde_json::json!(["x"]);
        v.as_object_mut().expect("object").remove("mlp");
        let err = DecoderSpec::from_json(&v.to_string()).expect_err("missing block");
        assert!(err.to_string().contains("missing field `mlp`"), "{err}");
    }
}
