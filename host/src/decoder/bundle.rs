//! A compiled decoder bundle loaded on a device, with the host-side slot
//! bookkeeping: each slot's cache length. Every argument is validated here
//! before anything reaches IREE.

use std::{ops::Range, path::Path};

use mlxcel_emit::{Elem, NumericContract};
use mlxcel_shim::{
    Arg, CacheOutcome, Checkpoint, CompileCache, CompileRequest, Compiler, DType, Device, HostTensor, Parameters,
    Session, Target,
};

use mlxcel_decoder::{
    DecoderSpec, DecoderWeights, GraphError, Index, KvLayout, TensorInfo, WeightsError,
    config::{ConfigError, TextConfig},
    graph::{self, BundleShape},
};

/// The compiler flags a module emitted under `contract` needs beyond the target's, the
/// decoder's and the encoders' alike: bf16 activations summed in pairs contract bf16 weights in
/// tiles of 16 rows by 2 inputs (`NumericContract::linear_tiled`), the tile of IREE's bf16 mmt4d
/// microkernel, which runs them at up to 1.6 times the rate of the generated code for f32
/// activations (on CPUs with AVX512-BF16 only; summed in order they take the f32 tiles and
/// generated code).
pub fn contract_flags(contract: &NumericContract) -> Vec<String> {
    let pairs = contract.activations == Elem::BF16 && contract.bf16_dot == mlxcel_emit::Bf16Dot::Pairs;
    if pairs { vec!["--iree-llvmcpu-enable-ukernels=mmt4d".to_owned()] } else { Vec::new() }
}

/// What a bundle is compiled for.
#[derive(Clone, Debug)]
pub struct DecoderOptions {
    pub shape: BundleShape,
    /// The numeric contract; `None` is f32 compute for f32 and bf16 weights alike
    /// (bf16 weights stay bf16 and are widened inside each op: the parity
    /// reference is transformers in f32 on the same stored weights). The bf16
    /// contract (bf16 activations) is experimental and only ever asked for.
    pub contract: Option<NumericContract>,
    pub target: Target,
    /// The decoder's spec when the checkpoint's family plugin brings one; `None` reads the
    /// preset for the config's text `model_type`.
    pub spec: Option<DecoderSpec>,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        DecoderOptions {
            shape: BundleShape { chunk: 32, capacity: 256, slots: 4 },
            contract: None,
            target: Target::host_cpu(),
            spec: None,
        }
    }
}

/// Decoder errors: bad configuration, bad requests, or the runtime.
#[derive(Debug, thiserror::Error)]
pub enum DecoderError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Runtime(#[from] mlxcel_shim::Error),
    #[error("emitting the decoder graph: {0}")]
    Emit(#[from] mlxcel_emit::EmitError),
    #[error(transparent)]
    Weights(#[from] WeightsError),
    #[error("slot {slot} is out of range (the bundle has {slots} slots)")]
    SlotOutOfRange { slot: usize, slots: usize },
    #[error("{used} cache rows plus {adding} new tokens exceed the context capacity of {capacity}")]
    CapacityExceeded { used: usize, adding: usize, capacity: usize },
    #[error(
        "cannot prefill rows {part:?} of a {rows}-row prompt: a part starts at most at the {held} rows the slot holds, ends at a prefill call's end or the prompt's, and is not empty"
    )]
    Part { part: Range<usize>, rows: usize, held: usize },
    #[error("invalid prefill embeddings: {0}")]
    Embeddings(String),
    #[error("invalid prefill extras: {0}")]
    Extras(String),
    #[error("invalid positions: {0}")]
    Positions(String),
    #[error("the compiled bundle lacks exports: {0}")]
    MissingExports(String),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("slot {0} is listed twice in one decode step")]
    RepeatedSlot(usize),
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error("capacity {capacity} is not a positive multiple of the prefill chunk {chunk}")]
    BadShape { capacity: usize, chunk: usize },
    #[error("checkpoint tensor {key:?} is {found}; the bundle needs {want} weights")]
    WeightDtype { key: String, found: String, want: String },
}

/// One decoder bundle on one device.
#[derive(Debug)]
pub struct Decoder {
    config: TextConfig,
    options: DecoderOptions,
    session: Session,
    /// Cache rows in use per slot.
    lens: Vec<usize>,
    /// Per slot: rows whose contents its last request left valid (its prompt and the tokens
    /// it fed), kept across `release` so that a later prefill may start after a shared
    /// prefix instead of recomputing it.
    held: Vec<usize>,
    /// Per slot: decode position minus cache row (M-RoPE's `rope_deltas`;
    /// 0 for plain prompts).
    deltas: Vec<i64>,
    outcome: CacheOutcome,
    fingerprint: Fingerprint,
    /// How the checkpoint stores the weights the bundle reads (the contract record's sources).
    weight_forms: Vec<String>,
}

/// Everything a compiled bundle depends on. Its digest is part of the
/// compile-cache key, so any change recompiles rather than loading a
/// bundle built for something else.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Fingerprint {
    /// The decoder spec, as JSON: a plugin's spec and a preset of the same name differ here.
    pub spec: String,
    /// sha256 over the checkpoint's safetensors headers (names, dtypes,
    /// shapes, offsets) and file sizes: cheap, and it changes when the files do.
    pub weights: String,
    pub dtype: String,
    pub capacity: usize,
    pub chunk: usize,
    pub slots: usize,
    pub hidden: usize,
    pub kv_layout: String,
    /// The exports and their argument order.
    pub abi: String,
    /// The numeric contract's record ([`mlxcel_emit::ContractDescriptor`]) as JSON: the
    /// compiled artifact carries it too, and a cached one stating another is refused.
    pub numeric_contract: String,
    pub compiler: String,
    pub target: String,
}

impl Fingerprint {
    /// A stable digest of every field.
    pub fn digest(&self) -> String {
        use sha2::Digest;
        let json = serde_json::to_string(self).expect("invariant: the fingerprint serialises");
        format!("decoder-fingerprint:{}", hex::encode(sha2::Sha256::digest(json.as_bytes())))
    }
}

