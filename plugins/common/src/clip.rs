//! The CLIP-style processors' geometry (`CLIPImageProcessor` and the many processors built
//! like it: LLaVA, and others that resize the shortest edge and crop the centre), as
//! transformers' PIL backend computes it:
//!
//! - [`shortest_edge_size`]: `get_resize_output_image_size(default_to_square=False)`, and with
//!   a longest edge too `get_size_with_aspect_ratio`, in Python floats;
//! - [`center_crop`]: numpy `center_crop` on the 8-bit image, zero-padded (black) where the
//!   image is smaller than the crop.

/// OpenAI CLIP's mean and std as the processors write them (Python floats, rounded to f32 by
/// numpy when normalising).
pub const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
pub const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

use crate::image::{Image, ImageError};

/// A size that cannot be resized to a shortest edge: a side or the edge is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot resize a {width}x{height} image to a shortest edge of {shortest}")]
pub struct ShortestEdgeError {
    pub width: u32,
    pub height: u32,
    pub shortest: u32,
}

/// The `(height, width)` an image of `height x width` resizes to when its shorter edge becomes
/// `shortest` (transformers' `size={"shortest_edge": ...}`), the aspect ratio kept and the
/// longer edge truncated: `int(shortest * long / short)`.
///
/// With `longest` (`size={"shortest_edge": ..., "longest_edge": ...}`) the shorter edge is
/// first reduced, as `get_size_with_aspect_ratio` does, so that the longer one stays within it.
pub fn shortest_edge_size(
    height: u32,
    width: u32,
    shortest: u32,
    longest: Option<u32>,
) -> Result<(u32, u32), ShortestEdgeError> {
    if height == 0 || width == 0 || shortest == 0 {
        return Err(ShortestEdgeError { width, height, shortest });
    }
    match longest {
        None => {
            // Python: `int(requested_new_short * long / short)`: the product is an exact
            // integer, the division rounds once, `int` truncates.
            let (short, long) = if width <= height { (width, height) } else { (height, width) };
            let new_long = (f64::from(shortest) * f64::from(long) / f64::from(short)) as u32;
            Ok(if width <= height { (new_long, shortest) } else { (shortest, new_long) })
        }
        Some(max_size) => {
            let (h, w) = (f64::from(height), f64::from(width));
            let (min_side, max_side) = (h.min(w), h.max(w));
            let mut size = shortest;
            let mut raw = None;
            if max_side / min_side * f64::from(size) > f64::from(max_size) {
                let r = f64::from(max_size) * min_side / max_side;
                raw = Some(r);
                size = r.round_ties_even() as u32;
            }
            let scaled = |num: f64, den: f64| (raw.unwrap_or(f64::from(size)) * num / den) as u32;
            Ok(if (height <= width && height == size) || (width <= height && width == size) {
                (height, width)
            } else if width < height {
                (scaled(h, w), size)
            } else {
                (size, scaled(w, h))
            })
        }
    }
}

/// Where a crop of `crop` samples starts in an axis of `orig` samples: the offset of the
/// crop's first sample in the image (negative where the crop reaches into padding).
///
/// numpy's `center_crop`: `top = (orig - crop) // 2` when the crop fits; otherwise the image
/// is first padded to `crop`, `ceil((crop - orig) / 2)` zeros before it.
fn crop_offset(orig: u32, crop: u32) -> i64 {
    if crop <= orig { i64::from((orig - crop) / 2) } else { -i64::from((crop - orig).div_ceil(2)) }
}

