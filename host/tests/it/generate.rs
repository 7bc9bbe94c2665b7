//! `mlxcel-host generate` and the text pipeline under it, against the
//! oracle's goldens: the chat template renders the golden `prompt`, the
//! tokenizer gives the golden `input_ids`, and the real binary generates the
//! golden greedy tokens; bad input fails with a clear message.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use mlxcel_host::text::{ChatTemplate, Content, Detokenizer, Message, Tokenizer, stop_tokens};

/// A fixture and its golden variants: `text` ones go through the template,
/// the tokenizer and `generate` end to end; `media` ones (with images, whose
/// placeholders the family plugins expand) only render their prompt.
struct Fixture {
    name: &'static str,
    text: &'static [&'static str],
    media: &'static [&'static str],
}

const LM: &[&str] = &["short", "long"];
const VLM_TEXT: &[&str] = &["text_only"];
const VLM_MEDIA: &[&str] = &["image", "two_images", "long"];

/// Every fixture whose decoder the host has (molmo, molmo2, youtu_vl and
/// gemma3n join with theirs).
const FIXTURES: &[Fixture] = &[
    Fixture { name: "qwen2", text: LM, media: &[] },
    Fixture { name: "llama", text: LM, media: &[] },
    Fixture { name: "qwen3", text: LM, media: &[] },
    Fixture { name: "gemma3_text", text: LM, media: &[] },
    // MLX community checkpoints: their goldens are MLX's own generate (mlx-lm on mlx-cpu).
    Fixture { name: "qwen3_mlx_q4", text: LM, media: &[] },
    Fixture { name: "qwen3_mlx_q8", text: LM, media: &[] },
    Fixture { name: "llama_mlx_mixed", text: LM, media: &[] },
    Fixture { name: "qwen2_vl", text: VLM_TEXT, media: VLM_MEDIA },
    Fixture { name: "qwen2_5_vl", text: VLM_TEXT, media: VLM_MEDIA },
    Fixture { name: "qwen3_vl", text: VLM_TEXT, media: VLM_MEDIA },
    Fixture { name: "llava", text: VLM_TEXT, media: VLM_MEDIA },
    Fixture { name: "gemma3", text: VLM_TEXT, media: VLM_MEDIA },
];

/// The bundle shape every run here uses, so runs share compiled modules.
const SHAPE: &[&str] = &["--capacity", "128", "--chunk", "32"];

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

struct Golden {
    messages: Vec<Message>,
    prompt: String,
    input_ids: Vec<u32>,
    greedy: Vec<u32>,
}

fn golden(name: &str, variant: &str) -> Golden {
    let path = fixture(name).join("goldens").join(format!("{variant}.json"));
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("golden")).expect("json");
    // The oracle tokenizes the rendered template as-is (the processors too: their goldens omit the flag).
    assert_ne!(meta["add_special_tokens"], true, "{name}/{variant}");
    Golden {
        messages: serde_json::from_value(meta["messages"].clone()).expect("messages"),
        prompt: meta["prompt"].as_str().expect("prompt").to_owned(),
        input_ids: ids(&meta["input_ids"]),
        greedy: ids(&meta["greedy_tokens"]),
    }
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// The text of a golden's one user turn.
fn user_text(g: &Golden, ctx: &str) -> String {
    let [Message { role, content, .. }] = &g.messages[..] else { panic!("{ctx}: one message") };
    assert_eq!(role, "user", "{ctx}");
    match content {
        Content::Text(text) => text.clone(),
        Content::Parts(parts) => match &parts[..] {
            [part] if part.kind == "text" => part.text.clone().expect("text"),
            _ => panic!("{ctx}: not text-only"),
        },
        Content::Null => panic!("{ctx}: no content"),
    }
}

#[test]
fn chat_templates_and_tokenizers_match_transformers() {
    for &Fixture { name, text, media } in FIXTURES {
        let dir = fixture(name);
        let template = ChatTemplate::load(&dir).expect("template");
        let tokenizer = Tokenizer::load(&dir).expect("tokenizer");
        for variant in media {
            let g = golden(name, variant);
            assert_eq!(template.render(&g.messages, true).expect("renders"), g.prompt, "{name}/{variant}: rendered");
        }
        for variant in text {
            let g = golden(name, variant);
            let prompt = template.render(&g.messages, true).expect("renders");
            assert_eq!(prompt, g.prompt, "{name}/{variant}: rendered template");
            assert_eq!(tokenizer.encode(&prompt, false).expect("encodes"), g.input_ids, "{name}/{variant}: input ids");
            assert_eq!(
                tokenizer.decode(&g.input_ids, false).expect("decodes"),
                g.prompt,
                "{name}/{variant}: round trip"
            );
        }
    }
}

