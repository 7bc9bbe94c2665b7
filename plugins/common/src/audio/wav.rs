//! RIFF/WAVE decoding into f32 samples, scaled as libsndfile (soundfile, hence librosa and
//! transformers' `load_audio`) scales integers for float output: 8-bit unsigned as
//! `(x - 128) / 128`, signed 16-, 24- and 32-bit as `x / 2^(bits - 1)`; IEEE float samples pass
//! through (64-bit ones rounded to f32). A 16-bit clip thus gives exactly `samples / 32768`,
//! what the oracle feeds the reference processors.
//!
//! Only the `fmt ` and `data` chunks are read; every other chunk (`LIST`, `fact`, ...) is
//! skipped. Compressed formats (ADPCM, mu-law, ...) are refused by their format tag.

use mlxcel_plugin_api::{MediaItem, PluginError};

/// `WAVE_FORMAT_PCM`.
const FORMAT_PCM: u16 = 1;
/// `WAVE_FORMAT_IEEE_FLOAT`.
const FORMAT_FLOAT: u16 = 3;
/// `WAVE_FORMAT_EXTENSIBLE`: the real format is the first two bytes of the sub-format GUID.
const FORMAT_EXTENSIBLE: u16 = 0xFFFE;

/// Why bytes are not a WAV clip this decoder reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WavError {
    /// No `RIFF....WAVE` header.
    #[error("not a wav file (no RIFF/WAVE header)")]
    NotWav,
    /// A chunk runs past the end of the file.
    #[error("the wav file is truncated: the `{chunk}` chunk needs {needed} bytes, {available} remain")]
    Truncated { chunk: String, needed: u64, available: u64 },
    /// The `fmt ` chunk is missing or comes after `data`.
    #[error("the wav file has no `fmt ` chunk before its `data` chunk")]
    NoFormat,
    /// No `data` chunk.
    #[error("the wav file has no `data` chunk")]
    NoData,
    /// A format tag or sample width this decoder does not read.
    #[error(
        "wav format tag {tag:#06x} with {bits}-bit samples is not supported (pcm 8/16/24/32-bit or float 32/64-bit)"
    )]
    Unsupported { tag: u16, bits: u16 },
    /// The header contradicts itself.
    #[error("the wav header is inconsistent: {0}")]
    Inconsistent(String),
}

/// Decoded PCM: samples in `[-1, 1]`, interleaved by channel.
#[derive(Debug, Clone, PartialEq)]
pub struct Pcm {
    pub sample_rate: u32,
    pub channels: u16,
    pub samples: Vec<f32>,
}

impl Pcm {
    /// The clip of an audio item: WAV bytes decoded, or decoded samples taken as they are.
    /// Images are refused as unsupported, naming `family`.
    pub fn from_item(item: &MediaItem, family: &str) -> Result<Self, PluginError> {
        match item {
            MediaItem::EncodedAudio(bytes) => decode_wav(bytes).map_err(|e| PluginError::invalid(e.to_string())),
            MediaItem::PcmF32 { sample_rate, channels, samples } => {
                let channels = u16::try_from(*channels)
                    .ok()
                    .filter(|&c| c > 0)
                    .ok_or_else(|| PluginError::invalid(format!("decoded audio with {channels} channels")))?;
                if samples.len() % usize::from(channels) != 0 {
                    return Err(PluginError::invalid(format!(
                        "{} interleaved samples do not divide into {channels} channels",
                        samples.len()
                    )));
                }
                Ok(Pcm { sample_rate: *sample_rate, channels, samples: samples.to_vec() })
            }
            MediaItem::EncodedImage(_) | MediaItem::Rgb8 { .. } => {
                Err(PluginError::unsupported(format!("{family} preprocesses audio only")))
            }
        }
    }

    /// Samples per channel.
    pub fn frames(&self) -> usize {
        self.samples.len() / usize::from(self.channels.max(1))
    }