/// The centre `height x width` of `image`, as transformers' `center_crop` cuts it; where the
/// image is smaller than the crop along an axis it is centred in black (zero) pixels, the
/// odd pixel of padding going after the image.
pub fn center_crop(image: &Image, height: u32, width: u32) -> Result<Image, ImageError> {
    if height == 0 || width == 0 {
        return Err(ImageError::Empty { width, height });
    }
    if (height, width) == (image.height(), image.width()) {
        return Ok(image.clone());
    }
    let (top, left) = (crop_offset(image.height(), height), crop_offset(image.width(), width));
    let (src_w, src_h) = (i64::from(image.width()), i64::from(image.height()));
    let src = image.pixels();
    let mut out = vec![0u8; width as usize * height as usize * 3];
    for y in 0..i64::from(height) {
        let sy = y + top;
        if !(0..src_h).contains(&sy) {
            continue;
        }
        // The run of this output row that lies inside the image.
        let x0 = (-left).max(0);
        let x1 = (src_w - left).min(i64::from(width));
        if x0 >= x1 {
            continue;
        }
        let from = ((sy * src_w + x0 + left) * 3) as usize;
        let to = ((y * i64::from(width) + x0) * 3) as usize;
        let len = ((x1 - x0) * 3) as usize;
        out[to..to + len].copy_from_slice(&src[from..from + len]);
    }
    Image::from_rgb8(width, height, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shortest_edge_becomes_the_size_and_the_longest_is_truncated() {
        // (height, width) as the reference computes them (checked in Python).
        assert_eq!(shortest_edge_size(60, 100, 56, None), Ok((56, 93)));
        assert_eq!(shortest_edge_size(90, 50, 56, None), Ok((100, 56)));
        assert_eq!(shortest_edge_size(56, 56, 56, None), Ok((56, 56)));
        // 336 * 640 / 480 = 448 exactly; 224 * 500 / 375 = 298.66.. truncates to 298.
        assert_eq!(shortest_edge_size(480, 640, 336, None), Ok((336, 448)));
        assert_eq!(shortest_edge_size(375, 500, 224, None), Ok((224, 298)));
        // Upscaling a small image.
        assert_eq!(shortest_edge_size(10, 30, 56, None), Ok((56, 168)));
        let err = shortest_edge_size(0, 30, 56, None).expect_err("empty");
        assert_eq!(err.to_string(), "cannot resize a 30x0 image to a shortest edge of 56");
        assert!(shortest_edge_size(30, 30, 0, None).is_err());
    }

    #[test]
    fn a_longest_edge_shrinks_the_shortest_first() {
        // get_size_with_aspect_ratio((h, w), size, max_size), checked in Python.
        assert_eq!(shortest_edge_size(100, 1000, 56, Some(200)), Ok((20, 200)));
        assert_eq!(shortest_edge_size(1000, 100, 56, Some(200)), Ok((200, 20)));
        assert_eq!(shortest_edge_size(60, 100, 56, Some(1000)), Ok((56, 93)));
        assert_eq!(shortest_edge_size(56, 100, 56, Some(1000)), Ok((56, 100)));
        // raw_size = 300 * 333 / 1000 = 99.9, size = round(99.9) = 100,
        // the long side int(99.9 * 1000 / 333) = 300.
        assert_eq!(shortest_edge_size(333, 1000, 224, Some(300)), Ok((100, 300)));
    }

    fn numbered(width: u32, height: u32) -> Image {
        let pixels = (0..width * height).flat_map(|i| [(i % 251) as u8 + 1, 7, 9]).collect();
        Image::from_rgb8(width, height, pixels).expect("image")
    }

    /// Row `y` of an image, red channel only.
    fn red_row(image: &Image, y: u32) -> Vec<u8> {
        let w = image.width() as usize;
        image.pixels()[y as usize * w * 3..(y as usize + 1) * w * 3].iter().step_by(3).copied().collect()
    }

    #[test]
    fn a_larger_image_is_cut_at_the_floor_of_half_the_excess() {
        let image = numbered(7, 5);
        let crop = center_crop(&image, 2, 4).expect("crop");
        // top = (5 - 2) // 2 = 1, left = (7 - 4) // 2 = 1.
        assert_eq!(red_row(&crop, 0), [9, 10, 11, 12]);
        assert_eq!(red_row(&crop, 1), [16, 17, 18, 19]);
        assert_eq!(center_crop(&image, 5, 7).expect("same"), image);
    }

    #[test]
    fn a_smaller_image_is_centred_in_black_with_the_odd_pixel_after_it() {
        // 3 wide into 6: ceil(3 / 2) = 2 zeros before, 1 after. 2 high into 3: 1 before, 0 after.
        let image = numbered(3, 2);
        let crop = center_crop(&image, 3, 6).expect("crop");
        assert_eq!((crop.width(), crop.height()), (6, 3));
        assert_eq!(red_row(&crop, 0), [0; 6]);
        assert_eq!(red_row(&crop, 1), [0, 0, 1, 2, 3, 0]);
        assert_eq!(red_row(&crop, 2), [0, 0, 4, 5, 6, 0]);
        // Padding is black in every channel.
        assert_eq!(&crop.pixels()[..3], &[0, 0, 0]);
    }

    #[test]
    fn one_axis_can_be_cut_while_the_other_is_padded() {
        let image = numbered(2, 6);
        let crop = center_crop(&image, 2, 4).expect("crop");
        // Rows from top = (6 - 2) // 2 = 2; columns padded by 1 each side.
        assert_eq!(red_row(&crop, 0), [0, 5, 6, 0]);
        assert_eq!(red_row(&crop, 1), [0, 7, 8, 0]);
        assert!(center_crop(&image, 0, 4).is_err());
    }
}
