//! Canonical decompositions in plain Rust f32, each in the stated order (Rust never contracts
//! `a * b + c` into a fused multiply-add). A case reaches "exact canonical-decomposition
//! equivalence" when its emitted result is bit-identical to one of these. The `mutant_*`
//! functions are the decompositions the claims must tell apart.
#![forbid(unsafe_code)]

/// The `bits`-bit integers of MLX's packed u32 words, least significant first, row-major
/// `[rows, cols]`.
pub fn unpack(words: &[u32], bits: usize, rows: usize, cols: usize) -> Vec<u8> {
    let per = 32 / bits;
    let mask = (1u32 << bits) - 1;
    let mut q = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let w = words[(r * cols + c) / per];
            q.push(((w >> (bits * (c % per))) & mask) as u8);
        }
    }
    q
}

/// MLX affine dequantization as the contract states it: `f32(q) * scale`, rounded, then
/// `+ bias`, rounded; one scale and bias per `group` consecutive inputs of a row.
pub fn dequantize(q: &[u8], scales: &[f32], biases: &[f32], cols: usize, group: usize) -> Vec<f32> {
    per_element(q, scales, biases, cols, group, |q, s, b| q * s + b)
}

/// Mutant: one rounding, `fma(q, scale, bias)`.
pub fn mutant_dequantize_fused(q: &[u8], scales: &[f32], biases: &[f32], cols: usize, group: usize) -> Vec<f32> {
    per_element(q, scales, biases, cols, group, |q, s, b| q.mul_add(s, b))
}

/// Mutant: reassociated as `(q + bias / scale) * scale`.
#[cfg_attr(not(test), allow(dead_code))] // used by the unit tests
pub fn mutant_dequantize_shifted(q: &[u8], scales: &[f32], biases: &[f32], cols: usize, group: usize) -> Vec<f32> {
    per_element(q, scales, biases, cols, group, |q, s, b| (q + b / s) * s)
}

fn per_element(
    q: &[u8],
    scales: &[f32],
    biases: &[f32],
    cols: usize,
    group: usize,
    f: impl Fn(f32, f32, f32) -> f32,
) -> Vec<f32> {
    let groups = cols / group;
    q.iter()
        .enumerate()
        .map(|(i, &q)| {
            let (r, c) = (i / cols, i % cols);
            let g = r * groups + c / group;
            f(q as f32, scales[g], biases[g])
        })
        .collect()
}

/// `a + b`, elementwise.
pub fn add(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// `x @ w^T` for `x [rows, k]`, `w [out, k]`: each output a sequential sum over k of rounded
/// products, from 0.
pub fn linear(x: &[f32], w: &[f32], rows: usize, out: usize, k: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(rows * out);
    for r in 0..rows {
        for o in 0..out {
            let mut acc = 0f32;
            for i in 0..k {
                acc += x[r * k + i] * w[o * k + i];
            }
            y.push(acc);
        }
    }
    y
}

/// As [`linear`], each step a fused multiply-add: `acc = fma(x, w, acc)`, sequential over k.
pub fn linear_fma(x: &[f32], w: &[f32], rows: usize, out: usize, k: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(rows * out);
    for r in 0..rows {
        for o in 0..out {
            let mut acc = 0f32;
            for i in 0..k {
                acc = x[r * k + i].mul_add(w[o * k + i], acc);
            }
            y.push(acc);
        }
    }
    y
}

/// Inclusive prefix sums along the last axis of `[rows, n]`, sequential: `y_t = y_(t-1) + x_t`.
pub fn cumsum(x: &[f32], rows: usize, n: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(rows * n);
    for r in 0..rows {
        let mut acc = 0f32;
        for t in 0..n {
            acc += x[r * n + t];
            y.push(acc);
        }
    }
    y
}

/// Mutant: the same prefix sums reassociated as a Hillis-Steele scan (log2 n rounds of
/// `y_t += y_(t - 2^k)`), the order a parallel scan takes.
#[cfg_attr(not(test), allow(dead_code))] // used by the unit tests
pub fn mutant_cumsum_tree(x: &[f32], rows: usize, n: usize) -> Vec<f32> {
    let mut y = x.to_vec();
    for r in 0..rows {
        let row = &mut y[r * n..(r + 1) * n];
        let mut step = 1;
        while step < n {
            let prev = row.to_vec();
            for t in step..n {
                row[t] = prev[t] + prev[t - step];
            }
            step *= 2;
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::first_divergence;
    use crate::rng::Rng;

    /// Operands as the dequantize case draws them: random integers, positive and negative
    /// scales and biases of a quantized N(0, 1) weight's magnitude.
    fn operands(bits: usize) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
        let mut rng = Rng::new(11);
        let q = (0..64 * 128).map(|_| (rng.unit() * (1 << bits) as f32) as u8).collect();
        let s = (0..64 * 4).map(|_| 0.05 + 0.2 * rng.unit()).collect();
        let b = (0..64 * 4).map(|_| -2.0 - rng.unit()).collect();
        (q, s, b)
    }

    #[test]
    fn unpacks_least_significant_first() {
        assert_eq!(unpack(&[0x7654_3210], 4, 1, 8), [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(unpack(&[0x0403_0201], 8, 1, 4), [1, 2, 3, 4]);
    }

    /// Mutation-sensitive: a fused multiply-add, or `(q + b / s) * s`, is not the canonical
    /// dequantization on these operands, so a canonical-exact claim would catch either.
    #[test]
    fn dequantization_mutants_are_told_apart() {
        for bits in [4, 8] {
            let (q, s, b) = operands(bits);
            let canon = dequantize(&q, &s, &b, 128, 32);
            let shape = [64, 128];
            assert!(first_divergence(&mutant_dequantize_fused(&q, &s, &b, 128, 32), &canon, &shape).is_some());
            assert!(first_divergence(&mutant_dequantize_shifted(&q, &s, &b, 128, 32), &canon, &shape).is_some());
        }
    }

    /// Mutation-sensitive: reassociating the scan changes bits on N(0, 1) operands.
    #[test]
    fn scan_reassociation_is_told_apart() {
        let x = Rng::new(5).normals(4 * 64, 1.0);
        let seq = cumsum(&x, 4, 64);
        assert!(first_divergence(&mutant_cumsum_tree(&x, 4, 64), &seq, &[4, 64]).is_some());
        assert_eq!(cumsum(&[1.0, 2.0, 3.0], 1, 3), [1.0, 3.0, 6.0]);
        assert_eq!(mutant_cumsum_tree(&[1.0, 2.0, 3.0], 1, 3), [1.0, 3.0, 6.0]);
    }

    /// Mutation-sensitive: rounding the products and the sum to bf16 (a bf16 accumulator)
    /// is not the f32 contraction rounded once.
    #[test]
    fn a_bf16_accumulator_is_told_apart() {
        use crate::rng::round_bf16;
        let mut rng = Rng::new(3);
        let x: Vec<f32> = rng.normals(256, 1.0).into_iter().map(round_bf16).collect();
        let w: Vec<f32> = rng.normals(256, 1.0).into_iter().map(round_bf16).collect();
        let once = round_bf16(linear(&x, &w, 1, 1, 256)[0]);
        let mut acc = 0f32;
        for i in 0..256 {
            acc = round_bf16(acc + round_bf16(x[i] * w[i]));
        }
        assert_ne!(once.to_bits(), acc.to_bits());
    }
}
