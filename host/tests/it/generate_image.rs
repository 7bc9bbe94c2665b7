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
