//! The typed view of a Molmo2 checkpoint: `config.json` (the ViT, the pooling adapter, the
//! text width and vocabulary, the image token ids) and the processor config.
//!
//! Read as transformers 5.24's `Molmo2Config` reads it, legacy spellings included: the vision
//! config under `vision_config` or the Hub's `vit_config` (with `image_default_input_size`,
//! `image_patch_size` and `image_num_pos`), the adapter's feature layers as
//! `vision_feature_layer` or `vit_layers`. Absent keys take the config classes' defaults. The
//! processor's own fields (`image_use_col_tokens`, ...) sit beside its `image_processor`; a
//! Hub checkpoint keeps the image processor flat in `preprocessor_config.json`.
//!
//! What the graphs and the contract cannot honour is refused here, naming the field: another
//! vision activation, grouped key/value heads in the ViT or the adapter, biased projector
//! linears, a q/k norm other than `qwen3` and `olmo`, a scaled rotary embedding that skips
//! layers.

use mlxcel_family_common::{Identity, WeightDtype, processor_section};
use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::processor::ImageProcessor;

/// Everything the family varies on, parsed once and handed back to every entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Molmo2Config {
    pub model_type: String,
    pub architecture: String,
    /// The dtype the checkpoint stores its weights in; the encoder reads them so.
    pub weights: WeightDtype,
    pub tokens: Tokens,
    /// The text decoder's width, which the projector projects to.
    pub text_hidden_size: usize,
    /// The decoder's variants: the q/k norm over the whole projection (`qk_norm_type`
    /// `olmo`, else per head, `qwen3`), and the norms after each block (`norm_after`).
    pub qk_norm_whole: bool,
    pub norm_after: bool,
    pub vision: VisionConfig,
    pub adapter: AdapterConfig,
    /// The image processor's settings as given (validated by [`ImageProcessor::from_json`]).
    pub image_processor: Value,
    pub layout: BlockLayout,
}

/// The image tokens' ids (`config.json`'s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    /// `<im_start>`: opens the high-resolution block (and the low-resolution one without
    /// `use_single_crop_start_token`).
    pub image_start: u32,
    /// `<low_res_im_start>`: opens the low-resolution block.
    pub low_res_image_start: u32,
    /// `<im_end>`: closes either block.
    pub image_end: u32,
    /// `<im_patch>`: one per pooled feature row, which is added to its embedding.
    pub image_patch: u32,
    /// `<im_col>`: ends each row of patches.
    pub image_col: u32,
    /// `<frame_start>` and `<frame_end>` (video; image tokens for the bidirectional block all the same).
    pub frame_start: u32,
    pub frame_end: u32,
}

impl Tokens {
    /// Whether `id` is one of the processor's `image_token_ids` the model makes bidirectional
    /// (`mm_token_type_ids`). `<im_low>`, the eighth, has no id in `config.json`; the image
    /// blocks never hold it.
    pub fn is_image(&self, id: u32) -> bool {
        [
            self.image_patch,
            self.image_col,
            self.image_start,
            self.low_res_image_start,
            self.frame_start,
            self.image_end,
            self.frame_end,
        ]
        .contains(&id)
    }
}

/// How the processor spells an image's two blocks (`Molmo2Processor`'s own fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockLayout {
    /// `<im_col>` after each row of the high-resolution block.
    pub col_tokens: bool,
    /// `<im_col>` after each row of the low-resolution block.
    pub single_crop_col_tokens: bool,
    /// The low-resolution block opens with `<low_res_im_start>` (else `<im_start>`).
    pub single_crop_start_token: bool,
}

/// The ViT (`vision_config`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    /// Layers the checkpoint's config declares; only `0..=max(feature_layers)` are run.
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    /// The crop edge in pixels (square).
    pub image_size: usize,
    pub patch_size: usize,
    pub num_position_embeddings: usize,
    pub layer_norm_eps: f64,
    pub attention_bias: bool,
}

impl VisionConfig {
    /// Values in one patch row: 3 channels x patch x patch.
    pub fn patch_width(&self) -> usize {
        3 * self.patch_size * self.patch_size
    }

    /// Patches in one crop.
    pub fn patches(&self) -> usize {
        (self.image_size / self.patch_size).pow(2)
    }
}

/// The pooling adapter and the projector (`adapter_config`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterConfig {
    /// The ViT layers (0-based) whose outputs are concatenated, in the config's order.
    pub feature_layers: Vec<usize>,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub head_dim: usize,
    pub attention_bias: bool,
    pub intermediate_size: usize,
}

