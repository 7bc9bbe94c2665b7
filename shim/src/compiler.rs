//! StableHLO text to VMFB through `libIREECompiler.so` from the PyPI wheel
//! `iree-base-compiler`, located without the user activating a venv.

use std::path::{Path, PathBuf};

use eerie::compiler::{MemBufferOutput, Pipeline};

use crate::error::{Error, Result};

/// The IREE release this build's runtime is; the compiler must match it.
pub const IREE_VERSION: &str = "3.13.0";

/// What the compiled code runs on. The target is part of every cache key:
/// `cpu = "host"` artifacts use this machine's instructions and are not portable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// `llvm-cpu` for the named CPU (`host`, `generic`, `x86-64-v3`, ...).
    Cpu { cpu: String },
    /// NVIDIA GPUs (`cuda` cargo feature).
    Cuda,
    /// Vulkan SPIR-V (`vulkan` cargo feature).
    Vulkan,
}

impl Target {
    /// The CPU this process runs on: fastest, not portable.
    pub fn host_cpu() -> Self {
        Target::Cpu { cpu: "host".into() }
    }

    /// Whether code for this target may use AVX512-BF16's `vdpbf16ps` (bf16 pair products into
    /// f32, what IREE's bf16 mmt4d microkernel is written for): the host's `/proc/cpuinfo` says;
    /// a CPU named otherwise is not assumed to have it (code that sums in order runs on any CPU).
    pub fn has_avx512_bf16(&self) -> bool {
        match self {
            Target::Cpu { cpu } if cpu == "host" => {
                std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|info| cpuinfo_has_flag(&info, "avx512_bf16"))
            }
            _ => false,
        }
    }

    /// The width in bits of the widest vectors code for this target may use, where it is known:
    /// the host's `/proc/cpuinfo` says (512 when every core has AVX-512F, 256 with AVX2, 128 on
    /// other x86-64 CPUs); a CPU named otherwise, or a host whose flags name neither, is not known.
    pub fn vector_bits(&self) -> Option<u32> {
        match self {
            Target::Cpu { cpu } if cpu == "host" => {
                std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|info| cpuinfo_vector_bits(&info))
            }
            _ => None,
        }
    }

    /// Compiler flags selecting this target.
    pub fn flags(&self) -> Vec<String> {
        match self {
            // No microkernels by default: IREE 3.13 computes a bf16 x bf16 `linalg.mmt4d` in tiles
            // of 32x1 (what an f32 tiled linear becomes once IREE folds its left operand's
            // widening from bf16 into the contraction) wrong through its mmt4d ukernel, on
            // AVX-512 and AVX2 targets alike (an error of 37 on outputs of magnitude 27); its
            // generated code is right. A module whose bf16 contractions are tiled 16x2, the
            // ukernel's own tile, enables it with its own flag (which replaces this one, see
            // `Compiler::compile`); the graphs emit no other operation IREE lowers to a ukernel.
            Target::Cpu { cpu } => vec![
                "--iree-hal-target-backends=llvm-cpu".into(),
                format!("--iree-llvmcpu-target-cpu={cpu}"),
                "--iree-llvmcpu-enable-ukernels=none".into(),
            ],
            Target::Cuda => vec!["--iree-hal-target-backends=cuda".into()],
            Target::Vulkan => vec!["--iree-hal-target-backends=vulkan-spirv".into()],
        }
    }

    /// A string that changes whenever code compiled for this target could
    /// differ; for `host` it names this machine's CPU model and features.
    pub fn fingerprint(&self) -> String {
        match self {
            Target::Cpu { cpu } if cpu == "host" => {
                format!("llvm-cpu:host:{}:ukernels-none:tuning-{}", host_cpu_identity(), self.tuning_spec_digest())
            }
            Target::Cpu { cpu } => format!("llvm-cpu:{cpu}:ukernels-none:tuning-{}", self.tuning_spec_digest()),
            Target::Cuda => "cuda".into(),
            Target::Vulkan => "vulkan-spirv".into(),
        }
    }

    /// The Transform-dialect tuning spec compiles for this target are given
    /// ([`llvm_cpu_tuning_spec`] for its vector width), `None` off the CPU.
    pub fn tuning_spec(&self) -> Option<String> {
        match self {
            Target::Cpu { .. } => Some(llvm_cpu_tuning_spec(self.vector_bits())),
            Target::Cuda | Target::Vulkan => None,
        }
    }

    fn tuning_spec_digest(&self) -> String {
        use sha2::Digest;
        hex::encode(&sha2::Sha256::digest(self.tuning_spec().unwrap_or_default().as_bytes())[..8])
    }
}

