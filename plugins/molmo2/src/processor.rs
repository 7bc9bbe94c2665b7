//! The image processor (transformers' `Molmo2ImageProcessor`, torchvision backend): each image
//! becomes one low-resolution global crop and a grid of overlapping high-resolution crops, cut
//! into patches, plus the pooling table that groups their patches into image tokens.
//!
//! Per image, as the reference does it:
//!
//! 1. **Tiling.** `select_tiling` picks `rows x cols` crops (at most `max_crops`) for the image
//!    less the overlap margins, in torch f32 arithmetic; the canvas is `tiles * window + margins`
//!    pixels per side, where `window = crop - margins` (margins are given in patches).
//! 2. **Resizes.** The image is resized to `crop x crop` (the global crop) and to the canvas, each
//!    with torch's bilinear kernel in f32 rounded back to 8 bits
//!    ([`Image::resize_torch_bilinear`]).
//! 3. **Crops.** The canvas is cut into `crop x crop` crops with stride `window` (torch's
//!    `unfold`), row-major; the global crop comes first.
//! 4. **Normalise.** transformers fuses rescale into normalise: `mean / rescale_factor` and
//!    `std / rescale_factor` as f32 tensors, then `(x - mean') / std'` in f32.
//! 5. **Patches.** Each crop becomes `(crop / patch)^2` patches of `patch * patch * 3` values,
//!    patches row-major, each channels-last and row-major inside.
//! 6. **Pooling.** The high-resolution patch grid with the overlap margins dropped (each crop
//!    keeps the margin it shares with no neighbour), and the global crop's patch grid, are each
//!    padded with -1 to whole `pool_h x pool_w` windows (the padding split `p / 2` before,
//!    `(p + 1) / 2` after) and read window by window: one row of patch indices per image token,
//!    the global crop's rows first. High-resolution indices are offset past the global crop.
//!
//! Indices are relative to this image's first crop. The reference's processor numbers the
//! patches of all images of a request in one sequence (it adds each image's running offset,
//! the crops times patches per crop of the images before it); the caller adds that offset.

use mlxcel_family_common::Image;
use mlxcel_family_common::tiling::select_tiling;
use serde_json::Value;

/// The processor class this reads the settings of.
const PROCESSOR_TYPE: &str = "Molmo2ImageProcessor";
/// Pillow's bilinear code, the only `resample` the processor is ported for.
const PIL_BILINEAR: u64 = 2;
/// transformers' `IMAGENET_STANDARD_MEAN` and `IMAGENET_STANDARD_STD`.
const IMAGENET_STANDARD: [f64; 3] = [0.5; 3];
/// Sanity bounds on the settings (checkpoints use 8 to a few dozen crops of 378 pixels). They
/// keep every size product far inside `usize` and the patch indices inside `i32`; memory is
/// the caller's to bound, with [`ImageProcessor::grid`], before processing an image.
const MAX_CROPS: usize = 256;
/// The largest `size` (crop side) accepted, in pixels.
const MAX_CROP_SIZE: usize = 2048;

/// The image processor's settings (processor_config.json's `image_processor`, or a Hub
/// `preprocessor_config.json`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ImageProcessor {
    /// `size`: the side of every crop, in pixels.
    crop_size: usize,
    max_crops: usize,
    /// `overlap_margins`, left (top) and right (bottom), in patches.
    margins: [usize; 2],
    patch_size: usize,
    /// `pooling_size`: `[pool_h, pool_w]`.
    pooling: [usize; 2],
    /// The fused normalisation: `image_mean / rescale_factor` and `image_std / rescale_factor`.
    mean: [f32; 3],
    std: [f32; 3],
}

/// The tiling and canvas of one image (`compute_crop_geometry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    /// Crops down and across.
    tiling: [usize; 2],
    /// Canvas height and width in pixels.
    canvas: [usize; 2],
}

