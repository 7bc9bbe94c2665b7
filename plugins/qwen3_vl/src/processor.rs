//! The Qwen-VL image processor, plus what Qwen3-VL's tower needs per patch row to read its
//! learned position table: the four table rows a bilinear resample of the `side x side` grid to
//! the image's `h x w` patch grid takes (`pos_taps`) and their weights (`pos_weights`).
//!
//! The arithmetic is transformers' `get_vision_interpolation_indices_and_weights` (bilinear,
//! `align_corners=True`, border padding), in f32 as torch computes it: per axis the source
//! coordinate `i * (side - 1) / max(size - 1, 1)`, its floor and the next tap clamped to the
//! grid, weights `max(1 - |src - floor - offset|, 0)`; the taps `(h0, w0) (h0, w1) (h1, w0)
//! (h1, w1)` at `h * side + w`, each weighted by the product of its axes' weights. The row's
//! patch (h, w) is its `patch_positions` entry (the processor's merge order, as the
//! reference's).

use mlxcel_family_common::qwen_vl::processor::{self, PATCH_POSITIONS};
use mlxcel_plugin_api::{DType, MediaItem, PluginError, PreprocessOptions, Preprocessed, Tensor, TensorSpec};

use crate::config::Qwen3VlConfig;

/// Encoder inputs of the position-table resample, `[patches, 4]` each.
pub(crate) const POS_TAPS: &str = "pos_taps";
pub(crate) const POS_WEIGHTS: &str = "pos_weights";

/// One axis: the two taps into a `side`-long table for target index `index` of `size`, and
/// their weights.
fn axis_taps(index: u32, size: u32, side: u32) -> ([u32; 2], [f32; 2]) {
    let src = index as f32 * (side - 1) as f32 / size.saturating_sub(1).max(1) as f32;
    let floor = src.floor();
    let taps = [0u32, 1].map(|offset| (floor as u32 + offset).min(side - 1));
    let weights = [0.0f32, 1.0].map(|offset| (1.0 - (src - floor - offset).abs()).max(0.0));
    (taps, weights)
}

/// The taps and weights of every patch row at `positions` (`[n, 2]`, (h, w)) of an `h x w` grid.
pub(crate) fn position_taps(positions: &[i32], (h, w): (u32, u32), side: u32) -> (Vec<i32>, Vec<f32>) {
    let mut taps = Vec::with_capacity(positions.len() * 2);
    let mut weights = Vec::with_capacity(positions.len() * 2);
    for at in positions.chunks_exact(2) {
        let (ht, hw) = axis_taps(at[0] as u32, h, side);
        let (wt, ww) = axis_taps(at[1] as u32, w, side);
        for (a, b) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
            taps.push((ht[a] * side + wt[b]) as i32);
            weights.push(hw[a] * ww[b]);
        }
    }
    (taps, weights)
}

pub(crate) fn preprocess(
    config: &Qwen3VlConfig,
    item: &MediaItem,
    options: &PreprocessOptions,
) -> Result<Preprocessed, PluginError> {
    let mut out = processor::preprocess(&config.qwen, item, options)?;
    let positions = out
        .tensors
        .iter()
        .find(|t| t.spec.name.as_str() == PATCH_POSITIONS)
        .ok_or_else(|| PluginError::new(mlxcel_plugin_api::ErrorCode::Internal, "no patch positions"))?;
    let positions: Vec<i32> =
        positions.data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let dims = out.grid.dims.as_slice();
    let (taps, weights) = position_taps(&positions, (dims[1], dims[2]), config.vision.grid_side() as u32);
    let n = (positions.len() / 2) as u64;
    let mut tensors = out.tensors.to_vec();
    let bytes = taps.iter().flat_map(|v| v.to_le_bytes()).collect();
    tensors.push(Tensor::from_bytes(TensorSpec::new(POS_TAPS, DType::I32, &[n, 4]), bytes)?);
    tensors.push(Tensor::from_f32(POS_WEIGHTS, &[n, 4], &weights)?);
    out.tensors = tensors.into();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4x4 table resampled to 6 rows: the ends land on the table's ends with weight 1, and
    /// every weight pair sums to 1.
    #[test]
    fn the_taps_span_the_table_corner_to_corner() {
        assert_eq!(axis_taps(0, 6, 4), ([0, 1], [1.0, 0.0]));
        assert_eq!(axis_taps(5, 6, 4), ([3, 3], [1.0, 0.0]));
        let (taps, w) = axis_taps(2, 6, 4);
        // src = 2 * 3 / 5 = 1.2
        assert_eq!(taps, [1, 2]);
        assert!((w[0] - 0.8).abs() < 1e-6 && (w[1] - 0.2).abs() < 1e-6, "{w:?}");
        // A one-patch axis reads the first row only.
        assert_eq!(axis_taps(0, 1, 4), ([0, 1], [1.0, 0.0]));
        let (taps, weights) = position_taps(&[0, 0, 5, 5], (6, 6), 4);
        assert_eq!(taps, [0, 1, 4, 5, 15, 15, 15, 15]);
        assert_eq!(weights, [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    }
}
