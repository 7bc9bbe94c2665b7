//! The typed view of a Qwen2.5-VL checkpoint: what every Qwen-VL family shares
//! ([`mlxcel_family_common::qwen_vl::QwenVl`]) and Qwen2.5-VL's own vision tower
//! (`Qwen2_5_VLVisionConfig`: RMSNorm, a gated MLP, window attention but in
//! `fullatt_block_indexes`).
//!
//! Absent fields take `Qwen2_5_VLVisionConfig`'s defaults (transformers 5.24), as the
//! reference does on the Hub's sparse configs. A vision rotary embedding other than the
//! axial one, or a window smaller than one merged unit, is refused: the reference cannot
//! run it either.

use mlxcel_family_common::qwen_vl::QwenVl;
use mlxcel_family_common::qwen_vl::config::{VisionAct, VisionRope, check_heads};
use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};

/// Everything the family varies on, parsed once and handed back to every entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen25VlConfig {
    pub qwen: QwenVl,
    pub vision: VisionConfig,
}

/// The tower's fields of `vision_config` (its patch geometry is [`QwenVl::geometry`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub depth: usize,
    /// The tower's width.
    pub hidden_size: usize,
    /// The gated MLP's inner width.
    pub intermediate_size: usize,
    pub num_heads: usize,
    /// The merger's output width (the text model's hidden size).
    pub out_hidden_size: usize,
    pub hidden_act: VisionAct,
    /// A window's side in pixels.
    pub window_size: usize,
    /// The blocks that attend over the whole image; the others attend within their window.
    pub fullatt_block_indexes: Vec<usize>,
    pub rope_theta: f64,
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
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
    #[serde(default = "default_width")]
    out_hidden_size: usize,
    #[serde(default = "default_act")]
    hidden_act: String,
    #[serde(default = "default_window")]
    window_size: usize,
    #[serde(default = "default_fullatt")]
    fullatt_block_indexes: Vec<usize>,
    rope_parameters: Option<VisionRope>,
}

fn default_depth() -> usize {
    32
}
fn default_width() -> usize {
    3584
}
fn default_intermediate() -> usize {
    3420
}
fn default_heads() -> usize {
    16
}
fn default_act() -> String {
    "silu".into()
}
fn default_window() -> usize {
    112
}
fn default_fullatt() -> Vec<usize> {
    vec![7, 15, 23, 31]
}

impl Qwen25VlConfig {
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
            window_size: v.window_size,
            fullatt_block_indexes: v.fullatt_block_indexes,
            rope_theta,
        };
        if let Some(&i) = vision.fullatt_block_indexes.iter().find(|&&i| i >= vision.depth) {
            return Err(invalid(format!("vision_config: fullatt_block_indexes names block {i} of {}", vision.depth)));
        }
        let merged = qwen.geometry.spatial_merge_size * qwen.geometry.patch_size;
        if vision.window_size < merged {
            return Err(invalid(format!(
                "vision_config: window_size {} is less than one merged unit ({merged} pixels)",
                vision.window_size
            )));
        }
        Ok(Self { qwen, vision })
    }

    /// A window's side in patches: the reference's `window_size // spatial_merge_size //
    /// patch_size` merged units, each `spatial_merge_size` patches a side.
    pub fn window_patches(&self) -> usize {
        let g = &self.qwen.geometry;
        self.vision.window_size / g.spatial_merge_size / g.patch_size * g.spatial_merge_size
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
            ("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration")
        );
        let v = &c.vision;
        assert_eq!(
            (v.depth, v.hidden_size, v.intermediate_size, v.num_heads, v.head_dim(), v.out_hidden_size),
            (2, 32, 64, 2, 16, 64)
        );
        assert_eq!((v.hidden_act, v.window_size, v.fullatt_block_indexes.as_slice()), (VisionAct::Silu, 56, &[1][..]));
        // 56 pixels: 2 merged units of 2 patches a side.
        assert_eq!(c.window_patches(), 4);
    }

    /// Qwen2.5-VL-3B-Instruct's config as the Hub has it: text fields flat, `rope_scaling`, the
    /// vision tower without `rope_parameters` and with the Hub's `in_chans`.
    #[test]
    fn the_hubs_flat_config_parses() {
        let config = r#"{"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
            "hidden_size": 2048, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "image_token_id": 151655,
            "video_token_id": 151656, "vision_start_token_id": 151652, "vision_end_token_id": 151653,
            "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
              "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14, "spatial_merge_size": 2,
              "spatial_patch_size": 14, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
              "tokens_per_second": 2, "temporal_patch_size": 2}}"#;
        let c = Qwen25VlConfig::parse(config, "").expect("parse");
        assert_eq!((c.vision.head_dim(), c.window_patches(), c.vision.rope_theta), (80, 8, 10000.0));
        assert_eq!(c.qwen.text_hidden_size, 2048);
    }

    #[test]
    fn what_the_reference_cannot_run_is_refused_by_name() {
        let dir = mlxcel_golden::Fixture::named("qwen2_5_vl").expect("fixture");
        let config = std::fs::read_to_string(dir.dir().join("config.json")).expect("config");
        let edit = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v: serde_json::Value = serde_json::from_str(&config).expect("json");
            f(&mut v["vision_config"]);
            Qwen25VlConfig::parse(&v.to_string(), "").expect_err("refused").message.to_string()
        };
        assert!(edit(&|v| v["window_size"] = 14.into()).contains("window_size 14"));
        assert!(edit(&|v| v["fullatt_block_indexes"] = serde_json::json!([2])).contains("block 2 of 2"));
        assert!(edit(&|v| v["rope_parameters"]["rope_type"] = "yarn".into()).contains("`yarn`"));
        assert!(edit(&|v| v["hidden_act"] = "relu".into()).contains("`relu`"));
        assert!(edit(&|v| v["depth"] = "two".into()).contains("config.json: invalid type"));
    }
}