/// One image, preprocessed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Crops {
    /// `[crops, patches_per_crop, pixels_per_patch]`, row-major.
    pub(crate) pixel_values: Vec<f32>,
    /// Crops including the global one (the reference's `image_num_crops`).
    pub(crate) crops: usize,
    pub(crate) patches_per_crop: usize,
    /// `patch * patch * 3`.
    pub(crate) pixels_per_patch: usize,
    /// `[tokens, pool]` patch indices, row-major, -1 for padding; relative to this image's
    /// first crop (the reference adds the running offset of earlier images).
    pub(crate) pooling: Vec<i32>,
    /// `pool_h * pool_w`, the patches pooled into one token.
    pub(crate) pool: usize,
    /// `[low_res_h, low_res_w, high_res_h, high_res_w]`: the pooled grids (`image_grids`).
    pub(crate) grid: [usize; 4],
}

impl ImageProcessor {
    /// Parses the image processor JSON object (or a processor config holding it under
    /// `image_processor`). Fails closed: an unknown processor type, a non-square `size`,
    /// `do_resize`/`do_rescale`/`do_normalize` false, a resample other than bilinear (2), a
    /// `pooling_size` or `overlap_margins` not of length 2, margins that leave no window, etc.
    /// are an error naming the field. Absent (or null) fields take `Molmo2ImageProcessor`'s
    /// class defaults (size 378, max_crops 8, overlap_margins [4, 4], patch 14, pooling [2, 2],
    /// mean and std 0.5, rescale 1/255, bilinear).
    pub(crate) fn from_json(v: &Value) -> Result<Self, String> {
        let v = v.get("image_processor").unwrap_or(v);
        let fields = v.as_object().ok_or("the image processor config is not a json object")?;
        let get = |name: &str| fields.get(name).filter(|x| !x.is_null());
        let bad = |name: &str, want: &str| format!("image processor: `{name}` must be {want}");

        if let Some(kind) = get("image_processor_type") {
            let kind = kind.as_str().ok_or_else(|| bad("image_processor_type", "a string"))?;
            if kind != PROCESSOR_TYPE && kind != "Molmo2ImageProcessorFast" {
                return Err(format!(
                    "image processor: `image_processor_type` `{kind}` (molmo2 takes {PROCESSOR_TYPE})"
                ));
            }
        }
        for flag in ["do_resize", "do_rescale", "do_normalize"] {
            match get(flag) {
                None | Some(Value::Bool(true)) => {}
                Some(Value::Bool(false)) => {
                    return Err(format!("image processor: `{flag}` false is not supported (molmo2 always does it)"));
                }
                Some(_) => return Err(bad(flag, "a boolean")),
            }
        }
        if let Some(code) = get("resample") {
            let code = code.as_u64().ok_or_else(|| bad("resample", "a pil resampling code"))?;
            if code != PIL_BILINEAR {
                return Err(format!("image processor: `resample` {code} is not supported (bilinear, 2)"));
            }
        }
        let uint = |name: &str, default: usize| -> Result<usize, String> {
            match get(name) {
                None => Ok(default),
                Some(x) => {
                    x.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| bad(name, "a non-negative integer"))
                }
            }
        };
        let pair = |name: &str, default: [usize; 2]| -> Result<[usize; 2], String> {
            let Some(x) = get(name) else { return Ok(default) };
            let items = x.as_array().filter(|a| a.len() == 2).ok_or_else(|| bad(name, "a list of two integers"))?;
            let n = |x: &Value| x.as_u64().and_then(|n| usize::try_from(n).ok());
            match (n(&items[0]), n(&items[1])) {
                (Some(a), Some(b)) => Ok([a, b]),
                _ => Err(bad(name, "a list of two non-negative integers")),
            }
        };

        let crop_size = match get("size") {
            None => 378,
            Some(size) => square_size(size)?,
        };
        let max_crops = uint("max_crops", 8)?;
        let margins = pair("overlap_margins", [4, 4])?;
        let patch_size = uint("patch_size", 14)?;
        let pooling = pair("pooling_size", [2, 2])?;
        if !(1..=MAX_CROPS).contains(&max_crops) {
            return Err(bad("max_crops", &format!("between 1 and {MAX_CROPS}")));
        }
        if !(1..=MAX_CROP_SIZE).contains(&crop_size) {
            return Err(bad("size", &format!("between 1 and {MAX_CROP_SIZE} pixels")));
        }
        if patch_size == 0 || crop_size % patch_size != 0 {
            return Err(format!(
                "image processor: `size` {crop_size} is not a whole number of `patch_size` {patch_size} patches"
            ));
        }
        if pooling.contains(&0) {
            return Err(bad("pooling_size", "two positive integers"));
        }
        let crop_patches = crop_size / patch_size;
        if margins[0].checked_add(margins[1]).is_none_or(|m| m >= crop_patches) {
            return Err(format!(
                "image processor: `overlap_margins` {margins:?} leave no window in a crop of {crop_patches} patches"
            ));
        }

