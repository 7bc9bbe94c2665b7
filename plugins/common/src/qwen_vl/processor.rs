//! The image processor (`Qwen2VLImageProcessor`, PIL backend): `smart_resize` to multiples of
//! `patch * merge` within the pixel bounds, Pillow's resampling, rescale, normalise, the still
//! image repeated over `temporal_patch_size` frames, and merge-ordered patch rows.
//!
//! Besides the reference's `pixel_values` `[patches, C*T*P*P]` and `image_grid_thw` `[1, 3]`,
//! each item carries what the encoder graph needs per patch row, so a graph compiled for a
//! bucket serves any grid that fits it:
//! - `patch_positions` `[patches, 2]` i32: the row's (h, w) patch coordinates, for the 2-D
//!   rotary embedding;
//! - `patch_segments` `[patches]` i32: 2 on an image's first row, 1 on its other rows (0 is
//!   the host's zero padding), so attention stays within each image even when several
//!   images' rows are concatenated into one call.

use mlxcel_plugin_api::{MediaGrid, MediaItem, PluginError, PreprocessOptions, Preprocessed, Tensor};

use super::{ProcessorConfig, QwenVl};
use crate::{Image, Normalize, PatchGrid, Patchify, Resample, smart_resize};

/// Encoder input names shared with the graph.
pub const PIXEL_VALUES: &str = "pixel_values";
pub const GRID_THW: &str = "image_grid_thw";
pub const PATCH_POSITIONS: &str = "patch_positions";
pub const PATCH_SEGMENTS: &str = "patch_segments";

/// Segment marks of [`PATCH_SEGMENTS`].
pub const SEGMENT_START: i32 = 2;
pub const SEGMENT_CONTINUE: i32 = 1;

/// One image to encoder inputs. `options.max_pixels` and `min_pixels` tighten the processor's
/// own bounds on the resized area (they never loosen them).
pub fn preprocess(config: &QwenVl, item: &MediaItem, options: &PreprocessOptions) -> Result<Preprocessed, PluginError> {
    let p = &config.processor;
    let resized = resize(p, item, options, "a qwen-vl processor")?;
    let chw = resized.to_chw(&Normalize { rescale: p.rescale_factor, mean_std: p.mean_std });
    let patchify = Patchify { patch: p.patch_size, merge: p.merge_size, temporal: p.temporal_patch_size };
    let (rows, grid) = patchify.patchify(&chw, 3, resized.height() as usize, resized.width() as usize);
    let n = grid.patches();
    let dims = [grid.t as u32, grid.h as u32, grid.w as u32];
    let mut tensors = vec![
        Tensor::from_f32(PIXEL_VALUES, &[n as u64, patchify.row_width(3) as u64], &rows)?,
        Tensor::from_i64(GRID_THW, &[1, 3], &dims.map(i64::from))?,
    ];
    tensors.extend(row_tensors(&patchify, &grid)?);
    let feature_tokens = (n / (p.merge_size * p.merge_size)) as u32;
    Ok(Preprocessed { tensors: tensors.into(), grid: MediaGrid { dims: dims.to_vec().into(), feature_tokens } })
}

/// The item decoded and resized as the processor's settings `p` say: `smart_resize` to
/// multiples of `patch * merge` within the pixel bounds (`options` tighten them, never loosen
/// them), then Pillow's resampling; an image already that size is kept as it is. `family`
/// names the processor in the refusal of an item that is not an image. What a processor does
/// after this (the patch layout within a row, the tensors it hands the encoder) is its own.
pub fn resize(
    p: &ProcessorConfig,
    item: &MediaItem,
    options: &PreprocessOptions,
    family: &str,
) -> Result<Image, PluginError> {
    let image = Image::from_item(item, family)?;
    let max_pixels = options.max_pixels.into_option().map_or(p.max_pixels, |m| m.min(p.max_pixels));
    let min_pixels = options.min_pixels.into_option().map_or(p.min_pixels, |m| m.max(p.min_pixels));
    let factor = (p.patch_size * p.merge_size) as u32;
    let (height, width) = if p.do_resize {
        smart_resize(image.height(), image.width(), factor, min_pixels, max_pixels)
            .map_err(|e| PluginError::invalid(e.to_string()))?
    } else {
        (image.height(), image.width())
    };
    if height % factor != 0 || width % factor != 0 || height == 0 || width == 0 {
        return Err(PluginError::invalid(format!(
            "a {width}x{height} image is not a multiple of {factor} pixels per side and resizing is off"
        )));
    }
    if u64::from(height) * u64::from(width) > max_pixels {
        return Err(PluginError::too_large(format!(
            "{}x{} resizes to {width}x{height}, more than {max_pixels} pixels",
            image.width(),
            image.height()
        )));
    }
    if (height, width) == (image.height(), image.width()) {
        return Ok(image);
    }
    let filter = Resample::from_pil(p.resample)
        .ok_or_else(|| PluginError::unsupported(format!("pil resampling filter {}", p.resample)))?;
    image.resize(width, height, filter).map_err(|e| PluginError::invalid(e.to_string()))
}

