//! Shared test support: building the testkit fixture libraries and laying out plugin
//! directories with manifests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use mlxcel_plugin_api::Manifest;
use mlxcel_plugin_api::manifest::{Accepts, CapabilityEntry, Evidence, Limits, PluginSection, Status};
use sha2::{Digest, Sha256};

/// A testkit fixture crate and what it claims.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fixture {
    /// The directory under `plugins/testkit/`.
    pub(crate) dir: &'static str,
    /// The plugin name it reports.
    pub(crate) name: &'static str,
    /// Its HF architecture.
    pub(crate) architecture: &'static str,
    /// Its HF model type.
    pub(crate) model_type: &'static str,
    /// The plugin-api version it declares.
    pub(crate) plugin_api: &'static str,
}

pub(crate) const GOOD: Fixture = Fixture {
    dir: "good",
    name: "testkit-good",
    architecture: "ToyGoodForConditionalGeneration",
    model_type: "toy_good",
    plugin_api: "1.4",
};
pub(crate) const OLDER_MINOR: Fixture = Fixture {
    dir: "older-minor",
    name: "testkit-older-minor",
    architecture: "ToyOlderForConditionalGeneration",
    model_type: "toy_older",
    plugin_api: "1.0",
};
pub(crate) const V1_1: Fixture = Fixture {
    dir: "v1-1",
    name: "testkit-v1-1",
    architecture: "ToyV11ForConditionalGeneration",
    model_type: "toy_v1_1",
    plugin_api: "1.1",
};
pub(crate) const V1_2: Fixture = Fixture {
    dir: "v1-2",
    name: "testkit-v1-2",
    architecture: "ToyV12ForConditionalGeneration",
    model_type: "toy_v1_2",
    plugin_api: "1.2",
};
pub(crate) const V1_3: Fixture = Fixture {
    dir: "v1-3",
    name: "testkit-v1-3",
    architecture: "ToyV13ForConditionalGeneration",
    model_type: "toy_v1_3",
    plugin_api: "1.3",
};
pub(crate) const INCOMPATIBLE_MAJOR: Fixture = Fixture {
    dir: "incompatible-major",
    name: "testkit-incompatible-major",
    architecture: "ToyMajorForConditionalGeneration",
    model_type: "toy_major",
    plugin_api: "2.0",
};
pub(crate) const PANICKING: Fixture = Fixture {
    dir: "panicking",
    name: "testkit-panicking",
    architecture: "ToyPanickingForConditionalGeneration",
    model_type: "toy_panicking",
    plugin_api: "1.4",
};
pub(crate) const PANICKING_IDENTITY: Fixture = Fixture {
    dir: "panicking-identity",
    name: "testkit-panicking-identity",
    architecture: "ToyPanickingIdentityForConditionalGeneration",
    model_type: "toy_panicking_identity",
    plugin_api: "1.4",
};
pub(crate) const DUPLICATE: Fixture = Fixture {
    dir: "duplicate",
    name: "testkit-duplicate",
    architecture: "ToyGoodForConditionalGeneration",
    model_type: "toy_duplicate",
    plugin_api: "1.4",
};
pub(crate) const NO_ENTRY: Fixture = Fixture {
    dir: "no-entry",
    name: "testkit-no-entry",
    architecture: "ToyNoEntryForConditionalGeneration",
    model_type: "toy_no_entry",
    plugin_api: "1.4",
};

const ALL: [Fixture; 10] =
    [GOOD, OLDER_MINOR, V1_1, V1_2, V1_3, INCOMPATIBLE_MAJOR, PANICKING, PANICKING_IDENTITY, DUPLICATE, NO_ENTRY];

/// The version every toy fixture reports (`mlxcel_testkit_toy::VERSION`).
pub(crate) const TOY_VERSION: &str = "0.3.1";

impl Fixture {
    fn package(&self) -> String {
        format!("mlxcel-testkit-{}", self.dir)
    }

    /// The library file name cargo produces for this fixture.
    pub(crate) fn library_file(&self) -> String {
        let stem = self.package().replace('-', "_");
        format!("{}{stem}{}", std::env::consts::DLL_PREFIX, std::env::consts::DLL_SUFFIX)
    }

    /// The built library (building every fixture on first use).
    pub(crate) fn library(&self) -> PathBuf {
        built_profile_dir().join(self.library_file())
    }