        let factor = match get("rescale_factor") {
            None => 1.0 / 255.0,
            Some(x) => x
                .as_f64()
                .filter(|f| f.is_finite() && *f > 0.0)
                .ok_or_else(|| bad("rescale_factor", "a positive number"))?,
        };
        // `torch.tensor(image_mean) * (1.0 / rescale_factor)`: an f32 tensor times the Python
        // float, which torch rounds to f32 first.
        let scale = (1.0 / factor) as f32;
        let mean = per_channel(get("image_mean"), "image_mean")?.map(|m| m * scale);
        let std = per_channel(get("image_std"), "image_std")?.map(|s| s * scale);
        if mean.iter().chain(&std).any(|x| !x.is_finite()) || std.contains(&0.0) {
            return Err(bad("image_std", "non-zero, with mean and std finite over `rescale_factor`"));
        }
        Ok(Self { crop_size, max_crops, margins, patch_size, pooling, mean, std })
    }

    /// The side of every crop, in pixels (`size`).
    pub(crate) fn crop_size(&self) -> usize {
        self.crop_size
    }

    pub(crate) fn patch_size(&self) -> usize {
        self.patch_size
    }

    /// `pool_h * pool_w`: the patches pooled into one image token (a pooling table's width).
    pub(crate) fn pool(&self) -> usize {
        self.pooling[0] * self.pooling[1]
    }

    /// `max_crops`: the most high-resolution crops of one image (the global crop is extra).
    pub(crate) fn max_crops(&self) -> usize {
        self.max_crops
    }

    /// The pooled grid `[low_res_h, low_res_w, high_res_h, high_res_w]` and the crop count
    /// (the global crop included) for an image of `height x width`, without decoding it
    /// (`get_image_grid_and_crops`). The image becomes `low_res_h * low_res_w + high_res_h *
    /// high_res_w` tokens and `crops * crop_size^2 * 3` pixel values.
    pub(crate) fn grid(&self, height: usize, width: usize) -> ([usize; 4], usize) {
        let tiling = self.geometry(height, width).tiling;
        (self.tiling_grid(tiling), tiling[0] * tiling[1] + 1)
    }

    /// The image tokens of an image tiled `rows x cols` (`rows * cols` at most `max_crops`):
    /// the global crop's pooled patches plus the canvas's.
    pub(crate) fn tiling_tokens(&self, rows: usize, cols: usize) -> usize {
        let [h, w, high_h, high_w] = self.tiling_grid([rows, cols]);
        h * w + high_h * high_w
    }

    /// The pooled grid of a tiling: each side in patches, divided by the pooling window and
    /// rounded up (the -1 padding completes the last window).
    fn tiling_grid(&self, tiling: [usize; 2]) -> [usize; 4] {
        let side = self.crop_size / self.patch_size;
        let [ph, pw] = self.pooling;
        let [canvas_h, canvas_w] = self.canvas(tiling).map(|c| c / self.patch_size);
        [side.div_ceil(ph), side.div_ceil(pw), canvas_h.div_ceil(ph), canvas_w.div_ceil(pw)]
    }

    /// The canvas of a tiling in pixels: `tiles * window + margins` per side.
    fn canvas(&self, tiling: [usize; 2]) -> [usize; 2] {
        let margin = (self.margins[0] + self.margins[1]) * self.patch_size;
        tiling.map(|t| t * self.window_size() + margin)
    }

    /// The side of one window (a crop less both margins), in pixels.
    fn window_size(&self) -> usize {
        (self.crop_size / self.patch_size - self.margins[0] - self.margins[1]) * self.patch_size
    }

    /// `compute_crop_geometry`: the tiling for the image less the margins, and the canvas.
    fn geometry(&self, height: usize, width: usize) -> Geometry {
        let margin = (self.margins[0] + self.margins[1]) * self.patch_size;
        // Image sides are u32 and the margin is under MAX_CROP_SIZE: both fit i64.
        let less = |side: usize| side as i64 - margin as i64;
        let tiling = select_tiling(less(height), less(width), self.window_size(), self.max_crops);
        Geometry { tiling, canvas: self.canvas(tiling) }
    }
}

