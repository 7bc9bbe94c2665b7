//! The spectral arithmetic of numpy-based audio feature extractors, bit for bit with numpy 2 on
//! x86-64 (the oracle's numpy 2.4): a periodic Hann window in f32, a real FFT in f32, complex
//! magnitudes in f32 and an HTK mel filterbank in f64.
//!
//! numpy 2 computes each of these in single precision and differently from a textbook
//! formula, and log-mel features of quiet bins move by several f32 ulps when any of them is
//! replaced by a more accurate one (an f64 FFT left 9.5e-7 on the Gemma3n fixture, at the edge of
//! the 1e-6 preprocessing tolerance). So each follows what numpy runs:
//!
//! - [`numpy_cos_f32`]: numpy's SIMD single-precision cosine (the Highway kernel numpy
//!   dispatches to on CPUs with FMA): the quadrant `rint(x 2/pi)` with the product and the
//!   rounding constant's addition fused (as GCC contracts them), Cody-Waite reduction by `pi/2`
//!   in three fused steps, then the quadrant's sine or cosine polynomial, also fused;
//! - [`RealFft`]: pocketfft's `rfftp` in double precision, the result rounded to f32: numpy's
//!   `rfft` passes its normalisation factor as a Python int, and on float32 input the ufunc runs
//!   its float64 loop (on the Gemma3n fixture every bin equals the f64 transform rounded, and
//!   none equals a single-precision transform's); radix-4 passes (one radix-2 pass first for odd
//!   powers of two) in FFTPACK's order, no fused multiply-adds (numpy's baseline build has none);
//! - [`complex_abs_f32`]: numpy's SIMD `absolute` for complex64, `max * sqrt(fma(r, r, 1))`
//!   with `r = min / max`, not libm's `hypotf`;
//! - [`htk_mel_filterbank`]: transformers' `create_fb_matrix` (`norm=None`): triangles on the
//!   HTK mel scale in f64 over bin frequencies computed in f32.

/// numpy's constants for its single-precision sine and cosine (hexadecimal floats in its
/// source, here as bits).
const TWO_OVER_PI: u32 = 0x3f22_f983;
const PIO2_HIGH: u32 = 0xbfc9_0fd8;
const PIO2_MED: u32 = 0xb4a8_885a;
const PIO2_LOW: u32 = 0xa7c2_34c4;
/// `1.5 * 2^23`: adding and subtracting it rounds an f32 of magnitude below 2^22 to an integer.
const RINT_MAGIC: u32 = 0x4b40_0000;
const COS_C8: u32 = 0x37cc_730b;
const COS_C6: u32 = 0xbab6_036e;
const COS_C4: u32 = 0x3d2a_aa9e;
const SIN_S9: u32 = 0x363e_9dde;
const SIN_S7: u32 = 0xb950_35dd;
const SIN_S5: u32 = 0x3c08_88cd;
const SIN_S3: u32 = 0xbe2a_aaab;
/// Above this magnitude numpy's kernel calls libm's `cosf` instead (71476.0625, which this
/// literal rounds to exactly).
const COS_SIMD_RANGE: f32 = 71_476.06;

fn bits(b: u32) -> f32 {
    f32::from_bits(b)
}

/// `np.cos` of a float32, as numpy's vectorised kernel computes it for `|x| <= 71476.0625`
/// (outside that range numpy calls libm, and so does this).
pub fn numpy_cos_f32(x: f32) -> f32 {
    if x.is_nan() || x.abs() > COS_SIMD_RANGE {
        return x.cos();
    }
    let magic = bits(RINT_MAGIC);
    let quadrant = x.mul_add(bits(TWO_OVER_PI), magic) - magic;
    let mut r = quadrant.mul_add(bits(PIO2_HIGH), x);
    r = quadrant.mul_add(bits(PIO2_MED), r);
    r = quadrant.mul_add(bits(PIO2_LOW), r);
    let r2 = r * r;
    let mut cos = bits(COS_C8).mul_add(r2, bits(COS_C6));
    cos = cos.mul_add(r2, bits(COS_C4));
    cos = cos.mul_add(r2, -0.5);
    cos = cos.mul_add(r2, 1.0);
    let mut sin = bits(SIN_S9).mul_add(r2, bits(SIN_S7));
    sin = sin.mul_add(r2, bits(SIN_S5));
    sin = sin.mul_add(r2, bits(SIN_S3));
    sin = sin.mul_add(r2, 0.0);
    sin = sin.mul_add(r, r);
    // cos(x) = sin(r) in quadrants 1 and 3 (counting from 0), and negated in 1 and 2.
    let q = quadrant as i32 + 1;
    let value = if q & 1 == 0 { sin } else { cos };
    if q & 2 == 2 { 0.0 - value } else { value }
}

