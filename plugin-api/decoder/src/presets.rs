//! The library's own text architectures, as [`DecoderSpec`]s. A checkpoint
//! whose family plugin brings no spec is read with the preset whose
//! `model_types` hold its text `model_type`. A new architecture whose blocks
//! the graph already has is one function here (or a spec in its plugin).

use crate::spec::{
    Attention, AttentionKind, AttnScale, Augmentations, DecoderSpec, EmbedScale, Embedding, Head, Mlp, NormPlacement,
    Norms, QkNormScope, QkvBias, RmsStyle, SPEC_SCHEMA, WeightLayout,
};

fn types(names: &[&str]) -> Vec<String> {
    names.iter().map(|&n| n.to_owned()).collect()
}

/// A config class's defaults as a JSON object.
fn defaults(value: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match value {
        serde_json::Value::Object(map) => map,
        _ => unreachable!("invariant: the defaults are written as an object"),
    }
}

/// Llama (and LLaVA's language model). A sparse text config (LLaVA 1.5's on the Hub gives
/// little more than its vocabulary) takes `LlamaConfig`'s defaults.
pub fn llama() -> DecoderSpec {
    DecoderSpec {
        schema: SPEC_SCHEMA,
        name: "llama".into(),
        model_types: types(&["llama"]),
        embedding: Embedding { scale: EmbedScale::None },
        norms: Norms { style: RmsStyle::Plain, placement: NormPlacement::Pre },
        attention: Attention {
            kind: AttentionKind::GroupedQuery,
            qkv_bias: QkvBias::FromConfig,
            qk_norm: false,
            qk_norm_scope: QkNormScope::PerHead,
            scale: AttnScale::InverseSqrtHeadDim,
            sliding_layers: false,
            sliding_pattern: None,
            v_norm: false,
            rope_per_kind: false,
        },
        mlp: Mlp::Gated,
        head: Head { tied_by_default: false, final_softcapping: false },
        // transformers 5.24 `LlamaConfig`.
        config_defaults: defaults(serde_json::json!({
            "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 32, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "tie_word_embeddings": false, "attention_bias": false,
        })),
        injected_layers: 0,
        weights: WeightLayout::Transformers,
        config_aliases: Default::default(),
        intermediate_counts_fused: false,
        augmentations: Augmentations::default(),
    }
}

/// The defaults `Qwen2Config`, `Qwen3Config` and the Qwen-VL text configs share (their
/// sizes, norm epsilons and rotary bases differ, so a config must give those, or the family's
/// plugin brings the spec with its own class's defaults).
fn qwen_defaults() -> serde_json::Map<String, serde_json::Value> {
    defaults(serde_json::json!({"hidden_act": "silu", "use_sliding_window": false}))
}

/// Qwen2 (and the language model of Qwen2-VL and Qwen2.5-VL): q, k and v always biased.
pub fn qwen2() -> DecoderSpec {
    let base = llama();
    DecoderSpec {
        name: "qwen2".into(),
        model_types: types(&["qwen2", "qwen2_vl_text", "qwen2_5_vl_text"]),
        attention: Attention { qkv_bias: QkvBias::Always, ..base.attention },
        config_defaults: qwen_defaults(),
        ..base
    }
}

/// Qwen3 (and Qwen3-VL's language model): per-head q/k norms.
pub fn qwen3() -> DecoderSpec {
    let base = llama();
    DecoderSpec {
        name: "qwen3".into(),
        model_types: types(&["qwen3", "qwen3_vl_text"]),
        attention: Attention { qk_norm: true, ..base.attention },
        config_defaults: qwen_defaults(),
        ..base
    }
}

