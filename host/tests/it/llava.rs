//! The LLaVA family plugin (issue 9) built by `tools/build-plugins.sh`: `plugins verify` passes
//! the oracle's fixture at every stage through the decoder's greedy tokens, `generate --image`
//! gives the golden greedy tokens for one and two images, and bad images (corrupt, empty, a
//! strip too thin to resize) are refused with clear errors.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::qwen2_vl::built_plugins;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host is in the workspace")
}

fn fixture() -> PathBuf {
    workspace().join("tests/fixtures/llava")
}

/// The in-tree plugins, built once for this test binary.
fn plugins() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("llava-plugins");
        built_plugins(&dir);
        dir
    })
}

/// A compile cache kept between runs of this test binary.
fn cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("llava-cache")
}

/// The lines verify printed for one variant.
fn section<'a>(out: &'a str, variant: &str) -> &'a str {
    let section = out.split(&format!("variant {variant}:\n")).nth(1).expect("the variant is reported");
    section.split("variant ").next().unwrap_or(section)
}

#[test]
fn verify_passes_the_llava_fixture_at_every_stage() {
    let temp = tempfile::tempdir().expect("temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"))
        .args(["plugins", "verify"])
        .arg(plugins().join("llava.toml"))
        .arg("--fixture")
        .arg(fixture())
        .arg("--cache-dir")
        .arg(temp.path().join("cache"))
        .env_remove("MLXCEL_PLUGINS")
        .output()
        .expect("run mlxcel-host");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{out}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(out.contains("plugin llava 0.1.0 (plugin-api 1.1)"), "{out}");
    assert!(out.contains("config       ok       LlavaForConditionalGeneration (llava)"), "{out}");
    assert!(out.contains("checkpoint   ok       no problems"), "{out}");
    for variant in ["image", "long", "two_images"] {
        let section = section(&out, variant);
        for line in [
            "preprocess   ok       max-abs-diff 0.000e0 (tolerance 1e-6); `pixel_values`",
            "placeholder  ok       exact",
            "encoder      ok       max-abs-diff ",
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
    for stage in ["embeddings", "encoder", "logits", "mask", "placeholder", "positions", "preprocess"] {
        assert!(out.contains(&format!("\n  {stage} = ")), "the summary lacks {stage}:\n{out}");
    }
}

/// `generate` on the llava fixture with these images and flags.
fn generate(images: &[PathBuf], prompt: &str, extra: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"));
    command.arg("generate").arg("--model").arg(fixture()).args(["--prompt", prompt]);
    for image in images {
        command.arg("--image").arg(image);
    }
    command.arg("--plugins").arg(plugins()).arg("--cache-dir").arg(cache());
    command.args(["--capacity", "128", "--chunk", "32", "--max-tokens", "16", "--ignore-eos", "--json"]);
    command.args(extra).env_remove("MLXCEL_PLUGINS").output().expect("the binary runs")
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id")).collect()
}

#[test]
fn image_prompts_give_the_golden_greedy_tokens() {
    let dir = fixture();
    for variant in ["image", "two_images"] {
        let path = dir.join("goldens").join(format!("{variant}.json"));
        let golden: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("golden")).expect("json");
        let images: Vec<PathBuf> =
            golden["images"].as_array().expect("images").iter().map(|p| dir.join(p.as_str().expect("path"))).collect();
        let parts = golden["messages"][0]["content"].as_array().expect("parts");
        let text = parts.iter().find(|p| p["type"] == "text").and_then(|p| p["text"].as_str()).expect("text part");
        // Qualified capabilities are served without --allow-unqualified.
        let out = generate(&images, text, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{variant}: {stderr}");
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one json object on stdout");
        assert_eq!(got["prompt"], golden["prompt"], "{variant}: rendered prompt");
        assert_eq!(ids(&got["prompt_ids"]), ids(&golden["input_ids"]), "{variant}: expanded prompt ids");
        assert_eq!(ids(&got["tokens"]), ids(&golden["greedy_tokens"]), "{variant}: greedy tokens");
        assert_eq!(got["images"].as_array().map(Vec::len), Some(images.len()), "{variant}: {got}");
    }
}

fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "expected a refusal, got: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A grey RGB PNG of `width x height`.
fn png(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().expect("png header");
    writer.write_image_data(&vec![128; (width * height * 3) as usize]).expect("png data");
    writer.finish().expect("png end");
    bytes
}

#[test]
fn corrupt_and_too_small_images_are_refused_clearly() {
    let temp = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, bytes: &[u8]| {
        let path = temp.path().join(name);
        std::fs::write(&path, bytes).expect("write");
        path
    };
    let flags: [&str; 0] = [];

    // Cut off inside the image data.
    let wide = std::fs::read(fixture().join("inputs/wide.png")).expect("png");
    let truncated = write("truncated.png", &wide[..60]);
    let stderr = refused(&generate(std::slice::from_ref(&truncated), "Describe.", &flags));
    assert!(stderr.contains(&format!("cannot use {} as an image", truncated.display())), "{stderr}");
    assert!(stderr.contains("cannot decode the png"), "{stderr}");

    // A header that declares no pixels at all.
    let mut empty = png(4, 4);
    empty[16..20].copy_from_slice(&0u32.to_be_bytes());
    let empty = write("empty.png", &empty);
    let stderr = refused(&generate(std::slice::from_ref(&empty), "Describe.", &flags));
    assert!(stderr.contains("the image is empty (0x4)"), "{stderr}");

    // One pixel high: the shortest-edge resize would make it 56x22400 before the crop.
    let strip = write("strip.png", &png(400, 1));
    let stderr = refused(&generate(std::slice::from_ref(&strip), "Describe.", &flags));
    assert!(
        stderr.contains(
            "a 400x1 image resizes to 22400x56 before the 56x56 centre crop, more than 1003520 pixels (its aspect \
             ratio is too extreme)"
        ),
        "{stderr}"
    );

    // Small but usable: upscaled like the reference does, and generation runs.
    let small = write("small.png", &png(3, 2));
    let out = generate(std::slice::from_ref(&small), "Describe.", &flags);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The golden image and two-image requests inside a mixed batch through the server give the
/// golden tokens: the manifest's `batched` evidence.
#[test]
fn the_golden_image_requests_inside_a_mixed_batch_give_the_golden_tokens() {
    crate::server::mixed_batch_gives_the_golden_tokens("llava");
}
