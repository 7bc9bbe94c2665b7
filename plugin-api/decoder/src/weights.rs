//! The one place a decoder's logical weight names meet a checkpoint's keys.
//!
//! The graph names its tensors by what they are ([`Tensor`]: the embedding
//! table, layer 3's q projection, the final norm, the LM head);
//! [`DecoderWeights::resolve`] finds where the checkpoint keeps its text
//! model and head, [`DecoderWeights::key`] turns a logical name into the key
//! (as transformers lays a text model out below that root), and
//! [`DecoderWeights::check`]
//! holds each declared tensor against the checkpoint: present, of the shape
//! the config implies, in the dtype the graph reads, and dense. Every problem
//! is reported at once, before anything is compiled; a layout that matches in
//! two places is an error, not a first match.

use std::collections::BTreeMap;

use mlxcel_emit::Elem;

use crate::spec::WeightLayout;

/// What the resolver knows of one checkpoint tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// The safetensors dtype string (`F32`, `BF16`, `U32`, ...).
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// A checkpoint's tensors by key: all the resolver reads.
pub type Index = BTreeMap<String, TensorInfo>;

/// Where a decoder's text model is found: the root holding its embedding table, its final
/// norm and its first layer (a text checkpoint's `model.`, transformers 5's
/// `model.language_model.`, the older `language_model.model.`, a bare export's none).
const TEXT_ANCHORS: [&str; 3] = ["embed_tokens.weight", "norm.weight", "layers.0.input_layernorm.weight"];

/// The same anchors in the Molmo layout ([`WeightLayout::Molmo`]): `model.transformer.` in
/// its checkpoints.
const MOLMO_ANCHORS: [&str; 3] = ["wte.embedding", "ln_f.weight", "blocks.0.attn_norm.weight"];

/// The separator of a logical parameter name, `<label>/<path>`: the tensor `path` below the
/// root of the checkpoint module labelled `label` (`vision_tower/encoder.layers.0.mlp.fc1.weight`).
pub const LOGICAL_SEPARATOR: char = '/';

/// Splits a logical parameter name into its module label and path; `None` for a name without
/// a label, which is a checkpoint key as it stands.
pub fn split_logical(name: &str) -> Option<(&str, &str)> {
    name.split_once(LOGICAL_SEPARATOR)
}

/// Module labels MLX's converters rename: (the transformers or original label, MLX's).
/// mlx-vlm's Qwen2-VL keeps its `visual` tower as `vision_tower`, and its Molmo the original
/// `model.vision_backbone` so too.
const MLX_LABELS: [(&str, &str); 2] = [("visual", "vision_tower"), ("vision_backbone", "vision_tower")];

/// How a checkpoint stores a parameter the graph declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoredLayout {
    /// In the declared shape and order.
    AsDeclared,
    /// A convolution kernel declared `[out, in, k...]` (transformers' layout) stored
    /// channels-last, `[out, k..., in]`, as MLX stores every convolution kernel; it is read
    /// transposed into the declared layout.
    ChannelsLast,
}

/// The channels-last shape of a kernel declared `[out, in, k...]`: `[out, k..., in]`; `None`
/// below rank 3.
pub fn channels_last(declared: &[usize]) -> Option<Vec<usize>> {
    let [out, inputs, kernel @ ..] = declared else { return None };
    if kernel.is_empty() {
        return None;
    }
    let mut shape = vec![*out];
    shape.extend_from_slice(kernel);
    shape.push(*inputs);
    Some(shape)
}

/// Which names a Molmo-layout checkpoint under `root` uses: the original ones (`blocks.0.att_proj`)
/// or transformers' Molmo2 ones (`blocks.0.self_attn.att_proj`); both at once are ambiguous.
fn molmo_original_names(index: &Index, root: &str) -> Result<bool, WeightsError> {
    let original = format!("{root}blocks.0.att_proj.weight");
    let nested = format!("{root}blocks.0.self_attn.att_proj.weight");
    match (index.contains_key(&original), index.contains_key(&nested)) {
        (true, false) => Ok(true),
        (false, true) => Ok(false),
        (true, true) => Err(WeightsError::AmbiguousModule {
            module: "text model's attention".into(),
            roots: format!("`{original}` and `{nested}`"),
        }),
        (false, false) => Err(WeightsError::Incomplete {
            module: "text model".into(),
            root: root.to_owned(),
            missing: format!("`{original}` (or `{nested}`)"),
        }),
    }
}

/// How the tensor stored as `stored` serves a parameter declared `declared`. `mlx` says whether
/// the checkpoint is MLX's (its files' metadata), `None` when that is not known (a plugin's
/// check sees only the tensors): an MLX checkpoint's kernel of rank 3 or more is channels-last,
/// and one whose two layouts share a shape (`[o, 3, 3, 3]`) cannot be told apart and is refused;
/// any other checkpoint's is as declared.
pub fn stored_layout(declared: &[usize], stored: &[usize], mlx: Option<bool>) -> Result<StoredLayout, String> {
    let last = channels_last(declared);
    let channels_last_shape = last.as_deref() == Some(stored);
    match mlx {
        Some(true) if channels_last_shape && stored == declared => Err(format!(
            "is {stored:?} in an MLX checkpoint, which stores convolution kernels channels-last; for this shape \
             the two layouts cannot be told apart"
        )),
        Some(true) | None if channels_last_shape => Ok(StoredLayout::ChannelsLast),
        _ if stored == declared => Ok(StoredLayout::AsDeclared),
        Some(false) if channels_last_shape => Err(format!(
            "has shape {stored:?}, the channels-last form of {declared:?}, but the checkpoint is not MLX's"
        )),
        _ => Err(format!("has shape {stored:?}, the config needs {declared:?}")),
    }
}

