//! The typed view of a Youtu-VL checkpoint: `config.json` and the processor config.
//!
//! `config.json` is flat: the text model's fields at the root beside `vision_config`, which is
//! how mlx-vlm's `ModelConfig.from_dict` reads it (it copies the root into the text config and
//! would drop a nested `text_config`, so one is refused here rather than read differently by the
//! decoder). Absent fields take mlx-vlm 0.7.10's class defaults (`youtu_vl/config.py`:
//! `ModelConfig`, `TextConfig`, `VisionConfig`), as the reference does.
//!
//! Everything the tower cannot compute as the reference does is refused by name: a tower other
//! than SigLIP2's, an activation other than the tanh GELU the reference hard-codes, a rotary
//! embedding other than its fixed one (theta 10000, no scaling), a patch embedding of another
//! width, a window smaller than one merged unit. Fields the reference does not read and that
//! change nothing (`num_patches`, which sizes SigLIP2's position table that this tower does not
//! have; `attention_dropout`) are ignored, as the reference ignores them.
//!
//! The processor config is the stand-in processor's ([`crate::processor`]): its pixel bounds,
//! resampling and normalisation are read, a few fields that do not change its pixels are
//! ignored, and any other field is refused, since it may belong to the remote-code processor
//! this plugin does not implement (SigLIP2's `max_num_patches`, say) and ignoring it could
//! change the image silently.

use mlxcel_family_common::qwen_vl::config::check_heads;
use mlxcel_family_common::qwen_vl::{Geometry, PatchRows, ProcessorConfig};
use mlxcel_family_common::{Identity, Steps, WeightDtype, processor_section};
use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};

/// The stand-in processor's default pixel bounds, in merged units of `(patch * merge)^2`
/// pixels: `Qwen2VLImageProcessor`'s defaults (56 * 56 and 28 * 28 * 1280 pixels at its 28-pixel
/// unit), so an image costs the same 4 to 1280 feature tokens it would in Qwen2-VL.
const DEFAULT_MIN_UNITS: u64 = 4;
const DEFAULT_MAX_UNITS: u64 = 1280;
/// Pillow's `BICUBIC`, the stand-in's resampling.
const DEFAULT_RESAMPLE: u32 = 3;
/// SigLIP2's normalisation: `[0, 1]` to `[-1, 1]`.
const MEAN_STD: [f64; 3] = [0.5; 3];
/// The vision rotary embedding's theta, fixed in the reference (`VisionRoPE(head_dim // 2)`).
pub(crate) const VISION_ROPE_THETA: f64 = 10000.0;
/// The only vision MLP activation the reference computes (`nn.gelu_approx`, whatever the
/// config names).
const VISION_ACT: &str = "gelu_pytorch_tanh";
/// The only tower the family has.
const VISION_MODEL_TYPE: &str = "siglip2_vision_model";

/// Processor config fields read (see [`ProcessorConfig`]), and those ignored because they do not
/// change the pixels: the processor's class names, and `do_convert_rgb` (the host hands every
/// image over as RGB, as transformers' `load_image` converts it).
const PROCESSOR_READ: [&str; 12] = [
    "min_pixels",
    "max_pixels",
    "size",
    "patch_size",
    "merge_size",
    "resample",
    "do_resize",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
];
const PROCESSOR_IGNORED: [&str; 4] = ["processor_class", "image_processor_type", "auto_map", "do_convert_rgb"];

/// Everything the family varies on, parsed once and handed back to every entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct YoutuVlConfig {
    pub model_type: String,
    pub architecture: String,
    /// The dtype the checkpoint stores its weights in; the encoder reads them so.
    pub weights: WeightDtype,
    /// Width of the text decoder, which the merger projects to.
    pub text_hidden_size: u32,
    pub image_token_id: u32,
    pub video_token_id: u32,
    pub vision_start_token_id: u32,
    pub vision_end_token_id: u32,
    /// The patch geometry: RGB, `patch_size` pixels a side, `spatial_merge_size` patches merged a
    /// side, one frame.
    pub geometry: Geometry,
    pub vision: VisionConfig,
    pub processor: ProcessorConfig,
}