/// The widest x86 vectors every core of a `/proc/cpuinfo` text has, in bits.
fn cpuinfo_vector_bits(info: &str) -> Option<u32> {
    [("avx512f", 512), ("avx2", 256), ("sse2", 128)]
        .into_iter()
        .find(|(flag, _)| cpuinfo_has_flag(info, flag))
        .map(|(_, bits)| bits)
}

/// Whether every `flags` line of a `/proc/cpuinfo` text names `flag` (a whole word).
fn cpuinfo_has_flag(info: &str, flag: &str) -> bool {
    let mut lines = info.lines().filter(|l| l.starts_with("flags")).peekable();
    lines.peek().is_some() && lines.all(|l| l.split_whitespace().any(|f| f == flag))
}

/// The CPU model name and feature flags from `/proc/cpuinfo`, hashed.
fn host_cpu_identity() -> String {
    use sha2::Digest;
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let wanted = |l: &&str| l.starts_with("model name") || l.starts_with("flags");
    let mut lines: Vec<&str> = info.lines().filter(wanted).collect();
    lines.sort();
    lines.dedup();
    hex::encode(&sha2::Sha256::digest(lines.join("\n").as_bytes())[..8])
}

/// The matchers of IREE's Transform-dialect tuning spec for every `llvm-cpu` target
/// (`shim/tuning/llvm_cpu.mlir`): lowering configurations for the dispatch shapes IREE's
/// defaults leave slow (IREE's own mechanism for per-target tuning, instead of hand-written
/// kernels).
const LLVM_CPU_MATCHERS: &str = include_str!("../tuning/llvm_cpu.mlir");

/// The matchers for 256-bit (AVX2) targets only (`shim/tuning/llvm_cpu_avx2.mlir`): IREE's
/// defaults for their shapes differ on AVX-512.
const LLVM_CPU_AVX2_MATCHERS: &str = include_str!("../tuning/llvm_cpu_avx2.mlir");

/// The matchers for 512-bit (AVX-512) targets only (`shim/tuning/llvm_cpu_avx512.mlir`): vector
/// steps that take the full width where every target's would take half of it.
const LLVM_CPU_AVX512_MATCHERS: &str = include_str!("../tuning/llvm_cpu_avx512.mlir");

/// The tuning spec for an `llvm-cpu` target whose widest vectors are `vector_bits` wide (`None`:
/// not known): the matchers of its width that override every target's (AVX-512), the matchers
/// of every target, then those of its width that add to them (AVX2), each applying its
/// configuration (`@apply_op_config`) to the operations it matches; IREE tries them in this
/// order and the first that matches wins. Its digest is part of the target's fingerprint, so
/// every cache key follows it.
pub fn llvm_cpu_tuning_spec(vector_bits: Option<u32>) -> String {
    let matchers = match vector_bits {
        Some(512) => vec![LLVM_CPU_AVX512_MATCHERS, LLVM_CPU_MATCHERS],
        Some(256) => vec![LLVM_CPU_MATCHERS, LLVM_CPU_AVX2_MATCHERS],
        _ => vec![LLVM_CPU_MATCHERS],
    };
    let names: Vec<&str> = matchers
        .iter()
        .flat_map(|m| m.lines())
        .filter_map(|l| l.trim_start().strip_prefix("transform.named_sequence @"))
        .filter_map(|l| l.split_once('(').map(|(name, _)| name))
        .collect();
    let entries: Vec<String> = names.iter().map(|n| format!("        @{n} -> @apply_op_config")).collect();
    format!(
        "module @mlxcel_llvm_cpu attributes {{transform.with_named_sequence, iree_codegen.tuning_spec_with_default_entrypoint}} {{
  transform.named_sequence @apply_op_config(%op: !transform.any_op {{transform.readonly}}, %config: !transform.any_param {{transform.readonly}}) {{
    transform.annotate %op \"compilation_info\" = %config : !transform.any_op, !transform.any_param
    transform.yield
  }}

{}
  transform.named_sequence @__kernel_config(%variant: !transform.any_op {{transform.consumed}}) -> !transform.any_op attributes {{iree_codegen.tuning_spec_entrypoint}} {{
    %res = transform.foreach_match in %variant
{}
      : (!transform.any_op) -> !transform.any_op
    transform.yield %res : !transform.any_op
  }}
}}
",
        matchers.join("\n"),
        entries.join(",\n")
    )
}

