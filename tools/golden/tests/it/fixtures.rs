//! Walks `tests/fixtures` and checks each golden against itself and its metadata, so a malformed or
//! inconsistent fixture fails here rather than inside a family's parity test.

use mlxcel_golden::{Fixture, Golden, TensorData, Tolerance, fixtures_root};

/// The checkpoint fixtures: every directory with a provenance and goldens. (The image corpus,
/// `tests/fixtures/images`, has no goldens; mlxcel-media's tests check it.)
fn fixtures() -> Vec<Fixture> {
    let mut dirs: Vec<_> = std::fs::read_dir(fixtures_root())
        .expect("tests/fixtures exists")
        .map(|e| e.expect("readable entry").path())
        .filter(|p| p.join("provenance.json").is_file() && p.join("goldens").is_dir())
        .collect();
    dirs.sort();
    dirs.into_iter().map(Fixture::open).collect()
}

fn argmax(row: &[f32]) -> i64 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as i64
}

fn check_consistent(g: &Golden) {
    let ids = g.input_ids().expect("input_ids");
    let n = ids.len();
    let meta_ids: Vec<i64> =
        serde_json::from_value(g.field("input_ids").expect("meta ids").clone()).expect("input_ids is a list of ints");
    assert_eq!(meta_ids, ids, "{}: json and tensor input_ids", g.variant());

    let logits = g.tensor("logits").expect("logits");
    assert_eq!(logits.shape[0], n, "{}: one logits row per prompt token", g.variant());
    let vocab = logits.shape[1];

    // Step 0 of the cached decode is the last prefill position: the same numbers as the full forward.
    let decode = g.tensor("decode_logits").expect("decode_logits");
    let steps = decode.shape[0];
    let decode = decode.as_f32().expect("f32 decode logits");
    let last_row = &logits.as_f32().expect("f32 logits")[(n - 1) * vocab..n * vocab];
    g.check_f32("logits", logits.as_f32().expect("f32"), Tolerance::EXACT).expect("a golden equals itself");
    let step0 = mlxcel_golden::Tensor { shape: vec![vocab], data: TensorData::F32(last_row.to_vec()) };
    mlxcel_golden::compare_f32("decode_logits[0]", &decode[..vocab], &step0, Tolerance::abs(1e-4))
        .expect("cached step 0 matches the full-sequence last row");

    let tokens = g.greedy_tokens().expect("greedy tokens");
    assert_eq!(tokens.len(), steps);
    let picked: Vec<i64> = decode.chunks_exact(vocab).map(argmax).collect();
    assert_eq!(picked, tokens, "{}: greedy tokens are the argmax of the decode logits", g.variant());
    assert!(g.min_greedy_margin().expect("margin") > 0.0);

    let positions = g.tensor("position_ids").expect("position ids");
    assert_eq!(*positions.shape.last().expect("rank >= 1"), n);
    for (stage, t) in g.stages().map(|s| (s, g.tensor(s).expect("stage"))) {
        if stage.starts_with("attention_mask.") {
            assert_eq!(t.shape, vec![n, n], "{}: {stage}", g.variant());
            let mask = t.as_u8().expect("u8 mask");
            assert!((0..n).all(|i| mask[i * n + i] == 1), "{}: {stage} diagonal", g.variant());
        }
    }
}

#[test]
fn every_fixture_loads_and_is_consistent() {
    let fixtures = fixtures();
    assert!(!fixtures.is_empty(), "no fixtures under {}", fixtures_root().display());
    for fixture in fixtures {
        let provenance = fixture.provenance().expect("provenance");
        assert!(provenance["reference"].is_string(), "{}", fixture.dir().display());
        assert!(fixture.dir().join("config.json").is_file());
        let variants = fixture.variants().expect("variants");
        assert!(!variants.is_empty(), "{}", fixture.dir().display());
        for v in variants {
            check_consistent(&fixture.golden(&v).expect("golden loads"));
        }
    }
}
