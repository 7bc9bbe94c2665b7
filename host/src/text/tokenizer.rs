//! The checkpoint's `tokenizer.json` through the `tokenizers` crate, and a
//! streaming detokenizer that only emits complete UTF-8 text.

use std::path::{Path, PathBuf};

use super::TextError;

/// A checkpoint's tokenizer.
#[derive(Debug)]
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
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| TextError::TokenizerLoad { path: path.clone(), message: e.to_string() })?;
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
