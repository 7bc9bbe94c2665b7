//! The typed view of a Gemma3 checkpoint: `config.json` (the SigLIP vision tower, the projector's
//! token count, the text model's width, the image token ids) and the image processor config.
//!
//! Token ids are read under both names transformers accepts (`image_token_index` or
//! `image_token_id`, likewise `boi_`/`eoi_`); the processor config nested under
//! `image_processor` (`processor_config.json`, transformers 5) or flat
//! (`preprocessor_config.json`). Absent keys take the defaults of `Gemma3Config`,
//! `SiglipVisionConfig`, `Gemma3Processor` and `Gemma3ImageProcessor`.

use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// A non-negative integer at `key`, `default` when absent or null.
fn uint(v: &Value, key: &str, default: u64, what: &str) -> Result<u64, PluginError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x.as_u64().ok_or_else(|| invalid(format!("{what}.{key}: not a non-negative integer: {x}"))),
    }
}

fn small(x: u64, what: &str) -> Result<u32, PluginError> {
    u32::try_from(x).map_err(|_| invalid(format!("{what} {x} does not fit u32")))
}

fn triple(v: Option<&Value>, default: [f64; 3], what: &str) -> Result<[f32; 3], PluginError> {
    let v = match v {
        None | Some(Value::Null) => return Ok(default.map(|x| x as f32)),
        Some(v) => v,
    };
    if let Some(x) = v.as_f64() {
        return Ok([x as f32; 3]);
    }
    let values: Option<Vec<f32>> = v.as_array().map(|a| a.iter().filter_map(Value::as_f64).map(|x| x as f32).collect());
    match values {
        Some(values) if values.len() == 3 => Ok([values[0], values[1], values[2]]),
        _ => Err(invalid(format!("{what}: expected three numbers, got {v}"))),
    }
}

impl Gemma3Config {
    /// Parses `config.json` and the processor config (empty: the processor's defaults).
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let root: Value = serde_json::from_str(config_json).map_err(|e| invalid(format!("config.json: {e}")))?;
        let model_type = root.get("model_type").and_then(Value::as_str).unwrap_or_default().to_owned();
        let architecture = root.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str);
        let architecture = architecture.unwrap_or_default().to_owned();
        let text = root.get("text_config").ok_or_else(|| invalid("config.json: no text_config"))?;
        let hidden = text.get("hidden_size").and_then(Value::as_u64);
        let text_hidden_size =
            small(hidden.ok_or_else(|| invalid("config.json: no text_config.hidden_size"))?, "hidden_size")?;
        // `image_token_index` is the config's own name; `image_token_id` its attribute alias.
        let token = |names: [&str; 2], default: u64| -> Result<u32, PluginError> {
            match names.iter().find_map(|k| root.get(*k).filter(|v| !v.is_null())) {
                None => small(default, names[0]),
                Some(v) => small(
                    v.as_u64().ok_or_else(|| invalid(format!("config.json: {} is not an id: {v}", names[0])))?,
                    names[0],
                ),
            }
        };
        let mm_tokens_per_image =
            small(uint(&root, "mm_tokens_per_image", 256, "config.json")?, "mm_tokens_per_image")?;

        let v = root.get("vision_config").ok_or_else(|| invalid("config.json: no vision_config"))?;
        let what = "vision_config";
        if let Some(kind) = v.get("model_type").and_then(Value::as_str)
            && kind != "siglip_vision_model"
        {
            return Err(unsupported(format!("vision_config.model_type `{kind}` (gemma3 takes a siglip_vision_model)")));
        }
        let act = v.get("hidden_act").and_then(Value::as_str).unwrap_or("gelu_pytorch_tanh");
        if act != "gelu_pytorch_tanh" {
            return Err(unsupported(format!(
                "vision_config.hidden_act `{act}` (the tower is built for gelu_pytorch_tanh)"
            )));
        }
        let size =
            |key: &str, default: u64| -> Result<usize, PluginError> { Ok(uint(v, key, default, what)? as usize) };
        let vision = VisionConfig {
            hidden_size: size("hidden_size", 768)?,
            intermediate_size: size("intermediate_size", 3072)?,
            num_hidden_layers: size("num_hidden_layers", 12)?,
            num_attention_heads: size("num_attention_heads", 12)?,
            num_channels: size("num_channels", 3)?,
            image_size: size("image_size", 224)?,
            patch_size: size("patch_size", 16)?,
            layer_norm_eps: v.get("layer_norm_eps").and_then(Value::as_f64).unwrap_or(1e-6),
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
            model_type,
            architecture,
            text_hidden_size,
            mm_tokens_per_image,
            image_token_id: token(["image_token_index", "image_token_id"], 262_144)?,
            boi_token_id: token(["boi_token_index", "boi_token_id"], 255_999)?,
            eoi_token_id: token(["eoi_token_index", "eoi_token_id"], 256_000)?,
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
        let root: Value = if json.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(json).map_err(|e| invalid(format!("processor config: {e}")))?
        };
        let p = root.get("image_processor").unwrap_or(&root);
        let what = "processor config";
        let flag = |key: &str, default: bool| match p.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(invalid(format!("{what}: {key} is not a boolean: {other}"))),
        };
        if flag("do_pan_and_scan", false)? {
            return Err(unsupported(
                "do_pan_and_scan: true (pan-and-scan crops are not implemented; set it to false in the processor config)",
            ));
        }
        if let Some(kind) = p.get("image_processor_type").and_then(Value::as_str)
            && !kind.starts_with("Gemma3ImageProcessor")
        {
            return Err(unsupported(format!("image_processor_type `{kind}` (gemma3 takes Gemma3ImageProcessor)")));
        }
        // Gemma3Processor expands each image to `image_seq_length` soft tokens; the projector makes
        // `mm_tokens_per_image` rows. They must agree or the reference itself refuses the prompt.
        let seq = uint(&root, "image_seq_length", u64::from(mm_tokens_per_image), what)?;
        if seq != u64::from(mm_tokens_per_image) {
            return Err(invalid(format!(
                "{what}: image_seq_length {seq} differs from config.json's mm_tokens_per_image {mm_tokens_per_image}"
            )));
        }
        let edge = vision.image_size as u64;
        let size = match p.get("size") {
            None | Some(Value::Null) => (224, 224),
            Some(s) => {
                let h = s.get("height").and_then(Value::as_u64);
                let w = s.get("width").and_then(Value::as_u64);
                match (h, w) {
                    (Some(h), Some(w)) => (small(h, "size.height")?, small(w, "size.width")?),
                    _ => {
                        return Err(unsupported(format!(
                            "{what}: size {s} (gemma3 resizes to a fixed height and width)"
                        )));
                    }
                }
            }
        };
        if u64::from(size.0) != edge || u64::from(size.1) != edge {
            return Err(invalid(format!(
                "{what}: images resize to {}x{} but the vision tower takes {edge}x{edge}",
                size.1, size.0
            )));
        }
        let rescale = p.get("rescale_factor").and_then(Value::as_f64).unwrap_or(1.0 / 255.0);
        let mean = triple(p.get("image_mean"), STANDARD_MEAN, "image_mean")?;
        let std = triple(p.get("image_std"), STANDARD_STD, "image_std")?;
        Ok(Self {
            size,
            resample: small(uint(p, "resample", u64::from(PIL_BILINEAR), what)?, "resample")?,
            do_resize: flag("do_resize", true)?,
            rescale_factor: flag("do_rescale", true)?.then_some(rescale),
            mean_std: flag("do_normalize", true)?.then_some((mean, std)),
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
