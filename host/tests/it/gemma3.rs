//! The Gemma3 family plugin (issue 8): `plugins verify` on the oracle's fixture passes every
//! stage through the decoder's logits and greedy tokens; `generate --image` gives the golden
//! greedy tokens of the image and two-image prompts; the golden image requests inside a mixed
//! batch through the server give them too; bad input and an unsupported processor config are
//! refused clearly. At the decoder level, the merged embeddings built three wrong ways (causal
//! attention only, text scaled twice, text not scaled) leave the golden logits' 1e-4 tolerance
//! while the right way stays inside it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use mlxcel_golden::{Fixture, Golden};
use mlxcel_host::decoder::{BundleShape, Decoder, DecoderOptions, Extras, Logits, Positions};
use mlxcel_shim::{CompileCache, Compiler, Device, Driver, HostTensor};

use crate::qwen2_vl::built_plugins;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host is in the workspace")
}

fn fixture() -> PathBuf {
    workspace().join("tests/fixtures/gemma3")
}

/// The in-tree plugins, built once for this test binary.
fn plugins() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gemma3-plugins");
        built_plugins(&dir);
        dir
    })
}

fn golden_json(variant: &str) -> serde_json::Value {
    let path = fixture().join("goldens").join(format!("{variant}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden")).expect("json")
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id")).collect()
}

/// The lines verify printed for one variant.
fn section<'a>(out: &'a str, variant: &str) -> &'a str {
    let section = out.split(&format!("variant {variant}:\n")).nth(1).expect("the variant is reported");
    section.split("variant ").next().unwrap_or(section)
}

#[test]
fn verify_passes_the_gemma3_fixture_at_every_stage() {
    let temp = tempfile::tempdir().expect("temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"))
        .args(["plugins", "verify"])
        .arg(plugins().join("gemma3.toml"))
        .arg("--fixture")
        .arg(fixture())
        .arg("--cache-dir")
        .arg(temp.path().join("cache"))
        .env_remove("MLXCEL_PLUGINS")
        .output()
        .expect("run mlxcel-host");
    let (out, err) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    println!("{out}{err}");
    assert!(output.status.success(), "{out}\n{err}");
    assert!(out.contains("plugin gemma3 0.1.0 (plugin-api 1.1)"), "{out}");
    assert!(out.contains("checkpoint   ok       no problems"), "{out}");
    for variant in ["image", "long", "two_images"] {
        let section = section(&out, variant);
        for line in [
            "preprocess   ok       max-abs-diff 0.000e0",
            "placeholder  ok       exact",
            "encoder      ok",
            "positions    ok       exact",
            "mask         ok       exact",
        ] {
            assert!(section.contains(line), "variant {variant}: missing {line:?} in:\n{out}");
        }
    }
    assert!(out.contains("variant text_only:\n  preprocess   skipped"), "{out}");
    for variant in ["image", "long", "two_images", "text_only"] {
        let section = section(&out, variant);
        for line in [
            "embeddings   ok       max-abs-diff ",
            "logits       ok       max-abs-diff ",
            "`decode_logits` (16 steps) ",
            "tokens       ok       16/16\n",
        ] {
            assert!(section.contains(line), "variant {variant}: missing {line:?} in:\n{out}");
        }
        assert!(out.contains(&format!("\n  {variant} = 16/16")), "{out}");
    }
    assert!(out.contains("verify: passed (4 variants)"), "{out}");
    // The fixture's image blocks are 16 rows: the decoder keeps the 32-row chunk.
    assert!(err.contains("chunk 32, one slot"), "{err}");
}

/// `generate` on a checkpoint with these images and flags.
fn generate(model: &Path, images: &[PathBuf], prompt: &str, extra: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"));
    command.arg("generate").arg("--model").arg(model).args(["--prompt", prompt]);
    for image in images {
        command.arg("--image").arg(image);
    }
    command.arg("--plugins").arg(plugins());
    command.args(["--capacity", "128", "--chunk", "32", "--max-tokens", "16", "--ignore-eos", "--json"]);
    command.args(extra).env_remove("MLXCEL_PLUGINS").output().expect("the binary runs")
}

