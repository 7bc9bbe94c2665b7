//! Chat-template loading and rendering as the host does it (`host/src/text/template.rs`,
//! `ChatTemplate::load` on a checkpoint directory): the input is `chat_template.jinja` (absent
//! when empty, so the loader falls back to `tokenizer_config.json`'s `chat_template`), NUL,
//! `tokenizer_config.json` (its special tokens, `bos_or_eos`), NUL, the messages as JSON
//! (a fixed text and image conversation when they do not parse).

#![no_main]

use mlxcel_fuzz::text::{ChatTemplate, Message, bos_or_eos};

/// A text and image conversation, as JSON: `Message` grows fields (tool calls) and reads this
/// form whatever it holds.
const DEFAULT_MESSAGES: &str = r#"[
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
    {"role": "assistant", "content": "A cat."},
    {"role": "user", "content": "Sure?"}
]"#;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let files = mlxcel_fuzz::parts(data, 3);
    let dir = mlxcel_fuzz::scratch();
    let jinja = files[0];
    mlxcel_fuzz::put(dir, "chat_template.jinja", (!jinja.is_empty()).then_some(jinja));
    mlxcel_fuzz::put(dir, "tokenizer_config.json", files.get(1).copied());
    let _ = bos_or_eos(dir);
    let Ok(template) = ChatTemplate::load(dir) else { return };
    let messages = files
        .get(2)
        .and_then(|m| serde_json::from_slice::<Vec<Message>>(m).ok())
        .unwrap_or_else(|| serde_json::from_str(DEFAULT_MESSAGES).expect("invariant: the default messages read"));
    for add_generation_prompt in [false, true] {
        let _ = template.render(&messages, add_generation_prompt);
    }
});