    /// A `config.json` this fixture accepts.
    pub(crate) fn config_json(&self) -> String {
        format!(
            r#"{{"architectures": ["{}"], "model_type": "{}", "hidden_size": 16, "patch_size": 2,
                "image_token_id": 7, "boi_token_id": 5, "eoi_token_id": 6}}"#,
            self.architecture, self.model_type
        )
    }

    /// A manifest that agrees with the fixture library at `library`.
    pub(crate) fn manifest(&self, library: &Path) -> Manifest {
        Manifest {
            manifest_version: 1,
            plugin: PluginSection {
                name: self.name.to_owned(),
                version: TOY_VERSION.to_owned(),
                plugin_api: self.plugin_api.to_owned(),
                library: self.library_file(),
                sha256: sha256_of(library),
            },
            accepts: Accepts {
                architectures: vec![self.architecture.to_owned()],
                model_types: vec![self.model_type.to_owned()],
            },
            modalities: vec!["image".to_owned()],
            limits: Limits {
                max_pixels_per_image: Some(1 << 20),
                max_images_per_request: Some(4),
                max_audio_seconds_per_request: None,
                low_detail_max_pixels: None,
            },
            capabilities: [
                ("image".to_owned(), qualified()),
                (
                    "multi_image".to_owned(),
                    CapabilityEntry {
                        status: Status::Experimental,
                        note: Some("mixed-batch parity not yet measured".to_owned()),
                        evidence: None,
                    },
                ),
            ]
            .into_iter()
            .collect(),
            forms: Default::default(),
            chat: Default::default(),
        }
    }
}

/// A complete `qualified` entry.
pub(crate) fn qualified() -> CapabilityEntry {
    CapabilityEntry { status: Status::Qualified, note: None, evidence: Some(evidence()) }
}

/// Evidence that meets the qualified bar.
pub(crate) fn evidence() -> Evidence {
    Evidence {
        reference: "transformers".to_owned(),
        reference_versions: [("transformers", "5.24.0"), ("torch", "2.9.0")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        fixture: "tests/fixtures/toy".to_owned(),
        max_abs_diff: [
            ("preprocess", 0.0),
            ("placeholder", 0.0),
            ("encoder", 3e-5),
            ("positions", 0.0),
            ("mask", 0.0),
            ("logits", 6e-5),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect(),
        greedy_tokens_matched: 16,
        greedy_tokens_total: 16,
        batched: true,
        date: "2026-08-01".parse().expect("a toml date"),
    }
}

pub(crate) fn sha256_of(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    hex::encode(Sha256::digest(&bytes))
}

/// The target directory and profile directory this test binary was built into
/// (`<target>/<profile>/deps/it-<hash>`).
pub(crate) fn target_dirs() -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("test binary lives in <profile>/deps").to_owned();
    let target_dir = profile_dir.parent().expect("profile dir has a parent").to_owned();
    (target_dir, profile_dir)
}

pub(crate) fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

/// Builds every fixture once per test process, into the same target directory and profile as
/// this test binary, and returns the profile directory holding the libraries.
fn built_profile_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let (target_dir, profile_dir) = target_dirs();
            let profile = profile_dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug").to_owned();
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("plugin-api is in the workspace");
            let mut command = Command::new(cargo());
            command.current_dir(workspace).arg("build").arg("--offline").arg("--target-dir").arg(&target_dir);
            match profile.as_str() {
                "debug" => {}
                "release" => {
                    command.arg("--release");
                }
                other => {
                    command.args(["--profile", other]);
                }
            }
            for fixture in ALL {
                command.args(["-p", &fixture.package()]);
            }
            let output = command.output().expect("run cargo to build the testkit fixtures");
            assert!(
                output.status.success(),
                "building the testkit fixtures failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            profile_dir
        })
        .clone()
}

/// A temporary plugin directory.
pub(crate) struct PluginDir {
    dir: tempfile::TempDir,
}

impl PluginDir {
    pub(crate) fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("create a temp dir") }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Copies the fixture's library in and writes its manifest after `tweak`; returns the
    /// manifest path.
    pub(crate) fn install(&self, fixture: Fixture, tweak: impl FnOnce(&mut Manifest)) -> PathBuf {
        let library = self.path().join(fixture.library_file());
        std::fs::copy(fixture.library(), &library).expect("copy fixture library");
        let mut manifest = fixture.manifest(&library);
        tweak(&mut manifest);
        self.write_manifest(&format!("{}.toml", fixture.name), &manifest)
    }

    /// Writes a file into the directory.
    pub(crate) fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.path().join(name);
        std::fs::write(&path, bytes).expect("write into the plugin dir");
        path
    }

    pub(crate) fn write_manifest(&self, name: &str, manifest: &Manifest) -> PathBuf {
        self.write(name, manifest.to_toml().as_bytes())
    }
}

/// Installs the good fixture and loads it.
pub(crate) fn load_good() -> (PluginDir, mlxcel_plugin_api::LoadedPlugin) {
    let dir = PluginDir::new();
    let manifest = dir.install(GOOD, |_| {});
    let plugin = mlxcel_plugin_api::load_plugin(&manifest).expect("the good fixture loads");
    (dir, plugin)
}
