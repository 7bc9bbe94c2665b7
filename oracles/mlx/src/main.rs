//! MLX micro-oracles: identical seeded operands through an MLX operation (mlx-rs on the mlx-cpu
//! wheel) and through the same operation as mlxcel-emit writes it, compiled and run by IREE
//! through mlxcel-shim; each case states the claim it reaches. Exits non-zero when a case falls
//! below its stated claim (an exact case stops being exact, a closeness bound is exceeded) or a
//! mutant of a case is not caught.
#![deny(unsafe_code)]

mod cases;
mod compare;
mod iree;
mod mlx;
mod mlx_link;
mod reference;
mod rng;

use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("mlx-oracles: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<bool> {
    let iree = iree::Iree::new()?;
    for line in header(&iree) {
        println!("{line}");
    }
    let mut report = cases::Report::default();
    cases::quantized(&iree, &mut report)?;
    cases::dense(&iree, &mut report)?;
    cases::norms(&iree, &mut report)?;
    cases::activations(&iree, &mut report)?;
    cases::residual(&iree, &mut report)?;
    cases::attention(&iree, &mut report)?;
    cases::scan(&iree, &mut report)?;
    cases::conv(&iree, &mut report)?;

    println!();
    println!("cases:");
    for c in &report.cases {
        let verdict = if c.outcome.passed { "ok  " } else { "FAIL" };
        println!("{verdict} {}: {}", c.name, c.outcome.describe());
    }
    for n in &report.notes {
        println!("note: {n}");
    }
    println!();
    println!("mutants (each must fail its case's claim):");
    for m in &report.mutations {
        let verdict = if m.detected { "caught" } else { "MISSED" };
        println!("{verdict} {}: {}", m.name, m.detail);
    }
    let failed = report.cases.iter().filter(|c| !c.outcome.passed).count();
    let missed = report.mutations.iter().filter(|m| !m.detected).count();
    let by_level = |l: compare::Level| report.cases.iter().filter(|c| c.outcome.reached == l).count();
    println!();
    println!(
        "summary: {} cases: {} exact production-MLX, {} exact canonical-decomposition, {} closeness; {} below their claim; {} of {} mutants caught",
        report.cases.len(),
        by_level(compare::Level::Production),
        by_level(compare::Level::Canonical),
        by_level(compare::Level::Close),
        failed,
        report.mutations.len() - missed,
        report.mutations.len()
    );
    Ok(failed == 0 && missed == 0)
}

/// Backend identity: MLX (library, bindings, wheel), IREE (compiler revision, target), CPU.
fn header(iree: &iree::Iree) -> Vec<String> {
    let lock = include_str!("../Cargo.lock");
    let locked = |name: &str| {
        let mut lines = lock.lines();
        while let Some(l) = lines.next() {
            if l == format!("name = \"{name}\"") {
                return lines.next().and_then(|v| v.strip_prefix("version = ")).map(|v| v.trim_matches('"').to_owned());
            }
        }
        None
    };
    let wheel = std::fs::read_dir(concat!(env!("MLX_WHEEL_PREFIX"), "/.."))
        .ok()
        .and_then(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .find_map(|n| n.strip_prefix("mlx_cpu-")?.strip_suffix(".dist-info").map(str::to_owned))
        })
        .unwrap_or_else(|| "unknown".into());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']))
        .unwrap_or("unknown");
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    let wanted = [
        "fma",
        "f16c",
        "avx2",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    ];
    let features: Vec<String> =
        wanted.iter().map(|f| format!("{}{f}", if flags.contains(f) { "+" } else { "-" })).collect();
    vec![
        "MLX micro-oracles".to_owned(),
        format!(
            "MLX: libmlx {} (wheel mlx-cpu {wheel}), mlx-rs {}, mlx-sys {}, CPU stream",
            mlx_link::mlx_version().unwrap_or_else(|| "unknown".into()),
            locked("mlx-rs").unwrap_or_default(),
            locked("mlx-sys").unwrap_or_default()
        ),
        format!(
            "IREE: compiler {} (runtime {}), target {}, driver local-sync",
            iree.compiler.revision(),
            mlxcel_shim::IREE_VERSION,
            iree.target.fingerprint()
        ),
        format!("CPU: {model}; {}", features.join(" ")),
        format!("contract: mlxcel-emit {}", mlxcel_emit::NumericContract::f32().fingerprint()),
    ]
}
