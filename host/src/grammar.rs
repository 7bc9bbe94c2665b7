//! Grammar-constrained sampling, for structured output (`response_format`) and forced tool
//! calls: before each token is sampled, every token the grammar does not allow next gets a
//! logit of -inf, so what is generated always belongs to the grammar's language. The grammars
//! (JSON schemas and Lark grammars) are compiled and matched by llguidance, over the bytes each
//! token stands for ([`Tokenizer::token_bytes`]).
//!
//! The end of the grammar is the request's own end: where the grammar may stop, the request's
//! stop tokens are allowed (and nothing else once it must stop); a stop token is never fed to
//! the grammar.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::text::Tokenizer;

/// Why a grammar could not be built or followed.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    #[error("the tokenizer cannot be matched against grammars: {0}")]
    Tokenizer(String),
    #[error("the grammar cannot be compiled: {0}")]
    Compile(String),
    #[error("the grammar refused token {token}: {message}")]
    Token { token: u32, message: String },
    #[error("computing the grammar's allowed tokens failed: {0}")]
    Mask(String),
    #[error("the grammar allows no token the request may produce")]
    Dead,
}

/// What a constrained request's text must be.
#[derive(Clone, Debug, PartialEq)]
pub enum Grammar {
    /// One JSON value matching this JSON schema.
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark dialect (which embeds JSON schemas with `%json`).
    Lark(String),
}

/// How constrained JSON is laid out unless the schema says otherwise (llguidance's
/// `x-guidance` key): one space after `,` and `:`, as Python's `json.dumps` writes (what chat
/// templates render tool calls with), and no other whitespace. Free whitespace would let a
/// model pad its answer with blanks up to `max_tokens` and makes the same request's tokens
/// depend on more than the model's choice of content.
const JSON_LAYOUT: &str = r#"{"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}"#;

impl Grammar {
    /// The schema with the server's JSON layout, unless it states its own.
    fn with_layout(schema: &serde_json::Value) -> serde_json::Value {
        let mut schema = schema.clone();
        if let Some(object) = schema.as_object_mut()
            && !object.contains_key("x-guidance")
            && let Ok(layout) = serde_json::from_str(JSON_LAYOUT)
        {
            object.insert("x-guidance".to_owned(), layout);
        }
        schema
    }

    /// A schema's JSON text with the server's layout, for embedding in a Lark grammar
    /// (`%json {...}`).
    pub fn laid_out(schema: &serde_json::Value) -> String {
        Self::with_layout(schema).to_string()
    }

    fn top_level(&self) -> TopLevelGrammar {
        match self {
            Grammar::JsonSchema(schema) => TopLevelGrammar::from_json_schema(Self::with_layout(schema)),
            Grammar::Lark(source) => TopLevelGrammar::from_lark(source.clone()),
        }
    }
}

/// A checkpoint's vocabulary as grammars see it; built once, shared by every request.
pub struct Vocabulary {
    factory: ParserFactory,
    /// The tokens the tokenizer knows (the model's logits may have more, padding).
    size: usize,
    /// The token llguidance allows where the grammar may end.
    end: u32,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary").field("size", &self.size).field("end", &self.end).finish_non_exhaustive()
    }
}

/// The tokenizer as llguidance asks for it: the token trie, and tokenization (used for the
/// grammar's literal text).
struct Env {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Text the tokenizer cannot take (not UTF-8) is split along the trie instead.
        std::str::from_utf8(s)
            .ok()
            .and_then(|text| self.tokenizer.encode(text, false).ok())
            .unwrap_or_else(|| self.trie.greedy_tokenize(s))
    }
}

impl Vocabulary {
    /// The vocabulary of `tokenizer`; `end` is a token that ends generation (the checkpoint's
    /// first end-of-sequence id), which stands for "the grammar may end here".
    pub fn new(tokenizer: &Tokenizer, end: u32) -> Result<Self, GrammarError> {
        let words = tokenizer.token_bytes().map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        if end as usize >= words.len() {
            return Err(GrammarError::Tokenizer(format!("end token {end} is outside the {} tokens", words.len())));
        }
        let info = TokRxInfo::new(words.len() as u32, end);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tokenizer: tokenizer.clone() });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        factory.quiet();
        Ok(Vocabulary { factory, size: words.len(), end })
    }

    /// A fresh constraint following `grammar`; `ends` are the request's stop tokens.
    pub fn constrain(&self, grammar: &Grammar, ends: Vec<u32>) -> Result<Constraint, GrammarError> {
        if ends.is_empty() {
            // Nothing could end the request where the grammar ends.
            return Err(GrammarError::Compile("a constrained request needs a stop token".to_owned()));
        }
        let parser =
            self.factory.create_parser(grammar.top_level()).map_err(|e| GrammarError::Compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(GrammarError::Compile(error));
        }
        Ok(Constraint { matcher, ends, size: self.size, end: self.end })
    }
}

/// One request's place in its grammar.
pub struct Constraint {
    matcher: Matcher,
    ends: Vec<u32>,
    size: usize,
    end: u32,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("ends", &self.ends).finish_non_exhaustive()
    }
}

impl Constraint {
    /// Sets every logit the grammar does not allow next to -inf.
    pub fn restrict(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| GrammarError::Mask(e.to_string()))?;
        let may_end = mask.is_allowed(self.end);
        let mut any = false;
        for (token, logit) in logits.iter_mut().enumerate() {
            let allowed = if self.ends.contains(&(token as u32)) {
                may_end
            } else {
                token < self.size && token as u32 != self.end && mask.is_allowed(token as u32)
            };
            if allowed {
                any |= *logit > f32::NEG_INFINITY;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        if any { Ok(()) } else { Err(GrammarError::Dead) }
    }

    /// Moves past `token`, the one sampled from [`Constraint::restrict`]'s logits. A stop
    /// token ends the request, not the grammar's text, and is not fed to it.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.ends.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| GrammarError::Token { token, message: e.to_string() })
    }
}

#[cfg(test)]
mod tests;
