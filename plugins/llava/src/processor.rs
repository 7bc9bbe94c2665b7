//! The image processor (`CLIPImageProcessor`, PIL backend): the shortest-edge (or exact)
//! resize with Pillow's resampling, the centre crop (black padding where the image is smaller
//! than the crop), rescale and normalise, giving `pixel_values` `[1, 3, S, S]` for a tower of
//! `image_size` S.
//!
//! `options.max_pixels` bounds the resized image before the crop: a shortest-edge resize
//! scales a thin strip's long side by the same factor as its short one, so a 1x400 image
//! would become 56x22400 on the way to a 56x56 crop. The reference allows it; a server
//! refuses it with the numbers.

use mlxcel_family_common::{Image, Normalize, Resample, center_crop};
use mlxcel_plugin_api::{MediaGrid, MediaItem, PluginError, PreprocessOptions, Preprocessed, Tensor};

use crate::config::LlavaConfig;

/// The encoder input, named as the reference's processor output.
pub(crate) const PIXEL_VALUES: &str = "pixel_values";

/// One image to `pixel_values`.
pub(crate) fn preprocess(
    config: &LlavaConfig,
    item: &MediaItem,
    options: &PreprocessOptions,
) -> Result<Preprocessed, PluginError> {
    let image = Image::from_item(item, "llava")?;
    let p = &config.processor;
    let side = config.vision.image_size as u32;
    let max_pixels = options.max_pixels.into_option();
    if let Some(max) = max_pixels
        && u64::from(side) * u64::from(side) > max
    {
        return Err(PluginError::too_large(format!("the tower's {side}x{side} input exceeds {max} pixels")));
    }
    let (w0, h0) = (image.width(), image.height());
    let resized = match p.resize {
        Some(rule) => {
            let (height, width) = rule.size_for(h0, w0)?;
            if let Some(max) = max_pixels
                && u64::from(height) * u64::from(width) > max
            {
                return Err(PluginError::too_large(format!(
                    "a {w0}x{h0} image resizes to {width}x{height} before the {side}x{side} centre crop, more than \
                     {max} pixels (its aspect ratio is too extreme)"
                )));
            }
            if (height, width) == (h0, w0) {
                image
            } else {
                let filter = Resample::from_pil(p.resample)
                    .ok_or_else(|| PluginError::unsupported(format!("pil resampling filter {}", p.resample)))?;
                image.resize(width, height, filter).map_err(|e| PluginError::invalid(e.to_string()))?
            }
        }
        None => image,
    };
    let cropped = match p.crop {
        Some((height, width)) => {
            center_crop(&resized, height, width).map_err(|e| PluginError::invalid(e.to_string()))?
        }
        None => resized,
    };
    if (cropped.width(), cropped.height()) != (side, side) {
        return Err(PluginError::invalid(format!(
            "a {w0}x{h0} image processes to {}x{}; the CLIP tower takes {side}x{side}",
            cropped.width(),
            cropped.height()
        )));
    }
    let chw = cropped.to_chw(&Normalize { rescale: p.rescale_factor, mean_std: p.mean_std });
    let s = u64::from(side);
    let tensor = Tensor::from_f32(PIXEL_VALUES, &[1, 3, s, s], &chw)?;
    let grid = config.vision.grid() as u32;
    Ok(Preprocessed {
        tensors: vec![tensor].into(),
        grid: MediaGrid { dims: vec![grid, grid].into(), feature_tokens: config.feature_tokens() },
    })
}

#[cfg(test)]
mod tests {
    use mlxcel_plugin_api::ErrorCode;

    use super::*;
    use crate::testing::{fixture_config, fixture_json, golden, image_item};

    #[test]
    fn pixel_values_match_the_goldens_to_1e_6() {
        let config = fixture_config();
        for variant in ["image", "two_images", "long"] {
            let golden = golden(variant);
            let images = golden.field("images").expect("images").as_array().expect("list").clone();
            let mut pixels = Vec::new();
            for path in &images {
                let item = image_item(path.as_str().expect("path"));
                let out = preprocess(&config, &item, &PreprocessOptions::default()).expect("preprocess");
                assert_eq!(out.tensors[0].spec.shape.as_slice(), &[1, 3, 56, 56]);
                assert_eq!((out.grid.dims.as_slice(), out.grid.feature_tokens), (&[4, 4][..], 16));
                pixels.extend(out.tensors[0].to_f32().expect("f32"));
            }
            let report = golden
                .check_f32("pixel_values", &pixels, mlxcel_golden::Tolerance::abs(1e-6))
                .unwrap_or_else(|e| panic!("{variant}: {e}"));
            assert!(report.max_abs_diff <= 1e-6, "{variant}: {report:?}");
        }
    }

    fn flat(width: u32, height: u32, rgb: [u8; 3]) -> MediaItem {
        MediaItem::Rgb8 { width, height, pixels: rgb.repeat((width * height) as usize).into() }
    }