/// What the vision graph needs per patch row of `grid` beside its pixels, in the rows'
/// [`Patchify::merge_order`]: [`PATCH_POSITIONS`] and [`PATCH_SEGMENTS`].
pub fn row_tensors(patchify: &Patchify, grid: &PatchGrid) -> Result<[Tensor; 2], PluginError> {
    let n = grid.patches();
    let positions: Vec<i32> = patchify.merge_order(grid).flat_map(|(h, w)| [h as i32, w as i32]).collect();
    let mut segments = vec![SEGMENT_CONTINUE; n];
    if let Some(first) = segments.first_mut() {
        *first = SEGMENT_START;
    }
    let n64 = n as u64;
    Ok([i32_tensor(PATCH_POSITIONS, &[n64, 2], &positions)?, i32_tensor(PATCH_SEGMENTS, &[n64], &segments)?])
}

fn i32_tensor(name: &str, shape: &[u64], values: &[i32]) -> Result<Tensor, PluginError> {
    let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::from_bytes(mlxcel_plugin_api::TensorSpec::new(name, mlxcel_plugin_api::DType::I32, shape), data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qwen_vl::testing::{FIXTURES, fixture_config, golden, image_item};

    #[test]
    fn pixel_values_and_grids_match_the_goldens_to_1e_6() {
        for name in FIXTURES {
            let config = fixture_config(name);
            for variant in ["image", "two_images", "long"] {
                let golden = golden(name, variant);
                let images = golden.field("images").expect("images").as_array().expect("list").clone();
                let mut pixels = Vec::new();
                let mut grids = Vec::new();
                for path in &images {
                    let item = image_item(name, path.as_str().expect("path"));
                    let out = preprocess(&config, &item, &PreprocessOptions::default()).expect("preprocess");
                    pixels.extend(out.tensors[0].to_f32().expect("f32"));
                    grids.extend(out.grid.dims.iter().map(|&d| i64::from(d)));
                    assert_eq!(out.grid.feature_tokens, out.grid.dims.iter().product::<u32>() / 4);
                    assert_eq!(out.tensors[0].spec.shape[1] as usize, config.geometry.patch_width());
                }
                golden.check_i64("image_grid_thw", &grids).expect(variant);
                let report = golden
                    .check_f32("pixel_values", &pixels, mlxcel_golden::Tolerance::abs(1e-6))
                    .unwrap_or_else(|e| panic!("{name}/{variant}: {e}"));
                assert!(report.max_abs_diff <= 1e-6, "{name}/{variant}: {report:?}");
            }
        }
    }

    #[test]
    fn positions_follow_the_merge_order_and_segments_mark_the_first_row() {
        let config = fixture_config("qwen2_vl");
        let out =
            preprocess(&config, &image_item("qwen2_vl", "inputs/wide.png"), &PreprocessOptions::default()).expect("ok");
        let positions = &out.tensors[2];
        let values: Vec<i32> =
            positions.data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        // Grid 4x8: the first merge block is (0,0) (0,1) (1,0) (1,1), the next starts at (0,2).
        assert_eq!(&values[..10], &[0, 0, 0, 1, 1, 0, 1, 1, 0, 2]);
        let segments = &out.tensors[3].data;
        assert_eq!(&segments[..8], &[2, 0, 0, 0, 1, 0, 0, 0]);
    }

    /// Issue 29: a tighter `max_pixels` (the host's budget for `detail: "low"`) shrinks the image
    /// through `smart_resize`, never refuses it: fewer patches and feature tokens, the aspect kept.
    #[test]
    fn a_tighter_pixel_bound_shrinks_the_image_through_smart_resize() {
        let config = fixture_config("qwen2_vl");
        let wide = image_item("qwen2_vl", "inputs/wide.png");
        let full = preprocess(&config, &wide, &PreprocessOptions::default()).expect("full");
        let low = PreprocessOptions { max_pixels: Some(3136).into(), ..Default::default() };
        let small = preprocess(&config, &wide, &low).expect("shrunk, not refused");
        // 100x60 is 112x56 (4x8 patches, 8 tokens) at the fixture's bounds, 56x28 (2x4, 2 tokens)
        // within 3136 pixels.
        assert_eq!((full.grid.dims.to_vec(), full.grid.feature_tokens), (vec![1, 4, 8], 8));
        assert_eq!((small.grid.dims.to_vec(), small.grid.feature_tokens), (vec![1, 2, 4], 2));
        let again = preprocess(&config, &wide, &low).expect("again");
        assert_eq!(again.tensors[0].data, small.tensors[0].data, "deterministic");
    }

    #[test]
    fn bad_images_get_clear_errors() {
        let config = fixture_config("qwen2_vl");
        let options = PreprocessOptions::default();
        let corrupt = MediaItem::EncodedImage(b"\x89PNG\r\n\x1a\ngarbage".to_vec().into());
        let err = preprocess(&config, &corrupt, &options).expect_err("corrupt");
        assert!(err.message.starts_with("cannot decode the png"), "{err}");
        let thin = MediaItem::Rgb8 { width: 1, height: 300, pixels: vec![0; 900].into() };
        let err = preprocess(&config, &thin, &options).expect_err("aspect");
        assert!(err.message.contains("aspect ratio"), "{err}");
        let audio = MediaItem::PcmF32 { sample_rate: 16000, channels: 1, samples: vec![0.0].into() };
        assert_eq!(
            preprocess(&config, &audio, &options).expect_err("audio").code,
            mlxcel_plugin_api::ErrorCode::Unsupported
        );
    }
}
