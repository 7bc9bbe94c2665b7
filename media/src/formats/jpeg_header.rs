//! The JPEG markers before the first scan: the frame size (`SOFn`), the component count, and
//! the APP1 segments Pillow keeps (`Exif\0\0`: the first whole, later ones appended without
//! their prefix; XMP: the last one).

use crate::exif::Metadata;
use crate::{Error, Format};

/// What the markers before the first scan say.
#[derive(Debug, Default)]
pub(crate) struct Header {
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) components: u8,
    /// Where the first scan's marker stands.
    pub(crate) scan: usize,
    pub(crate) metadata: Metadata,
}

const XMP_PREFIX: &[u8] = b"http://ns.adobe.com/xap/1.0/\0";

fn corrupt(reason: &str) -> Error {
    Error::corrupt(Format::Jpeg, reason)
}

/// The width and height of the frame.
pub(crate) fn dimensions(bytes: &[u8]) -> Result<(u32, u32), Error> {
    parse(bytes).map(|h| (h.width, h.height))
}

/// Walks the markers from the start of image to the frame header and on to the first scan.
pub(crate) fn parse(bytes: &[u8]) -> Result<Header, Error> {
    let mut header = Header::default();
    let mut frame = false;
    let mut at = 2;
    loop {
        // Fill bytes (0xff) may precede a marker.
        while bytes.get(at) == Some(&0xff) && bytes.get(at + 1) == Some(&0xff) {
            at += 1;
        }
        let (Some(&0xff), Some(&marker)) = (bytes.get(at), bytes.get(at + 1)) else {
            return Err(corrupt(if at + 1 >= bytes.len() {
                "truncated before the first scan"
            } else {
                "no marker where one belongs"
            }));
        };
        at += 2;
        if matches!(marker, 0x01 | 0xd0..=0xd7) {
            continue;
        }
        if marker == 0xd9 {
            return Err(corrupt("the image ends before its first scan"));
        }
        if marker == 0xda {
            header.scan = at - 2;
            return if frame { Ok(header) } else { Err(corrupt("a scan before the frame header")) };
        }
        let Some(len) = bytes.get(at..at + 2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]]))) else {
            return Err(corrupt("truncated in a marker segment"));
        };
        let Some(segment) = bytes.get(at + 2..at + len.max(2)) else {
            return Err(corrupt("truncated in a marker segment"));
        };
        match marker {
            // Start of frame: every SOFn but DHT (c4), JPG (c8) and DAC (cc).
            0xc0..=0xcf if !matches!(marker, 0xc4 | 0xc8 | 0xcc) => {
                let [_precision, h0, h1, w0, w1, components, ..] = *segment else {
                    return Err(corrupt("truncated in the frame header"));
                };
                header.height = u32::from(u16::from_be_bytes([h0, h1]));
                header.width = u32::from(u16::from_be_bytes([w0, w1]));
                header.components = components;
                frame = true;
            }
            0xe1 if segment.starts_with(b"Exif\0\0") => match &mut header.metadata.exif {
                Some(exif) => exif.extend_from_slice(&segment[6..]),
                None => header.metadata.exif = Some(segment.to_vec()),
            },
            0xe1 if segment.starts_with(XMP_PREFIX) => header.metadata.xmp = Some(segment[XMP_PREFIX.len()..].to_vec()),
            _ => {}
        }
        at += len.max(2);
    }
}
