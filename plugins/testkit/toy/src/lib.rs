//! A tiny fake VLM family ("toy") that the plugin-api test fixtures export under different
//! names, versions and failure modes.
//!
//! It behaves like a small real family so the loader tests exercise every entry: `<image>`
//! placeholders expand to `<boi>` + `<img>` x n + `<eoi>`, RGB pixels are normalized and cut
//! into `patch_size` patches, the encoder is one projection read from the checkpoint, and the
//! contract scales text by `sqrt(hidden)` and makes each image block bidirectional (as Gemma3).

#![forbid(unsafe_code)]

use std::marker::PhantomData;

use mlxcel_plugin_api::decoder::{self, DecoderSpec, presets};
use mlxcel_plugin_api::{
    AttentionMask, Capability, CheckpointIndex, CheckpointReport, ConfigSummary, ContractRequest, DType,
    EncoderCompute, EncoderGraph, EncoderGraphRequest, EncoderTarget, FamilyPlugin, ItemLayout, LayoutRequest,
    MediaGrid, MediaItem, Modality, ParsedConfig, PluginError, PluginIdentity, Positions, PrefillProgram,
    PreprocessOptions, Preprocessed, ProgramPlacement, PromptLayout, RString, RVec, ShapeBucket, SpecialToken, Tensor,
    TensorSpec,
};
use serde::{Deserialize, Serialize};

/// The toy plugin's own version, written into every fixture manifest.
pub const VERSION: &str = "0.3.1";

/// The prompt placeholder for one image.
pub const PLACEHOLDER: &str = "<image>";

/// Patch counts the toy encoder can be compiled for.
pub const BUCKETS: [u64; 3] = [4, 16, 64];

/// What distinguishes one fixture from another.
pub trait Variant: 'static {
    /// Plugin name.
    const NAME: &'static str;
    /// The accepted HF architecture.
    const ARCHITECTURE: &'static str;
    /// The accepted HF model type.
    const MODEL_TYPE: &'static str;
    /// Panic in `identity`: a plugin that cannot even introduce itself.
    const PANIC_IN_IDENTITY: bool = false;
    /// Panic in `preprocess` for images of this width.
    const PANIC_ON_WIDTH: Option<u32> = None;
    /// Leave image blocks causal in the prefill contract: a deliberately wrong answer for the
    /// conformance kit to catch.
    const CAUSAL_IMAGE_BLOCKS: bool = false;
}

/// The toy family under the identity of `V`.
#[derive(Debug)]
pub struct Toy<V>(PhantomData<V>);

/// The toy's typed config: `config.json` plus the processor config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToyConfig {
    /// HF model type.
    pub model_type: String,
    /// First HF architecture.
    pub architecture: String,
    /// Text hidden size.
    pub hidden_size: u32,
    /// Patch edge in pixels.
    pub patch_size: u32,
    /// `<img>` token id.
    pub image_token_id: u32,
    /// `<boi>` token id.
    pub boi_token_id: u32,
    /// `<eoi>` token id.
    pub eoi_token_id: u32,
    /// Per-channel mean.
    pub image_mean: [f32; 3],
    /// Per-channel std.
    pub image_std: [f32; 3],
}

#[derive(Deserialize)]
struct RawConfig {
    model_type: String,
    #[serde(default)]
    architectures: Vec<String>,
    hidden_size: u32,
    patch_size: u32,
    image_token_id: u32,
    boi_token_id: u32,
    eoi_token_id: u32,
}

#[derive(Deserialize)]
struct RawProcessor {
    #[serde(default = "half")]
    image_mean: [f32; 3],
    #[serde(default = "half")]
    image_std: [f32; 3],
}

fn half() -> [f32; 3] {
    [0.5; 3]
}

fn strings(values: &[&str]) -> RVec<RString> {
    values.iter().map(|s| RString::from(*s)).collect()
}

impl<V: Variant> FamilyPlugin for Toy<V> {
    type Config = ToyConfig;

