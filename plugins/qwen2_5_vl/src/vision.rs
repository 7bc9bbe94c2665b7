//! The Qwen2.5-VL vision tower as StableHLO, one module per bucket of patch rows:
//!
//! `main(pixel_values[B, C*T*P*P], patch_positions[B, 2], patch_segments[B]) -> image_features[B/m^2, H]`
//!
//! - the patch embedding (a Conv3d whose stride is its kernel, no bias) as one matmul;
//! - per block: RMSNorm, attention with the 2-D rotary embedding, residual, RMSNorm, the gated
//!   MLP `down(act(gate(x)) * up(x))` (biased linears), residual;
//! - `Qwen2_5_VLPatchMerger`: RMSNorm, every `m^2` consecutive rows concatenated, Linear, exact
//!   GELU, Linear to the text width.
//!
//! Window attention. The reference permutes the merged units into window order, attends within
//! each window (`cu_window_seqlens`) except in `fullatt_block_indexes` (within each image), and
//! permutes the merger's output back. Every step but attention acts row by row, and attention
//! does not depend on the order of its rows, so the graph keeps the processor's patch order and
//! restricts attention with a mask instead: a row attends to the rows of its own image and, in
//! a windowed block, of its own window (the window its patch position falls in; the reference
//! cuts windows from each image's top-left corner and shortens the last ones). The only
//! difference from the reference is the order keys are summed in, which moves the last bits.
//! The cost is that windowed blocks compute the full `[B, B]` scores, masked.
//!
//! Buckets, inputs and the image mask are the Qwen-VL families' shared ones
//! ([`mlxcel_family_common::qwen_vl::vision`]).

use mlxcel_emit::{Elem, Func, Module, NumericContract, Value};
use mlxcel_family_common::qwen_vl::vision::{Signature, encoder_graph, image_keys, same_keys_mask, window_keys};
use mlxcel_family_common::vit::{Tower, bf16_on_bf16_weights, declare_parameters, encoder_contract, rotary_2d};
use mlxcel_plugin_api::{EncoderCompute, EncoderGraph, EncoderGraphRequest, EncoderTarget, PluginError};

use crate::config::Qwen25VlConfig;

/// The vision weights, by logical name (`visual/<path below the vision model>`); the host
/// resolves the root (`visual.` in Hub checkpoints, `model.visual.` in transformers 5's).
const PREFIX: &str = "visual/";
/// Every RMSNorm's epsilon in the tower (`Qwen2_5_VLRMSNorm(..., eps=1e-6)`).
const RMS_EPS: f64 = 1e-6;

/// The graph's inputs beyond the shared ones (none) and its one output.
pub(crate) fn signature(config: &Qwen25VlConfig) -> Signature {
    Signature::features(config.vision.out_hidden_size)
}

/// Checkpoint keys and shapes the graph reads, in declaration order.
pub(crate) fn parameters(config: &Qwen25VlConfig) -> Vec<(String, Vec<usize>)> {
    let (v, g) = (&config.vision, &config.qwen.geometry);
    let (e, mlp, merged) = (v.hidden_size, v.intermediate_size, v.hidden_size * g.merge_area());
    let p = g.patch_size;
    let mut out =
        vec![(format!("{PREFIX}patch_embed.proj.weight"), vec![e, g.in_channels, g.temporal_patch_size, p, p])];
    for i in 0..v.depth {
        let n = |s: &str| format!("{PREFIX}blocks.{i}.{s}");
        out.extend([
            (n("norm1.weight"), vec![e]),
            (n("attn.qkv.weight"), vec![3 * e, e]),
            (n("attn.qkv.bias"), vec![3 * e]),
            (n("attn.proj.weight"), vec![e, e]),
            (n("attn.proj.bias"), vec![e]),
            (n("norm2.weight"), vec![e]),
            (n("mlp.gate_proj.weight"), vec![mlp, e]),
            (n("mlp.gate_proj.bias"), vec![mlp]),
            (n("mlp.up_proj.weight"), vec![mlp, e]),
            (n("mlp.up_proj.bias"), vec![mlp]),
            (n("mlp.down_proj.weight"), vec![e, mlp]),
            (n("mlp.down_proj.bias"), vec![e]),
        ]);
    }
    out.extend([
        (format!("{PREFIX}merger.ln_q.weight"), vec![e]),
        (format!("{PREFIX}merger.mlp.0.weight"), vec![merged, merged]),
        (format!("{PREFIX}merger.mlp.0.bias"), vec![merged]),
        (format!("{PREFIX}merger.mlp.2.weight"), vec![v.out_hidden_size, merged]),
        (format!("{PREFIX}merger.mlp.2.bias"), vec![v.out_hidden_size]),
    ]);
    out
}