/// The periodic Hann window of `length` samples as numpy evaluates
/// `0.5 * (1 - np.cos(2 * np.pi * np.arange(length, dtype=np.float32) / length))`: the angle
/// `f32(2 pi) * n / length` in f32, numpy's f32 cosine, then `1 - c` and `0.5 * ...` in f32.
pub fn hann_window_numpy(length: usize) -> Vec<f32> {
    let two_pi = std::f64::consts::TAU as f32;
    let len = length as f32;
    (0..length)
        .map(|n| {
            let angle = two_pi * n as f32 / len;
            0.5 * (1.0 - numpy_cos_f32(angle))
        })
        .collect()
}

/// `np.abs` of a complex64: numpy's vectorised `max * sqrt(fma(r, r, 1))`, `r = min / max`
/// over the absolute parts (infinities and NaNs as numpy's kernel maps them).
pub fn complex_abs_f32(re: f32, im: f32) -> f32 {
    let (mut re, mut im) = (re.abs(), im.abs());
    if re.is_infinite() || im.is_infinite() {
        return f32::INFINITY;
    }
    if re.is_nan() || im.is_nan() {
        (re, im) = (f32::NAN, f32::NAN);
    }
    let larger = re.max(im);
    let smaller = re.min(im);
    let ratio = if larger == 0.0 || larger.is_infinite() { 0.0 } else { smaller / larger };
    ratio.mul_add(ratio, 1.0).sqrt() * larger
}

/// One pass of the real FFT: its radix and twiddle factors (`wa` in FFTPACK).
#[derive(Debug, Clone)]
struct Pass {
    radix: usize,
    twiddles: Vec<f64>,
}

/// A forward real FFT of a power-of-two length: pocketfft's `rfftp` in f64, rounded to f32 as
/// numpy returns it for float32 input (see the module).
#[derive(Debug, Clone)]
pub struct RealFft {
    n: usize,
    /// In pocketfft's factor order; the forward transform runs them last to first.
    passes: Vec<Pass>,
}

impl RealFft {
    /// The plan for `n` points, or `None` unless `n` is a power of two of at least 2.
    pub fn new(n: usize) -> Option<Self> {
        if n < 2 || !n.is_power_of_two() {
            return None;
        }
        // Factors of 4 first; a remaining factor of 2 is moved to the front.
        let mut radices = Vec::new();
        let mut left = n;
        while left.is_multiple_of(4) {
            radices.push(4);
            left /= 4;
        }
        if left == 2 {
            radices.push(2);
            let last = radices.len() - 1;
            radices.swap(0, last);
        }
        let mut passes = Vec::with_capacity(radices.len());
        let mut l1 = 1;
        for (k, &radix) in radices.iter().enumerate() {
            let ido = n / (l1 * radix);
            let mut twiddles = vec![0.0f64; (radix - 1) * (ido - 1)];
            // The last factor's pass runs with ido = 1 and needs none.
            if k + 1 < radices.len() {
                for j in 1..radix {
                    for i in 1..=(ido - 1) / 2 {
                        let angle = std::f64::consts::TAU * (j * l1 * i) as f64 / n as f64;
                        twiddles[(j - 1) * (ido - 1) + 2 * i - 2] = angle.cos();
                        twiddles[(j - 1) * (ido - 1) + 2 * i - 1] = angle.sin();
                    }
                }
            }
            passes.push(Pass { radix, twiddles });
            l1 *= radix;
        }
        Some(Self { n, passes })
    }

