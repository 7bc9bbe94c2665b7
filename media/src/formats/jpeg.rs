//! JPEG through libjpeg-turbo (the `turbojpeg` crate's safe API over the library it builds
//! from source), as Pillow decodes it: the default ISLOW inverse DCT and fancy upsampling,
//! YCbCr (or RGB) to RGB, grey repeated into the three channels. CMYK and YCCK are refused.
//! Any warning libjpeg-turbo raises (a truncated file, corrupt entropy data) refuses the
//! image, where Pillow would decode some of them with the damage.

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
    decompressor.decompress(bytes, image).map_err(library)?;
    let image = Rgb8::new(width, height, pixels).ok_or_else(|| corrupt("the decoded size is inconsistent"))?;
    Ok((image, header.metadata))
}
