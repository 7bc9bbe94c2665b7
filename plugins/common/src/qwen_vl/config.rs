//! What the Qwen-VL families' `config.json` and image processor config share: the text model's
//! width and M-RoPE sections, the special token ids, the patch geometry of `vision_config`, and
//! the processor's bounds and steps. Each family reads its own vision tower's fields beside this.
//!
//! Both layouts transformers writes are read: text fields under `text_config` with
//! `rope_parameters` (transformers 5), or at the top level with `rope_scaling` (4.x, the Hub's
//! checkpoints); the processor config nested under `image_processor` (`processor_config.json`)
//! or flat (`preprocessor_config.json`), with the pixel bounds as `min_pixels`/`max_pixels` or
//! `size.shortest_edge`/`size.longest_edge`.

use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};

use crate::{Identity, Steps, WeightDtype, processor_section};

/// The processor's defaults in transformers (`Qwen2VLImageProcessor`), used for absent keys.
const DEFAULT_MIN_PIXELS: u64 = 56 * 56;
const DEFAULT_MAX_PIXELS: u64 = 28 * 28 * 1280;
pub use crate::clip::{CLIP_MEAN, CLIP_STD};

/// The fields every Qwen-VL family varies on outside its vision tower.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QwenVl {
    pub model_type: String,
    pub architecture: String,
    /// The dtype the checkpoint stores its weights in; the encoder reads them so.
    pub weights: WeightDtype,
    /// Width of the text decoder, which the merger projects to.
    pub text_hidden_size: u32,
    /// How the rotary half-dimension splits between t, h and w.
    pub mrope_section: Vec<u32>,
    pub image_token_id: u32,
    pub video_token_id: u32,
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
    pub geometry: Geometry,
    pub processor: ProcessorConfig,
}

/// How `vision_config` cuts images into patch rows and merges them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    pub in_channels: usize,
    pub patch_size: usize,
    pub spatial_merge_size: usize,
    pub temporal_patch_size: usize,
}

impl Geometry {
    /// Values in one patch row: channels x frames x patch x patch.
    pub fn patch_width(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Patches merged into one feature row.
    pub fn merge_area(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }
}

/// What the shared pieces over merge-ordered patch rows read of a family's config: the
/// `<|image_pad|>` expansion ([`super::prompt`]) and the vision graphs' buckets and signature
/// ([`super::vision`]). [`QwenVl`] is the Qwen-VL families'; a family that takes Qwen-VL's patch
/// rows and placeholder with a config of its own (Youtu-VL, whose positions are not M-RoPE)
/// implements it too.
pub trait PatchRows {
    /// How images are cut into patch rows and merged.
    fn geometry(&self) -> &Geometry;
    /// The largest resized image the processor lets through, in pixels.
    fn max_pixels(&self) -> u64;
    /// The dtype the checkpoint stores the encoder's weights in.
    fn weights(&self) -> WeightDtype;
    /// The token each feature row replaces.
    fn image_token_id(&self) -> u32;
}

impl PatchRows for QwenVl {
    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn max_pixels(&self) -> u64 {
        self.processor.max_pixels
    }

    fn weights(&self) -> WeightDtype {
        self.weights
    }