/// A loaded IREE compiler. Cheap to clone; the library stays loaded for the
/// life of the process (IREE cannot be re-initialised after shutdown).
#[derive(Clone, Debug)]
pub struct Compiler {
    inner: eerie::compiler::Compiler,
    revision: String,
}

impl Compiler {
    /// Finds and loads the compiler: `$MLXCEL_IREE_COMPILER` (the library or
    /// its directory), else the project venv (`$MLXCEL_VENV`, else `.venv` at
    /// the workspace root).
    pub fn locate() -> Result<Self> {
        Compiler::load(&find_library(&candidates())?)
    }

    /// Loads the compiler library at `path` and checks its version.
    pub fn load(path: &Path) -> Result<Self> {
        let mut inner = eerie::compiler::Compiler::with_library(path)
            .map_err(|e| Error::CompilerLoad { path: path.to_owned(), reason: e.to_string() })?;
        // The process-wide options: none beyond the program name. MLIR threading stays on, so a
        // session compiles its executables on every core (see `Compiler::compile` for what that
        // takes with a tuning spec).
        match inner.setup_global_cl(vec!["mlxcel".to_owned()]) {
            Ok(_) | Err(eerie::compiler::CompilerError::GlobalCLAlreadySet) => {}
            Err(e) => return Err(Error::CompilerLoad { path: path.to_owned(), reason: e.to_string() }),
        }
        let revision =
            inner.get_revision().map_err(|e| Error::CompilerLoad { path: path.to_owned(), reason: e.to_string() })?;
        // Official wheels report "3.13.0rc<date> @ <commit>" or "3.13.0 @ ...".
        if !revision.starts_with(IREE_VERSION) {
            return Err(Error::CompilerVersion { path: path.to_owned(), found: revision, wanted: IREE_VERSION });
        }
        Ok(Compiler { inner, revision })
    }

    /// The compiler's revision string; part of every cache key.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    pub fn library_path(&self) -> &Path {
        self.inner.library_path()
    }

    /// Compiles StableHLO (or any IREE input) text. `what` names the module
    /// in errors; `extra_flags` follow the target's flags and its tuning spec, replacing any for
    /// the same option (a `--iree-codegen-tuning-spec-path` of their own replaces the target's).
    pub fn compile(&self, what: &str, mlir: &str, target: &Target, extra_flags: &[String]) -> Result<Vec<u8>> {
        // The compiler reads the spec from a file; it lives as long as this call.
        let spec = match target.tuning_spec() {
            Some(text) => Some(write_spec(&text).map_err(|e| Error::Compile {
                what: what.to_owned(),
                diagnostics: format!("could not write the tuning spec to a temporary file: {e}"),
            })?),
            None => None,
        };
        let flags = compile_flags(target, spec.as_ref().map(|f| f.path()), extra_flags);
        let _span = tracing::info_span!("compile", module = what).entered();
        // One thread uses IREE at a time (see lock.rs): concurrent compiler
        // sessions crashed (SIGSEGV) on IREE 3.13 with decoder-sized modules.
        let _guard = crate::lock::IreeLock::acquire();
        let started = std::time::Instant::now();
        let failed = |e| Error::Compile { what: what.to_owned(), diagnostics: describe_compiler_error(e) };
        let with_spec = flags.iter().any(|f| f.starts_with(TUNING_SPEC_FLAG));
        let mut session = self.inner.create_session();
        session.set_flags(flags).map_err(failed)?;
        if with_spec {
            load_tuning_spec(&session).map_err(failed)?;
        }
        let source = session.create_source_from_buf(mlir.as_bytes()).map_err(failed)?;
        let mut invocation = session.create_invocation();
        let mut output = MemBufferOutput::new(&self.inner).map_err(failed)?;
        invocation
            .parse_source(source)
            .map_err(failed)?
            .set_verify_ir(true)
            .pipeline(Pipeline::Std)
            .map_err(failed)?
            .output_vm_byte_code(&mut output)
            .map_err(failed)?;
        let vmfb = output.map_memory().map_err(failed)?.to_vec();
        drop(spec);
        tracing::info!(bytes = vmfb.len(), elapsed_ms = started.elapsed().as_millis() as u64, "compiled");
        Ok(vmfb)
    }
}

