//! `demo` and `run`: compile MLIR through the cache, run it on a device,
//! print the results.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mlxcel_shim::{
    Arg, CacheOutcome, Checkpoint, CompileCache, CompileRequest, Compiler, DType, Device, Driver, HostTensor,
    Parameters, Session, Target,
};

/// Where and for what code runs.
#[derive(Clone, Debug, clap::Args)]
pub(crate) struct DeviceArgs {
    /// HAL driver: local-task (a worker per core: what real checkpoints want)
    /// or local-sync (inline on the calling thread: lowest overhead per call,
    /// so faster only for tiny models).
    #[arg(long, env = "MLXCEL_DRIVER", default_value = "local-task")]
    pub(crate) driver: String,
    /// CPU to compile for: host (fastest, not portable), generic, x86-64-v3, ...
    #[arg(long, default_value = "host")]
    pub(crate) target_cpu: String,
    /// Compile cache directory [default: $MLXCEL_CACHE_DIR or ~/.cache/mlxcel/compiled].
    #[arg(long)]
    pub(crate) cache_dir: Option<PathBuf>,
    /// Only read the compile cache (one built ahead with `mlxcel-host compile`, mounted
    /// read-only): a module it does not hold is an error, never compiled.
    #[arg(long, env = "MLXCEL_CACHE_READ_ONLY")]
    pub(crate) compile_cache_read_only: bool,
}

impl DeviceArgs {
    /// The compile cache these flags name.
    pub(crate) fn compile_cache(&self) -> CompileCache {
        let dir = self.cache_dir.clone().unwrap_or_else(CompileCache::default_dir);
        if self.compile_cache_read_only { CompileCache::read_only(dir) } else { CompileCache::new(dir) }
    }
}

/// The text decoder's activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Compute {
    /// f32 activations for f32 and bf16 weights alike, bf16 weights widened inside each op
    /// (qualified: at parity with transformers in f32 on the same stored weights).
    F32,
    /// bf16 activations with f32 accumulation, on a bf16 checkpoint, the encoders of the families
    /// whose plugins offer it included (experimental: transformers in bf16 bit for bit on
    /// small fixtures, but for one row's rounding in one softmax where the CPU lacks
    /// AVX512-BF16; at real widths the text rows of a prompt bit for bit on an AMD Zen 4, the
    /// image's rows and the encoder close but not bit for bit; faster than f32 only where
    /// `vdpbf16ps` doubles the f32 multiply-add rate, as on a Zen 4 and not on an Intel Xeon with
    /// AMX). Its linears sum as the target CPU can ([`mlxcel_emit::Bf16Dot::for_cpu`]).
    Bf16,
}

impl Compute {
    /// The decoder's numeric contract for code compiled for `target_cpu` (`None`: the bundle's
    /// f32 default); encoders compute beside it in the same activations and sums, where their
    /// family offers that (a family that does not refuses the first image). bf16 is refused
    /// unless unqualified capabilities are allowed.
    pub(crate) fn contract(
        self,
        allow_unqualified: bool,
        target_cpu: &str,
    ) -> Result<Option<mlxcel_emit::NumericContract>> {
        match self {
            Compute::F32 => Ok(None),
            Compute::Bf16 if !allow_unqualified => bail!(
                "--compute bf16 is experimental (transformers in bf16 bit for bit on small fixtures, and at real \
                 widths close but not bit for bit; not qualified); pass --allow-unqualified to use it"
            ),
            Compute::Bf16 => {
                let avx512_bf16 = Target::Cpu { cpu: target_cpu.to_owned() }.has_avx512_bf16();
                Ok(Some(mlxcel_emit::NumericContract::bf16(mlxcel_emit::Bf16Dot::for_cpu(avx512_bf16))))
            }
        }
    }
}

const DEMO_MLIR: &str = include_str!("../programs/attention.mlir");

