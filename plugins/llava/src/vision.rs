//! The CLIP tower and the projector as StableHLO, one module for the tower's one input shape:
//!
//! `main(pixel_values[1, 3, S, S]) -> image_features[rows, text_hidden]`
//!
//! - the patch embedding (a Conv2d whose stride is its kernel, no bias) as one matmul: the
//!   image cut into `(S / P)^2` row-major patches of `[3, P, P]`, the kernel `[E, 3, P, P]`
//!   reshaped to `[E, 3 * P * P]`;
//! - the class embedding before the patch rows, the position embeddings added, `pre_layrnorm`;
//! - encoder layers (LayerNorm, attention with q, k, v and out projections scaled by
//!   `head_dim^-0.5` after the product, LayerNorm, fc1, the tower's activation, fc2), run only
//!   as deep as the deepest feature layer; the hidden states are `[embeddings, layer 1, ...]`
//!   before `post_layernorm`, which LLaVA never reads;
//! - each feature layer's state (without the class row under `default`), concatenated along
//!   the features, then the projector: `linear_1`, `projector_hidden_act`, `linear_2`.

use mlxcel_emit::{Elem, Func, Module, NumericContract, Type, Value};
use mlxcel_family_common::vit::{
    Tower, declare_parameters, encoder_contract, parameter_specs, pre_norm_layer_parameters,
};
use mlxcel_plugin_api::{
    DType, EncoderCompute, EncoderGraph, EncoderGraphRequest, EncoderTarget, ErrorCode, Modality, PluginError,
    ShapeBucket, TensorSpec,
};

use crate::config::{Act, LlavaConfig, SelectStrategy};
use crate::processor::PIXEL_VALUES;

/// The graph's output, placed by the contract.
pub(crate) const FEATURES: &str = "image_features";
/// The tower's and the projector's weights, by logical name (`label/path`, the path as CLIP
/// names the tensor below its vision model); the host resolves each module's root, so hub
/// checkpoints (`vision_tower.vision_model.`) and transformers 5's (`vision_tower.`) both load.
const TOWER: &str = "vision_tower/";
const PROJECTOR: &str = "multi_modal_projector/";

fn bucket_id(config: &LlavaConfig) -> String {
    let s = config.vision.image_size;
    format!("image-{s}x{s}")
}

fn input(config: &LlavaConfig) -> TensorSpec {
    let s = config.vision.image_size as u64;
    TensorSpec::new(PIXEL_VALUES, DType::F32, &[1, 3, s, s])
}

/// The one bucket: a CLIP tower takes one image of its own square.
pub(crate) fn buckets(config: &LlavaConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
    if modality != Modality::Image {
        return Err(PluginError::unsupported(format!("llava has no {} encoder", modality.as_str())));
    }
    Ok(vec![ShapeBucket { id: bucket_id(config).into(), inputs: vec![input(config)].into() }])
}

/// Checkpoint keys and shapes the graph reads, in declaration order.
pub(crate) fn parameters(config: &LlavaConfig) -> Vec<(String, Vec<usize>)> {
    let v = &config.vision;
    let (e, p) = (v.hidden_size, v.patch_size);
    let t = |s: &str| format!("{TOWER}{s}");
    let mut out = vec![
        (t("embeddings.class_embedding"), vec![e]),
        (t("embeddings.patch_embedding.weight"), vec![e, v.num_channels, p, p]),
        (t("embeddings.position_embedding.weight"), vec![v.patches() + 1, e]),
        (t("pre_layrnorm.weight"), vec![e]),
        (t("pre_layrnorm.bias"), vec![e]),
    ];
    for i in 0..config.layers_needed() {
        out.extend(pre_norm_layer_parameters(&t(&format!("encoder.layers.{i}")), e, v.intermediate_size));
    }
    let (text, wide) = (config.text_hidden_size as usize, e * config.feature_layers.len());
    out.push((format!("{PROJECTOR}linear_1.weight"), vec![text, wide]));
    if config.projector_bias {
        out.push((format!("{PROJECTOR}linear_1.bias"), vec![text]));
    }
    out.push((format!("{PROJECTOR}linear_2.weight"), vec![text, text]));
    if config.projector_bias {
        out.push((format!("{PROJECTOR}linear_2.bias"), vec![text]));
    }
    out
}

pub(crate) fn graph(
    config: &LlavaConfig,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
) -> Result<EncoderGraph, PluginError> {
    let c = encoder_contract(target, EncoderCompute::F32);
    if request.modality != Modality::Image || request.bucket.as_str() != bucket_id(config) {
        return Err(PluginError::unsupported(format!(
            "no {} encoder bucket `{}` (llava has `{}`)",
            request.modality.as_str(),
            request.bucket,
            bucket_id(config)
        )));
    }
    let stablehlo = emit(config, c).map_err(|e| PluginError::new(ErrorCode::Internal, e.to_string()))?;
    let parameters = parameter_specs(&parameters(config), config.weights);
    let rows = u64::from(config.feature_tokens());
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
    config: &'a LlavaConfig,
    tower: Tower<'a>,
}

