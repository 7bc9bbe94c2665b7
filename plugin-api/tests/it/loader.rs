//! Loading the good fixture, calling every entry, and the scan's handling of bad plugins.

use mlxcel_plugin_api::{
    CheckpointIndex, ContractRequest, DType, EncoderCompute, EncoderGraphRequest, EncoderTarget, Error, ErrorCode,
    ItemMeta, LayoutRequest, MediaItem, Modality, PreprocessOptions, ROption, RVec, TensorSpec, scan,
};

use crate::support::{DUPLICATE, GOOD, INCOMPATIBLE_MAJOR, NO_ENTRY, PANICKING_IDENTITY, PluginDir, load_good};

fn rgb(width: u32, height: u32) -> MediaItem {
    let pixels: Vec<u8> = (0..width * height * 3).map(|i| (i * 37 % 256) as u8).collect();
    MediaItem::Rgb8 { width, height, pixels: pixels.into() }
}

#[test]
fn good_plugin_answers_every_stage() {
    let (_dir, plugin) = load_good();
    assert_eq!(plugin.name(), "testkit-good");
    assert_eq!(plugin.api_version().to_string(), "1.4");
    assert_eq!(plugin.identity().architectures.as_slice(), &[mlxcel_plugin_api::RString::from(GOOD.architecture)]);

    let config = plugin.parse_config(&GOOD.config_json(), "").expect("parse_config");
    assert_eq!(config.summary.text_hidden_size, 16);
    assert_eq!(config.summary.model_type.as_str(), "toy_good");

    let pre = plugin.preprocess(&config, &rgb(4, 2), &PreprocessOptions::default()).expect("preprocess");
    assert_eq!(pre.grid.dims.as_slice(), &[1, 2]);
    assert_eq!(pre.grid.feature_tokens, 2);
    let pixels = &pre.tensors[0];
    assert_eq!(pixels.spec.name.as_str(), "pixel_values");
    assert_eq!(pixels.spec.shape.as_slice(), &[2, 12]);
    // First patch, red channel, top-left pixel: byte 0 normalized with mean = std = 0.5.
    assert_eq!(pixels.to_f32().expect("f32")[0], -1.0);

    let item = ItemMeta { modality: Modality::Image, grid: pre.grid.clone() };
    let layout = plugin
        .prompt_layout(
            &config,
            &LayoutRequest { prompt: "look: <image> ok".into(), items: RVec::from(vec![item.clone()]) },
        )
        .expect("prompt_layout");
    assert_eq!(layout.text.as_str(), "look: <boi><img><img><eoi> ok");
    assert_eq!(layout.items[0].feature_tokens, 2);
    assert_eq!(layout.items[0].feature_token_id, 7);

    // "look:" 1 token, boi, img, img, eoi, "ok".
    let tokens = vec![100, 5, 7, 7, 6, 101];
    let contract = plugin
        .prefill_program(&config, &ContractRequest { token_ids: tokens.into(), items: RVec::from(vec![item]) })
        .expect("prefill_program");
    assert_eq!(contract.text_scale, 4.0);
    assert_eq!(contract.placements[0].tokens, mlxcel_plugin_api::TokenSet::Span { start: 2, len: 2 });
    let mask = contract.mask.materialize(6);
    // Row 2 (first image token) may see row 3 (second image token): bidirectional block.
    assert_eq!(mask[2 * 6 + 3], 0.0);
    // Row 1 (boi) may not see row 2.
    assert_eq!(mask[6 + 2], f32::NEG_INFINITY);

    let buckets = plugin.encoder_buckets(&config, Modality::Image).expect("buckets");
    assert_eq!(buckets.iter().map(|b| b.id.as_str()).collect::<Vec<_>>(), ["patches-4", "patches-16", "patches-64"]);
    let request = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-4".into() };
    let graph = plugin
        .encoder_graph(&config, &request, &EncoderTarget::new(Some(256)), EncoderCompute::F32)
        .expect("encoder_graph");
    // Through 1.4's `encoder_graph_compute`: the plugin was told the target.
    assert!(graph.stablehlo.starts_with("// laid out for 256-bit vectors\n"), "{}", graph.stablehlo);
    // ... and the compute, which a family that does not offer it refuses in its own words.
    let err = plugin
        .encoder_graph(&config, &request, &EncoderTarget::new(Some(256)), EncoderCompute::Bf16Pairs)
        .expect_err("the toy computes in f32 only");
    assert!(err.to_string().contains("the toy encoder computes in f32 only, not in bf16 (paired sums)"), "{err}");
    assert!(graph.stablehlo.contains("#flow.parameter.named<\"model\"::\"vision.proj.weight\">"));
    assert_eq!(graph.parameters[0].shape.as_slice(), &[12, 16]);
    assert_eq!(graph.outputs[0].shape.as_slice(), &[4, 16]);

    let good_index =
        CheckpointIndex { tensors: RVec::from(vec![TensorSpec::new("vision.proj.weight", DType::F32, &[12, 16])]) };
    let report = plugin.check_checkpoint(&config, &good_index).expect("check_checkpoint").expect("1.4 plugin");
    assert!(report.problems.is_empty());
    let report = plugin
        .check_checkpoint(&config, &CheckpointIndex { tensors: RVec::new() })
        .expect("check_checkpoint")
        .expect("1.4 plugin");
    assert_eq!(report.problems[0].as_str(), "missing tensor `vision.proj.weight`");
}

