//! The plugin manifest (`<family>.toml`, installed next to the library): its schema, parsing
//! and validation. Read and validated before the library is opened.
//!
//! A capability may be marked `qualified` only with complete evidence that meets the published
//! tolerances ([`QUALIFIED_TOLERANCES`]); anything less is a validation error, so a manifest
//! cannot claim more than it proves.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::types::{Capability, Modality};
use crate::version::ApiVersion;

/// The manifest format this crate reads and writes.
pub const MANIFEST_VERSION: u32 = 1;

/// A comparison stage of the conformance evidence, in pipeline order.
pub const STAGES: [&str; 7] = ["preprocess", "placeholder", "encoder", "embeddings", "positions", "mask", "logits"];

/// The largest max-abs-diff a `qualified` capability may report per stage. Every stage listed
/// here must be present in its evidence. Positions, mask and placeholder expansion are exact.
pub const QUALIFIED_TOLERANCES: [(&str, f64); 6] = [
    ("preprocess", 1e-6),
    ("placeholder", 0.0),
    ("encoder", 1e-4),
    ("positions", 0.0),
    ("mask", 0.0),
    ("logits", 1e-4),
];

/// A plugin manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The manifest format, [`MANIFEST_VERSION`].
    pub manifest_version: u32,
    /// The plugin and its library.
    pub plugin: PluginSection,
    /// Which checkpoints the plugin accepts.
    pub accepts: Accepts,
    /// Input modalities: `image`, `audio`, `video`.
    pub modalities: Vec<String>,
    /// Request limits the host enforces before calling the plugin.
    #[serde(default)]
    pub limits: Limits,
    /// Qualification status per capability (`image`, `multi_image`, `audio`, `video`).
    pub capabilities: BTreeMap<String, CapabilityEntry>,
    /// Qualification status per checkpoint form beyond transformers' own (f32, bf16, f16 and the
    /// Hub's older layout, which the capabilities' evidence covers): [`FORMS`]. Media from a
    /// checkpoint of a form not listed here is refused; an `experimental` one is served only
    /// with the opt-in flag.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub forms: BTreeMap<String, FormEntry>,
    /// How the family's models write what the chat API returns in its own fields.
    #[serde(default, skip_serializing_if = "Chat::is_empty")]
    pub chat: Chat,
}

/// `[chat]`: the family's conventions in generated text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chat {
    /// The syntax its models call tools in, one of [`TOOL_CALL_FORMATS`]; absent, requests
    /// with `tools` are refused (the host never guesses a syntax).
    pub tool_call_format: Option<String>,
}

impl Chat {
    fn is_empty(&self) -> bool {
        self.tool_call_format.is_none()
    }
}

/// The tool-call syntaxes the host parses: `hermes`, each call a JSON object
/// `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>` lines (Qwen2.5,
/// Qwen3 and their vision-language models, as their chat templates render past calls).
pub const TOOL_CALL_FORMATS: [&str; 1] = ["hermes"];

/// The checkpoint forms a manifest may qualify: `mlx_affine`, the MLX community's
/// affine-quantized checkpoints (`quantization` in `config.json`, packed `uint32` weights with
/// scales and biases, MLX's key names and channels-last convolution kernels), against MLX's own
/// reference (mlx-vlm on mlx-cpu).
pub const FORMS: [&str; 1] = ["mlx_affine"];

/// `[forms.<name>]`: how far a checkpoint form is qualified for the plugin's capabilities.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FormEntry {
    /// The status.
    pub status: Status,
    /// Why, in a sentence (required unless qualified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// For `experimental`: the first stage (of [`STAGES`]) at which the form diverges from its
    /// reference, as `plugins verify` reports it; the conformance test holds it there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_divergence: Option<String>,
    /// The conformance evidence; required for `qualified`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
}

/// `[plugin]`: identity and library.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSection {
    /// Family name, `[a-z0-9-]+`, e.g. `qwen2-vl`.
    pub name: String,
    /// The plugin's own semver.
    pub version: String,
    /// The plugin-api version the library was built against, `MAJOR.MINOR`; the plugin
    /// requires a host at `^MAJOR.MINOR`.
    pub plugin_api: String,
    /// The library's file name, in the same directory as the manifest.
    pub library: String,
    /// Lowercase hex sha256 of the library file.
    pub sha256: String,
}

