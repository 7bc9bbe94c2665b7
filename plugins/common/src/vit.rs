//! Vision-tower blocks shared by the family plugins' encoder graphs: a tower's weights by name,
//! its biased linears and layer norms, and the pre-norm ViT encoder layer of SigLIP and CLIP
//! (`layer_norm1`, self-attention with separate `q_proj`/`k_proj`/`v_proj`/`out_proj`, residual,
//! `layer_norm2`, `mlp.fc1`, activation, `mlp.fc2`, residual), with its parameter list in the
//! order the graph declares it, its attention optionally positioned by the 2-D rotary embedding
//! and restricted by a mask (Youtu-VL's SigLIP2 layers, windowed as Qwen2.5-VL's); Molmo's ViT
//! block and SwiGLU projector (Molmo and Molmo2); the Qwen-VL patch merger and 2-D rotary
//! embedding, and the average pool over the patch grid that projectors use.

use std::collections::HashMap;

use mlxcel_emit::{Elem, Func, Global, Module, NumericContract, Tiles, Type, Value};
use mlxcel_plugin_api::{EncoderCompute, EncoderTarget, PluginError, RVec, TensorSpec};

use crate::config::WeightDtype;

/// The contract an encoder graph computes under on `target` in `compute`: f32 (a 16-bit
/// checkpoint's weights widened inside the graph) or bf16 (torch's bf16 on the CPU, with the
/// sums `compute` names), its weights tiled for the target's vectors
/// (`NumericContract::for_vectors`), f32 ones as 16-bit ones since an encoder contracts only
/// many rows (`NumericContract::for_many_rows`); tiles change no result.
pub fn encoder_contract(target: &EncoderTarget, compute: EncoderCompute) -> NumericContract {
    compute.contract().for_vectors(target.vector_bits()).for_many_rows()
}

/// Refuses every compute but f32, for a family whose encoder computes in f32 only.
pub fn f32_only(compute: EncoderCompute, family: &str) -> Result<(), PluginError> {
    match compute {
        EncoderCompute::F32 => Ok(()),
        other => {
            Err(PluginError::unsupported(format!("the {family} encoder computes in f32 only, not in {}", other.name())))
        }
    }
}

/// Refuses a bf16 compute over weights not stored in bf16, for a family whose encoder computes in
/// bf16 as torch does on a bf16 checkpoint: over f32 or f16 weights it would round where no
/// reference does.
pub fn bf16_on_bf16_weights(compute: EncoderCompute, weights: WeightDtype, family: &str) -> Result<(), PluginError> {
    if compute == EncoderCompute::F32 || weights == WeightDtype::BF16 {
        return Ok(());
    }
    Err(PluginError::unsupported(format!(
        "the {family} encoder computes in {} on a bf16 checkpoint only (this one stores {weights:?})",
        compute.name()
    )))
}

/// An encoder weight as its module declares it: the global, and the tiles a matrix is
/// declared in (`None`: as the checkpoint stores it).
#[derive(Debug, Clone)]
pub struct Declared {
    pub global: Global,
    pub tiles: Option<Tiles>,
}

/// Declares an encoder's weights, each `(logical name, shape)` in the dtype the checkpoint
/// stores them in: by logical name, for a [`Tower`] computing under `c`. A `*.weight` matrix
/// that `c` serves in tiles (`NumericContract::tiles`: f32 and 16-bit float weights, in tiles of
/// the target's vectors) is declared in them instead, under the key they name (the host builds
/// that view at load): [`Tower::project`] contracts it as stored, and [`Tower::w`] gives it
/// back as the `[out, in]` matrix for any other use.
pub fn declare_parameters(
    m: &mut Module,
    parameters: &[(String, Vec<usize>)],
    weights: WeightDtype,
    c: &NumericContract,
) -> HashMap<String, Declared> {
    let elem = weights.elem();
    parameters
        .iter()
        .map(|(key, shape)| {
            let tiled = match **shape {
                [out, inputs] if key.ends_with(".weight") => {
                    c.tiles(elem, out, inputs).map(|t| (t, t.shape(out, inputs)))
                }
                _ => None,
            };
            let global = match tiled {
                Some((t, tiled_shape)) => m.param(&t.key(key), Type::new(elem, &tiled_shape)),
                None => m.param(key, Type::new(elem, shape)),
            };
            (key.clone(), Declared { global, tiles: tiled.map(|(t, _)| t) })
        })
        .collect()
}