    /// The transform's length.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Always false: a plan has at least two points.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// `np.fft.rfft(input, n)` for float32 input: `input` zero-padded (or cut) to the length,
    /// transformed in f64; the `n / 2 + 1` bins as `(re, im)` rounded to f32.
    pub fn forward(&self, input: &[f32]) -> Vec<(f32, f32)> {
        let n = self.n;
        let mut a = vec![0.0f64; n];
        for (slot, &x) in a.iter_mut().zip(input) {
            *slot = f64::from(x);
        }
        let mut b = vec![0.0f64; n];
        let mut l1 = n;
        for pass in self.passes.iter().rev() {
            let ido = n / l1;
            l1 /= pass.radix;
            match pass.radix {
                4 => radf4(ido, l1, &a, &mut b, &pass.twiddles),
                _ => radf2(ido, l1, &a, &mut b, &pass.twiddles),
            }
            std::mem::swap(&mut a, &mut b);
        }
        // FFTPACK's half-complex order: r0, r1, i1, ..., r(n/2).
        let mut out = Vec::with_capacity(n / 2 + 1);
        out.push((a[0] as f32, 0.0));
        for k in 1..n / 2 {
            out.push((a[2 * k - 1] as f32, a[2 * k] as f32));
        }
        out.push((a[n - 1] as f32, 0.0));
        out
    }
}

/// FFTPACK's radix-2 forward pass: `cc[a + ido (b + l1 c)]` into `ch[a + ido (b + 2 c)]`.
fn radf2(ido: usize, l1: usize, cc: &[f64], ch: &mut [f64], wa: &[f64]) {
    let c = |a: usize, b: usize, k: usize| cc[a + ido * (b + l1 * k)];
    let h = |a: usize, b: usize, k: usize| a + ido * (b + 2 * k);
    for k in 0..l1 {
        ch[h(0, 0, k)] = c(0, k, 0) + c(0, k, 1);
        ch[h(ido - 1, 1, k)] = c(0, k, 0) - c(0, k, 1);
    }
    if ido.is_multiple_of(2) {
        for k in 0..l1 {
            ch[h(0, 1, k)] = -c(ido - 1, k, 1);
            ch[h(ido - 1, 0, k)] = c(ido - 1, k, 0);
        }
    }
    if ido <= 2 {
        return;
    }
    for k in 0..l1 {
        for i in (2..ido).step_by(2) {
            let ic = ido - i;
            let (wr, wi) = (wa[i - 2], wa[i - 1]);
            // conj(w) * (re + i im)
            let tr2 = wr * c(i - 1, k, 1) + wi * c(i, k, 1);
            let ti2 = wr * c(i, k, 1) - wi * c(i - 1, k, 1);
            ch[h(i - 1, 0, k)] = c(i - 1, k, 0) + tr2;
            ch[h(ic - 1, 1, k)] = c(i - 1, k, 0) - tr2;
            ch[h(i, 0, k)] = ti2 + c(i, k, 0);
            ch[h(ic, 1, k)] = ti2 - c(i, k, 0);
        }
    }
}

