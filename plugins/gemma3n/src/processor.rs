//! The audio feature extractor (`Gemma3nAudioFeatureExtractor`, one clip per call): mono
//! samples at the extractor's rate to log-mel frames, `input_features` `[1, frames, mel bins]`
//! and `input_features_mask` `[1, frames]`, exactly the reference's tensors for a clip alone.
//!
//! The reference's steps, in its precisions (numpy, float32 samples):
//!
//! - the waveform is padded on the right with `padding_value` to a multiple of 128 samples
//!   (the call's `pad_to_multiple_of`), then scaled by `input_scale_factor`;
//! - frames of `frame_length + 1` samples every `hop_length`; HTK pre-emphasis in f32 (the first
//!   sample times `1 - p`, each next one minus `p` times its predecessor), or the plain form, then
//!   the periodic Hann window;
//! - `np.fft.rfft` to `fft_length` points and `np.abs`, both float32 (numpy 2's own kernels,
//!   reproduced in `mlxcel_family_common::audio::spectrum`);
//! - the magnitudes times the HTK mel filterbank in f64, `log(max(mel, mel_floor))`, the optional
//!   per-bin mean and deviation, rounded to f32;
//! - the mask marks a frame valid when its first sample is one of the clip's own.
//!
//! transformers truncates a clip to 480000 samples (30 s at 16 kHz); here a longer clip is
//! refused, as is one whose rows would not fit the prompt's `audio_soft_tokens_per_image`
//! soft tokens (the reference fails on it) or one too short for a single frame.

use mlxcel_family_common::audio::{Pcm, RealFft, complex_abs_f32, hann_window_numpy, htk_mel_filterbank};
use mlxcel_plugin_api::{MediaGrid, MediaItem, PluginError, PreprocessOptions, Preprocessed, Tensor, TensorSpec};

use crate::config::{FeatureConfig, Gemma3nConfig};

/// The encoder inputs' names, shared with the graph (the reference's processor outputs).
pub(crate) const FEATURES: &str = "input_features";
pub(crate) const MASK: &str = "input_features_mask";
/// The feature extractor call's `max_length`: the longest clip, in samples.
pub(crate) const MAX_SAMPLES: usize = 480_000;
/// The feature extractor call's `pad_to_multiple_of`.
const PAD_TO_MULTIPLE: usize = 128;

/// Log-mel frames of one clip and their validity.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogMel {
    pub frames: usize,
    /// `[frames][bins]`, row-major.
    pub features: Vec<f32>,
    pub mask: Vec<bool>,
}

/// The feature extractor on one clip of mono samples (see the module).
pub(crate) fn log_mel(fe: &FeatureConfig, samples: &[f32]) -> LogMel {
    let clip = samples.len();
    let mut wave = samples.to_vec();
    wave.resize(clip.div_ceil(PAD_TO_MULTIPLE) * PAD_TO_MULTIPLE, fe.padding_value as f32);
    if fe.input_scale_factor != 1.0 {
        let scale = fe.input_scale_factor as f32;
        wave.iter_mut().for_each(|x| *x *= scale);
    }
    let span = fe.frame_length + 1;
    let frames = if wave.len() < span { 0 } else { (wave.len() - span) / fe.hop_length + 1 };
    let bins = fe.feature_size;
    let window = hann_window_numpy(fe.frame_length);
    let fft = RealFft::new(fe.fft_length).expect("invariant: the fft length is a power of two of at least 2");
    let n_freqs = fe.fft_length / 2 + 1;
    let filters =
        htk_mel_filterbank(n_freqs, fe.min_frequency, fe.max_frequency, bins, fe.sampling_rate, fe.fft_length);
    let (p, first_scale) = (fe.preemphasis as f32, (1.0 - fe.preemphasis) as f32);
    let mut features = Vec::with_capacity(frames * bins);
    let mut frame = vec![0.0f32; fe.frame_length];
    let mut mel = vec![0.0f64; bins];
    for i in 0..frames {
        let s = &wave[i * fe.hop_length..i * fe.hop_length + span];
        for (j, out) in frame.iter_mut().enumerate() {
            let x = if fe.preemphasis <= 0.0 {
                s[j]
            } else if fe.preemphasis_htk_flavor {
                if j == 0 { s[0] * first_scale } else { s[j] - p * s[j - 1] }
            } else {
                s[j + 1] - p * s[j]
            };
            *out = x * window[j];
        }
        let spectrum = fft.forward(&frame);
        mel.iter_mut().for_each(|m| *m = 0.0);
        for (k, &(re, im)) in spectrum.iter().enumerate() {
            let magnitude = f64::from(complex_abs_f32(re, im));
            for (m, acc) in mel.iter_mut().enumerate() {
                *acc += magnitude * filters[k * bins + m];
            }
        }
        for (m, &energy) in mel.iter().enumerate() {
            let mut v = energy.max(fe.mel_floor).ln();
            if let Some(mean) = &fe.per_bin_mean {
                v -= mean[m];
            }
            if let Some(std) = &fe.per_bin_stddev {
                v /= std[m];
            }
            features.push(v as f32);
        }
    }
    let mask = (0..frames).map(|i| i * fe.hop_length < clip).collect();
    LogMel { frames, features, mask }
}