/// Finds the one root below which the checkpoint holds every tensor of a module: the prefix
/// `P` such that `P + path` is a key for each of `paths`. `label`, when not empty, must be one
/// of the root's dotted components (`vision_tower` matches `vision_tower.`,
/// `vision_tower.vision_model.` and `model.vision_tower.`), so a module is found wherever a
/// checkpoint layout nests it and never inside an unrelated one. No root, or more than one,
/// is an error naming what was looked for: nothing is guessed, and no first match wins.
pub fn resolve_root(index: &Index, label: &str, paths: &[&str]) -> Result<String, WeightsError> {
    let module = || if label.is_empty() { "text model".to_owned() } else { format!("`{label}`") };
    let Some(first) = paths.first() else { return Ok(String::new()) };
    // MLX's converters rename some modules (mlx-vlm's Qwen2-VL keeps its `visual` tower as
    // `vision_tower`): a root under either name is the module's; both at once stay ambiguous.
    let mlx_name = MLX_LABELS.iter().find(|(hf, _)| *hf == label).map(|(_, mlx)| *mlx);
    let labelled = |root: &str| label.is_empty() || root.split('.').any(|c| c == label || Some(c) == mlx_name);
    let candidates: Vec<&str> = index
        .keys()
        .filter_map(|key| key.strip_suffix(first))
        .filter(|root| root.is_empty() || root.ends_with('.'))
        .filter(|root| labelled(root))
        .collect();
    if candidates.is_empty() {
        return Err(WeightsError::NoModule { module: module(), path: (*first).to_owned() });
    }
    let holds = |root: &str| paths.iter().filter(|p| !index.contains_key(&format!("{root}{p}"))).count();
    let complete: Vec<&str> = candidates.iter().copied().filter(|root| holds(root) == 0).collect();
    match complete.as_slice() {
        [one] => Ok((*one).to_owned()),
        [] => {
            let root = candidates.iter().copied().min_by_key(|root| holds(root)).unwrap_or_default();
            let missing: Vec<String> = paths
                .iter()
                .filter(|p| !index.contains_key(&format!("{root}{p}")))
                .map(|p| format!("{root}{p}"))
                .collect();
            Err(WeightsError::Incomplete { module: module(), root: root.to_owned(), missing: quoted_all(&missing) })
        }
        many => Err(WeightsError::AmbiguousModule { module: module(), roots: quoted(many) }),
    }
}

/// The checkpoint key of every logical name in `names`: the names of one label resolve
/// together ([`resolve_root`] over all their paths), a name without a label is its own key.
pub fn resolve_names<'a>(
    index: &Index,
    names: impl IntoIterator<Item = &'a str>,
) -> Result<BTreeMap<String, String>, WeightsError> {
    let mut modules: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut keys = BTreeMap::new();
    for name in names {
        match split_logical(name) {
            Some((label, path)) => modules.entry(label).or_default().push(path),
            None => {
                keys.insert(name.to_owned(), name.to_owned());
            }
        }
    }
    for (label, paths) in modules {
        let root = resolve_root(index, label, &paths)?;
        for path in paths {
            keys.insert(format!("{label}{LOGICAL_SEPARATOR}{path}"), format!("{root}{path}"));
        }
    }
    Ok(keys)
}

/// One quantized module's parameters (MLX's `quantization` in `config.json`): bits per weight
/// and the consecutive inputs sharing one scale and bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Quantization {
    pub bits: u32,
    pub group_size: usize,
}

impl Quantization {
    /// Integers per packed `uint32` word.
    pub fn per_word(&self) -> usize {
        32 / self.bits as usize
    }
}

/// A checkpoint's quantization as MLX's converters record it in `config.json`: `quantization`
/// (and the same under `quantization_config`) holds the default `group_size`, `bits` and `mode`,
/// and, per module path, either that module's own `{group_size, bits}` or `false` (left dense).
/// Which linears are quantized is read from the tensors (scales and biases beside a weight), as
/// MLX's loader reads it; the config says with which parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct QuantConfig {
    /// The default for modules without an entry; `None` when only per-module entries are given.
    pub default: Option<Quantization>,
    /// Per module path (`model.layers.0.mlp.down_proj`): its parameters, or `None` for dense.
    pub modules: BTreeMap<String, Option<Quantization>>,
}

/// The bit widths the graphs dequantize: whole values per byte, so a packed word is IREE's
/// `i4`/`i8` packing of the same bytes.
pub const QUANT_BITS: [u32; 2] = [4, 8];

