//! The typed view of a Qwen2-VL checkpoint: `config.json` (the vision tower, the text model's
//! width and M-RoPE sections, the special token ids) and the image processor config.
//!
//! Both layouts transformers writes are read: text fields under `text_config` with
//! `rope_parameters` (transformers 5), or at the top level with `rope_scaling` (4.x); the
//! processor config nested under `image_processor` (`processor_config.json`) or flat
//! (`preprocessor_config.json`), with the pixel bounds as `min_pixels`/`max_pixels` or
//! `size.shortest_edge`/`size.longest_edge`.

use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The processor's defaults in transformers (`Qwen2VLImageProcessor`), used for absent keys.
const DEFAULT_MIN_PIXELS: u64 = 56 * 56;
const DEFAULT_MAX_PIXELS: u64 = 28 * 28 * 1280;
/// OpenAI CLIP's mean and std as transformers writes them (Python floats, rounded to f32 by
/// numpy when normalising).
const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// Everything the family varies on, parsed once and handed back to every entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen2VlConfig {
    pub model_type: String,
    pub architecture: String,
    /// Width of the text decoder, which the merger projects to.
    pub text_hidden_size: u32,
    /// How the rotary half-dimension splits between t, h and w.
    pub mrope_section: Vec<u32>,
    pub image_token_id: u32,
    pub video_token_id: u32,
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
    pub vision: VisionConfig,
    pub processor: ProcessorConfig,
}

/// `vision_config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub depth: usize,
    pub embed_dim: usize,
    /// The merger's output width (the text model's hidden size).
    pub hidden_size: usize,
    pub num_heads: usize,
    pub mlp_ratio: f64,
    pub hidden_act: VisionAct,
    pub in_channels: usize,
    pub patch_size: usize,
    pub spatial_merge_size: usize,
    pub temporal_patch_size: usize,
    pub rope_theta: f64,
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.num_heads
    }

    /// `int(embed_dim * mlp_ratio)`, as the reference sizes the vision MLP.
    pub fn mlp_dim(&self) -> usize {
        (self.embed_dim as f64 * self.mlp_ratio) as usize
    }

    /// Values in one patch row: channels x frames x patch x patch.
    pub fn patch_width(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Patches merged into one feature row.
    pub fn merge_area(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }
}

/// The vision MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VisionAct {
    /// `x * sigmoid(1.702 x)` (Qwen2-VL's checkpoints).
    QuickGelu,
    /// Exact (erf) GELU.
    Gelu,
    /// The tanh approximation.
    GeluPytorchTanh,
    Silu,
}

/// The image processor's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessorConfig {
    pub min_pixels: u64,
    pub max_pixels: u64,
    pub patch_size: usize,
    pub merge_size: usize,
    pub temporal_patch_size: usize,
    /// Pillow resampling code (3: bicubic).
    pub resample: u32,
    pub do_resize: bool,
    pub rescale_factor: Option<f64>,
    pub mean_std: Option<([f32; 3], [f32; 3])>,
}

fn invalid(message: impl Into<String>) -> PluginError {
    PluginError::invalid(message)
}

fn get<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, key| v.get(key))
}

fn req_u64(v: &Value, path: &[&str], what: &str) -> Result<u64, PluginError> {
    get(v, path).and_then(Value::as_u64).ok_or_else(|| invalid(format!("{what}: missing or not an integer")))
}

fn opt_u64(v: &Value, path: &[&str], what: &str) -> Result<Option<u64>, PluginError> {
    match get(v, path) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(Some).ok_or_else(|| invalid(format!("{what}: not a non-negative integer: {x}"))),
    }
}

fn small(x: u64, what: &str) -> Result<u32, PluginError> {
    u32::try_from(x).map_err(|_| invalid(format!("{what} {x} does not fit u32")))
}

fn triple(v: Option<&Value>, default: [f64; 3], what: &str) -> Result<[f32; 3], PluginError> {
    let Some(v) = v else { return Ok(default.map(|x| x as f32)) };
    let values: Option<Vec<f32>> = v.as_array().map(|a| a.iter().filter_map(Value::as_f64).map(|x| x as f32).collect());
    match values {
        Some(values) if values.len() == 3 => Ok([values[0], values[1], values[2]]),
        _ => Err(invalid(format!("{what}: expected three numbers, got {v}"))),
    }
}

