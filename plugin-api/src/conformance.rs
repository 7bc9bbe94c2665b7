//! The conformance kit's comparison logic: a plugin's answers against a reference's goldens,
//! stage by stage, with the published tolerances.
//!
//! This module compares values already in memory, for plugin authors' own tests. The host's
//! `plugins verify` command reads a fixture's goldens and compares through `mlxcel-golden`
//! (which reports the divergent coordinate per axis), with the tolerances from [`tolerance`].
//! The stage names are those of the manifest's evidence ([`STAGES`]), so a passing
//! [`ConformanceReport`] converts straight into a manifest's `max_abs_diff` table.
//!
//! [`STAGES`]: crate::manifest::STAGES

use std::collections::BTreeMap;
use std::fmt;

use crate::manifest::QUALIFIED_TOLERANCES;
use crate::types::{AttentionMask, Positions, Preprocessed};

/// The outcome of comparing one stage.
#[derive(Debug, Clone, PartialEq)]
pub struct StageReport {
    /// The stage name (`preprocess`, `placeholder`, `positions`, `mask`, ...).
    pub stage: &'static str,
    /// The largest absolute difference over all elements (0 for exact stages that match;
    /// infinite when the shapes differ).
    pub max_abs_diff: f64,
    /// How many elements differ by more than the tolerance.
    pub mismatches: usize,
    /// The flat index of the first such element.
    pub first_mismatch: Option<usize>,
    /// The tolerance applied.
    pub tolerance: f64,
    /// A shape or length problem that made element comparison impossible.
    pub shape_problem: Option<String>,
}

impl StageReport {
    /// Whether the stage is within tolerance.
    pub fn passed(&self) -> bool {
        self.shape_problem.is_none() && self.mismatches == 0
    }
}

impl fmt::Display for StageReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.shape_problem, self.first_mismatch) {
            (Some(problem), _) => write!(f, "{}: failed: {problem}", self.stage),
            (None, Some(first)) => write!(
                f,
                "{}: failed: {} values over {:e}, max-abs-diff {:e}, first at flat index {first}",
                self.stage, self.mismatches, self.tolerance, self.max_abs_diff
            ),
            (None, None) => {
                write!(f, "{}: ok, max-abs-diff {:e} (tolerance {:e})", self.stage, self.max_abs_diff, self.tolerance)
            }
        }
    }
}

/// Every stage of one fixture variant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConformanceReport {
    /// The fixture variant, e.g. `two_images`.
    pub variant: String,
    /// Stage results in pipeline order.
    pub stages: Vec<StageReport>,
}

impl ConformanceReport {
    /// Whether every stage passed.
    pub fn passed(&self) -> bool {
        self.stages.iter().all(StageReport::passed)
    }

    /// The first failing stage, which is where to look.
    pub fn first_failure(&self) -> Option<&StageReport> {
        self.stages.iter().find(|s| !s.passed())
    }

    /// The per-stage max-abs-diff for a manifest's evidence, worst over `reports`.
    pub fn max_abs_diff(reports: &[ConformanceReport]) -> BTreeMap<String, f64> {
        let mut table = BTreeMap::new();
        for stage in reports.iter().flat_map(|r| &r.stages) {
            let entry = table.entry(stage.stage.to_owned()).or_insert(0.0f64);
            *entry = entry.max(stage.max_abs_diff);
        }
        table
    }
}

/// The published tolerance of a stage; stages without one (such as `embeddings`) default to
/// the encoder's.
pub fn tolerance(stage: &str) -> f64 {
    QUALIFIED_TOLERANCES.iter().find(|(s, _)| *s == stage).map_or(1e-4, |(_, t)| *t)
}

