//! The typed view of a Gemma 3n checkpoint's audio side: `config.json` (the audio encoder's
//! `audio_config`, the token ids and vocabulary ranges of the multimodal embedders, the text
//! model's width and vocabulary) and the processor config (`Gemma3nAudioFeatureExtractor`'s
//! settings and the processor's `audio_seq_length`).
//!
//! Absent keys take the defaults of transformers' `Gemma3nConfig`, `Gemma3nAudioConfig`,
//! `Gemma3nAudioFeatureExtractor` and `Gemma3nProcessor`. Fields that change the arithmetic and
//! are not implemented (dither, left padding, more or fewer than two subsampling convolutions)
//! are refused, never ignored. The vision tower is not read: images are not served.

use mlxcel_family_common::{Identity, WeightDtype};
use mlxcel_plugin_api::PluginError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The epsilon of the conformer's own RMSNorms: transformers builds them with
/// `Gemma3nRMSNorm(hidden_size)`, whose default this is, whatever `rms_norm_eps` says (only the
/// light convolution's two norms and the embedder's take the config's).
pub(crate) const CONFORMER_NORM_EPS: f64 = 1e-6;

/// Everything the family varies on, parsed once and handed back to every entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gemma3nConfig {
    pub model_type: String,
    pub architecture: String,
    /// The dtype the checkpoint stores its weights in; the encoder reads them so.
    pub weights: WeightDtype,
    /// Width of the text decoder, which the audio embedder projects to.
    pub text_hidden_size: u32,
    /// The text model's vocabulary, multimodal ids included; its last id is the audio padding
    /// token whose embedding fills the soft tokens the clip does not cover.
    pub text_vocab_size: u32,
    /// Soft tokens per clip (`audio_soft_tokens_per_image`).
    pub audio_soft_tokens: u32,
    /// `<audio_soft_token>`: the positions that receive the encoder's rows.
    pub audio_token_id: u32,
    /// `<start_of_audio>`, a text token.
    pub boa_token_id: u32,
    /// `<end_of_audio>`, a hard token of the audio embedder's vocabulary.
    pub eoa_token_id: u32,
    /// The first id of the vision embedder's vocabulary: ids from here up to the audio
    /// vocabulary are embedded by `embed_vision`, which this plugin does not have.
    pub vision_vocab_offset: u32,
    pub audio: AudioConfig,
    pub features: FeatureConfig,
}

/// `audio_config` (`Gemma3nAudioConfig`): the USM-style conformer and the audio embedder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AudioConfig {
    pub hidden_size: usize,
    /// Mel bins per frame.
    pub input_feat_size: usize,
    pub rms_norm_eps: f64,
    /// The clamp applied around each residual branch (`gradient_clipping`).
    pub gradient_clipping: f64,
    pub num_attention_heads: usize,
    pub num_hidden_layers: usize,
    /// `conf_attention_chunk_size`: how the reference blocks its local attention. Every query
    /// sees the same keys whatever the chunk, so it does not enter the graph.
    pub attention_chunk_size: usize,
    /// `conf_attention_context_left`: a query sees this many frames minus one before it.
    pub attention_context_left: usize,
    /// `conf_attention_context_right`: and this many after it.
    pub attention_context_right: usize,
    pub attention_logit_cap: f64,
    pub conv_kernel_size: usize,
    pub reduction_factor: usize,
    pub residual_weight: f64,
    /// Output channels of the two subsampling convolutions.
    pub sscp_channels: [usize; 2],
    /// `(time, frequency)` kernels of the two convolutions.
    pub sscp_kernels: [[usize; 2]; 2],
    /// `(time, frequency)` strides of the two convolutions.
    pub sscp_strides: [[usize; 2]; 2],
    pub sscp_group_norm_eps: f64,
    /// The audio embedder's hard-token vocabulary: `vocab_size` ids from `vocab_offset`.
    pub vocab_size: u32,
    pub vocab_offset: u32,
}