#[test]
fn streamed_text_equals_the_full_decode() {
    for &Fixture { name, text, .. } in FIXTURES {
        let tokenizer = Tokenizer::load(&fixture(name)).expect("tokenizer");
        let g = golden(name, text[text.len() - 1]);
        // The prompt's own tokens include multi-byte characters split across tokens.
        let (context, stream) = g.input_ids.split_at(4);
        let mut detok = Detokenizer::new(context, false);
        let mut text = String::new();
        for &id in stream.iter().chain(&g.greedy) {
            let piece = detok.push(&tokenizer, id).expect("push");
            assert!(!piece.ends_with('\u{FFFD}'), "{name}: a held-back character was emitted");
            text += &piece;
        }
        text += &detok.finish(&tokenizer).expect("finish");
        let all: Vec<u32> = stream.iter().chain(&g.greedy).copied().collect();
        assert_eq!(text, tokenizer.decode(&all, false).expect("decodes"), "{name}");
    }
}

#[test]
fn split_characters_are_held_until_complete() {
    let tokenizer = Tokenizer::load(&fixture("qwen2")).expect("tokenizer");
    // "é" is two bytes; the byte-level vocabulary has a token for each.
    let ids = tokenizer.encode("é", false).expect("encodes");
    let mut detok = Detokenizer::new(&[], false);
    let pieces: Vec<String> = ids.iter().map(|&id| detok.push(&tokenizer, id).expect("push")).collect();
    assert_eq!(pieces.concat(), "é");
    if ids.len() > 1 {
        assert_eq!(pieces[0], "", "the first byte alone is not a character");
    }
    // A stream ending inside a character flushes it as the full decode does.
    let mut detok = Detokenizer::new(&[], false);
    assert_eq!(detok.push(&tokenizer, ids[0]).expect("push"), if ids.len() > 1 { "" } else { "é" });
    assert_eq!(detok.finish(&tokenizer).expect("finish"), tokenizer.decode(&ids[..1], false).expect("decodes"));
}

#[test]
fn stop_tokens_come_from_generation_config() {
    for (name, want) in [("qwen2", vec![386]), ("llama", vec![388]), ("gemma3_text", vec![385, 389])] {
        let dir = fixture(name);
        let tokenizer = Tokenizer::load(&dir).expect("tokenizer");
        assert_eq!(stop_tokens(&dir, &tokenizer).expect("stop tokens"), want, "{name}");
    }
}

/// Runs the real binary.
fn mlxcel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel-host")).args(args).output().expect("the binary runs")
}

/// `generate --json`: the parsed object, after checking the run succeeded.
fn generate_json(model: &Path, extra: &[&str]) -> serde_json::Value {
    let model = model.to_str().expect("utf-8 path");
    let mut args = vec!["generate", "--model", model, "--json"];
    args.extend_from_slice(SHAPE);
    args.extend_from_slice(extra);
    let out = mlxcel(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "generate {args:?} failed: {stderr}");
    serde_json::from_slice(&out.stdout).expect("one json object on stdout")
}

/// `--json --max-tokens 16` greedy gives the golden tokens from the chat
/// template and from `--raw` with the golden prompt. The oracle's greedy
/// tokens ignore end-of-sequence (`eos_token_id=None` in tools/oracle's
/// `greedy`), so these runs pass `--ignore-eos`.
fn check_generate(&Fixture { name, text, .. }: &Fixture) {
    let dir = fixture(name);
    let tokenizer = Tokenizer::load(&dir).expect("tokenizer");
    for variant in text {
        let g = golden(name, variant);
        let content = user_text(&g, &format!("{name}/{variant}"));
        let n = g.greedy.len().to_string();
        for (how, prompt, raw) in [("templated", &content, None), ("raw", &g.prompt, Some("--raw"))] {
            let mut extra = vec!["--prompt", prompt, "--max-tokens", &n, "--ignore-eos"];
            extra.extend(raw);
            let got = generate_json(&dir, &extra);
            let ctx = format!("{name}/{variant} ({how})");
            assert_eq!(got["prompt"], g.prompt.as_str(), "{ctx}: prompt");
            assert_eq!(ids(&got["prompt_ids"]), g.input_ids, "{ctx}: prompt ids");
            assert_eq!(ids(&got["tokens"]), g.greedy, "{ctx}: greedy tokens");
            assert_eq!(got["finish_reason"], "length", "{ctx}");
            assert_eq!(got["text"], tokenizer.decode(&g.greedy, true).expect("decodes").as_str(), "{ctx}: text");
            assert!(got["timings"]["prompt_tokens_per_s"].as_f64().is_some_and(|r| r > 0.0), "{ctx}: {got}");
        }
    }
}

#[test]
fn generate_matches_the_golden_greedy_tokens() {
    // Two workers (the machine has two cores), one process per run.
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        let worker = || {
            while let Some(f) = FIXTURES.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                check_generate(f);
            }
        };
        let workers = [s.spawn(worker), s.spawn(worker)];
        for w in workers {
            if let Err(panic) = w.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

/// A copy of a fixture (by symlink) with another `generation_config.json`.
fn with_generation_config(name: &str, config: serde_json::Value) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(fixture(name)).expect("fixture") {
        let entry = entry.expect("entry");
        if entry.file_name() != "generation_config.json" {
            std::os::unix::fs::symlink(entry.path(), tmp.path().join(entry.file_name())).expect("symlink");
        }
    }
    std::fs::write(tmp.path().join("generation_config.json"), config.to_string()).expect("write");
    tmp
}

