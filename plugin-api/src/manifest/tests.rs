//! Unit tests for manifest parsing and validation: one `check` call site, a table of cases.

use std::path::Path;

use super::*;

const VALID: &str = r#"
manifest_version = 1
modalities = ["image"]

[plugin]
name = "qwen2-vl"
version = "0.1.0"
plugin_api = "1.1"
library = "libmlxcel_family_qwen2_vl.so"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

[accepts]
architectures = ["Qwen2VLForConditionalGeneration"]
model_types = ["qwen2_vl"]

[limits]
max_pixels_per_image = 1003520
max_images_per_request = 8

[capabilities.image]
status = "qualified"

[capabilities.image.evidence]
reference = "transformers"
reference_versions = { transformers = "5.24.0", torch = "2.9.0" }
fixture = "tests/fixtures/qwen2_vl"
max_abs_diff = { preprocess = 0.0, placeholder = 0.0, encoder = 2e-5, positions = 0.0, mask = 0.0, logits = 5e-5 }
greedy_tokens_matched = 16
greedy_tokens_total = 16
batched = true
date = 2026-08-01

[capabilities.multi_image]
status = "experimental"
note = "two-image fixture not yet at parity"
"#;

/// Parses `VALID` with `edit` applied (a `(from, to)` text substitution) and compares the
/// outcome: `Ok(())` or the error message after the path prefix.
fn check(edit: (&str, &str), expect: Result<(), &str>) {
    let (from, to) = edit;
    assert!(VALID.contains(from), "the edit `{from}` does not apply");
    let text = VALID.replacen(from, to, 1);
    let got = Manifest::parse(&text, Path::new("m.toml")).map(|_| ()).map_err(|e| e.to_string());
    let expect = expect.map_err(|m| format!("invalid manifest m.toml: {m}"));
    assert_eq!(got, expect, "edit {edit:?}");
}

#[test]
fn the_example_is_valid_and_round_trips() {
    let manifest = Manifest::parse(VALID, Path::new("m.toml")).expect("valid");
    assert_eq!(manifest.plugin_api(), ApiVersion::new(1, 1));
    assert_eq!(manifest.modalities(), vec![Modality::Image]);
    assert_eq!(manifest.capability(Capability::Image).map(|c| c.status), Some(Status::Qualified));
    let again = Manifest::parse(&manifest.to_toml(), Path::new("m.toml")).expect("round trip");
    assert_eq!(again, manifest);
}

#[test]
fn identity_and_library_fields_are_checked() {
    check(
        ("manifest_version = 1", "manifest_version = 2"),
        Err("manifest_version 2 is not supported (this host reads 1)"),
    );
    check(("name = \"qwen2-vl\"", "name = \"Qwen2_VL\""), Err("plugin.name `Qwen2_VL` must match [a-z0-9-]+"));
    check(
        ("version = \"0.1.0\"", "version = \"one\""),
        Err("plugin.version `one` is not semver: unexpected character 'o' while parsing major version number"),
    );
    check(
        ("plugin_api = \"1.1\"", "plugin_api = \"1\""),
        Err("plugin.plugin_api: invalid plugin-api version `1`: expected MAJOR.MINOR"),
    );
    check(
        ("library = \"libmlxcel_family_qwen2_vl.so\"", "library = \"../evil.so\""),
        Err("plugin.library `../evil.so` must be a file name in the manifest's directory"),
    );
    check(
        ("sha256 = \"9f86", "sha256 = \"9F86"),
        Err(
            "plugin.sha256 `9F86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08` must be 64 lowercase hex digits",
        ),
    );
    check(
        ("architectures = [\"Qwen2VLForConditionalGeneration\"]\nmodel_types = [\"qwen2_vl\"]", ""),
        Err("accepts must list at least one architecture or model_type"),
    );
    check(
        ("modalities = [\"image\"]", "modalities = [\"image\", \"smell\"]"),
        Err("unknown modality `smell` (known: image, audio, video)"),
    );
    check(("max_images_per_request = 8", "max_images_per_request = 0"), Err("limits must be positive when given"));
    check(
        ("[plugin]", "surprise = true\n[plugin]"),
        Err(
            "unknown field `surprise`, expected one of `manifest_version`, `plugin`, `accepts`, `modalities`, `limits`, `capabilities`, `forms`, `chat` (line 5)",
        ),
    );
}

/// Issue 29: `detail: "low"`'s budget is positive, within the per-image limit, and for images.
#[test]
fn a_low_detail_budget_is_positive_and_only_tightens_the_pixel_limit() {
    let limits = "max_pixels_per_image = 1003520";
    check((limits, "max_pixels_per_image = 1003520\nlow_detail_max_pixels = 262144"), Ok(()));
    check((limits, "max_pixels_per_image = 1003520\nlow_detail_max_pixels = 1003520"), Ok(()));
    check((limits, "low_detail_max_pixels = 262144"), Ok(()));
    check(
        (limits, "max_pixels_per_image = 1003520\nlow_detail_max_pixels = 0"),
        Err("limits must be positive when given"),
    );
    check(
        (limits, "max_pixels_per_image = 1003520\nlow_detail_max_pixels = 2000000"),
        Err(
            "limits.low_detail_max_pixels 2000000 exceeds limits.max_pixels_per_image 1003520 (a low-detail budget only tightens the limit)",
        ),
    );
    let audio_only = VALID
        .replace("modalities = [\"image\"]", "modalities = [\"audio\"]")
        .replace("[capabilities.image]", "[capabilities.audio]")
        .replace("[capabilities.image.evidence]", "[capabilities.audio.evidence]")
        .replace(
            "[capabilities.multi_image]\nstatus = \"experimental\"\nnote = \"two-image fixture not yet at parity\"\n",
            "",
        )
        .replace(limits, "low_detail_max_pixels = 262144");
    let got = Manifest::parse(&audio_only, Path::new("m.toml")).map(|_| ()).map_err(|e| e.to_string());
    assert_eq!(got, Err("invalid manifest m.toml: limits.low_detail_max_pixels needs modality `image`".to_owned()));
    let parsed =
        Manifest::parse(&VALID.replace(limits, "low_detail_max_pixels = 262144"), Path::new("m.toml")).expect("valid");
    assert_eq!(parsed.limits.low_detail_max_pixels, Some(262_144));
    assert_eq!(parsed.limits.max_pixels_per_image, None);
}

