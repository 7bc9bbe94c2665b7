//! Text decoders at parity with transformers: full-sequence logits within
//! 1e-4 and 16 greedy tokens identical, for prompts inside one prefill chunk
//! and longer than one, single and side by side in two slots.

use std::path::{Path, PathBuf};

use mlxcel_host::decoder::{
    BundleShape, Decoder, DecoderError, DecoderOptions, Extras, Logits, Positions, chunk_spans, graph,
};
use mlxcel_shim::{CompileCache, Compiler, Device, Driver, Target};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

struct Golden {
    input_ids: Vec<u32>,
    greedy: Vec<u32>,
    logits: Vec<f32>,
    decode_logits: Vec<f32>,
    /// The merged embeddings the reference fed its decoder, `[n, hidden]`.
    inputs_embeds: Vec<f32>,
    /// `[n]` or `[3, n]`.
    positions: Positions,
    /// Bidirectional image blocks (from `token_type_ids`) and DeepStack
    /// features scattered onto the image rows, as the contract hands them.
    extras: Extras,
}

fn golden(name: &str, variant: &str) -> Golden {
    let dir = fixture(name).join("goldens");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{variant}.json"))).expect("json"))
            .expect("json");
    let ids = |k: &str| -> Vec<u32> {
        meta[k].as_array().expect("array").iter().map(|v| v.as_u64().expect("id") as u32).collect()
    };
    let bytes = std::fs::read(dir.join(format!("{variant}.safetensors"))).expect("goldens");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let f32s = |k: &str| -> Vec<f32> {
        st.tensor(k).expect(k).data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    let pos = st.tensor("position_ids").expect("position_ids");
    let flat: Vec<i32> =
        pos.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")) as i32).collect();
    let positions = match pos.shape() {
        [3, n] => Positions::MRope([flat[..*n].to_vec(), flat[*n..2 * n].to_vec(), flat[2 * n..].to_vec()]),
        _ => Positions::OneD(flat),
    };
    let input_ids = ids("input_ids");
    let n = input_ids.len();
    let mut extras = Extras::default();
    // Media rows see each other both ways only where the reference's full-attention mask lets a
    // row see a later one (Gemma 3's images; Gemma 3n's audio rows carry token types too, and
    // stay causal).
    let bidirectional = st.tensor("attention_mask.full_attention").is_ok_and(|m| {
        let side = m.shape()[0];
        m.data().iter().enumerate().any(|(i, &v)| v != 0 && i % side > i / side)
    });
    if let Some(tt) = st.tensor("token_type_ids").ok().filter(|_| bidirectional) {
        let image: Vec<bool> = tt.data().chunks_exact(8).map(|c| c.iter().any(|&b| b != 0)).collect();
        let mut start = None;
        for (i, &is_image) in image.iter().chain([&false]).enumerate() {
            match (is_image, start) {
                (true, None) => start = Some(i),
                (false, Some(b)) => {
                    extras.bidirectional.push(std::iter::once(b..i).collect());
                    start = None;
                }
                _ => {}
            }
        }
    }
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).expect("config"))
            .expect("json");
    for layer in 0.. {
        let Ok(features) = st.tensor(&format!("deepstack_features.{layer}")) else { break };
        let image_token = config["image_token_id"].as_u64().expect("image_token_id") as u32;
        let hidden = features.shape()[1];
        let rows: Vec<f32> =
            features.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let mut dense = vec![0.0f32; n * hidden];
        let mut next = rows.chunks_exact(hidden);
        for (i, &t) in input_ids.iter().enumerate() {
            if t == image_token {
                dense[i * hidden..(i + 1) * hidden]
                    .copy_from_slice(next.next().expect("a feature row per image token"));
            }
        }
        assert!(next.next().is_none(), "as many feature rows as image tokens");
        extras.injections.push(mlxcel_shim::HostTensor::from_slice(vec![n, hidden], &dense).expect("injection"));
    }
    extras.row_tokens = input_ids.clone();
    Golden {
        extras,
        input_ids,
        greedy: ids("greedy_tokens"),
        logits: f32s("logits"),
        decode_logits: f32s("decode_logits"),
        inputs_embeds: f32s("inputs_embeds"),
        positions,
    }
}

/// The decoder spec a fixture's family brings: Qwen3-VL's language model is the qwen3 preset
/// with one injected layer per DeepStack vision block, which its family plugin declares from
/// its own config; Youtu-VL's is the youtu preset read from its flat root config; the other
/// fixtures read their preset.
fn spec(name: &str) -> Option<mlxcel_decoder::DecoderSpec> {
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).expect("config"))
            .expect("json");
    if config["model_type"] == "youtu_vl" {
        return Some(mlxcel_decoder::DecoderSpec {
            model_types: vec!["youtu_vl".into()],
            ..mlxcel_decoder::presets::youtu()
        });
    }
    let deepstack = config.pointer("/vision_config/deepstack_visual_indexes")?.as_array()?.len();
    Some(mlxcel_decoder::DecoderSpec { injected_layers: deepstack, ..mlxcel_decoder::presets::qwen3() })
}

fn load(name: &str, shape: BundleShape) -> Decoder {
    let compiler = Compiler::locate().expect("compiler");
    let cache = CompileCache::new(CompileCache::default_dir());
    let device = Device::new(Driver::LocalSync).expect("device");
    let options = DecoderOptions { shape, spec: spec(name), ..DecoderOptions::default() };
    Decoder::load(&fixture(name), options, &device, &compiler, &cache).expect("decoder loads")
}

const SHAPE: BundleShape = BundleShape { chunk: 32, capacity: 128, slots: 2 };

/// First coordinate over tolerance, for a useful failure message.
fn assert_close(stage: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{stage}: length");
    let mut max = 0.0f32;
    let mut first = None;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        max = max.max(d);
        if d > tol && first.is_none() {
            first = Some((i, *g, *w));
        }
    }
    eprintln!("{stage}: max-abs-diff {max:e}");
    if let Some((i, g, w)) = first {
        panic!("{stage}: first divergence at flat index {i}: got {g}, want {w}; max-abs-diff {max:e} > {tol:e}");
    }
}

fn argmax(xs: &[f32]) -> u32 {
    xs.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0
        as u32
}

/// What a parity run prefills from.
#[derive(Clone, Copy, Debug)]
enum From {
    /// The prompt's token ids.
    Tokens,
    /// The reference's merged embeddings and positions (image features
    /// already in place), as a family plugin's contract would hand them over.
    Embeddings,
}

fn prefill(dec: &mut Decoder, slot: usize, g: &Golden, from: From) -> Vec<f32> {
    match from {
        From::Tokens => dec.prefill_tokens(slot, &g.input_ids, Logits::All).expect("prefill tokens"),
        From::Embeddings => {
            let n = g.input_ids.len();
            let x = mlxcel_shim::HostTensor::from_slice(vec![n, dec.config().hidden], &g.inputs_embeds).expect("x");
            dec.prefill_embeddings(slot, &x, &g.positions, &g.extras, Logits::All).expect("prefill embeddings")
        }
    }
}

/// Prefill then greedy decode in `slot`; returns (prompt logits, tokens, decode logits).
fn run(dec: &mut Decoder, slot: usize, g: &Golden, from: From) -> (Vec<f32>, Vec<u32>, Vec<f32>) {
    let n = g.greedy.len();
    let logits = prefill(dec, slot, g, from);
    let vocab = dec.config().vocab;
    let mut next = argmax(&logits[logits.len() - vocab..]);
    let (mut tokens, mut dlogits) = (vec![next], Vec::new());
    for _ in 1..n {
        let l = dec.decode(&[(slot, next)]).expect("decode").remove(0);
        next = argmax(&l);
        dlogits.extend_from_slice(&l);
        tokens.push(next);
    }
    (logits, tokens, dlogits)
}

fn check_parity(name: &str, variants: &[&str], from: From) {
    let mut dec = load(name, SHAPE);
    for &variant in variants {
        let g = golden(name, variant);
        let (logits, tokens, dlogits) = run(&mut dec, 0, &g, from);
        assert_close(&format!("{name}/{variant} logits"), &logits, &g.logits, 1e-4);
        assert_eq!(tokens, g.greedy, "{name}/{variant}: greedy tokens");
        let vocab = dec.config().vocab;
        // decode_logits row i is the distribution that chose token i + 1.
        assert_close(
            &format!("{name}/{variant} decode logits"),
            &dlogits,
            &g.decode_logits[vocab..vocab * g.greedy.len()],
            1e-4,
        );
        dec.release(0).expect("release");
    }
}

#[test]
fn qwen2_matches_transformers() {
    check_parity("qwen2", &["short", "long"], From::Tokens);
}

#[test]
fn llama_matches_transformers() {
    check_parity("llama", &["short", "long"], From::Tokens);
}

#[test]
fn qwen3_matches_transformers() {
    check_parity("qwen3", &["short", "long"], From::Tokens);
}

