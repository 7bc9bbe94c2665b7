//! `mlxcel-host plugins list|inspect|verify`, run as the real binary against testkit plugins:
//! listing keeps going past bad plugins and names each reason, the capability gate names its
//! flag, inspect prints the evidence, and verify passes the toy family against a fixture made
//! here and fails, naming the stage, on a deliberately wrong answer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use mlxcel_plugin_api::Manifest;
use mlxcel_plugin_api::manifest::{Accepts, CapabilityEntry, Evidence, Limits, PluginSection, Status};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use sha2::{Digest, Sha256};

/// A testkit plugin crate and the identity it reports (see `plugins/testkit/`).
#[derive(Clone, Copy)]
struct Testkit {
    package: &'static str,
    name: &'static str,
    architecture: &'static str,
    model_type: &'static str,
    plugin_api: &'static str,
}

const GOOD: Testkit = Testkit {
    package: "mlxcel-testkit-good",
    name: "testkit-good",
    architecture: "ToyGoodForConditionalGeneration",
    model_type: "toy_good",
    plugin_api: "1.4",
};
const WRONG_MASK: Testkit = Testkit {
    package: "mlxcel-testkit-wrong-mask",
    name: "testkit-wrong-mask",
    architecture: "ToyWrongMaskForConditionalGeneration",
    model_type: "toy_wrong_mask",
    plugin_api: "1.4",
};
const INCOMPATIBLE_MAJOR: Testkit = Testkit {
    package: "mlxcel-testkit-incompatible-major",
    name: "testkit-incompatible-major",
    architecture: "ToyMajorForConditionalGeneration",
    model_type: "toy_major",
    plugin_api: "2.0",
};

/// The version every toy plugin reports (`mlxcel_testkit_toy::VERSION`).
const TOY_VERSION: &str = "0.3.1";

/// `<target>` and `<target>/<profile>` of this test binary (`<profile>/deps/it-<hash>`).
impl Testkit {
    fn library_file(&self) -> String {
        crate::support::library_file(self.package)
    }

    /// The built library; the testkit crates are built once per test process.
    fn library(&self) -> PathBuf {
        static BUILT: OnceLock<PathBuf> = OnceLock::new();
        BUILT
            .get_or_init(|| {
                crate::support::build_packages(&[GOOD.package, WRONG_MASK.package, INCOMPATIBLE_MAJOR.package])
            })
            .join(self.library_file())
    }

