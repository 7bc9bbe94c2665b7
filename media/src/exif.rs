//! The orientation `ImageOps.exif_transpose` finds, and the transposition it applies.
//!
//! Pillow's `Image.getexif` reads the EXIF block a format keeps (`info["exif"]`: a JPEG's
//! APP1 segments, a PNG's `eXIf` chunk or `exif` text, a WebP's `EXIF` chunk), or else a
//! PNG's `Raw profile type exif` text (hex after three header lines); it strips up to two
//! `Exif\0\0` prefixes and reads the TIFF structure's first directory. Only when that has no
//! Orientation tag does it search the XMP packet for `tiff:Orientation="N"` or
//! `tiff:Orientation>N`. Values 2 to 8 transpose; anything else leaves the image as it is.
//! A block that is not a TIFF structure makes Pillow raise, so it is refused here too.

use crate::Rgb8;

/// Tag 0x0112 of the first image directory.
const ORIENTATION_TAG: u16 = 0x0112;

/// What a format's container said about orientation, as Pillow's `info` keeps it.
#[derive(Debug, Default)]
pub(crate) struct Metadata {
    /// `info["exif"]`: the EXIF block, `Exif\0\0` prefix or not.
    pub(crate) exif: Option<Vec<u8>>,
    /// `info["Raw profile type exif"]`: a PNG text chunk holding the block in hex.
    pub(crate) raw_profile: Option<Vec<u8>>,
    /// The XMP packet (`info["XML:com.adobe.xmp"]`, else `info["xmp"]`).
    pub(crate) xmp: Option<Vec<u8>>,
}

/// An EXIF orientation: how to turn the stored pixels upright.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Orientation {
    /// 1 (or absent, or a value Pillow ignores): as stored.
    Upright,
    /// 2: mirrored left to right.
    FlipLeftRight,
    /// 3: rotated 180 degrees.
    Rotate180,
    /// 4: mirrored top to bottom.
    FlipTopBottom,
    /// 5: transposed (rows become columns).
    Transpose,
    /// 6: Pillow's `ROTATE_270` (a quarter turn clockwise).
    Rotate270,
    /// 7: transversed (the anti-diagonal transpose).
    Transverse,
    /// 8: Pillow's `ROTATE_90` (a quarter turn anticlockwise).
    Rotate90,
}

impl Orientation {
    /// The transposition `exif_transpose` applies for an orientation value.
    pub fn from_exif(value: u64) -> Self {
        match value {
            2 => Orientation::FlipLeftRight,
            3 => Orientation::Rotate180,
            4 => Orientation::FlipTopBottom,
            5 => Orientation::Transpose,
            6 => Orientation::Rotate270,
            7 => Orientation::Transverse,
            8 => Orientation::Rotate90,
            _ => Orientation::Upright,
        }
    }

    /// Applies the transposition (pixel moves only; it commutes with the RGB conversion).
    pub fn apply(self, image: Rgb8) -> Rgb8 {
        if self == Orientation::Upright {
            return image;
        }
        let (w, h) = (image.width as usize, image.height as usize);
        let swaps = matches!(
            self,
            Orientation::Transpose | Orientation::Rotate270 | Orientation::Transverse | Orientation::Rotate90
        );
        let (ow, oh) = if swaps { (h, w) } else { (w, h) };
        // For each output pixel, the source pixel (x, y) it takes.
        let source = |x: usize, y: usize| -> (usize, usize) {
            match self {
                Orientation::Upright => (x, y),
                Orientation::FlipLeftRight => (w - 1 - x, y),
                Orientation::Rotate180 => (w - 1 - x, h - 1 - y),
                Orientation::FlipTopBottom => (x, h - 1 - y),
                Orientation::Transpose => (y, x),
                Orientation::Rotate270 => (y, h - 1 - x),
                Orientation::Transverse => (w - 1 - y, h - 1 - x),
                Orientation::Rotate90 => (w - 1 - y, x),
            }
        };
        let mut pixels = Vec::with_capacity(image.pixels.len());
        for y in 0..oh {
            for x in 0..ow {
                let (sx, sy) = source(x, y);
                let at = (sy * w + sx) * 3;
                pixels.extend_from_slice(&image.pixels[at..at + 3]);
            }
        }
        Rgb8 { width: ow as u32, height: oh as u32, pixels }
    }
}

impl Metadata {
    /// The orientation Pillow finds, or why Pillow would fail reading the EXIF block.
    pub(crate) fn orientation(&self) -> Result<Orientation, String> {
        let exif = match (&self.exif, &self.raw_profile) {
            (Some(exif), _) => Some(exif.clone()),
            (None, Some(profile)) => Some(raw_profile_bytes(profile)?),
            (None, None) => None,
        };
        if let Some(exif) = exif
            && let Some(value) = tiff_orientation(&exif)?
        {
            return Ok(value);
        }
        Ok(self.xmp.as_deref().and_then(xmp_orientation).map_or(Orientation::Upright, Orientation::from_exif))
    }
}

