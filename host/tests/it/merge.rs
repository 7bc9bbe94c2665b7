//! The host's merge of encoder rows into text embeddings, held against the Gemma 3 fixture's
//! goldens at the decoder (seed 001's negatives): a causal-only mask, text scaled twice and text
//! not scaled each take the logits out of the 1e-4 tolerance, while the merge the host does stays
//! inside it. The fixture is Gemma 3's because its contract has all three: a text scale and
//! bidirectional image blocks.

use mlxcel_golden::{Fixture, Golden};
use mlxcel_host::decoder::{BundleShape, Decoder, DecoderOptions, Extras, Logits, Positions};
use mlxcel_shim::{CompileCache, Compiler, Device, Driver, HostTensor};

use crate::support::fixture as fixture_dir;

fn fixture() -> std::path::PathBuf {
    fixture_dir("gemma3")
}

/// The fixture's decoder with one slot.
fn decoder() -> Decoder {
    let compiler = Compiler::locate().expect("compiler");
    let cache = CompileCache::new(CompileCache::default_dir());
    let device = Device::new(Driver::LocalSync).expect("device");
    let options =
        DecoderOptions { shape: BundleShape { chunk: 32, capacity: 128, slots: 1 }, ..DecoderOptions::default() };
    Decoder::load(&fixture(), options, &device, &compiler, &cache).expect("decoder loads")
}

fn golden(variant: &str) -> Golden {
    Fixture::open(fixture()).golden(variant).expect("golden")
}

/// How the merged prefill input is built.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Merge {
    /// As the host merges: raw rows scaled once by sqrt(hidden), projected rows placed
    /// unscaled, bidirectional attention inside each image's soft tokens.
    Right,
    /// The bidirectional blocks dropped: causal attention only.
    CausalOnly,
    /// The text rows scaled twice (a scaled `embed` scaled again by the merge).
    DoubleScaled,
    /// The text rows not scaled at all.
    Unscaled,
}

/// Prefills the golden prompt merged `how` (the golden projected rows at the soft tokens) and
/// returns the max-abs-diff of its logits from the golden ones, with the embeddings' own.
fn logits_diff(dec: &mut Decoder, variant: &str, how: Merge) -> (f32, f32) {
    let g = golden(variant);
    let tokens: Vec<u32> = g.input_ids().expect("ids").iter().map(|&t| t as u32).collect();
    let n = tokens.len();
    let hidden = dec.config().hidden;
    let scale = dec.embed_scale();
    let raw = dec.embed(&tokens).expect("embed");
    let text = match how {
        Merge::Right | Merge::CausalOnly => Decoder::scale_embeddings(&raw, scale).expect("scale"),
        Merge::DoubleScaled => {
            let once = Decoder::scale_embeddings(&raw, scale).expect("scale");
            Decoder::scale_embeddings(&once, scale).expect("scale again")
        }
        Merge::Unscaled => raw,
    };
    let mut values: Vec<f32> = text.to_vec().expect("f32");
    let features = g.tensor("image_features").expect("image_features").as_f32().expect("f32").to_vec();
    let soft = 392;
    let mut rows = features.chunks_exact(hidden);
    let mut blocks: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        if t != soft {
            continue;
        }
        values[i * hidden..(i + 1) * hidden].copy_from_slice(rows.next().expect("a projected row per soft token"));
        match blocks.last_mut() {
            Some(b) if b.end == i => b.end = i + 1,
            _ => blocks.push(i..i + 1),
        }
    }
    assert!(rows.next().is_none(), "{variant}: every projected row placed");
    let embeds = g.tensor("inputs_embeds").expect("inputs_embeds").as_f32().expect("f32");
    let embed_diff = values.iter().zip(embeds).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    let x = HostTensor::from_slice(vec![n, hidden], &values).expect("embeddings");
    let extras = Extras {
        bidirectional: if how == Merge::CausalOnly {
            Vec::new()
        } else {
            blocks.into_iter().map(|b| vec![b]).collect()
        },
        ..Extras::default()
    };
    let positions = Positions::OneD((0..n as i32).collect());
    dec.release(0).expect("release");
    let logits = dec.prefill_embeddings(0, &x, &positions, &extras, Logits::All).expect("prefill");
    let want = g.tensor("logits").expect("logits").as_f32().expect("f32");
    assert_eq!(logits.len(), want.len(), "{variant}: logits");
    let diff = logits.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    (embed_diff, diff)
}

/// Seed 001's negatives: a causal-only mask, double scaling and missing scaling each take the
/// logits out of the 1e-4 tolerance; the right merge stays inside it.
#[test]
fn wrong_merges_diverge_from_the_golden_logits_and_the_right_one_does_not() {
    let mut dec = decoder();
    assert_eq!(dec.embed_scale(), 8.0, "sqrt(64)");
    for variant in ["image", "two_images"] {
        let (embeds, right) = logits_diff(&mut dec, variant, Merge::Right);
        println!("{variant}: right merge: inputs_embeds {embeds:e}, logits {right:e}");
        assert_eq!(embeds, 0.0, "{variant}: the right merge is the reference's inputs_embeds");
        assert!(right <= 1e-4, "{variant}: the right merge's logits are {right:e} from the golden");
        for wrong in [Merge::CausalOnly, Merge::DoubleScaled, Merge::Unscaled] {
            let (embeds, diff) = logits_diff(&mut dec, variant, wrong);
            println!("{variant}: {wrong:?}: inputs_embeds {embeds:e}, logits {diff:e}");
            assert!(diff > 1e-4, "{variant}: {wrong:?} stays within the tolerance ({diff:e})");
        }
    }
}
