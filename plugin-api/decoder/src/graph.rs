//! The decoder bundle as StableHLO: one module whose exports share one
//! packed, device-resident KV cache.
//!
//! - `embed(tokens[T]) -> [T, H]`: the embedding table's rows, unscaled (a caller that
//!   prefills from embeddings applies the family's scale itself, once)
//! - `prefill_embeddings(x[T, H], pos[T], mask[K, T, C], slot, start) -> hidden[T, H]`
//! - `prefill_tokens(tokens[T], pos[T], mask[K, T, C], slot, start) -> hidden[T, H]`
//! - `logits(hidden[T, H]) -> logits[T, V]`: every row (verification and tests)
//! - `logits_at(hidden[T, H], row) -> logits[1, V]`: one row, what serving needs
//! - `prefill_tokens_W`, `logits_at_W`: the same over `W` rows, for each narrower width `W`
//!   of [`prefill_widths`], so a token prompt's last, short call is not padded to a whole
//!   chunk (prompts from embeddings carry media, hundreds of rows, and keep whole chunks:
//!   each width is one more compiled forward pass)
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
//! The cache is one global `[L, 2, S, KVH, C, D]` (packed: IREE 3.13 fuses
//! separately declared DUS-only globals), head-major so that attention reads each
//! head's rows as they lie (see [`KvLayout::global`]). Masks are additive and built by
//! the host, so causal, padded and family-specific masks all take one path.
//! Each decode step (`decode`, `decode_rows_W`) also exists as `<name>_r{R}` for each
//! narrower key window `R` of [`key_windows`]: the same step attending over the first `R`
//! cache rows of each slot only, its masks `[K, S, R]`; the host calls the narrowest that
//! holds every row its streams see.

use std::cell::RefCell;

use mlxcel_emit::{
    AffineWeight, Compare, Elem, EmitError, Func, Global, Module, NumericContract, QLINEAR_FUSED_MAX_ROWS, Rows, Type,
    Value,
};

use crate::config::{Activation, LayerKind, TextConfig};
use crate::spec::WeightLayout;
use crate::weights::{DecoderWeights, Index, LayerTensor, Linear, Tensor, WeightsError, check_affine, dense_problems};

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

/// The decoder ABI's version: the exports below, their arguments and results. Part of the
/// plugin ABI (a plugin's spec is emitted through it) and of every bundle's compile-cache
/// fingerprint; bumped whenever an export changes.
pub const DECODER_ABI: u32 = 9;

/// One export of a decoder bundle: its name and, in order, what its arguments and results are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Export {
    pub name: &'static str,
    pub args: &'static [&'static str],
    pub results: &'static [&'static str],
}

/// Every export a bundle has (the module is `decoder`, so `decoder.<name>`). `injections` is
/// present when the spec has injected layers.
pub const EXPORTS: [Export; 10] = [
    Export { name: "embed", args: &["tokens[T]"], results: &["raw-rows[T,H]"] },
    Export {
        name: "prefill_tokens",
        args: &["tokens[T]", "pos[T|3,T]", "masks[K,T,C]", "slot", "start"],
        results: &["hidden[T,H]"],
    },
    Export {
        name: "prefill_embeddings",
        args: &["x[T,H]", "pos[T|3,T]", "masks[K,T,C]", "slot", "start", "injections[J,T,H]?", "tokens[T]?"],
        results: &["hidden[T,H]"],
    },
    Export { name: "logits", args: &["hidden[T,H]"], results: &["logits[T,V]"] },
    Export { name: "logits_at", args: &["hidden[T,H]", "row"], results: &["logits[1,V]"] },
    Export {
        name: "prefill_tokens_{P}",
        args: &["tokens[P]", "pos[P|3,P]", "masks[K,P,C]", "slot", "start"],
        results: &["hidden[P,H]"],
    },
    Export { name: "logits_at_{P}", args: &["hidden[P,H]", "row"], results: &["logits[1,V]"] },
    Export {
        name: "decode",
        args: &["tokens[S]", "pos[S|3,S]", "write[S]", "masks[K,S,C]"],
        results: &["logits[S,V]"],
    },
    Export {
        name: "decode_rows_{W}",
        args: &["tokens[W]", "pos[W|3,W]", "masks[K,W,C]", "slots[W]", "write[W]"],
        results: &["logits[W,V]"],
    },
    Export { name: "kv_slot", args: &["slot"], results: &["kv[slot layout]"] },
];

/// The widths of the partial decode steps a bundle of `slots` slots exports besides `decode`
/// (which computes a row for every slot): 1, 2, 4, … below `slots`. A step of n streams runs
/// the narrowest that holds n, so a few streams on a many-slot server compute few rows.
pub fn decode_widths(slots: usize) -> Vec<usize> {
    (0..usize::BITS).map(|k| 1usize << k).take_while(|&w| w < slots).collect()
}

/// The export that runs a decode step of `width` rows, each row naming its slot.
pub fn decode_rows_export(width: usize) -> String {
    format!("decode_rows_{width}")
}

/// The narrower token prefill calls a bundle of prefill chunk `chunk` exports besides the
/// chunk's: a quarter and a half of it, when at least 8 rows. A token prefill call runs the
/// narrowest that holds its rows, so a prompt's last call (or a short prompt's only one)
/// computes at most twice its rows rather than a whole chunk: a 75-row prompt in chunks of 64
/// computes 64 + 16 rows, not 128.
pub fn prefill_widths(chunk: usize) -> Vec<usize> {
    let mut widths: Vec<usize> = [chunk / 4, chunk / 2].into_iter().filter(|&w| w >= 8 && w < chunk).collect();
    widths.dedup();
    widths
}

/// The export of `name` (`prefill_tokens` or `logits_at`) over `width` rows: `name` itself at
/// the chunk's width, `name_W` at a narrower one of [`prefill_widths`].
pub fn prefill_export(name: &str, width: usize, chunk: usize) -> String {
    if width == chunk { name.to_owned() } else { format!("{name}_{width}") }
}

/// The narrower key windows a bundle of `shape` exports its attending calls (prompt chunks
/// and decode steps, [`attends`]) over besides the whole cache (ascending): quarters,
/// sixteenths and sixty-fourths of the cache rows per slot, each rounded up to whole chunks,
/// while at least [`MIN_KEY_WINDOW`] rows. Attention reads and multiplies every cache row of
/// its window, masked or not, so without them every call of a server started with a long
/// context read the keys and values of the whole context (8 bf16-compute streams of the
/// shape-real Qwen2-VL-2B at 2048 rows: 37 to 39 tok/s over the whole cache, 56 to 57 over a
/// window of 576). Each window compiles every attending export once more (the compiler runs
/// on one thread), so they are a quarter apart, not a half.
pub fn key_windows(shape: BundleShape) -> Vec<usize> {
    let chunk = shape.chunk.max(1);
    let mut windows: Vec<usize> = (1..=3)
        .map(|k| (shape.rows() >> (2 * k)).next_multiple_of(chunk))
        .filter(|&w| w >= MIN_KEY_WINDOW && w < shape.rows())
        .collect();
    windows.sort_unstable();
    windows.dedup();
    windows
}

/// The smallest key window [`key_windows`] makes: narrower ones would save little beside the
/// weights a call reads, at the price of compiling every attending export once more.
pub const MIN_KEY_WINDOW: usize = 256;

/// Whether the export `name` (an [`EXPORTS`] name, resolved or not) attends over the cache,
/// and so is also emitted over each key window: the prompt chunks and the decode steps.
pub fn attends(name: &str) -> bool {
    name.starts_with("prefill_") || name.starts_with("decode")
}

/// The export of the attending call `name` over the first `keys` cache rows of each slot:
/// `name` itself over the whole cache, `name_r{keys}` over a narrower window of [`key_windows`].
pub fn windowed(name: &str, keys: usize, shape: BundleShape) -> String {
    if keys >= shape.rows() { name.to_owned() } else { format!("{name}_r{keys}") }
}

/// The narrowest key window of a bundle of `shape` that holds the first `rows` cache rows:
/// one of [`key_windows`], or the whole cache.
pub fn key_window_for(rows: usize, shape: BundleShape) -> usize {
    key_windows(shape).into_iter().find(|&w| w >= rows).unwrap_or(shape.rows())
}

