//! Builds the out-of-tree plugin from `docs/writing-a-plugin.md` (every code block marked
//! `file=...`) as its own Cargo project against the path dependency, then loads it.

use std::path::{Path, PathBuf};
use std::process::Command;

use mlxcel_emit::{Elem, NumericContract};
use mlxcel_plugin_api::decoder::{self, BundleShape, DecoderWeights, TextConfig};
use mlxcel_plugin_api::{
    CheckpointIndex, ContractRequest, ItemMeta, LayoutRequest, Manifest, MediaItem, Modality, PreprocessOptions, RVec,
    scan,
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

/// Builds the walkthrough project against the plugin-api crate at `plugin_api` (into a target
/// directory of its own inside the test's, so reruns are incremental) and installs the library
/// with its manifest, hash filled in, in a new plugin directory.
fn build_walkthrough(plugin_api: &Path, target_name: &str) -> tempfile::TempDir {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("plugin-api sits in the workspace");
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

    let (target_dir, _) = target_dirs();
    let target_dir: PathBuf = target_dir.join(target_name);
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
    plugins
}

#[test]
fn the_walkthrough_plugin_builds_out_of_tree_and_loads() {
    let plugins = build_walkthrough(Path::new(env!("CARGO_MANIFEST_DIR")), "out-of-tree-plugin");
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
        .prefill_program(&config, &ContractRequest { token_ids: RVec::from(vec![1, 9, 9, 2]), items })
        .expect("prefill_program");
    assert_eq!(contract.placements[0].tokens, mlxcel_plugin_api::TokenSet::Span { start: 1, len: 2 });
    assert_eq!(contract.text_scale, 8.0);

    // The encoder's logical weight found under whichever root the checkpoint keeps it.
    let index = |key: &str, d: u64| CheckpointIndex {
        tensors: RVec::from(vec![mlxcel_plugin_api::TensorSpec::new(key, mlxcel_plugin_api::DType::F32, &[588, d])]),
    };
    for key in ["vision.proj.weight", "model.vision.proj.weight"] {
        let report = plugin.check_checkpoint(&config, &index(key, 64)).expect("check").expect("1.1 and later");
        assert!(report.problems.is_empty(), "{key}: {:?}", report.problems);
    }
    let report = plugin.check_checkpoint(&config, &index("vision.proj.weight", 32)).expect("check").expect("report");
    assert_eq!(report.problems[0].as_str(), "`vision.proj.weight` has shape [588, 32], the config needs [588, 64]");

    // The plugin's own language model, read and emitted as the host does it.
    let spec = plugin.decoder_spec(&config).expect("decoder_spec").expect("the walkthrough brings a spec");
    assert_eq!((spec.name.as_str(), spec.attention.qk_norm), ("acme_text", true));
    let checkpoint = r#"{"architectures": ["AcmeVlForConditionalGeneration"], "model_type": "acme_vl",
        "text_config": {"model_type": "acme_text", "hidden_size": 64, "intermediate_size": 128,
                        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                        "rms_norm_eps": 1e-6, "vocab_size": 32, "rope_theta": 10000.0}}"#;
    let text = TextConfig::parse_with(checkpoint, Some(&spec)).expect("the spec reads acme_text");
    assert!(text.qk_norm && text.sandwich_norms && text.embed_scale == Some(8.0), "{text:?}");
    let presets_only = TextConfig::parse(checkpoint).expect_err("no preset reads acme_text");
    assert!(presets_only.to_string().contains("\"acme_text\" has no text decoder preset"), "{presets_only}");
    let index = synthetic_index(&text);
    let names = DecoderWeights::resolve(&index, &text).expect("resolve");
    let shape = BundleShape { chunk: 8, capacity: 16, slots: 2 };
    let mlir = decoder::graph::emit(&text, &names, &index, shape, NumericContract::f32(), Elem::F32).expect("emit");
    for tensor in ["model.layers.1.self_attn.k_norm.weight", "model.layers.1.post_feedforward_layernorm.weight"] {
        assert!(mlir.contains(tensor), "the bundle reads {tensor}");
    }
    // [layers, k|v, slots, kv heads, rows, head width]
    assert!(mlir.contains("tensor<2x2x2x2x24x16xf32>"), "the KV cache follows the declared layout");
}

