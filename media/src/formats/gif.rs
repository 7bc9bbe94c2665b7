//! The first frame of a GIF as Pillow 13 loads it: the frame's palette indices (the `gif`
//! crate's LZW decoder; GIF is lossless) drawn on a canvas the size of the logical screen
//! (grown to hold the frame) that is filled with the frame's transparent index, or index 0
//! without one, then looked up in the local palette, else the global one. A palette that is
//! the identity grey ramp is no palette (Pillow's mode `L`: the index is the grey level); an
//! index past the palette's entries is black. Later frames of an animation are not read.

use std::num::NonZeroU64;

use crate::exif::Metadata;
use crate::{Error, Format, Rgb8};

fn corrupt(reason: impl Into<String>) -> Error {
    Error::corrupt(Format::Gif, reason)
}

/// Pillow's `_is_palette_needed`: false for a palette whose entry `i` is `(i, i, i)`.
fn is_palette_needed(palette: &[u8]) -> bool {
    palette.chunks(3).enumerate().any(|(i, rgb)| rgb.iter().any(|&c| usize::from(c) != i))
}

/// Decodes the first frame on a `width x height` canvas (the size [`super::gif_header`] read,
/// already checked against the limit).
pub(crate) fn decode(bytes: &[u8], width: u32, height: u32) -> Result<(Rgb8, Metadata), Error> {
    let (w, h) = (width as usize, height as usize);
    let mut options = gif::DecodeOptions::new();
    options.set_color_output(gif::ColorOutput::Indexed);
    options.allow_unknown_blocks(true);
    // The frame's indices and its palettes: at most one byte a canvas pixel, plus the tables.
    let budget = NonZeroU64::new((w as u64 * h as u64).saturating_add(1 << 16)).expect("invariant: nonzero");
    options.set_memory_limit(gif::MemoryLimit::Bytes(budget));
    let gif_error = |e: gif::DecodingError| corrupt(e.to_string().to_lowercase());
    // The `gif` crate wants a colour table for every frame; Pillow takes a file without any as
    // grey levels, which is what the identity ramp gives below, so a file without a global
    // table is read with that ramp added (a frame's own table still wins).
    let with_ramp;
    let bytes = match bytes.get(10) {
        Some(flags) if flags & 0x80 == 0 && bytes.len() >= 13 => {
            let ramp = (0..=255u8).flat_map(|i| [i, i, i]);
            with_ramp = [&bytes[..10], &[flags | 0x87], &bytes[11..13]]
                .concat()
                .into_iter()
                .chain(ramp)
                .chain(bytes[13..].iter().copied())
                .collect::<Vec<u8>>();
            &with_ramp[..]
        }
        _ => bytes,
    };
    let mut decoder = options.read_info(bytes).map_err(gif_error)?;
    let global = decoder.global_palette().map(<[u8]>::to_vec);
    let frame = decoder.read_next_frame().map_err(gif_error)?.ok_or_else(|| corrupt("it has no image"))?;
    let palette = match (&frame.palette, &global) {
        (Some(local), _) => Some(local.as_slice()),
        (None, Some(global)) => Some(global.as_slice()),
        (None, None) => None,
    }
    .filter(|p| is_palette_needed(p));
    let (left, top) = (usize::from(frame.left), usize::from(frame.top));
    let (fw, fh) = (usize::from(frame.width), usize::from(frame.height));
    if left + fw > w || top + fh > h || frame.buffer.len() < fw * fh {
        return Err(corrupt("the first frame does not fit the canvas its header declared"));
    }
    let mut indices = vec![frame.transparent.unwrap_or(0); w * h];
    for (y, row) in frame.buffer.chunks_exact(fw.max(1)).take(fh).enumerate() {
        indices[(top + y) * w + left..(top + y) * w + left + fw].copy_from_slice(row);
    }
    let pixels = match palette {
        Some(palette) => indices
            .iter()
            .flat_map(|&i| {
                let i = usize::from(i) * 3;
                let rgb = palette.get(i..i + 3).unwrap_or(&[0, 0, 0]);
                [rgb[0], rgb[1], rgb[2]]
            })
            .collect(),
        None => indices.iter().flat_map(|&i| [i, i, i]).collect(),
    };
    let image = Rgb8::new(width, height, pixels).ok_or_else(|| corrupt("the canvas size is inconsistent"))?;
    Ok((image, Metadata::default()))
}
