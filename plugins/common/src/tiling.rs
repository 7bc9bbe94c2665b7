//! Molmo's crop tiling, shared by Molmo and Molmo2 (mlx-vlm's numpy `select_tiling` and
//! transformers' torch one compute the same thing in f32).

/// `where(required_scale < 1.0, 10e9, required_scale)`: the f32 the scalar becomes.
const TOO_SMALL: f32 = 10e9;

/// `select_tiling`: of the `rows x cols` tilings with at most `max_crops` crops, ordered by crop
/// count then rows, the one whose `window`-pixel crops cover `height x width` with the least
/// upscaling, or, when none covers it, with the least downscaling. The scales are f32 divisions
/// (`candidate / original` per side, the smaller side's), ties go to the first, and a side of
/// zero or less (an image no larger than the margins) gives the reference's infinite or
/// negative scales, handled as torch does.
pub fn select_tiling(height: i64, width: i64, window: usize, max_crops: usize) -> [usize; 2] {
    let mut tilings: Vec<[usize; 2]> =
        (1..=max_crops).flat_map(|rows| (1..=max_crops / rows).map(move |cols| [rows, cols])).collect();
    tilings.sort_by_key(|&[rows, cols]| (rows * cols, rows));
    let original = [height as f32, width as f32];
    let scales: Vec<f32> = tilings
        .iter()
        .map(|tiling| {
            // `torch.amin` over the two sides; no NaN can arise (the candidates are positive).
            let [h, w] = [0, 1].map(|i| (tiling[i] * window) as f32 / original[i]);
            h.min(w)
        })
        .collect();
    let pick = if scales.iter().all(|&s| s < 1.0) {
        first_extreme(&scales, |a, b| a > b)
    } else {
        let scales: Vec<f32> = scales.iter().map(|&s| if s < 1.0 { TOO_SMALL } else { s }).collect();
        first_extreme(&scales, |a, b| a < b)
    };
    tilings[pick]
}

/// The index of the first element no other `beats` (torch's `argmax`/`argmin` tie rule).
fn first_extreme(values: &[f32], beats: impl Fn(f32, f32) -> bool) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if beats(v, values[best]) {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_tiling_follows_torch_ties_and_degenerate_sides() {
        // Each expectation is transformers' `select_tiling` on the same arguments. Candidates for
        // 2 crops, in order: 1x1, 1x2, 2x1.
        // Only 1x2 covers 28x50: min(28/28, 56/50) = 1.
        assert_eq!(select_tiling(28, 50, 28, 2), [1, 2]);
        assert_eq!(select_tiling(50, 28, 28, 2), [2, 1]);
        // Nothing covers 100x100 and all three scale by 0.28: the first wins.
        assert_eq!(select_tiling(100, 100, 28, 2), [1, 1]);
        // 2x2, 2x3, 3x2, 2x4 and 4x2 all cover 267x267 at 532/267: the first (fewest crops) wins.
        assert_eq!(select_tiling(267, 267, 266, 8), [2, 2]);
        assert_eq!(select_tiling(500, 250, 266, 8), [2, 1]);
        assert_eq!(select_tiling(300, 1000, 266, 8), [2, 4]);
        // An image no larger than the margins: a zero side divides to +inf (every tiling then
        // "covers" at inf and the first wins), a negative side to negative scales (nothing
        // covers; the largest, first among equals, wins).
        assert_eq!(select_tiling(0, 0, 28, 8), [1, 1]);
        assert_eq!(select_tiling(0, 500, 28, 2), [1, 2]);
        assert_eq!(select_tiling(-15, 472, 28, 2), [1, 1]);
    }
}
