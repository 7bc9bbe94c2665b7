//! The data that crosses the plugin boundary: plain `#[repr(C)]` values built from abi_stable's
//! FFI-safe containers, so every answer can be inspected, hashed and compared with a golden.
//!
//! **Architecture Invariant:** these types are frozen within a major version. A minor version
//! adds new types and new root-module entries; it never adds a field to an existing type
//! (abi_stable's load-time layout check would refuse the older plugin, which is the point).

use abi_stable::StableAbi;
use abi_stable::std_types::{ROption, RString, RVec};

// === Errors ===

/// Why a plugin refused a request.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The input is malformed or outside what the family accepts (corrupt image, wrong config).
    InvalidArgument,
    /// The family does not implement what was asked (a modality, pan-and-scan, a bucket).
    Unsupported,
    /// The input is well formed but exceeds a limit (too many pixels, too long audio).
    ResourceExhausted,
    /// A bug in the plugin that it detected itself.
    Internal,
    /// The plugin panicked; the panic was caught at the boundary.
    Panicked,
}

impl ErrorCode {
    /// A lowercase name for messages.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid argument",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::ResourceExhausted => "resource exhausted",
            ErrorCode::Internal => "internal",
            ErrorCode::Panicked => "panicked",
        }
    }
}

/// An error value returned by a plugin entry. Owned by whoever receives it.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct PluginError {
    /// The kind of failure.
    pub code: ErrorCode,
    /// A lowercase message without trailing period.
    pub message: RString,
}

impl PluginError {
    /// Builds an error from a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: RString::from(message.into()) }
    }

    /// [`ErrorCode::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    /// [`ErrorCode::Unsupported`].
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unsupported, message)
    }

    /// [`ErrorCode::ResourceExhausted`].
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ResourceExhausted, message)
    }
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for PluginError {}

// === Identity ===

/// An input modality.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Modality {
    /// Still images.
    Image,
    /// Audio clips.
    Audio,
    /// Video clips.
    Video,
}

impl Modality {
    /// Every modality, in declaration order.
    pub const ALL: [Modality; 3] = [Modality::Image, Modality::Audio, Modality::Video];

    /// The lowercase name used in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Modality::Image => "image",
            Modality::Audio => "audio",
            Modality::Video => "video",
        }
    }
}

/// A feature the host may serve with this plugin; each has a qualification status in the
/// manifest.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// One image in a request.
    Image,
    /// Several images in one request.
    MultiImage,
    /// Audio input.
    Audio,
    /// Video input.
    Video,
}

impl Capability {
    /// Every capability, in declaration order.
    pub const ALL: [Capability; 4] = [Capability::Image, Capability::MultiImage, Capability::Audio, Capability::Video];

    /// The snake_case name used in manifests and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Image => "image",
            Capability::MultiImage => "multi_image",
            Capability::Audio => "audio",
            Capability::Video => "video",
        }
    }

    /// Parses the manifest name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

/// Who the plugin is and what it claims; compared field by field with its manifest.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PluginIdentity {
    /// The family name, e.g. `qwen2-vl` (the HF `model_type` with `_` as `-`).
    pub name: RString,
    /// The plugin's own semver, usually its crate version.
    pub version: RString,
    /// Accepted HF `architectures` entries, e.g. `Qwen2VLForConditionalGeneration`.
    pub architectures: RVec<RString>,
    /// Accepted HF `model_type` values, e.g. `qwen2_vl`.
    pub model_types: RVec<RString>,
    /// Input modalities the family understands.
    pub modalities: RVec<Modality>,
    /// Capabilities the library implements (the manifest says how well).
    pub capabilities: RVec<Capability>,
    /// Reference implementations at pinned revisions, for humans.
    pub references: RVec<RString>,
}

impl PluginIdentity {
    /// An identity from plain strings, in the fields' order.
    pub fn new(
        name: &str,
        version: &str,
        architectures: &[&str],
        model_types: &[&str],
        modalities: &[Modality],
        capabilities: &[Capability],
        references: &[&str],
    ) -> Self {
        let strings = |s: &[&str]| s.iter().map(|&x| RString::from(x)).collect();
        PluginIdentity {
            name: name.into(),
            version: version.into(),
            architectures: strings(architectures),
            model_types: strings(model_types),
            modalities: modalities.iter().copied().collect(),
            capabilities: capabilities.iter().copied().collect(),
            references: strings(references),
        }
    }
}

