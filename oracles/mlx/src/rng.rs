//! Seeded operands: SplitMix64, so every run (and every machine) draws the same values.
#![forbid(unsafe_code)]

#[derive(Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 24 random bits (exact in f32).
    #[cfg_attr(not(test), allow(dead_code))] // used by the unit tests
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal (Box-Muller in f64, rounded to f32).
    pub fn normal(&mut self) -> f32 {
        let u1 = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }

    /// `n` normals scaled by `scale`.
    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// f32 to bf16 bits, round to nearest even (no NaNs among the operands).
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let round = 0x7FFF + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `x` rounded to the nearest bf16, as an f32.
pub fn round_bf16(x: f32) -> f32 {
    bf16_to_f32(bf16_bits(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_seeded() {
        let a: Vec<f32> = Rng::new(7).normals(8, 1.0);
        let b: Vec<f32> = Rng::new(7).normals(8, 1.0);
        assert_eq!(a, b);
        assert_ne!(a, Rng::new(8).normals(8, 1.0));
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3F80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
    }
}