/// `size`: `{"height": n, "width": n}` or one integer (transformers reads it as a square).
fn square_size(size: &Value) -> Result<usize, String> {
    let side = |x: Option<&Value>| x.and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
    if let Some(n) = side(Some(size)) {
        return Ok(n);
    }
    let fields = size.as_object().filter(|f| f.len() == 2);
    match fields.map(|f| (side(f.get("height")), side(f.get("width")))) {
        Some((Some(h), Some(w))) if h == w => Ok(h),
        Some((Some(h), Some(w))) => Err(format!("image processor: `size` {h}x{w} is not square (molmo2 crops are)")),
        _ => Err(format!("image processor: `size` must be {{\"height\": n, \"width\": n}}, got {size}")),
    }
}

/// `image_mean` or `image_std`: one number or three, as f32 (`torch.tensor` of the floats).
fn per_channel(value: Option<&Value>, name: &str) -> Result<[f32; 3], String> {
    let Some(value) = value else { return Ok(IMAGENET_STANDARD.map(|x| x as f32)) };
    let all = value.as_f64().map(|x| [x; 3]);
    let each = || {
        let items = value.as_array().filter(|a| a.len() == 3)?;
        Some([items[0].as_f64()?, items[1].as_f64()?, items[2].as_f64()?])
    };
    all.or_else(each)
        .map(|xs| xs.map(|x| x as f32))
        .ok_or_else(|| format!("image processor: `{name}` must be a number or a list of three numbers"))
}

/// One image to its crops, patches and pooling table (the reference's
/// `_image_batch_to_patches_and_grids` for one image).
pub(crate) fn crops(image: &Image, p: &ImageProcessor) -> Result<Crops, String> {
    let (height, width) = (image.height() as usize, image.width() as usize);
    let g = p.geometry(height, width);
    let (grid, crops) = p.grid(height, width);
    let patch = p.patch_size;
    let side = p.crop_size / patch;
    let patches_per_crop = side * side;
    let pixels_per_patch = patch * patch * 3;
    let len = crops
        .checked_mul(patches_per_crop)
        .and_then(|n| n.checked_mul(pixels_per_patch))
        .ok_or_else(|| format!("a {width}x{height} image makes too many crops"))?;
    // Every index must fit the reference's int32 table.
    let total_patches = crops * patches_per_crop;
    i32::try_from(total_patches).map_err(|_| format!("a {width}x{height} image makes too many patches"))?;
    let mut pixel_values = Vec::new();
    pixel_values
        .try_reserve_exact(len)
        .map_err(|_| format!("cannot allocate the {len} pixel values of a {width}x{height} image"))?;

    let resize = |w: usize, h: usize| {
        // Canvas sides are below MAX_CROPS * MAX_CROP_SIZE: they fit u32.
        image.resize_torch_bilinear(w as u32, h as u32).map_err(|e| e.to_string())
    };
    let global = resize(p.crop_size, p.crop_size)?;
    push_patches(&mut pixel_values, &global, 0, 0, p);
    let canvas = resize(g.canvas[1], g.canvas[0])?;
    let window = p.window_size();
    for row in 0..g.tiling[0] {
        for col in 0..g.tiling[1] {
            push_patches(&mut pixel_values, &canvas, row * window, col * window, p);
        }
    }
    debug_assert_eq!(pixel_values.len(), len);

    let [ph, pw] = p.pooling;
    let low = (0..patches_per_crop as i64).collect::<Vec<_>>();
    let (mut pooling, low_rows, low_cols) = arange_for_pooling(&low, side, side, ph, pw);
    let (high, rows, cols) = high_res_index_grid(g, side, p.margins);
    let (high, pooled_rows, pooled_cols) = arange_for_pooling(&high, rows, cols, ph, pw);
    pooling.extend(high.iter().map(|&i| if i >= 0 { i + patches_per_crop as i64 } else { -1 }));
    debug_assert_eq!(grid, [low_rows, low_cols, pooled_rows, pooled_cols]);
    // In range: every index is below `total_patches`, checked to fit i32 above.
    let pooling = pooling.into_iter().map(|i| i as i32).collect();
    Ok(Crops { pixel_values, crops, patches_per_crop, pixels_per_patch, pooling, pool: ph * pw, grid })
}