    fn image_token_id(&self) -> u32 {
        self.image_token_id
    }
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

/// `config.json` as transformers writes it: the text fields under `text_config`
/// (transformers 5) or at the top (4.x), the special tokens at either level.
#[derive(Deserialize)]
struct RawConfig {
    #[serde(flatten)]
    identity: Identity,
    text_config: Option<RawText>,
    #[serde(flatten)]
    top: RawText,
    vision_config: Option<RawGeometry>,
}

#[derive(Deserialize)]
struct RawText {
    hidden_size: Option<u32>,
    rope_parameters: Option<RawRope>,
    rope_scaling: Option<RawRope>,
    image_token_id: Option<u32>,
    video_token_id: Option<u32>,
    vision_start_token_id: Option<u32>,
    vision_end_token_id: Option<u32>,
}

#[derive(Deserialize)]
struct RawRope {
    mrope_section: Option<Vec<u32>>,
}

/// The geometry fields of `vision_config` (the families' config classes share their names and
/// defaults; the Hub's `in_chans` beside them is an attribute transformers does not read).
#[derive(Deserialize)]
struct RawGeometry {
    #[serde(default = "default_channels")]
    in_channels: usize,
    #[serde(default = "default_patch")]
    patch_size: usize,
    #[serde(default = "default_two")]
    spatial_merge_size: usize,
    #[serde(default = "default_two")]
    temporal_patch_size: usize,
}

fn default_channels() -> usize {
    3
}

fn default_patch() -> usize {
    14
}

fn default_two() -> usize {
    2
}

/// The image processor config; the pixel bounds as `min_pixels`/`max_pixels` or
/// `size.shortest_edge`/`size.longest_edge`.
#[derive(Deserialize, Default)]
struct RawProcessor {
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
    size: Option<RawPixelBounds>,
    patch_size: Option<usize>,
    merge_size: Option<usize>,
    temporal_patch_size: Option<usize>,
    resample: Option<u32>,
    #[serde(flatten)]
    steps: Steps,
}

#[derive(Deserialize, Default)]
struct RawPixelBounds {
    shortest_edge: Option<u64>,
    longest_edge: Option<u64>,
}

/// `vision_config.rope_parameters` of the towers whose rotary embedding is axial (Qwen2.5-VL,
/// Qwen3-VL), as a family's serde mirror reads it.
#[derive(Deserialize, Debug, Default)]
pub struct VisionRope {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
}

impl VisionRope {
    /// The rotary theta (10000 when the config names none, transformers' default); a rope type
    /// other than the axial one is refused, as the reference refuses it.
    pub fn axial_theta(rope: Option<&VisionRope>) -> Result<f64, PluginError> {
        if let Some(kind) = rope.and_then(|r| r.rope_type.as_deref()).filter(|&k| k != "axial") {
            return Err(PluginError::unsupported(format!(
                "vision_config.rope_parameters.rope_type `{kind}` (the tower's rotary embedding is axial)"
            )));
        }
        Ok(rope.and_then(|r| r.rope_theta).unwrap_or(10000.0))
    }
}

/// A Qwen-VL vision MLP's activation (`vision_config.hidden_act`): Qwen2-VL's checkpoints use
/// `quick_gelu`, Qwen2.5-VL's `silu`, Qwen3-VL's `gelu_pytorch_tanh`; each family reads any of
/// them, as the reference's `ACT2FN` does. Another name is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VisionAct {
    /// `x * sigmoid(1.702 x)`.
    QuickGelu,
    /// Exact (erf) GELU.
    Gelu,
    /// The tanh approximation.
    GeluPytorchTanh,
    Silu,
}

impl VisionAct {
    pub fn parse(name: &str) -> Result<Self, PluginError> {
        match name {
            "quick_gelu" => Ok(VisionAct::QuickGelu),
            "gelu" => Ok(VisionAct::Gelu),
            "gelu_pytorch_tanh" => Ok(VisionAct::GeluPytorchTanh),
            "silu" => Ok(VisionAct::Silu),
            other => Err(PluginError::unsupported(format!("vision_config.hidden_act `{other}`"))),
        }
    }