/// Gemma 3 text: sliding and global layers with their own rotary
/// embeddings, q/k norms, sandwich norms, `(1 + w)` RMSNorm, embeddings
/// scaled by `sqrt(hidden)`, scores by `query_pre_attn_scalar`, a tied head,
/// the final logits soft-capped when the config gives a cap. A config without `layer_types`
/// (the Hub's) slides every layer but each sixth, and its legacy rotary fields are read per
/// layer kind, as transformers converts them.
pub fn gemma3_text() -> DecoderSpec {
    DecoderSpec {
        schema: SPEC_SCHEMA,
        name: "gemma3_text".into(),
        model_types: types(&["gemma3_text"]),
        embedding: Embedding { scale: EmbedScale::SqrtHidden },
        norms: Norms { style: RmsStyle::OnePlus, placement: NormPlacement::Sandwich },
        attention: Attention {
            kind: AttentionKind::GroupedQuery,
            qkv_bias: QkvBias::FromConfig,
            qk_norm: true,
            qk_norm_scope: QkNormScope::PerHead,
            scale: AttnScale::InverseSqrtQueryPreAttnScalar,
            sliding_layers: true,
            sliding_pattern: Some(6),
            v_norm: false,
            rope_per_kind: true,
        },
        mlp: Mlp::Gated,
        // Gemma3ForCausalLM caps the final logits when the config says so.
        head: Head { tied_by_default: true, final_softcapping: true },
        // transformers 5.24 `Gemma3TextConfig` (its `default_theta`: global 1e6, local 1e4).
        config_defaults: defaults(serde_json::json!({
            "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
            "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
            "attention_bias": false, "query_pre_attn_scalar": 256, "sliding_window": 4096,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        })),
        injected_layers: 0,
        weights: WeightLayout::Transformers,
        config_aliases: Default::default(),
        intermediate_counts_fused: false,
        augmentations: Augmentations::default(),
    }
}

/// Youtu-LLM (transformers' `youtu`, and Youtu-VL's language model): Llama's blocks with
/// multi-head latent attention, a tied head by default.
pub fn youtu() -> DecoderSpec {
    let base = llama();
    DecoderSpec {
        name: "youtu".into(),
        model_types: types(&["youtu"]),
        attention: Attention { kind: AttentionKind::MultiHeadLatent, ..base.attention },
        head: Head { tied_by_default: true, final_softcapping: false },
        // transformers 5.24 `YoutuConfig`.
        config_defaults: defaults(serde_json::json!({
            "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 32,
            "num_attention_heads": 16, "num_key_value_heads": 16, "kv_lora_rank": 512, "q_lora_rank": 1536,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "hidden_act": "silu",
            "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "rope_interleave": true, "attention_bias": false,
        })),
        ..base
    }
}

/// Gemma 3n text (`gemma3n_text`, the language model of Gemma 3n): Gemma 3's sliding and global
/// layers (every fifth global by default), q/k norms and a scaleless v norm, unscaled scores,
/// sandwich norms with plain weights, wrapped in AltUp streams with a LAuReL branch, per-layer
/// inputs, KV sharing in the last layers and activation sparsity in the first; the final logits
/// soft-capped.
pub fn gemma3n_text() -> DecoderSpec {
    let base = gemma3_text();
    DecoderSpec {
        name: "gemma3n_text".into(),
        model_types: types(&["gemma3n_text"]),
        norms: Norms { style: RmsStyle::Plain, placement: NormPlacement::Sandwich },
        attention: Attention { scale: AttnScale::One, v_norm: true, sliding_pattern: Some(5), ..base.attention },
        // transformers 5.24 `Gemma3nTextConfig`.
        config_defaults: defaults(serde_json::json!({
            "vocab_size": 262400, "hidden_size": 2048, "intermediate_size": 16384, "num_hidden_layers": 35,
            "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
            "attention_bias": false, "sliding_window": 512, "final_logit_softcapping": 30.0,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "vocab_size_per_layer_input": 262144, "hidden_size_per_layer_input": 256, "altup_active_idx": 0,
            "altup_correct_scale": true, "altup_num_inputs": 4, "num_kv_shared_layers": 15, "laurel_rank": 64,
            "activation_sparsity_pattern": null,
        })),
        augmentations: Augmentations {
            altup: true,
            laurel: true,
            per_layer_inputs: true,
            kv_sharing: true,
            activation_sparsity: true,
        },
        ..base
    }
}

/// Every preset, in the order errors list them.
pub fn all() -> [DecoderSpec; 6] {
    [llama(), qwen2(), qwen3(), gemma3_text(), youtu(), gemma3n_text()]
}

/// The preset that reads `model_type`.
pub fn for_model_type(model_type: &str) -> Option<DecoderSpec> {
    all().into_iter().find(|p| p.reads(model_type))
}

/// The model types some preset reads, for error messages.
pub fn model_types() -> String {
    all().iter().flat_map(|p| p.model_types.clone()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_type_has_one_preset() {
        let mut seen = std::collections::BTreeSet::new();
        for p in all() {
            p.validate().expect("a preset is a valid spec");
            for t in &p.model_types {
                assert!(seen.insert(t.clone()), "{t} is read by two presets");
                assert_eq!(for_model_type(t).map(|q| q.name), Some(p.name.clone()));
            }
        }
        assert_eq!(for_model_type("gemma3n"), None);
    }
}