/// Appends the `crop x crop` crop at `(top, left)` of `image` as normalised patches: patches
/// row-major, each `patch` rows of `patch` pixels of three channels.
fn push_patches(out: &mut Vec<f32>, image: &Image, top: usize, left: usize, p: &ImageProcessor) {
    let (width, pixels) = (image.width() as usize, image.pixels());
    let patch = p.patch_size;
    let side = p.crop_size / patch;
    for py in 0..side {
        for px in 0..side {
            for y in 0..patch {
                let start = ((top + py * patch + y) * width + left + px * patch) * 3;
                for (i, &v) in pixels[start..start + patch * 3].iter().enumerate() {
                    let c = i % 3;
                    // tvF.normalize: `x.sub_(mean).div_(std)` in f32.
                    out.push((f32::from(v) - p.mean[c]) / p.std[c]);
                }
            }
        }
    }
}

/// The high-resolution patch grid: the index of each canvas patch within the crops (crop
/// `(row, col)` holds indices from `(row * cols + col) * side^2`, row-major), where each
/// crop contributes all but the margins it overlaps a neighbour with. Returns the grid
/// row-major with its rows and columns (the canvas side in patches).
fn high_res_index_grid(g: Geometry, side: usize, [left, right]: [usize; 2]) -> (Vec<i64>, usize, usize) {
    // The (crop, patch) pairs kept along one axis, in order.
    let kept = |tiles: usize| -> Vec<(usize, usize)> {
        (0..tiles)
            .flat_map(|t| (0..side).map(move |i| (t, i)))
            .filter(|&(t, i)| {
                // A margin shared with the previous or the next crop along the axis.
                let before = t > 0 && i < left;
                let after = t + 1 < tiles && i + right >= side;
                !(before || after)
            })
            .collect()
    };
    let (down, across) = (kept(g.tiling[0]), kept(g.tiling[1]));
    let mut grid = Vec::with_capacity(down.len() * across.len());
    for &(row, y) in &down {
        for &(col, x) in &across {
            grid.push((((row * g.tiling[1] + col) * side + y) * side + x) as i64);
        }
    }
    (grid, down.len(), across.len())
}

/// `arange_for_pooling`: a `height x width` index grid padded with -1 to whole `ph x pw`
/// windows (`p / 2` before, `(p + 1) / 2` after, per axis), read window by window, each window
/// row-major. Returns the `[windows, ph * pw]` table and the windows down and across.
fn arange_for_pooling(grid: &[i64], height: usize, width: usize, ph: usize, pw: usize) -> (Vec<i64>, usize, usize) {
    let (rows, cols) = (height.div_ceil(ph), width.div_ceil(pw));
    let (top, left) = ((rows * ph - height) / 2, (cols * pw - width) / 2);
    let at = |y: usize, x: usize| match (y.checked_sub(top), x.checked_sub(left)) {
        (Some(y), Some(x)) if y < height && x < width => grid[y * width + x],
        _ => -1,
    };
    let mut out = Vec::with_capacity(rows * cols * ph * pw);
    for r in 0..rows {
        for c in 0..cols {
            for i in 0..ph {
                for j in 0..pw {
                    out.push(at(r * ph + i, c * pw + j));
                }
            }
        }
    }
    (out, rows, cols)
}