/// `[accepts]`: HF config values the plugin serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Accepts {
    /// HF `architectures` entries.
    #[serde(default)]
    pub architectures: Vec<String>,
    /// HF `model_type` values.
    #[serde(default)]
    pub model_types: Vec<String>,
}

/// `[limits]`: per-request bounds.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Most pixels in one image after decoding.
    pub max_pixels_per_image: Option<u64>,
    /// The pixel budget of OpenAI's `image_url.detail: "low"`, for a family whose processor
    /// shrinks an image to fit `PreprocessOptions::max_pixels` through its own resize rule
    /// (Qwen-VL's `smart_resize`): the host preprocesses a `low` image with this bound instead
    /// of `max_pixels_per_image`. The in-tree families that resize so declare 262144 (512x512,
    /// the size OpenAI serves `low` at). Absent for a family that refuses an image over the
    /// bound or sees every image at one size: `low` is then served at its one resolution.
    pub low_detail_max_pixels: Option<u64>,
    /// Most images in one request.
    pub max_images_per_request: Option<u32>,
    /// Most seconds of audio in one request.
    pub max_audio_seconds_per_request: Option<f64>,
}

/// Qualification status of one capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Matches the reference stage by stage and token-exact, single and batched.
    Qualified,
    /// Implemented but not (yet) at parity; served only with the opt-in flag.
    Experimental,
    /// Not implemented; never served.
    Unsupported,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Qualified => "qualified",
            Status::Experimental => "experimental",
            Status::Unsupported => "unsupported",
        })
    }
}

/// `[capabilities.<name>]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapabilityEntry {
    /// The status.
    pub status: Status,
    /// Why, in a sentence (required unless qualified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The conformance evidence; required for `qualified`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
}

/// What a conformance run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    /// The reference implementation, e.g. `transformers`.
    pub reference: String,
    /// Versions of the reference stack, e.g. `transformers = "5.0.0"`, `torch = "2.9.0"`.
    pub reference_versions: BTreeMap<String, String>,
    /// The fixture directory or id the goldens came from.
    pub fixture: String,
    /// Max-abs-diff per stage (see [`STAGES`]).
    pub max_abs_diff: BTreeMap<String, f64>,
    /// Greedy tokens identical to the reference.
    pub greedy_tokens_matched: u32,
    /// Greedy tokens compared.
    pub greedy_tokens_total: u32,
    /// Whether the run included mixed batches with other requests.
    pub batched: bool,
    /// When the run happened (a TOML date, `2026-08-01`).
    pub date: toml::value::Datetime,
}

