//! One conformance check per family fixture, read from the fixture itself: every
//! `plugins verify` stage of every golden variant (through `--json`), `generate --image` giving
//! each media variant's golden prompt ids and greedy tokens, the golden media requests inside a
//! mixed batch through the server, and bad images refused clearly. The cases are every oracle
//! fixture an in-tree manifest accepts (`host/build.rs` writes the list), so a new family's test
//! comes from its manifest and fixture; nothing here names a family. A fixture named
//! `*_bf16_compute` is its checkpoint's reference in bf16 (transformers run in bf16): it is
//! checked under `--compute bf16`, every stage of every variant bit for bit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use mlxcel_plugin_api::manifest::STAGES;
use safetensors::tensor::TensorView;

use crate::support::{copy_dir, fixture, generate, golden_json, ids, plugins, png, refused};

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                check(stringify!($name));
            }
        )*
    };
}

include!(concat!(env!("OUT_DIR"), "/conformance_cases.rs"));

fn check(name: &str) {
    if let Some(stage) = recorded_divergence(name) {
        diverges_where_recorded(name, &stage);
        return;
    }
    verify_passes_every_stage(name);
    let opt_in = if is_bf16_compute(name) { BF16_COMPUTE } else { opt_in(name) };
    generate_gives_the_golden_tokens(name, opt_in);
    crate::server::mixed_batch_gives_the_golden_tokens(name, opt_in);
    if is_audio(name) {
        bad_audio_is_refused_clearly(name, opt_in);
    } else {
        bad_images_are_refused_clearly(name, opt_in);
    }
}

/// The flags of the experimental bf16 compute.
const BF16_COMPUTE: &[&str] = &["--compute", "bf16", mlxcel_plugin_api::ALLOW_UNQUALIFIED_FLAG];

/// Whether the fixture is a bf16-compute reference (see the module doc).
fn is_bf16_compute(name: &str) -> bool {
    name.ends_with("_bf16_compute")
}

/// Whether the fixture's media are audio clips (an audio family's, Gemma 3n's).
fn is_audio(name: &str) -> bool {
    fixture(name)
        .join("inputs")
        .read_dir()
        .expect("inputs")
        .any(|e| e.expect("entry").path().extension().is_some_and(|x| x == "wav"))
}

/// The in-tree manifest accepting the fixture's config: by its architecture, or its model type
/// when it names none.
fn manifest_for(name: &str) -> (serde_json::Value, mlxcel_plugin_api::Manifest) {
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).expect("config"))
            .expect("json");
    let architecture = config["architectures"][0].as_str();
    let model_type = config["model_type"].as_str().expect("model_type");
    let manifests = crate::support::workspace().join("manifests");
    let manifest = std::fs::read_dir(&manifests)
        .expect("manifests")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| mlxcel_plugin_api::Manifest::from_file(&p).expect("manifest"))
        .find(|m| match architecture {
            Some(architecture) => m.accepts.architectures.iter().any(|a| a == architecture),
            None => m.accepts.model_types.iter().any(|t| t == model_type),
        })
        .expect("a manifest accepts the fixture");
    (config, manifest)
}

/// The flags the golden media requests need: none when the manifest qualifies images, else
/// `--allow-unqualified`, after checking that without it a golden image is refused, naming the
/// capability and the flag (an experimental capability is never served by default).
fn opt_in(name: &str) -> &'static [&'static str] {
    let (_, manifest) = manifest_for(name);
    let dir = fixture(name);
    let (capability, flag, file) = if is_audio(name) {
        (
            mlxcel_plugin_api::Capability::Audio,
            "--audio",
            std::fs::read_dir(dir.join("inputs"))
                .expect("inputs")
                .map(|e| e.expect("entry").path())
                .find(|p| p.extension().is_some_and(|x| x == "wav"))
                .expect("a clip"),
        )
    } else {
        (mlxcel_plugin_api::Capability::Image, "--image", dir.join("inputs/wide.png"))
    };
    if manifest.capability(capability).map(|c| c.status) == Some(mlxcel_plugin_api::Status::Qualified) {
        return &[];
    }
    let file = file.to_str().expect("utf-8 path").to_owned();
    let stderr = refused(&generate(plugins(), &dir, &[], "Describe.", &[flag, &file]));
    assert!(
        stderr.contains(&format!("capability `{}`", capability.as_str()))
            && stderr.contains(mlxcel_plugin_api::ALLOW_UNQUALIFIED_FLAG),
        "{name}: an unqualified {} capability must be refused by default: {stderr}",
        capability.as_str()
    );
    &[mlxcel_plugin_api::ALLOW_UNQUALIFIED_FLAG]
}