#[cfg(test)]
mod tests {
    use mlxcel_golden::Tolerance;
    use serde_json::json;

    use super::*;
    use crate::testing::{VARIANT_IMAGES, fixture, golden};

    /// The fixture's image processor (`processor_config.json`'s `image_processor`).
    fn fixture_processor() -> ImageProcessor {
        let text = std::fs::read_to_string(fixture().dir().join("processor_config.json")).expect("read");
        let config: Value = serde_json::from_str(&text).expect("json");
        ImageProcessor::from_json(&config["image_processor"]).expect("parse")
    }

    fn fixture_image(path: &str) -> Image {
        Image::decode(&std::fs::read(fixture().dir().join(path)).expect("read image")).expect("decode")
    }

    #[test]
    fn every_stage_matches_the_goldens_exactly() {
        let p = fixture_processor();
        for (variant, count) in VARIANT_IMAGES {
            let golden = golden(variant);
            if count == 0 {
                assert!(!golden.has("pixel_values"), "{variant}");
                continue;
            }
            let images = golden.field("images").expect("images").as_array().expect("list").clone();
            assert_eq!(images.len(), count, "{variant}");
            let (mut pixels, mut pooling, mut grids, mut num_crops) = (vec![], vec![], vec![], vec![]);
            // The reference numbers the patches of all images in one sequence.
            let mut offset = 0i64;
            for path in &images {
                let image = fixture_image(path.as_str().expect("path"));
                let out = crops(&image, &p).expect("crops");
                let (grid, count) = p.grid(image.height() as usize, image.width() as usize);
                assert_eq!((out.grid, out.crops), (grid, count), "{variant}: grid() agrees with crops()");
                assert_eq!((out.patches_per_crop, out.pixels_per_patch, out.pool), (16, 588, 4));
                assert_eq!(out.pooling.len() / out.pool, grid[0] * grid[1] + grid[2] * grid[3]);
                pixels.extend_from_slice(&out.pixel_values);
                pooling.extend(out.pooling.iter().map(|&i| if i >= 0 { i64::from(i) + offset } else { -1 }));
                grids.extend(out.grid.map(|g| g as i64));
                num_crops.push(out.crops as i64);
                offset += (out.crops * out.patches_per_crop) as i64;
            }
            let report = golden
                .check_f32("pixel_values", &pixels, Tolerance::EXACT)
                .unwrap_or_else(|e| panic!("{variant}: {e}"));
            assert_eq!(report.max_abs_diff, 0.0, "{variant}: {report:?}");
            for (stage, got) in
                [("image_token_pooling", &pooling), ("image_grids", &grids), ("image_num_crops", &num_crops)]
            {
                golden.check_i64(stage, got).unwrap_or_else(|e| panic!("{variant} {stage}: {e}"));
            }
        }
    }

