//! Element-wise comparison with an explicit tolerance, reporting the first divergent coordinate.

use std::fmt;

use crate::error::Error;
use crate::tensor::{Tensor, unravel};

/// An element passes when `|got - want| <= abs + rel * |want|`; NaN never passes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub abs: f64,
    pub rel: f64,
}

impl Tolerance {
    /// Bit-for-bit value equality (integers, masks, positions).
    pub const EXACT: Self = Self { abs: 0.0, rel: 0.0 };

    pub const fn abs(abs: f64) -> Self {
        Self { abs, rel: 0.0 }
    }

    pub const fn with_rel(self, rel: f64) -> Self {
        Self { rel, ..self }
    }

    fn allows(&self, got: f64, want: f64) -> bool {
        let diff = (got - want).abs();
        // `<=` is false for NaN, so a NaN on either side always counts as over tolerance.
        diff <= self.abs + self.rel * want.abs()
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Self::EXACT { write!(f, "exact") } else { write!(f, "abs {:e}, rel {:e}", self.abs, self.rel) }
    }
}

/// A failed comparison: where the values first part ways, and how badly overall.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    pub stage: String,
    /// Row-major flat index of the first element over tolerance.
    pub index: usize,
    /// The same position per axis of the golden's shape.
    pub coordinate: Vec<usize>,
    pub got: f64,
    pub want: f64,
    pub max_abs_diff: f64,
    /// How many elements are over tolerance, out of `len`.
    pub over_tolerance: usize,
    pub len: usize,
    pub tolerance: Tolerance,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stage {}: first divergence at flat index {} {:?}: got {}, want {}; max abs diff {:e}, \
             {} of {} over tolerance ({})",
            self.stage,
            self.index,
            self.coordinate,
            self.got,
            self.want,
            self.max_abs_diff,
            self.over_tolerance,
            self.len,
            self.tolerance
        )
    }
}

/// What a passing comparison measured, for logs and evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub stage: String,
    pub len: usize,
    pub max_abs_diff: f64,
    pub tolerance: Tolerance,
}

fn compare_values(
    stage: &str,
    shape: &[usize],
    pairs: impl ExactSizeIterator<Item = (f64, f64)>,
    tolerance: Tolerance,
) -> Result<Report, Error> {
    let len = pairs.len();
    let mut first: Option<(usize, f64, f64)> = None;
    let mut over = 0;
    let mut max_abs_diff: f64 = 0.0;
    for (i, (got, want)) in pairs.enumerate() {
        let diff = (got - want).abs();
        // A NaN difference sticks in the maximum (NaN > x is false) so it is never hidden.
        if diff.is_nan() {
            max_abs_diff = f64::NAN;
        } else if diff > max_abs_diff {
            max_abs_diff = diff;
        }
        if !tolerance.allows(got, want) {
            over += 1;
            first.get_or_insert((i, got, want));
        }
    }
    match first {
        None => Ok(Report { stage: stage.to_owned(), len, max_abs_diff, tolerance }),
        Some((index, got, want)) => Err(Error::Mismatch(Box::new(Divergence {
            stage: stage.to_owned(),
            index,
            coordinate: unravel(index, shape),
            got,
            want,
            max_abs_diff,
            over_tolerance: over,
            len,
            tolerance,
        }))),
    }
}

fn check_len(stage: &str, got: usize, want: &Tensor) -> Result<(), Error> {
    if got == want.len() {
        Ok(())
    } else {
        Err(Error::Length { stage: stage.to_owned(), got, want: want.len(), shape: want.shape.clone() })
    }
}

/// Compares float values against an f32 golden (same row-major layout) within `tolerance`.
pub fn compare_f32(stage: &str, got: &[f32], want: &Tensor, tolerance: Tolerance) -> Result<Report, Error> {
    let values = want.as_f32().ok_or_else(|| Error::Dtype {
        stage: stage.to_owned(),
        expected: "f32",
        found: want.dtype_name().to_owned(),
    })?;
    check_len(stage, got.len(), want)?;
    let pairs = got.iter().zip(values).map(|(&g, &w)| (f64::from(g), f64::from(w)));
    compare_values(stage, &want.shape, pairs, tolerance)
}

