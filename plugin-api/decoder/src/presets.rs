//! The library's own text architectures, as [`DecoderSpec`]s. A checkpoint
//! whose family plugin brings no spec is read with the preset whose
//! `model_types` hold its text `model_type`. A new architecture whose blocks
//! the graph already has is one function here (or a spec in its plugin).

use crate::spec::{
    Attention, AttentionKind, AttnScale, DecoderSpec, EmbedScale, Embedding, Head, Mlp, NormPlacement, Norms, QkvBias,
    RmsStyle, SPEC_SCHEMA,
};

fn types(names: &[&str]) -> Vec<String> {
    names.iter().map(|&n| n.to_owned()).collect()
}

/// Llama (and LLaVA's language model).
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
            scale: AttnScale::InverseSqrtHeadDim,
            sliding_layers: false,
        },
        mlp: Mlp::Gated,
        head: Head { tied_by_default: false, final_softcapping: false },
        injected_layers: 0,
    }
}

/// Qwen2 (and the language model of Qwen2-VL and Qwen2.5-VL): q, k and v always biased.
pub fn qwen2() -> DecoderSpec {
    let base = llama();
    DecoderSpec {
        name: "qwen2".into(),
        model_types: types(&["qwen2", "qwen2_vl_text", "qwen2_5_vl_text"]),
        attention: Attention { qkv_bias: QkvBias::Always, ..base.attention },
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
        ..base
    }
}

/// Gemma 3 text: sliding and global layers with their own rotary
/// embeddings, q/k norms, sandwich norms, `(1 + w)` RMSNorm, embeddings
/// scaled by `sqrt(hidden)`, scores by `query_pre_attn_scalar`, a tied head,
/// the final logits soft-capped when the config gives a cap.
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
            scale: AttnScale::InverseSqrtQueryPreAttnScalar,
            sliding_layers: true,
        },
        mlp: Mlp::Gated,
        // Gemma3ForCausalLM caps the final logits when the config says so.
        head: Head { tied_by_default: true, final_softcapping: true },
        injected_layers: 0,
    }
}

/// Every preset, in the order errors list them.
pub fn all() -> [DecoderSpec; 4] {
    [llama(), qwen2(), qwen3(), gemma3_text()]
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
        assert_eq!(for_model_type("gemma3n_text"), None);
    }
}