/// FFTPACK's radix-4 forward pass: `cc[a + ido (b + l1 c)]` into `ch[a + ido (b + 4 c)]`, the
/// twiddles of its three non-trivial legs at `wa[i + x (ido - 1)]`.
fn radf4(ido: usize, l1: usize, cc: &[f64], ch: &mut [f64], wa: &[f64]) {
    let hsqt2 = std::f64::consts::FRAC_1_SQRT_2;
    let c = |a: usize, b: usize, k: usize| cc[a + ido * (b + l1 * k)];
    let h = |a: usize, b: usize, k: usize| a + ido * (b + 4 * k);
    let w = |x: usize, i: usize| wa[i + x * (ido - 1)];
    for k in 0..l1 {
        let tr1 = c(0, k, 3) + c(0, k, 1);
        ch[h(0, 2, k)] = c(0, k, 3) - c(0, k, 1);
        let tr2 = c(0, k, 0) + c(0, k, 2);
        ch[h(ido - 1, 1, k)] = c(0, k, 0) - c(0, k, 2);
        ch[h(0, 0, k)] = tr2 + tr1;
        ch[h(ido - 1, 3, k)] = tr2 - tr1;
    }
    if ido.is_multiple_of(2) {
        for k in 0..l1 {
            let ti1 = -hsqt2 * (c(ido - 1, k, 1) + c(ido - 1, k, 3));
            let tr1 = hsqt2 * (c(ido - 1, k, 1) - c(ido - 1, k, 3));
            ch[h(ido - 1, 0, k)] = c(ido - 1, k, 0) + tr1;
            ch[h(ido - 1, 2, k)] = c(ido - 1, k, 0) - tr1;
            ch[h(0, 3, k)] = ti1 + c(ido - 1, k, 2);
            ch[h(0, 1, k)] = ti1 - c(ido - 1, k, 2);
        }
    }
    if ido <= 2 {
        return;
    }
    // conj(w) * (re + i im), as FFTPACK's MULPM.
    let mulpm = |wr: f64, wi: f64, re: f64, im: f64| (wr * re + wi * im, wr * im - wi * re);
    for k in 0..l1 {
        for i in (2..ido).step_by(2) {
            let ic = ido - i;
            let (cr2, ci2) = mulpm(w(0, i - 2), w(0, i - 1), c(i - 1, k, 1), c(i, k, 1));
            let (cr3, ci3) = mulpm(w(1, i - 2), w(1, i - 1), c(i - 1, k, 2), c(i, k, 2));
            let (cr4, ci4) = mulpm(w(2, i - 2), w(2, i - 1), c(i - 1, k, 3), c(i, k, 3));
            let (tr1, tr4) = (cr4 + cr2, cr4 - cr2);
            let (ti1, ti4) = (ci2 + ci4, ci2 - ci4);
            let (tr2, tr3) = (c(i - 1, k, 0) + cr3, c(i - 1, k, 0) - cr3);
            let (ti2, ti3) = (c(i, k, 0) + ci3, c(i, k, 0) - ci3);
            ch[h(i - 1, 0, k)] = tr2 + tr1;
            ch[h(ic - 1, 3, k)] = tr2 - tr1;
            ch[h(i, 0, k)] = ti1 + ti2;
            ch[h(ic, 3, k)] = ti1 - ti2;
            ch[h(i - 1, 2, k)] = tr3 + ti4;
            ch[h(ic - 1, 1, k)] = tr3 - ti4;
            ch[h(i, 2, k)] = tr4 + ti3;
            ch[h(ic, 1, k)] = tr4 - ti3;
        }
    }
}

