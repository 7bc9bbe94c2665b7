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
//! Rows past an item's patches are the host's zero padding: their segment mark is 0, so they
//! attend only to each other and the real rows never see them.

use mlxcel_emit::{Compare, Elem, Func, Module, NumericContract, Reduce, Type, Value};
use mlxcel_family_common::vit::{Tower, declare_parameters, parameter_specs, rope, rotary_2d};
use mlxcel_plugin_api::{DType, EncoderGraph, EncoderGraphRequest, Modality, PluginError, ShapeBucket, TensorSpec};

use crate::config::{Qwen2VlConfig, VisionAct};
use crate::processor::{PATCH_POSITIONS, PATCH_SEGMENTS, PIXEL_VALUES, SEGMENT_START};

/// The graph's output, placed by the contract.
pub(crate) const FEATURES: &str = "image_features";
/// The vision weights, by logical name (`visual/<path below the vision model>`); the host
/// resolves the root (`visual.` in hub checkpoints, `model.visual.` in transformers 5's).
const PREFIX: &str = "visual/";
/// The smallest bucket, in patch rows; the next ones are every power of two
/// times it and one and a half times each, so an image's rows are padded by
/// less than half (attention costs the square of that). Each bucket is
/// compiled the first time an image needs it, then cached.
const SMALLEST_BUCKET: usize = 64;
const LN_EPS: f64 = 1e-6;

/// Patch-row counts of the buckets: 64, 96, 128, 192, 256, ... (see [`SMALLEST_BUCKET`]) until
/// the processor's largest image fits. All are multiples of the 2x2 merge.
pub(crate) fn bucket_sizes(config: &Qwen2VlConfig) -> Vec<usize> {
    let area = (config.vision.patch_size * config.vision.patch_size) as u64;
    let most = config.processor.max_pixels.div_ceil(area.max(1)) as usize;
    let mut sizes = vec![SMALLEST_BUCKET];
    while let Some(&n) = sizes.last().filter(|&&n| n < most) {
        // n is a power of two times 64, or 1.5 times one.
        let next = if n.is_power_of_two() { n + n / 2 } else { n / 3 * 4 };
        sizes.push(next);
    }
    sizes
}

fn bucket_id(n: usize) -> String {
    format!("patches-{n}")
}

fn inputs(config: &Qwen2VlConfig, n: usize) -> Vec<TensorSpec> {
    let n64 = n as u64;
    vec![
        TensorSpec::new(PIXEL_VALUES, DType::F32, &[n64, config.vision.patch_width() as u64]),
        TensorSpec::new(PATCH_POSITIONS, DType::I32, &[n64, 2]),
        TensorSpec::new(PATCH_SEGMENTS, DType::I32, &[n64]),
    ]
}

pub(crate) fn buckets(config: &Qwen2VlConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
    if modality != Modality::Image {
        return Err(PluginError::unsupported(format!("qwen2-vl has no {} encoder", modality.as_str())));
    }
    Ok(bucket_sizes(config)
        .into_iter()
        .map(|n| ShapeBucket { id: bucket_id(n).into(), inputs: inputs(config, n).into() })
        .collect())
}

/// Checkpoint keys and shapes the graph reads, in declaration order.
pub(crate) fn parameters(config: &Qwen2VlConfig) -> Vec<(String, Vec<usize>)> {
    let v = &config.vision;
    let (e, mlp, merged) = (v.embed_dim, v.mlp_dim(), v.embed_dim * v.merge_area());
    let p = v.patch_size;
    let mut out =
        vec![(format!("{PREFIX}patch_embed.proj.weight"), vec![e, v.in_channels, v.temporal_patch_size, p, p])];
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

pub(crate) fn graph(config: &Qwen2VlConfig, request: &EncoderGraphRequest) -> Result<EncoderGraph, PluginError> {
    let sizes = bucket_sizes(config);
    let n = sizes
        .iter()
        .copied()
        .find(|&n| bucket_id(n) == request.bucket.as_str() && request.modality == Modality::Image)
        .ok_or_else(|| PluginError::unsupported(format!("no image encoder bucket `{}`", request.bucket)))?;
    let stablehlo =
        emit(config, n).map_err(|e| PluginError::new(mlxcel_plugin_api::ErrorCode::Internal, e.to_string()))?;
    let v = &config.vision;
    let parameters = parameter_specs(&parameters(config), config.weights);
    let rows = (n / v.merge_area()) as u64;
    Ok(EncoderGraph {
        bucket: request.bucket.clone(),
        stablehlo: stablehlo.into(),
        entry_function: "main".into(),
        parameter_scope: "model".into(),
        parameters,
        inputs: inputs(config, n).into(),
        outputs: vec![TensorSpec::new(FEATURES, DType::F32, &[rows, v.hidden_size as u64])].into(),
    })
}

struct Emitter<'a> {
    c: NumericContract,
    config: &'a Qwen2VlConfig,
    tower: Tower<'a>,
}

