//! Decoded RGB images and the transformers PIL backend's arithmetic on them: Pillow's
//! two-pass convolution resampling (8-bit fixed point), then `rescale` (in f64, rounded to
//! f32) and `normalize` (in f32), channel-first.
//!
//! The resampler follows Pillow's `Resample.c` (the algorithm unchanged since Pillow 4.3):
//! per output pixel a filter window is placed at `(i + 0.5) * scale` in input coordinates,
//! its support widened by the downscale factor; the weights are computed in f64,
//! normalised to sum to one, then quantised to signed fixed point with 22 fractional bits
//! (rounding half away from zero). Each pass accumulates `u8 * weight` in integers starting
//! from one half, shifts the fraction out and clamps to `0..=255`. The horizontal pass runs
//! first and its 8-bit output feeds the vertical pass, except that Pillow 13 runs the vertical
//! pass first when the image shrinks vertically by more than twice its horizontal shrink; a
//! pass whose size does not change is skipped. Matching these integer steps is what makes the preprocessed tensors equal the
//! reference's bit for bit rather than within one 8-bit level.
//!
//! [`Image::resize_torch_bilinear`] is the torchvision backend's counterpart for processors that
//! resize in float and round back to 8 bits (Molmo2): torch's CPU bilinear kernel in f32, with
//! the fused multiply-adds its x86-64 build evaluates (see the method).

/// Fraction bits of the fixed-point weights (Pillow's `PRECISION_BITS`, `32 - 8 - 2`).
const PRECISION_BITS: u32 = 22;

/// Why an image cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// Width or height is zero.
    #[error("the image is empty ({width}x{height})")]
    Empty { width: u32, height: u32 },
    /// The pixel buffer does not hold `width * height` RGB pixels.
    #[error("a {width}x{height} rgb image needs {expected} bytes, got {actual}")]
    Size { width: u32, height: u32, expected: u64, actual: u64 },
    /// The encoded bytes do not decode (`mlxcel_media`: here built for PNG only).
    #[error(transparent)]
    Decode(#[from] mlxcel_media::Error),
}

/// An 8-bit RGB image, row-major, channels interleaved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    width: u32,
    height: u32,
    pixels: Vec<u8>,
}

/// A resampling filter, as Pillow names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resample {
    /// Pillow's `BILINEAR` (triangle filter, support 1).
    Bilinear,
    /// Pillow's `BICUBIC` (Keys cubic with `a = -0.5`, support 2).
    Bicubic,
}

impl Resample {
    /// The filter for a Pillow resampling code (`resample` in processor configs), if supported.
    pub fn from_pil(code: u32) -> Option<Self> {
        match code {
            2 => Some(Resample::Bilinear),
            3 => Some(Resample::Bicubic),
            _ => None,
        }
    }

    fn support(self) -> f64 {
        match self {
            Resample::Bilinear => 1.0,
            Resample::Bicubic => 2.0,
        }
    }

    /// The filter's weight at `x`, with Pillow's expression order.
    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Resample::Bilinear => {
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Resample::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

/// The rescale and normalise steps of a processor config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    /// `rescale_factor`, applied in f64 then rounded to f32 (`None`: `do_rescale` false).
    pub rescale: Option<f64>,
    /// `image_mean` and `image_std` as f32 (`None`: `do_normalize` false).
    pub mean_std: Option<([f32; 3], [f32; 3])>,
}

/// The most pixels an encoded image handed to a plugin may declare: Pillow's `MAX_IMAGE_PIXELS`,
/// the host's own default cap (`MAX_INPUT_PIXELS`). Refused from the header, before decoding.
pub const MAX_ENCODED_PIXELS: u64 = 89_478_485;

impl Image {
    /// The image a request item carries, decoded (`family` names the plugin in the refusal of
    /// an item that is not an image). A malformed image is the input's fault, and so is an
    /// encoded one declaring more than [`MAX_ENCODED_PIXELS`].
    pub fn from_item(
        item: &mlxcel_plugin_api::MediaItem,
        family: &str,
    ) -> Result<Self, mlxcel_plugin_api::PluginError> {
        use mlxcel_plugin_api::{MediaItem, PluginError};
        match item {
            MediaItem::Rgb8 { width, height, pixels } => Image::from_rgb8(*width, *height, pixels.to_vec()),
            MediaItem::EncodedImage(bytes) => Image::decode_limited(bytes, MAX_ENCODED_PIXELS),
            _ => return Err(PluginError::unsupported(format!("{family} preprocesses images only"))),
        }
        .map_err(|e| PluginError::invalid(e.to_string()))
    }