/// Every export a bundle of `shape` has, by name (the `{W}` of [`EXPORTS`] resolved to each of
/// [`decode_widths`], the `{P}` to each of [`prefill_widths`], and each call that
/// [`attends`] also over each narrower key window of [`key_windows`]).
pub fn export_names(shape: BundleShape) -> Vec<String> {
    EXPORTS
        .iter()
        .flat_map(|e| {
            let names: Vec<String> = if e.name.ends_with("{W}") {
                decode_widths(shape.slots).into_iter().map(decode_rows_export).collect()
            } else if let Some(base) = e.name.strip_suffix("_{P}") {
                prefill_widths(shape.chunk).into_iter().map(|w| prefill_export(base, w, shape.chunk)).collect()
            } else {
                vec![e.name.to_owned()]
            };
            let windows: Vec<usize> = if attends(e.name) {
                key_windows(shape).into_iter().chain([shape.rows()]).collect()
            } else {
                vec![shape.rows()]
            };
            names
                .into_iter()
                .flat_map(move |n| windows.clone().into_iter().map(move |w| windowed(&n, w, shape)))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// [`DECODER_ABI`] and [`EXPORTS`] as one line, for fingerprints and messages.
pub fn abi_schema() -> String {
    let exports: Vec<String> =
        EXPORTS.iter().map(|e| format!("{}({})->{}", e.name, e.args.join(","), e.results.join(","))).collect();
    format!("decoder-abi-v{DECODER_ABI}: {}", exports.join(" "))
}

/// The KV cache a decoder keeps, as its attention kinds imply. The bundle holds it as one
/// device-resident global `[layers, planes, slots, heads, rows, width]` ([`KvLayout::global`]);
/// the host sizes, describes and reads slots through this, never from the config's head counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Cache layers: one per decoder layer for grouped-query attention.
    pub layers: usize,
    /// Tensors per cache layer and row: keys and values.
    pub planes: usize,
    /// One row of one plane: `[kv_heads, head_dim]`.
    pub row: Vec<usize>,
    /// The cache's element type (the activations').
    pub elem: Elem,
}

impl KvLayout {
    /// The cache `cfg`'s attention needs with `elem` activations.
    pub fn of(cfg: &TextConfig, elem: Elem) -> Self {
        match &cfg.mla {
            // Grouped-query attention caches each layer's keys and values.
            // Grouped-query attention caches the keys and values of each layer that computes
            // them (a KV-sharing layer reads an earlier layer's).
            None => {
                KvLayout { layers: cfg.cached_layers().len(), planes: 2, row: vec![cfg.kv_heads, cfg.head_dim], elem }
            }
            // Latent attention caches one row per position: the normed latent, then the
            // rotated key every head shares (read as one key head of that width).
            Some(m) => KvLayout { layers: cfg.layers, planes: 1, row: vec![1, m.cache_row()], elem },
        }
    }

    /// What the planes hold, for messages.
    fn planes_hold(&self) -> &'static str {
        if self.planes == 2 { "k|v" } else { "latent+rotated key" }
    }

    /// Elements of one row of one plane.
    pub fn row_elems(&self) -> usize {
        self.row.iter().product()
    }

    /// The global's shape for `shape`'s slots and rows: `[layers, planes, slots, heads, rows,
    /// width]`, head-major. Attention contracts each (slot, head) pair's rows as one batch;
    /// with the rows of a head contiguous IREE 3.13 reads the values as they lie and the keys
    /// through one transposed copy, where a row-major cache (`[.., rows, heads, width]`) had
    /// it write widened, transposed copies of both every step (8 decode streams of
    /// Qwen2-VL-2B in bf16: about a fifth of the step).
    pub fn global(&self, shape: BundleShape) -> Vec<usize> {
        vec![self.layers, self.planes, shape.slots, self.row[0], shape.rows(), self.row[1]]
    }

    /// One slot's cache as `kv_slot` returns it: `[layers, planes, rows, row...]`.
    pub fn slot(&self, rows: usize) -> Vec<usize> {
        let mut dims = vec![self.layers, self.planes, rows];
        dims.extend_from_slice(&self.row);
        dims
    }

    /// The layout in words, for fingerprints and messages.
    pub fn describe(&self, shape: BundleShape) -> String {
        format!(
            "[layers={}, planes={} ({}), slots={}, heads, rows={}, width; row={:?}] {}",
            self.layers,
            self.planes,
            self.planes_hold(),
            shape.slots,
            shape.rows(),
            self.row,
            self.elem
        )
    }
}

/// A matrix the graph reads as it is stored: dense in the checkpoint's dtype, or MLX's affine
/// quantization (the packed integers declared as `i4`/`i8` `[out, in]`, scales and biases).
#[derive(Clone)]
enum Lin {
    Dense(Global),
    /// A float matrix `[out, in]` served in the contract's tiles (`NumericContract::tiles`,
    /// `NumericContract::linear_tiled`).
    Tiled(Global),
    Affine {
        q: Global,
        scales: Global,
        biases: Global,
        group_size: usize,
    },
}

impl Lin {
    fn load(&self, f: &mut Func) -> LoadedLin {
        match self {
            Lin::Dense(w) => LoadedLin::Dense(f.load(w)),
            Lin::Tiled(w) => LoadedLin::Tiled(f.load(w)),
            Lin::Affine { q, scales, biases, group_size } => LoadedLin::Affine(AffineWeight {
                q: f.load(q),
                scales: f.load(scales),
                biases: f.load(biases),
                group_size: *group_size,
            }),
        }
    }
}

enum LoadedLin {
    Dense(Value),
    Tiled(Value),
    Affine(AffineWeight),
}

/// The q, k and v projections: three matrices, or one holding their rows in that order.
#[allow(clippy::large_enum_variant)] // one per layer, built once: boxing buys nothing
enum Qkv {
    Separate {
        q: Lin,
        k: Lin,
        v: Lin,
        bias: Option<[Global; 3]>,
    },
    Fused {
        qkv: Lin,
        bias: Option<Global>,
    },
    /// A KV-sharing layer's: queries only.
    QueryOnly {
        q: Lin,
        bias: Option<Global>,
    },
}

/// The gated MLP's input projections: two matrices, or one holding the up rows then the
/// gate rows.
enum GateUp {
    Separate { gate: Lin, up: Lin },
    Fused(Lin),
}

/// How a layer's attention reads its input, by the spec's attention kind.
#[allow(clippy::large_enum_variant)] // one per layer, built once: boxing buys nothing
enum AttnWeights {
    GroupedQuery { qkv: Qkv, q_norm: Option<Global>, k_norm: Option<Global> },
    Latent(LatentWeights),
}

/// Multi-head latent attention's projections ([`crate::config::Mla`]).
struct LatentWeights {
    q: LatentQuery,
    /// `[kv_lora_rank + rope, hidden]`: the latent, then the shared rotary key.
    kv_a: Lin,
    kv_a_norm: Global,
    /// `[heads * (nope + v), kv_lora_rank]`, read dense: the graph splits it per head into the
    /// key part the queries are absorbed through and the value part applied after attention.
    kv_b: Global,
}

/// The queries: one projection, or a low-rank one with its norm.
#[allow(clippy::large_enum_variant)] // one per layer, built once: boxing buys nothing
enum LatentQuery {
    Full(Lin),
    LowRank { a: Lin, norm: Global, b: Lin },
}

struct Layer {
    /// The norm before attention; none when the norms sit after the blocks.
    ln1: Option<Global>,
    attn: AttnWeights,
    o: Lin,
    /// The norm on the attention output, before the residual add (Gemma's sandwich, OLMo's post).
    post_attn: Option<Global>,
    /// The norm before the MLP; none when the norms sit after the blocks.
    ln2: Option<Global>,
    /// The norm on the MLP output, before the residual add.
    post_mlp: Option<Global>,
    gate_up: GateUp,
    down: Lin,
    /// The MLP's width.
    intermediate: usize,
    /// AltUp's, LAuReL's and the per-layer input's weights, when the spec has them.
    aug: Option<LayerAug>,
}

/// One layer's augmentation weights ([`crate::spec::Augmentations`]).
struct LayerAug {
    /// `correct_output_scale [H]`, when the config scales the active stream's correction.
    correct_scale: Option<Global>,
    /// `[n, n]`, `[n * n, n]`, `[n, H]`, `[H]`.
    correction: Global,
    prediction: Global,
    router: Global,
    router_norm: Global,
    /// `linear_left [r, H]`, `linear_right [H, r]`, `post_laurel_norm [H]`.
    laurel: Option<(Lin, Lin, Global)>,
    /// `per_layer_input_gate [p, H]`, `per_layer_projection [H, p]`, `post_per_layer_input_norm [H]`.
    per_layer: Option<(Lin, Lin, Global)>,
}

/// The model-level augmentation weights.
struct ModelAug {
    /// The per-layer token table `[vocab, L * p]`, the embeddings' projection `[L * p, H]`, its
    /// norm `[p]`.
    per_layer: Option<(Global, Lin, Global)>,
    /// Per extra stream: the projection from the embeddings and the one back.
    streams_in: Vec<Lin>,
    streams_out: Vec<Lin>,
}

struct Weights {
    /// The embedding table `[vocab, hidden]`: dense, or quantized like a linear's weight.
    embed: Lin,
    /// The table's further rows, stored apart (dense): `[vocab + extra_vocab - split, hidden]`.
    embed_extra: Option<Global>,
    /// Rows of the table stored in `embed`: the head's vocabulary, unless the checkpoint
    /// splits its two-part table elsewhere.
    split: usize,
    layers: Vec<Layer>,
    norm: Global,
    lm_head: Lin,
    aug: Option<ModelAug>,
}

/// Which cache slots the rows of a call use.
enum Slots {
    /// One slot (runtime index) for every row: prefill.
    One(Value),
    /// Row `b` uses slot `b`: decode.
    All,
    /// Row `b` uses the slot (runtime index) `slots[b]`: a decode step of some of the slots.
    Listed(Vec<Value>),
}

/// Where a layer's attention writes and reads the cache: its layer, the slots of the call's
/// rows and each row group's first cache row.
struct CacheAt<'a> {
    layer: usize,
    slots: &'a Slots,
    writes: &'a [Value],
}

struct Emitter<'a> {
    cfg: &'a TextConfig,
    shape: BundleShape,
    c: NumericContract,
    /// Whose rows the linears contract: a prompt's in the prefill exports, by their count
    /// elsewhere (see [`Rows`]).
    rows: Rows,
    w: &'a Weights,
    cache: Global,
    /// The cache rows per slot that attention reads: the first `key_rows` (see [`key_windows`]).
    key_rows: usize,
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
    emit_bundle(cfg, names, index, shape, contract, weights).map(|b| b.mlir)
}

/// An emitted bundle: its module, and how the checkpoint stores what it reads.
#[derive(Clone, Debug)]
pub struct Emitted {
    pub mlir: String,
    /// Each distinct storage form of the weights the module reads, for the numeric contract's
    /// record ([`mlxcel_emit::ContractDescriptor::sources`]): the dense dtype, and each affine
    /// quantization (`affine bits=4 group_size=64 scales=f32`).
    pub sources: Vec<String>,
}

