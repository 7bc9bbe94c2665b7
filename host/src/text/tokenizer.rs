//! The checkpoint's `tokenizer.json` through the `tokenizers` crate, and a
//! streaming detokenizer that only emits complete UTF-8 text.

use std::path::{Path, PathBuf};

use super::TextError;

/// A checkpoint's tokenizer.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl Tokenizer {
    /// Loads `<dir>/tokenizer.json`.
    pub fn load(dir: &Path) -> Result<Self, TextError> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(TextError::Io { path, source: std::io::ErrorKind::NotFound.into() });
        }
        // tokenizers panics on some malformed files (an unwrap in its decoder parsing, found by
        // the tokenizer fuzz target); a bad file is an error here, never a crash.
        let loaded = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_file(&path)).map_err(|panic| {
            let message =
                panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            TextError::TokenizerLoad {
                path: path.clone(),
                message: format!("the tokenizers library failed on it: {}", message.unwrap_or_default()),
            }
        })?;
        let inner = loaded.map_err(|e| TextError::TokenizerLoad { path: path.clone(), message: e.to_string() })?;
        Ok(Tokenizer { inner, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Token ids of `text`. A rendered chat template already holds its
    /// special tokens, so it is encoded with `add_special_tokens = false`
    /// (as transformers' `apply_chat_template` does).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TextError> {
        let encoding = self.inner.encode(text, add_special_tokens).map_err(|e| TextError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`, without special tokens when `skip_special` is set.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TextError> {
        self.inner.decode(ids, skip_special).map_err(|e| TextError::Decode(e.to_string()))
    }

    /// The id of a token string (special or not).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The bytes each token id stands for in generated text, indexed by id (ids the
    /// tokenizer lacks are empty): what a grammar-constrained sampler matches tokens by.
    /// Special added tokens are marked with a leading 0xFF, a byte no UTF-8 text holds, so no
    /// grammar over text ever matches one. Only the two decoders vision-language checkpoints
    /// use are understood, byte-level BPE (GPT-2's byte-to-character table) and SentencePiece
    /// with byte fallback (`<0xNN>` tokens, `▁` for a space); any other is refused, since a
    /// guessed byte form would let the sampler accept text the tokens do not spell.
    pub fn token_bytes(&self) -> Result<Vec<Vec<u8>>, TextError> {
        let refuse = |what: String| TextError::Invalid { path: self.path.clone(), what };
        let form = match self.inner.get_decoder() {
            None => Err("the tokenizer has no decoder".to_owned()),
            Some(d) => serde_json::to_value(d).map_err(|e| e.to_string()).and_then(|d| ByteForm::of(&d)),
        }
        .map_err(refuse)?;
        let vocab = self.inner.get_vocab(true);
        let size = vocab.values().max().map_or(0, |&m| m as usize + 1);
        // Ids far past the entries would make a table mostly of holes, sized by the file.
        if size > 2 * vocab.len() + 1024 {
            return Err(refuse(format!("token ids reach {} for {} tokens", size - 1, vocab.len())));
        }
        let mut bytes = vec![Vec::new(); size];
        let added = self.inner.get_added_tokens_decoder();
        for (text, &id) in &vocab {
            bytes[id as usize] = match added.get(&id) {
                Some(token) if token.special => [&[SPECIAL_MARKER][..], token.content.as_bytes()].concat(),
                // An added token that is not special is written as its text.
                Some(token) => token.content.as_bytes().to_vec(),
                None => form.bytes(text).ok_or_else(|| refuse(format!("token {id} ({text:?}) has no byte form")))?,
            };
        }
        Ok(bytes)
    }
}

/// The byte no UTF-8 text holds, which marks a special token's bytes (llguidance's convention).
const SPECIAL_MARKER: u8 = 0xFF;

/// How a vocabulary entry spells bytes.
enum ByteForm {
    /// GPT-2's table: each byte is one character (printable bytes themselves, the rest shifted
    /// past U+0100 in order).
    ByteLevel(Box<[Option<u8>; 512]>),
    /// SentencePiece: `<0xNN>` is the byte NN, other entries are UTF-8 with `space` for ' '.
    ByteFallback { space: char },
}

impl ByteForm {
    /// The form a serialized `tokenizers` decoder implies.
    fn of(decoder: &serde_json::Value) -> Result<Self, String> {
        let kind = |d: &serde_json::Value| d.get("type").and_then(|t| t.as_str()).unwrap_or_default().to_owned();
        if kind(decoder) == "ByteLevel" {
            return Ok(ByteForm::ByteLevel(byte_level_table()));
        }
        let parts = match decoder.get("decoders").and_then(|d| d.as_array()) {
            Some(parts) if kind(decoder) == "Sequence" => parts,
            _ => {
                return Err(format!(
                    "the tokenizer's decoder {} is neither byte-level nor byte-fallback",
                    kind(decoder)
                ));
            }
        };
        if parts.iter().any(|d| kind(d) == "ByteLevel") {
            return Ok(ByteForm::ByteLevel(byte_level_table()));
        }
        if !parts.iter().any(|d| kind(d) == "ByteFallback") {
            return Err("the tokenizer's decoder has no ByteLevel or ByteFallback step".to_owned());
        }
        let mut space = ' ';
        for d in parts.iter().filter(|d| kind(d) == "Replace" && d["content"] == " ") {
            let mut chars = d["pattern"]["String"].as_str().unwrap_or_default().chars();
            if let (Some(c), None) = (chars.next(), chars.next()) {
                space = c;
            }
        }
        Ok(ByteForm::ByteFallback { space })
    }

    fn bytes(&self, entry: &str) -> Option<Vec<u8>> {
        match self {
            ByteForm::ByteLevel(table) => entry.chars().map(|c| table.get(c as usize).copied().flatten()).collect(),
            ByteForm::ByteFallback { space } => {
                if let Some(hex) = entry.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'))
                    && hex.len() == 2
                {
                    return u8::from_str_radix(hex, 16).ok().map(|b| vec![b]);
                }
                Some(entry.replace(*space, " ").into_bytes())
            }
        }
    }
}

/// GPT-2's byte-level table inverted: character (below U+0200) to byte.
fn byte_level_table() -> Box<[Option<u8>; 512]> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = Box::new([None; 512]);
    let mut shifted = 0x100;
    for b in 0..=255u8 {
        if printable(b) {
            table[b as usize] = Some(b);
        } else {
            table[shifted] = Some(b);
            shifted += 1;
        }
    }
    table
}

/// Turns a stream of token ids into text increments. Decoding one token at a
/// time breaks characters split across byte-level tokens and drops the
/// spaces some decoders derive from context, so each step decodes a short
/// window and emits only what the new token added, holding it back while it
/// ends in an incomplete character (U+FFFD).
#[derive(Debug)]
pub struct Detokenizer {
    ids: Vec<u32>,
    /// Start of the decoded window.
    prefix: usize,
    /// End of what has been emitted.
    read: usize,
    skip_special: bool,
}

/// Prompt tokens kept as context for the first generated ones.
const CONTEXT: usize = 5;

impl Detokenizer {
    /// A detokenizer for the tokens that follow `context` (the prompt; its
    /// last few ids give the first generated tokens their spacing).
    pub fn new(context: &[u32], skip_special: bool) -> Self {
        let ids = context[context.len().saturating_sub(CONTEXT)..].to_vec();
        let n = ids.len();
        Detokenizer { ids, prefix: 0, read: n, skip_special }
    }

    /// Adds one token; returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TextError> {
        self.ids.push(id);
        let before = tokenizer.decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let after = tokenizer.decode(&self.ids[self.prefix..], self.skip_special)?;
        if after.len() <= before.len() || after.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let delta = added(&before, &after);
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(delta)
    }

    /// The text still held back at the end of the stream (an incomplete
    /// character comes out as U+FFFD, as a full decode gives it).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, TextError> {
        let before = tokenizer.decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let after = tokenizer.decode(&self.ids[self.prefix..], self.skip_special)?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(added(&before, &after))
    }
}

/// What `after` adds to `before`. When the decoder rewrote the window's
/// start (rare), what is new is counted in characters rather than bytes, so
/// no character is split.
fn added(before: &str, after: &str) -> String {
    match after.strip_prefix(before) {
        Some(d) => d.to_owned(),
        None => after.chars().skip(before.chars().count()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;

    /// Found by the tokenizer fuzz target: a `decoder` object the tokenizers library fails to
    /// parse (a stray `#`) made it panic inside `from_file`; it is an error now.
    #[test]
    fn a_tokenizer_file_that_makes_the_library_panic_is_an_error() {
        let input = "eyJ2ZXJzaW9uIjogIjEuMCIsICJhZGRlZF90b2tlbnMiOiBbXSwgIm5vcm1hbGl6ZXIiOiBudWxsLCAicHJlX3Rva2VuaXplciI6IHsidHlwZSI6ICJNZXRhc3BhY2UiLCAicmVwbGFjZW1lbnQiOiAiXHUyNTgxIiwgInByZXBlbmRfc2NoZW1lIjogImFsd2F5cyIsICJzcGxpdCI6IHRydWV9LCAicG9zdF9wcm9jZXNzb3IiOiBudWxsLCAiZGVjb2RlciI6IHsidHlwZSI6ICJNZXRhc3BhY2UiLCMgInJlcGxhY2VtZW50IjogIlx1MjU4MSIsICJwcmVwZW5kX3NjaGVtZSI6ICJhbHdheXMiLCAic3BsaXQiOiB0cnVlfSwgIm1vZGVsIjogeyJ0eXBlIjogIlVuaWdyYW0iLCAidW5rX2lkIjogMCwgImJ5dGVfZmFsbGJhY2siOiB0cnVlLCAidm9jYWIiOiBbWyI8dW5rPiIsIDAuMF0sIFsiXHUyNTgxYSIsIC0xLjBdLCBbImIiLCAtMi4wXSwgWyI8MHg0MT4iLCAtMy4wXV19fQBhYiBB";
        let bytes = base64::engine::general_purpose::STANDARD.decode(input).expect("base64");
        // The fuzz input is the file, a NUL, then text to encode.
        let file = bytes.split(|&b| b == 0).next().expect("file");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("tokenizer.json"), file).expect("write");
        let err = Tokenizer::load(dir.path()).expect_err("refused");
        assert!(matches!(err, TextError::TokenizerLoad { .. }), "{err}");
    }
}