impl AdapterConfig {
    /// Width of the pooling attention's input: the concatenated features.
    pub fn pooling_input(&self, vision_hidden: usize) -> usize {
        vision_hidden * self.feature_layers.len()
    }

    /// ViT layers the graph runs: up to the deepest one read.
    pub fn layers_run(&self) -> usize {
        self.feature_layers.iter().max().map_or(0, |&l| l + 1)
    }
}

fn invalid(message: impl Into<String>) -> PluginError {
    PluginError::invalid(message)
}

fn unsupported(message: impl Into<String>) -> PluginError {
    PluginError::unsupported(message)
}

#[derive(Deserialize)]
struct RawConfig {
    #[serde(flatten)]
    identity: Identity,
    vision_config: Option<RawVision>,
    /// The Hub's (original) name of `vision_config`.
    vit_config: Option<RawVision>,
    adapter_config: Option<RawAdapter>,
    text_config: Option<RawText>,
    image_start_token_id: Option<u32>,
    low_res_image_start_token_id: Option<u32>,
    image_end_token_id: Option<u32>,
    image_patch_id: Option<u32>,
    image_col_id: Option<u32>,
    frame_start_token_id: Option<u32>,
    frame_end_token_id: Option<u32>,
}

/// `Molmo2VisionConfig` (defaults: SigLIP so400m's shape at 378 pixels).
#[derive(Deserialize)]
struct RawVision {
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    hidden_act: Option<String>,
    layer_norm_eps: Option<f64>,
    image_size: Option<Vec<usize>>,
    image_default_input_size: Option<Vec<usize>>,
    patch_size: Option<usize>,
    image_patch_size: Option<usize>,
    num_position_embeddings: Option<usize>,
    image_num_pos: Option<usize>,
    num_channels: Option<usize>,
    attention_bias: Option<bool>,
}

/// `Molmo2AdapterConfig`.
#[derive(Deserialize)]
struct RawAdapter {
    vision_feature_layer: Option<Vec<i64>>,
    vit_layers: Option<Vec<i64>>,
    hidden_size: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    attention_bias: Option<bool>,
    hidden_act: Option<String>,
    intermediate_size: Option<usize>,
    text_hidden_size: Option<usize>,
    mlp_bias: Option<bool>,
}

/// The text config's fields the family checks (the decoder library reads the rest).
#[derive(Deserialize)]
struct RawText {
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    qk_norm_type: Option<String>,
    norm_after: Option<bool>,
    rope_scaling_layers: Option<Vec<usize>>,
    rope_parameters: Option<Value>,
    rope_scaling: Option<Value>,
}

/// `processor_config.json`'s own fields, beside its `image_processor`.
#[derive(Deserialize, Default)]
struct RawProcessorRoot {
    image_use_col_tokens: Option<bool>,
    use_single_crop_col_tokens: Option<bool>,
    use_single_crop_start_token: Option<bool>,
}

/// One of two spellings of a field; both given and different is ambiguous.
fn either<T: PartialEq + std::fmt::Debug>(
    a: Option<T>,
    b: Option<T>,
    names: (&str, &str),
) -> Result<Option<T>, PluginError> {
    match (a, b) {
        (Some(a), Some(b)) if a != b => {
            Err(invalid(format!("config.json: `{}` {a:?} and `{}` {b:?} disagree", names.0, names.1)))
        }
        (Some(v), _) | (None, Some(v)) => Ok(Some(v)),
        (None, None) => Ok(None),
    }
}

impl Molmo2Config {
    /// Parses `config.json` and the processor config (empty: the processor's defaults).
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let raw: RawConfig = serde_json::from_str(config_json).map_err(|e| invalid(format!("config.json: {e}")))?;
        let weights = raw.identity.weight_dtype().map_err(invalid)?;
        let vision = match (raw.vision_config, raw.vit_config) {
            (Some(_), Some(_)) => {
                return Err(invalid("config.json: both `vision_config` and `vit_config`; which applies is ambiguous"));
            }
            (Some(v), None) | (None, Some(v)) => v,
            (None, None) => return Err(invalid("config.json: no vision_config")),
        };
        let vision = parse_vision(vision)?;
        let adapter_raw = raw.adapter_config.ok_or_else(|| invalid("config.json: no adapter_config"))?;
        let text = raw.text_config.ok_or_else(|| invalid("config.json: no text_config"))?;
        let (qk_norm_whole, norm_after) = text_variants(&text)?;
        let text_hidden_size = text.hidden_size.unwrap_or(4096);

