//! The typed view of a LLaVA checkpoint: `config.json` (the CLIP vision tower, the feature
//! layers and selection, the projector, the image token) and the processor config (the
//! `CLIPImageProcessor` steps and the `LlavaProcessor` fields).
//!
//! Absent keys take transformers' defaults (`LlavaConfig`, `CLIPVisionConfig` with LLaVA's
//! sub-config defaults, `CLIPImageProcessor`), except the processor's resize and crop sizes:
//! transformers defaults them to 224, but the CLIP tower refuses any image that is not its
//! `image_size` square, so without them the tower's size is the only one that can work. The
//! processor config is read nested under `image_processor` (`processor_config.json`) or flat
//! (`preprocessor_config.json`).
//!
//! Everything the family cannot serve exactly as the reference does is refused here, by
//! name: a tower other than CLIP, an activation the numeric contract does not define, a
//! feature layer outside the tower, a processor that does not produce the tower's square.

use mlxcel_family_common::clip::{CLIP_MEAN, CLIP_STD};
use mlxcel_family_common::{Identity, Resample, Steps, WeightDtype, processor_section, shortest_edge_size};
use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};

/// `LlamaConfig().hidden_size`, for LLaVA 1.5 configs whose `text_config` leaves it out.
const LLAMA_DEFAULT_HIDDEN: u32 = 4096;
/// The placeholder `LlavaProcessor` expands.
const DEFAULT_IMAGE_TOKEN: &str = "<image>";

/// Everything the family varies on, parsed once and handed back to every entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlavaConfig {
    pub model_type: String,
    pub architecture: String,
    /// The dtype the checkpoint stores its weights in; the encoder reads them so.
    pub weights: WeightDtype,
    /// Width of the text decoder, which the projector maps to.
    pub text_hidden_size: u32,
    pub image_token_id: u32,
    /// The placeholder text the chat template renders once per image.
    pub image_token: String,
    /// `image_seq_length`, when the config states it: the tower's patch count.
    pub image_seq_length: Option<u32>,
    /// The hidden states the projector reads, in the config's order and concatenated along
    /// the features: 0 is the embeddings after `pre_layrnorm`, `i` the output of layer `i`.
    pub feature_layers: Vec<usize>,
    pub select: SelectStrategy,
    pub projector_act: Act,
    pub projector_bias: bool,
    pub vision: VisionConfig,
    pub processor: ProcessorConfig,
}

/// `vision_feature_select_strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectStrategy {
    /// Drops the class token's row.
    Default,
    /// Keeps every row.
    Full,
}

/// An activation the numeric contract defines, by its transformers name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Act {
    /// Exact (erf) GELU: `gelu`.
    Gelu,
    /// `gelu_pytorch_tanh`.
    GeluPytorchTanh,
    /// `x * sigmoid(1.702 x)`: `quick_gelu`.
    QuickGelu,
    Silu,
}

impl Act {
    fn parse(name: &str, what: &str) -> Result<Self, PluginError> {
        Ok(match name {
            "gelu" => Act::Gelu,
            "gelu_pytorch_tanh" => Act::GeluPytorchTanh,
            "quick_gelu" => Act::QuickGelu,
            "silu" | "swish" => Act::Silu,
            other => {
                return Err(PluginError::unsupported(format!(
                    "{what} `{other}`: the llava plugin computes gelu, gelu_pytorch_tanh, quick_gelu and silu"
                )));
            }
        })
    }
}

/// `vision_config` of a CLIP tower.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub image_size: usize,
    pub patch_size: usize,
    pub num_channels: usize,
    pub act: Act,
    pub layer_norm_eps: f64,
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Patches per side.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Patch rows, without the class token.
    pub fn patches(&self) -> usize {
        self.grid() * self.grid()
    }
}

/// How the processor resizes before the crop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resize {
    /// `{"shortest_edge": s}`, optionally with `longest_edge`: the aspect ratio kept.
    ShortestEdge { shortest: u32, longest: Option<u32> },
    /// `{"height": h, "width": w}`.
    Exact { height: u32, width: u32 },
}