/// Gemma 3n's language model (AltUp streams, LAuReL, per-layer inputs, KV sharing, activation
/// sparsity, the final soft cap) against transformers: from its tokens, and from transformers'
/// merged embeddings with audio features in place and each row's token id for the per-layer
/// inputs.
#[test]
fn gemma3n_decoder_matches_transformers() {
    check_parity("gemma3n", &["text_only"], From::Tokens);
    check_parity("gemma3n", &["text_only", "audio", "two_audios", "long"], From::Embeddings);
}

/// Multi-head latent attention (Youtu-LLM) against transformers, which expands every cached
/// latent into keys and values, and Youtu-VL's language model against mlx-vlm, which absorbs
/// the projections for short queries as the graph always does, fed mlx-vlm's merged
/// embeddings.
#[test]
fn latent_attention_matches_transformers_and_mlx_vlm() {
    check_parity("youtu", &["short", "long"], From::Tokens);
    check_parity("youtu_vl", &["text_only", "image", "two_images", "long"], From::Embeddings);

    // The cache holds one row per position and layer: the latent and the shared rotated key
    // (16 + 8 values), not 4 heads of keys and values (4 x (24 + 16)).
    let mut dec = load("youtu", SHAPE);
    let layout = dec.kv_layout();
    assert_eq!((layout.layers, layout.planes, layout.row.as_slice()), (2, 1, &[1, 24][..]));
    let g = golden("youtu", "short");
    dec.prefill_tokens(0, &g.input_ids, Logits::Last).expect("prefill");
    let kv = dec.kv_slot(0).expect("kv slot");
    assert_eq!(kv.len(), 2 * g.input_ids.len() * 24);
    assert!(kv.iter().all(|v| v.is_finite()) && kv.iter().any(|&v| v != 0.0));
}

/// The VLM checkpoints' decoders, fed the reference's merged embeddings and
/// positions: M-RoPE (t, h, w) positions with rope deltas carried into
/// decode for the Qwen-VL families, 1-D for LLaVA.
#[test]
fn qwen2_vl_decoder_matches_transformers() {
    check_parity("qwen2_vl", &["text_only"], From::Tokens);
    check_parity("qwen2_vl", &["image", "two_images", "long", "text_only"], From::Embeddings);
}

#[test]
fn qwen2_5_vl_decoder_matches_transformers() {
    check_parity("qwen2_5_vl", &["image", "two_images", "long", "text_only"], From::Embeddings);
}

#[test]
fn llava_decoder_matches_transformers() {
    check_parity("llava", &["text_only"], From::Tokens);
    check_parity("llava", &["image", "two_images", "long"], From::Embeddings);
}

/// Qwen3-VL: interleaved M-RoPE, and DeepStack features added to the image
/// rows after the first layers.
#[test]
fn qwen3_vl_decoder_matches_transformers() {
    check_parity("qwen3_vl", &["text_only"], From::Tokens);
    check_parity("qwen3_vl", &["image", "two_images", "long", "text_only"], From::Embeddings);
}

/// Gemma3: image tokens see their whole image block in both directions, in
/// sliding and full layers; blocks that straddle a chunk move the chunk.
#[test]
fn gemma3_decoder_matches_transformers() {
    check_parity("gemma3", &["text_only"], From::Tokens);
    check_parity("gemma3", &["image", "two_images", "long", "text_only"], From::Embeddings);
}

/// `contract` with the weight tiles of this machine's CPU, as a bundle compiled for it takes them.
fn host_tiles(contract: mlxcel_emit::NumericContract) -> mlxcel_emit::NumericContract {
    contract.for_vectors(Target::host_cpu().vector_bits())
}

/// bf16 compute, asked for explicitly (bf16 activations, f32 accumulation, one rounding per
/// op), on the bf16 fixtures whose reference runs in bf16: Qwen2 (`qwen2_bf16`) and Gemma 3
/// (`gemma3_text_bf16_compute`, whose attention scale 24^-0.5 is not a power of two). Each runs
/// under both of the contract's sums that this CPU can run: in order (`Bf16Dot::InOrder`, what
/// CPUs without AVX512-BF16 get) everywhere, and in pairs (`Bf16Dot::Pairs`: IREE's bf16 mmt4d
/// microkernel, as torch's oneDNN sums with `vdpbf16ps`) where the CPU has AVX512-BF16. Every
/// rounding to bf16 is written out (`NumericContract::round`) and attention scores are scaled as
/// torch scales them (`NumericContract::act_scale`), so the prompt logits equal the reference's
/// bit for bit and all 16 greedy tokens match, in both orders: these fixtures' linears sum at
/// most 128 inputs, which round to the same bf16 values in either order (at real widths the two
/// orders differ in about 1 output in 4,000, measured on AMD Zen 3). One exception is stated, in
/// order only: in Gemma 3's long prompt one row (row 43 of 85) rounds its attention differently,
/// 152 of its 448 logits by one bf16 step, since that contract's softmax (the backend's f32 `exp`
/// and sum) is not torch's to the last bit, and torch's own result moves the same way under
/// another f32 softmax (max-subtracted `exp` over the sum: row 52 of the same prompt). Those
/// logits are held to three bf16 steps of their row's largest magnitude, the bound
/// `tools/oracle/check.py` holds bf16 references to across CPUs. Summed in pairs the softmax is
/// torch's AVX-512 kernel's (`bf16_softmax_is_torchs`), and that prompt is exact too.
#[test]
fn bf16_compute_is_transformers_bf16() {
    let compiler = Compiler::locate().expect("compiler");
    let cache = CompileCache::new(CompileCache::default_dir());
    let device = Device::new(Driver::LocalSync).expect("device");
    let mut dots = vec![mlxcel_emit::Bf16Dot::InOrder];
    if Target::host_cpu().has_avx512_bf16() {
        dots.push(mlxcel_emit::Bf16Dot::Pairs);
    }
    // (fixture, variant, bit for bit)
    let cases = [
        ("qwen2_bf16", "short", true),
        ("qwen2_bf16", "long", true),
        ("gemma3_text_bf16_compute", "short", true),
        ("gemma3_text_bf16_compute", "long", false),
    ];
    for &dot in &dots {
        let bf16 = mlxcel_emit::NumericContract::bf16(dot);
        for name in ["qwen2_bf16", "gemma3_text_bf16_compute"] {
            let options = DecoderOptions { shape: SHAPE, contract: Some(bf16), ..DecoderOptions::default() };
            let mut dec = Decoder::load(&fixture(name), options, &device, &compiler, &cache).expect("bf16 compute");
            assert_eq!(dec.contract(), host_tiles(bf16), "{name}: bf16 compute is asked for, never the default");
            let vocab = dec.config().vocab;
            for &(_, variant, exact) in cases.iter().filter(|c| c.0 == name) {
                let g = golden(name, variant);
                let (logits, tokens, _) = run(&mut dec, 0, &g, From::Tokens);
                let what = format!("{name}/{variant} ({dot:?})");
                // Summed in pairs the softmax is torch's to the bit too, and every row is exact.
                if exact || dot == mlxcel_emit::Bf16Dot::Pairs {
                    let max = logits.iter().zip(&g.logits).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                    assert_eq!(max, 0.0, "{what}: prompt logits differ from transformers-bf16 by up to {max:e}");
                } else {
                    for (row, (ours, theirs)) in logits.chunks(vocab).zip(g.logits.chunks(vocab)).enumerate() {
                        let scale = theirs.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                        // A bf16 step at `scale`: 2^(floor(log2 scale) - 7).
                        let bound = 3.0 * 2f32.powi(scale.log2().floor() as i32 - 7);
                        let max = ours.iter().zip(theirs).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                        assert!(max <= bound, "{what}: row {row} differs by {max:e}, over {bound:e}");
                    }
                }
                assert_eq!(tokens, g.greedy, "{what}: greedy tokens");
                dec.release(0).expect("release");
            }
        }
    }
}

#[test]
fn gemma3_text_matches_transformers() {
    check_parity("gemma3_text", &["short", "long"], From::Tokens);
}

/// bf16 storage with f32 compute, the default for a bf16 checkpoint: the weights stay bf16 in
/// the bundle and are widened inside each op, at parity with transformers in f32 on the same
/// stored weights (logits within 1e-4, 16 greedy tokens identical).
#[test]
fn qwen2_bf16_weights_with_f32_compute_match_transformers() {
    let dec = load("qwen2_bf16_f32", SHAPE);
    assert_eq!(
        dec.contract(),
        host_tiles(mlxcel_emit::NumericContract::f32()),
        "bf16 weights compute in f32 by default"
    );
    assert_eq!(dec.fingerprint().dtype, "bf16", "the weights are read as stored");
    drop(dec);
    check_parity("qwen2_bf16_f32", &["short", "long"], From::Tokens);
}

