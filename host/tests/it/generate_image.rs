//! `mlxcel-host generate --image` refusals that are not a family's: the capability gate (a
//! capability the manifest does not mark qualified needs `--allow-unqualified`) and a text-only
//! checkpoint that takes no images. The golden tokens of every family's media variants are
//! `conformance.rs`'s.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::support::{experimental_copy, fixture, generate, plugins, refused};

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

#[test]
fn an_experimental_capability_is_refused_without_the_flag() {
    let dir = fixture("qwen2_vl");
    let plugins = experimental_plugins();
    let stderr = refused(&generate(plugins, &dir, &[dir.join("inputs/wide.png")], "Describe this image.", &[]));
    assert!(stderr.contains("capability `image` of plugin `qwen2-vl` is experimental"), "{stderr}");
    assert!(stderr.contains("--allow-unqualified"), "{stderr}");
    let two = [dir.join("inputs/wide.png"), dir.join("inputs/tall.png")];
    let stderr = refused(&generate(plugins, &dir, &two, "Compare.", &[]));
    assert!(stderr.contains("--allow-unqualified"), "{stderr}");
    let out = generate(plugins, &dir, &two, "Compare.", &["--allow-unqualified"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_text_only_checkpoint_refuses_images() {
    let qwen2 = fixture("qwen2");
    let image = fixture("qwen2_vl").join("inputs/wide.png");
    let stderr = refused(&generate(plugins(), &qwen2, &[image], "Describe.", &["--allow-unqualified"]));
    assert!(stderr.contains("takes no images"), "{stderr}");
    assert!(stderr.contains("images need a vision-language checkpoint and its family plugin"), "{stderr}");
}

/// The encoder reads its weights in the dtype the config names, and the checkpoint is held to
/// it tensor by tensor before anything compiles: a config that names another dtype than the
/// one stored is refused, naming a tensor, both ways.
#[test]
fn a_config_naming_another_weight_dtype_than_the_stored_one_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    for (name, stored, said) in [("qwen2_vl_bf16", "bf16", "float32"), ("qwen2_vl", "f32", "bfloat16")] {
        let dir = root.path().join(name);
        crate::support::copy_dir(&fixture(name), &dir);
        let path = dir.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("json");
        for section in ["text_config", "vision_config"] {
            config[section]["dtype"] = said.into();
        }
        config["dtype"] = said.into();
        std::fs::write(&path, config.to_string()).expect("write the config");
        let image = dir.join("inputs/wide.png");
        let stderr = refused(&generate(plugins(), &dir, &[image], "Describe.", &[]));
        let want = format!(
            "is stored as {stored}; the encoder graph reads {} weights",
            if stored == "f32" { "bf16" } else { "f32" }
        );
        assert!(stderr.contains(&want) && stderr.contains("visual."), "{name}: {stderr}");
    }
}

/// A checkpoint form the family's manifest marks experimental (Gemma 3's MLX-quantized form:
/// mlx-vlm, its reference, is not transformers' Gemma 3 on images) is refused for images
/// unless the user opts in, and then served; its text is served either way.
#[test]
fn experimental_checkpoint_forms_are_refused_for_images_without_the_opt_in() {
    let model = fixture("gemma3_mlx_q4");
    let image = model.join("inputs/wide.png");
    let stderr = refused(&generate(plugins(), &model, std::slice::from_ref(&image), "Describe.", &[]));
    assert!(
        stderr.contains("plugin `gemma3` serves checkpoints in the `mlx_affine` form as experimental, not qualified"),
        "{stderr}"
    );
    let opted = generate(plugins(), &model, &[image], "Describe.", &["--allow-unqualified"]);
    assert!(opted.status.success(), "{}", String::from_utf8_lossy(&opted.stderr));
    let text = generate(plugins(), &model, &[], "Say hello.", &[]);
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
}

/// bf16 compute serves a family's images only where its plugin offers the encoder in bf16
/// (Qwen2-VL's, whose golden tokens `conformance::qwen2_vl_bf16_compute` checks): another family
/// refuses before anything compiles, naming the compute, and its text is still served in bf16.
#[test]
fn bf16_compute_is_refused_for_images_by_a_family_whose_encoder_computes_in_f32_only() {
    let qwen2_vl = fixture("qwen2_vl_bf16");
    let out = generate(
        plugins(),
        &qwen2_vl,
        &[qwen2_vl.join("inputs/wide.png")],
        "Describe.",
        &["--compute", "bf16", "--allow-unqualified"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["activations"], "bf16", "{report}");
    let model = fixture("gemma3_bf16");
    let image = model.join("inputs/wide.png");
    let bf16 = ["--compute", "bf16", "--allow-unqualified"];
    let stderr = refused(&generate(plugins(), &model, std::slice::from_ref(&image), "Describe.", &bf16));
    assert!(stderr.contains("--compute bf16 computes the image encoder in bf16"), "{stderr}");
    assert!(stderr.contains("the gemma3 encoder computes in f32 only"), "{stderr}");
    assert!(!stderr.contains("compiled"), "refused before any compile: {stderr}");
    let text = generate(plugins(), &model, &[], "Say hello.", &bf16);
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
}
