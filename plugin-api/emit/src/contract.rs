//! The numeric contract: which dtype values are stored in, which dtype
//! contractions and reductions accumulate in, and where results are rounded.
//! It is versioned and part of every compiled artifact's fingerprint; the
//! helpers below are the only place the contract-sensitive operations are
//! written, so every graph rounds at the same points as the reference
//! (Hugging Face transformers on CPU torch).

use crate::{Compare, Elem, Func, Reduce, Type, Value};

/// Bump when any helper's emitted arithmetic changes or a helper is added.
/// v3: exact GELU (`gelu_erf`) and `quick_gelu`.
/// v4: `linear` over at most [`WEIGHT_LEFT_MAX_ROWS`] rows contracts with
/// the weight on the left (`w @ x^T`).
/// v5: MLX's affine-quantized weights (`dequantize`, `qlinear`).
/// v6: a decode step's `linear` over 16-bit float weights reduces in 256-wide lane groups
/// combined at the end (the target's tuning spec), stated in the association.
/// v7: `linear_tiled`: 16-bit float weights served in row tiles, each output summed over its
/// inputs in order.
/// v8: `qlinear` over up to [`QLINEAR_FUSED_MAX_ROWS`] rows reduces each output over
/// `(groups, group_size)` as one row does (it contracted a dequantized `[out, in]` copy).
/// v9: a prompt's rows ([`Rows::Prompt`]) take the many-rows form of `linear` and `qlinear` at
/// every row count.
/// v10: rotary tables from angles reduced by whole turns first ([`NumericContract::cos_sin`]).
/// v11: under bf16 activations, `linear_tiled` contracts bf16 `x` with bf16 weights in tiles of
/// 16 rows by 2 inputs ([`Tiles::BF16`]) by IREE's bf16 mmt4d microkernel, and every rounding to
/// bf16 is written out on the bits ([`NumericContract::round`]), elementwise operations in the
/// activations included ([`NumericContract::act_mul`], [`NumericContract::act_add`]).
/// v12: the bf16 contract names how its linears sum bf16 products ([`Bf16Dot`]): in pairs on
/// CPUs with AVX512-BF16, in order (the f32 contract's tiles) elsewhere.
/// v13: under f32 activations, f32 weights are served in the same row tiles as 16-bit ones, each
/// output summed over its inputs in order (they were contracted by `linear` in the backend's
/// order).
/// v14: affine-quantized weights are served in row tiles ([`NumericContract::affine_tiles`]):
/// a decode step sums each output's groups in order, each over its inputs in order, and more
/// rows contract the dequantized tiles as `linear_tiled` does.
/// v15: attention scores are scaled as torch multiplies a tensor by a Python number
/// ([`NumericContract::act_scale`]): by the f32 scale, rounded once. Under bf16 activations the
/// scale was rounded to bf16 first, which for a head size that is not a power of four (any
/// scale not a power of two: Qwen3's 32, every 128) made two thirds of the logits differ
/// from transformers in bf16.
/// v16: under bf16 activations `quick_gelu` rounds where torch's three tensor operations do
/// (`1.702 * x`, the sigmoid, the product), and encoders compute under bf16 activations too; f32
/// graphs compute the same results.
/// v17: an RMSNorm's mean of squares is the sum divided by the count, as torch's `mean` on CPU
/// (it was multiplied by the count's reciprocal: an f32 ulp apart in about a third of the rows
/// 1536 wide), and under bf16 activations that sum adds in torch's order ([`torch_sum_last`]):
/// the backend's order put a row's normalized value on the other side of a bf16 rounding.
/// v18: bf16 linears summed in pairs over a prompt's or an encoder's rows restart every
/// [`PAIRS_BLOCK_INPUTS`] inputs and add the blocks' sums in order, as torch's bf16 `linear` on
/// such CPUs does (one run over all inputs parted from it at real widths).
/// v19: under bf16 activations summed in pairs, the softmax is torch's AVX-512 kernel's to the
/// bit ([`torch_softmax_last`]: Sleef's `expf`, 16 lanes, times `1 / sum`), and a prompt's
/// attention scores and outputs sum as torch's bf16 `matmul` does
/// ([`NumericContract::matmul_nt_rows`]: pairs over the head's width and over the keys, in blocks
/// of [`PAIRS_BLOCK_INPUTS`] keys); both were the backend's. A real-width prompt's logits parted
/// from transformers in bf16 at row 23 through the softmax alone.
pub const CONTRACT_VERSION: u32 = 19;

/// `linear` over this many rows or fewer (decode steps) contracts as
/// `w @ x^T`, the weight on the left, and transposes the result back: IREE
/// 3.13's llvm-cpu codegen streams a weight on the left much faster for few
/// rows. Measured on a 8960x1536 f32 weight, 2 threads, `x @ w^T` against
/// `w @ x^T`: 1 row 7.0 against 3.0 ms, 8 rows 3.8 against 3.2, 16 rows 7.1
/// against 5.4, but 32 rows 9.9 against 12.8. Larger row counts (prefill,
/// encoders) keep `x @ w^T`, and with it their measured bf16 numerics.
pub const WEIGHT_LEFT_MAX_ROWS: usize = 16;

/// Rows per tile of a weight served for [`NumericContract::linear_tiled`] under f32 activations
/// on a CPU with 512-bit vectors, and wherever the vector width is not known (a CPU named by
/// `--target-cpu`, an encoder from a plugin built before plugin-api 1.3): two 512-bit vectors
/// of f32 outputs. Measured
/// on 8960x1536 and 1536x8960 bf16 weights (IREE 3.13, 2 threads, AVX-512, against `linear`):
/// tiles of 32 rows take 0.93 and 1.01 ms for one row of `x` (1.04 and 1.41), 1.58 and 1.88 ms
/// for 8 rows (5.40 and 7.53), 10.1 and 11.1 ms for 64 (16.7 and 20.7); tiles of 16 rows run
/// one accumulator per row of `x` and were slower for one row (1.17 ms), tiles of 64 slower for
/// 8 (2.48 ms).
pub const WEIGHT_TILE_ROWS: usize = 32;

/// Rows per tile of a 16-bit weight served for [`NumericContract::linear_tiled`] under f32
/// activations on a CPU whose widest vectors are `vector_bits` wide (`None`: not known): two
/// vectors of f32 outputs, so 16 on AVX2 and [`WEIGHT_TILE_ROWS`] on AVX-512 (an f32 weight's
/// tiles have half as many, see [`NumericContract::tiles`]). Measured on an 8960x1536 bf16
/// weight on an AMD Zen 3 (AVX2; IREE 3.13, 2 threads, `linalg.mmt4d` alone): tiles of 16 rows
/// contract 64 rows of `x` in 13.1 to 15.0 ms against 17.7 to 18.7 in tiles of 32, and one row
/// as fast (1.47 to 1.85 ms against 1.50 to 1.81); tiles of 8 rows cost one row about 1.6x.
/// Each output still sums its inputs in order in one lane, so the tile changes no result.
pub fn weight_tile_rows(vector_bits: Option<u32>) -> usize {
    match vector_bits {
        Some(bits) if bits < 512 => WEIGHT_TILE_ROWS / 2,
        _ => WEIGHT_TILE_ROWS,
    }
}

/// What joins a checkpoint key and its layout in the key a module declares for a tiled view.
pub const TILED_KEY_SEPARATOR: &str = "|tile";

/// The tiles a dense `[out, in]` matrix is served in for [`NumericContract::linear_tiled`],
/// `[out / rows, in / depth, rows, depth]`: row `r`, input `i` of the stored matrix is at
/// `[r / rows, i / depth, r % rows, i % depth]`. The host builds that view once, at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    pub rows: usize,
    pub depth: usize,
}

impl Tiles {
    /// The tiles of f32 activations over f32 or 16-bit float weights: `rows` rows by one input
    /// ([`weight_tile_rows`]), each output one f32 vector lane summing its inputs in order.
    pub const fn f32(rows: usize) -> Tiles {
        Tiles { rows, depth: 1 }
    }

    /// The tiles of bf16 activations over bf16 weights: 16 rows by 2 inputs, the tile of IREE's
    /// bf16 mmt4d microkernel (`vdpbf16ps` multiplies 2 bf16 pairs into each f32 lane). Measured
    /// on an 8960x1536 weight (IREE 3.13, 2 threads, AMD Zen 4): 64 rows of `x` 6.3 ms (278
    /// GFLOP/s) against 10.1 ms for f32 activations in [`Tiles::f32`] of 32 rows, 1 row 0.57
    /// against 0.93 ms, 8 rows 1.59 against 1.58 ms.
    pub const BF16: Tiles = Tiles { rows: 16, depth: 2 };

    /// `[out / rows, in / depth, rows, depth]`.
    pub fn shape(&self, out: usize, inputs: usize) -> [usize; 4] {
        [out / self.rows, inputs / self.depth, self.rows, self.depth]
    }

    /// Whether an `[out, in]` matrix fills whole tiles.
    pub fn fit(&self, out: usize, inputs: usize) -> bool {
        out.is_multiple_of(self.rows) && inputs.is_multiple_of(self.depth)
    }

    /// The parameter key a module declares for the checkpoint matrix `key` in these tiles:
    /// `{key}|tile{rows}`, or `{key}|tile{rows}x{depth}` for tiles deeper than one input.
    pub fn key(&self, key: &str) -> String {
        match self.depth {
            1 => format!("{key}{TILED_KEY_SEPARATOR}{}", self.rows),
            d => format!("{key}{TILED_KEY_SEPARATOR}{}x{d}", self.rows),
        }
    }
}

/// How a contract's linears sum the products of bf16 activations and bf16 weights into f32,
/// which the target CPU decides: torch's own order on the CPU differs the same way (oneDNN's
/// `vdpbf16ps` where there is AVX512-BF16), and IREE's bf16 microkernel has a tile only for
/// such CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bf16Dot {
    /// Two inputs at a time, the odd input's product first (`vdpbf16ps`): weights in
    /// [`Tiles::BF16`], `x` in bf16, IREE's bf16 mmt4d microkernel. Needs AVX512-BF16.
    Pairs,
    /// Each operand widened to f32 exactly, each output summed over its inputs in order: weights
    /// in [`Tiles::f32`], IREE's generated code, as under f32 activations. Any CPU. (Without
    /// AVX512-BF16 IREE's microkernel falls back to generic code for tiles of 16x2, which computed
    /// them wrong, and slowly: an 8960x1536 weight took 1232 ms for 64 rows on an AMD Zen 3,
    /// against 18.0 ms in these tiles.)
    InOrder,
}

