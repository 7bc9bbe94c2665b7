//! Molmo's ViT, attention pooling and projector as StableHLO, one image (all its crops) per
//! call, as mlx-vlm's `VisionModel` computes them:
//!
//! `main(pixel_values[C, P, 3*p*p], image_masks[C, P], feature_order[T]) -> image_features[T, text]`
//!
//! - the patch embedding (a linear without bias), the class embedding before the patches, the
//!   learned position embedding of all `P + 1` rows (no interpolation: every crop is the ViT's
//!   size), the pre-LayerNorm;
//! - per layer, within each crop: LayerNorm, multi-head attention (biased q, k, v and out
//!   projections, scores scaled by `head_dim^-0.5`, softmax in f32), residual; LayerNorm,
//!   `w1`, MLX's fast GELU (`x * sigmoid(1.702 x)`), `w2`, residual. Only the layers up to the
//!   deepest feature layer run;
//! - the feature layers' outputs concatenated per row in the config's order, the class row
//!   dropped; the padding embeddings added by `image_masks` (`pad_embed[0]` where a patch is
//!   all padding, `pad_embed[1]` where it is partly);
//! - each crop's 2x2 windows of patches: their mean is the query of one attention over the
//!   four (the pooling's biased projections), then the SwiGLU projector
//!   `w2(silu(w1(x)) * w3(x))` to the text width;
//! - the rows gathered in `feature_order`, the order of the prompt's `<im_patch>` tokens.
//!
//! The reference zeroes a crop whose pixels are all -1 (a batch's padding image); no crop of
//! an image is, so that step is not emitted. A bucket holds `C` crops and `T` tokens; the host
//! zero-pads a smaller image into it, and the rows past its own tokens are never placed.

use mlxcel_emit::{Compare, Elem, Func, Module, NumericContract, Reduce, Type, Value};
use mlxcel_family_common::vit::{Tower, attend, declare_parameters, encoder_contract, parameter_specs};
use mlxcel_plugin_api::{
    DType, EncoderCompute, EncoderGraph, EncoderGraphRequest, EncoderTarget, ErrorCode, Modality, PluginError,
    ShapeBucket, TensorSpec,
};

use crate::config::MolmoConfig;
use crate::processor::patch_tokens;

pub(crate) const FEATURES: &str = "image_features";
pub(crate) const PIXEL_VALUES: &str = "pixel_values";
pub(crate) const IMAGE_MASKS: &str = "image_masks";
pub(crate) const FEATURE_ORDER: &str = "feature_order";
/// The tower's weights by logical name, under the checkpoint's vision module (allenai's
/// `model.vision_backbone.`, mlx-vlm's `vision_tower.`).
const VISION: &str = "vision_backbone/";

/// One bucket: the crops (the global one included) and the most `<im_patch>` tokens of any
/// tiling into that many crops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub crops: usize,
    pub tokens: usize,
}

impl Bucket {
    fn id(&self) -> String {
        format!("crops-{}", self.crops)
    }

    fn inputs(&self, config: &MolmoConfig) -> Vec<TensorSpec> {
        let v = &config.vision;
        let (c, p) = (self.crops as u64, (v.side() * v.side()) as u64);
        vec![
            TensorSpec::new(PIXEL_VALUES, DType::F32, &[c, p, v.patch_width() as u64]),
            TensorSpec::new(IMAGE_MASKS, DType::F32, &[c, p]),
            TensorSpec::new(FEATURE_ORDER, DType::I32, &[self.tokens as u64]),
        ]
    }
}

/// A bucket per crop count the tilings make (1 to `max_crops` crops plus the global one).
pub(crate) fn bucket_list(config: &MolmoConfig) -> Vec<Bucket> {
    let p = &config.processor;
    (1..=p.max_crops)
        .filter_map(|k| {
            let tokens = (1..=k).filter(|r| k.is_multiple_of(*r)).map(|r| patch_tokens(p, [r, k / r])).max()?;
            Some(Bucket { crops: k + 1, tokens })
        })
        .collect()
}

pub(crate) fn buckets(config: &MolmoConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
    if modality != Modality::Image {
        return Err(PluginError::unsupported(format!("molmo has no {} encoder", modality.as_str())));
    }
    Ok(bucket_list(config).iter().map(|b| ShapeBucket { id: b.id().into(), inputs: b.inputs(config).into() }).collect())
}

