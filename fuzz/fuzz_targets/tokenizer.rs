//! `tokenizer.json` through the host's `Tokenizer::load` (`host/src/text/tokenizer.rs`), then,
//! after a NUL, text encoded with and without special tokens, decoded whole and streamed
//! through the `Detokenizer` as generation does (ids past the vocabulary included).

#![no_main]

use mlxcel_fuzz::text::{Detokenizer, Tokenizer};

static QUIET_CAUGHT_PANICS: std::sync::Once = std::sync::Once::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    // `Tokenizer::load` catches the tokenizers library's own panics on malformed files and
    // returns an error; libfuzzer-sys's panic hook would abort on them even so. A panic that
    // escapes the target still aborts (libfuzzer-sys catches it around the target and aborts).
    QUIET_CAUGHT_PANICS.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let files = mlxcel_fuzz::parts(data, 2);
    let dir = mlxcel_fuzz::scratch();
    mlxcel_fuzz::put(dir, "tokenizer.json", Some(files[0]));
    let Ok(tokenizer) = Tokenizer::load(dir) else { return };
    let text = files.get(1).map(|t| String::from_utf8_lossy(t)).unwrap_or_default();
    let _ = tokenizer.token_id(&text);
    for special in [false, true] {
        let Ok(ids) = tokenizer.encode(&text, special) else { continue };
        let _ = tokenizer.decode(&ids, special);
        let (prompt, generated) = ids.split_at(ids.len() / 2);
        let mut stream = Detokenizer::new(prompt, !special);
        for &id in generated.iter().chain([u32::MAX, 7].iter()) {
            let _ = stream.push(&tokenizer, id);
        }
        let _ = stream.finish(&tokenizer);
    }
});
