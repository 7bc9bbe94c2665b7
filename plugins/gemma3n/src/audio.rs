//! Gemma 3n's audio encoder (`Gemma3nAudioEncoder`, a USM-style conformer) and the audio
//! embedder (`embed_audio`) as StableHLO, one clip per call, per bucket of `T` mel frames:
//!
//! `main(input_features[1, T, bins], input_features_mask[1, T]) ->
//!     (audio_features[soft, text_hidden], end_of_audio[soft, text_hidden])`
//!
//! - subsampling (`subsample_conv_projection`): two Conv2d over (time, frequency), each padded
//!   with zeros (time: `kernel - 1` frames after, frequency: one bin on both sides, as the
//!   reference hard-codes), written as strided patches times the kernel; each followed by the
//!   cumulative group norm (mean and variance of every value up to and including each frame,
//!   the cumulative sums as a product with a lower-triangular matrix) and ReLU; then the
//!   frequency-major flattening and `input_proj_linear`;
//! - per conformer block: a feed-forward half (clamp, RMSNorm, `ffw_layer_1`, SiLU,
//!   `ffw_layer_2`, clamp, RMSNorm, times `conf_residual_weight`, residual); local self-attention
//!   (clamp, RMSNorm; q scaled by `head_dim^-0.5 / softplus(0)` and `softplus(per_dim_scale)`;
//!   each query against the keys `max_past` frames before it to `context_right` after it,
//!   logits `q.k + q.P[d]` with `P` the projected sinusoidal embedding of the distance `d`
//!   (what the reference's blocked relative shift computes), soft-capped, invalid keys at
//!   `f32::MIN`, softmax; `post`, clamp, RMSNorm, residual); the rows past the clip zeroed; the
//!   light convolution (RMSNorm, `linear_start`, GLU, causal depthwise Conv1d, clamp, RMSNorm,
//!   SiLU, `linear_end`, residual); a second feed-forward half; clamp and the block's RMSNorm;
//! - every `conf_reduction_factor`-th frame kept;
//! - `embed_audio` on those rows (`soft_embedding_norm`, `embedding_projection`, the unscaled
//!   `embedding_post_projection_norm`), each row past the clip, and every soft token past the
//!   clip's rows, replaced by the embedding of the padding token (the text vocabulary's last id,
//!   through the hard path: `embedding`, `hard_embedding_norm`, the projection, the post norm),
//!   as `Gemma3nModel.forward` fills them; `end_of_audio` is `<end_of_audio>`'s hard embedding,
//!   repeated on every row, which the contract places over each block's closing token.
//!
//! The reference sees a clip alone as exactly its own frames; in a bucket the frames past it
//! are zero and masked. They never reach the clip's rows: the input's padded frames are zeroed,
//! the first convolution's frames past the clip are zeroed (the second convolution reads them as
//! the reference's zero padding), attention ignores keys past the clip, and the group norm and
//! the light convolution look only backwards. Every value stays finite on the padded rows (the
//! masked logits are `f32::MIN`, not minus infinity), so no NaN reaches a clip row through a
//! zero attention weight.

use mlxcel_emit::{Compare, Elem, Func, Module, NumericContract, Reduce, RmsStyle, Type, Value};
use mlxcel_family_common::vit::{Tower, declare_parameters, encoder_contract, parameter_specs};
use mlxcel_plugin_api::{
    DType, EncoderCompute, EncoderGraph, EncoderGraphRequest, EncoderTarget, ErrorCode, Modality, PluginError,
    ShapeBucket, TensorSpec,
};

use crate::config::{AudioConfig, CONFORMER_NORM_EPS, Gemma3nConfig};
use crate::processor::{FEATURES as INPUT, MASK, MAX_SAMPLES};

/// The soft tokens' rows, placed by the contract.
pub(crate) const FEATURES: &str = "audio_features";
/// `<end_of_audio>`'s row (repeated), placed by the contract over each block's closer.
pub(crate) const END: &str = "end_of_audio";
/// The encoder's and the embedder's weights, by logical name (`label/path`, the path as the
/// reference names the tensor below its module); the host resolves each module's root.
const TOWER: &str = "audio_tower/";
const EMBED: &str = "embed_audio/";
/// The smallest bucket, in output rows.
const MIN_BUCKET_ROWS: usize = 4;

/// Mel frames of the longest clip the feature extractor takes.
fn max_frames(config: &Gemma3nConfig) -> usize {
    let fe = &config.features;
    MAX_SAMPLES.saturating_sub(fe.frame_length + 1) / fe.hop_length + 1
}

