//! Every file of `tests/fixtures/images` (made by `tools/oracle/gen_images.py`) against the RGB
//! transformers' `load_image` gave for it: max-abs-diff 0, and each refused file refused with
//! the error its case names.

use std::collections::BTreeMap;
use std::path::PathBuf;

use mlxcel_media::{Error, Format, decode_limited};

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/images")
}

struct Case {
    name: String,
    file: String,
    expect: Expect,
}

enum Expect {
    Rgb { width: u32, height: u32, rgb: String },
    Refused(String),
}

fn cases() -> (u64, Vec<Case>) {
    let text = std::fs::read_to_string(corpus().join("cases.json")).expect("read cases.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("cases.json");
    let max_pixels = json["max_pixels"].as_u64().expect("max_pixels");
    let cases = json["cases"]
        .as_object()
        .expect("cases")
        .iter()
        .map(|(name, case)| {
            let field = |k: &str| case[k].as_str().map(str::to_owned);
            let expect = match field("refused") {
                Some(refusal) => Expect::Refused(refusal),
                None => Expect::Rgb {
                    width: case["width"].as_u64().expect("width") as u32,
                    height: case["height"].as_u64().expect("height") as u32,
                    rgb: field("rgb").expect("rgb"),
                },
            };
            Case { name: name.clone(), file: field("file").expect("file"), expect }
        })
        .collect();
    (max_pixels, cases)
}

/// The refusal kind a case names, for an error.
fn kind(error: &Error) -> &'static str {
    match error {
        Error::Unrecognized => "unrecognized",
        Error::NotBuilt { .. } => "not_built",
        Error::Empty { .. } => "empty",
        Error::TooManyPixels { .. } => "too_many_pixels",
        Error::Unsupported { .. } => "unsupported",
        Error::Corrupt { .. } => "corrupt",
    }
}

#[test]
fn every_corpus_file_decodes_to_the_references_pixels_or_is_refused_as_named() {
    let (max_pixels, cases) = cases();
    assert!(cases.len() > 60, "the corpus has {} cases", cases.len());
    let mut worst: BTreeMap<String, (usize, u8)> = BTreeMap::new();
    let mut failures = Vec::new();
    for case in &cases {
        let bytes = std::fs::read(corpus().join(&case.file)).expect("read case");
        let decoded = decode_limited(&bytes, max_pixels);
        match (&case.expect, decoded) {
            (Expect::Rgb { width, height, rgb }, Ok(image)) => {
                let want = std::fs::read(corpus().join(rgb)).expect("read rgb");
                if (image.width(), image.height()) != (*width, *height) {
                    failures.push(format!(
                        "{}: {}x{}, want {width}x{height}",
                        case.name,
                        image.width(),
                        image.height()
                    ));
                    continue;
                }
                let diff = image.pixels().iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap_or(0);
                let differing = image.pixels().iter().zip(&want).filter(|(a, b)| a != b).count();
                if diff != 0 {
                    failures.push(format!("{}: {differing} bytes differ, max-abs-diff {diff}", case.name));
                }
                let format = case.name.split('_').next().unwrap_or("?").to_owned();
                let entry = worst.entry(format).or_default();
                *entry = (entry.0 + 1, entry.1.max(diff));
            }
            (Expect::Rgb { .. }, Err(e)) => failures.push(format!("{}: refused: {e}", case.name)),
            (Expect::Refused(want), Ok(_)) => failures.push(format!("{}: decoded, want refused ({want})", case.name)),
            (Expect::Refused(want), Err(e)) => {
                if kind(&e) != want {
                    failures.push(format!("{}: refused as {} ({e}), want {want}", case.name, kind(&e)));
                }
            }
        }
    }
    for (format, (count, diff)) in &worst {
        println!("{format}: {count} files, max-abs-diff {diff}");
    }
    assert!(failures.is_empty(), "{} of {} cases:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn refusals_name_the_problem() {
    let read = |name: &str| std::fs::read(corpus().join(name)).expect("read case");
    let message = |name: &str| decode_limited(&read(name), 89_478_485).expect_err(name).to_string();
    assert_eq!(
        message("refused_jpeg_cmyk.jpg"),
        "unsupported jpeg image: cmyk colour (4 channels); send an rgb or greyscale jpeg"
    );
    assert_eq!(message("refused_webp_animated.webp"), "unsupported webp image: animated; send a still image");
    assert_eq!(message("refused_apng.png"), "unsupported png image: animated (apng, 2 frames); send a still image");
    assert_eq!(message("refused_bmp.bmp"), "not an image in a format this server decodes (png, jpeg, webp, gif)");
    assert_eq!(
        message("refused_jpeg_bomb.jpg"),
        "the jpeg image is 50000x50000 (2500000000 pixels), over the limit of 89478485 pixels"
    );
    assert!(message("refused_jpeg_truncated.jpg").starts_with("cannot decode the jpeg: "));
    assert!(message("refused_webp_truncated.webp").starts_with("cannot decode the webp: "));
    assert!(message("refused_gif_truncated.gif").starts_with("cannot decode the gif: "));
    assert!(message("refused_png_truncated.png").starts_with("cannot decode the png: "));
    // Every bomb is a small file, refused from its header.
    for bomb in ["refused_png_bomb.png", "refused_jpeg_bomb.jpg", "refused_webp_bomb.webp", "refused_gif_bomb.gif"] {
        assert!(read(bomb).len() < 1024, "{bomb}");
        let (format, w, h) = mlxcel_media::dimensions(&read(bomb)).expect(bomb);
        assert_eq!((w, h), (50_000, 50_000), "{bomb}: {format}");
    }
    assert_eq!(Format::sniff(&read("refused_gif_bomb.gif")), Some(Format::Gif));
}

/// Every prefix of every decodable file is refused, or (for a cut that only drops trailing
/// chunks Pillow does not need) decodes to the whole file's pixels; none panics.
#[test]
fn truncated_files_are_refused_never_misread() {
    let (max_pixels, cases) = cases();
    // A PNG cut before an eXIf chunk that follows the image data decodes, unrotated, as Pillow
    // would load that shorter file.
    let whole_needed = |c: &&Case| matches!(c.expect, Expect::Rgb { .. }) && !c.name.contains("after_idat");
    for case in cases.iter().filter(whole_needed) {
        let bytes = std::fs::read(corpus().join(&case.file)).expect("read case");
        let whole = decode_limited(&bytes, max_pixels).ok();
        let step = (bytes.len() / 40).max(1);
        for cut in (0..bytes.len()).step_by(step) {
            if let Ok(image) = decode_limited(&bytes[..cut], max_pixels) {
                assert_eq!(Some(image), whole, "{} cut at {cut} of {}", case.name, bytes.len());
            }
        }
    }
}