/// The first divergent stage the fixture's manifest records for the fixture's checkpoint form,
/// when it marks that form `experimental` (an MLX-quantized checkpoint, `forms.mlx_affine`);
/// `None` for transformers' own forms and qualified ones.
fn recorded_divergence(name: &str) -> Option<String> {
    let (config, manifest) = manifest_for(name);
    config.get("quantization")?;
    let form = manifest.form("mlx_affine").unwrap_or_else(|| panic!("{name}: the manifest has no forms.mlx_affine"));
    match form.status {
        mlxcel_plugin_api::Status::Experimental => form.first_divergence.clone(),
        _ => None,
    }
}

/// An experimental form's fixture: verify fails, first at the recorded stage, and its
/// text-only variants (the decoder alone) still pass every stage.
fn diverges_where_recorded(name: &str, recorded: &str) {
    let temp = tempfile::tempdir().expect("temp dir");
    let (ok, report, err) = verify_json(&fixture(name), &temp.path().join("cache"), &[]);
    assert!(!ok, "{name}: verify passes; the manifest's first_divergence ({recorded}) is out of date:\n{err}");
    let stages = report["stages"].as_array().expect("stages");
    let first = stages.iter().find(|s| s["outcome"] == "failed").expect("a failed stage");
    assert_eq!(first["stage"], recorded, "{name}: the first divergence moved: {first}\n{err}");
    for s in stages.iter().filter(|s| s["variant"] == "text_only") {
        assert_ne!(s["outcome"], "failed", "{name}: the text path diverges: {s}");
    }
}

/// `plugins verify --json` on `dir` with a fresh compile cache, and `extra` flags.
fn verify_json(dir: &Path, cache: &Path, extra: &[&str]) -> (bool, serde_json::Value, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"))
        .args(["plugins", "verify"])
        .arg(plugins())
        .arg("--fixture")
        .arg(dir)
        .arg("--cache-dir")
        .arg(cache)
        .arg("--json")
        .args(extra)
        .env_remove("MLXCEL_PLUGINS")
        .output()
        .expect("run mlxcel-host");
    let err = String::from_utf8_lossy(&output.stderr).into_owned();
    let report = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("no json report ({e}):\n{err}"));
    (output.status.success(), report, err)
}

fn stage<'a>(report: &'a serde_json::Value, variant: &str, name: &str) -> Option<&'a serde_json::Value> {
    report["stages"].as_array()?.iter().find(|s| s["variant"] == variant && s["stage"] == name)
}

/// The media a golden variant's prompt carries: its images, then its audio clips.
fn media(golden: &serde_json::Value) -> Vec<String> {
    ["images", "audio"]
        .iter()
        .flat_map(|key| golden[key].as_array().into_iter().flatten())
        .map(|p| p.as_str().expect("path").to_owned())
        .collect()
}

fn verify_passes_every_stage(name: &str) {
    let temp = tempfile::tempdir().expect("temp dir");
    let extra = if is_bf16_compute(name) { BF16_COMPUTE } else { &[] };
    let (ok, report, err) = verify_json(&fixture(name), &temp.path().join("cache"), extra);
    println!("{err}");
    assert!(ok && report["passed"] == true, "{name}: verify:\n{err}");
    for fixture_stage in ["config", "checkpoint"] {
        let s = stage(&report, "(fixture)", fixture_stage).unwrap_or_else(|| panic!("{name}: no {fixture_stage}"));
        assert_eq!(s["outcome"], "checked", "{name}: {s}");
    }
    let variants = report["variants"].as_array().expect("variants");
    assert!(variants.len() >= 2, "{name}: {variants:?}");
    for variant in variants.iter().map(|v| v.as_str().expect("name")) {
        let golden = golden_json(name, variant);
        let with_media = !media(&golden).is_empty();
        for s in STAGES.iter().chain(&["tokens"]) {
            let got = stage(&report, variant, s).unwrap_or_else(|| panic!("{name}/{variant}: no stage {s}"));
            // Tokens are counted (`checked`, "16/16"); the other stages are compared.
            let allowed: &[&str] = match *s {
                "tokens" => &["checked"],
                "embeddings" | "logits" => &["passed"],
                _ if with_media => &["passed"],
                _ => &["passed", "skipped"],
            };
            assert!(
                allowed.iter().any(|a| got["outcome"] == *a),
                "{name}/{variant}: stage {s} is {}, expected {allowed:?}: {got}",
                got["outcome"]
            );
        }
        let steps = golden["greedy_tokens"].as_array().expect("greedy tokens").len();
        let greedy = &report["greedy"][variant];
        assert_eq!((greedy["matched"].as_u64(), greedy["total"].as_u64()), (Some(steps as u64), Some(steps as u64)));
    }
}

