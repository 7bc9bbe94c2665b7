//! Builds the out-of-tree plugin from `docs/writing-a-plugin.md` (every code block marked
//! `file=...`) as its own Cargo project against the path dependency, then loads it.

use std::path::{Path, PathBuf};
use std::process::Command;

use mlxcel_plugin_api::{
    ContractRequest, ItemMeta, LayoutRequest, Manifest, MediaItem, Modality, PreprocessOptions, RVec, scan,
};

use crate::support::{cargo, sha256_of, target_dirs};

/// The `file=...` code blocks of a markdown document, as (path, contents).
fn code_files(markdown: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            Some(_) if line.trim_start().starts_with("```") => files.extend(current.take()),
            Some((_, body)) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {
                if let Some(info) = line.trim_start().strip_prefix("```")
                    && let Some(path) = info.split_whitespace().find_map(|w| w.strip_prefix("file="))
                {
                    current = Some((path.to_owned(), String::new()));
                }
            }
        }
    }
    files
}

#[test]
fn the_walkthrough_plugin_builds_out_of_tree_and_loads() {
    let plugin_api = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = plugin_api.parent().expect("plugin-api sits in the workspace");
    let doc = std::fs::read_to_string(workspace.join("docs/writing-a-plugin.md")).expect("read the walkthrough");
    let files = code_files(&doc);
    let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["Cargo.toml", "src/lib.rs", "acme-vl.toml"]);

    let project = tempfile::tempdir().expect("temp dir");
    for (path, body) in &files {
        let body = if path == "Cargo.toml" {
            let dependency = r#"path = "../mlxcel-host/plugin-api""#;
            assert!(body.contains(dependency), "the walkthrough's Cargo.toml names the path dependency");
            body.replace(dependency, &format!("path = {:?}", plugin_api.display().to_string()))
        } else {
            body.clone()
        };
        let target = project.path().join(path);
        std::fs::create_dir_all(target.parent().expect("files have a parent")).expect("mkdir");
        std::fs::write(&target, body).expect("write project file");
    }
    // The workspace's lock file pins the same dependency versions, so the offline build resolves.
    std::fs::copy(workspace.join("Cargo.lock"), project.path().join("Cargo.lock")).expect("copy Cargo.lock");

    // A target directory of its own inside the test's, so reruns are incremental.
    let (target_dir, _) = target_dirs();
    let target_dir: PathBuf = target_dir.join("out-of-tree-plugin");
    let output = Command::new(cargo())
        .current_dir(project.path())
        .args(["build", "--offline", "--release", "--target-dir"])
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .expect("run cargo");
    assert!(output.status.success(), "out-of-tree build failed:\n{}", String::from_utf8_lossy(&output.stderr));

    let library_name = format!("{}mlxcel_family_acme_vl{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX);
    let plugins = tempfile::tempdir().expect("plugin dir");
    let library = plugins.path().join(&library_name);
    std::fs::copy(target_dir.join("release").join(&library_name), &library).expect("install the library");
    let manifest_text = std::fs::read_to_string(project.path().join("acme-vl.toml")).expect("manifest");
    let mut manifest = Manifest::parse(&manifest_text, Path::new("acme-vl.toml")).expect("the doc's manifest is valid");
    assert_eq!(manifest.plugin.library, library_name);
    manifest.plugin.sha256 = sha256_of(&library);
    std::fs::write(plugins.path().join("acme-vl.toml"), manifest.to_toml()).expect("install the manifest");

    let set = scan(plugins.path()).expect("scan");
    assert!(set.rejected().is_empty(), "{:?}", set.rejected());
    let plugin = set
        .for_config(r#"{"architectures": ["AcmeVlForConditionalGeneration"], "model_type": "acme_vl"}"#)
        .expect("the plugin accepts its architecture");
    assert_eq!(plugin.name(), "acme-vl");

    let config = plugin
        .parse_config(
            r#"{"architectures": ["AcmeVlForConditionalGeneration"], "model_type": "acme_vl",
                "hidden_size": 64, "image_token_id": 9}"#,
            "",
        )
        .expect("parse_config");
    let image = MediaItem::Rgb8 { width: 28, height: 14, pixels: RVec::from(vec![255u8; 28 * 14 * 3]) };
    let pre = plugin.preprocess(&config, &image, &PreprocessOptions::default()).expect("preprocess");
    assert_eq!(pre.tensors[0].spec.shape.as_slice(), &[2, 588]);
    assert_eq!(pre.tensors[0].to_f32().expect("f32")[0], 1.0);
    let items = RVec::from(vec![ItemMeta { modality: Modality::Image, grid: pre.grid }]);
    let layout = plugin
        .prompt_layout(&config, &LayoutRequest { prompt: "a <image> b".into(), items: items.clone() })
        .expect("prompt_layout");
    assert_eq!(layout.text.as_str(), "a <img><img> b");
    let contract = plugin
        .prefill_contract(&config, &ContractRequest { token_ids: RVec::from(vec![1, 9, 9, 2]), items })
        .expect("prefill_contract");
    assert_eq!(contract.placements[0].token_start, 1);
    assert_eq!(contract.text_scale, 8.0);
}