        let adapter = parse_adapter(adapter_raw, &vision, text_hidden_size)?;

        let tokens = Tokens {
            image_start: raw.image_start_token_id.unwrap_or(151_936),
            low_res_image_start: raw.low_res_image_start_token_id.unwrap_or(151_940),
            image_end: raw.image_end_token_id.unwrap_or(151_937),
            image_patch: raw.image_patch_id.unwrap_or(151_938),
            // Not a Molmo2Config field: the processor finds `<im_col>` by name; the checkpoints
            // record it beside the others.
            image_col: raw.image_col_id.ok_or_else(|| invalid("config.json: no image_col_id (`<im_col>`)"))?,
            frame_start: raw.frame_start_token_id.unwrap_or(151_943),
            frame_end: raw.frame_end_token_id.unwrap_or(151_944),
        };

        // The image processor's object, nested (`processor_config.json`) or flat (the Hub's
        // `preprocessor_config.json`), as every family reads it.
        let image_processor: Value =
            processor_section(processor_json).map_err(|e| invalid(format!("processor config: {e}")))?;
        let processor = ImageProcessor::from_json(&image_processor).map_err(|e| invalid(format!("processor: {e}")))?;
        if processor.crop_size() != vision.image_size || processor.patch_size() != vision.patch_size {
            return Err(invalid(format!(
                "the processor cuts {}-pixel crops of {}-pixel patches; the ViT takes {} and {}",
                processor.crop_size(),
                processor.patch_size(),
                vision.image_size,
                vision.patch_size
            )));
        }
        let root: RawProcessorRoot = if processor_json.trim().is_empty() {
            RawProcessorRoot::default()
        } else {
            serde_json::from_str(processor_json).map_err(|e| invalid(format!("processor config: {e}")))?
        };
        let col_tokens = root.image_use_col_tokens.unwrap_or(true);
        let layout = BlockLayout {
            col_tokens,
            single_crop_col_tokens: root.use_single_crop_col_tokens.unwrap_or(col_tokens),
            single_crop_start_token: root.use_single_crop_start_token.unwrap_or(true),
        };
        Ok(Molmo2Config {
            model_type: raw.identity.model_type.clone(),
            architecture: raw.identity.architecture(),
            weights,
            tokens,
            text_hidden_size,
            qk_norm_whole,
            norm_after,
            vision,
            adapter,
            image_processor,
            layout,
        })
    }

    /// The image processor (validated when the config was parsed).
    pub(crate) fn processor(&self) -> Result<ImageProcessor, PluginError> {
        ImageProcessor::from_json(&self.image_processor)
            .map_err(|e| PluginError::new(mlxcel_plugin_api::ErrorCode::Internal, format!("processor: {e}")))
    }
}

fn parse_vision(v: RawVision) -> Result<VisionConfig, PluginError> {
    let act = v.hidden_act.as_deref().unwrap_or("gelu_pytorch_tanh");
    if act != "gelu_pytorch_tanh" {
        return Err(unsupported(format!("vision_config.hidden_act `{act}` (the ViT is built for gelu_pytorch_tanh)")));
    }
    let size = either(v.image_size, v.image_default_input_size, ("image_size", "image_default_input_size"))?
        .unwrap_or_else(|| vec![378, 378]);
    let &[height, width] = size.as_slice() else {
        return Err(invalid(format!("vision_config.image_size {size:?} is not [height, width]")));
    };
    if height != width {
        return Err(invalid(format!("vision_config.image_size {size:?}: the crops are square")));
    }
    let patch_size = either(v.patch_size, v.image_patch_size, ("patch_size", "image_patch_size"))?.unwrap_or(14);
    if patch_size == 0 || !height.is_multiple_of(patch_size) {
        return Err(invalid(format!(
            "vision_config: {height} pixels are not a whole number of {patch_size}-pixel patches"
        )));
    }
    let patches = (height / patch_size).pow(2);
    let positions = either(v.num_position_embeddings, v.image_num_pos, ("num_position_embeddings", "image_num_pos"))?
        .unwrap_or(patches);
    if positions != patches {
        return Err(unsupported(format!(
            "vision_config: {positions} position embeddings for {patches} patches per crop (the ViT adds them \
             without interpolation)"
        )));
    }
    let heads = v.num_attention_heads.unwrap_or(16);
    if v.num_key_value_heads.unwrap_or(heads) != heads {
        return Err(unsupported("vision_config: grouped key/value heads in the ViT".to_owned()));
    }
    if v.num_channels.unwrap_or(3) != 3 {
        return Err(invalid("vision_config: images are rgb (3 channels)".to_owned()));
    }
    let vision = VisionConfig {
        hidden_size: v.hidden_size.unwrap_or(1152),
        intermediate_size: v.intermediate_size.unwrap_or(4304),
        num_hidden_layers: v.num_hidden_layers.unwrap_or(27),
        num_attention_heads: heads,
        head_dim: v.head_dim.unwrap_or(72),
        image_size: height,
        patch_size,
        num_position_embeddings: positions,
        layer_norm_eps: v.layer_norm_eps.unwrap_or(1e-6),
        attention_bias: v.attention_bias.unwrap_or(true),
    };
    if heads == 0 || vision.head_dim == 0 {
        return Err(invalid("vision_config: no attention heads".to_owned()));
    }
    Ok(vision)
}