impl Emitter<'_> {
    fn w(&self, f: &mut Func, key: &str) -> Value {
        self.tower.t(f, key)
    }

    fn linear(&self, f: &mut Func, x: &Value, name: &str) -> Value {
        self.tower.linear(f, x, name)
    }

    fn layer_norm(&self, f: &mut Func, x: &Value, name: &str) -> Value {
        self.tower.layer_norm(f, x, name)
    }

    /// The additive mask `[B, B]`: 0 where two rows share an image, negative infinity elsewhere.
    /// A row's image is the count of image starts at or before it (doubled, plus one for real
    /// rows), so padding rows never match real ones.
    fn mask(&self, f: &mut Func, segments: &Value) -> Value {
        let n = segments.shape()[0];
        let i32s = Type::new(Elem::I32, &[n, n]);
        let rows = f.iota(&i32s, 0);
        let cols = f.iota(&i32s, 1);
        let two = f.splat(segments.ty(), f64::from(SEGMENT_START));
        let starts = f.compare(Compare::Eq, segments, &two);
        let one = f.splat(segments.ty(), 1.0);
        let zero = f.splat(segments.ty(), 0.0);
        let start = f.select(&starts, &one, &zero);
        let before = f.compare(Compare::Le, &cols, &rows);
        let sb = f.broadcast(&start, &[n, n], &[1]);
        let zeros = f.splat(&i32s, 0.0);
        let counted = f.select(&before, &sb, &zeros);
        let image = f.reduce(&counted, &[1], Reduce::Sum);
        let real = f.compare(Compare::Gt, segments, &zero);
        let realv = f.select(&real, &one, &zero);
        let doubled = f.add(&image, &image);
        let key = f.add(&doubled, &realv);
        let kr = f.broadcast(&key, &[n, n], &[0]);
        let kc = f.broadcast(&key, &[n, n], &[1]);
        let same = f.compare(Compare::Eq, &kr, &kc);
        let f32s = Type::new(Elem::F32, &[n, n]);
        let open = f.splat(&f32s, 0.0);
        let shut = f.splat(&f32s, f64::NEG_INFINITY);
        f.select(&same, &open, &shut)
    }

    fn attention(&self, f: &mut Func, x: &Value, i: usize, cos: &Value, sin: &Value, mask: &Value) -> Value {
        let v = &self.config.vision;
        let (n, e, heads, d) = (x.shape()[0], v.embed_dim, v.num_heads, v.head_dim());
        let qkv = self.linear(f, x, &format!("blocks.{i}.attn.qkv"));
        let qkv = f.reshape(&qkv, &[n, 3, heads, d]);
        let part = |f: &mut Func, j: usize| {
            let s = f.slice(&qkv, &[0, j, 0, 0], &[n, j + 1, heads, d]);
            f.reshape(&s, &[n, heads, d])
        };
        let (q, k, val) = (part(f, 0), part(f, 1), part(f, 2));
        let q = rope(f, &q, cos, sin);
        let k = rope(f, &k, cos, sin);
        // scores [heads, B, B]
        let scores = self.c.matmul(f, &q, &k, (&[1], &[1]), (&[2], &[2]));
        let scale = f.splat(scores.ty(), 1.0 / (d as f64).sqrt());
        let scores = f.mul(&scores, &scale);
        let mb = f.broadcast(mask, &[heads, n, n], &[1, 2]);
        let masked = f.add(&scores, &mb);
        let probs = self.c.softmax(f, &masked);
        // out [heads, B, D] -> [B, heads * D]
        let out = self.c.matmul(f, &probs, &val, (&[0], &[1]), (&[2], &[0]));
        let out = f.transpose(&out, &[1, 0, 2]);
        let out = f.reshape(&out, &[n, e]);
        self.linear(f, &out, &format!("blocks.{i}.attn.proj"))
    }

    fn activation(&self, f: &mut Func, x: &Value, act: VisionAct) -> Value {
        match act {
            VisionAct::QuickGelu => {
                let k = f.splat(x.ty(), 1.702);
                let kx = f.mul(&k, x);
                let s = f.logistic(&kx);
                f.mul(x, &s)
            }
            VisionAct::Gelu => self.c.gelu_erf(f, x),
            VisionAct::GeluPytorchTanh => self.c.gelu_tanh(f, x),
            VisionAct::Silu => self.c.silu(f, x),
        }
    }
}