    /// Wraps decoded RGB bytes, checking the size.
    pub fn from_rgb8(width: u32, height: u32, pixels: Vec<u8>) -> Result<Self, ImageError> {
        if width == 0 || height == 0 {
            return Err(ImageError::Empty { width, height });
        }
        let expected = u64::from(width) * u64::from(height) * 3;
        if pixels.len() as u64 != expected {
            return Err(ImageError::Size { width, height, expected, actual: pixels.len() as u64 });
        }
        Ok(Self { width, height, pixels })
    }

    /// Decodes an encoded image of any size as transformers' `load_image` does (orientation
    /// applied, alpha dropped, grey and palettes expanded). The plugins build `mlxcel_media`
    /// for PNG only; the host decodes every format and hands plugins RGB. For untrusted input
    /// use [`Image::decode_limited`].
    pub fn decode(bytes: &[u8]) -> Result<Self, ImageError> {
        Self::decode_limited(bytes, u64::MAX)
    }

    /// [`Image::decode`], refusing an image whose header declares more than `max_pixels` pixels
    /// before any pixel buffer exists.
    pub fn decode_limited(bytes: &[u8], max_pixels: u64) -> Result<Self, ImageError> {
        let rgb = mlxcel_media::decode_limited(bytes, max_pixels)?;
        let (width, height) = (rgb.width(), rgb.height());
        Self::from_rgb8(width, height, rgb.into_pixels())
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    /// The interleaved RGB bytes.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// Resizes to `width x height` exactly as Pillow's `Image.resize` (no `box`, no
    /// `reducing_gap`) does for an RGB image.
    pub fn resize(&self, width: u32, height: u32, filter: Resample) -> Result<Self, ImageError> {
        if width == 0 || height == 0 {
            return Err(ImageError::Empty { width, height });
        }
        let (w0, h0) = (self.width as usize, self.height as usize);
        let (w1, h1) = (width as usize, height as usize);
        // Pillow 13 runs the vertical pass first when the image shrinks vertically by more
        // than twice the horizontal shrink (in pixels); measured against Pillow 13.0.0 on
        // random sizes, since the two orders round the 8-bit intermediate differently.
        let vertical_first = h1 < h0 && (h0 - h1) as i64 > 2 * (w0 as i64 - w1 as i64);
        let pixels = if vertical_first {
            let tall = vertical(&self.pixels, w0, h0, h1, filter);
            horizontal(&tall, w0, h1, w1, filter)
        } else {
            let wide = horizontal(&self.pixels, w0, h0, w1, filter);
            vertical(&wide, w1, h0, h1, filter)
        };
        Ok(Self { width, height, pixels })
    }

    /// The image as f32, channel-first `[3, height, width]`, rescaled and normalised as
    /// transformers' numpy `rescale` (`f64(u8) * factor`, rounded to f32) and `normalize`
    /// (`(x - mean) / std` in f32).
    pub fn to_chw(&self, normalize: &Normalize) -> Vec<f32> {
        let plane = self.width as usize * self.height as usize;
        let mut out = vec![0f32; plane * 3];
        for (i, px) in self.pixels.chunks_exact(3).enumerate() {
            for c in 0..3 {
                let mut v = match normalize.rescale {
                    Some(factor) => (f64::from(px[c]) * factor) as f32,
                    None => f32::from(px[c]),
                };
                if let Some((mean, std)) = normalize.mean_std {
                    v = (v - mean[c]) / std[c];
                }
                out[c * plane + i] = v;
            }
        }
        out
    }

    /// Resizes to `width x height` as transformers' torchvision-backend processors do when they
    /// resize in float (Molmo2's `resize_and_normalize_image`): torch's CPU
    /// `F.interpolate(x.float(), mode="bilinear", align_corners=False, antialias=False)`, then
    /// `.round()` (half to even) and `.clamp(0, 255)` back to 8 bits.
    ///
    /// Per axis, output index `i` samples input coordinate `max(scale * (i + 0.5) - 0.5, 0)`
    /// with `scale = in / out` in f32 (torch's `area_pixel_compute_source_index`); its floor
    /// (at most `in - 1`) is the first tap, the next index (clamped) the second, and the
    /// fraction, clamped to `0..=1`, the second tap's weight. An axis whose size does not
    /// change keeps each index with weights `1, 0`; a resize to the same size returns the image
    /// unchanged, as torchvision does.
    ///
    /// The arithmetic is that of torch's channels-last kernel (`cpu_upsample_linear_channels_last`),
    /// which torch runs for three-channel images on one thread and for any output whose height
    /// plus width is at most 128 (the reference goldens run one thread): the four corner
    /// weights are products of the axis weights, `w00 = h0 * w0` and so on, and the value is
    /// `p00 * w00 + p01 * w01 + p10 * w10 + p11 * w11` with the compiler's contraction into
    /// fused multiply-adds, `fma(p11, w11, fma(p10, w10, fma(p00, w00, p01 * w01)))`, and the
    /// source coordinate itself `fma(scale, i + 0.5, -0.5)`. Measured against torch 2.15's
    /// x86-64 wheel (AVX-512 kernels, the goldens' machine) the f32 values before rounding agree
    /// bit for bit; other builds may contract differently. Torch's generic kernel, which
    /// it picks instead with several threads for larger outputs, combines the two rows after
    /// interpolating each (`fma(t0, h0, t1 * h1)`): about a third of its f32 values differ in
    /// the last bit, and about one 8-bit value in 10^5 after rounding (8.5e-6 on random images).
    pub fn resize_torch_bilinear(&self, width: u32, height: u32) -> Result<Self, ImageError> {
        if width == 0 || height == 0 {
            return Err(ImageError::Empty { width, height });
        }
        if (width, height) == (self.width, self.height) {
            return Ok(self.clone());
        }
        let (w0, h0) = (self.width as usize, self.height as usize);
        let (w1, h1) = (width as usize, height as usize);
        let rows = torch_linear_taps(h0, h1);
        let cols = torch_linear_taps(w0, w1);
        let sample = |y: usize, x: usize, c: usize| f32::from(self.pixels[(y * w0 + x) * 3 + c]);
        let mut pixels = Vec::with_capacity(w1 * h1 * 3);
        for row in &rows {
            for col in &cols {
                let w00 = row.weight0 * col.weight0;
                let w01 = row.weight0 * col.weight1;
                let w10 = row.weight1 * col.weight0;
                let w11 = row.weight1 * col.weight1;
                for c in 0..3 {
                    let p00 = sample(row.index0, col.index0, c);
                    let p01 = sample(row.index0, col.index1, c);
                    let p10 = sample(row.index1, col.index0, c);
                    let p11 = sample(row.index1, col.index1, c);
                    let v = p11.mul_add(w11, p10.mul_add(w10, p00.mul_add(w00, p01 * w01)));
                    // In range after the clamp, so the cast only drops the (zero) fraction.
                    pixels.push(v.round_ties_even().clamp(0.0, 255.0) as u8);
                }
            }
        }
        Ok(Self { width, height, pixels })
    }
}

/// One output index of torch's linear interpolation along an axis: two input indices and
/// their weights.
#[derive(Debug, Clone, Copy, PartialEq)]
struct LinearTap {
    index0: usize,
    index1: usize,
    weight0: f32,
    weight1: f32,
}

/// Torch's `compute_source_index_and_lambda` (`align_corners=False`) for every output index,
/// in f32 with the fused multiply-add of its x86-64 builds.
fn torch_linear_taps(in_size: usize, out_size: usize) -> Vec<LinearTap> {
    if in_size == out_size {
        return (0..out_size).map(|i| LinearTap { index0: i, index1: i, weight0: 1.0, weight1: 0.0 }).collect();
    }
    // `static_cast<float>(input_size) / output_size`: both converted to f32, divided in f32.
    let scale = in_size as f32 / out_size as f32;
    (0..out_size)
        .map(|i| {
            let source = scale.mul_add(i as f32 + 0.5, -0.5);
            let source = if source < 0.0 { 0.0 } else { source };
            let index0 = (source.floor() as usize).min(in_size - 1);
            let weight1 = (source - index0 as f32).clamp(0.0, 1.0);
            let index1 = if index0 < in_size - 1 { index0 + 1 } else { index0 };
            LinearTap { index0, index1, weight0: 1.0 - weight1, weight1 }
        })
        .collect()
}

/// The horizontal pass: `rows` rows of width `from` resampled to width `to`.
fn horizontal(pixels: &[u8], from: usize, rows: usize, to: usize, filter: Resample) -> Vec<u8> {
    if from == to {
        return pixels.to_vec();
    }
    let taps = Taps::new(from, to, filter);
    let mut out = vec![0u8; to * rows * 3];
    for y in 0..rows {
        let row = &pixels[y * from * 3..(y + 1) * from * 3];
        for x in 0..to {
            for c in 0..3 {
                out[(y * to + x) * 3 + c] = taps.apply(x, |i| row[i * 3 + c]);
            }
        }
    }
    out
}

/// The vertical pass: columns of height `from` (rows `width` wide) resampled to height `to`.
fn vertical(pixels: &[u8], width: usize, from: usize, to: usize, filter: Resample) -> Vec<u8> {
    if from == to {
        return pixels.to_vec();
    }
    let taps = Taps::new(from, to, filter);
    let mut out = vec![0u8; width * to * 3];
    for y in 0..to {
        for x in 0..width {
            for c in 0..3 {
                out[(y * width + x) * 3 + c] = taps.apply(y, |i| pixels[(i * width + x) * 3 + c]);
            }
        }
    }
    out
}

/// One pass's fixed-point filter taps: per output index, the first input index and weights.
struct Taps {
    ksize: usize,
    bounds: Vec<(usize, usize)>,
    weights: Vec<i32>,
}

impl Taps {
    /// Pillow's `precompute_coeffs` followed by `normalize_coeffs_8bpc`.
    fn new(in_size: usize, out_size: usize, filter: Resample) -> Self {
        // Pillow computes the box extent in f32 and the scale in f64.
        let scale = f64::from(in_size as f32) / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut bounds = Vec::with_capacity(out_size);
        let mut weights = vec![0i32; out_size * ksize];
        let mut k = vec![0f64; ksize];
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // C's `(int)` truncates toward zero; the clamps follow.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let count = xmax.saturating_sub(xmin).min(ksize);
            let mut total = 0.0;
            k.fill(0.0);
            for (x, slot) in k.iter_mut().enumerate().take(count) {
                let w = filter.weight(((x + xmin) as f64 - center + 0.5) * ss);
                *slot = w;
                total += w;
            }
            for (x, slot) in k.iter().enumerate() {
                let v = if total != 0.0 && x < count { slot / total } else { *slot };
                let fixed = v * f64::from(1u32 << PRECISION_BITS);
                weights[xx * ksize + x] = if v < 0.0 { (-0.5 + fixed) as i32 } else { (0.5 + fixed) as i32 };
            }
            bounds.push((xmin, count));
        }
        Self { ksize, bounds, weights }
    }