impl Bf16Dot {
    /// The sum for a CPU with (`true`) or without AVX512-BF16.
    pub fn for_cpu(avx512_bf16: bool) -> Self {
        if avx512_bf16 { Bf16Dot::Pairs } else { Bf16Dot::InOrder }
    }

    /// Its name in fingerprints and contract records.
    pub fn name(self) -> &'static str {
        match self {
            Bf16Dot::Pairs => "pairs",
            Bf16Dot::InOrder => "in-order",
        }
    }
}

/// A linear weight `[out, in]` in MLX's affine quantization, as a module declares it: `q` holds
/// the `bits`-bit integers (signless `i4` or `i8`: the checkpoint's packed `uint32` words read as
/// such), `scales` and `biases` `[out, in / group_size]` are in the checkpoint's dtype, and
/// `w = q * scale + bias` per group of `group_size` consecutive inputs.
#[derive(Clone, Debug)]
pub struct AffineWeight {
    pub q: Value,
    pub scales: Value,
    pub biases: Value,
    pub group_size: usize,
}

impl AffineWeight {
    /// `[out, in]`.
    pub fn shape(&self) -> [usize; 2] {
        match self.q.shape() {
            &[tiles, inputs, rows, 1] => [tiles * rows, inputs],
            shape => [shape[0], shape.get(1).copied().unwrap_or(0)],
        }
    }

    /// The rows of its tiles, when it is served in row tiles ([`NumericContract::affine_tiles`]):
    /// `q` `[out / t, in, t, 1]`, `scales` and `biases` `[out / t, in / group_size, t, 1]`.
    pub fn tile_rows(&self) -> Option<usize> {
        match self.q.shape() {
            &[_, _, rows, 1] => Some(rows),
            _ => None,
        }
    }
}

/// The numeric contract as a compiled artifact carries it: every choice that decides a graph's
/// rounding, in one versioned record. Its JSON is part of the artifact's cache key and is
/// written into the artifact, and the host refuses an artifact whose record differs from the
/// one it asks for (naming both) before the module is loaded.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContractDescriptor {
    pub version: u32,
    /// How the checkpoint stores what the graph reads, one entry per distinct form
    /// (`f32`, `bf16`, `affine bits=4 group_size=64 scales=f32`).
    pub sources: Vec<String>,
    /// The dtype values are materialised in between operations.
    pub activations: Elem,
    /// The dtype contractions, norms and softmax accumulate in.
    pub accumulate: Elem,
    /// The dtype of the results the graph returns (logits, features).
    pub results: Elem,
    /// How bf16 x bf16 linears sum, under bf16 activations.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub bf16_dot: Option<Bf16Dot>,
    /// Where each contract helper rounds.
    pub rounding: Vec<String>,
    /// How reductions associate.
    pub association: String,
    /// How quantized weights are dequantized, when the sources include any.
    pub dequantization: Option<String>,
    /// The backend that compiles and runs the graph: compiler revision and target (with the
    /// CPU's identity when compiled for the host).
    pub backend: String,
}

impl ContractDescriptor {
    /// The record as one line of JSON (field order fixed).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("invariant: the descriptor serialises")
    }
}

/// Where each helper rounds, as [`ContractDescriptor::rounding`] states it.
const ROUNDING: [&str; 14] = [
    "linear, matmul: operands widened to the accumulator, contracted, the bias added there, rounded once",
    "linear_tiled: as linear, the weight (and x, when bf16 products are summed in pairs) widened inside the contraction",
    "rms_norm plain: normalised in the accumulator and rounded, then multiplied by the weight in the activations",
    "rms_norm one_plus: normalised and scaled by (1 + w) in the accumulator, rounded once",
    "rms_norm: the mean of squares is their sum divided by the count, in the accumulator",
    "layer_norm: in the accumulator (biased variance), rounded once",
    "silu, gelu_tanh, gelu_erf (Abramowitz-Stegun 7.1.26): in the accumulator, rounded once",
    "quick_gelu: 1.702 x rounded, the sigmoid in the accumulator rounded, the product rounded (torch's three ops)",
    "softmax: max-subtracted in the accumulator, rounded once; attention scores scaled by the f32 scale, rounded once",
    "softmax under bf16 pairs: Sleef's expf (fused multiply-adds) of each input less the maximum, times 1/sum rounded",
    "residual: added in the activations",
    "softcap: tanh(x / c) * c in the logits' dtype",
    "qlinear: the weight dequantized in the accumulator, then as linear",
    "cos_sin: rotary angles in f32 reduced by whole turns (2pi in three parts, exact products), then cos and sin",
];

/// How reductions associate, as [`ContractDescriptor::association`] states it.
const ASSOCIATION: &str = "unspecified: the backend's order (IREE llvm-cpu tiles and vectorises each reduction; \
                           with --iree-llvmcpu-reassociate-fp-reductions in the backend, vector lanes are summed \
                           apart and then combined); qlinear over up to 8 rows reduces each output over \
                           (groups, group_size) at once, and linear over up to 16 rows contracts with the weight \
                           on the left, except over a prompt's rows (a prefill call), which take the form of more \
                           rows at every count; linear_tiled under f32 activations (f32 and 16-bit float weights in row tiles \
                           of 32, or 16 on a host CPU without AVX-512) sums each output over its inputs in order, \
                           one vector lane per output, and \
                           under bf16 activations over bf16 weights as the contract's bf16_dot says: pairs (tiles of 16 \
                           rows by 2 inputs) in the order of IREE's bf16 mmt4d microkernel, two inputs' products \
                           added to each lane at a time, over a prompt's rows and over more than 16 by \
                           count in blocks of 1024 inputs each summed from zero and the blocks' sums \
                           added in order (torch's oneDNN gemm), over a decode step's in one run, \
                           and so do a prompt's attention scores (over the head's width) and outputs \
                           (over the keys, in the window's order) per KV head, a decode step's \
                           attention in the backend's order, and the softmax sums its exponentials \
                           as torch's AVX-512 vec::reduce_all: 16 lanes each in order, the last \
                           partial vector into the first lanes, then lane i + lane i+8, +4, +2, +1 \
                           (fewer than 16 inputs in order), \
                           or in-order (those row tiles, one input deep) as under f32 \
                           activations; qlinear over a weight in row tiles (affine_tiles) sums each \
                           output in one vector lane: over up to 8 rows each group's products over its inputs \
                           in order, then the groups' sums in order, and over more rows (or a prompt's) its \
                           products over the inputs in order, as linear_tiled; linear over one \
                           row of 16-bit float weights not in tiles reduces each output over 256 inputs at a time, \
                           lanes summed apart and combined at the end (the llvm-cpu tuning spec, reassociated); \
                           under bf16 activations an RMSNorm's mean of squares sums as torch's CPU sum kernel: \
                           8-lane f32 vectors, 4 accumulators a step in a 4-level cascade (runs of 16 steps \
                           carried up a level), the leftover vectors to the first accumulator, the accumulators \
                           in order, then from zero the scalar tail and the 8 lanes in order";

/// The dequantization, as [`ContractDescriptor::dequantization`] states it.
const DEQUANTIZATION: &str = "MLX affine: integers packed least significant first in u32 words, zero-extended; \
                              w = f32(q) * f32(scale), rounded, then + f32(bias), rounded; one scale and bias \
                              per group of group_size consecutive inputs";

/// Inputs per block of a bf16 linear summed in pairs ([`Bf16Dot::Pairs`]): each output sums a
/// block's products from zero, two inputs at a time in order, and the blocks' sums are added in
/// order. torch's bf16 `linear` on a CPU with AVX512-BF16 (oneDNN's gemm) sums this way for two
/// rows of `x` and more: emulated in numpy against torch 2.15 on an AMD Zen 4, blocks of 1024
/// inputs reproduced every output of 2 to 1024 rows by 1280 to 8960 inputs, while one block over
/// all inputs missed up to 1 in 2000 (`tools/oracle/gen_torch_linears.py` keeps such outputs).
/// One row of `x` takes another path in torch, which neither order reproduces (1 to 3 outputs
/// in 2048 differ either way at 2048 to 8960 inputs); decode steps keep one run over all inputs
/// ([`NumericContract::linear_tiled_rows`]). A CPU with AMX (an Intel Xeon with `amx_bf16`) runs
/// torch's bf16 gemms on AMX tiles instead, whose sums neither order states: there 11 of the
/// fixture's 2,368 outputs part from the Zen 4 goldens, and a 311-row prompt's 1536-input linear
/// parts from these blocks in 27 of 79,616 outputs (0 with oneDNN held to `AVX512_CORE_BF16`).
/// IREE emits no AMX code, so the contract cannot follow torch there.
pub const PAIRS_BLOCK_INPUTS: usize = 1024;

/// At most this many rows of `x` per tile in [`NumericContract::linear_tiled`].
const LHS_TILE_MAX_ROWS: usize = 16;

/// Rows of `x` per tile in [`NumericContract::linear_tiled`]: the largest divisor of `rows` up
/// to 16, so a tile's products fill at most 32 of the 32 vector registers (16 rows by two
/// vectors of outputs; measured on 8960x1536, 64 rows: 10.2 ms in tiles of 16, 10.1 in tiles of
/// 8).
fn lhs_tile_rows(rows: usize) -> usize {
    (1..=rows.clamp(1, LHS_TILE_MAX_ROWS)).rev().find(|m| rows.is_multiple_of(*m)).unwrap_or(1)
}

/// `qlinear` over this many rows or fewer reduces as a fused multiply-and-reduce (see
/// [`NumericContract::qlinear`]): a decode step of up to 8 streams. Measured on an 8960x1536
/// 4-bit weight in groups of 64 (IREE 3.13, 2 threads, with the llvm-cpu tuning spec) against
/// contracting the dequantized weight: 3 rows 2.2 against 6.3 ms, 4 rows 2.9 against 7.1, 8 rows
/// 4.2 to 4.6 against 5.8 to 6.1, but 16 rows 7.8 against 7.3.
pub const QLINEAR_FUSED_MAX_ROWS: usize = 8;

