//! Audio for the families that take it: WAV clips decoded to f32 samples ([`wav`]) and the
//! spectral arithmetic of numpy-based feature extractors, bit for bit with numpy ([`spectrum`]).
//! A family's own recipe (framing, pre-emphasis, log floor) is written in its crate over these.

pub mod spectrum;
pub mod wav;

pub use spectrum::{RealFft, complex_abs_f32, hann_window_numpy, htk_mel_filterbank, numpy_cos_f32};
pub use wav::{Pcm, WavError, decode_wav, encode_wav};