pub(crate) fn graph(
    config: &Qwen25VlConfig,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
    compute: EncoderCompute,
) -> Result<EncoderGraph, PluginError> {
    bf16_on_bf16_weights(compute, config.qwen.weights, "qwen2_5_vl")?;
    let c = encoder_contract(target, compute);
    encoder_graph(&config.qwen, &signature(config), request, &parameters(config), |n| emit(config, n, c))
}

/// Emits the module for a bucket of `n` patch rows.
pub(crate) fn emit(config: &Qwen25VlConfig, n: usize, c: NumericContract) -> Result<String, mlxcel_emit::EmitError> {
    let (v, g) = (&config.vision, &config.qwen.geometry);
    let mut m = Module::new("qwen2_5_vl_vision");
    let globals = declare_parameters(&mut m, &parameters(config), config.qwen.weights, &c);
    let tower = Tower { c, globals: &globals, prefix: PREFIX, eps: RMS_EPS };
    let width = g.patch_width();
    let args = signature(config).argument_types(&config.qwen, n);
    let (mut func, a) = m.func("main", &args);
    let f = &mut func;

    let kernel = tower.t(f, "patch_embed.proj.weight");
    let kernel = f.reshape(&kernel, &[v.hidden_size, width]);
    // The reference casts the pixels to the kernel's dtype before the convolution.
    let pixels = c.round(f, &a[0]);
    let mut x = c.linear(f, &pixels, &kernel, None);
    let (cos, sin) = rotary_2d(f, &a[1], v.head_dim(), v.rope_theta);
    let images = image_keys(f, &a[2]);
    let image_mask = same_keys_mask(f, &[&images]);
    let [window_row, window_col] = window_keys(f, &a[1], config.window_patches());
    let window_mask = same_keys_mask(f, &[&images, &window_row, &window_col]);
    for i in 0..v.depth {
        let mask = if v.fullatt_block_indexes.contains(&i) { &image_mask } else { &window_mask };
        let h = tower.rms_norm(f, &x, &format!("blocks.{i}.norm1"));
        let attn = tower.rotary_attention(f, &h, &format!("blocks.{i}.attn"), v.num_heads, (&cos, &sin), mask);
        x = c.residual(f, &x, &attn);
        let h = tower.rms_norm(f, &x, &format!("blocks.{i}.norm2"));
        let gate = tower.linear(f, &h, &format!("blocks.{i}.mlp.gate_proj"));
        let gate = v.hidden_act.apply(c, f, &gate);
        let up = tower.linear(f, &h, &format!("blocks.{i}.mlp.up_proj"));
        let h = c.act_mul(f, &gate, &up);
        let h = tower.linear(f, &h, &format!("blocks.{i}.mlp.down_proj"));
        x = c.residual(f, &x, &h);
    }
    let norm = |f: &mut Func, x: &Value| tower.rms_norm(f, x, "merger.ln_q");
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
        assert_eq!(g.parameters.len(), 1 + 12 * 2 + 5);
        assert!(g.stablehlo.contains("\"model\"::\"visual/blocks.1.mlp.gate_proj.bias\""));
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
