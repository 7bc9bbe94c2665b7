use std::path::PathBuf;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde_json::{Value, json};

use super::*;

fn tokenizer(fixture: &str) -> Tokenizer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(fixture);
    Tokenizer::load(&dir).expect("fixture tokenizer")
}

/// A SentencePiece-style tokenizer: byte fallback, `▁` for spaces, a few merged pieces.
fn byte_fallback_tokenizer() -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    vocab.insert("<unk>".into(), json!(0));
    for b in 0..=255u32 {
        vocab.insert(format!("<0x{b:02X}>"), json!(b + 1));
    }
    for (i, piece) in ["▁", "n", "a", "m", "e", "▁n", "am", "▁nam", "▁name", "\"", "{"].iter().enumerate() {
        vocab.insert((*piece).into(), json!(257 + i));
    }
    let spec = json!({
        "version": "1.0",
        "added_tokens": [{"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false,
                          "normalized": false, "special": true}],
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": [["▁", "n"], ["a", "m"], ["▁n", "am"], ["▁nam", "e"]]}
    });
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("tokenizer.json"), spec.to_string()).expect("write");
    Tokenizer::load(dir.path()).expect("byte-fallback tokenizer")
}

/// The bytes of a text's tokens, joined, are the text: both decoder forms.
#[test]
fn token_bytes_spell_the_text_the_tokens_encode() {
    for (name, tokenizer) in [("qwen2_vl", tokenizer("qwen2_vl")), ("byte fallback", byte_fallback_tokenizer())] {
        let fixture = name;
        let bytes = tokenizer.token_bytes().expect("token bytes");
        for text in ["{\"name\": \"Zoë\", \"n\": [1, 2.5e-3]}", "  two  spaces\nand a line", "日本語 ✓ 🙂"] {
            let ids = tokenizer.encode(text, false).expect("encode");
            let spelled: Vec<u8> = ids.iter().flat_map(|&id| bytes[id as usize].clone()).collect();
            // SentencePiece tokenizers may start a text with a space of their own.
            let spelled = String::from_utf8(spelled).expect("utf-8");
            assert_eq!(spelled.trim_start_matches(' '), text.trim_start_matches(' '), "{fixture}: {ids:?}");
        }
    }
}

/// The qwen2_vl fixture's `<|endoftext|>`, `<|im_end|>` and logits per row.
const ENDOFTEXT: u32 = 384;
const IM_END: u32 = 386;
const LOGITS: usize = 448;

/// Random tokens among those allowed, until a stop token: the text.
fn walk(vocabulary: &Vocabulary, tokenizer: &Tokenizer, grammar: &Grammar, seed: u64, vocab: usize) -> String {
    let stop = IM_END;
    let mut constraint = vocabulary.constrain(grammar, vec![stop, ENDOFTEXT]).expect("constraint");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::new();
    for _ in 0..400 {
        // Uniform random logits: the grammar alone decides what is possible.
        let mut logits: Vec<f32> = (0..vocab).map(|_| (rng.next_u32() % 1000) as f32 / 100.0).collect();
        constraint.restrict(&mut logits).expect("restrict");
        let token = crate::sampling::greedy(&logits).expect("a token");
        constraint.accept(token).expect("accept");
        if token == stop || token == ENDOFTEXT {
            return tokenizer.decode(&out, true).expect("decode");
        }
        out.push(token);
    }
    panic!("no end in 400 tokens: {:?}", tokenizer.decode(&out, true));
}

#[test]
fn random_tokens_under_a_schema_always_make_a_matching_document() {
    let tokenizer = tokenizer("qwen2_vl");
    let vocabulary = Vocabulary::new(&tokenizer, ENDOFTEXT).expect("vocabulary");
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "kind": {"enum": ["cat", "dog", "bird"]},
            "tags": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3},
            "owner": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 150}},
                      "required": ["age"], "additionalProperties": false}
        },
        "required": ["name", "kind", "tags", "owner"],
        "additionalProperties": false
    });
    let grammar = Grammar::JsonSchema(schema);
    for seed in 0..6 {
        let text = walk(&vocabulary, &tokenizer, &grammar, seed, LOGITS);
        let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(doc["name"].as_str().is_some_and(|n| n.chars().count() <= 12), "{text}");
        assert!(["cat", "dog", "bird"].contains(&doc["kind"].as_str().unwrap_or_default()), "{text}");
        let tags = doc["tags"].as_array().expect("tags");
        assert!(tags.len() <= 3 && tags.iter().all(|t| t.as_u64().is_some_and(|t| t <= 99)), "{text}");
        assert!(doc["owner"]["age"].as_u64().is_some_and(|a| a <= 150), "{text}");
        assert_eq!(doc.as_object().map(|o| o.len()), Some(4), "{text}");
        // The server's layout: Python's separators and no other whitespace.
        assert!(text.starts_with("{\"name\": \""), "{text}");
    }
}

#[test]
fn a_token_outside_the_grammar_is_refused_and_stop_tokens_wait_for_its_end() {
    let tokenizer = tokenizer("qwen2_vl");
    let vocabulary = Vocabulary::new(&tokenizer, ENDOFTEXT).expect("vocabulary");
    let grammar = Grammar::JsonSchema(json!({"enum": ["yes", "no"]}));
    let mut constraint = vocabulary.constrain(&grammar, vec![IM_END]).expect("constraint");
    let mut logits = vec![0.0; LOGITS];
    constraint.restrict(&mut logits).expect("restrict");
    assert_eq!(logits[IM_END as usize], f32::NEG_INFINITY, "the document has not begun");
    // Padding rows past the tokenizer never qualify.
    assert_eq!(logits[LOGITS - 1], f32::NEG_INFINITY);
    let quote = tokenizer.encode("\"", false).expect("encode")[0];
    assert!(logits[quote as usize] > f32::NEG_INFINITY);
    let brace = tokenizer.encode("{", false).expect("encode")[0];
    assert!(constraint.accept(brace).is_err());

    let mut constraint = vocabulary.constrain(&grammar, vec![IM_END]).expect("constraint");
    for id in tokenizer.encode("\"no\"", false).expect("encode") {
        let mut logits = vec![0.0; LOGITS];
        constraint.restrict(&mut logits).expect("restrict");
        assert!(logits[id as usize] > f32::NEG_INFINITY);
        constraint.accept(id).expect("accept");
    }
    let mut logits = vec![0.0; LOGITS];
    constraint.restrict(&mut logits).expect("restrict");
    let allowed: Vec<usize> = (0..logits.len()).filter(|&t| logits[t] > f32::NEG_INFINITY).collect();
    assert_eq!(allowed, vec![IM_END as usize], "only the stop token is left");
}

#[test]
fn a_schema_llguidance_cannot_compile_is_an_error_and_so_is_a_request_without_a_stop_token() {
    let tokenizer = tokenizer("qwen2_vl");
    let vocabulary = Vocabulary::new(&tokenizer, ENDOFTEXT).expect("vocabulary");
    let bad =
        Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}));
    assert!(matches!(vocabulary.constrain(&bad, vec![IM_END]), Err(GrammarError::Compile(_))));
    let good = Grammar::JsonSchema(json!({"type": "object"}));
    assert!(matches!(vocabulary.constrain(&good, vec![]), Err(GrammarError::Compile(_))));
}