/// Logical names and shapes the graph reads, in declaration order.
pub(crate) fn parameters(config: &MolmoConfig) -> Vec<(String, Vec<usize>)> {
    let v = &config.vision;
    let (e, mlp, positions) = (v.emb_dim, v.mlp_dim, v.side() * v.side() + 1);
    let vit = |s: &str| format!("{VISION}image_vit.{s}");
    let mut out = vec![
        (vit("class_embedding"), vec![e]),
        (vit("positional_embedding"), vec![positions, e]),
        (vit("patch_embedding.weight"), vec![e, v.patch_width()]),
        (vit("pre_ln.weight"), vec![e]),
        (vit("pre_ln.bias"), vec![e]),
    ];
    for i in 0..v.layers_run() {
        let n = |s: &str| vit(&format!("transformer.resblocks.{i}.{s}"));
        for (w, shape) in [("wq", [e, e]), ("wk", [e, e]), ("wv", [e, e]), ("wo", [e, e])] {
            out.push((n(&format!("attention.{w}.weight")), shape.to_vec()));
            out.push((n(&format!("attention.{w}.bias")), vec![e]));
        }
        out.extend([
            (n("attention_norm.weight"), vec![e]),
            (n("attention_norm.bias"), vec![e]),
            (n("ffn_norm.weight"), vec![e]),
            (n("ffn_norm.bias"), vec![e]),
            (n("feed_forward.w1.weight"), vec![mlp, e]),
            (n("feed_forward.w1.bias"), vec![mlp]),
            (n("feed_forward.w2.weight"), vec![e, mlp]),
            (n("feed_forward.w2.bias"), vec![e]),
        ]);
    }
    let wide = e * v.feature_layers.len();
    let b = |s: &str| format!("{VISION}{s}");
    out.push((b("pad_embed"), vec![2, wide]));
    for (w, shape) in [("wq", [e, wide]), ("wk", [e, wide]), ("wv", [e, wide]), ("wo", [e, e])] {
        out.push((b(&format!("image_pooling_2d.{w}.weight")), shape.to_vec()));
        out.push((b(&format!("image_pooling_2d.{w}.bias")), vec![e]));
    }
    out.extend([
        (b("image_projector.w1.weight"), vec![v.projector_dim, e]),
        (b("image_projector.w3.weight"), vec![v.projector_dim, e]),
        (b("image_projector.w2.weight"), vec![config.text_hidden_size, v.projector_dim]),
    ]);
    out
}

pub(crate) fn graph(
    config: &MolmoConfig,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
) -> Result<EncoderGraph, PluginError> {
    let c = encoder_contract(target, EncoderCompute::F32);
    let list = bucket_list(config);
    let bucket = list.iter().copied().find(|b| b.id() == request.bucket.as_str());
    let (Modality::Image, Some(bucket)) = (request.modality, bucket) else {
        return Err(PluginError::unsupported(format!(
            "no {} encoder bucket `{}` (molmo has crops-2 to crops-{})",
            request.modality.as_str(),
            request.bucket,
            config.processor.max_crops + 1
        )));
    };
    let stablehlo = emit(config, bucket, c).map_err(|e| PluginError::new(ErrorCode::Internal, e.to_string()))?;
    Ok(EncoderGraph {
        bucket: request.bucket.clone(),
        stablehlo: stablehlo.into(),
        entry_function: "main".into(),
        parameter_scope: "model".into(),
        parameters: parameter_specs(&parameters(config), config.weights),
        inputs: bucket.inputs(config).into(),
        outputs: vec![TensorSpec::new(FEATURES, DType::F32, &[bucket.tokens as u64, config.text_hidden_size as u64])]
            .into(),
    })
}

struct Emitter<'a> {
    c: NumericContract,
    config: &'a MolmoConfig,
    tower: Tower<'a>,
}

