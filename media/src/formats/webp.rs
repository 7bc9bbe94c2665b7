//! WebP through libwebp (the `webp` crate's safe API over the library it builds from its
//! bundled source): lossy frames go from YUV to RGB with libwebp's fancy upsampling, as in
//! Pillow, whose decoder is the same library; alpha is dropped. Animated files are refused.

use crate::exif::Metadata;
use crate::formats::webp_header;
use crate::{Error, Format, Rgb8};

fn corrupt(reason: impl Into<String>) -> Error {
    Error::corrupt(Format::WebP, reason)
}

/// Decodes a WebP whose header declared `width x height` (already checked against the limit).
pub(crate) fn decode(bytes: &[u8], width: u32, height: u32) -> Result<(Rgb8, Metadata), Error> {
    let container = webp_header::parse(bytes)?;
    let features = webp::BitstreamFeatures::new(bytes).ok_or_else(|| corrupt("libwebp cannot read its header"))?;
    if container.animated || features.has_animation() {
        return Err(Error::unsupported(Format::WebP, "animated; send a still image"));
    }
    if (features.width(), features.height()) != (width, height) {
        return Err(corrupt("the container and the bitstream disagree on the size"));
    }
    let decoded =
        webp::Decoder::new(bytes).decode().ok_or_else(|| corrupt("libwebp cannot decode it (truncated or corrupt)"))?;
    if (decoded.width(), decoded.height()) != (width, height) {
        return Err(corrupt("the decoded size differs from the declared one"));
    }
    let channels = if decoded.is_alpha() { 4 } else { 3 };
    let pixels: Vec<u8> = decoded.chunks_exact(channels).flat_map(|p| [p[0], p[1], p[2]]).collect();
    let image = Rgb8::new(width, height, pixels).ok_or_else(|| corrupt("the decoded size is inconsistent"))?;
    Ok((image, container.metadata))
}