// === Config ===

/// The [`SpecialToken`] role by which a family says its processor starts every prompt with the
/// tokenizer's `bos_token` (its `eos_token` when it has none) when the rendered prompt does not
/// already start with it (Molmo2's processor); the host then does so for text-only prompts
/// and prompts with media alike. The id is the one `config.json` gives that token, which the
/// host holds to the tokenizer's, or [`PROMPT_START_UNKNOWN`] when the config gives none.
pub const PROMPT_START: &str = "prompt_start";

/// The id of a [`PROMPT_START`] token the config does not name.
pub const PROMPT_START_UNKNOWN: u32 = u32::MAX;

/// A special token the host needs to know by id (image pad, boi/eoi, audio markers).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct SpecialToken {
    /// The family's name for the role, e.g. `image_pad`.
    pub role: RString,
    /// The token id in the checkpoint's vocabulary.
    pub id: u32,
}

/// What the host needs from a parsed checkpoint config, independent of the family.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct ConfigSummary {
    /// The HF `model_type` the config declared.
    pub model_type: RString,
    /// The first HF `architectures` entry, or empty if the config has none.
    pub architecture: RString,
    /// The modalities this checkpoint actually has (a text-only Gemma3 has none).
    pub modalities: RVec<Modality>,
    /// Hidden size of the text decoder, which encoder features must match after projection.
    pub text_hidden_size: u32,
    /// Token ids of the family's special tokens.
    pub special_tokens: RVec<SpecialToken>,
}

impl ConfigSummary {
    /// A summary from plain values; `special_tokens` as `(role, id)`.
    pub fn new(
        model_type: &str,
        architecture: &str,
        modalities: &[Modality],
        text_hidden_size: u32,
        special_tokens: &[(&str, u32)],
    ) -> Self {
        ConfigSummary {
            model_type: model_type.into(),
            architecture: architecture.into(),
            modalities: modalities.iter().copied().collect(),
            text_hidden_size,
            special_tokens: special_tokens.iter().map(|&(role, id)| SpecialToken { role: role.into(), id }).collect(),
        }
    }
}

/// The family's typed view of a checkpoint config, as data.
///
/// `family` holds the family's own config type serialized as JSON; the host passes the whole
/// value back to every later entry, and can show or hash it. Produced by `parse_config`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family-independent facts.
    pub summary: ConfigSummary,
    /// The family's typed config, serialized as JSON by the plugin.
    pub family: RString,
}

// === Media and tensors ===

/// One image or audio item as the host received it. Borrowed by the plugin for one call.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub enum MediaItem {
    /// An encoded image file (PNG, JPEG, ...); the plugin decodes it.
    EncodedImage(RVec<u8>),
    /// Decoded 8-bit RGB pixels, row-major, `width * height * 3` bytes.
    Rgb8 {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// Interleaved RGB bytes.
        pixels: RVec<u8>,
    },
    /// An encoded audio file (WAV, ...); the plugin decodes it.
    EncodedAudio(RVec<u8>),
    /// Decoded PCM samples in `[-1, 1]`, interleaved by channel.
    PcmF32 {
        /// Samples per second.
        sample_rate: u32,
        /// Channel count.
        channels: u32,
        /// Interleaved samples.
        samples: RVec<f32>,
    },
}

impl MediaItem {
    /// The modality of this item.
    pub fn modality(&self) -> Modality {
        match self {
            MediaItem::EncodedImage(_) | MediaItem::Rgb8 { .. } => Modality::Image,
            MediaItem::EncodedAudio(_) | MediaItem::PcmF32 { .. } => Modality::Audio,
        }
    }
}