/// The same weights as an `EncoderGraph` lists them.
pub fn parameter_specs(parameters: &[(String, Vec<usize>)], weights: WeightDtype) -> RVec<TensorSpec> {
    parameters
        .iter()
        .map(|(key, shape)| TensorSpec::new(key, weights.dtype(), &shape.iter().map(|&d| d as u64).collect::<Vec<_>>()))
        .collect()
}

/// A tower's declared parameters and the prefix of its own logical names (`vision_tower/`).
#[derive(Debug)]
pub struct Tower<'a> {
    pub c: NumericContract,
    pub globals: &'a HashMap<String, Declared>,
    pub prefix: &'a str,
    /// Every layer norm's epsilon.
    pub eps: f64,
}

/// What positions and restricts a [`Tower::attention_with`] beyond the plain softmax over
/// every row: the 2-D rotary tables `(cos, sin)` `[n, head_dim]` ([`rotary_2d`]) applied to q
/// and k, and an additive f32 mask `[n, n]` added to the scaled scores (0 where a row may
/// attend, negative infinity elsewhere). The default has neither.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionOptions<'a> {
    pub rotary: Option<(&'a Value, &'a Value)>,
    pub mask: Option<&'a Value>,
}

impl Tower<'_> {
    /// The parameter `key` (a whole logical name), in the activation dtype: bf16 weights are
    /// widened where they are read, so every op computes as on f32 weights and no widened
    /// copy outlives the call (the encoders compile without const-expr hoisting).
    /// A matrix declared in row tiles and read other than by [`Tower::project`] (a patch
    /// kernel, a table) is put back in `[out, in]` order in the graph.
    pub fn w(&self, f: &mut Func, key: &str) -> Value {
        let declared = self.declared(key);
        let mut stored = f.load(&declared.global);
        if declared.tiles.is_some() {
            // `[out / rows, in / depth, rows, depth]` back to `[out, in]`.
            let &[tiles, inputs, rows, depth] = stored.shape() else { unreachable!("tiles are rank 4") };
            let t = f.transpose(&stored, &[0, 2, 1, 3]);
            stored = f.reshape(&t, &[tiles * rows, inputs * depth]);
        }
        f.convert(&stored, self.c.activations)
    }

    fn declared(&self, key: &str) -> &Declared {
        self.globals.get(key).expect("invariant: every parameter is declared")
    }

    /// `x W^T (+ bias)` with the parameter `key` (a whole logical name) as `W`: contracted as
    /// stored when it is declared in row tiles (`NumericContract::linear_tiled`), otherwise
    /// through `NumericContract::linear`.
    pub fn project(&self, f: &mut Func, x: &Value, key: &str, bias: Option<&Value>) -> Value {
        let declared = self.declared(key);
        match declared.tiles {
            Some(_) => {
                let w = f.load(&declared.global);
                self.c.linear_tiled(f, x, &w, bias)
            }
            None => {
                let w = self.w(f, key);
                self.c.linear(f, x, &w, bias)
            }
        }
    }

    /// The tower's parameter `name` (below its prefix).
    pub fn t(&self, f: &mut Func, name: &str) -> Value {
        self.w(f, &format!("{}{name}", self.prefix))
    }

    /// `x W^T + b` with the tower's `name.weight` and `name.bias`.
    pub fn linear(&self, f: &mut Func, x: &Value, name: &str) -> Value {
        let b = self.t(f, &format!("{name}.bias"));
        self.project(f, x, &format!("{}{name}.weight", self.prefix), Some(&b))
    }

    /// LayerNorm with the tower's `name.weight` and `name.bias`.
    pub fn layer_norm(&self, f: &mut Func, x: &Value, name: &str) -> Value {
        let w = self.t(f, &format!("{name}.weight"));
        let b = self.t(f, &format!("{name}.bias"));
        self.c.layer_norm(f, x, &w, &b, self.eps)
    }

    /// RMSNorm (weight only) with the tower's `name.weight`, in the Llama/Qwen order: the
    /// normalised value rounded to the activation dtype, then scaled.
    pub fn rms_norm(&self, f: &mut Func, x: &Value, name: &str) -> Value {
        let w = self.t(f, &format!("{name}.weight"));
        self.c.rms_norm(f, x, &w, self.eps, mlxcel_emit::RmsStyle::Plain)
    }

    /// Self-attention of the Qwen-VL towers over the rows of `x [n, e]`: the fused `qkv` linear
    /// under `attn` split into `heads` heads, the 2-D rotary embedding (tables `[n, d]`) on q and
    /// k, scores scaled after the product with the additive `mask [n, n]` added, softmax, then
    /// `attn.proj`.
    pub fn rotary_attention(
        &self,
        f: &mut Func,
        x: &Value,
        attn: &str,
        heads: usize,
        (cos, sin): (&Value, &Value),
        mask: &Value,
    ) -> Value {
        let (n, e) = (x.shape()[0], x.shape()[1]);
        let d = e / heads;
        let qkv = self.linear(f, x, &format!("{attn}.qkv"));
        let qkv = f.reshape(&qkv, &[n, 3, heads, d]);
        let part = |f: &mut Func, j: usize| {
            let s = f.slice(&qkv, &[0, j, 0, 0], &[n, j + 1, heads, d]);
            f.reshape(&s, &[n, heads, d])
        };
        let (q, k, val) = (part(f, 0), part(f, 1), part(f, 2));
        let q = rope(&self.c, f, &q, cos, sin);
        let k = rope(&self.c, f, &k, cos, sin);
        // scores [heads, n, n], scaled as a tensor times a Python number; the f32 mask (0 or
        // negative infinity) is added to them widened, exactly, as the softmax reads them in f32
        // (the reference attends within each image instead).
        let scores = self.c.matmul(f, &q, &k, (&[1], &[1]), (&[2], &[2]));
        let scores = self.c.act_scale(f, &scores, 1.0 / (d as f64).sqrt());
        let scores = f.convert(&scores, Elem::F32);
        let mb = f.broadcast(mask, &[heads, n, n], &[1, 2]);
        let masked = f.add(&scores, &mb);
        let probs = self.c.softmax(f, &masked);
        // out [heads, n, d] -> [n, heads * d]
        let out = self.c.matmul(f, &probs, &val, (&[0], &[1]), (&[2], &[0]));
        let out = f.transpose(&out, &[1, 0, 2]);
        let out = f.reshape(&out, &[n, e]);
        self.linear(f, &out, &format!("{attn}.proj"))
    }

    /// Full self-attention over the rows of `x [n, hidden]` with `heads` heads, the projections
    /// under `attn` (`encoder.layers.3.self_attn`); scores scaled after the product, as the
    /// references do.
    pub fn attention(&self, f: &mut Func, x: &Value, attn: &str, heads: usize) -> Value {
        self.attention_with(f, x, attn, heads, AttentionOptions::default())
    }

    /// [`Tower::attention`] with `options`: the 2-D rotary embedding on q and k after their
    /// projections, and an additive mask on the scaled scores (SigLIP2's layers in Youtu-VL's
    /// windowed tower). Without options it is exactly the plain attention.
    pub fn attention_with(
        &self,
        f: &mut Func,
        x: &Value,
        attn: &str,
        heads: usize,
        options: AttentionOptions<'_>,
    ) -> Value {
        let (n, e) = (x.shape()[0], x.shape()[1]);
        let d = e / heads;
        let project = |f: &mut Func, proj: &str| {
            let y = self.linear(f, x, &format!("{attn}.{proj}"));
            f.reshape(&y, &[n, heads, d])
        };
        let mut q = project(f, "q_proj");
        let mut k = project(f, "k_proj");
        let val = project(f, "v_proj");
        if let Some((cos, sin)) = options.rotary {
            q = rope(&self.c, f, &q, cos, sin);
            k = rope(&self.c, f, &k, cos, sin);
        }
        // scores [heads, n, n] = q k^T, then scaled (torch: matmul(q, k^T) * scaling).
        let scores = self.c.matmul(f, &q, &k, (&[1], &[1]), (&[2], &[2]));
        let scale = f.splat(scores.ty(), (d as f64).powf(-0.5));
        let mut scores = f.mul(&scores, &scale);
        if let Some(mask) = options.mask {
            let mb = f.broadcast(mask, &[heads, n, n], &[1, 2]);
            scores = f.add(&scores, &mb);
        }
        let probs = self.c.softmax(f, &scores);
        // [heads, n, d] -> [n, heads * d]
        let out = self.c.matmul(f, &probs, &val, (&[0], &[1]), (&[2], &[0]));
        let out = f.transpose(&out, &[1, 0, 2]);
        let out = f.reshape(&out, &[n, e]);
        self.linear(f, &out, &format!("{attn}.out_proj"))
    }

    /// The pre-norm encoder layer under `layer` (`encoder.layers.3`), `act` the MLP's activation.
    pub fn pre_norm_layer(
        &self,
        f: &mut Func,
        x: &Value,
        layer: &str,
        heads: usize,
        act: impl Fn(&mut Func, &Value) -> Value,
    ) -> Value {
        self.pre_norm_layer_with(f, x, layer, heads, AttentionOptions::default(), act)
    }

    /// [`Tower::pre_norm_layer`] with its attention's `options` ([`Tower::attention_with`]).
    pub fn pre_norm_layer_with(
        &self,
        f: &mut Func,
        x: &Value,
        layer: &str,
        heads: usize,
        options: AttentionOptions<'_>,
        act: impl Fn(&mut Func, &Value) -> Value,
    ) -> Value {
        let h = self.layer_norm(f, x, &format!("{layer}.layer_norm1"));
        let h = self.attention_with(f, &h, &format!("{layer}.self_attn"), heads, options);
        let x = self.c.residual(f, x, &h);
        let h = self.layer_norm(f, &x, &format!("{layer}.layer_norm2"));
        let h = self.linear(f, &h, &format!("{layer}.mlp.fc1"));
        let h = act(f, &h);
        let h = self.linear(f, &h, &format!("{layer}.mlp.fc2"));
        self.c.residual(f, &x, &h)
    }

    /// `x W^T (+ b)` with the tower's `name.weight`, and `name.bias` when `bias`.
    pub fn linear_maybe_biased(&self, f: &mut Func, x: &Value, name: &str, bias: bool) -> Value {
        if bias {
            return self.linear(f, x, name);
        }
        self.project(f, x, &format!("{}{name}.weight", self.prefix), None)
    }

    /// One residual attention block of Molmo's ViT (Molmo's and Molmo2's) under `layer`
    /// (`image_vit.transformer.resblocks.3`) over `x [C, P, e]`, each crop attending within
    /// itself: `attention_norm`, the `attention.{wq,wk,wv,wo}` projections (biased when
    /// `bias`) around [`attend`], residual; `ffn_norm`, `feed_forward.w1` (biased), `act`,
    /// `feed_forward.w2` (biased), residual.
    #[allow(clippy::too_many_arguments)]
    pub fn molmo_resblock(
        &self,
        f: &mut Func,
        x: &Value,
        layer: &str,
        (heads, head_dim): (usize, usize),
        bias: bool,
        act: impl Fn(&mut Func, &Value) -> Value,
    ) -> Value {
        let (crops, rows) = (x.shape()[0], x.shape()[1]);
        let h = self.layer_norm(f, x, &format!("{layer}.attention_norm"));
        let project = |f: &mut Func, w: &str| {
            let y = self.linear_maybe_biased(f, &h, &format!("{layer}.attention.{w}"), bias);
            f.reshape(&y, &[crops, rows, heads, head_dim])
        };
        let (q, k, v) = (project(f, "wq"), project(f, "wk"), project(f, "wv"));
        let att = attend(&self.c, f, &q, &k, &v, None);
        let att = self.linear_maybe_biased(f, &att, &format!("{layer}.attention.wo"), bias);
        let x = self.c.residual(f, x, &att);
        let h = self.layer_norm(f, &x, &format!("{layer}.ffn_norm"));
        let h = self.linear(f, &h, &format!("{layer}.feed_forward.w1"));
        let h = act(f, &h);
        let h = self.linear(f, &h, &format!("{layer}.feed_forward.w2"));
        self.c.residual(f, &x, &h)
    }

    /// Molmo's SwiGLU projector under `prefix` (`image_projector`): `w2(silu(w1(x)) * w3(x))`,
    /// all three unbiased.
    pub fn swiglu_projector(&self, f: &mut Func, x: &Value, prefix: &str) -> Value {
        let gate = self.linear_maybe_biased(f, x, &format!("{prefix}.w1"), false);
        let up = self.linear_maybe_biased(f, x, &format!("{prefix}.w3"), false);
        let act = self.c.silu(f, &gate);
        let prod = f.mul(&act, &up);
        self.linear_maybe_biased(f, &prod, &format!("{prefix}.w2"), false)
    }

    /// The patch merger of the Qwen-VL towers: `norm(x)`, each `area` consecutive rows (one
    /// merge group, in the processor's merge order) concatenated into one, then `fc1`, `act`,
    /// `fc2` (biased linears of the tower). `[n, e]` to `[n / area, out]`.
    pub fn patch_merger(
        &self,
        f: &mut Func,
        x: &Value,
        area: usize,
        norm: impl Fn(&mut Func, &Value) -> Value,
        [fc1, fc2]: [&str; 2],
        act: impl Fn(&mut Func, &Value) -> Value,
    ) -> Value {
        let (n, e) = (x.shape()[0], x.shape()[1]);
        let h = norm(f, x);
        let h = f.reshape(&h, &[n / area, e * area]);
        let h = self.linear(f, &h, fc1);
        let h = act(f, &h);
        self.linear(f, &h, fc2)
    }
}

