//! Encoded images as the host decodes them (`mlxcel-media` with every format it builds: PNG,
//! JPEG, WebP, GIF): `dimensions` from the header alone, then `decode_limited` under a pixel cap.
//! A decoded image must have the size its header declared (transposed by an EXIF rotation),
//! within the cap, and a cap one pixel short must refuse it before decoding.

#![no_main]

use mlxcel_media::{Error, decode_limited, dimensions};

/// The cap (the host's default, `MAX_INPUT_PIXELS`, is 89_478_485): the check is the same
/// code, and a smaller cap keeps an execution that allocates the declared image fast.
const MAX_PIXELS: u64 = 1 << 22;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let declared = dimensions(data);
    let decoded = decode_limited(data, MAX_PIXELS);
    let (format, width, height) = match declared {
        Ok(d) => d,
        Err(e) => {
            assert_eq!(decoded, Err(e), "decode_limited refused what dimensions refused, alike");
            return;
        }
    };
    let pixels = u64::from(width) * u64::from(height);
    if let Ok(image) = &decoded {
        let size = (image.width(), image.height());
        assert!(
            size == (width, height) || size == (height, width),
            "{format}: declared {width}x{height}, got {size:?}"
        );
        assert!(pixels <= MAX_PIXELS);
        assert_eq!(image.pixels().len() as u64, pixels * 3);
    }
    if pixels <= MAX_PIXELS {
        assert!(matches!(decode_limited(data, pixels - 1), Err(Error::TooManyPixels { .. })));
    } else {
        assert!(matches!(decoded, Err(Error::TooManyPixels { .. })));
    }
});