/// Whose rows a contraction's `x` holds, which picks the form of [`NumericContract::linear_rows`],
/// [`NumericContract::linear_tiled_rows`] and [`NumericContract::qlinear_rows`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// By their count: up to [`WEIGHT_LEFT_MAX_ROWS`] rows (a decode step's streams, one token
    /// each) contract with the weight on the left, up to [`QLINEAR_FUSED_MAX_ROWS`] quantized
    /// ones as one fused reduction; more (an encoder's, a prefill chunk's) take `x @ w^T`.
    ByCount,
    /// Consecutive rows of one prompt (a prefill call): `x @ w^T` and the dequantized
    /// quantized weight at every count, so a row computes the same bits in a call of any width
    /// and a prompt prefilled in calls of several widths equals one prefilled in whole chunks.
    Prompt,
}

/// How a graph materialises and accumulates values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct NumericContract {
    pub version: u32,
    /// The dtype activations are stored in between operations (the
    /// checkpoint's compute dtype: f32 or bf16).
    pub activations: Elem,
    /// The dtype matmuls, norms and softmax accumulate in.
    pub accumulate: Elem,
    /// How bf16 x bf16 linears sum (bf16 activations over bf16 weights); f32 contracts have
    /// none and say [`Bf16Dot::InOrder`].
    pub bf16_dot: Bf16Dot,
    /// Rows per 16-bit weight tile of [`Tiles::f32`] ([`weight_tile_rows`] of the target; a layout,
    /// which changes no result).
    pub tile_rows: usize,
    /// Whether the graph's linears only ever contract many rows (an encoder's), so f32 weights take
    /// `tile_rows` too rather than half as many ([`Self::tiles`], [`Self::for_many_rows`]).
    pub many_rows_only: bool,
}

impl NumericContract {
    /// Everything in f32: the parity reference.
    pub fn f32() -> Self {
        NumericContract {
            version: CONTRACT_VERSION,
            activations: Elem::F32,
            accumulate: Elem::F32,
            bf16_dot: Bf16Dot::InOrder,
            tile_rows: WEIGHT_TILE_ROWS,
            many_rows_only: false,
        }
    }

    /// bf16 activations with f32 accumulation, as torch computes on CPU, bf16 linears summed as
    /// `dot` says (the target CPU's: [`Bf16Dot::for_cpu`]).
    pub fn bf16(dot: Bf16Dot) -> Self {
        NumericContract { bf16_dot: dot, activations: Elem::BF16, ..Self::f32() }
    }

    /// The same contract with its weight tiles for a CPU whose widest vectors are `vector_bits`
    /// wide ([`weight_tile_rows`]).
    pub fn for_vectors(self, vector_bits: Option<u32>) -> Self {
        NumericContract { tile_rows: weight_tile_rows(vector_bits), ..self }
    }

    /// The same contract for a graph whose linears only ever contract many rows of `x` (an
    /// encoder's patches or frames, never a decode step's few): f32 weights take the 16-bit
    /// weights' tiles, two vectors of f32 outputs. Measured on an AMD Zen 3 (AVX2; `linalg.mmt4d`
    /// alone, 1024 rows, 4 runs alternated): a 5120x1280 f32 weight 86.3 to 90.2 ms in tiles of 16
    /// against 88.8 to 104 in tiles of 8, a 1280x1280 one level.
    pub fn for_many_rows(self) -> Self {
        NumericContract { many_rows_only: true, ..self }
    }

    /// The contract's full record for a graph reading `sources` (see
    /// [`ContractDescriptor::sources`]; dequantization is stated when one starts with `affine`),
    /// compiled and run by `backend`, returning `results`.
    pub fn descriptor(&self, sources: Vec<String>, results: Elem, backend: String) -> ContractDescriptor {
        let quantized = sources.iter().any(|s| s.starts_with("affine"));
        ContractDescriptor {
            version: self.version,
            sources,
            activations: self.activations,
            accumulate: self.accumulate,
            results,
            bf16_dot: self.stated_bf16_dot(),
            rounding: ROUNDING.iter().map(|s| (*s).to_owned()).collect(),
            association: ASSOCIATION.to_owned(),
            dequantization: quantized.then(|| DEQUANTIZATION.to_owned()),
            backend,
        }
    }

    /// A stable string for fingerprints and cache keys.
    pub fn fingerprint(&self) -> String {
        let dot = self.stated_bf16_dot().map(|d| format!(":bf16-dot={}", d.name())).unwrap_or_default();
        format!("numeric-contract=v{}:act={}:acc={}{dot}", self.version, self.activations, self.accumulate)
    }

    /// The bf16 sum, where one is computed: under bf16 activations only (f32 ones sum no bf16
    /// products, whatever the field says).
    fn stated_bf16_dot(&self) -> Option<Bf16Dot> {
        (self.activations == Elem::BF16).then_some(self.bf16_dot)
    }

    /// The tiles a dense `[out, in]` matrix stored as `elem` is served in for
    /// [`Self::linear_tiled`], or `None` when it is read as stored: 16-bit float weights under f32
    /// activations in [`Tiles::f32`] of the contract's rows, f32 weights in half as many (one
    /// vector of the weight per input, as a 16-bit tile row is; as many in a graph of many rows
    /// only, [`Self::for_many_rows`]), bf16 weights under bf16
    /// activations in [`Tiles::BF16`] when they are summed in pairs ([`Bf16Dot::Pairs`]) and in
    /// [`Tiles::f32`] otherwise, when the matrix fills whole tiles.
    ///
    /// Measured on an AMD Zen 3 (AVX2): f32 weights in tiles of 16 rows against `linear`
    /// (full-depth Qwen2-VL-2B text decoder, 305-row prompt, alternated twice): prefill 6.38 and
    /// 6.65 s against 11.91 and 8.81 s, decode 4.89 and 5.81 tok/s against 4.07 and 4.60, the same
    /// greedy tokens. Tiles of 8 rows against 16 (an 8960x1536 f32 weight, `linalg.mmt4d` alone,
    /// IREE 3.13, 2 threads, 8 runs alternated, medians): 8 rows of `x` (a decode step of 8 streams)
    /// 3.98 against 4.64 ms, where 16 outputs by 8 rows need more accumulators than AVX2 has
    /// registers; 64 rows 14.4 against 14.2 ms, one row 3.0 against 2.9. Served (8 slots, 48
    /// tokens a stream, alternated), 8 streams aggregated a median 21.1 tok/s against 20.1 in
    /// tiles of 16 (6 runs each), and 23.9 against 22.3 through `linear` (4 each, a quieter
    /// stretch); a 329-row prompt prefilled in 7.34 and 7.36 s against 7.46 and 7.35.
    pub fn tiles(&self, elem: Elem, out: usize, inputs: usize) -> Option<Tiles> {
        let f32_rows = if self.many_rows_only { self.tile_rows } else { self.tile_rows / 2 };
        let tiles = match (self.activations, elem, self.bf16_dot) {
            (Elem::F32, Elem::F32, _) => Tiles::f32(f32_rows),
            (Elem::F32, Elem::BF16 | Elem::F16, _) => Tiles::f32(self.tile_rows),
            (Elem::BF16, Elem::BF16, Bf16Dot::Pairs) => Tiles::BF16,
            (Elem::BF16, Elem::BF16, Bf16Dot::InOrder) => Tiles::f32(self.tile_rows),
            _ => return None,
        };
        tiles.fit(out, inputs).then_some(tiles)
    }

    /// The row tiles an affine-quantized `[out, in]` matrix is served in ([`Self::qlinear_rows`]):
    /// the 16-bit weights' ([`Tiles::f32`] of `tile_rows`), for the integers, their scales and
    /// their biases alike, when the rows fill them. The integers of one input of a tile are
    /// consecutive, so a decode step's vector lanes are outputs, each summing its own products
    /// (no reduction across lanes), and a prefill's dequantized weight is already in the tiles
    /// `linalg.mmt4d` contracts.
    ///
    /// Measured on an AMD Zen 3 (AVX2; an 8960x1536 4-bit weight in groups of 64 with bf16 scales,
    /// IREE 3.13, 2 threads, alternated): one row 1.11 to 1.25 ms against 1.59 to 1.81 for `[out,
    /// in]` (which sums each group across the lanes of its vectors at every step), 8 rows 3.1 to
    /// 4.5 against 4.4 to 5.3 (the tuning spec's best for `[out, in]`), 64 rows 16.9 to 19.2
    /// against 22.7 to 24.8 (its dequantized `[out, in]` copy contracted by `dot_general`).
    pub fn affine_tiles(&self, out: usize, inputs: usize, group_size: usize) -> Option<Tiles> {
        let tiles = Tiles::f32(self.tile_rows);
        (tiles.fit(out, inputs) && group_size > 0 && inputs.is_multiple_of(group_size)).then_some(tiles)
    }

    /// `x @ w^T (+ bias)` for a torch `Linear` weight `w` of `[out, in]`:
    /// operands are widened to the accumulator, contracted, and the result
    /// rounded once to the activation dtype (after the bias, as torch's
    /// addmm does).
    pub fn linear(&self, f: &mut Func, x: &Value, w: &Value, bias: Option<&Value>) -> Value {
        self.linear_rows(f, x, w, bias, Rows::ByCount)
    }

    /// [`Self::linear`] over rows of the kind `kind` (see [`Rows`]).
    pub fn linear_rows(&self, f: &mut Func, x: &Value, w: &Value, bias: Option<&Value>, kind: Rows) -> Value {
        let xa = f.convert(x, self.accumulate);
        let wa = f.convert(w, self.accumulate);
        let rank = x.ty().rank();
        let last = rank.saturating_sub(1);
        let rows: usize = x.shape()[..last].iter().product();
        let y = if kind == Rows::ByCount && rows <= WEIGHT_LEFT_MAX_ROWS {
            let yt = f.dot_general(&wa, &xa, (&[], &[]), (&[1], &[last]));
            let perm: Vec<usize> = (1..rank).chain(std::iter::once(0)).collect();
            f.transpose(&yt, &perm)
        } else {
            f.dot_general(&xa, &wa, (&[], &[]), (&[last], &[1]))
        };
        self.bias_and_round(f, &y, bias)
    }