/// The buckets' frame counts, ascending: multiples of the frames per output row, from the
/// most the prompt's soft tokens (and the longest clip) allow, halving while a bucket keeps at
/// least [`MIN_BUCKET_ROWS`] rows. A bucket is compiled for its frames; a clip is zero-padded
/// into the smallest that holds it.
pub(crate) fn bucket_frames(config: &Gemma3nConfig) -> Vec<usize> {
    let per_row = config.audio.frames_per_row();
    let mut rows = (config.audio_soft_tokens as usize).min(max_frames(config).div_ceil(per_row)).max(1);
    let mut out = vec![rows * per_row];
    while rows.div_ceil(2) >= MIN_BUCKET_ROWS && rows.div_ceil(2) < rows {
        rows = rows.div_ceil(2);
        out.push(rows * per_row);
    }
    out.reverse();
    out
}

fn bucket_id(frames: usize) -> String {
    format!("frames-{frames}")
}

fn inputs(config: &Gemma3nConfig, frames: usize) -> Vec<TensorSpec> {
    let (t, bins) = (frames as u64, config.audio.input_feat_size as u64);
    vec![TensorSpec::new(INPUT, DType::F32, &[1, t, bins]), TensorSpec::new(MASK, DType::I32, &[1, t])]
}

pub(crate) fn buckets(config: &Gemma3nConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
    if modality != Modality::Audio {
        return Err(PluginError::unsupported(format!("gemma3n serves no {} encoder", modality.as_str())));
    }
    Ok(bucket_frames(config)
        .into_iter()
        .map(|frames| ShapeBucket { id: bucket_id(frames).into(), inputs: inputs(config, frames).into() })
        .collect())
}

/// Checkpoint keys and shapes the graph reads, in declaration order.
pub(crate) fn parameters(config: &Gemma3nConfig) -> Vec<(String, Vec<usize>)> {
    let a = &config.audio;
    let h = a.hidden_size;
    let t = |s: &str| format!("{TOWER}{s}");
    let [c0, c1] = a.sscp_channels;
    let [[kt0, kf0], [kt1, kf1]] = a.sscp_kernels;
    let sscp = "subsample_conv_projection";
    let mut out = vec![
        (t(&format!("{sscp}.conv_0.conv.weight")), vec![c0, 1, kt0, kf0]),
        (t(&format!("{sscp}.conv_0.norm.weight")), vec![c0]),
        (t(&format!("{sscp}.conv_1.conv.weight")), vec![c1, c0, kt1, kf1]),
        (t(&format!("{sscp}.conv_1.norm.weight")), vec![c1]),
        (t(&format!("{sscp}.input_proj_linear.weight")), vec![h, c1 * a.sscp_freqs()[1]]),
    ];
    for i in 0..a.num_hidden_layers {
        let l = |s: &str| t(&format!("conformer.{i}.{s}"));
        for half in ["ffw_layer_start", "ffw_layer_end"] {
            out.extend([
                (l(&format!("{half}.pre_layer_norm.weight")), vec![h]),
                (l(&format!("{half}.ffw_layer_1.weight")), vec![4 * h, h]),
                (l(&format!("{half}.ffw_layer_2.weight")), vec![h, 4 * h]),
                (l(&format!("{half}.post_layer_norm.weight")), vec![h]),
            ]);
        }
        out.extend([
            (l("attention.pre_attn_norm.weight"), vec![h]),
            (l("attention.attn.per_dim_scale"), vec![a.head_dim()]),
            (l("attention.attn.relative_position_embedding.pos_proj.weight"), vec![h, h]),
            (l("attention.attn.q_proj.weight"), vec![h, h]),
            (l("attention.attn.k_proj.weight"), vec![h, h]),
            (l("attention.attn.v_proj.weight"), vec![h, h]),
            (l("attention.post.weight"), vec![h, h]),
            (l("attention.post_norm.weight"), vec![h]),
            (l("lconv1d.pre_layer_norm.weight"), vec![h]),
            (l("lconv1d.linear_start.weight"), vec![2 * h, h]),
            (l("lconv1d.depthwise_conv1d.weight"), vec![h, 1, a.conv_kernel_size]),
            (l("lconv1d.conv_norm.weight"), vec![h]),
            (l("lconv1d.linear_end.weight"), vec![h, h]),
            (l("norm.weight"), vec![h]),
        ]);
    }
    let text = config.text_hidden_size as usize;
    out.extend([
        (format!("{EMBED}embedding.weight"), vec![a.vocab_size as usize, h]),
        (format!("{EMBED}hard_embedding_norm.weight"), vec![h]),
        (format!("{EMBED}soft_embedding_norm.weight"), vec![h]),
        (format!("{EMBED}embedding_projection.weight"), vec![text, h]),
    ]);
    out
}