impl AudioConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Frames a query sees before itself (`max(0, context_left - 1)`).
    pub fn max_past(&self) -> usize {
        self.attention_context_left.saturating_sub(1)
    }

    /// Relative positions a query sees, itself included.
    pub fn attention_span(&self) -> usize {
        self.max_past() + self.attention_context_right + 1
    }

    /// Mel frames per subsampled frame (the time strides' product).
    pub fn time_stride(&self) -> usize {
        self.sscp_strides[0][0] * self.sscp_strides[1][0]
    }

    /// Mel frames per encoder output row.
    pub fn frames_per_row(&self) -> usize {
        self.time_stride() * self.reduction_factor
    }

    /// The frequency bins after the first and after the second convolution (each pads one
    /// bin on both sides, as the reference hard-codes).
    pub fn sscp_freqs(&self) -> [usize; 2] {
        let out = |f: usize, i: usize| (f + 2 - self.sscp_kernels[i][1]) / self.sscp_strides[i][1] + 1;
        let first = out(self.input_feat_size, 0);
        [first, out(first, 1)]
    }
}

/// `Gemma3nAudioFeatureExtractor`'s settings, resolved as its constructor resolves them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureConfig {
    pub sampling_rate: u32,
    pub feature_size: usize,
    /// Samples per frame (`round(sampling_rate * frame_length_ms / 1000)`).
    pub frame_length: usize,
    /// Samples between frame starts.
    pub hop_length: usize,
    pub fft_length: usize,
    pub min_frequency: f64,
    pub max_frequency: f64,
    pub preemphasis: f64,
    pub preemphasis_htk_flavor: bool,
    pub mel_floor: f64,
    pub input_scale_factor: f64,
    /// The value the waveform is padded with (to a multiple of 128 samples).
    pub padding_value: f64,
    pub per_bin_mean: Option<Vec<f64>>,
    pub per_bin_stddev: Option<Vec<f64>>,
}

impl Gemma3nConfig {
    /// The factor text embeddings are scaled by: `sqrt(hidden)` rounded to f32, as the text
    /// model's `Gemma3nTextScaledWordEmbedding` computes it.
    pub fn text_scale(&self) -> f32 {
        f64::from(self.text_hidden_size).sqrt() as f32
    }

    /// The audio embedder's row for the padding token (`text vocab_size - 1`).
    pub fn padding_row(&self) -> usize {
        (self.text_vocab_size - 1 - self.audio.vocab_offset) as usize
    }

    /// The audio embedder's row for `<end_of_audio>`.
    pub fn eoa_row(&self) -> usize {
        (self.eoa_token_id - self.audio.vocab_offset) as usize
    }