#[test]
fn generate_gives_the_golden_greedy_tokens_for_one_and_two_images() {
    let dir = fixture();
    for variant in ["image", "two_images"] {
        let golden = golden_json(variant);
        let images: Vec<PathBuf> =
            golden["images"].as_array().expect("images").iter().map(|p| dir.join(p.as_str().expect("path"))).collect();
        let parts = golden["messages"][0]["content"].as_array().expect("parts");
        let text = parts.iter().find(|p| p["type"] == "text").and_then(|p| p["text"].as_str()).expect("text part");
        // Qualified capabilities are served without --allow-unqualified.
        let out = generate(&dir, &images, text, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{variant}: {stderr}");
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one json object on stdout");
        assert_eq!(got["prompt"], golden["prompt"], "{variant}: rendered prompt");
        assert_eq!(ids(&got["prompt_ids"]), ids(&golden["input_ids"]), "{variant}: expanded prompt ids");
        assert_eq!(ids(&got["tokens"]), ids(&golden["greedy_tokens"]), "{variant}: greedy tokens");
    }
}

fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "expected a refusal, got: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Copies the fixture's files (not its goldens) into `to`.
fn copy_checkpoint(to: &Path) {
    for sub in ["", "inputs"] {
        std::fs::create_dir_all(to.join(sub)).expect("mkdir");
        for entry in std::fs::read_dir(fixture().join(sub)).expect("list the fixture") {
            let path = entry.expect("entry").path();
            if path.is_file() {
                std::fs::copy(&path, to.join(sub).join(path.file_name().expect("name"))).expect("copy");
            }
        }
    }
}

#[test]
fn a_corrupt_image_and_an_unsupported_processor_config_are_refused_clearly() {
    let dir = fixture();
    let temp = tempfile::tempdir().expect("temp dir");
    let truncated = temp.path().join("truncated.png");
    let bytes = std::fs::read(dir.join("inputs/wide.png")).expect("png");
    std::fs::write(&truncated, &bytes[..40]).expect("write");
    let stderr = refused(&generate(&dir, std::slice::from_ref(&truncated), "Describe.", &[]));
    assert!(stderr.contains("cannot decode the png"), "{stderr}");

    let config = dir.join("config.json");
    let stderr = refused(&generate(&dir, std::slice::from_ref(&config), "Describe.", &[]));
    assert!(stderr.contains("not a png image"), "{stderr}");

    // Pan-and-scan crops are not implemented: the checkpoint that asks for them is refused
    // before any image is touched.
    let copy = temp.path().join("gemma3-pan-and-scan");
    copy_checkpoint(&copy);
    let path = copy.join("processor_config.json");
    let text = std::fs::read_to_string(&path).expect("processor config");
    let pan = text.replace("\"do_pan_and_scan\": false", "\"do_pan_and_scan\": true");
    assert_ne!(pan, text);
    std::fs::write(&path, pan).expect("write");
    let stderr = refused(&generate(&copy, &[copy.join("inputs/wide.png")], "Describe.", &[]));
    assert!(stderr.contains("the gemma3 plugin cannot read"), "{stderr}");
    assert!(stderr.contains("do_pan_and_scan: true (pan-and-scan crops are not implemented"), "{stderr}");
}

/// The fixture's decoder with one slot.
fn decoder() -> Decoder {
    let compiler = Compiler::locate().expect("compiler");
    let cache = CompileCache::new(CompileCache::default_dir());
    let device = Device::new(Driver::LocalSync).expect("device");
    let options =
        DecoderOptions { shape: BundleShape { chunk: 32, capacity: 128, slots: 1 }, ..DecoderOptions::default() };
    Decoder::load(&fixture(), options, &device, &compiler, &cache).expect("decoder loads")
}

fn golden(variant: &str) -> Golden {
    Fixture::open(fixture()).golden(variant).expect("golden")
}

/// How the merged prefill input is built.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Merge {
    /// As the host merges: raw rows scaled once by sqrt(hidden), projected rows placed
    /// unscaled, bidirectional attention inside each image's soft tokens.
    Right,
    /// The bidirectional blocks dropped: causal attention only.
    CausalOnly,
    /// The text rows scaled twice (a scaled `embed` scaled again by the merge).
    DoubleScaled,
    /// The text rows not scaled at all.
    Unscaled,
}