    /// A manifest that agrees with the library: `image` qualified with evidence, `multi_image`
    /// experimental.
    fn manifest(&self, library: &Path) -> Manifest {
        let evidence = Evidence {
            reference: "transformers".to_owned(),
            reference_versions: [("transformers".to_owned(), "5.24.0".to_owned())].into_iter().collect(),
            fixture: "tests/fixtures/toy".to_owned(),
            max_abs_diff: [
                ("preprocess", 0.0),
                ("placeholder", 0.0),
                ("encoder", 3e-7),
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
        };
        Manifest {
            manifest_version: 1,
            plugin: PluginSection {
                name: self.name.to_owned(),
                version: TOY_VERSION.to_owned(),
                plugin_api: self.plugin_api.to_owned(),
                library: library.file_name().and_then(|n| n.to_str()).expect("library file name").to_owned(),
                sha256: hex::encode(Sha256::digest(std::fs::read(library).expect("read library"))),
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
                (
                    "image".to_owned(),
                    CapabilityEntry { status: Status::Qualified, note: None, evidence: Some(evidence) },
                ),
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

/// A temporary plugin directory.
struct PluginDir(tempfile::TempDir);

impl PluginDir {
    fn new() -> Self {
        Self(tempfile::tempdir().expect("temp dir"))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Installs a testkit library and its manifest; returns the manifest path.
    fn install(&self, kit: Testkit) -> PathBuf {
        let library = self.path().join(kit.library_file());
        std::fs::copy(kit.library(), &library).expect("copy the library");
        let manifest = self.path().join(format!("{}.toml", kit.name));
        std::fs::write(&manifest, kit.manifest(&library).to_toml()).expect("write the manifest");
        manifest
    }
}

fn host(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel-host"))
        .args(args)
        .env_remove("MLXCEL_PLUGINS")
        .output()
        .expect("run mlxcel-host")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

/// A directory with one good plugin and three bad ones: an incompatible major, a library that
/// is not a library, and a library no manifest names.
fn mixed_dir() -> PluginDir {
    let dir = PluginDir::new();
    dir.install(GOOD);
    dir.install(INCOMPATIBLE_MAJOR);
    let corrupt = dir.path().join("libcorrupt.so");
    std::fs::write(&corrupt, b"not a shared library").expect("write");
    let mut manifest = GOOD.manifest(&corrupt);
    manifest.plugin.name = "testkit-corrupt".to_owned();
    manifest.accepts =
        Accepts { architectures: vec!["ToyCorruptForConditionalGeneration".to_owned()], model_types: vec![] };
    std::fs::write(dir.path().join("testkit-corrupt.toml"), manifest.to_toml()).expect("write");
    std::fs::write(dir.path().join("libstray.so"), b"").expect("write");
    dir
}

#[test]
fn list_shows_loaded_plugins_and_every_rejection_with_its_reason() {
    let dir = mixed_dir();
    let output = host(&["plugins", "list", "--plugins", path_str(dir.path())]);
    let out = stdout(&output);
    assert!(output.status.success(), "a bad plugin must not stop the host:\n{out}\n{}", stderr(&output));
    assert!(out.contains("1 loaded, 3 skipped"), "{out}");
    assert!(out.contains("testkit-good 0.3.1  plugin-api 1.4"), "{out}");
    assert!(out.contains("architectures: ToyGoodForConditionalGeneration"), "{out}");
    assert!(out.contains("model types:   toy_good"), "{out}");
    assert!(out.contains("image        qualified     served"), "{out}");
    assert!(
        out.contains("plugin `testkit-incompatible-major`")
            && out.contains("built against plugin-api 2.0, which this host (plugin-api 1.4) cannot load"),
        "{out}"
    );
    assert!(out.contains("skipped plugin `testkit-corrupt`") && out.contains("cannot open library"), "{out}");
    assert!(out.contains("libstray.so: no manifest names library"), "{out}");
}

/// A directory others can write to is refused whole; a library others can write to, or one
/// reached through a symlink out of the directory, is skipped with the reason; the flag lifts
/// both. Every loaded library's sha256 is logged.
#[test]
fn unsafe_plugin_directories_and_libraries_are_refused_unless_allowed() {
    use std::os::unix::fs::PermissionsExt;
    let chmod =
        |path: &Path, mode: u32| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let list = |dir: &Path, allow: bool| {
        let mut args = vec!["plugins", "list", "--plugins", path_str(dir)];
        if allow {
            args.push("--allow-unsafe-plugin-dir");
        }
        host(&args)
    };

    let dir = PluginDir::new();
    let manifest = dir.install(GOOD);
    let output = list(dir.path(), false);
    assert!(output.status.success(), "{}", stderr(&output));
    let sha = Manifest::from_file(&manifest).expect("manifest").plugin.sha256;
    assert!(stderr(&output).contains(&format!("(sha256 {sha})")), "{}", stderr(&output));

    chmod(dir.path(), 0o777);
    let output = list(dir.path(), false);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("is writable by every user"), "{}", stderr(&output));
    assert!(stderr(&output).contains("--allow-unsafe-plugin-dir"), "{}", stderr(&output));
    assert!(stdout(&list(dir.path(), true)).contains("1 loaded, 0 skipped"));
    chmod(dir.path(), 0o755);

    let library = dir.path().join(GOOD.library_file());
    chmod(&library, 0o777);
    let out = stdout(&list(dir.path(), false));
    assert!(out.contains("0 loaded, 1 skipped") && out.contains("is writable by every user"), "{out}");
    chmod(&library, 0o755);

    // The library moved out and linked back in.
    let outside = tempfile::tempdir().expect("temp dir");
    let moved = outside.path().join(GOOD.library_file());
    std::fs::rename(&library, &moved).expect("move");
    std::os::unix::fs::symlink(&moved, &library).expect("symlink");
    let out = stdout(&list(dir.path(), false));
    assert!(out.contains("0 loaded, 1 skipped") && out.contains("outside the plugin directory"), "{out}");
    assert!(stdout(&list(dir.path(), true)).contains("1 loaded, 0 skipped"));
}

#[test]
fn the_capability_gate_refuses_unqualified_capabilities_and_names_the_flag() {
    let dir = PluginDir::new();
    dir.install(GOOD);
    let strict = stdout(&host(&["plugins", "list", "--plugins", path_str(dir.path())]));
    assert!(
        strict.contains("multi_image  experimental  not served (start the host with --allow-unqualified to serve it)"),
        "{strict}"
    );
    assert!(strict.contains("note: mixed-batch parity not yet measured"), "{strict}");
    let opted_in = stdout(&host(&["plugins", "list", "--allow-unqualified", "--plugins", path_str(dir.path())]));
    assert!(opted_in.contains("multi_image  experimental  served"), "{opted_in}");
}

#[test]
fn list_needs_a_plugin_directory_and_says_how_to_give_one() {
    let output = host(&["plugins", "list"]);
    assert!(!output.status.success());
    assert!(stderr(&output).contains("pass --plugins <dir> or set MLXCEL_PLUGINS"), "{}", stderr(&output));
}

#[test]
fn inspect_prints_the_whole_manifest_with_evidence() {
    let dir = mixed_dir();
    let output = host(&["plugins", "inspect", "testkit-good", "--plugins", path_str(dir.path())]);
    let out = stdout(&output);
    assert!(output.status.success(), "{out}\n{}", stderr(&output));
    for expected in [
        "# testkit-good 0.3.1 (plugin-api 1.4)",
        "# reference: https://example.invalid/toy-vl@0000000",
        "max_pixels_per_image = 1048576",
        "[capabilities.image.evidence]",
        "reference = \"transformers\"",
        "greedy_tokens_matched = 16",
        "batched = true",
        "date = 2026-08-01",
        "encoder = 0.0000003",
        "status = \"experimental\"",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }

    let skipped = host(&["plugins", "inspect", "testkit-incompatible-major", "--plugins", path_str(dir.path())]);
    assert!(!skipped.status.success());
    assert!(stdout(&skipped).contains("plugin_api = \"2.0\""), "{}", stdout(&skipped));
    assert!(stderr(&skipped).contains("plugin `testkit-incompatible-major` was skipped"), "{}", stderr(&skipped));

    let unknown = host(&["plugins", "inspect", "nope", "--plugins", path_str(dir.path())]);
    assert!(!unknown.status.success());
    assert!(stderr(&unknown).contains("no plugin `nope`") && stderr(&unknown).contains("loaded: testkit-good"));
}

// === verify ===

/// The toy config the fixture's checkpoint declares (`plugins/testkit/toy`).
const HIDDEN: usize = 16;
const PATCH: usize = 2;
const BOI: i64 = 5;
const EOI: i64 = 6;
const IMG: i64 = 7;
const MEAN: [f32; 3] = [0.5, 0.25, 0.5];
const STD: [f32; 3] = [0.5, 0.25, 0.125];
/// Vocabulary ids of single bytes start here (special tokens sit below).
const BYTE_BASE: i64 = 100;

/// An RGB test image with distinct values everywhere.
struct Image {
    file: &'static str,
    width: usize,
    height: usize,
    pixels: Vec<u8>,
}

impl Image {
    fn new(file: &'static str, width: usize, height: usize, seed: usize) -> Self {
        let pixels = (0..width * height * 3).map(|i| ((i * 37 + seed * 11) % 256) as u8).collect();
        Self { file, width, height, pixels }
    }

    fn patches(&self) -> usize {
        (self.width / PATCH) * (self.height / PATCH)
    }

    /// The toy processor, written out independently: patches in row-major grid order, each
    /// channel-major, normalized per channel.
    fn pixel_values(&self) -> Vec<f32> {
        let mut values = Vec::new();
        for py in 0..self.height / PATCH {
            for px in 0..self.width / PATCH {
                for c in 0..3 {
                    for y in 0..PATCH {
                        for x in 0..PATCH {
                            let v = self.pixels[((py * PATCH + y) * self.width + px * PATCH + x) * 3 + c];
                            values.push((f32::from(v) / 255.0 - MEAN[c]) / STD[c]);
                        }
                    }
                }
            }
        }
        values
    }

    fn png(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, self.width as u32, self.height as u32);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().expect("png header");
        writer.write_image_data(&self.pixels).expect("png data");
        writer.finish().expect("png end");
        bytes
    }
}

/// The projection the toy encoder reads from the checkpoint, `[3 * PATCH^2, HIDDEN]`.
fn projection() -> Vec<f32> {
    (0..3 * PATCH * PATCH * HIDDEN).map(|i| ((i * 7919 % 61) as f32 - 30.0) / 40.0).collect()
}

/// Token ids of an expanded prompt: specials by name, every other byte by itself.
fn tokenize(text: &str) -> Vec<i64> {
    let mut ids = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        if let Some((id, token)) =
            [(BOI, "<boi>"), (EOI, "<eoi>"), (IMG, "<img>")].into_iter().find(|(_, token)| rest.starts_with(token))
        {
            ids.push(id);
            rest = &rest[token.len()..];
        } else {
            ids.push(BYTE_BASE + i64::from(rest.as_bytes()[0]));
            rest = &rest[1..];
        }
    }
    ids
}

/// A byte-level `tokenizer.json` for [`tokenize`]'s ids.
fn tokenizer_json() -> serde_json::Value {
    // GPT-2's byte-to-unicode table: printable bytes stand for themselves.
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut vocab = serde_json::Map::new();
    let mut next = 256u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).expect("valid code point")
        };
        vocab.insert(c.to_string(), (BYTE_BASE + i64::from(b)).into());
    }
    let added: Vec<serde_json::Value> = [(BOI, "<boi>"), (EOI, "<eoi>"), (IMG, "<img>")]
        .into_iter()
        .map(|(id, content)| serde_json::json!({"id": id, "content": content, "special": true}))
        .collect();
    serde_json::json!({"model": {"type": "BPE", "vocab": vocab}, "added_tokens": added, "decoder": {"type": "ByteLevel"}})
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn i64_bytes(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn write_safetensors(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)], golden: bool) {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| (*name, TensorView::new(*dtype, shape.clone(), data).expect("view")))
        .collect();
    let meta = golden.then(|| HashMap::from([("golden_format".to_owned(), "1".to_owned())]));
    std::fs::write(path, safetensors::serialize(views, meta).expect("serialize")).expect("write safetensors");
}