#[test]
fn capabilities_must_be_known_and_match_modalities() {
    check(
        ("[capabilities.multi_image]", "[capabilities.telepathy]"),
        Err("unknown capability `telepathy` (known: image, multi_image, audio, video)"),
    );
    check(
        ("[capabilities.multi_image]\nstatus = \"experimental\"", "[capabilities.audio]\nstatus = \"experimental\""),
        Err("capability `audio` needs modality `audio`"),
    );
    check(
        ("note = \"two-image fixture not yet at parity\"", ""),
        Err("capabilities.multi_image: status `experimental` requires a note saying why"),
    );
}

#[test]
fn qualified_requires_complete_evidence_within_tolerance() {
    let evidence_start = VALID.find("[capabilities.image.evidence]").expect("evidence table");
    let evidence_end = VALID.find("[capabilities.multi_image]").expect("next table");
    check((&VALID[evidence_start..evidence_end], ""), Err("capabilities.image: status `qualified` requires evidence"));
    check(
        ("encoder = 2e-5", "encoder = 2e-3"),
        Err("capabilities.image: qualified evidence has encoder max-abs-diff 2e-3, over the tolerance 1e-4"),
    );
    check(("mask = 0.0, ", ""), Err("capabilities.image: qualified evidence lacks stage `mask`"));
    check(
        ("positions = 0.0", "positions = 1.0"),
        Err("capabilities.image: qualified evidence has positions max-abs-diff 1e0, over the tolerance 0e0"),
    );
    check(
        ("greedy_tokens_matched = 16", "greedy_tokens_matched = 15"),
        Err("capabilities.image: qualified requires token-exact greedy decoding, got 15/16"),
    );
    check(
        ("batched = true", "batched = false"),
        Err("capabilities.image: qualified requires evidence from mixed batches (batched = true)"),
    );
    check(
        ("logits = 5e-5", "logits = 5e-5, vibes = 0.0"),
        Err("capabilities.image: evidence.max_abs_diff has unknown stage `vibes`"),
    );
    check(
        ("date = 2026-08-01", "date = 2026-08-01T10:00:00"),
        Err("capabilities.image: evidence.date must be a date such as 2026-08-01"),
    );
    check(
        ("reference_versions = { transformers = \"5.24.0\", torch = \"2.9.0\" }", "reference_versions = {}"),
        Err("capabilities.image: evidence.reference_versions must name the reference's versions"),
    );
}

#[test]
fn experimental_may_carry_partial_evidence() {
    check(("status = \"qualified\"", "status = \"experimental\"\nnote = \"batched run pending\""), Ok(()));
    check(("status = \"qualified\"", "status = \"experimental\"\nnote = \"encoder off\""), Ok(()));
}

#[test]
fn checkpoint_forms_are_known_and_experimental_ones_name_their_first_divergence() {
    let experimental = "note = \"two-image fixture not yet at parity\"\n\n[forms.mlx_affine]\nstatus = \"experimental\"\nnote = \"mlx-vlm differs\"";
    let with = |tail: &str| ("note = \"two-image fixture not yet at parity\"", format!("{experimental}{tail}"));
    let (from, to) = with("\nfirst_divergence = \"mask\"");
    check((from, &to), Ok(()));
    let manifest = Manifest::parse(&VALID.replacen(from, &to, 1), Path::new("m.toml")).expect("valid");
    assert_eq!(manifest.form("mlx_affine").map(|f| f.status), Some(Status::Experimental));
    let (from, to) = with("");
    check((from, &to), Err("forms.mlx_affine: status `experimental` requires first_divergence"));
    let (from, to) = with("\nfirst_divergence = \"vibes\"");
    check(
        (from, &to),
        Err(
            "forms.mlx_affine: first_divergence `vibes` is not a stage (preprocess, placeholder, encoder, embeddings, positions, mask, logits)",
        ),
    );
    let (from, to) = (
        "[capabilities.multi_image]",
        "[forms.gguf_q4_k]\nstatus = \"experimental\"\nnote = \"x\"\nfirst_divergence = \"mask\"\n\n[capabilities.multi_image]",
    );
    check((from, to), Err("unknown checkpoint form `gguf_q4_k` (known: mlx_affine)"));
    let (from, to) =
        ("[capabilities.multi_image]", "[forms.mlx_affine]\nstatus = \"qualified\"\n\n[capabilities.multi_image]");
    check((from, to), Err("forms.mlx_affine: status `qualified` requires evidence"));
}

#[test]
fn a_tool_call_format_is_one_the_host_parses() {
    check(("[accepts]", "[chat]\ntool_call_format = \"hermes\"\n\n[accepts]"), Ok(()));
    check(
        ("[accepts]", "[chat]\ntool_call_format = \"xml\"\n\n[accepts]"),
        Err("chat.tool_call_format `xml` is not one the host parses (known: hermes)"),
    );
    check(
        ("[accepts]", "[chat]\nparser = \"hermes\"\n\n[accepts]"),
        Err("unknown field `parser`, expected `tool_call_format` (line 13)"),
    );
}