/// The bf16 form of the other text fixtures (`tools/oracle/gen_bf16.py`: the fixture's weights
/// rounded once to bf16 and stored so), at parity with transformers in f32 on those weights.
#[test]
fn bf16_form_text_checkpoints_match_transformers() {
    for name in ["qwen3_bf16", "gemma3_text_bf16"] {
        let dec = load(name, SHAPE);
        assert_eq!(dec.fingerprint().dtype, "bf16", "{name}: the weights are read as stored");
        assert_eq!(dec.contract(), host_tiles(mlxcel_emit::NumericContract::f32()), "{name}: f32 compute");
        drop(dec);
        check_parity(name, &["short", "long"], From::Tokens);
    }
}

/// The Hub's form of each text fixture (`tools/oracle/gen_hub.py`: legacy `rope_theta` and
/// `rope_scaling`, no `layer_types`, Gemma 3's `sliding_window_pattern` and
/// `rope_local_base_freq`) decodes to the same goldens as the form transformers 5 writes.
#[test]
fn hub_form_text_checkpoints_match_transformers() {
    for name in ["llama_hub", "qwen2_hub", "qwen3_hub", "gemma3_text_hub"] {
        check_parity(name, &["short", "long"], From::Tokens);
    }
}

/// Gemma3ForCausalLM's final-logit soft-capping: with a cap of 1.0 every logit bends (by up to
/// 4.2 on these prompts), so an uncapped head fails this at the first row.
#[test]
fn gemma3_text_softcap_matches_transformers() {
    check_parity("gemma3_text_softcap", &["short", "long"], From::Tokens);
}

/// MLX community checkpoints (`tools/oracle/gen_mlx_quant.py`: converted by `mlx_lm.convert`,
/// goldens from mlx-lm's own load and greedy generate on mlx-cpu): 4-bit groups of 64 and 8-bit
/// groups of 32 over every linear and the embedding (qwen3's tied head reads the quantized
/// table), and mixed widths from per-module overrides with one module left dense and an untied
/// 8-bit head (llama), at parity with MLX: logits within 1e-4, 16 greedy tokens identical.
#[test]
fn mlx_quantized_checkpoints_match_mlx() {
    for (name, forms) in [
        ("qwen3_mlx_q4", &["affine bits=4 group_size=64 scales=f32", "f32"][..]),
        ("qwen3_mlx_q8", &["affine bits=8 group_size=32 scales=f32", "f32"][..]),
        (
            "llama_mlx_mixed",
            &[
                "affine bits=4 group_size=32 scales=f32",
                "affine bits=8 group_size=128 scales=f32",
                "affine bits=8 group_size=64 scales=f32",
                "f32",
            ][..],
        ),
    ] {
        let dec = load(name, SHAPE);
        let record: mlxcel_emit::ContractDescriptor =
            serde_json::from_str(&dec.fingerprint().numeric_contract).expect("the contract's record");
        assert_eq!(record.sources, forms, "{name}: the storage forms the contract names");
        assert!(record.dequantization.is_some(), "{name}: the dequantization is stated");
        drop(dec);
        check_parity(name, &["short", "long"], From::Tokens);
    }
}

/// A quantized checkpoint whose config does not say how (no `quantization`), or says
/// something its tensors contradict (another width, another group size, a module "left dense"
/// that carries scales), is refused before anything compiles, each tensor named.
#[test]
fn quantization_the_config_and_tensors_disagree_on_is_refused() {
    let compiler = Compiler::locate().expect("compiler");
    let temp = tempfile::tempdir().expect("temp dir");
    let cache = CompileCache::new(temp.path().join("cache"));
    let device = Device::new(Driver::LocalSync).expect("device");
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit, &str); 4] = [
        (
            "no quantization",
            |c| {
                let o = c.as_object_mut().expect("object");
                o.remove("quantization");
                o.remove("quantization_config");
            },
            "`model.embed_tokens.weight` is affine-quantized (scales and biases beside it), but config.json gives \
             this module no quantization parameters",
        ),
        (
            "8 bits",
            |c| {
                c["quantization"]["bits"] = 8.into();
                c["quantization_config"]["bits"] = 8.into();
            },
            "`model.layers.0.mlp.gate_proj.weight` has shape [128, 8]; 8-bit groups of 64 over a [128, 64] weight \
             need [128, 16]",
        ),
        (
            "groups of 32",
            |c| {
                c["quantization"]["group_size"] = 32.into();
                c["quantization_config"]["group_size"] = 32.into();
            },
            "`model.layers.0.mlp.gate_proj.scales` has shape [128, 1]; 4-bit groups of 32 over a [128, 64] weight \
             need [128, 2]",
        ),
        (
            "a quantized module said to be dense",
            |c| {
                c["quantization"]["model.layers.1.mlp.up_proj"] = false.into();
                c["quantization_config"]["model.layers.1.mlp.up_proj"] = false.into();
            },
            "`model.layers.1.mlp.up_proj.weight` is affine-quantized (scales and biases beside it), but config.json \
             gives this module no quantization parameters",
        ),
    ];
    for (what, edit, why) in edits {
        let dir = temp.path().join(what.replace(' ', "_"));
        crate::support::copy_dir(&fixture("qwen3_mlx_q4"), &dir);
        let path = dir.join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("config")).expect("json");
        edit(&mut config);
        std::fs::write(&path, serde_json::to_string_pretty(&config).expect("json")).expect("write");
        let options = DecoderOptions { shape: SHAPE, ..DecoderOptions::default() };
        let err = Decoder::load(&dir, options, &device, &compiler, &cache).expect_err(what);
        assert!(matches!(err, DecoderError::Weights(_)), "{what}: {err}");
        assert!(err.to_string().contains(why), "{what}: expected {why:?} in {err}");
    }
    assert!(!temp.path().join("cache").exists(), "nothing was compiled");
}

/// The host's per-kind visibility is exactly the reference's masks: sliding
/// windows (8 here) and Gemma3's bidirectional image blocks.
#[test]
fn attention_masks_match_the_reference() {
    for (name, variants) in [("gemma3_text", &["long"][..]), ("gemma3", &["image", "two_images", "long"][..])] {
        let config = mlxcel_host::decoder::TextConfig::load(&fixture(name), None).expect("config");
        for variant in variants {
            let g = golden(name, variant);
            let bytes = std::fs::read(fixture(name).join(format!("goldens/{variant}.safetensors"))).expect("goldens");
            let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
            for kind in config.kinds() {
                let golden = st.tensor(&format!("attention_mask.{}", kind.hf_name())).expect("mask");
                let n = golden.shape()[0];
                for q in 0..n {
                    for kv in 0..n {
                        let want = golden.data()[q * n + kv] != 0;
                        let block = g.extras.bidirectional.iter().flatten().any(|b| b.contains(&q) && b.contains(&kv));
                        let got = config.visible_with(kind, q, kv, block);
                        assert_eq!(got, want, "{name}/{variant} {kind:?} q={q} kv={kv}");
                    }
                }
            }
        }
    }
}

#[test]
fn two_slots_decode_together_as_each_alone() {
    let mut dec = load("qwen2", SHAPE);
    let (a, b) = (golden("qwen2", "short"), golden("qwen2", "long"));
    let vocab = dec.config().vocab;
    let la = dec.prefill_tokens(0, &a.input_ids, Logits::All).expect("prefill a");
    let lb = dec.prefill_tokens(1, &b.input_ids, Logits::All).expect("prefill b");
    let (mut na, mut nb) = (argmax(&la[la.len() - vocab..]), argmax(&lb[lb.len() - vocab..]));
    let (mut ta, mut tb) = (vec![na], vec![nb]);
    for _ in 1..a.greedy.len() {
        let out = dec.decode(&[(0, na), (1, nb)]).expect("decode");
        na = argmax(&out[0]);
        nb = argmax(&out[1]);
        ta.push(na);
        tb.push(nb);
    }
    assert_eq!(ta, a.greedy, "slot 0 beside slot 1");
    assert_eq!(tb, b.greedy, "slot 1 beside slot 0");

    // A reused slot gives what a fresh one gives.
    dec.release(1).expect("release");
    let (_, again, _) = run(&mut dec, 1, &a, From::Tokens);
    assert_eq!(again, a.greedy, "reused slot");
}

