//! The image processor (`Gemma3ImageProcessor`, PIL backend, pan-and-scan off): every image is
//! resized to the configured fixed size with Pillow's resampling (bilinear by default),
//! rescaled and normalised, channel-first: `pixel_values` `[1, 3, height, width]`, exactly the
//! reference's tensor. The encoder graph takes it as is and cuts the patches itself.
//!
//! The grid is `(tokens_per_side, tokens_per_side)`: the projector's pooled grid, whose
//! `mm_tokens_per_image` rows every image becomes, whatever its size.

use mlxcel_family_common::{Image, Normalize, Resample};
use mlxcel_plugin_api::{MediaGrid, MediaItem, PluginError, PreprocessOptions, Preprocessed, Tensor};

use crate::config::Gemma3Config;

/// The encoder input's name, shared with the graph (the reference's processor output).
pub(crate) const PIXEL_VALUES: &str = "pixel_values";

/// One image to the encoder's input. `options.max_pixels` bounds the resized area (the
/// processor's fixed size); `min_pixels` cannot be met by a fixed size larger than it and is
/// ignored otherwise.
pub(crate) fn preprocess(
    config: &Gemma3Config,
    item: &MediaItem,
    options: &PreprocessOptions,
) -> Result<Preprocessed, PluginError> {
    let image = Image::from_item(item, "gemma3")?;
    let p = &config.processor;
    let (height, width) = p.size;
    let area = u64::from(height) * u64::from(width);
    if let Some(max) = options.max_pixels.into_option()
        && area > max
    {
        return Err(PluginError::too_large(format!(
            "gemma3 resizes every image to {width}x{height} ({area} pixels), over the limit of {max} pixels"
        )));
    }
    if let Some(min) = options.min_pixels.into_option()
        && area < min
    {
        return Err(PluginError::invalid(format!(
            "gemma3 resizes every image to {width}x{height} ({area} pixels), under the minimum of {min} pixels"
        )));
    }
    let resized = if (image.width(), image.height()) == (width, height) {
        // Pillow returns a copy for a resize to the same size.
        image
    } else if !p.do_resize {
        return Err(PluginError::invalid(format!(
            "a {}x{} image with resizing off; the vision tower takes {width}x{height}",
            image.width(),
            image.height()
        )));
    } else {
        let filter = Resample::from_pil(p.resample)
            .ok_or_else(|| PluginError::unsupported(format!("pil resampling filter {}", p.resample)))?;
        image.resize(width, height, filter).map_err(|e| PluginError::invalid(e.to_string()))?
    };
    let chw = resized.to_chw(&Normalize { rescale: p.rescale_factor, mean_std: p.mean_std });
    let tensor = Tensor::from_f32(PIXEL_VALUES, &[1, 3, u64::from(height), u64::from(width)], &chw)?;
    let side = config.tokens_per_side() as u32;
    Ok(Preprocessed {
        tensors: vec![tensor].into(),
        grid: MediaGrid { dims: vec![side, side].into(), feature_tokens: config.mm_tokens_per_image },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixture_config, golden, image_item};

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
                assert_eq!(out.tensors[0].spec.shape.as_slice(), &[1, 3, 112, 112]);
                assert_eq!((out.grid.dims.as_slice(), out.grid.feature_tokens), (&[4, 4][..], 16));
                pixels.extend(out.tensors[0].to_f32().expect("f32"));
            }
            let report = golden
                .check_f32("pixel_values", &pixels, mlxcel_golden::Tolerance::abs(1e-6))
                .unwrap_or_else(|e| panic!("{variant}: {e}"));
            assert!(report.max_abs_diff <= 1e-6, "{variant}: {report:?}");
        }
    }

    #[test]
    fn bad_images_and_limits_get_clear_errors() {
        let config = fixture_config();
        let options = PreprocessOptions::default();
        let corrupt = MediaItem::EncodedImage(b"\x89PNG\r\n\x1a\ngarbage".to_vec().into());
        let err = preprocess(&config, &corrupt, &options).expect_err("corrupt");
        assert!(err.message.starts_with("cannot decode the png"), "{err}");
        let short = MediaItem::Rgb8 { width: 4, height: 4, pixels: vec![0; 5].into() };
        assert!(preprocess(&config, &short, &options).is_err());
        let audio = MediaItem::PcmF32 { sample_rate: 16000, channels: 1, samples: vec![0.0].into() };
        assert_eq!(
            preprocess(&config, &audio, &options).expect_err("audio").code,
            mlxcel_plugin_api::ErrorCode::Unsupported
        );
        let small = PreprocessOptions { max_pixels: Some(10_000).into(), ..Default::default() };
        let image = MediaItem::Rgb8 { width: 2, height: 2, pixels: vec![7; 12].into() };
        let err = preprocess(&config, &image, &small).expect_err("limit");
        assert_eq!(err.code, mlxcel_plugin_api::ErrorCode::ResourceExhausted);
        assert!(err.message.contains("112x112 (12544 pixels), over the limit of 10000"), "{err}");
        // A tiny image is upscaled like any other.
        let out = preprocess(&config, &image, &options).expect("upscaled");
        assert!(out.tensors[0].to_f32().expect("f32").iter().all(|&v| (v - (7.0 / 255.0 - 0.5) / 0.5).abs() < 1e-6));
    }
}
