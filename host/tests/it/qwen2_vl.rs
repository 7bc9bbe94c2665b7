//! The Qwen2-VL family plugin (issue 7) built by `tools/build-plugins.sh` and checked by
//! `plugins verify` against the oracle's fixture, stage by stage.

use std::path::Path;
use std::process::Command;

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

#[test]
fn verify_passes_the_qwen2_vl_fixture_at_every_stage() {
    let temp = tempfile::tempdir().expect("temp dir");
    let plugins = temp.path().join("plugins");
    built_plugins(&plugins);
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host is in the workspace");
    let fixture = workspace.join("tests/fixtures/qwen2_vl");
    let cache = temp.path().join("cache");
    let output = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"))
        .args(["plugins", "verify"])
        .arg(plugins.join("qwen2_vl.toml"))
        .arg("--fixture")
        .arg(&fixture)
        .arg("--cache-dir")
        .arg(&cache)
        .env_remove("MLXCEL_PLUGINS")
        .output()
        .expect("run mlxcel-host");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{out}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(out.contains("plugin qwen2-vl 0.1.0 (plugin-api 1.1)"), "{out}");
    assert!(out.contains("checkpoint   ok       no problems"), "{out}");
    for variant in ["image", "long", "two_images"] {
        let section = out.split(&format!("variant {variant}:\n")).nth(1).expect("the variant is reported");
        let section = section.split("variant ").next().unwrap_or(section);
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
    assert!(out.contains("verify: passed (4 variants)"), "{out}");
}