/// A step of fewer streams than slots runs a partial export (`decode_rows_W`) that computes a
/// row for each listed slot only (and padding rows up to W): on an 8-slot bundle, one stream
/// (W = 1), three in an arbitrary order (W = 4, one padding row) and seven (`decode`, every
/// slot) each give the logits of the same streams stepped beside all 8 slots (dense f32 and MLX
/// 4-bit weights) and the golden tokens, and the slots not listed keep their cache rows.
#[test]
fn fewer_streams_than_slots_decode_as_beside_every_slot() {
    let shape = BundleShape { slots: 8, ..SHAPE };
    for name in ["qwen2", "qwen3_mlx_q4"] {
        let prompts = [golden(name, "short"), golden(name, "long")];
        let g = |slot: usize| &prompts[slot % 2];
        for listed in [&[6][..], &[5, 2, 6], &[0, 1, 2, 3, 4, 5, 7]] {
            let (mut part, mut full) = (load(name, shape), load(name, shape));
            for dec in [&mut part, &mut full] {
                for slot in 0..8 {
                    dec.prefill_tokens(slot, &g(slot).input_ids, Logits::Last).expect("prefill");
                }
            }
            let idle: Vec<(usize, Vec<f32>)> =
                (0..8).filter(|s| !listed.contains(s)).map(|s| (s, part.kv_slot(s).expect("kv"))).collect();
            for step in 0..4 {
                let some: Vec<(usize, u32)> = listed.iter().map(|&s| (s, g(s).greedy[step])).collect();
                let every: Vec<(usize, u32)> = (0..8).map(|s| (s, g(s).greedy[step])).collect();
                let got = part.decode(&some).expect("some slots");
                let want = full.decode(&every).expect("every slot");
                for (&slot, one) in listed.iter().zip(&got) {
                    let what = format!("{name}: slots {listed:?}, slot {slot}, step {step}");
                    let diff = one.iter().zip(&want[slot]).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                    assert!(diff <= 1e-4, "{what}: differs from the all-slot step by {diff}");
                    assert_eq!(argmax(one), g(slot).greedy[step + 1], "{what}: the golden token");
                    assert_eq!(part.len(slot), full.len(slot), "{what}: length");
                }
            }
            for (slot, rows) in idle {
                assert_eq!(part.kv_slot(slot).expect("kv"), rows, "{name}: slots {listed:?}: slot {slot}'s rows");
                assert_eq!(part.len(slot), g(slot).input_ids.len(), "{name}: slots {listed:?}: slot {slot}'s length");
            }
        }
    }
}

/// Serving asks for the last row's logits only (`logits_at`); they are the
/// last row of the every-row logits verification compares, for a prompt
/// longer than one chunk. Its last call runs the narrowest token prefill
/// export that holds its rows (8, 16 or the whole 32 here), which computes a
/// prompt's rows in the same form at every width (`Rows::Prompt`): the same
/// bits as the embeddings path's whole chunks.
#[test]
fn last_row_logits_are_the_last_row_of_all() {
    let mut dec = load("qwen2", SHAPE);
    let g = golden("qwen2", "long");
    assert!(g.input_ids.len() > SHAPE.chunk + 20, "the prompt spans chunks");
    assert_eq!(graph::prefill_widths(SHAPE.chunk), [8, 16]);
    let (vocab, hidden) = (dec.config().vocab, dec.config().hidden);
    // Last calls of 5, 8 (width 8), 12 (16) and 20 rows (the chunk), then the whole prompt.
    let mut lengths: Vec<usize> = [5, 8, 12, 20].iter().map(|r| SHAPE.chunk + r).collect();
    lengths.push(g.input_ids.len());
    for n in lengths {
        let prompt = &g.input_ids[..n];
        let all = dec.prefill_tokens(0, prompt, Logits::All).expect("all rows");
        let last = dec.prefill_tokens(1, prompt, Logits::Last).expect("last row");
        assert_eq!(all.len(), n * vocab);
        assert_eq!(last.len(), vocab);
        // `logits_at` takes one row's form of the head, `logits` a chunk's.
        let diff = last.iter().zip(&all[all.len() - vocab..]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(diff <= 1e-5, "{n} rows: the last row differs from all rows' last by {diff}");
        assert_eq!(dec.len(0), dec.len(1));
        // Both caches hold the same rows: a step from each sees the same.
        let next = argmax(&last);
        let step = dec.decode(&[(0, next), (1, next)]).expect("decode");
        assert!(step[0] == step[1], "{n} rows: the next step differs");
        dec.release(1).expect("release 1");
        // The embeddings path, in whole chunks, from the same rows.
        let x = dec.embed(prompt).expect("embed");
        let x = Decoder::scale_embeddings(&x, dec.embed_scale()).expect("scale");
        assert_eq!(x.shape(), [n, hidden]);
        let from_x = dec
            .prefill_embeddings(1, &x, &Positions::Sequential, &Extras::default(), Logits::Last)
            .expect("embeddings");
        assert!(from_x == last, "{n} rows: the embeddings path's last row differs");
        dec.release(0).expect("release 0");
        dec.release(1).expect("release 1");
    }
}

#[test]
fn bad_requests_get_their_own_errors_and_change_nothing() {
    let mut dec = load("qwen2", SHAPE);
    let g = golden("qwen2", "short");
    dec.prefill_tokens(0, &g.input_ids, Logits::All).expect("prefill");
    let before = dec.len(0);
    let cases: Vec<(Result<_, DecoderError>, &str)> = vec![
        (dec.prefill_tokens(2, &[1], Logits::All).map(drop), "SlotOutOfRange"),
        (dec.prefill_tokens(1, &[], Logits::All).map(drop), "EmptyPrompt"),
        (dec.prefill_tokens(1, &[100_000], Logits::All).map(drop), "TokenOutOfRange"),
        (dec.prefill_tokens(1, &vec![1; SHAPE.capacity + 1], Logits::All).map(drop), "CapacityExceeded"),
        (dec.decode(&[(5, 1)]).map(drop), "SlotOutOfRange"),
        (dec.decode(&[(0, 9999)]).map(drop), "TokenOutOfRange"),
        (dec.decode(&[(0, 1), (0, 1)]).map(drop), "RepeatedSlot"),
    ];
    for (result, want) in cases {
        let err = result.expect_err(want);
        assert!(format!("{err:?}").starts_with(want), "want {want}, got {err:?}");
    }
    assert_eq!(dec.len(0), before, "a refused request leaves the other slot alone");
}

/// `embed`'s raw rows, scaled by the decoder's own embedding scale as the
/// host's merge scales them (`Decoder::scale_embeddings`), prefilled from
/// embeddings, are the same computation as `prefill_tokens`.
fn embeddings_equal_tokens(dec: &mut Decoder, g: &Golden) -> Vec<f32> {
    let from_tokens = dec.prefill_tokens(0, &g.input_ids, Logits::All).expect("prefill tokens");
    let raw = dec.embed(&g.input_ids).expect("embed");
    assert_eq!(raw.shape(), &[g.input_ids.len(), dec.config().hidden]);
    let x = Decoder::scale_embeddings(&raw, dec.embed_scale()).expect("scale");
    let from_embeddings = dec
        .prefill_embeddings(1, &x, &Positions::Sequential, &Extras::default(), Logits::All)
        .expect("prefill embeddings");
    assert_eq!(from_tokens, from_embeddings, "logits");
    assert_eq!(dec.len(0), dec.len(1));
    let (k0, k1) = (dec.kv_slot(0).expect("kv 0"), dec.kv_slot(1).expect("kv 1"));
    assert_eq!(k0, k1, "every layer's K and V");
    assert!(k0.iter().any(|&v| v != 0.0), "the cache was written");
    k0
}

/// Seeding a slot from embeddings is the same computation as from tokens:
/// the logits and every layer's K and V agree exactly. `embed` returns the
/// table's rows unscaled; Gemma3's sqrt(hidden) is applied once, by the
/// caller, as the token path applies it in the graph.
#[test]
fn prefill_embeddings_of_embedded_tokens_equals_prefill_tokens() {
    let mut gemma = load("gemma3_text", SHAPE);
    let g = golden("gemma3_text", "long");
    assert_eq!(gemma.embed_scale(), 8.0, "sqrt(64)");
    embeddings_equal_tokens(&mut gemma, &g);
    // The raw rows are the table's: scaling them is what makes the difference.
    let raw = gemma.embed(&g.input_ids).expect("embed");
    let scaled = Decoder::scale_embeddings(&raw, 8.0).expect("scale");
    let (r, s): (Vec<f32>, Vec<f32>) = (raw.to_vec().expect("raw"), scaled.to_vec().expect("scaled"));
    assert!(r.iter().zip(&s).all(|(r, s)| r * 8.0 == *s) && r != s, "embed is unscaled");
    drop(gemma);

    let mut dec = load("qwen3", SHAPE);
    let g = golden("qwen3", "long");
    assert_eq!(dec.embed_scale(), 1.0, "qwen3 does not scale its embeddings");
    let k0 = embeddings_equal_tokens(&mut dec, &g);
    assert_eq!(k0.len(), 2 * 2 * g.input_ids.len() * 2 * 32, "layers x (k, v) x rows x kv heads x head dim");

    // Wrong dtype or hidden size is refused before any native call.
    let ints = mlxcel_shim::HostTensor::from_slice(vec![2, 64], &[0i32; 128]).expect("tensor");
    assert!(matches!(
        dec.prefill_embeddings(1, &ints, &Positions::Sequential, &Extras::default(), Logits::All),
        Err(DecoderError::Embeddings(_))
    ));
    let narrow = mlxcel_shim::HostTensor::from_slice(vec![2, 63], &[0f32; 126]).expect("tensor");
    assert!(matches!(
        dec.prefill_embeddings(1, &narrow, &Positions::Sequential, &Extras::default(), Logits::All),
        Err(DecoderError::Embeddings(_))
    ));
    let x = dec.embed(&g.input_ids[..4]).expect("embed");
    let short = Positions::OneD(vec![0, 1, 2]);
    assert!(matches!(
        dec.prefill_embeddings(1, &x, &short, &Extras::default(), Logits::All),
        Err(DecoderError::Positions(_))
    ));
    let three = Positions::MRope([vec![0; 4], vec![0; 4], vec![0; 4]]);
    assert!(
        matches!(
            dec.prefill_embeddings(1, &x, &three, &Extras::default(), Logits::All),
            Err(DecoderError::Positions(_))
        ),
        "qwen3 has no M-RoPE"
    );
}

/// The bidirectional blocks and DeepStack features are load-bearing: the
/// same prompts without them diverge from the reference.
#[test]
fn dropping_contract_extras_diverges() {
    for (name, variant) in [("gemma3", "image"), ("qwen3_vl", "image")] {
        let mut dec = load(name, SHAPE);
        let mut g = golden(name, variant);
        g.extras = Extras::default();
        let logits = prefill(&mut dec, 0, &g, From::Embeddings);
        let max = logits.iter().zip(&g.logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(max > 1e-2, "{name}/{variant}: without its extras the logits still match (max diff {max:e})");
    }
}

/// The compatibility fingerprint follows the checkpoint's content (not its
/// path) and the bundle shape; a change recompiles instead of reusing.
#[test]
fn fingerprint_follows_content_and_shape() {
    let a = load("qwen2", SHAPE);
    let copy = tempfile::tempdir().expect("tempdir");
    for entry in std::fs::read_dir(fixture("qwen2")).expect("fixture") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            std::fs::copy(&path, copy.path().join(path.file_name().expect("name"))).expect("copy");
        }
    }
    let compiler = Compiler::locate().expect("compiler");
    let cache = CompileCache::new(CompileCache::default_dir());
    let device = Device::new(Driver::LocalSync).expect("device");
    let options = DecoderOptions { shape: SHAPE, ..DecoderOptions::default() };
    let b = Decoder::load(copy.path(), options.clone(), &device, &compiler, &cache).expect("copy loads");
    assert_eq!(a.fingerprint(), b.fingerprint(), "same content, other directory");
    assert_eq!(b.cache_outcome(), mlxcel_shim::CacheOutcome::Hit);

    let wider = DecoderOptions { shape: BundleShape { capacity: 160, ..SHAPE }, ..options };
    let c = Decoder::load(copy.path(), wider, &device, &compiler, &cache).expect("wider loads");
    assert_ne!(a.fingerprint().digest(), c.fingerprint().digest());
    assert_eq!(c.fingerprint().capacity, 160);
}

