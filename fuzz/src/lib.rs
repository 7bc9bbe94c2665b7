//! What the fuzz targets share: one input split into the files a parser reads, a scratch
//! directory for the parsers that take paths, and the families driven as the plugin ABI's
//! entries drive them (`plugin-api/src/guest.rs`).
//!
//! The host's text module and the shim's checkpoint parser are compiled here from their own
//! source files (`#[path]`), not through their crates: `mlxcel-host` and `mlxcel-shim` link the
//! IREE runtime, a C build that has no place under a sanitizer, while these files use nothing
//! of it. The code fuzzed is the code shipped, line for line.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use mlxcel_plugin_api::{FamilyPlugin, MediaItem, Modality, PreprocessOptions};

/// `host/src/text`: `tokenizer.json`, chat templates, stop tokens.
#[path = "../../host/src/text/mod.rs"]
#[allow(dead_code, unreachable_pub, clippy::all)]
pub mod text;

/// `shim/src/checkpoint.rs`: safetensors headers and `model.safetensors.index.json`. It names
/// `crate::error` and `crate::tensor`, so those two files sit at this crate's root as in the shim.
#[path = "../../shim/src/checkpoint.rs"]
#[allow(dead_code, unreachable_pub, clippy::all)]
pub mod checkpoint;
#[path = "../../shim/src/error.rs"]
#[allow(dead_code, unreachable_pub, clippy::all)]
mod error;
#[path = "../../shim/src/tensor.rs"]
#[allow(dead_code, unreachable_pub, clippy::all)]
mod tensor;

/// `host/src/serve/api.rs` and `host/src/serve/request.rs`: the chat request's wire format and
/// the checks that need no server state (`request.rs` names `super::api` and `super::text`,
/// which sit at this crate's root as in the host's `serve` module).
#[path = "../../host/src/serve/api.rs"]
#[allow(dead_code, unreachable_pub, clippy::all)]
mod api;
#[path = "../../host/src/serve/request.rs"]
#[allow(dead_code, unreachable_pub, clippy::all)]
mod request;

/// The vocabulary the chat-request target checks `logit_bias` keys against (Qwen2-VL's).
const VOCAB: usize = 151_936;

/// A chat-completions request body as the server reads it: the wire format (unknown fields
/// refused), then the generation fields and the messages (data URLs decoded). What the checks
/// accept must hold what they promise: at most the stop strings and top logprobs allowed, biased
/// tokens inside the vocabulary, and one media source per image and audio part, in order.
pub fn chat_request(data: &[u8]) {
    if let Ok(completion) = serde_json::from_slice::<api::CompletionRequest>(data) {
        let _ = completion.into_parts();
    }
    let Ok(chat) = serde_json::from_slice::<api::ChatRequest>(data) else { return };
    if let Ok(fields) = request::fields(&chat, VOCAB) {
        assert!(fields.stop_strings.len() <= request::MAX_STOP_STRINGS);
        assert!(fields.top_logprobs.is_none_or(|n| n <= request::MAX_TOP_LOGPROBS as usize));
        assert!(fields.logit_bias.iter().all(|&(token, _)| (token as usize) < VOCAB));
        assert_eq!(fields.top_logprobs.is_some(), chat.logprobs);
    }
    let parts: Vec<&'static str> = chat
        .messages
        .iter()
        .filter_map(|m| match &m.content {
            Some(api::MessageContent::Parts(parts)) => Some(parts),
            _ => None,
        })
        .flatten()
        .filter_map(|p| match p {
            api::ContentPart::Text { .. } => None,
            api::ContentPart::ImageUrl { .. } => Some("image"),
            api::ContentPart::InputAudio { .. } => Some("audio"),
        })
        .collect();
    for remote in [false, true] {
        let Ok(wire) = serde_json::from_slice::<api::ChatRequest>(data) else { return };
        if let Ok((messages, media)) = request::messages(wire.messages, remote) {
            assert_eq!(messages.len(), chat.messages.len());
            let kinds: Vec<&str> = media
                .iter()
                .map(|m| if m.modality == mlxcel_plugin_api::Modality::Audio { "audio" } else { "image" })
                .collect();
            assert_eq!(kinds, parts, "one media source per part, in order");
            assert!(remote || media.iter().all(|m| matches!(m.source, request::ImageSource::Inline(_))));
        }
    }
}

/// The parts of `data` between NUL bytes, at most `n` (the last keeps any further NULs). JSON,
/// TOML and Jinja text never hold a raw NUL, so a seed is its files joined by one.
pub fn parts(data: &[u8], n: usize) -> Vec<&[u8]> {
    data.splitn(n, |&b| b == 0).collect()
}

/// As [`parts`], each as text; `None` when one is not UTF-8 (the host reads these files with
/// `read_to_string`, which refuses such bytes before any parser sees them).
pub fn text_parts(data: &[u8], n: usize) -> Option<Vec<&str>> {
    parts(data, n).into_iter().map(|p| std::str::from_utf8(p).ok()).collect()
}

/// A directory of this process's own for the parsers that read files by path.
pub fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("mlxcel-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("invariant: the temporary directory is writable");
        dir
    })
}