/// transformers' `create_fb_matrix` with `norm=None`: `[n_freqs][n_mels]` row-major in f64.
/// Bin `k` sits at `f32(k) * f32(sample_rate / fft_length)` Hz; the `n_mels + 2` band edges are
/// evenly spaced on the HTK mel scale (`2595 log10(1 + f / 700)`, numpy's `linspace`: `i * step +
/// start`, the last edge exact); each filter is the triangle `max(0, min(down, up))`.
pub fn htk_mel_filterbank(
    n_freqs: usize,
    f_min: f64,
    f_max: f64,
    n_mels: usize,
    sample_rate: u32,
    fft_length: usize,
) -> Vec<f64> {
    let bin_hz = (f64::from(sample_rate) / fft_length as f64) as f32;
    let freqs: Vec<f64> = (0..n_freqs).map(|k| f64::from(k as f32 * bin_hz)).collect();
    let mel = |f: f64| 2595.0 * (1.0 + f / 700.0).log10();
    let (m_min, m_max) = (mel(f_min), mel(f_max));
    let edges = n_mels + 2;
    let step = (m_max - m_min) / (edges - 1) as f64;
    let f_pts: Vec<f64> = (0..edges)
        .map(|i| if i + 1 == edges { m_max } else { i as f64 * step + m_min })
        .map(|m| 700.0 * (10f64.powf(m / 2595.0) - 1.0))
        .collect();
    let f_diff: Vec<f64> = f_pts.windows(2).map(|w| w[1] - w[0]).collect();
    let mut fb = vec![0.0f64; n_freqs * n_mels];
    for (k, &hz) in freqs.iter().enumerate() {
        for m in 0..n_mels {
            // The reference's `-1.0 * slopes`: a negation, exact either way.
            let down = -(f_pts[m] - hz) / f_diff[m];
            let up = (f_pts[m + 2] - hz) / f_diff[m + 1];
            fb[k * n_mels + m] = 0f64.max(down.min(up));
        }
    }
    fb
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A direct DFT in f64, for the transform's values (not its rounding).
    fn dft(x: &[f32], n: usize) -> Vec<(f64, f64)> {
        (0..=n / 2)
            .map(|k| {
                x.iter().enumerate().fold((0.0, 0.0), |(re, im), (j, &v)| {
                    let a = -std::f64::consts::TAU * (j * k) as f64 / n as f64;
                    (re + f64::from(v) * a.cos(), im + f64::from(v) * a.sin())
                })
            })
            .collect()
    }

    #[test]
    fn the_real_fft_is_a_dft_for_even_and_odd_powers_of_two() {
        for n in [2, 4, 8, 16, 32, 64, 512, 1024] {
            let fft = RealFft::new(n).expect("power of two");
            let x: Vec<f32> = (0..n * 3 / 4).map(|i| ((i * 7919) % 23) as f32 / 11.0 - 1.0).collect();
            let got = fft.forward(&x);
            let want = dft(&x, n);
            assert_eq!(got.len(), n / 2 + 1);
            for (k, (&(gr, gi), &(wr, wi))) in got.iter().zip(&want).enumerate() {
                let err = (f64::from(gr) - wr).abs().max((f64::from(gi) - wi).abs());
                assert!(err < 1e-4 * n as f64, "n {n} bin {k}: ({gr}, {gi}) against ({wr}, {wi})");
            }
        }
        assert!(RealFft::new(12).is_none() && RealFft::new(1).is_none());
    }

    /// Values numpy 2.4 gives on x86-64 with AVX-512 (`np.cos` of float32, `np.abs` of
    /// complex64) where they differ from the correctly rounded result, which is what the
    /// emulation is for.
    #[test]
    fn cosine_and_magnitude_follow_numpys_kernels() {
        let window = hann_window_numpy(512);
        // transformers' Gemma3n window at 3, 35 and 37, one ulp from the correctly rounded
        // 0x39b1a400, 0x3d3a0628 and 0x3d4f83c0; at 320 the quadrant's fused rounding picks the
        // sine branch (an unfused product rounds to 2.5 and picks the cosine, 0x3f5a8279).
        let at = |n: usize| window[n].to_bits();
        assert_eq!([at(3), at(35), at(37), at(320)], [0x39b1_a000, 0x3d3a_0620, 0x3d4f_83c8, 0x3f5a_8278]);
        assert_eq!(window[0], 0.0);
        assert_eq!(window[256], 1.0);
        for (n, &w) in window.iter().enumerate() {
            let exact = 0.5 * (1.0 - (std::f64::consts::TAU * n as f64 / 512.0).cos());
            // The angle is rounded to f32 first, which moves the value by up to ~1.2e-7.
            assert!((f64::from(w) - exact).abs() < 2e-7, "{n}");
        }
        // np.abs where it is one ulp above libm's hypotf.
        let abs = |re: u32, im: u32| complex_abs_f32(f32::from_bits(re), f32::from_bits(im)).to_bits();
        assert_eq!(abs(0xbf0d_7a4b, 0x3ec8_07c7), 0x3f2d_4287);
        assert_eq!(abs(0xbf21_1906, 0x3e9c_9893), 0x3f33_1e12);
        assert_eq!(abs(0xbef9_dbe6, 0x3d9e_ab11), 0x3efc_fcf6);
        assert_eq!(complex_abs_f32(3.0, -4.0), 5.0);
        assert_eq!(complex_abs_f32(0.0, 0.0), 0.0);
        assert_eq!(complex_abs_f32(-2.5, 0.0), 2.5);
        assert_eq!(complex_abs_f32(f32::NEG_INFINITY, f32::NAN), f32::INFINITY);
        assert!(complex_abs_f32(1.0, f32::NAN).is_nan());
    }

    #[test]
    fn the_mel_filterbank_has_unit_peaks_between_its_edges() {
        let fb = htk_mel_filterbank(513, 125.0, 7600.0, 32, 16_000, 1024);
        for m in 0..32 {
            let column: Vec<f64> = (0..513).map(|k| fb[k * 32 + m]).collect();
            let peak = column.iter().copied().fold(0.0, f64::max);
            assert!(peak > 0.5 && peak <= 1.0, "filter {m} peaks at {peak}");
        }
        // Nothing below 125 Hz (bin 8 is exactly 125 Hz) or above 7600 Hz (bin 486.4).
        assert!((0..=8).all(|k| (0..32).all(|m| fb[k * 32 + m] == 0.0)));
        assert!((487..513).all(|k| (0..32).all(|m| fb[k * 32 + m] == 0.0)));
    }
}