/// The tower's fields of `vision_config` (its patch geometry is [`YoutuVlConfig::geometry`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub num_layers: usize,
    /// The tower's width.
    pub hidden_size: usize,
    /// The MLP's inner width.
    pub intermediate_size: usize,
    pub num_heads: usize,
    /// The merger's output width (the text model's hidden size).
    pub out_hidden_size: usize,
    /// Every LayerNorm's epsilon (the merger's RMSNorm has its own, fixed).
    pub layer_norm_eps: f64,
    /// A window's side in pixels.
    pub window_size: usize,
    /// The layers that attend over the whole image; the others attend within their window.
    pub fullatt_block_indexes: Vec<usize>,
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }
}

fn invalid(message: impl Into<String>) -> PluginError {
    PluginError::invalid(message)
}

/// `config.json`; absent fields take mlx-vlm's defaults.
#[derive(Deserialize)]
struct RawConfig {
    #[serde(flatten)]
    identity: Identity,
    hidden_size: Option<u32>,
    text_config: Option<serde_json::Value>,
    rope_interleave: Option<bool>,
    rope_traditional: Option<bool>,
    n_routed_experts: Option<serde_json::Value>,
    image_token_id: Option<u32>,
    video_token_id: Option<u32>,
    vision_start_token_id: Option<u32>,
    vision_end_token_id: Option<u32>,
    vision_config: Option<RawVision>,
}

/// `vision_config`, as mlx-vlm's `VisionConfig` reads it, plus the fields that would change the
/// math if a config set them (refused unless they say what the reference computes anyway).
#[derive(Deserialize)]
struct RawVision {
    model_type: Option<String>,
    hidden_size: Option<usize>,
    out_hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_channels: Option<usize>,
    patch_size: Option<usize>,
    hidden_act: Option<String>,
    layer_norm_eps: Option<f64>,
    spatial_merge_size: Option<usize>,
    window_size: Option<usize>,
    fullatt_block_indexes: Option<Vec<usize>>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    rope_parameters: Option<serde_json::Value>,
    in_features: Option<usize>,
}

/// The processor config fields [`PROCESSOR_READ`] names.
#[derive(Deserialize)]
struct RawProcessor {
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
    size: Option<RawPixelBounds>,
    patch_size: Option<usize>,
    merge_size: Option<usize>,
    resample: Option<u32>,
    #[serde(flatten)]
    steps: Steps,
}

/// The pixel bounds written as `size` (transformers 5's Qwen-VL processors).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPixelBounds {
    shortest_edge: Option<u64>,
    longest_edge: Option<u64>,
}