    /// The activation of `x`, in the contract's arithmetic.
    pub fn apply(
        self,
        c: mlxcel_emit::NumericContract,
        f: &mut mlxcel_emit::Func,
        x: &mlxcel_emit::Value,
    ) -> mlxcel_emit::Value {
        match self {
            VisionAct::QuickGelu => c.quick_gelu(f, x),
            VisionAct::Gelu => c.gelu_erf(f, x),
            VisionAct::GeluPytorchTanh => c.gelu_tanh(f, x),
            VisionAct::Silu => c.silu(f, x),
        }
    }
}

/// The tower's width must split into `heads` heads whose size is a multiple of 4 (the 2-D
/// rotary embedding halves each head, then halves each half into frequency pairs).
pub fn check_heads(width_key: &str, width: usize, heads: usize) -> Result<(), PluginError> {
    if heads == 0 || !width.is_multiple_of(heads) || !(width / heads).is_multiple_of(4) {
        return Err(invalid(format!(
            "vision_config: {width_key} {width} must split into num_heads {heads} heads of a multiple of 4"
        )));
    }
    Ok(())
}

impl QwenVl {
    /// Parses `config.json` and the processor config (empty: the processor's defaults).
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let raw: RawConfig = serde_json::from_str(config_json).map_err(|e| invalid(format!("config.json: {e}")))?;
        let text = raw.text_config.as_ref();
        // A field of the text model, under `text_config` or at the top.
        let pick = |f: fn(&RawText) -> Option<u32>| text.and_then(f).or(f(&raw.top));
        let text_hidden_size = pick(|t| t.hidden_size).ok_or_else(|| invalid("config.json: no text hidden_size"))?;
        let ropes = [
            text.and_then(|t| t.rope_parameters.as_ref()),
            text.and_then(|t| t.rope_scaling.as_ref()),
            raw.top.rope_parameters.as_ref(),
            raw.top.rope_scaling.as_ref(),
        ];
        let mrope_section = ropes
            .into_iter()
            .flatten()
            .find_map(|r| r.mrope_section.clone())
            .ok_or_else(|| invalid("config.json: no mrope_section in rope_parameters or rope_scaling"))?;
        if mrope_section.len() != 3 {
            return Err(invalid("config.json: mrope_section must be three integers"));
        }
        let token = |key: &str, f: fn(&RawText) -> Option<u32>| -> Result<u32, PluginError> {
            f(&raw.top).or_else(|| text.and_then(f)).ok_or_else(|| invalid(format!("config.json: no {key}")))
        };
        let g = raw.vision_config.as_ref().ok_or_else(|| invalid("config.json: no vision_config"))?;
        let geometry = Geometry {
            in_channels: g.in_channels,
            patch_size: g.patch_size,
            spatial_merge_size: g.spatial_merge_size,
            temporal_patch_size: g.temporal_patch_size,
        };
        if geometry.in_channels != 3
            || geometry.patch_size == 0
            || geometry.spatial_merge_size == 0
            || geometry.temporal_patch_size == 0
        {
            return Err(invalid(
                "vision_config: expected 3 input channels and non-zero patch, merge and temporal sizes",
            ));
        }
        let processor = ProcessorConfig::parse(processor_json, &geometry)?;
        if processor.patch_size != geometry.patch_size
            || processor.merge_size != geometry.spatial_merge_size
            || processor.temporal_patch_size != geometry.temporal_patch_size
        {
            return Err(invalid("the processor's patch, merge or temporal size disagrees with vision_config"));
        }
        Ok(Self {
            model_type: raw.identity.model_type.clone(),
            architecture: raw.identity.architecture(),
            weights: raw.identity.weight_dtype().map_err(invalid)?,
            text_hidden_size,
            mrope_section,
            image_token_id: token("image_token_id", |t| t.image_token_id)?,
            video_token_id: token("video_token_id", |t| t.video_token_id)?,
            vision_start_token_id: token("vision_start_token_id", |t| t.vision_start_token_id)?,
            vision_end_token_id: token("vision_end_token_id", |t| t.vision_end_token_id)?,
            geometry,
            processor,
        })
    }