    /// The normalised value of channel `c` at 8-bit level `v`, as the processor computes it.
    fn level(config: &LlavaConfig, c: usize, v: u8) -> f32 {
        let (mean, std) = config.processor.mean_std.expect("normalises");
        ((f64::from(v) * config.processor.rescale_factor.expect("rescales")) as f32 - mean[c]) / std[c]
    }

    #[test]
    fn images_smaller_than_the_crop_and_of_any_aspect_fill_the_towers_square() {
        let config = fixture_config();
        let options = PreprocessOptions::default();
        // Upscaled by the shortest-edge resize, then cropped: a flat image stays flat.
        for (w, h) in [(3, 2), (2, 3), (1, 1), (20, 200), (57, 56)] {
            let out = preprocess(&config, &flat(w, h, [10, 200, 255]), &options).expect("preprocess");
            let values = out.tensors[0].to_f32().expect("f32");
            assert_eq!(values.len(), 3 * 56 * 56, "{w}x{h}");
            for (c, plane) in values.chunks_exact(56 * 56).enumerate() {
                let want = level(&config, c, [10, 200, 255][c]);
                assert!(plane.iter().all(|&v| v == want), "{w}x{h} channel {c}");
            }
        }
    }

    #[test]
    fn without_a_resize_a_small_image_is_centred_in_black() {
        let processor = r#"{"image_processor": {"do_resize": false, "crop_size": {"height": 56, "width": 56}}}"#;
        let config = LlavaConfig::parse(&fixture_json("config.json"), processor).expect("parse");
        // 10 wide, 3 high: columns 23..33 and rows 27..30 hold the image (ceil(46 / 2) = 23,
        // ceil(53 / 2) = 27).
        let out = preprocess(&config, &flat(10, 3, [255, 255, 255]), &PreprocessOptions::default()).expect("ok");
        let values = out.tensors[0].to_f32().expect("f32");
        let at = |c: usize, y: usize, x: usize| values[c * 56 * 56 + y * 56 + x];
        for c in 0..3 {
            let (black, white) = (level(&config, c, 0), level(&config, c, 255));
            assert_eq!((at(c, 27, 23), at(c, 29, 32)), (white, white), "channel {c}");
            assert_eq!((at(c, 26, 23), at(c, 30, 23), at(c, 27, 22), at(c, 27, 33)), (black, black, black, black));
        }
        // Larger than the crop without a resize: cut from the centre.
        let out = preprocess(&config, &flat(100, 60, [1, 2, 3]), &PreprocessOptions::default()).expect("cut");
        assert_eq!(out.tensors[0].spec.shape.as_slice(), &[1, 3, 56, 56]);
    }

    #[test]
    fn bad_images_get_clear_errors() {
        let config = fixture_config();
        let options = PreprocessOptions::default();
        let empty = MediaItem::Rgb8 { width: 0, height: 5, pixels: Vec::new().into() };
        let err = preprocess(&config, &empty, &options).expect_err("empty");
        assert_eq!((err.code, err.message.as_str()), (ErrorCode::InvalidArgument, "the image is empty (0x5)"));
        let short = MediaItem::Rgb8 { width: 2, height: 2, pixels: vec![0; 5].into() };
        let err = preprocess(&config, &short, &options).expect_err("short");
        assert_eq!(err.message.as_str(), "a 2x2 rgb image needs 12 bytes, got 5");
        let corrupt = MediaItem::EncodedImage(b"\x89PNG\r\n\x1a\ngarbage".to_vec().into());
        let err = preprocess(&config, &corrupt, &options).expect_err("corrupt");
        assert!(err.message.starts_with("cannot decode the png"), "{err}");
        let audio = MediaItem::PcmF32 { sample_rate: 16000, channels: 1, samples: vec![0.0].into() };
        assert_eq!(preprocess(&config, &audio, &options).expect_err("audio").code, ErrorCode::Unsupported);
    }

    #[test]
    fn the_pixel_limit_bounds_the_resize_before_the_crop() {
        let config = fixture_config();
        let options = PreprocessOptions { max_pixels: Some(1_003_520).into(), ..Default::default() };
        // 1x300 resizes to 56x16800 (940800 pixels): allowed. 1x400 to 56x22400: refused.
        preprocess(&config, &flat(300, 1, [0, 0, 0]), &options).expect("within the limit");
        let err = preprocess(&config, &flat(1, 400, [0, 0, 0]), &options).expect_err("a thin strip");
        assert_eq!(err.code, ErrorCode::ResourceExhausted);
        assert_eq!(
            err.message.as_str(),
            "a 1x400 image resizes to 56x22400 before the 56x56 centre crop, more than 1003520 pixels (its aspect \
             ratio is too extreme)"
        );
        let tiny = PreprocessOptions { max_pixels: Some(1000).into(), ..Default::default() };
        let err = preprocess(&config, &flat(56, 56, [0, 0, 0]), &tiny).expect_err("the tower's input");
        assert_eq!(err.message.as_str(), "the tower's 56x56 input exceeds 1000 pixels");
    }
}