/// sha256 over the checkpoint's tensor table and file sizes: what every compiled artifact and
/// cached encoder output over the checkpoint is keyed by.
pub fn weights_identity(ckpt: &Checkpoint) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for (key, t) in ckpt.tensors() {
        h.update(format!("{key}|{}|{:?}|{}|{:?};", t.dtype, t.shape, t.file, t.offsets).as_bytes());
    }
    for f in ckpt.files() {
        let len = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        h.update(format!("{len};").as_bytes());
    }
    hex::encode(h.finalize())
}

impl Decoder {
    /// Emits, compiles (through the cache) and loads the bundle for the
    /// checkpoint at `dir`, serving its weights as IREE parameters.
    pub fn load(
        dir: &Path,
        options: DecoderOptions,
        device: &Device,
        compiler: &Compiler,
        cache: &CompileCache,
    ) -> Result<Self, DecoderError> {
        let config = TextConfig::load(dir, options.spec.as_ref())?;
        let shape = options.shape;
        if shape.chunk == 0 || shape.capacity == 0 || !shape.capacity.is_multiple_of(shape.chunk) || shape.slots == 0 {
            return Err(DecoderError::BadShape { capacity: shape.capacity, chunk: shape.chunk });
        }
        let checkpoint = Checkpoint::open(dir)?;
        let index = checkpoint_index(&checkpoint);
        let names = DecoderWeights::resolve(&index, &config)?;
        let contract = match options.contract {
            Some(c) => c,
            None => contract_for(&checkpoint, &names)?,
        };
        // Weight tiles of two vectors of the target's f32 outputs (16 rows on AVX2: prefill 1.26x
        // as fast as in the default 32 there); a layout, which changes no result.
        let contract = contract.for_vectors(options.target.vector_bits());
        let options = DecoderOptions { contract: Some(contract), ..options };
        let weights = weight_dtype(&checkpoint, &names, &contract)?;
        let emitted = graph::emit_bundle(&config, &names, &index, shape, contract, weights).map_err(|e| match e {
            GraphError::Emit(e) => DecoderError::Emit(e),
            GraphError::Weights(e) => DecoderError::Weights(e),
        })?;
        let quantized = emitted.sources.iter().any(|s| s.starts_with("affine"));
        let mut flags: Vec<String> = Vec::new();
        // Weights stored narrower than the activations are widened (or dequantized) inside each
        // op; IREE's const-expr hoisting would instead precompute a widened copy of every weight
        // at load (the checkpoint's bytes several times over resident, and read by every step).
        if weights != contract.activations || quantized {
            flags.push("--iree-opt-const-expr-hoisting=false".to_owned());
        }
        // With aggressive dispatch fusion IREE 3.13 fuses a quantized weight's dequantization
        // into a decode step's reductions (see `NumericContract::qlinear`), so the packed
        // integers are what is read; without it each dequantized weight is written out in f32
        // and read back.
        if quantized {
            flags.push("--iree-dispatch-creation-enable-aggressive-fusion".to_owned());
        }
        // A decode step's reductions over weights narrower than f32 run along the inputs (the
        // quantized ones above; 16-bit float weights whose rows do not fill the contract's row
        // tiles through the target's tuning spec, see `shim/tuning/llvm_cpu.mlir`; tiled ones
        // are summed in order by `linalg.mmt4d` and do not depend on this flag). Kept in order,
        // IREE 3.13 reduces each vector lane by lane in scalar adds (an 8960x1536 4-bit matvec:
        // 7.4 ms, against 1.1 ms reassociated and 1.2 ms for the same weight in bf16). The
        // association is the backend's either way (see the contract's record); the flag is part
        // of the backend's identity there.
        if quantized || weights != Elem::F32 {
            flags.push("--iree-llvmcpu-reassociate-fp-reductions=true".to_owned());
        }
        flags.extend(contract_flags(&contract));
        if quantized {
            // Reassociated, a norm over a dequantized embedding row keeps a 48 KiB vector on the
            // stack, over IREE's default 32 KiB limit; local-task workers have 128 KiB stacks
            // (IREE's `task_worker_stack_size`), local-sync runs on the caller's thread.
            flags.push("--iree-llvmcpu-stack-allocation-limit=65536".to_owned());
        }
        // The backend is the compiler, the target and the flags that change codegen.
        let descriptor = contract.descriptor(
            emitted.sources.clone(),
            Elem::F32,
            format!("IREE {} {} {}", compiler.revision(), options.target.fingerprint(), flags.join(" "))
                .trim_end()
                .to_owned(),
        );
        let fingerprint = Fingerprint {
            spec: config.spec.to_json(),
            weights: weights_identity(&checkpoint),
            dtype: weights.to_string(),
            capacity: shape.capacity,
            chunk: shape.chunk,
            slots: shape.slots,
            hidden: config.hidden,
            kv_layout: KvLayout::of(&config, contract.activations).describe(shape),
            abi: graph::abi_schema(),
            numeric_contract: descriptor.to_json(),
            compiler: compiler.revision().to_owned(),
            target: options.target.fingerprint(),
        };
        let key_parts = vec![fingerprint.digest()];
        let request = CompileRequest {
            name: "decoder",
            mlir: &emitted.mlir,
            target: &options.target,
            flags: &flags,
            key_parts: &key_parts,
            contract: Some(&fingerprint.numeric_contract),
        };
        let (artifact, outcome) = cache.get_or_compile(compiler, &request)?;
        let params = Parameters::new("model", checkpoint)?;
        let session = Session::new(device, Some(&params), &[&artifact])?;
        let missing: Vec<String> = graph::export_names(shape)
            .into_iter()
            .filter(|name| session.function(&format!("decoder.{name}")).is_err())
            .collect();
        if !missing.is_empty() {
            return Err(DecoderError::MissingExports(missing.join(", ")));
        }
        Ok(Decoder {
            lens: vec![0; shape.slots],
            held: vec![0; shape.slots],
            deltas: vec![0; shape.slots],
            config,
            options,
            session,
            outcome,
            fingerprint,
            weight_forms: emitted.sources,
        })
    }

