//! `serve`: an OpenAI-compatible HTTP server over one checkpoint. The engine thread owns the
//! decoder bundle (compiled for `--slots` slots of `--context` rows) and the family plugin's
//! encoders; HTTP requests are prepared on the blocking pool and streamed back from the engine.

pub(crate) mod api;
mod engine;
mod fetch;
mod http;
mod media_bytes;
mod metrics;
mod request;
mod tools;
mod weights;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use mlxcel_host::decoder::{BundleShape, Decoder, DecoderOptions};
use mlxcel_host::engine::SchedulerConfig;
/// The text module as `request.rs` names it (`super::text`), which `fuzz/` compiles beside it.
use mlxcel_host::text;
use mlxcel_host::text::{ChatTemplate, Tokenizer, stop_tokens};
use mlxcel_plugin_api::QualificationPolicy;
use mlxcel_shim::{Compiler, Device, Driver, Target};

use crate::exec::{Compute, DeviceArgs};
use crate::multimodal::{Encoders, MAX_INPUT_PIXELS, MediaModel, encoder_compute};
use crate::plugins::PluginDir;

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// The checkpoint directory (config.json, *.safetensors, tokenizer.json, chat template).
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    plugins: PluginDir,
    /// The model name clients send [default: the checkpoint directory's name].
    #[arg(long)]
    served_model_name: Option<String>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Requests decoded together (KV slots of the compiled bundle).
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// Context capacity per slot in tokens (prompt plus generated). Prompt chunks and decode
    /// steps attend over the narrowest key window that holds their rows (quarters of it, down to
    /// 256 rows), so a long context costs memory and compile time, not the prompts and steps of
    /// short conversations.
    #[arg(long, default_value_t = 2048)]
    context: usize,
    /// Prefill chunk of the compiled bundle in tokens (the context must be a multiple).
    #[arg(long, default_value_t = 64)]
    chunk: usize,
    /// Requests that may wait for a slot; past it, HTTP 429 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Serve capabilities the plugin's manifest does not mark qualified (experimental ones).
    #[arg(long)]
    allow_unqualified: bool,
    /// The text decoder's activations: f32 (for f32 and bf16 checkpoints alike) or bf16
    /// (experimental, needs --allow-unqualified; images where the family's plugin offers a bf16
    /// encoder).
    #[arg(long, value_enum, default_value = "f32")]
    compute: Compute,
    /// Largest request body in bytes (images come inline as data URLs).
    #[arg(long, default_value_t = 32 << 20)]
    max_body_bytes: usize,
    /// Largest image, in pixels declared by its header, decoded at all (decompression bombs are
    /// refused before any allocation).
    #[arg(long, default_value_t = MAX_INPUT_PIXELS)]
    max_image_pixels: u64,
    /// Fetch http(s) image URLs (refused otherwise): public addresses only, every redirect
    /// re-checked, capped in bytes and time.
    #[arg(long)]
    allow_remote_images: bool,
    /// Largest remote image in bytes.
    #[arg(long, default_value_t = 20 << 20)]
    remote_image_max_bytes: u64,
    /// Seconds a remote image fetch may take in all.
    #[arg(long, default_value_t = 10)]
    remote_image_timeout: u64,
    /// Also fetch from loopback, private and link-local addresses (the server's own network).
    /// Only for a server no untrusted client can reach.
    #[arg(long, requires = "allow_remote_images")]
    allow_private_image_hosts: bool,
    /// Megabytes of media that requests in flight may hold (encoded files, preprocessed tensors,
    /// encoder features, until merged into their prompts): a request whose media does not fit
    /// beside the others' is refused with 429 and Retry-After.
    #[arg(long, default_value_t = 1024.0)]
    max_media_mb: f64,
    /// Megabytes of encoder outputs kept for images sent again (a conversation resends its
    /// image every turn): a hit skips decoding, preprocessing and the encoder. 0 keeps none.
    #[arg(long, default_value_t = 128)]
    encoder_cache_mb: u64,
    /// Prefill calls (of --chunk tokens) run between two decode steps while streams decode: a
    /// long prompt or an image's rows enter a few calls at a time, so the running streams never
    /// wait for a whole prompt.
    #[arg(long, default_value_t = 1)]
    prefill_chunks_per_step: usize,
    /// Prefill every prompt whole: no request keeps the rows an earlier one left in its slot
    /// (the prefix cache; on by default).
    #[arg(long)]
    no_prefix_cache: bool,
    /// Requests prepared at once (template, tokenizer, image decoding and preprocessing).
    #[arg(long, default_value_t = 2)]
    prepare_workers: usize,
    /// Seconds one request's preparation may take (template, tokenizer, image decoding and the
    /// plugin's preprocessing): past it the request gets a 500 and the server goes on without
    /// waiting for it.
    #[arg(long, default_value_t = 60.0)]
    prepare_deadline: f64,
    /// Seconds in-flight requests may still run after a shutdown signal before they are
    /// cancelled.
    #[arg(long, default_value_t = 30)]
    shutdown_timeout: u64,
    /// The API key clients must send (`Authorization: Bearer <key>`, as OpenAI clients do);
    /// without one the server asks for none. Prefer the environment variable: a command line
    /// is visible to every user of the machine.
    #[arg(long, env = "MLXCEL_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Compile (or load from the compile cache) every encoder bucket before listening, so that
    /// no image request waits for a compile and a read-only cache missing one fails at start.
    #[arg(long)]
    warm_encoders: bool,
    /// Serve /metrics without the API key (for a scraper on a trusted network).
    #[arg(long, requires = "api_key")]
    metrics_without_key: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