/// Compiles (or fetches from the cache) one module, with `flags` after the target's.
/// `contract` is the numeric contract the module was emitted under with the storage forms of
/// the weights it reads, when it states one: its record (with this compiler and target as the
/// backend) keys the cache entry and is checked against a cached one.
pub(crate) fn compile(
    name: &str,
    mlir: &str,
    flags: &[String],
    contract: Option<(mlxcel_emit::NumericContract, Vec<String>)>,
    args: &DeviceArgs,
) -> Result<mlxcel_shim::Artifact> {
    let compiler = Compiler::locate()?;
    let cache = args.compile_cache();
    let target = Target::Cpu { cpu: args.target_cpu.clone() };
    let record = contract.map(|(c, sources)| {
        // The backend is the compiler, the target and the flags that change codegen.
        let backend = format!("IREE {} {} {}", compiler.revision(), target.fingerprint(), flags.join(" "));
        let backend = backend.trim_end().to_owned();
        c.descriptor(sources, mlxcel_emit::Elem::F32, backend).to_json()
    });
    let request = CompileRequest { name, mlir, target: &target, flags, key_parts: &[], contract: record.as_deref() };
    let started = std::time::Instant::now();
    let (artifact, outcome) = cache.get_or_compile(&compiler, &request)?;
    let how = match outcome {
        CacheOutcome::Hit => "from the compile cache",
        CacheOutcome::Compiled { replaced: false } => "compiled",
        CacheOutcome::Compiled { replaced: true } => "recompiled (the cached copy was damaged)",
    };
    eprintln!(
        "{name}: {how} in {:.2} s ({} bytes, IREE {}, cache {})",
        started.elapsed().as_secs_f64(),
        artifact.vmfb.len(),
        compiler.revision(),
        cache.dir().display()
    );
    Ok(artifact)
}

pub(crate) fn demo(args: &DeviceArgs) -> Result<()> {
    let driver: Driver = args.driver.parse()?;
    let artifact = compile("demo", DEMO_MLIR, &[], None, args)?;
    let device = Device::new(driver)?;
    let session = Session::new(&device, None, &[&artifact])?;
    let q = [0.5f32, -1.0, 0.25, 2.0];
    let k: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
    let v: Vec<f32> = (0..24).map(|i| ((i * 5 % 13) as f32 - 6.0) / 3.0).collect();
    let inputs = [
        HostTensor::from_slice(vec![1, 4], &q)?,
        HostTensor::from_slice(vec![6, 4], &k)?,
        HostTensor::from_slice(vec![6, 4], &v)?,
    ];
    let args: Vec<Arg<'_>> = inputs.iter().map(Arg::from).collect();
    let got: Vec<f32> = session.call("demo.attend", &args)?[0].to_host()?.to_vec()?;
    let want = attention_reference(&q, &k, &v);
    let diff = got.iter().zip(&want).map(|(g, w)| (f64::from(*g) - w).abs()).fold(0.0, f64::max);
    println!("attention on {}: {:?}", driver.name(), got);
    println!("f64 reference:     {:?}", want.iter().map(|&w| w as f32).collect::<Vec<_>>());
    println!("max |difference|:  {diff:.2e}");
    if diff > 1e-5 {
        bail!("the result differs from the reference by {diff:.2e} (more than 1e-5)");
    }
    Ok(())
}

/// softmax(q k^T / 2) v in f64.
fn attention_reference(q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
    let n = k.len() / 4;
    let s: Vec<f64> =
        (0..n).map(|j| (0..4).map(|c| f64::from(q[c]) * f64::from(k[j * 4 + c])).sum::<f64>() * 0.5).collect();
    let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
    let total: f64 = e.iter().sum();
    (0..4).map(|c| (0..n).map(|j| e[j] / total * f64::from(v[j * 4 + c])).sum()).collect()
}