    /// The numeric contract the bundle was compiled under.
    pub fn contract(&self) -> NumericContract {
        self.options.contract.expect("invariant: resolved at load")
    }

    /// How the checkpoint stores the weights the bundle reads: its dense dtype and each affine
    /// quantization (`affine bits=4 group_size=64 scales=f32`), sorted.
    pub fn weight_forms(&self) -> &[String] {
        &self.weight_forms
    }

    /// What the loaded bundle is compatible with.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    pub fn config(&self) -> &TextConfig {
        &self.config
    }

    /// The KV cache the bundle keeps.
    pub fn kv_layout(&self) -> KvLayout {
        KvLayout::of(&self.config, self.contract().activations)
    }

    pub fn shape(&self) -> BundleShape {
        self.options.shape
    }

    /// Whether the bundle came from the compile cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.outcome
    }

    /// Cache rows in use in `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }

    /// Rows of `slot` a prefill may keep (see [`Decoder::prefill_tokens_keeping`]): what its last
    /// request wrote, valid until the slot is prefilled again.
    pub fn held(&self, slot: usize) -> usize {
        self.held.get(slot).copied().unwrap_or(0)
    }

    /// Frees a slot for the next request. Its rows stay on the device, so a later prefill of
    /// the same slot may keep a prefix of them.
    pub fn release(&mut self, slot: usize) -> Result<(), DecoderError> {
        self.check_slot(slot)?;
        self.lens[slot] = 0;
        self.deltas[slot] = 0;
        Ok(())
    }

    fn check_slot(&self, slot: usize) -> Result<(), DecoderError> {
        if slot >= self.lens.len() {
            return Err(DecoderError::SlotOutOfRange { slot, slots: self.lens.len() });
        }
        Ok(())
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), DecoderError> {
        let rows = self.config.table_rows();
        match tokens.iter().find(|&&t| t as usize >= rows) {
            Some(&token) => Err(DecoderError::TokenOutOfRange { token, vocab: rows }),
            None => Ok(()),
        }
    }

    /// Prefills `slot` from scratch with `tokens`, in chunks, and returns the
    /// logits `rows` asks for (row-major f32).
    pub fn prefill_tokens(&mut self, slot: usize, tokens: &[u32], rows: Logits) -> Result<Vec<f32>, DecoderError> {
        self.prefill_tokens_rows(slot, 0..tokens.len(), tokens, rows)
    }

    /// Computes rows `part` of the prompt `tokens` in `slot`, whose first `part.start` rows the
    /// caller knows to hold exactly what prefilling `tokens[..part.start]` writes: a prefix the
    /// slot's last request shares (at most [`Decoder::held`] rows), or the rows an earlier part
    /// of this prefill wrote. `part` ends at the prompt's end or at a prefill call's end as a
    /// whole prefill from `part.start` makes them ([`chunk_spans`]), so that the parts compute
    /// exactly what a whole prefill does. `rows` counts from `part.start` (`Logits::All` returns
    /// the part's rows; `Logits::Last` the prompt's last row, empty for a part before it).
    pub fn prefill_tokens_rows(
        &mut self,
        slot: usize,
        part: Range<usize>,
        tokens: &[u32],
        rows: Logits,
    ) -> Result<Vec<f32>, DecoderError> {
        self.check_tokens(tokens)?;
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        self.prefill(slot, part, Prefill::Tokens(&ids), &Positions::Sequential, rows)
    }

    /// Prefills `slot` from prepared embeddings `[n, hidden]` in the bundle's
    /// activation dtype (for example text embeddings with image features
    /// merged in) at the given positions, with the contract's `extras`
    /// (bidirectional blocks, per-layer injections). Decoding continues from
    /// the largest position plus one. Returns the logits `rows` asks for.
    pub fn prefill_embeddings(
        &mut self,
        slot: usize,
        embeddings: &HostTensor,
        positions: &Positions,
        extras: &Extras,
        rows: Logits,
    ) -> Result<Vec<f32>, DecoderError> {
        let n = embeddings.shape().first().copied().unwrap_or(0);
        self.prefill_embeddings_rows(slot, 0..n, embeddings, positions, extras, rows)
    }

    /// Rows `part` of a prompt prefilled from embeddings, as [`Decoder::prefill_tokens_rows`]
    /// computes a part: `embeddings`, `positions` and `extras` describe the whole prompt, and
    /// neither end of `part` may fall strictly inside a bidirectional group's span (the group's
    /// rows are computed in one call).
    pub fn prefill_embeddings_rows(
        &mut self,
        slot: usize,
        part: Range<usize>,
        embeddings: &HostTensor,
        positions: &Positions,
        extras: &Extras,
        rows: Logits,
    ) -> Result<Vec<f32>, DecoderError> {
        let want = self.contract().activations;
        let (h, shape) = (self.config.hidden, embeddings.shape());
        if Some(embeddings.dtype()) != runtime_dtype(want) {
            return Err(DecoderError::Embeddings(format!("dtype is {}, the bundle takes {want}", embeddings.dtype())));
        }
        if shape.len() != 2 || shape[1] != h {
            return Err(DecoderError::Embeddings(format!("shape is {shape:?}, the bundle takes [n, {h}]")));
        }
        let n = shape[0];
        let (chunk, k) = (self.options.shape.chunk, self.config.injected_layers);
        if !extras.injections.is_empty() && extras.injections.len() != k {
            return Err(DecoderError::Extras(format!(
                "{} injection tensors; this decoder takes {k} (its injected layers)",
                extras.injections.len()
            )));
        }
        for (i, t) in extras.injections.iter().enumerate() {
            if t.dtype() != embeddings.dtype() || t.shape() != [n, h] {
                return Err(DecoderError::Extras(format!(
                    "injection {i} is {} {:?}; it must be {} [{n}, {h}] like the embeddings",
                    t.dtype(),
                    t.shape(),
                    embeddings.dtype()
                )));
            }
        }
        if self.config.per_layer_inputs.is_some() {
            if extras.row_tokens.len() != n {
                return Err(DecoderError::Extras(format!(
                    "{} row token ids for {n} embeddings; this decoder's per-layer inputs need one per row",
                    extras.row_tokens.len()
                )));
            }
            self.check_tokens(&extras.row_tokens)?;
        }
        let mut runs: Vec<Range<usize>> = extras.bidirectional.iter().flatten().cloned().collect();
        runs.sort_by_key(|b| b.start);
        for (i, b) in runs.iter().enumerate() {
            if b.is_empty() || b.end > n {
                return Err(DecoderError::Extras(format!("bidirectional block {b:?} is not inside 0..{n}")));
            }
            if i > 0 && runs[i - 1].end > b.start {
                return Err(DecoderError::Extras(format!("bidirectional blocks {:?} and {b:?} overlap", runs[i - 1])));
            }
        }
        // Rows of one group are prefilled in one call to see each other: its whole span.
        for span in extras.bidirectional.iter().filter_map(|g| span(g)) {
            if span.len() > chunk {
                return Err(DecoderError::Extras(format!(
                    "the prompt's bidirectional block {span:?} (its images', {} tokens) is longer than the prefill \
                     chunk ({chunk}), and a block is prefilled in one call: run with --chunk of at least {} (the \
                     context a multiple of it)",
                    span.len(),
                    span.len().next_power_of_two()
                )));
            }
        }
        let splits =
            |at: usize| extras.bidirectional.iter().filter_map(|g| span(g)).find(|s| s.start < at && at < s.end);
        if let Some(span) = splits(part.start).or_else(|| splits(part.end)) {
            return Err(DecoderError::Extras(format!(
                "the rows {part:?} would split the bidirectional block {span:?}, which is computed in one call"
            )));
        }
        self.prefill(slot, part, Prefill::Embeddings(embeddings, extras), positions, rows)
    }

    /// The factor the token paths (`prefill_tokens`, `decode`) apply to embedding rows before
    /// the first layer: the spec's embedding scale (`sqrt(hidden)` in f32, for one), 1.0 when
    /// the family has none. A caller that prefills from [`Decoder::embed`]'s rows applies it
    /// with [`Decoder::scale_embeddings`].
    pub fn embed_scale(&self) -> f32 {
        self.config.embed_scale.unwrap_or(1.0)
    }

    /// `rows * scale` as torch computes `embedding(ids) * scale.to(weight dtype)` and as the
    /// token paths do in the graph: the f32 `scale` rounded once to the rows' dtype, then each
    /// product rounded to it. f32 and bf16 rows; `[n, hidden]` in, the same shape out.
    pub fn scale_embeddings(rows: &HostTensor, scale: f32) -> Result<HostTensor, DecoderError> {
        let bytes = rows.bytes();
        let scaled: Vec<u8> = match rows.dtype() {
            DType::F32 => bytes
                .chunks_exact(4)
                .flat_map(|c| (f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * scale).to_le_bytes())
                .collect(),
            DType::BF16 => {
                let k = bf16_to_f32(f32_to_bf16(scale));
                bytes
                    .chunks_exact(2)
                    .flat_map(|c| {
                        let x = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
                        // The product of two bf16 values is exact in f32; one rounding to bf16.
                        f32_to_bf16(x * k).to_le_bytes()
                    })
                    .collect()
            }
            other => {
                return Err(DecoderError::Embeddings(format!("cannot scale {other} embeddings (f32 or bf16 only)")));
            }
        };
        Ok(HostTensor::from_bytes(rows.dtype(), rows.shape().to_vec(), scaled)?)
    }

    /// f32 or bf16 rows as f32 values, widened exactly: how the host merges features into
    /// embeddings of either dtype.
    pub fn rows_as_f32(rows: &HostTensor) -> Result<Vec<f32>, DecoderError> {
        match rows.dtype() {
            DType::F32 => Ok(rows.to_vec::<f32>()?),
            DType::BF16 => {
                Ok(rows.bytes().chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect())
            }
            other => Err(DecoderError::Embeddings(format!("cannot read {other} rows (f32 or bf16 only)"))),
        }
    }

    /// f32 `values` of `shape` as rows of `dtype` (f32, or bf16 rounded once to nearest even,
    /// as torch rounds): the merged embeddings in the bundle's activation dtype.
    pub fn rows_from_f32(dtype: DType, shape: Vec<usize>, values: &[f32]) -> Result<HostTensor, DecoderError> {
        match dtype {
            DType::F32 => Ok(HostTensor::from_slice(shape, values)?),
            DType::BF16 => {
                let bytes = values.iter().flat_map(|&x| f32_to_bf16(x).to_le_bytes()).collect();
                Ok(HostTensor::from_bytes(dtype, shape, bytes)?)
            }
            other => Err(DecoderError::Embeddings(format!("cannot write {other} rows (f32 or bf16 only)"))),
        }
    }

    /// The checkpoint's embedding-table rows for `tokens`, `[n, hidden]` in the activation
    /// dtype, unscaled: prefilling them through `prefill_embeddings` after
    /// [`Decoder::scale_embeddings`] by [`Decoder::embed_scale`] is exactly `prefill_tokens`.
    pub fn embed(&mut self, tokens: &[u32]) -> Result<HostTensor, DecoderError> {
        self.check_tokens(tokens)?;
        let (chunk, h) = (self.options.shape.chunk, self.config.hidden);
        let mut bytes = Vec::new();
        let mut dtype = None;
        for part in tokens.chunks(chunk) {
            let mut ids: Vec<i32> = part.iter().map(|&t| t as i32).collect();
            ids.resize(chunk, 0);
            let ids = HostTensor::from_slice(vec![chunk], &ids)?;
            let out = self.session.call("decoder.embed", &[Arg::from(&ids)])?.remove(0).to_host()?;
            let row = out.bytes().len() / chunk;
            bytes.extend_from_slice(&out.bytes()[..part.len() * row]);
            dtype = Some(out.dtype());
        }
        let dtype = dtype.ok_or(DecoderError::EmptyPrompt)?;
        Ok(HostTensor::from_bytes(dtype, vec![tokens.len(), h], bytes)?)
    }

    /// One slot's cache rows in use, `[L, 2, len, KVH, D]` flattened (f32).
    pub fn kv_slot(&mut self, slot: usize) -> Result<Vec<f32>, DecoderError> {
        self.check_slot(slot)?;
        let s = HostTensor::scalar(slot as i32);
        let all: Vec<f32> = self.session.call("decoder.kv_slot", &[Arg::from(&s)])?.remove(0).to_host()?.to_vec()?;
        let (cap, len) = (self.options.shape.rows(), self.lens[slot]);
        let row = self.kv_layout().row_elems();
        Ok(all.chunks_exact(cap * row).flat_map(|block| block[..len * row].iter().copied()).collect())
    }

    /// The position streams the graph takes for `n` rows: one, or three for
    /// M-RoPE (1-D positions then drive all three, as for text).
    fn streams(&self, positions: &Positions, n: usize) -> Result<Vec<Vec<i32>>, DecoderError> {
        let one = match positions {
            Positions::Sequential => (0..n as i32).collect(),
            Positions::OneD(p) => p.clone(),
            Positions::MRope(three) => {
                if self.config.mrope.is_none() {
                    return Err(DecoderError::Positions("three position streams for a decoder without M-RoPE".into()));
                }
                if three.iter().any(|s| s.len() != n) {
                    return Err(DecoderError::Positions(format!(
                        "streams of {:?} rows for {n} embeddings",
                        three.each_ref().map(Vec::len)
                    )));
                }
                return Ok(three.to_vec());
            }
        };
        if one.len() != n {
            return Err(DecoderError::Positions(format!("{} positions for {n} rows", one.len())));
        }
        if one.iter().any(|&p| p < 0) {
            return Err(DecoderError::Positions("negative position".into()));
        }
        Ok(if self.config.mrope.is_some() { vec![one.clone(), one.clone(), one] } else { vec![one] })
    }

    /// Decode positions `[S]` or, for M-RoPE, `[3, S]` with equal streams.
    fn decode_positions(&self, pos: &[i32]) -> Result<HostTensor, DecoderError> {
        Ok(if self.config.mrope.is_some() {
            HostTensor::from_slice(vec![3, pos.len()], &pos.repeat(3))?
        } else {
            HostTensor::from_slice(vec![pos.len()], pos)?
        })
    }

    /// The key window of a call and its additive masks `[K, rows, R]` over it, one per
    /// attention kind in use: row r is the query at cache position `queries[r]` and sees the
    /// rows its layer kind allows (causal; within the window for sliding layers). Rows inside
    /// a run of one of `groups` also see every row of every run of their group (a contract's
    /// bidirectional image tokens), in every layer kind.
    ///
    /// The window is the narrowest of the bundle's key windows ([`graph::key_window_for`])
    /// that holds every row the real rows (`real`) see. Padding and idle rows see cache row 0
    /// alone, so they attend over something finite inside any window (a row that saw nothing
    /// would turn NaN, and its NaN keys, written into slack rows, would reach every later score
    /// through the masked columns); their outputs are unused.
    fn masks(
        &self,
        queries: &[usize],
        real: impl Fn(usize) -> bool,
        groups: &[Vec<Range<usize>>],
    ) -> Result<(usize, HostTensor), DecoderError> {
        let capacity = self.options.shape.rows();
        let kinds = self.config.kinds();
        let rows = queries.len();
        let mut mask = vec![f32::NEG_INFINITY; kinds.len() * rows * capacity];
        let mut seen = 1;
        for (k, &kind) in kinds.iter().enumerate() {
            for (r, &q) in queries.iter().enumerate() {
                let row = &mut mask[(k * rows + r) * capacity..(k * rows + r + 1) * capacity];
                if !real(r) {
                    row[0] = 0.0;
                    continue;
                }
                let group = groups.iter().find(|g| g.iter().any(|b| b.contains(&q)));
                for (kv, m) in row.iter_mut().enumerate() {
                    let same = group.is_some_and(|g| g.iter().any(|b| b.contains(&kv)));
                    if self.config.visible_with(kind, q, kv, same) {
                        *m = 0.0;
                        seen = seen.max(kv + 1);
                    }
                }
            }
        }
        let window = graph::key_window_for(seen, self.options.shape);
        if window < capacity {
            mask = mask.chunks_exact(capacity).flat_map(|row| &row[..window]).copied().collect();
        }
        Ok((window, HostTensor::from_slice(vec![kinds.len(), rows, window], &mask)?))
    }

    /// Rows `start..start + real` of every injection, zero-padded to the
    /// chunk: `[K, chunk, H]` (zeros when the prompt has none).
    fn injection_chunk(
        &self,
        x: &HostTensor,
        extras: &Extras,
        start: usize,
        real: usize,
    ) -> Result<HostTensor, DecoderError> {
        let (chunk, k, h) = (self.options.shape.chunk, self.config.injected_layers, self.config.hidden);
        let row = x.bytes().len() / x.shape()[0];
        let mut bytes = vec![0u8; k * chunk * row];
        for (i, t) in extras.injections.iter().enumerate() {
            let src = &t.bytes()[start * row..(start + real) * row];
            bytes[i * chunk * row..i * chunk * row + src.len()].copy_from_slice(src);
        }
        Ok(HostTensor::from_bytes(x.dtype(), vec![k, chunk, h], bytes)?)
    }

    fn prefill(
        &mut self,
        slot: usize,
        part: Range<usize>,
        input: Prefill<'_>,
        positions: &Positions,
        rows: Logits,
    ) -> Result<Vec<f32>, DecoderError> {
        self.check_slot(slot)?;
        let BundleShape { chunk, capacity, .. } = self.options.shape;
        let n = match input {
            Prefill::Tokens(ids) => ids.len(),
            Prefill::Embeddings(x, _) => x.shape()[0],
        };
        if n == 0 {
            return Err(DecoderError::EmptyPrompt);
        }
        if n > capacity {
            return Err(DecoderError::CapacityExceeded { used: 0, adding: n, capacity });
        }
        if part.start >= part.end || part.end > n || part.start > self.held[slot] {
            return Err(DecoderError::Part { part, rows: n, held: self.held[slot] });
        }
        let streams = self.streams(positions, n)?;
        let next = streams.iter().flatten().copied().max().map_or(0, |m| i64::from(m) + 1);
        let vocab = self.config.vocab;
        let mut logits = Vec::with_capacity(if rows == Logits::All { part.len() * vocab } else { vocab });
        let groups = match input {
            Prefill::Embeddings(_, extras) => extras.bidirectional.as_slice(),
            Prefill::Tokens(_) => &[],
        };
        let spans: Vec<Range<usize>> = groups.iter().filter_map(|g| span(g)).collect();
        let calls: Vec<(usize, usize)> =
            chunk_spans(part.start, n, chunk, &spans).into_iter().take_while(|&(start, _)| start < part.end).collect();
        if calls.last().is_some_and(|&(start, real)| start + real != part.end) {
            return Err(DecoderError::Part { part, rows: n, held: self.held[slot] });
        }
        self.lens[slot] = part.start;
        self.held[slot] = part.start;
        self.deltas[slot] = next - n as i64;
        // A token prompt's call runs the narrowest prefill export that holds its rows (the rows
        // past them are padding, written into slack cache rows no query sees, as a whole
        // chunk's are); every row's logits come from `logits`, over a whole chunk, and prompts
        // from embeddings (media, hundreds of rows) keep whole chunks.
        let narrower = match input {
            Prefill::Tokens(_) if rows == Logits::Last => graph::prefill_widths(chunk),
            _ => Vec::new(),
        };
        for (start, real) in calls {
            let width = narrower.iter().copied().find(|&w| w >= real).unwrap_or(chunk);
            let first = match input {
                Prefill::Tokens(ids) => {
                    let mut part = ids[start..start + real].to_vec();
                    part.resize(width, 0);
                    HostTensor::from_slice(vec![width], &part)?
                }
                Prefill::Embeddings(x, _) => {
                    let row = x.bytes().len() / n;
                    let mut part = x.bytes()[start * row..(start + real) * row].to_vec();
                    part.resize(width * row, 0);
                    HostTensor::from_bytes(x.dtype(), vec![width, self.config.hidden], part)?
                }
            };
            let pos = chunk_positions(&streams, start, real, width)?;
            let (keys, masks) = self.masks(&(start..start + width).collect::<Vec<_>>(), |r| r < real, groups)?;
            let mut args = vec![first, pos, masks, HostTensor::scalar(slot as i32), HostTensor::scalar(start as i32)];
            if let Prefill::Embeddings(x, extras) = input
                && self.config.injected_layers > 0
            {
                args.push(self.injection_chunk(x, extras, start, real)?);
            }
            if let Prefill::Embeddings(_, extras) = input
                && self.config.per_layer_inputs.is_some()
            {
                let mut part: Vec<i32> = extras.row_tokens[start..start + real].iter().map(|&t| t as i32).collect();
                part.resize(width, 0);
                args.push(HostTensor::from_slice(vec![width], &part)?);
            }
            let function = match input {
                Prefill::Tokens(_) => graph::prefill_export("prefill_tokens", width, chunk),
                Prefill::Embeddings(..) => "prefill_embeddings".to_owned(),
            };
            let function = graph::windowed(&function, keys, self.options.shape);
            let out =
                self.session.call(&format!("decoder.{function}"), &args.iter().map(Arg::from).collect::<Vec<_>>())?;
            let hidden = Arg::Device(&out[0]);
            match rows {
                Logits::All => {
                    let head = self.session.call("decoder.logits", &[hidden])?;
                    let all: Vec<f32> = head[0].to_host()?.to_vec()?;
                    logits.extend_from_slice(&all[..real * vocab]);
                }
                Logits::Last if start + real == n => {
                    let row = HostTensor::scalar((real - 1) as i32);
                    let at = format!("decoder.{}", graph::prefill_export("logits_at", width, chunk));
                    let head = self.session.call(&at, &[hidden, Arg::from(&row)])?;
                    logits = head[0].to_host()?.to_vec()?;
                }
                Logits::Last => {}
            }
            self.lens[slot] = start + real;
            self.held[slot] = start + real;
        }
        Ok(logits)
    }

    /// One decode step for each `(slot, token)`; every slot listed appends
    /// one row. Returns each listed slot's logits, in order.
    ///
    /// The step runs the narrowest partial export (`decode_rows_W`, W = 1, 2, 4, … below the
    /// slot count) that holds the listed slots, so it computes W rows rather than one for every
    /// slot; more streams than the widest run `decode`, a row for every slot.
    pub fn decode(&mut self, steps: &[(usize, u32)]) -> Result<Vec<Vec<f32>>, DecoderError> {
        let BundleShape { capacity, slots, .. } = self.options.shape;
        for (i, &(slot, token)) in steps.iter().enumerate() {
            self.check_slot(slot)?;
            self.check_tokens(&[token])?;
            if steps[..i].iter().any(|&(s, _)| s == slot) {
                return Err(DecoderError::RepeatedSlot(slot));
            }
            if self.lens[slot] + 1 > capacity {
                return Err(DecoderError::CapacityExceeded { used: self.lens[slot], adding: 1, capacity });
            }
        }
        let Some(&(first, _)) = steps.first() else { return Ok(Vec::new()) };
        // Idle slots and padding rows write a junk row into the last slack row, past every row a
        // query can see, so the rows a released slot holds for a later prefix survive.
        let junk = (self.options.shape.rows() - 1) as i32;
        let partial = graph::decode_widths(slots).into_iter().find(|&w| w >= steps.len());
        // Per call row: its slot, token and cache row.
        let (rows, export) = match partial {
            Some(width) => {
                let mut rows: Vec<(usize, i32, i32)> =
                    steps.iter().map(|&(slot, token)| (slot, token as i32, self.lens[slot] as i32)).collect();
                // Padding rows: token 0 into the first listed slot's junk row.
                rows.resize(width, (first, 0, junk));
                (rows, graph::decode_rows_export(width))
            }
            None => {
                let mut rows: Vec<(usize, i32, i32)> = (0..slots).map(|slot| (slot, 0, junk)).collect();
                for &(slot, token) in steps {
                    rows[slot] = (slot, token as i32, self.lens[slot] as i32);
                }
                (rows, "decode".to_owned())
            }
        };
        let mut pos = vec![0i32; rows.len()];
        for (r, &(slot, _, write)) in rows.iter().enumerate() {
            if write != junk {
                pos[r] = self.decode_position(slot)?;
            }
        }
        let ids: Vec<i32> = rows.iter().map(|r| r.1).collect();
        let write: Vec<i32> = rows.iter().map(|r| r.2).collect();
        let queries: Vec<usize> = write.iter().map(|&w| w as usize).collect();
        let n = rows.len();
        let (tokens, pos) = (HostTensor::from_slice(vec![n], &ids)?, self.decode_positions(&pos)?);
        let (keys, masks) = self.masks(&queries, |r| rows[r].2 != junk, &[])?;
        let write = HostTensor::from_slice(vec![n], &write)?;
        let export = graph::windowed(&export, keys, self.options.shape);
        let args = match partial {
            Some(_) => {
                let listed: Vec<i32> = rows.iter().map(|r| r.0 as i32).collect();
                vec![tokens, pos, masks, HostTensor::from_slice(vec![n], &listed)?, write]
            }
            None => vec![tokens, pos, write, masks],
        };
        let out = self.session.call(&format!("decoder.{export}"), &args.iter().map(Arg::from).collect::<Vec<_>>())?;
        let all: Vec<f32> = out[0].to_host()?.to_vec()?;
        let vocab = self.config.vocab;
        let mut result = Vec::with_capacity(steps.len());
        for (i, &(slot, _)) in steps.iter().enumerate() {
            // A partial call's row i is step i; `decode`'s row b is slot b.
            let r = if partial.is_some() { i } else { slot };
            self.lens[slot] += 1;
            self.held[slot] = self.lens[slot];
            result.push(all[r * vocab..(r + 1) * vocab].to_vec());
        }
        Ok(result)
    }

    /// The position of `slot`'s next row (its cache length shifted by its rope delta).
    fn decode_position(&self, slot: usize) -> Result<i32, DecoderError> {
        let at = self.lens[slot] as i64 + self.deltas[slot];
        i32::try_from(at).map_err(|_| DecoderError::Positions(format!("position {at} overflows i32")))
    }
}