pub(crate) fn graph(
    config: &Gemma3nConfig,
    request: &EncoderGraphRequest,
    target: &EncoderTarget,
) -> Result<EncoderGraph, PluginError> {
    let c = encoder_contract(target, EncoderCompute::F32);
    let frames = bucket_frames(config).into_iter().find(|&f| request.bucket.as_str() == bucket_id(f));
    let (Modality::Audio, Some(frames)) = (request.modality, frames) else {
        return Err(PluginError::unsupported(format!(
            "no {} encoder bucket `{}` (gemma3n has audio buckets {:?})",
            request.modality.as_str(),
            request.bucket,
            bucket_frames(config).into_iter().map(bucket_id).collect::<Vec<_>>()
        )));
    };
    let stablehlo = emit(config, frames, c).map_err(|e| PluginError::new(ErrorCode::Internal, e.to_string()))?;
    let rows = u64::from(config.audio_soft_tokens);
    let width = u64::from(config.text_hidden_size);
    Ok(EncoderGraph {
        bucket: request.bucket.clone(),
        stablehlo: stablehlo.into(),
        entry_function: "main".into(),
        parameter_scope: "model".into(),
        parameters: parameter_specs(&parameters(config), config.weights),
        inputs: inputs(config, frames).into(),
        outputs: vec![
            TensorSpec::new(FEATURES, DType::F32, &[rows, width]),
            TensorSpec::new(END, DType::F32, &[rows, width]),
        ]
        .into(),
    })
}

/// `torch.nn.functional.softplus(per_dim_scale)` as torch computes it in f32 (up to an ulp):
/// `max(x, 0) + log1p(exp(-|x|))`, the `log1p` as `2 atanh(u / (2 + u))` by its series (StableHLO
/// as this builder emits it has no logarithm; with `u / (2 + u) <= 1/3` eight terms leave less
/// than 1e-9).
fn softplus(f: &mut Func, x: &Value) -> Value {
    let c = |f: &mut Func, v: f64| f.splat(x.ty(), v);
    let ax = f.abs(x);
    let nax = f.neg(&ax);
    let u = f.exp(&nax);
    let two = c(f, 2.0);
    let den = f.add(&two, &u);
    let s = f.div(&u, &den);
    let s2 = f.mul(&s, &s);
    let mut p = c(f, 1.0 / 15.0);
    for k in (0..7).rev() {
        let ps = f.mul(&p, &s2);
        let term = c(f, 1.0 / (2 * k + 1) as f64);
        p = f.add(&ps, &term);
    }
    let sp = f.mul(&s, &p);
    let log1p = f.mul(&two, &sp);
    let zero = c(f, 0.0);
    let pos = f.max(x, &zero);
    f.add(&pos, &log1p)
}

/// The reference's `q_scale` buffer: `head_dim^-0.5` times `1 / softplus(0)`, both rounded to
/// f32 and multiplied in f32, as torch builds it.
fn q_scale(a: &AudioConfig) -> f32 {
    let inv_softplus0 = 1.0f32 / (std::f64::consts::LN_2 as f32);
    ((a.head_dim() as f64).powf(-0.5) as f32) * inv_softplus0
}

/// The sinusoidal timing signal of the relative distances `max_past, ..., -context_right`,
/// `[span, hidden]`: `hidden / 2` sines then as many cosines of `distance * inv_timescale`,
/// the timescales `exp(-i ln(1e4) / max(hidden/2 - 1, 1))`, in f32 as torch computes them
/// (each transcendental correctly rounded here, within an ulp of torch's).
fn timing_signal(a: &AudioConfig) -> Vec<f32> {
    let half = a.hidden_size / 2;
    let increment = (1.0e4f64).ln() / half.saturating_sub(1).max(1) as f64;
    let neg = -increment as f32;
    let inv: Vec<f32> = (0..half).map(|i| f64::from(i as f32 * neg).exp() as f32).collect();
    let mut out = Vec::with_capacity(a.attention_span() * a.hidden_size);
    for j in 0..a.attention_span() {
        let distance = (a.max_past() as i64 - j as i64) as f32;
        let scaled: Vec<f64> = inv.iter().map(|&v| f64::from(distance * v)).collect();
        out.extend(scaled.iter().map(|s| s.sin() as f32));
        out.extend(scaled.iter().map(|s| s.cos() as f32));
    }
    out
}

/// `x` with `pads[d] = (before, after)` zeros along each dimension `d`.
fn pad_zeros(f: &mut Func, x: &Value, pads: &[(usize, usize)]) -> Value {
    let mut x = x.clone();
    for (d, &(before, after)) in pads.iter().enumerate() {
        let mut parts = Vec::with_capacity(3);
        for (amount, is_x) in [(before, false), (0, true), (after, false)] {
            if is_x {
                parts.push(x.clone());
            } else if amount > 0 {
                let mut shape = x.shape().to_vec();
                shape[d] = amount;
                parts.push(f.splat(&x.ty().with_shape(&shape), 0.0));
            }
        }
        if parts.len() > 1 {
            x = f.concat(&parts, d);
        }
    }
    x
}

/// Every `stride`-th element of `x [n]` from the first (`n` a multiple of `stride`).
fn every(f: &mut Func, x: &Value, stride: usize) -> Value {
    let n = x.shape()[0];
    let grid = f.reshape(x, &[n / stride, stride]);
    let first = f.slice(&grid, &[0, 0], &[n / stride, 1]);
    f.reshape(&first, &[n / stride])
}