/// Prefills the golden prompt merged `how` (the golden projected rows at the soft tokens) and
/// returns the max-abs-diff of its logits from the golden ones, with the embeddings' own.
fn logits_diff(dec: &mut Decoder, variant: &str, how: Merge) -> (f32, f32) {
    let g = golden(variant);
    let tokens: Vec<u32> = g.input_ids().expect("ids").iter().map(|&t| t as u32).collect();
    let n = tokens.len();
    let hidden = dec.config().hidden;
    let scale = dec.embed_scale();
    let raw = dec.embed(&tokens).expect("embed");
    let text = match how {
        Merge::Right | Merge::CausalOnly => Decoder::scale_embeddings(&raw, scale).expect("scale"),
        Merge::DoubleScaled => {
            let once = Decoder::scale_embeddings(&raw, scale).expect("scale");
            Decoder::scale_embeddings(&once, scale).expect("scale again")
        }
        Merge::Unscaled => raw,
    };
    let mut values: Vec<f32> = text.to_vec().expect("f32");
    let features = g.tensor("image_features").expect("image_features").as_f32().expect("f32").to_vec();
    let soft = 392;
    let mut rows = features.chunks_exact(hidden);
    let mut blocks: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        if t != soft {
            continue;
        }
        values[i * hidden..(i + 1) * hidden].copy_from_slice(rows.next().expect("a projected row per soft token"));
        match blocks.last_mut() {
            Some(b) if b.end == i => b.end = i + 1,
            _ => blocks.push(i..i + 1),
        }
    }
    assert!(rows.next().is_none(), "{variant}: every projected row placed");
    let embeds = g.tensor("inputs_embeds").expect("inputs_embeds").as_f32().expect("f32");
    let embed_diff = values.iter().zip(embeds).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let x = HostTensor::from_slice(vec![n, hidden], &values).expect("embeddings");
    let extras =
        Extras { bidirectional: if how == Merge::CausalOnly { Vec::new() } else { blocks }, ..Extras::default() };
    let positions = Positions::OneD((0..n as i32).collect());
    dec.release(0).expect("release");
    let logits = dec.prefill_embeddings(0, &x, &positions, &extras, Logits::All).expect("prefill");
    let want = g.tensor("logits").expect("logits").as_f32().expect("f32");
    assert_eq!(logits.len(), want.len(), "{variant}: logits");
    let diff = logits.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    (embed_diff, diff)
}

/// Seed 001's negatives: a causal-only mask, double scaling and missing scaling each take the
/// logits out of the 1e-4 tolerance; the right merge stays inside it.
#[test]
fn wrong_merges_diverge_from_the_golden_logits_and_the_right_one_does_not() {
    let mut dec = decoder();
    assert_eq!(dec.embed_scale(), 8.0, "sqrt(64)");
    for variant in ["image", "two_images"] {
        let (embeds, right) = logits_diff(&mut dec, variant, Merge::Right);
        println!("{variant}: right merge: inputs_embeds {embeds:e}, logits {right:e}");
        assert_eq!(embeds, 0.0, "{variant}: the right merge is the reference's inputs_embeds");
        assert!(right <= 1e-4, "{variant}: the right merge's logits are {right:e} from the golden");
        for wrong in [Merge::CausalOnly, Merge::DoubleScaled, Merge::Unscaled] {
            let (embeds, diff) = logits_diff(&mut dec, variant, wrong);
            println!("{variant}: {wrong:?}: inputs_embeds {embeds:e}, logits {diff:e}");
            assert!(diff > 1e-4, "{variant}: {wrong:?} stays within the tolerance ({diff:e})");
        }
    }
}

/// The golden image and two-image requests inside a mixed batch through the server give the
/// golden tokens: the manifest's `batched` evidence.
#[test]
fn the_golden_image_requests_inside_a_mixed_batch_give_the_golden_tokens() {
    crate::server::mixed_batch_gives_the_golden_tokens("gemma3");
}