/// Scaled dot-product attention within each batch row: `q [b, lq, heads, d]` against `k` and
/// `v [b, lk, heads, d]`, with an optional additive f32 `mask [b, lq, lk]`; scores scaled by
/// `d^-0.5` after the product (as eager attention does), softmax, then `[b, lq, heads * d]`.
/// Crops of a multi-crop tower attend within their crop, pooled queries within their group.
pub fn attend(c: &NumericContract, f: &mut Func, q: &Value, k: &Value, v: &Value, mask: Option<&Value>) -> Value {
    let (b, lq, heads, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let lk = k.shape()[1];
    // scores [b, heads, lq, lk]
    let scores = c.matmul(f, q, k, (&[0, 2], &[0, 2]), (&[3], &[3]));
    let scale = f.splat(scores.ty(), (d as f64).powf(-0.5));
    let scores = f.mul(&scores, &scale);
    let scores = match mask {
        Some(m) => {
            let mb = f.broadcast(m, &[b, heads, lq, lk], &[0, 2, 3]);
            f.add(&scores, &mb)
        }
        None => scores,
    };
    let probs = c.softmax(f, &scores);
    // out [b, heads, lq, d] -> [b, lq, heads * d]
    let out = c.matmul(f, &probs, v, (&[0, 1], &[0, 2]), (&[3], &[1]));
    let out = f.transpose(&out, &[0, 2, 1, 3]);
    f.reshape(&out, &[b, lq, heads * d])
}

/// The 2-D rotary tables of the Qwen-VL towers, cos and sin `[n, head_dim]`: per row, the
/// frequencies of its height position then those of its width position (`positions [n, 2]`,
/// i32), each `pos * inv_freq` with torch's `1 / theta ** (arange(0, d/2, 2) / (d/2))` in f32,
/// the pair duplicated over both halves.
pub fn rotary_2d(f: &mut Func, positions: &Value, head_dim: usize, theta: f64) -> (Value, Value) {
    let n = positions.shape()[0];
    let spatial = head_dim / 2;
    let theta = theta as f32;
    let inv: Vec<f32> = (0..spatial / 2).map(|i| 1.0 / theta.powf((2 * i) as f32 / spatial as f32)).collect();
    let k = inv.len();
    let inv = f.constant_f32(&[k], &inv);
    let ib = f.broadcast(&inv, &[n, 2, k], &[2]);
    let p = f.convert(positions, Elem::F32);
    let pb = f.broadcast(&p, &[n, 2, k], &[0, 1]);
    let freqs = f.mul(&pb, &ib);
    let freqs = f.reshape(&freqs, &[n, 2 * k]);
    let freqs = f.concat(&[freqs.clone(), freqs], 1);
    // The tables are f32 under every contract.
    NumericContract::f32().cos_sin(f, &freqs)
}

/// `x * cos + rotate_half(x) * sin` for `x [n, heads, d]` and f32 tables `[n, d]`, as the
/// towers' `apply_rotary_pos_emb_vision` computes it: `x` widened to f32, the rotation in f32,
/// rounded once to `c`'s activations (no rounding under f32).
pub fn rope(c: &NumericContract, f: &mut Func, x: &Value, cos: &Value, sin: &Value) -> Value {
    let s = x.shape().to_vec();
    let (n, h, d) = (s[0], s[1], s[2]);
    let half = d / 2;
    let x = f.convert(x, Elem::F32);
    let x1 = f.slice(&x, &[0, 0, 0], &[n, h, half]);
    let x2 = f.slice(&x, &[0, 0, half], &[n, h, d]);
    let nx2 = f.neg(&x2);
    let rot = f.concat(&[nx2, x1], 2);
    let cb = f.broadcast(cos, &s, &[0, 2]);
    let sb = f.broadcast(sin, &s, &[0, 2]);
    let a = f.mul(&x, &cb);
    let r = f.mul(&rot, &sb);
    let y = f.add(&a, &r);
    c.round(f, &y)
}

/// `AvgPool2d(k, stride=k)` over the `side x side` grid of patch rows `x [side * side, e]`
/// (row-major): `[(side / k)^2, e]`, pooled rows row-major, each the mean of its `k x k`
/// window summed in the window's row-major order, then divided by `k * k`.
pub fn avg_pool_grid(f: &mut Func, x: &Value, side: usize, k: usize) -> Value {
    let e = x.shape()[1];
    let t = side / k;
    // Patch (ty * k + i, tx * k + j) is row ((ty * k + i) * side + tx * k + j).
    let grid = f.reshape(x, &[t, k, t, k, e]);
    let mut sum: Option<Value> = None;
    for i in 0..k {
        for j in 0..k {
            let one = f.slice(&grid, &[0, i, 0, j, 0], &[t, i + 1, t, j + 1, e]);
            let one = f.reshape(&one, &[t, t, e]);
            sum = Some(match sum {
                Some(acc) => f.add(&acc, &one),
                None => one,
            });
        }
    }
    let sum = sum.expect("invariant: the kernel is at least 1x1");
    let count = f.splat(sum.ty(), (k * k) as f64);
    let mean = f.div(&sum, &count);
    f.reshape(&mean, &[t * t, e])
}

/// The parameters of [`Tower::pre_norm_layer`] for the layer whose whole logical prefix is
/// `layer` (`vision_tower/encoder.layers.3`), in declaration order.
pub fn pre_norm_layer_parameters(layer: &str, hidden: usize, intermediate: usize) -> Vec<(String, Vec<usize>)> {
    let n = |s: &str| format!("{layer}.{s}");
    let (e, mlp) = (hidden, intermediate);
    vec![
        (n("layer_norm1.weight"), vec![e]),
        (n("layer_norm1.bias"), vec![e]),
        (n("self_attn.q_proj.weight"), vec![e, e]),
        (n("self_attn.q_proj.bias"), vec![e]),
        (n("self_attn.k_proj.weight"), vec![e, e]),
        (n("self_attn.k_proj.bias"), vec![e]),
        (n("self_attn.v_proj.weight"), vec![e, e]),
        (n("self_attn.v_proj.bias"), vec![e]),
        (n("self_attn.out_proj.weight"), vec![e, e]),
        (n("self_attn.out_proj.bias"), vec![e]),
        (n("layer_norm2.weight"), vec![e]),
        (n("layer_norm2.bias"), vec![e]),
        (n("mlp.fc1.weight"), vec![mlp, e]),
        (n("mlp.fc1.bias"), vec![mlp]),
        (n("mlp.fc2.weight"), vec![e, mlp]),
        (n("mlp.fc2.bias"), vec![e]),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-linear tower over a `[64, 8]` matrix stored as `weights`, emitted for `target`.
    fn one_linear(target: EncoderTarget, weights: WeightDtype) -> String {
        let mut m = Module::new("t");
        let parameters = [("v/fc.weight".to_owned(), vec![64, 8]), ("v/fc.bias".to_owned(), vec![64])];
        let c = encoder_contract(&target, EncoderCompute::F32);
        let globals = declare_parameters(&mut m, &parameters, weights, &c);
        let tower = Tower { c, globals: &globals, prefix: "v/", eps: 1e-6 };
        let (mut func, a) = m.func("main", &[Type::new(Elem::F32, &[4, 8])]);
        let y = tower.linear(&mut func, &a[0], "fc");
        let w = tower.t(&mut func, "fc.weight");
        m.add_func(func, &[y, w]);
        m.finish().expect("the tower emits")
    }

    #[test]
    fn float_matrices_are_tiled_for_the_targets_vectors() {
        let avx2 = one_linear(EncoderTarget::new(Some(256)), WeightDtype::BF16);
        assert!(avx2.contains("\"v/fc.weight|tile16\"") && avx2.contains("tensor<4x8x16x1xbf16>"), "{avx2}");
        for target in [EncoderTarget::unknown(), EncoderTarget::new(Some(512))] {
            let wide = one_linear(target, WeightDtype::BF16);
            assert!(wide.contains("\"v/fc.weight|tile32\"") && wide.contains("tensor<2x8x32x1xbf16>"), "{wide}");
        }
        // f32 matrices take the same tiles in an encoder (many rows only); vectors are not tiled.
        let f32 = one_linear(EncoderTarget::new(Some(256)), WeightDtype::F32);
        assert!(f32.contains("\"v/fc.weight|tile16\"") && f32.contains("tensor<4x8x16x1xf32>"), "{f32}");
        assert!(f32.contains("\"v/fc.bias\""), "{f32}");
        // The matrix read whole comes back as `[out, in]`.
        assert!(avx2.contains("-> (tensor<4x64xf32>, tensor<64x8xf32>)"), "{avx2}");
    }
}
