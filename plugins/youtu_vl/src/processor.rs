//! The image processor. Youtu-VL's own is remote code that neither transformers nor mlx-vlm
//! ships, so this is a documented stand-in: the fixture's (`tools/oracle/gen_youtu_vl.py`,
//! `preprocess`) for the sizes it produces, with a bounded resize rule for every other image.
//!
//! - Resize: both sides a multiple of `patch * merge` (32 pixels), each rounded to the nearest
//!   multiple, by Pillow's resampling (bicubic unless the processor config says otherwise).
//!   The fixture's stand-in then clamps each side to 64..=128 pixels, a bound for its tiny
//!   tower; here the bound is Qwen-VL's `smart_resize` on the area instead, which a user serving
//!   real images can rely on: the aspect ratio kept, an image over `max_pixels` scaled down to
//!   fit and one under `min_pixels` scaled up (never cropped, never refused for its size), so
//!   an image costs between `min_pixels` and `max_pixels / (patch * merge)^2` feature tokens,
//!   and the host's tighter budgets (`detail: "low"`) shrink it the same way. The bounds are
//!   the processor config's (`min_pixels`/`max_pixels`, or `size`), else 4 to 1280 merged units
//!   (4096 to 1,310,720 pixels at patch 16), Qwen2-VL's token budget. The fixture's images
//!   (100x60 and 50x90) resize to 96x64 and 64x96 under both rules. The checkpoint's own
//!   processor may size and resample images otherwise; it is not compared here.
//! - Rescale by 1/255 and normalise with mean and std 0.5 (SigLIP2's), unless the processor
//!   config says otherwise.
//! - Patch rows: `patch x patch` pixels flattened (row, column, channel), the input order of the
//!   tower's patch `Linear`, the rows in merge order (each 2x2 block of patches consecutive), as
//!   the tower's rotary positions, windows and merger assume.
//!
//! Each item carries the reference's `pixel_values` `[patches, P*P*3]` and `spatial_shapes`
//! `[1, 2]` (the patch grid's height and width), and the Qwen-VL graphs' per-row inputs
//! (`patch_positions`, `patch_segments`: [`mlxcel_family_common::qwen_vl::processor`]), so a
//! graph compiled for a bucket serves any grid that fits it. Its grid is `(1, h, w)` in patches,
//! the Qwen-VL grid of one frame, with `h * w / merge^2` feature tokens.

use mlxcel_family_common::qwen_vl::processor::{PIXEL_VALUES, resize, row_tensors};
use mlxcel_family_common::{Normalize, Patchify};
use mlxcel_plugin_api::{MediaGrid, MediaItem, PluginError, PreprocessOptions, Preprocessed, Tensor};

use crate::config::YoutuVlConfig;

/// The patch grid's `(height, width)` per image, as the reference's vision tower takes it.
pub(crate) const SPATIAL_SHAPES: &str = "spatial_shapes";