/// Per-request options for preprocessing; unset values come from the processor config.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Default)]
pub struct PreprocessOptions {
    /// Upper bound on pixels per image (the host passes the manifest's limit or a stricter one).
    pub max_pixels: ROption<u64>,
    /// Lower bound on pixels per image.
    pub min_pixels: ROption<u64>,
    /// Upper bound on audio length, in milliseconds.
    pub max_audio_ms: ROption<u64>,
}

/// Element type of a tensor.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned byte.
    U8,
    /// One byte, 0 or 1.
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// The lowercase name, as in StableHLO element types where they coincide.
    pub fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
}

/// A named tensor's type and static shape, without data.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    /// The name (a graph input/output name, or a checkpoint tensor name).
    pub name: RString,
    /// Element type.
    pub dtype: DType,
    /// Static shape, outermost first.
    pub shape: RVec<u64>,
}

impl TensorSpec {
    /// Builds a spec.
    pub fn new(name: impl Into<String>, dtype: DType, shape: &[u64]) -> Self {
        Self { name: RString::from(name.into()), dtype, shape: shape.iter().copied().collect() }
    }

    /// Number of elements, or `None` on overflow.
    pub fn element_count(&self) -> Option<u64> {
        self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }
}

/// A tensor with data: little-endian, row-major, densely packed.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Name, dtype and shape.
    pub spec: TensorSpec,
    /// `element_count * dtype.size()` bytes.
    pub data: RVec<u8>,
}

impl Tensor {
    /// Builds an `f32` tensor; fails if `values` does not fill `shape` exactly.
    pub fn from_f32(name: impl Into<String>, shape: &[u64], values: &[f32]) -> Result<Self, PluginError> {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(TensorSpec::new(name, DType::F32, shape), data)
    }

    /// Builds an `i64` tensor; fails if `values` does not fill `shape` exactly.
    pub fn from_i64(name: impl Into<String>, shape: &[u64], values: &[i64]) -> Result<Self, PluginError> {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::from_bytes(TensorSpec::new(name, DType::I64, shape), data)
    }

    /// Builds a tensor from raw little-endian bytes, checking the byte length.
    pub fn from_bytes(spec: TensorSpec, data: Vec<u8>) -> Result<Self, PluginError> {
        let tensor = Self { spec, data: data.into() };
        tensor.validate()?;
        Ok(tensor)
    }

    /// Checks that the byte length matches dtype and shape.
    pub fn validate(&self) -> Result<(), PluginError> {
        let expected = self
            .spec
            .element_count()
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|n| n.checked_mul(self.spec.dtype.size()));
        match expected {
            Some(len) if len == self.data.len() => Ok(()),
            Some(len) => Err(PluginError::new(
                ErrorCode::Internal,
                format!(
                    "tensor `{}` has {} bytes but {} {:?} needs {len}",
                    self.spec.name,
                    self.data.len(),
                    self.spec.dtype.as_str(),
                    self.spec.shape.as_slice()
                ),
            )),
            None => Err(PluginError::new(
                ErrorCode::Internal,
                format!("tensor `{}` shape {:?} overflows", self.spec.name, self.spec.shape.as_slice()),
            )),
        }
    }

    /// The values of an `f32` tensor, or `None` for another dtype.
    pub fn to_f32(&self) -> Option<Vec<f32>> {
        (self.spec.dtype == DType::F32)
            .then(|| self.data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

/// Family metadata describing one preprocessed item, e.g. Qwen2-VL's `(t, h, w)` patch grid.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct MediaGrid {
    /// The grid, in the family's own order (documented by the family).
    pub dims: RVec<u32>,
    /// How many feature rows (and placeholder tokens) this item becomes after the encoder.
    pub feature_tokens: u32,
}

/// The output of `preprocess` for one item.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct Preprocessed {
    /// The encoder's inputs for this item, named as in the encoder graph's signature.
    pub tensors: RVec<Tensor>,
    /// The item's grid metadata.
    pub grid: MediaGrid,
}

/// One item of a request as later stages see it: its modality and preprocessed grid.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct ItemMeta {
    /// The item's modality.
    pub modality: Modality,
    /// The grid `preprocess` returned for it.
    pub grid: MediaGrid,
}