/// Emits the module for a bucket of `n` patch rows.
pub(crate) fn emit(config: &Qwen2VlConfig, n: usize) -> Result<String, mlxcel_emit::EmitError> {
    let v = &config.vision;
    let mut m = Module::new("qwen2_vl_vision");
    let globals = declare_parameters(&mut m, &parameters(config), config.weights);
    let c = NumericContract::f32();
    let e = Emitter { c, config, tower: Tower { c, globals: &globals, prefix: PREFIX, eps: LN_EPS } };
    let width = v.patch_width();
    let args = [Type::new(Elem::F32, &[n, width]), Type::new(Elem::I32, &[n, 2]), Type::new(Elem::I32, &[n])];
    let (mut func, a) = m.func("main", &args);
    let f = &mut func;

    let kernel = e.w(f, "patch_embed.proj.weight");
    let kernel = f.reshape(&kernel, &[v.embed_dim, width]);
    let mut x = e.c.linear(f, &a[0], &kernel, None);
    let (cos, sin) = rotary_2d(f, &a[1], v.head_dim(), v.rope_theta);
    let mask = e.mask(f, &a[2]);
    for i in 0..v.depth {
        let h = e.layer_norm(f, &x, &format!("blocks.{i}.norm1"));
        let attn = e.attention(f, &h, i, &cos, &sin, &mask);
        x = f.add(&x, &attn);
        let h = e.layer_norm(f, &x, &format!("blocks.{i}.norm2"));
        let h = e.linear(f, &h, &format!("blocks.{i}.mlp.fc1"));
        let h = e.activation(f, &h, v.hidden_act);
        let h = e.linear(f, &h, &format!("blocks.{i}.mlp.fc2"));
        x = f.add(&x, &h);
    }
    let norm = |f: &mut Func, x: &Value| e.layer_norm(f, x, "merger.ln_q");
    let gelu = |f: &mut Func, x: &Value| e.c.gelu_erf(f, x);
    let out = e.tower.patch_merger(f, &x, v.merge_area(), norm, ["merger.mlp.0", "merger.mlp.2"], gelu);
    m.add_func(func, &[out]);
    m.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixture_config;

    #[test]
    fn buckets_grow_by_halves_until_the_largest_image_fits() {
        let mut config = fixture_config();
        // 12544 pixels / 196 = 64 patches.
        assert_eq!(bucket_sizes(&config), [64]);
        config.processor.max_pixels = 28 * 28 * 1280;
        let want = [64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144];
        assert_eq!(bucket_sizes(&config), want);
        assert!(want.iter().all(|n| n % 4 == 0), "whole 2x2 merge groups");
    }

    #[test]
    fn the_graph_emits_for_the_fixture_with_its_declared_signature() {
        let config = fixture_config();
        let request = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-64".into() };
        let g = graph(&config, &request).expect("graph");
        assert!(g.stablehlo.contains("func.func @main("), "{}", g.stablehlo);
        assert_eq!(g.outputs[0].shape.as_slice(), &[16, 64]);
        assert_eq!(g.parameters.len(), 1 + 12 * 2 + 6);
        assert!(g.stablehlo.contains("\"model\"::\"visual/merger.mlp.2.bias\""));
        let bad = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-65".into() };
        assert!(graph(&config, &bad).is_err());
    }
}