    /// `x @ w^T (+ bias)` for a weight served in tiles ([`Tiles`]), `w [out / t, in / k, t, k]`:
    /// `x`'s rows are tiled the same way (in the accumulator for tiles one input deep, in the
    /// activation dtype for deeper ones, whose pair products read bf16), and the two contracted by
    /// `linalg.mmt4d` into the accumulator, the weight widened inside it, then the bias added
    /// and the result rounded once, as [`Self::linear`].
    ///
    /// Under f32 activations ([`Tiles::f32`]) each output is one vector lane summing its products
    /// over the inputs in order, so no reduction is reassociated; IREE 3.13's mmt4d codegen
    /// streams the stored 16-bit weight with one widening per 16 weights and one multiply-add per
    /// row of `x`, where a `dot_general` over `[out, in]` transposes every weight tile
    /// (BENCHMARKS.md, "tiled weights"); bf16 activations summed in order ([`Bf16Dot::InOrder`])
    /// take the same form, `x` widened exactly. Summed in pairs ([`Tiles::BF16`]) both operands
    /// are bf16 and IREE's bf16 mmt4d microkernel contracts them (the bundle enables it), adding
    /// each output's products to its lane two inputs at a time.
    ///
    /// Summed in pairs, more than [`PAIRS_BLOCK_INPUTS`] inputs are contracted a block at a time
    /// and the blocks' sums added in order, as torch does, over a prompt's rows and over more than
    /// [`WEIGHT_LEFT_MAX_ROWS`] by count (encoders); see [`Self::linear_tiled_rows`].
    pub fn linear_tiled(&self, f: &mut Func, x: &Value, w: &Value, bias: Option<&Value>) -> Value {
        self.linear_tiled_rows(f, x, w, bias, Rows::ByCount)
    }

    /// [`Self::linear_tiled`] over rows of the kind `kind` (see [`Rows`]). Decode steps (up to
    /// [`WEIGHT_LEFT_MAX_ROWS`] rows by count) sum pairs in one run over all inputs whatever
    /// their count, so a stream's bits do not depend on how many streams share its step; torch's
    /// own one-row path sums in neither order, and blocks cost a decode step a sixth (8 bf16
    /// streams 60.8 and 57.1 tok/s against 49.4 and 49.0, BENCHMARKS.md).
    pub fn linear_tiled_rows(&self, f: &mut Func, x: &Value, w: &Value, bias: Option<&Value>, kind: Rows) -> Value {
        let [tiles, depth, t, k] = match w.shape() {
            &[tiles, depth, t, k] => [tiles, depth, t, k],
            _ => [0, x.shape().last().copied().unwrap_or(0), 1, 1],
        };
        let inputs = depth * k;
        let rank = x.ty().rank();
        let last = rank.saturating_sub(1);
        let lead = x.shape()[..last].to_vec();
        let rows: usize = lead.iter().product();
        let xa = f.convert(x, if k == 1 { self.accumulate } else { self.activations });
        let mut x2 = f.reshape(&xa, &[rows, inputs]);
        // Rows with no divisor from 8 to 16 (a vision tower's 577 = 24 * 24 + 1) are padded
        // with zero rows to a multiple of 16, whose outputs are dropped: tiles of fewer rows run
        // fewer multiply-adds per weight read.
        let padded = if rows > LHS_TILE_MAX_ROWS && lhs_tile_rows(rows) < 8 {
            rows.next_multiple_of(LHS_TILE_MAX_ROWS)
        } else {
            rows
        };
        if padded > rows {
            let zeros = f.splat(&Type::new(xa.elem(), &[padded - rows, inputs]), 0.0);
            x2 = f.concat(&[x2, zeros], 0);
        }
        let m0 = lhs_tile_rows(padded);
        let xr = f.reshape(&x2, &[padded / m0, m0, depth, k]);
        let lhs = f.transpose(&xr, &[0, 2, 1, 3]);
        let blocks = kind == Rows::Prompt || rows > WEIGHT_LEFT_MAX_ROWS;
        let y4 = if k > 1 && inputs > PAIRS_BLOCK_INPUTS && blocks {
            // Products summed in pairs restart from zero every PAIRS_BLOCK_INPUTS inputs, and
            // the blocks' sums are added in order, as oneDNN's bf16 gemm under torch computes.
            let step = PAIRS_BLOCK_INPUTS / k;
            let block = |f: &mut Func, lo: usize| {
                let hi = (lo + step).min(depth);
                let lb = f.slice(&lhs, &[0, lo, 0, 0], &[padded / m0, hi, m0, k]);
                let wb = f.slice(w, &[0, lo, 0, 0], &[tiles, hi, t, k]);
                f.mmt4d(&lb, &wb, self.accumulate)
            };
            let mut acc = block(f, 0);
            for lo in (step..depth).step_by(step) {
                let yb = block(f, lo);
                acc = f.add(&acc, &yb);
            }
            acc
        } else {
            f.mmt4d(&lhs, w, self.accumulate)
        };
        let y = f.transpose(&y4, &[0, 2, 1, 3]);
        let mut y = f.reshape(&y, &[padded, tiles * t]);
        if padded > rows {
            y = f.slice(&y, &[0, 0], &[rows, tiles * t]);
        }
        let mut shape = lead;
        shape.push(tiles * t);
        let y = f.reshape(&y, &shape);
        self.bias_and_round(f, &y, bias)
    }

    /// Whether [`Self::matmul_nt_rows`] sums its products in bf16 pairs over rows of the kind
    /// `kind`: under bf16 activations summed in pairs ([`Bf16Dot::Pairs`]), over a prompt's
    /// rows. A decode step's attention keeps [`Self::matmul`], as its linears keep one run:
    /// torch's one-row products take yet another path.
    pub fn attends_in_pairs(&self, kind: Rows) -> bool {
        self.follows_torch_avx512() && kind == Rows::Prompt
    }

    /// Whether the contract reproduces torch's AVX-512 kernels where it states their order: bf16
    /// activations summed in pairs ([`Bf16Dot::Pairs`]), whose CPUs (AVX512-BF16) run torch's
    /// 16-lane f32 vectors. The softmax ([`torch_softmax_last`]) and a prompt's attention
    /// products ([`Self::matmul_nt_rows`]) follow them; elsewhere they keep the backend's order.
    /// On a CPU with AMX the softmax is still torch's (its own AVX-512 kernel: 0 of the fixture's
    /// 66,592 probabilities differ there), but torch's batched gemms run on AMX tiles, whose sums
    /// the attention products do not follow ([`PAIRS_BLOCK_INPUTS`]).
    fn follows_torch_avx512(&self) -> bool {
        self.activations == Elem::BF16 && self.bf16_dot == Bf16Dot::Pairs
    }

    /// `a @ b^T` for each of `n` pairs of activations, `a [n, m, k]` and `b [n, p, k]`: `[n, m,
    /// p]`, rounded once, as [`Self::matmul`]. Where [`Self::attends_in_pairs`], each `b[i]` is
    /// put in [`Tiles::BF16`] in the graph (zero rows and inputs padding it to whole tiles add
    /// nothing) and contracted by [`Self::linear_tiled_rows`] over a prompt's rows: products in
    /// pairs, the odd input's first, restarting every [`PAIRS_BLOCK_INPUTS`] inputs, as torch's
    /// bf16 `matmul` (a batched gemm per head) sums attention's scores over the head's width and
    /// its output over the keys (emulated against torch 2.15 on an AMD Zen 4: scores over 128
    /// inputs, 0 of 9,216 outputs differ against 1 summed in order; outputs over 1,600 keys, 0 of
    /// 8,192 against 2 in one run). Otherwise the backend's order, as [`Self::matmul`].
    pub fn matmul_nt_rows(&self, f: &mut Func, a: &Value, b: &Value, kind: Rows) -> Value {
        if !self.attends_in_pairs(kind) {
            return self.matmul(f, a, b, (&[0], &[0]), (&[2], &[2]));
        }
        let (n, m, k) = (a.shape()[0], a.shape()[1], a.shape()[2]);
        let p = b.shape()[1];
        let tile = Tiles::BF16;
        let (pp, kp) = (p.next_multiple_of(tile.rows), k.next_multiple_of(tile.depth));
        let pad = |f: &mut Func, v: &Value, rows: usize, cols: usize| {
            let v = f.convert(v, self.activations);
            let (r, c) = (v.shape()[0], v.shape()[1]);
            let v = if cols > c {
                let zeros = f.splat(&Type::new(self.activations, &[r, cols - c]), 0.0);
                f.concat(&[v, zeros], 1)
            } else {
                v
            };
            if rows > r {
                let zeros = f.splat(&Type::new(self.activations, &[rows - r, cols]), 0.0);
                f.concat(&[v, zeros], 0)
            } else {
                v
            }
        };
        let parts: Vec<Value> = (0..n)
            .map(|i| {
                let ai = f.slice(a, &[i, 0, 0], &[i + 1, m, k]);
                let ai = f.reshape(&ai, &[m, k]);
                let ai = pad(f, &ai, m, kp);
                let bi = f.slice(b, &[i, 0, 0], &[i + 1, p, k]);
                let bi = f.reshape(&bi, &[p, k]);
                let bi = pad(f, &bi, pp, kp);
                let bt = f.reshape(&bi, &[pp / tile.rows, tile.rows, kp / tile.depth, tile.depth]);
                let bt = f.transpose(&bt, &[0, 2, 1, 3]);
                let y = self.linear_tiled_rows(f, &ai, &bt, None, kind);
                let y = if pp > p { f.slice(&y, &[0, 0], &[m, p]) } else { y };
                f.reshape(&y, &[1, m, p])
            })
            .collect();
        if parts.len() == 1 { parts[0].clone() } else { f.concat(&parts, 0) }
    }