// === Prompt layout ===

/// Input of `prompt_layout`: the prompt as rendered by the chat template, and its items in order.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct LayoutRequest {
    /// The rendered prompt text, with the family's placeholder once per item (or none: a bare
    /// prompt, for families that insert their own blocks).
    pub prompt: RString,
    /// The request's media items in prompt order.
    pub items: RVec<ItemMeta>,
}

/// How one item was expanded.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct ItemLayout {
    /// The logical token id whose positions receive this item's features (`<|image_pad|>`).
    pub feature_token_id: u32,
    /// How many of those tokens the expansion contains; equals the item's `feature_tokens`.
    pub feature_tokens: u32,
    /// The text block that replaced the item's placeholder, special tokens spelled out.
    pub expansion: RString,
}

/// Output of `prompt_layout`: the expanded prompt text the host tokenizes, plus per-item facts
/// the host checks after tokenization (the count of each `feature_token_id` must match).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PromptLayout {
    /// The expanded prompt, to be tokenized as a whole (as the HF processors do).
    pub text: RString,
    /// One entry per request item, in order.
    pub items: RVec<ItemLayout>,
}

// === Encoder graph ===

/// One static shape the encoder graph can be compiled for.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShapeBucket {
    /// A stable id, part of the compile-cache key, e.g. `patches-1024`.
    pub id: RString,
    /// The graph inputs at this bucket. Preprocessed tensors of the same names fit if every
    /// dimension is at most the bucket's; the host zero-pads them.
    pub inputs: RVec<TensorSpec>,
}

/// Input of `encoder_graph`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct EncoderGraphRequest {
    /// Which encoder (image or audio tower).
    pub modality: Modality,
    /// The id of one of the buckets `encoder_buckets` returned.
    pub bucket: RString,
}

/// The CPU an encoder graph is compiled for, as far as the graph's layout depends on it (an
/// input of `encoder_graph_for`, since 1.3): a family lays its weights out for the target's
/// vectors, which changes no result. Older plugins are asked through `encoder_graph`, as for
/// [`EncoderTarget::unknown`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EncoderTarget {
    /// The width in bits of the widest vectors every core has (512 with AVX-512F, 256 with
    /// AVX2); none when it is not known, as for a CPU named by `--target-cpu`.
    pub vector_bits: ROption<u32>,
}

impl EncoderTarget {
    /// A target whose widest vectors are `vector_bits` wide (`None`: not known).
    pub fn new(vector_bits: Option<u32>) -> Self {
        Self { vector_bits: vector_bits.into() }
    }

    /// A target of which nothing is known: what a plugin built before 1.3 is emitted for.
    pub fn unknown() -> Self {
        Self::new(None)
    }

    /// The width of the widest vectors, when known.
    pub fn vector_bits(&self) -> Option<u32> {
        self.vector_bits.into_option()
    }
}

/// What an encoder graph computes in (an input of `encoder_graph_compute`, since 1.4): the
/// results depend on it, so a family that does not offer a compute refuses it. Older plugins
/// are asked for [`EncoderCompute::F32`].
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EncoderCompute {
    /// f32 activations over the checkpoint's weights (16-bit ones widened exactly).
    #[default]
    F32,
    /// bf16 activations, as torch computes a bf16 model on the CPU, each bf16 x bf16 product
    /// summed in f32 in order over its inputs.
    Bf16InOrder,
    /// bf16 activations, each bf16 x bf16 product summed in f32 two inputs at a time, the odd
    /// input's product first (AVX512-BF16's `vdpbf16ps`).
    Bf16Pairs,
}

impl EncoderCompute {
    /// The compute of encoders beside a decoder computing under `decoder` (the same
    /// activations and sums).
    pub fn beside(decoder: &mlxcel_emit::NumericContract) -> Self {
        match (decoder.activations, decoder.bf16_dot) {
            (mlxcel_emit::Elem::BF16, mlxcel_emit::Bf16Dot::Pairs) => EncoderCompute::Bf16Pairs,
            (mlxcel_emit::Elem::BF16, mlxcel_emit::Bf16Dot::InOrder) => EncoderCompute::Bf16InOrder,
            _ => EncoderCompute::F32,
        }
    }