/// A bf16 value (its bits) widened to f32, exactly.
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// An f32 rounded to bf16 (to nearest, ties to even; NaN stays NaN), as torch rounds.
fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let lsb = (bits >> 16) & 1;
    (bits.wrapping_add(0x7fff + lsb) >> 16) as u16
}

/// The runtime's name for an emitted element type.
fn runtime_dtype(e: Elem) -> Option<DType> {
    Some(match e {
        Elem::F32 => DType::F32,
        Elem::BF16 => DType::BF16,
        Elem::F16 => DType::F16,
        Elem::I64 => DType::I64,
        Elem::I32 => DType::I32,
        Elem::I1 => DType::Bool,
        Elem::I4 | Elem::I8 | Elem::U4 | Elem::U8 => return None,
    })
}

/// The rows from a group's first run to its last: what one prefill call must hold.
pub fn span(group: &[Range<usize>]) -> Option<Range<usize>> {
    let start = group.iter().map(|r| r.start).min()?;
    Some(start..group.iter().map(|r| r.end).max()?)
}

/// The `(start, rows)` of each prefill call over rows `from..n`: whole chunks,
/// except that a chunk ends early rather than split a bidirectional group's
/// span (validated to fit in one chunk), so the next starts at the span. Spans
/// that overlap (groups whose runs interleave) are kept whole together. The
/// scheduler cuts a prompt into pieces along these calls.
pub fn chunk_spans(from: usize, n: usize, chunk: usize, spans: &[Range<usize>]) -> Vec<(usize, usize)> {
    let mut merged: Vec<Range<usize>> = spans.to_vec();
    merged.sort_by_key(|s| s.start);
    let mut blocks: Vec<Range<usize>> = Vec::with_capacity(merged.len());
    for s in merged {
        match blocks.last_mut() {
            Some(last) if s.start < last.end => last.end = last.end.max(s.end),
            _ => blocks.push(s),
        }
    }
    let mut spans = Vec::new();
    let mut start = from;
    while start < n {
        let mut end = (start + chunk).min(n);
        if let Some(b) = blocks.iter().find(|b| b.start < end && end < b.end && b.start > start) {
            end = b.start;
        }
        spans.push((start, end - start));
        start = end;
    }
    spans
}