    /// The encoder's rows for a clip of `frames` mel frames, padding included: one per
    /// `frames_per_row` frames, rounded up (each convolution and the reduction keep the first
    /// frame of every stride).
    pub fn rows_for_frames(&self, frames: usize) -> usize {
        frames.div_ceil(self.audio.frames_per_row())
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
    text_config: Option<RawText>,
    audio_config: Option<RawAudio>,
    vision_config: Option<RawVision>,
    audio_soft_tokens_per_image: Option<u32>,
    audio_token_id: Option<u32>,
    boa_token_id: Option<u32>,
    eoa_token_id: Option<u32>,
}

#[derive(Deserialize)]
struct RawText {
    model_type: Option<String>,
    hidden_size: Option<u32>,
    vocab_size: Option<u32>,
}

#[derive(Deserialize, Default)]
struct RawVision {
    vocab_offset: Option<u32>,
}

#[derive(Deserialize, Default)]
struct RawAudio {
    model_type: Option<String>,
    vocab_size: Option<u32>,
    vocab_offset: Option<u32>,
    input_feat_size: Option<usize>,
    hidden_size: Option<usize>,
    rms_norm_eps: Option<f64>,
    gradient_clipping: Option<f64>,
    conf_attention_chunk_size: Option<usize>,
    conf_attention_context_left: Option<usize>,
    conf_attention_context_right: Option<usize>,
    conf_attention_logit_cap: Option<f64>,
    conf_num_attention_heads: Option<usize>,
    conf_num_hidden_layers: Option<usize>,
    conf_conv_kernel_size: Option<usize>,
    conf_reduction_factor: Option<usize>,
    conf_residual_weight: Option<f64>,
    sscp_conv_channel_size: Option<Vec<usize>>,
    sscp_conv_group_norm_eps: Option<f64>,
    sscp_conv_kernel_size: Option<Vec<Vec<usize>>>,
    sscp_conv_stride_size: Option<Vec<Vec<usize>>>,
}

/// The feature extractor's fields (nested under `feature_extractor` in transformers 5's
/// `processor_config.json`, flat in the Hub's `preprocessor_config.json`).
#[derive(Deserialize, Default)]
struct RawFeatures {
    feature_extractor_type: Option<String>,
    feature_size: Option<usize>,
    sampling_rate: Option<u32>,
    padding_value: Option<f64>,
    padding_side: Option<String>,
    frame_length_ms: Option<f64>,
    hop_length_ms: Option<f64>,
    // Saved by `to_dict` but ignored by the constructor, which recomputes them from the
    // millisecond fields; read only to refuse a config whose saved values say otherwise.
    frame_length: Option<usize>,
    hop_length: Option<usize>,
    fft_length: Option<usize>,
    min_frequency: Option<f64>,
    max_frequency: Option<f64>,
    preemphasis: Option<f64>,
    preemphasis_htk_flavor: Option<bool>,
    fft_overdrive: Option<bool>,
    dither: Option<f64>,
    input_scale_factor: Option<f64>,
    mel_floor: Option<f64>,
    per_bin_mean: Option<Vec<f64>>,
    per_bin_stddev: Option<Vec<f64>>,
}

/// `processor_config.json`'s own field.
#[derive(Deserialize, Default)]
struct RawProcessorRoot {
    audio_seq_length: Option<u32>,
}

/// A `[[time, freq], [time, freq]]` list of exactly the reference's two convolutions.
fn pairs(name: &str, given: Option<Vec<Vec<usize>>>, default: [[usize; 2]; 2]) -> Result<[[usize; 2]; 2], PluginError> {
    let Some(given) = given else { return Ok(default) };
    let pair = |v: &Vec<usize>| -> Option<[usize; 2]> {
        match v.as_slice() {
            &[t, f] if t > 0 && f > 0 => Some([t, f]),
            _ => None,
        }
    };
    match given.as_slice() {
        [a, b] => match (pair(a), pair(b)) {
            (Some(a), Some(b)) => Ok([a, b]),
            _ => Err(invalid(format!("audio_config.{name} {given:?}: each entry is a positive (time, freq) pair"))),
        },
        _ => Err(unsupported(format!(
            "audio_config.{name} has {} entries; the reference's subsampling has exactly two convolutions",
            given.len()
        ))),
    }
}

impl AudioConfig {
    fn parse(raw: RawAudio) -> Result<Self, PluginError> {
        if let Some(kind) = raw.model_type.as_deref()
            && kind != "gemma3n_audio"
        {
            return Err(unsupported(format!("audio_config.model_type `{kind}` (gemma3n takes gemma3n_audio)")));
        }
        let channels = match raw.sscp_conv_channel_size.as_deref() {
            None => [128, 32],
            Some(&[a, b]) if a > 0 && b > 0 => [a, b],
            Some(other) => {
                return Err(unsupported(format!(
                    "audio_config.sscp_conv_channel_size {other:?}: the reference's subsampling has exactly two \
                     convolutions"
                )));
            }
        };
        let config = AudioConfig {
            hidden_size: raw.hidden_size.unwrap_or(1536),
            input_feat_size: raw.input_feat_size.unwrap_or(128),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            gradient_clipping: raw.gradient_clipping.unwrap_or(1e10),
            num_attention_heads: raw.conf_num_attention_heads.unwrap_or(8),
            num_hidden_layers: raw.conf_num_hidden_layers.unwrap_or(12),
            attention_chunk_size: raw.conf_attention_chunk_size.unwrap_or(12),
            attention_context_left: raw.conf_attention_context_left.unwrap_or(13),
            attention_context_right: raw.conf_attention_context_right.unwrap_or(0),
            attention_logit_cap: raw.conf_attention_logit_cap.unwrap_or(50.0),
            conv_kernel_size: raw.conf_conv_kernel_size.unwrap_or(5),
            reduction_factor: raw.conf_reduction_factor.unwrap_or(4),
            residual_weight: raw.conf_residual_weight.unwrap_or(0.5),
            sscp_channels: channels,
            sscp_kernels: pairs("sscp_conv_kernel_size", raw.sscp_conv_kernel_size, [[3, 3], [3, 3]])?,
            sscp_strides: pairs("sscp_conv_stride_size", raw.sscp_conv_stride_size, [[2, 2], [2, 2]])?,
            sscp_group_norm_eps: raw.sscp_conv_group_norm_eps.unwrap_or(1e-3),
            vocab_size: raw.vocab_size.unwrap_or(128),
            vocab_offset: raw.vocab_offset.unwrap_or(262_144 + 128),
        };
        let a = &config;
        let positive = [
            ("hidden_size", a.hidden_size),
            ("input_feat_size", a.input_feat_size),
            ("conf_num_attention_heads", a.num_attention_heads),
            ("conf_attention_chunk_size", a.attention_chunk_size),
            ("conf_conv_kernel_size", a.conv_kernel_size),
            ("conf_reduction_factor", a.reduction_factor),
            ("vocab_size", a.vocab_size as usize),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(invalid(format!("audio_config.{name} is 0")));
        }
        if !a.hidden_size.is_multiple_of(a.num_attention_heads) {
            return Err(invalid(format!(
                "audio_config.hidden_size {} is not a multiple of conf_num_attention_heads {}",
                a.hidden_size, a.num_attention_heads
            )));
        }
        // The relative position embedding concatenates hidden/2 sines and as many cosines.
        if !a.hidden_size.is_multiple_of(2) {
            return Err(invalid(format!("audio_config.hidden_size {} is odd", a.hidden_size)));
        }
        if !(a.attention_logit_cap.is_finite() && a.attention_logit_cap > 0.0) {
            return Err(invalid(format!("audio_config.conf_attention_logit_cap {}", a.attention_logit_cap)));
        }
        if a.gradient_clipping.is_nan() || a.gradient_clipping <= 0.0 {
            return Err(invalid(format!("audio_config.gradient_clipping {}", a.gradient_clipping)));
        }
        // Each convolution pads one frequency bin on both sides; its kernel must fit in that.
        let first_in = a.input_feat_size;
        let fits_first = first_in + 2 >= a.sscp_kernels[0][1];
        if !fits_first || (first_in + 2 - a.sscp_kernels[0][1]) / a.sscp_strides[0][1] + 1 + 2 < a.sscp_kernels[1][1] {
            return Err(invalid(format!(
                "audio_config.sscp_conv_kernel_size {:?} is wider than the padded frequency bins",
                a.sscp_kernels
            )));
        }
        Ok(config)
    }
}

impl FeatureConfig {
    fn parse(raw: RawFeatures, input_feat_size: usize) -> Result<Self, PluginError> {
        let what = "the feature extractor config";
        if let Some(kind) = raw.feature_extractor_type.as_deref()
            && kind != "Gemma3nAudioFeatureExtractor"
        {
            return Err(unsupported(format!("{what}: feature_extractor_type `{kind}`")));
        }
        if raw.dither.is_some_and(|d| d != 0.0) {
            return Err(unsupported(format!(
                "{what}: dither {} (random noise added to every clip is not reproducible; set it to 0.0)",
                raw.dither.unwrap_or_default()
            )));
        }
        if let Some(side) = raw.padding_side.as_deref()
            && side != "right"
        {
            return Err(unsupported(format!("{what}: padding_side `{side}` (only right padding is implemented)")));
        }
        let sampling_rate = raw.sampling_rate.unwrap_or(16_000);
        let feature_size = raw.feature_size.unwrap_or(128);
        if sampling_rate == 0 {
            return Err(invalid(format!("{what}: sampling_rate 0")));
        }
        if feature_size != input_feat_size {
            return Err(invalid(format!(
                "{what}: feature_size {feature_size} differs from config.json's audio_config.input_feat_size \
                 {input_feat_size}"
            )));
        }
        // Python's int(round(x)): halves to even.
        let samples = |ms: f64| (f64::from(sampling_rate) * ms / 1000.0).round_ties_even();
        let frame_length = samples(raw.frame_length_ms.unwrap_or(32.0));
        let hop_length = samples(raw.hop_length_ms.unwrap_or(10.0));
        if !(frame_length >= 1.0 && hop_length >= 1.0 && frame_length < 1e7 && hop_length < 1e7) {
            return Err(invalid(format!("{what}: frames of {frame_length} samples every {hop_length}")));
        }
        let (frame_length, hop_length) = (frame_length as usize, hop_length as usize);
        let mut fft_length = frame_length.next_power_of_two();
        if raw.fft_overdrive.unwrap_or(true) {
            fft_length *= 2;
        }
        for (name, saved, used) in [
            ("frame_length", raw.frame_length, frame_length),
            ("hop_length", raw.hop_length, hop_length),
            ("fft_length", raw.fft_length, fft_length),
        ] {
            if let Some(saved) = saved
                && saved != used
            {
                return Err(invalid(format!(
                    "{what}: {name} {saved} disagrees with the {used} that Gemma3nAudioFeatureExtractor derives \
                     from the sampling rate and frame_length_ms/hop_length_ms (it ignores the saved value)"
                )));
            }
        }
        let min_frequency = raw.min_frequency.unwrap_or(125.0);
        let max_frequency = raw.max_frequency.unwrap_or(7600.0);
        if !(min_frequency >= 0.0 && min_frequency < max_frequency) {
            return Err(invalid(format!("{what}: mel range {min_frequency} to {max_frequency} Hz")));
        }
        for (name, bins) in [("per_bin_mean", &raw.per_bin_mean), ("per_bin_stddev", &raw.per_bin_stddev)] {
            if let Some(bins) = bins
                && bins.len() != feature_size
            {
                return Err(invalid(format!("{what}: {name} has {} values for {feature_size} bins", bins.len())));
            }
        }
        Ok(FeatureConfig {
            sampling_rate,
            feature_size,
            frame_length,
            hop_length,
            fft_length,
            min_frequency,
            max_frequency,
            preemphasis: raw.preemphasis.unwrap_or(0.97),
            preemphasis_htk_flavor: raw.preemphasis_htk_flavor.unwrap_or(true),
            mel_floor: raw.mel_floor.unwrap_or(1e-5),
            input_scale_factor: raw.input_scale_factor.unwrap_or(1.0),
            padding_value: raw.padding_value.unwrap_or(0.0),
            per_bin_mean: raw.per_bin_mean,
            per_bin_stddev: raw.per_bin_stddev,
        })
    }
}

/// The feature extractor's section of the processor config: `feature_extractor` when nested,
/// else the whole object; an empty text is the defaults.
fn feature_section(json: &str) -> Result<(RawFeatures, RawProcessorRoot), serde_json::Error> {
    if json.trim().is_empty() {
        return Ok((RawFeatures::default(), RawProcessorRoot::default()));
    }
    let mut root: Value = serde_json::from_str(json)?;
    let processor_root: RawProcessorRoot = serde_json::from_value(root.clone())?;
    let section = match root.get_mut("feature_extractor") {
        Some(nested) => nested.take(),
        None => root,
    };
    Ok((serde_json::from_value(section)?, processor_root))
}

impl Gemma3nConfig {
    /// Parses `config.json` and the processor config (empty: the processor's defaults).
    pub fn parse(config_json: &str, processor_json: &str) -> Result<Self, PluginError> {
        let raw: RawConfig = serde_json::from_str(config_json).map_err(|e| invalid(format!("config.json: {e}")))?;
        let weights = raw.identity.weight_dtype().map_err(invalid)?;
        let text = raw.text_config.ok_or_else(|| invalid("config.json has no text_config"))?;
        if let Some(kind) = text.model_type.as_deref()
            && kind != "gemma3n_text"
        {
            return Err(unsupported(format!("text_config.model_type `{kind}` (gemma3n takes gemma3n_text)")));
        }
        let audio = AudioConfig::parse(raw.audio_config.unwrap_or_default())?;
        let vision = raw.vision_config.unwrap_or_default();
        let (features, root) =
            feature_section(processor_json).map_err(|e| invalid(format!("processor config: {e}")))?;
        let features = FeatureConfig::parse(features, audio.input_feat_size)?;
        let config = Gemma3nConfig {
            model_type: raw.identity.model_type.clone(),
            architecture: raw.identity.architecture(),
            weights,
            text_hidden_size: text.hidden_size.unwrap_or(2048),
            text_vocab_size: text.vocab_size.unwrap_or(262_400),
            audio_soft_tokens: raw.audio_soft_tokens_per_image.unwrap_or(188),
            audio_token_id: raw.audio_token_id.unwrap_or(262_273),
            boa_token_id: raw.boa_token_id.unwrap_or(256_000),
            eoa_token_id: raw.eoa_token_id.unwrap_or(262_272),
            vision_vocab_offset: vision.vocab_offset.unwrap_or(262_144),
            audio,
            features,
        };
        config.check(root)?;
        Ok(config)
    }