    /// The weight of an affine-quantized linear, `[out, groups, group_size]` in the accumulator:
    /// each integer zero-extended and converted exactly, then `q * scale` rounded, then `+ bias`
    /// rounded (two roundings, in this order, as MLX's `dequantize` computes; scales and biases
    /// are widened exactly). Rows gathered from a quantized table (`[t, in]` with their
    /// `[t, groups]` scales and biases) dequantize the same way.
    ///
    /// A weight in row tiles ([`AffineWeight::tile_rows`] `t`) dequantizes the same way into
    /// `[out / t, groups, group_size, t]`.
    pub fn dequantize(&self, f: &mut Func, w: &AffineWeight) -> Value {
        let [out, inputs] = w.shape();
        let g = w.group_size;
        let groups = inputs / g.max(1);
        let unsigned = match w.q.elem() {
            Elem::I4 => Elem::U4,
            Elem::I8 => Elem::U8,
            other => other,
        };
        // The shape of the integers, and where scales and biases broadcast from in it.
        let (shape, per_group): (Vec<usize>, &[usize]) = match w.tile_rows() {
            Some(t) => (vec![out / t, groups, g, t], &[0, 1, 3]),
            None => (vec![out, groups, g], &[0, 1]),
        };
        let q = f.reshape(&w.q, &shape);
        let q = f.bitcast_convert(&q, unsigned);
        let q = f.convert(&q, self.accumulate);
        let group_shape: Vec<usize> = per_group.iter().map(|&d| shape[d]).collect();
        let mut factor = |v: &Value| {
            // Tiles of scales are declared `[out / t, groups, t, 1]`.
            let v = if v.shape() == group_shape.as_slice() { v.clone() } else { f.reshape(v, &group_shape) };
            let v = f.convert(&v, self.accumulate);
            f.broadcast(&v, &shape, per_group)
        };
        let s = factor(&w.scales);
        let b = factor(&w.biases);
        let scaled = f.mul(&q, &s);
        f.add(&scaled, &b)
    }

    /// `x @ w^T (+ bias)` for an affine-quantized `w`: the weight dequantized in the accumulator
    /// ([`Self::dequantize`]), contracted with `x` widened to the accumulator, the bias added, and
    /// the result rounded once to the activation dtype, as [`Self::linear`].
    ///
    /// Up to [`QLINEAR_FUSED_MAX_ROWS`] rows (decode steps) contract as one multiply-and-reduce
    /// over `[rows, out, groups, group_size]`: IREE 3.13 fuses the dequantization into that
    /// reduction (with aggressive dispatch fusion), so what is read from memory is the packed
    /// integers, and the llvm-cpu tuning spec gives each weight vector all the rows at once, so a
    /// weight is dequantized once per step rather than once per row. More rows (prefill,
    /// encoders) contract the dequantized weight with `dot_general`, which IREE keeps as a
    /// separate dispatch writing the weight out in f32 once per call.
    pub fn qlinear(&self, f: &mut Func, x: &Value, w: &AffineWeight, bias: Option<&Value>) -> Value {
        self.qlinear_rows(f, x, w, bias, Rows::ByCount)
    }

    /// [`Self::qlinear`] over rows of the kind `kind` (see [`Rows`]).
    ///
    /// A weight in row tiles ([`Self::affine_tiles`]) contracts a decode step's rows (up to
    /// [`QLINEAR_FUSED_MAX_ROWS`], by count) as one multiply-and-reduce into which IREE fuses the
    /// dequantization: each output sums each group's products over its inputs in order, then the
    /// groups' sums in order (the tuning spec's `match_qlinear_tiled*` give each vector lane one
    /// output). More rows, and a prompt's, contract the dequantized tiles with `linalg.mmt4d` as
    /// [`Self::linear_tiled`] does: each output sums its products over the inputs in order.
    pub fn qlinear_rows(&self, f: &mut Func, x: &Value, w: &AffineWeight, bias: Option<&Value>, kind: Rows) -> Value {
        let [out, inputs] = w.shape();
        let g = w.group_size;
        let groups = inputs / g.max(1);
        let last = x.ty().rank().saturating_sub(1);
        let lead = x.shape()[..last].to_vec();
        let rows: usize = lead.iter().product();
        // A tiled weight's rows per tile, and its number of tiles.
        let tiles = w.tile_rows().map(|t| (t, out / t.max(1)));
        let d = self.dequantize(f, w);
        if kind == Rows::Prompt || rows > QLINEAR_FUSED_MAX_ROWS {
            if let Some((t, n)) = tiles {
                let w4 = f.reshape(&d, &[n, inputs, t, 1]);
                return self.linear_tiled(f, x, &w4, bias);
            }
            let xa = f.convert(x, self.accumulate);
            let w2 = f.reshape(&d, &[out, inputs]);
            let y = f.dot_general(&xa, &w2, (&[], &[]), (&[last], &[1]));
            return self.bias_and_round(f, &y, bias);
        }
        let xa = f.convert(x, self.accumulate);
        let y = match tiles {
            None => {
                let shape = [rows, out, groups, g];
                let xr = f.reshape(&xa, &[rows, groups, g]);
                let xb = f.broadcast(&xr, &shape, &[0, 2, 3]);
                let db = f.broadcast(&d, &shape, &[1, 2, 3]);
                let p = f.mul(&xb, &db);
                f.reduce(&p, &[2, 3], Reduce::Sum)
            }
            // One row keeps no row dimension: IREE 3.13 vectorises a unit one worse.
            Some((t, n)) if rows == 1 => {
                let xr = f.reshape(&xa, &[groups, g]);
                let xb = f.broadcast(&xr, &[n, groups, g, t], &[1, 2]);
                let p = f.mul(&xb, &d);
                let per_group = f.reduce(&p, &[2], Reduce::Sum);
                f.reduce(&per_group, &[1], Reduce::Sum)
            }
            Some((t, n)) => {
                let shape = [rows, n, groups, g, t];
                let xr = f.reshape(&xa, &[rows, groups, g]);
                let xb = f.broadcast(&xr, &shape, &[0, 2, 3]);
                let db = f.broadcast(&d, &shape, &[1, 2, 3, 4]);
                let p = f.mul(&xb, &db);
                let per_group = f.reduce(&p, &[3], Reduce::Sum);
                f.reduce(&per_group, &[2], Reduce::Sum)
            }
        };
        let mut shape = lead;
        shape.push(out);
        let y = f.reshape(&y, &shape);
        self.bias_and_round(f, &y, bias)
    }

    /// `y` (in the accumulator) plus `bias` widened to it, rounded once to the activation dtype:
    /// how `linear` and `qlinear` end, as torch's addmm does.
    fn bias_and_round(&self, f: &mut Func, y: &Value, bias: Option<&Value>) -> Value {
        let y = match bias {
            Some(b) => {
                let ba = f.convert(b, self.accumulate);
                let bb = f.broadcast_to(&ba, y.shape());
                f.add(y, &bb)
            }
            None => y.clone(),
        };
        self.round(f, &y)
    }

    /// Batched matmul in the accumulator, rounded to the activation dtype.
    pub fn matmul(
        &self,
        f: &mut Func,
        a: &Value,
        b: &Value,
        batch: (&[usize], &[usize]),
        contract: (&[usize], &[usize]),
    ) -> Value {
        // Operands of one narrower float type are widened inside the contraction (the same
        // products and sums as widening them first; see `Func::dot_general_to`).
        let y = if a.elem() == b.elem() && a.elem().is_float() && a.elem().bits() < self.accumulate.bits() {
            f.dot_general_to(a, b, batch, contract, self.accumulate)
        } else {
            let aa = f.convert(a, self.accumulate);
            let ba = f.convert(b, self.accumulate);
            f.dot_general(&aa, &ba, batch, contract)
        };
        self.round(f, &y)
    }

    /// RMSNorm over the last dimension, computed in the accumulator:
    /// `x * rsqrt(mean(x^2) + eps)`, then scaled. `OnePlus` is Gemma's
    /// `(1 + w)` form, applied before rounding; `Plain` rounds the
    /// normalised value first and then multiplies by `w` in the activation
    /// dtype (Llama/Qwen order).
    pub fn rms_norm(&self, f: &mut Func, x: &Value, w: &Value, eps: f64, style: RmsStyle) -> Value {
        let shape = x.shape().to_vec();
        let last = shape.len() - 1;
        let xa = f.convert(x, self.accumulate);
        let sq = f.mul(&xa, &xa);
        let mean = self.mean_last(f, &sq);
        let eps = f.splat(mean.ty(), eps);
        let var_eps = f.add(&mean, &eps);
        let r = f.rsqrt(&var_eps);
        let rb = f.broadcast(&r, &shape, &(0..last).collect::<Vec<_>>());
        let normed = f.mul(&xa, &rb);
        match style {
            RmsStyle::Plain => {
                let normed = self.round(f, &normed);
                let wv = f.convert(w, self.activations);
                let wb = f.broadcast_to(&wv, &shape);
                self.act_mul(f, &wb, &normed)
            }
            RmsStyle::OnePlus => {
                let wa = f.convert(w, self.accumulate);
                let one = f.splat(wa.ty(), 1.0);
                let scale = f.add(&one, &wa);
                let sb = f.broadcast_to(&scale, &shape);
                let y = f.mul(&normed, &sb);
                self.round(f, &y)
            }
        }
    }

    /// The mean over the last dimension of `x`, a value in the accumulator, as torch's
    /// `x.mean(-1)` computes it on CPU: the sum divided by the count. Under bf16 activations the
    /// sum is torch's to the bit ([`torch_sum_last`]), so a bf16 rounding after it (an RMSNorm's)
    /// falls where torch's does; under f32 activations its order is the backend's.
    pub fn mean_last(&self, f: &mut Func, x: &Value) -> Value {
        let last = x.shape().len() - 1;
        let sum = match self.activations {
            Elem::BF16 => torch_sum_last(f, x),
            _ => f.reduce(x, &[last], Reduce::Sum),
        };
        let n = f.splat(sum.ty(), x.shape()[last] as f64);
        f.div(&sum, &n)
    }

    /// LayerNorm over the last dimension in the accumulator (biased variance).
    pub fn layer_norm(&self, f: &mut Func, x: &Value, w: &Value, b: &Value, eps: f64) -> Value {
        let shape = x.shape().to_vec();
        let last = shape.len() - 1;
        let lead: Vec<usize> = (0..last).collect();
        let inv_n = 1.0 / shape[last] as f64;
        let xa = f.convert(x, self.accumulate);
        let sum = f.reduce(&xa, &[last], Reduce::Sum);
        let k = f.splat(sum.ty(), inv_n);
        let mean = f.mul(&sum, &k);
        let mb = f.broadcast(&mean, &shape, &lead);
        let centred = f.sub(&xa, &mb);
        let sq = f.mul(&centred, &centred);
        let var_sum = f.reduce(&sq, &[last], Reduce::Sum);
        let var = f.mul(&var_sum, &k);
        let eps = f.splat(var.ty(), eps);
        let var_eps = f.add(&var, &eps);
        let r = f.rsqrt(&var_eps);
        let rb = f.broadcast(&r, &shape, &lead);
        let normed = f.mul(&centred, &rb);
        let wa = f.convert(w, self.accumulate);
        let ba = f.convert(b, self.accumulate);
        let wb = f.broadcast_to(&wa, &shape);
        let bb = f.broadcast_to(&ba, &shape);
        let scaled = f.mul(&normed, &wb);
        let y = f.add(&scaled, &bb);
        self.round(f, &y)
    }