    fn identity() -> PluginIdentity {
        if V::PANIC_IN_IDENTITY {
            panic!("identity is broken in this fixture");
        }
        PluginIdentity {
            name: V::NAME.into(),
            version: VERSION.into(),
            architectures: strings(&[V::ARCHITECTURE]),
            model_types: strings(&[V::MODEL_TYPE]),
            modalities: RVec::from(vec![Modality::Image]),
            capabilities: RVec::from(vec![Capability::Image, Capability::MultiImage]),
            references: strings(&["https://example.invalid/toy-vl@0000000"]),
        }
    }

    fn parse_config(config_json: &str, processor_json: &str) -> Result<ParsedConfig<ToyConfig>, PluginError> {
        let raw: RawConfig =
            serde_json::from_str(config_json).map_err(|e| PluginError::invalid(format!("config.json: {e}")))?;
        if raw.model_type != V::MODEL_TYPE {
            return Err(PluginError::invalid(format!("model_type `{}` is not `{}`", raw.model_type, V::MODEL_TYPE)));
        }
        if raw.patch_size == 0 || raw.hidden_size == 0 {
            return Err(PluginError::invalid("patch_size and hidden_size must be positive"));
        }
        let processor: RawProcessor = if processor_json.trim().is_empty() {
            RawProcessor { image_mean: half(), image_std: half() }
        } else {
            serde_json::from_str(processor_json)
                .map_err(|e| PluginError::invalid(format!("preprocessor_config.json: {e}")))?
        };
        let config = ToyConfig {
            model_type: raw.model_type,
            architecture: raw.architectures.first().cloned().unwrap_or_default(),
            hidden_size: raw.hidden_size,
            patch_size: raw.patch_size,
            image_token_id: raw.image_token_id,
            boi_token_id: raw.boi_token_id,
            eoi_token_id: raw.eoi_token_id,
            image_mean: processor.image_mean,
            image_std: processor.image_std,
        };
        let token = |role: &str, id| SpecialToken { role: role.into(), id };
        let summary = ConfigSummary {
            model_type: config.model_type.as_str().into(),
            architecture: config.architecture.as_str().into(),
            modalities: RVec::from(vec![Modality::Image]),
            text_hidden_size: config.hidden_size,
            special_tokens: RVec::from(vec![
                token("image", config.image_token_id),
                token("boi", config.boi_token_id),
                token("eoi", config.eoi_token_id),
            ]),
        };
        Ok(ParsedConfig { summary, config })
    }

    fn prompt_layout(config: &ToyConfig, request: &LayoutRequest) -> Result<PromptLayout, PluginError> {
        let block = |tokens: u32| format!("<boi>{}<eoi>", "<img>".repeat(tokens as usize));
        let items: Vec<ItemLayout> = request
            .items
            .iter()
            .map(|item| ItemLayout {
                feature_token_id: config.image_token_id,
                feature_tokens: item.grid.feature_tokens,
                expansion: block(item.grid.feature_tokens).into(),
            })
            .collect();
        let placeholders = request.prompt.matches(PLACEHOLDER).count();
        let text = if placeholders == 0 {
            // A bare prompt: the images go first, as the toy's processor does.
            let blocks: String = items.iter().map(|i| i.expansion.to_string()).collect();
            format!("{blocks}{}", request.prompt)
        } else if placeholders == items.len() {
            let mut parts = request.prompt.split(PLACEHOLDER);
            let mut text = parts.next().unwrap_or_default().to_owned();
            for (item, rest) in items.iter().zip(parts) {
                text.push_str(&item.expansion);
                text.push_str(rest);
            }
            text
        } else {
            return Err(PluginError::invalid(format!(
                "prompt has {placeholders} `{PLACEHOLDER}` placeholders for {} images",
                items.len()
            )));
        };
        Ok(PromptLayout { text: text.into(), items: items.into() })
    }