#[test]
fn plugin_errors_come_back_typed() {
    let (_dir, plugin) = load_good();
    let config = plugin.parse_config(&GOOD.config_json(), "").expect("parse_config");

    let check = |item: MediaItem, options: PreprocessOptions, code: ErrorCode, message: &str| match plugin
        .preprocess(&config, &item, &options)
    {
        Err(Error::Plugin { plugin, entry, error }) => {
            assert_eq!((plugin.as_str(), entry, error.code), ("testkit-good", "preprocess", code));
            assert_eq!(error.message.as_str(), message);
        }
        other => panic!("expected a plugin error, got {other:?}"),
    };
    check(
        rgb(3, 2),
        PreprocessOptions::default(),
        ErrorCode::InvalidArgument,
        "image 3x2 is not a positive multiple of the 2-pixel patch",
    );
    check(
        rgb(4, 4),
        PreprocessOptions { max_pixels: ROption::RSome(8), ..Default::default() },
        ErrorCode::ResourceExhausted,
        "image has 16 pixels, more than 8",
    );
    check(
        MediaItem::EncodedImage(RVec::from(vec![0u8; 4])),
        PreprocessOptions::default(),
        ErrorCode::Unsupported,
        "the toy family takes decoded RGB images only",
    );

    let err = plugin.parse_config("{not json", "").expect_err("bad json");
    assert!(
        err.to_string().starts_with("plugin `testkit-good` failed in parse_config: invalid argument: config.json:"),
        "{err}"
    );
}

#[test]
fn scan_skips_each_bad_plugin_with_its_reason_and_loads_the_rest() {
    let dir = PluginDir::new();
    dir.install(GOOD, |_| {});
    dir.install(INCOMPATIBLE_MAJOR, |m| m.plugin.plugin_api = "1.4".to_owned());
    dir.install(PANICKING_IDENTITY, |_| {});
    dir.install(NO_ENTRY, |_| {});
    // A corrupt library with a manifest whose sha256 matches it.
    let corrupt = dir.write("libcorrupt.so", b"\x7fELF but not really a shared object");
    let mut manifest = GOOD.manifest(&corrupt);
    manifest.plugin.name = "corrupt".to_owned();
    manifest.plugin.library = "libcorrupt.so".to_owned();
    manifest.accepts.architectures = vec!["CorruptForCausalLM".to_owned()];
    manifest.accepts.model_types = vec!["corrupt".to_owned()];
    dir.write_manifest("corrupt.toml", &manifest);
    // A manifest whose sha256 names other bytes.
    let mut stale = GOOD.manifest(&corrupt);
    stale.plugin.name = "stale".to_owned();
    stale.accepts.architectures = vec!["StaleForCausalLM".to_owned()];
    stale.accepts.model_types = vec!["stale".to_owned()];
    dir.write_manifest("stale.toml", &stale);
    // A manifest that does not validate.
    dir.write("broken.toml", b"manifest_version = 1\n[plugin]\nname = \"broken\"\n");
    // A library nobody names.
    dir.write("libstray.so", b"");

    let set = scan(dir.path()).expect("scan");
    let loaded: Vec<&str> = set.plugins().iter().map(|p| p.name()).collect();
    assert_eq!(loaded, ["testkit-good"]);

    let mut reasons: Vec<String> = set.rejected().iter().map(|r| r.to_string()).collect();
    reasons.sort();
    let dir_text = dir.path().display().to_string();
    let reasons: Vec<String> = reasons.into_iter().map(|r| r.replace(&dir_text, "$DIR")).collect();
    let expect_prefixes = [
        "skipped $DIR/libstray.so: no manifest names library $DIR/libstray.so",
        "skipped plugin `broken` ($DIR/broken.toml): invalid manifest $DIR/broken.toml: missing field `version`",
        "skipped plugin `corrupt` ($DIR/corrupt.toml): cannot open library $DIR/libcorrupt.so: ",
        "skipped plugin `stale` ($DIR/stale.toml): library $DIR/libmlxcel_testkit_good.so does not match its manifest: sha256 is ",
        "skipped plugin `testkit-incompatible-major` ($DIR/testkit-incompatible-major.toml): plugin `testkit-incompatible-major` was built against plugin-api 2.0, which this host (plugin-api 1.4) cannot load",
        "skipped plugin `testkit-no-entry` ($DIR/testkit-no-entry.toml): library $DIR/libmlxcel_testkit_no_entry.so lacks the symbol `mlxcel_plugin_api_version`: not built with export_plugin!",
        "skipped plugin `testkit-panicking-identity` ($DIR/testkit-panicking-identity.toml): plugin `testkit-panicking-identity` failed in identity: panicked: plugin panicked in identity: identity is broken in this fixture",
    ];
    assert_eq!(reasons.len(), expect_prefixes.len(), "{reasons:#?}");
    for (reason, prefix) in reasons.iter().zip(expect_prefixes) {
        assert!(reason.starts_with(prefix), "\n{reason}\ndoes not start with\n{prefix}");
    }
}