    /// SiLU as torch computes it: `x / (1 + exp(-x))` in the accumulator,
    /// rounded once to the activation dtype.
    pub fn silu(&self, f: &mut Func, x: &Value) -> Value {
        let xa = f.convert(x, self.accumulate);
        let neg = f.neg(&xa);
        let e = f.exp(&neg);
        let one = f.splat(xa.ty(), 1.0);
        let denom = f.add(&one, &e);
        let y = f.div(&xa, &denom);
        self.round(f, &y)
    }

    /// `(cos a, sin a)` of f32 rotary angles `a` (`position * inv_freq`), as torch computes them
    /// in f32: `a` is first reduced by whole turns, `r = a - k * 2pi` with `k` the nearest
    /// integer to `a / 2pi` and `2pi` in three f32 parts whose products with `k` are exact (to
    /// `k` of 2^15, angles of about 205,000), so the cosine and sine see `r` to within a few
    /// units in its last place. IREE 3.13's own reduction of large f32 angles is coarser: at
    /// position 32,768 (Qwen2's rotary, 128 wide) its tables were off by up to 9e-4 (4e-3 at
    /// 131,072) against 2.4e-7 reduced first, and 1,220 of 65,536 entries rounded to bf16
    /// differently from torch's, against 5.
    pub fn cos_sin(&self, f: &mut Func, a: &Value) -> (Value, Value) {
        // 2pi = C1 + C2 + C3: C1 and C2 have 8 and 9 significant bits, C3 is the rest in f32.
        const C1: f64 = 6.28125;
        const C2: f64 = 0.001934051513671875;
        const C3: f64 = 1.2556658930407139e-6;
        let splat = |f: &mut Func, v: f64| f.splat(a.ty(), v);
        let turn = splat(f, 1.0 / std::f64::consts::TAU);
        let turns = f.mul(a, &turn);
        let k = f.round_even(&turns);
        let mut r = a.clone();
        for c in [C1, C2, C3] {
            let c = splat(f, c);
            let part = f.mul(&k, &c);
            r = f.sub(&r, &part);
        }
        (f.cos(&r), f.sin(&r))
    }

    /// Soft-capping, `tanh(x / cap) * cap`, in `x`'s own dtype as torch computes it on the
    /// tensor (Gemma's final logits).
    pub fn softcap(&self, f: &mut Func, x: &Value, cap: f64) -> Value {
        let c = f.splat(x.ty(), cap);
        let scaled = f.div(x, &c);
        let t = f.tanh(&scaled);
        f.mul(&t, &c)
    }

    /// The tanh approximation of GELU (`gelu_pytorch_tanh`), in the accumulator.
    pub fn gelu_tanh(&self, f: &mut Func, x: &Value) -> Value {
        let xa = f.convert(x, self.accumulate);
        let c = |f: &mut Func, v: f64| f.splat(xa.ty(), v);
        let x2 = f.mul(&xa, &xa);
        let x3 = f.mul(&x2, &xa);
        let k = c(f, 0.044715);
        let kx3 = f.mul(&k, &x3);
        let inner = f.add(&xa, &kx3);
        let s = c(f, (2.0f64 / std::f64::consts::PI).sqrt());
        let scaled = f.mul(&s, &inner);
        let t = f.tanh(&scaled);
        let one = c(f, 1.0);
        let half = c(f, 0.5);
        let hx = f.mul(&half, &xa);
        let onet = f.add(&one, &t);
        let y = f.mul(&hx, &onet);
        self.round(f, &y)
    }

    /// Exact GELU (transformers' `gelu`, torch's `F.gelu` with `approximate="none"`):
    /// `x * 0.5 * (1 + erf(x / sqrt 2))` in the accumulator, rounded once.
    ///
    /// erf is Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7), the polynomial
    /// torch's CPU GELU kernels evaluate too (ATen's vectorized `erf`, oneDNN's `gelu_erf`):
    /// `t = 1 / (1 + p|z|)`, `erf|z| = 1 - (r t) exp(-z^2)` with `r` by Horner from the
    /// highest coefficient, the sign of `z` restored. (The Qwen2-VL tower's original order;
    /// torch's own, `1 - (exp(-z^2) t) r`, measured no closer to `F.gelu`: the same max
    /// difference, 87.7% bit-equal against 87.2%.)
    ///
    /// IREE 3.13 also compiles `chlo.erf` from the text this builder emits. Measured on 160001
    /// points of [-8, 8] in f32 (llvm-cpu, against torch 2.15 on CPU): as erf alone, `chlo.erf`
    /// is marginally closer to `torch.erf` (max 3.6e-7, mean 2.9e-8) than this polynomial (max
    /// 4.6e-7, mean 3.4e-8); as GELU, the polynomial is closer to `F.gelu` (max 4.8e-7, mean
    /// 1.6e-8, 87% bit-equal) than `chlo.erf` (max 1.0e-6, mean 9.2e-8, 52% bit-equal), because
    /// torch's GELU computes this same polynomial. GELU is what the models call, so the
    /// polynomial it is.
    pub fn gelu_erf(&self, f: &mut Func, x: &Value) -> Value {
        let xa = f.convert(x, self.accumulate);
        let c = |f: &mut Func, v: f64| f.splat(xa.ty(), v);
        let k = c(f, std::f64::consts::FRAC_1_SQRT_2);
        let z = f.mul(&xa, &k);
        let erf = erf_abramowitz_stegun(f, &z);
        let half = c(f, 0.5);
        let hx = f.mul(&xa, &half);
        let one = c(f, 1.0);
        let onep = f.add(&one, &erf);
        let y = f.mul(&hx, &onep);
        self.round(f, &y)
    }

    /// transformers' `quick_gelu`, `x * sigmoid(1.702 x)`, with the sigmoid as torch's CPU
    /// kernel computes it (`1 / (1 + exp(-y))`) in the accumulator. The three are tensor
    /// operations in torch, each rounded to the activation dtype: `1.702 * x` as a tensor times a
    /// Python number ([`Self::act_scale`]), the sigmoid, the product ([`Self::act_mul`]); under
    /// f32 activations no rounding moves anything.
    pub fn quick_gelu(&self, f: &mut Func, x: &Value) -> Value {
        let kx = self.act_scale(f, x, 1.702);
        let kxa = f.convert(&kx, self.accumulate);
        let neg = f.neg(&kxa);
        let e = f.exp(&neg);
        let one = f.splat(kxa.ty(), 1.0);
        let denom = f.add(&one, &e);
        let s = f.div(&one, &denom);
        let s = self.round(f, &s);
        self.act_mul(f, x, &s)
    }

    /// Softmax over the last dimension in the accumulator (max-subtracted, the maximum as
    /// [`max_last`] writes it), rounded to the activation dtype. Under bf16 activations summed in
    /// pairs it is torch's AVX-512 kernel's to the bit ([`torch_softmax_last`]); elsewhere the
    /// backend's `exp`, sum and division.
    pub fn softmax(&self, f: &mut Func, x: &Value) -> Value {
        let shape = x.shape().to_vec();
        let last = shape.len() - 1;
        let lead: Vec<usize> = (0..last).collect();
        let xa = f.convert(x, self.accumulate);
        if self.follows_torch_avx512() {
            let p = torch_softmax_last(f, &xa);
            return self.round(f, &p);
        }
        let m = max_last(f, &xa);
        let mb = f.broadcast(&m, &shape, &lead);
        let shifted = f.sub(&xa, &mb);
        let e = f.exp(&shifted);
        let s = f.reduce(&e, &[last], Reduce::Sum);
        let sb = f.broadcast(&s, &shape, &lead);
        let p = f.div(&e, &sb);
        self.round(f, &p)
    }

    /// A residual add in the activation dtype.
    pub fn residual(&self, f: &mut Func, x: &Value, delta: &Value) -> Value {
        self.act_add(f, x, delta)
    }

    /// `y` rounded to the activation dtype, to nearest even. Under bf16 activations the
    /// rounding is written out on the f32 bits (add `0x7fff` plus the lowest kept bit, clear the
    /// low 16), and the result converted to bf16 exactly: IREE 3.13 drops a `bf16` conversion
    /// whose value a fused bf16 operation widens again (`extf(truncf(x))` folds under its
    /// `contract` fast-math flag), so an RMSNorm multiplied its weight by the unrounded norm and
    /// 248 of 448 logits of a one-token prompt differed from torch's in bf16; written out, none.
    pub fn round(&self, f: &mut Func, y: &Value) -> Value {
        if self.activations != Elem::BF16 || y.elem() != Elem::F32 {
            return f.convert(y, self.activations);
        }
        let ty = y.ty().with_elem(Elem::I32);
        let splat = |f: &mut Func, v: f64| f.splat(&ty, v);
        let bits = f.bitcast_convert(y, Elem::I32);
        let sixteen = splat(f, 16.0);
        let kept = f.shift_right_logical(&bits, &sixteen);
        let one = splat(f, 1.0);
        let lowest = f.and(&kept, &one);
        let half = splat(f, f64::from(0x7fff));
        let biased = f.add(&bits, &half);
        let biased = f.add(&biased, &lowest);
        let high = splat(f, f64::from(-65536i32));
        let rounded = f.and(&biased, &high);
        let rounded = f.bitcast_convert(&rounded, Elem::F32);
        f.convert(&rounded, self.activations)
    }