/// `[n, n]` f32 with ones on and below the diagonal: `L s` is the cumulative sum of `s`.
fn lower_triangle(f: &mut Func, n: usize) -> Value {
    let ty = Type::new(Elem::I32, &[n, n]);
    let rows = f.iota(&ty, 0);
    let cols = f.iota(&ty, 1);
    let keep = f.compare(Compare::Ge, &rows, &cols);
    let fty = Type::new(Elem::F32, &[n, n]);
    let one = f.splat(&fty, 1.0);
    let zero = f.splat(&fty, 0.0);
    f.select(&keep, &one, &zero)
}

/// The `span` windows of `x [t, ...]` along its first dimension, `[span, t, ...]`: window `j` is
/// row `i - past + j` for each `i` (`fill` outside `0..t`).
fn windows(f: &mut Func, x: &Value, past: usize, future: usize, fill: f64) -> Value {
    let shape = x.shape().to_vec();
    let t = shape[0];
    let mut parts = Vec::with_capacity(3);
    for (amount, is_x) in [(past, false), (0, true), (future, false)] {
        if is_x {
            parts.push(x.clone());
        } else if amount > 0 {
            let mut s = shape.clone();
            s[0] = amount;
            parts.push(f.splat(&x.ty().with_shape(&s), fill));
        }
    }
    let padded = if parts.len() > 1 { f.concat(&parts, 0) } else { x.clone() };
    let mut stacked = Vec::with_capacity(past + future + 1);
    for j in 0..past + future + 1 {
        let mut start = vec![0; shape.len()];
        start[0] = j;
        let mut limit = shape.clone();
        limit[0] = j + t;
        let one = f.slice(&padded, &start, &limit);
        let mut s = vec![1];
        s.extend(&shape);
        stacked.push(f.reshape(&one, &s));
    }
    if stacked.len() == 1 { stacked.swap_remove(0) } else { f.concat(&stacked, 0) }
}

struct Emitter<'a> {
    c: NumericContract,
    config: &'a Gemma3nConfig,
    tower: Tower<'a>,
    embed: Tower<'a>,
}

