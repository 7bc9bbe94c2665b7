//! The decoder bundle as StableHLO: one module whose exports share one
//! packed, device-resident KV cache.
//!
//! - `embed(tokens[T]) -> [T, H]`: the embedding table's rows, unscaled (a caller that
//!   prefills from embeddings applies the family's scale itself, once)
//! - `prefill_embeddings(x[T, H], pos[T], mask[K, T, C], slot, start) -> hidden[T, H]`
//! - `prefill_tokens(tokens[T], pos[T], mask[K, T, C], slot, start) -> hidden[T, H]`
//! - `logits(hidden[T, H]) -> logits[T, V]`: every row (verification and tests)
//! - `logits_at(hidden[T, H], row) -> logits[1, V]`: one row, what serving needs
//! - `decode(tokens[S], pos[S], write[S], mask[K, S, C]) -> logits[S, V]`
//! - `kv_slot(slot) -> [L, 2, C, KVH, D]` (tests and diagnostics)
//!
//! `T` is the prefill chunk, `C` the cache rows per slot (the context
//! capacity plus one chunk of slack, so a chunk may start anywhere below the
//! capacity: bidirectional blocks move chunk starts), `S` the slot count,
//! `K` the number of attention kinds in use (full, sliding: one mask each).
//! Prefill returns the final-normed hidden state and leaves the LM head to
//! `logits`/`logits_at`: a prompt needs the logits of its last row only,
//! and the head over every row of a chunk was about 39% of a Qwen2-VL-2B
//! prefill.
//! The cache is one global `[L, 2, S, C, KVH, D]` (packed: IREE 3.13 fuses
//! separately declared DUS-only globals). Masks are additive and built by the
//! host, so causal, padded and family-specific masks all take one path.

use std::cell::RefCell;

use mlxcel_emit::{Elem, EmitError, Func, Global, Module, NumericContract, Type, Value};

use crate::config::{Activation, LayerKind, TextConfig};
use crate::weights::{DecoderWeights, Index, WeightsError};

/// Why a bundle cannot be emitted for a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error(transparent)]
    Emit(#[from] EmitError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
}

/// The fixed shapes a bundle is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BundleShape {
    /// Tokens per prefill call.
    pub chunk: usize,
    /// Cache rows per slot; a multiple of `chunk`.
    pub capacity: usize,
    pub slots: usize,
}

impl BundleShape {
    /// Cache rows per slot: the capacity plus one chunk of slack, so that a
    /// chunk starting anywhere before the capacity stays inside the cache
    /// (`dynamic_update_slice` would otherwise clamp its start).
    pub fn rows(&self) -> usize {
        self.capacity + self.chunk
    }
}

struct Layer {
    ln1: Global,
    q: Global,
    k: Global,
    v: Global,
    qkv_bias: Option<[Global; 3]>,
    qk_norm: Option<[Global; 2]>,
    o: Global,
    /// Gemma's norm on the attention output, before the residual add.
    post_attn: Option<Global>,
    /// The norm before the MLP.
    ln2: Global,
    /// Gemma's norm on the MLP output, before the residual add.
    post_mlp: Option<Global>,
    gate: Global,
    up: Global,
    down: Global,
}

struct Weights {
    embed: Global,
    layers: Vec<Layer>,
    norm: Global,
    lm_head: Global,
}

/// Which cache slots the rows of a call use.
enum Slots {
    /// One slot (runtime index) for every row: prefill.
    One(Value),
    /// Row `b` uses slot `b`: decode.
    All,
}

struct Emitter<'a> {
    cfg: &'a TextConfig,
    shape: BundleShape,
    c: NumericContract,
    w: Weights,
    cache: Global,
}