impl Resize {
    /// The `(height, width)` an image of `height x width` resizes to.
    pub fn size_for(&self, height: u32, width: u32) -> Result<(u32, u32), PluginError> {
        match *self {
            Resize::ShortestEdge { shortest, longest } => {
                shortest_edge_size(height, width, shortest, longest).map_err(|e| PluginError::invalid(e.to_string()))
            }
            Resize::Exact { height, width } => Ok((height, width)),
        }
    }
}

/// The image processor's steps, in the reference's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessorConfig {
    /// `None`: `do_resize` false.
    pub resize: Option<Resize>,
    /// Pillow resampling code (3: bicubic).
    pub resample: u32,
    /// `(height, width)`; `None`: `do_center_crop` false.
    pub crop: Option<(u32, u32)>,
    pub rescale_factor: Option<f64>,
    pub mean_std: Option<([f32; 3], [f32; 3])>,
}

fn invalid(message: impl Into<String>) -> PluginError {
    PluginError::invalid(message)
}

/// `config.json`; absent or null fields take `LlavaConfig`'s defaults.
#[derive(Deserialize)]
struct RawConfig {
    #[serde(flatten)]
    identity: Identity,
    text_config: Option<RawText>,
    image_token_index: Option<u32>,
    image_token_id: Option<u32>,
    vision_config: Option<RawVision>,
    vision_feature_layer: Option<OneOrMany>,
    vision_feature_select_strategy: Option<String>,
    projector_hidden_act: Option<String>,
    image_seq_length: Option<u32>,
    multimodal_projector_bias: Option<bool>,
}

#[derive(Deserialize)]
struct RawText {
    model_type: Option<String>,
    hidden_size: Option<u32>,
}

/// An int or a list of ints, as `vision_feature_layer` is written.
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(i64),
    Many(Vec<i64>),
}

/// `vision_config`: LlavaConfig's defaults for its CLIP sub-config (llava-1.5), then
/// CLIPVisionConfig's.
#[derive(Deserialize, Default)]
struct RawVision {
    model_type: Option<String>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    image_size: Option<usize>,
    patch_size: Option<usize>,
    num_channels: Option<usize>,
    hidden_act: Option<String>,
    layer_norm_eps: Option<f64>,
}

/// `processor_config.json`'s `LlavaProcessor` fields, beside its `image_processor`.
#[derive(Deserialize, Default)]
struct RawProcessorRoot {
    patch_size: Option<u32>,
    num_additional_image_tokens: Option<u32>,
    vision_feature_select_strategy: Option<String>,
    image_token: Option<String>,
}

/// The `CLIPImageProcessor` fields.
#[derive(Deserialize, Default)]
struct RawProcessor {
    size: Option<RawSize>,
    crop_size: Option<RawSize>,
    resample: Option<u32>,
    do_center_crop: Option<bool>,
    #[serde(flatten)]
    steps: Steps,
}

/// A `size` or `crop_size` entry: a dict, or an int as older configs write it.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum RawSize {
    Int(u32),
    Dict { shortest_edge: Option<u32>, longest_edge: Option<u32>, height: Option<u32>, width: Option<u32> },
}

impl RawSize {
    /// As a resize: an int is the shortest edge (`size`) or the square (`crop_size`).
    fn resize(&self, what: &str, square_int: bool) -> Result<Resize, PluginError> {
        match *self {
            RawSize::Int(n) if square_int => Ok(Resize::Exact { height: n, width: n }),
            RawSize::Int(n) => Ok(Resize::ShortestEdge { shortest: n, longest: None }),
            RawSize::Dict { shortest_edge: Some(shortest), longest_edge, .. } => {
                Ok(Resize::ShortestEdge { shortest, longest: longest_edge })
            }
            RawSize::Dict { shortest_edge: None, height: Some(height), width: Some(width), .. } => {
                Ok(Resize::Exact { height, width })
            }
            RawSize::Dict { .. } => {
                Err(PluginError::unsupported(format!("{what} {self:?}: expected shortest_edge, or height and width")))
            }
        }
    }
}

impl LlavaConfig {
    /// Parses `config.json` and the processor config (empty: the processor's defaults).
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let raw: RawConfig = serde_json::from_str(config_json).map_err(|e| invalid(format!("config.json: {e}")))?;
        let text_type = raw.text_config.as_ref().and_then(|t| t.model_type.as_deref()).unwrap_or("llama");
        let text_hidden_size = match raw.text_config.as_ref().and_then(|t| t.hidden_size) {
            Some(h) => h,
            None if text_type == "llama" => LLAMA_DEFAULT_HIDDEN,
            None => return Err(invalid(format!("config.json: text_config ({text_type}) has no hidden_size"))),
        };
        let image_token_id =
            raw.image_token_index.or(raw.image_token_id).ok_or_else(|| invalid("config.json: no image_token_index"))?;

