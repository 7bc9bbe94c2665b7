//! The typed view of a Qwen2-VL checkpoint: what every Qwen-VL family shares
//! ([`mlxcel_family_common::qwen_vl::QwenVl`]: the text model's width and M-RoPE sections, the
//! special token ids, the patch geometry, the image processor) and Qwen2-VL's own vision tower.

use mlxcel_family_common::qwen_vl::QwenVl;
use mlxcel_family_common::qwen_vl::config::{VisionAct, check_heads};
use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};

/// Everything the family varies on, parsed once and handed back to every entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Qwen2VlConfig {
    pub qwen: QwenVl,
    pub vision: VisionConfig,
}

/// The tower's fields of `vision_config` (its patch geometry is [`QwenVl::geometry`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisionConfig {
    pub depth: usize,
    pub embed_dim: usize,
    /// The merger's output width (the text model's hidden size).
    pub hidden_size: usize,
    pub num_heads: usize,
    pub mlp_ratio: f64,
    pub hidden_act: VisionAct,
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
    depth: usize,
    embed_dim: usize,
    hidden_size: Option<usize>,
    num_heads: usize,
    #[serde(default = "default_mlp_ratio")]
    mlp_ratio: f64,
    #[serde(default = "default_act")]
    hidden_act: String,
    rope_theta: Option<f64>,
    rope_parameters: Option<RawRope>,
}

#[derive(Deserialize)]
struct RawRope {
    rope_theta: Option<f64>,
}

fn default_mlp_ratio() -> f64 {
    4.0
}

fn default_act() -> String {
    "quick_gelu".into()
}

impl Qwen2VlConfig {
    /// Parses `config.json` and the processor config (empty: the processor's defaults).
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let qwen = QwenVl::parse(config_json, processor_json)?;
        let raw: RawConfig = serde_json::from_str(config_json).map_err(|e| invalid(format!("config.json: {e}")))?;
        let v = raw.vision_config.as_ref().ok_or_else(|| invalid("config.json: no vision_config"))?;
        let hidden_act = VisionAct::parse(&v.hidden_act)?;
        let rope_theta = v.rope_parameters.as_ref().and_then(|r| r.rope_theta).or(v.rope_theta).unwrap_or(10000.0);
        let vision = VisionConfig {
            depth: v.depth,
            embed_dim: v.embed_dim,
            hidden_size: v.hidden_size.unwrap_or(qwen.text_hidden_size as usize),
            num_heads: v.num_heads,
            mlp_ratio: v.mlp_ratio,
            hidden_act,
            rope_theta,
        };
        check_heads("embed_dim", vision.embed_dim, vision.num_heads)?;
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
            ("qwen2_vl", "Qwen2VLForConditionalGeneration")
        );
        let v = &c.vision;
        assert_eq!(
            (v.depth, v.embed_dim, v.hidden_size, v.num_heads, v.head_dim(), v.mlp_dim()),
            (2, 32, 64, 2, 16, 64)
        );
        assert_eq!(v.hidden_act, VisionAct::QuickGelu);
    }

    #[test]
    fn the_transformers_4_layout_parses_too() {
        let config = r#"{"model_type": "qwen2_vl", "architectures": ["Qwen2VLForConditionalGeneration"],
            "hidden_size": 1536, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
            "vision_end_token_id": 151653,
            "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 1536, "num_heads": 16,
              "mlp_ratio": 4, "hidden_act": "quick_gelu", "in_chans": 3, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2}}"#;
        let c = Qwen2VlConfig::parse(config, "").expect("parse");
        assert_eq!((c.vision.mlp_dim(), c.vision.rope_theta), (5120, 10000.0));
    }

    /// A field of the wrong type is an error, not the default it would otherwise take.
    #[test]
    fn a_field_of_the_wrong_type_is_refused_not_defaulted() {
        let dir = mlxcel_golden::Fixture::named("qwen2_vl").expect("fixture");
        let config = std::fs::read_to_string(dir.dir().join("config.json")).expect("config");
        let mut v: serde_json::Value = serde_json::from_str(&config).expect("json");
        v["vision_config"]["mlp_ratio"] = "four".into();
        let err = Qwen2VlConfig::parse(&v.to_string(), "").expect_err("refused");
        assert!(err.message.contains("config.json: invalid type"), "{err}");
    }
}
