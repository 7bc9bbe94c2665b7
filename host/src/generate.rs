//! `generate`: one prompt through a checkpoint's chat template, tokenizer and
//! decoder bundle, streamed to stdout (or one JSON object with `--json`).

use std::{
    io::{IsTerminal, Write},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use mlxcel_decoder::DecoderSpec;
use mlxcel_emit::NumericContract;
use mlxcel_host::{
    decoder::{BundleShape, Decoder, DecoderOptions, Logits},
    sampling::{History, Sampler, SamplingParams},
    text::{ChatTemplate, Content, Detokenizer, Message, Part, Tokenizer, stop_tokens},
};
use mlxcel_plugin_api::QualificationPolicy;
use mlxcel_shim::{CacheOutcome, Compiler, Device, Driver, Target};

use crate::exec::{Compute, DeviceArgs};
use crate::multimodal::{Encoders, MediaModel, MediaRequest, encoder_compute};
use crate::plugins::PluginDir;

/// What to generate from, and how.
#[derive(Debug, clap::Args)]
pub(crate) struct GenerateArgs {
    /// The checkpoint directory (config.json, *.safetensors, tokenizer.json, ...).
    #[arg(long)]
    model: PathBuf,
    /// The user message (or, with --raw, the whole prompt).
    #[arg(long)]
    prompt: String,
    /// An image (png, jpeg, webp or gif's first frame; its EXIF orientation applied) placed before
    /// the prompt in the user message (repeatable, in order); the checkpoint's family plugin
    /// preprocesses and encodes it.
    #[arg(long = "image", value_name = "FILE", conflicts_with = "raw")]
    images: Vec<PathBuf>,
    /// An audio clip (WAV) placed after the images, before the prompt, in the user message
    /// (repeatable, in order); the checkpoint's family plugin decodes, preprocesses and encodes
    /// it.
    #[arg(long = "audio", value_name = "FILE", conflicts_with = "raw")]
    audio: Vec<PathBuf>,
    /// Serve capabilities the plugin's manifest does not mark qualified (experimental ones).
    #[arg(long)]
    allow_unqualified: bool,
    /// The text decoder's activations: f32 (for f32 and bf16 checkpoints alike) or bf16
    /// (experimental, needs --allow-unqualified; images where the family's plugin offers a bf16
    /// encoder).
    #[arg(long, value_enum, default_value = "f32")]
    compute: Compute,
    #[command(flatten)]
    plugins: PluginDir,
    /// A system message placed before the user message.
    #[arg(long, conflicts_with = "raw")]
    system: Option<String>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// 0 is greedy; higher values sample more freely.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    temperature: f32,
    /// Sample among the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample among the most likely tokens covering this probability (1: all).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    top_p: f32,
    /// Drop tokens less likely than this fraction of the most likely one (0: none).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    min_p: f32,
    /// Penalise tokens of the prompt and output: positive logits divided by it, others multiplied (1: off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Subtract this times the number of times a token was generated from its logit (-2 to 2; 0: off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Subtract this from the logit of every token generated at least once (-2 to 2; 0: off).
    #[arg(long, allow_negative_numbers = true, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Seed for sampling (default: a fresh one, reported with --json).
    #[arg(long)]
    seed: Option<u64>,
    /// Print one JSON object (token ids, text, finish reason, timings) instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Tokenize the prompt as-is: no chat template, no special tokens added.
    #[arg(long)]
    raw: bool,
    /// Keep going past end-of-sequence tokens (for parity runs against references that do).
    #[arg(long)]
    ignore_eos: bool,
    /// Context capacity of the compiled bundle in tokens (prompt plus generated).
    #[arg(long, default_value_t = 2048)]
    capacity: usize,
    /// Prefill chunk of the compiled bundle in tokens (the capacity must be a multiple).
    #[arg(long, default_value_t = 64)]
    chunk: usize,
    #[command(flatten)]
    device: DeviceArgs,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
enum Finish {
    /// A stop token came.
    Stop,
    /// `--max-tokens` were generated.
    Length,
    /// The context capacity is full.
    Capacity,
}

#[derive(Debug, serde::Serialize)]
struct Timings {
    load_s: f64,
    prefill_s: f64,
    decode_s: f64,
    prompt_tokens_per_s: f64,
    decode_tokens_per_s: f64,
}

#[derive(Debug, serde::Serialize)]
struct Report<'a> {
    model: &'a std::path::Path,
    prompt: &'a str,
    #[serde(skip_serializing_if = "<[PathBuf]>::is_empty")]
    images: &'a [PathBuf],
    audio: &'a [PathBuf],
    prompt_ids: &'a [u32],
    tokens: &'a [u32],
    text: &'a str,
    finish_reason: Finish,
    /// The stop token that ended generation (not part of `tokens`).
    stop_token: Option<u32>,
    sampling: &'a SamplingParams,
    seed: u64,
    compile_cache: &'static str,
    /// The decoder's weights as stored and its activations (`bf16` and `f32`: bf16 storage,
    /// f32 compute; `affine bits=4 group_size=64 scales=f32, f32`: MLX's 4-bit linears, the
    /// rest f32).
    weights: String,
    activations: String,
    timings: Timings,
}

pub(crate) fn generate(args: &GenerateArgs) -> Result<()> {
    match run(args) {
        // The reader went away (`generate ... | head`): nothing left to do.
        Err(e) if e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(is_broken_pipe)) => Ok(()),
        other => other,
    }
}