impl Emitter<'_> {
    fn activation(&self, f: &mut Func, x: &Value, act: Act) -> Value {
        match act {
            Act::Gelu => self.c.gelu_erf(f, x),
            Act::GeluPytorchTanh => self.c.gelu_tanh(f, x),
            Act::QuickGelu => self.c.quick_gelu(f, x),
            Act::Silu => self.c.silu(f, x),
        }
    }

    /// `[1, 3, S, S]` to patch rows `[(S/P)^2, 3 * P * P]`, row-major over the grid, each row
    /// channel, pixel row, pixel column (the conv kernel's order), embedded by the kernel.
    fn patch_embedding(&self, f: &mut Func, pixels: &Value) -> Value {
        let v = &self.config.vision;
        let (g, p, c) = (v.grid(), v.patch_size, v.num_channels);
        let x = f.reshape(pixels, &[c, g, p, g, p]);
        let x = f.transpose(&x, &[1, 3, 0, 2, 4]);
        let x = f.reshape(&x, &[g * g, c * p * p]);
        let kernel = self.tower.t(f, "embeddings.patch_embedding.weight");
        let kernel = f.reshape(&kernel, &[v.hidden_size, c * p * p]);
        self.c.linear(f, &x, &kernel, None)
    }

    fn projector_linear(&self, f: &mut Func, x: &Value, name: &str) -> Value {
        let b = self.config.projector_bias.then(|| self.tower.w(f, &format!("{PROJECTOR}{name}.bias")));
        self.tower.project(f, x, &format!("{PROJECTOR}{name}.weight"), b.as_ref())
    }
}

/// Emits the module.
pub(crate) fn emit(config: &LlavaConfig, c: NumericContract) -> Result<String, mlxcel_emit::EmitError> {
    let v = &config.vision;
    let mut m = Module::new("llava_vision");
    let globals = declare_parameters(&mut m, &parameters(config), config.weights, &c);
    let tower = Tower { c, globals: &globals, prefix: TOWER, eps: v.layer_norm_eps };
    let e = Emitter { c, config, tower };
    let s = v.image_size;
    let (mut func, a) = m.func("main", &[Type::new(Elem::F32, &[1, 3, s, s])]);
    let f = &mut func;

    let patches = e.patch_embedding(f, &a[0]);
    let class = e.tower.t(f, "embeddings.class_embedding");
    let class = f.reshape(&class, &[1, v.hidden_size]);
    let x = f.concat(&[class, patches], 0);
    let positions = e.tower.t(f, "embeddings.position_embedding.weight");
    let x = f.add(&x, &positions);
    let mut states = vec![e.tower.layer_norm(f, &x, "pre_layrnorm")];
    for i in 0..config.layers_needed() {
        let layer = format!("encoder.layers.{i}");
        let next = e.tower.pre_norm_layer(f, &states[i], &layer, v.num_heads, |f, h| e.activation(f, h, v.act));
        states.push(next);
    }
    let rows = v.patches() + 1;
    let selected: Vec<Value> = config
        .feature_layers
        .iter()
        .map(|&l| match config.select {
            SelectStrategy::Default => f.slice(&states[l], &[1, 0], &[rows, v.hidden_size]),
            SelectStrategy::Full => states[l].clone(),
        })
        .collect();
    let features = if selected.len() == 1 { selected[0].clone() } else { f.concat(&selected, 1) };
    let h = e.projector_linear(f, &features, "linear_1");
    let h = e.activation(f, &h, config.projector_act);
    let out = e.projector_linear(f, &h, "linear_2");
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
        let all = buckets(&config, Modality::Image).expect("buckets");
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].inputs[0].shape.as_slice(), &[1, 3, 56, 56]);
        let request = EncoderGraphRequest { modality: Modality::Image, bucket: all[0].id.clone() };
        let g = graph(&config, &request, &EncoderTarget::unknown()).expect("graph");
        assert!(g.stablehlo.contains("func.func @main(%v0: tensor<1x3x56x56xf32>)"), "{}", g.stablehlo);
        assert_eq!(g.outputs[0].shape.as_slice(), &[16, 64]);
        // Embeddings (3), pre_layrnorm (2), two of the three layers (16 each), projector (4):
        // the third layer's output is never read.
        assert_eq!(g.parameters.len(), 3 + 2 + 2 * 16 + 4);
        assert!(g.stablehlo.contains("\"model\"::\"vision_tower/encoder.layers.1.mlp.fc2.bias\""));
        assert!(!g.stablehlo.contains("encoder.layers.2."));
        assert!(!g.stablehlo.contains("post_layernorm"));
        let bad = EncoderGraphRequest { modality: Modality::Image, bucket: "image-57x57".into() };
        let err = graph(&config, &bad, &EncoderTarget::unknown()).expect_err("no such bucket");
        assert_eq!(err.message.as_str(), "no image encoder bucket `image-57x57` (llava has `image-56x56`)");
        assert!(buckets(&config, Modality::Audio).is_err());
    }

    #[test]
    fn feature_layer_lists_widen_the_projector_and_full_keeps_the_class_row() {
        let mut config = fixture_config();
        config.feature_layers = vec![0, 3];
        config.select = SelectStrategy::Full;
        config.projector_bias = false;
        let params = parameters(&config);
        let linear_1 = params.iter().find(|(k, _)| k == "multi_modal_projector/linear_1.weight").expect("linear_1");
        assert_eq!(linear_1.1, [64, 64]);
        assert!(!params.iter().any(|(k, _)| k.ends_with(".linear_1.bias")));
        assert!(params.iter().any(|(k, _)| k.contains("encoder.layers.2.")));
        let text = emit(&config, NumericContract::f32()).expect("emit");
        assert!(text.contains("-> tensor<17x64xf32>"), "{text}");
        assert!(
            text.contains("stablehlo.concatenate") && text.contains("dim = 1 : (tensor<17x32xf32>, tensor<17x32xf32>)")
        );
    }
}