    /// The special tokens a `ConfigSummary` names.
    pub fn special_tokens(&self) -> [(&'static str, u32); 4] {
        [
            ("image_pad", self.image_token_id),
            ("video_pad", self.video_token_id),
            ("vision_start", self.vision_start_token_id),
            ("vision_end", self.vision_end_token_id),
        ]
    }
}

impl ProcessorConfig {
    fn parse(json: &str, geometry: &Geometry) -> Result<Self, PluginError> {
        let p: RawProcessor = processor_section(json).map_err(|e| invalid(format!("processor config: {e}")))?;
        let bounds = p.size.unwrap_or_default();
        let min_pixels = p.min_pixels.or(bounds.shortest_edge).unwrap_or(DEFAULT_MIN_PIXELS);
        let max_pixels = p.max_pixels.or(bounds.longest_edge).unwrap_or(DEFAULT_MAX_PIXELS);
        if min_pixels > max_pixels {
            return Err(invalid(format!("min_pixels {min_pixels} exceeds max_pixels {max_pixels}")));
        }
        Ok(Self {
            min_pixels,
            max_pixels,
            patch_size: p.patch_size.unwrap_or(geometry.patch_size),
            merge_size: p.merge_size.unwrap_or(geometry.spatial_merge_size),
            temporal_patch_size: p.temporal_patch_size.unwrap_or(geometry.temporal_patch_size),
            resample: p.resample.unwrap_or(3),
            do_resize: p.steps.resize(),
            rescale_factor: p.steps.rescale(),
            mean_std: p.steps.normalize(CLIP_MEAN, CLIP_STD),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen_vl::testing::{FIXTURES, fixture_config};

    #[test]
    fn the_fixture_configs_parse_with_every_shared_field() {
        for name in FIXTURES {
            let c = fixture_config(name);
            assert_eq!(c.text_hidden_size, 64, "{name}");
            let sections: &[u32] = if name == "qwen3_vl" { &[6, 5, 5] } else { &[2, 3, 3] };
            assert_eq!(c.mrope_section, sections, "{name}");
            assert_eq!(
                (c.image_token_id, c.video_token_id, c.vision_start_token_id, c.vision_end_token_id),
                (389, 390, 387, 388)
            );
            let (g, p) = (&c.geometry, &c.processor);
            assert_eq!((g.spatial_merge_size, g.temporal_patch_size, p.resample), (2, 2, 3));
            assert_eq!(p.rescale_factor, Some(0.00392156862745098));
            if name == "qwen3_vl" {
                // Patch 16, the pixel bounds as `size`, mean and std 0.5.
                assert_eq!((g.patch_size, g.patch_width(), p.min_pixels, p.max_pixels), (16, 1536, 4096, 16384));
                assert_eq!(p.mean_std, Some(([0.5; 3], [0.5; 3])));
            } else {
                assert_eq!((g.patch_size, g.patch_width(), p.min_pixels, p.max_pixels), (14, 1176, 3136, 12544));
                assert_eq!(p.mean_std, Some((CLIP_MEAN.map(|x| x as f32), CLIP_STD.map(|x| x as f32))));
            }
        }
    }

    #[test]
    fn the_transformers_4_layout_and_a_flat_preprocessor_config_parse_too() {
        let config = r#"{"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"],
            "hidden_size": 1536, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
            "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 1536, "num_heads": 16,
              "mlp_ratio": 4, "hidden_act": "quick_gelu", "in_chans": 3, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2}}"#;
        let processor = r#"{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2,
            "temporal_patch_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}"#;
        let c = QwenVl::parse(config, processor).expect("parse");
        assert_eq!((c.text_hidden_size, c.mrope_section.as_slice()), (1536, &[16, 24, 24][..]));
        assert_eq!((c.processor.min_pixels, c.processor.max_pixels), (3136, 12845056));
        assert_eq!(c.processor.mean_std, Some(([0.5; 3], [0.5; 3])));
    }

    #[test]
    fn a_config_without_the_shared_fields_is_refused_by_name() {
        let err = QwenVl::parse(r#"{"model_type": "qwen2_vl", "hidden_size": 8}"#, "").expect_err("refused");
        assert!(err.message.contains("mrope_section"), "{err}");
        let err = QwenVl::parse("{", "").expect_err("refused");
        assert!(err.message.starts_with("config.json: "), "{err}");
    }

    /// A field of the wrong type is an error, not the default it would otherwise take.
    #[test]
    fn a_field_of_the_wrong_type_is_refused_not_defaulted() {
        for name in FIXTURES {
            let dir = mlxcel_golden::Fixture::named(name).expect("fixture");
            let config = std::fs::read_to_string(dir.dir().join("config.json")).expect("config");
            let err = QwenVl::parse(&config, r#"{"do_normalize": "yes"}"#).expect_err("refused");
            assert!(err.message.contains("processor config: invalid type"), "{err}");
            let err = QwenVl::parse(&config, r#"{"image_mean": [0.5, 0.5]}"#).expect_err("refused");
            assert!(err.message.contains("processor config"), "{err}");
            let mut v: serde_json::Value = serde_json::from_str(&config).expect("json");
            v["vision_config"]["patch_size"] = "fourteen".into();
            let err = QwenVl::parse(&v.to_string(), "").expect_err("refused");
            assert!(err.message.contains("config.json: invalid type"), "{err}");
        }
    }
}