/// Emits the bundle module for `cfg` on the checkpoint `index`, whose weights `names`
/// locates; every tensor the graph declares is checked against `index` (present, of the
/// config's shape, stored dense in `weights`) and every problem reported before any MLIR
/// is returned.
pub fn emit(
    cfg: &TextConfig,
    names: &DecoderWeights,
    index: &Index,
    shape: BundleShape,
    contract: NumericContract,
    weights: Elem,
) -> Result<String, GraphError> {
    let mut m = Module::new("decoder");
    // Every declared parameter, for the check against the checkpoint.
    let declared: RefCell<Vec<(String, Vec<usize>)>> = RefCell::default();
    let p = |m: &mut Module, key: String, shape: &[usize]| {
        declared.borrow_mut().push((key.clone(), shape.to_vec()));
        m.param(&key, Type::new(weights, shape))
    };
    let (h, d) = (cfg.hidden, cfg.head_dim);
    let embed = p(&mut m, names.embed(), &[cfg.vocab, h]);
    let mut layers = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        let n = |s: &str| names.key(&format!("layers.{i}.{s}"));
        layers.push(Layer {
            ln1: p(&mut m, n("input_layernorm.weight"), &[h]),
            q: p(&mut m, n("self_attn.q_proj.weight"), &[cfg.heads * d, h]),
            k: p(&mut m, n("self_attn.k_proj.weight"), &[cfg.kv_heads * d, h]),
            v: p(&mut m, n("self_attn.v_proj.weight"), &[cfg.kv_heads * d, h]),
            qkv_bias: cfg.qkv_bias.then(|| {
                [
                    p(&mut m, n("self_attn.q_proj.bias"), &[cfg.heads * d]),
                    p(&mut m, n("self_attn.k_proj.bias"), &[cfg.kv_heads * d]),
                    p(&mut m, n("self_attn.v_proj.bias"), &[cfg.kv_heads * d]),
                ]
            }),
            qk_norm: cfg.qk_norm.then(|| {
                [p(&mut m, n("self_attn.q_norm.weight"), &[d]), p(&mut m, n("self_attn.k_norm.weight"), &[d])]
            }),
            o: p(&mut m, n("self_attn.o_proj.weight"), &[h, cfg.heads * d]),
            post_attn: cfg.sandwich_norms.then(|| p(&mut m, n("post_attention_layernorm.weight"), &[h])),
            ln2: if cfg.sandwich_norms {
                p(&mut m, n("pre_feedforward_layernorm.weight"), &[h])
            } else {
                p(&mut m, n("post_attention_layernorm.weight"), &[h])
            },
            post_mlp: cfg.sandwich_norms.then(|| p(&mut m, n("post_feedforward_layernorm.weight"), &[h])),
            gate: p(&mut m, n("mlp.gate_proj.weight"), &[cfg.intermediate, h]),
            up: p(&mut m, n("mlp.up_proj.weight"), &[cfg.intermediate, h]),
            down: p(&mut m, n("mlp.down_proj.weight"), &[h, cfg.intermediate]),
        });
    }
    let norm = p(&mut m, names.key("norm.weight"), &[h]);
    let lm_head = match &names.lm_head {
        Some(key) => p(&mut m, key.clone(), &[cfg.vocab, h]),
        None => embed.clone(),
    };
    let cache_ty = Type::new(contract.activations, &[cfg.layers, 2, shape.slots, shape.rows(), cfg.kv_heads, d]);
    let cache = m.state("kv", cache_ty, 0.0);
    let e = Emitter { cfg, shape, c: contract, w: Weights { embed, layers, norm, lm_head }, cache };

    let (t, cap, s) = (shape.chunk, shape.rows(), shape.slots);
    let i32s = |n: usize| Type::new(Elem::I32, &[n]);
    let scalar = Type::scalar(Elem::I32);
    let kinds = cfg.kinds().len();
    // Positions: one stream, or three (t, h, w) for M-RoPE.
    let streams = if cfg.mrope.is_some() { 3 } else { 1 };
    let pos_ty = |n: usize| if streams == 3 { Type::new(Elem::I32, &[3, n]) } else { Type::new(Elem::I32, &[n]) };
    let mask = |n: usize| Type::new(Elem::F32, &[kinds, n, cap]);

    // embed: raw rows; the token paths below scale them in the graph.
    let (mut f, a) = m.func("embed", &[i32s(t)]);
    let x = e.rows(&mut f, &a[0]);
    m.add_func(f, &[x]);

    // prefill_embeddings
    // (with DeepStack: a further `injections[K, T, H]` added after layers 0..K)
    let mut args = vec![contract.act(&[t, h]), pos_ty(t), mask(t), scalar.clone(), scalar.clone()];
    if cfg.deepstack_layers > 0 {
        args.push(contract.act(&[cfg.deepstack_layers, t, h]));
    }
    let (mut f, a) = m.func("prefill_embeddings", &args);
    let x = f.reshape(&a[0], &[1, t, h]);
    let injections = a.get(5).cloned();
    let hidden = e.forward(&mut f, &x, &a[1], &a[2], Slots::One(a[3].clone()), &[a[4].clone()], injections);
    m.add_func(f, &[hidden]);

    // prefill_tokens
    let (mut f, a) = m.func("prefill_tokens", &[i32s(t), pos_ty(t), mask(t), scalar.clone(), scalar]);
    let x = e.embed(&mut f, &a[0]);
    let x = f.reshape(&x, &[1, t, h]);
    let hidden = e.forward(&mut f, &x, &a[1], &a[2], Slots::One(a[3].clone()), &[a[4].clone()], None);
    m.add_func(f, &[hidden]);

    // logits: the head over every row of a prefill's hidden state.
    let (mut f, a) = m.func("logits", &[contract.act(&[t, h])]);
    let logits = e.head(&mut f, &a[0]);
    m.add_func(f, &[logits]);

    // logits_at: the head over one row.
    let (mut f, a) = m.func("logits_at", &[contract.act(&[t, h]), Type::scalar(Elem::I32)]);
    let zero = f.splat(&Type::scalar(Elem::I32), 0.0);
    let row = f.dynamic_slice(&a[0], &[a[1].clone(), zero], &[1, h]);
    let logits = e.head(&mut f, &row);
    m.add_func(f, &[logits]);

    // kv_slot: one slot's cache [L, 2, C, KVH, D], for tests and diagnostics.
    let (mut f, a) = m.func("kv_slot", &[Type::scalar(Elem::I32)]);
    let all = f.load(&e.cache);
    let zero = f.splat(&Type::scalar(Elem::I32), 0.0);
    let at = [zero.clone(), zero.clone(), a[0].clone(), zero.clone(), zero.clone(), zero];
    let one = f.dynamic_slice(&all, &at, &[cfg.layers, 2, 1, cap, cfg.kv_heads, d]);
    let one = f.reshape(&one, &[cfg.layers, 2, cap, cfg.kv_heads, d]);
    m.add_func(f, &[one]);

    // decode: row b is slot b, one token each.
    let (mut f, a) = m.func("decode", &[i32s(s), pos_ty(s), i32s(s), mask(s)]);
    let x = e.embed(&mut f, &a[0]);
    let x = f.reshape(&x, &[s, 1, h]);
    let writes: Vec<Value> = (0..s)
        .map(|b| {
            let one = f.slice(&a[2], &[b], &[b + 1]);
            f.reshape(&one, &[])
        })
        .collect();
    let hidden = e.forward(&mut f, &x, &a[1], &a[3], Slots::All, &writes, None);
    let logits = e.head(&mut f, &hidden);
    m.add_func(f, &[logits]);

    let declared = declared.into_inner();
    DecoderWeights::check(index, declared.iter().map(|(k, s)| (k.as_str(), s.as_slice())), weights)?;
    Ok(m.finish()?)
}

