//! The Youtu-VL vision tower as StableHLO, one module per bucket of patch rows:
//!
//! `main(pixel_values[B, P*P*3], patch_positions[B, 2], patch_segments[B]) -> image_features[B/m^2, H]`
//!
//! - the patch embedding, a biased `Linear` over each flattened patch (no position table: the
//!   tower's positions are rotary);
//! - per SigLIP2 layer: LayerNorm, attention (biased `q_proj`, `k_proj`, `v_proj`, `out_proj`)
//!   with Qwen2.5-VL's 2-D rotary embedding (theta 10000, each axis half the head), residual,
//!   LayerNorm, `fc1`, tanh GELU, `fc2`, residual;
//! - `post_layernorm`;
//! - the merger: RMSNorm `ln_q` (eps 1e-6), every `m^2` consecutive rows concatenated, Linear,
//!   exact GELU, Linear to the text width.
//!
//! Window attention is Qwen2.5-VL's, expressed as a mask as the Qwen2.5-VL plugin expresses it:
//! the reference (mlx-vlm's `Siglip2Encoder`) permutes the merged units into windows of
//! `window_size // merge // patch` units cut from each image's top-left corner, attends within
//! each window except in `fullatt_block_indexes` (within each image), and permutes back. Every
//! step but attention acts row by row and attention does not depend on the order of its rows,
//! so the graph keeps the processor's patch order and lets a row attend to the rows of its own
//! image and, in a windowed layer, its own window; only the order keys are summed in differs.
//!
//! Buckets, the per-row inputs and the masks are the Qwen-VL graphs'
//! ([`mlxcel_family_common::qwen_vl::vision`]).

use mlxcel_emit::{Func, Module, NumericContract, Value};
use mlxcel_family_common::qwen_vl::vision::{Signature, encoder_graph, image_keys, same_keys_mask, window_keys};
use mlxcel_family_common::vit::{
    AttentionOptions, Tower, declare_parameters, encoder_contract, pre_norm_layer_parameters, rotary_2d,
};
use mlxcel_plugin_api::{EncoderCompute, EncoderGraph, EncoderGraphRequest, EncoderTarget, PluginError};

use crate::config::{VISION_ROPE_THETA, YoutuVlConfig};

/// The tower's weights, by logical name (`vision_model/<path>`); the host resolves the root
/// (`siglip2.vision_model.` in the Hub's checkpoints).
const TOWER: &str = "vision_model/";
/// The merger's weights (`merger.` in the Hub's checkpoints, beside the tower).
const MERGER: &str = "merger/";
/// The merger's RMSNorm epsilon (`nn.RMSNorm(context_dim, eps=1e-6)`, not the config's).
const MERGER_EPS: f64 = 1e-6;

/// The graph's inputs beyond the shared ones (none) and its one output.
pub(crate) fn signature(config: &YoutuVlConfig) -> Signature {
    Signature::features(config.vision.out_hidden_size)
}

/// Checkpoint keys and shapes the graph reads, in declaration order.
pub(crate) fn parameters(config: &YoutuVlConfig) -> Vec<(String, Vec<usize>)> {
    let (v, g) = (&config.vision, &config.geometry);
    let (e, merged, out) = (v.hidden_size, v.hidden_size * g.merge_area(), v.out_hidden_size);
    let mut params = vec![
        (format!("{TOWER}embeddings.patch_embedding.weight"), vec![e, g.patch_width()]),
        (format!("{TOWER}embeddings.patch_embedding.bias"), vec![e]),
    ];
    for i in 0..v.num_layers {
        params.extend(pre_norm_layer_parameters(&format!("{TOWER}encoder.layers.{i}"), e, v.intermediate_size));
    }
    params.extend([
        (format!("{TOWER}post_layernorm.weight"), vec![e]),
        (format!("{TOWER}post_layernorm.bias"), vec![e]),
        (format!("{MERGER}ln_q.weight"), vec![e]),
        (format!("{MERGER}mlp.0.weight"), vec![merged, merged]),
        (format!("{MERGER}mlp.0.bias"), vec![merged]),
        (format!("{MERGER}mlp.2.weight"), vec![out, merged]),
        (format!("{MERGER}mlp.2.bias"), vec![out]),
    ]);
    params
}

pub(crate) fn graph(
    config: &YoutuVlConfig,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
) -> Result<EncoderGraph, PluginError> {
    let c = encoder_contract(target, EncoderCompute::F32);
    encoder_graph(config, &signature(config), request, &parameters(config), |n| emit(config, n, c))
}

