//! The vision tower as StableHLO, one module per bucket of patch rows:
//!
//! `main(pixel_values[B, C*T*P*P], patch_positions[B, 2], patch_segments[B]) -> image_features[B/m^2, H]`
//!
//! - the patch embedding (a Conv3d whose stride is its kernel) as one matmul with the
//!   checkpoint's `[embed, C, T, P, P]` kernel reshaped to `[embed, C*T*P*P]`;
//! - per block: LayerNorm, attention with the 2-D rotary embedding on q and k (each head's
//!   dimensions split into h and w frequency halves, duplicated as `rotate_half` expects) and
//!   a mask that keeps each row within its own image (segment), LayerNorm, the MLP;
//! - `PatchMerger`: LayerNorm, every `m^2` consecutive rows concatenated, Linear, exact GELU,
//!   Linear to the text width.
//!
//! Buckets, inputs and the image mask are the Qwen-VL families' shared ones
//! ([`mlxcel_family_common::qwen_vl::vision`]).

use mlxcel_emit::{Elem, Func, Module, NumericContract, Value};
use mlxcel_family_common::qwen_vl::vision::{Signature, encoder_graph, image_keys, same_keys_mask};
use mlxcel_family_common::vit::{Tower, bf16_on_bf16_weights, declare_parameters, encoder_contract, rotary_2d};
use mlxcel_plugin_api::{EncoderCompute, EncoderGraph, EncoderGraphRequest, EncoderTarget, PluginError};

use crate::config::Qwen2VlConfig;

/// The vision weights, by logical name (`visual/<path below the vision model>`); the host
/// resolves the root (`visual.` in hub checkpoints, `model.visual.` in transformers 5's).
const PREFIX: &str = "visual/";
const LN_EPS: f64 = 1e-6;

/// The graph's inputs beyond the shared ones (none) and its one output.
pub(crate) fn signature(config: &Qwen2VlConfig) -> Signature {
    Signature::features(config.vision.hidden_size)
}

/// Checkpoint keys and shapes the graph reads, in declaration order.
pub(crate) fn parameters(config: &Qwen2VlConfig) -> Vec<(String, Vec<usize>)> {
    let (v, g) = (&config.vision, &config.qwen.geometry);
    let (e, mlp, merged) = (v.embed_dim, v.mlp_dim(), v.embed_dim * g.merge_area());
    let p = g.patch_size;
    let mut out =
        vec![(format!("{PREFIX}patch_embed.proj.weight"), vec![e, g.in_channels, g.temporal_patch_size, p, p])];
    for i in 0..v.depth {
        let n = |s: &str| format!("{PREFIX}blocks.{i}.{s}");
        out.extend([
            (n("norm1.weight"), vec![e]),
            (n("norm1.bias"), vec![e]),
            (n("attn.qkv.weight"), vec![3 * e, e]),
            (n("attn.qkv.bias"), vec![3 * e]),
            (n("attn.proj.weight"), vec![e, e]),
            (n("attn.proj.bias"), vec![e]),
            (n("norm2.weight"), vec![e]),
            (n("norm2.bias"), vec![e]),
            (n("mlp.fc1.weight"), vec![mlp, e]),
            (n("mlp.fc1.bias"), vec![mlp]),
            (n("mlp.fc2.weight"), vec![e, mlp]),
            (n("mlp.fc2.bias"), vec![e]),
        ]);
    }
    out.extend([
        (format!("{PREFIX}merger.ln_q.weight"), vec![e]),
        (format!("{PREFIX}merger.ln_q.bias"), vec![e]),
        (format!("{PREFIX}merger.mlp.0.weight"), vec![merged, merged]),
        (format!("{PREFIX}merger.mlp.0.bias"), vec![merged]),
        (format!("{PREFIX}merger.mlp.2.weight"), vec![v.hidden_size, merged]),
        (format!("{PREFIX}merger.mlp.2.bias"), vec![v.hidden_size]),
    ]);
    out
}

pub(crate) fn graph(
    config: &Qwen2VlConfig,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
    compute: EncoderCompute,
) -> Result<EncoderGraph, PluginError> {
    bf16_on_bf16_weights(compute, config.qwen.weights, "qwen2_vl")?;
    let c = encoder_contract(target, compute);
    encoder_graph(&config.qwen, &signature(config), request, &parameters(config), |n| emit(config, n, c))
}