impl Emitter<'_> {
    /// The embedding table's rows for `tokens`, in the activation dtype.
    fn rows(&self, f: &mut Func, tokens: &Value) -> Value {
        let table = f.load(&self.w.embed);
        let rows = f.gather_rows(&table, tokens);
        f.convert(&rows, self.c.activations)
    }

    /// The rows scaled by the family's embedding scale (Gemma's `sqrt(hidden)`): what the token
    /// paths feed the layers.
    fn embed(&self, f: &mut Func, tokens: &Value) -> Value {
        let rows = self.rows(f, tokens);
        match self.cfg.embed_scale {
            // torch multiplies by the f32 scale cast to the weight dtype.
            Some(scale) => {
                let k = f.constant_f32(&[], &[scale]);
                let k = f.convert(&k, self.c.activations);
                let kb = f.broadcast(&k, rows.shape(), &[]);
                f.mul(&rows, &kb)
            }
            None => rows,
        }
    }

    /// Runs the layers on `x [B, T, H]` and returns the final-normed hidden
    /// state `[B*T, H]` (`[T, H]` for prefill, `[S, H]` for decode). `pos` is `[B*T]`,
    /// `masks` `[K, B*T, C]`; `writes` holds each row group's first cache row.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        f: &mut Func,
        x: &Value,
        pos: &Value,
        masks: &Value,
        slots: Slots,
        writes: &[Value],
        injections: Option<Value>,
    ) -> Value {
        let (b, t, h) = (x.shape()[0], x.shape()[1], self.cfg.hidden);
        let cap = self.shape.rows();
        // Per attention kind: its rotary tables and its mask [B, T, C].
        let mut per_kind: Vec<(LayerKind, Value, Value, Value)> = Vec::new();
        for (i, kind) in self.cfg.kinds().into_iter().enumerate() {
            let (cos, sin) = self.rope_tables(f, kind, pos, b, t);
            let m = f.slice(masks, &[i, 0, 0], &[i + 1, b * t, cap]);
            let m = f.reshape(&m, &[b, t, cap]);
            per_kind.push((kind, cos, sin, m));
        }
        let mut cache = f.load(&self.cache);
        let mut x = x.clone();
        for (l, layer) in self.w.layers.iter().enumerate() {
            let kind = self.cfg.layer_kinds[l];
            let (_, cos, sin, mask) =
                per_kind.iter().find(|(k, ..)| *k == kind).expect("invariant: every layer kind has tables");
            let (y, updated) = self.layer(f, l, layer, &x, cos, sin, mask, &slots, writes, cache);
            cache = updated;
            x = y;
            // DeepStack: rows without features get zeros, and x + 0 is x.
            if let Some(inj) = injections.as_ref().filter(|i| l < i.shape()[0]) {
                let one = f.slice(inj, &[l, 0, 0], &[l + 1, t, h]);
                let one = f.reshape(&one, &[b, t, h]);
                x = f.add(&x, &one);
            }
        }
        f.store(&self.cache, &cache);
        let norm = f.load(&self.w.norm);
        let x = self.c.rms_norm(f, &x, &norm, self.cfg.rms_eps, self.cfg.norm_style);
        f.reshape(&x, &[b * t, h])
    }

    /// The LM head over final-normed rows `[R, H]`: f32 logits `[R, V]`.
    fn head(&self, f: &mut Func, x: &Value) -> Value {
        let head = f.load(&self.w.lm_head);
        let logits = self.c.linear(f, x, &head, None);
        f.convert(&logits, Elem::F32)
    }

    /// cos/sin `[B, T, D]` from positions, as transformers' rotary
    /// embedding: `freqs = pos * inv_freq`, duplicated over both halves. With
    /// M-RoPE each rotary pair takes its frequency from its stream's position.
    fn rope_tables(&self, f: &mut Func, kind: LayerKind, pos: &Value, b: usize, t: usize) -> (Value, Value) {
        let d = self.cfg.head_dim;
        let inv = self.cfg.inv_freq(kind);
        if let Some(mrope) = &self.cfg.mrope {
            let half = d / 2;
            let inv = f.constant_f32(&[half], &inv);
            let ib = f.broadcast(&inv, &[b, t, half], &[2]);
            let p = f.convert(pos, Elem::F32);
            let mut freqs: Option<Value> = None;
            for stream in 0..3 {
                let ps = f.slice(&p, &[stream, 0], &[stream + 1, b * t]);
                let ps = f.reshape(&ps, &[b, t]);
                let pb = f.broadcast(&ps, &[b, t, half], &[0, 1]);
                let fs = f.mul(&pb, &ib);
                // Exact selection: x * 1 + y * 0 + z * 0 is x for finite y, z.
                let onehot: Vec<f32> = (0..half).map(|j| if mrope.stream(j) == stream { 1.0 } else { 0.0 }).collect();
                let oh = f.constant_f32(&[half], &onehot);
                let ohb = f.broadcast(&oh, &[b, t, half], &[2]);
                let picked = f.mul(&fs, &ohb);
                freqs = Some(match freqs {
                    Some(acc) => f.add(&acc, &picked),
                    None => picked,
                });
            }
            let freqs = freqs.expect("invariant: three streams");
            let freqs = f.concat(&[freqs.clone(), freqs], 2);
            let (cos, sin) = (f.cos(&freqs), f.sin(&freqs));
            return (f.convert(&cos, self.c.activations), f.convert(&sin, self.c.activations));
        }
        let mut both = inv.clone();
        both.extend_from_slice(&inv);
        let inv = f.constant_f32(&[d], &both);
        let p = f.convert(pos, Elem::F32);
        let p = f.reshape(&p, &[b, t]);
        let pb = f.broadcast(&p, &[b, t, d], &[0, 1]);
        let ib = f.broadcast(&inv, &[b, t, d], &[2]);
        let freqs = f.mul(&pb, &ib);
        let (cos, sin) = (f.cos(&freqs), f.sin(&freqs));
        (f.convert(&cos, self.c.activations), f.convert(&sin, self.c.activations))
    }

    /// `x * cos + rotate_half(x) * sin` for `x [B, T, N, D]`.
    fn rope(&self, f: &mut Func, x: &Value, cos: &Value, sin: &Value) -> Value {
        let s = x.shape().to_vec();
        let (n, d) = (s[2], s[3]);
        let half = d / 2;
        let x1 = f.slice(x, &[0, 0, 0, 0], &[s[0], s[1], n, half]);
        let x2 = f.slice(x, &[0, 0, 0, half], &[s[0], s[1], n, d]);
        let nx2 = f.neg(&x2);
        let rot = f.concat(&[nx2, x1], 3);
        let cb = f.broadcast(cos, &s, &[0, 1, 3]);
        let sb = f.broadcast(sin, &s, &[0, 1, 3]);
        let a = f.mul(x, &cb);
        let r = f.mul(&rot, &sb);
        f.add(&a, &r)
    }

    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        f: &mut Func,
        l: usize,
        w: &Layer,
        x: &Value,
        cos: &Value,
        sin: &Value,
        mask: &Value,
        slots: &Slots,
        writes: &[Value],
        cache: Value,
    ) -> (Value, Value) {
        let cfg = self.cfg;
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let (nh, kvh, d, cap) = (cfg.heads, cfg.kv_heads, cfg.head_dim, self.shape.rows());
        let g = nh / kvh;
        let c = &self.c;

        let ln1 = f.load(&w.ln1);
        let style = cfg.norm_style;
        let hx = c.rms_norm(f, x, &ln1, cfg.rms_eps, style);
        let bias = |f: &mut Func, i: usize| w.qkv_bias.as_ref().map(|bs| f.load(&bs[i]));
        let proj = |f: &mut Func, wg: &Global, bi: Option<Value>, heads: usize| {
            let wv = f.load(wg);
            let y = c.linear(f, &hx, &wv, bi.as_ref());
            f.reshape(&y, &[b, t, heads, d])
        };
        let bq = bias(f, 0);
        let mut q = proj(f, &w.q, bq, nh);
        let bk = bias(f, 1);
        let mut k = proj(f, &w.k, bk, kvh);
        let bv = bias(f, 2);
        let v = proj(f, &w.v, bv, kvh);
        if let Some([qn, kn]) = &w.qk_norm {
            let qn = f.load(qn);
            q = c.rms_norm(f, &q, &qn, cfg.rms_eps, style);
            let kn = f.load(kn);
            k = c.rms_norm(f, &k, &kn, cfg.rms_eps, style);
        }
        let q = self.rope(f, &q, cos, sin);
        let k = self.rope(f, &k, cos, sin);

        // Write this call's K and V rows into the cache.
        let idx = |f: &mut Func, v: usize| f.splat(&Type::scalar(Elem::I32), v as f64);
        let zero = idx(f, 0);
        let lidx = idx(f, l);
        let mut cache = cache;
        for (which, kv) in [(0usize, &k), (1, &v)] {
            let widx = idx(f, which);
            for (row, write) in writes.iter().enumerate().take(b) {
                let part = f.slice(kv, &[row, 0, 0, 0], &[row + 1, t, kvh, d]);
                let part = f.reshape(&part, &[1, 1, 1, t, kvh, d]);
                let slot = match slots {
                    Slots::One(s) => s.clone(),
                    Slots::All => idx(f, row),
                };
                let at = [lidx.clone(), widx.clone(), slot, write.clone(), zero.clone(), zero.clone()];
                cache = f.dynamic_update_slice(&cache, &part, &at);
            }
        }

        // Read every cache row of the slots this call uses: [B, C, KVH, D].
        let s_all = self.shape.slots;
        let read = |f: &mut Func, which: usize| -> Value {
            match slots {
                Slots::One(s) => {
                    let w = idx(f, which);
                    let at = [lidx.clone(), w, s.clone(), zero.clone(), zero.clone(), zero.clone()];
                    let r = f.dynamic_slice(&cache, &at, &[1, 1, 1, cap, kvh, d]);
                    f.reshape(&r, &[1, cap, kvh, d])
                }
                Slots::All => {
                    let r = f.slice(&cache, &[l, which, 0, 0, 0, 0], &[l + 1, which + 1, s_all, cap, kvh, d]);
                    f.reshape(&r, &[s_all, cap, kvh, d])
                }
            }
        };
        let keys = read(f, 0);
        let values = read(f, 1);

        // Grouped-query attention: q [B, T, KVH, G, D] against keys [B, C, KVH, D].
        let qg = f.reshape(&q, &[b, t, kvh, g, d]);
        // scores [B, KVH, T, G, C]
        let scores = c.matmul(f, &qg, &keys, (&[0, 2], &[0, 2]), (&[4], &[3]));
        let scale = f.splat(scores.ty(), cfg.attn_scale);
        let scores = f.mul(&scores, &scale);
        let sa = f.convert(&scores, Elem::F32);
        let mb = f.broadcast(mask, &[b, kvh, t, g, cap], &[0, 2, 4]);
        let masked = f.add(&sa, &mb);
        let probs = c.softmax(f, &masked);
        // out [B, KVH, T, G, D]
        let out = c.matmul(f, &probs, &values, (&[0, 1], &[0, 2]), (&[4], &[1]));
        let out = f.transpose(&out, &[0, 2, 1, 3, 4]);
        let out = f.reshape(&out, &[b, t, nh * d]);
        let o = f.load(&w.o);
        let mut attn = c.linear(f, &out, &o, None);
        if let Some(post) = &w.post_attn {
            let pw = f.load(post);
            attn = c.rms_norm(f, &attn, &pw, cfg.rms_eps, style);
        }
        let x = c.residual(f, x, &attn);

        let ln2 = f.load(&w.ln2);
        let hx = c.rms_norm(f, &x, &ln2, cfg.rms_eps, style);
        let (gw, uw, dw) = (f.load(&w.gate), f.load(&w.up), f.load(&w.down));
        let gate = c.linear(f, &hx, &gw, None);
        let up = c.linear(f, &hx, &uw, None);
        let act = match cfg.activation {
            Activation::Silu => c.silu(f, &gate),
            Activation::GeluTanh => c.gelu_tanh(f, &gate),
        };
        let prod = f.mul(&act, &up);
        let mut down = c.linear(f, &prod, &dw, None);
        if let Some(post) = &w.post_mlp {
            let pw = f.load(post);
            down = c.rms_norm(f, &down, &pw, cfg.rms_eps, style);
        }
        (c.residual(f, &x, &down), cache)
    }
}
