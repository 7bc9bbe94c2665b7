//! The Molmo2 ViT, the pooling adapter and the projector as StableHLO, one image (all its
//! crops) per call:
//!
//! `main(pixel_values[C, P, 3*p*p], pooling[T, k]) -> image_features[T, text_hidden]`
//!
//! - the patch embedding, a linear over each patch's `p*p*3` values (the processor's
//!   channels-last order), plus the learned position embedding of every patch (`P` of them,
//!   no interpolation: every crop is the ViT's size);
//! - per layer, within each crop: LayerNorm, multi-head attention (q, k, v and out
//!   projections, biased when `attention_bias`; scores scaled by `head_dim^-0.5` after the
//!   product, softmax in f32), residual; LayerNorm, `w1`, `gelu_pytorch_tanh`, `w2`, residual.
//!   Only the layers up to the deepest feature layer run: the rest cannot change the features;
//! - the outputs of the adapter's feature layers concatenated per patch, in the config's order;
//! - `Molmo2Adapter`: for each pooled token the rows its `pooling` indices name (over all the
//!   image's crops' patches, `-1` for none) gathered, zeroed where absent, their mean over the
//!   present ones the query (a sum divided by the count, at least one), attention of that one
//!   query over the gathered rows with absent ones masked by f32's lowest value, the out
//!   projection; then the SwiGLU projector `w2(silu(w1(x)) * w3(x))` to the text width.
//!
//! A bucket holds `C` crops and `T` pooled tokens; the host zero-pads smaller images into it,
//! and the rows past an image's own tokens are never placed. No real pooling row is all `-1`
//! (the pooling windows' padding is under a window per side), so the reference's dropping of
//! such rows never moves a row: the placed rows are the first `feature_tokens`.

use mlxcel_emit::{Compare, Elem, Func, Module, NumericContract, Reduce, Type, Value};
use mlxcel_family_common::vit::{Tower, attend, declare_parameters, encoder_contract, parameter_specs};
use mlxcel_plugin_api::{
    DType, EncoderCompute, EncoderGraph, EncoderGraphRequest, EncoderTarget, ErrorCode, Modality, PluginError,
    ShapeBucket, TensorSpec,
};

use crate::config::Molmo2Config;
use crate::processor::ImageProcessor;

/// The graph's output, placed by the contract.
pub(crate) const FEATURES: &str = "image_features";
/// The processor's outputs the graph takes: the crops' patches, and the pooling table of this
/// image alone (the adapter's `pooled_patches_idx`). The reference's `image_token_pooling`
/// is the same table offset by the earlier images' patches, a batching detail; a
/// per-image table is not compared with it as a processor output, and the encoder stage
/// checks it through the pooled rows.
pub(crate) const PIXEL_VALUES: &str = "pixel_values";
pub(crate) const POOLING: &str = "pooled_patches_idx";
/// The ViT's and the adapter's weights by logical name, in the checkpoints' own layout (the
/// original Molmo names, which transformers writes back on save).
const VIT: &str = "image_vit/";
const ADAPTER: &str = "vision_backbone/";

/// One bucket: its crop count and the most pooled tokens an image of that many crops has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub crops: usize,
    pub tokens: usize,
}

impl Bucket {
    fn id(&self) -> String {
        format!("crops-{}", self.crops)
    }

    fn inputs(&self, config: &Molmo2Config, pool: usize) -> Vec<TensorSpec> {
        let v = &config.vision;
        vec![
            TensorSpec::new(PIXEL_VALUES, DType::F32, &[self.crops as u64, v.patches() as u64, v.patch_width() as u64]),
            TensorSpec::new(POOLING, DType::I32, &[self.tokens as u64, pool as u64]),
        ]
    }
}

/// A bucket per crop count (the global crop plus one to `max_crops` high-resolution crops),
/// each holding the most tokens any tiling with that many crops or fewer pools to.
pub(crate) fn bucket_list(p: &ImageProcessor) -> Vec<Bucket> {
    (1..=p.max_crops())
        .map(|k| {
            let tokens = (1..=k)
                .flat_map(|h| (1..=k / h).map(move |w| (h, w)))
                .map(|(h, w)| p.tiling_tokens(h, w))
                .max()
                .unwrap_or(0);
            Bucket { crops: k + 1, tokens }
        })
        .collect()
}

pub(crate) fn buckets(config: &Molmo2Config, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
    if modality != Modality::Image {
        return Err(PluginError::unsupported(format!("molmo2 has no {} encoder", modality.as_str())));
    }
    let p = config.processor()?;
    Ok(bucket_list(&p)
        .iter()
        .map(|b| ShapeBucket { id: b.id().into(), inputs: b.inputs(config, p.pool()).into() })
        .collect())
}