/// Emits the module for a bucket of `n` patch rows.
fn emit(config: &YoutuVlConfig, n: usize, c: NumericContract) -> Result<String, mlxcel_emit::EmitError> {
    let (v, g) = (&config.vision, &config.geometry);
    let mut m = Module::new("youtu_vl_vision");
    let globals = declare_parameters(&mut m, &parameters(config), config.weights, &c);
    let tower = Tower { c, globals: &globals, prefix: TOWER, eps: v.layer_norm_eps };
    let merger = Tower { c, globals: &globals, prefix: MERGER, eps: MERGER_EPS };
    let (mut func, a) = m.func("main", &signature(config).argument_types(config, n));
    let f = &mut func;

    let mut x = tower.linear(f, &a[0], "embeddings.patch_embedding");
    let (cos, sin) = rotary_2d(f, &a[1], v.head_dim(), VISION_ROPE_THETA);
    let images = image_keys(f, &a[2]);
    let image_mask = same_keys_mask(f, &[&images]);
    let [window_row, window_col] = window_keys(f, &a[1], config.window_patches());
    let window_mask = same_keys_mask(f, &[&images, &window_row, &window_col]);
    for i in 0..v.num_layers {
        let mask = if v.fullatt_block_indexes.contains(&i) { &image_mask } else { &window_mask };
        let options = AttentionOptions { rotary: Some((&cos, &sin)), mask: Some(mask) };
        let layer = format!("encoder.layers.{i}");
        x = tower.pre_norm_layer_with(f, &x, &layer, v.num_heads, options, |f, h| c.gelu_tanh(f, h));
    }
    let x = tower.layer_norm(f, &x, "post_layernorm");
    let norm = |f: &mut Func, x: &Value| merger.rms_norm(f, x, "ln_q");
    let gelu = |f: &mut Func, x: &Value| c.gelu_erf(f, x);
    let out = merger.patch_merger(f, &x, g.merge_area(), norm, ["mlp.0", "mlp.2"], gelu);
    m.add_func(func, &[out]);
    m.finish()
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::decoder::{Index, TensorInfo, resolve_names};
    use mlxcel_plugin_api::{CheckpointIndex, DType, FamilyPlugin, Modality, TensorSpec};

    use super::*;
    use crate::YoutuVl;
    use crate::testing::{fixture, fixture_config};

    #[test]
    fn the_graph_emits_for_the_fixture_with_its_declared_signature() {
        let config = fixture_config();
        let request = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-64".into() };
        let g = graph(&config, &request, &EncoderTarget::unknown()).expect("graph");
        assert!(g.stablehlo.contains("func.func @main("), "{}", g.stablehlo);
        let shapes =
            |specs: &[TensorSpec]| specs.iter().map(|s| (s.name.to_string(), s.shape.to_vec())).collect::<Vec<_>>();
        assert_eq!(
            shapes(&g.inputs),
            [
                ("pixel_values".to_owned(), vec![64, 768]),
                ("patch_positions".to_owned(), vec![64, 2]),
                ("patch_segments".to_owned(), vec![64])
            ]
        );
        assert_eq!(shapes(&g.outputs), [("image_features".to_owned(), vec![16, 64])]);
        assert_eq!(g.parameters.len(), 2 + 16 * 2 + 7);
        assert!(g.parameters.iter().all(|p| p.dtype == DType::F32));
        assert!(g.stablehlo.contains("\"model\"::\"vision_model/encoder.layers.1.self_attn.q_proj.bias\""));
        assert!(g.stablehlo.contains("\"model\"::\"merger/mlp.2.weight|tile32\""));
        let bad = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-65".into() };
        assert!(graph(&config, &bad, &EncoderTarget::unknown()).is_err());
        let buckets = YoutuVl::encoder_buckets(&config, Modality::Image).expect("buckets");
        // Up to 1280 merged units of 4 patches.
        assert_eq!(buckets.last().map(|b| b.id.to_string()), Some("patches-6144".to_owned()));
    }

    /// The logical names resolve to the fixture's Hugging Face keys, each label under one root,
    /// and so do they in transformers 5's layout (everything under `model.`); the default check
    /// finds every tensor as declared.
    #[test]
    fn the_labels_resolve_on_the_fixture_unambiguously() {
        let config = fixture_config();
        let tensors = fixture().checkpoint_tensors().expect("tensors");
        let names = parameters(&config);
        let resolve = |prefix: &str| {
            let index: Index = tensors
                .iter()
                .map(|(k, (dtype, shape))| {
                    (format!("{prefix}{k}"), TensorInfo { dtype: dtype.clone(), shape: shape.clone() })
                })
                .collect();
            resolve_names(&index, names.iter().map(|(n, _)| n.as_str())).expect("resolved")
        };
        for prefix in ["", "model."] {
            let keys = resolve(prefix);
            assert_eq!(
                keys["vision_model/embeddings.patch_embedding.weight"],
                format!("{prefix}siglip2.vision_model.embeddings.patch_embedding.weight")
            );
            assert_eq!(keys["merger/ln_q.weight"], format!("{prefix}merger.ln_q.weight"));
        }
        let index = CheckpointIndex {
            tensors: tensors
                .iter()
                .map(|(k, (_, shape))| {
                    TensorSpec::new(k, DType::F32, &shape.iter().map(|&d| d as u64).collect::<Vec<_>>())
                })
                .collect(),
        };
        let report = YoutuVl::check_checkpoint(&config, &index).expect("checked");
        assert!(report.problems.is_empty(), "{:?}", report.problems);
    }
}
