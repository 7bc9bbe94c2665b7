//! PNG through the `png` crate, with the samples turned into RGB by Pillow's rules rather
//! than the crate's: 1-bit grey is 0 or 255 and 2- and 4-bit grey scale to 8 bits (`L;2`,
//! `L;4`); 16-bit grey is Pillow's `I;16`, which `convert("RGB")` clips to 255 instead of
//! scaling; every other 16-bit sample keeps its high byte; a palette index past the `PLTE`
//! entries is black; transparency (`tRNS`, alpha) is dropped. Orientation comes from an `eXIf`
//! chunk, an `exif` or `Raw profile type exif` text chunk, or the XMP text chunk.

use std::borrow::Cow;

use crate::exif::Metadata;
use crate::{Error, Format, Rgb8};

/// The eight bytes every PNG starts with.
pub(crate) const SIGNATURE: &[u8; 8] = b"\x89PNG\r\n\x1a\n";

/// What the decoder may allocate besides the decoded frame: the chunks it keeps (palette,
/// transparency, `eXIf`, animation control; text and ICC profiles are skipped).
const METADATA_BYTES: u64 = 1 << 20;

/// The most a compressed text chunk may inflate to (Pillow's `MAX_TEXT_CHUNK`).
const MAX_TEXT: usize = 1 << 20;

fn corrupt(reason: impl Into<String>) -> Error {
    Error::corrupt(Format::Png, reason)
}

/// The width and height in the `IHDR` chunk (the first, right after the signature; its CRC
/// is left to the decoder).
pub(crate) fn dimensions(bytes: &[u8]) -> Result<(u32, u32), Error> {
    // Length (4), type (4), then width (4), height (4), bit depth, colour type, compression,
    // filter and interlace (1 each), then the CRC (4).
    let Some(ihdr) = bytes.get(8..33) else {
        return Err(corrupt("truncated in the ihdr chunk"));
    };
    if ihdr[..8] != *b"\0\0\0\x0dIHDR" {
        return Err(corrupt("the first chunk is not a 13-byte ihdr"));
    }
    let field = |at: usize| u32::from_be_bytes([ihdr[at], ihdr[at + 1], ihdr[at + 2], ihdr[at + 3]]);
    Ok((field(8), field(12)))
}

/// Decodes a PNG whose header declared `width x height` (already checked against the limit).
pub(crate) fn decode(bytes: &[u8], width: u32, height: u32) -> Result<(Rgb8, Metadata), Error> {
    let pixels = u64::from(width) * u64::from(height);
    // The largest raw frame: 16-bit RGBA, eight bytes a pixel.
    let budget = pixels.saturating_mul(8).saturating_add(METADATA_BYTES);
    let limits = png::Limits { bytes: usize::try_from(budget).unwrap_or(usize::MAX) };
    let png_error = |e: png::DecodingError| corrupt(e.to_string().to_lowercase());
    let mut decoder = png::Decoder::new_with_limits(std::io::Cursor::new(bytes), limits);
    decoder.set_ignore_text_chunk(true);
    decoder.set_ignore_iccp_chunk(true);
    decoder.set_transformations(png::Transformations::IDENTITY);
    let mut reader = decoder.read_info().map_err(png_error)?;
    if let Some(animation) = reader.info().animation_control
        && animation.num_frames > 1
    {
        let what = format!("animated (apng, {} frames); send a still image", animation.num_frames);
        return Err(Error::unsupported(Format::Png, what));
    }
    let palette = reader.info().palette.clone().map(Cow::into_owned);
    let size = reader.output_buffer_size().ok_or_else(|| corrupt("the image is too large"))?;
    let mut buffer = vec![0; size];
    let info = reader.next_frame(&mut buffer).map_err(png_error)?;
    let (w, h) = (info.width as usize, info.height as usize);
    let depth = info.bit_depth as usize;
    let mut out = Vec::with_capacity(w * h * 3);
    for row in buffer[..info.buffer_size()].chunks_exact(info.line_size).take(h) {
        rgb_row(row, w, info.color_type, depth, palette.as_deref(), &mut out)?;
    }
    let image = Rgb8::new(info.width, info.height, out).ok_or_else(|| corrupt("the frame size is inconsistent"))?;
    Ok((image, metadata(bytes)?))
}