fn is_broken_pipe(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

fn run(args: &GenerateArgs) -> Result<()> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        frequency_penalty: args.frequency_penalty,
        presence_penalty: args.presence_penalty,
    };
    let mut sampler = Sampler::new(params, args.seed).context("invalid sampling parameters")?;
    let with_media = !args.images.is_empty() || !args.audio.is_empty();
    let contract = args.compute.contract(args.allow_unqualified, &args.device.target_cpu)?;
    if args.max_tokens == 0 {
        bail!("--max-tokens must be at least 1");
    }
    let driver: Driver = args.device.driver.parse()?;
    let dir = &args.model;
    if !dir.is_dir() {
        bail!("the model directory {} does not exist", dir.display());
    }

    // Media first: the plugin, its capability gate and every image are checked before any
    // compile.
    let plugins;
    let (mut media, spec, start) = if !with_media {
        // A text prompt still takes the decoder (and the prompt start) the checkpoint's plugin
        // declares, when a plugin directory is given and one accepts it.
        let (spec, start) = match args.plugins.dir() {
            None => (None, None),
            Some(_) => {
                plugins = args.plugins.scan()?;
                match MediaModel::open(&plugins.1, &plugins.0, dir) {
                    Ok(model) => (model.decoder_spec()?, model.prompt_start()),
                    Err(_) => (None, None),
                }
            }
        };
        (None, spec, start)
    } else {
        plugins = args.plugins.scan()?;
        let policy = QualificationPolicy { allow_unqualified: args.allow_unqualified };
        let compute = encoder_compute(contract.as_ref());
        let media = MediaRequest::open(&plugins.1, &plugins.0, dir, (&args.images, &args.audio), policy, compute)?;
        let spec = media.decoder_spec()?;
        (Some(media), spec, None)
    };

    let tokenizer = Tokenizer::load(dir)?;
    let prompt = if args.raw {
        args.prompt.clone()
    } else {
        let template = ChatTemplate::load(dir).context("pass --raw to use the prompt without a chat template")?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(Message::new("system", system));
        }
        if !with_media {
            messages.push(Message::new("user", &args.prompt));
        } else {
            let images = args.images.iter().map(|_| "image");
            let clips = args.audio.iter().map(|_| "audio");
            let mut parts: Vec<Part> =
                images.chain(clips).map(|kind| Part { kind: kind.to_owned(), text: None }).collect();
            parts.push(Part { kind: "text".to_owned(), text: Some(args.prompt.clone()) });
            messages.push(Message {
                role: "user".to_owned(),
                content: Content::Parts(parts),
                tool_calls: None,
                tool_call_id: None,
            });
        }
        template.render(&messages, true)?
    };
    let ids = match &mut media {
        None => crate::multimodal::started(tokenizer.encode(&prompt, false)?, start),
        Some(media) => media.expand(&prompt, &tokenizer)?,
    };
    if ids.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    // The last generated token is never fed back, so the prompt needs one free row.
    if ids.len() >= args.capacity {
        bail!(
            "the prompt is {} tokens and the context capacity is {}: raise --capacity above {}",
            ids.len(),
            args.capacity,
            ids.len()
        );
    }
    let stops = if args.ignore_eos { Vec::new() } else { stop_tokens(dir, &tokenizer)? };

    let started = Instant::now();
    let mut decoder = load(args, driver, spec, contract)?;
    let load_s = started.elapsed().as_secs_f64();
    let cached = match decoder.cache_outcome() {
        CacheOutcome::Hit => "hit",
        CacheOutcome::Compiled { .. } => "compiled",
    };
    if !args.json {
        eprintln!("{}: loaded in {load_s:.2} s (compile cache: {cached})", dir.display());
    }

    let out = std::io::stdout();
    let mut out = out.lock();
    let mut detok = Detokenizer::new(&ids, true);
    let mut text = String::new();
    let mut emit = |piece: &str, text: &mut String| -> Result<()> {
        text.push_str(piece);
        if !args.json && !piece.is_empty() {
            out.write_all(piece.as_bytes()).and_then(|()| out.flush()).context("writing to stdout")?;
        }
        Ok(())
    };

    let slot = 0;
    let started = Instant::now();
    let logits = match &mut media {
        None => decoder.prefill_tokens(slot, &ids, Logits::Last).context("prefill")?,
        Some(media) => {
            media.encode(&mut Encoders::new(dir, &args.device, contract.as_ref()))?;
            let (embeddings, positions, extras, _) = media.prefill_input(&mut decoder, &ids)?;
            decoder.prefill_embeddings(slot, &embeddings, &positions, &extras, Logits::Last).context("prefill")?
        }
    };
    let vocab = decoder.config().vocab;
    // The penalties see the prompt ids (media placeholders expanded) and the tokens generated.
    let history = History { prompt: &ids, generated: &[] };
    let mut next = sampler.sample(&logits[logits.len() - vocab..], history).context("sampling")?.token;
    let prefill = started.elapsed();

    let started = Instant::now();
    let mut tokens = Vec::new();
    let mut stop_token = None;
    let mut steps = 0;
    let finish = loop {
        if stops.contains(&next) {
            stop_token = Some(next);
            break Finish::Stop;
        }
        tokens.push(next);
        let piece = detok.push(&tokenizer, next)?;
        emit(&piece, &mut text)?;
        if tokens.len() == args.max_tokens {
            break Finish::Length;
        }
        if decoder.len(slot) >= args.capacity {
            break Finish::Capacity;
        }
        let logits = decoder.decode(&[(slot, next)]).context("decode")?;
        steps += 1;
        let row = logits.first().context("the decoder returned no logits")?;
        let history = History { prompt: &ids, generated: &tokens };
        next = sampler.sample(row, history).context("sampling")?.token;
    };
    let decode = started.elapsed();
    let rest = detok.finish(&tokenizer)?;
    emit(&rest, &mut text)?;
    decoder.release(slot)?;

    let timings = Timings {
        load_s,
        prefill_s: prefill.as_secs_f64(),
        decode_s: decode.as_secs_f64(),
        prompt_tokens_per_s: rate(ids.len(), prefill),
        decode_tokens_per_s: rate(steps, decode),
    };
    if args.json {
        let report = Report {
            model: dir,
            prompt: &prompt,
            images: &args.images,
            audio: &args.audio,
            prompt_ids: &ids,
            tokens: &tokens,
            text: &text,
            finish_reason: finish,
            stop_token,
            sampling: sampler.params(),
            seed: sampler.seed(),
            compile_cache: cached,
            weights: decoder.weight_forms().join(", "),
            activations: decoder.contract().activations.to_string(),
            timings,
        };
        writeln!(out, "{}", serde_json::to_string(&report)?).context("writing to stdout")?;
    } else {
        writeln!(out).context("writing to stdout")?;
        eprintln!(
            "prompt: {} tokens, {:.1} tokens/s; generated: {} tokens, {:.1} tokens/s; finish: {}",
            ids.len(),
            timings.prompt_tokens_per_s,
            tokens.len(),
            timings.decode_tokens_per_s,
            serde_json::to_value(finish)?.as_str().unwrap_or_default()
        );
    }
    Ok(())
}

/// Compiles (or fetches) and loads the one-slot bundle, with a spinner on a terminal.
fn load(
    args: &GenerateArgs,
    driver: Driver,
    spec: Option<DecoderSpec>,
    contract: Option<NumericContract>,
) -> Result<Decoder> {
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_message(format!("compiling and loading {}", args.model.display()));
        bar.enable_steady_tick(Duration::from_millis(100));
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let loaded = (|| {
        let compiler = Compiler::locate()?;
        let cache = args.device.compile_cache();
        let device = Device::new(driver)?;
        let options = DecoderOptions {
            shape: BundleShape { chunk: args.chunk, capacity: args.capacity, slots: 1 },
            contract,
            target: Target::Cpu { cpu: args.device.target_cpu.clone() },
            spec,
        };
        anyhow::Ok(Decoder::load(&args.model, options, &device, &compiler, &cache)?)
    })();
    bar.finish_and_clear();
    loaded.with_context(|| format!("loading the decoder of {}", args.model.display()))
}

fn rate(n: usize, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 { n as f64 / s } else { 0.0 }
}
