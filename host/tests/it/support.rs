//! What the integration tests share: the workspace's fixtures, the in-tree plugins built as the
//! README's run command builds them, and `generate` run as a user runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub(crate) fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host is in the workspace")
}

/// A fixture's directory (`tests/fixtures/<name>`).
pub(crate) fn fixture(name: &str) -> PathBuf {
    workspace().join("tests/fixtures").join(name)
}

/// A golden variant's JSON.
pub(crate) fn golden_json(name: &str, variant: &str) -> serde_json::Value {
    let path = fixture(name).join("goldens").join(format!("{variant}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden json")).expect("json")
}

/// A fixture's golden variants, sorted.
pub(crate) fn variants(name: &str) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(fixture(name).join("goldens"))
        .expect("goldens")
        .filter_map(|e| {
            let path = e.expect("entry").path();
            (path.extension()? == "json").then(|| path.file_stem()?.to_str().map(str::to_owned))?
        })
        .collect();
    out.sort();
    out
}

/// The in-tree plugins, built once for this test run.
///
/// `cargo test` runs every test in one process, so the `OnceLock` is enough. `cargo nextest`
/// runs each test in its own process, and two that started together both replaced the one
/// directory (one failed with "Directory not empty", or loaded a plugin the other was
/// removing). So under nextest the directory is the run's own (`NEXTEST_RUN_ID`), its first
/// process builds it under a file lock, and the others find its stamp.
pub(crate) fn plugins() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let Ok(run) = std::env::var("NEXTEST_RUN_ID") else {
            let dir = tmp.join("it-plugins");
            built_plugins(&dir);
            return dir;
        };
        let dir = tmp.join(format!("it-plugins-{run}"));
        let lock = std::fs::File::create(tmp.join("it-plugins.lock")).expect("create the plugin build lock");
        lock.lock().expect("take the plugin build lock");
        let stamp = dir.join(".built");
        if !stamp.exists() {
            // Earlier runs' directories go first.
            for entry in std::fs::read_dir(tmp).expect("read the tests' tmp dir").flatten() {
                if entry.file_name().to_string_lossy().starts_with("it-plugins-") {
                    std::fs::remove_dir_all(entry.path()).expect("remove an earlier run's plugins");
                }
            }
            built_plugins(&dir);
            std::fs::write(&stamp, run).expect("stamp the built plugins");
        }
        dir
    })
}

/// Builds the in-tree plugins into `dir`, as the README's run command does.
pub(crate) fn built_plugins(dir: &Path) {
    let output = Command::new(workspace().join("tools/build-plugins.sh"))
        .arg(dir)
        .current_dir(workspace())
        .output()
        .expect("run tools/build-plugins.sh");
    assert!(output.status.success(), "build-plugins failed:\n{}", String::from_utf8_lossy(&output.stderr));
}

/// The target directory this test binary was built in, and its profile directory.
pub(crate) fn target_dirs() -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().expect("test executable path");
    let profile = exe.parent().and_then(Path::parent).expect("test binary lives in <profile>/deps").to_owned();
    (profile.parent().expect("profile dir has a parent").to_owned(), profile)
}

/// The file name of a workspace `cdylib` package's library.
pub(crate) fn library_file(package: &str) -> String {
    let stem = package.replace('-', "_");
    format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
}

/// Builds workspace packages (test fixture plugins) in this test binary's profile; the
/// directory their libraries are in.
pub(crate) fn build_packages(packages: &[&str]) -> PathBuf {
    let (target_dir, profile_dir) = target_dirs();
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    command.current_dir(workspace()).args(["build", "--offline", "--target-dir"]).arg(&target_dir);
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("release") => {
            command.arg("--release");
        }
        Some("debug") | None => {}
        Some(other) => {
            command.args(["--profile", other]);
        }
    }
    for package in packages {
        command.args(["-p", package]);
    }
    let output = command.output().expect("run cargo to build the fixture plugins");
    assert!(output.status.success(), "building {packages:?} failed:\n{}", String::from_utf8_lossy(&output.stderr));
    profile_dir
}