impl Manifest {
    /// Parses and validates manifest text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let invalid = |problem: String| Error::InvalidManifest { path: path.to_owned(), problem };
        let manifest: Manifest = toml::from_str(text).map_err(|e| invalid(toml_message(&e, text)))?;
        manifest.validate().map_err(invalid)?;
        Ok(manifest)
    }

    /// Reads, parses and validates a manifest file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io { path: path.to_owned(), source })?;
        Self::parse(&text, path)
    }

    /// Serializes to TOML (for tools that write manifests).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("invariant: manifests serialize")
    }

    /// The plugin-api version the manifest declares (validated).
    pub fn plugin_api(&self) -> ApiVersion {
        self.plugin.plugin_api.parse().expect("invariant: validated manifests have a version")
    }

    /// The declared modalities (validated).
    pub fn modalities(&self) -> Vec<Modality> {
        self.modalities.iter().filter_map(|m| modality_from_name(m)).collect()
    }

    /// The capabilities with their entries (validated).
    pub fn capabilities(&self) -> impl Iterator<Item = (Capability, &CapabilityEntry)> {
        self.capabilities.iter().filter_map(|(k, v)| Capability::from_name(k).map(|c| (c, v)))
    }

    /// The entry for one capability, if declared.
    pub fn capability(&self, capability: Capability) -> Option<&CapabilityEntry> {
        self.capabilities.get(capability.as_str())
    }

    /// The entry for one checkpoint form (of [`FORMS`]), if declared.
    pub fn form(&self, form: &str) -> Option<&FormEntry> {
        self.forms.get(form)
    }

    /// Checks every rule that parsing alone does not; returns the first problem.
    pub fn validate(&self) -> Result<(), String> {
        if self.manifest_version != MANIFEST_VERSION {
            return Err(format!(
                "manifest_version {} is not supported (this host reads {MANIFEST_VERSION})",
                self.manifest_version
            ));
        }
        let p = &self.plugin;
        let name_ok =
            !p.name.is_empty() && p.name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !name_ok {
            return Err(format!("plugin.name `{}` must match [a-z0-9-]+", p.name));
        }
        semver::Version::parse(&p.version).map_err(|e| format!("plugin.version `{}` is not semver: {e}", p.version))?;
        p.plugin_api.parse::<ApiVersion>().map_err(|e| format!("plugin.plugin_api: {e}"))?;
        let plain_file =
            !p.library.is_empty() && !p.library.contains(['/', '\\']) && p.library != "." && p.library != "..";
        if !plain_file {
            return Err(format!("plugin.library `{}` must be a file name in the manifest's directory", p.library));
        }
        let sha_ok = p.sha256.len() == 64 && p.sha256.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c));
        if !sha_ok {
            return Err(format!("plugin.sha256 `{}` must be 64 lowercase hex digits", p.sha256));
        }
        if self.accepts.architectures.is_empty() && self.accepts.model_types.is_empty() {
            return Err("accepts must list at least one architecture or model_type".to_owned());
        }
        if self.modalities.is_empty() {
            return Err("modalities must not be empty".to_owned());
        }
        for m in &self.modalities {
            if modality_from_name(m).is_none() {
                return Err(format!("unknown modality `{m}` (known: image, audio, video)"));
            }
        }
        let limits = &self.limits;
        if limits.max_pixels_per_image == Some(0)
            || limits.max_images_per_request == Some(0)
            || limits.low_detail_max_pixels == Some(0)
        {
            return Err("limits must be positive when given".to_owned());
        }
        if let (Some(low), Some(max)) = (limits.low_detail_max_pixels, limits.max_pixels_per_image)
            && low > max
        {
            return Err(format!(
                "limits.low_detail_max_pixels {low} exceeds limits.max_pixels_per_image {max} (a low-detail budget only tightens the limit)"
            ));
        }
        if limits.low_detail_max_pixels.is_some() && !self.modalities.iter().any(|m| m == Modality::Image.as_str()) {
            return Err("limits.low_detail_max_pixels needs modality `image`".to_owned());
        }
        if let Some(seconds) = limits.max_audio_seconds_per_request
            && !(seconds.is_finite() && seconds > 0.0)
        {
            return Err("limits.max_audio_seconds_per_request must be positive".to_owned());
        }
        if let Some(format) = &self.chat.tool_call_format
            && !TOOL_CALL_FORMATS.contains(&format.as_str())
        {
            return Err(format!("chat.tool_call_format `{format}` is not one the host parses (known: hermes)"));
        }
        if self.capabilities.is_empty() {
            return Err("capabilities must declare at least one capability".to_owned());
        }
        for (name, entry) in &self.capabilities {
            let capability = Capability::from_name(name)
                .ok_or_else(|| format!("unknown capability `{name}` (known: image, multi_image, audio, video)"))?;
            let needs = needed_modality(capability);
            if !self.modalities.iter().any(|m| m == needs.as_str()) {
                return Err(format!("capability `{name}` needs modality `{}`", needs.as_str()));
            }
            entry.validate().map_err(|e| format!("capabilities.{name}: {e}"))?;
        }
        for (name, entry) in &self.forms {
            if !FORMS.contains(&name.as_str()) {
                return Err(format!("unknown checkpoint form `{name}` (known: {})", FORMS.join(", ")));
            }
            entry.validate().map_err(|e| format!("forms.{name}: {e}"))?;
        }
        Ok(())
    }
}