pub(crate) fn run_file(
    mlir_path: &Path,
    function: Option<&str>,
    inputs: &[String],
    params: Option<&Path>,
    args: &DeviceArgs,
) -> Result<()> {
    let driver: Driver = args.driver.parse()?;
    let mlir = std::fs::read_to_string(mlir_path).with_context(|| format!("cannot read {}", mlir_path.display()))?;
    let name = mlir_path.file_stem().and_then(|s| s.to_str()).unwrap_or("module");
    let artifact = compile(name, &mlir, &[], None, args)?;
    let device = Device::new(driver)?;
    let parameters = params.map(|p| Parameters::new("model", Checkpoint::open(p)?)).transpose()?;
    let session = Session::new(&device, parameters.as_ref(), &[&artifact])?;
    let function = match function {
        Some(f) => f.to_owned(),
        None => {
            // IREE exports `__init` (and other `__` names) itself for a module with globals:
            // the initializer it runs on load, never the function a user means.
            let functions = session.functions();
            let user: Vec<&str> =
                functions.iter().map(|f| f.name.as_str()).filter(|n| !export_name(n).starts_with("__")).collect();
            match user.as_slice() {
                [only] => (*only).to_owned(),
                many => {
                    bail!("the module exports {} functions; pick one with --function ({})", many.len(), many.join(", "))
                }
            }
        }
    };
    let tensors = inputs.iter().map(|s| parse_input(s)).collect::<Result<Vec<_>>>()?;
    let call_args: Vec<Arg<'_>> = tensors.iter().map(Arg::from).collect();
    for (i, out) in session.call(&function, &call_args)?.iter().enumerate() {
        println!("result[{i}]: {} = {}", out.desc(), format_values(&out.to_host()?)?);
    }
    Ok(())
}

/// The function's own name in `module.function`.
fn export_name(qualified: &str) -> &str {
    qualified.rsplit_once('.').map_or(qualified, |(_, f)| f)
}

/// Parses `2x3xf32=1 2 3 4 5 6` (or `f32=1.5` for a scalar).
fn parse_input(spec: &str) -> Result<HostTensor> {
    let (ty, values) = spec.split_once('=').with_context(|| format!("input {spec:?} is not TYPE=VALUES"))?;
    let mut parts: Vec<&str> = ty.split('x').collect();
    let dtype_name = parts.pop().unwrap_or_default();
    let dtype = DType::from_mlir(dtype_name).with_context(|| format!("unknown element type {dtype_name:?}"))?;
    let shape = parts
        .iter()
        .map(|d| d.parse::<usize>().with_context(|| format!("bad dimension {d:?} in {spec:?}")))
        .collect::<Result<Vec<_>>>()?;
    let values: Vec<&str> = values.split([' ', ',']).filter(|s| !s.is_empty()).collect();
    let t = match dtype {
        DType::F32 => HostTensor::from_slice(shape, &parse_all::<f32>(&values)?),
        DType::I32 => HostTensor::from_slice(shape, &parse_all::<i32>(&values)?),
        DType::I64 => HostTensor::from_slice(shape, &parse_all::<i64>(&values)?),
        other => bail!("inputs of type {other} are not supported on the command line"),
    };
    Ok(t?)
}

fn parse_all<T: std::str::FromStr>(values: &[&str]) -> Result<Vec<T>> {
    values.iter().map(|v| v.parse::<T>().map_err(|_| anyhow::anyhow!("bad value {v:?}"))).collect()
}

fn format_values(t: &HostTensor) -> Result<String> {
    Ok(match t.dtype() {
        DType::F32 => format!("{:?}", t.to_vec::<f32>()?),
        DType::I32 => format!("{:?}", t.to_vec::<i32>()?),
        DType::I64 => format!("{:?}", t.to_vec::<i64>()?),
        other => format!("<{} bytes of {other}>", t.bytes().len()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iree_internal_exports_are_never_the_default_function() {
        assert_eq!(export_name("example.__init"), "__init");
        assert_eq!(export_name("example.scale"), "scale");
        assert_eq!(export_name("scale"), "scale");
    }

    #[test]
    fn inputs_parse_like_iree_run_module() {
        let t = parse_input("2x2xf32=1 2 3 4").expect("parses");
        assert_eq!((t.shape(), t.to_vec::<f32>().expect("f32")), (&[2usize, 2][..], vec![1.0, 2.0, 3.0, 4.0]));
        assert_eq!(parse_input("i32=7").expect("scalar").to_vec::<i32>().expect("i32"), vec![7]);
        assert!(parse_input("2x2xf32=1 2 3").is_err(), "too few values");
        assert!(parse_input("2xq8=1 2").is_err(), "unknown type");
        assert!(parse_input("nonsense").is_err());
    }
}
