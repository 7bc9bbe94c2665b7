//! The typed view of a Gemma3 checkpoint: `config.json` (the SigLIP vision tower, the projector's
//! token count, the text model's width, the image token ids) and the image processor config.
//!
//! Token ids are read under both names transformers accepts (`image_token_index` or
//! `image_token_id`, likewise `boi_`/`eoi_`); the processor config nested under
//! `image_processor` (`processor_config.json`, transformers 5) or flat
//! (`preprocessor_config.json`). Absent keys take the defaults of `Gemma3Config`,
//! `SiglipVisionConfig`, `Gemma3Processor` and `Gemma3ImageProcessor`.

use mlxcel_family_common::{Identity, Steps, WeightDtype, processor_section};
use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};

/// transformers' `IMAGENET_STANDARD_MEAN` and `_STD` (Gemma3ImageProcessor's defaults).
const STANDARD_MEAN: [f64; 3] = [0.5, 0.5, 0.5];
const STANDARD_STD: [f64; 3] = [0.5, 0.5, 0.5];
/// Pillow's bilinear filter, the processor's default `resample`.
const PIL_BILINEAR: u32 = 2;

/// Everything the family varies on, parsed once and handed back to every entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gemma3Config {
    pub model_type: String,
    pub architecture: String,
    /// The dtype the checkpoint stores its weights in; the encoder reads them so.
    pub weights: WeightDtype,
    /// Width of the text decoder, which the projector projects to.
    pub text_hidden_size: u32,
    /// Feature rows (and soft tokens) per image: the projector's pooled grid, squared.
    pub mm_tokens_per_image: u32,
    /// `<image_soft_token>`: the positions that receive the projected rows.
    pub image_token_id: u32,
    /// `<start_of_image>`: the placeholder the chat template renders, and the block's opener.
    pub boi_token_id: u32,
    /// `<end_of_image>`.
    pub eoi_token_id: u32,
    pub vision: VisionConfig,
    pub processor: ProcessorConfig,
}

/// `vision_config` (a SigLIP vision tower).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_channels: usize,
    /// The square input edge in pixels.
    pub image_size: usize,
    pub patch_size: usize,
    pub layer_norm_eps: f64,
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Patches along each side of the image.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patch rows of one image.
    pub fn patches(&self) -> usize {
        self.patches_per_side() * self.patches_per_side()
    }

    /// Values in one patch row: channels x patch x patch.
    pub fn patch_width(&self) -> usize {
        self.num_channels * self.patch_size * self.patch_size
    }
}

impl Gemma3Config {
    /// Pooled tokens along each side of the image (`int(mm_tokens_per_image ** 0.5)`).
    pub fn tokens_per_side(&self) -> usize {
        (self.mm_tokens_per_image as f64).sqrt() as usize
    }

    /// The average pool's kernel and stride, in patches.
    pub fn pool_kernel(&self) -> usize {
        self.vision.patches_per_side() / self.tokens_per_side()
    }

    /// The factor text embeddings are scaled by: `sqrt(hidden)` rounded to f32, exactly as the
    /// text model's `Gemma3TextScaledWordEmbedding` (and the host's decoder) computes it.
    pub fn text_scale(&self) -> f32 {
        f64::from(self.text_hidden_size).sqrt() as f32
    }
}

/// The image processor's settings (pan-and-scan refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessorConfig {
    /// The resized image, `(height, width)`.
    pub size: (u32, u32),
    /// Pillow resampling code (2: bilinear).
    pub resample: u32,
    pub do_resize: bool,
    pub rescale_factor: Option<f64>,
    pub mean_std: Option<([f32; 3], [f32; 3])>,
}

fn invalid(message: impl Into<String>) -> PluginError {
    PluginError::invalid(message)
}

fn unsupported(message: impl Into<String>) -> PluginError {
    PluginError::unsupported(message)
}