/// Which rows' logits a prefill returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// The last prompt row's (`[vocab]`): all that sampling the first token needs.
    Last,
    /// Every prompt row's (`[n, vocab]`): for verification against a reference.
    All,
}

/// What a prefill starts from.
#[derive(Clone, Copy)]
enum Prefill<'a> {
    Tokens(&'a [i32]),
    Embeddings(&'a HostTensor, &'a Extras),
}

/// What a prepared prompt may carry besides embeddings and positions.
#[derive(Clone, Debug, Default)]
pub struct Extras {
    /// Groups of row ranges (runs): every row of a group's runs sees every
    /// other in both directions (a contract's bidirectional image tokens:
    /// one group per image block in Gemma 3, every image token one group in
    /// Molmo2). Runs never overlap; a group's span, first run to last, must
    /// lie inside one prefill chunk.
    pub bidirectional: Vec<Vec<Range<usize>>>,
    /// Per injected layer, `[n, hidden]` added to the hidden state after
    /// that layer (zeros on rows without features). Empty, or exactly the
    /// decoder's `injected_layers` tensors.
    pub injections: Vec<HostTensor>,
    /// Each row's token id (the expanded prompt, media placeholders included), for a decoder
    /// whose layers read per-layer token embeddings (Gemma 3n's per-layer inputs); it must
    /// then hold one id per row. Ignored by other decoders.
    pub row_tokens: Vec<u32>,
}