/// Compares integers (token ids, positions, masks, grids) exactly against an i64 or u8 golden.
pub fn compare_i64(stage: &str, got: &[i64], want: &Tensor) -> Result<Report, Error> {
    let values = want.to_i64().ok_or_else(|| Error::Dtype {
        stage: stage.to_owned(),
        expected: "i64 or u8",
        found: want.dtype_name().to_owned(),
    })?;
    check_len(stage, got.len(), want)?;
    // Golden integers are token ids, positions and 0/1 masks, all far below 2^53: exact in f64.
    let pairs = got.iter().zip(&values).map(|(&g, &w)| (g as f64, w as f64));
    compare_values(stage, &want.shape, pairs, Tolerance::EXACT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorData;

    fn f32_tensor(shape: &[usize], values: &[f32]) -> Tensor {
        Tensor { shape: shape.to_vec(), data: TensorData::F32(values.to_vec()) }
    }

    fn divergence(result: Result<Report, Error>) -> Divergence {
        match result {
            Err(Error::Mismatch(d)) => *d,
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }

    #[test]
    fn passes_within_tolerance_and_reports_max_diff() {
        let want = f32_tensor(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let report = compare_f32("logits", &[1.0, 2.00005, 3.0, 3.99998], &want, Tolerance::abs(1e-4))
            .expect("within tolerance");
        assert_eq!(report.len, 4);
        assert!((report.max_abs_diff - 5e-5).abs() < 1e-6, "{report:?}");
    }

    #[test]
    fn reports_first_divergent_coordinate() {
        let want = f32_tensor(&[2, 3], &[0.0; 6]);
        let got = [0.0, 0.0, 0.0, 0.0, 0.5, -2.0];
        let d = divergence(compare_f32("logits", &got, &want, Tolerance::abs(0.1)));
        assert_eq!(d.stage, "logits");
        assert_eq!((d.index, d.coordinate.clone()), (4, vec![1, 1]));
        assert_eq!((d.got, d.want), (0.5, 0.0));
        assert_eq!(d.max_abs_diff, 2.0);
        assert_eq!((d.over_tolerance, d.len), (2, 6));
        let text = d.to_string();
        assert!(text.contains("stage logits") && text.contains("flat index 4 [1, 1]"), "{text}");
        assert!(text.contains("2 of 6 over tolerance"), "{text}");
    }

    #[test]
    fn relative_tolerance_scales_with_the_golden() {
        let want = f32_tensor(&[2], &[1000.0, 0.001]);
        let tol = Tolerance::abs(0.0).with_rel(1e-3);
        compare_f32("x", &[1000.9, 0.001], &want, tol).expect("0.9 is within 1e-3 of 1000");
        let d = divergence(compare_f32("x", &[1000.0, 0.0011], &want, tol));
        assert_eq!(d.index, 1);
    }

    #[test]
    fn nan_never_passes() {
        let want = f32_tensor(&[3], &[1.0, 2.0, 3.0]);
        let d = divergence(compare_f32("h", &[1.0, f32::NAN, 3.0], &want, Tolerance::abs(1e9)));
        assert_eq!(d.index, 1);
        assert!(d.max_abs_diff.is_nan());
    }

    #[test]
    fn integers_compare_exactly_including_masks() {
        let want = Tensor { shape: vec![2, 2], data: TensorData::U8(vec![1, 0, 1, 1]) };
        compare_i64("attention_mask", &[1, 0, 1, 1], &want).expect("identical");
        let d = divergence(compare_i64("attention_mask", &[1, 1, 1, 1], &want));
        assert_eq!((d.index, d.coordinate), (1, vec![0, 1]));
        assert_eq!(d.tolerance, Tolerance::EXACT);
    }

    #[test]
    fn wrong_length_and_dtype_are_errors_not_mismatches() {
        let want = f32_tensor(&[2], &[1.0, 2.0]);
        assert!(matches!(
            compare_f32("x", &[1.0], &want, Tolerance::EXACT),
            Err(Error::Length { got: 1, want: 2, .. })
        ));
        assert!(matches!(compare_i64("x", &[1, 2], &want), Err(Error::Dtype { .. })));
    }
}
