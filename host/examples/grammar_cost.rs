//! What structured output costs per token: builds the grammar vocabulary of a checkpoint's
//! tokenizer, compiles a few JSON schemas, then walks each grammar with random logits of the
//! model's width, timing the mask (`Constraint::restrict`) and the advance (`accept`) of every
//! token. Prints one JSON object; BENCHMARKS.md sets its figures beside a decode step.
//!
//!     cargo run --release --example grammar_cost -- <checkpoint dir> [tokens per schema]

use std::path::PathBuf;
use std::time::Instant;

use mlxcel_host::grammar::{Grammar, Vocabulary};
use mlxcel_host::text::{Tokenizer, stop_tokens};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use serde_json::json;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir =
        PathBuf::from(args.next().ok_or_else(|| anyhow::anyhow!("usage: grammar_cost <checkpoint dir> [tokens]"))?);
    let budget: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(2000);
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let width = config["vocab_size"].as_u64().or(config["text_config"]["vocab_size"].as_u64()).unwrap_or(0) as usize;
    let tokenizer = Tokenizer::load(&dir)?;
    let ends = stop_tokens(&dir, &tokenizer)?;
    let started = Instant::now();
    let vocabulary = Vocabulary::new(&tokenizer, ends[0])?;
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let schemas = [
        ("json_object", json!({"type": "object"})),
        (
            "pet",
            json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 24}, "kind": {"enum": ["cat", "dog", "bird"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4}},
            "required": ["name", "kind", "age", "tags"], "additionalProperties": false}),
        ),
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut out = serde_json::Map::new();
    for (name, schema) in schemas {
        let grammar = Grammar::JsonSchema(schema);
        let (mut tokens, mut mask_s, mut accept_s, mut compile_s, mut documents) = (0usize, 0.0, 0.0, 0.0, 0usize);
        while tokens < budget {
            let started = Instant::now();
            let mut constraint = vocabulary.constrain(&grammar, ends.clone())?;
            compile_s += started.elapsed().as_secs_f64();
            documents += 1;
            loop {
                let mut logits: Vec<f32> = (0..width).map(|_| (rng.next_u32() % 10_000) as f32 / 1000.0).collect();
                let started = Instant::now();
                constraint.restrict(&mut logits)?;
                mask_s += started.elapsed().as_secs_f64();
                let token = mlxcel_host::sampling::greedy(&logits)?;
                let started = Instant::now();
                constraint.accept(token)?;
                accept_s += started.elapsed().as_secs_f64();
                tokens += 1;
                if ends.contains(&token) || tokens >= budget {
                    break;
                }
            }
        }
        out.insert(
            name.to_owned(),
            json!({
                "tokens": tokens, "documents": documents,
                "compile_ms_per_document": compile_s * 1e3 / documents as f64,
                "mask_us_per_token": mask_s * 1e6 / tokens as f64,
                "accept_us_per_token": accept_s * 1e6 / tokens as f64,
            }),
        );
    }
    let report = json!({
        "checkpoint": dir.display().to_string(), "tokenizer_tokens": tokenizer.token_bytes()?.len(),
        "logits_width": width, "vocabulary_build_ms": build_ms, "schemas": out,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