/// As [`emit`], with the weights' storage forms.
pub fn emit_bundle(
    cfg: &TextConfig,
    names: &DecoderWeights,
    index: &Index,
    shape: BundleShape,
    contract: NumericContract,
    weights: Elem,
) -> Result<Emitted, GraphError> {
    let mut m = Module::new("decoder");
    let sources: RefCell<std::collections::BTreeSet<String>> = RefCell::new([weights.to_string()].into());
    // Every declared dense parameter, for the check against the checkpoint, and the problems
    // found with quantized ones as they are declared.
    let declared: RefCell<Vec<(String, Vec<usize>)>> = RefCell::default();
    let problems: RefCell<Vec<String>> = RefCell::default();
    let p = |m: &mut Module, key: String, shape: &[usize]| {
        declared.borrow_mut().push((key.clone(), shape.to_vec()));
        m.param(&key, Type::new(weights, shape))
    };
    // A matrix `[out, in]` as the checkpoint stores it; an affine-quantized one in row tiles when
    // `tiled` and its rows fill them (a table whose rows are gathered is declared as stored).
    let lin_as = |m: &mut Module, key: String, out: usize, inputs: usize, tiled: bool| -> Lin {
        let linear = Linear::detect(index, &key, cfg.quantization.as_ref());
        let Linear::Affine { weight, scales, biases, .. } = &linear else {
            let Some(tiles) = contract.tiles(weights, out, inputs) else {
                return Lin::Dense(p(m, key, &[out, inputs]));
            };
            // Checked against the checkpoint as stored; served in tiles.
            declared.borrow_mut().push((key.clone(), vec![out, inputs]));
            return Lin::Tiled(m.param(&tiles.key(&key), Type::new(weights, &tiles.shape(out, inputs))));
        };
        match check_affine(index, &linear, out, inputs) {
            Ok(layout) => {
                let q = layout.quantization;
                sources
                    .borrow_mut()
                    .insert(format!("affine bits={} group_size={} scales={}", q.bits, q.group_size, layout.scales));
                let packed = if q.bits == 4 { Elem::I4 } else { Elem::I8 };
                let groups = inputs / q.group_size;
                match contract.affine_tiles(out, inputs, q.group_size).filter(|_| tiled) {
                    Some(tiles) => Lin::Affine {
                        q: m.param(&tiles.key(weight), Type::new(packed, &tiles.shape(out, inputs))),
                        scales: m.param(&tiles.key(scales), Type::new(layout.scales, &tiles.shape(out, groups))),
                        biases: m.param(&tiles.key(biases), Type::new(layout.scales, &tiles.shape(out, groups))),
                        group_size: q.group_size,
                    },
                    None => Lin::Affine {
                        q: m.param(weight, Type::new(packed, &[out, inputs])),
                        scales: m.param(scales, Type::new(layout.scales, &[out, groups])),
                        biases: m.param(biases, Type::new(layout.scales, &[out, groups])),
                        group_size: q.group_size,
                    },
                }
            }
            Err(found) => {
                problems.borrow_mut().extend(found);
                // A stand-in so the graph completes; the problems above fail the emit.
                Lin::Dense(m.param(weight, Type::new(weights, &[out, inputs])))
            }
        }
    };
    let lin = |m: &mut Module, key: String, out: usize, inputs: usize| lin_as(m, key, out, inputs, true);
    let (h, d) = (cfg.hidden, cfg.head_dim);
    let key = |t: Tensor| names.key(t).expect("invariant: every tensor but an absent head has a key");
    // A table stored in two parts is read at whatever row it is split: transformers 5.24 saves
    // Molmo2's as two equal halves (the stacked table is the same), the Hub's at the vocabulary.
    let split = match cfg.extra_vocab {
        0 => cfg.vocab,
        extra => stored_split(index, &key(Tensor::Embed), &key(Tensor::EmbedExtra), cfg.vocab + extra, h)
            .unwrap_or(cfg.vocab),
    };
    // Rows are gathered from the table: a quantized one is read as stored (only the rows a step
    // reads are touched), a dense one from the tiles the tied head contracts.
    let embed = lin_as(&mut m, key(Tensor::Embed), split, h, false);
    let embed_extra =
        (cfg.extra_vocab > 0).then(|| p(&mut m, key(Tensor::EmbedExtra), &[cfg.vocab + cfg.extra_vocab - split, h]));
    let fused = names.layout == WeightLayout::Molmo;
    let mut layers = Vec::with_capacity(cfg.layers);
    for i in 0..cfg.layers {
        use LayerTensor as L;
        let n = |m: &mut Module, t: LayerTensor, shape: &[usize]| p(m, key(Tensor::Layer(i, t)), shape);
        let l =
            |m: &mut Module, t: LayerTensor, out: usize, inputs: usize| lin(m, key(Tensor::Layer(i, t)), out, inputs);
        let ln1 = (!cfg.post_norms).then(|| n(&mut m, L::AttnInNorm, &[h]));
        let width = cfg.intermediates[i];
        let (attn, o_inputs) = match &cfg.mla {
            Some(mla) => {
                let q_rows = cfg.heads * mla.q_head_dim();
                let q = match mla.q_lora_rank {
                    None => LatentQuery::Full(l(&mut m, L::Q, q_rows, h)),
                    Some(r) => LatentQuery::LowRank {
                        a: l(&mut m, L::QA, r, h),
                        norm: n(&mut m, L::QANorm, &[r]),
                        b: l(&mut m, L::QB, q_rows, r),
                    },
                };
                let latent = LatentWeights {
                    q,
                    kv_a: l(&mut m, L::KvA, mla.cache_row(), h),
                    kv_a_norm: n(&mut m, L::KvANorm, &[mla.kv_lora_rank]),
                    kv_b: n(&mut m, L::KvB, &[cfg.heads * (mla.nope + mla.v), mla.kv_lora_rank]),
                };
                (AttnWeights::Latent(latent), cfg.heads * mla.v)
            }
            None => {
                let rows = (cfg.heads + 2 * cfg.kv_heads) * d;
                let shares = cfg.kv_source[i].is_some();
                let qkv = if shares {
                    Qkv::QueryOnly {
                        q: l(&mut m, L::Q, cfg.heads * d, h),
                        bias: cfg.qkv_bias.then(|| n(&mut m, L::QBias, &[cfg.heads * d])),
                    }
                } else if fused {
                    Qkv::Fused {
                        qkv: l(&mut m, L::Qkv, rows, h),
                        bias: cfg.qkv_bias.then(|| n(&mut m, L::QkvBias, &[rows])),
                    }
                } else {
                    Qkv::Separate {
                        q: l(&mut m, L::Q, cfg.heads * d, h),
                        k: l(&mut m, L::K, cfg.kv_heads * d, h),
                        v: l(&mut m, L::V, cfg.kv_heads * d, h),
                        bias: cfg.qkv_bias.then(|| {
                            [
                                n(&mut m, L::QBias, &[cfg.heads * d]),
                                n(&mut m, L::KBias, &[cfg.kv_heads * d]),
                                n(&mut m, L::VBias, &[cfg.kv_heads * d]),
                            ]
                        }),
                    }
                };
                let (qn, kn) = if cfg.qk_norm_whole { (cfg.heads * d, cfg.kv_heads * d) } else { (d, d) };
                let q_norm = cfg.qk_norm.then(|| n(&mut m, L::QNorm, &[qn]));
                let k_norm = (cfg.qk_norm && !shares).then(|| n(&mut m, L::KNorm, &[kn]));
                (AttnWeights::GroupedQuery { qkv, q_norm, k_norm }, cfg.heads * d)
            }
        };
        layers.push(Layer {
            ln1,
            attn,
            o: l(&mut m, L::O, h, o_inputs),
            post_attn: (cfg.sandwich_norms || cfg.post_norms).then(|| n(&mut m, L::AttnOutNorm, &[h])),
            ln2: (!cfg.post_norms).then(|| n(&mut m, L::MlpInNorm, &[h])),
            post_mlp: (cfg.sandwich_norms || cfg.post_norms).then(|| n(&mut m, L::MlpOutNorm, &[h])),
            gate_up: if fused {
                GateUp::Fused(l(&mut m, L::UpGate, 2 * width, h))
            } else {
                GateUp::Separate { gate: l(&mut m, L::Gate, width, h), up: l(&mut m, L::Up, width, h) }
            },
            down: l(&mut m, L::Down, h, width),
            intermediate: width,
            aug: cfg.altup.map(|a| {
                let streams = a.inputs;
                LayerAug {
                    correct_scale: a.correct_scale.then(|| n(&mut m, L::AltUpCorrectScale, &[h])),
                    correction: n(&mut m, L::AltUpCorrection, &[streams, streams]),
                    prediction: n(&mut m, L::AltUpPrediction, &[streams * streams, streams]),
                    router: n(&mut m, L::AltUpRouter, &[streams, h]),
                    router_norm: n(&mut m, L::AltUpRouterNorm, &[h]),
                    laurel: cfg.laurel_rank.map(|r| {
                        (
                            l(&mut m, L::LaurelLeft, r, h),
                            l(&mut m, L::LaurelRight, h, r),
                            n(&mut m, L::LaurelNorm, &[h]),
                        )
                    }),
                    per_layer: cfg.per_layer_inputs.map(|p| {
                        let ph = p.hidden;
                        (
                            l(&mut m, L::PerLayerGate, ph, h),
                            l(&mut m, L::PerLayerProjection, h, ph),
                            n(&mut m, L::PerLayerNorm, &[h]),
                        )
                    }),
                }
            }),
        });
    }
    let norm = p(&mut m, key(Tensor::Norm), &[h]);
    let lm_head = match names.key(Tensor::LmHead) {
        Some(head) => lin(&mut m, head, cfg.vocab, h),
        // A quantized table tied to the head is contracted in the tiles too.
        None if matches!(embed, Lin::Affine { .. }) => lin(&mut m, key(Tensor::Embed), split, h),
        None => embed.clone(),
    };
    let kv = KvLayout::of(cfg, contract.activations);
    let cache_ty = Type::new(kv.elem, &kv.global(shape));
    let cache = m.state("kv", cache_ty, 0.0);
    let aug = cfg.altup.map(|a| {
        let global = |m: &mut Module, t: Tensor, shape: &[usize]| p(m, key(t), shape);
        ModelAug {
            per_layer: cfg.per_layer_inputs.map(|pl| {
                let width = cfg.layers * pl.hidden;
                (
                    global(&mut m, Tensor::PerLayerEmbed, &[pl.vocab, width]),
                    lin(&mut m, key(Tensor::PerLayerProjection), width, h),
                    global(&mut m, Tensor::PerLayerProjectionNorm, &[pl.hidden]),
                )
            }),
            streams_in: (0..a.inputs - 1).map(|i| lin(&mut m, key(Tensor::AltUpIn(i)), h, h)).collect(),
            streams_out: (0..a.inputs - 1).map(|i| lin(&mut m, key(Tensor::AltUpOut(i)), h, h)).collect(),
        }
    });
    let loaded = Weights { embed, embed_extra, split, layers, norm, lm_head, aug };
    let (t, cap, s) = (shape.chunk, shape.rows(), shape.slots);
    let full = Emitter { cfg, shape, c: contract, rows: Rows::ByCount, w: &loaded, cache, key_rows: cap };
    let i32s = |n: usize| Type::new(Elem::I32, &[n]);
    let scalar = Type::scalar(Elem::I32);
    let kinds = cfg.kinds().len();
    // Positions: one stream, or three (t, h, w) for M-RoPE.
    let streams = if cfg.mrope.is_some() { 3 } else { 1 };
    let pos_ty = |n: usize| if streams == 3 { Type::new(Elem::I32, &[3, n]) } else { Type::new(Elem::I32, &[n]) };

    // embed: raw rows; the token paths below scale them in the graph.
    let (mut f, a) = m.func("embed", &[i32s(t)]);
    let x = full.rows(&mut f, &a[0]);
    m.add_func(f, &[x]);

    // Every export that attends, once over the whole cache and once over each narrower key
    // window (`_r{R}`, the first R rows of each slot; the host calls the narrowest that holds
    // every row the call's queries see). Writes go to the whole cache, so a prompt chunk whose
    // padding rows fall past the window still writes where its start says.
    for keys in key_windows(shape).into_iter().chain([cap]) {
        let e = Emitter { key_rows: keys, cache: full.cache.clone(), ..full };
        let mask = |n: usize| Type::new(Elem::F32, &[kinds, n, keys]);
        let name = |base: &str| windowed(base, keys, shape);

        // The prefill exports contract a prompt's rows in one form at every width.
        let prompt = Emitter { rows: Rows::Prompt, cache: full.cache.clone(), ..e };

        // prefill_embeddings
        // (with injected layers: a further `injections[K, T, H]` added after layers 0..K)
        // (with per-layer inputs: a further `tokens[T]`, the rows' ids)
        let mut args = vec![contract.act(&[t, h]), pos_ty(t), mask(t), scalar.clone(), scalar.clone()];
        if cfg.injected_layers > 0 {
            args.push(contract.act(&[cfg.injected_layers, t, h]));
        }
        if cfg.per_layer_inputs.is_some() {
            args.push(i32s(t));
        }
        let (mut f, a) = m.func(&name("prefill_embeddings"), &args);
        let x = f.reshape(&a[0], &[1, t, h]);
        let injections = (cfg.injected_layers > 0).then(|| a[5].clone());
        let row_tokens = cfg.per_layer_inputs.is_some().then(|| a[a.len() - 1].clone());
        let hidden = prompt.forward(
            &mut f,
            &x,
            &a[1],
            &a[2],
            Slots::One(a[3].clone()),
            &[a[4].clone()],
            injections,
            row_tokens.as_ref(),
        );
        m.add_func(f, &[hidden]);

        // prefill_tokens, over a whole chunk and over each narrower width
        for w in std::iter::once(t).chain(prefill_widths(t)) {
            let (mut f, a) = m.func(
                &name(&prefill_export("prefill_tokens", w, t)),
                &[i32s(w), pos_ty(w), mask(w), scalar.clone(), scalar.clone()],
            );
            let x = prompt.embed(&mut f, &a[0]);
            let x = f.reshape(&x, &[1, w, h]);
            let hidden =
                prompt.forward(&mut f, &x, &a[1], &a[2], Slots::One(a[3].clone()), &[a[4].clone()], None, Some(&a[0]));
            m.add_func(f, &[hidden]);
        }

        // decode_rows_W: one token for each of W listed slots, so a few streams do not pay for
        // a row of every slot (`decode` computes all S rows whichever are in use).
        for width in decode_widths(s) {
            let (mut f, a) = m.func(
                &name(&decode_rows_export(width)),
                &[i32s(width), pos_ty(width), mask(width), i32s(width), i32s(width)],
            );
            let x = e.embed(&mut f, &a[0]);
            let x = f.reshape(&x, &[width, 1, h]);
            let (slots, writes) = (f.scalars(&a[3]), f.scalars(&a[4]));
            let hidden = e.forward(&mut f, &x, &a[1], &a[2], Slots::Listed(slots), &writes, None, Some(&a[0]));
            let logits = e.head(&mut f, &hidden);
            m.add_func(f, &[logits]);
        }

        // decode: row b is slot b, one token each.
        let (mut f, a) = m.func(&name("decode"), &[i32s(s), pos_ty(s), i32s(s), mask(s)]);
        let x = e.embed(&mut f, &a[0]);
        let x = f.reshape(&x, &[s, 1, h]);
        let writes = f.scalars(&a[2]);
        let hidden = e.forward(&mut f, &x, &a[1], &a[3], Slots::All, &writes, None, Some(&a[0]));
        let logits = e.head(&mut f, &hidden);
        m.add_func(f, &[logits]);
    }

    // logits_at: the head over one row, what serving needs of a prompt (a row, whichever call
    // it came from: the one-row form), over a whole chunk and over each narrower width.
    for w in std::iter::once(t).chain(prefill_widths(t)) {
        let (mut f, a) = m.func(&prefill_export("logits_at", w, t), &[contract.act(&[w, h]), Type::scalar(Elem::I32)]);
        let zero = f.splat(&Type::scalar(Elem::I32), 0.0);
        let row = f.dynamic_slice(&a[0], &[a[1].clone(), zero], &[1, h]);
        let logits = full.head(&mut f, &row);
        m.add_func(f, &[logits]);
    }

    // logits: the head over every row of a prefill's hidden state.
    let (mut f, a) = m.func("logits", &[contract.act(&[t, h])]);
    let logits = full.head(&mut f, &a[0]);
    m.add_func(f, &[logits]);

    // kv_slot: one slot's cache [L, 2, C, KVH, D], for tests and diagnostics.
    let (mut f, a) = m.func("kv_slot", &[Type::scalar(Elem::I32)]);
    let all = f.load(&full.cache);
    let zero = f.splat(&Type::scalar(Elem::I32), 0.0);
    let at = [zero.clone(), zero.clone(), a[0].clone(), zero.clone(), zero.clone(), zero];
    let mut sizes = kv.global(shape);
    sizes[2] = 1;
    let one = f.dynamic_slice(&all, &at, &sizes);
    let one = f.reshape(&one, &[kv.layers, kv.planes, kv.row[0], cap, kv.row[1]]);
    let one = f.transpose(&one, &[0, 1, 3, 2, 4]);
    debug_assert_eq!(one.shape(), kv.slot(cap).as_slice());
    m.add_func(f, &[one]);

    let declared = declared.into_inner();
    let mut problems = problems.into_inner();
    problems.extend(dense_problems(index, declared.iter().map(|(k, s)| (k.as_str(), s.as_slice())), weights));
    if !problems.is_empty() {
        return Err(WeightsError::Tensors(problems).into());
    }
    Ok(Emitted { mlir: m.finish()?, sources: sources.into_inner().into_iter().collect() })
}