    #[test]
    fn grids_and_crop_counts_match_the_reference_for_other_sizes() {
        // (width, height, image_grids, image_num_crops) from transformers 5.24 / torch 2.15:
        // `Molmo2ImageProcessor(size={"height": 56, "width": 56}, max_crops=2,
        // overlap_margins=[1, 1], patch_size=14, pooling_size=[2, 2])` and
        // `Molmo2ImageProcessor()`, `get_image_grid_and_crops(h, w)`, checked against the
        // processor's own outputs on random images of each size (up to 4M pixels).
        let fixture: [(usize, usize, [usize; 4], usize); 21] = [
            (378, 378, [2, 2, 2, 2], 2),
            (1000, 300, [2, 2, 2, 3], 3),
            (13, 500, [2, 2, 2, 2], 2),
            (14, 14, [2, 2, 2, 2], 2),
            (1, 1, [2, 2, 2, 2], 2),
            (100, 60, [2, 2, 2, 3], 3),
            (50, 90, [2, 2, 3, 2], 3),
            (2000, 2000, [2, 2, 2, 2], 2),
            (1, 4000, [2, 2, 2, 2], 2),
            (4000, 1, [2, 2, 2, 2], 2),
            (28, 28, [2, 2, 2, 2], 2),
            (28, 100, [2, 2, 3, 2], 3),
            (27, 27, [2, 2, 2, 2], 2),
            (29, 29, [2, 2, 2, 2], 2),
            (112, 112, [2, 2, 2, 2], 2),
            (100, 100, [2, 2, 2, 2], 2),
            (113, 1000, [2, 2, 3, 2], 3),
            (640, 480, [2, 2, 2, 3], 3),
            (266, 266, [2, 2, 2, 2], 2),
            (379, 379, [2, 2, 2, 2], 2),
            (760, 140, [2, 2, 2, 3], 3),
        ];
        let defaults: [(usize, usize, [usize; 4], usize); 21] = [
            (378, 378, [14, 14, 14, 14], 2),
            (1000, 300, [14, 14, 14, 42], 5),
            (13, 500, [14, 14, 14, 14], 2),
            (14, 14, [14, 14, 14, 14], 2),
            (1, 1, [14, 14, 14, 14], 2),
            (100, 60, [14, 14, 14, 14], 2),
            (50, 90, [14, 14, 14, 14], 2),
            (2000, 2000, [14, 14, 23, 23], 5),
            (1, 4000, [14, 14, 14, 14], 2),
            (4000, 1, [14, 14, 14, 14], 2),
            (28, 28, [14, 14, 14, 14], 2),
            (28, 100, [14, 14, 14, 14], 2),
            (27, 27, [14, 14, 14, 14], 2),
            (29, 29, [14, 14, 14, 14], 2),
            (112, 112, [14, 14, 14, 14], 2),
            (100, 100, [14, 14, 14, 14], 2),
            (113, 1000, [14, 14, 42, 14], 5),
            (640, 480, [14, 14, 23, 23], 5),
            (266, 266, [14, 14, 14, 14], 2),
            (379, 379, [14, 14, 23, 23], 5),
            (760, 140, [14, 14, 14, 33], 4),
        ];
        // And `Molmo2ImageProcessor(size={"height": 84, "width": 84}, max_crops=5,
        // overlap_margins=[2, 1], patch_size=14, pooling_size=[3, 2])`: uneven margins and pooling.
        let uneven: [(usize, usize, [usize; 4], usize); 7] = [
            (378, 378, [2, 3, 3, 5], 5),
            (1000, 300, [2, 3, 2, 8], 5),
            (13, 500, [2, 3, 2, 3], 2),
            (640, 480, [2, 3, 3, 5], 5),
            (333, 777, [2, 3, 4, 3], 4),
            (57, 41, [2, 3, 2, 3], 2),
            (2000, 150, [2, 3, 2, 9], 6),
        ];
        let class_defaults = ImageProcessor::from_json(&json!({})).expect("defaults");
        let uneven_processor = ImageProcessor::from_json(&json!({
            "size": {"height": 84, "width": 84}, "max_crops": 5, "overlap_margins": [2, 1], "pooling_size": [3, 2]
        }))
        .expect("uneven");
        for (p, table) in
            [(fixture_processor(), &fixture[..]), (class_defaults, &defaults[..]), (uneven_processor, &uneven[..])]
        {
            for &(width, height, grid, crops) in table {
                assert_eq!(p.grid(height, width), (grid, crops), "{width}x{height} with {p:?}");
                let [rows, cols] = p.geometry(height, width).tiling;
                assert_eq!(p.tiling_tokens(rows, cols), grid[0] * grid[1] + grid[2] * grid[3]);
            }
        }
    }

    #[test]
    fn pooling_pads_with_minus_one_split_before_and_after() {
        // A 3x3 grid pooled 2x2: one row of padding after (3 -> 4: 0 before, 1 after), and the
        // same for columns.
        let grid: Vec<i64> = (0..9).collect();
        let (table, rows, cols) = arange_for_pooling(&grid, 3, 3, 2, 2);
        assert_eq!((rows, cols), (2, 2));
        assert_eq!(table, [0, 1, 3, 4, 2, -1, 5, -1, 6, 7, -1, -1, 8, -1, -1, -1]);
        // 2 -> 4 with a 4x4 window pads one before and one after.
        let (table, _, _) = arange_for_pooling(&[0, 1, 2, 3], 2, 2, 4, 4);
        assert_eq!(table, [-1, -1, -1, -1, -1, 0, 1, -1, -1, 2, 3, -1, -1, -1, -1, -1]);
    }