/// The clip's samples, checked against what the reference takes.
fn mono_samples(
    config: &Gemma3nConfig,
    item: &MediaItem,
    options: &PreprocessOptions,
) -> Result<Vec<f32>, PluginError> {
    let pcm = Pcm::from_item(item, "gemma3n")?;
    let rate = config.features.sampling_rate;
    if pcm.sample_rate != rate {
        return Err(PluginError::invalid(format!(
            "the clip is sampled at {} Hz; gemma3n takes {rate} Hz audio (resample it first)",
            pcm.sample_rate
        )));
    }
    if pcm.channels != 1 {
        return Err(PluginError::invalid(format!(
            "the clip has {} channels; gemma3n takes mono audio (mix it down first)",
            pcm.channels
        )));
    }
    let mut limit = MAX_SAMPLES;
    if let Some(ms) = options.max_audio_ms.into_option() {
        limit = limit.min((u128::from(ms) * u128::from(rate) / 1000).min(usize::MAX as u128) as usize);
    }
    if pcm.samples.len() > limit {
        return Err(PluginError::too_large(format!(
            "the clip is {:.2} s long ({} samples at {rate} Hz), over the limit of {:.2} s",
            pcm.seconds(),
            pcm.samples.len(),
            limit as f64 / f64::from(rate)
        )));
    }
    Ok(pcm.samples)
}

/// One clip to the encoder's inputs; its grid is `[frames]` and, like every clip, it fills
/// `audio_soft_tokens_per_image` soft tokens.
pub(crate) fn preprocess(
    config: &Gemma3nConfig,
    item: &MediaItem,
    options: &PreprocessOptions,
) -> Result<Preprocessed, PluginError> {
    let samples = mono_samples(config, item, options)?;
    let fe = &config.features;
    let mel = log_mel(fe, &samples);
    if mel.frames == 0 {
        return Err(PluginError::invalid(format!(
            "the clip has {} samples, too short for one {}-sample frame",
            samples.len(),
            fe.frame_length + 1
        )));
    }
    let (rows, soft) = (config.rows_for_frames(mel.frames), config.audio_soft_tokens as usize);
    if rows > soft {
        let most = soft * config.audio.frames_per_row();
        // The longest clip whose padded length still gives at most `most` frames.
        let longest =
            ((most - 1) * fe.hop_length + fe.frame_length + fe.hop_length) / PAD_TO_MULTIPLE * PAD_TO_MULTIPLE;
        return Err(PluginError::too_large(format!(
            "the clip gives {rows} audio rows ({} frames); the prompt holds {soft} soft tokens per clip, {most} \
             frames: clips of at most {longest} samples ({:.3} s)",
            mel.frames,
            longest as f64 / f64::from(fe.sampling_rate)
        )));
    }
    let frames = mel.frames as u64;
    let features = Tensor::from_f32(FEATURES, &[1, frames, fe.feature_size as u64], &mel.features)?;
    let mask: Vec<u8> = mel.mask.iter().flat_map(|&v| i32::from(v).to_le_bytes()).collect();
    let mask = Tensor::from_bytes(TensorSpec::new(MASK, mlxcel_plugin_api::DType::I32, &[1, frames]), mask)?;
    Ok(Preprocessed {
        tensors: vec![features, mask].into(),
        grid: MediaGrid { dims: vec![mel.frames as u32].into(), feature_tokens: config.audio_soft_tokens },
    })
}

#[cfg(test)]
mod tests {
    use mlxcel_family_common::audio::encode_wav;
    use mlxcel_plugin_api::ErrorCode;

    use super::*;
    use crate::testing::{audio_item, fixture_config, golden};