/// The checkpoint's tensors as the resolver reads them.
pub fn checkpoint_index(ckpt: &Checkpoint) -> Index {
    ckpt.tensors()
        .iter()
        .map(|(key, t)| (key.clone(), TensorInfo { dtype: t.dtype.clone(), shape: t.shape.clone() }))
        .collect()
}

/// The dtype the checkpoint stores its dense tensors in, read from the final norm (dense in
/// every checkpoint form, where an MLX checkpoint's embedding table may be packed integers): its
/// key and safetensors dtype.
fn dense_dtype(ckpt: &Checkpoint, names: &DecoderWeights) -> (String, String) {
    let key = names.key(mlxcel_decoder::Tensor::Norm).expect("invariant: the final norm has a key");
    let found = ckpt.get(&key).map(|e| e.dtype.clone()).unwrap_or_default();
    (key, found)
}

/// The contract matching the checkpoint's weight dtype.
fn contract_for(ckpt: &Checkpoint, names: &DecoderWeights) -> Result<NumericContract, DecoderError> {
    let (key, found) = dense_dtype(ckpt, names);
    match found.as_str() {
        // bf16 and f16 weights stay so in memory and are widened inside each op: f32 compute, as
        // transformers computes on them loaded with `dtype=torch.float32` (the parity reference).
        "F32" | "BF16" | "F16" => Ok(NumericContract::f32()),
        _ => Err(DecoderError::WeightDtype { key, found, want: "f32, bf16 or f16".into() }),
    }
}