/// Writes `bytes` to `dir/name`, or removes the file when `bytes` is `None`.
pub fn put(dir: &Path, name: &str, bytes: Option<&[u8]>) {
    let path = dir.join(name);
    match bytes {
        Some(bytes) => std::fs::write(&path, bytes).expect("invariant: the scratch directory is writable"),
        None => {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// A file of the repository's test fixtures (`tests/fixtures/<name>`).
pub fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read the fixture {}: {e}", path.display()))
}

/// `config.json`, NUL, the processor config: parsed as `parse_config` does, the typed config
/// through JSON and back as it crosses the ABI, then the entries the host calls on every
/// checkpoint before any media (the decoder spec, held to `validate` as the ABI does and used
/// to read the text config as the host does, and the encoder buckets).
pub fn family_config<P: FamilyPlugin>(data: &[u8]) {
    let Some(files) = text_parts(data, 2) else { return };
    let (config_json, processor_json) = (files[0], files.get(1).copied().unwrap_or_default());
    let Ok(parsed) = P::parse_config(config_json, processor_json) else { return };
    let json = serde_json::to_string(&parsed.config).expect("a parsed config serializes");
    let config: P::Config =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("a parsed config does not read back ({e}): {json}"));
    if let Ok(Some(spec)) = P::decoder_spec(&config)
        && spec.validate().is_ok()
    {
        let _ = mlxcel_decoder::TextConfig::parse_with(config_json, Some(&spec));
    }
    let _ = P::encoder_buckets(&config, Modality::Image);
}

/// The family's typed config from its fixture's `config.json` and processor config.
pub fn fixture_config<P: FamilyPlugin>(dir: &str, processor: &str) -> P::Config {
    // A fixture without a processor config (an empty name) is read as the host reads such a
    // checkpoint: with an empty one.
    let processor = if processor.is_empty() { String::new() } else { fixture(&format!("{dir}/{processor}")) };
    let parsed = P::parse_config(&fixture(&format!("{dir}/config.json")), &processor);
    parsed.unwrap_or_else(|e| panic!("the {dir} fixture's config does not parse: {e:?}")).config
}

/// Largest decoded image the preprocessing targets build (width and height are each below 1024).
const MAX_RGB_PIXELS: u32 = 1 << 18;

/// One media item through `preprocess` with the fixture's config. The input is a mode byte, two
/// little-endian `u32` bounds and a payload. Mode bit 0 clear: the payload is an encoded image
/// handed to the plugin as bytes (what the host does with a format it does not decode); set:
/// decoded RGB as the host hands it, the payload's first four bytes a width and a height
/// (`u16`, each taken modulo 1024, at least 1) and the rest the pixels, repeated to fill them.
/// Bits 1 and 2 pass the bounds as `max_pixels` and `min_pixels`. Every tensor returned must
/// hold the bytes its shape declares (the ABI's own check).
/// One audio clip through `preprocess` with the fixture's config: two little-endian `u16`
/// bytes of a clip limit in tenths of a second (0: none), then the encoded clip (WAV as a
/// client sends it).
pub fn family_audio<P: FamilyPlugin>(config: &P::Config, data: &[u8]) {
    let [l0, l1, payload @ ..] = data else { return };
    let limit = u64::from(u16::from_le_bytes([*l0, *l1])) * 100;
    let options = PreprocessOptions { max_audio_ms: (limit > 0).then_some(limit).into(), ..Default::default() };
    if let Ok(out) = P::preprocess(config, &MediaItem::EncodedAudio(payload.to_vec().into()), &options) {
        for tensor in out.tensors.iter() {
            if let Err(e) = tensor.validate() {
                panic!("preprocess returned a tensor its bytes do not fill: {e:?}");
            }
        }
    }
}

pub fn family_preprocess<P: FamilyPlugin>(config: &P::Config, data: &[u8]) {
    let [mode, m0, m1, m2, m3, n0, n1, n2, n3, payload @ ..] = data else { return };
    let options = PreprocessOptions {
        max_pixels: (mode & 2 != 0).then(|| u64::from(u32::from_le_bytes([*m0, *m1, *m2, *m3]))).into(),
        min_pixels: (mode & 4 != 0).then(|| u64::from(u32::from_le_bytes([*n0, *n1, *n2, *n3]))).into(),
        max_audio_ms: None.into(),
    };
    let item = if mode & 1 == 0 {
        // The plugins refuse an image declaring more than `MAX_ENCODED_PIXELS` (89M) from its
        // header; one under that but past this harness's bound would only slow the search
        // down filling its buffer (the cap itself is `media_decode`'s and a unit test's).
        if mlxcel_media::dimensions(payload).is_ok_and(|(_, w, h)| u64::from(w) * u64::from(h) > 1 << 22) {
            return;
        }
        MediaItem::EncodedImage(payload.to_vec().into())
    } else {
        let [w0, w1, h0, h1, pixels @ ..] = payload else { return };
        let width = 1 + u32::from(u16::from_le_bytes([*w0, *w1])) % 1024;
        let height = 1 + u32::from(u16::from_le_bytes([*h0, *h1])) % 1024;
        if width * height > MAX_RGB_PIXELS {
            return;
        }
        let len = (width * height * 3) as usize;
        let pixels: Vec<u8> =
            if pixels.is_empty() { vec![0; len] } else { pixels.iter().copied().cycle().take(len).collect() };
        MediaItem::Rgb8 { width, height, pixels: pixels.into() }
    };
    if let Ok(out) = P::preprocess(config, &item, &options) {
        for tensor in out.tensors.iter() {
            if let Err(e) = tensor.validate() {
                panic!("preprocess returned a tensor its bytes do not fill: {e:?}");
            }
        }
    }
}
