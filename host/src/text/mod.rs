//! The text side of a checkpoint, as transformers reads it: the tokenizer
//! (`tokenizer.json`), the chat template (`chat_template.jinja` or
//! `tokenizer_config.json`), streaming detokenization, and the stop tokens
//! (`generation_config.json`, else `config.json`).

mod stop;
mod template;
mod tokenizer;

use std::path::{Path, PathBuf};

pub use stop::{StopScan, StopStringError, StopStrings, stop_tokens};
pub use template::{ChatTemplate, Content, Message, Part};
pub use tokenizer::{Detokenizer, Tokenizer};

/// Errors reading or applying a checkpoint's text files.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid json: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("cannot load the tokenizer {path}: {message}")]
    TokenizerLoad { path: PathBuf, message: String },
    #[error("tokenizing: {0}")]
    Encode(String),
    #[error("detokenizing: {0}")]
    Decode(String),
    #[error("the checkpoint has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json)")]
    NoChatTemplate,
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error("chat template: {0}")]
    Template(#[from] minijinja::Error),
}

/// Reads a json file.
fn read_json(path: &Path) -> Result<serde_json::Value, TextError> {
    let text = std::fs::read_to_string(path).map_err(|source| TextError::Io { path: path.to_owned(), source })?;
    serde_json::from_str(&text).map_err(|source| TextError::Json { path: path.to_owned(), source })
}

/// Reads a json file that may be absent.
fn read_json_if_present(path: &Path) -> Result<Option<serde_json::Value>, TextError> {
    if path.exists() { read_json(path).map(Some) } else { Ok(None) }
}

/// The tokenizer's `bos_token`, or its `eos_token` when it has none (`tokenizer_config.json`,
/// a string or `{"content": ...}`): the token processors that start every prompt with one pick
/// (`bos_token or eos_token`). `None` when it names neither.
pub fn bos_or_eos(dir: &Path) -> Result<Option<String>, TextError> {
    let config = read_json_if_present(&dir.join("tokenizer_config.json"))?.unwrap_or_default();
    Ok(template::special_token(&config, "bos_token").or_else(|| template::special_token(&config, "eos_token")))
}