/// `bytes.fromhex("".join(text.split("\n")[3:]))`.
fn raw_profile_bytes(text: &[u8]) -> Result<Vec<u8>, String> {
    let hex: Vec<u8> =
        text.split(|&b| b == b'\n').skip(3).flatten().copied().filter(|b| !b.is_ascii_whitespace()).collect();
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    hex.chunks(2)
        .map(|pair| match pair {
            [hi, lo] => Some(digit(*hi)? << 4 | digit(*lo)?),
            _ => None,
        })
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| "the png's raw exif profile is not hexadecimal".to_string())
}

/// The Orientation tag of the block's first directory: `Ok(None)` when the tag is absent (or
/// unreadable where Pillow skips it), an error where Pillow raises (not a TIFF structure).
fn tiff_orientation(block: &[u8]) -> Result<Option<Orientation>, String> {
    let mut data = block;
    for _ in 0..2 {
        data = data.strip_prefix(b"Exif\0\0").unwrap_or(data);
    }
    if data.is_empty() {
        return Ok(None);
    }
    let not_tiff = || "its exif block is not a tiff structure".to_string();
    let big_endian = match data.get(..4) {
        Some(b"MM\0*") => true,
        Some(b"II*\0") => false,
        // BigTIFF headers open; their directories are not read here (never seen in EXIF).
        Some(b"MM\0+") | Some(b"II+\0") => return Ok(None),
        _ => return Err(not_tiff()),
    };
    let u16_at = |at: usize| -> Option<u16> {
        let b = data.get(at..at + 2)?;
        Some(if big_endian { u16::from_be_bytes([b[0], b[1]]) } else { u16::from_le_bytes([b[0], b[1]]) })
    };
    let u32_at = |at: usize| -> Option<u32> {
        let b = data.get(at..at + 4)?;
        let b = [b[0], b[1], b[2], b[3]];
        Some(if big_endian { u32::from_be_bytes(b) } else { u32::from_le_bytes(b) })
    };
    let first = u32_at(4).ok_or_else(not_tiff)? as usize;
    // Pillow stops reading the directory at the first short read and keeps what it had.
    let Some(count) = u16_at(first) else { return Ok(None) };
    let mut found = None;
    for i in 0..usize::from(count) {
        let entry = first + 2 + i * 12;
        let (Some(tag), Some(kind), Some(n)) = (u16_at(entry), u16_at(entry + 2), u32_at(entry + 4)) else {
            break;
        };
        if tag != ORIENTATION_TAG {
            continue;
        }
        // Pillow skips an entry of a type it does not know, or whose data is empty or lies
        // past the end; any other entry is the tag, and a later one replaces an earlier one.
        let Some(unit) = type_size(kind) else { continue };
        let size = u64::from(n) * unit;
        let readable = size > 0
            && (size <= 4 || u32_at(entry + 8).is_some_and(|at| (at as u64).saturating_add(size) <= data.len() as u64));
        if !readable {
            continue;
        }
        // One integer names a transposition; a tuple (a count other than one) or another type
        // does not.
        let value = match (kind, n) {
            (1 | 6, 1) => data.get(entry + 8).map(|&b| u64::from(b)),
            (3 | 8, 1) => u16_at(entry + 8).map(u64::from),
            (4 | 9, 1) => u32_at(entry + 8).map(u64::from),
            _ => None,
        };
        found = Some(value.map_or(Orientation::Upright, Orientation::from_exif));
    }
    Ok(found)
}

/// The bytes per value of a TIFF field type Pillow reads (`TiffImagePlugin`'s load dispatch).
fn type_size(kind: u16) -> Option<u64> {
    match kind {
        1 | 2 | 6 | 7 => Some(1),
        3 | 8 => Some(2),
        4 | 9 | 11 | 13 => Some(4),
        5 | 10 | 12 | 16 | 17 | 18 => Some(8),
        _ => None,
    }
}

