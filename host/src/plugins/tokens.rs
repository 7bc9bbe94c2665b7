//! The bytes each token id of a byte-level BPE `tokenizer.json` stands for, so the conformance
//! kit can check a plugin's expanded prompt against a golden's `input_ids` token by token
//! without tokenizing (every oracle fixture uses a byte-level BPE tokenizer).

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Token id to the bytes it decodes to.
#[derive(Debug, Default)]
pub(crate) struct Pieces {
    pieces: HashMap<i64, Vec<u8>>,
}

impl Pieces {
    /// Reads the vocabulary and added tokens of a `tokenizer.json`.
    pub(crate) fn from_tokenizer_json(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let json: Value = serde_json::from_str(&text).with_context(|| format!("{} is not json", path.display()))?;
        Self::from_json(&json).with_context(|| format!("in {}", path.display()))
    }

    fn from_json(json: &Value) -> Result<Self> {
        let decoder = json.pointer("/decoder/type").and_then(Value::as_str).unwrap_or("none");
        if decoder != "ByteLevel" {
            bail!("the conformance kit reads byte-level BPE tokenizers only (the decoder is `{decoder}`)");
        }
        let vocab = json
            .pointer("/model/vocab")
            .and_then(Value::as_object)
            .context("the tokenizer has no model.vocab object")?;
        let unicode_to_byte = unicode_to_byte();
        let mut pieces = HashMap::with_capacity(vocab.len());
        for (token, id) in vocab {
            let id = id.as_i64().with_context(|| format!("vocab entry `{token}` has no integer id"))?;
            let bytes = token
                .chars()
                .map(|c| unicode_to_byte.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                .with_context(|| format!("vocab entry `{token}` is not byte-level"))?;
            pieces.insert(id, bytes);
        }
        // Added tokens are matched literally, so they decode to their content.
        for added in json.get("added_tokens").and_then(Value::as_array).into_iter().flatten() {
            let (Some(id), Some(content)) =
                (added.get("id").and_then(Value::as_i64), added.get("content").and_then(Value::as_str))
            else {
                bail!("an added token lacks its id or content: {added}");
            };
            pieces.insert(id, content.as_bytes().to_vec());
        }
        Ok(Self { pieces })
    }

    /// The bytes of one id.
    pub(crate) fn get(&self, id: i64) -> Option<&[u8]> {
        self.pieces.get(&id).map(Vec::as_slice)
    }
}

/// GPT-2's byte-to-unicode table, inverted: printable bytes stand for themselves, the others
/// for code points from 256 up, in byte order.
fn unicode_to_byte() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    let mut table = HashMap::with_capacity(256);
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("invariant: 256..324 are valid code points");
            next += 1;
            c
        };
        table.insert(c, b);
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_pieces_and_added_tokens_decode() {
        let json = serde_json::json!({
            "model": {"type": "BPE", "vocab": {"a": 0, "Ġb": 1, "Ċ": 2, "Ã©": 3}},
            "added_tokens": [{"id": 9, "content": "<img>"}],
            "decoder": {"type": "ByteLevel"},
        });
        let pieces = Pieces::from_json(&json).expect("byte-level tokenizer");
        assert_eq!(pieces.get(0), Some(&b"a"[..]));
        assert_eq!(pieces.get(1), Some(&b" b"[..]));
        assert_eq!(pieces.get(2), Some(&b"\n"[..]));
        assert_eq!(pieces.get(3), Some("é".as_bytes()));
        assert_eq!(pieces.get(9), Some(&b"<img>"[..]));
        assert_eq!(pieces.get(4), None);
    }

    #[test]
    fn other_decoders_are_refused() {
        let json = serde_json::json!({"model": {"vocab": {}}, "decoder": {"type": "Metaspace"}});
        let err = Pieces::from_json(&json).expect_err("not byte-level");
        assert!(err.to_string().contains("`Metaspace`"), "{err}");
    }
}