    fn preprocess(
        config: &ToyConfig,
        item: &MediaItem,
        options: &PreprocessOptions,
    ) -> Result<Preprocessed, PluginError> {
        let MediaItem::Rgb8 { width, height, pixels } = item else {
            return Err(PluginError::unsupported("the toy family takes decoded RGB images only"));
        };
        let (width, height) = (*width, *height);
        if Some(width) == V::PANIC_ON_WIDTH {
            panic!("preprocess cannot handle width {width}");
        }
        let p = config.patch_size;
        if width < p || height < p || width % p != 0 || height % p != 0 {
            return Err(PluginError::invalid(format!(
                "image {width}x{height} is not a positive multiple of the {p}-pixel patch"
            )));
        }
        let total = u64::from(width) * u64::from(height);
        if let Some(max) = options.max_pixels.into_option()
            && total > max
        {
            return Err(PluginError::too_large(format!("image has {total} pixels, more than {max}")));
        }
        if pixels.len() as u64 != total * 3 {
            return Err(PluginError::invalid(format!("{} bytes for a {width}x{height} rgb image", pixels.len())));
        }
        let (gh, gw) = (height / p, width / p);
        let mut values = Vec::with_capacity(pixels.len());
        for py in 0..gh {
            for px in 0..gw {
                for c in 0..3 {
                    for y in 0..p {
                        for x in 0..p {
                            let index = (((py * p + y) * width + px * p + x) * 3 + c) as usize;
                            let v = f32::from(pixels[index]) / 255.0;
                            values.push((v - config.image_mean[c as usize]) / config.image_std[c as usize]);
                        }
                    }
                }
            }
        }
        let patches = u64::from(gh * gw);
        let tensor = Tensor::from_f32("pixel_values", &[patches, u64::from(3 * p * p)], &values)?;
        Ok(Preprocessed {
            tensors: RVec::from(vec![tensor]),
            grid: MediaGrid { dims: RVec::from(vec![gh, gw]), feature_tokens: gh * gw },
        })
    }

    fn encoder_buckets(config: &ToyConfig, modality: Modality) -> Result<Vec<ShapeBucket>, PluginError> {
        if modality != Modality::Image {
            return Err(PluginError::unsupported(format!("no {} encoder", modality.as_str())));
        }
        let width = u64::from(3 * config.patch_size * config.patch_size);
        Ok(BUCKETS
            .iter()
            .map(|&n| ShapeBucket {
                id: format!("patches-{n}").into(),
                inputs: RVec::from(vec![TensorSpec::new("pixel_values", DType::F32, &[n, width])]),
            })
            .collect())
    }

    /// The graph names the target it was asked for in a comment, so a test sees which entry
    /// the host went through.
    fn encoder_graph(
        config: &ToyConfig,
        request: &EncoderGraphRequest,
        target: &EncoderTarget,
        compute: EncoderCompute,
    ) -> Result<EncoderGraph, PluginError> {
        if compute != EncoderCompute::F32 {
            return Err(PluginError::unsupported(format!(
                "the toy encoder computes in f32 only, not in {}",
                compute.name()
            )));
        }
        let n: u64 = request
            .bucket
            .strip_prefix("patches-")
            .and_then(|n| n.parse().ok())
            .filter(|n| BUCKETS.contains(n))
            .ok_or_else(|| PluginError::unsupported(format!("no bucket `{}`", request.bucket)))?;
        let k = u64::from(3 * config.patch_size * config.patch_size);
        let h = u64::from(config.hidden_size);
        let vectors = target.vector_bits().map_or("unknown".to_owned(), |bits| format!("{bits}-bit"));
        let stablehlo = format!(
            "// laid out for {vectors} vectors\nmodule @toy_encoder {{\n  \
             util.global private @proj = #flow.parameter.named<\"model\"::\"vision.proj.weight\"> : tensor<{k}x{h}xf32>\n  \
             func.func @main(%pixels: tensor<{n}x{k}xf32>) -> tensor<{n}x{h}xf32> {{\n    \
             %w = util.global.load @proj : tensor<{k}x{h}xf32>\n    \
             %0 = stablehlo.dot_general %pixels, %w, contracting_dims = [1] x [0] : (tensor<{n}x{k}xf32>, tensor<{k}x{h}xf32>) -> tensor<{n}x{h}xf32>\n    \
             return %0 : tensor<{n}x{h}xf32>\n  }}\n}}\n"
        );
        Ok(EncoderGraph {
            bucket: request.bucket.clone(),
            stablehlo: stablehlo.into(),
            entry_function: "main".into(),
            parameter_scope: "model".into(),
            parameters: RVec::from(vec![TensorSpec::new("vision.proj.weight", DType::F32, &[k, h])]),
            inputs: RVec::from(vec![TensorSpec::new("pixel_values", DType::F32, &[n, k])]),
            outputs: RVec::from(vec![TensorSpec::new("features", DType::F32, &[n, h])]),
        })
    }