        let vision = VisionConfig::parse(raw.vision_config.as_ref().unwrap_or(&RawVision::default()))?;
        let states = vision.num_layers + 1;
        let layers = match &raw.vision_feature_layer {
            None => vec![-2],
            Some(OneOrMany::One(l)) => vec![*l],
            Some(OneOrMany::Many(ls)) if !ls.is_empty() => ls.clone(),
            Some(OneOrMany::Many(_)) => return Err(invalid("vision_feature_layer: an empty list")),
        };
        let feature_layers = layers
            .iter()
            .map(|&l| {
                let n = states as i64;
                if (-n..n).contains(&l) {
                    Ok(l.rem_euclid(n) as usize)
                } else {
                    Err(invalid(format!(
                        "vision_feature_layer {l} is out of range: the CLIP tower has {} layers, so {states} hidden \
                         states ({}..={})",
                        vision.num_layers,
                        -n,
                        n - 1
                    )))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let select = match raw.vision_feature_select_strategy.as_deref().unwrap_or("default") {
            "default" => SelectStrategy::Default,
            "full" => SelectStrategy::Full,
            other => {
                return Err(PluginError::unsupported(format!(
                    "vision_feature_select_strategy `{other}` (transformers knows default and full)"
                )));
            }
        };
        let projector_act = Act::parse(raw.projector_hidden_act.as_deref().unwrap_or("gelu"), "projector_hidden_act")?;
        if let Some(n) = raw.image_seq_length
            && n as usize != vision.patches()
        {
            return Err(invalid(format!(
                "image_seq_length {n} disagrees with the tower's {0}x{0} patches of a {1}-pixel image",
                vision.grid(),
                vision.image_size
            )));
        }

        let (processor, fields) = ProcessorConfig::parse(processor_json, &vision)?;
        if let Some(p) = fields.patch_size
            && p as usize != vision.patch_size
        {
            return Err(invalid(format!(
                "the processor's patch_size {p} disagrees with vision_config.patch_size {}",
                vision.patch_size
            )));
        }
        if let Some(n) = fields.num_additional_image_tokens
            && n != 1
        {
            return Err(invalid(format!(
                "the processor counts {n} additional image tokens; a CLIP tower has one (its class token)"
            )));
        }
        if let Some(s) = fields.vision_feature_select_strategy.as_deref() {
            let ours = match select {
                SelectStrategy::Default => "default",
                SelectStrategy::Full => "full",
            };
            if s != ours {
                return Err(invalid(format!(
                    "the processor's vision_feature_select_strategy `{s}` disagrees with config.json's `{ours}`"
                )));
            }
        }

        Ok(Self {
            model_type: raw.identity.model_type.clone(),
            architecture: raw.identity.architecture(),
            weights: raw.identity.weight_dtype().map_err(invalid)?,
            text_hidden_size,
            image_token_id,
            image_token: fields.image_token.unwrap_or_else(|| DEFAULT_IMAGE_TOKEN.to_owned()),
            image_seq_length: raw.image_seq_length,
            feature_layers,
            select,
            projector_act,
            projector_bias: raw.multimodal_projector_bias.unwrap_or(true),
            vision,
            processor,
        })
    }

    /// The feature rows (and image tokens) of one image: the tower's patches, plus the class
    /// token's row under the `full` strategy.
    pub fn feature_tokens(&self) -> u32 {
        let extra = match self.select {
            SelectStrategy::Default => 0,
            SelectStrategy::Full => 1,
        };
        (self.vision.patches() + extra) as u32
    }

    /// The number of tower layers the graph runs: up to the deepest feature layer.
    pub fn layers_needed(&self) -> usize {
        self.feature_layers.iter().copied().max().unwrap_or(0)
    }
}

impl VisionConfig {
    fn parse(v: &RawVision) -> Result<Self, PluginError> {
        let vision_type = v.model_type.as_deref().unwrap_or("clip_vision_model");
        if vision_type != "clip_vision_model" {
            return Err(PluginError::unsupported(format!(
                "vision_config.model_type `{vision_type}`: the llava plugin runs CLIP towers (clip_vision_model)"
            )));
        }
        let config = Self {
            hidden_size: v.hidden_size.unwrap_or(1024),
            intermediate_size: v.intermediate_size.unwrap_or(4096),
            num_layers: v.num_hidden_layers.unwrap_or(24),
            num_heads: v.num_attention_heads.unwrap_or(16),
            image_size: v.image_size.unwrap_or(336),
            patch_size: v.patch_size.unwrap_or(14),
            num_channels: v.num_channels.unwrap_or(3),
            act: Act::parse(v.hidden_act.as_deref().unwrap_or("quick_gelu"), "vision_config.hidden_act")?,
            layer_norm_eps: v.layer_norm_eps.unwrap_or(1e-5),
        };
        if config.num_heads == 0 || config.hidden_size == 0 || !config.hidden_size.is_multiple_of(config.num_heads) {
            return Err(invalid(format!(
                "vision_config: hidden_size {} does not split into {} attention heads",
                config.hidden_size, config.num_heads
            )));
        }
        if config.patch_size == 0 || config.image_size == 0 || !config.image_size.is_multiple_of(config.patch_size) {
            return Err(invalid(format!(
                "vision_config: image_size {} is not a multiple of patch_size {}",
                config.image_size, config.patch_size
            )));
        }
        if config.num_channels != 3 {
            return Err(PluginError::unsupported(format!(
                "vision_config.num_channels {}: images are rgb",
                config.num_channels
            )));
        }
        if config.num_layers == 0 || config.intermediate_size == 0 {
            return Err(invalid("vision_config: a CLIP tower needs at least one layer and an mlp"));
        }
        Ok(config)
    }
}

impl ProcessorConfig {
    fn parse(json: &str, vision: &VisionConfig) -> Result<(Self, RawProcessorRoot), PluginError> {
        let read = |e: serde_json::Error| invalid(format!("processor config: {e}"));
        let p: RawProcessor = processor_section(json).map_err(read)?;
        let fields: RawProcessorRoot = if json.trim().is_empty() {
            RawProcessorRoot::default()
        } else {
            serde_json::from_str(json).map_err(read)?
        };
        let side = vision.image_size as u32;
        let resize = match &p.size {
            Some(size) => size.resize("size", false)?,
            None => Resize::ShortestEdge { shortest: side, longest: None },
        };
        let crop = match &p.crop_size {
            Some(size) => match size.resize("crop_size", true)? {
                Resize::Exact { height, width } => (height, width),
                Resize::ShortestEdge { .. } => {
                    return Err(PluginError::unsupported("crop_size must be height and width"));
                }
            },
            None => (side, side),
        };
        let resample = p.resample.unwrap_or(3);
        if Resample::from_pil(resample).is_none() {
            return Err(PluginError::unsupported(format!(
                "pil resampling filter {resample} (bilinear 2 and bicubic 3 are implemented)"
            )));
        }
        let config = Self {
            resize: p.steps.resize().then_some(resize),
            resample,
            crop: p.do_center_crop.unwrap_or(true).then_some(crop),
            rescale_factor: p.steps.rescale(),
            mean_std: p.steps.normalize(CLIP_MEAN, CLIP_STD),
        };
        // The tower takes one square; the processor must make it for every image.
        let made = match (config.crop, config.resize) {
            (Some(crop), _) => Some(crop),
            (None, Some(Resize::Exact { height, width })) => Some((height, width)),
            _ => None,
        };
        if made != Some((side, side)) {
            let what = made.map_or("images of the input's own shape".to_owned(), |(h, w)| format!("{w}x{h} images"));
            return Err(PluginError::unsupported(format!(
                "the image processor makes {what}; the CLIP tower takes {side}x{side}"
            )));
        }
        Ok((config, fields))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixture_config, fixture_json};

    #[test]
    fn the_fixture_config_parses_with_every_field_the_family_needs() {
        let c = fixture_config();
        assert_eq!((c.model_type.as_str(), c.architecture.as_str()), ("llava", "LlavaForConditionalGeneration"));
        assert_eq!((c.text_hidden_size, c.image_token_id, c.image_token.as_str()), (64, 387, "<image>"));
        assert_eq!((c.image_seq_length, c.feature_tokens()), (Some(16), 16));
        // -2 of 4 hidden states (embeddings and three layers) is the second layer's output.
        assert_eq!((c.feature_layers.as_slice(), c.layers_needed()), (&[2][..], 2));
        assert_eq!((c.select, c.projector_act, c.projector_bias), (SelectStrategy::Default, Act::Gelu, true));
        let v = &c.vision;
        assert_eq!((v.hidden_size, v.intermediate_size, v.num_layers, v.num_heads, v.head_dim()), (32, 64, 3, 2, 16));
        assert_eq!((v.image_size, v.patch_size, v.grid(), v.patches()), (56, 14, 4, 16));
        assert_eq!((v.act, v.layer_norm_eps), (Act::QuickGelu, 1e-5));
        let p = &c.processor;
        assert_eq!(p.resize, Some(Resize::ShortestEdge { shortest: 56, longest: None }));
        assert_eq!((p.crop, p.resample, p.rescale_factor), (Some((56, 56)), 3, Some(0.00392156862745098)));
        assert_eq!(p.mean_std, Some((CLIP_MEAN.map(|x| x as f32), CLIP_STD.map(|x| x as f32))));
    }

    /// A llava-1.5 style config: sparse sub-configs, transformers 4, a flat preprocessor config.
    const HUB_CONFIG: &str = r#"{"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava",
        "image_token_index": 32000, "projector_hidden_act": "gelu", "transformers_version": "4.36.0.dev0",
        "text_config": {"model_type": "llama", "vocab_size": 32064},
        "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
          "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
          "patch_size": 14, "projection_dim": 768},
        "vision_feature_layer": -2, "vision_feature_select_strategy": "default"}"#;
    const HUB_PREPROCESSOR: &str = r#"{"crop_size": {"height": 336, "width": 336}, "do_center_crop": true,
        "do_normalize": true, "do_rescale": true, "do_resize": true, "image_processor_type": "CLIPImageProcessor",
        "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}}"#;