impl FormEntry {
    fn validate(&self) -> Result<(), String> {
        let capability =
            CapabilityEntry { status: self.status, note: self.note.clone(), evidence: self.evidence.clone() };
        capability.validate()?;
        match (self.status, self.first_divergence.as_deref()) {
            (Status::Experimental, None) => Err("status `experimental` requires first_divergence".to_owned()),
            (Status::Experimental, Some(stage)) if !STAGES.contains(&stage) => {
                Err(format!("first_divergence `{stage}` is not a stage ({})", STAGES.join(", ")))
            }
            (Status::Qualified, Some(_)) => Err("a qualified form has no first_divergence".to_owned()),
            _ => Ok(()),
        }
    }
}

impl CapabilityEntry {
    fn validate(&self) -> Result<(), String> {
        if let Some(evidence) = &self.evidence {
            evidence.validate_shape()?;
        }
        match self.status {
            Status::Qualified => {
                let evidence = self.evidence.as_ref().ok_or("status `qualified` requires evidence")?;
                evidence.validate_qualified()
            }
            Status::Experimental | Status::Unsupported => match self.note.as_deref().map(str::trim) {
                Some(note) if !note.is_empty() => Ok(()),
                _ => Err(format!("status `{}` requires a note saying why", self.status)),
            },
        }
    }
}

impl Evidence {
    /// Rules for any evidence, whatever the status.
    fn validate_shape(&self) -> Result<(), String> {
        if self.reference.trim().is_empty() {
            return Err("evidence.reference must not be empty".to_owned());
        }
        if self.reference_versions.is_empty() {
            return Err("evidence.reference_versions must name the reference's versions".to_owned());
        }
        if self.fixture.trim().is_empty() {
            return Err("evidence.fixture must not be empty".to_owned());
        }
        for (stage, diff) in &self.max_abs_diff {
            if !STAGES.contains(&stage.as_str()) {
                return Err(format!("evidence.max_abs_diff has unknown stage `{stage}`"));
            }
            if !(diff.is_finite() && *diff >= 0.0) {
                return Err(format!("evidence.max_abs_diff.{stage} must be a finite non-negative number"));
            }
        }
        if self.greedy_tokens_matched > self.greedy_tokens_total {
            return Err("evidence.greedy_tokens_matched exceeds greedy_tokens_total".to_owned());
        }
        if self.date.date.is_none() || self.date.time.is_some() {
            return Err("evidence.date must be a date such as 2026-08-01".to_owned());
        }
        Ok(())
    }

    /// The bar for `qualified`.
    fn validate_qualified(&self) -> Result<(), String> {
        for (stage, tolerance) in QUALIFIED_TOLERANCES {
            match self.max_abs_diff.get(stage) {
                None => return Err(format!("qualified evidence lacks stage `{stage}`")),
                Some(diff) if *diff > tolerance => {
                    return Err(format!(
                        "qualified evidence has {stage} max-abs-diff {diff:e}, over the tolerance {tolerance:e}"
                    ));
                }
                Some(_) => {}
            }
        }
        if self.greedy_tokens_total == 0 || self.greedy_tokens_matched != self.greedy_tokens_total {
            return Err(format!(
                "qualified requires token-exact greedy decoding, got {}/{}",
                self.greedy_tokens_matched, self.greedy_tokens_total
            ));
        }
        if !self.batched {
            return Err("qualified requires evidence from mixed batches (batched = true)".to_owned());
        }
        Ok(())
    }
}

/// Which modality a capability needs.
fn needed_modality(capability: Capability) -> Modality {
    match capability {
        Capability::Image | Capability::MultiImage => Modality::Image,
        Capability::Audio => Modality::Audio,
        Capability::Video => Modality::Video,
    }
}

/// Parses a manifest modality name.
pub fn modality_from_name(name: &str) -> Option<Modality> {
    Modality::ALL.into_iter().find(|m| m.as_str() == name)
}

/// toml's message with a lowercase start, no trailing period, and the line it points at.
fn toml_message(error: &toml::de::Error, text: &str) -> String {
    let message = error.message().trim_end_matches('.');
    let mut chars = message.chars();
    let lowered = match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    };
    match error.span() {
        Some(span) => {
            let line = text.get(..span.start).map_or(0, |before| before.matches('\n').count()) + 1;
            format!("{lowered} (line {line})")
        }
        None => lowered,
    }
}

#[cfg(test)]
mod tests;