impl Qwen2VlConfig {
    /// Parses `config.json` and the processor config (empty: the processor's defaults).
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let root: Value = serde_json::from_str(config_json).map_err(|e| invalid(format!("config.json: {e}")))?;
        let model_type = root.get("model_type").and_then(Value::as_str).unwrap_or_default().to_owned();
        let architecture = root.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str);
        let architecture = architecture.unwrap_or_default().to_owned();
        let text = root.get("text_config").unwrap_or(&root);
        let hidden = text.get("hidden_size").or_else(|| root.get("hidden_size"));
        let text_hidden_size = small(
            hidden.and_then(Value::as_u64).ok_or_else(|| invalid("config.json: no text hidden_size"))?,
            "hidden_size",
        )?;
        let rope = ["rope_parameters", "rope_scaling"]
            .iter()
            .find_map(|k| text.get(*k).or_else(|| root.get(*k)).filter(|v| v.get("mrope_section").is_some()))
            .ok_or_else(|| invalid("config.json: no mrope_section in rope_parameters or rope_scaling"))?;
        let mrope_section = rope
            .get("mrope_section")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok())).collect::<Option<Vec<u32>>>())
            .and_then(|s| s.filter(|s| s.len() == 3))
            .ok_or_else(|| invalid("config.json: mrope_section must be three integers"))?;
        let token = |key: &str| -> Result<u32, PluginError> {
            let id = root.get(key).or_else(|| text.get(key)).and_then(Value::as_u64);
            small(id.ok_or_else(|| invalid(format!("config.json: no {key}")))?, key)
        };

        let v = root.get("vision_config").ok_or_else(|| invalid("config.json: no vision_config"))?;
        let vu = |key: &str| -> Result<usize, PluginError> {
            Ok(req_u64(v, &[key], &format!("vision_config.{key}"))? as usize)
        };
        let act = match v.get("hidden_act").and_then(Value::as_str).unwrap_or("quick_gelu") {
            "quick_gelu" => VisionAct::QuickGelu,
            "gelu" => VisionAct::Gelu,
            "gelu_pytorch_tanh" => VisionAct::GeluPytorchTanh,
            "silu" => VisionAct::Silu,
            other => return Err(PluginError::unsupported(format!("vision_config.hidden_act `{other}`"))),
        };
        let rope_theta = get(v, &["rope_parameters", "rope_theta"])
            .or_else(|| v.get("rope_theta"))
            .and_then(Value::as_f64)
            .unwrap_or(10000.0);
        let vision = VisionConfig {
            depth: vu("depth")?,
            embed_dim: vu("embed_dim")?,
            hidden_size: v.get("hidden_size").and_then(Value::as_u64).map_or(text_hidden_size as usize, |h| h as usize),
            num_heads: vu("num_heads")?,
            mlp_ratio: v.get("mlp_ratio").and_then(Value::as_f64).unwrap_or(4.0),
            hidden_act: act,
            in_channels: v.get("in_channels").and_then(Value::as_u64).unwrap_or(3) as usize,
            patch_size: vu("patch_size")?,
            spatial_merge_size: vu("spatial_merge_size")?,
            temporal_patch_size: vu("temporal_patch_size")?,
            rope_theta,
        };
        if vision.num_heads == 0
            || !vision.embed_dim.is_multiple_of(vision.num_heads)
            || !vision.head_dim().is_multiple_of(4)
        {
            return Err(invalid(format!(
                "vision_config: embed_dim {} must split into num_heads {} heads of a multiple of 4",
                vision.embed_dim, vision.num_heads
            )));
        }
        if vision.in_channels != 3 || vision.patch_size == 0 || vision.spatial_merge_size == 0 {
            return Err(invalid("vision_config: expected 3 input channels and non-zero patch and merge sizes"));
        }

        let processor = ProcessorConfig::parse(processor_json, &vision)?;
        if processor.patch_size != vision.patch_size
            || processor.merge_size != vision.spatial_merge_size
            || processor.temporal_patch_size != vision.temporal_patch_size
        {
            return Err(invalid("the processor's patch, merge or temporal size disagrees with vision_config"));
        }
        Ok(Self {
            model_type,
            architecture,
            text_hidden_size,
            mrope_section,
            image_token_id: token("image_token_id")?,
            video_token_id: token("video_token_id")?,
            vision_start_token_id: token("vision_start_token_id")?,
            vision_end_token_id: token("vision_end_token_id")?,
            vision,
            processor,
        })
    }
}