    /// The numeric contract an encoder graph computes under in this compute, before its
    /// layout for a target (`NumericContract::for_vectors`) and its many-rows tiles
    /// (`NumericContract::for_many_rows`).
    pub fn contract(self) -> mlxcel_emit::NumericContract {
        match self {
            EncoderCompute::F32 => mlxcel_emit::NumericContract::f32(),
            EncoderCompute::Bf16InOrder => mlxcel_emit::NumericContract::bf16(mlxcel_emit::Bf16Dot::InOrder),
            EncoderCompute::Bf16Pairs => mlxcel_emit::NumericContract::bf16(mlxcel_emit::Bf16Dot::Pairs),
        }
    }

    /// Its name in messages and fingerprints.
    pub fn name(self) -> &'static str {
        match self {
            EncoderCompute::F32 => "f32",
            EncoderCompute::Bf16InOrder => "bf16 (in-order sums)",
            EncoderCompute::Bf16Pairs => "bf16 (paired sums)",
        }
    }
}

/// A family's encoder as StableHLO, with named checkpoint parameters.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct EncoderGraph {
    /// The bucket this graph was emitted for.
    pub bucket: RString,
    /// StableHLO module text.
    pub stablehlo: RString,
    /// The public function to call, e.g. `main`.
    pub entry_function: RString,
    /// The parameter scope used in `#flow.parameter.named<"scope"::"name">`, normally `model`.
    pub parameter_scope: RString,
    /// Checkpoint tensors the graph reads as parameters, with the dtype and shape it expects.
    pub parameters: RVec<TensorSpec>,
    /// Function inputs, in order.
    pub inputs: RVec<TensorSpec>,
    /// Function outputs, in order; `Placement::encoder_output` and injections name these.
    pub outputs: RVec<TensorSpec>,
}

// === Prepared-prefill contract ===

/// Input of `prefill_contract`: the tokenized expanded prompt and the items.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContractRequest {
    /// Token ids of the expanded prompt.
    pub token_ids: RVec<u32>,
    /// The request's items, in order.
    pub items: RVec<ItemMeta>,
}

/// Where one item's encoder rows go in the sequence.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct Placement {
    /// Index of the item in the request.
    pub item: u32,
    /// Which encoder output supplies the rows.
    pub encoder_output: RString,
    /// First sequence position that receives a row.
    pub token_start: u32,
    /// Number of consecutive rows placed.
    pub rows: u32,
}

/// Position ids for the prefill and where decode continues.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub enum Positions {
    /// One position per token.
    OneD {
        /// `len` ids.
        ids: RVec<i64>,
        /// The position of the first decoded token.
        next_position: i64,
    },
    /// Multimodal rotary positions (Qwen2-VL's M-RoPE): three rows `(t, h, w)`.
    MRope {
        /// `3 * len` ids, row-major `[3][len]`.
        ids: RVec<i64>,
        /// How the rotary half-dimension splits between t, h and w (`mrope_section`).
        sections: RVec<u32>,
        /// Whether the three rows' frequencies interleave (t, h, w, t, h, w, ...) as in
        /// Qwen3-VL, instead of occupying contiguous sections as in Qwen2-VL.
        interleaved: bool,
        /// The position of the first decoded token (all three rows equal from then on);
        /// `next_position - len` is the `rope_delta` carried into decode.
        next_position: i64,
    },
}

impl Positions {
    /// Sequence length these positions describe.
    pub fn len(&self) -> usize {
        match self {
            Positions::OneD { ids, .. } => ids.len(),
            Positions::MRope { ids, .. } => ids.len() / 3,
        }
    }

    /// Whether the sequence is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sequential 1-D positions `0..len`.
    pub fn sequential(len: u32) -> Self {
        Positions::OneD { ids: (0..i64::from(len)).collect(), next_position: i64::from(len) }
    }
}