/// The dtype the checkpoint stores the decoder's weights in, which must be
/// the contract's activation dtype (f32 checkpoints run the f32 contract).
/// The dtype the weights are stored (and read) in: f32, bf16 or f16 under f32 compute, bf16 under
/// bf16 compute (which has no f32 weights to narrow). Every tensor is then checked to be in it.
fn weight_dtype(ckpt: &Checkpoint, names: &DecoderWeights, contract: &NumericContract) -> Result<Elem, DecoderError> {
    let (key, found) = dense_dtype(ckpt, names);
    let stored = Elem::from_safetensors(&found);
    match (stored, contract.activations) {
        (Some(Elem::F32 | Elem::BF16 | Elem::F16), Elem::F32) | (Some(Elem::BF16), Elem::BF16) => {
            Ok(stored.expect("invariant: matched as some"))
        }
        _ => Err(DecoderError::WeightDtype {
            key,
            found,
            want: format!(
                "{} weights for {} activations",
                if contract.activations == Elem::F32 { "f32, bf16 or f16" } else { "bf16" },
                contract.activations
            ),
        }),
    }
}

/// Where prompt rows sit in position space.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Positions {
    /// `0..n`.
    Sequential,
    /// One position per row (1-D rotary).
    OneD(Vec<i32>),
    /// Temporal, height and width positions per row (M-RoPE).
    MRope([Vec<i32>; 3]),
}

