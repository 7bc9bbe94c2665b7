//! The tokens that end a generation: `eos_token_id` of
//! `generation_config.json`, else of `config.json` (top level or its
//! `text_config`), else the tokenizer's `eos_token` — the order transformers'
//! `generate` resolves them in.

use std::path::Path;

use super::{TextError, Tokenizer, read_json_if_present, template::special_token};

/// The stop token ids of the checkpoint at `dir` (possibly empty).
pub fn stop_tokens(dir: &Path, tokenizer: &Tokenizer) -> Result<Vec<u32>, TextError> {
    for name in ["generation_config.json", "config.json"] {
        let path = dir.join(name);
        let Some(json) = read_json_if_present(&path)? else { continue };
        let field = match json.get("eos_token_id") {
            Some(v) if !v.is_null() => Some(v),
            _ => json.get("text_config").and_then(|t| t.get("eos_token_id")).filter(|v| !v.is_null()),
        };
        if let Some(v) = field {
            return ids(v).ok_or_else(|| TextError::Invalid {
                path,
                what: format!("eos_token_id {v} is neither a token id nor a list of them"),
            });
        }
    }
    let path = dir.join("tokenizer_config.json");
    let eos = read_json_if_present(&path)?.and_then(|c| special_token(&c, "eos_token"));
    Ok(eos.and_then(|t| tokenizer.token_id(&t)).into_iter().collect())
}

fn ids(v: &serde_json::Value) -> Option<Vec<u32>> {
    let one = |v: &serde_json::Value| v.as_u64().and_then(|x| u32::try_from(x).ok());
    match v {
        serde_json::Value::Array(items) => items.iter().map(one).collect(),
        _ => one(v).map(|x| vec![x]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eos_is_an_id_or_a_list() {
        assert_eq!(ids(&serde_json::json!(7)), Some(vec![7]));
        assert_eq!(ids(&serde_json::json!([1, 107])), Some(vec![1, 107]));
        assert_eq!(ids(&serde_json::json!("x")), None);
        assert_eq!(ids(&serde_json::json!([1, -2])), None);
    }
}