/// The first `m` rows of a golden's prompt as `prefill_embeddings` takes them.
fn head(dec: &Decoder, g: &Golden, m: usize) -> (mlxcel_shim::HostTensor, Positions, Extras) {
    let hidden = dec.config().hidden;
    let x = mlxcel_shim::HostTensor::from_slice(vec![m, hidden], &g.inputs_embeds[..m * hidden]).expect("x");
    let positions = match &g.positions {
        Positions::MRope(three) => Positions::MRope(three.clone().map(|s| s[..m].to_vec())),
        Positions::OneD(p) => Positions::OneD(p[..m].to_vec()),
        Positions::Sequential => Positions::Sequential,
    };
    let bidirectional = g.extras.bidirectional.iter().filter(|grp| grp.iter().all(|r| r.end <= m)).cloned().collect();
    let injections = g
        .extras
        .injections
        .iter()
        .map(|t| {
            let rows: Vec<f32> = t.to_vec().expect("f32");
            mlxcel_shim::HostTensor::from_slice(vec![m, hidden], &rows[..m * hidden]).expect("injection")
        })
        .collect();
    let row_tokens = g.extras.row_tokens.iter().take(m).copied().collect();
    (x, positions, Extras { bidirectional, injections, row_tokens })
}

/// The prefix cache's and the interleaved prefill's primitive: a slot that held an earlier
/// request (the prompt's first rows, then decoded tokens of its own) keeps those first rows,
/// computes the rest one prefill call at a time, and gives exactly the logits and the 16 greedy
/// tokens of a cold prefill of the whole prompt in another slot: M-RoPE positions and rope deltas (Qwen2-VL), DeepStack injections (Qwen3-VL),
/// bidirectional image blocks (Gemma 3), and a kept prefix ending mid-chunk.
fn check_kept_prefix(name: &str, variant: &str) {
    let mut dec = load(name, SHAPE);
    let g = golden(name, variant);
    let (n, vocab, hidden) = (g.input_ids.len(), dec.config().vocab, dec.config().hidden);
    // Keep two thirds of the prompt, backed off to the start of a block it would split.
    let mut keep = n * 2 / 3;
    for grp in &g.extras.bidirectional {
        let (start, end) = (grp[0].start, grp.last().expect("a run").end);
        if start < keep && keep < end {
            keep = start;
        }
    }
    assert!(keep > 0 && keep % SHAPE.chunk != 0, "{name}/{variant}: keep {keep} must be mid-chunk");
    let (x, positions, extras) = head(&dec, &g, keep);
    let first = dec.prefill_embeddings(0, &x, &positions, &extras, Logits::Last).expect("earlier request");
    let mut next = argmax(&first);
    for _ in 0..3 {
        next = argmax(&dec.decode(&[(0, next)]).expect("decode").remove(0));
    }
    assert_eq!(dec.held(0), keep + 3);
    dec.release(0).expect("release");

    let (cold, cold_tokens, _) = run(&mut dec, 1, &g, From::Embeddings);
    let x = mlxcel_shim::HostTensor::from_slice(vec![n, hidden], &g.inputs_embeds).expect("x");
    // The rest in pieces of one prefill call each, as the scheduler cuts it between decode steps.
    let spans: Vec<_> = g.extras.bidirectional.iter().map(|grp| grp[0].start..grp.last().expect("a run").end).collect();
    let mut warm = Vec::new();
    for (start, rows) in chunk_spans(keep, n, SHAPE.chunk, &spans) {
        let part = start..start + rows;
        warm.extend(dec.prefill_embeddings_rows(0, part, &x, &g.positions, &g.extras, Logits::All).expect("piece"));
    }
    assert_eq!(warm.len(), (n - keep) * vocab);
    assert!(
        warm == cold[keep * vocab..],
        "{name}/{variant}: the rows after the kept prefix differ from a cold prefill"
    );
    let mut next = argmax(&warm[warm.len() - vocab..]);
    let mut tokens = vec![next];
    while tokens.len() < cold_tokens.len() {
        next = argmax(&dec.decode(&[(0, next)]).expect("decode").remove(0));
        tokens.push(next);
    }
    assert_eq!(tokens, cold_tokens, "{name}/{variant}: greedy tokens after a kept prefix");
}

#[test]
fn a_kept_prefix_gives_a_cold_prefills_logits_and_tokens() {
    check_kept_prefix("qwen2_vl", "image");
    check_kept_prefix("qwen3_vl", "two_images");
    check_kept_prefix("gemma3", "image");
}

/// A prompt's kept rows give exactly the cold prefill's logits on the token path too, and what
/// cannot be kept is refused before any native call: more rows than the slot holds, the whole
/// prompt, a bidirectional block split.
#[test]
fn kept_token_rows_equal_a_cold_prefill_and_impossible_parts_are_refused() {
    let mut dec = load("qwen3", SHAPE);
    let g = golden("qwen3", "long");
    let keep = g.input_ids.len() / 2;
    let first = dec.prefill_tokens(0, &g.input_ids[..keep], Logits::Last).expect("earlier request");
    dec.decode(&[(0, argmax(&first))]).expect("decode");
    dec.release(0).expect("release");

    let prompt = &g.input_ids;
    let cold = dec.prefill_tokens(1, prompt, Logits::Last).expect("cold");
    let n = prompt.len();
    // More rows than the slot holds, the whole prompt, a part ending inside a prefill call.
    for bad in [keep + 2..n, n..n, keep..keep + 1] {
        let err = dec.prefill_tokens_rows(0, bad.clone(), prompt, Logits::Last).expect_err("refused");
        assert!(matches!(err, DecoderError::Part { .. }), "rows {bad:?}: {err:?}");
    }
    assert_eq!(dec.held(0), keep + 1, "a refused part leaves the slot's rows");
    let warm = dec.prefill_tokens_rows(0, keep..n, prompt, Logits::Last).expect("warm");
    assert!(warm == cold, "the logits after a kept prefix differ from a cold prefill");

    let x = dec.embed(prompt).expect("embed");
    let split = Extras { bidirectional: vec![vec![keep - 2..keep + 2]], ..Extras::default() };
    let err = dec
        .prefill_embeddings_rows(0, keep..n, &x, &Positions::Sequential, &split, Logits::Last)
        .expect_err("a split block is refused");
    assert!(matches!(err, DecoderError::Extras(_)), "{err:?}");
}