impl YoutuVlConfig {
    /// Parses `config.json` and the processor config (empty: the stand-in processor's defaults).
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let raw: RawConfig = serde_json::from_str(config_json).map_err(|e| invalid(format!("config.json: {e}")))?;
        if raw.text_config.is_some() {
            return Err(invalid(
                "config.json: a nested text_config; Youtu-VL's config is flat (mlx-vlm reads the text model's \
                 fields at the root and would not read this one)",
            ));
        }
        check_text(&raw)?;
        let v = raw.vision_config.as_ref().ok_or_else(|| invalid("config.json: no vision_config"))?;
        let (geometry, vision) = parse_vision(v)?;
        // mlx-vlm `TextConfig.hidden_size`.
        let text_hidden_size = raw.hidden_size.unwrap_or(2560);
        if vision.out_hidden_size != text_hidden_size as usize {
            return Err(invalid(format!(
                "vision_config.out_hidden_size {} differs from the text model's hidden_size {text_hidden_size}: the \
                 merger's rows replace text embeddings",
                vision.out_hidden_size
            )));
        }
        let processor = parse_processor(processor_json, &geometry)?;
        Ok(Self {
            model_type: raw.identity.model_type.clone(),
            architecture: raw.identity.architecture(),
            weights: raw.identity.weight_dtype().map_err(invalid)?,
            text_hidden_size,
            // mlx-vlm `ModelConfig`'s defaults.
            image_token_id: raw.image_token_id.unwrap_or(128_264),
            video_token_id: raw.video_token_id.unwrap_or(128_265),
            vision_start_token_id: raw.vision_start_token_id.unwrap_or(128_262),
            vision_end_token_id: raw.vision_end_token_id.unwrap_or(128_263),
            geometry,
            vision,
            processor,
        })
    }

    /// The special tokens a `ConfigSummary` names (the Qwen-VL roles: the prompt is theirs).
    pub fn special_tokens(&self) -> [(&'static str, u32); 4] {
        [
            ("image_pad", self.image_token_id),
            ("video_pad", self.video_token_id),
            ("vision_start", self.vision_start_token_id),
            ("vision_end", self.vision_end_token_id),
        ]
    }

    /// A window's side in patches: the reference's `window_size // spatial_merge_size //
    /// patch_size` merged units, each `spatial_merge_size` patches a side.
    pub fn window_patches(&self) -> usize {
        let g = &self.geometry;
        self.vision.window_size / g.spatial_merge_size / g.patch_size * g.spatial_merge_size
    }
}

