//! The GIF blocks before the first frame's image data: the logical screen, the first image
//! descriptor, and the canvas Pillow draws that frame on (the screen, grown to hold the frame).

use crate::{Error, Format};

fn corrupt(reason: &str) -> Error {
    Error::corrupt(Format::Gif, reason)
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u32> {
    bytes.get(at..at + 2).map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
}

/// The canvas size of the first frame.
pub(crate) fn dimensions(bytes: &[u8]) -> Result<(u32, u32), Error> {
    let truncated = || corrupt("truncated before its first frame");
    let (width, height) = (u16_at(bytes, 6).ok_or_else(truncated)?, u16_at(bytes, 8).ok_or_else(truncated)?);
    let flags = *bytes.get(10).ok_or_else(truncated)?;
    let mut at = 13;
    if flags & 0x80 != 0 {
        at += 3 << ((flags & 7) + 1);
    }
    loop {
        match bytes.get(at).ok_or_else(truncated)? {
            b'!' => {
                // Label, then sub-blocks until an empty one.
                at += 2;
                loop {
                    let len = usize::from(*bytes.get(at).ok_or_else(truncated)?);
                    at += 1 + len;
                    if len == 0 {
                        break;
                    }
                }
            }
            b',' => {
                let field = |offset| u16_at(bytes, at + 1 + offset).ok_or_else(truncated);
                let (left, top, w, h) = (field(0)?, field(2)?, field(4)?, field(6)?);
                return Ok((width.max(left + w), height.max(top + h)));
            }
            b';' => return Err(corrupt("it has no image")),
            // Pillow reads past a byte that starts no block.
            _ => at += 1,
        }
    }
}
