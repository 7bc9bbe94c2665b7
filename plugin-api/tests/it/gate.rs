//! The capability gate: only `qualified` is served by default, and the refusal names the flag.

use mlxcel_plugin_api::manifest::{CapabilityEntry, Status};
use mlxcel_plugin_api::{ALLOW_UNQUALIFIED_FLAG, Capability, Error, QualificationPolicy};

use crate::support::{GOOD, PluginDir};

#[test]
fn only_qualified_capabilities_are_served_without_the_opt_in() {
    let dir = PluginDir::new();
    let manifest = dir.install(GOOD, |m| {
        m.capabilities.insert(
            "audio".to_owned(),
            CapabilityEntry { status: Status::Unsupported, note: Some("no audio tower".to_owned()), evidence: None },
        );
        m.modalities.push("audio".to_owned());
    });
    // The library does not claim audio, so load the manifest alone for the gate.
    let manifest = mlxcel_plugin_api::Manifest::from_file(&manifest).expect("valid manifest");
    let strict = QualificationPolicy::default();
    let opted_in = QualificationPolicy { allow_unqualified: true };
    let gate = mlxcel_plugin_api::check_capability;

    assert_eq!(gate(&manifest, Capability::Image, strict).expect("qualified"), Status::Qualified);

    let err = gate(&manifest, Capability::MultiImage, strict).expect_err("experimental");
    assert!(matches!(err, Error::Unqualified { status: Status::Experimental, .. }));
    assert_eq!(
        err.to_string(),
        "capability `multi_image` of plugin `testkit-good` is experimental, not qualified; start the host with \
         --allow-unqualified to serve it anyway"
    );
    assert!(err.to_string().contains(ALLOW_UNQUALIFIED_FLAG));
    assert_eq!(gate(&manifest, Capability::MultiImage, opted_in).expect("opted in"), Status::Experimental);

    for policy in [strict, opted_in] {
        let err = gate(&manifest, Capability::Audio, policy).expect_err("unsupported");
        assert_eq!(err.to_string(), "capability `audio` is not supported by plugin `testkit-good`");
        let err = gate(&manifest, Capability::Video, policy).expect_err("undeclared");
        assert_eq!(err.to_string(), "capability `video` is not supported by plugin `testkit-good`");
    }
}

#[test]
fn the_gate_is_available_on_a_loaded_plugin() {
    let (_dir, plugin) = crate::support::load_good();
    assert_eq!(
        plugin.check_capability(Capability::Image, QualificationPolicy::default()).expect("ok"),
        Status::Qualified
    );
    assert!(plugin.check_capability(Capability::MultiImage, QualificationPolicy::default()).is_err());
}
