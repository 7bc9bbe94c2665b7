//! The Qwen3-VL vision tower as StableHLO, one module per bucket of patch rows:
//!
//! `main(pixel_values[B, C*T*P*P], patch_positions[B, 2], patch_segments[B], pos_taps[B, 4],
//! pos_weights[B, 4]) -> (image_features[B/m^2, H], deepstack_features.0[B/m^2, H], ...)`
//!
//! - the patch embedding (a Conv3d whose stride is its kernel, biased) as one matmul, plus the
//!   learned position embedding resampled to the image's grid: the four table rows of each
//!   patch (`pos_taps`) weighted (`pos_weights`) and summed in tap order;
//! - per block: LayerNorm, attention with the 2-D rotary embedding within each image, residual,
//!   LayerNorm, `linear_fc1`, the activation, `linear_fc2`, residual;
//! - after each block of `deepstack_visual_indexes`, a DeepStack merger on its output: every
//!   `m^2` consecutive rows concatenated, then LayerNorm (over the concatenation), Linear, exact
//!   GELU, Linear to the text width;
//! - the merger on the last block's output: LayerNorm, the rows concatenated, Linear, exact GELU,
//!   Linear.
//!
//! Buckets, the shared inputs and the image mask are the Qwen-VL families'
//! ([`mlxcel_family_common::qwen_vl::vision`]).

use mlxcel_emit::{Func, Module, NumericContract, Value};
use mlxcel_family_common::qwen_vl::vision::{FEATURES, RowInput, Signature, encoder_graph, image_keys, same_keys_mask};
use mlxcel_family_common::vit::{Tower, declare_parameters, encoder_contract, rotary_2d};
use mlxcel_plugin_api::{DType, EncoderCompute, EncoderGraph, EncoderGraphRequest, EncoderTarget, PluginError};

use crate::config::Qwen3VlConfig;
use crate::processor::{POS_TAPS, POS_WEIGHTS};

/// The vision weights, by logical name (`visual/<path below the vision model>`); the host
/// resolves the root (`model.visual.` in transformers' checkpoints, `visual.` in older ones).
const PREFIX: &str = "visual/";
/// Every LayerNorm's epsilon in the tower (`nn.LayerNorm(..., eps=1e-6)`).
const LN_EPS: f64 = 1e-6;
/// Taps of the bilinear position resample.
const TAPS: usize = 4;

/// The name of the k-th DeepStack output, added to text layer k's output.
pub(crate) fn deepstack_output(k: usize) -> String {
    format!("deepstack_features.{k}")
}

/// The position-table inputs beyond the shared ones; the features and one DeepStack output
/// per `deepstack_visual_indexes` entry.
pub(crate) fn signature(config: &Qwen3VlConfig) -> Signature {
    let v = &config.vision;
    let mut outputs = vec![FEATURES.to_owned()];
    outputs.extend((0..v.deepstack_visual_indexes.len()).map(deepstack_output));
    Signature {
        extra_inputs: vec![
            RowInput { name: POS_TAPS, dtype: DType::I32, width: TAPS },
            RowInput { name: POS_WEIGHTS, dtype: DType::F32, width: TAPS },
        ],
        outputs,
        width: v.out_hidden_size,
    }
}

/// Checkpoint keys and shapes the graph reads, in declaration order.
pub(crate) fn parameters(config: &Qwen3VlConfig) -> Vec<(String, Vec<usize>)> {
    let (v, g) = (&config.vision, &config.qwen.geometry);
    let (e, mlp, merged, out) = (v.hidden_size, v.intermediate_size, v.hidden_size * g.merge_area(), v.out_hidden_size);
    let p = g.patch_size;
    let mut params = vec![
        (format!("{PREFIX}patch_embed.proj.weight"), vec![e, g.in_channels, g.temporal_patch_size, p, p]),
        (format!("{PREFIX}patch_embed.proj.bias"), vec![e]),
        (format!("{PREFIX}pos_embed.weight"), vec![v.num_position_embeddings, e]),
    ];
    for i in 0..v.depth {
        let n = |s: &str| format!("{PREFIX}blocks.{i}.{s}");
        params.extend([
            (n("norm1.weight"), vec![e]),
            (n("norm1.bias"), vec![e]),
            (n("attn.qkv.weight"), vec![3 * e, e]),
            (n("attn.qkv.bias"), vec![3 * e]),
            (n("attn.proj.weight"), vec![e, e]),
            (n("attn.proj.bias"), vec![e]),
            (n("norm2.weight"), vec![e]),
            (n("norm2.bias"), vec![e]),
            (n("mlp.linear_fc1.weight"), vec![mlp, e]),
            (n("mlp.linear_fc1.bias"), vec![mlp]),
            (n("mlp.linear_fc2.weight"), vec![e, mlp]),
            (n("mlp.linear_fc2.bias"), vec![e]),
        ]);
    }
    let merger = |name: &str, norm: usize| {
        let n = |s: &str| format!("{PREFIX}{name}.{s}");
        [
            (n("norm.weight"), vec![norm]),
            (n("norm.bias"), vec![norm]),
            (n("linear_fc1.weight"), vec![merged, merged]),
            (n("linear_fc1.bias"), vec![merged]),
            (n("linear_fc2.weight"), vec![out, merged]),
            (n("linear_fc2.bias"), vec![out]),
        ]
    };
    params.extend(merger("merger", e));
    for k in 0..v.deepstack_visual_indexes.len() {
        params.extend(merger(&format!("deepstack_merger_list.{k}"), merged));
    }
    params
}