/// A rectangle of the attention matrix (query rows x key columns).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MaskBlock {
    /// First query position.
    pub row_start: u32,
    /// Number of query positions.
    pub rows: u32,
    /// First key position.
    pub col_start: u32,
    /// Number of key positions.
    pub cols: u32,
    /// `true` adds 0 (attend), `false` adds negative infinity (do not attend).
    pub allow: bool,
}

/// The base pattern of the additive attention mask.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MaskBase {
    /// Each position attends to itself and earlier positions.
    Causal,
}

/// The additive attention mask for the prefill: a base pattern, then blocks applied in order.
/// Applies to every decoder layer; sliding-window layers intersect it with their window.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct AttentionMask {
    /// The base pattern.
    pub base: MaskBase,
    /// Overrides applied on top of the base, later blocks winning.
    pub blocks: RVec<MaskBlock>,
}

impl AttentionMask {
    /// A plain causal mask.
    pub fn causal() -> Self {
        Self { base: MaskBase::Causal, blocks: RVec::new() }
    }

    /// Adds a bidirectional block over `[start, start + len)` (Gemma3's image blocks).
    pub fn with_bidirectional(mut self, start: u32, len: u32) -> Self {
        self.blocks.push(MaskBlock { row_start: start, rows: len, col_start: start, cols: len, allow: true });
        self
    }

    /// The dense additive mask for `len` positions, row-major `[len][len]`: 0 where a query
    /// attends, negative infinity where it does not. Blocks are clipped to the sequence.
    pub fn materialize(&self, len: usize) -> Vec<f32> {
        let mut mask = vec![f32::NEG_INFINITY; len * len];
        match self.base {
            MaskBase::Causal => {
                for row in 0..len {
                    mask[row * len..=row * len + row].fill(0.0);
                }
            }
        }
        for block in self.blocks.iter() {
            let clip = |start: u32, count: u32| {
                let start = (start as usize).min(len);
                (start, start.saturating_add(count as usize).min(len))
            };
            let (row_start, row_end) = clip(block.row_start, block.rows);
            let (col_start, col_end) = clip(block.col_start, block.cols);
            let value = if block.allow { 0.0 } else { f32::NEG_INFINITY };
            for row in row_start..row_end {
                mask[row * len + col_start..row * len + col_end].fill(value);
            }
        }
        mask
    }
}

/// How an injection combines with the hidden state.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InjectionMode {
    /// `hidden[pos] += rows[i]` at every placed position.
    Add,
}

/// Extra encoder rows fed into a decoder layer's output at the placed positions (Qwen3-VL's
/// DeepStack).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct LayerInjection {
    /// The decoder layer whose output receives the rows.
    pub decoder_layer: u32,
    /// The encoder output that supplies them, placed like the main features.
    pub encoder_output: RString,
    /// How they combine.
    pub mode: InjectionMode,
}

/// The prepared-prefill contract: how encoder features merge into the text embeddings.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PrefillContract {
    /// Factor applied once to text-token embeddings before features are placed (Gemma3's
    /// `sqrt(hidden)`, rounded to the embedding dtype by the host). Placed rows are never
    /// scaled. `1.0` means no scaling.
    pub text_scale: f32,
    /// Where each item's rows go.
    pub placements: RVec<Placement>,
    /// Position ids.
    pub positions: Positions,
    /// The additive attention mask.
    pub mask: AttentionMask,
    /// Per-layer injections, empty for most families.
    pub injections: RVec<LayerInjection>,
}

// === The contract as a program (1.2) ===

/// Which tokens a placement covers.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub enum TokenSet {
    /// `len` consecutive tokens from `start`.
    Span {
        /// The first token.
        start: u32,
        /// How many.
        len: u32,
    },
    /// These tokens, in row order (need not be consecutive).
    List {
        /// Token indices, one per row.
        indices: RVec<u32>,
    },
}

impl TokenSet {
    /// The token indices, in row order.
    pub fn indices(&self) -> Vec<usize> {
        match self {
            TokenSet::Span { start, len } => (*start as usize..(*start + *len) as usize).collect(),
            TokenSet::List { indices } => indices.iter().map(|&i| i as usize).collect(),
        }
    }
}

