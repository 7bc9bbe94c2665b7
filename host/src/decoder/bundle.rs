//! A compiled decoder bundle loaded on a device, with the host-side slot
//! bookkeeping: each slot's cache length. Every argument is validated here
//! before anything reaches IREE.

use std::path::Path;

use mlxcel_emit::{Elem, NumericContract};
use mlxcel_shim::{
    Arg, CacheOutcome, Checkpoint, CompileCache, CompileRequest, Compiler, Device, HostTensor, Parameters, Session,
    Target,
};

use super::{
    config::{ConfigError, TextConfig},
    graph::{self, BundleShape},
};

/// What a bundle is compiled for.
#[derive(Clone, Debug)]
pub struct DecoderOptions {
    pub shape: BundleShape,
    pub contract: NumericContract,
    pub target: Target,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        DecoderOptions {
            shape: BundleShape { chunk: 32, capacity: 256, slots: 4 },
            contract: NumericContract::f32(),
            target: Target::host_cpu(),
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
    #[error("slot {slot} is out of range (the bundle has {slots} slots)")]
    SlotOutOfRange { slot: usize, slots: usize },
    #[error("{used} cache rows plus {adding} new tokens exceed the context capacity of {capacity}")]
    CapacityExceeded { used: usize, adding: usize, capacity: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
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
    outcome: CacheOutcome,
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
        let config = TextConfig::load(dir)?;
        let shape = options.shape;
        if shape.chunk == 0 || shape.capacity == 0 || !shape.capacity.is_multiple_of(shape.chunk) || shape.slots == 0 {
            return Err(DecoderError::BadShape { capacity: shape.capacity, chunk: shape.chunk });
        }
        let checkpoint = Checkpoint::open(dir)?;
        let weights = weight_dtype(&checkpoint, &options.contract)?;
        let mlir = graph::emit(&config, shape, options.contract, weights)?;
        // For inspecting what the compiler is given.
        if let Some(dir) = std::env::var_os("MLXCEL_DUMP_MLIR") {
            let path = Path::new(&dir).join(format!("decoder-{}.mlir", config.arch.name()));
            if let Err(e) = std::fs::write(&path, &mlir) {
                tracing::warn!(path = %path.display(), error = %e, "could not dump the decoder MLIR");
            }
        }
        let key_parts = vec![
            options.contract.fingerprint(),
            format!(
                "decoder:{}:chunk={}:cap={}:slots={}",
                config.arch.name(),
                shape.chunk,
                shape.capacity,
                shape.slots
            ),
        ];
        let request =
            CompileRequest { name: "decoder", mlir: &mlir, target: &options.target, flags: &[], key_parts: &key_parts };
        let (artifact, outcome) = cache.get_or_compile(compiler, &request)?;
        let params = Parameters::new("model", checkpoint)?;
        let session = Session::new(device, Some(&params), &[&artifact])?;
        Ok(Decoder { lens: vec![0; shape.slots], config, options, session, outcome })
    }

    pub fn config(&self) -> &TextConfig {
        &self.config
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

    /// Frees a slot for the next request.
    pub fn release(&mut self, slot: usize) -> Result<(), DecoderError> {
        self.check_slot(slot)?;
        self.lens[slot] = 0;
        Ok(())
    }

    fn check_slot(&self, slot: usize) -> Result<(), DecoderError> {
        if slot >= self.lens.len() {
            return Err(DecoderError::SlotOutOfRange { slot, slots: self.lens.len() });
        }
        Ok(())
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), DecoderError> {
        match tokens.iter().find(|&&t| t as usize >= self.config.vocab) {
            Some(&token) => Err(DecoderError::TokenOutOfRange { token, vocab: self.config.vocab }),
            None => Ok(()),
        }
    }

    /// Prefills `slot` from scratch with `tokens`, in chunks, and returns the
    /// logits of every prompt position (`[n, vocab]`, row-major f32).
    pub fn prefill_tokens(&mut self, slot: usize, tokens: &[u32]) -> Result<Vec<f32>, DecoderError> {
        self.check_slot(slot)?;
        self.check_tokens(tokens)?;
        let BundleShape { chunk, capacity, .. } = self.options.shape;
        if tokens.is_empty() {
            return Err(DecoderError::EmptyPrompt);
        }
        if tokens.len() > capacity {
            return Err(DecoderError::CapacityExceeded { used: 0, adding: tokens.len(), capacity });
        }
        let vocab = self.config.vocab;
        let mut logits = Vec::with_capacity(tokens.len() * vocab);
        self.lens[slot] = 0;
        for (c, part) in tokens.chunks(chunk).enumerate() {
            let start = c * chunk;
            let mut ids: Vec<i32> = part.iter().map(|&t| t as i32).collect();
            ids.resize(chunk, 0);
            let pos: Vec<i32> = (start..start + chunk).map(|p| p as i32).collect();
            let mask = causal_mask(start, chunk, capacity);
            let args = [
                HostTensor::from_slice(vec![chunk], &ids)?,
                HostTensor::from_slice(vec![chunk], &pos)?,
                HostTensor::from_slice(vec![chunk, capacity], &mask)?,
                HostTensor::scalar(slot as i32),
                HostTensor::scalar(start as i32),
            ];
            let out = self.session.call("decoder.prefill_tokens", &args.iter().map(Arg::from).collect::<Vec<_>>())?;
            let rows: Vec<f32> = out[0].to_host()?.to_vec()?;
            logits.extend_from_slice(&rows[..part.len() * vocab]);
            self.lens[slot] = start + part.len();
        }
        Ok(logits)
    }

    /// One decode step for each `(slot, token)`; every slot listed appends
    /// one row. Returns each listed slot's logits, in order.
    pub fn decode(&mut self, steps: &[(usize, u32)]) -> Result<Vec<Vec<f32>>, DecoderError> {
        let BundleShape { capacity, slots, .. } = self.options.shape;
        for &(slot, token) in steps {
            self.check_slot(slot)?;
            self.check_tokens(&[token])?;
            if self.lens[slot] + 1 > capacity {
                return Err(DecoderError::CapacityExceeded { used: self.lens[slot], adding: 1, capacity });
            }
        }
        let mut ids = vec![0i32; slots];
        let mut pos = vec![0i32; slots];
        let mut write = vec![0i32; slots];
        // Idle slots write a junk row at their current end, which the next
        // prefill or decode of that slot overwrites before it is visible.
        let mut mask = vec![f32::NEG_INFINITY; slots * capacity];
        for s in 0..slots {
            let at = self.lens[s].min(capacity - 1);
            write[s] = at as i32;
            pos[s] = at as i32;
            mask[s * capacity] = 0.0;
        }
        for &(slot, token) in steps {
            let at = self.lens[slot];
            ids[slot] = token as i32;
            mask[slot * capacity..slot * capacity + at + 1].fill(0.0);
        }
        let args = [
            HostTensor::from_slice(vec![slots], &ids)?,
            HostTensor::from_slice(vec![slots], &pos)?,
            HostTensor::from_slice(vec![slots], &write)?,
            HostTensor::from_slice(vec![slots, capacity], &mask)?,
        ];
        let out = self.session.call("decoder.decode", &args.iter().map(Arg::from).collect::<Vec<_>>())?;
        let all: Vec<f32> = out[0].to_host()?.to_vec()?;
        let vocab = self.config.vocab;
        let mut result = Vec::with_capacity(steps.len());
        for &(slot, _) in steps {
            self.lens[slot] += 1;
            result.push(all[slot * vocab..(slot + 1) * vocab].to_vec());
        }
        Ok(result)
    }
}

/// Additive causal mask for a chunk starting at `start`: row i sees cache
/// rows `0..=start + i`.
fn causal_mask(start: usize, chunk: usize, capacity: usize) -> Vec<f32> {
    let mut mask = vec![f32::NEG_INFINITY; chunk * capacity];
    for i in 0..chunk {
        let visible = (start + i + 1).min(capacity);
        mask[i * capacity..i * capacity + visible].fill(0.0);
    }
    mask
}

/// The dtype the checkpoint stores weights in, which must be the
/// contract's activation dtype (f32 checkpoints run the f32 contract).
fn weight_dtype(ckpt: &Checkpoint, contract: &NumericContract) -> Result<Elem, DecoderError> {
    let want = contract.activations;
    for (key, entry) in ckpt.tensors() {
        if Elem::from_safetensors(&entry.dtype) != Some(want) {
            return Err(DecoderError::WeightDtype {
                key: key.clone(),
                found: entry.dtype.clone(),
                want: want.to_string(),
            });
        }
    }
    Ok(want)
}
