//! Version negotiation: refusals name both versions; an older compatible minor loads.

use mlxcel_plugin_api::decoder::{self, DecoderSpec, presets};
use mlxcel_plugin_api::{
    API_VERSION, CheckpointIndex, EncoderCompute, EncoderGraphRequest, EncoderTarget, Error, Modality,
    PreprocessOptions, RVec, load_plugin,
};

use crate::support::{GOOD, INCOMPATIBLE_MAJOR, OLDER_MINOR, PluginDir, V1_1, V1_2, V1_3};

#[test]
fn an_incompatible_major_is_refused_from_the_manifest_naming_both_versions() {
    let dir = PluginDir::new();
    let manifest = dir.install(INCOMPATIBLE_MAJOR, |_| {});
    let err = load_plugin(&manifest).expect_err("major 2 on a 1.x host");
    match &err {
        Error::IncompatibleApi { plugin_version, host_version, .. } => {
            assert_eq!((plugin_version.to_string(), *host_version), ("2.0".to_owned(), API_VERSION));
        }
        other => panic!("expected IncompatibleApi, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "plugin `testkit-incompatible-major` was built against plugin-api 2.0, which this host (plugin-api 1.4) \
         cannot load: rebuild the plugin against this host's plugin-api major version"
    );
}

#[test]
fn an_incompatible_major_is_refused_from_the_library_even_if_the_manifest_lies() {
    let dir = PluginDir::new();
    let manifest = dir.install(INCOMPATIBLE_MAJOR, |m| m.plugin.plugin_api = "1.4".to_owned());
    let err = load_plugin(&manifest).expect_err("the version symbol says 2.0");
    assert!(matches!(err, Error::IncompatibleApi { .. }), "{err:?}");
    assert!(err.to_string().contains("built against plugin-api 2.0, which this host (plugin-api 1.4) cannot load"));
}

#[test]
fn a_newer_minor_is_refused() {
    let dir = PluginDir::new();
    let manifest = dir.install(GOOD, |m| m.plugin.plugin_api = "1.5".to_owned());
    let err = load_plugin(&manifest).expect_err("1.5 on a 1.4 host");
    assert_eq!(
        err.to_string(),
        "plugin `testkit-good` was built against plugin-api 1.5, which this host (plugin-api 1.4) cannot load: \
         upgrade the host, or rebuild the plugin against an older plugin-api minor"
    );
}

#[test]
fn a_plugin_built_against_an_older_minor_loads_without_the_newer_entries() {
    let dir = PluginDir::new();
    let manifest = dir.install(OLDER_MINOR, |_| {});
    let plugin = load_plugin(&manifest).expect("1.0 plugin on a 1.4 host");
    assert_eq!(plugin.api_version().to_string(), "1.0");

    let config = plugin.parse_config(&OLDER_MINOR.config_json(), "").expect("1.0 entries work");
    let pixels = RVec::from(vec![0u8; 2 * 2 * 3]);
    let item = mlxcel_plugin_api::MediaItem::Rgb8 { width: 2, height: 2, pixels };
    let pre = plugin.preprocess(&config, &item, &PreprocessOptions::default()).expect("preprocess");
    assert_eq!(pre.grid.feature_tokens, 1);

    // `check_checkpoint` arrived in 1.1: a 1.0 plugin does not have it, and says so as `None`.
    let report = plugin.check_checkpoint(&config, &CheckpointIndex { tensors: RVec::new() }).expect("no error");
    assert_eq!(report, None);
    assert_eq!(plugin.decoder_spec(&config).expect("no error"), None);
}

#[test]
fn a_plugin_built_against_1_1_has_check_checkpoint_but_no_decoder_spec() {
    let dir = PluginDir::new();
    let manifest = dir.install(V1_1, |_| {});
    let plugin = load_plugin(&manifest).expect("1.1 plugin on a 1.4 host");
    assert_eq!(plugin.api_version().to_string(), "1.1");
    let config = plugin.parse_config(&V1_1.config_json(), "").expect("parse_config");
    let report = plugin.check_checkpoint(&config, &CheckpointIndex { tensors: RVec::new() }).expect("no error");
    assert!(report.expect("1.1 has check_checkpoint").problems.len() == 1, "the missing projection is reported");
    // `decoder_spec` arrived in 1.2, and the toy implements it: through the 1.1 table it is absent.
    assert_eq!(plugin.decoder_spec(&config).expect("no error"), None);
}

#[test]
fn a_plugin_built_against_1_2_is_asked_for_its_encoder_without_the_target() {
    let dir = PluginDir::new();
    let plugin = load_plugin(&dir.install(V1_2, |_| {})).expect("1.2 plugin on a 1.4 host");
    assert_eq!(plugin.api_version().to_string(), "1.2");
    let config = plugin.parse_config(&V1_2.config_json(), "").expect("parse_config");
    // 1.2's entries are all there.
    assert!(plugin.decoder_spec(&config).expect("no error").is_some(), "1.2 has decoder_spec");
    // `encoder_graph_for` arrived in 1.3: the host falls back to `encoder_graph`, whose target
    // is not known, whatever it was given.
    let request = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-4".into() };
    let graph = plugin
        .encoder_graph(&config, &request, &EncoderTarget::new(Some(256)), EncoderCompute::F32)
        .expect("encoder_graph");
    assert!(graph.stablehlo.starts_with("// laid out for unknown vectors\n"), "{}", graph.stablehlo);
    assert_eq!(graph.outputs[0].shape.as_slice(), &[4, 16]);
}

#[test]
fn a_plugin_built_against_1_3_is_asked_for_its_encoder_in_f32_only() {
    let dir = PluginDir::new();
    let plugin = load_plugin(&dir.install(V1_3, |_| {})).expect("1.3 plugin on a 1.4 host");
    assert_eq!(plugin.api_version().to_string(), "1.3");
    let config = plugin.parse_config(&V1_3.config_json(), "").expect("parse_config");
    let request = EncoderGraphRequest { modality: Modality::Image, bucket: "patches-4".into() };
    // Through 1.3's `encoder_graph_for`: the plugin is told the target.
    let graph = plugin
        .encoder_graph(&config, &request, &EncoderTarget::new(Some(256)), EncoderCompute::F32)
        .expect("encoder_graph");
    assert!(graph.stablehlo.starts_with("// laid out for 256-bit vectors\n"), "{}", graph.stablehlo);
    // `encoder_graph_compute` arrived in 1.4: a 1.3 plugin cannot be asked for another compute,
    // and the host refuses rather than hand back an f32 graph.
    let err = plugin
        .encoder_graph(&config, &request, &EncoderTarget::new(Some(256)), EncoderCompute::Bf16Pairs)
        .expect_err("no bf16 encoders before 1.4");
    assert_eq!(
        err.to_string(),
        "plugin `testkit-v1-3` failed in encoder_graph_compute: unsupported: the plugin is built against plugin-api \
         1.3, whose encoders compute in f32 only; an encoder in bf16 (paired sums) needs a plugin built against 1.4 \
         or later"
    );
}

#[test]
fn a_current_plugin_brings_its_own_decoder_spec() {
    let dir = PluginDir::new();
    let plugin = load_plugin(&dir.install(GOOD, |_| {})).expect("loads");
    let config = plugin.parse_config(&GOOD.config_json(), "").expect("parse_config");
    let spec = plugin.decoder_spec(&config).expect("no error").expect("the toy brings a spec");
    // The toy's: Llama's blocks with q/k norms, reading `toy_text`.
    let llama = presets::llama();
    let want = DecoderSpec {
        name: "toy_text".into(),
        model_types: vec!["toy_text".into()],
        attention: decoder::spec::Attention { qk_norm: true, ..llama.attention },
        ..llama
    };
    assert_eq!(spec, want);
}