/// Logical names and shapes the graph reads, in declaration order.
pub(crate) fn parameters(config: &Molmo2Config) -> Vec<(String, Vec<usize>)> {
    let v = &config.vision;
    let a = &config.adapter;
    let (e, mlp) = (v.hidden_size, v.intermediate_size);
    let inner = v.num_attention_heads * v.head_dim;
    let t = |s: String| format!("{VIT}{s}");
    let mut out = vec![
        (t("patch_embedding.weight".into()), vec![e, v.patch_width()]),
        (t("patch_embedding.bias".into()), vec![e]),
        (t("positional_embedding".into()), vec![v.patches(), e]),
    ];
    for i in 0..a.layers_run() {
        let n = |s: &str| t(format!("transformer.resblocks.{i}.{s}"));
        out.extend([(n("attention_norm.weight"), vec![e]), (n("attention_norm.bias"), vec![e])]);
        for (w, shape) in [("wq", [inner, e]), ("wk", [inner, e]), ("wv", [inner, e]), ("wo", [e, inner])] {
            out.push((n(&format!("attention.{w}.weight")), shape.to_vec()));
            if v.attention_bias {
                out.push((n(&format!("attention.{w}.bias")), vec![shape[0]]));
            }
        }
        out.extend([
            (n("ffn_norm.weight"), vec![e]),
            (n("ffn_norm.bias"), vec![e]),
            (n("feed_forward.w1.weight"), vec![mlp, e]),
            (n("feed_forward.w1.bias"), vec![mlp]),
            (n("feed_forward.w2.weight"), vec![e, mlp]),
            (n("feed_forward.w2.bias"), vec![e]),
        ]);
    }
    let pooled_in = a.pooling_input(e);
    let pooled_inner = a.num_attention_heads * a.head_dim;
    let b = |s: &str| format!("{ADAPTER}{s}");
    for (w, shape) in [
        ("wq", [pooled_inner, pooled_in]),
        ("wk", [pooled_inner, pooled_in]),
        ("wv", [pooled_inner, pooled_in]),
        ("wo", [a.hidden_size, pooled_inner]),
    ] {
        out.push((b(&format!("image_pooling_2d.{w}.weight")), shape.to_vec()));
        if a.attention_bias {
            out.push((b(&format!("image_pooling_2d.{w}.bias")), vec![shape[0]]));
        }
    }
    out.extend([
        (b("image_projector.w1.weight"), vec![a.intermediate_size, a.hidden_size]),
        (b("image_projector.w3.weight"), vec![a.intermediate_size, a.hidden_size]),
        (b("image_projector.w2.weight"), vec![config.text_hidden_size, a.intermediate_size]),
    ]);
    out
}

pub(crate) fn graph(
    config: &Molmo2Config,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
) -> Result<EncoderGraph, PluginError> {
    let c = encoder_contract(target, EncoderCompute::F32);
    let p = config.processor()?;
    let bucket = bucket_list(&p).into_iter().find(|b| b.id() == request.bucket.as_str());
    let (Modality::Image, Some(bucket)) = (request.modality, bucket) else {
        return Err(PluginError::unsupported(format!(
            "no {} encoder bucket `{}` (molmo2 has crops-2 to crops-{})",
            request.modality.as_str(),
            request.bucket,
            p.max_crops() + 1
        )));
    };
    let stablehlo =
        emit(config, bucket, p.pool(), c).map_err(|e| PluginError::new(ErrorCode::Internal, e.to_string()))?;
    Ok(EncoderGraph {
        bucket: request.bucket.clone(),
        stablehlo: stablehlo.into(),
        entry_function: "main".into(),
        parameter_scope: "model".into(),
        parameters: parameter_specs(&parameters(config), config.weights),
        inputs: bucket.inputs(config, p.pool()).into(),
        outputs: vec![TensorSpec::new(FEATURES, DType::F32, &[bucket.tokens as u64, config.text_hidden_size as u64])]
            .into(),
    })
}

struct Emitter<'a> {
    c: NumericContract,
    config: &'a Molmo2Config,
    tower: Tower<'a>,
}