/// How a placement's rows combine with the text embeddings at its tokens.
#[repr(u8)]
#[derive(StableAbi, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlaceMode {
    /// The rows replace the token embeddings.
    Replace,
    /// The rows are added to the (scaled) token embeddings.
    Add,
}

/// Where one item's encoder rows go (1.2): replaced or added, at any tokens.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProgramPlacement {
    /// Index of the item in the request.
    pub item: u32,
    /// Which encoder output supplies the rows (its first `tokens` rows, in order).
    pub encoder_output: RString,
    /// How they combine.
    pub mode: PlaceMode,
    /// The tokens receiving a row each.
    pub tokens: TokenSet,
}

impl ProgramPlacement {
    /// `rows` rows of `encoder_output` replacing the tokens from `start`: the common case.
    pub fn replace_span(item: u32, encoder_output: &str, start: u32, rows: u32) -> Self {
        ProgramPlacement {
            item,
            encoder_output: encoder_output.into(),
            mode: PlaceMode::Replace,
            tokens: TokenSet::Span { start, len: rows },
        }
    }

    /// `(start, len)` when the placement covers a span of tokens.
    pub fn span(&self) -> Option<(u32, u32)> {
        match self.tokens {
            TokenSet::Span { start, len } => Some((start, len)),
            TokenSet::List { .. } => None,
        }
    }
}

/// Rows of one item added to a decoder layer's output at its tokens (1.2).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProgramInjection {
    /// Index of the item in the request.
    pub item: u32,
    /// The decoder layer whose output receives the rows.
    pub decoder_layer: u32,
    /// The encoder output that supplies them.
    pub encoder_output: RString,
    /// The tokens receiving a row each.
    pub tokens: TokenSet,
}

/// The prepared-prefill contract as a program (1.2): [`PrefillContract`] with placements that
/// replace or add rows at any tokens and per-item injections. The host runs this form; a
/// plugin that answers only `prefill_contract` has it converted (every placement a replacing
/// span, each injection at its item's placement).
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq)]
pub struct PrefillProgram {
    /// Factor applied once to text-token embeddings before features are placed; `1.0` for none.
    pub text_scale: f32,
    /// Where each item's rows go.
    pub placements: RVec<ProgramPlacement>,
    /// Per-layer injections, empty for most families.
    pub injections: RVec<ProgramInjection>,
    /// Position ids.
    pub positions: Positions,
    /// The additive attention mask.
    pub mask: AttentionMask,
}

impl From<PrefillContract> for PrefillProgram {
    fn from(contract: PrefillContract) -> Self {
        let span = |p: &Placement| TokenSet::Span { start: p.token_start, len: p.rows };
        let injections = contract
            .placements
            .iter()
            .flat_map(|p| {
                contract.injections.iter().map(move |inj| {
                    // The 1.0 contract's only mode; a new one must be converted explicitly.
                    let InjectionMode::Add = inj.mode;
                    ProgramInjection {
                        item: p.item,
                        decoder_layer: inj.decoder_layer,
                        encoder_output: inj.encoder_output.clone(),
                        tokens: span(p),
                    }
                })
            })
            .collect();
        let placements = contract
            .placements
            .iter()
            .map(|p| ProgramPlacement {
                item: p.item,
                encoder_output: p.encoder_output.clone(),
                mode: PlaceMode::Replace,
                tokens: span(p),
            })
            .collect();
        PrefillProgram {
            text_scale: contract.text_scale,
            placements,
            injections,
            positions: contract.positions,
            mask: contract.mask,
        }
    }
}

impl TryFrom<PrefillProgram> for PrefillContract {
    type Error = String;

