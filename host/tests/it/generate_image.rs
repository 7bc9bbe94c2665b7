//! `mlxcel-host generate --image` end to end through the Qwen2-VL family plugin: the golden
//! greedy tokens of the fixture's image variants, the capability gate, and clear refusals of a
//! file that is not an image and of a text-only checkpoint.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::qwen2_vl::{built_plugins, experimental_copy};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// The in-tree plugins, built once for this test binary.
fn plugins() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("generate-image-plugins");
        built_plugins(&dir);
        dir
    })
}

/// The in-tree plugins with qwen2_vl's capabilities marked experimental.
fn experimental_plugins() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("generate-image-plugins-experimental");
        let _ = std::fs::remove_dir_all(&dir);
        experimental_copy(plugins(), &dir);
        dir
    })
}

/// `generate` on a fixture with these images and flags.
fn generate(model: &Path, images: &[PathBuf], prompt: &str, extra: &[&str]) -> Output {
    generate_in(plugins(), model, images, prompt, extra)
}

fn generate_in(plugin_dir: &Path, model: &Path, images: &[PathBuf], prompt: &str, extra: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"));
    command.arg("generate").arg("--model").arg(model).args(["--prompt", prompt]);
    for image in images {
        command.arg("--image").arg(image);
    }
    command.arg("--plugins").arg(plugin_dir);
    command.args(["--capacity", "128", "--chunk", "32", "--max-tokens", "16", "--ignore-eos", "--json"]);
    command.args(extra).env_remove("MLXCEL_PLUGINS").output().expect("the binary runs")
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id")).collect()
}

#[test]
fn image_prompts_give_the_golden_greedy_tokens() {
    let dir = fixture("qwen2_vl");
    for variant in ["image", "two_images"] {
        let path = dir.join("goldens").join(format!("{variant}.json"));
        let golden: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("golden")).expect("json");
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
        assert_eq!(got["images"].as_array().map(Vec::len), Some(images.len()), "{variant}: {got}");
    }
}

fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "expected a refusal, got: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_experimental_capability_is_refused_without_the_flag() {
    let dir = fixture("qwen2_vl");
    let plugins = experimental_plugins();
    let stderr = refused(&generate_in(plugins, &dir, &[dir.join("inputs/wide.png")], "Describe this image.", &[]));
    assert!(stderr.contains("capability `image` of plugin `qwen2-vl` is experimental"), "{stderr}");
    assert!(stderr.contains("--allow-unqualified"), "{stderr}");
    let two = [dir.join("inputs/wide.png"), dir.join("inputs/tall.png")];
    let stderr = refused(&generate_in(plugins, &dir, &two, "Compare.", &[]));
    assert!(stderr.contains("--allow-unqualified"), "{stderr}");
}

#[test]
fn a_file_that_is_not_an_image_is_refused_clearly() {
    let dir = fixture("qwen2_vl");
    let config = dir.join("config.json");
    let stderr = refused(&generate(&dir, std::slice::from_ref(&config), "Describe.", &["--allow-unqualified"]));
    assert!(stderr.contains(&format!("cannot use {} as an image: not a png image", config.display())), "{stderr}");

    let temp = tempfile::tempdir().expect("temp dir");
    let truncated = temp.path().join("truncated.png");
    let bytes = std::fs::read(dir.join("inputs/wide.png")).expect("png");
    std::fs::write(&truncated, &bytes[..40]).expect("write");
    let stderr = refused(&generate(&dir, std::slice::from_ref(&truncated), "Describe.", &["--allow-unqualified"]));
    assert!(stderr.contains("cannot decode the png"), "{stderr}");
}

#[test]
fn a_text_only_checkpoint_refuses_images() {
    let qwen2 = fixture("qwen2");
    let image = fixture("qwen2_vl").join("inputs/wide.png");
    let stderr = refused(&generate(&qwen2, &[image], "Describe.", &["--allow-unqualified"]));
    assert!(stderr.contains("takes no images"), "{stderr}");
    assert!(stderr.contains("images need a vision-language checkpoint and its family plugin"), "{stderr}");
}