impl ProcessorConfig {
    fn parse(json: &str, vision: &VisionConfig) -> Result<Self, PluginError> {
        let root: Value = if json.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_json::from_str(json).map_err(|e| invalid(format!("processor config: {e}")))?
        };
        let p = root.get("image_processor").unwrap_or(&root);
        let bool_or = |key: &str, default: bool| p.get(key).and_then(Value::as_bool).unwrap_or(default);
        let min_pixels = opt_u64(p, &["min_pixels"], "min_pixels")?
            .or(opt_u64(p, &["size", "shortest_edge"], "size.shortest_edge")?)
            .unwrap_or(DEFAULT_MIN_PIXELS);
        let max_pixels = opt_u64(p, &["max_pixels"], "max_pixels")?
            .or(opt_u64(p, &["size", "longest_edge"], "size.longest_edge")?)
            .unwrap_or(DEFAULT_MAX_PIXELS);
        let size = |key: &str, default: usize| -> Result<usize, PluginError> {
            Ok(opt_u64(p, &[key], key)?.map_or(default, |x| x as usize))
        };
        let rescale = p.get("rescale_factor").and_then(Value::as_f64).unwrap_or(1.0 / 255.0);
        let mean = triple(p.get("image_mean"), CLIP_MEAN, "image_mean")?;
        let std = triple(p.get("image_std"), CLIP_STD, "image_std")?;
        if min_pixels > max_pixels {
            return Err(invalid(format!("min_pixels {min_pixels} exceeds max_pixels {max_pixels}")));
        }
        Ok(Self {
            min_pixels,
            max_pixels,
            patch_size: size("patch_size", vision.patch_size)?,
            merge_size: size("merge_size", vision.spatial_merge_size)?,
            temporal_patch_size: size("temporal_patch_size", vision.temporal_patch_size)?,
            resample: opt_u64(p, &["resample"], "resample")?.map_or(3, |r| r as u32),
            do_resize: bool_or("do_resize", true),
            rescale_factor: bool_or("do_rescale", true).then_some(rescale),
            mean_std: bool_or("do_normalize", true).then_some((mean, std)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixture_config;

    #[test]
    fn the_fixture_config_parses_with_every_field_the_family_needs() {
        let c = fixture_config();
        assert_eq!((c.model_type.as_str(), c.architecture.as_str()), ("qwen2_vl", "Qwen2VLForConditionalGeneration"));
        assert_eq!(c.text_hidden_size, 64);
        assert_eq!(c.mrope_section, [2, 3, 3]);
        assert_eq!(
            (c.image_token_id, c.video_token_id, c.vision_start_token_id, c.vision_end_token_id),
            (389, 390, 387, 388)
        );
        let v = &c.vision;
        assert_eq!(
            (v.depth, v.embed_dim, v.hidden_size, v.num_heads, v.head_dim(), v.mlp_dim()),
            (2, 32, 64, 2, 16, 64)
        );
        assert_eq!((v.patch_size, v.spatial_merge_size, v.temporal_patch_size, v.patch_width()), (14, 2, 2, 1176));
        assert_eq!(v.hidden_act, VisionAct::QuickGelu);
        let p = &c.processor;
        assert_eq!((p.min_pixels, p.max_pixels, p.resample), (3136, 12544, 3));
        assert_eq!(p.mean_std, Some((CLIP_MEAN.map(|x| x as f32), CLIP_STD.map(|x| x as f32))));
        assert_eq!(p.rescale_factor, Some(0.00392156862745098));
    }

    #[test]
    fn the_transformers_4_layout_and_a_flat_preprocessor_config_parse_too() {
        let config = r#"{"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"],
            "hidden_size": 1536, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
            "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 1536, "num_heads": 16,
              "mlp_ratio": 4, "hidden_act": "quick_gelu", "in_channels": 3, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2}}"#;
        let processor = r#"{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2,
            "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}"#;
        let c = Qwen2VlConfig::parse(config, processor).expect("parse");
        assert_eq!((c.text_hidden_size, c.mrope_section.as_slice()), (1536, &[16, 24, 24][..]));
        assert_eq!((c.vision.mlp_dim(), c.vision.rope_theta), (5120, 10000.0));
        assert_eq!((c.processor.min_pixels, c.processor.max_pixels), (3136, 12845056));
        assert_eq!(c.processor.mean_std, Some(([0.5; 3], [0.5; 3])));
    }

    #[test]
    fn a_config_without_the_family_fields_is_refused_by_name() {
        let err = Qwen2VlConfig::parse(r#"{"model_type": "qwen2_vl", "hidden_size": 8}"#, "").expect_err("refused");
        assert!(err.message.contains("mrope_section"), "{err}");
        let err = Qwen2VlConfig::parse("{", "").expect_err("refused");
        assert!(err.message.starts_with("config.json: "), "{err}");
    }
}