    #[test]
    fn bad_settings_are_refused_naming_the_field() {
        let refuse = |v: Value, field: &str| {
            let err = ImageProcessor::from_json(&v).expect_err(field);
            assert!(err.contains(&format!("`{field}`")), "{field}: {err}");
        };
        refuse(json!({"image_processor_type": "SiglipImageProcessor"}), "image_processor_type");
        refuse(json!({"size": {"height": 56, "width": 84}}), "size");
        refuse(json!({"size": {"shortest_edge": 56}}), "size");
        refuse(json!({"size": 50}), "size");
        refuse(json!({"do_resize": false}), "do_resize");
        refuse(json!({"do_rescale": false}), "do_rescale");
        refuse(json!({"do_normalize": false}), "do_normalize");
        refuse(json!({"do_normalize": "yes"}), "do_normalize");
        refuse(json!({"resample": 3}), "resample");
        refuse(json!({"pooling_size": [2, 2, 2]}), "pooling_size");
        refuse(json!({"pooling_size": [0, 2]}), "pooling_size");
        refuse(json!({"overlap_margins": [4]}), "overlap_margins");
        refuse(json!({"overlap_margins": [13, 14]}), "overlap_margins");
        refuse(json!({"max_crops": 0}), "max_crops");
        refuse(json!({"max_crops": 100000}), "max_crops");
        refuse(json!({"max_crops": -1}), "max_crops");
        refuse(json!({"patch_size": 0}), "patch_size");
        refuse(json!({"rescale_factor": 0}), "rescale_factor");
        refuse(json!({"image_mean": [0.5, 0.5]}), "image_mean");
        refuse(json!({"image_std": 0.0}), "image_std");
        assert!(ImageProcessor::from_json(&json!([])).is_err());
    }

    #[test]
    fn defaults_nulls_and_the_nested_form_read_alike() {
        let defaults = ImageProcessor::from_json(&json!({})).expect("defaults");
        assert_eq!(
            defaults,
            ImageProcessor {
                crop_size: 378,
                max_crops: 8,
                margins: [4, 4],
                patch_size: 14,
                pooling: [2, 2],
                mean: [127.5; 3],
                std: [127.5; 3],
            }
        );
        let explicit = json!({"image_processor": {
            "image_processor_type": "Molmo2ImageProcessor", "size": {"height": 378, "width": 378},
            "max_crops": null, "resample": 2, "image_mean": 0.5, "image_std": [0.5, 0.5, 0.5],
            "rescale_factor": 0.00392156862745098, "do_convert_rgb": true
        }});
        assert_eq!(ImageProcessor::from_json(&explicit).expect("explicit"), defaults);
        assert_eq!(ImageProcessor::from_json(&json!({"size": 378})).expect("int size"), defaults);
    }

    #[test]
    fn the_hub_preprocessor_config_reads_as_the_fixture_processor() {
        let hub = mlxcel_golden::Fixture::named("molmo2_hub").expect("the molmo2_hub fixture");
        let text = std::fs::read_to_string(hub.dir().join("preprocessor_config.json")).expect("read");
        let flat: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(ImageProcessor::from_json(&flat).expect("hub"), fixture_processor());
    }

    #[test]
    fn a_one_pixel_image_and_an_extreme_aspect_ratio_process_without_panicking() {
        let p = fixture_processor();
        for (w, h) in [(1, 1), (1, 700), (700, 1)] {
            let image = Image::from_rgb8(w, h, vec![200; (w * h * 3) as usize]).expect("image");
            let out = crops(&image, &p).expect("crops");
            assert_eq!(out.pixel_values.len(), out.crops * 16 * 588);
            let want = (200.0f32 - 127.5) / 127.5;
            assert!(out.pixel_values.iter().all(|&v| v == want), "{w}x{h}");
            assert_eq!(out.pooling.len() / out.pool, out.grid[0] * out.grid[1] + out.grid[2] * out.grid[3]);
        }
    }
}