/// Emits the module for a bucket of `n` patch rows.
pub(crate) fn emit(config: &Qwen2VlConfig, n: usize, c: NumericContract) -> Result<String, mlxcel_emit::EmitError> {
    let (v, g) = (&config.vision, &config.qwen.geometry);
    let mut m = Module::new("qwen2_vl_vision");
    let globals = declare_parameters(&mut m, &parameters(config), config.qwen.weights, &c);
    let tower = Tower { c, globals: &globals, prefix: PREFIX, eps: LN_EPS };
    let width = g.patch_width();
    let args = signature(config).argument_types(&config.qwen, n);
    let (mut func, a) = m.func("main", &args);
    let f = &mut func;

    let kernel = tower.t(f, "patch_embed.proj.weight");
    let kernel = f.reshape(&kernel, &[v.embed_dim, width]);
    // The reference casts the pixels to the kernel's dtype before the convolution.
    let pixels = c.round(f, &a[0]);
    let mut x = c.linear(f, &pixels, &kernel, None);
    let (cos, sin) = rotary_2d(f, &a[1], v.head_dim(), v.rope_theta);
    let images = image_keys(f, &a[2]);
    let mask = same_keys_mask(f, &[&images]);
    for i in 0..v.depth {
        let h = tower.layer_norm(f, &x, &format!("blocks.{i}.norm1"));
        let attn = tower.rotary_attention(f, &h, &format!("blocks.{i}.attn"), v.num_heads, (&cos, &sin), &mask);
        x = c.residual(f, &x, &attn);
        let h = tower.layer_norm(f, &x, &format!("blocks.{i}.norm2"));
        let h = tower.linear(f, &h, &format!("blocks.{i}.mlp.fc1"));
        let h = v.hidden_act.apply(c, f, &h);
        let h = tower.linear(f, &h, &format!("blocks.{i}.mlp.fc2"));
        x = c.residual(f, &x, &h);
    }
    let norm = |f: &mut Func, x: &Value| tower.layer_norm(f, x, "merger.ln_q");
    let gelu = |f: &mut Func, x: &Value| c.gelu_erf(f, x);
    let out = tower.patch_merger(f, &x, g.merge_area(), norm, ["merger.mlp.0", "merger.mlp.2"], gelu);
    // The features leave in f32 whatever the compute: widening bf16 is exact.
    let out = f.convert(&out, Elem::F32);
    m.add_func(func, &[out]);
    m.finish()
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::Modality;

    use super::*;
    use crate::testing::fixture_config;

    #[test]
    fn the_graph_emits_for_the_fixture_with_its_declared_signature() {
        let config = fixture_config();
        let request = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-64".into() };
        let g = graph(&config, &request, &EncoderTarget::unknown(), EncoderCompute::F32).expect("graph");
        assert!(g.stablehlo.contains("func.func @main("), "{}", g.stablehlo);
        assert_eq!(g.outputs[0].shape.as_slice(), &[16, 64]);
        assert_eq!(g.parameters.len(), 1 + 12 * 2 + 6);
        assert!(g.stablehlo.contains("\"model\"::\"visual/merger.mlp.2.bias\""));
        let bad = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-65".into() };
        assert!(graph(&config, &bad, &EncoderTarget::unknown(), EncoderCompute::F32).is_err());
    }

    /// bf16 compute is offered on a bf16 checkpoint only, and its features still leave in f32.
    #[test]
    fn bf16_compute_is_offered_on_a_bf16_checkpoint_only() {
        let mut config = fixture_config();
        let request = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-64".into() };
        let err = graph(&config, &request, &EncoderTarget::unknown(), EncoderCompute::Bf16Pairs)
            .expect_err("an f32 checkpoint");
        assert!(err.message.contains("on a bf16 checkpoint only"), "{}", err.message);
        config.qwen.weights = mlxcel_family_common::config::WeightDtype::BF16;
        let g = graph(&config, &request, &EncoderTarget::unknown(), EncoderCompute::Bf16Pairs).expect("bf16");
        let f32_graph = graph(&config, &request, &EncoderTarget::unknown(), EncoderCompute::F32).expect("f32");
        assert_ne!(g.stablehlo, f32_graph.stablehlo);
        assert!(g.stablehlo.contains("linalg.mmt4d"), "bf16 weights in the pair tiles");
        assert_eq!(g.outputs[0].dtype, mlxcel_plugin_api::DType::F32);
        assert!(g.stablehlo.contains("-> tensor<16x64xf32>"), "the features widened to f32");
    }
}