impl PatchRows for YoutuVlConfig {
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

/// What mlx-vlm's `TextConfig` reads at the root that the decoder spec would read otherwise:
/// mlx-vlm rotates adjacent pairs when `rope_interleave` (default true) or `rope_traditional`
/// (default true) is, so `rope_interleave` false alone still rotates them, while the decoder
/// reads `rope_interleave` alone; and `n_routed_experts` makes its layers mixtures of experts,
/// which the spec has no block for.
fn check_text(raw: &RawConfig) -> Result<(), PluginError> {
    let interleave = raw.rope_interleave.unwrap_or(true);
    let traditional = interleave || raw.rope_traditional != Some(false);
    if traditional != interleave {
        return Err(PluginError::unsupported(format!(
            "config.json: rope_interleave {:?} with rope_traditional {:?}: the reference rotates {} pairs, the \
             decoder would not",
            raw.rope_interleave,
            raw.rope_traditional,
            if traditional { "adjacent" } else { "half-split" }
        )));
    }
    if raw.n_routed_experts.as_ref().is_some_and(|n| !n.is_null()) {
        return Err(PluginError::unsupported(
            "config.json: n_routed_experts (mixture-of-experts text layers are not served)",
        ));
    }
    Ok(())
}

/// `vision_config` with mlx-vlm `VisionConfig`'s defaults, checked.
fn parse_vision(v: &RawVision) -> Result<(Geometry, VisionConfig), PluginError> {
    let unsupported = |message: String| Err(PluginError::unsupported(format!("vision_config: {message}")));
    let model_type = v.model_type.as_deref().unwrap_or(VISION_MODEL_TYPE);
    if model_type != VISION_MODEL_TYPE {
        return unsupported(format!("model_type `{model_type}` (the youtu-vl tower is {VISION_MODEL_TYPE})"));
    }
    let act = v.hidden_act.as_deref().unwrap_or(VISION_ACT);
    if act != VISION_ACT {
        return unsupported(format!("hidden_act `{act}` (the reference computes {VISION_ACT} whatever it is named)"));
    }
    if let Some(theta) = v.rope_theta.filter(|&t| t != VISION_ROPE_THETA) {
        return unsupported(format!("rope_theta {theta} (the reference's vision rotary theta is {VISION_ROPE_THETA})"));
    }
    if let Some(key) = [("rope_scaling", &v.rope_scaling), ("rope_parameters", &v.rope_parameters)]
        .into_iter()
        .find_map(|(key, value)| value.as_ref().map(|_| key))
    {
        return unsupported(format!("{key} (the reference's vision rotary embedding is unscaled, theta 10000)"));
    }
    let channels = v.num_channels.unwrap_or(3);
    if channels != 3 {
        return unsupported(format!("num_channels {channels}: images are rgb"));
    }
    let geometry = Geometry {
        in_channels: channels,
        patch_size: v.patch_size.unwrap_or(16),
        spatial_merge_size: v.spatial_merge_size.unwrap_or(2),
        temporal_patch_size: 1,
    };
    if geometry.patch_size == 0 || geometry.spatial_merge_size == 0 {
        return Err(invalid("vision_config: patch_size and spatial_merge_size must be positive"));
    }
    if let Some(width) = v.in_features.filter(|&w| w != geometry.patch_width()) {
        return unsupported(format!(
            "in_features {width} (the patch embedding reads {} values per patch)",
            geometry.patch_width()
        ));
    }
    let vision = VisionConfig {
        num_layers: v.num_hidden_layers.unwrap_or(27),
        hidden_size: v.hidden_size.unwrap_or(1152),
        intermediate_size: v.intermediate_size.unwrap_or(4304),
        num_heads: v.num_attention_heads.unwrap_or(16),
        out_hidden_size: v.out_hidden_size.unwrap_or(2560),
        layer_norm_eps: v.layer_norm_eps.unwrap_or(1e-6),
        window_size: v.window_size.unwrap_or(256),
        fullatt_block_indexes: v.fullatt_block_indexes.clone().unwrap_or_else(|| vec![7, 15, 23, 26]),
    };
    check_heads("hidden_size", vision.hidden_size, vision.num_heads)?;
    if let Some(&i) = vision.fullatt_block_indexes.iter().find(|&&i| i >= vision.num_layers) {
        return Err(invalid(format!("vision_config: fullatt_block_indexes names layer {i} of {}", vision.num_layers)));
    }
    let merged = geometry.spatial_merge_size * geometry.patch_size;
    if vision.window_size < merged {
        return Err(invalid(format!(
            "vision_config: window_size {} is less than one merged unit ({merged} pixels)",
            vision.window_size
        )));
    }
    Ok((geometry, vision))
}

/// The stand-in processor's settings: the bounds, resampling and normalisation the processor
/// config gives, else the defaults above; a field outside [`PROCESSOR_READ`] and
/// [`PROCESSOR_IGNORED`] is refused.
fn parse_processor(json: &str, geometry: &Geometry) -> Result<ProcessorConfig, PluginError> {
    let read = |e: serde_json::Error| invalid(format!("processor config: {e}"));
    let fields: serde_json::Map<String, serde_json::Value> = processor_section(json).map_err(read)?;
    if let Some(key) =
        fields.keys().find(|k| !PROCESSOR_READ.contains(&k.as_str()) && !PROCESSOR_IGNORED.contains(&k.as_str()))
    {
        return Err(PluginError::unsupported(format!(
            "processor config: `{key}` is not read by the youtu-vl processor, a documented stand-in that bounds \
             images by min_pixels and max_pixels; refused rather than ignored"
        )));
    }
    let p: RawProcessor = serde_json::from_value(serde_json::Value::Object(fields)).map_err(read)?;
    let bounds = p.size.unwrap_or(RawPixelBounds { shortest_edge: None, longest_edge: None });
    let pick = |key: &str, flat: Option<u64>, nested: Option<u64>, default: u64| match (flat, nested) {
        (Some(a), Some(b)) if a != b => {
            Err(invalid(format!("processor config: {key} {a} and its size entry {b} disagree")))
        }
        (a, b) => Ok(a.or(b).unwrap_or(default)),
    };
    let unit = (geometry.patch_size * geometry.spatial_merge_size) as u64;
    let min_pixels = pick("min_pixels", p.min_pixels, bounds.shortest_edge, DEFAULT_MIN_UNITS * unit * unit)?;
    let max_pixels = pick("max_pixels", p.max_pixels, bounds.longest_edge, DEFAULT_MAX_UNITS * unit * unit)?;
    if min_pixels > max_pixels {
        return Err(invalid(format!("processor config: min_pixels {min_pixels} exceeds max_pixels {max_pixels}")));
    }
    let patch_size = p.patch_size.unwrap_or(geometry.patch_size);
    let merge_size = p.merge_size.unwrap_or(geometry.spatial_merge_size);
    if (patch_size, merge_size) != (geometry.patch_size, geometry.spatial_merge_size) {
        return Err(invalid(format!(
            "processor config: patch_size {patch_size} and merge_size {merge_size} disagree with vision_config's {} \
             and {}",
            geometry.patch_size, geometry.spatial_merge_size
        )));
    }
    Ok(ProcessorConfig {
        min_pixels,
        max_pixels,
        patch_size,
        merge_size,
        temporal_patch_size: 1,
        resample: p.resample.unwrap_or(DEFAULT_RESAMPLE),
        do_resize: p.steps.resize(),
        rescale_factor: p.steps.rescale(),
        mean_std: p.steps.normalize(MEAN_STD, MEAN_STD),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixture_config, fixture_config_json};

    #[test]
    fn the_fixture_config_parses_with_every_field_the_family_needs() {
        let c = fixture_config();
        assert_eq!(
            (c.model_type.as_str(), c.architecture.as_str(), c.weights),
            ("youtu_vl", "YoutuVLForConditionalGeneration", WeightDtype::F32)
        );
        assert_eq!(
            (c.text_hidden_size, c.special_tokens()[0], c.special_tokens()[3]),
            (64, ("image_pad", 389), ("vision_end", 388))
        );
        let v = &c.vision;
        assert_eq!(
            (v.num_layers, v.hidden_size, v.intermediate_size, v.num_heads, v.head_dim(), v.out_hidden_size),
            (2, 32, 64, 2, 16, 64)
        );
        assert_eq!((v.layer_norm_eps, v.window_size, v.fullatt_block_indexes.as_slice()), (1e-6, 64, &[1][..]));
        assert_eq!(
            c.geometry,
            Geometry { in_channels: 3, patch_size: 16, spatial_merge_size: 2, temporal_patch_size: 1 }
        );
        // 64 pixels: 2 merged units of 2 patches a side.
        assert_eq!(c.window_patches(), 4);
        // No processor config: the default bounds, 4 to 1280 merged units of 32x32 pixels.
        let p = &c.processor;
        assert_eq!((p.min_pixels, p.max_pixels, p.resample), (4096, 1_310_720, 3));
        assert_eq!((p.rescale_factor, p.mean_std), (Some(1.0 / 255.0), Some(([0.5; 3], [0.5; 3]))));
    }

    /// A sparse config takes mlx-vlm's class defaults, as the reference does.
    #[test]
    fn absent_fields_take_the_references_defaults() {
        let c = YoutuVlConfig::parse(r#"{"model_type": "youtu_vl", "vision_config": {}}"#, "").expect("parse");
        assert_eq!((c.text_hidden_size, c.image_token_id, c.vision_start_token_id), (2560, 128_264, 128_262));
        let v = &c.vision;
        assert_eq!(
            (v.num_layers, v.hidden_size, v.num_heads, v.head_dim(), v.intermediate_size),
            (27, 1152, 16, 72, 4304)
        );
        assert_eq!(
            (v.window_size, v.fullatt_block_indexes.as_slice(), c.window_patches()),
            (256, &[7, 15, 23, 26][..], 16)
        );
        assert_eq!((c.geometry.patch_size, c.geometry.patch_width()), (16, 768));
    }

    #[test]
    fn what_the_reference_cannot_run_is_refused_by_name() {
        let config = fixture_config_json();
        let edit = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v: serde_json::Value = serde_json::from_str(&config).expect("json");
            f(&mut v);
            YoutuVlConfig::parse(&v.to_string(), "").expect_err("refused").message.to_string()
        };
        let vision = |key: &'static str, value: serde_json::Value| {
            edit(&move |v: &mut serde_json::Value| v["vision_config"][key] = value.clone())
        };
        assert!(vision("model_type", "siglip_vision_model".into()).contains("`siglip_vision_model`"));
        assert!(vision("hidden_act", "gelu".into()).contains("hidden_act `gelu`"));
        assert!(vision("rope_theta", 1e6.into()).contains("rope_theta 1000000"));
        assert!(vision("rope_scaling", serde_json::json!({"type": "linear"})).contains("rope_scaling"));
        assert!(vision("num_channels", 4.into()).contains("num_channels 4"));
        assert!(vision("in_features", 588.into()).contains("in_features 588"));
        assert!(vision("window_size", 16.into()).contains("window_size 16"));
        assert!(vision("fullatt_block_indexes", serde_json::json!([2])).contains("layer 2 of 2"));
        assert!(vision("num_attention_heads", 3.into()).contains("num_heads 3"));
        assert!(vision("out_hidden_size", 32.into()).contains("out_hidden_size 32"));
        assert!(vision("hidden_size", "wide".into()).contains("config.json: invalid type"));
        assert!(edit(&|v| v["text_config"] = serde_json::json!({"hidden_size": 64})).contains("nested text_config"));
        assert!(edit(&|v| v["rope_interleave"] = false.into()).contains("adjacent pairs"));
        assert!(edit(&|v| v["n_routed_experts"] = 8.into()).contains("n_routed_experts"));
        let without_vision = edit(&|v| {
            v.as_object_mut().expect("object").remove("vision_config");
        });
        assert!(without_vision.contains("no vision_config"), "{without_vision}");
        // Fields the reference does not read change nothing.
        let mut quiet: serde_json::Value = serde_json::from_str(&config).expect("json");
        quiet["vision_config"]["num_patches"] = 4096.into();
        quiet["vision_config"]["attention_dropout"] = 0.0.into();
        quiet["vision_config"]["rope_theta"] = VISION_ROPE_THETA.into();
        // Both rotary flags off: half-split rotation in the reference and in the decoder.
        quiet["rope_interleave"] = false.into();
        quiet["rope_traditional"] = false.into();
        quiet["n_routed_experts"] = serde_json::Value::Null;
        assert_eq!(YoutuVlConfig::parse(&quiet.to_string(), "").expect("quiet"), fixture_config());
    }

    #[test]
    fn the_processor_config_gives_the_bounds_and_steps_and_nothing_else() {
        let config = fixture_config_json();
        let parse = |processor: &str| YoutuVlConfig::parse(&config, processor).map(|c| c.processor);
        let flat = parse(
            r#"{"min_pixels": 1024, "max_pixels": 65536, "resample": 2, "patch_size": 16, "merge_size": 2,
               "processor_class": "YoutuVLProcessor", "do_convert_rgb": true}"#,
        )
        .expect("flat");
        assert_eq!((flat.min_pixels, flat.max_pixels, flat.resample), (1024, 65536, 2));
        let nested =
            parse(r#"{"image_processor": {"size": {"shortest_edge": 1024, "longest_edge": 65536}, "resample": 2}}"#)
                .expect("nested");
        assert_eq!(nested, flat);
        let refused = |processor: &str| parse(processor).expect_err("refused").message.to_string();
        assert!(refused(r#"{"max_num_patches": 256}"#).contains("`max_num_patches` is not read"));
        assert!(refused(r#"{"size": {"height": 224, "width": 224}}"#).contains("unknown field `height`"));
        assert!(refused(r#"{"patch_size": 14}"#).contains("patch_size 14"));
        assert!(refused(r#"{"min_pixels": 9000, "max_pixels": 4096}"#).contains("exceeds"));
        assert!(refused(r#"{"max_pixels": 4096, "size": {"longest_edge": 8192}}"#).contains("disagree"));
        assert!(refused(r#"{"image_mean": [0.5, 0.5]}"#).contains("processor config"));
    }
}
