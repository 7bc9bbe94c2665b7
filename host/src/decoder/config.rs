//! The text decoder's view of a Hugging Face `config.json`: a serde mirror
//! of the fields the graph needs, for the architectures the host runs.

use std::path::Path;

use serde::Deserialize;

/// Decoder architectures, by HF `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama (LLaVA's language model): optional attention bias.
    Llama,
    /// Qwen2: q/k/v projections with bias.
    Qwen2,
    /// Qwen3: per-head RMSNorm on q and k before RoPE, no bias.
    Qwen3,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }
}

/// `rope_parameters` (transformers 5) or the older top-level `rope_theta`.
#[derive(Clone, Debug, Deserialize)]
struct RopeParameters {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

/// How rotary frequencies are derived from `rope_theta`.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `1 / theta ** (2i / d)`.
    Default,
    /// Llama 3.1's smoothed low/high frequency scaling.
    Llama3 { factor: f32, low_freq_factor: f32, high_freq_factor: f32, original_context: f32 },
}

#[derive(Clone, Debug, Deserialize)]
struct RawConfig {
    model_type: String,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    vocab_size: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    hidden_act: Option<String>,
    rope_theta: Option<f64>,
    rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    use_sliding_window: bool,
}

/// A decoder configuration, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct TextConfig {
    pub arch: Arch,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_eps: f64,
    pub vocab: usize,
    pub tied_embeddings: bool,
    pub qkv_bias: bool,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
}

/// Why a config cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a valid config: {reason}")]
    Invalid { path: String, reason: String },
    #[error("model_type {0:?} has no text decoder here (supported: llama, qwen2, qwen3)")]
    Unsupported(String),
}

impl TextConfig {
    /// Reads `<dir>/config.json`.
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path)
            .map_err(|source| ConfigError::Io { path: path.display().to_string(), source })?;
        TextConfig::parse(&text).map_err(|e| match e {
            ConfigError::Invalid { reason, .. } => ConfigError::Invalid { path: path.display().to_string(), reason },
            other => other,
        })
    }

    pub fn parse(json: &str) -> Result<Self, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid { path: "config.json".into(), reason };
        let raw: RawConfig = serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?;
        let arch = match raw.model_type.as_str() {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            other => return Err(ConfigError::Unsupported(other.to_owned())),
        };
        if let Some(act) = raw.hidden_act.as_deref().filter(|a| *a != "silu") {
            return Err(invalid(format!("hidden_act {act:?} (only silu is implemented for {})", arch.name())));
        }
        if raw.use_sliding_window {
            return Err(invalid("use_sliding_window is not implemented for this decoder".into()));
        }
        let rope_scaling = match raw.rope_parameters.as_ref() {
            None => RopeScaling::Default,
            Some(r) => match r.rope_type.as_deref().unwrap_or("default") {
                "default" => RopeScaling::Default,
                "llama3" => {
                    let need = |v: Option<f64>, name: &str| {
                        v.map(|v| v as f32).ok_or_else(|| invalid(format!("llama3 rope_parameters lack {name}")))
                    };
                    RopeScaling::Llama3 {
                        factor: need(r.factor, "factor")?,
                        low_freq_factor: need(r.low_freq_factor, "low_freq_factor")?,
                        high_freq_factor: need(r.high_freq_factor, "high_freq_factor")?,
                        original_context: need(r.original_max_position_embeddings, "original_max_position_embeddings")?,
                    }
                }
                other => return Err(invalid(format!("rope_type {other:?} is not implemented (default, llama3)"))),
            },
        };
        let rope_theta = raw
            .rope_parameters
            .as_ref()
            .and_then(|r| r.rope_theta)
            .or(raw.rope_theta)
            .ok_or_else(|| invalid("no rope_theta".into()))?;
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(invalid(format!("{heads} attention heads do not group over {kv_heads} key/value heads")));
        }
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / heads);
        if !head_dim.is_multiple_of(2) {
            return Err(invalid(format!("head_dim {head_dim} is odd; rotary embedding needs pairs")));
        }
        Ok(TextConfig {
            arch,
            hidden: raw.hidden_size,
            intermediate: raw.intermediate_size,
            layers: raw.num_hidden_layers,
            heads,
            kv_heads,
            head_dim,
            rms_eps: raw.rms_norm_eps,
            vocab: raw.vocab_size,
            tied_embeddings: raw.tie_word_embeddings,
            qkv_bias: arch == Arch::Qwen2 || raw.attention_bias,
            rope_theta,
            rope_scaling,
        })
    }

    /// The rotary inverse frequencies exactly as transformers computes them:
    /// in f32, operation by operation, python scalars rounded to f32.
    pub fn inv_freq(&self) -> Vec<f32> {
        let d = self.head_dim as f32;
        let base = self.rope_theta as f32;
        let plain = (0..self.head_dim / 2).map(|i| 1.0f32 / base.powf((2 * i) as f32 / d));
        match self.rope_scaling {
            RopeScaling::Default => plain.collect(),
            RopeScaling::Llama3 { factor, low_freq_factor: low, high_freq_factor: high, original_context: old } => {
                plain
                    .map(|inv| {
                        let (low_wavelen, high_wavelen) = (old / low, old / high);
                        let wavelen = (2.0 * std::f64::consts::PI) as f32 / inv;
                        let scaled = if wavelen > low_wavelen { inv / factor } else { inv };
                        let smooth = (old / wavelen - low) / (high - low);
                        let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                        // torch: ~(wavelen < high) * ~(wavelen > low); wavelen is never NaN here.
                        let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                        if medium { smoothed } else { scaled }
                    })
                    .collect()
            }
        }
    }
}