/// Mutation-sensitive: rotary tables hold at the positions of long contexts. The contract's
/// `cos_sin`, compiled and run, against the cosine and sine of the same f32 angles in f64 (Qwen2's
/// rotary, 128 wide, base 1e6, positions up to 131,071): within 1e-6. IREE's own reduction of
/// these angles was off by up to 4e-3.
#[test]
fn rotary_tables_hold_at_the_positions_of_long_contexts() {
    use mlxcel_emit::{Elem, Module, NumericContract, Type};
    let (d, base) = (128usize, 1.0e6f32);
    let inv: Vec<f32> = (0..d / 2).map(|i| 1.0 / base.powf((2 * i) as f32 / d as f32)).collect();
    let angles: Vec<f32> = (0..4096u32)
        .flat_map(|p| {
            let pos = (p * 32 + p % 32) as f32;
            inv.iter().step_by(8).map(move |f| pos * f)
        })
        .collect();
    let n = angles.len();
    let mut m = Module::new("rotary");
    let (mut f, a) = m.func("tables", &[Type::new(Elem::F32, &[n])]);
    let (cos, sin) = NumericContract::f32().cos_sin(&mut f, &a[0]);
    m.add_func(f, &[cos, sin]);
    let session = compiled(m, "rotary");
    let x = mlxcel_shim::HostTensor::from_slice(vec![n], &angles).expect("angles");
    let out = session.call("rotary.tables", &[mlxcel_shim::Arg::from(&x)]).expect("runs");
    let read = |i: usize| out[i].to_host().expect("read").to_vec::<f32>().expect("f32");
    for (got, exact, name) in [(read(0), f64::cos as fn(f64) -> f64, "cos"), (read(1), f64::sin, "sin")] {
        let (worst, at) = got
            .iter()
            .zip(&angles)
            .map(|(g, a)| ((*g as f64 - exact(*a as f64)).abs(), *a))
            .fold((0.0, 0.0), |w, e| if e.0 > w.0 { e } else { w });
        assert!(worst <= 1e-6, "{name} is off by {worst:e} at the angle {at}");
    }
}

/// Mutation-sensitive: the softmax's maximum, written as partial maxima a CPU's vectors hold
/// (`contract::max_last`), is one in-order maximum along the row bit for bit: compiled and run
/// beside that reduction on rows 1 to 1030 wide, whole vectors and not, with their maximum
/// anywhere, rows of negatives only (a pad of zeros would show), infinities, -0 beside +0, and
/// a NaN.
#[test]
fn the_softmax_maximum_is_the_rows_maximum() {
    use mlxcel_emit::{Elem, Module, Reduce, Type, contract::max_last};
    use mlxcel_shim::{Arg, HostTensor};
    let rows = 8usize;
    let widths = [1usize, 15, 16, 17, 33, 577, 1024, 1030];
    let mut m = Module::new("maxima");
    for &n in &widths {
        let (mut f, a) = m.func(&format!("max_{n}"), &[Type::new(Elem::F32, &[rows, n])]);
        let ours = max_last(&mut f, &a[0]);
        let in_order = f.reduce(&a[0], &[1], Reduce::Max);
        m.add_func(f, &[ours, in_order]);
    }
    let session = compiled(m, "maxima");
    for &n in &widths {
        let mut x: Vec<f32> = (0..rows * n).map(|i| ((i * 7919 % 1013) as f32 - 900.0) / 7.0).collect();
        let row = |r: usize| r * n..(r + 1) * n;
        x[row(1)].iter_mut().for_each(|v| *v = -v.abs() - 1.0);
        x[row(2)].iter_mut().for_each(|v| *v = -0.0);
        x[(3 * n + n / 2)..(3 * n + n / 2 + 1)].fill(0.0);
        x[row(3)].iter_mut().filter(|v| **v != 0.0).for_each(|v| *v = -0.0);
        x[row(4)].iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
        x[5 * n + n - 1] = f32::INFINITY;
        x[6 * n + n / 3] = f32::NAN;
        x[7 * n + n - 1] = 1.0e30;
        let t = HostTensor::from_slice(vec![rows, n], &x).expect("rows");
        let out = session.call(&format!("maxima.max_{n}"), &[Arg::from(&t)]).expect("runs");
        let read = |i: usize| out[i].to_host().expect("read").to_vec::<f32>().expect("f32");
        let (ours, in_order) = (read(0), read(1));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ours), bits(&in_order), "width {n}: {ours:?} against {in_order:?}");
        assert_eq!(in_order[3].to_bits(), 0, "width {n}: +0 is above -0");
        assert!(in_order[6].is_nan() && in_order[4] == f32::NEG_INFINITY, "width {n}: {in_order:?}");
    }
}

/// Mutation-sensitive: under bf16 activations an RMSNorm's mean of squares is torch's to the bit
/// (`tests/fixtures/torch_sums`, made by `tools/oracle/gen_torch_sums.py`). The contract's
/// `mean_last` of bf16-valued rows at widths 4 to 16,384 (under one vector, a scalar tail,
/// leftover vectors, one to three levels of torch's cascade) and its plain `rms_norm` of the rows
/// up to 3584 wide, compiled and run, equal torch's `x.float().pow(2).mean(-1)` and transformers'
/// `Qwen2RMSNorm` in bf16. The f32 contract's mean (the backend's order) is run beside it and
/// differs from torch's at real widths, so the order is what this holds.
#[test]
fn bf16_rms_norm_sums_as_torch() {
    use mlxcel_emit::{Bf16Dot, Elem, Module, NumericContract, RmsStyle, Type};
    use mlxcel_shim::{Arg, DType, HostTensor};
    let bytes = std::fs::read(fixture("torch_sums").join("sums.safetensors")).expect("torch_sums fixture");
    let golden = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut widths: Vec<usize> =
        golden.names().iter().filter_map(|n| n.strip_prefix("x.")).map(|w| w.parse().expect("width")).collect();
    widths.sort();
    assert!(widths.len() >= 8 && widths.contains(&1536) && widths.contains(&16384), "{widths:?}");
    let bf16 = NumericContract::bf16(Bf16Dot::Pairs);
    let mut m = Module::new("sums");
    for &n in &widths {
        let x = golden.tensor(&format!("x.{n}")).expect("x");
        let ty = Type::new(Elem::BF16, x.shape());
        let (mut f, a) = m.func(&format!("mean_{n}"), std::slice::from_ref(&ty));
        let xa = f.convert(&a[0], Elem::F32);
        let sq = f.mul(&xa, &xa);
        let torch_order = bf16.mean_last(&mut f, &sq);
        let backend_order = NumericContract::f32().mean_last(&mut f, &sq);
        m.add_func(f, &[torch_order, backend_order]);
        if golden.tensor(&format!("rms_norm.{n}")).is_ok() {
            let (mut f, a) = m.func(&format!("norm_{n}"), &[ty, Type::new(Elem::BF16, &[n])]);
            let eps: f64 = golden_eps(&bytes);
            let y = bf16.rms_norm(&mut f, &a[0], &a[1], eps, RmsStyle::Plain);
            m.add_func(f, &[y]);
        }
    }
    let session = compiled(m, "sums");
    let host = |name: &str| {
        let t = golden.tensor(name).expect("tensor");
        HostTensor::from_bytes(DType::BF16, t.shape().to_vec(), t.data().to_vec()).expect("bf16 tensor")
    };
    let mut backend_differs = 0;
    for &n in &widths {
        let x = host(&format!("x.{n}"));
        let out = session.call(&format!("sums.mean_{n}"), &[Arg::from(&x)]).expect("runs");
        let read = |i: usize| out[i].to_host().expect("read").to_vec::<f32>().expect("f32");
        let want: Vec<f32> = golden
            .tensor(&format!("mean_square.{n}"))
            .expect("means")
            .data()
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
            .collect();
        let (ours, backend) = (read(0), read(1));
        let differ = |got: &[f32]| got.iter().zip(&want).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
        assert_eq!(differ(&ours), 0, "width {n}: means of squares unlike torch's: {ours:?} against {want:?}");
        if n >= 1152 {
            backend_differs += differ(&backend);
        }
        if golden.tensor(&format!("rms_norm.{n}")).is_ok() {
            let w = host(&format!("weight.{n}"));
            let out = session.call(&format!("sums.norm_{n}"), &[Arg::from(&x), Arg::from(&w)]).expect("runs");
            let got = out[0].to_host().expect("read");
            let want = golden.tensor(&format!("rms_norm.{n}")).expect("norm");
            let differ = got.bytes().chunks(2).zip(want.data().chunks(2)).filter(|(g, w)| g != w).count();
            assert_eq!(differ, 0, "width {n}: {differ} normalized bf16 values unlike transformers'");
        }
    }
    assert!(backend_differs > 0, "the backend's order gave torch's sums too: this holds no order");
}