/// A checkpoint index holding every tensor the decoder `cfg` reads, each of the shape it needs.
fn synthetic_index(cfg: &TextConfig) -> decoder::Index {
    let (h, d, i) = (cfg.hidden, cfg.head_dim, cfg.intermediate);
    let mut tensors = vec![("model.embed_tokens.weight".to_owned(), vec![cfg.vocab, h])];
    tensors.push(("model.norm.weight".to_owned(), vec![h]));
    tensors.push(("lm_head.weight".to_owned(), vec![cfg.vocab, h]));
    for l in 0..cfg.layers {
        let layer = |name: &str, shape: Vec<usize>| (format!("model.layers.{l}.{name}"), shape);
        tensors.extend([
            layer("input_layernorm.weight", vec![h]),
            layer("self_attn.q_proj.weight", vec![cfg.heads * d, h]),
            layer("self_attn.k_proj.weight", vec![cfg.kv_heads * d, h]),
            layer("self_attn.v_proj.weight", vec![cfg.kv_heads * d, h]),
            layer("self_attn.q_norm.weight", vec![d]),
            layer("self_attn.k_norm.weight", vec![d]),
            layer("self_attn.o_proj.weight", vec![h, cfg.heads * d]),
            layer("post_attention_layernorm.weight", vec![h]),
            layer("pre_feedforward_layernorm.weight", vec![h]),
            layer("post_feedforward_layernorm.weight", vec![h]),
            layer("mlp.gate_proj.weight", vec![i, h]),
            layer("mlp.up_proj.weight", vec![i, h]),
            layer("mlp.down_proj.weight", vec![h, i]),
        ]);
    }
    tensors.into_iter().map(|(key, shape)| (key, decoder::TensorInfo { dtype: "F32".to_owned(), shape })).collect()
}

#[test]
fn a_plugin_built_against_another_plugin_api_release_of_the_same_major_loads() {
    // abi_stable records the plugin-api package version in every type layout and refuses a
    // plugin whose version is not "loosely compatible" (0.x: same minor; otherwise same major).
    // The package version therefore follows the ABI (1.4.0), not the workspace: a copy of this
    // crate released as 1.0.7 stands in for an older release a third party built against.
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let copy = tempfile::tempdir().expect("temp dir");
    let crate_dir = copy.path().join("plugin-api");
    copy_tree(&here.join("src"), &crate_dir.join("src"));
    std::fs::write(crate_dir.join("Cargo.toml"), standalone_manifest(here, "1.0.7")).expect("write Cargo.toml");

    let plugins = build_walkthrough(&crate_dir, "out-of-tree-plugin-release");
    let set = scan(plugins.path()).expect("scan");
    assert!(set.rejected().is_empty(), "{:?}", set.rejected());
    let plugin = set.get("acme-vl").expect("loaded");
    let config = plugin
        .parse_config(r#"{"model_type": "acme_vl", "hidden_size": 64, "image_token_id": 9}"#, "")
        .expect("parse_config");
    assert_eq!(config.summary.text_hidden_size, 64);
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("list") {
        let path = entry.expect("entry").path();
        let target = to.join(path.file_name().expect("a name"));
        if path.is_dir() {
            copy_tree(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copy");
        }
    }
}

/// plugin-api's `Cargo.toml` outside the workspace, at package version `version`: workspace
/// inheritance resolved, tests and lints dropped.
fn standalone_manifest(crate_dir: &Path, version: &str) -> String {
    let read = |path: &Path| -> toml::Table {
        toml::from_str(&std::fs::read_to_string(path).expect("read Cargo.toml")).expect("Cargo.toml parses")
    };
    let mut table = read(&crate_dir.join("Cargo.toml"));
    let root = read(&crate_dir.join("../Cargo.toml"));
    let workspace = root["workspace"].as_table().expect("[workspace]");
    let inherited = |value: &toml::Value| value.get("workspace").and_then(toml::Value::as_bool) == Some(true);
    let package = table["package"].as_table_mut().expect("[package]");
    for (key, value) in package.iter_mut() {
        if inherited(value) {
            *value = workspace["package"][key.as_str()].clone();
        }
    }
    package.insert("version".to_owned(), version.into());
    let dependencies = table["dependencies"].as_table_mut().expect("[dependencies]");
    for (name, spec) in dependencies.iter_mut() {
        if !inherited(spec) {
            continue;
        }
        let mut resolved = match &workspace["dependencies"][name.as_str()] {
            toml::Value::String(v) => toml::Table::from_iter([("version".to_owned(), v.as_str().into())]),
            toml::Value::Table(t) => t.clone(),
            other => panic!("unexpected workspace dependency {name}: {other}"),
        };
        for (key, value) in spec.as_table().expect("a table").iter().filter(|(k, _)| *k != "workspace") {
            resolved.insert(key.clone(), value.clone());
        }
        // A workspace path dependency (the decoder library) is relative to the workspace root.
        if let Some(path) = resolved.get("path").and_then(toml::Value::as_str) {
            let absolute = crate_dir.join("..").join(path);
            resolved.insert("path".to_owned(), absolute.display().to_string().into());
        }
        *spec = toml::Value::Table(resolved);
    }
    for key in ["dev-dependencies", "test", "lints"] {
        table.remove(key);
    }
    table.insert("workspace".to_owned(), toml::Value::Table(toml::Table::new()));
    toml::to_string(&table).expect("serialize Cargo.toml")
}
