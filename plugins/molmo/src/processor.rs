//! The image processor: mlx-vlm's `MolmoImageProcessor` (Molmo's own numpy processor, with
//! Pillow for the resize), for one image.
//!
//! 1. **Tiling.** `select_tiling` (shared with Molmo2) picks `rows x cols` crops for the image
//!    less the margins, each crop's window `crop - margins` patches.
//! 2. **Resize and pad.** The image is resized with Pillow's bilinear filter to fit the canvas
//!    (`int(side * min(scale))` in f32), read as `u8 / 255`, centred on a zero canvas with a
//!    mask of where it lies, and normalised (`(x - mean) / std` in f32, the padding too). The
//!    reference first takes the image to f32 (`u8 / 255`) and back to 8 bits (`x * 255`,
//!    truncated) for Pillow; in f32 that round trip gives every one of the 256 values back
//!    exactly, so the decoded pixels are resized as they are.
//! 3. **Crops.** Overlapping `crop x crop` windows of the canvas, patchified (each patch's rows
//!    of pixels, channels last); the mask's mean per patch is `image_masks`.
//! 4. **The global image**, resized and padded to one crop the same way, goes first.
//! 5. **Where each pooled feature goes**: each crop keeps the pooled 2x2 windows it does not
//!    share, in the canvas's raster order; the global crop's all come first.
//!
//! The reference's `image_masks` has one row more than it has crop rows for the crops and none
//! for the global crop, so its rows pair with the crops shifted by one: the global crop takes
//! the first crop's mask and the last crop takes a row of -1 (a partial padding embedding
//! everywhere). The port keeps that pairing; it is what the reference computes.

use mlxcel_family_common::tiling::select_tiling;
use mlxcel_family_common::{Image, Resample};

use crate::config::ProcessorConfig;

/// One image, processed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Processed {
    /// `[1 + crops, patches, 3 * patch * patch]`, the global crop first.
    pub pixel_values: Vec<f32>,
    /// `[1 + crops, patches]`.
    pub image_masks: Vec<f32>,
    pub crops: usize,
    /// The tiling, `[rows, cols]`.
    pub tiling: [usize; 2],
    /// For each `<im_patch>` token of the image's block, in order: the index of its feature
    /// among the encoder's `(crop, pooled window)` rows.
    pub feature_order: Vec<i32>,
}

/// The canvas, in patches, of a tiling: `[rows, cols] * window + margins`.
pub(crate) fn canvas_patches(p: &ProcessorConfig, tiling: [usize; 2]) -> [usize; 2] {
    let margins = p.margins[0] + p.margins[1];
    tiling.map(|t| t * p.window_patches() + margins)
}

/// `<im_patch>` tokens of an image of this tiling: the global crop's and the canvas's pooled
/// windows.
pub(crate) fn patch_tokens(p: &ProcessorConfig, tiling: [usize; 2]) -> usize {
    let [h, w] = canvas_patches(p, tiling);
    p.tokens_side * p.tokens_side + h.div_ceil(2) * w.div_ceil(2)
}

/// The tiling the processor picks for a `width x height` image.
pub(crate) fn tiling(p: &ProcessorConfig, width: usize, height: usize) -> [usize; 2] {
    let margin_pixels = (p.margins[0] + p.margins[1]) * p.patch_size;
    let less = |side: usize| side as i64 - margin_pixels as i64;
    select_tiling(less(height), less(width), p.window_patches() * p.patch_size, p.max_crops)
}

/// An image resized to fit `height x width` and centred, as `resize_and_pad` does: the
/// normalised canvas (channels last) and the mask of where the image lies.
fn resize_and_pad(
    image: &Image,
    height: usize,
    width: usize,
    p: &ProcessorConfig,
) -> Result<(Vec<f32>, Vec<bool>), String> {
    let (h0, w0) = (image.height() as f32, image.width() as f32);
    let scale = (width as f32 / w0).min(height as f32 / h0);
    let (sh, sw) = ((h0 * scale) as usize, (w0 * scale) as usize);
    if sh == 0 || sw == 0 {
        return Err(format!(
            "a {}x{} image scales to {sw}x{sh} pixels on a {width}x{height} canvas; an image this thin has no pixels there",
            image.width(),
            image.height()
        ));
    }
    let resized = image.resize(sw as u32, sh as u32, Resample::Bilinear).map_err(|e| e.to_string())?;
    let (top, left) = ((height - sh) / 2, (width - sw) / 2);
    let mut canvas = vec![0f32; height * width * 3];
    let mut mask = vec![false; height * width];
    for y in 0..sh {
        for x in 0..sw {
            let at = (y + top) * width + x + left;
            mask[at] = true;
            for c in 0..3 {
                canvas[at * 3 + c] = f32::from(resized.pixels()[(y * sw + x) * 3 + c]) / 255.0;
            }
        }
    }
    for (i, v) in canvas.iter_mut().enumerate() {
        let c = i % 3;
        *v = (*v - p.mean[c]) / p.std[c];
    }
    Ok((canvas, mask))
}

