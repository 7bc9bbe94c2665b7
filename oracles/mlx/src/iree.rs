//! Our side: StableHLO text compiled by IREE and run through mlxcel-shim, as the host does.
#![forbid(unsafe_code)]

use std::path::Path;

use anyhow::{Context, Result};
use mlxcel_shim::{
    Arg, Checkpoint, CompileCache, CompileRequest, Compiler, DType, Device, Driver, HostTensor, Parameters, Session,
    Target,
};

use crate::rng::{bf16_bits, bf16_to_f32};

/// The compiler, one device (`local-sync`: inline, one thread, so a run is deterministic by
/// construction) and a compile cache of its own.
pub struct Iree {
    pub compiler: Compiler,
    pub target: Target,
    device: Device,
    cache: CompileCache,
    _cache_dir: tempfile::TempDir,
}

impl std::fmt::Debug for Iree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iree").field("revision", &self.compiler.revision()).finish()
    }
}

/// A function argument: f32 or bf16 data (bf16 given as f32 values it holds exactly).
#[derive(Clone, Debug)]
pub enum Input {
    F32(Vec<usize>, Vec<f32>),
    BF16(Vec<usize>, Vec<f32>),
}

/// Tensors served as the `model` parameter scope: packed quantized weights (u32 words) and
/// their f32 scales and biases, written to a safetensors file as a checkpoint holds them.
#[derive(Debug, Default)]
pub struct Weights {
    pub u32s: Vec<(String, Vec<usize>, Vec<u32>)>,
    pub f32s: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl Iree {
    pub fn new() -> Result<Self> {
        let compiler = Compiler::locate().context("the IREE compiler (tools/dev/setup.sh installs it)")?;
        let device = Device::new(Driver::LocalSync)?;
        let dir = tempfile::tempdir()?;
        Ok(Iree { compiler, target: Target::host_cpu(), device, cache: CompileCache::new(dir.path()), _cache_dir: dir })
    }

    /// Compiles `mlir` (module `name`, function `f`) and calls `f` once; every result read back
    /// as f32 (bf16 results widened exactly), with its dtype.
    pub fn run(
        &self,
        name: &str,
        mlir: &str,
        flags: &[String],
        weights: Option<&Weights>,
        inputs: &[Input],
    ) -> Result<Vec<Out>> {
        let request = CompileRequest { name, mlir, target: &self.target, flags, key_parts: &[], contract: None };
        let (artifact, _) =
            self.cache.get_or_compile(&self.compiler, &request).with_context(|| format!("compiling {name}"))?;
        let dir = tempfile::tempdir()?;
        let params = match weights {
            Some(w) => {
                let path = dir.path().join("model.safetensors");
                write_safetensors(&path, w)?;
                Some(Parameters::new("model", Checkpoint::open(&path)?)?)
            }
            None => None,
        };
        let session = Session::new(&self.device, params.as_ref(), &[&artifact])?;
        let hosts = inputs.iter().map(host_tensor).collect::<Result<Vec<_>>>()?;
        let args: Vec<Arg<'_>> = hosts.iter().map(Arg::from).collect();
        let out = session.call(&format!("{name}.f"), &args).with_context(|| format!("running {name}"))?;
        out.iter().map(|t| read_f32(&t.to_host()?)).collect()
    }
}

fn host_tensor(input: &Input) -> Result<HostTensor> {
    Ok(match input {
        Input::F32(shape, data) => HostTensor::from_slice(shape.clone(), data)?,
        Input::BF16(shape, data) => {
            let bytes = data.iter().flat_map(|&x| bf16_bits(x).to_le_bytes()).collect();
            HostTensor::from_bytes(DType::BF16, shape.clone(), bytes)?
        }
    })
}

/// A result: its dtype's name and its values as f32.
#[derive(Clone, Debug)]
pub struct Out {
    pub dtype: String,
    pub values: Vec<f32>,
}

fn read_f32(t: &HostTensor) -> Result<Out> {
    let values = match t.dtype() {
        DType::F32 => t.to_vec::<f32>()?,
        DType::BF16 => t.bytes().chunks_exact(2).map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect(),
        other => anyhow::bail!("a result of dtype {other}"),
    };
    Ok(Out { dtype: t.dtype().mlir().to_owned(), values })
}

fn write_safetensors(path: &Path, w: &Weights) -> Result<()> {
    use safetensors::{Dtype, tensor::TensorView};
    let mut bytes: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (k, s, d) in &w.u32s {
        bytes.push((k.clone(), Dtype::U32, s.clone(), d.iter().flat_map(|x| x.to_le_bytes()).collect()));
    }
    for (k, s, d) in &w.f32s {
        bytes.push((k.clone(), Dtype::F32, s.clone(), d.iter().flat_map(|x| x.to_le_bytes()).collect()));
    }
    let views = bytes
        .iter()
        .map(|(k, dt, s, b)| Ok((k.clone(), TensorView::new(*dt, s.clone(), b)?)))
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path)?;
    Ok(())
}