/// A copy of a built plugin directory whose qwen2_vl manifest marks every qualified capability
/// `experimental` again: the gate's refusal, tested without depending on a real manifest's status.
pub(crate) fn experimental_copy(built: &Path, out: &Path) {
    // Every capability experimental; the checkpoint forms as they are.
    manifest_copy(built, out, |manifest| {
        for entry in manifest.capabilities.values_mut() {
            entry.status = mlxcel_plugin_api::Status::Experimental;
            entry.note.get_or_insert_with(|| "made experimental for a test".to_owned());
        }
    });
}

/// A copy of a built plugin directory with `edit` applied to every manifest (the libraries,
/// and so their hashes, as they are).
pub(crate) fn manifest_copy(built: &Path, out: &Path, edit: impl Fn(&mut mlxcel_plugin_api::Manifest)) {
    std::fs::create_dir_all(out).expect("create the copy");
    for entry in std::fs::read_dir(built).expect("read the plugin dir") {
        let path = entry.expect("entry").path();
        let target = out.join(path.file_name().expect("file name"));
        if path.extension().is_some_and(|e| e == "toml") {
            let mut manifest = mlxcel_plugin_api::Manifest::from_file(&path).expect("manifest");
            edit(&mut manifest);
            std::fs::write(target, manifest.to_toml()).expect("write the manifest");
        } else {
            std::fs::copy(&path, target).expect("copy the library");
        }
    }
}

/// `generate` on `model` with these images, greedy, 16 tokens, one JSON object on stdout.
pub(crate) fn generate(plugin_dir: &Path, model: &Path, images: &[PathBuf], prompt: &str, extra: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mlxcel-host"));
    command.arg("generate").arg("--model").arg(model).args(["--prompt", prompt]);
    for image in images {
        command.arg("--image").arg(image);
    }
    command.arg("--plugins").arg(plugin_dir);
    let chunk = chunk_for(model).to_string();
    let capacity = capacity_for(model).to_string();
    command.args(["--capacity", &capacity, "--chunk", &chunk, "--max-tokens", "16", "--ignore-eos", "--json"]);
    command.args(extra).env_remove("MLXCEL_PLUGINS").output().expect("the binary runs")
}

/// The context capacity the tests run a fixture with: 128 rows, or the next power of two that
/// holds its longest golden prompt and greedy tokens (Molmo's image blocks open every image
/// prompt, so its long variant needs more).
pub(crate) fn capacity_for(fixture: &Path) -> usize {
    let fixture = mlxcel_golden::Fixture::open(fixture);
    let longest = fixture
        .variants()
        .unwrap_or_default()
        .iter()
        .filter_map(|v| fixture.golden(v).ok())
        .map(|g| g.tensor("input_ids").map_or(0, |t| t.len()) + g.tensor("greedy_tokens").map_or(0, |t| t.len()))
        .max()
        .unwrap_or(0);
    longest.max(128).next_power_of_two()
}

/// The prefill chunk the tests run a fixture with: 32 tokens (every fixture's long variant
/// spans chunks), or the next power of two that holds the longest bidirectional block of its
/// goldens' masks, since a block is prefilled within one chunk.
pub(crate) fn chunk_for(fixture: &Path) -> usize {
    let fixture = mlxcel_golden::Fixture::open(fixture);
    let mut longest = 0;
    for variant in fixture.variants().unwrap_or_default() {
        let Ok(golden) = fixture.golden(&variant) else { continue };
        let Some(mask) = golden.tensor("attention_mask.full_attention").ok().and_then(|t| t.to_i64()) else {
            continue;
        };
        let n = (mask.len() as f64).sqrt() as usize;
        // A row seeing a later column is inside a block reaching at least that far.
        for row in 0..n {
            if let Some(last) = (row + 1..n).rev().find(|&col| mask[row * n + col] != 0) {
                longest = longest.max(last - row + 1);
            }
        }
    }
    longest.max(32).next_power_of_two()
}

pub(crate) fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id")).collect()
}

/// The stderr of a command that must have failed.
pub(crate) fn refused(out: &Output) -> String {
    assert!(!out.status.success(), "expected a refusal, got: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Copies a directory tree.
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("list the directory") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy the file");
        }
    }
}

/// A grey RGB PNG of `width x height`.
pub(crate) fn png(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut bytes, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().expect("png header");
    writer.write_image_data(&vec![128; (width * height * 3) as usize]).expect("png data");
    writer.finish().expect("png end");
    bytes
}
