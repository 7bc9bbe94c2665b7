//! The text architectures as declared data. A preset says what an
//! architecture fixes that its `config.json` leaves unsaid (which
//! projections carry biases, where the norms sit, how embeddings and
//! attention scores are scaled); [`crate::TextConfig::parse`] combines it
//! with the config's sizes into the spec the graph is built from. A new
//! architecture whose blocks the graph already has is one entry here.

use mlxcel_emit::RmsStyle;

/// How attention scores are scaled before the softmax.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnScale {
    /// `head_dim ** -0.5`.
    InverseSqrtHeadDim,
    /// `query_pre_attn_scalar ** -0.5`, which the config must give (Gemma).
    InverseSqrtQueryPreAttnScalar,
}

/// One architecture's fixed choices.
#[derive(Debug, PartialEq, Eq)]
pub struct Preset {
    /// The preset's name (the text `model_type` it is known by).
    pub name: &'static str,
    /// The `model_type` values it reads: text configs, and the `text_config`
    /// of the vision-language checkpoints whose language model it is.
    pub model_types: &'static [&'static str],
    /// q, k and v projections always carry biases; otherwise they do when
    /// the config's `attention_bias` says so.
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k before the rotary embedding.
    pub qk_norm: bool,
    /// Norms after attention and after the MLP as well as before them.
    pub sandwich_norms: bool,
    pub norm_style: RmsStyle,
    /// Token embeddings are multiplied by `sqrt(hidden)` (in f32).
    pub embed_scale_sqrt_hidden: bool,
    /// The LM head is tied to the embeddings when the config does not say.
    pub tied_by_default: bool,
    pub attn_scale: AttnScale,
    /// Sliding-window layers (`layer_types`, `use_sliding_window`) are part
    /// of the architecture; elsewhere they are refused.
    pub sliding_layers: bool,
}

/// Llama (and LLaVA's language model).
pub const LLAMA: Preset = Preset {
    name: "llama",
    model_types: &["llama"],
    qkv_bias: false,
    qk_norm: false,
    sandwich_norms: false,
    norm_style: RmsStyle::Plain,
    embed_scale_sqrt_hidden: false,
    tied_by_default: false,
    attn_scale: AttnScale::InverseSqrtHeadDim,
    sliding_layers: false,
};

/// Qwen2 (and the language model of Qwen2-VL and Qwen2.5-VL).
pub const QWEN2: Preset =
    Preset { name: "qwen2", model_types: &["qwen2", "qwen2_vl_text", "qwen2_5_vl_text"], qkv_bias: true, ..LLAMA };

/// Qwen3 (and Qwen3-VL's language model).
pub const QWEN3: Preset = Preset { name: "qwen3", model_types: &["qwen3", "qwen3_vl_text"], qk_norm: true, ..LLAMA };

/// Gemma 3 text: sliding and global layers with their own rotary
/// embeddings, q/k norms, sandwich norms, `(1 + w)` RMSNorm, embeddings
/// scaled by `sqrt(hidden)`.
pub const GEMMA3_TEXT: Preset = Preset {
    name: "gemma3_text",
    model_types: &["gemma3_text"],
    qkv_bias: false,
    qk_norm: true,
    sandwich_norms: true,
    norm_style: RmsStyle::OnePlus,
    embed_scale_sqrt_hidden: true,
    tied_by_default: true,
    attn_scale: AttnScale::InverseSqrtQueryPreAttnScalar,
    sliding_layers: true,
};

/// Every preset, in the order errors list them.
pub static PRESETS: [Preset; 4] = [LLAMA, QWEN2, QWEN3, GEMMA3_TEXT];

/// The preset that reads `model_type`.
pub fn for_model_type(model_type: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.model_types.contains(&model_type))
}

/// The model types some preset reads, for error messages.
pub fn model_types() -> String {
    PRESETS.iter().flat_map(|p| p.model_types.iter().copied()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_type_has_one_preset() {
        let mut seen = std::collections::BTreeSet::new();
        for p in &PRESETS {
            for t in p.model_types {
                assert!(seen.insert(*t), "{t} is read by two presets");
                assert_eq!(for_model_type(t).map(|q| q.name), Some(p.name));
            }
        }
        assert_eq!(for_model_type("gemma3n_text"), None);
    }
}