/// The row at which a checkpoint splits a two-part token table of `rows` rows: the first
/// part's rows, when both parts are stored `[n, hidden]`, non-empty, and add up to `rows`;
/// `None` otherwise (the declared shapes then report what is wrong).
fn stored_split(index: &Index, first: &str, second: &str, rows: usize, hidden: usize) -> Option<usize> {
    let (a, b) = (index.get(first)?, index.get(second)?);
    match (a.shape.as_slice(), b.shape.as_slice()) {
        (&[n, ha], &[m, hb]) if ha == hidden && hb == hidden && n > 0 && m > 0 && n + m == rows => Some(n),
        _ => None,
    }
}

impl Emitter<'_> {
    /// The embedding table's rows for `tokens`, in the activation dtype; a quantized table's
    /// rows are gathered packed, with their scales and biases, and dequantized as a linear's
    /// weight is.
    fn rows(&self, f: &mut Func, tokens: &Value) -> Value {
        let Some(extra) = &self.w.embed_extra else { return self.base_rows(f, tokens) };
        // Two gathers, each with its indices clamped into its own table, and a select: the
        // stacked table is never materialised.
        let (vocab, rows) = (self.w.split, self.cfg.vocab + self.cfg.extra_vocab - self.w.split);
        let ty = tokens.ty().clone();
        let at = |f: &mut Func, v: usize| f.splat(&ty, v as f64);
        let (zero, last, v) = (at(f, 0), at(f, vocab - 1), at(f, vocab));
        let base_ids = f.min(tokens, &last);
        let base = self.base_rows(f, &base_ids);
        let shifted = f.sub(tokens, &v);
        let extra_last = at(f, rows - 1);
        let extra_ids = f.max(&shifted, &zero);
        let extra_ids = f.min(&extra_ids, &extra_last);
        let table = f.load(extra);
        let extra_rows = f.gather_rows(&table, &extra_ids);
        let extra_rows = f.convert(&extra_rows, self.c.activations);
        let is_base = f.compare(Compare::Lt, tokens, &v);
        let is_base = f.broadcast(&is_base, base.shape(), &[0]);
        f.select(&is_base, &base, &extra_rows)
    }

    /// Rows of the table the head shares (or the whole table when nothing is stored apart).
    fn base_rows(&self, f: &mut Func, tokens: &Value) -> Value {
        match self.w.embed.load(f) {
            LoadedLin::Dense(table) => {
                let rows = f.gather_rows(&table, tokens);
                f.convert(&rows, self.c.activations)
            }
            LoadedLin::Tiled(table) => {
                let rows = f.gather_tiled_rows(&table, tokens);
                f.convert(&rows, self.c.activations)
            }
            LoadedLin::Affine(table) => {
                let dequantized = |f: &mut Func, ids: &Value| {
                    let rows = AffineWeight {
                        q: f.gather_rows(&table.q, ids),
                        scales: f.gather_rows(&table.scales, ids),
                        biases: f.gather_rows(&table.biases, ids),
                        group_size: table.group_size,
                    };
                    let d = self.c.dequantize(f, &rows);
                    f.reshape(&d, &rows.shape())
                };
                // IREE 3.13 fails to compile one gather of 4 to 7 packed 4-bit rows of some
                // widths (1536: a `vector.maskedstore` of 15 i4 lanes it cannot legalize, whether
                // gathered as nibbles or as bytes); it compiles a gather of one row, so a decode
                // step's rows are gathered and dequantized one by one (the same arithmetic).
                let n = tokens.shape()[0];
                let d = if n > 1 && n <= QLINEAR_FUSED_MAX_ROWS {
                    let rows: Vec<Value> = (0..n)
                        .map(|r| {
                            let id = f.slice(tokens, &[r], &[r + 1]);
                            dequantized(f, &id)
                        })
                        .collect();
                    f.concat(&rows, 0)
                } else {
                    dequantized(f, tokens)
                };
                f.convert(&d, self.c.activations)
            }
        }
    }

    /// `x @ w^T (+ bias)` through the contract, for `w` as the checkpoint stores it.
    fn linear(&self, f: &mut Func, x: &Value, w: &Lin, bias: Option<&Value>) -> Value {
        match w.load(f) {
            LoadedLin::Dense(w) => self.c.linear_rows(f, x, &w, bias, self.rows),
            LoadedLin::Tiled(w) => self.c.linear_tiled_rows(f, x, &w, bias, self.rows),
            LoadedLin::Affine(w) => self.c.qlinear_rows(f, x, &w, bias, self.rows),
        }
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
                self.c.act_mul(f, &rows, &kb)
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
        tokens: Option<&Value>,
    ) -> Value {
        let (b, t, h) = (x.shape()[0], x.shape()[1], self.cfg.hidden);
        let cap = self.key_rows;
        // Per attention kind: its rotary tables and its mask [B, T, C] (C the key window).
        let mut per_kind: Vec<(LayerKind, Value, Value, Value)> = Vec::new();
        for (i, kind) in self.cfg.kinds().into_iter().enumerate() {
            let (cos, sin) = self.rope_tables(f, kind, pos, b, t);
            let m = f.slice(masks, &[i, 0, 0], &[i + 1, b * t, cap]);
            let m = f.reshape(&m, &[b, t, cap]);
            per_kind.push((kind, cos, sin, m));
        }
        let tables = |l: usize| {
            let kind = self.cfg.layer_kinds[l];
            let (_, cos, sin, mask) =
                per_kind.iter().find(|(k, ..)| *k == kind).expect("invariant: every layer kind has tables");
            (cos, sin, mask)
        };
        let mut cache = f.load(&self.cache);
        let x = match &self.w.aug {
            Some(aug) => {
                let (y, updated) = self.streams(f, aug, x, tokens, &tables, &slots, writes, cache);
                cache = updated;
                y
            }
            None => {
                let mut x = x.clone();
                for (l, layer) in self.w.layers.iter().enumerate() {
                    let (cos, sin, mask) = tables(l);
                    let (y, updated) = self.layer(f, l, layer, &x, cos, sin, mask, &slots, writes, cache);
                    cache = updated;
                    x = y;
                    // Injections: rows without features get zeros, and x + 0 is x.
                    if let Some(inj) = injections.as_ref().filter(|i| l < i.shape()[0]) {
                        let one = f.slice(inj, &[l, 0, 0], &[l + 1, t, h]);
                        let one = f.reshape(&one, &[b, t, h]);
                        x = f.add(&x, &one);
                    }
                }
                x
            }
        };
        f.store(&self.cache, &cache);
        let norm = f.load(&self.w.norm);
        let x = self.c.rms_norm(f, &x, &norm, self.cfg.rms_eps, self.cfg.norm_style);
        f.reshape(&x, &[b * t, h])
    }

    /// The layers over AltUp streams ([`crate::spec::Augmentations`], as transformers' Gemma 3n
    /// runs them): the streams made from `x [B, T, H]`, each layer's prediction, attention and
    /// MLP on the active stream with the LAuReL branch, the correction, the per-layer input
    /// gated into the other streams; at the end the streams projected back and averaged.
    /// `tokens [B*T]` are the rows' ids, for the per-layer inputs. Returns `[B, T, H]` before
    /// the final norm, and the cache.
    #[allow(clippy::too_many_arguments)]
    fn streams<'t>(
        &self,
        f: &mut Func,
        aug: &ModelAug,
        x: &Value,
        tokens: Option<&Value>,
        tables: &dyn Fn(usize) -> (&'t Value, &'t Value, &'t Value),
        slots: &Slots,
        writes: &[Value],
        cache: Value,
    ) -> (Value, Value) {
        let cfg = self.cfg;
        let c = &self.c;
        let altup = cfg.altup.expect("invariant: stream weights come from an AltUp config");
        let per_layer = self.per_layer_inputs(f, aug, x, tokens);
        let target = self.magnitude(f, x);
        let mut hs = vec![x.clone()];
        for proj in &aug.streams_in {
            let y = self.linear(f, x, proj, None);
            hs.push(self.rescaled(f, &y, &target));
        }
        let mut cache = cache;
        for (l, layer) in self.w.layers.iter().enumerate() {
            let w = layer.aug.as_ref().expect("invariant: every layer of an AltUp config has its weights");
            let (cos, sin, mask) = tables(l);
            // Predict every stream from all of them.
            let modalities = self.router(f, w, &hs[altup.active]);
            let coefs = self.linear(f, &modalities, &Lin::Dense(w.prediction.clone()), None);
            let n = altup.inputs;
            let pred: Vec<Value> = (0..n)
                .map(|i| {
                    let mut acc: Option<Value> = None;
                    for (k, stream) in hs.iter().enumerate() {
                        let coef = self.column(f, &coefs, i * n + k, stream.shape());
                        let term = f.mul(stream, &coef);
                        acc = Some(match acc {
                            Some(a) => f.add(&a, &term),
                            None => term,
                        });
                    }
                    let acc = acc.expect("invariant: at least one stream");
                    f.add(&acc, &hs[i])
                })
                .collect();
            let active = &pred[altup.active];
            let style = cfg.norm_style;
            let ln1 = f.load(layer.ln1.as_ref().expect("invariant: AltUp layers have sandwich norms"));
            let normed = c.rms_norm(f, active, &ln1, cfg.rms_eps, style);
            let (attn, updated) = self.attention(f, l, layer, &normed, cos, sin, mask, slots, writes, cache);
            cache = updated;
            let gated = c.residual(f, active, &attn);
            let mixed = match &w.laurel {
                Some((left, right, norm)) => {
                    let y = self.linear(f, &normed, left, None);
                    let y = self.linear(f, &y, right, None);
                    let nw = f.load(norm);
                    let y = c.rms_norm(f, &y, &nw, cfg.rms_eps, style);
                    let laurel = c.residual(f, &normed, &y);
                    let sum = f.add(&gated, &laurel);
                    let root2 = f.splat(sum.ty(), std::f64::consts::SQRT_2);
                    f.div(&sum, &root2)
                }
                None => gated,
            };
            let ln2 = f.load(layer.ln2.as_ref().expect("invariant: AltUp layers have sandwich norms"));
            let mlp_in = c.rms_norm(f, &mixed, &ln2, cfg.rms_eps, style);
            let mut mlp = self.mlp(f, l, layer, &mlp_in);
            if let Some(post) = &layer.post_mlp {
                let pw = f.load(post);
                mlp = c.rms_norm(f, &mlp, &pw, cfg.rms_eps, style);
            }
            let out = c.residual(f, &mixed, &mlp);
            // Correct every stream by what the layer changed in the active one.
            let modalities = self.router(f, w, &out);
            let innovation = f.sub(&out, active);
            let coefs = self.linear(f, &modalities, &Lin::Dense(w.correction.clone()), None);
            let one = f.splat(coefs.ty(), 1.0);
            let coefs = f.add(&coefs, &one);
            let mut corrected: Vec<Value> = pred
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let coef = self.column(f, &coefs, i, p.shape());
                    let y = f.mul(&innovation, &coef);
                    f.add(&y, p)
                })
                .collect();
            if let (Some((gate, proj, norm)), Some(inputs)) = (&w.per_layer, &per_layer) {
                let mut first = corrected[altup.active].clone();
                if let Some(scale) = &w.correct_scale {
                    let sw = f.load(scale);
                    let sw = f.convert(&sw, c.activations);
                    let sb = f.broadcast_to(&sw, first.shape());
                    first = f.mul(&first, &sb);
                }
                let g = self.linear(f, &first, gate, None);
                let g = self.activation(f, &g);
                let s = inputs.shape().to_vec();
                let mine = f.slice(inputs, &[0, 0, l, 0], &[s[0], s[1], l + 1, s[3]]);
                let mine = f.reshape(&mine, &[s[0], s[1], s[3]]);
                let g = f.mul(&g, &mine);
                let g = self.linear(f, &g, proj, None);
                let nw = f.load(norm);
                let g = c.rms_norm(f, &g, &nw, cfg.rms_eps, style);
                // transformers adds it to streams 1.. (the inactive ones: the active is 0).
                for stream in corrected.iter_mut().skip(1) {
                    *stream = f.add(stream, &g);
                }
            }
            hs = corrected;
        }
        // The streams back: each projected and rescaled to the first's magnitude, averaged.
        let target = self.magnitude(f, &hs[0]);
        let mut sum = hs[0].clone();
        for (stream, proj) in hs.iter().skip(1).zip(&aug.streams_out) {
            let y = self.linear(f, stream, proj, None);
            let y = self.rescaled(f, &y, &target);
            sum = f.add(&sum, &y);
        }
        let count = f.splat(sum.ty(), hs.len() as f64);
        (f.div(&sum, &count), cache)
    }

    /// `sqrt(mean(x^2))` over the last dimension of `x [B, T, H]`: `[B, T]` in the accumulator.
    fn magnitude(&self, f: &mut Func, x: &Value) -> Value {
        let mean = self.mean_square(f, x);
        f.sqrt(&mean)
    }

    /// `mean(x^2)` over the last dimension, in the accumulator.
    fn mean_square(&self, f: &mut Func, x: &Value) -> Value {
        let xa = f.convert(x, self.c.accumulate);
        let sq = f.mul(&xa, &xa);
        self.c.mean_last(f, &sq)
    }

    /// `y` rescaled to `target`'s magnitude: `y * target / sqrt(max(mean(y^2), 1e-5))`.
    fn rescaled(&self, f: &mut Func, y: &Value, target: &Value) -> Value {
        let ya = f.convert(y, self.c.accumulate);
        let last = y.shape().len() - 1;
        let mean = self.mean_square(f, y);
        let floor = f.splat(mean.ty(), 1e-5);
        let mean = f.max(&mean, &floor);
        let now = f.sqrt(&mean);
        let lead: Vec<usize> = (0..last).collect();
        let tb = f.broadcast(target, y.shape(), &lead);
        let nb = f.broadcast(&now, y.shape(), &lead);
        let scaled = f.mul(&ya, &tb);
        let out = f.div(&scaled, &nb);
        f.convert(&out, self.c.activations)
    }

    /// AltUp's router: `tanh(modality_router(router_norm(x) / H))`, `[B, T, streams]`.
    fn router(&self, f: &mut Func, w: &LayerAug, x: &Value) -> Value {
        let cfg = self.cfg;
        let nw = f.load(&w.router_norm);
        let normed = self.c.rms_norm(f, x, &nw, cfg.rms_eps, cfg.norm_style);
        let k = f.splat(normed.ty(), (cfg.hidden as f32).recip() as f64);
        let scaled = f.mul(&normed, &k);
        let routed = self.linear(f, &scaled, &Lin::Dense(w.router.clone()), None);
        f.tanh(&routed)
    }

    /// Column `j` of `m [B, T, K]` broadcast to `shape [B, T, H]`.
    fn column(&self, f: &mut Func, m: &Value, j: usize, shape: &[usize]) -> Value {
        let s = m.shape().to_vec();
        let col = f.slice(m, &[0, 0, j], &[s[0], s[1], j + 1]);
        let col = f.reshape(&col, &[s[0], s[1]]);
        f.broadcast(&col, shape, &[0, 1])
    }

    /// Per-layer inputs `[B, T, layers, p]`: each row's per-layer embeddings (ids outside the
    /// per-layer table read row 0) scaled by `sqrt(p)`, plus the normed projection of the input
    /// embeddings scaled by `1/sqrt(H)`, times `1/sqrt(2)`. `None` without per-layer inputs.
    fn per_layer_inputs(&self, f: &mut Func, aug: &ModelAug, x: &Value, tokens: Option<&Value>) -> Option<Value> {
        let cfg = self.cfg;
        let c = &self.c;
        let (table, proj, norm) = aug.per_layer.as_ref()?;
        let pl = cfg.per_layer_inputs?;
        let tokens = tokens.expect("invariant: a decoder with per-layer inputs is given its rows' tokens");
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let (layers, p) = (cfg.layers, pl.hidden);
        let ty = tokens.ty().clone();
        let limit = f.splat(&ty, pl.vocab as f64);
        let zero = f.splat(&ty, 0.0);
        let inside = f.compare(Compare::Lt, tokens, &limit);
        let ids = f.select(&inside, tokens, &zero);
        let tw = f.load(table);
        let rows = f.gather_rows(&tw, &ids);
        let rows = f.convert(&rows, c.activations);
        // torch multiplies by the f32 scale cast to the table's dtype.
        let k = f.constant_f32(&[], &[(p as f64).sqrt() as f32]);
        let k = f.convert(&k, c.activations);
        let kb = f.broadcast(&k, rows.shape(), &[]);
        let rows = c.act_mul(f, &rows, &kb);
        let rows = f.reshape(&rows, &[b, t, layers, p]);
        let y = self.linear(f, x, proj, None);
        let k = f.constant_f32(&[], &[(cfg.hidden as f64).powf(-0.5) as f32]);
        let k = f.convert(&k, c.activations);
        let kb = f.broadcast(&k, y.shape(), &[]);
        let y = c.act_mul(f, &y, &kb);
        let y = f.reshape(&y, &[b, t, layers, p]);
        let nw = f.load(norm);
        let y = c.rms_norm(f, &y, &nw, cfg.rms_eps, cfg.norm_style);
        let sum = c.act_add(f, &y, &rows);
        // torch.rsqrt(torch.tensor(2.0)) in f32.
        let k = f.constant_f32(&[], &[std::f32::consts::FRAC_1_SQRT_2]);
        let k = f.convert(&k, c.activations);
        let kb = f.broadcast(&k, sum.shape(), &[]);
        Some(c.act_mul(f, &sum, &kb))
    }

    /// The LM head over final-normed rows `[R, H]`: f32 logits `[R, V]`, soft-capped in the
    /// activation dtype when the config caps them.
    fn head(&self, f: &mut Func, x: &Value) -> Value {
        let mut logits = self.linear(f, x, &self.w.lm_head, None);
        if let Some(cap) = self.cfg.final_softcap {
            logits = self.c.softcap(f, &logits, cap);
        }
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
            let (cos, sin) = self.c.cos_sin(f, &freqs);
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
        let (cos, sin) = self.c.cos_sin(f, &freqs);
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
        let a = self.c.act_mul(f, x, &cb);
        let r = self.c.act_mul(f, &rot, &sb);
        self.c.act_add(f, &a, &r)
    }

    /// Writes `rows [B, T, N, D]` (row group `b` into its slot at its first cache row) into
    /// plane `plane` of layer `at.layer`.
    fn write_cache(&self, f: &mut Func, cache: Value, at: &CacheAt, plane: usize, rows: &Value) -> Value {
        let s = rows.shape().to_vec();
        let (t, n, d) = (s[1], s[2], s[3]);
        let idx = |f: &mut Func, v: usize| f.splat(&Type::scalar(Elem::I32), v as f64);
        let (zero, lidx, widx) = (idx(f, 0), idx(f, at.layer), idx(f, plane));
        let mut cache = cache;
        for (row, write) in at.writes.iter().enumerate().take(s[0]) {
            let part = f.slice(rows, &[row, 0, 0, 0], &[row + 1, t, n, d]);
            let part = f.transpose(&part, &[0, 2, 1, 3]);
            let part = f.reshape(&part, &[1, 1, 1, n, t, d]);
            let slot = match at.slots {
                Slots::One(s) => s.clone(),
                Slots::All => idx(f, row),
                Slots::Listed(slots) => slots[row].clone(),
            };
            let start = [lidx.clone(), widx.clone(), slot, zero.clone(), write.clone(), zero.clone()];
            cache = f.dynamic_update_slice(&cache, &part, &start);
        }
        cache
    }

    /// The first [`Emitter::key_rows`] cache rows of plane `plane` of layer `at.layer` in the
    /// slots this call uses: `[B, N, C, D]` for a cache row of `[n, d]`, `C` the window.
    fn read_cache(&self, f: &mut Func, cache: &Value, at: &CacheAt, plane: usize, n: usize, d: usize) -> Value {
        let cap = self.key_rows;
        let idx = |f: &mut Func, v: usize| f.splat(&Type::scalar(Elem::I32), v as f64);
        let one = |f: &mut Func, s: &Value| {
            let (zero, lidx, widx) = (idx(f, 0), idx(f, at.layer), idx(f, plane));
            let start = [lidx, widx, s.clone(), zero.clone(), zero.clone(), zero];
            let r = f.dynamic_slice(cache, &start, &[1, 1, 1, n, cap, d]);
            f.reshape(&r, &[1, n, cap, d])
        };
        match at.slots {
            Slots::One(s) => one(f, s),
            Slots::Listed(slots) => {
                let rows: Vec<Value> = slots.iter().map(|s| one(f, s)).collect();
                if rows.len() == 1 { rows[0].clone() } else { f.concat(&rows, 0) }
            }
            Slots::All => {
                let (l, all) = (at.layer, self.shape.slots);
                let r = f.slice(cache, &[l, plane, 0, 0, 0, 0], &[l + 1, plane + 1, all, n, cap, d]);
                f.reshape(&r, &[all, n, cap, d])
            }
        }
    }

    /// Masked attention probabilities from f32-converted `scores` and the mask `[B, T, C]`,
    /// which `mask_dims` places in the scores' shape.
    fn probs(&self, f: &mut Func, scores: &Value, mask: &Value, mask_dims: &[usize]) -> Value {
        let scores = self.c.act_scale(f, scores, self.cfg.attn_scale);
        let sa = f.convert(&scores, Elem::F32);
        let mb = f.broadcast(mask, sa.shape(), mask_dims);
        let masked = f.add(&sa, &mb);
        self.c.softmax(f, &masked)
    }

    /// Grouped-query attention over `hx [B, T, H]`: `[B, T, heads * head_dim]` before the
    /// output projection, and the cache with this call's keys and values written.
    #[allow(clippy::too_many_arguments)]
    fn grouped_query(
        &self,
        f: &mut Func,
        qkv: &Qkv,
        (q_norm, k_norm): (Option<&Global>, Option<&Global>),
        hx: &Value,
        (cos, sin): (&Value, &Value),
        mask: &Value,
        at: &CacheAt,
        cache: Value,
    ) -> (Value, Value) {
        let cfg = self.cfg;
        let (b, t) = (hx.shape()[0], hx.shape()[1]);
        let (nh, kvh, d, cap) = (cfg.heads, cfg.kv_heads, cfg.head_dim, self.key_rows);
        let g = nh / kvh;
        let c = &self.c;
        let style = cfg.norm_style;
        // A KV-sharing layer computes queries only, and attends over its source's cache layer.
        let (mut q, kv) = match qkv {
            Qkv::Separate { q, k, v, bias } => {
                let bias = |f: &mut Func, i: usize| bias.as_ref().map(|bs| f.load(&bs[i]));
                let proj = |f: &mut Func, w: &Lin, bi: Option<Value>, heads: usize| {
                    let y = self.linear(f, hx, w, bi.as_ref());
                    f.reshape(&y, &[b, t, heads, d])
                };
                let bq = bias(f, 0);
                let q = proj(f, q, bq, nh);
                let bk = bias(f, 1);
                let k = proj(f, k, bk, kvh);
                let bv = bias(f, 2);
                (q, Some((k, proj(f, v, bv, kvh))))
            }
            Qkv::QueryOnly { q, bias } => {
                let bias = bias.as_ref().map(|g| f.load(g));
                let y = self.linear(f, hx, q, bias.as_ref());
                (f.reshape(&y, &[b, t, nh, d]), None)
            }
            Qkv::Fused { qkv, bias } => {
                let bias = bias.as_ref().map(|g| f.load(g));
                let y = self.linear(f, hx, qkv, bias.as_ref());
                let y = f.reshape(&y, &[b, t, nh + 2 * kvh, d]);
                let part =
                    |f: &mut Func, from: usize, heads: usize| f.slice(&y, &[0, 0, from, 0], &[b, t, from + heads, d]);
                (part(f, 0, nh), Some((part(f, nh, kvh), part(f, nh + kvh, kvh))))
            }
        };
        // Per head, or (OLMo) over the whole projection, viewed flat and back.
        let norm = |f: &mut Func, x: &Value, w: &Global, heads: usize| {
            let w = f.load(w);
            if !cfg.qk_norm_whole {
                return c.rms_norm(f, x, &w, cfg.rms_eps, style);
            }
            let flat = f.reshape(x, &[b, t, heads * d]);
            let normed = c.rms_norm(f, &flat, &w, cfg.rms_eps, style);
            f.reshape(&normed, &[b, t, heads, d])
        };
        if let Some(qn) = q_norm {
            q = norm(f, &q, qn, nh);
        }
        let q = self.rope(f, &q, cos, sin);
        let mut cache = cache;
        if let Some((mut k, mut v)) = kv {
            if let Some(kn) = k_norm {
                k = norm(f, &k, kn, kvh);
            }
            if cfg.v_norm {
                // Gemma 3n's scaleless norm: the plain form times ones is the normed value.
                let ones = f.constant_f32(&[d], &vec![1.0; d]);
                v = c.rms_norm(f, &v, &ones, cfg.rms_eps, style);
            }
            let k = self.rope(f, &k, cos, sin);
            cache = self.write_cache(f, cache, at, 0, &k);
            cache = self.write_cache(f, cache, at, 1, &v);
        }
        let keys = self.read_cache(f, &cache, at, 0, kvh, d);
        let values = self.read_cache(f, &cache, at, 1, kvh, d);

        // q [B, T, KVH, G, D] against keys [B, KVH, C, D]: scores [B, KVH, T, G, C].
        let qg = f.reshape(&q, &[b, t, kvh, g, d]);
        let pairs = c.attends_in_pairs(self.rows);
        let scores = if pairs {
            // Each KV head's queries against its keys, as torch's bf16 matmul sums them.
            let qh = f.transpose(&qg, &[0, 2, 1, 3, 4]);
            let qh = f.reshape(&qh, &[b * kvh, t * g, d]);
            let kh = f.reshape(&keys, &[b * kvh, cap, d]);
            let s = c.matmul_nt_rows(f, &qh, &kh, self.rows);
            f.reshape(&s, &[b, kvh, t, g, cap])
        } else {
            c.matmul(f, &qg, &keys, (&[0, 2], &[0, 1]), (&[4], &[3]))
        };
        debug_assert_eq!(scores.shape(), &[b, kvh, t, g, cap]);
        let probs = self.probs(f, &scores, mask, &[0, 2, 4]);
        // out [B, KVH, T, G, D]
        let out = if pairs {
            let ph = f.reshape(&probs, &[b * kvh, t * g, cap]);
            let vt = f.transpose(&values, &[0, 1, 3, 2]);
            let vt = f.reshape(&vt, &[b * kvh, d, cap]);
            let o = c.matmul_nt_rows(f, &ph, &vt, self.rows);
            f.reshape(&o, &[b, kvh, t, g, d])
        } else {
            c.matmul(f, &probs, &values, (&[0, 1], &[0, 1]), (&[4], &[2]))
        };
        let out = f.transpose(&out, &[0, 2, 1, 3, 4]);
        (f.reshape(&out, &[b, t, nh * d]), cache)
    }

    /// Multi-head latent attention over `hx [B, T, H]`, in its absorbed form: each head's
    /// no-rope query is taken into the latent space through that head's key part of `kv_b`,
    /// and, beside its rotated query, meets the cached rows (latent, rotated key) as one key
    /// head of `kv_lora_rank + rope` values; the heads' outputs over the latents go through
    /// their value parts of `kv_b`. The same sums as expanding every cached latent into keys
    /// and values, in another association (mlx-vlm absorbs for short queries and expands
    /// for long ones; transformers always expands), and the cache holds only the latent.
    /// Returns `[B, T, heads * v]` before the output projection, and the cache with this
    /// call's rows written.
    #[allow(clippy::too_many_arguments)]
    fn latent(
        &self,
        f: &mut Func,
        w: &LatentWeights,
        hx: &Value,
        (cos, sin): (&Value, &Value),
        mask: &Value,
        at: &CacheAt,
        cache: Value,
    ) -> (Value, Value) {
        let cfg = self.cfg;
        let m = cfg.mla.expect("invariant: latent weights come from a latent-attention config");
        let (b, t) = (hx.shape()[0], hx.shape()[1]);
        let (nh, r, p, cap) = (cfg.heads, m.kv_lora_rank, m.rope, self.key_rows);
        let c = &self.c;
        let style = cfg.norm_style;
        let q = match &w.q {
            LatentQuery::Full(q) => self.linear(f, hx, q, None),
            LatentQuery::LowRank { a, norm, b: up } => {
                let qa = self.linear(f, hx, a, None);
                let nw = f.load(norm);
                let qa = c.rms_norm(f, &qa, &nw, cfg.rms_eps, style);
                self.linear(f, &qa, up, None)
            }
        };
        let q = f.reshape(&q, &[b, t, nh, m.q_head_dim()]);
        let q_nope = f.slice(&q, &[0, 0, 0, 0], &[b, t, nh, m.nope]);
        let q_pe = f.slice(&q, &[0, 0, 0, m.nope], &[b, t, nh, m.q_head_dim()]);
        let kv = self.linear(f, hx, &w.kv_a, None);
        let latent = f.slice(&kv, &[0, 0, 0], &[b, t, r]);
        let nw = f.load(&w.kv_a_norm);
        let latent = c.rms_norm(f, &latent, &nw, cfg.rms_eps, style);
        let k_pe = f.slice(&kv, &[0, 0, r], &[b, t, r + p]);
        let k_pe = f.reshape(&k_pe, &[b, t, 1, p]);
        let (q_pe, k_pe) =
            if m.interleaved { (self.deinterleave(f, &q_pe), self.deinterleave(f, &k_pe)) } else { (q_pe, k_pe) };
        let q_pe = self.rope(f, &q_pe, cos, sin);
        let k_pe = self.rope(f, &k_pe, cos, sin);

        let latent4 = f.reshape(&latent, &[b, t, 1, r]);
        let rows = f.concat(&[latent4, k_pe], 3);
        let cache = self.write_cache(f, cache, at, 0, &rows);
        let cached = self.read_cache(f, &cache, at, 0, 1, r + p);
        let cached = f.reshape(&cached, &[b, cap, r + p]);

        // kv_b per head: [heads, nope + v, r], the key rows then the value rows.
        let kv_b = f.load(&w.kv_b);
        let kv_b = f.reshape(&kv_b, &[nh, m.nope + m.v, r]);
        let w_k = f.slice(&kv_b, &[0, 0, 0], &[nh, m.nope, r]);
        let w_v = f.slice(&kv_b, &[0, m.nope, 0], &[nh, m.nope + m.v, r]);
        // q_nope [B, T, N, nope] . w_k [N, nope, r] -> [N, B, T, r] -> [B, T, N, r]
        let q_lat = c.matmul(f, &q_nope, &w_k, (&[2], &[0]), (&[3], &[1]));
        let q_lat = f.transpose(&q_lat, &[1, 2, 0, 3]);
        let q_all = f.concat(&[q_lat, q_pe], 3);
        // scores [B, T, N, C]
        let scores = c.matmul(f, &q_all, &cached, (&[0], &[0]), (&[3], &[2]));
        let probs = self.probs(f, &scores, mask, &[0, 1, 3]);
        let latents = f.slice(&cached, &[0, 0, 0], &[b, cap, r]);
        // out over the latents [B, T, N, r], then each head's value part: [N, B, T, v].
        let o_lat = c.matmul(f, &probs, &latents, (&[0], &[0]), (&[3], &[1]));
        let out = c.matmul(f, &o_lat, &w_v, (&[2], &[0]), (&[3], &[2]));
        let out = f.transpose(&out, &[1, 2, 0, 3]);
        (f.reshape(&out, &[b, t, nh * m.v]), cache)
    }

    /// Adjacent rotary pairs `(x0, x1), (x2, x3), ...` of `x [B, T, N, D]` laid out as the
    /// two halves `rotate_half` turns (`x0, x2, ..., x1, x3, ...`), as transformers' DeepSeek
    /// family does before its rotary embedding; the graph keeps that layout after it (dot
    /// products do not depend on the order, if queries and keys share it).
    fn deinterleave(&self, f: &mut Func, x: &Value) -> Value {
        let s = x.shape().to_vec();
        let pairs = f.reshape(x, &[s[0], s[1], s[2], s[3] / 2, 2]);
        let halves = f.transpose(&pairs, &[0, 1, 2, 4, 3]);
        f.reshape(&halves, &s)
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
        let c = &self.c;
        let style = cfg.norm_style;
        let hx = match &w.ln1 {
            Some(ln1) => {
                let ln1 = f.load(ln1);
                c.rms_norm(f, x, &ln1, cfg.rms_eps, style)
            }
            None => x.clone(),
        };
        let (attn, cache) = self.attention(f, l, w, &hx, cos, sin, mask, slots, writes, cache);
        let x = c.residual(f, x, &attn);

        let hx = match &w.ln2 {
            Some(ln2) => {
                let ln2 = f.load(ln2);
                c.rms_norm(f, &x, &ln2, cfg.rms_eps, style)
            }
            None => x.clone(),
        };
        let mut down = self.mlp(f, l, w, &hx);
        if let Some(post) = &w.post_mlp {
            let pw = f.load(post);
            down = c.rms_norm(f, &down, &pw, cfg.rms_eps, style);
        }
        (c.residual(f, &x, &down), cache)
    }

    /// Layer `l`'s attention over the normed input `hx [B, T, H]`: the output projection's
    /// result, normed when the layer norms attention's output, and the cache.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        f: &mut Func,
        l: usize,
        w: &Layer,
        hx: &Value,
        cos: &Value,
        sin: &Value,
        mask: &Value,
        slots: &Slots,
        writes: &[Value],
        cache: Value,
    ) -> (Value, Value) {
        let cfg = self.cfg;
        let at = CacheAt { layer: cfg.cache_layer(l), slots, writes };
        let (out, cache) = match &w.attn {
            AttnWeights::GroupedQuery { qkv, q_norm, k_norm } => {
                self.grouped_query(f, qkv, (q_norm.as_ref(), k_norm.as_ref()), hx, (cos, sin), mask, &at, cache)
            }
            AttnWeights::Latent(lw) => self.latent(f, lw, hx, (cos, sin), mask, &at, cache),
        };
        let mut attn = self.linear(f, &out, &w.o, None);
        if let Some(post) = &w.post_attn {
            let pw = f.load(post);
            attn = self.c.rms_norm(f, &attn, &pw, cfg.rms_eps, cfg.norm_style);
        }
        (attn, cache)
    }

    /// Layer `l`'s gated MLP over the normed input `hx [B, T, H]`, its gate made sparse where
    /// the config asks (as transformers' `_gaussian_topk`: what lies above `mean + std *
    /// Phi^-1(target)` of its row, shifted down by that cutoff, is kept).
    fn mlp(&self, f: &mut Func, l: usize, w: &Layer, hx: &Value) -> Value {
        let (b, t) = (hx.shape()[0], hx.shape()[1]);
        let (mut gate, up) = match &w.gate_up {
            GateUp::Separate { gate, up } => (self.linear(f, hx, gate, None), self.linear(f, hx, up, None)),
            GateUp::Fused(both) => {
                let y = self.linear(f, hx, both, None);
                let i = w.intermediate;
                let up = f.slice(&y, &[0, 0, 0], &[b, t, i]);
                (f.slice(&y, &[0, 0, i], &[b, t, 2 * i]), up)
            }
        };
        let target = self.cfg.sparsity[l];
        if target > 0.0 {
            gate = self.sparse(f, &gate, target);
        }
        let act = self.activation(f, &gate);
        let prod = self.c.act_mul(f, &act, &up);
        self.linear(f, &prod, &w.down, None)
    }

    /// `relu(x - (mean + std * Phi^-1(target)))` over the last dimension (the standard
    /// deviation biased), in the activation dtype as torch computes it.
    fn sparse(&self, f: &mut Func, x: &Value, target: f64) -> Value {
        let shape = x.shape().to_vec();
        let last = shape.len() - 1;
        let lead: Vec<usize> = (0..last).collect();
        let n = f.splat(&Type::new(x.elem(), &shape[..last]), shape[last] as f64);
        let sum = f.reduce(x, &[last], mlxcel_emit::Reduce::Sum);
        let mean = f.div(&sum, &n);
        let mb = f.broadcast(&mean, &shape, &lead);
        let centred = f.sub(x, &mb);
        let sq = f.mul(&centred, &centred);
        let var = f.reduce(&sq, &[last], mlxcel_emit::Reduce::Sum);
        let var = f.div(&var, &n);
        let std = f.sqrt(&var);
        // torch: Normal(0, 1).icdf on an f32 tensor, cast to the activations' dtype.
        let k = f.constant_f32(&[], &[normal_quantile(target as f32)]);
        let k = f.convert(&k, x.elem());
        let kb = f.broadcast(&k, &shape[..last], &[]);
        let cutoff = f.mul(&std, &kb);
        let cutoff = f.add(&mean, &cutoff);
        let cb = f.broadcast(&cutoff, &shape, &lead);
        let shifted = f.sub(x, &cb);
        let zero = f.splat(shifted.ty(), 0.0);
        f.max(&shifted, &zero)
    }

    /// The config's MLP activation.
    fn activation(&self, f: &mut Func, x: &Value) -> Value {
        match self.cfg.activation {
            Activation::Silu => self.c.silu(f, x),
            Activation::GeluTanh => self.c.gelu_tanh(f, x),
        }
    }
}