/// One image to encoder inputs. `options.max_pixels` and `min_pixels` tighten the processor's
/// own bounds on the resized area (they never loosen them).
pub(crate) fn preprocess(
    config: &YoutuVlConfig,
    item: &MediaItem,
    options: &PreprocessOptions,
) -> Result<Preprocessed, PluginError> {
    let p = &config.processor;
    let image = resize(p, item, options, "the youtu-vl processor")?;
    let (height, width) = (image.height() as usize, image.width() as usize);
    let chw = image.to_chw(&Normalize { rescale: p.rescale_factor, mean_std: p.mean_std });
    let patchify = Patchify { patch: p.patch_size, merge: p.merge_size, temporal: 1 };
    let grid = patchify.grid(height, width);
    let (patch, plane, channels) = (p.patch_size, height * width, config.geometry.in_channels);
    let row_width = patch * patch * channels;
    let mut rows = Vec::with_capacity(grid.patches() * row_width);
    for (ph, pw) in patchify.merge_order(&grid) {
        for y in ph * patch..(ph + 1) * patch {
            for x in pw * patch..(pw + 1) * patch {
                rows.extend((0..channels).map(|c| chw[c * plane + y * width + x]));
            }
        }
    }
    let n = grid.patches();
    let mut tensors = vec![
        Tensor::from_f32(PIXEL_VALUES, &[n as u64, row_width as u64], &rows)?,
        Tensor::from_i64(SPATIAL_SHAPES, &[1, 2], &[grid.h as i64, grid.w as i64])?,
    ];
    tensors.extend(row_tensors(&patchify, &grid)?);
    let feature_tokens = (n / config.geometry.merge_area()) as u32;
    let dims = vec![1, grid.h as u32, grid.w as u32];
    Ok(Preprocessed { tensors: tensors.into(), grid: MediaGrid { dims: dims.into(), feature_tokens } })
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::ErrorCode;

    use super::*;
    use crate::testing::{fixture_config, golden, image_item};

    fn run(path: &str, options: &PreprocessOptions) -> Preprocessed {
        preprocess(&fixture_config(), &image_item(path), options).expect("preprocess")
    }

    #[test]
    fn pixel_values_and_spatial_shapes_match_the_goldens_to_1e_6() {
        let config = fixture_config();
        for variant in ["image", "two_images", "long"] {
            let golden = golden(variant);
            let images = golden.field("images").expect("images").as_array().expect("list").clone();
            let (mut pixels, mut shapes) = (Vec::new(), Vec::new());
            for path in &images {
                let out = preprocess(&config, &image_item(path.as_str().expect("path")), &PreprocessOptions::default())
                    .expect("preprocess");
                pixels.extend(out.tensors[0].to_f32().expect("f32"));
                let data = &out.tensors[1].data;
                shapes.extend(data.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes"))));
                let dims = out.grid.dims.as_slice();
                assert_eq!((dims[0], out.grid.feature_tokens), (1, dims[1] * dims[2] / 4), "{variant}");
            }
            golden.check_i64("spatial_shapes", &shapes).expect(variant);
            let report = golden
                .check_f32("pixel_values", &pixels, mlxcel_golden::Tolerance::abs(1e-6))
                .unwrap_or_else(|e| panic!("{variant}: {e}"));
            assert!(report.max_abs_diff <= 1e-6, "{variant}: {report:?}");
        }
    }

    /// The stand-in's sizes: round each side to a multiple of 32, clamp it to 64..=128.
    fn stand_in(width: u32, height: u32) -> (u32, u32) {
        let side = |s: u32| ((f64::from(s) / 32.0).round_ties_even() as u32 * 32).clamp(64, 128);
        (side(width), side(height))
    }

    /// The resize rule gives the fixture's images the stand-in's sizes, and sizes inside the
    /// stand-in's clamp the same as it too; outside it, the bounds are on the area.
    #[test]
    fn the_resize_rule_agrees_with_the_stand_in_where_its_clamp_does_not_bite() {
        let config = fixture_config();
        let size = |width: u32, height: u32| {
            let item = MediaItem::Rgb8 { width, height, pixels: vec![128; (width * height * 3) as usize].into() };
            let out = preprocess(&config, &item, &PreprocessOptions::default()).expect("preprocess");
            (out.grid.dims[2] * 16, out.grid.dims[1] * 16)
        };
        for (width, height) in [(100, 60), (50, 90), (80, 80), (112, 48), (130, 70), (48, 48)] {
            assert_eq!(size(width, height), stand_in(width, height), "{width}x{height}");
        }
        // A large image is scaled down within 1280 merged units (41x30 of them, each side
        // floored), a tiny one up to 4.
        assert_eq!(size(4000, 3000), (1312, 960));
        assert_eq!(size(10, 10), (64, 64));
    }

    #[test]
    fn rows_are_patches_flattened_row_column_channel_in_merge_order() {
        // A 64x64 image whose pixel (y, x) is (y, x, 7): 16 patches, the second row the patch at
        // (0, 1), the third at (1, 0).
        let pixels: Vec<u8> = (0..64u8).flat_map(|y| (0..64u8).flat_map(move |x| [y, x, 7])).collect();
        let item = MediaItem::Rgb8 { width: 64, height: 64, pixels: pixels.into() };
        let out = preprocess(&fixture_config(), &item, &PreprocessOptions::default()).expect("preprocess");
        let values = out.tensors[0].to_f32().expect("f32");
        let back = |v: f32| ((v * 0.5 + 0.5) * 255.0).round() as u8;
        let row = |i: usize| &values[i * 768..(i + 1) * 768];
        assert_eq!(row(0)[..6].iter().map(|&v| back(v)).collect::<Vec<_>>(), [0, 0, 7, 0, 1, 7]);
        assert_eq!(row(1)[..3].iter().map(|&v| back(v)).collect::<Vec<_>>(), [0, 16, 7]);
        assert_eq!(row(2)[..3].iter().map(|&v| back(v)).collect::<Vec<_>>(), [16, 0, 7]);
        // The second pixel row of a patch starts 16 pixels (48 values) in.
        assert_eq!(row(2)[48..51].iter().map(|&v| back(v)).collect::<Vec<_>>(), [17, 0, 7]);
        let positions = out.tensors[2].data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        assert_eq!(positions.take(6).collect::<Vec<_>>(), [0, 0, 0, 1, 1, 0]);
    }

    #[test]
    fn a_tighter_pixel_bound_shrinks_the_image() {
        let full = run("inputs/wide.png", &PreprocessOptions::default());
        let low = PreprocessOptions { max_pixels: Some(4096).into(), ..Default::default() };
        let small = run("inputs/wide.png", &low);
        assert_eq!((full.grid.dims.to_vec(), full.grid.feature_tokens), (vec![1, 4, 6], 6));
        assert_eq!((small.grid.dims.to_vec(), small.grid.feature_tokens), (vec![1, 2, 4], 2));
    }

    #[test]
    fn bad_images_get_clear_errors() {
        let config = fixture_config();
        let options = PreprocessOptions::default();
        let corrupt = MediaItem::EncodedImage(b"\x89PNG\r\n\x1a\ngarbage".to_vec().into());
        let err = preprocess(&config, &corrupt, &options).expect_err("corrupt");
        assert!(err.message.starts_with("cannot decode the png"), "{err}");
        let thin = MediaItem::Rgb8 { width: 1, height: 300, pixels: vec![0; 900].into() };
        assert!(preprocess(&config, &thin, &options).expect_err("aspect").message.contains("aspect ratio"));
        let short = MediaItem::Rgb8 { width: 4, height: 4, pixels: vec![0; 10].into() };
        assert!(preprocess(&config, &short, &options).expect_err("size").message.contains("needs 48 bytes"));
        let empty = MediaItem::Rgb8 { width: 0, height: 4, pixels: Vec::new().into() };
        assert!(preprocess(&config, &empty, &options).expect_err("empty").message.contains("empty"));
        let audio = MediaItem::PcmF32 { sample_rate: 16000, channels: 1, samples: vec![0.0].into() };
        assert_eq!(preprocess(&config, &audio, &options).expect_err("audio").code, ErrorCode::Unsupported);
    }
}
