//! Decoding under a pixel limit: the declared size is checked from the header before anything
//! is decoded, in every format, and hostile or truncated input is refused without a panic.

use mlxcel_media::{Error, Format, decode, decode_limited, dimensions};

fn png_error(reason: &str) -> Error {
    Error::Corrupt { format: Format::Png, reason: reason.into() }
}

fn png_dimensions(bytes: &[u8]) -> Result<(u32, u32), Error> {
    dimensions(bytes).map(|(_, w, h)| (w, h))
}

/// Encodes `data` as a PNG with the png crate.
fn encode(width: u32, height: u32, color: png::ColorType, depth: png::BitDepth, data: &[u8]) -> Vec<u8> {
    encode_with(width, height, color, depth, data, |_| {})
}

fn encode_with(
    width: u32,
    height: u32,
    color: png::ColorType,
    depth: png::BitDepth,
    data: &[u8],
    configure: impl FnOnce(&mut png::Encoder<'_, &mut Vec<u8>>),
) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(color);
    encoder.set_depth(depth);
    configure(&mut encoder);
    let mut writer = encoder.write_header().expect("png header");
    writer.write_image_data(data).expect("png data");
    writer.finish().expect("png end");
    out
}

/// A 5x3 RGB gradient and its PNG encoding.
fn small_rgb() -> (Vec<u8>, Vec<u8>) {
    let pixels: Vec<u8> = (0..15u8).flat_map(|i| [i * 17, 255 - i * 13, i * 7 + 3]).collect();
    let png = encode(5, 3, png::ColorType::Rgb, png::BitDepth::Eight, &pixels);
    (pixels, png)
}

/// A signature and an IHDR chunk declaring `width x height` 8-bit RGB (the CRC is not
/// computed: the header is refused or read before the decoder checks it).
fn header(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    bytes.extend_from_slice(&width.to_be_bytes());
    bytes.extend_from_slice(&height.to_be_bytes());
    bytes.extend_from_slice(&[8, 2, 0, 0, 0]);
    bytes.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    bytes
}

#[test]
fn a_small_png_within_the_limit_decodes_and_one_over_it_is_refused() {
    let (pixels, png) = small_rgb();
    assert_eq!(png_dimensions(&png), Ok((5, 3)));
    let image = decode_limited(&png, 15).expect("exactly at the limit");
    assert_eq!((image.width(), image.height()), (5, 3));
    assert_eq!(image.pixels(), pixels.as_slice());
    assert_eq!(decode(&png), Ok(image.clone()));
    assert_eq!(decode_limited(&png, 1 << 20), Ok(image));

    let refused = decode_limited(&png, 14).expect_err("over the limit");
    assert_eq!(refused, Error::TooManyPixels { format: Format::Png, width: 5, height: 3, pixels: 15, limit: 14 });
    assert_eq!(refused.to_string(), "the png image is 5x3 (15 pixels), over the limit of 14 pixels");
}

#[test]
fn a_huge_declared_size_is_refused_from_the_header_alone() {
    let mut bytes = header(100_000, 100_000);
    bytes.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8));
    assert_eq!(png_dimensions(&bytes), Ok((100_000, 100_000)));
    let limit = 4096 * 4096;
    assert_eq!(
        decode_limited(&bytes, limit),
        Err(Error::TooManyPixels {
            format: Format::Png,
            width: 100_000,
            height: 100_000,
            pixels: 10_000_000_000,
            limit
        })
    );
    // The product cannot overflow: the largest declarable size still compares.
    let max = header(u32::MAX, u32::MAX);
    let pixels = u64::from(u32::MAX).pow(2);
    assert_eq!(
        decode_limited(&max, pixels - 1),
        Err(Error::TooManyPixels { format: Format::Png, width: u32::MAX, height: u32::MAX, pixels, limit: pixels - 1 })
    );
}

