//! The RIFF container of a WebP: the size its first chunk declares (`VP8X` canvas, `VP8 `
//! key frame or `VP8L` header), whether it is animated, and the first `EXIF` and `XMP `
//! chunks of an extended file (what Pillow's decoder reads through libwebp's demuxer).

use crate::exif::Metadata;
use crate::{Error, Format};

/// What the container says.
#[derive(Debug, Default)]
pub(crate) struct Container {
    pub(crate) size: (u32, u32),
    pub(crate) animated: bool,
    pub(crate) metadata: Metadata,
}

fn corrupt(reason: &str) -> Error {
    Error::corrupt(Format::WebP, reason)
}

fn u24(b: &[u8]) -> u32 {
    u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16
}

/// Reads the chunk headers (no image data).
pub(crate) fn parse(bytes: &[u8]) -> Result<Container, Error> {
    let mut container = Container::default();
    let mut at = 12;
    let mut first = true;
    while let Some(header) = bytes.get(at..at + 8) {
        let fourcc = &header[..4];
        let length = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        let data = bytes.get(at + 8..(at + 8).saturating_add(length));
        if first {
            let data = data.ok_or_else(|| corrupt("truncated in its first chunk"))?;
            container.size = match fourcc {
                b"VP8X" => {
                    let d = data.get(..10).ok_or_else(|| corrupt("a short vp8x chunk"))?;
                    container.animated = d[0] & 0x02 != 0;
                    (1 + u24(&d[4..7]), 1 + u24(&d[7..10]))
                }
                b"VP8 " => match data.get(..10) {
                    Some([_, _, _, 0x9d, 0x01, 0x2a, w0, w1, h0, h1]) => (
                        u32::from(u16::from_le_bytes([*w0, *w1]) & 0x3fff),
                        u32::from(u16::from_le_bytes([*h0, *h1]) & 0x3fff),
                    ),
                    _ => return Err(corrupt("the vp8 chunk does not start with a key frame")),
                },
                b"VP8L" => match data.get(..5) {
                    Some([0x2f, b0, b1, b2, b3]) => {
                        let bits = u32::from_le_bytes([*b0, *b1, *b2, *b3]);
                        ((bits & 0x3fff) + 1, ((bits >> 14) & 0x3fff) + 1)
                    }
                    _ => return Err(corrupt("the vp8l chunk has no lossless signature")),
                },
                _ => return Err(corrupt("the first chunk is not vp8, vp8l or vp8x")),
            };
            if fourcc != b"VP8X" {
                // A simple file is that one chunk.
                return Ok(container);
            }
            first = false;
        } else {
            let Some(data) = data else { break };
            match fourcc {
                b"ANIM" | b"ANMF" => container.animated = true,
                b"EXIF" if container.metadata.exif.is_none() => container.metadata.exif = Some(data.to_vec()),
                b"XMP " if container.metadata.xmp.is_none() => container.metadata.xmp = Some(data.to_vec()),
                _ => {}
            }
        }
        // Chunks are padded to an even length.
        at = at + 8 + length + (length & 1);
    }
    if first {
        return Err(corrupt("truncated before its first chunk"));
    }
    Ok(container)
}