fn generate_gives_the_golden_tokens(name: &str, opt_in: &[&str]) {
    let dir = fixture(name);
    let mut checked = 0;
    for variant in crate::support::variants(name) {
        let golden = golden_json(name, &variant);
        let files: Vec<PathBuf> = media(&golden).iter().map(|p| dir.join(p)).collect();
        if files.is_empty() {
            continue;
        }
        let (images, clips): (Vec<PathBuf>, Vec<PathBuf>) =
            files.into_iter().partition(|p| p.extension().is_none_or(|x| x != "wav"));
        let mut extra: Vec<String> = opt_in.iter().map(|s| (*s).to_owned()).collect();
        for clip in &clips {
            extra.extend(["--audio".to_owned(), clip.to_str().expect("utf-8 path").to_owned()]);
        }
        let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
        // `generate --image` places the images before its one text prompt: the variants laid
        // out so (media parts, then one text part) are its golden requests.
        let parts = golden["messages"][0]["content"].as_array().expect("parts");
        let Some((last, before)) = parts.split_last() else { continue };
        if last["type"] != "text" || before.iter().any(|p| p["type"] == "text") {
            continue;
        }
        let text = last["text"].as_str().expect("text");
        // Qualified capabilities are served without --allow-unqualified.
        let out = generate(plugins(), &dir, &images, text, &extra);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}/{variant}: {stderr}");
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one json object on stdout");
        assert_eq!(got["prompt"], golden["prompt"], "{name}/{variant}: rendered prompt");
        assert_eq!(ids(&got["prompt_ids"]), ids(&golden["input_ids"]), "{name}/{variant}: expanded prompt ids");
        // A golden cut before a tie (common.reference_goldens' cut_at_tie) holds fewer tokens.
        let want = ids(&golden["greedy_tokens"]);
        let got_tokens = ids(&got["tokens"]);
        assert_eq!(got_tokens[..want.len().min(got_tokens.len())], want[..], "{name}/{variant}: greedy tokens");
        checked += 1;
    }
    assert!(checked >= 2, "{name}: only {checked} media variants went through generate");
}

fn bad_images_are_refused_clearly(name: &str, opt_in: &[&str]) {
    let dir = fixture(name);
    let temp = tempfile::tempdir().expect("temp dir");
    let write = |file: &str, bytes: &[u8]| {
        let path = temp.path().join(file);
        std::fs::write(&path, bytes).expect("write");
        path
    };
    // Every image fixture has the wide picture as a PNG input (the server's mixed batch sends it).
    let any_image = dir.join("inputs/wide.png");
    let bytes = std::fs::read(&any_image).expect("png");
    let cases = [
        (write("truncated.png", &bytes[..60]), "cannot decode the png"),
        (dir.join("config.json"), "not an image in a format the host decodes (png, jpeg, webp, gif)"),
        (fixture("images").join("refused_jpeg_cmyk.jpg"), "unsupported jpeg image: cmyk colour"),
        (fixture("images").join("refused_webp_animated.webp"), "unsupported webp image: animated"),
        (
            {
                let mut empty = png(4, 4);
                empty[16..20].copy_from_slice(&0u32.to_be_bytes());
                write("empty.png", &empty)
            },
            "the png image is empty (0x4)",
        ),
    ];
    for (path, why) in &cases {
        let stderr = refused(&generate(plugins(), &dir, std::slice::from_ref(path), "Describe.", opt_in));
        assert!(stderr.contains(&format!("cannot use {} as an image", path.display())), "{name}: {stderr}");
        assert!(stderr.contains(why), "{name}: expected {why:?} in {stderr}");
    }
    // Small but usable: resized as the reference resizes it, and generation runs.
    let small = write("small.png", &png(3, 2));
    let out = generate(plugins(), &dir, &[small], "Describe.", opt_in);
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
}