/// `re.search(r'tiff:Orientation(="|>)([0-9])', xmp)`.
fn xmp_orientation(xmp: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"tiff:Orientation";
    let mut rest = xmp;
    while let Some(at) = rest.windows(KEY.len()).position(|w| w == KEY) {
        let after = &rest[at + KEY.len()..];
        let digit = match after {
            [b'=', b'"', d, ..] | [b'>', d, ..] => Some(*d),
            _ => None,
        };
        if let Some(d) = digit.filter(u8::is_ascii_digit) {
            return Some(u64::from(d - b'0'));
        }
        rest = &rest[at + 1..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little- or big-endian TIFF block with one directory holding `entries`.
    fn tiff(big_endian: bool, entries: &[(u16, u16, u32, [u8; 4])]) -> Vec<u8> {
        let u16b = |v: u16| if big_endian { v.to_be_bytes() } else { v.to_le_bytes() };
        let u32b = |v: u32| if big_endian { v.to_be_bytes() } else { v.to_le_bytes() };
        let mut out = if big_endian { b"MM\0*".to_vec() } else { b"II*\0".to_vec() };
        out.extend(u32b(8));
        out.extend(u16b(entries.len() as u16));
        for &(tag, kind, count, value) in entries {
            out.extend(u16b(tag));
            out.extend(u16b(kind));
            out.extend(u32b(count));
            out.extend(value);
        }
        out.extend(u32b(0));
        out
    }

    fn short(v: u16, big_endian: bool) -> [u8; 4] {
        let b = if big_endian { v.to_be_bytes() } else { v.to_le_bytes() };
        [b[0], b[1], 0, 0]
    }

    fn check(metadata: Metadata, expect: Result<Orientation, &str>) {
        assert_eq!(metadata.orientation(), expect.map_err(str::to_string));
    }

    #[test]
    fn the_orientation_is_found_where_pillow_looks() {
        for big_endian in [true, false] {
            let block = tiff(big_endian, &[(0x010f, 2, 4, *b"Cam\0"), (0x0112, 3, 1, short(6, big_endian))]);
            let prefixed = [b"Exif\0\0".as_slice(), &block].concat();
            check(Metadata { exif: Some(block.clone()), ..Default::default() }, Ok(Orientation::Rotate270));
            check(Metadata { exif: Some(prefixed), ..Default::default() }, Ok(Orientation::Rotate270));
        }
        // The XMP packet counts only when the EXIF block has no orientation.
        let xmp = Some(br#"<x:xmpmeta><rdf:Description tiff:Orientation="3"/></x:xmpmeta>"#.to_vec());
        let upright = tiff(false, &[(0x0112, 3, 1, short(1, false))]);
        check(Metadata { exif: Some(upright), xmp: xmp.clone(), ..Default::default() }, Ok(Orientation::Upright));
        let none = tiff(false, &[(0x010f, 2, 4, *b"Cam\0")]);
        check(Metadata { exif: Some(none), xmp: xmp.clone(), ..Default::default() }, Ok(Orientation::Rotate180));
        check(Metadata { xmp: Some(b"<tiff:Orientation>8</tiff:Orientation>".to_vec()), ..Default::default() }, {
            Ok(Orientation::Rotate90)
        });
        // A PNG's hex profile: three header lines, then the block in hex.
        let block = tiff(true, &[(0x0112, 3, 1, short(2, true))]);
        let hex: String = block.iter().map(|b| format!("{b:02x}")).collect();
        let profile = format!("\nexif\n{:8}\n{}\n{}\n", block.len(), &hex[..20], &hex[20..]);
        check(
            Metadata { raw_profile: Some(profile.into_bytes()), ..Default::default() },
            Ok(Orientation::FlipLeftRight),
        );
        // Values Pillow has no transposition for, and a count of two, leave the image alone.
        for entry in [(0x0112, 3, 1, short(9, false)), (0x0112, 3, 2, [6, 0, 6, 0]), (0x0112, 2, 2, *b"6\0\0\0")] {
            check(Metadata { exif: Some(tiff(false, &[entry])), ..Default::default() }, Ok(Orientation::Upright));
        }
        check(Metadata { exif: Some(b"Exif\0\0".to_vec()), ..Default::default() }, Ok(Orientation::Upright));
        check(
            Metadata { exif: Some(b"JUNKJUNK".to_vec()), ..Default::default() },
            Err("its exif block is not a tiff structure"),
        );
        // A directory cut short keeps what was read before the cut.
        let mut cut = tiff(false, &[(0x0112, 3, 1, short(8, false)), (0x010f, 2, 4, *b"Cam\0")]);
        cut.truncate(8 + 2 + 12 + 5);
        check(Metadata { exif: Some(cut), ..Default::default() }, Ok(Orientation::Rotate90));
    }

    #[test]
    fn each_transposition_moves_pixels_as_pillow_does() {
        // 3x2, pixel value = 10 * y + x in every channel.
        let image = Rgb8::new(3, 2, [0u8, 1, 2, 10, 11, 12].iter().flat_map(|&v| [v; 3]).collect()).expect("rgb");
        let grey = |o: Orientation| {
            let out = o.apply(image.clone());
            (out.width, out.height, out.pixels.chunks(3).map(|p| p[0]).collect::<Vec<_>>())
        };
        assert_eq!(grey(Orientation::Upright), (3, 2, vec![0, 1, 2, 10, 11, 12]));
        assert_eq!(grey(Orientation::FlipLeftRight), (3, 2, vec![2, 1, 0, 12, 11, 10]));
        assert_eq!(grey(Orientation::Rotate180), (3, 2, vec![12, 11, 10, 2, 1, 0]));
        assert_eq!(grey(Orientation::FlipTopBottom), (3, 2, vec![10, 11, 12, 0, 1, 2]));
        assert_eq!(grey(Orientation::Transpose), (2, 3, vec![0, 10, 1, 11, 2, 12]));
        assert_eq!(grey(Orientation::Rotate270), (2, 3, vec![10, 0, 11, 1, 12, 2]));
        assert_eq!(grey(Orientation::Transverse), (2, 3, vec![12, 2, 11, 1, 10, 0]));
        assert_eq!(grey(Orientation::Rotate90), (2, 3, vec![2, 12, 1, 11, 0, 10]));
    }
}