/// Appends the `crop x crop` window at `(top, left)` of a `width`-wide canvas as patches, and
/// each patch's mask mean.
fn push_crop(
    pixels: &mut Vec<f32>,
    masks: &mut Vec<f32>,
    (canvas, mask, width): (&[f32], &[bool], usize),
    (top, left): (usize, usize),
    p: &ProcessorConfig,
) {
    let (patch, side) = (p.patch_size, p.crop_patches());
    for py in 0..side {
        for px in 0..side {
            let mut inside = 0u32;
            for y in 0..patch {
                let row = (top + py * patch + y) * width + left + px * patch;
                pixels.extend_from_slice(&canvas[row * 3..(row + patch) * 3]);
                inside += mask[row..row + patch].iter().filter(|&&m| m).count() as u32;
            }
            masks.push(inside as f32 / (patch * patch) as f32);
        }
    }
}

pub(crate) fn process(image: &Image, p: &ProcessorConfig) -> Result<Processed, String> {
    let (width, height) = (image.width() as usize, image.height() as usize);
    let tiling = tiling(p, width, height);
    let (crop, patch) = (p.crop_size, p.patch_size);
    let window = p.window_patches() * patch;
    let margin_pixels = (p.margins[0] + p.margins[1]) * patch;
    let canvas_h = tiling[0] * window + margin_pixels;
    let canvas_w = tiling[1] * window + margin_pixels;
    let crops = tiling[0] * tiling[1];
    let (side, tokens) = (p.crop_patches(), p.tokens_side);
    let mut pixel_values = Vec::new();
    pixel_values
        .try_reserve_exact((crops + 1) * side * side * 3 * patch * patch)
        .map_err(|_| format!("cannot allocate the pixels of a {width}x{height} image's {crops} crops"))?;
    let mut crop_masks = Vec::with_capacity(crops * side * side);

    let (global, global_mask) = resize_and_pad(image, crop, crop, p)?;
    let mut unused = Vec::new();
    push_crop(&mut pixel_values, &mut unused, (&global, &global_mask, crop), (0, 0), p);
    let (canvas, mask) = resize_and_pad(image, canvas_h, canvas_w, p)?;

    // Each crop's pooled windows it keeps, numbered in crop order (`patch_ordering`), placed
    // in a tokens x tokens grid of -1.
    let [left, right] = p.margins;
    let mut ordering = Vec::with_capacity(crops * tokens * tokens);
    let mut next = 0i64;
    for i in 0..tiling[0] {
        for j in 0..tiling[1] {
            push_crop(&mut pixel_values, &mut crop_masks, (&canvas, &mask, canvas_w), (i * window, j * window), p);
            let kept = |index: usize, count: usize| {
                let mut n = side - left - right;
                if index == 0 {
                    n += left;
                }
                if index + 1 == count {
                    n += right;
                }
                let start = if index == 0 { 0 } else { left / 2 };
                (start, n.div_ceil(2))
            };
            let ((y0, rows), (x0, cols)) = (kept(i, tiling[0]), kept(j, tiling[1]));
            for y in 0..tokens {
                for x in 0..tokens {
                    let inside = (y0..y0 + rows).contains(&y) && (x0..x0 + cols).contains(&x);
                    ordering.push(if inside { next + ((y - y0) * cols + x - x0) as i64 } else { -1 });
                }
            }
            next += (rows * cols) as i64;
        }
    }
    // The valid entries, in crop order, take the valid values read in the canvas's raster
    // order (tiling row, token row, tiling column, token column).
    let mut raster = Vec::with_capacity(ordering.len());
    for ti in 0..tiling[0] {
        for y in 0..tokens {
            for tj in 0..tiling[1] {
                for x in 0..tokens {
                    let v = ordering[((ti * tiling[1] + tj) * tokens + y) * tokens + x];
                    if v >= 0 {
                        raster.push(v);
                    }
                }
            }
        }
    }
    let mut values = raster.into_iter();
    for v in ordering.iter_mut().filter(|v| **v >= 0) {
        *v = values.next().ok_or("invariant: as many raster values as valid slots")?;
    }
    // The global crop's windows first, then the crops' offset past them.
    let per_crop = (tokens * tokens) as i64;
    let mut order: Vec<i64> = (0..per_crop).collect();
    order.extend(ordering.iter().map(|&v| if v >= 0 { v + per_crop } else { -1 }));

    // `build_image_input_idx`: slot s (the k-th valid) goes to the patch token whose rank is
    // the slot holding order value k... inverted: token t takes the slot whose order is t.
    let n_tokens = patch_tokens(p, tiling);
    let valid = order.iter().filter(|&&v| v >= 0).count();
    if valid != n_tokens {
        return Err(format!("invariant: {valid} pooled features for {n_tokens} <im_patch> tokens"));
    }
    let mut rank_of_value = vec![0usize; n_tokens];
    for (k, &v) in order.iter().filter(|&&v| v >= 0).enumerate() {
        rank_of_value[v as usize] = k;
    }
    // The k-th valid slot goes to patch token `rank_of_value[k]`.
    let mut feature_order = vec![0i32; n_tokens];
    for (k, (slot, _)) in order.iter().enumerate().filter(|(_, v)| **v >= 0).enumerate() {
        feature_order[rank_of_value[k]] = slot as i32;
    }

    let mut image_masks = crop_masks;
    image_masks.extend(std::iter::repeat_n(-1f32, side * side));
    Ok(Processed { pixel_values, image_masks, crops: crops + 1, tiling, feature_order })
}

