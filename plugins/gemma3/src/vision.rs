//! The SigLIP vision tower and Gemma3's average-pool projector as StableHLO, one image per call:
//!
//! `main(pixel_values[1, 3, S, S]) -> image_features[mm_tokens_per_image, text_hidden]`
//!
//! - the patch embedding (a Conv2d whose stride is its kernel) as one matmul: the image cut into
//!   `P x P` patches of `C*p*p` values in the kernel's `(c, y, x)` order, against the
//!   checkpoint's `[hidden, C, p, p]` kernel reshaped to `[hidden, C*p*p]`, plus its bias;
//!   then the learned position embedding of every patch (no interpolation: the processor
//!   resizes to the tower's size);
//! - per encoder layer: LayerNorm, multi-head attention over all patches (q, k, v and out
//!   projections with biases; scores scaled by `head_dim^-0.5` after the product, softmax in
//!   f32), residual; LayerNorm, `fc1`, `gelu_pytorch_tanh`, `fc2`, residual;
//! - `post_layernorm`;
//! - `Gemma3MultiModalProjector`: the `[P*P, hidden]` rows viewed as the `P x P` patch grid and
//!   average-pooled with a `k x k` kernel and stride (`AvgPool2d`, `k = P / tokens_per_side`):
//!   the window summed in row-major order as torch's CPU kernel does, then divided by `k*k`;
//!   Gemma's RMSNorm (`(1 + w)`, `mm_soft_emb_norm`); the product with
//!   `mm_input_projection_weight` `[hidden, text_hidden]` (a plain matmul, no transpose).
//!
//! The output rows are the pooled grid in row-major order, as `flatten(2).transpose(1, 2)`
//! gives them; every image is exactly `mm_tokens_per_image` rows.

use mlxcel_emit::{Elem, Func, Module, NumericContract, RmsStyle, Type, Value};
use mlxcel_family_common::vit::{
    Tower, avg_pool_grid, declare_parameters, encoder_contract, parameter_specs, pre_norm_layer_parameters,
};
use mlxcel_plugin_api::{
    DType, EncoderCompute, EncoderGraph, EncoderGraphRequest, EncoderTarget, ErrorCode, Modality, PluginError,
    ShapeBucket, TensorSpec,
};

use crate::config::Gemma3Config;
use crate::processor::PIXEL_VALUES;

/// The graph's output, placed by the contract.
pub(crate) const FEATURES: &str = "image_features";
/// The tower's and the projector's weights, by logical name (`label/path`, the path as the
/// reference names the tensor below its module); the host resolves each module's root.
const TOWER: &str = "vision_tower/";
const PROJECTOR: &str = "multi_modal_projector/";
/// The one bucket: a single image at the tower's size.
const BUCKET: &str = "image-1";

fn input(config: &Gemma3Config) -> TensorSpec {
    let s = config.vision.image_size as u64;
    TensorSpec::new(PIXEL_VALUES, DType::F32, &[1, config.vision.num_channels as u64, s, s])
}

/// Every image is resized to the tower's size, so one bucket of one image serves all; several
/// images are encoded one call each.
pub(crate) fn buckets(config: &Gemma3Config, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
    if modality != Modality::Image {
        return Err(PluginError::unsupported(format!("gemma3 has no {} encoder", modality.as_str())));
    }
    Ok(vec![ShapeBucket { id: BUCKET.into(), inputs: vec![input(config)].into() }])
}

/// Checkpoint keys and shapes the graph reads, in declaration order.
pub(crate) fn parameters(config: &Gemma3Config) -> Vec<(String, Vec<usize>)> {
    let v = &config.vision;
    let (e, mlp, p) = (v.hidden_size, v.intermediate_size, v.patch_size);
    let t = |s: &str| format!("{TOWER}{s}");
    let mut out = vec![
        (t("embeddings.patch_embedding.weight"), vec![e, v.num_channels, p, p]),
        (t("embeddings.patch_embedding.bias"), vec![e]),
        (t("embeddings.position_embedding.weight"), vec![v.patches(), e]),
    ];
    for i in 0..v.num_hidden_layers {
        out.extend(pre_norm_layer_parameters(&format!("{TOWER}encoder.layers.{i}"), e, mlp));
    }
    out.extend([
        (t("post_layernorm.weight"), vec![e]),
        (t("post_layernorm.bias"), vec![e]),
        (format!("{PROJECTOR}mm_soft_emb_norm.weight"), vec![e]),
        (format!("{PROJECTOR}mm_input_projection_weight"), vec![e, config.text_hidden_size as usize]),
    ]);
    out
}