    /// The 1.0 form of a program, for the 1.0 and 1.1 entries: possible when every placement
    /// replaces a span and every injection rides on its item's placement, for every item.
    fn try_from(program: PrefillProgram) -> Result<Self, String> {
        let mut placements = Vec::new();
        for p in program.placements.iter() {
            let (PlaceMode::Replace, TokenSet::Span { start, len }) = (p.mode, &p.tokens) else {
                return Err(format!("placement of item {} adds rows or places them at a token list", p.item));
            };
            placements.push(Placement {
                item: p.item,
                encoder_output: p.encoder_output.clone(),
                token_start: *start,
                rows: *len,
            });
        }
        let mut kinds: Vec<(u32, RString)> = Vec::new();
        for inj in program.injections.iter() {
            let kind = (inj.decoder_layer, inj.encoder_output.clone());
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        for p in program.placements.iter() {
            for (layer, output) in &kinds {
                let at = |i: &&ProgramInjection| {
                    i.item == p.item && i.decoder_layer == *layer && i.encoder_output == *output && i.tokens == p.tokens
                };
                if program.injections.iter().filter(at).count() != 1 {
                    return Err(format!("the injections of item {} are not its placement's tokens", p.item));
                }
            }
        }
        if program.injections.len() != kinds.len() * program.placements.len() {
            return Err("an injection has no placement of its item".to_owned());
        }
        let injections = kinds
            .into_iter()
            .map(|(decoder_layer, encoder_output)| LayerInjection {
                decoder_layer,
                encoder_output,
                mode: InjectionMode::Add,
            })
            .collect();
        Ok(PrefillContract {
            text_scale: program.text_scale,
            placements: placements.into(),
            positions: program.positions,
            mask: program.mask,
            injections,
        })
    }
}

// === Checkpoint check (1.1) ===

/// Input of `check_checkpoint` (since 1.1): the checkpoint's tensor index.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash)]
pub struct CheckpointIndex {
    /// Every tensor in the checkpoint's safetensors headers.
    pub tensors: RVec<TensorSpec>,
}

/// Output of `check_checkpoint`: problems found, empty when the checkpoint fits.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct CheckpointReport {
    /// One lowercase sentence per problem (missing tensor, wrong shape).
    pub problems: RVec<RString>,
}

impl CheckpointReport {
    /// The problems of an encoder graph's `parameters` (logical name, shape), declared in
    /// `dtype`, against `index`: the names are resolved to checkpoint keys by the one resolver
    /// (`mlxcel_decoder::resolve_names`: each `label/path` module found under the one root
    /// that holds all of it), then each key is held to its shape and to `dtype`.
    pub fn parameters(
        index: &CheckpointIndex,
        parameters: impl IntoIterator<Item = (String, Vec<usize>)>,
        dtype: DType,
    ) -> Self {
        let parameters: Vec<(String, Vec<usize>)> = parameters.into_iter().collect();
        let tensors: mlxcel_decoder::Index = index
            .tensors
            .iter()
            .map(|t| {
                let shape = t.shape.iter().map(|&d| d as usize).collect();
                (t.name.to_string(), mlxcel_decoder::TensorInfo { dtype: t.dtype.as_str().to_owned(), shape })
            })
            .collect();
        let keys = match mlxcel_decoder::resolve_names(&tensors, parameters.iter().map(|(name, _)| name.as_str())) {
            Ok(keys) => keys,
            Err(e) => return CheckpointReport { problems: RVec::from(vec![RString::from(e.to_string())]) },
        };
        let mut problems = Vec::new();
        for (name, shape) in &parameters {
            let key = keys.get(name).unwrap_or(name);
            let stored = |t: &TensorSpec| -> Vec<usize> { t.shape.iter().map(|&d| d as usize).collect() };
            match index.tensors.iter().find(|t| t.name.as_str() == key) {
                None => problems.push(format!("the checkpoint has no `{key}`")),
                // As declared, or an MLX convolution kernel channels-last, which the host
                // serves transposed.
                Some(t) if let Err(why) = mlxcel_decoder::stored_layout(shape, &stored(t), None) => {
                    problems.push(format!("`{key}` {why}"))
                }
                Some(t) if t.dtype != dtype => problems.push(format!(
                    "`{key}` is stored as {}; the encoder graph reads {} weights, the dtype the config names",
                    t.dtype.as_str(),
                    dtype.as_str()
                )),
                Some(_) => {}
            }
        }
        CheckpointReport { problems: problems.into_iter().map(RString::from).collect() }
    }
}