pub(crate) fn graph(
    config: &Qwen3VlConfig,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
) -> Result<EncoderGraph, PluginError> {
    let c = encoder_contract(target, EncoderCompute::F32);
    encoder_graph(&config.qwen, &signature(config), request, &parameters(config), |n| emit(config, n, c))
}

/// The learned position embedding of each row: its taps' table rows times their weights,
/// summed in tap order (`(pos_embed(taps) * weights[..., None]).sum(1)`).
fn position_embedding(tower: &Tower, f: &mut Func, taps: &Value, weights: &Value) -> Value {
    let n = taps.shape()[0];
    let table = tower.t(f, "pos_embed.weight");
    let e = table.shape()[1];
    let flat = f.reshape(taps, &[n * TAPS]);
    let rows = f.gather_rows(&table, &flat);
    let rows = f.reshape(&rows, &[n, TAPS, e]);
    let wb = f.broadcast(weights, &[n, TAPS, e], &[0, 1]);
    let weighted = f.mul(&rows, &wb);
    let mut sum: Option<Value> = None;
    for k in 0..TAPS {
        let one = f.slice(&weighted, &[0, k, 0], &[n, k + 1, e]);
        let one = f.reshape(&one, &[n, e]);
        sum = Some(match sum {
            Some(acc) => f.add(&acc, &one),
            None => one,
        });
    }
    sum.expect("invariant: four taps")
}

/// A DeepStack merger: the rows of each merge group concatenated, then normalised.
fn deepstack_merger(tower: &Tower, c: NumericContract, f: &mut Func, x: &Value, area: usize, k: usize) -> Value {
    let (n, e) = (x.shape()[0], x.shape()[1]);
    let name = format!("deepstack_merger_list.{k}");
    let h = f.reshape(x, &[n / area, e * area]);
    let h = tower.layer_norm(f, &h, &format!("{name}.norm"));
    let h = tower.linear(f, &h, &format!("{name}.linear_fc1"));
    let h = c.gelu_erf(f, &h);
    tower.linear(f, &h, &format!("{name}.linear_fc2"))
}

/// Emits the module for a bucket of `n` patch rows.
pub(crate) fn emit(config: &Qwen3VlConfig, n: usize, c: NumericContract) -> Result<String, mlxcel_emit::EmitError> {
    let (v, g) = (&config.vision, &config.qwen.geometry);
    let mut m = Module::new("qwen3_vl_vision");
    let globals = declare_parameters(&mut m, &parameters(config), config.qwen.weights, &c);
    let tower = Tower { c, globals: &globals, prefix: PREFIX, eps: LN_EPS };
    let (mut func, a) = m.func("main", &signature(config).argument_types(&config.qwen, n));
    let f = &mut func;

    let kernel = tower.t(f, "patch_embed.proj.weight");
    let kernel = f.reshape(&kernel, &[v.hidden_size, g.patch_width()]);
    let bias = tower.t(f, "patch_embed.proj.bias");
    let x = c.linear(f, &a[0], &kernel, Some(&bias));
    let pos = position_embedding(&tower, f, &a[3], &a[4]);
    let mut x = f.add(&x, &pos);
    let (cos, sin) = rotary_2d(f, &a[1], v.head_dim(), v.rope_theta);
    let images = image_keys(f, &a[2]);
    let mask = same_keys_mask(f, &[&images]);
    let mut deepstack = Vec::with_capacity(v.deepstack_visual_indexes.len());
    for i in 0..v.depth {
        let h = tower.layer_norm(f, &x, &format!("blocks.{i}.norm1"));
        let attn = tower.rotary_attention(f, &h, &format!("blocks.{i}.attn"), v.num_heads, (&cos, &sin), &mask);
        x = c.residual(f, &x, &attn);
        let h = tower.layer_norm(f, &x, &format!("blocks.{i}.norm2"));
        let h = tower.linear(f, &h, &format!("blocks.{i}.mlp.linear_fc1"));
        let h = v.hidden_act.apply(c, f, &h);
        let h = tower.linear(f, &h, &format!("blocks.{i}.mlp.linear_fc2"));
        x = c.residual(f, &x, &h);
        if let Some(k) = v.deepstack_visual_indexes.iter().position(|&d| d == i) {
            deepstack.push(deepstack_merger(&tower, c, f, &x, g.merge_area(), k));
        }
    }
    let norm = |f: &mut Func, x: &Value| tower.layer_norm(f, x, "merger.norm");
    let gelu = |f: &mut Func, x: &Value| c.gelu_erf(f, x);
    let features = tower.patch_merger(f, &x, g.merge_area(), norm, ["merger.linear_fc1", "merger.linear_fc2"], gelu);
    let mut outputs = vec![features];
    outputs.extend(deepstack);
    m.add_func(func, &outputs);
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
        let g = graph(&config, &request, &EncoderTarget::unknown()).expect("graph");
        assert!(g.stablehlo.contains("func.func @main("), "{}", g.stablehlo);
        let names: Vec<&str> = g.outputs.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["image_features", "deepstack_features.0", "deepstack_features.1"]);
        assert_eq!(g.outputs[2].shape.as_slice(), &[16, 64]);
        assert_eq!(g.inputs.len(), 5);
        assert_eq!(g.parameters.len(), 3 + 12 * 2 + 6 * 3);
        let bad = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-65".into() };
        assert!(graph(&config, &bad, &EncoderTarget::unknown()).is_err());
    }
}