/// One row of raw samples to RGB, appended to `out`.
fn rgb_row(
    row: &[u8],
    width: usize,
    color: png::ColorType,
    depth: usize,
    palette: Option<&[u8]>,
    out: &mut Vec<u8>,
) -> Result<(), Error> {
    // Sample `i` of a row of `depth`-bit samples, most significant bits first.
    let packed = |i: usize| -> u8 {
        let bit = i * depth;
        (row[bit / 8] >> (8 - depth - bit % 8)) & ((1u16 << depth) - 1) as u8
    };
    match (color, depth) {
        (png::ColorType::Grayscale, 16) => {
            // Pillow's I;16 to RGB clips at 255.
            for s in row.chunks_exact(2).take(width) {
                let v = u16::from_be_bytes([s[0], s[1]]).min(255) as u8;
                out.extend([v, v, v]);
            }
        }
        (png::ColorType::Grayscale, 8) => row[..width].iter().for_each(|&v| out.extend([v, v, v])),
        (png::ColorType::Grayscale, 1 | 2 | 4) => {
            let scale = 255 / ((1u16 << depth) - 1) as u8;
            (0..width).for_each(|i| {
                let v = packed(i) * scale;
                out.extend([v, v, v]);
            });
        }
        (png::ColorType::Indexed, 1 | 2 | 4 | 8) => {
            let palette = palette.ok_or_else(|| corrupt("an indexed image has no palette"))?;
            let index = |i: usize| usize::from(if depth == 8 { row[i] } else { packed(i) });
            // Entries past the palette are black in Pillow's palette.
            (0..width).for_each(|i| out.extend(palette.get(index(i) * 3..index(i) * 3 + 3).unwrap_or(&[0, 0, 0])));
        }
        (png::ColorType::Rgb, 8) => out.extend_from_slice(&row[..width * 3]),
        (png::ColorType::Rgb, 16) => row.chunks_exact(6).take(width).for_each(|s| out.extend([s[0], s[2], s[4]])),
        (png::ColorType::Rgba, 8) => row.chunks_exact(4).take(width).for_each(|s| out.extend([s[0], s[1], s[2]])),
        (png::ColorType::Rgba, 16) => row.chunks_exact(8).take(width).for_each(|s| out.extend([s[0], s[2], s[4]])),
        (png::ColorType::GrayscaleAlpha, 8) => row.chunks_exact(2).take(width).for_each(|s| out.extend([s[0]; 3])),
        (png::ColorType::GrayscaleAlpha, 16) => row.chunks_exact(4).take(width).for_each(|s| out.extend([s[0]; 3])),
        (color, depth) => return Err(corrupt(format!("{color:?} at {depth} bits is not a png colour type"))),
    }
    Ok(())
}

/// The chunks Pillow reads orientation from, wherever they stand (Pillow reads the chunks
/// after the image data too, when it loads). The walk stops where the chunks stop parsing;
/// the decoder has already refused a file that is broken before its image data ends.
fn metadata(bytes: &[u8]) -> Result<Metadata, Error> {
    let mut metadata = Metadata::default();
    let mut at = SIGNATURE.len();
    while let Some(header) = bytes.get(at..at + 8) {
        let length = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let kind = &header[4..8];
        let Some(data) = bytes.get(at + 8..(at + 8).saturating_add(length)) else { break };
        match kind {
            b"IEND" => break,
            b"eXIf" => metadata.exif = Some([b"Exif\0\0".as_slice(), data].concat()),
            b"tEXt" | b"zTXt" | b"iTXt" => text_chunk(kind, data, &mut metadata)?,
            _ => {}
        }
        at = at + 12 + length;
    }
    Ok(metadata)
}

/// A text chunk whose keyword Pillow reads orientation from (as `PngImagePlugin` keeps them:
/// `exif` only as uncompressed latin-1 bytes, the raw profile and XMP from any text chunk).
fn text_chunk(kind: &[u8], data: &[u8], metadata: &mut Metadata) -> Result<(), Error> {
    let (keyword, rest) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (data, &[][..]),
    };
    let wanted = matches!(keyword, b"exif" | b"Raw profile type exif" | b"XML:com.adobe.xmp");
    if !wanted {
        return Ok(());
    }
    let text: Vec<u8> = match kind {
        b"tEXt" => rest.to_vec(),
        b"zTXt" => match rest.split_first() {
            Some((0, compressed)) => inflate(compressed).unwrap_or_default(),
            Some((method, _)) => return Err(corrupt(format!("unknown compression method {method} in a ztxt chunk"))),
            None => Vec::new(),
        },
        _ => {
            // iTXt: compression flag and method, language and translated keyword, then text.
            let [flag, method, tail @ ..] = rest else { return Ok(()) };
            let mut parts = tail.splitn(3, |&b| b == 0);
            let (Some(_), Some(_), Some(text)) = (parts.next(), parts.next(), parts.next()) else { return Ok(()) };
            match (flag, method) {
                (0, _) => text.to_vec(),
                (_, 0) => match inflate(text) {
                    Some(text) => text,
                    None => return Ok(()),
                },
                _ => return Ok(()),
            }
        }
    };
    match (keyword, kind) {
        (b"exif", b"tEXt") => metadata.exif = Some(text),
        (b"Raw profile type exif", _) => metadata.raw_profile = Some(text),
        (b"XML:com.adobe.xmp", _) => metadata.xmp = Some(text),
        _ => {}
    }
    Ok(())
}

/// A zlib stream inflated up to [`MAX_TEXT`] bytes; `None` if it does not inflate.
fn inflate(compressed: &[u8]) -> Option<Vec<u8>> {
    miniz_oxide::inflate::decompress_to_vec_zlib_with_limit(compressed, MAX_TEXT).ok()
}