/// A module of one dispatch, compiled up to its executables' configurations.
const ONE_DISPATCH: &str = "func.func @load_tuning_spec(%a: tensor<16xf32>) -> tensor<16xf32> {
  %b = stablehlo.add %a, %a : tensor<16xf32>
  return %b : tensor<16xf32>
}
";

/// Loads the session's tuning spec into its context before any module of ours is compiled in
/// it, by configuring a module of one dispatch (the spec is parsed when the first executable is
/// configured, and kept by the context). With MLIR threading on, a decoder bundle's compile
/// once deadlocked: a worker waited forever on the lock under which IREE 3.13's
/// `getOrLoadTransformLibraryModule` parses the spec. What the sources show: the parse verifies
/// the spec's named sequences in parallel, and a pool thread that waits for such tasks runs
/// whichever task is queued next (LLVM's `StdThreadPool::processTasks`), which can be another
/// executable's configuration asking for the same lock on the same thread. With one executable
/// nothing is queued beside the parse, and afterwards every executable finds the spec loaded.
fn load_tuning_spec(session: &eerie::compiler::Session<'_>) -> std::result::Result<(), eerie::compiler::CompilerError> {
    let source = session.create_source_from_buf(ONE_DISPATCH.as_bytes())?;
    let mut invocation = session.create_invocation();
    invocation.parse_source(source)?.set_compile_to_phase("executable-configurations")?.pipeline(Pipeline::Std)?;
    Ok(())
}

/// The compiler's option naming a Transform-dialect tuning spec file, with its `=`.
const TUNING_SPEC_FLAG: &str = "--iree-codegen-tuning-spec-path=";

/// What the compiler is given for a module on `target`: the target's flags, its tuning spec
/// (the file at `spec`), then `extra`, each replacing any earlier flag for the same option.
fn compile_flags(target: &Target, spec: Option<&Path>, extra: &[String]) -> Vec<String> {
    let mut flags = target.flags();
    if let Some(path) = spec {
        flags.push(format!("{TUNING_SPEC_FLAG}{}", path.display()));
    }
    let mut flags = without_replaced(flags, extra);
    flags.extend(extra.iter().cloned());
    flags
}

/// Writes what a compile of the module `what` is given into `dir`, for reading it and compiling
/// it again with the wheel's `iree-compile`: `<what>.mlir`, `<what>.flags` (one flag per line)
/// and, when the target has a tuning spec, `<what>.spec.mlir`, which those flags name. A file
/// that cannot be written costs a warning, never the compile.
pub(crate) fn dump(dir: &Path, what: &str, mlir: &str, target: &Target, extra: &[String]) {
    let write = |name: String, text: &str| {
        let path = dir.join(name);
        if let Err(e) = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, text)) {
            tracing::warn!(path = %path.display(), error = %e, "could not dump a module");
        }
    };
    let spec = target.tuning_spec().map(|text| {
        write(format!("{what}.spec.mlir"), &text);
        dir.join(format!("{what}.spec.mlir"))
    });
    write(format!("{what}.mlir"), mlir);
    let mut flags = compile_flags(target, spec.as_deref(), extra).join("\n");
    flags.push('\n');
    write(format!("{what}.flags"), &flags);
}

/// `target` without the flags whose option one of `extra` sets: a module's flag replaces the
/// target's for the same option, so the compiler is given each option once.
fn without_replaced(target: Vec<String>, extra: &[String]) -> Vec<String> {
    let option = |flag: &str| flag.split_once('=').map_or(flag, |(name, _)| name).to_owned();
    let replaced: std::collections::HashSet<String> = extra.iter().map(|f| option(f)).collect();
    target.into_iter().filter(|f| !replaced.contains(&option(f))).collect()
}

fn write_spec(text: &str) -> std::io::Result<tempfile::NamedTempFile> {
    use std::io::Write;
    let mut file = tempfile::Builder::new().prefix("mlxcel-tuning-").suffix(".mlir").tempfile()?;
    file.write_all(text.as_bytes())?;
    file.flush()?;
    Ok(file)
}

fn describe_compiler_error(e: eerie::compiler::CompilerError) -> String {
    use eerie::compiler::CompilerError as E;
    match e {
        E::IREECompilerError(err, diagnostics) => format!("{err}\n{diagnostics}").trim_end().to_owned(),
        E::IREECompilerDiagnosticsError(diagnostics) => diagnostics.to_string().trim_end().to_owned(),
        other => other.to_string(),
    }
}