/// The standard normal distribution's quantile at `p` as torch's `Normal(0, 1).icdf` computes
/// it on an f32 tensor (`sqrt(2) * erfinv(2p - 1)`, the argument rounded to f32): refined by
/// Newton steps on `libm`'s erfc to f64 accuracy, then rounded once.
fn normal_quantile(p: f32) -> f32 {
    let arg = (2.0 * p - 1.0) as f64;
    // erfinv(arg) by Newton's method on erf, from a start inside the basin.
    let mut y = if arg.abs() < 0.7 { arg * 0.886 } else { arg.signum() * (-(1.0 - arg.abs()).ln()).sqrt() * 0.9 };
    for _ in 0..60 {
        let err = (1.0 - libm::erfc(y)) - arg;
        let slope = 2.0 / std::f64::consts::PI.sqrt() * (-y * y).exp();
        let step = err / slope;
        y -= step;
        if step.abs() < 1e-17 {
            break;
        }
    }
    (std::f64::consts::SQRT_2 * y) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_windows_quarter_the_cache_in_whole_chunks_down_to_the_smallest() {
        let serve = BundleShape { chunk: 64, capacity: 2048, slots: 8 };
        assert_eq!(key_windows(serve), [576]);
        assert_eq!(key_windows(BundleShape { capacity: 8192, ..serve }), [576, 2112]);
        assert_eq!(key_windows(BundleShape { capacity: 32768, ..serve }), [576, 2112, 8256]);
        // The bench's 512-row context and the tests' short caches: none.
        assert!(key_windows(BundleShape { capacity: 512, ..serve }).is_empty());
        assert!(key_windows(BundleShape { chunk: 32, capacity: 128, slots: 2 }).is_empty());
        // Whole chunks: a 1024-row chunk's cache of 2048 rows has one window, its first chunk.
        assert_eq!(key_windows(BundleShape { chunk: 1024, capacity: 1024, slots: 1 }), [1024]);
        for (rows, window) in [(1, 576), (576, 576), (577, 2112), (2112, 2112)] {
            assert_eq!(key_window_for(rows, serve), window, "{rows} rows");
        }
        assert_eq!(windowed("decode", 576, serve), "decode_r576");
        assert_eq!(windowed("decode", serve.rows(), serve), "decode");
    }

    #[test]
    fn every_call_that_attends_is_named_once_per_key_window() {
        let shape = BundleShape { chunk: 64, capacity: 2048, slots: 4 };
        let names = export_names(shape);
        let attending = [
            "decode",
            "decode_rows_1",
            "decode_rows_2",
            "prefill_tokens",
            "prefill_tokens_16",
            "prefill_tokens_32",
            "prefill_embeddings",
        ];
        for call in attending {
            assert!(attends(call), "{call}");
            assert!(names.iter().any(|n| n == call), "{call}");
            assert!(names.iter().any(|n| *n == format!("{call}_r576")), "{call}_r576");
        }
        for name in ["embed", "logits", "logits_at", "logits_at_32", "kv_slot"] {
            assert!(!attends(name), "{name}");
            assert!(names.iter().any(|n| n == name), "{name}");
            assert!(!names.iter().any(|n| n.starts_with(name) && n.contains("_r")), "{name} has no window");
        }
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "names are unique");
    }
}
