//! The Qwen2-VL family plugin (issue 7) built by `tools/build-plugins.sh` and checked by
//! `plugins verify` against the oracle's fixture, stage by stage, through the decoder's logits
//! and greedy tokens; and a golden nudged past the logits tolerance fails at that stage.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

use safetensors::tensor::TensorView;

/// Builds the in-tree plugins into a fresh directory, as the README's run command does.
pub(crate) fn built_plugins(dir: &Path) {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host is in the workspace");
    let output = Command::new(workspace.join("tools/build-plugins.sh"))
        .arg(dir)
        .current_dir(workspace)
        .output()
        .expect("run tools/build-plugins.sh");
    assert!(output.status.success(), "build-plugins failed:\n{}", String::from_utf8_lossy(&output.stderr));
}

/// The fixture's directory in the workspace.
fn fixture() -> std::path::PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host is in the workspace");
    workspace.join("tests/fixtures/qwen2_vl")
}

/// Builds the plugins into `temp` and runs `plugins verify` of qwen2_vl on `fixture`, with a
/// compile cache in `temp`.
fn verify(temp: &Path, fixture: &Path) -> Output {
    let plugins = temp.join("plugins");
    built_plugins(&plugins);
    Command::new(env!("CARGO_BIN_EXE_mlxcel-host"))
        .args(["plugins", "verify"])
        .arg(plugins.join("qwen2_vl.toml"))
        .arg("--fixture")
        .arg(fixture)
        .arg("--cache-dir")
        .arg(temp.join("cache"))
        .env_remove("MLXCEL_PLUGINS")
        .output()
        .expect("run mlxcel-host")
}

/// The lines verify printed for one variant.
fn section<'a>(out: &'a str, variant: &str) -> &'a str {
    let section = out.split(&format!("variant {variant}:\n")).nth(1).expect("the variant is reported");
    section.split("variant ").next().unwrap_or(section)
}

/// A copy of a built plugin directory whose qwen2_vl manifest marks every qualified capability
/// `experimental` again: the gate's refusal, tested without depending on a real manifest's status.
pub(crate) fn experimental_copy(built: &Path, out: &Path) {
    std::fs::create_dir_all(out).expect("create the copy");
    for entry in std::fs::read_dir(built).expect("read the plugin dir") {
        let path = entry.expect("entry").path();
        let target = out.join(path.file_name().expect("file name"));
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).expect("manifest");
            let text = text.replace("status = \"qualified\"", "status = \"experimental\"");
            std::fs::write(target, text).expect("write the manifest");
        } else {
            std::fs::copy(&path, target).expect("copy the library");
        }
    }
}

#[test]
fn verify_passes_the_qwen2_vl_fixture_at_every_stage() {
    let temp = tempfile::tempdir().expect("temp dir");
    let output = verify(temp.path(), &fixture());
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{out}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(out.contains("plugin qwen2-vl 0.1.0 (plugin-api 1.1)"), "{out}");
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
    // The decoder's stages, text_only included (the same path with no placements).
    for variant in ["image", "long", "two_images", "text_only"] {
        let section = section(&out, variant);
        for line in [
            "embeddings   ok       max-abs-diff ",
            "logits       ok       max-abs-diff ",
            "; prefill `logits` (",
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
    assert!(out.contains("greedy tokens matched per variant, for the manifest's evidence:"), "{out}");
}

#[test]
fn verify_fails_at_the_logits_stage_when_a_decode_step_diverges() {
    let temp = tempfile::tempdir().expect("temp dir");
    let copy = temp.path().join("qwen2_vl");
    copy_dir(&fixture(), &copy);
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

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("list fixture") {
        let entry = entry.expect("fixture entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy fixture file");
        }
    }
}
