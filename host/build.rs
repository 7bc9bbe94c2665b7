//! Generates the conformance test list: one test per oracle fixture that an in-tree plugin's
//! manifest accepts (its `config.json`'s first architecture among the manifest's
//! `[accepts] architectures`, or, for a config naming none, its `model_type` among the
//! `model_types`), so a new family's conformance test comes from its manifest and
//! fixture alone, with no host file to edit.

use std::{
    env, fs,
    path::{Path, PathBuf},
};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (manifests, fixtures) = (root.join("manifests"), root.join("tests/fixtures"));
    println!("cargo::rerun-if-changed={}", manifests.display());
    println!("cargo::rerun-if-changed={}", fixtures.display());
    let mut accepted = Vec::new();
    for path in entries(&manifests).into_iter().filter(|p| p.extension().is_some_and(|e| e == "toml")) {
        println!("cargo::rerun-if-changed={}", path.display());
        let Ok(manifest) = fs::read_to_string(&path).map(|t| t.parse::<toml::Table>()) else { continue };
        let Ok(manifest) = manifest else { continue };
        // A config names its architecture, or (mlx-vlm's form) only its model type.
        for key in ["architectures", "model_types"] {
            let names = manifest.get("accepts").and_then(|a| a.get(key)).and_then(|a| a.as_array());
            accepted.extend(names.into_iter().flatten().filter_map(|a| a.as_str().map(|n| (key, n.to_owned()))));
        }
    }
    let mut names = Vec::new();
    for dir in entries(&fixtures) {
        let config = dir.join("config.json");
        println!("cargo::rerun-if-changed={}", config.display());
        let Ok(text) = fs::read_to_string(&config) else { continue };
        let Ok(config) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        let wanted = match config.pointer("/architectures/0").and_then(|a| a.as_str()) {
            Some(architecture) => ("architectures", architecture),
            None => ("model_types", config.get("model_type").and_then(|t| t.as_str()).unwrap_or_default()),
        };
        if accepted.iter().any(|(key, name)| (*key, name.as_str()) == wanted)
            && let Some(name) = dir.file_name().and_then(|n| n.to_str())
        {
            names.push(name.to_owned());
        }
    }
    names.sort();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("conformance_cases.rs");
    fs::write(&out, format!("conformance!({});\n", names.join(", "))).expect("write the conformance cases");
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> =
        fs::read_dir(dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    paths.sort();
    paths
}