fn parse_adapter(a: RawAdapter, vision: &VisionConfig, text_hidden: usize) -> Result<AdapterConfig, PluginError> {
    let layers = either(a.vision_feature_layer, a.vit_layers, ("vision_feature_layer", "vit_layers"))?
        .unwrap_or_else(|| vec![24, 18]);
    let n = vision.num_hidden_layers as i64;
    let feature_layers = layers
        .iter()
        .map(|&l| match l {
            // Negative layers count from the last, as hidden_states[-k] does.
            l if (-n..0).contains(&l) => Ok((n + l) as usize),
            l if (0..n).contains(&l) => Ok(l as usize),
            l => Err(invalid(format!("adapter_config: feature layer {l} does not index the ViT's {n} layers"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if feature_layers.is_empty() {
        return Err(invalid("adapter_config: no feature layers".to_owned()));
    }
    let act = a.hidden_act.as_deref().unwrap_or("silu");
    if act != "silu" {
        return Err(unsupported(format!("adapter_config.hidden_act `{act}` (the projector is built for silu)")));
    }
    if a.mlp_bias.unwrap_or(false) {
        return Err(unsupported("adapter_config.mlp_bias (the projector's linears are unbiased)".to_owned()));
    }
    let heads = a.num_attention_heads.unwrap_or(16);
    if a.num_key_value_heads.unwrap_or(heads) != heads {
        return Err(unsupported("adapter_config: grouped key/value heads in the pooling attention".to_owned()));
    }
    if let Some(t) = a.text_hidden_size
        && t != text_hidden
    {
        return Err(invalid(format!("adapter_config.text_hidden_size {t} is not the text model's {text_hidden}")));
    }
    let adapter = AdapterConfig {
        feature_layers,
        hidden_size: a.hidden_size.unwrap_or(1152),
        num_attention_heads: heads,
        head_dim: a.head_dim.unwrap_or(72),
        attention_bias: a.attention_bias.unwrap_or(true),
        intermediate_size: a.intermediate_size.unwrap_or(18944),
    };
    if heads == 0 || adapter.head_dim == 0 {
        return Err(invalid("adapter_config: no attention heads".to_owned()));
    }
    Ok(adapter)
}

/// The text model's variants: which q/k norm (`qwen3` per head, `olmo` over the whole
/// projection; anything else refused), whether the norms sit after the blocks, and a scaled
/// rotary embedding that only some layers use, which the decoder does not build (refused).
fn text_variants(t: &RawText) -> Result<(bool, bool), PluginError> {
    let whole = match t.qk_norm_type.as_deref().unwrap_or("qwen3") {
        "qwen3" => false,
        "olmo" => true,
        other => return Err(unsupported(format!("text_config.qk_norm_type `{other}` (qwen3 or olmo)"))),
    };
    let rope = t.rope_parameters.as_ref().or(t.rope_scaling.as_ref());
    let kind = rope.and_then(|r| r.get("rope_type").or_else(|| r.get("type"))).and_then(Value::as_str);
    if let (Some(layers), Some(kind)) = (&t.rope_scaling_layers, kind)
        && kind != "default"
    {
        let n = t.num_hidden_layers.unwrap_or(36);
        if !(0..n).all(|i| layers.contains(&i)) {
            return Err(unsupported(format!(
                "text_config.rope_scaling_layers leaves layers unscaled under a `{kind}` rotary embedding"
            )));
        }
    }
    Ok((whole, t.norm_after.unwrap_or(false)))
}