    /// Every clip of each variant against the golden `input_features` (to 1e-6) and
    /// `input_features_mask` (exactly); a variant of several clips is checked clip by clip, each
    /// against its rows of the golden batch, which pads the shorter one with frames of its own.
    #[test]
    fn features_and_mask_match_the_goldens() {
        let config = fixture_config();
        let bins = config.features.feature_size;
        for variant in ["audio", "two_audios", "long"] {
            let golden = golden(variant);
            let clips = golden.field("audio").expect("audio").as_array().expect("list").clone();
            let want = golden.tensor("input_features").expect("features");
            let want_mask = golden.tensor("input_features_mask").expect("mask").to_i64().expect("ints");
            let want = want.as_f32().expect("f32");
            let batch_frames = want_mask.len() / clips.len();
            for (c, path) in clips.iter().enumerate() {
                let out = preprocess(&config, &audio_item(path.as_str().expect("path")), &Default::default())
                    .expect("preprocess");
                let frames = out.grid.dims[0] as usize;
                assert_eq!(out.tensors[0].spec.shape.as_slice(), &[1, frames as u64, bins as u64]);
                assert_eq!(out.grid.feature_tokens, 8);
                let got = out.tensors[0].to_f32().expect("f32");
                let rows = &want[c * batch_frames * bins..][..frames * bins];
                let worst = got.iter().zip(rows).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                assert!(worst <= 1e-6, "{variant} clip {c}: max abs diff {worst}");
                assert_eq!(worst, 0.0, "{variant} clip {c}: numpy's arithmetic is reproduced bit for bit");
                let mask: Vec<i64> = out.tensors[1]
                    .data
                    .chunks_exact(4)
                    .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                    .collect();
                assert_eq!(mask, want_mask[c * batch_frames..][..frames], "{variant} clip {c}");
                // Padded into a longer clip's batch, a clip has up to `(frame_length + 1) / hop`
                // more valid frames (starting inside it, ending in the padding; the reference's
                // "3 elements longer" note); alone it has none of them, and no row it places
                // depends on them (the encoder's frames look at most two frames ahead).
                let extra = want_mask[c * batch_frames + frames..(c + 1) * batch_frames].iter().filter(|&&m| m == 1);
                assert!(extra.count() <= 3, "{variant} clip {c}");
            }
        }
    }

    fn wav(rate: u32, channels: u16, samples: usize) -> MediaItem {
        let data: Vec<u8> =
            (0..samples * usize::from(channels)).flat_map(|i| ((i % 200) as i16).to_le_bytes()).collect();
        MediaItem::EncodedAudio(encode_wav(rate, channels, 1, 16, &data).into())
    }

    #[test]
    fn rates_channels_and_lengths_are_refused_clearly() {
        let config = fixture_config();
        let options = PreprocessOptions::default();
        let err = preprocess(&config, &wav(44_100, 1, 4410), &options).expect_err("rate");
        assert_eq!(
            err.message.as_str(),
            "the clip is sampled at 44100 Hz; gemma3n takes 16000 Hz audio (resample it first)"
        );
        let err = preprocess(&config, &wav(16_000, 2, 1600), &options).expect_err("stereo");
        assert!(err.message.contains("2 channels; gemma3n takes mono"), "{err}");
        let err = preprocess(&config, &wav(16_000, 1, 400), &options).expect_err("short");
        assert!(err.message.contains("too short for one 513-sample frame"), "{err}");
        // The fixture's 8 soft tokens hold 128 frames: 1.296 s at most.
        let err = preprocess(&config, &wav(16_000, 1, 24_000), &options).expect_err("rows");
        assert_eq!(err.code, ErrorCode::ResourceExhausted);
        assert!(err.message.contains("gives 10 audio rows (148 frames); the prompt holds 8 soft tokens per clip, 128 frames: clips of at most 20992 samples (1.312 s)"), "{err}");
        let err = preprocess(&config, &wav(16_000, 1, MAX_SAMPLES + 1), &options).expect_err("30 s");
        assert_eq!(err.code, ErrorCode::ResourceExhausted);
        assert!(err.message.contains("30.00 s long (480001 samples at 16000 Hz), over the limit of 30.00 s"), "{err}");
        let short_limit = PreprocessOptions { max_audio_ms: Some(500).into(), ..Default::default() };
        let err = preprocess(&config, &wav(16_000, 1, 9000), &short_limit).expect_err("0.5 s");
        assert!(err.message.contains("over the limit of 0.50 s"), "{err}");
        let image = MediaItem::Rgb8 { width: 1, height: 1, pixels: vec![0; 3].into() };
        assert_eq!(preprocess(&config, &image, &options).expect_err("image").code, ErrorCode::Unsupported);
        // The longest clip that fits is served: 20992 samples, 128 frames, 8 rows.
        let out = preprocess(&config, &wav(16_000, 1, 20_992), &options).expect("fits");
        assert_eq!(out.grid.dims.as_slice(), &[128]);
        assert!(preprocess(&config, &wav(16_000, 1, 20_993), &options).is_err());
    }

    #[test]
    fn decoded_pcm_is_taken_as_is() {
        let config = fixture_config();
        let samples: Vec<f32> = (0..8000).map(|i| ((i % 200) as f32) / 32768.0).collect();
        let pcm = MediaItem::PcmF32 { sample_rate: 16_000, channels: 1, samples: samples.into() };
        let a = preprocess(&config, &pcm, &Default::default()).expect("pcm");
        let b = preprocess(&config, &wav(16_000, 1, 8000), &Default::default()).expect("wav");
        assert_eq!(a, b);
    }
}