/// Chunk `start..start + real` of the position streams, padded to `chunk`
/// with zeros: `[chunk]` or `[3, chunk]`.
fn chunk_positions(streams: &[Vec<i32>], start: usize, real: usize, chunk: usize) -> Result<HostTensor, DecoderError> {
    let mut flat = Vec::with_capacity(streams.len() * chunk);
    for s in streams {
        flat.extend_from_slice(&s[start..start + real]);
        flat.resize(flat.len() + chunk - real, 0);
    }
    let shape = if streams.len() == 3 { vec![3, chunk] } else { vec![chunk] };
    Ok(HostTensor::from_slice(shape, &flat)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even.
        assert_eq!(f32_to_bf16(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(f32_to_bf16(1.0 + 1.5 / 256.0), 0x3f81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(f32_to_bf16(-2.5)), -2.5);
    }

    #[test]
    fn scaling_rounds_the_scale_then_each_product_to_the_rows_dtype() {
        // sqrt(3072) = 55.4256...: bf16 keeps 55.5, and 1.0078125 * 55.5 = 55.93359375 rounds to 56.0.
        let scale = (3072f64).sqrt() as f32;
        let rows = HostTensor::from_bytes(
            DType::BF16,
            vec![1, 2],
            [0x3f81u16, 0x3f80].iter().flat_map(|b| b.to_le_bytes()).collect(),
        )
        .expect("bf16 rows");
        let out = Decoder::scale_embeddings(&rows, scale).expect("scale");
        let values: Vec<f32> =
            out.bytes().chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect();
        assert_eq!(values, [56.0, 55.5]);
        let rows = HostTensor::from_slice(vec![1, 2], &[1.5f32, -2.0]).expect("f32 rows");
        let out: Vec<f32> = Decoder::scale_embeddings(&rows, 8.0).expect("scale").to_vec().expect("f32");
        assert_eq!(out, [12.0, -16.0]);
        let ints = HostTensor::from_slice(vec![1, 2], &[1i32, 2]).expect("i32 rows");
        assert!(matches!(Decoder::scale_embeddings(&ints, 8.0), Err(DecoderError::Embeddings(_))));
    }
}