impl QuantConfig {
    /// The quantization recorded in a `config.json` root, `None` when it records none. Refused:
    /// `quantization` and `quantization_config` that disagree, a mode other than `affine`
    /// (MLX's default, also when `mode` is absent), bit widths other than 4 and 8, a group size
    /// of 0, and any entry that is neither a parameter nor a module's `{...}` or `false`.
    pub fn from_config(root: &serde_json::Value) -> Result<Option<QuantConfig>, String> {
        let (a, b) = (root.get("quantization"), root.get("quantization_config"));
        let block = match (a, b) {
            (Some(a), Some(b)) if a != b => {
                return Err("`quantization` and `quantization_config` differ; which applies is ambiguous".into());
            }
            (Some(v), _) | (None, Some(v)) => v,
            (None, None) => return Ok(None),
        };
        let Some(fields) = block.as_object() else {
            return Err(format!("`quantization` is {block}, not an object"));
        };
        // transformers' own quantization configs (bitsandbytes, GPTQ, AWQ, ...) name a method.
        if let Some(method) = fields.get("quant_method") {
            return Err(format!("quantization method {method} is not implemented (MLX's affine quantization is)"));
        }
        let params = |what: &str, v: &serde_json::Map<String, serde_json::Value>| -> Result<Quantization, String> {
            if let Some(mode) = v.get("mode").filter(|m| m.as_str() != Some("affine")) {
                return Err(format!("{what}: quantization mode {mode} is not implemented (affine is)"));
            }
            let int = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
            let (Some(bits), Some(group_size)) = (int("bits"), int("group_size")) else {
                return Err(format!("{what}: needs integer `bits` and `group_size`"));
            };
            if !QUANT_BITS.contains(&(bits as u32)) {
                return Err(format!("{what}: {bits}-bit quantization is not implemented (4 and 8 are)"));
            }
            if group_size == 0 {
                return Err(format!("{what}: group_size is 0"));
            }
            Ok(Quantization { bits: bits as u32, group_size: group_size as usize })
        };
        let mut config = QuantConfig::default();
        let mut own = serde_json::Map::new();
        for (key, value) in fields {
            match (key.as_str(), value) {
                ("bits" | "group_size" | "mode", _) => {
                    own.insert(key.clone(), value.clone());
                }
                (_, serde_json::Value::Bool(false)) => {
                    config.modules.insert(key.clone(), None);
                }
                (_, serde_json::Value::Object(m)) => {
                    config.modules.insert(key.clone(), Some(params(&format!("module `{key}`"), m)?));
                }
                _ => return Err(format!("quantization entry `{key}` = {value} is not understood")),
            }
        }
        if !own.is_empty() {
            config.default = Some(params("quantization", &own)?);
        }
        Ok(Some(config))
    }

    /// The parameters of the module whose weight is `key` (`<module>.weight`): its own entry,
    /// else the default; `None` when the config leaves it dense.
    pub fn for_weight(&self, key: &str) -> Option<Quantization> {
        let module = key.strip_suffix(".weight").unwrap_or(key);
        match self.modules.get(module) {
            Some(own) => *own,
            None => self.default,
        }
    }
}

/// A linear layer's weight as a checkpoint stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Linear {
    /// One matrix in its dtype.
    Dense { weight: String },
    /// MLX's affine quantization: `weight` packs `bits`-bit integers into
    /// u32 words, and each group of `group_size` inputs has a scale and a
    /// bias (`w = scale * q + bias`); `quantization` is `None` when the
    /// config does not say, which a graph reading it must refuse.
    Affine { weight: String, scales: String, biases: String, quantization: Option<Quantization> },
}

impl Linear {
    /// How the checkpoint stores the linear weight `key` (`...weight`): affine when
    /// `...scales` and `...biases` sit beside it, with the config's parameters for it.
    pub fn detect(index: &Index, key: &str, quantization: Option<&QuantConfig>) -> Linear {
        let base = key.strip_suffix(".weight").unwrap_or(key);
        let (scales, biases) = (format!("{base}.scales"), format!("{base}.biases"));
        match (index.contains_key(&scales), index.contains_key(&biases)) {
            (true, true) => Linear::Affine {
                weight: key.to_owned(),
                scales,
                biases,
                quantization: quantization.and_then(|q| q.for_weight(key)),
            },
            _ => Linear::Dense { weight: key.to_owned() },
        }
    }
}

/// Why a checkpoint cannot serve a decoder's weights.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WeightsError {
    #[error("no checkpoint key is the {module}'s `{path}` (under any root)")]
    NoModule { module: String, path: String },
    #[error("the checkpoint holds the {module} under more than one root ({roots}); which one is meant is ambiguous")]
    AmbiguousModule { module: String, roots: String },
    #[error("the checkpoint's {module} under `{root}` lacks {missing}")]
    Incomplete { module: String, root: String, missing: String },
    #[error("{} of the decoder's tensors do not match the checkpoint: {}", .0.len(), .0.join("; "))]
    Tensors(Vec<String>),
}

/// A decoder tensor by what it is, not by where a checkpoint keeps it: the graph names its
/// weights only this way, and [`DecoderWeights::key`] is the one place they become keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tensor {
    Embed,
    /// The token table's extra rows, stored apart (the Molmo layout's `new_embedding`).
    EmbedExtra,
    /// The final norm.
    Norm,
    /// The untied LM head.
    LmHead,
    Layer(usize, LayerTensor),
    /// Per-layer inputs: the per-layer token table `[vocab, layers * hidden_per_layer]`, the
    /// projection of the input embeddings to the same width, and its norm `[hidden_per_layer]`.
    PerLayerEmbed,
    PerLayerProjection,
    PerLayerProjectionNorm,
    /// AltUp: the projection making stream `i + 1` from the embeddings, and the one taking it
    /// back at the end.
    AltUpIn(usize),
    AltUpOut(usize),
}

/// A tensor of one decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerTensor {
    /// The norm before attention.
    AttnInNorm,
    Q,
    K,
    V,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    O,
    /// The sandwich norm on attention's output.
    AttnOutNorm,
    /// The norm before the MLP.
    MlpInNorm,
    /// The sandwich norm on the MLP's output.
    MlpOutNorm,
    Gate,
    Up,
    Down,
    /// The fused projection holding the q, k and v rows, in that order (Molmo layout).
    Qkv,
    /// Its bias.
    QkvBias,
    /// The fused projection holding the up rows, then the gate rows (Molmo layout).
    UpGate,
    /// Multi-head latent attention: the queries' low-rank projection, its norm, and the
    /// projection up to every head's query.
    QA,
    QANorm,
    QB,
    /// Multi-head latent attention: the projection to the latent and the shared rotary key,
    /// the latent's norm, and the projection of the latent to every head's no-rope key and
    /// value (per head, the key rows then the value rows).
    KvA,
    KvANorm,
    KvB,
    /// AltUp: the active stream's output scale, the correction and prediction coefficients,
    /// the router and its norm.
    AltUpCorrectScale,
    AltUpCorrection,
    AltUpPrediction,
    AltUpRouter,
    AltUpRouterNorm,
    /// LAuReL: the two low-rank projections and the norm on their output.
    LaurelLeft,
    LaurelRight,
    LaurelNorm,
    /// Per-layer inputs: the gate from the active stream, the projection back, its norm.
    PerLayerGate,
    PerLayerProjection,
    PerLayerNorm,
}