    /// The clip's length in seconds.
    pub fn seconds(&self) -> f64 {
        self.frames() as f64 / f64::from(self.sample_rate.max(1))
    }
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The `fmt ` chunk's fields this decoder uses.
#[derive(Debug, Clone, Copy)]
struct Format {
    tag: u16,
    channels: u16,
    sample_rate: u32,
    block_align: u16,
    bits: u16,
}

impl Format {
    fn parse(body: &[u8]) -> Result<Self, WavError> {
        if body.len() < 16 {
            return Err(WavError::Inconsistent(format!("a `fmt ` chunk of {} bytes (at least 16)", body.len())));
        }
        let mut tag = u16_at(body, 0);
        let bits = u16_at(body, 14);
        if tag == FORMAT_EXTENSIBLE {
            // cbSize (2), valid bits (2), channel mask (4), then the sub-format GUID, whose first
            // two bytes are the plain format tag.
            if body.len() < 26 {
                return Err(WavError::Inconsistent("an extensible `fmt ` chunk without its sub-format".into()));
            }
            tag = u16_at(body, 24);
        }
        Ok(Format { tag, channels: u16_at(body, 2), sample_rate: u32_at(body, 4), block_align: u16_at(body, 12), bits })
    }
}

/// Decodes a WAV file.
pub fn decode_wav(bytes: &[u8]) -> Result<Pcm, WavError> {
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return Err(WavError::NotWav);
    }
    let mut at = 12usize;
    let mut format: Option<Format> = None;
    while at + 8 <= bytes.len() {
        let id = &bytes[at..at + 4];
        let size = u32_at(bytes, at + 4) as usize;
        let body_start = at + 8;
        let available = bytes.len() - body_start;
        if size > available {
            return Err(WavError::Truncated {
                chunk: String::from_utf8_lossy(id).into_owned(),
                needed: size as u64,
                available: available as u64,
            });
        }
        let body = &bytes[body_start..body_start + size];
        match id {
            b"fmt " => format = Some(Format::parse(body)?),
            b"data" => return samples(format.ok_or(WavError::NoFormat)?, body),
            _ => {}
        }
        // Chunks are padded to an even size.
        at = body_start + size + (size & 1);
    }
    Err(WavError::NoData)
}

fn samples(format: Format, data: &[u8]) -> Result<Pcm, WavError> {
    let Format { tag, channels, sample_rate, block_align, bits } = format;
    if channels == 0 || sample_rate == 0 {
        return Err(WavError::Inconsistent(format!("{channels} channels at {sample_rate} Hz")));
    }
    let width = usize::from(bits / 8);
    let supported = matches!((tag, bits), (FORMAT_PCM, 8 | 16 | 24 | 32) | (FORMAT_FLOAT, 32 | 64));
    if !supported {
        return Err(WavError::Unsupported { tag, bits });
    }
    if usize::from(block_align) != width * usize::from(channels) {
        return Err(WavError::Inconsistent(format!(
            "block align {block_align} for {channels} channels of {bits}-bit samples"
        )));
    }
    // A trailing partial frame is dropped, as libsndfile does.
    let whole = data.len() / usize::from(block_align) * usize::from(block_align);
    let data = &data[..whole];
    let samples: Vec<f32> = match (tag, bits) {
        (FORMAT_PCM, 8) => data.iter().map(|&b| (f32::from(b) - 128.0) / 128.0).collect(),
        (FORMAT_PCM, 16) => {
            data.chunks_exact(2).map(|c| f32::from(i16::from_le_bytes([c[0], c[1]])) / 32768.0).collect()
        }
        (FORMAT_PCM, 24) => data
            .chunks_exact(3)
            .map(|c| {
                // Sign-extend through the top byte of an i32.
                let x = i32::from_le_bytes([0, c[0], c[1], c[2]]) >> 8;
                (f64::from(x) / 8_388_608.0) as f32
            })
            .collect(),
        (FORMAT_PCM, _) => data
            .chunks_exact(4)
            .map(|c| (f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])) / 2_147_483_648.0) as f32)
            .collect(),
        (_, 32) => data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        _ => data
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
    };
    Ok(Pcm { sample_rate, channels, samples })
}

