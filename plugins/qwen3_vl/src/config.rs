//! The typed view of a Qwen3-VL checkpoint: what every Qwen-VL family shares
//! ([`mlxcel_family_common::qwen_vl::QwenVl`]) and Qwen3-VL's own vision tower
//! (`Qwen3VLVisionConfig`: a biased patch embedding, learned position embeddings on a square
//! grid, LayerNorm blocks, the merger and the DeepStack mergers).
//!
//! Absent fields take `Qwen3VLVisionConfig`'s defaults (transformers 5.24), as the reference does
//! on sparse configs. A vision rotary embedding other than the axial one, a position table that
//! is not a square grid, or a DeepStack index past the last block is refused.

use mlxcel_family_common::qwen_vl::QwenVl;
use mlxcel_family_common::qwen_vl::config::{VisionAct, VisionRope, check_heads};
use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};

/// Everything the family varies on, parsed once and handed back to every entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen3VlConfig {
    pub qwen: QwenVl,
    pub vision: VisionConfig,
}

/// The tower's fields of `vision_config` (its patch geometry is [`QwenVl::geometry`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub depth: usize,
    /// The tower's width.
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    /// The mergers' output width (the text model's hidden size).
    pub out_hidden_size: usize,
    pub hidden_act: VisionAct,
    /// Rows of the learned position table, a square grid of `grid_side()` a side.
    pub num_position_embeddings: usize,
    /// The blocks whose outputs feed a DeepStack merger, the k-th one's rows added to the
    /// output of text layer k.
    pub deepstack_visual_indexes: Vec<usize>,
    pub rope_theta: f64,
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// The position grid's side: `int(num_position_embeddings ** 0.5)`.
    pub fn grid_side(&self) -> usize {
        (self.num_position_embeddings as f64).sqrt() as usize
    }
}

fn invalid(message: impl Into<String>) -> PluginError {
    PluginError::invalid(message)
}

#[derive(Deserialize)]
struct RawConfig {
    vision_config: Option<RawVision>,
}

#[derive(Deserialize)]
struct RawVision {
    #[serde(default = "default_depth")]
    depth: usize,
    #[serde(default = "default_width")]
    hidden_size: usize,
    #[serde(default = "default_intermediate")]
    intermediate_size: usize,
    #[serde(default = "default_heads")]
    num_heads: usize,
    #[serde(default = "default_out")]
    out_hidden_size: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_positions")]
    num_position_embeddings: usize,
    #[serde(default = "default_deepstack")]
    deepstack_visual_indexes: Vec<usize>,
    rope_parameters: Option<VisionRope>,
}

fn default_depth() -> usize {
    27
}
fn default_width() -> usize {
    1152
}
fn default_intermediate() -> usize {
    4304
}
fn default_heads() -> usize {
    16
}
fn default_out() -> usize {
    3584
}
fn default_act() -> String {
    "gelu_pytorch_tanh".into()
}
fn default_positions() -> usize {
    2304
}
fn default_deepstack() -> Vec<usize> {
    vec![8, 16, 24]
}

impl Qwen3VlConfig {
    /// Parses `config.json` and the processor config (empty: the processor's defaults).
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let qwen = QwenVl::parse(config_json, processor_json)?;
        let raw: RawConfig = serde_json::from_str(config_json).map_err(|e| invalid(format!("config.json: {e}")))?;
        let v = raw.vision_config.ok_or_else(|| invalid("config.json: no vision_config"))?;
        let hidden_act = VisionAct::parse(&v.hidden_act)?;
        let rope_theta = VisionRope::axial_theta(v.rope_parameters.as_ref())?;
        check_heads("hidden_size", v.hidden_size, v.num_heads)?;
        let vision = VisionConfig {
            depth: v.depth,
            hidden_size: v.hidden_size,
            intermediate_size: v.intermediate_size,
            num_heads: v.num_heads,
            out_hidden_size: v.out_hidden_size,
            hidden_act,
            num_position_embeddings: v.num_position_embeddings,
            deepstack_visual_indexes: v.deepstack_visual_indexes,
            rope_theta,
        };
        let side = vision.grid_side();
        if side < 2 || side * side != vision.num_position_embeddings {
            return Err(invalid(format!(
                "vision_config: num_position_embeddings {} is not a square grid of at least 2x2",
                vision.num_position_embeddings
            )));
        }
        let ds = &vision.deepstack_visual_indexes;
        if let Some(&i) = ds.iter().find(|&&i| i >= vision.depth) {
            return Err(invalid(format!(
                "vision_config: deepstack_visual_indexes names block {i} of {}",
                vision.depth
            )));
        }
        if ds.windows(2).any(|w| w[0] >= w[1]) {
            return Err(invalid(format!("vision_config: deepstack_visual_indexes {ds:?} must increase")));
        }
        Ok(Self { qwen, vision })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixture_config;

    #[test]
    fn the_fixture_config_parses_with_every_field_the_family_needs() {
        let c = fixture_config();
        assert_eq!(
            (c.qwen.model_type.as_str(), c.qwen.architecture.as_str()),
            ("qwen3_vl", "Qwen3VLForConditionalGeneration")
        );
        let v = &c.vision;
        assert_eq!(
            (v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.head_dim(), v.out_hidden_size),
            (2, 32, 64, 2, 16, 64)
        );
        assert_eq!(
            (v.hidden_act, v.grid_side(), v.deepstack_visual_indexes.as_slice()),
            (VisionAct::GeluPytorchTanh, 4, &[0, 1][..])
        );
        assert_eq!((c.qwen.geometry.patch_size, c.qwen.mrope_section.as_slice()), (16, &[6, 5, 5][..]));
    }

    #[test]
    fn what_the_reference_cannot_run_is_refused_by_name() {
        let dir = mlxcel_golden::Fixture::named("qwen3_vl").expect("fixture");
        let config = std::fs::read_to_string(dir.dir().join("config.json")).expect("config");
        let edit = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v: serde_json::Value = serde_json::from_str(&config).expect("json");
            f(&mut v["vision_config"]);
            Qwen3VlConfig::parse(&v.to_string(), "").expect_err("refused").message.to_string()
        };
        assert!(edit(&|v| v["num_position_embeddings"] = 15.into()).contains("not a square grid"));
        assert!(edit(&|v| v["deepstack_visual_indexes"] = serde_json::json!([2])).contains("block 2 of 2"));
        assert!(edit(&|v| v["deepstack_visual_indexes"] = serde_json::json!([1, 0])).contains("must increase"));
        assert!(edit(&|v| v["rope_parameters"]["rope_type"] = "yarn".into()).contains("`yarn`"));
        assert!(edit(&|v| v["hidden_act"] = "relu".into()).contains("`relu`"));
    }
}
