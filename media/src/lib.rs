//! Encoded images to 8-bit RGB, pixel for pixel as transformers' `load_image` gives them:
//! Pillow 13 opens the file, `ImageOps.exif_transpose` applies its orientation, and
//! `convert("RGB")` drops alpha and expands grey and palettes.
//!
//! Every format reads its width and height from its header first, and an image declaring more
//! pixels than the caller allows is refused before any pixel buffer exists; the decoders' own
//! allocations are then bounded by what the declared image needs. PNG is pure Rust and always
//! built. JPEG (`jpeg`) is libjpeg-turbo built from source, the library Pillow links, with its
//! default ISLOW inverse DCT and fancy upsampling: another decoder's arithmetic differs by one
//! level here and there. WebP (`webp`) is libwebp built from its bundled source, for the same
//! reason (lossy YUV to RGB with fancy upsampling). GIF (`gif`) is pure Rust; GIF is lossless,
//! so only Pillow's rules for the first frame's canvas and palette have to be followed.
//!
//! The family plugins take this crate with the default features off (PNG only), so no plugin
//! links libjpeg-turbo or libwebp; the host decodes every format and hands plugins RGB.

#![forbid(unsafe_code)]

mod exif;
mod formats;

pub use exif::Orientation;

/// The formats this crate recognises by their signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Png,
    Jpeg,
    WebP,
    Gif,
}

impl Format {
    /// The format whose signature `bytes` start with, if any.
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(formats::png::SIGNATURE) {
            Some(Format::Png)
        } else if bytes.starts_with(&[0xff, 0xd8, 0xff]) {
            Some(Format::Jpeg)
        } else if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
            Some(Format::WebP)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(Format::Gif)
        } else {
            None
        }
    }

    /// Whether this build decodes the format (PNG always; the others by feature).
    pub fn is_built(self) -> bool {
        match self {
            Format::Png => true,
            Format::Jpeg => cfg!(feature = "jpeg"),
            Format::WebP => cfg!(feature = "webp"),
            Format::Gif => cfg!(feature = "gif"),
        }
    }

    /// The lowercase name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Format::Png => "png",
            Format::Jpeg => "jpeg",
            Format::WebP => "webp",
            Format::Gif => "gif",
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an encoded image cannot be used. Every variant is the input's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No signature this crate knows (a format not served, or not an image).
    #[error("not an image in a format this server decodes (png, jpeg, webp, gif)")]
    Unrecognized,
    /// A format this build leaves out (the family plugins take PNG only).
    #[error("{format} images are not decoded here (mlxcel-media is built without its `{format}` feature)")]
    NotBuilt { format: Format },
    /// The header declares no pixels.
    #[error("the {format} image is empty ({width}x{height})")]
    Empty { format: Format, width: u32, height: u32 },
    /// The header declares more pixels than the caller allows; refused before decoding.
    #[error("the {format} image is {width}x{height} ({pixels} pixels), over the limit of {limit} pixels")]
    TooManyPixels { format: Format, width: u32, height: u32, pixels: u64, limit: u64 },
    /// A well-formed image of a kind not served (CMYK JPEG, animation).
    #[error("unsupported {format} image: {what}")]
    Unsupported { format: Format, what: String },
    /// The bytes do not decode (truncated, corrupt, or refused by the decoder).
    #[error("cannot decode the {format}: {reason}")]
    Corrupt { format: Format, reason: String },
}

impl Error {
    fn corrupt(format: Format, reason: impl Into<String>) -> Self {
        Error::Corrupt { format, reason: reason.into() }
    }

    fn unsupported(format: Format, what: impl Into<String>) -> Self {
        Error::Unsupported { format, what: what.into() }
    }
}

/// An 8-bit RGB image, row-major, channels interleaved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb8 {
    width: u32,
    height: u32,
    pixels: Vec<u8>,
}

impl Rgb8 {
    /// Wraps `width * height` interleaved RGB pixels; `None` if the sizes disagree.
    pub fn new(width: u32, height: u32, pixels: Vec<u8>) -> Option<Self> {
        (pixels.len() as u64 == u64::from(width) * u64::from(height) * 3).then_some(Self { width, height, pixels })
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    /// The interleaved RGB bytes.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    pub fn into_pixels(self) -> Vec<u8> {
        self.pixels
    }
}