    #[test]
    fn a_llava_1_5_config_takes_the_references_defaults() {
        let c = LlavaConfig::parse(HUB_CONFIG, HUB_PREPROCESSOR).expect("parse");
        assert_eq!((c.text_hidden_size, c.feature_tokens(), c.feature_layers.as_slice()), (4096, 576, &[23][..]));
        assert_eq!((c.vision.act, c.vision.layer_norm_eps, c.vision.head_dim()), (Act::QuickGelu, 1e-5, 64));
        // No processor config at all: the tower's own square.
        let c = LlavaConfig::parse(HUB_CONFIG, "").expect("parse");
        assert_eq!(c.processor.resize, Some(Resize::ShortestEdge { shortest: 336, longest: None }));
        assert_eq!(c.processor.crop, Some((336, 336)));
        // Ints as older configs write them.
        let old = r#"{"size": 336, "crop_size": 336}"#;
        assert_eq!(LlavaConfig::parse(HUB_CONFIG, old).expect("parse").processor, c.processor);
    }

    #[test]
    fn the_full_strategy_keeps_the_class_row_and_layer_lists_concatenate() {
        let config = fixture_json("config.json")
            .replace(r#""vision_feature_layer": -2"#, r#""vision_feature_layer": [0, -1, 1]"#)
            .replace(r#""vision_feature_select_strategy": "default""#, r#""vision_feature_select_strategy": "full""#);
        let processor = fixture_json("processor_config.json").replace(r#""default""#, r#""full""#);
        let c = LlavaConfig::parse(&config, &processor).expect("parse");
        assert_eq!((c.select, c.feature_tokens()), (SelectStrategy::Full, 17));
        assert_eq!((c.feature_layers.as_slice(), c.layers_needed()), (&[0, 3, 1][..], 3));
    }

    /// `config.json` of the fixture with `from` replaced by `to`, parsed with its processor.
    fn parse_edited(from: &str, to: &str) -> Result<LlavaConfig, PluginError> {
        let config = fixture_json("config.json");
        assert!(config.contains(from), "{from}");
        LlavaConfig::parse(&config.replace(from, to), &fixture_json("processor_config.json"))
    }

    #[test]
    fn configs_the_family_cannot_serve_are_refused_by_name() {
        use mlxcel_plugin_api::ErrorCode;
        let layer = r#""vision_feature_layer": -2"#;
        let err = parse_edited(layer, r#""vision_feature_layer": -5"#).expect_err("out of range");
        assert_eq!(
            err.message.as_str(),
            "vision_feature_layer -5 is out of range: the CLIP tower has 3 layers, so 4 hidden states (-4..=3)"
        );
        let err = parse_edited(layer, r#""vision_feature_layer": [1, 4]"#).expect_err("out of range");
        assert!(err.message.starts_with("vision_feature_layer 4 is out of range"), "{err}");
        assert!(parse_edited(layer, r#""vision_feature_layer": []"#).is_err());

        let err =
            parse_edited(r#""projector_hidden_act": "gelu""#, r#""projector_hidden_act": "relu""#).expect_err("relu");
        assert_eq!(err.code, ErrorCode::Unsupported);
        assert!(err.message.starts_with("projector_hidden_act `relu`"), "{err}");
        let err = parse_edited(r#""model_type": "clip_vision_model""#, r#""model_type": "siglip_vision_model""#)
            .expect_err("siglip");
        assert_eq!(err.code, ErrorCode::Unsupported);
        assert!(err.message.contains("siglip_vision_model"), "{err}");
        let err = parse_edited(r#""image_seq_length": 16"#, r#""image_seq_length": 576"#).expect_err("seq");
        assert!(err.message.contains("image_seq_length 576"), "{err}");
        let err = parse_edited(
            r#""vision_feature_select_strategy": "default""#,
            r#""vision_feature_select_strategy": "full""#,
        )
        .expect_err("the processor still says default");
        assert!(err.message.contains("disagrees"), "{err}");
        let err = parse_edited(r#""image_size": 56"#, r#""image_size": 60"#).expect_err("not a multiple");
        assert!(err.message.contains("not a multiple of patch_size"), "{err}");
        let config = fixture_json("config.json").replace(r#""image_size": 56"#, r#""image_size": 70"#);
        let err = LlavaConfig::parse(&config, &fixture_json("processor_config.json")).expect_err("5x5 patches");
        assert!(err.message.starts_with("image_seq_length 16 disagrees with the tower's 5x5 patches"), "{err}");
        let config = config.replace(r#""image_seq_length": 16,"#, "");
        let err = LlavaConfig::parse(&config, &fixture_json("processor_config.json")).expect_err("crop");
        assert_eq!(err.message.as_str(), "the image processor makes 56x56 images; the CLIP tower takes 70x70");
        let err = LlavaConfig::parse("{", "").expect_err("json");
        assert!(err.message.starts_with("config.json: "), "{err}");
        let err = LlavaConfig::parse(r#"{"model_type": "llava"}"#, "").expect_err("no token");
        assert_eq!(err.message.as_str(), "config.json: no image_token_index");
    }

    #[test]
    fn processors_that_do_not_make_the_towers_square_are_refused() {
        let config = fixture_json("config.json");
        let no_crop = r#"{"image_processor": {"size": {"shortest_edge": 56}, "do_center_crop": false}}"#;
        let err = LlavaConfig::parse(&config, no_crop).expect_err("variable shape");
        assert_eq!(
            err.message.as_str(),
            "the image processor makes images of the input's own shape; the CLIP tower takes 56x56"
        );
        let exact = r#"{"image_processor": {"size": {"height": 56, "width": 56}, "do_center_crop": false}}"#;
        let c = LlavaConfig::parse(&config, exact).expect("an exact resize makes the square");
        assert_eq!((c.processor.resize, c.processor.crop), (Some(Resize::Exact { height: 56, width: 56 }), None));
        let nearest = r#"{"image_processor": {"resample": 0}}"#;
        assert!(LlavaConfig::parse(&config, nearest).expect_err("nearest").message.contains("filter 0"));
        let tokens = r#"{"num_additional_image_tokens": 0}"#;
        assert!(LlavaConfig::parse(&config, tokens).expect_err("no cls").message.contains("class token"));
        let patch = r#"{"patch_size": 16}"#;
        assert!(LlavaConfig::parse(&config, patch).expect_err("patch").message.contains("patch_size 16"));
    }
}