/// `config.json`. Each token id under the config's own name (`image_token_index`) or its
/// attribute alias (`image_token_id`); absent or null fields take transformers' defaults.
#[derive(Deserialize)]
struct RawConfig {
    #[serde(flatten)]
    identity: Identity,
    text_config: Option<RawText>,
    mm_tokens_per_image: Option<u32>,
    image_token_index: Option<u32>,
    image_token_id: Option<u32>,
    boi_token_index: Option<u32>,
    boi_token_id: Option<u32>,
    eoi_token_index: Option<u32>,
    eoi_token_id: Option<u32>,
    vision_config: Option<RawVision>,
}

#[derive(Deserialize)]
struct RawText {
    hidden_size: Option<u32>,
}

/// `vision_config`, with `SiglipVisionConfig`'s defaults for what is absent.
#[derive(Deserialize)]
struct RawVision {
    model_type: Option<String>,
    hidden_act: Option<String>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_channels: Option<usize>,
    image_size: Option<usize>,
    patch_size: Option<usize>,
    layer_norm_eps: Option<f64>,
}

/// `processor_config.json`'s own fields, beside its `image_processor`.
#[derive(Deserialize, Default)]
struct RawProcessorRoot {
    image_seq_length: Option<u64>,
}

/// The image processor's fields.
#[derive(Deserialize, Default)]
struct RawProcessor {
    do_pan_and_scan: Option<bool>,
    image_processor_type: Option<String>,
    size: Option<RawSize>,
    resample: Option<u32>,
    #[serde(flatten)]
    steps: Steps,
}

#[derive(Deserialize, Debug)]
struct RawSize {
    height: Option<u32>,
    width: Option<u32>,
}

impl Gemma3Config {
    /// Parses `config.json` and the processor config (empty: the processor's defaults).
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let raw: RawConfig = serde_json::from_str(config_json).map_err(|e| invalid(format!("config.json: {e}")))?;
        let text = raw.text_config.as_ref().ok_or_else(|| invalid("config.json: no text_config"))?;
        let text_hidden_size = text.hidden_size.ok_or_else(|| invalid("config.json: no text_config.hidden_size"))?;
        let mm_tokens_per_image = raw.mm_tokens_per_image.unwrap_or(256);

        let v = raw.vision_config.as_ref().ok_or_else(|| invalid("config.json: no vision_config"))?;
        if let Some(kind) = v.model_type.as_deref()
            && kind != "siglip_vision_model"
        {
            return Err(unsupported(format!("vision_config.model_type `{kind}` (gemma3 takes a siglip_vision_model)")));
        }
        let act = v.hidden_act.as_deref().unwrap_or("gelu_pytorch_tanh");
        if act != "gelu_pytorch_tanh" {
            return Err(unsupported(format!(
                "vision_config.hidden_act `{act}` (the tower is built for gelu_pytorch_tanh)"
            )));
        }
        let vision = VisionConfig {
            hidden_size: v.hidden_size.unwrap_or(768),
            intermediate_size: v.intermediate_size.unwrap_or(3072),
            num_hidden_layers: v.num_hidden_layers.unwrap_or(12),
            num_attention_heads: v.num_attention_heads.unwrap_or(12),
            num_channels: v.num_channels.unwrap_or(3),
            image_size: v.image_size.unwrap_or(224),
            patch_size: v.patch_size.unwrap_or(16),
            layer_norm_eps: v.layer_norm_eps.unwrap_or(1e-6),
        };
        if vision.num_attention_heads == 0 || !vision.hidden_size.is_multiple_of(vision.num_attention_heads) {
            return Err(invalid(format!(
                "vision_config: hidden_size {} does not split into num_attention_heads {} heads",
                vision.hidden_size, vision.num_attention_heads
            )));
        }
        if vision.num_channels != 3 {
            return Err(invalid(format!("vision_config: {} input channels; images are rgb", vision.num_channels)));
        }
        if vision.patch_size == 0 || vision.image_size == 0 || !vision.image_size.is_multiple_of(vision.patch_size) {
            return Err(invalid(format!(
                "vision_config: image_size {} is not a whole number of {}-pixel patches",
                vision.image_size, vision.patch_size
            )));
        }