/// Mutation-sensitive: a bf16 linear summed in pairs (`Bf16Dot::Pairs`) is torch's bf16 `linear`
/// to the bit at real widths (`tests/fixtures/torch_linears`, made by
/// `tools/oracle/gen_torch_linears.py`): 2 to 16 rows of `x` by 1024 to 8960 inputs as a prompt's
/// rows, weights in the tiles the host serves them in, through the contract's `linear_tiled_rows`,
/// compiled and run. The
/// fixture keeps outputs where a sum in other blocks rounds differently, and one run of pairs over
/// all inputs (the contract before blocks: one `mmt4d` of the whole tiles) is run beside it and
/// must part from torch there, so the blocks are what this holds. torch sums this way on CPUs with
/// AVX512-BF16, the only ones whose contract sums in pairs.
#[test]
fn bf16_linear_sums_as_torch() {
    use mlxcel_emit::{Bf16Dot, Elem, Module, NumericContract, PAIRS_BLOCK_INPUTS, Rows, Tiles, Type};
    use mlxcel_shim::{Arg, DType, HostTensor};
    if !Target::host_cpu().has_avx512_bf16() {
        eprintln!("bf16_linear_sums_as_torch: this CPU has no AVX512-BF16, so no contract sums bf16 in pairs here");
        return;
    }
    let bytes = std::fs::read(fixture("torch_linears").join("linears.safetensors")).expect("torch_linears fixture");
    let golden = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut shapes: Vec<String> =
        golden.names().iter().filter_map(|n| n.strip_prefix("x.")).map(String::from).collect();
    shapes.sort();
    assert!(shapes.len() >= 5 && shapes.iter().any(|s| s.ends_with("x8960")), "{shapes:?}");
    let bf16 = NumericContract::bf16(Bf16Dot::Pairs);
    let tiles = Tiles::BF16;
    let mut m = Module::new("linears");
    for s in &shapes {
        let x = golden.tensor(&format!("x.{s}")).expect("x");
        let w = golden.tensor(&format!("w.{s}")).expect("w");
        let (rows, inputs, out) = (x.shape()[0], x.shape()[1], w.shape()[0]);
        assert!(inputs >= PAIRS_BLOCK_INPUTS && rows <= 16, "{s}");
        let wt = Type::new(Elem::BF16, &tiles.shape(out, inputs));
        let (mut f, a) = m.func(&format!("linear_{s}"), &[Type::new(Elem::BF16, x.shape()), wt]);
        let blocks = bf16.linear_tiled_rows(&mut f, &a[0], &a[1], None, Rows::Prompt);
        // One run of pairs over all inputs: `x` in tiles of all its rows, one `mmt4d`.
        let xr = f.reshape(&a[0], &[1, rows, inputs / 2, 2]);
        let lhs = f.transpose(&xr, &[0, 2, 1, 3]);
        let y4 = f.mmt4d(&lhs, &a[1], Elem::F32);
        let y = f.transpose(&y4, &[0, 2, 1, 3]);
        let y = f.reshape(&y, &[rows, out]);
        let one_run = f.convert(&y, Elem::BF16);
        m.add_func(f, &[blocks, one_run]);
    }
    let session = compiled_with(m, "linears", &mlxcel_host::decoder::contract_flags(&bf16));
    let mut one_run_differs = 0;
    for s in &shapes {
        let x = golden.tensor(&format!("x.{s}")).expect("x");
        let w = golden.tensor(&format!("w.{s}")).expect("w");
        let (inputs, out) = (w.shape()[1], w.shape()[0]);
        let tiled = bf16_tiles(w.data(), out, inputs, tiles);
        let xh = HostTensor::from_bytes(DType::BF16, x.shape().to_vec(), x.data().to_vec()).expect("x");
        let wh = HostTensor::from_bytes(DType::BF16, tiles.shape(out, inputs).to_vec(), tiled).expect("w");
        let got = session.call(&format!("linears.linear_{s}"), &[Arg::from(&xh), Arg::from(&wh)]).expect("runs");
        let want = golden.tensor(&format!("y.{s}")).expect("y");
        let [blocks, one_run] = [0, 1].map(|i| got[i].to_host().expect("read"));
        one_run_differs += bf16_as_torch(&format!("{s}: torch's linear"), blocks.bytes(), one_run.bytes(), want.data());
    }
    assert!(one_run_differs > 0, "one run over all inputs gave torch's outputs too: this holds no blocks");
}

/// Mutation-sensitive: a prompt's attention products under the bf16 contract summed in pairs
/// ([`mlxcel_emit::NumericContract::matmul_nt_rows`]) equal torch's bf16 `matmul` of eager
/// attention bit for bit (`tests/fixtures/torch_attention`): a head's scores over 128 inputs and
/// its outputs over 1600 keys (two blocks). The fixture keeps the keys and channels where another
/// order rounds differently, and the backend's order (the contract before, which a decode step's
/// attention keeps) is run beside it and must part from torch there.
#[test]
fn bf16_attention_products_sum_as_torch() {
    use mlxcel_emit::{Bf16Dot, Elem, Module, NumericContract, Rows, Type};
    use mlxcel_shim::{Arg, DType, HostTensor};
    if !Target::host_cpu().has_avx512_bf16() {
        eprintln!(
            "bf16_attention_products_sum_as_torch: this CPU has no AVX512-BF16, so no contract sums bf16 in pairs here"
        );
        return;
    }
    let bytes =
        std::fs::read(fixture("torch_attention").join("attention.safetensors")).expect("torch_attention fixture");
    let golden = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let bf16 = NumericContract::bf16(Bf16Dot::Pairs);
    let tensor = |name: &str| golden.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    let ty = |name: &str| {
        let mut shape = vec![1];
        shape.extend_from_slice(tensor(name).shape());
        Type::new(Elem::BF16, &shape)
    };
    // (first operand, second operand, whether the second is stored `[in, out]`, golden)
    let products = [("q", "k", false, "scores"), ("probs", "v", true, "outputs")];
    let mut m = Module::new("attention");
    for (a, b, transposed, name) in products {
        let (mut f, args) = m.func(name, &[ty(a), ty(b)]);
        let second = if transposed { f.transpose(&args[1], &[0, 2, 1]) } else { args[1].clone() };
        let pairs = bf16.matmul_nt_rows(&mut f, &args[0], &second, Rows::Prompt);
        let backend = bf16.matmul_nt_rows(&mut f, &args[0], &second, Rows::ByCount);
        m.add_func(f, &[pairs, backend]);
    }
    let session = compiled_with(m, "attention", &mlxcel_host::decoder::contract_flags(&bf16));
    let mut backend_differs = 0;
    for (a, b, _, name) in products {
        let host = |n: &str| {
            let t = tensor(n);
            let mut shape = vec![1];
            shape.extend_from_slice(t.shape());
            HostTensor::from_bytes(DType::BF16, shape, t.data().to_vec()).expect("operand")
        };
        let (ah, bh) = (host(a), host(b));
        let got = session.call(&format!("attention.{name}"), &[Arg::from(&ah), Arg::from(&bh)]).expect("runs");
        let [pairs, backend] = [0, 1].map(|i| got[i].to_host().expect("read"));
        let differs =
            bf16_as_torch(&format!("{name}: torch's matmul"), pairs.bytes(), backend.bytes(), tensor(name).data());
        eprintln!("{name}: the backend's order parts from torch in {differs} of {}", pairs.bytes().len() / 2);
        backend_differs += differs;
    }
    assert!(backend_differs > 0, "the backend's order gave torch's outputs too: this holds no order");
}