#[test]
fn generation_stops_at_an_eos_token_unless_told_not_to() {
    let g = golden("qwen2", "short");
    // Make the golden's third token an end-of-sequence token.
    let eos = g.greedy[2];
    assert!(!g.greedy[..2].contains(&eos));
    let dir = with_generation_config("qwen2", serde_json::json!({ "eos_token_id": [1, eos] }));
    let got = generate_json(dir.path(), &["--prompt", "Say hello.", "--max-tokens", "16"]);
    assert_eq!(ids(&got["tokens"]), g.greedy[..2], "{got}");
    assert_eq!((&got["finish_reason"], &got["stop_token"]), (&"stop".into(), &eos.into()));
    let got = generate_json(dir.path(), &["--prompt", "Say hello.", "--max-tokens", "16", "--ignore-eos"]);
    assert_eq!(ids(&got["tokens"]), g.greedy);
}

#[test]
fn text_streams_to_stdout_and_rates_to_stderr() {
    let dir = fixture("qwen2");
    let model = dir.to_str().expect("utf-8 path");
    let mut args = vec!["generate", "--model", model, "--prompt", "Say hello.", "--max-tokens", "16"];
    args.extend_from_slice(SHAPE);
    let out = mlxcel(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let want = generate_json(&dir, &["--prompt", "Say hello.", "--max-tokens", "16"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}\n", want["text"].as_str().expect("text")));
    assert!(stderr.contains("tokens/s"), "{stderr}");
}

#[test]
fn sampling_is_reproducible_with_a_seed() {
    let dir = fixture("llama");
    let sample = |seed: &str| {
        let args = ["--prompt", "Say hello.", "--max-tokens", "12", "--temperature", "1.5", "--top-p", "0.95"];
        let got = generate_json(&dir, &[&args[..], &["--seed", seed, "--ignore-eos"]].concat());
        assert_eq!(got["seed"], seed.parse::<u64>().expect("seed"));
        ids(&got["tokens"])
    };
    let a = sample("7");
    assert_eq!(a, sample("7"));
    assert_ne!(a, sample("8"), "another seed, another sample (12 tokens at temperature 1.5)");
}

/// bf16 activations are asked for (`--compute bf16`), only with `--allow-unqualified`; a bf16
/// checkpoint otherwise keeps its weights bf16 and computes in f32. (Images under bf16 compute:
/// `generate_image.rs`.)
#[test]
fn bf16_compute_is_opt_in() {
    let text = fixture("qwen2_bf16");
    let default = generate_json(&text, &["--prompt", "hi", "--max-tokens", "1"]);
    assert_eq!((default["weights"].as_str(), default["activations"].as_str()), (Some("bf16"), Some("f32")));
    let asked =
        generate_json(&text, &["--prompt", "hi", "--max-tokens", "1", "--compute", "bf16", "--allow-unqualified"]);
    assert_eq!((asked["weights"].as_str(), asked["activations"].as_str()), (Some("bf16"), Some("bf16")));
    let out = mlxcel(&["generate", "--prompt", "hi", "--model", text.to_str().expect("utf-8"), "--compute", "bf16"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("pass --allow-unqualified"), "{stderr}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let qwen2 = fixture("qwen2");
    let qwen2 = qwen2.to_str().expect("utf-8 path");
    let long = user_text(&golden("qwen2", "long"), "qwen2/long");
    for (args, want) in [
        (
            vec!["--model", "/nonexistent/model", "--prompt", "hi"],
            "the model directory /nonexistent/model does not exist",
        ),
        (
            vec!["--model", qwen2, "--prompt", &long, "--capacity", "64"],
            "the prompt is 88 tokens and the context capacity is 64",
        ),
        (
            vec!["--model", qwen2, "--prompt", "hi", "--temperature", "-1"],
            "temperature must be a finite number >= 0, got -1",
        ),
        (
            vec!["--model", qwen2, "--prompt", "hi", "--temperature", "1", "--top-p", "0"],
            "top_p must be in (0, 1], got 0",
        ),
        (vec!["--model", qwen2, "--prompt", "hi", "--min-p", "1.5"], "min_p must be in [0, 1], got 1.5"),
        (vec!["--model", qwen2, "--prompt", "hi", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (vec!["--model", qwen2, "--prompt", "hi", "--capacity", "100", "--chunk", "32"], "not a positive multiple"),
    ] {
        let out = mlxcel(&[&["generate"], &args[..]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.starts_with("error: ") && stderr.contains(want), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
    // A checkpoint without a chat template needs --raw.
    let dir = tempfile::tempdir().expect("tempdir");
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::os::unix::fs::symlink(fixture("qwen2").join(file), dir.path().join(file)).expect("symlink");
    }
    let out = mlxcel(&["generate", "--model", dir.path().to_str().expect("utf-8"), "--prompt", "hi"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no chat template") && stderr.contains("--raw"), "{stderr}");
}