/// An audio family's bad clips, each refused with what is wrong and where: a truncated WAV, a
/// file that is not one, a clip longer than the family takes.
fn bad_audio_is_refused_clearly(name: &str, opt_in: &[&str]) {
    let dir = fixture(name);
    let temp = tempfile::tempdir().expect("temp dir");
    let clip = std::fs::read_dir(dir.join("inputs"))
        .expect("inputs")
        .map(|e| e.expect("entry").path())
        .find(|p| p.extension().is_some_and(|x| x == "wav"))
        .expect("a clip");
    let bytes = std::fs::read(&clip).expect("wav");
    let write = |file: &str, bytes: &[u8]| {
        let path = temp.path().join(file);
        std::fs::write(&path, bytes).expect("write");
        path
    };
    // A RIFF header declaring its data, then a minute of 16 kHz mono 16-bit silence.
    let long = {
        let samples = 16_000 * 60;
        let mut w = b"RIFF".to_vec();
        w.extend_from_slice(&(36 + 2 * samples as u32).to_le_bytes());
        w.extend_from_slice(b"WAVEfmt ");
        w.extend_from_slice(&16u32.to_le_bytes());
        w.extend_from_slice(&[1, 0, 1, 0]);
        w.extend_from_slice(&16_000u32.to_le_bytes());
        w.extend_from_slice(&32_000u32.to_le_bytes());
        w.extend_from_slice(&[2, 0, 16, 0]);
        w.extend_from_slice(b"data");
        w.extend_from_slice(&(2 * samples as u32).to_le_bytes());
        w.resize(w.len() + 2 * samples, 0);
        write("long.wav", &w)
    };
    // An audio family's manifest lists no image capability: an image is refused, naming it.
    let image = fixture("images").join("refused_jpeg_cmyk.jpg");
    let stderr = refused(&generate(plugins(), &dir, &[image], "Describe.", opt_in));
    assert!(stderr.contains("capability `image` is not supported"), "{name}: {stderr}");
    for path in [write("truncated.wav", &bytes[..30]), dir.join("config.json"), long] {
        let file = path.to_str().expect("utf-8 path");
        let mut args = vec!["--audio", file];
        args.extend_from_slice(opt_in);
        let stderr = refused(&generate(plugins(), &dir, &[], "Describe.", &args));
        assert!(stderr.contains(&format!("cannot use {} as audio", path.display())), "{name}: {stderr}");
    }
}

/// Processor settings a family does not implement, each refused before any image is touched:
/// (fixture, file, the fixture's text, the text that asks for it, what the refusal says).
const UNSUPPORTED_CONFIGS: &[(&str, &str, &str, &str, &str)] = &[(
    "gemma3",
    "processor_config.json",
    "\"do_pan_and_scan\": false",
    "\"do_pan_and_scan\": true",
    "do_pan_and_scan: true (pan-and-scan crops are not implemented",
)];

#[test]
fn unsupported_processor_configs_are_refused_before_any_image() {
    for (name, file, from, to, why) in UNSUPPORTED_CONFIGS {
        let temp = tempfile::tempdir().expect("temp dir");
        let copy = temp.path().join(name);
        copy_dir(&fixture(name), &copy);
        let path = copy.join(file);
        let text = std::fs::read_to_string(&path).expect("config");
        let edited = text.replace(from, to);
        assert_ne!(edited, text, "{name}: {file} has no {from}");
        std::fs::write(&path, edited).expect("write");
        let image = copy.join(&media(&golden_json(name, "image"))[0]);
        let stderr = refused(&generate(plugins(), &copy, &[image], "Describe.", &[]));
        assert!(stderr.contains(&format!("plugin cannot read {}", copy.display())), "{name}: {stderr}");
        assert!(stderr.contains(why), "{name}: expected {why:?} in {stderr}");
    }
}

/// The lines verify printed for one variant.
fn section<'a>(out: &'a str, variant: &str) -> &'a str {
    let section = out.split(&format!("variant {variant}:\n")).nth(1).expect("the variant is reported");
    section.split("variant ").next().unwrap_or(section)
}

/// `plugins verify` of the qwen2_vl plugin on `dir` (its human report).
fn verify(temp: &Path, dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel-host"))
        .args(["plugins", "verify"])
        .arg(plugins().join("qwen2_vl.toml"))
        .arg("--fixture")
        .arg(dir)
        .arg("--cache-dir")
        .arg(temp.join("cache"))
        .env_remove("MLXCEL_PLUGINS")
        .output()
        .expect("run mlxcel-host")
}