/// The first candidate that holds the compiler library: an explicit path is
/// taken as given (a wrong one fails loudly when loaded); a venv must hold
/// the wheel's library.
fn find_library(candidates: &[Candidate]) -> Result<PathBuf> {
    let mut searched = Vec::new();
    for candidate in candidates {
        match candidate {
            Candidate::Explicit(path) => return Ok(path.clone()),
            Candidate::Venv(venv) => match find_in_venv(venv) {
                Some(lib) => return Ok(lib),
                None => searched.push(venv.display().to_string()),
            },
        }
    }
    Err(Error::CompilerNotFound { searched: searched.join(", "), wanted: IREE_VERSION })
}

#[derive(Debug)]
enum Candidate {
    Explicit(PathBuf),
    Venv(PathBuf),
}

fn candidates() -> Vec<Candidate> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("MLXCEL_IREE_COMPILER") {
        out.push(Candidate::Explicit(PathBuf::from(p)));
    }
    if let Some(p) = std::env::var_os("MLXCEL_VENV") {
        out.push(Candidate::Venv(PathBuf::from(p)));
    }
    // The venv tools/dev/setup.sh makes at the workspace root.
    out.push(Candidate::Venv(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv")));
    out
}

/// `<venv>/lib/python3.*/site-packages/iree/compiler/_mlir_libs/libIREECompiler.so`
fn find_in_venv(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(&lib)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3")))
        .collect();
    pythons.sort();
    pythons
        .into_iter()
        .map(|p| p.join("site-packages/iree/compiler/_mlir_libs/libIREECompiler.so"))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dump_holds_what_the_compiler_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::Cpu { cpu: "znver4".into() };
        let extra = vec!["--iree-llvmcpu-enable-ukernels=mmt4d".to_owned(), "--iree-opt-level=O2".to_owned()];
        dump(dir.path(), "enc", "func.func @f() { return }", &target, &extra);
        assert_eq!(std::fs::read_to_string(dir.path().join("enc.mlir")).unwrap(), "func.func @f() { return }");
        let spec = dir.path().join("enc.spec.mlir");
        assert_eq!(std::fs::read_to_string(&spec).unwrap(), target.tuning_spec().unwrap());
        let flags = std::fs::read_to_string(dir.path().join("enc.flags")).unwrap();
        let flags: Vec<&str> = flags.lines().collect();
        assert_eq!(
            flags,
            [
                "--iree-hal-target-backends=llvm-cpu",
                "--iree-llvmcpu-target-cpu=znver4",
                &format!("{TUNING_SPEC_FLAG}{}", spec.display()),
                "--iree-llvmcpu-enable-ukernels=mmt4d",
                "--iree-opt-level=O2",
            ],
            "the target's flags, its spec, then the module's, each option once"
        );
    }

    #[test]
    fn cpu_flags_are_whole_words_on_every_core() {
        let info =
            "processor : 0\nflags\t\t: fpu avx512f avx512_bf16 avx2\nprocessor : 1\nflags\t\t: fpu avx512_bf16\n";
        assert!(cpuinfo_has_flag(info, "avx512_bf16"));
        assert!(!cpuinfo_has_flag(info, "avx512"), "a prefix is not a flag");
        assert!(!cpuinfo_has_flag("flags : avx512_bf16\nflags : avx2\n", "avx512_bf16"), "one core lacks it");
        assert!(!cpuinfo_has_flag("processor : 0\n", "avx512_bf16"), "no flags line");
        assert!(!Target::Cpu { cpu: "znver4".into() }.has_avx512_bf16(), "a named CPU is not assumed to have it");
    }

    #[test]
    fn the_vector_width_is_the_widest_every_core_has() {
        let zen4 = "flags\t\t: sse2 avx2 avx512f avx512_bf16\nflags\t\t: sse2 avx2 avx512f avx512_bf16\n";
        assert_eq!(cpuinfo_vector_bits(zen4), Some(512));
        assert_eq!(cpuinfo_vector_bits("flags : sse2 avx2 fma\nflags : sse2 avx2 fma\n"), Some(256));
        assert_eq!(
            cpuinfo_vector_bits("flags : sse2 avx2 avx512f\nflags : sse2 avx2\n"),
            Some(256),
            "one core lacks it"
        );
        assert_eq!(cpuinfo_vector_bits("flags : sse2 sse4_2\n"), Some(128));
        assert_eq!(cpuinfo_vector_bits("Features : fp asimd\n"), None, "not x86");
        assert_eq!(Target::Cpu { cpu: "znver4".into() }.vector_bits(), None, "a named CPU is not known");
    }

    #[test]
    fn avx2_and_avx512_targets_get_their_own_matchers() {
        let entry = |name: &str| format!("@{name} -> @apply_op_config");
        let base = [
            "match_matvec_bf16",
            "match_matvec_f16",
            "match_qlinear_rows_g32",
            "match_qlinear_rows",
            "match_qlinear_tiled",
            "match_qlinear_tiled_rows",
            "match_mmt4d_bf16_pairs_deep",
            "match_mmt4d_f32_bf16_deep",
            "match_mmt4d_f32_f32_deep",
        ];
        let avx2 = ["match_mmt4d_f32_deep_tiles8", "match_mmt4d_f32_deep_tiles16"];
        let avx512 = ["match_qlinear_tiled_rows_avx512"];
        for bits in [None, Some(128), Some(512)] {
            let spec = llvm_cpu_tuning_spec(bits);
            assert!(base.iter().all(|m| spec.contains(&entry(m))), "{bits:?}");
            assert!(!spec.contains("mmt4d_f32_deep"), "{bits:?}: IREE's AVX-512 defaults for these differ");
            assert_eq!(spec.contains("_avx512"), bits == Some(512), "{bits:?}");
        }
        // AVX-512's come first: where they and every target's both match, theirs win.
        let spec = llvm_cpu_tuning_spec(Some(512));
        let at = |m: &str| spec.find(&entry(m)).unwrap_or_else(|| panic!("{m} listed"));
        assert!(at(avx512[0]) < at(base[0]), "AVX-512's first");
        assert_eq!(spec.matches(" -> @apply_op_config").count(), base.len() + avx512.len());
        assert_eq!(spec.matches("transform.named_sequence @match_").count(), base.len() + avx512.len());
        let spec = llvm_cpu_tuning_spec(Some(256));
        let at = |m: &str| spec.find(&entry(m)).unwrap_or_else(|| panic!("{m} listed"));
        assert!(at(base[base.len() - 1]) < at(avx2[0]) && at(avx2[0]) < at(avx2[1]), "in order");
        // Every matcher defined is tried, and nothing else is.
        assert_eq!(spec.matches(" -> @apply_op_config").count(), base.len() + avx2.len());
        assert_eq!(spec.matches("transform.named_sequence @match_").count(), base.len() + avx2.len());
        assert!(Target::host_cpu().tuning_spec().is_some() && Target::Cuda.tuning_spec().is_none(), "CPU only");
    }

    #[test]
    fn a_modules_flag_replaces_the_targets_for_the_same_option() {
        let target = Target::host_cpu().flags();
        assert!(target.contains(&"--iree-llvmcpu-enable-ukernels=none".to_owned()));
        let extra =
            ["--iree-llvmcpu-enable-ukernels=mmt4d".to_owned(), "--iree-opt-const-expr-hoisting=false".to_owned()];
        let kept = without_replaced(target.clone(), &extra);
        assert_eq!(kept.len(), target.len() - 1, "{kept:?}");
        assert!(!kept.iter().any(|f| f.starts_with("--iree-llvmcpu-enable-ukernels")), "{kept:?}");
        assert_eq!(without_replaced(target.clone(), &[]), target);
    }

    #[test]
    fn a_missing_wheel_says_where_it_looked_and_what_to_do() {
        let empty = std::env::temp_dir().join("mlxcel-no-such-venv");
        let err = find_library(&[Candidate::Venv(empty.clone())]).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&empty.display().to_string()), "{text}");
        assert!(text.contains("tools/dev/setup.sh") && text.contains("iree-base-compiler==3.13.0"), "{text}");
        let explicit = PathBuf::from("/opt/iree/libIREECompiler.so");
        let found = find_library(&[Candidate::Explicit(explicit.clone()), Candidate::Venv(empty)]).unwrap();
        assert_eq!(found, explicit);
    }

    #[test]
    fn a_library_that_is_not_the_compiler_is_a_clear_error() {
        let err = Compiler::load(Path::new("/nonexistent/libIREECompiler.so")).unwrap_err();
        assert!(matches!(err, Error::CompilerLoad { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/libIREECompiler.so"), "{err}");
    }
}