#[test]
fn truncated_input_is_an_error_never_a_panic() {
    let (_, png) = small_rgb();
    // The image data ends 12 bytes (the IEND chunk) plus 4 (the IDAT CRC) before the end.
    let image_data_end = png.len() - 16;
    for cut in 0..png.len() {
        let prefix = &png[..cut];
        for result in [decode(prefix), decode_limited(prefix, 15)] {
            if cut < image_data_end {
                assert!(
                    matches!(result, Err(Error::Corrupt { format: Format::Png, .. } | Error::Unrecognized)),
                    "cut {cut}: {result:?}"
                );
            } else if let Ok(image) = result {
                // Once every pixel is there the image may decode; never to something else.
                assert_eq!(Some(image), decode(&png).ok(), "cut {cut}");
            }
        }
        if cut < 33 {
            assert!(png_dimensions(prefix).is_err(), "cut {cut}");
        } else {
            assert_eq!(png_dimensions(prefix), Ok((5, 3)), "cut {cut}");
        }
    }
}

#[test]
fn headers_that_are_not_png_or_malformed_are_named() {
    assert_eq!(png_dimensions(b"RIFF\0\0\0\0WAVE"), Err(Error::Unrecognized));
    assert_eq!(decode_limited(b"BM", 100), Err(Error::Unrecognized));
    assert_eq!(png_dimensions(b""), Err(Error::Unrecognized));
    assert_eq!(png_dimensions(b"\x89PN"), Err(Error::Unrecognized));
    assert_eq!(png_dimensions(b"\x89PNG\r\n\x1a\n\0"), Err(png_error("truncated in the ihdr chunk")));
    let mut not_ihdr = header(4, 4);
    not_ihdr[12..16].copy_from_slice(b"IDAT");
    assert_eq!(png_dimensions(&not_ihdr), Err(png_error("the first chunk is not a 13-byte ihdr")));
    assert_eq!(png_dimensions(&header(0, 7)), Err(Error::Empty { format: Format::Png, width: 0, height: 7 }));
    assert_eq!(decode_limited(&header(7, 0), 100), Err(Error::Empty { format: Format::Png, width: 7, height: 0 }));
}

#[test]
fn the_decoder_budget_fits_small_images_with_palettes_wide_samples_and_metadata() {
    // A one-pixel indexed image with a full 256-entry palette: the palette alone is far
    // larger than the pixel.
    let palette: Vec<u8> = (0..=255u8).flat_map(|i| [i, 255 - i, i / 2]).collect();
    let indexed = encode_with(1, 1, png::ColorType::Indexed, png::BitDepth::Eight, &[200], |e| {
        e.set_palette(palette.clone());
    });
    let image = decode_limited(&indexed, 1).expect("indexed");
    assert_eq!(image.pixels(), &palette[600..603]);

    // 16-bit RGBA keeps the high bytes and drops the alpha.
    let wide: Vec<u8> = [0x12u8, 0x34, 0xab, 0xcd, 0xff, 0x00, 0x80, 0x00].repeat(2);
    let rgba16 = encode(2, 1, png::ColorType::Rgba, png::BitDepth::Sixteen, &wide);
    assert_eq!(decode_limited(&rgba16, 2).expect("rgba16").pixels(), &[0x12, 0xab, 0xff, 0x12, 0xab, 0xff]);

    // Text chunks much larger than the image are skipped, not buffered.
    let text = "x".repeat(4 << 20);
    let annotated = encode_with(1, 1, png::ColorType::Grayscale, png::BitDepth::Eight, &[77], |e| {
        e.add_text_chunk("Comment".into(), text.clone()).expect("text chunk");
    });
    assert_eq!(decode_limited(&annotated, 1).expect("annotated").pixels(), &[77, 77, 77]);
}

/// A `width x height` grey PNG with an `eXIf` chunk of `exif_len` bytes before the data.
fn grey_with_exif(width: u32, height: u32, exif_len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Grayscale);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().expect("png header");
    let mut exif = b"MM\0\x2a".to_vec();
    exif.resize(exif_len, 0);
    writer.write_chunk(png::chunk::eXIf, &exif).expect("exif chunk");
    writer.write_image_data(&vec![9; width as usize * height as usize]).expect("png data");
    writer.finish().expect("png end");
    out
}