#[cfg(test)]
mod tests {
    use mlxcel_golden::Tolerance;

    use super::*;
    use crate::testing::{fixture, fixture_config, golden};

    fn image(variant: &str) -> Image {
        let g = golden(variant);
        let path = g.meta()["images"][0].as_str().expect("image path").to_owned();
        Image::decode(&std::fs::read(fixture().dir().join(path)).expect("read")).expect("decode")
    }

    /// The pixels and masks match the reference exactly, and each `<im_patch>` token takes the
    /// feature `image_input_idx` puts at its position.
    #[test]
    fn every_stage_matches_the_goldens_exactly() {
        let config = fixture_config();
        // The plugins decode PNG only (the host decodes the other formats); image_jpeg goes through verify.
        for variant in ["image", "long"] {
            let g = golden(variant);
            let out = process(&image(variant), &config.processor).expect("process");
            g.check_f32("pixel_values", &out.pixel_values, Tolerance::abs(0.0)).expect("pixels");
            g.check_f32("image_masks", &out.image_masks, Tolerance::abs(0.0)).expect("masks");
            let idx = g.tensor("image_input_idx").expect("idx").to_i64().expect("ints");
            let ids = g.input_ids().expect("ids");
            let patch = i64::from(config.tokens.image_patch);
            let positions: Vec<i64> = (0..ids.len() as i64).filter(|&i| ids[i as usize] == patch).collect();
            let mut want = vec![-1i32; positions.len()];
            for (slot, &at) in idx.iter().enumerate().filter(|(_, at)| **at >= 0) {
                let rank = positions.binary_search(&at).expect("a patch token");
                want[rank] = slot as i32;
            }
            assert_eq!(out.feature_order, want, "{variant}");
            assert_eq!(patch_tokens(&config.processor, out.tiling), positions.len(), "{variant}");
        }
    }

    /// The reference's f32 round trip to 8 bits (`(u8 / 255 * 255).astype(uint8)`) gives every
    /// value back, which is why the port resizes the decoded pixels as they are.
    #[test]
    fn the_references_round_trip_to_eight_bits_is_exact() {
        for v in 0..=255u8 {
            assert_eq!(((f32::from(v) / 255.0) * 255.0) as u8, v);
        }
    }

    /// Images thinner than a pixel on the canvas are refused; none panics, whatever its shape.
    #[test]
    fn extreme_shapes_are_processed_or_refused_without_panicking() {
        let config = fixture_config();
        let p = &config.processor;
        for (w, h) in [(1, 1), (3, 2), (14, 14), (2000, 1), (1, 2000), (600, 20), (113, 112)] {
            let img = Image::from_rgb8(w, h, vec![128; (w * h * 3) as usize]).expect("image");
            match process(&img, p) {
                Ok(out) => {
                    assert_eq!(out.feature_order.len(), patch_tokens(p, out.tiling), "{w}x{h}");
                    let mut sorted = out.feature_order.clone();
                    sorted.sort_unstable();
                    sorted.dedup();
                    assert_eq!(sorted.len(), out.feature_order.len(), "{w}x{h}: a feature placed twice");
                }
                Err(e) => assert!(e.contains("has no pixels"), "{w}x{h}: {e}"),
            }
        }
        let thin = Image::from_rgb8(2000, 1, vec![0; 6000]).expect("image");
        assert!(process(&thin, p).is_err(), "a 2000x1 image scales to no rows");
    }
}