        let config = Self {
            model_type: raw.identity.model_type.clone(),
            architecture: raw.identity.architecture(),
            weights: raw.identity.weight_dtype().map_err(invalid)?,
            text_hidden_size,
            mm_tokens_per_image,
            image_token_id: raw.image_token_index.or(raw.image_token_id).unwrap_or(262_144),
            boi_token_id: raw.boi_token_index.or(raw.boi_token_id).unwrap_or(255_999),
            eoi_token_id: raw.eoi_token_index.or(raw.eoi_token_id).unwrap_or(256_000),
            processor: ProcessorConfig::parse(processor_json, &vision, mm_tokens_per_image)?,
            vision,
        };
        // The projector pools the patch grid to `tokens_per_side` squared with a square kernel.
        let side = config.tokens_per_side();
        let patches = config.vision.patches_per_side();
        if side == 0 || side * side != mm_tokens_per_image as usize || !patches.is_multiple_of(side) {
            return Err(invalid(format!(
                "mm_tokens_per_image {mm_tokens_per_image} must be a square whose side divides the {patches} patches \
                 per side of the image"
            )));
        }
        Ok(config)
    }
}

impl ProcessorConfig {
    fn parse(json: &str, vision: &VisionConfig, mm_tokens_per_image: u32) -> Result<Self, PluginError> {
        let what = "processor config";
        let read = |e: serde_json::Error| invalid(format!("{what}: {e}"));
        let p: RawProcessor = processor_section(json).map_err(read)?;
        let root: RawProcessorRoot = if json.trim().is_empty() {
            RawProcessorRoot::default()
        } else {
            serde_json::from_str(json).map_err(read)?
        };
        if p.do_pan_and_scan == Some(true) {
            return Err(unsupported(
                "do_pan_and_scan: true (pan-and-scan crops are not implemented; set it to false in the processor config)",
            ));
        }
        if let Some(kind) = p.image_processor_type.as_deref()
            && !kind.starts_with("Gemma3ImageProcessor")
        {
            return Err(unsupported(format!("image_processor_type `{kind}` (gemma3 takes Gemma3ImageProcessor)")));
        }
        // Gemma3Processor expands each image to `image_seq_length` soft tokens; the projector makes
        // `mm_tokens_per_image` rows. They must agree or the reference itself refuses the prompt.
        let seq = root.image_seq_length.unwrap_or(u64::from(mm_tokens_per_image));
        if seq != u64::from(mm_tokens_per_image) {
            return Err(invalid(format!(
                "{what}: image_seq_length {seq} differs from config.json's mm_tokens_per_image {mm_tokens_per_image}"
            )));
        }
        let edge = vision.image_size as u64;
        let size = match &p.size {
            None => (224, 224),
            Some(RawSize { height: Some(h), width: Some(w) }) => (*h, *w),
            Some(other) => {
                return Err(unsupported(format!(
                    "{what}: size {other:?} (gemma3 resizes to a fixed height and width)"
                )));
            }
        };
        if u64::from(size.0) != edge || u64::from(size.1) != edge {
            return Err(invalid(format!(
                "{what}: images resize to {}x{} but the vision tower takes {edge}x{edge}",
                size.1, size.0
            )));
        }
        Ok(Self {
            size,
            resample: p.resample.unwrap_or(PIL_BILINEAR),
            do_resize: p.steps.resize(),
            rescale_factor: p.steps.rescale(),
            mean_std: p.steps.normalize(STANDARD_MEAN, STANDARD_STD),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixture_config, fixture_json};

    #[test]
    fn the_fixture_config_parses_with_every_field_the_family_needs() {
        let c = fixture_config();
        assert_eq!((c.model_type.as_str(), c.architecture.as_str()), ("gemma3", "Gemma3ForConditionalGeneration"));
        assert_eq!((c.text_hidden_size, c.mm_tokens_per_image), (64, 16));
        assert_eq!((c.boi_token_id, c.image_token_id, c.eoi_token_id), (390, 392, 391));
        let v = &c.vision;
        assert_eq!(
            (v.hidden_size, v.intermediate_size, v.num_hidden_layers, v.num_attention_heads, v.head_dim()),
            (32, 64, 2, 2, 16)
        );
        assert_eq!(
            (v.image_size, v.patch_size, v.patches_per_side(), v.patches(), v.patch_width()),
            (112, 14, 8, 64, 588)
        );
        assert_eq!(v.layer_norm_eps, 1e-6);
        assert_eq!((c.tokens_per_side(), c.pool_kernel()), (4, 2));
        assert_eq!(c.text_scale(), 8.0);
        let p = &c.processor;
        assert_eq!((p.size, p.resample, p.do_resize), ((112, 112), 2, true));
        assert_eq!(p.rescale_factor, Some(0.00392156862745098));
        assert_eq!(p.mean_std, Some(([0.5; 3], [0.5; 3])));
    }

    #[test]
    fn a_hub_layout_with_a_flat_preprocessor_config_parses() {
        // google/gemma-3-4b-it's shape: 896-pixel images, 256 soft tokens, a 4x4 pool.
        let config = r#"{"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
            "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
            "mm_tokens_per_image": 256, "text_config": {"hidden_size": 2560, "model_type": "gemma3_text"},
            "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
              "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
              "patch_size": 14, "vision_use_head": false}}"#;
        let processor = r#"{"do_pan_and_scan": null, "image_processor_type": "Gemma3ImageProcessor",
            "image_seq_length": 256, "resample": 2, "size": {"height": 896, "width": 896}}"#;
        let c = Gemma3Config::parse(config, processor).expect("parse");
        assert_eq!((c.vision.patches_per_side(), c.tokens_per_side(), c.pool_kernel()), (64, 16, 4));
        assert_eq!(c.text_scale(), (2560f64).sqrt() as f32);
        assert_eq!(c.processor.mean_std, Some(([0.5; 3], [0.5; 3])));
        assert_eq!(c.image_token_id, 262_144);
    }

    #[test]
    fn unsupported_and_inconsistent_configs_are_refused_by_name() {
        let (config, processor) = fixture_json();
        let pan = processor.replace("\"do_pan_and_scan\": false", "\"do_pan_and_scan\": true");
        let err = Gemma3Config::parse(&config, &pan).expect_err("pan and scan");
        assert_eq!(err.code, mlxcel_plugin_api::ErrorCode::Unsupported);
        assert!(err.message.contains("do_pan_and_scan"), "{err}");

        let seq = processor.replace("\"image_seq_length\": 16", "\"image_seq_length\": 9");
        let err = Gemma3Config::parse(&config, &seq).expect_err("seq length");
        assert!(err.message.contains("image_seq_length 9 differs"), "{err}");

        let size = processor.replace("\"height\": 112", "\"height\": 224");
        let err = Gemma3Config::parse(&config, &size).expect_err("size");
        assert!(err.message.contains("the vision tower takes 112x112"), "{err}");

        let tokens = config.replace("\"mm_tokens_per_image\": 16", "\"mm_tokens_per_image\": 9");
        let seq9 = processor.replace("\"image_seq_length\": 16", "\"image_seq_length\": 9");
        let err = Gemma3Config::parse(&tokens, &seq9).expect_err("pool");
        assert!(err.message.contains("mm_tokens_per_image 9 must be a square whose side divides"), "{err}");

        let act = config.replace("\"hidden_act\": \"gelu_pytorch_tanh\"", "\"hidden_act\": \"relu\"");
        assert_ne!(act, config, "the vision act was replaced");
        let err = Gemma3Config::parse(&act, &processor).expect_err("act");
        assert!(err.message.contains("hidden_act `relu`"), "{err}");

        let err = Gemma3Config::parse(r#"{"model_type": "gemma3"}"#, "").expect_err("no text config");
        assert!(err.message.contains("text_config"), "{err}");
        let err = Gemma3Config::parse("{", "").expect_err("not json");
        assert!(err.message.starts_with("config.json: "), "{err}");
    }
}