impl Emitter<'_> {
    fn audio(&self) -> &AudioConfig {
        &self.config.audio
    }

    /// A bias-free linear with the tower's `name.weight`.
    fn linear(&self, f: &mut Func, x: &Value, name: &str) -> Value {
        self.tower.project(f, x, &format!("{}{name}.weight", self.tower.prefix), None)
    }

    /// `Gemma3nRMSNorm`: `x * (mean(x^2) + eps)^-0.5`, times the tower's `name.weight` (not
    /// `1 + w`).
    fn rms(&self, f: &mut Func, x: &Value, name: &str, eps: f64) -> Value {
        let w = self.tower.t(f, &format!("{name}.weight"));
        self.c.rms_norm(f, x, &w, eps, RmsStyle::Plain)
    }

    /// `Gemma3nRMSNorm(with_scale=False)`.
    fn rms_unscaled(&self, f: &mut Func, x: &Value, eps: f64) -> Value {
        let shape = x.shape().to_vec();
        let last = shape.len() - 1;
        let sq = f.mul(x, x);
        let mean = self.c.mean_last(f, &sq);
        let eps = f.splat(mean.ty(), eps);
        let m = f.add(&mean, &eps);
        let r = f.rsqrt(&m);
        let rb = f.broadcast(&r, &shape, &(0..last).collect::<Vec<_>>());
        f.mul(x, &rb)
    }

    /// `torch.clamp(x, -gradient_clipping, gradient_clipping)`.
    fn clamp(&self, f: &mut Func, x: &Value) -> Value {
        let limit = f64::from(self.audio().gradient_clipping as f32);
        let lo = f.splat(x.ty(), -limit);
        let hi = f.splat(x.ty(), limit);
        let x = f.max(x, &lo);
        f.min(&x, &hi)
    }

    /// `Gemma3nAudioCumulativeGroupNorm` over `x [t, freq, channels]`: at each frame, the mean and
    /// (mean-centred) variance of every value of the frames up to it, then the channel scale.
    fn cumulative_group_norm(&self, f: &mut Func, x: &Value, name: &str) -> Value {
        let shape = x.shape().to_vec();
        let (t, per_frame) = (shape[0], shape[1] * shape[2]);
        let triangle = lower_triangle(f, t);
        let counts: Vec<f32> = (1..=t).map(|i| (i * per_frame) as f32).collect();
        let counts = f.constant_f32(&[t], &counts);
        let cumulative = |f: &mut Func, v: &Value| {
            let sums = f.reduce(v, &[1, 2], Reduce::Sum);
            let running = f.dot_general(&triangle, &sums, (&[], &[]), (&[1], &[0]));
            let mean = f.div(&running, &counts);
            f.broadcast(&mean, &shape, &[0])
        };
        let mean = cumulative(f, x);
        let centred = f.sub(x, &mean);
        let sq = f.mul(&centred, &centred);
        let var = cumulative(f, &sq);
        let eps = f.splat(var.ty(), self.audio().sscp_group_norm_eps);
        let v = f.add(&var, &eps);
        let r = f.rsqrt(&v);
        let normed = f.mul(&centred, &r);
        let w = self.tower.t(f, &format!("{name}.weight"));
        let wb = f.broadcast(&w, &shape, &[2]);
        f.mul(&normed, &wb)
    }

    /// One subsampling block on `x [t, freq, channels_in]`: the zero-padded Conv2d as patches
    /// times the kernel, the cumulative group norm, ReLU; frames where `keep [t_out]` is 0 zeroed.
    fn conv_block(&self, f: &mut Func, x: &Value, index: usize, keep: Option<&Value>) -> Value {
        let a = self.audio();
        let [kt, kf] = a.sscp_kernels[index];
        let [st, sf] = a.sscp_strides[index];
        let c_out = a.sscp_channels[index];
        let (t_in, f_in, c_in) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let t_out = (t_in - 1) / st + 1;
        let f_out = (f_in + 2 - kf) / sf + 1;
        // The reference's padding, and a little more past the end so that each tap's strided
        // rows are a reshape away; the extra zeros fall on rows no output reads.
        let t_pad = (t_in + kt - 1).max(kt - 1 + st * t_out);
        let f_pad = (f_in + 2).max(kf - 1 + sf * f_out);
        let padded = pad_zeros(f, x, &[(0, t_pad - t_in), (1, f_pad - f_in - 1), (0, 0)]);
        let mut taps = Vec::with_capacity(kt * kf);
        for dt in 0..kt {
            for df in 0..kf {
                let s = f.slice(&padded, &[dt, df, 0], &[dt + st * t_out, df + sf * f_out, c_in]);
                let s = f.reshape(&s, &[t_out, st, f_out, sf, c_in]);
                let s = f.slice(&s, &[0, 0, 0, 0, 0], &[t_out, 1, f_out, 1, c_in]);
                taps.push(f.reshape(&s, &[t_out, f_out, c_in, 1]));
            }
        }
        // [t_out, f_out, c_in, kt * kf]: each patch in the kernel's (c_in, kt, kf) order.
        let patches = if taps.len() == 1 { taps.swap_remove(0) } else { f.concat(&taps, 3) };
        let patches = f.reshape(&patches, &[t_out * f_out, c_in * kt * kf]);
        let block = format!("subsample_conv_projection.conv_{index}");
        let kernel = self.tower.t(f, &format!("{block}.conv.weight"));
        let kernel = f.reshape(&kernel, &[c_out, c_in * kt * kf]);
        let y = self.c.linear(f, &patches, &kernel, None);
        let y = f.reshape(&y, &[t_out, f_out, c_out]);
        let y = self.cumulative_group_norm(f, &y, &format!("{block}.norm"));
        let zero = f.splat(y.ty(), 0.0);
        let y = f.max(&y, &zero);
        match keep {
            Some(keep) => {
                let kb = f.broadcast(keep, y.shape(), &[0]);
                f.mul(&y, &kb)
            }
            None => y,
        }
    }

    /// `subsample_conv_projection` on `features [t, bins]` with the frame mask `valid [t]`
    /// (f32 0/1): `[t / time_stride, hidden]`.
    fn subsample(&self, f: &mut Func, features: &Value, valid: &Value) -> Value {
        let a = self.audio();
        let (t, bins) = (features.shape()[0], features.shape()[1]);
        let vb = f.broadcast(valid, &[t, bins], &[0]);
        let x = f.mul(features, &vb);
        let x = f.reshape(&x, &[t, bins, 1]);
        let keep = every(f, valid, a.sscp_strides[0][0]);
        let x = self.conv_block(f, &x, 0, Some(&keep));
        let x = self.conv_block(f, &x, 1, None);
        let (t1, f1, c1) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        // Frequency-major, channels within: the reference's permute(0, 2, 3, 1) then view.
        let x = f.reshape(&x, &[t1, f1 * c1]);
        self.linear(f, &x, "subsample_conv_projection.input_proj_linear")
    }

    fn feed_forward(&self, f: &mut Func, x: &Value, half: &str) -> Value {
        let h = self.clamp(f, x);
        let h = self.rms(f, &h, &format!("{half}.pre_layer_norm"), CONFORMER_NORM_EPS);
        let h = self.linear(f, &h, &format!("{half}.ffw_layer_1"));
        let h = self.c.silu(f, &h);
        let h = self.linear(f, &h, &format!("{half}.ffw_layer_2"));
        let h = self.clamp(f, &h);
        let h = self.rms(f, &h, &format!("{half}.post_layer_norm"), CONFORMER_NORM_EPS);
        let scale = f.splat(h.ty(), f64::from(self.audio().residual_weight as f32));
        let h = f.mul(&h, &scale);
        f.add(x, &h)
    }

    /// `Gemma3nAudioAttention` over `x [t, hidden]` with key validity `valid [t]` (i1):
    /// `[t, hidden]` before `post`.
    fn local_attention(&self, f: &mut Func, x: &Value, attn: &str, valid: &Value) -> Value {
        let a = self.audio();
        let (t, hidden) = (x.shape()[0], x.shape()[1]);
        let (heads, d) = (a.num_attention_heads, a.head_dim());
        let (past, future, span) = (a.max_past(), a.attention_context_right, a.attention_span());
        let project = |f: &mut Func, name: &str| {
            let y = self.linear(f, x, &format!("{attn}.{name}"));
            f.reshape(&y, &[t, heads, d])
        };
        let q = project(f, "q_proj");
        let k = project(f, "k_proj");
        let v = project(f, "v_proj");
        let qs = f.splat(q.ty(), f64::from(q_scale(a)));
        let q = f.mul(&q, &qs);
        let per_dim = self.tower.t(f, &format!("{attn}.per_dim_scale"));
        let per_dim = softplus(f, &per_dim);
        let pb = f.broadcast(&per_dim, &[t, heads, d], &[2]);
        let q = f.mul(&q, &pb);
        // Content: each query against the keys of its window, [t, heads, span].
        let keys = windows(f, &k, past, future, 0.0);
        let content = self.c.matmul(f, &q, &keys, (&[0, 1], &[1, 2]), (&[2], &[3]));
        // Position: each query against the projected embedding of each distance.
        let timing = f.constant_f32(&[span, hidden], &timing_signal(a));
        let positions = self.linear(f, &timing, &format!("{attn}.relative_position_embedding.pos_proj"));
        let positions = f.reshape(&positions, &[span, heads, d]);
        let position = self.c.matmul(f, &q, &positions, (&[1], &[1]), (&[2], &[2]));
        let position = f.transpose(&position, &[1, 0, 2]);
        let logits = f.add(&content, &position);
        let logits = self.c.softcap(f, &logits, f64::from(a.attention_logit_cap as f32));
        let valid_keys = windows(f, valid, past, future, 0.0);
        let valid_keys = f.transpose(&valid_keys, &[1, 0]);
        let vb = f.broadcast(&valid_keys, &[t, heads, span], &[0, 2]);
        let floor = f.splat(logits.ty(), f64::from(f32::MIN));
        let logits = f.select(&vb, &logits, &floor);
        let probs = self.c.softmax(f, &logits);
        let values = windows(f, &v, past, future, 0.0);
        let context = self.c.matmul(f, &probs, &values, (&[0, 1], &[1, 2]), (&[2], &[0]));
        f.reshape(&context, &[t, heads * d])
    }

    fn attention(&self, f: &mut Func, x: &Value, layer: &str, valid: &Value) -> Value {
        let h = self.clamp(f, x);
        let h = self.rms(f, &h, &format!("{layer}.pre_attn_norm"), CONFORMER_NORM_EPS);
        let h = self.local_attention(f, &h, &format!("{layer}.attn"), valid);
        let h = self.linear(f, &h, &format!("{layer}.post"));
        let h = self.clamp(f, &h);
        let h = self.rms(f, &h, &format!("{layer}.post_norm"), CONFORMER_NORM_EPS);
        f.add(x, &h)
    }

    fn light_conv(&self, f: &mut Func, x: &Value, layer: &str) -> Value {
        let a = self.audio();
        let eps = a.rms_norm_eps;
        let (t, h) = (x.shape()[0], x.shape()[1]);
        let y = self.rms(f, x, &format!("{layer}.pre_layer_norm"), eps);
        let y = self.linear(f, &y, &format!("{layer}.linear_start"));
        // GLU over the last dimension: the first half times the sigmoid of the second.
        let first = f.slice(&y, &[0, 0], &[t, h]);
        let gate = f.slice(&y, &[0, h], &[t, 2 * h]);
        let gate = f.logistic(&gate);
        let y = f.mul(&first, &gate);
        // Causal depthwise convolution: kernel - 1 zero frames before.
        let kernel = a.conv_kernel_size;
        let w = self.tower.t(f, &format!("{layer}.depthwise_conv1d.weight"));
        let w = f.reshape(&w, &[h, kernel]);
        let padded = pad_zeros(f, &y, &[(kernel - 1, 0), (0, 0)]);
        let mut acc: Option<Value> = None;
        for j in 0..kernel {
            let tap = f.slice(&padded, &[j, 0], &[j + t, h]);
            let wj = f.slice(&w, &[0, j], &[h, j + 1]);
            let wj = f.reshape(&wj, &[h]);
            let wb = f.broadcast(&wj, &[t, h], &[1]);
            let term = f.mul(&tap, &wb);
            acc = Some(match acc {
                Some(sum) => f.add(&sum, &term),
                None => term,
            });
        }
        let y = acc.expect("invariant: the kernel has at least one tap");
        let y = self.clamp(f, &y);
        let y = self.rms(f, &y, &format!("{layer}.conv_norm"), eps);
        let y = self.c.silu(f, &y);
        let y = self.linear(f, &y, &format!("{layer}.linear_end"));
        f.add(&y, x)
    }

    /// One conformer block; `valid` is the frame mask as i1 and as f32.
    fn block(&self, f: &mut Func, x: &Value, index: usize, valid: (&Value, &Value)) -> Value {
        let l = format!("conformer.{index}");
        let x = self.feed_forward(f, x, &format!("{l}.ffw_layer_start"));
        let x = self.attention(f, &x, &format!("{l}.attention"), valid.0);
        let vb = f.broadcast(valid.1, x.shape(), &[0]);
        let x = f.mul(&x, &vb);
        let x = self.light_conv(f, &x, &format!("{l}.lconv1d"));
        let x = self.feed_forward(f, &x, &format!("{l}.ffw_layer_end"));
        let x = self.clamp(f, &x);
        self.rms(f, &x, &format!("{l}.norm"), CONFORMER_NORM_EPS)
    }

    /// `embed_audio`'s projection and post norm of normalised rows.
    fn project(&self, f: &mut Func, x: &Value) -> Value {
        let y = self.embed.project(f, x, &format!("{}embedding_projection.weight", self.embed.prefix), None);
        self.rms_unscaled(f, &y, self.audio().rms_norm_eps)
    }

    /// `embed_audio(inputs_embeds=x)`.
    fn embed_soft(&self, f: &mut Func, x: &Value) -> Value {
        let w = self.embed.t(f, "soft_embedding_norm.weight");
        let y = self.c.rms_norm(f, x, &w, self.audio().rms_norm_eps, RmsStyle::Plain);
        self.project(f, &y)
    }

    /// `embed_audio(input_ids=vocab_offset + row)`: `[1, text_hidden]`.
    fn embed_hard(&self, f: &mut Func, row: usize) -> Value {
        let table = self.embed.t(f, "embedding.weight");
        let width = table.shape()[1];
        let x = f.slice(&table, &[row, 0], &[row + 1, width]);
        let w = self.embed.t(f, "hard_embedding_norm.weight");
        let y = self.c.rms_norm(f, &x, &w, self.audio().rms_norm_eps, RmsStyle::Plain);
        self.project(f, &y)
    }
}

