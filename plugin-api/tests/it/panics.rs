//! Panics never cross the boundary: they come back as errors and the plugin keeps working.

use mlxcel_plugin_api::{Error, ErrorCode, MediaItem, PreprocessOptions, RVec, load_plugin};

use crate::support::{PANICKING, PANICKING_IDENTITY, PluginDir};

fn rgb(width: u32, height: u32) -> MediaItem {
    MediaItem::Rgb8 { width, height, pixels: RVec::from(vec![128u8; (width * height * 3) as usize]) }
}

#[test]
fn a_panic_in_an_entry_is_an_error_and_the_next_call_works() {
    let dir = PluginDir::new();
    let plugin = load_plugin(&dir.install(PANICKING, |_| {})).expect("loads");
    let config = plugin.parse_config(&PANICKING.config_json(), "").expect("parse_config");
    let options = PreprocessOptions::default();

    for _ in 0..3 {
        match plugin.preprocess(&config, &rgb(6, 2), &options) {
            Err(Error::Plugin { entry: "preprocess", error, .. }) => {
                assert_eq!(error.code, ErrorCode::Panicked);
                assert_eq!(error.message.as_str(), "plugin panicked in preprocess: preprocess cannot handle width 6");
            }
            other => panic!("expected a caught panic, got {other:?}"),
        }
        let ok = plugin.preprocess(&config, &rgb(4, 2), &options).expect("the next call works");
        assert_eq!(ok.grid.feature_tokens, 2);
    }
    assert_eq!(plugin.call_identity().expect("identity still answers").name.as_str(), "testkit-panicking");
}

#[test]
fn a_plugin_whose_identity_panics_is_refused_at_load() {
    let dir = PluginDir::new();
    let err = load_plugin(&dir.install(PANICKING_IDENTITY, |_| {})).expect_err("identity panics");
    match err {
        Error::Plugin { entry: "identity", error, .. } => assert_eq!(error.code, ErrorCode::Panicked),
        other => panic!("expected a caught panic, got {other:?}"),
    }
}