    /// `x * s` for a constant `s`, as torch multiplies a tensor by a Python number: in f32 (the
    /// scale rounded to f32, never to the activations) and rounded once to the activations.
    pub fn act_scale(&self, f: &mut Func, x: &Value, s: f64) -> Value {
        if self.activations != Elem::BF16 || x.elem() != Elem::BF16 {
            let k = f.splat(x.ty(), s);
            return f.mul(x, &k);
        }
        let xw = f.convert(x, Elem::F32);
        let k = f.splat(xw.ty(), s);
        let y = f.mul(&xw, &k);
        self.round(f, &y)
    }

    /// `a * b` elementwise in the activation dtype, as torch multiplies two tensors of it:
    /// in f32 and rounded (written out under bf16 activations, see [`Self::round`]).
    pub fn act_mul(&self, f: &mut Func, a: &Value, b: &Value) -> Value {
        self.act_binary(f, a, b, Func::mul)
    }

    /// `a + b` elementwise in the activation dtype (see [`Self::act_mul`]).
    pub fn act_add(&self, f: &mut Func, a: &Value, b: &Value) -> Value {
        self.act_binary(f, a, b, Func::add)
    }

    fn act_binary(&self, f: &mut Func, a: &Value, b: &Value, op: fn(&mut Func, &Value, &Value) -> Value) -> Value {
        if self.activations != Elem::BF16 || a.elem() != Elem::BF16 {
            return op(f, a, b);
        }
        let (aw, bw) = (f.convert(a, Elem::F32), f.convert(b, Elem::F32));
        let y = op(f, &aw, &bw);
        self.round(f, &y)
    }

    /// A type in the activation dtype.
    pub fn act(&self, shape: &[usize]) -> Type {
        Type::new(self.activations, shape)
    }
}

/// The coefficients of Abramowitz and Stegun 7.1.26: `p`, then `a5` down to `a1`.
pub(crate) const ERF_P: f64 = 0.327_591_1;
pub(crate) const ERF_A: [f64; 5] = [1.061_405_429, -1.453_152_027, 1.421_413_741, -0.284_496_736, 0.254_829_592];

/// erf of a float `z` by Abramowitz and Stegun 7.1.26, in `z`'s type (see
/// [`NumericContract::gelu_erf`] for the order and the measurement).
fn erf_abramowitz_stegun(f: &mut Func, z: &Value) -> Value {
    let c = |f: &mut Func, v: f64| f.splat(z.ty(), v);
    let a = f.abs(z);
    let one = c(f, 1.0);
    let p = c(f, ERF_P);
    let pa = f.mul(&p, &a);
    let den = f.add(&pa, &one);
    let t = f.div(&one, &den);
    let mut r = c(f, ERF_A[0]);
    for &coeff in &ERF_A[1..] {
        let rt = f.mul(&r, &t);
        let k = c(f, coeff);
        r = f.add(&rt, &k);
    }
    let rt = f.mul(&r, &t);
    let z2 = f.mul(z, z);
    let nz2 = f.neg(&z2);
    let e = f.exp(&nz2);
    let tail = f.mul(&rt, &e);
    let erf_abs = f.sub(&one, &tail);
    let zero = c(f, 0.0);
    let negative = f.compare(crate::Compare::Lt, z, &zero);
    let flipped = f.neg(&erf_abs);
    f.select(&negative, &flipped, &erf_abs)
}

/// Where RMSNorm's weight is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RmsStyle {
    /// `w * round(normed)` (Llama, Qwen).
    Plain,
    /// `round(normed * (1 + w))` (Gemma).
    OnePlus,
}

/// Partial maxima [`max_last`] keeps per row: one vector of f32 on AVX-512, two on AVX2.
const MAX_LANES: usize = 16;

/// The maximum over the last dimension of the float `x` `[.., n]`: the row (padded with negative
/// infinity to a whole number of [`MAX_LANES`]) read as `n / 16` steps of 16 lanes, each lane's
/// maximum over the steps, then the maximum of the lanes. A maximum is exact in any order (a
/// NaN wins wherever it is, -0 is below +0, and negative infinity changes nothing), so this is
/// the row's maximum bit for bit. Written as one reduction along the row, IREE 3.13 keeps its
/// order and compiles it to a chain of scalar compares, the bulk of an encoder's softmax: on
/// Qwen2-VL-2B's 16x1024x1024 bf16 scores of one vision block on AVX-512, the softmax (one
/// dispatch with the packing of its output) took 50 ms; with the maximum written so, the
/// dispatches IREE forms from the same softmax and packing take 15 ms, with the same bits out.
pub fn max_last(f: &mut Func, x: &Value) -> Value {
    let shape = x.shape().to_vec();
    let (lead, n) = shape.split_at(shape.len() - 1);
    let (n, last) = (n[0], lead.len());
    if n <= MAX_LANES {
        return f.reduce(x, &[last], Reduce::Max);
    }
    let padded = n.next_multiple_of(MAX_LANES);
    let row = if padded > n {
        let fill = f.splat(&Type::new(x.elem(), &[lead, &[padded - n]].concat()), f64::NEG_INFINITY);
        f.concat(&[x.clone(), fill], last)
    } else {
        x.clone()
    };
    let steps = f.reshape(&row, &[lead, &[padded / MAX_LANES, MAX_LANES]].concat());
    let lanes = f.reduce(&steps, &[last], Reduce::Max);
    f.reduce(&lanes, &[last], Reduce::Max)
}

/// Lanes of the vectors torch's CPU sum kernel (`SumKernel.cpp`) accumulates f32 in: 256-bit
/// ones. torch 2.15's x86 build has that kernel for AVX2 and the default capability only, so a
/// CPU with AVX-512 sums in 8 lanes too: measured on an AMD Zen 4 (AVX-512), this order
/// reproduces `x.pow(2).sum(-1)` of bf16-valued rows bit for bit at every width tried, 4 to
/// 20,000, and 16 lanes did not (about half the rows differed).
const TORCH_SUM_LANES: usize = 8;
/// Independent accumulators a step of torch's row sum keeps (its `ilp_factor`).
const TORCH_SUM_ILP: usize = 4;
/// Levels of torch's cascade sum (`multi_row_sum`'s `num_levels`).
const TORCH_SUM_LEVELS: usize = 4;

/// The sum over the last dimension of the f32 `x` `[.., n]` in the order torch's CPU kernel adds
/// (a contiguous inner reduction): the row is read as `n / 8` vectors of [`TORCH_SUM_LANES`]
/// (fewer than 8 inputs: as `n` scalars), those as steps of [`TORCH_SUM_ILP`] summed by
/// [`cascade_sum`], the leftover vectors added to the first accumulator, the accumulators
/// added in order; then the scalar tail from zero, and the lanes one by one. Every addition is
/// written out, in that order: a backend reduction would associate as it likes.
pub(crate) fn torch_sum_last(f: &mut Func, x: &Value) -> Value {
    let shape = x.shape().to_vec();
    let (lead, n) = shape.split_at(shape.len() - 1);
    let (n, m) = (n[0], lead.iter().product::<usize>());
    let rows = f.reshape(x, &[m, n]);
    let vectors = n / TORCH_SUM_LANES;
    let sum = if vectors == 0 {
        // Fewer inputs than a vector: torch's scalar row sum, the same cascade one input wide.
        let units = f.reshape(&rows, &[m, n, 1]);
        row_sum(f, &units)
    } else {
        let main = f.slice(&rows, &[0, 0], &[m, vectors * TORCH_SUM_LANES]);
        let units = f.reshape(&main, &[m, vectors, TORCH_SUM_LANES]);
        let lanes = row_sum(f, &units);
        let mut total = None;
        for k in vectors * TORCH_SUM_LANES..n {
            let tail = f.slice(&rows, &[0, k], &[m, k + 1]);
            total = Some(add_to(f, total, tail));
        }
        for lane in 0..TORCH_SUM_LANES {
            let l = f.slice(&lanes, &[0, lane], &[m, lane + 1]);
            total = Some(add_to(f, total, l));
        }
        total.expect("invariant: a vector has lanes")
    };
    f.reshape(&sum, lead)
}

/// torch's `row_sum` over `units` `[m, count, width]`, giving `[m, width]`: the first
/// `count / 4 * 4` units as steps of [`TORCH_SUM_ILP`] accumulators summed by [`cascade_sum`],
/// the rest added to the first accumulator, then the accumulators added in order. A sum of no
/// unit is zero.
fn row_sum(f: &mut Func, units: &Value) -> Value {
    let (m, count, width) = (units.shape()[0], units.shape()[1], units.shape()[2]);
    let steps = count / TORCH_SUM_ILP;
    let acc = (steps > 0).then(|| {
        let blocks = f.slice(units, &[0, 0, 0], &[m, steps * TORCH_SUM_ILP, width]);
        let blocks = f.reshape(&blocks, &[m, steps, TORCH_SUM_ILP, width]);
        cascade_sum(f, &blocks)
    });
    let acc = acc.flatten();
    let mut partial: Vec<Option<Value>> = (0..TORCH_SUM_ILP)
        .map(|k| {
            acc.as_ref().map(|a| {
                let p = f.slice(a, &[0, k, 0], &[m, k + 1, width]);
                f.reshape(&p, &[m, width])
            })
        })
        .collect();
    for i in steps * TORCH_SUM_ILP..count {
        let u = f.slice(units, &[0, i, 0], &[m, i + 1, width]);
        let u = f.reshape(&u, &[m, width]);
        partial[0] = Some(add_to(f, partial[0].take(), u));
    }
    let mut total = partial[0].take();
    for p in partial.into_iter().skip(1).flatten() {
        total = Some(add_to(f, total, p));
    }
    total.unwrap_or_else(|| f.splat(&Type::new(units.elem(), &[m, width]), 0.0))
}