/// A fixture in the oracle's layout for a toy plugin, with goldens computed here from the toy's
/// definition: `two_images` (a 6x4 and a 4x4 image, the first padded into a larger bucket)
/// and `text_only`.
fn toy_fixture(kit: Testkit) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("fixture dir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("inputs")).expect("mkdir");
    std::fs::create_dir_all(root.join("goldens")).expect("mkdir");
    let config = serde_json::json!({
        "architectures": [kit.architecture], "model_type": kit.model_type, "hidden_size": HIDDEN,
        "patch_size": PATCH, "image_token_id": IMG, "boi_token_id": BOI, "eoi_token_id": EOI,
    });
    std::fs::write(root.join("config.json"), config.to_string()).expect("write");
    let processor = serde_json::json!({"image_mean": MEAN, "image_std": STD});
    std::fs::write(root.join("processor_config.json"), processor.to_string()).expect("write");
    std::fs::write(root.join("tokenizer.json"), tokenizer_json().to_string()).expect("write");
    std::fs::write(root.join("provenance.json"), r#"{"reference": "the toy family, by hand"}"#).expect("write");
    let k = 3 * PATCH * PATCH;
    let weight = projection();
    write_safetensors(
        &root.join("model.safetensors"),
        &[("vision.proj.weight", Dtype::F32, vec![k, HIDDEN], f32_bytes(&weight))],
        false,
    );

    let images = [Image::new("wide.png", 6, 4, 1), Image::new("square.png", 4, 4, 2)];
    for image in &images {
        std::fs::write(root.join("inputs").join(image.file), image.png()).expect("write png");
    }
    let block = |n: usize| format!("<boi>{}<eoi>", "<img>".repeat(n));
    let variants = [
        (
            "two_images",
            "User: <image> and <image> differ?\nModel:".to_owned(),
            format!("User: {} and {} differ?\nModel:", block(images[0].patches()), block(images[1].patches())),
            &images[..],
        ),
        ("text_only", "User: hi there\nModel:".to_owned(), "User: hi there\nModel:".to_owned(), &images[..0]),
    ];
    for (variant, prompt, expanded, items) in variants {
        let ids = tokenize(&expanded);
        let n = ids.len();
        let mut attend = vec![0u8; n * n];
        for row in 0..n {
            for col in 0..=row {
                attend[row * n + col] = 1;
            }
        }
        let mut start = None;
        for (i, &id) in ids.iter().chain(std::iter::once(&-1)).enumerate() {
            match (id == IMG, start) {
                (true, None) => start = Some(i),
                (false, Some(s)) => {
                    for row in s..i {
                        attend[row * n + s..row * n + i].fill(1);
                    }
                    start = None;
                }
                _ => {}
            }
        }
        let positions: Vec<i64> = (0..n as i64).collect();
        let mut tensors = vec![
            ("input_ids", Dtype::I64, vec![n], i64_bytes(&ids)),
            ("position_ids", Dtype::I64, vec![n], i64_bytes(&positions)),
            ("attention_mask.full_attention", Dtype::U8, vec![n, n], attend),
        ];
        if !items.is_empty() {
            let pixels: Vec<f32> = items.iter().flat_map(Image::pixel_values).collect();
            let rows = pixels.len() / k;
            let features: Vec<f32> = (0..rows * HIDDEN)
                .map(|i| {
                    let (r, h) = (i / HIDDEN, i % HIDDEN);
                    (0..k).map(|j| f64::from(pixels[r * k + j]) * f64::from(weight[j * HIDDEN + h])).sum::<f64>() as f32
                })
                .collect();
            tensors.push(("pixel_values", Dtype::F32, vec![rows, k], f32_bytes(&pixels)));
            tensors.push(("image_features", Dtype::F32, vec![rows, HIDDEN], f32_bytes(&features)));
        }
        write_safetensors(&root.join("goldens").join(format!("{variant}.safetensors")), &tensors, true);
        let files: Vec<String> = items.iter().map(|i| format!("inputs/{}", i.file)).collect();
        let meta = serde_json::json!({"golden_format": 1, "prompt": prompt, "input_ids": ids, "images": files});
        std::fs::write(root.join("goldens").join(format!("{variant}.json")), meta.to_string()).expect("write");
    }
    dir
}

/// Runs `plugins verify` with a compile cache shared by the tests.
fn verify(plugin: &Path, fixture: &Path) -> Output {
    let cache = crate::support::target_dirs().0.join("plugins-verify-cache");
    host(&["plugins", "verify", path_str(plugin), "--fixture", path_str(fixture), "--cache-dir", path_str(&cache)])
}

#[test]
fn verify_passes_the_toy_family_stage_by_stage() {
    let dir = PluginDir::new();
    let manifest = dir.install(GOOD);
    let fixture = toy_fixture(GOOD);
    // By manifest, by library and by plugin directory (where the plugin is picked by the config).
    let library = dir.path().join(GOOD.library_file());
    for target in [manifest.as_path(), library.as_path(), dir.path()] {
        let output = verify(target, fixture.path());
        let out = stdout(&output);
        assert!(output.status.success(), "{out}\n{}", stderr(&output));
        assert!(out.contains("plugin testkit-good 0.3.1 (plugin-api 1.4)"), "{out}");
        for line in [
            "config       ok",
            "checkpoint   ok",
            "preprocess   ok",
            "placeholder  ok",
            "encoder      ok",
            "positions    ok",
            "mask         ok",
        ] {
            assert!(out.contains(line), "missing {line:?} in:\n{out}");
        }
        assert!(out.contains("variant text_only:\n  preprocess   skipped  no media in this variant"), "{out}");
        assert!(out.contains("verify: passed (2 variants)"), "{out}");
        assert!(out.contains("  encoder = "), "{out}");
    }
}

#[test]
fn verify_fails_a_wrong_prefill_mask_at_the_mask_stage() {
    let dir = PluginDir::new();
    let manifest = dir.install(WRONG_MASK);
    let fixture = toy_fixture(WRONG_MASK);
    let output = verify(&manifest, fixture.path());
    let (out, err) = (stdout(&output), stderr(&output));
    println!("{out}{err}");
    assert!(!output.status.success(), "{out}");
    assert!(out.contains("encoder      ok"), "the other stages still pass:\n{out}");
    assert!(out.contains("mask         FAILED   stage attention_mask.full_attention: first divergence"), "{out}");
    // The first image block starts at token 7 ("User: " then <boi>); its first row may not see
    // the next image token in a causal mask.
    assert!(out.contains("flat index") && out.contains("[7, 8]"), "{out}");
    assert!(err.contains("verify failed: 1 stage(s) failed; the first is variant two_images, stage mask"), "{err}");
}

#[test]
fn verify_names_the_encoder_stage_and_coordinate_when_features_diverge() {
    let dir = PluginDir::new();
    let manifest = dir.install(GOOD);
    let fixture = toy_fixture(GOOD);
    // Shift one golden feature (row 7, column 3) by far more than the 1e-4 tolerance.
    let goldens = fixture.path().join("goldens/two_images.safetensors");
    let bytes = std::fs::read(&goldens).expect("read goldens");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("goldens parse");
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| (name, view.dtype(), view.shape().to_vec(), view.data().to_vec()))
        .collect();
    let features = tensors.iter_mut().find(|t| t.0 == "image_features").expect("features");
    let at = (7 * HIDDEN + 3) * 4;
    let value = f32::from_le_bytes(features.3[at..at + 4].try_into().expect("4 bytes")) + 0.01;
    features.3[at..at + 4].copy_from_slice(&value.to_le_bytes());
    let tensors: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> =
        tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone())).collect();
    write_safetensors(&goldens, &tensors, true);

    let output = verify(&manifest, fixture.path());
    let (out, err) = (stdout(&output), stderr(&output));
    assert!(!output.status.success(), "{out}");
    assert!(
        out.contains("encoder      FAILED   stage image_features: first divergence at flat index 115 [7, 3]"),
        "{out}"
    );
    assert!(out.contains("1 of 160 over tolerance"), "{out}");
    assert!(err.contains("stage encoder"), "{err}");
}