    /// The relations between fields the reference assumes.
    fn check(&self, root: RawProcessorRoot) -> Result<(), PluginError> {
        let soft = self.audio_soft_tokens;
        if soft == 0 || self.text_hidden_size == 0 {
            return Err(invalid("audio_soft_tokens_per_image and text_config.hidden_size must be positive"));
        }
        // Gemma3nProcessor expands each clip to `audio_seq_length` soft tokens; the model fills
        // `audio_soft_tokens_per_image` rows. They must agree or the reference refuses the prompt.
        let seq = root.audio_seq_length.unwrap_or(188);
        if seq != soft {
            return Err(invalid(format!(
                "processor config: audio_seq_length {seq} differs from config.json's audio_soft_tokens_per_image {soft}"
            )));
        }
        let (offset, size) = (self.audio.vocab_offset, self.audio.vocab_size);
        let in_audio_vocab = |id: u32| id >= offset && id - offset < size;
        // The reference pads with the embedding of `text vocab_size - 1`, looked up in the audio
        // embedder's table.
        if self.text_vocab_size == 0 || !in_audio_vocab(self.text_vocab_size - 1) {
            return Err(invalid(format!(
                "text_config.vocab_size {}: its last id, the audio padding token, is outside the audio vocabulary \
                 [{offset}, {})",
                self.text_vocab_size,
                u64::from(offset) + u64::from(size)
            )));
        }
        if !in_audio_vocab(self.eoa_token_id) {
            return Err(unsupported(format!(
                "eoa_token_id {} is outside the audio vocabulary [{offset}, {}): the plugin embeds it with the audio \
                 embedder, as the reference does for Gemma 3n's layout",
                self.eoa_token_id,
                u64::from(offset) + u64::from(size)
            )));
        }
        if self.vision_vocab_offset > offset {
            return Err(invalid(format!(
                "vision_config.vocab_offset {} is above audio_config.vocab_offset {offset}",
                self.vision_vocab_offset
            )));
        }
        // <start_of_audio> must be a text token: a hard multimodal token there would need an
        // embedder row the contract does not place.
        if self.boa_token_id >= self.vision_vocab_offset {
            return Err(unsupported(format!(
                "boa_token_id {} is a multimodal hard token (at or above {}); gemma3n's is a text token",
                self.boa_token_id, self.vision_vocab_offset
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixture_config, fixture_json};

    #[test]
    fn the_fixture_config_parses_with_every_field_the_family_needs() {
        let c = fixture_config();
        assert_eq!((c.model_type.as_str(), c.architecture.as_str()), ("gemma3n", "Gemma3nForConditionalGeneration"));
        assert_eq!((c.text_hidden_size, c.text_vocab_size, c.audio_soft_tokens), (64, 408, 8));
        assert_eq!((c.boa_token_id, c.audio_token_id, c.eoa_token_id, c.vision_vocab_offset), (391, 401, 400, 392));
        assert_eq!((c.padding_row(), c.eoa_row()), (7, 0));
        assert_eq!(c.text_scale(), 8.0);
        let a = &c.audio;
        assert_eq!((a.hidden_size, a.input_feat_size, a.num_attention_heads, a.head_dim()), (32, 32, 2, 16));
        assert_eq!((a.num_hidden_layers, a.attention_chunk_size, a.max_past(), a.attention_span()), (2, 4, 4, 5));
        assert_eq!((a.conv_kernel_size, a.reduction_factor, a.residual_weight), (5, 4, 0.5));
        assert_eq!((a.sscp_channels, a.sscp_kernels, a.sscp_strides), ([8, 4], [[3, 3], [3, 3]], [[2, 2], [2, 2]]));
        assert_eq!((a.sscp_freqs(), a.time_stride(), a.frames_per_row()), ([16, 8], 4, 16));
        assert_eq!((a.vocab_size, a.vocab_offset, a.attention_logit_cap), (8, 400, 50.0));
        assert_eq!((a.gradient_clipping, a.sscp_group_norm_eps, a.rms_norm_eps), (1e10, 1e-3, 1e-6));
        let f = &c.features;
        assert_eq!(
            (f.sampling_rate, f.feature_size, f.frame_length, f.hop_length, f.fft_length),
            (16_000, 32, 512, 160, 1024)
        );
        assert_eq!(
            (f.min_frequency, f.max_frequency, f.preemphasis, f.preemphasis_htk_flavor),
            (125.0, 7600.0, 0.97, true)
        );
        assert_eq!((f.mel_floor, f.input_scale_factor, f.padding_value), (1e-5, 1.0, 0.0));
        assert_eq!((f.per_bin_mean.clone(), f.per_bin_stddev.clone()), (None, None));
        // 97 frames (one second) give 7 rows; 128 frames are the most that fit 8 soft tokens.
        assert_eq!((c.rows_for_frames(97), c.rows_for_frames(128), c.rows_for_frames(129)), (7, 8, 9));
    }

    #[test]
    fn the_hub_defaults_and_a_flat_processor_config_parse() {
        // google/gemma-3n-E2B-it's audio side: transformers' defaults.
        let config = r#"{"architectures": ["Gemma3nForConditionalGeneration"], "model_type": "gemma3n",
            "torch_dtype": "bfloat16", "text_config": {"model_type": "gemma3n_text", "hidden_size": 2048,
            "vocab_size": 262400}, "audio_config": {"model_type": "gemma3n_audio"}, "vision_config": {}}"#;
        let processor = r#"{"feature_extractor_type": "Gemma3nAudioFeatureExtractor", "feature_size": 128,
            "frame_length": 512, "hop_length": 160, "fft_length": 1024, "dither": 0.0, "padding_side": "right",
            "image_processor_type": "SiglipImageProcessorFast", "audio_seq_length": 188}"#;
        let c = Gemma3nConfig::parse(config, processor).expect("parse");
        assert_eq!((c.weights, c.padding_row(), c.eoa_row()), (WeightDtype::BF16, 127, 0));
        assert_eq!((c.audio.max_past(), c.audio.attention_span(), c.audio.sscp_freqs()), (12, 13, [64, 32]));
        // 30 s (2997 frames) gives exactly the 188 rows the processor expands to.
        assert_eq!(c.rows_for_frames(2997), 188);
    }

    #[test]
    fn unsupported_and_inconsistent_configs_are_refused_by_name() {
        let (config, processor) = fixture_json();
        let refused = |config: &str, processor: &str, needle: &str| {
            let err = Gemma3nConfig::parse(config, processor).expect_err(needle);
            assert!(err.message.contains(needle), "{needle}: {err}");
            err.code
        };
        use mlxcel_plugin_api::ErrorCode::{InvalidArgument, Unsupported};
        let dither = processor.replace("\"dither\": 0.0", "\"dither\": 1e-4");
        assert_eq!(refused(&config, &dither, "dither 0.0001"), Unsupported);
        let left = processor.replace("\"padding_side\": \"right\"", "\"padding_side\": \"left\"");
        assert_eq!(refused(&config, &left, "padding_side `left`"), Unsupported);
        let seq = processor.replace("\"audio_seq_length\": 8", "\"audio_seq_length\": 9");
        assert_eq!(refused(&config, &seq, "audio_seq_length 9 differs"), InvalidArgument);
        let frames = processor.replace("\"frame_length\": 512", "\"frame_length\": 400");
        assert_eq!(refused(&config, &frames, "frame_length 400 disagrees with the 512"), InvalidArgument);
        let bins = processor.replace("\"feature_size\": 32", "\"feature_size\": 64");
        assert_eq!(refused(&config, &bins, "feature_size 64 differs"), InvalidArgument);
        let three = config.replace(
            "\"sscp_conv_channel_size\": [\n      8,\n      4\n    ]",
            "\"sscp_conv_channel_size\": [8, 4, 2]",
        );
        assert_ne!(three, config);
        assert_eq!(refused(&three, &processor, "exactly two"), Unsupported);
        let vocab = config.replace("\"vocab_size\": 408", "\"vocab_size\": 420");
        assert_eq!(refused(&vocab, &processor, "audio padding token"), InvalidArgument);
        let heads = config.replace("\"conf_num_attention_heads\": 2", "\"conf_num_attention_heads\": 3");
        assert_eq!(refused(&heads, &processor, "not a multiple of conf_num_attention_heads 3"), InvalidArgument);
        let cap = config.replace("\"conf_attention_logit_cap\": 50.0", "\"conf_attention_logit_cap\": 0.0");
        assert_eq!(refused(&cap, &processor, "conf_attention_logit_cap 0"), InvalidArgument);
        assert_eq!(refused(r#"{"model_type": "gemma3n"}"#, "", "text_config"), InvalidArgument);
        assert!(refused("{", "", "config.json: ").eq(&InvalidArgument));
    }
}