/// torch's `multi_row_sum` over the steps of `blocks` `[m, steps, ilp, width]`, giving
/// `[m, ilp, width]` (`None` for no step): a cascade of [`TORCH_SUM_LEVELS`] accumulators. The
/// first sums runs of `2^p` steps in order (`p` at least 4) and hands each run's sum up a level;
/// a level that has summed `2^p` of those, in order, hands its sum up in turn, and the last keeps
/// everything handed to it; the steps after the last whole run stay in the first. At the end the
/// levels are added, first to last. Each level's sums are written for all its groups at once
/// (one slice per position in a group), so the additions are torch's, in its order, in few
/// operations.
fn cascade_sum(f: &mut Func, blocks: &Value) -> Option<Value> {
    let (m, steps, ilp, width) = (blocks.shape()[0], blocks.shape()[1], blocks.shape()[2], blocks.shape()[3]);
    let power = (ceil_log2(steps) / TORCH_SUM_LEVELS).max(4);
    let run = 1usize << power;
    let mut acc: [Option<Value>; TORCH_SUM_LEVELS] = Default::default();
    // The first level's leftover steps, after the whole runs.
    let whole = steps / run * run;
    if whole < steps {
        let rest = f.slice(blocks, &[0, whole, 0, 0], &[m, steps, ilp, width]);
        acc[0] = Some(sum_in_order(f, &rest, 1));
    }
    // Sums handed up to the next level, `[m, count, ilp, width]`.
    let mut handed = (whole > 0).then(|| {
        let runs = f.slice(blocks, &[0, 0, 0, 0], &[m, whole, ilp, width]);
        let runs = f.reshape(&runs, &[m, whole / run, run, ilp, width]);
        sum_in_order(f, &runs, 2)
    });
    for (level, slot) in acc.iter_mut().enumerate().skip(1) {
        let Some(sums) = handed.take() else { break };
        let count = sums.shape()[1];
        let groups = if level == TORCH_SUM_LEVELS - 1 { 0 } else { count / run };
        if groups * run < count {
            let rest = f.slice(&sums, &[0, groups * run, 0, 0], &[m, count, ilp, width]);
            *slot = Some(sum_in_order(f, &rest, 1));
        }
        if groups > 0 {
            let full = f.slice(&sums, &[0, 0, 0, 0], &[m, groups * run, ilp, width]);
            let full = f.reshape(&full, &[m, groups, run, ilp, width]);
            handed = Some(sum_in_order(f, &full, 2));
        }
    }
    let mut total = None;
    for level in acc.into_iter().flatten() {
        total = Some(add_to(f, total, level));
    }
    total
}

/// The sum of `x` over its dimension `dim`, which is dropped: each slice along it added to the
/// running sum in order, from zero.
fn sum_in_order(f: &mut Func, x: &Value, dim: usize) -> Value {
    let shape = x.shape().to_vec();
    let mut kept = shape.clone();
    kept.remove(dim);
    let mut total = None;
    for i in 0..shape[dim] {
        let (mut start, mut limit) = (vec![0; shape.len()], shape.clone());
        (start[dim], limit[dim]) = (i, i + 1);
        let s = f.slice(x, &start, &limit);
        let s = f.reshape(&s, &kept);
        total = Some(add_to(f, total, s));
    }
    total.expect("invariant: summed over a dimension of at least one")
}

/// `acc + x`, where no `acc` is zero (`0 + x` is `x`, so none is emitted).
/// Lanes of torch's f32 vectors on a CPU with AVX-512 (`Vectorized<float>::size()`).
const TORCH_AVX512_LANES: usize = 16;

/// `softmax` over the last dimension of the f32 `x`, as torch 2.15's CPU kernel on AVX-512
/// (`_vec_softmax_lastdim<float>`) computes it, to the bit: the row's maximum, each input less it
/// through Sleef's `expf` ([`sleef_expf_u10`]), the exponentials summed in 16 lanes
/// ([`torch_vec_sum_last`]), and each multiplied by `1 / sum` rounded (not divided by the sum).
/// Emulated in numpy against torch on an AMD Zen 4: 0 of 6.5 million outputs differ over rows of
/// 5 to 1600 inputs (masked with -inf or a dtype's minimum too), where the backend's `exp` and
/// order made transformers' bf16 logits part from row 23 of a real-width prompt.
pub(crate) fn torch_softmax_last(f: &mut Func, x: &Value) -> Value {
    let shape = x.shape().to_vec();
    let lead: Vec<usize> = (0..shape.len() - 1).collect();
    let m = max_last(f, x);
    let mb = f.broadcast(&m, &shape, &lead);
    let shifted = f.sub(x, &mb);
    let e = sleef_expf_u10(f, &shifted);
    let sum = torch_vec_sum_last(f, &e);
    let one = f.splat(sum.ty(), 1.0);
    let r = f.div(&one, &sum);
    let rb = f.broadcast(&r, &shape, &lead);
    f.mul(&e, &rb)
}

/// The f32 bits of each Sleef constant of `expf` (`xexpf`, its single-precision AVX-512 build).
const SLEEF_R_LN2F: u32 = 0x3FB8_AA3B;
const SLEEF_L2UF: u32 = 0x3F31_7200;
const SLEEF_L2LF: u32 = 0x35BF_BE8E;
const SLEEF_EXPF_POLY: [u32; 6] = [0x3950_2BDA, 0x3AB6_96C9, 0x3C08_88A6, 0x3D2A_AA7A, 0x3E2A_AAAB, 0x3F00_0000];

/// `exp(d)` of f32 `d` as Sleef's `Sleef_expf16_u10` (what torch's `Vectorized<float>::exp`
/// calls on AVX-512) computes it: `q = round(d * log2(e))`, `s = d - q * ln2` in two fused steps
/// (ln2 split in an upper and a lower part), a degree-5 polynomial in `s` by fused multiply-adds,
/// `1 + (s^2 * p + s)`, then scaled by `2^q` as two powers of two (so no intermediate overflows);
/// 0 below -104, infinity above 100. Every `fma` rounds once, as the instruction does.
fn sleef_expf_u10(f: &mut Func, d: &Value) -> Value {
    let ty = d.ty().clone();
    let ity = ty.with_elem(Elem::I32);
    let c = |f: &mut Func, bits: u32| f.splat(&ty, f64::from(f32::from_bits(bits)));
    let ci = |f: &mut Func, v: i64| f.splat(&ity, v as f64);
    let ln2e = c(f, SLEEF_R_LN2F);
    let t = f.mul(d, &ln2e);
    // Bounded so the integer conversion is defined; outside (-104, 100) the result is replaced.
    let (lo, hi) = (f.splat(&ty, -200.0), f.splat(&ty, 200.0));
    let t = f.max(&t, &lo);
    let t = f.min(&t, &hi);
    let qf = f.round_even(&t);
    let q = f.convert(&qf, Elem::I32);
    let l2u = c(f, SLEEF_L2UF | 0x8000_0000);
    let l2l = c(f, SLEEF_L2LF | 0x8000_0000);
    let s = f.fma(&qf, &l2u, d);
    let s = f.fma(&qf, &l2l, &s);
    let mut u = c(f, SLEEF_EXPF_POLY[0]);
    for bits in &SLEEF_EXPF_POLY[1..] {
        let k = c(f, *bits);
        u = f.fma(&u, &s, &k);
    }
    let s2 = f.mul(&s, &s);
    let u = f.fma(&s2, &u, &s);
    let one = f.splat(&ty, 1.0);
    let u = f.add(&one, &u);
    // 2^q as 2^(q >> 1) * 2^(q - (q >> 1)), each from its exponent bits.
    let one_i = ci(f, 1);
    let h = f.shift_right_arithmetic(&q, &one_i);
    let rest = f.sub(&q, &h);
    let pow2 = |f: &mut Func, k: &Value| {
        let bias = ci(f, 127);
        let e = f.add(k, &bias);
        let place = ci(f, 1 << 23);
        let bits = f.mul(&e, &place);
        f.bitcast_convert(&bits, Elem::F32)
    };
    let ph = pow2(f, &h);
    let pr = pow2(f, &rest);
    let u = f.mul(&u, &ph);
    let u = f.mul(&u, &pr);
    let (under, over) = (f.splat(&ty, -104.0), f.splat(&ty, 100.0));
    let zero = f.splat(&ty, 0.0);
    let inf = f.splat(&ty, f64::INFINITY);
    let small = f.compare(Compare::Lt, d, &under);
    let u = f.select(&small, &zero, &u);
    let large = f.compare(Compare::Gt, d, &over);
    f.select(&large, &inf, &u)
}

/// The sum over the last dimension of the f32 `x` `[.., n]` as torch's `vec::reduce_all` adds it
/// on AVX-512: the row in vectors of 16 lanes, each lane summing its inputs in order (the last,
/// partial vector into the first lanes), then the lanes halved: lane `i` plus lane `i + 8`, then
/// `+ 4`, `+ 2`, `+ 1`. Rows of fewer than 16 inputs are summed one input at a time, in order.
/// Each lane's sum is a `linalg.mmt4d` of the row's vectors against ones (one f32 lane per
/// output, its inputs in order, as [`NumericContract::linear_tiled`]'s f32 tiles).
fn torch_vec_sum_last(f: &mut Func, x: &Value) -> Value {
    let shape = x.shape().to_vec();
    let (lead, n) = shape.split_at(shape.len() - 1);
    let (n, rows) = (n[0], lead.iter().product::<usize>());
    let flat = f.reshape(x, &[rows, n]);
    if n < TORCH_AVX512_LANES {
        let total = sum_in_order(f, &flat, 1);
        return f.reshape(&total, lead);
    }
    let lanes = TORCH_AVX512_LANES;
    let padded = n.next_multiple_of(lanes);
    let row = if padded > n {
        let zeros = f.splat(&Type::new(x.elem(), &[rows, padded - n]), 0.0);
        f.concat(&[flat, zeros], 1)
    } else {
        flat
    };
    let vectors = padded / lanes;
    let rhs = f.reshape(&row, &[rows, vectors, lanes, 1]);
    let ones = f.splat(&Type::new(x.elem(), &[1, vectors, 1, 1]), 1.0);
    let acc = f.mmt4d(&ones, &rhs, x.elem());
    let mut acc = f.reshape(&acc, &[rows, lanes]);
    let mut width = lanes;
    while width > 1 {
        width /= 2;
        let low = f.slice(&acc, &[0, 0], &[rows, width]);
        let high = f.slice(&acc, &[0, width], &[rows, 2 * width]);
        acc = f.add(&low, &high);
    }
    f.reshape(&acc, lead)
}

fn add_to(f: &mut Func, acc: Option<Value>, x: Value) -> Value {
    match acc {
        Some(a) => f.add(&a, &x),
        None => x,
    }
}

/// `CeilLog2` as torch's cascade uses it: 1 for counts up to 2.
fn ceil_log2(x: usize) -> usize {
    if x <= 2 { 1 } else { (usize::BITS - (x - 1).leading_zeros()) as usize }
}