pub(crate) fn graph(
    config: &Gemma3Config,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
) -> Result<EncoderGraph, PluginError> {
    let c = encoder_contract(target, EncoderCompute::F32);
    if request.modality != Modality::Image || request.bucket.as_str() != BUCKET {
        return Err(PluginError::unsupported(format!(
            "no {} encoder bucket `{}` (gemma3 has `{BUCKET}`)",
            request.modality.as_str(),
            request.bucket
        )));
    }
    let stablehlo = emit(config, c).map_err(|e| PluginError::new(ErrorCode::Internal, e.to_string()))?;
    let parameters = parameter_specs(&parameters(config), config.weights);
    let rows = u64::from(config.mm_tokens_per_image);
    Ok(EncoderGraph {
        bucket: request.bucket.clone(),
        stablehlo: stablehlo.into(),
        entry_function: "main".into(),
        parameter_scope: "model".into(),
        parameters,
        inputs: vec![input(config)].into(),
        outputs: vec![TensorSpec::new(FEATURES, DType::F32, &[rows, u64::from(config.text_hidden_size)])].into(),
    })
}

struct Emitter<'a> {
    c: NumericContract,
    config: &'a Gemma3Config,
    tower: Tower<'a>,
}

impl Emitter<'_> {
    /// `[1, C, S, S]` pixels to `[P*P, hidden]` patch embeddings plus position embeddings.
    fn embeddings(&self, f: &mut Func, pixels: &Value) -> Value {
        let v = &self.config.vision;
        let (c, p, side) = (v.num_channels, v.patch_size, v.patches_per_side());
        let x = f.reshape(pixels, &[c, side, p, side, p]);
        // (c, py, y, px, x) -> (py, px, c, y, x): one row per patch, in the kernel's order.
        let x = f.transpose(&x, &[1, 3, 0, 2, 4]);
        let x = f.reshape(&x, &[side * side, v.patch_width()]);
        let kernel = self.tower.t(f, "embeddings.patch_embedding.weight");
        let kernel = f.reshape(&kernel, &[v.hidden_size, v.patch_width()]);
        let bias = self.tower.t(f, "embeddings.patch_embedding.bias");
        let x = self.c.linear(f, &x, &kernel, Some(&bias));
        let positions = self.tower.t(f, "embeddings.position_embedding.weight");
        f.add(&x, &positions)
    }

    fn projector(&self, f: &mut Func, x: &Value) -> Value {
        let pooled = avg_pool_grid(f, x, self.config.vision.patches_per_side(), self.config.pool_kernel());
        let norm = self.tower.w(f, &format!("{PROJECTOR}mm_soft_emb_norm.weight"));
        let normed = self.c.rms_norm(f, &pooled, &norm, self.config.vision.layer_norm_eps, RmsStyle::OnePlus);
        let proj = self.tower.w(f, &format!("{PROJECTOR}mm_input_projection_weight"));
        self.c.matmul(f, &normed, &proj, (&[], &[]), (&[1], &[0]))
    }
}

/// Emits the module for one image.
pub(crate) fn emit(config: &Gemma3Config, c: NumericContract) -> Result<String, mlxcel_emit::EmitError> {
    let mut m = Module::new("gemma3_vision");
    let globals = declare_parameters(&mut m, &parameters(config), config.weights, &c);
    let tower = Tower { c, globals: &globals, prefix: TOWER, eps: config.vision.layer_norm_eps };
    let e = Emitter { c, config, tower };
    let shape: Vec<usize> = input(config).shape.iter().map(|&d| d as usize).collect();
    let (mut func, a) = m.func("main", &[Type::new(Elem::F32, &shape)]);
    let f = &mut func;
    let mut x = e.embeddings(f, &a[0]);
    let heads = config.vision.num_attention_heads;
    for i in 0..config.vision.num_hidden_layers {
        x = e.tower.pre_norm_layer(f, &x, &format!("encoder.layers.{i}"), heads, |f, h| c.gelu_tanh(f, h));
    }
    let x = e.tower.layer_norm(f, &x, "post_layernorm");
    let out = e.projector(f, &x);
    m.add_func(func, &[out]);
    m.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixture_config;

    #[test]
    fn the_graph_emits_for_the_fixture_with_its_declared_signature() {
        let config = fixture_config();
        let buckets = buckets(&config, Modality::Image).expect("buckets");
        assert_eq!(buckets.len(), 1);
        assert_eq!(buckets[0].inputs[0].shape.as_slice(), &[1, 3, 112, 112]);
        let request = EncoderGraphRequest { modality: Modality::Image, bucket: buckets[0].id.clone() };
        let g = graph(&config, &request, &EncoderTarget::unknown()).expect("graph");
        assert!(g.stablehlo.contains("func.func @main("), "{}", g.stablehlo);
        assert_eq!(g.outputs[0].shape.as_slice(), &[16, 64]);
        assert_eq!(g.parameters.len(), 3 + 16 * 2 + 4);
        assert!(g.stablehlo.contains("\"model\"::\"multi_modal_projector/mm_input_projection_weight\""));
        assert!(g.stablehlo.contains("\"model\"::\"vision_tower/post_layernorm.bias\""));
        let bad = EncoderGraphRequest { modality: Modality::Image, bucket: "image-2".into() };
        assert_eq!(graph(&config, &bad, &EncoderTarget::unknown()).expect_err("bucket").code, ErrorCode::Unsupported);
        assert!(buckets_for_audio_fail(&config));
    }

    fn buckets_for_audio_fail(config: &Gemma3Config) -> bool {
        buckets(config, Modality::Audio).is_err()
    }
}