/// A WAV file of `samples` (interleaved) in the given format: for tests of the decoder and of
/// the families that read it.
pub fn encode_wav(sample_rate: u32, channels: u16, tag: u16, bits: u16, data: &[u8]) -> Vec<u8> {
    let block_align = channels * (bits / 8);
    let mut fmt = Vec::with_capacity(16);
    fmt.extend(tag.to_le_bytes());
    fmt.extend(channels.to_le_bytes());
    fmt.extend(sample_rate.to_le_bytes());
    fmt.extend((sample_rate * u32::from(block_align)).to_le_bytes());
    fmt.extend(block_align.to_le_bytes());
    fmt.extend(bits.to_le_bytes());
    let mut out = Vec::with_capacity(44 + data.len());
    out.extend(b"RIFF");
    out.extend(((4 + 8 + fmt.len() + 8 + data.len()) as u32).to_le_bytes());
    out.extend(b"WAVE");
    out.extend(b"fmt ");
    out.extend((fmt.len() as u32).to_le_bytes());
    out.extend(fmt);
    out.extend(b"data");
    out.extend((data.len() as u32).to_le_bytes());
    out.extend(data);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pcm16(samples: &[i16]) -> Vec<u8> {
        samples.iter().flat_map(|s| s.to_le_bytes()).collect()
    }

    #[test]
    fn sixteen_bit_pcm_is_samples_over_32768() {
        let wav = encode_wav(16_000, 1, FORMAT_PCM, 16, &pcm16(&[0, 1, -1, i16::MAX, i16::MIN]));
        let pcm = decode_wav(&wav).expect("decodes");
        assert_eq!((pcm.sample_rate, pcm.channels, pcm.frames()), (16_000, 1, 5));
        assert_eq!(pcm.samples, [0.0, 1.0 / 32768.0, -1.0 / 32768.0, 32767.0 / 32768.0, -1.0]);
    }

    #[test]
    fn other_widths_and_float_scale_as_libsndfile() {
        let u8s = decode_wav(&encode_wav(8_000, 1, FORMAT_PCM, 8, &[0, 128, 255])).expect("8-bit");
        assert_eq!(u8s.samples, [-1.0, 0.0, 127.0 / 128.0]);
        let i24 =
            decode_wav(&encode_wav(8_000, 1, FORMAT_PCM, 24, &[0x00, 0x00, 0x80, 0xFF, 0xFF, 0x7F])).expect("24-bit");
        assert_eq!(i24.samples, [-1.0, (8_388_607.0f64 / 8_388_608.0) as f32]);
        let floats: Vec<u8> = [0.25f32, -0.5].iter().flat_map(|x| x.to_le_bytes()).collect();
        let f = decode_wav(&encode_wav(44_100, 2, FORMAT_FLOAT, 32, &floats)).expect("float");
        assert_eq!((f.channels, f.frames(), f.samples.as_slice()), (2, 1, &[0.25, -0.5][..]));
    }

    #[test]
    fn other_chunks_are_skipped_and_odd_chunks_padded() {
        let mut wav = encode_wav(16_000, 1, FORMAT_PCM, 16, &pcm16(&[7]));
        // Insert an odd-sized LIST chunk (with its pad byte) before `data`.
        let data_at = wav.len() - 8 - 2;
        let list = [b"LIST".as_slice(), &3u32.to_le_bytes(), b"abc", &[0]].concat();
        wav.splice(data_at..data_at, list);
        assert_eq!(decode_wav(&wav).expect("decodes").samples, [7.0 / 32768.0]);
    }

    #[test]
    fn bad_files_are_named() {
        assert_eq!(decode_wav(b"RIFX....WAVE"), Err(WavError::NotWav));
        let mut wav = encode_wav(16_000, 1, FORMAT_PCM, 16, &pcm16(&[1, 2, 3]));
        wav.truncate(wav.len() - 2);
        let err = decode_wav(&wav).expect_err("truncated");
        assert_eq!(err.to_string(), "the wav file is truncated: the `data` chunk needs 6 bytes, 4 remain");
        let alaw = encode_wav(16_000, 1, 6, 8, &[1, 2]);
        assert_eq!(decode_wav(&alaw), Err(WavError::Unsupported { tag: 6, bits: 8 }));
        let no_data: Vec<u8> = encode_wav(16_000, 1, FORMAT_PCM, 16, &[])[..36].to_vec();
        assert_eq!(decode_wav(&no_data), Err(WavError::NoData));
    }

    #[test]
    fn items_decode_or_pass_through() {
        let item = MediaItem::EncodedAudio(encode_wav(16_000, 1, FORMAT_PCM, 16, &pcm16(&[16384])).into());
        assert_eq!(Pcm::from_item(&item, "x").expect("wav").samples, [0.5]);
        let pcm = MediaItem::PcmF32 { sample_rate: 16_000, channels: 2, samples: vec![0.1, 0.2].into() };
        assert_eq!(Pcm::from_item(&pcm, "x").expect("pcm").frames(), 1);
        let odd = MediaItem::PcmF32 { sample_rate: 16_000, channels: 2, samples: vec![0.1].into() };
        assert!(Pcm::from_item(&odd, "x").is_err());
        let image = MediaItem::EncodedImage(vec![1].into());
        let err = Pcm::from_item(&image, "gemma3n").expect_err("image");
        assert_eq!(err.message.as_str(), "gemma3n preprocesses audio only");
    }
}