impl LayerTensor {
    /// The tensor's name under a layer in `layout`, `None` for a tensor the layout does not
    /// have. As transformers lays a layer out, the norm before the MLP is
    /// `post_attention_layernorm` in a pre-norm layer and `pre_feedforward_layernorm` in a
    /// sandwich one, where `post_attention_layernorm` is the norm on attention's output.
    fn name(self, layout: WeightLayout, sandwich: bool, original: bool) -> Option<&'static str> {
        use LayerTensor::*;
        if layout == WeightLayout::Molmo {
            // The original checkpoints (Molmo v1's) name the projections on the block itself;
            // transformers' Molmo2 nests them under `self_attn.` and `mlp.`.
            let pick = |original_name, nested| Some(if original { original_name } else { nested });
            return match self {
                // One norm per block, before it or (`norm_after`) on its output.
                AttnInNorm | AttnOutNorm => Some("attn_norm.weight"),
                Qkv => pick("att_proj.weight", "self_attn.att_proj.weight"),
                QkvBias => pick("att_proj.bias", "self_attn.att_proj.bias"),
                QNorm => pick("q_norm.weight", "self_attn.q_norm.weight"),
                KNorm => pick("k_norm.weight", "self_attn.k_norm.weight"),
                O => pick("attn_out.weight", "self_attn.attn_out.weight"),
                MlpInNorm | MlpOutNorm => Some("ff_norm.weight"),
                UpGate => pick("ff_proj.weight", "mlp.ff_proj.weight"),
                Down => pick("ff_out.weight", "mlp.ff_out.weight"),
                _ => None,
            };
        }
        Some(match self {
            AttnInNorm => "input_layernorm.weight",
            Q => "self_attn.q_proj.weight",
            K => "self_attn.k_proj.weight",
            V => "self_attn.v_proj.weight",
            QBias => "self_attn.q_proj.bias",
            KBias => "self_attn.k_proj.bias",
            VBias => "self_attn.v_proj.bias",
            QNorm => "self_attn.q_norm.weight",
            KNorm => "self_attn.k_norm.weight",
            O => "self_attn.o_proj.weight",
            AttnOutNorm => "post_attention_layernorm.weight",
            MlpInNorm if sandwich => "pre_feedforward_layernorm.weight",
            MlpInNorm => "post_attention_layernorm.weight",
            MlpOutNorm => "post_feedforward_layernorm.weight",
            Gate => "mlp.gate_proj.weight",
            Up => "mlp.up_proj.weight",
            Down => "mlp.down_proj.weight",
            QA => "self_attn.q_a_proj.weight",
            QANorm => "self_attn.q_a_layernorm.weight",
            QB => "self_attn.q_b_proj.weight",
            KvA => "self_attn.kv_a_proj_with_mqa.weight",
            KvANorm => "self_attn.kv_a_layernorm.weight",
            KvB => "self_attn.kv_b_proj.weight",
            AltUpCorrectScale => "altup.correct_output_scale",
            AltUpCorrection => "altup.correction_coefs.weight",
            AltUpPrediction => "altup.prediction_coefs.weight",
            AltUpRouter => "altup.modality_router.weight",
            AltUpRouterNorm => "altup.router_norm.weight",
            LaurelLeft => "laurel.linear_left.weight",
            LaurelRight => "laurel.linear_right.weight",
            LaurelNorm => "laurel.post_laurel_norm.weight",
            PerLayerGate => "per_layer_input_gate.weight",
            PerLayerProjection => "per_layer_projection.weight",
            PerLayerNorm => "post_per_layer_input_norm.weight",
            Qkv | QkvBias | UpGate => return None,
        })
    }
}

/// Where one checkpoint keeps a decoder's weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecoderWeights {
    /// The text model's root: the prefix of `embed_tokens.weight`.
    pub root: String,
    /// The untied LM head's key; `None` when the head is the embedding table.
    pub lm_head: Option<String>,
    /// The layers carry sandwich norms (which renames the norm before the MLP).
    pub sandwich: bool,
    /// How the tensors are named and split.
    pub layout: WeightLayout,
    /// In the Molmo layout, the original checkpoints' names (Molmo v1's, as allenai and
    /// mlx-vlm store them): `blocks.N.att_proj`, `attn_out`, `ff_proj`, `ff_out` on the block,
    /// and the untied head as `ff_out` under the root; otherwise transformers' Molmo2 names.
    pub original_names: bool,
}

impl DecoderWeights {
    /// Finds the text model's root and its LM head in `index` for the decoder `cfg` (whether
    /// the head is the embedding table, where its norms sit).
    pub fn resolve(index: &Index, cfg: &crate::TextConfig) -> Result<Self, WeightsError> {
        let layout = cfg.spec.weights;
        let anchors = match layout {
            WeightLayout::Transformers => TEXT_ANCHORS,
            WeightLayout::Molmo => MOLMO_ANCHORS,
        };
        let root = resolve_root(index, "", &anchors)?;
        let original_names = layout == WeightLayout::Molmo && molmo_original_names(index, &root)?;
        let lm_head = match (cfg.tied_embeddings, original_names) {
            (true, _) => None,
            (false, true) => {
                let head = format!("{root}ff_out.weight");
                if !index.contains_key(&head) {
                    return Err(WeightsError::Incomplete {
                        module: "text model".into(),
                        root,
                        missing: format!("`{head}` (the untied head)"),
                    });
                }
                Some(head)
            }
            (false, false) => Some(format!("{}weight", resolve_root(index, "lm_head", &["weight"])?)),
        };
        Ok(DecoderWeights { root, lm_head, sandwich: cfg.sandwich_norms, layout, original_names })
    }

