//! JPEG through libjpeg-turbo (the `turbojpeg` crate's safe API over the library it builds
//! from source), as Pillow decodes it: the default ISLOW inverse DCT and fancy upsampling,
//! YCbCr (or RGB) to RGB, grey repeated into the three channels. CMYK and YCCK are refused.
//! A file whose data ends early is refused, as Pillow refuses it ("image file is truncated");
//! one that is all there but makes libjpeg-turbo warn (extraneous bytes before a marker, a bad
//! Huffman code) is decoded with libjpeg-turbo's recovery, as Pillow decodes it.

use turbojpeg::{Colorspace, Decompressor, Image, PixelFormat};

use crate::exif::Metadata;
use crate::formats::jpeg_header;
use crate::{Error, Format, Rgb8};

/// Progressive scans allowed before a file is refused: libjpeg-turbo's guard against files
/// made of endless tiny scans (its own tools use 500; real encoders write about ten).
const SCAN_LIMIT: u32 = 500;

fn corrupt(reason: impl Into<String>) -> Error {
    Error::corrupt(Format::Jpeg, reason)
}

fn library(e: turbojpeg::Error) -> Error {
    let message = e.to_string();
    let message = message.strip_prefix("TurboJPEG error: ").unwrap_or(&message).trim_end_matches('.');
    corrupt(message.to_lowercase())
}

/// Decodes a JPEG whose header declared `width x height` (already checked against the limit).
pub(crate) fn decode(bytes: &[u8], width: u32, height: u32) -> Result<(Rgb8, Metadata), Error> {
    let header = jpeg_header::parse(bytes)?;
    let mut decompressor = Decompressor::new().map_err(library)?;
    decompressor.set_scan_limit(SCAN_LIMIT).map_err(library)?;
    let info = decompressor.read_header(bytes).map_err(library)?;
    match info.colorspace {
        Colorspace::CMYK | Colorspace::YCCK => {
            let what =
                format!("{:?} colour (4 channels); send an rgb or greyscale jpeg", info.colorspace).to_lowercase();
            return Err(Error::unsupported(Format::Jpeg, what));
        }
        Colorspace::RGB | Colorspace::YCbCr | Colorspace::Gray => {}
    }
    if (info.width, info.height) != (width as usize, height as usize) {
        return Err(corrupt("the frame header and the decoder disagree on the size"));
    }
    let (w, h) = (info.width, info.height);
    let mut pixels = vec![0u8; w * h * 3];
    let image = Image { pixels: pixels.as_mut_slice(), width: w, pitch: w * 3, height: h, format: PixelFormat::RGB };
    match decompressor.decompress(bytes, image) {
        Ok(()) => {}
        // TurboJPEG reports a warning as a failure too, once the image is decoded.
        Err(e) if is_warning(&e) && ends_with_its_data(&bytes[header.scan..]) => {}
        Err(e) => return Err(library(e)),
    }
    let image = Rgb8::new(width, height, pixels).ok_or_else(|| corrupt("the decoded size is inconsistent"))?;
    Ok((image, header.metadata))
}

/// The messages of libjpeg-turbo's warnings (`JWRN_*` in `jerror.h`) but "Premature end of JPEG
/// file", which means the data ran out. TurboJPEG keeps the first warning's message; no error
/// message starts like these.
const WARNINGS: [&str; 6] = [
    "Corrupt JPEG data",
    "Unknown Adobe color transform code",
    "Inconsistent progression sequence",
    "Warning: unknown JFIF revision number",
    "Invalid SOS parameters for sequential JPEG",
    "Application transferred too many scanlines",
];

fn is_warning(e: &turbojpeg::Error) -> bool {
    matches!(e, turbojpeg::Error::TurboJpegError(message) if WARNINGS.iter().any(|w| message.starts_with(w)))
}

/// Whether an end-of-image marker follows in `scans` (the file from its first scan on):
/// entropy-coded data never holds the bytes ff d9, so without them the file is cut short (and
/// Pillow, running out of data before libjpeg-turbo finishes, refuses it).
fn ends_with_its_data(scans: &[u8]) -> bool {
    scans.windows(2).any(|m| m == [0xff, 0xd9])
}
