//! The Qwen-VL processors' geometry, shared by Qwen2-VL, Qwen2.5-VL and Qwen3-VL (and taken by
//! Youtu-VL's): `smart_resize` (both sides a multiple of `patch * merge`, the area within
//! bounds, the aspect ratio kept), the merge order of patch rows and the merge-ordered patchify
//! of `Qwen2VLImageProcessor`.

/// Why a size cannot be resized for the encoder.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResizeError {
    /// The aspect ratio is beyond what the reference accepts (200).
    #[error("absolute aspect ratio must be smaller than 200, got {0}")]
    AspectRatio(f64),
    /// A side or the factor is zero.
    #[error("cannot resize a {width}x{height} image to a multiple of {factor}")]
    Degenerate { width: u32, height: u32, factor: u32 },
}

/// `smart_resize(height, width, factor, min_pixels, max_pixels)` as transformers computes it
/// in Python floats: `round` is round-half-to-even, `floor` and `ceil` act on the quotients.
/// Returns `(height, width)`.
pub fn smart_resize(
    height: u32,
    width: u32,
    factor: u32,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u32, u32), ResizeError> {
    if height == 0 || width == 0 || factor == 0 {
        return Err(ResizeError::Degenerate { width, height, factor });
    }
    let (h, w, f) = (f64::from(height), f64::from(width), f64::from(factor));
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        return Err(ResizeError::AspectRatio(ratio));
    }
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = ((h * w) / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    Ok((h_bar as u32, w_bar as u32))
}

/// The patch geometry of a processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Patchify {
    /// Spatial patch edge in pixels.
    pub patch: usize,
    /// Patches merged per side after the encoder.
    pub merge: usize,
    /// Frames per temporal patch; a still image is repeated this many times.
    pub temporal: usize,
}

/// The grid of one patchified image, in patches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchGrid {
    pub t: usize,
    pub h: usize,
    pub w: usize,
}

impl PatchGrid {
    /// Number of patch rows.
    pub fn patches(&self) -> usize {
        self.t * self.h * self.w
    }
}

impl Patchify {
    /// Values per patch row: `channels * temporal * patch * patch`.
    pub fn row_width(&self, channels: usize) -> usize {
        channels * self.temporal * self.patch * self.patch
    }

    /// Cuts a channel-first still image `[channels, height, width]` into patch rows
    /// `[grid_h * grid_w, channels * temporal * patch * patch]`.
    ///
    /// Rows run in [`Patchify::merge_order`]. Within a row the order is channel, frame (the
    /// image repeated), pixel row, pixel column: the reference's `reshape(c, gh/m, m, p, gw/m, m,
    /// p)`, `transpose(1, 4, 2, 5, 0, 3, 6)` and the broadcast temporal axis after the channel.
    ///
    /// `height` and `width` must be multiples of `patch * merge`.
    pub fn patchify(&self, chw: &[f32], channels: usize, height: usize, width: usize) -> (Vec<f32>, PatchGrid) {
        let (p, t) = (self.patch, self.temporal);
        let grid = self.grid(height, width);
        let plane = height * width;
        let mut out = Vec::with_capacity(grid.patches() * self.row_width(channels));
        for (ph, pw) in self.merge_order(&grid) {
            let (y0, x0) = (ph * p, pw * p);
            for c in 0..channels {
                for _ in 0..t {
                    for y in 0..p {
                        let start = c * plane + (y0 + y) * width + x0;
                        out.extend_from_slice(&chw[start..start + p]);
                    }
                }
            }
        }
        (out, grid)
    }

    /// The patch grid of a still image of `height x width` pixels.
    pub fn grid(&self, height: usize, width: usize) -> PatchGrid {
        PatchGrid { t: 1, h: height / self.patch, w: width / self.patch }
    }

    /// The (row, column) of each patch of `grid` in the order the patch rows run: merge blocks
    /// row-major, then the `merge x merge` patches inside a block row-major, so the patches the
    /// encoder merges into one feature row are consecutive. Every processor whose tower merges
    /// patches after it cuts its rows in this order (Qwen-VL's, Youtu-VL's).
    pub fn merge_order(&self, grid: &PatchGrid) -> impl Iterator<Item = (usize, usize)> + use<> {
        let (m, bh, bw) = (self.merge, grid.h / self.merge, grid.w / self.merge);
        (0..bh * bw).flat_map(move |b| (0..m * m).map(move |i| ((b / bw) * m + i / m, (b % bw) * m + i % m)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_matches_the_reference_on_the_fixture_sizes() {
        // (height, width) -> resized, with the fixture's bounds (56*56, 12544) and factor 28.
        let check = |h, w, want| assert_eq!(smart_resize(h, w, 28, 3136, 12544), Ok(want), "{h}x{w}");
        check(60, 100, (56, 112));
        check(90, 50, (84, 56));
        // Too small: scaled up to the minimum area, ceil per side.
        check(20, 20, (56, 56));
        // Too large: scaled down below the maximum area, floor per side.
        check(1000, 1000, (112, 112));
        // Round half to even: 42 / 28 = 1.5 rounds to 2, 70 / 28 = 2.5 rounds to 2.
        assert_eq!(smart_resize(42, 70, 28, 0, u64::MAX), Ok((56, 56)));
        assert!(matches!(smart_resize(1, 201, 28, 0, u64::MAX), Err(ResizeError::AspectRatio(_))));
        assert!(smart_resize(0, 5, 28, 0, 10).is_err());
    }

    #[test]
    fn patch_rows_run_over_merge_blocks_then_channel_frame_row_column() {
        // A 2-channel 4x4 image, patch 1, merge 2, two frames: value = c*100 + y*10 + x.
        let (c, h, w) = (2, 4, 4);
        let chw: Vec<f32> = (0..c * h * w).map(|i| ((i / (h * w)) * 100 + (i / w % h) * 10 + i % w) as f32).collect();
        let p = Patchify { patch: 1, merge: 2, temporal: 2 };
        let (rows, grid) = p.patchify(&chw, c, h, w);
        assert_eq!(grid, PatchGrid { t: 1, h: 4, w: 4 });
        assert_eq!(rows.len(), 16 * 4);
        // Rows 0..4 are the top-left 2x2 block; row 2 is pixel (1, 0).
        assert_eq!(&rows[2 * 4..3 * 4], &[10.0, 10.0, 110.0, 110.0]);
        // Row 4 starts the next block along the width: pixel (0, 2).
        assert_eq!(&rows[4 * 4..5 * 4], &[2.0, 2.0, 102.0, 102.0]);
        // Row 8 is the first block of the second block row: pixel (2, 0).
        assert_eq!(&rows[8 * 4..9 * 4], &[20.0, 20.0, 120.0, 120.0]);
    }

    #[test]
    fn the_merge_order_runs_over_blocks_then_within_each_block() {
        let p = Patchify { patch: 16, merge: 2, temporal: 1 };
        let grid = p.grid(64, 96);
        assert_eq!(grid, PatchGrid { t: 1, h: 4, w: 6 });
        let order: Vec<_> = p.merge_order(&grid).collect();
        assert_eq!(order.len(), 24);
        assert_eq!(&order[..6], &[(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3)]);
        // The second block row starts after the first row's three blocks.
        assert_eq!(&order[12..14], &[(2, 0), (2, 1)]);
        assert_eq!(order[23], (3, 5));
    }
}