    /// The checkpoint key of `tensor`; `None` for the LM head when it is the embedding table,
    /// and for a tensor the layout does not have (the Molmo layout's separate q, k and v).
    pub fn key(&self, tensor: Tensor) -> Option<String> {
        let root = &self.root;
        let molmo = self.layout == WeightLayout::Molmo;
        match tensor {
            Tensor::Embed if molmo => Some(format!("{root}wte.embedding")),
            Tensor::Embed => Some(format!("{root}embed_tokens.weight")),
            Tensor::EmbedExtra if molmo => Some(format!("{root}wte.new_embedding")),
            Tensor::EmbedExtra => None,
            Tensor::Norm if molmo => Some(format!("{root}ln_f.weight")),
            Tensor::Norm => Some(format!("{root}norm.weight")),
            Tensor::LmHead => self.lm_head.clone(),
            Tensor::PerLayerEmbed
            | Tensor::PerLayerProjection
            | Tensor::PerLayerProjectionNorm
            | Tensor::AltUpIn(_)
            | Tensor::AltUpOut(_)
                if molmo =>
            {
                None
            }
            Tensor::PerLayerEmbed => Some(format!("{root}embed_tokens_per_layer.weight")),
            Tensor::PerLayerProjection => Some(format!("{root}per_layer_model_projection.weight")),
            Tensor::PerLayerProjectionNorm => Some(format!("{root}per_layer_projection_norm.weight")),
            Tensor::AltUpIn(i) => Some(format!("{root}altup_projections.{i}.weight")),
            Tensor::AltUpOut(i) => Some(format!("{root}altup_unembed_projections.{i}.weight")),
            Tensor::Layer(i, t) => {
                let blocks = if molmo { "blocks" } else { "layers" };
                t.name(self.layout, self.sandwich, self.original_names).map(|name| format!("{root}{blocks}.{i}.{name}"))
            }
        }
    }

    /// The key of the embedding table.
    pub fn embed(&self) -> String {
        self.key(Tensor::Embed).expect("invariant: the embedding table has a key")
    }

    /// The problems of the declared tensors (key, shape) against `index` when the graph reads
    /// them as `dtype`: each missing one, each of another shape or dtype, each linear stored
    /// quantized (the graph reads dense weights).
    pub fn check<'a>(
        index: &Index,
        declared: impl IntoIterator<Item = (&'a str, &'a [usize])>,
        dtype: Elem,
    ) -> Result<(), WeightsError> {
        let problems = dense_problems(index, declared, dtype);
        if problems.is_empty() { Ok(()) } else { Err(WeightsError::Tensors(problems)) }
    }
}

/// [`DecoderWeights::check`]'s problems, one line each.
pub fn dense_problems<'a>(
    index: &Index,
    declared: impl IntoIterator<Item = (&'a str, &'a [usize])>,
    dtype: Elem,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, shape) in declared {
        if let Linear::Affine { .. } = Linear::detect(index, key, None) {
            problems.push(format!(
                "`{key}` is affine-quantized (scales and biases beside it); this decoder reads dense weights"
            ));
            continue;
        }
        match index.get(key) {
            None => problems.push(format!("`{key}` is missing")),
            Some(t) if t.shape != shape => {
                problems.push(format!("`{key}` has shape {:?}, the config needs {shape:?}", t.shape));
            }
            Some(t) if Elem::from_safetensors(&t.dtype) != Some(dtype) => {
                problems.push(format!("`{key}` is {}, the decoder reads {dtype}", t.dtype));
            }
            Some(_) => {}
        }
    }
    problems
}

/// An affine-quantized linear as a graph reads it: the parameters, and the dtype its scales
/// and biases are stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffineLayout {
    pub quantization: Quantization,
    pub scales: Elem,
}

/// Checks the affine-quantized linear `linear` (from [`Linear::detect`]) for a weight of
/// `[out, inputs]`: the config gives it parameters, the inputs divide into groups and whole
/// words, the packed weight is `U32 [out, inputs * bits / 32]`, and the scales and biases are
/// `[out, inputs / group_size]` in one float dtype. Every problem is returned, one line each.
pub fn check_affine(index: &Index, linear: &Linear, out: usize, inputs: usize) -> Result<AffineLayout, Vec<String>> {
    let Linear::Affine { weight, scales, biases, quantization } = linear else {
        return Err(vec![format!("`{}` is not affine-quantized", linear.weight())]);
    };
    let Some(q) = *quantization else {
        return Err(vec![format!(
            "`{weight}` is affine-quantized (scales and biases beside it), but config.json gives this module no \
             quantization parameters (no `quantization`, or its entry is false)"
        )]);
    };
    let mut problems = Vec::new();
    if !inputs.is_multiple_of(q.group_size) || !(inputs * q.bits as usize).is_multiple_of(32) {
        problems.push(format!(
            "`{weight}`: {inputs} inputs do not divide into groups of {} and whole 32-bit words of {}-bit values",
            q.group_size, q.bits
        ));
        return Err(problems);
    }
    let expect = |problems: &mut Vec<String>, key: &str, shape: &[usize], dtypes: &[&str]| -> Option<String> {
        match index.get(key) {
            None => problems.push(format!("`{key}` is missing")),
            Some(t) if t.shape != shape => problems.push(format!(
                "`{key}` has shape {:?}; {}-bit groups of {} over a [{out}, {inputs}] weight need {shape:?}",
                t.shape, q.bits, q.group_size
            )),
            Some(t) if !dtypes.contains(&t.dtype.as_str()) => {
                problems.push(format!("`{key}` is {}, expected {}", t.dtype, dtypes.join(" or ")))
            }
            Some(t) => return Some(t.dtype.clone()),
        }
        None
    };
    let groups = [out, inputs / q.group_size];
    expect(&mut problems, weight, &[out, inputs * q.bits as usize / 32], &["U32"]);
    let s = expect(&mut problems, scales, &groups, &["F32", "BF16", "F16"]);
    let b = expect(&mut problems, biases, &groups, &["F32", "BF16", "F16"]);
    match (s, b) {
        (Some(s), Some(b)) if s != b => problems.push(format!("`{scales}` is {s} but `{biases}` is {b}")),
        (Some(s), Some(_)) if problems.is_empty() => {
            let scales = Elem::from_safetensors(&s).expect("invariant: a float dtype checked above");
            return Ok(AffineLayout { quantization: q, scales });
        }
        _ => {}
    }
    Err(problems)
}

