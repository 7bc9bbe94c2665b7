//! PNG decoding under a pixel limit: the declared size is checked from the header before
//! anything is decoded, and hostile or truncated input is refused without a panic.

use mlxcel_family_common::{Image, ImageError, png_dimensions};

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
    let image = Image::decode_limited(&png, 15).expect("exactly at the limit");
    assert_eq!((image.width(), image.height()), (5, 3));
    assert_eq!(image.pixels(), pixels.as_slice());
    assert_eq!(Image::decode(&png), Ok(image.clone()));
    assert_eq!(Image::decode_limited(&png, 1 << 20), Ok(image));

    let refused = Image::decode_limited(&png, 14).expect_err("over the limit");
    assert_eq!(refused, ImageError::TooManyPixels { width: 5, height: 3, pixels: 15, limit: 14 });
    assert_eq!(refused.to_string(), "the image is 5x3 (15 pixels), over the limit of 14 pixels");
}

#[test]
fn a_huge_declared_size_is_refused_from_the_header_alone() {
    let mut bytes = header(100_000, 100_000);
    bytes.extend((0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8));
    assert_eq!(png_dimensions(&bytes), Ok((100_000, 100_000)));
    let limit = 4096 * 4096;
    assert_eq!(
        Image::decode_limited(&bytes, limit),
        Err(ImageError::TooManyPixels { width: 100_000, height: 100_000, pixels: 10_000_000_000, limit })
    );
    // The product cannot overflow: the largest declarable size still compares.
    let max = header(u32::MAX, u32::MAX);
    let pixels = u64::from(u32::MAX).pow(2);
    assert_eq!(
        Image::decode_limited(&max, pixels - 1),
        Err(ImageError::TooManyPixels { width: u32::MAX, height: u32::MAX, pixels, limit: pixels - 1 })
    );
}

#[test]
fn truncated_input_is_an_error_never_a_panic() {
    let (_, png) = small_rgb();
    // The image data ends 12 bytes (the IEND chunk) plus 4 (the IDAT CRC) before the end.
    let image_data_end = png.len() - 16;
    for cut in 0..png.len() {
        let prefix = &png[..cut];
        for result in [Image::decode(prefix), Image::decode_limited(prefix, 15)] {
            if cut < image_data_end {
                assert!(matches!(result, Err(ImageError::Png(_) | ImageError::Format)), "cut {cut}: {result:?}");
            } else if let Ok(image) = result {
                // Once every pixel is there the image may decode; never to something else.
                assert_eq!(Some(image), Image::decode(&png).ok(), "cut {cut}");
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
    assert_eq!(png_dimensions(b"GIF89a\x01\0\x01\0"), Err(ImageError::Format));
    assert_eq!(Image::decode_limited(b"GIF89a", 100), Err(ImageError::Format));
    assert_eq!(png_dimensions(b""), Err(ImageError::Png("truncated in the signature".into())));
    assert_eq!(png_dimensions(b"\x89PN"), Err(ImageError::Png("truncated in the signature".into())));
    let mut not_ihdr = header(4, 4);
    not_ihdr[12..16].copy_from_slice(b"IDAT");
    assert_eq!(png_dimensions(&not_ihdr), Err(ImageError::Png("the first chunk is not a 13-byte ihdr".into())));
    assert_eq!(png_dimensions(&header(0, 7)), Err(ImageError::Empty { width: 0, height: 7 }));
    assert_eq!(Image::decode_limited(&header(7, 0), 100), Err(ImageError::Empty { width: 7, height: 0 }));
}

#[test]
fn the_decoder_budget_fits_small_images_with_palettes_wide_samples_and_metadata() {
    // A one-pixel indexed image with a full 256-entry palette: the palette alone is far
    // larger than the pixel.
    let palette: Vec<u8> = (0..=255u8).flat_map(|i| [i, 255 - i, i / 2]).collect();
    let indexed = encode_with(1, 1, png::ColorType::Indexed, png::BitDepth::Eight, &[200], |e| {
        e.set_palette(palette.clone());
    });
    let image = Image::decode_limited(&indexed, 1).expect("indexed");
    assert_eq!(image.pixels(), &palette[600..603]);

    // 16-bit RGBA is stripped to 8 bits and the alpha dropped.
    let wide: Vec<u8> = [0x12u8, 0x34, 0xab, 0xcd, 0xff, 0x00, 0x80, 0x00].repeat(2);
    let rgba16 = encode(2, 1, png::ColorType::Rgba, png::BitDepth::Sixteen, &wide);
    assert_eq!(Image::decode_limited(&rgba16, 2).expect("rgba16").pixels(), &[0x12, 0xab, 0xff, 0x12, 0xab, 0xff]);

    // Text chunks much larger than the image are skipped, not buffered.
    let text = "x".repeat(4 << 20);
    let annotated = encode_with(1, 1, png::ColorType::Grayscale, png::BitDepth::Eight, &[77], |e| {
        e.add_text_chunk("Comment".into(), text.clone()).expect("text chunk");
    });
    assert_eq!(Image::decode_limited(&annotated, 1).expect("annotated").pixels(), &[77, 77, 77]);
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
    assert_eq!(Image::decode_limited(&tiny, 1), Err(ImageError::Png("limits are exceeded".into())));
    assert_eq!(Image::decode(&tiny), Err(ImageError::Png("limits are exceeded".into())));
    // The same chunk fits the budget of a 1024x1024 image.
    let large = grey_with_exif(1024, 1024, 2 << 20);
    let image = Image::decode_limited(&large, 1 << 20).expect("large");
    assert!(image.pixels().iter().all(|&v| v == 9));
}