/// Emits the module for a bucket of `frames` mel frames (a multiple of the frames per row).
pub(crate) fn emit(
    config: &Gemma3nConfig,
    frames: usize,
    c: NumericContract,
) -> Result<String, mlxcel_emit::EmitError> {
    let a = &config.audio;
    let mut m = Module::new("gemma3n_audio");
    let globals = declare_parameters(&mut m, &parameters(config), config.weights, &c);
    let tower = Tower { c, globals: &globals, prefix: TOWER, eps: CONFORMER_NORM_EPS };
    let embed = Tower { c, globals: &globals, prefix: EMBED, eps: a.rms_norm_eps };
    let e = Emitter { c, config, tower, embed };
    let bins = a.input_feat_size;
    let args = [Type::new(Elem::F32, &[1, frames, bins]), Type::new(Elem::I32, &[1, frames])];
    let (mut func, v) = m.func("main", &args);
    let f = &mut func;
    let features = f.reshape(&v[0], &[frames, bins]);
    let mask = f.reshape(&v[1], &[frames]);
    let zero_i = f.splat(mask.ty(), 0.0);
    let valid = f.compare(Compare::Ne, &mask, &zero_i);
    let fty = Type::new(Elem::F32, &[frames]);
    let (one, zero) = (f.splat(&fty, 1.0), f.splat(&fty, 0.0));
    let valid = f.select(&valid, &one, &zero);

    let mut x = e.subsample(f, &features, &valid);
    // The reference's mask at each subsampled frame: the mask of its first mel frame.
    let sub_valid = every(f, &valid, a.time_stride());
    let half = f.splat(sub_valid.ty(), 0.5);
    let sub_valid_i1 = f.compare(Compare::Gt, &sub_valid, &half);
    for i in 0..a.num_hidden_layers {
        x = e.block(f, &x, i, (&sub_valid_i1, &sub_valid));
    }

    // Every reduction_factor-th frame, and its mask.
    let (sub, hidden) = (x.shape()[0], x.shape()[1]);
    let rows = sub / a.reduction_factor;
    let grid = f.reshape(&x, &[rows, a.reduction_factor, hidden]);
    let kept = f.slice(&grid, &[0, 0, 0], &[rows, 1, hidden]);
    let kept = f.reshape(&kept, &[rows, hidden]);
    let row_valid = every(f, &sub_valid, a.reduction_factor);
    let half = f.splat(row_valid.ty(), 0.5);
    let row_valid = f.compare(Compare::Gt, &row_valid, &half);

    let text = config.text_hidden_size as usize;
    let soft_tokens = config.audio_soft_tokens as usize;
    let soft = e.embed_soft(f, &kept);
    let padding = e.embed_hard(f, config.padding_row());
    let padding_rows = f.broadcast(&padding, &[rows, text], &[0, 1]);
    let row_valid = f.broadcast(&row_valid, &[rows, text], &[0]);
    let mut out = f.select(&row_valid, &soft, &padding_rows);
    if rows < soft_tokens {
        let rest = f.broadcast(&padding, &[soft_tokens - rows, text], &[0, 1]);
        out = f.concat(&[out, rest], 0);
    }
    let end = e.embed_hard(f, config.eoa_row());
    let end = f.broadcast(&end, &[soft_tokens, text], &[0, 1]);
    m.add_func(func, &[out, end]);
    m.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixture_config;

    #[test]
    fn the_graph_emits_for_each_bucket_with_its_declared_signature() {
        let config = fixture_config();
        let buckets = buckets(&config, Modality::Audio).expect("buckets");
        let ids: Vec<&str> = buckets.iter().map(|b| b.id.as_str()).collect();
        assert_eq!(ids, ["frames-64", "frames-128"]);
        for bucket in &buckets {
            let frames = bucket.inputs[0].shape[1];
            assert_eq!(bucket.inputs[0].shape.as_slice(), &[1, frames, 32]);
            assert_eq!((bucket.inputs[1].shape.as_slice(), bucket.inputs[1].dtype), (&[1, frames][..], DType::I32));
            let request = EncoderGraphRequest { modality: Modality::Audio, bucket: bucket.id.clone() };
            let g = graph(&config, &request, &EncoderTarget::unknown()).expect("graph");
            assert!(g.stablehlo.contains("func.func @main(%v0: tensor<1x"), "{}", g.stablehlo);
            assert_eq!(g.inputs, bucket.inputs);
            let outputs: Vec<(&str, &[u64])> =
                g.outputs.iter().map(|o| (o.name.as_str(), o.shape.as_slice())).collect();
            assert_eq!(outputs, [(FEATURES, &[8u64, 64][..]), (END, &[8, 64][..])]);
            assert_eq!(g.parameters.len(), 5 + 2 * 22 + 4);
            assert_eq!(g.parameters.len(), parameters(&config).len());
            assert!(g.stablehlo.contains("\"model\"::\"audio_tower/conformer.1.lconv1d.depthwise_conv1d.weight\""));
            assert!(g.stablehlo.contains("\"model\"::\"embed_audio/embedding_projection.weight|tile32\""));
            assert!(g.stablehlo.contains("-> (tensor<8x64xf32>, tensor<8x64xf32>)"));
        }
        let bad = EncoderGraphRequest { modality: Modality::Audio, bucket: "frames-96".into() };
        assert_eq!(graph(&config, &bad, &EncoderTarget::unknown()).expect_err("bucket").code, ErrorCode::Unsupported);
        let image = EncoderGraphRequest { modality: Modality::Image, bucket: "frames-64".into() };
        assert_eq!(graph(&config, &image, &EncoderTarget::unknown()).expect_err("image").code, ErrorCode::Unsupported);
        assert_eq!(super::buckets(&config, Modality::Image).expect_err("image").code, ErrorCode::Unsupported);
    }

    #[test]
    fn the_hub_model_buckets_halve_from_thirty_seconds() {
        let config = crate::config::Gemma3nConfig::parse(
            r#"{"model_type": "gemma3n", "text_config": {"hidden_size": 2048}}"#,
            "",
        )
        .expect("defaults");
        assert_eq!(bucket_frames(&config), [96, 192, 384, 752, 1504, 3008]);
        // 30 s of audio, 2997 frames, fits the largest.
        assert!(max_frames(&config) == 2997 && 2997 <= 3008);
    }

    #[test]
    fn the_constants_match_the_references_buffers() {
        let config = fixture_config();
        // torch: 16**-0.5 * (1 / softplus(tensor(0.))), softplus(0) = ln 2 in f32 (0x3f317218).
        assert_eq!(q_scale(&config.audio), 0.25f32 * (1.0f32 / f32::from_bits(0x3f31_7218)));
        let timing = timing_signal(&config.audio);
        assert_eq!(timing.len(), 5 * 32);
        // Distance 0 (row 4): sines 0, cosines 1.
        assert!(timing[4 * 32..4 * 32 + 16].iter().all(|&s| s == 0.0));
        assert!(timing[4 * 32 + 16..5 * 32].iter().all(|&c| c == 1.0));
        // Distance 4 (row 0), the fastest timescale: sin(4), cos(4).
        assert_eq!((timing[0], timing[16]), (4f32.sin(), 4f32.cos()));
    }
}