impl Linear {
    /// The weight's key.
    pub fn weight(&self) -> &str {
        match self {
            Linear::Dense { weight } | Linear::Affine { weight, .. } => weight,
        }
    }
}

fn quoted(items: &[&str]) -> String {
    items.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
}

fn quoted_all(items: &[String]) -> String {
    items.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(keys: &[(&str, &str, &[usize])]) -> Index {
        keys.iter()
            .map(|(k, dtype, shape)| {
                ((*k).to_owned(), TensorInfo { dtype: (*dtype).to_owned(), shape: shape.to_vec() })
            })
            .collect()
    }

    #[test]
    fn the_root_and_head_are_found_once_or_refused() {
        let llama = |tied: bool| {
            let mut c = crate::TextConfig::parse(&tiny_config("llama")).expect("config");
            c.tied_embeddings = tied;
            c
        };
        let (tied, untied) = (llama(true), llama(false));
        // A text model's anchors (embedding table, final norm, first layer's norm) under `root`.
        let text_model = |root: &str| -> Vec<(String, &'static str, Vec<usize>)> {
            TEXT_ANCHORS.iter().map(|p| (format!("{root}{p}"), "F32", vec![8])).collect()
        };
        let with = |parts: Vec<Vec<(String, &'static str, Vec<usize>)>>| -> Index {
            parts
                .into_iter()
                .flatten()
                .map(|(k, dtype, shape)| (k, TensorInfo { dtype: dtype.to_owned(), shape }))
                .collect()
        };
        let head = |key: &str| vec![(key.to_owned(), "F32", vec![8, 4])];
        let text = with(vec![text_model("model."), head("lm_head.weight")]);
        let w = DecoderWeights::resolve(&text, &untied).expect("text layout");
        assert_eq!((w.root.as_str(), w.lm_head.as_deref()), ("model.", Some("lm_head.weight")));
        let up = Tensor::Layer(0, LayerTensor::Up);
        assert_eq!(w.key(up).as_deref(), Some("model.layers.0.mlp.up_proj.weight"));
        assert_eq!(DecoderWeights::resolve(&text, &tied).expect("tied").lm_head, None);

        let stray = vec![("model.visual.embed_tokens.weight".to_owned(), "F32", vec![8])];
        let vlm = with(vec![text_model("model.language_model."), stray]);
        let found = DecoderWeights::resolve(&vlm, &tied).expect("vlm layout");
        assert_eq!(found.root, "model.language_model.", "a root holding only some anchors is no candidate");
        let legacy = with(vec![text_model("language_model.model."), head("language_model.lm_head.weight")]);
        let found = DecoderWeights::resolve(&legacy, &untied).expect("legacy layout");
        assert_eq!(
            (found.root.as_str(), found.lm_head.as_deref()),
            ("language_model.model.", Some("language_model.lm_head.weight"))
        );

        let both = with(vec![text_model("model."), text_model("language_model.model.")]);
        assert_eq!(
            DecoderWeights::resolve(&both, &tied),
            Err(WeightsError::AmbiguousModule {
                module: "text model".into(),
                roots: "`language_model.model.`, `model.`".into()
            })
        );
        assert!(matches!(DecoderWeights::resolve(&index(&[]), &tied), Err(WeightsError::NoModule { .. })));
        let vlm = with(vec![text_model("model.language_model.")]);
        assert!(matches!(DecoderWeights::resolve(&vlm, &untied), Err(WeightsError::NoModule { .. })));
        let heads = with(vec![text_model("model."), head("lm_head.weight"), head("language_model.lm_head.weight")]);
        assert!(matches!(DecoderWeights::resolve(&heads, &untied), Err(WeightsError::AmbiguousModule { .. })));
    }

    /// The Molmo layout in either naming: Molmo2's nested (`self_attn.att_proj`, `lm_head`) or
    /// the original (`att_proj` on the block, the head as the root's `ff_out`); both at once
    /// are ambiguous.
    #[test]
    fn the_molmo_layout_is_read_in_the_naming_the_checkpoint_uses() {
        let mut cfg = crate::TextConfig::parse(&tiny_config("llama")).expect("config");
        cfg.spec.weights = WeightLayout::Molmo;
        cfg.tied_embeddings = false;
        let with = |extra: &[&str]| -> Index {
            MOLMO_ANCHORS
                .iter()
                .map(|p| (format!("model.transformer.{p}"), vec![8]))
                .chain(extra.iter().map(|k| ((*k).to_owned(), vec![8, 8])))
                .map(|(k, shape)| (k, TensorInfo { dtype: "F32".into(), shape }))
                .collect()
        };
        let original = with(&["model.transformer.blocks.0.att_proj.weight", "model.transformer.ff_out.weight"]);
        let w = DecoderWeights::resolve(&original, &cfg).expect("original");
        assert!(w.original_names);
        assert_eq!(w.lm_head.as_deref(), Some("model.transformer.ff_out.weight"));
        let up_gate = Tensor::Layer(3, LayerTensor::UpGate);
        assert_eq!(w.key(up_gate).as_deref(), Some("model.transformer.blocks.3.ff_proj.weight"));
        let nested = with(&["model.transformer.blocks.0.self_attn.att_proj.weight", "lm_head.weight"]);
        let w = DecoderWeights::resolve(&nested, &cfg).expect("nested");
        assert!(!w.original_names);
        assert_eq!(w.key(up_gate).as_deref(), Some("model.transformer.blocks.3.mlp.ff_proj.weight"));
        let both = with(&[
            "model.transformer.blocks.0.att_proj.weight",
            "model.transformer.blocks.0.self_attn.att_proj.weight",
            "model.transformer.ff_out.weight",
        ]);
        assert!(matches!(DecoderWeights::resolve(&both, &cfg), Err(WeightsError::AmbiguousModule { .. })));
        let headless = with(&["model.transformer.blocks.0.att_proj.weight"]);
        let err = DecoderWeights::resolve(&headless, &cfg).expect_err("no head");
        assert!(err.to_string().contains("model.transformer.ff_out.weight"), "{err}");
    }

    #[test]
    fn a_module_is_found_under_whatever_root_nests_it_and_only_there() {
        let paths = ["embeddings.patch_embedding.weight", "encoder.layers.0.mlp.fc1.weight"];
        let under = |root: &str| -> Index {
            paths.iter().map(|p| (format!("{root}{p}"), TensorInfo { dtype: "F32".into(), shape: vec![2] })).collect()
        };
        for root in ["vision_tower.", "vision_tower.vision_model.", "model.vision_tower."] {
            assert_eq!(resolve_root(&under(root), "vision_tower", &paths).as_deref(), Ok(root));
        }
        // The label keeps another module's identically named tensors out.
        let mut two = under("vision_tower.");
        two.extend(under("audio_tower."));
        assert_eq!(resolve_root(&two, "vision_tower", &paths).as_deref(), Ok("vision_tower."));
        assert!(matches!(resolve_root(&two, "", &paths), Err(WeightsError::AmbiguousModule { .. })));
        let mut partial = under("vision_tower.");
        partial.remove("vision_tower.encoder.layers.0.mlp.fc1.weight");
        assert_eq!(
            resolve_root(&partial, "vision_tower", &paths),
            Err(WeightsError::Incomplete {
                module: "`vision_tower`".into(),
                root: "vision_tower.".into(),
                missing: "`vision_tower.encoder.layers.0.mlp.fc1.weight`".into(),
            })
        );

        let names = ["vision_tower/embeddings.patch_embedding.weight", "vision_tower/encoder.layers.0.mlp.fc1.weight"];
        let keys =
            resolve_names(&under("model.vision_tower."), names.iter().copied().chain(["exact.key"])).expect("resolved");
        assert_eq!(
            keys["vision_tower/encoder.layers.0.mlp.fc1.weight"],
            "model.vision_tower.encoder.layers.0.mlp.fc1.weight"
        );
        assert_eq!(keys["exact.key"], "exact.key", "a name without a label is its own key");
    }

    fn tiny_config(model_type: &str) -> String {
        serde_json::json!({
            "model_type": model_type, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4, "rms_norm_eps": 1e-6,
            "vocab_size": 8, "rope_theta": 10000.0, "layer_types": ["full_attention"],
            "query_pre_attn_scalar": 4, "tie_word_embeddings": true,
        })
        .to_string()
    }

    #[test]
    fn the_norm_before_the_mlp_is_named_by_where_the_norms_sit() {
        let idx = index(&[
            ("model.embed_tokens.weight", "F32", &[8, 8]),
            ("model.norm.weight", "F32", &[8]),
            ("model.layers.0.input_layernorm.weight", "F32", &[8]),
        ]);
        let key = |model_type: &str, t: LayerTensor| {
            let cfg = crate::TextConfig::parse(&tiny_config(model_type)).expect("config");
            DecoderWeights::resolve(&idx, &cfg).expect("resolve").key(Tensor::Layer(2, t)).expect("key")
        };
        assert_eq!(key("llama", LayerTensor::MlpInNorm), "model.layers.2.post_attention_layernorm.weight");
        assert_eq!(key("gemma3_text", LayerTensor::MlpInNorm), "model.layers.2.pre_feedforward_layernorm.weight");
        assert_eq!(key("gemma3_text", LayerTensor::AttnOutNorm), "model.layers.2.post_attention_layernorm.weight");
    }

    #[test]
    fn every_declared_tensor_is_checked_and_every_problem_reported() {
        let idx = index(&[
            ("a.weight", "F32", &[2, 3]),
            ("b.weight", "F32", &[3, 3]),
            ("c.weight", "BF16", &[2]),
            ("q.weight", "U32", &[4, 1]),
            ("q.scales", "F32", &[4, 1]),
            ("q.biases", "F32", &[4, 1]),
        ]);
        assert_eq!(DecoderWeights::check(&idx, [("a.weight", &[2usize, 3][..])], Elem::F32), Ok(()));
        let declared: [(&str, &[usize]); 5] = [
            ("a.weight", &[2, 3]),
            ("b.weight", &[2, 3]),
            ("c.weight", &[2]),
            ("d.weight", &[1]),
            ("q.weight", &[4, 8]),
        ];
        let Err(WeightsError::Tensors(problems)) = DecoderWeights::check(&idx, declared, Elem::F32) else {
            panic!("problems expected");
        };
        assert_eq!(
            problems,
            [
                "`b.weight` has shape [3, 3], the config needs [2, 3]",
                "`c.weight` is BF16, the decoder reads f32",
                "`d.weight` is missing",
                "`q.weight` is affine-quantized (scales and biases beside it); this decoder reads dense weights",
            ]
        );
    }

    #[test]
    fn a_linear_with_scales_and_biases_beside_it_is_affine() {
        let idx = index(&[("q.weight", "U32", &[4, 1]), ("q.scales", "F32", &[4, 1]), ("q.biases", "F32", &[4, 1])]);
        let q4 = Quantization { bits: 4, group_size: 64 };
        let config = QuantConfig { default: Some(q4), modules: BTreeMap::new() };
        assert_eq!(
            Linear::detect(&idx, "q.weight", Some(&config)),
            Linear::Affine {
                weight: "q.weight".into(),
                scales: "q.scales".into(),
                biases: "q.biases".into(),
                quantization: Some(q4),
            }
        );
        assert_eq!(Linear::detect(&idx, "p.weight", Some(&config)), Linear::Dense { weight: "p.weight".into() });
    }

    fn quant(json: &str) -> Result<Option<QuantConfig>, String> {
        QuantConfig::from_config(&serde_json::from_str(json).expect("json"))
    }

    #[test]
    fn mlx_quantization_configs_are_read_with_their_module_overrides() {
        assert_eq!(quant(r#"{"model_type": "qwen3"}"#), Ok(None));
        let q = quant(
            r#"{"quantization": {"group_size": 32, "bits": 4, "mode": "affine",
                "lm_head": {"group_size": 64, "bits": 8}, "model.layers.1.self_attn.v_proj": false},
                "quantization_config": {"group_size": 32, "bits": 4, "mode": "affine",
                "lm_head": {"group_size": 64, "bits": 8}, "model.layers.1.self_attn.v_proj": false}}"#,
        )
        .expect("valid")
        .expect("quantized");
        assert_eq!(q.for_weight("model.layers.0.mlp.up_proj.weight"), Some(Quantization { bits: 4, group_size: 32 }));
        assert_eq!(q.for_weight("lm_head.weight"), Some(Quantization { bits: 8, group_size: 64 }));
        assert_eq!(q.for_weight("model.layers.1.self_attn.v_proj.weight"), None);
        // An older converter writes no mode: affine, MLX's default.
        let q = quant(r#"{"quantization": {"group_size": 64, "bits": 8}}"#).expect("valid").expect("quantized");
        assert_eq!(q.default, Some(Quantization { bits: 8, group_size: 64 }));
    }

    #[test]
    fn quantization_the_graphs_cannot_honour_is_refused() {
        for (json, why) in [
            (r#"{"quantization": {"group_size": 64, "bits": 3}}"#, "3-bit quantization is not implemented"),
            (
                r#"{"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}}"#,
                "mode \"mxfp4\" is not implemented",
            ),
            (r#"{"quantization": {"group_size": 0, "bits": 4}}"#, "group_size is 0"),
            (r#"{"quantization": {"bits": 4}}"#, "needs integer `bits` and `group_size`"),
            (
                r#"{"quantization": {"group_size": 64, "bits": 4, "x": {"bits": 5, "group_size": 64}}}"#,
                "module `x`: 5-bit",
            ),
            (r#"{"quantization": {"group_size": 64, "bits": 4, "x": 7}}"#, "entry `x` = 7 is not understood"),
            (
                r#"{"quantization": {"group_size": 64, "bits": 4}, "quantization_config": {"group_size": 32, "bits": 4}}"#,
                "differ",
            ),
            (r#"{"quantization_config": {"quant_method": "gptq", "bits": 4}}"#, "method \"gptq\" is not implemented"),
        ] {
            let err = quant(json).expect_err(json);
            assert!(err.contains(why), "{json}: {err}");
        }
    }

    #[test]
    fn an_affine_linear_is_checked_against_its_packed_shape() {
        let q4 = Quantization { bits: 4, group_size: 32 };
        let affine = |q: Option<Quantization>| Linear::Affine {
            weight: "w.weight".into(),
            scales: "w.scales".into(),
            biases: "w.biases".into(),
            quantization: q,
        };
        let good = index(&[("w.weight", "U32", &[8, 8]), ("w.scales", "BF16", &[8, 2]), ("w.biases", "BF16", &[8, 2])]);
        assert_eq!(
            check_affine(&good, &affine(Some(q4)), 8, 64),
            Ok(AffineLayout { quantization: q4, scales: Elem::BF16 })
        );
        let none = check_affine(&good, &affine(None), 8, 64).expect_err("no parameters");
        assert!(none[0].contains("gives this module no quantization parameters"), "{none:?}");
        let odd = check_affine(&good, &affine(Some(Quantization { bits: 4, group_size: 48 })), 8, 64).expect_err("48");
        assert!(odd[0].contains("do not divide into groups of 48"), "{odd:?}");
        let bad = index(&[("w.weight", "U32", &[8, 16]), ("w.scales", "F32", &[8, 2]), ("w.biases", "BF16", &[8, 2])]);
        let found = check_affine(&bad, &affine(Some(q4)), 8, 64).expect_err("bad");
        assert_eq!(
            found,
            [
                "`w.weight` has shape [8, 16]; 4-bit groups of 32 over a [8, 64] weight need [8, 8]",
                "`w.scales` is F32 but `w.biases` is BF16",
            ]
        );
    }
}