#[test]
fn the_decoder_may_not_buffer_metadata_beyond_what_the_image_needs() {
    // 2 MiB of eXIf is over a one-pixel image's budget (its frame plus the metadata allowance).
    let tiny = grey_with_exif(1, 1, 2 << 20);
    assert_eq!(decode_limited(&tiny, 1), Err(png_error("limits are exceeded")));
    assert_eq!(decode(&tiny), Err(png_error("limits are exceeded")));
    // The same chunk fits the budget of a 1024x1024 image.
    let large = grey_with_exif(1024, 1024, 2 << 20);
    let image = decode_limited(&large, 1 << 20).expect("large");
    assert!(image.pixels().iter().all(|&v| v == 9));
}

/// The smallest header of each format declaring `width x height`, and nothing after it.
fn headers(width: u16, height: u16) -> Vec<(Format, Vec<u8>)> {
    let (w, h) = (width.to_be_bytes(), height.to_be_bytes());
    let jpeg = [&[0xff, 0xd8, 0xff, 0xc0, 0, 17, 8][..], &h, &w, &[3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1, 0xff, 0xda]]
        .concat();
    let (w1, h1) = (u32::from(width) - 1, u32::from(height) - 1);
    let vp8x = [&b"VP8X\x0a\0\0\0\0\0\0\0"[..], &w1.to_le_bytes()[..3], &h1.to_le_bytes()[..3]].concat();
    let webp = [&b"RIFF"[..], &(4 + vp8x.len() as u32).to_le_bytes(), b"WEBP", &vp8x].concat();
    let bits = (w1 & 0x3fff) | (h1 & 0x3fff) << 14;
    let vp8l = [&b"RIFF\0\0\0\0WEBPVP8L\x05\0\0\0\x2f"[..], &bits.to_le_bytes()].concat();
    let vp8 = [&b"RIFF\0\0\0\0WEBPVP8 \x0a\0\0\0\0\0\0\x9d\x01\x2a"[..], &width.to_le_bytes(), &height.to_le_bytes()]
        .concat();
    let gif =
        [&b"GIF89a"[..], &width.to_le_bytes(), &height.to_le_bytes(), &[0, 0, 0], b",\0\0\0\0\x01\0\x01\0\0"].concat();
    let png = header(u32::from(width), u32::from(height));
    vec![
        (Format::Png, png),
        (Format::Jpeg, jpeg),
        (Format::WebP, webp),
        (Format::WebP, vp8l),
        (Format::WebP, vp8),
        (Format::Gif, gif),
    ]
}

#[test]
fn every_format_is_refused_from_its_header_before_decoding() {
    for (format, bytes) in headers(16_000, 15_000) {
        assert!(bytes.len() < 64, "{format}: {} bytes", bytes.len());
        assert_eq!(dimensions(&bytes), Ok((format, 16_000, 15_000)), "{format}");
        let limit = 89_478_485;
        let refused = decode_limited(&bytes, limit).expect_err("over the limit");
        assert_eq!(refused, Error::TooManyPixels { format, width: 16_000, height: 15_000, pixels: 240_000_000, limit });
        // Within the limit the same header goes to the decoder, which finds no image data.
        let corrupt = decode_limited(&bytes, u64::MAX).expect_err("no image data");
        assert!(matches!(corrupt, Error::Corrupt { format: f, .. } if f == format), "{format}: {corrupt}");
    }
}

#[test]
fn a_gif_canvas_grows_to_hold_a_frame_past_the_screen() {
    // A 1x1 screen whose first frame sits at (30000, 0) and is 30000 wide: Pillow's canvas
    // is 60000x1, and that is what the limit sees.
    let gif =
        [&b"GIF89a\x01\0\x01\0\0\0\0,"[..], &30_000u16.to_le_bytes(), &[0, 0], &30_000u16.to_le_bytes(), &[1, 0, 0]]
            .concat();
    assert_eq!(dimensions(&gif), Ok((Format::Gif, 60_000, 1)));
    assert!(matches!(decode_limited(&gif, 59_999), Err(Error::TooManyPixels { pixels: 60_000, .. })));
}