/// verify itself: a golden nudged past the tolerance fails at that stage and names the first
/// divergent coordinate, while the stages around it still pass.
#[test]
fn verify_fails_at_the_logits_stage_when_a_decode_step_diverges() {
    let temp = tempfile::tempdir().expect("temp dir");
    let copy = temp.path().join("qwen2_vl");
    copy_dir(&fixture("qwen2_vl"), &copy);
    // Shift one golden logit of decode step 5 (vocabulary id 7, not the step's argmax) by far
    // more than the 1e-4 tolerance.
    let path = copy.join("goldens/image.safetensors");
    let bytes = std::fs::read(&path).expect("read goldens");
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).expect("goldens header");
    let metadata: Option<HashMap<String, String>> = header.metadata().clone();
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("goldens parse");
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.dtype(), view.shape().to_vec(), view.data().to_vec()))
        .collect();
    let logits = tensors.iter_mut().find(|t| t.0 == "decode_logits").expect("decode_logits");
    let vocab = logits.2[1];
    let at = (5 * vocab + 7) * 4;
    let value = f32::from_le_bytes(logits.3[at..at + 4].try_into().expect("4 bytes")) - 0.01;
    logits.3[at..at + 4].copy_from_slice(&value.to_le_bytes());
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| (name.as_str(), TensorView::new(*dtype, shape.clone(), data).expect("view")))
        .collect();
    std::fs::write(&path, safetensors::serialize(views, metadata).expect("serialize")).expect("write goldens");

    let output = verify(temp.path(), &copy);
    let (out, err) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    println!("{out}{err}");
    assert!(!output.status.success(), "{out}");
    let image = section(&out, "image");
    let first =
        format!("logits       FAILED   stage decode_logits: first divergence at flat index {} [5, 7]", 5 * vocab + 7);
    assert!(image.contains(&first), "{out}");
    assert!(image.contains("1 of 7168 over tolerance"), "{out}");
    // The steps are fed the golden tokens, so the argmax still matches everywhere.
    assert!(image.contains("tokens       ok       16/16"), "{out}");
    assert!(section(&out, "two_images").contains("logits       ok"), "{out}");
    assert!(err.contains("verify failed: 1 stage(s) failed; the first is variant image, stage logits"), "{err}");
}

/// A two-part token table split at another row than the vocabulary's (transformers 5.24 saves
/// Molmo2's `wte.embedding` and `wte.new_embedding` as two equal halves) is the same table: the
/// checkpoint passes verify at every stage, as the fixture does.
#[test]
fn a_token_table_split_elsewhere_reads_as_the_same_table() {
    let temp = tempfile::tempdir().expect("temp dir");
    let copy = temp.path().join("molmo2");
    copy_dir(&fixture("molmo2"), &copy);
    let path = copy.join("model.safetensors");
    let bytes = std::fs::read(&path).expect("read the checkpoint");
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).expect("header");
    let metadata: Option<HashMap<String, String>> = header.metadata().clone();
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("parse");
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.dtype(), view.shape().to_vec(), view.data().to_vec()))
        .collect();
    let (base, extra) = ("model.transformer.wte.embedding", "model.transformer.wte.new_embedding");
    let part = |name: &str| tensors.iter().position(|t| t.0 == name).expect(name);
    let (b, e) = (part(base), part(extra));
    let hidden = tensors[b].2[1];
    let mut table = tensors[b].3.clone();
    table.extend_from_slice(&tensors[e].3);
    let rows = tensors[b].2[0] + tensors[e].2[0];
    let half = rows / 2;
    let row = table.len() / rows;
    tensors[b].2 = vec![half, hidden];
    tensors[b].3 = table[..half * row].to_vec();
    tensors[e].2 = vec![rows - half, hidden];
    tensors[e].3 = table[half * row..].to_vec();
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| (name.as_str(), TensorView::new(*dtype, shape.clone(), data).expect("view")))
        .collect();
    std::fs::write(&path, safetensors::serialize(views, metadata).expect("serialize")).expect("write");

    let (ok, report, err) = verify_json(&copy, &temp.path().join("cache"), &[]);
    assert!(ok && report["passed"] == true, "split at {half} of {rows}: {err}");
}