impl Emitter<'_> {
    /// One ViT layer over `x [C, P, e]`.
    fn layer(&self, f: &mut Func, x: &Value, i: usize) -> Value {
        let v = &self.config.vision;
        let l = format!("{VIT}transformer.resblocks.{i}");
        let dims = (v.num_attention_heads, v.head_dim);
        self.tower.molmo_resblock(f, x, &l, dims, v.attention_bias, |f, h| self.c.gelu_tanh(f, h))
    }

    /// The concatenated features `[C * P, k * e]` to the pooled, projected rows `[T, text]`.
    fn adapter(&self, f: &mut Func, features: &Value, pooling: &Value) -> Value {
        let a = &self.config.adapter;
        let (t, k) = (pooling.shape()[0], pooling.shape()[1]);
        let width = features.shape()[1];
        let (heads, d) = (a.num_attention_heads, a.head_dim);
        let i32s = Type::new(Elem::I32, &[t, k]);
        let zero = f.splat(&i32s, 0.0);
        let present = f.compare(Compare::Ge, pooling, &zero);
        let index = f.max(pooling, &zero);
        let flat = f.reshape(&index, &[t * k]);
        let rows = f.gather_rows(features, &flat);
        let rows = f.reshape(&rows, &[t, k, width]);
        // Absent rows zeroed: multiplied by the mask as a float, as the reference does.
        let ones = f.splat(&Type::new(Elem::F32, &[t, k]), 1.0);
        let zeros = f.splat(&Type::new(Elem::F32, &[t, k]), 0.0);
        let weight = f.select(&present, &ones, &zeros);
        let wb = f.broadcast(&weight, &[t, k, width], &[0, 1]);
        let rows = f.mul(&rows, &wb);
        // The count of present rows, 1 where none is.
        let count = f.reduce(&weight, &[1], Reduce::Sum);
        let one = f.splat(&Type::new(Elem::F32, &[t]), 1.0);
        let none = f.splat(&Type::new(Elem::F32, &[t]), 0.0);
        let empty = f.compare(Compare::Eq, &count, &none);
        let count = f.select(&empty, &one, &count);
        let sum = f.reduce(&rows, &[1], Reduce::Sum);
        let cb = f.broadcast(&count, &[t, width], &[0]);
        let query = f.div(&sum, &cb);
        let query = f.reshape(&query, &[t, 1, width]);

        let pool = |f: &mut Func, x: &Value, w: &str, n: usize| {
            let y = self.tower.linear_maybe_biased(f, x, &format!("{ADAPTER}image_pooling_2d.{w}"), a.attention_bias);
            f.reshape(&y, &[t, n, heads, d])
        };
        let q = pool(f, &query, "wq", 1);
        let key = pool(f, &rows, "wk", k);
        let val = pool(f, &rows, "wv", k);
        // Absent keys take f32's lowest value (transformers' additive mask).
        let low = f.splat(&Type::new(Elem::F32, &[t, k]), f64::from(f32::MIN));
        let mask = f.select(&present, &zeros, &low);
        let mask = f.reshape(&mask, &[t, 1, k]);
        let att = attend(&self.c, f, &q, &key, &val, Some(&mask));
        let att = self.tower.linear_maybe_biased(f, &att, &format!("{ADAPTER}image_pooling_2d.wo"), a.attention_bias);
        let x = f.reshape(&att, &[t, a.hidden_size]);

        self.tower.swiglu_projector(f, &x, &format!("{ADAPTER}image_projector"))
    }
}

/// Emits the module for one bucket.
pub(crate) fn emit(
    config: &Molmo2Config,
    bucket: Bucket,
    pool: usize,
    c: NumericContract,
) -> Result<String, mlxcel_emit::EmitError> {
    let mut m = Module::new("molmo2_vision");
    let globals = declare_parameters(&mut m, &parameters(config), config.weights, &c);
    let tower = Tower { c, globals: &globals, prefix: "", eps: config.vision.layer_norm_eps };
    let e = Emitter { c, config, tower };
    let v = &config.vision;
    let (crops, patches, e_dim) = (bucket.crops, v.patches(), v.hidden_size);
    let (mut func, args) = m.func(
        "main",
        &[Type::new(Elem::F32, &[crops, patches, v.patch_width()]), Type::new(Elem::I32, &[bucket.tokens, pool])],
    );
    let f = &mut func;
    let x = e.tower.linear(f, &args[0], &format!("{VIT}patch_embedding"));
    let positions = e.tower.w(f, &format!("{VIT}positional_embedding"));
    let positions = f.broadcast(&positions, &[crops, patches, e_dim], &[1, 2]);
    let mut x = f.add(&x, &positions);
    let layers = &config.adapter.feature_layers;
    let mut taken: Vec<Option<Value>> = vec![None; layers.len()];
    for i in 0..config.adapter.layers_run() {
        x = e.layer(f, &x, i);
        for (slot, &l) in taken.iter_mut().zip(layers) {
            if l == i {
                *slot = Some(x.clone());
            }
        }
    }
    let taken: Vec<Value> = taken.into_iter().map(|t| t.expect("invariant: every feature layer runs")).collect();
    let features = f.concat(&taken, 2);
    let features = f.reshape(&features, &[crops * patches, e_dim * layers.len()]);
    let out = e.adapter(f, &features, &args[1]);
    m.add_func(func, &[out]);
    m.finish()
}