    /// The output value at `index`, reading input samples through `sample`.
    fn apply(&self, index: usize, sample: impl Fn(usize) -> u8) -> u8 {
        let (start, count) = self.bounds[index];
        let k = &self.weights[index * self.ksize..index * self.ksize + count];
        let mut acc: i64 = 1 << (PRECISION_BITS - 1);
        for (i, &w) in k.iter().enumerate() {
            acc += i64::from(sample(start + i)) * i64::from(w);
        }
        (acc >> PRECISION_BITS).clamp(0, 255) as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(width: u32, height: u32) -> Image {
        let pixels = (0..height)
            .flat_map(|y| {
                (0..width).flat_map(move |x| [(x * 7 % 256) as u8, (y * 11 % 256) as u8, ((x + y) * 5) as u8])
            })
            .collect();
        Image::from_rgb8(width, height, pixels).expect("image")
    }

    #[test]
    fn resizing_to_the_same_size_is_the_identity() {
        let image = gradient(9, 5);
        assert_eq!(image.resize(9, 5, Resample::Bicubic).expect("resize"), image);
    }

    #[test]
    fn a_flat_image_stays_flat_through_both_passes() {
        let image = Image::from_rgb8(13, 7, [10u8, 200, 255].repeat(13 * 7)).expect("image");
        for (w, h) in [(28, 14), (5, 3), (13, 20)] {
            for filter in [Resample::Bicubic, Resample::Bilinear] {
                let out = image.resize(w, h, filter).expect("resize");
                assert!(out.pixels().chunks_exact(3).all(|p| p == [10, 200, 255]), "{w}x{h} {filter:?}");
            }
        }
    }

    #[test]
    fn taps_sum_to_one_in_fixed_point_within_rounding() {
        for (from, to) in [(100, 112), (60, 56), (90, 84), (50, 56), (7, 3)] {
            let taps = Taps::new(from, to, Resample::Bicubic);
            for i in 0..to {
                let (_, count) = taps.bounds[i];
                let sum: i64 = taps.weights[i * taps.ksize..i * taps.ksize + count].iter().map(|&w| i64::from(w)).sum();
                assert!((sum - (1 << PRECISION_BITS)).abs() <= count as i64, "{from}->{to} at {i}: {sum}");
            }
        }
    }

    #[test]
    fn rescale_rounds_through_f64_and_normalise_runs_in_f32() {
        let image = Image::from_rgb8(1, 1, vec![0, 128, 255]).expect("image");
        let norm = Normalize { rescale: Some(1.0 / 255.0), mean_std: Some(([0.5; 3], [0.25; 3])) };
        let chw = image.to_chw(&norm);
        assert_eq!(chw[0], (0.0f32 - 0.5) / 0.25);
        assert_eq!(chw[1], ((128.0f64 / 255.0) as f32 - 0.5) / 0.25);
        assert_eq!(chw[2], (1.0f32 - 0.5) / 0.25);
    }

    #[test]
    fn torch_bilinear_matches_torch_where_unfused_arithmetic_rounds_otherwise() {
        // torch 2.15 (x86-64, AVX-512, one thread): `F.interpolate(t.float(), size=[7, 4],
        // mode="bilinear", align_corners=False, antialias=False).round().clamp(0, 255)` of this
        // 4x4 image. Evaluated without the fused multiply-adds, value 12 rounds to 166.
        let input = vec![
            250, 244, 19, 27, 86, 145, 17, 88, 125, 253, 96, 249, 17, 48, 154, 207, 66, 19, 182, 198, 179, 19, 122, 64,
            61, 104, 224, 93, 17, 94, 170, 242, 148, 214, 111, 15, 110, 12, 212, 120, 227, 11, 167, 149, 216, 134, 48,
            3,
        ];
        let torch: [u8; 84] = [
            250, 244, 19, 27, 86, 145, 17, 88, 125, 253, 96, 249, 167, 174, 67, 91, 79, 100, 76, 127, 144, 169, 105,
            183, 34, 62, 144, 194, 67, 28, 170, 190, 175, 36, 120, 77, 39, 76, 189, 150, 41, 57, 176, 220, 164, 117,
            116, 39, 65, 97, 223, 95, 32, 88, 170, 235, 153, 208, 106, 14, 93, 45, 216, 110, 152, 41, 168, 182, 192,
            163, 70, 7, 110, 12, 212, 120, 227, 11, 167, 149, 216, 134, 48, 3,
        ];
        let image = Image::from_rgb8(4, 4, input).expect("image");
        assert_eq!(image.resize_torch_bilinear(4, 7).expect("resize").pixels(), torch);
    }

    #[test]
    fn torch_bilinear_keeps_identity_flat_images_and_refuses_empty_sizes() {
        let image = gradient(9, 5);
        assert_eq!(image.resize_torch_bilinear(9, 5).expect("same size"), image);
        let flat = Image::from_rgb8(13, 7, [10u8, 200, 255].repeat(13 * 7)).expect("image");
        for (w, h) in [(28, 14), (5, 3), (13, 20), (1, 1), (13, 2)] {
            let out = flat.resize_torch_bilinear(w, h).expect("resize");
            assert!(out.pixels().chunks_exact(3).all(|p| p == [10, 200, 255]), "{w}x{h}");
        }
        assert_eq!(image.resize_torch_bilinear(0, 4), Err(ImageError::Empty { width: 0, height: 4 }));
    }

    #[test]
    fn torch_linear_taps_follow_the_half_pixel_rule() {
        // 4 -> 7: scale 4/7, source max((i + 0.5) * 4/7 - 0.5, 0); the last index clamps.
        let taps = torch_linear_taps(4, 7);
        assert_eq!((taps[0].index0, taps[0].index1, taps[0].weight1), (0, 1, 0.0));
        assert_eq!((taps[6].index0, taps[6].index1), (3, 3));
        let source = (4.0f32 / 7.0).mul_add(3.5, -0.5);
        assert_eq!((taps[3].index0, taps[3].weight1), (1, source - 1.0));
        assert_eq!(taps[3].weight0, 1.0 - taps[3].weight1);
    }

    #[test]
    fn bad_buffers_and_formats_are_named() {
        assert_eq!(Image::from_rgb8(0, 3, vec![]), Err(ImageError::Empty { width: 0, height: 3 }));
        let short = Image::from_rgb8(2, 2, vec![0; 11]).expect_err("short");
        assert_eq!(short.to_string(), "a 2x2 rgb image needs 12 bytes, got 11");
        let bmp = Image::decode(b"BM6\0\0\0").expect_err("bmp");
        assert_eq!(bmp, ImageError::Decode(mlxcel_media::Error::Unrecognized));
        let corrupt = Image::decode(b"\x89PNG\r\n\x1a\n\0\0\0").expect_err("corrupt");
        assert!(corrupt.to_string().starts_with("cannot decode the png"), "{corrupt}");
    }

    /// Issue 27 (fuzz/, `preprocess_qwen2_vl` and `preprocess_molmo2`): an encoded PNG whose
    /// header declares 15360x25659 (or 134217828x60) pixels made every family allocate the
    /// declared image before reading any pixel data, and abort.
    #[test]
    fn encoded_items_declaring_too_many_pixels_are_refused_before_decoding() {
        let header = |w: u32, h: u32| {
            let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
            png.extend_from_slice(&w.to_be_bytes());
            png.extend_from_slice(&h.to_be_bytes());
            png.extend_from_slice(&[8, 2, 0, 0, 0, 0, 0, 0, 0]);
            png
        };
        for (width, height) in [(15360, 25659), (134_217_828, 60)] {
            let item = mlxcel_plugin_api::MediaItem::EncodedImage(header(width, height).into());
            let err = Image::from_item(&item, "test").expect_err("refused");
            assert!(err.message.as_str().contains("over the limit of 89478485 pixels"), "{}", err.message);
        }
    }
}