/// The format and size `bytes` declare, read from the header alone: nothing is decoded or
/// allocated, so this is the check to make before trusting an upload. For a GIF the size is
/// the canvas the first frame is drawn on (the screen, grown to hold the frame as Pillow does).
pub fn dimensions(bytes: &[u8]) -> Result<(Format, u32, u32), Error> {
    let format = Format::sniff(bytes).ok_or(Error::Unrecognized)?;
    let (width, height) = match format {
        Format::Png => formats::png::dimensions(bytes)?,
        Format::Jpeg => formats::jpeg_header::dimensions(bytes)?,
        Format::WebP => formats::webp_header::parse(bytes)?.size,
        Format::Gif => formats::gif_header::dimensions(bytes)?,
    };
    if width == 0 || height == 0 {
        return Err(Error::Empty { format, width, height });
    }
    Ok((format, width, height))
}

/// Decodes an image of any size. For untrusted input use [`decode_limited`].
pub fn decode(bytes: &[u8]) -> Result<Rgb8, Error> {
    decode_limited(bytes, u64::MAX)
}

/// Decodes `bytes` to RGB as `load_image` does, refusing an image whose header declares more
/// than `max_pixels` pixels ([`Error::TooManyPixels`]) before any pixel buffer exists.
pub fn decode_limited(bytes: &[u8], max_pixels: u64) -> Result<Rgb8, Error> {
    let (format, width, height) = dimensions(bytes)?;
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err(Error::TooManyPixels { format, width, height, pixels, limit: max_pixels });
    }
    if !format.is_built() {
        return Err(Error::NotBuilt { format });
    }
    let (image, metadata) = match format {
        Format::Png => formats::png::decode(bytes, width, height)?,
        #[cfg(feature = "jpeg")]
        Format::Jpeg => formats::jpeg::decode(bytes, width, height)?,
        #[cfg(feature = "webp")]
        Format::WebP => formats::webp::decode(bytes, width, height)?,
        #[cfg(feature = "gif")]
        Format::Gif => formats::gif::decode(bytes, width, height)?,
        #[allow(unreachable_patterns)]
        _ => return Err(Error::NotBuilt { format }),
    };
    let orientation = metadata.orientation().map_err(|reason| Error::corrupt(format, reason))?;
    Ok(orientation.apply(image))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_by_their_signature() {
        for (bytes, format) in [
            (&b"\x89PNG\r\n\x1a\n...."[..], Some(Format::Png)),
            (b"\xff\xd8\xff\xe0", Some(Format::Jpeg)),
            (b"RIFF\0\0\0\0WEBPVP8 ", Some(Format::WebP)),
            (b"RIFF\0\0\0\0WAVEfmt ", None),
            (b"GIF89a", Some(Format::Gif)),
            (b"GIF87a", Some(Format::Gif)),
            (b"BM\0\0", None),
            (b"", None),
        ] {
            assert_eq!(Format::sniff(bytes), format, "{bytes:?}");
        }
        assert_eq!(decode(b"BM6\0\0\0"), Err(Error::Unrecognized));
    }

    /// Built as the plugins take it (`--no-default-features`): a JPEG is named, not misread, and
    /// its size is still checked first.
    #[cfg(not(feature = "jpeg"))]
    #[test]
    fn a_format_left_out_is_refused_by_name_after_the_limit() {
        let jpeg = b"\xff\xd8\xff\xc0\0\x11\x08\0\x17\0\x25\x03\x01\x22\0\x02\x11\x01\x03\x11\x01\xff\xda";
        let err = decode(jpeg).expect_err("not built");
        assert_eq!(
            err.to_string(),
            "jpeg images are not decoded here (mlxcel-media is built without its `jpeg` feature)"
        );
        assert!(matches!(decode_limited(jpeg, 100), Err(Error::TooManyPixels { width: 37, height: 23, .. })));
    }
}