/// `mlxcel-host compile`: everything `serve` with the same flags compiles (the decoder bundle
/// and every encoder bucket), built into the compile cache; then it exits. A cache built so can
/// be mounted read-only (`--compile-cache-read-only`).
pub(crate) fn compile(args: ServeArgs) -> Result<()> {
    run(args, true)
}

pub(crate) fn serve(args: ServeArgs) -> Result<()> {
    run(args, false)
}

fn run(args: ServeArgs, compile_only: bool) -> Result<()> {
    let dir = args.model.clone();
    if !dir.is_dir() {
        bail!("the model directory {} does not exist", dir.display());
    }
    if args.slots == 0 || args.queue == 0 || args.prepare_workers == 0 {
        bail!("--slots, --queue and --prepare-workers must be at least 1");
    }
    let prepare_deadline = Duration::try_from_secs_f64(args.prepare_deadline)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("--prepare-deadline {} is not a positive number of seconds", args.prepare_deadline))?;
    if !(args.max_media_mb.is_finite() && args.max_media_mb > 0.0) {
        bail!("--max-media-mb {} is not a positive number of megabytes", args.max_media_mb);
    }
    if args.api_key.as_deref().is_some_and(|k| k.trim().is_empty() || k.trim() != k) {
        bail!("the API key (--api-key or MLXCEL_API_KEY) is empty or starts or ends with a space");
    }
    let driver: Driver = args.device.driver.parse()?;
    let model_id = match &args.served_model_name {
        Some(name) => name.clone(),
        None => dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .context("the model directory has no name; pass --served-model-name")?,
    };
    // Stamped before anything reads them: a file changed from here on is seen.
    let weights = weights::WeightFiles::take(&dir)?;
    let tokenizer = Tokenizer::load(&dir)?;
    let template = ChatTemplate::load(&dir).context("a chat server needs the checkpoint's chat template")?;
    let stops = stop_tokens(&dir, &tokenizer)?;
    let policy = QualificationPolicy { allow_unqualified: args.allow_unqualified };

    // The plugin set lives as long as the process (plugin libraries are never unloaded), so
    // requests borrow it for 'static.
    let contract = args.compute.contract(args.allow_unqualified, &args.device.target_cpu)?;
    let compute = encoder_compute(contract.as_ref());
    let media: Option<&'static MediaModel<'static>> = match &args.plugins.dir() {
        None => None,
        Some(_) => {
            let (plugin_dir, set) = args.plugins.scan()?;
            let set: &'static _ = Box::leak(Box::new(set));
            match MediaModel::open(set, &plugin_dir, &dir) {
                // A plugin accepts the checkpoint: it must fit the plugin's encoder, or the server
                // would advertise images it cannot encode.
                Ok(media) => {
                    media.check_checkpoint(&dir)?;
                    media.check_compute(compute)?;
                    let media = media.with_encoder_cache(args.encoder_cache_mb.saturating_mul(1 << 20));
                    Some(Box::leak(Box::new(media)))
                }
                Err(e) => {
                    eprintln!("serving text only: {e:#}");
                    None
                }
            }
        }
    };

    let remote = args
        .allow_remote_images
        .then(|| {
            fetch::RemoteImages::new(
                args.remote_image_max_bytes,
                Duration::from_secs(args.remote_image_timeout),
                args.allow_private_image_hosts,
            )
        })
        .transpose()?;
    let kv_rows = (args.slots * args.context) as u64;
    let media_bytes = media_bytes::MediaBytes::new((args.max_media_mb * f64::from(1 << 20)) as u64);
    let metrics =
        Arc::new(metrics::Metrics::new(media.and_then(|m| m.encoder_cache()), Arc::clone(&media_bytes), kv_rows));
    let device_args: &'static DeviceArgs = Box::leak(Box::new(args.device.clone()));
    let shape = BundleShape { chunk: args.chunk, capacity: args.context, slots: args.slots };
    let load_dir = dir.clone();
    let with_encoders = media.is_some();
    let spec = media.map(|m| m.decoder_spec()).transpose()?.flatten();
    // The logits' width, which bounds `logit_bias` ids (it can exceed the tokenizer's vocabulary).
    let vocab = mlxcel_decoder::TextConfig::load(&dir, spec.as_ref())
        .with_context(|| format!("reading the text config of {}", dir.display()))?
        .vocab;
    let text = Arc::new(http::TextSide { tokenizer, template, stop_tokens: stops, vocab, grammar: OnceLock::new() });
    let warm = args.warm_encoders || compile_only;
    let loader: engine::Loader = Box::new(move || {
        let compiler = Compiler::locate()?;
        let cache = device_args.compile_cache();
        let device = Device::new(driver)?;
        let options = DecoderOptions {
            shape,
            contract,
            target: Target::Cpu { cpu: device_args.target_cpu.clone() },
            spec: spec.clone(),
        };
        let decoder = Decoder::load(&load_dir, options, &device, &compiler, &cache)
            .with_context(|| format!("loading the decoder of {}", load_dir.display()))?;
        let mut encoders = with_encoders.then(|| Encoders::new(&load_dir, device_args, contract.as_ref()));
        if let (true, Some(media), Some(encoders)) = (warm, media, encoders.as_mut()) {
            let buckets = media.warm(encoders).context("compiling the encoders")?;
            eprintln!("encoders ready: {buckets} bucket(s)");
        }
        Ok((decoder, encoders))
    });
    if compile_only {
        let started = Instant::now();
        loader()?;
        let cache = args.device.compile_cache();
        eprintln!(
            "compiled for {} ({} slots of {} tokens) in {:.1} s into {}",
            dir.display(),
            args.slots,
            args.context,
            started.elapsed().as_secs_f64(),
            cache.dir().display()
        );
        return Ok(());
    }
    let scheduler = SchedulerConfig {
        slots: args.slots,
        capacity: args.context,
        queue_bound: args.queue,
        prefills_per_step: 1,
        chunk: args.chunk,
        prefill_chunks_per_step: args.prefill_chunks_per_step,
        prefix_cache: !args.no_prefix_cache,
        retry_after: Duration::from_secs(1),
    };
    let started = Instant::now();
    eprintln!("loading {} ({} slots of {} tokens)...", dir.display(), args.slots, args.context);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Signal handlers go in before anything loads the IREE compiler: LLVM installs its own for
    // SIGINT and SIGTERM on first use, restoring the previous handler and re-raising when one
    // comes. Installed after it, ours would chain into LLVM's, which kills the process instead
    // of draining; installed first, LLVM's hands the signal back to ours.
    let signals = {
        let _runtime = runtime.enter();
        Signals::install()?
    };
    let (engine, engine_thread) = engine::start(loader, scheduler, Arc::clone(&metrics))?;
    eprintln!("loaded in {:.1} s", started.elapsed().as_secs_f64());

    let draining = Arc::new(AtomicBool::new(false));
    let state = Arc::new(http::AppState {
        model_id: model_id.clone(),
        engine: engine.clone(),
        metrics,
        text,
        media,
        policy,
        max_input_pixels: args.max_image_pixels,
        remote,
        preparing: Arc::new(tokio::sync::Semaphore::new(args.prepare_workers)),
        prepare_workers: args.prepare_workers,
        media_bytes,
        prepare_deadline,
        draining: Arc::clone(&draining),
        started: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        access: http::Access::new(args.api_key.as_deref(), !args.metrics_without_key),
        weights,
    });
    let timeout = Duration::from_secs(args.shutdown_timeout);
    let keyed = args.api_key.is_some();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        let addr: SocketAddr = listener.local_addr()?;
        announce(addr, &model_id, media.is_some(), keyed);
        let shutdown = async move {
            signals.wait().await;
            eprintln!("shutting down: finishing in-flight requests (at most {} s)", timeout.as_secs());
            draining.store(true, Ordering::Relaxed);
            engine.drain(Instant::now() + timeout);
        };
        axum::serve(listener, http::router(state, args.max_body_bytes))
            .with_graceful_shutdown(shutdown)
            .await
            .context("serving")
    })?;
    let _ = engine_thread.join();
    eprintln!("stopped");
    Ok(())
}

/// Prints where the server listens and a request to paste.
fn announce(addr: SocketAddr, model: &str, images: bool, keyed: bool) {
    println!("listening on http://{addr}");
    // The key itself is never printed: the requests read it from the environment.
    let auth = if keyed { " -H \"Authorization: Bearer $MLXCEL_API_KEY\"" } else { "" };
    println!("  models:  curl -s http://{addr}/v1/models{auth}");
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 16,
        "temperature": 0,
    });
    println!(
        "  chat:    curl -s http://{addr}/v1/chat/completions{auth} -H 'Content-Type: application/json' -d '{body}'"
    );
    if images {
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,%s"}},
                {"type": "text", "text": "Describe this image."},
            ]}],
            "max_tokens": 16,
            "temperature": 0,
        });
        println!(
            "  image:   printf '{body}' \"$(base64 -w0 path/to/image.png)\" | curl -s http://{addr}/v1/chat/completions{auth} -H 'Content-Type: application/json' -d @-"
        );
    }
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
}

/// SIGINT and SIGTERM, registered when installed (not on first poll).
struct Signals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                interrupt: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
                terminate: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    async fn wait(mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}
