//! `mlxcel-host`: the command-line entry point. Thin glue over the library
//! crates; every subcommand lives in its own module.

#![forbid(unsafe_code)]

mod encoder_cache;
mod exec;
mod generate;
mod layout;
mod multimodal;
mod plugins;
mod serve;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Serves vision-language models compiled from StableHLO by IREE.
#[derive(Debug, Parser)]
#[command(name = "mlxcel-host", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Compile and run the bundled attention program, and check it against
    /// a reference computed on the host.
    Demo(exec::DeviceArgs),
    /// Compile a StableHLO/MLIR file and run one of its functions.
    Run {
        /// The MLIR file.
        mlir: PathBuf,
        /// `module.function` to call (default: the only export).
        #[arg(long)]
        function: Option<String>,
        /// Inputs in iree-run-module form: `2x3xf32=1 2 3 4 5 6`, `i32=7`.
        #[arg(long = "input")]
        inputs: Vec<String>,
        /// A checkpoint (directory or .safetensors) serving `model` parameters.
        #[arg(long)]
        params: Option<PathBuf>,
        #[command(flatten)]
        device: exec::DeviceArgs,
    },
    /// Generate text from a prompt with a checkpoint's chat template and decoder.
    Generate(Box<generate::GenerateArgs>),
    /// Serve a checkpoint over an OpenAI-compatible HTTP API (chat completions, streaming,
    /// images through the family plugin).
    Serve(Box<serve::ServeArgs>),
    /// Build ahead everything `serve` with the same flags compiles (the decoder bundle, every
    /// encoder bucket) into the compile cache, for a server that mounts it read-only.
    Compile(Box<serve::ServeArgs>),
    /// Family plugins: list a plugin directory, inspect a manifest, verify a plugin against a
    /// fixture's goldens.
    Plugins {
        #[command(subcommand)]
        command: plugins::PluginsCommand,
    },
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("MLXCEL_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Demo(device) => exec::demo(&device),
        Command::Run { mlir, function, inputs, params, device } => {
            exec::run_file(&mlir, function.as_deref(), &inputs, params.as_deref(), &device)
        }
        Command::Generate(args) => generate::generate(&args),
        Command::Serve(args) => serve::serve(*args),
        Command::Compile(args) => serve::compile(*args),
        Command::Plugins { command } => plugins::run(&command),
    }
}