    fn prefill_program(config: &ToyConfig, request: &ContractRequest) -> Result<PrefillProgram, PluginError> {
        let ids = request.token_ids.as_slice();
        let mut runs = Vec::new();
        let mut start = None;
        for (i, &id) in ids.iter().chain(std::iter::once(&u32::MAX)).enumerate() {
            match (id == config.image_token_id, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    runs.push((s, i - s));
                    start = None;
                }
                _ => {}
            }
        }
        if runs.len() != request.items.len() {
            return Err(PluginError::invalid(format!(
                "{} image token runs for {} images",
                runs.len(),
                request.items.len()
            )));
        }
        let mut placements = Vec::new();
        let mut mask = AttentionMask::causal();
        for (index, (&(start, len), item)) in runs.iter().zip(request.items.iter()).enumerate() {
            if len as u32 != item.grid.feature_tokens {
                return Err(PluginError::invalid(format!(
                    "image {index} has {len} tokens but {} features",
                    item.grid.feature_tokens
                )));
            }
            placements.push(ProgramPlacement::replace_span(index as u32, "features", start as u32, len as u32));
            if !V::CAUSAL_IMAGE_BLOCKS {
                mask = mask.with_bidirectional(start as u32, len as u32);
            }
        }
        Ok(PrefillProgram {
            text_scale: (config.hidden_size as f32).sqrt(),
            placements: placements.into(),
            positions: Positions::sequential(ids.len() as u32),
            mask,
            injections: RVec::new(),
        })
    }

    fn check_checkpoint(config: &ToyConfig, index: &CheckpointIndex) -> Result<CheckpointReport, PluginError> {
        let k = u64::from(3 * config.patch_size * config.patch_size);
        let want = TensorSpec::new("vision.proj.weight", DType::F32, &[k, u64::from(config.hidden_size)]);
        let problems = match index.tensors.iter().find(|t| t.name == want.name) {
            None => vec![RString::from("missing tensor `vision.proj.weight`")],
            Some(t) if t.shape != want.shape || t.dtype != want.dtype => {
                vec![RString::from(format!(
                    "`vision.proj.weight` is {} {:?}, expected {} {:?}",
                    t.dtype.as_str(),
                    t.shape.as_slice(),
                    want.dtype.as_str(),
                    want.shape.as_slice()
                ))]
            }
            Some(_) => Vec::new(),
        };
        Ok(CheckpointReport { problems: problems.into() })
    }

    fn decoder_spec(_config: &ToyConfig) -> Result<Option<DecoderSpec>, PluginError> {
        Ok(Some(toy_decoder()))
    }
}

/// The toy's own text decoder (since plugin-api 1.2): Llama's blocks with q/k norms, reading
/// `toy_text` configs.
pub fn toy_decoder() -> DecoderSpec {
    let llama = presets::llama();
    DecoderSpec {
        name: "toy_text".into(),
        model_types: vec!["toy_text".into()],
        attention: decoder::spec::Attention { qk_norm: true, ..llama.attention },
        ..llama
    }
}