/// Compares two flat arrays of the same logical shape, element by element.
pub fn compare_values(
    stage: &'static str,
    got: &[f64],
    got_shape: &[u64],
    want: &[f64],
    want_shape: &[u64],
    tolerance: f64,
) -> StageReport {
    let mut report =
        StageReport { stage, max_abs_diff: 0.0, mismatches: 0, first_mismatch: None, tolerance, shape_problem: None };
    if got_shape != want_shape || got.len() != want.len() {
        report.max_abs_diff = f64::INFINITY;
        report.shape_problem =
            Some(format!("shape {got_shape:?} ({} values), golden {want_shape:?} ({} values)", got.len(), want.len()));
        return report;
    }
    for (index, (g, w)) in got.iter().zip(want).enumerate() {
        // NaN never matches, not even NaN: a golden with NaN is itself a bug.
        let diff = if g.is_nan() || w.is_nan() { f64::INFINITY } else { (g - w).abs() };
        report.max_abs_diff = report.max_abs_diff.max(diff);
        if diff > tolerance {
            report.mismatches += 1;
            report.first_mismatch.get_or_insert(index);
        }
    }
    report
}

/// Preprocess: the items' tensors named `tensor`, concatenated along the first axis in item
/// order (as HF processors batch `pixel_values`), against the golden.
pub fn compare_preprocess(items: &[Preprocessed], tensor: &str, want: &[f32], want_shape: &[u64]) -> StageReport {
    let stage = "preprocess";
    let mut values = Vec::new();
    let mut rows = 0u64;
    let mut inner: Option<Vec<u64>> = None;
    for (index, item) in items.iter().enumerate() {
        let Some(t) = item.tensors.iter().find(|t| t.spec.name.as_str() == tensor) else {
            return shape_failure(stage, format!("item {index} has no tensor `{tensor}`"));
        };
        let Some(data) = t.to_f32() else {
            return shape_failure(stage, format!("item {index}'s `{tensor}` is {}, not f32", t.spec.dtype.as_str()));
        };
        let shape = t.spec.shape.as_slice();
        let Some((first, rest)) = shape.split_first() else {
            return shape_failure(stage, format!("item {index}'s `{tensor}` is a scalar"));
        };
        match &inner {
            Some(expected) if expected.as_slice() != rest => {
                return shape_failure(
                    stage,
                    format!("item {index}'s `{tensor}` has inner shape {rest:?}, not {expected:?}"),
                );
            }
            Some(_) => {}
            None => inner = Some(rest.to_vec()),
        }
        rows += first;
        values.extend(data.into_iter().map(f64::from));
    }
    let mut shape = vec![rows];
    shape.extend(inner.unwrap_or_default());
    let want: Vec<f64> = want.iter().copied().map(f64::from).collect();
    compare_values(stage, &values, &shape, &want, want_shape, tolerance(stage))
}

/// Placeholder expansion: the host's tokenization of the plugin's expanded prompt against the
/// golden `input_ids`, exactly.
pub fn compare_placeholder(got: &[u32], want: &[i64]) -> StageReport {
    let got: Vec<f64> = got.iter().map(|&t| f64::from(t)).collect();
    let want: Vec<f64> = want.iter().map(|&t| t as f64).collect();
    compare_values("placeholder", &got, &[got.len() as u64], &want, &[want.len() as u64], 0.0)
}

/// Positions against golden `position_ids`: `[len]` for 1-D, `[3, len]` for M-RoPE; exactly.
pub fn compare_positions(got: &Positions, want: &[i64], want_shape: &[u64]) -> StageReport {
    let (ids, shape) = match got {
        Positions::OneD { ids, .. } => (ids, vec![ids.len() as u64]),
        Positions::MRope { ids, .. } => (ids, vec![3, (ids.len() / 3) as u64]),
    };
    let got: Vec<f64> = ids.iter().map(|&p| p as f64).collect();
    let want: Vec<f64> = want.iter().map(|&p| p as f64).collect();
    compare_values("positions", &got, &shape, &want, want_shape, 0.0)
}

/// The attention mask against a golden boolean mask `[len][len]` (non-zero = attend); exactly.
pub fn compare_mask(got: &AttentionMask, want: &[u8], len: usize) -> StageReport {
    let got: Vec<f64> = got.materialize(len).iter().map(|&v| if v == 0.0 { 1.0 } else { 0.0 }).collect();
    let want: Vec<f64> = want.iter().map(|&v| if v != 0 { 1.0 } else { 0.0 }).collect();
    let shape = [len as u64, len as u64];
    let want_shape = if want.len() == len * len { shape.to_vec() } else { vec![want.len() as u64] };
    compare_values("mask", &got, &shape, &want, &want_shape, 0.0)
}