impl Emitter<'_> {
    /// One ViT layer over `x [C, P + 1, e]`.
    fn layer(&self, f: &mut Func, x: &Value, i: usize) -> Value {
        let v = &self.config.vision;
        let l = format!("{VISION}image_vit.transformer.resblocks.{i}");
        self.tower.molmo_resblock(f, x, &l, (v.heads, v.head_dim), true, |f, h| self.c.quick_gelu(f, h))
    }

    /// Adds `pad_embed[0]` where `masks` is 0 and `pad_embed[1]` where it is in (0, 1) (or
    /// negative: the reference's -1 row), to `x [C, P, w]`.
    fn padding(&self, f: &mut Func, x: &Value, masks: &Value) -> Value {
        let shape = x.shape().to_vec();
        let (c, p, w) = (shape[0], shape[1], shape[2]);
        let table = self.tower.w(f, &format!("{VISION}pad_embed"));
        let zero = f.splat(&Type::new(Elem::F32, &[c, p]), 0.0);
        let one = f.splat(&Type::new(Elem::F32, &[c, p]), 1.0);
        let all = f.compare(Compare::Eq, masks, &zero);
        let below = f.compare(Compare::Lt, masks, &one);
        let not_all = f.compare(Compare::Ne, masks, &zero);
        let partial = f.select(&below, &not_all, &below);
        let zeros = f.splat(&Type::new(Elem::F32, &shape), 0.0);
        let mut x = x.clone();
        for (row, cond) in [(0, all), (1, partial)] {
            let embed = f.slice(&table, &[row, 0], &[row + 1, w]);
            let embed = f.reshape(&embed, &[w]);
            let embed = f.broadcast(&embed, &shape, &[2]);
            let cond = f.broadcast(&cond, &shape, &[0, 1]);
            let add = f.select(&cond, &embed, &zeros);
            x = f.add(&x, &add);
        }
        x
    }

    /// The padded features `[C, P, w]` pooled per 2x2 window and projected: `[C * P / 4, text]`.
    fn pool_and_project(&self, f: &mut Func, x: &Value) -> Value {
        let v = &self.config.vision;
        let (c, w) = (x.shape()[0], x.shape()[2]);
        let (side, half) = (v.side(), v.side() / 2);
        let n = c * half * half;
        // [C, h, 2, w, 2, e] -> [C, h, w, 2, 2, e] -> [n, 4, e]
        let g = f.reshape(x, &[c, half, 2, half, 2, w]);
        let g = f.transpose(&g, &[0, 1, 3, 2, 4, 5]);
        let g = f.reshape(&g, &[n, 4, w]);
        debug_assert_eq!(side, half * 2);
        let sum = f.reduce(&g, &[1], Reduce::Sum);
        let quarter = f.splat(sum.ty(), 0.25);
        let query = f.mul(&sum, &quarter);
        let query = f.reshape(&query, &[n, 1, w]);
        let (heads, d) = (v.heads, v.head_dim);
        let pool = |f: &mut Func, x: &Value, name: &str, rows: usize| {
            let y = self.tower.linear(f, x, &format!("{VISION}image_pooling_2d.{name}"));
            f.reshape(&y, &[n, rows, heads, d])
        };
        let q = pool(f, &query, "wq", 1);
        let k = pool(f, &g, "wk", 4);
        let val = pool(f, &g, "wv", 4);
        let att = attend(&self.c, f, &q, &k, &val, None);
        let att = self.tower.linear(f, &att, &format!("{VISION}image_pooling_2d.wo"));
        let x = f.reshape(&att, &[n, v.emb_dim]);
        self.tower.swiglu_projector(f, &x, &format!("{VISION}image_projector"))
    }
}

/// Emits the module for one bucket.
pub(crate) fn emit(config: &MolmoConfig, bucket: Bucket, c: NumericContract) -> Result<String, mlxcel_emit::EmitError> {
    let mut m = Module::new("molmo_vision");
    let globals = declare_parameters(&mut m, &parameters(config), config.weights, &c);
    let tower = Tower { c, globals: &globals, prefix: "", eps: config.vision.norm_eps };
    let e = Emitter { c, config, tower };
    let v = &config.vision;
    let (crops, patches, dim) = (bucket.crops, v.side() * v.side(), v.emb_dim);
    let (mut func, args) = m.func(
        "main",
        &[
            Type::new(Elem::F32, &[crops, patches, v.patch_width()]),
            Type::new(Elem::F32, &[crops, patches]),
            Type::new(Elem::I32, &[bucket.tokens]),
        ],
    );
    let f = &mut func;
    let vit = |s: &str| format!("{VISION}image_vit.{s}");
    let x = e.tower.linear_maybe_biased(f, &args[0], &vit("patch_embedding"), false);
    let class = e.tower.w(f, &vit("class_embedding"));
    let class = f.broadcast(&class, &[crops, 1, dim], &[2]);
    let x = f.concat(&[class, x], 1);
    let positions = e.tower.w(f, &vit("positional_embedding"));
    let positions = f.broadcast(&positions, &[crops, patches + 1, dim], &[1, 2]);
    let x = f.add(&x, &positions);
    let mut x = e.tower.layer_norm(f, &x, &vit("pre_ln"));
    let mut taken: Vec<Option<Value>> = vec![None; v.feature_layers.len()];
    for i in 0..v.layers_run() {
        x = e.layer(f, &x, i);
        for (slot, &l) in taken.iter_mut().zip(&v.feature_layers) {
            if l == i {
                *slot = Some(x.clone());
            }
        }
    }
    let taken: Vec<Value> = taken.into_iter().map(|t| t.expect("invariant: every feature layer runs")).collect();
    let features = f.concat(&taken, 2);
    let wide = dim * taken.len();
    let features = f.slice(&features, &[0, 1, 0], &[crops, patches + 1, wide]);
    let features = e.padding(f, &features, &args[1]);
    let rows = e.pool_and_project(f, &features);
    let out = f.gather_rows(&rows, &args[2]);
    m.add_func(func, &[out]);
    m.finish()
}