#[test]
fn two_plugins_claiming_one_architecture_are_both_skipped() {
    let dir = PluginDir::new();
    dir.install(GOOD, |_| {});
    dir.install(DUPLICATE, |_| {});
    dir.install(crate::support::PANICKING, |_| {});
    let set = scan(dir.path()).expect("scan");
    assert_eq!(set.plugins().iter().map(|p| p.name()).collect::<Vec<_>>(), ["testkit-panicking"]);
    let mut messages: Vec<String> = set.rejected().iter().map(|r| r.error.to_string()).collect();
    messages.sort();
    assert_eq!(messages.len(), 2);
    assert!(messages[0].starts_with(
        "plugin `testkit-duplicate` claims architecture `ToyGoodForConditionalGeneration`, also claimed by `testkit-good ("
    ));
    assert!(messages[1].starts_with(
        "plugin `testkit-good` claims architecture `ToyGoodForConditionalGeneration`, also claimed by `testkit-duplicate ("
    ));
    assert!(matches!(set.for_config(&GOOD.config_json()), Err(Error::NoPlugin { .. })));
}

#[test]
fn a_manifest_that_disagrees_with_its_library_refuses_the_plugin() {
    fn check(tweak: fn(&mut mlxcel_plugin_api::Manifest), expect: &str) {
        let dir = PluginDir::new();
        let manifest = dir.install(GOOD, tweak);
        let err = mlxcel_plugin_api::load_plugin(&manifest).expect_err("the manifest disagrees");
        assert!(matches!(err, Error::ManifestMismatch { .. }), "{err:?}");
        assert_eq!(err.to_string(), expect);
    }
    check(
        |m| m.plugin.version = "9.9.9".to_owned(),
        "plugin `testkit-good` disagrees with its manifest on version: manifest says 9.9.9, library says 0.3.1",
    );
    check(
        |m| m.plugin.name = "other-name".to_owned(),
        "plugin `other-name` disagrees with its manifest on name: manifest says other-name, library says testkit-good",
    );
    check(
        |m| m.accepts.architectures.push("ExtraForCausalLM".to_owned()),
        "plugin `testkit-good` disagrees with its manifest on architectures: manifest says \
         [ExtraForCausalLM, ToyGoodForConditionalGeneration], library says [ToyGoodForConditionalGeneration]",
    );
    check(
        |m| {
            m.capabilities.remove("multi_image");
        },
        "plugin `testkit-good` disagrees with its manifest on capabilities: manifest says [image], \
         library says [image, multi_image]",
    );
    check(
        |m| m.plugin.plugin_api = "1.0".to_owned(),
        "plugin `testkit-good` disagrees with its manifest on plugin_api: manifest says 1.0, library says 1.4",
    );
}

#[test]
fn an_invalid_manifest_is_refused_before_its_library_is_opened() {
    let dir = PluginDir::new();
    // The library is garbage: had it been opened, the error would be about opening it.
    let corrupt = dir.write("libmlxcel_testkit_good.so", b"garbage");
    let mut manifest = GOOD.manifest(&corrupt);
    manifest.capabilities.get_mut("image").expect("image").evidence = None;
    let path = dir.write_manifest("good.toml", &manifest);
    let err = mlxcel_plugin_api::load_plugin(&path).expect_err("qualified without evidence");
    assert!(matches!(err, Error::InvalidManifest { .. }), "{err:?}");
    assert!(err.to_string().ends_with("capabilities.image: status `qualified` requires evidence"), "{err}");
}

#[test]
fn plugins_are_selected_by_architecture_then_model_type() {
    let dir = PluginDir::new();
    dir.install(GOOD, |_| {});
    let set = scan(dir.path()).expect("scan");
    assert_eq!(set.for_config(&GOOD.config_json()).expect("by architecture").name(), "testkit-good");
    let by_type = r#"{"model_type": "toy_good"}"#;
    assert_eq!(set.for_config(by_type).expect("by model_type").name(), "testkit-good");
    let err = set.for_config(r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}"#).expect_err("none");
    assert_eq!(err.to_string(), "no loaded plugin accepts architecture `LlamaForCausalLM` (model_type `llama`)");
}