fn shape_failure(stage: &'static str, problem: String) -> StageReport {
    StageReport {
        stage,
        max_abs_diff: f64::INFINITY,
        mismatches: 0,
        first_mismatch: None,
        tolerance: tolerance(stage),
        shape_problem: Some(problem),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{MediaGrid, Tensor};
    use abi_stable::std_types::RVec;

    fn item(rows: u64, values: &[f32]) -> Preprocessed {
        let tensor = Tensor::from_f32("pixel_values", &[rows, 2], values).expect("valid tensor");
        Preprocessed { tensors: RVec::from(vec![tensor]), grid: MediaGrid { dims: RVec::new(), feature_tokens: 1 } }
    }

    #[test]
    fn preprocess_concatenates_items_and_applies_the_tolerance() {
        let items = [item(1, &[0.5, 1.0]), item(2, &[2.0, 3.0, 4.0, 5.0])];
        let ok = compare_preprocess(&items, "pixel_values", &[0.5, 1.0, 2.0, 3.0, 4.0, 5.0], &[3, 2]);
        assert!(ok.passed(), "{ok}");
        let off = compare_preprocess(&items, "pixel_values", &[0.5, 1.0, 2.0, 3.0, 4.0, 5.001], &[3, 2]);
        assert!(!off.passed());
        assert_eq!((off.mismatches, off.first_mismatch), (1, Some(5)));
        let shape = compare_preprocess(&items, "pixel_values", &[0.0; 6], &[2, 3]);
        assert_eq!(shape.to_string(), "preprocess: failed: shape [3, 2] (6 values), golden [2, 3] (6 values)");
        let missing = compare_preprocess(&items, "pixels", &[], &[0]);
        assert_eq!(missing.to_string(), "preprocess: failed: item 0 has no tensor `pixels`");
    }

    #[test]
    fn positions_placeholder_and_mask_are_exact() {
        let mrope = Positions::MRope {
            ids: RVec::from(vec![0, 1, 1, 0, 1, 2, 0, 2, 1]),
            sections: RVec::from(vec![2, 1, 1]),
            interleaved: false,
            next_position: 3,
        };
        assert!(compare_positions(&mrope, &[0, 1, 1, 0, 1, 2, 0, 2, 1], &[3, 3]).passed());
        let wrong = compare_positions(&mrope, &[0, 1, 1, 0, 1, 2, 0, 2, 2], &[3, 3]);
        assert_eq!(wrong.first_mismatch, Some(8));
        assert!(!compare_positions(&Positions::sequential(3), &[0, 1, 2], &[3, 1]).passed());

        assert!(compare_placeholder(&[5, 7, 7, 6], &[5, 7, 7, 6]).passed());
        assert!(!compare_placeholder(&[5, 7, 6], &[5, 7, 7, 6]).passed());

        let mask = AttentionMask::causal().with_bidirectional(1, 2);
        #[rustfmt::skip]
        let golden = [
            1, 0, 0,
            1, 1, 1,
            1, 1, 1,
        ];
        assert!(compare_mask(&mask, &golden, 3).passed());
        let causal_only = compare_mask(&AttentionMask::causal(), &golden, 3);
        assert_eq!((causal_only.mismatches, causal_only.first_mismatch), (1, Some(5)));
    }

    #[test]
    fn reports_fold_into_evidence() {
        let a = ConformanceReport {
            variant: "image".to_owned(),
            stages: vec![compare_values("logits", &[1.0], &[1], &[1.00002], &[1], tolerance("logits"))],
        };
        let b = ConformanceReport {
            variant: "two_images".to_owned(),
            stages: vec![compare_values("logits", &[1.0], &[1], &[1.00005], &[1], tolerance("logits"))],
        };
        assert!(a.passed() && b.passed());
        let table = ConformanceReport::max_abs_diff(&[a, b]);
        assert!((table["logits"] - 5e-5).abs() < 1e-9);
    }
}