/// Mutation-sensitive: under the bf16 contract summed in pairs, the softmax of bf16 rows equals
/// torch's `softmax(x, -1, dtype=float32).to(bf16)` on AVX-512 bit for bit
/// (`tests/fixtures/torch_attention`, rows of 5 to 1600 inputs, masked as eager attention masks),
/// and the backend's softmax (the contract elsewhere: its own `exp`, sum and division) parts from
/// torch on the rows the fixture keeps.
#[test]
fn bf16_softmax_is_torchs() {
    use mlxcel_emit::{Bf16Dot, Elem, Module, NumericContract, Type};
    use mlxcel_shim::{Arg, DType, HostTensor};
    if !Target::host_cpu().has_avx512_bf16() {
        eprintln!(
            "bf16_softmax_is_torchs: this CPU has no AVX512-BF16, so no contract follows torch's AVX-512 softmax here"
        );
        return;
    }
    let bytes =
        std::fs::read(fixture("torch_attention").join("attention.safetensors")).expect("torch_attention fixture");
    let golden = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut widths: Vec<String> =
        golden.names().iter().filter_map(|n| n.strip_prefix("logits.")).map(String::from).collect();
    widths.sort();
    assert!(widths.len() >= 4 && widths.iter().any(|w| w == "5"), "{widths:?}");
    let (torch, backend) = (NumericContract::bf16(Bf16Dot::Pairs), NumericContract::bf16(Bf16Dot::InOrder));
    let mut m = Module::new("softmax");
    for w in &widths {
        let x = golden.tensor(&format!("logits.{w}")).expect("logits");
        let (mut f, a) = m.func(&format!("softmax_{w}"), &[Type::new(Elem::BF16, x.shape())]);
        let ours = torch.softmax(&mut f, &a[0]);
        let other = backend.softmax(&mut f, &a[0]);
        m.add_func(f, &[ours, other]);
    }
    let session = compiled_with(m, "softmax", &mlxcel_host::decoder::contract_flags(&torch));
    let mut backend_differs = 0;
    for w in &widths {
        let x = golden.tensor(&format!("logits.{w}")).expect("logits");
        let xh = HostTensor::from_bytes(DType::BF16, x.shape().to_vec(), x.data().to_vec()).expect("x");
        let got = session.call(&format!("softmax.softmax_{w}"), &[Arg::from(&xh)]).expect("runs");
        let want = golden.tensor(&format!("softmax.{w}")).expect("softmax");
        let [ours, backend] = [0, 1].map(|i| got[i].to_host().expect("read"));
        let differs = bf16_as_torch(&format!("softmax over {w}: torch's"), ours.bytes(), backend.bytes(), want.data());
        eprintln!(
            "softmax over {w}: the backend's softmax parts from torch in {differs} of {}",
            ours.bytes().len() / 2
        );
        backend_differs += differs;
    }
    assert!(backend_differs > 0, "the backend's softmax gave torch's probabilities too: this holds no softmax");
}

/// Asserts that the bf16 values `ours` (little-endian bytes) equal `want`, `what`'s, bit for bit,
/// naming the first that differs, and returns how many of `other` (the order a test runs beside,
/// which must part from torch somewhere for the test to hold it) differ from `want`.
fn bf16_as_torch(what: &str, ours: &[u8], other: &[u8], want: &[u8]) -> usize {
    let values = |b: &[u8]| b.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect::<Vec<u16>>();
    let (ours, other, want) = (values(ours), values(other), values(want));
    let differ = |got: &[u16]| got.iter().zip(&want).filter(|(g, w)| g != w).count();
    let first = ours.iter().zip(&want).position(|(g, w)| g != w);
    assert_eq!(
        differ(&ours),
        0,
        "{} of {} bf16 values unlike {what}, the first at {first:?} (bits {:?} against {:?}; the other order {:?})",
        differ(&ours),
        want.len(),
        first.map(|i| ours[i]),
        first.map(|i| want[i]),
        first.map(|i| other[i]),
    );
    differ(&other)
}

/// A bf16 `[out, in]` matrix (little-endian bytes) in `tiles`: `[out / t, in / k, t, k]`.
fn bf16_tiles(w: &[u8], out: usize, inputs: usize, tiles: mlxcel_emit::Tiles) -> Vec<u8> {
    let [_, _, t, k] = tiles.shape(out, inputs);
    let mut tiled = Vec::with_capacity(w.len());
    for tile in 0..out / t {
        for d in 0..inputs / k {
            for r in 0..t {
                let at = ((tile * t + r) * inputs + d * k) * 2;
                tiled.extend_from_slice(&w[at..at + 2 * k]);
            }
        }
    }
    tiled
}

/// `m`, compiled for this machine's CPU (in a cache of its own) as `name` and loaded on a
/// local-sync device.
fn compiled(m: mlxcel_emit::Module, name: &str) -> mlxcel_shim::Session {
    compiled_with(m, name, &[])
}

/// [`compiled`] with the compiler flags `flags` after the target's (a contract's, see
/// `contract_flags`).
fn compiled_with(m: mlxcel_emit::Module, name: &str, flags: &[String]) -> mlxcel_shim::Session {
    let mlir = m.finish().expect("valid");
    let compiler = Compiler::locate().expect("compiler");
    let dir = tempfile::tempdir().expect("tempdir");
    let target = Target::host_cpu();
    let request =
        mlxcel_shim::CompileRequest { name, mlir: &mlir, target: &target, flags, key_parts: &[], contract: None };
    let artifact = CompileCache::new(dir.path()).get_or_compile(&compiler, &request).expect("compiles").0;
    let device = Device::new(Driver::LocalSync).expect("device");
    mlxcel_shim::Session::new(&device, None, &[&artifact]).expect("session")
}

/// The RMSNorm epsilon `tools/oracle/gen_torch_sums.py` recorded in the safetensors metadata.
fn golden_eps(bytes: &[u8]) -> f64 {
    let (_, meta) = safetensors::SafeTensors::read_metadata(bytes).expect("header");
    let eps = meta.metadata().as_ref().and_then(|m| m.get("eps")).expect("eps recorded");
    eps.parse().expect("eps")
}

/// A bundle with a narrower key window (a long context) prefills and decodes over the first
/// rows of each slot only while its streams are short, and gives what a bundle without one
/// gives: the golden tokens, and, for a long prompt (its chunks through the window, the last
/// ending on its edge) and a short one, then both decoding together across the window's edge
/// (288 rows: the `decode` export) and then one alone (`decode_rows_1`), the logits of the
/// same calls on a bundle whose every call reads its whole cache. Grouped-query attention,
/// sliding layers beside full ones (two masks), and latent attention.
#[test]
fn key_windows_attend_as_the_whole_cache() {
    for name in ["qwen2", "gemma3_text", "youtu"] {
        check_key_window(name);
    }
}

fn check_key_window(name: &str) {
    let wide = BundleShape { chunk: 32, capacity: 1024, slots: 2 };
    let whole = BundleShape { chunk: 32, capacity: 320, slots: 2 };
    assert_eq!(graph::key_windows(wide), vec![288]);
    assert!(graph::key_windows(whole).is_empty());
    let (mut windowed, mut reference) = (load(name, wide), load(name, whole));

    let short = golden(name, "short");
    let (_, tokens, _) = run(&mut windowed, 0, &short, From::Tokens);
    assert_eq!(tokens, short.greedy, "{name}: golden tokens through a key window");
    windowed.release(0).expect("release");

    let long = golden(name, "long");
    let prompt: Vec<u32> = long.input_ids.iter().copied().cycle().take(270).collect();
    let vocab = windowed.config().vocab;
    let mut next = Vec::new();
    for dec in [&mut windowed, &mut reference] {
        let a = dec.prefill_tokens(0, &prompt, Logits::All).expect("prefill long");
        let b = dec.prefill_tokens(1, &short.input_ids, Logits::All).expect("prefill short");
        next.push((a, b));
    }
    assert_close(&format!("{name}: long prompt logits"), &next[0].0, &next[1].0, 1e-4);
    assert_close(&format!("{name}: short prompt logits"), &next[0].1, &next[1].1, 1e-4);
    let last = |l: &[f32]| argmax(&l[l.len() - vocab..]);
    let (mut a, mut b) = (last(&next[1].0), last(&next[1].1));
    for step in 0..40 {
        let got = windowed.decode(&[(0, a), (1, b)]).expect("decode, windowed");
        let want = reference.decode(&[(0, a), (1, b)]).expect("decode, whole cache");
        assert_close(&format!("{name}: step {step}, long stream"), &got[0], &want[0], 1e-4);
        assert_close(&format!("{name}: step {step}, short stream"), &got[1], &want[1], 1e-4);
        (a, b) = (argmax(&want[0]), argmax(&want[1]));
        assert_eq!((argmax(&got[0]), argmax(&got[1])), (a, b), "{name}: step {step}: greedy tokens");
    }
    for dec in [&mut windowed, &mut reference] {
        dec.release(1).expect("release");
    }
    for step in 0..5 {
        let got = windowed.decode(&[(0, a)]).expect("decode alone, windowed").remove(0);
        let want = reference.decode(&[(0, a)]).expect("decode alone, whole cache").remove(0);
        assert_close(&format!("{name}: alone, step {step}"), &got, &want, 1e-4);
        a = argmax(&want);
    }

    // Prompts alone: one row past the window (its last call sees row 288, so it reads the
    // whole cache), and the 270 rows again for their last row only (the last call through a
    // narrower export inside the window).
    let past: Vec<u32> = long.input_ids.iter().copied().cycle().take(289).collect();
    let mut got = Vec::new();
    for dec in [&mut windowed, &mut reference] {
        dec.release(0).expect("release");
        let all = dec.prefill_tokens(0, &past, Logits::All).expect("prefill past the window");
        dec.release(0).expect("release");
        let last = dec.prefill_tokens(0, &prompt, Logits::Last).expect("prefill, last row");
        got.push((all, last));
    }
    assert_close(&format!("{name}: a prompt one row past the window"), &got[0].0, &got[1].0, 1e-4);
    assert_close(&format!("{name}: the last row through a narrower export"), &got[0].1, &got[1].1, 1e-4);
}
