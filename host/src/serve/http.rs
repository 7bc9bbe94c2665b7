//! The HTTP routes: `POST /v1/chat/completions` and `/v1/completions` (whole or streamed as
//! server-sent events),
//! `GET /v1/models`, the probes `/live`, `/ready` (and `/health`, the same) and `/metrics`.
//!
//! With an API key set, every route but the probes (and `/metrics` when left open) asks for it
//! as OpenAI clients send it, `Authorization: Bearer <key>`, and answers 401 otherwise.
//!
//! A request is checked and prepared (template, tokens, images decoded and preprocessed) on the
//! blocking pool, bounded by a semaphore, then handed to the engine thread; its events come
//! back on a channel whose receiver the request owns. Dropping that receiver (client gone, stop
//! string matched) cancels the request in the engine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use mlxcel_host::engine::{FinishReason, SubmitError};
use mlxcel_host::grammar::{Constraint, Grammar, Vocabulary};
use mlxcel_host::sampling::{Sampler, SamplingParams, TokenLogprobs};
use mlxcel_host::text::{ChatTemplate, Detokenizer, Message, StopStrings, Tokenizer};
use mlxcel_plugin_api::{Capability, Error as PluginApiError, Modality, QualificationPolicy, Status};
use sha2::{Digest as _, Sha256};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use super::api::{
    ApiError, AssistantMessage, ChatChunk, ChatCompletion, ChatRequest, Choice, ChunkChoice, Completion,
    CompletionChoice, CompletionLogprobs, CompletionRequest, Delta, FunctionDelta, LogprobsBody, PromptField,
    TokenLogprobBody, ToolCallBody, ToolCallDelta, TopLogprobBody, UsageBody,
};
use super::engine::{EngineHandle, Event, Job, Refusal};
use super::fetch::RemoteImages;
use super::media_bytes::{Held, MediaBytes};
use super::metrics::{Metrics, Open};
use super::request::{self, ImagePart, ImageSource};
use super::tools::{CallScanner, ToolChoice, Tools};
use super::weights::WeightFiles;
use crate::multimodal::{Fault, MediaError, MediaInput, MediaModel, MediaRefusal, MediaRequest};

/// An OpenAI error body with its status, `Retry-After` where there is one, and a closed
/// connection after a body that was not read.
impl IntoResponse for ApiError {
    fn into_response(self) -> axum::response::Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after
            && let Ok(value) = axum::http::HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, value);
        }
        if self.status == StatusCode::PAYLOAD_TOO_LARGE {
            // The rest of the body is never read, so this connection cannot carry another
            // request: without the header a client's pool reused it and its next request met a
            // closed socket ("server disconnected without sending a response").
            response
                .headers_mut()
                .insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
        }
        response
    }
}

/// The checkpoint's text side.
#[derive(Debug)]
pub(crate) struct TextSide {
    pub(crate) tokenizer: Tokenizer,
    pub(crate) template: ChatTemplate,
    /// The checkpoint's end-of-sequence ids.
    pub(crate) stop_tokens: Vec<u32>,
    /// The decoder's logits per row: every token id below it can be biased.
    pub(crate) vocab: usize,
    /// The vocabulary as grammars see it, built by the first constrained request.
    pub(crate) grammar: OnceLock<Result<Vocabulary, String>>,
}

impl TextSide {
    /// A constraint following `grammar` that ends at `ends` (blocking: compiling a schema
    /// takes milliseconds, the first one builds the vocabulary's trie).
    fn constrain(&self, grammar: &Grammar, ends: Vec<u32>, param: &'static str) -> Result<Constraint, ApiError> {
        let vocabulary = self.grammar.get_or_init(|| {
            let end = self.stop_tokens.first().copied().ok_or("the checkpoint names no end-of-sequence token")?;
            Vocabulary::new(&self.tokenizer, end).map_err(|e| e.to_string())
        });
        let vocabulary = vocabulary.as_ref().map_err(|e| {
            ApiError::invalid("unsupported_value", format!("constrained output is not served for this checkpoint: {e}"))
                .param(param)
        })?;
        vocabulary
            .constrain(grammar, ends)
            .map_err(|e| ApiError::invalid("invalid_value", format!("{param}: {e}")).param(param))
    }
}

/// What every route shares.
pub(crate) struct AppState {
    pub(crate) model_id: String,
    pub(crate) engine: EngineHandle,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) text: Arc<TextSide>,
    pub(crate) media: Option<&'static MediaModel<'static>>,
    pub(crate) policy: QualificationPolicy,
    pub(crate) max_input_pixels: u64,
    /// Fetches http(s) image URLs; `None` refuses them.
    pub(crate) remote: Option<RemoteImages>,
    /// Bounds the requests being prepared at once (the preprocessing pool's width).
    pub(crate) preparing: Arc<Semaphore>,
    /// The media bytes requests in flight hold, and the budget that admits them.
    pub(crate) media_bytes: Arc<MediaBytes>,
    /// How many requests may be prepared at once: `preparing`'s permits in all.
    pub(crate) prepare_workers: usize,
    /// How long one request's preparation may take before it is given up.
    pub(crate) prepare_deadline: Duration,
    pub(crate) draining: Arc<AtomicBool>,
    pub(crate) started: u64,
    pub(crate) access: Access,
    /// The weight files as loaded: a change refuses new requests.
    pub(crate) weights: WeightFiles,
}

/// Who may call the server: anyone, or whoever sends its one API key.
pub(crate) struct Access {
    /// sha256 of the key; `None` asks for none. Only the digest is kept and compared, so the
    /// comparison's time says nothing about the key, not even its length.
    key: Option<[u8; 32]>,
    /// `/metrics` asks for the key too (when there is one).
    metrics_need_key: bool,
}

impl Access {
    pub(crate) fn new(key: Option<&str>, metrics_need_key: bool) -> Self {
        Access { key: key.map(|k| Sha256::digest(k.as_bytes()).into()), metrics_need_key }
    }

    /// Whether a request to `path` with `headers` may go on.
    fn allows(&self, path: &str, headers: &HeaderMap) -> bool {
        let Some(key) = &self.key else { return true };
        if matches!(path, "/health" | "/live" | "/ready") || (path == "/metrics" && !self.metrics_need_key) {
            return true;
        }
        let Some(sent) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Some((scheme, token)) = sent.trim().split_once(' ') else { return false };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return false;
        }
        let digest: [u8; 32] = Sha256::digest(token.trim().as_bytes()).into();
        // Every byte is compared, whatever the first difference.
        digest.iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// Refuses a request without the server's API key (when it has one) with OpenAI's 401.
async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if state.access.allows(request.uri().path(), request.headers()) {
        return next.run(request).await;
    }
    state.metrics.count("unauthorized");
    let error = ApiError {
        status: StatusCode::UNAUTHORIZED,
        kind: "invalid_request_error",
        code: "invalid_api_key",
        param: None,
        message: "this server needs its API key, sent as `Authorization: Bearer <key>`".into(),
        retry_after: None,
    };
    let mut response = error.into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, axum::http::HeaderValue::from_static("Bearer"));
    response
}

pub(crate) fn router(state: Arc<AppState>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/live", get(live))
        .route("/ready", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state), authorize))
        .layer(axum::extract::DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::invalid(
        "not_found",
        "no such route; this server serves /v1/chat/completions, /v1/completions, /v1/models, /health, /live, /ready and /metrics",
    )
    .status(StatusCode::NOT_FOUND)
}

/// Liveness: the process answers HTTP (it may be draining).
async fn live() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "alive"}))
}

/// Readiness (`/ready`, and `/health` as before): the server listens only once its decoder and
/// plugins are loaded, so it is ready until it starts draining, its weight files change, or as
/// many preparations as it has workers are stuck past their deadline ([`preparing`]).
async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.draining.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, Json(serde_json::json!({"status": "draining"}))).into_response()
    } else if let Some(what) = state.weights.check() {
        let body = serde_json::json!({"status": "checkpoint_changed", "detail": what});
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    } else if let overdue = state.metrics.preparations_overdue.load(Ordering::Relaxed)
        && overdue >= state.prepare_workers as u64
    {
        let detail = format!(
            "{overdue} request preparations passed their deadline and are still running (a plugin stuck in a call); \
             restart the server to take their threads back"
        );
        let body = serde_json::json!({"status": "preparations_overdue", "detail": detail});
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    } else {
        Json(serde_json::json!({"status": "ok"})).into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render()).into_response()
}

async fn models(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("text".into(), "qualified".into());
    let mut family = serde_json::Value::Null;
    if let Some(media) = state.media {
        let plugin = media.plugin();
        family = plugin.name().into();
        for capability in Capability::ALL {
            let status = match plugin.manifest().capability(capability).map(|c| c.status) {
                Some(Status::Qualified) => "qualified",
                Some(Status::Experimental) => "experimental",
                Some(Status::Unsupported) | None => "unsupported",
            };
            let served = plugin.check_capability(capability, state.policy).is_ok();
            capabilities.insert(capability.as_str().into(), serde_json::json!({"status": status, "served": served}));
        }
    }
    Json(serde_json::json!({
        "object": "list",
        "data": [{
            "id": state.model_id,
            "object": "model",
            "created": state.started,
            "owned_by": "mlxcel-host",
            "family": family,
            "capabilities": capabilities,
        }]
    }))
}

async fn chat(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    respond(&state, start_chat(&state, body, arrived).await)
}

async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrived = Instant::now();
    respond(&state, start_completion(&state, body, arrived).await)
}

fn respond(state: &AppState, answer: Result<Response, ApiError>) -> Response {
    match answer {
        Ok(response) => response,
        Err(e) => {
            state.metrics.count("refused");
            e.into_response()
        }
    }
}

/// Which API a request came through: the shape of its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Chat,
    Completion,
}

/// Everything a request decided before the engine took it.
struct Accepted {
    api: Api,
    id: String,
    prompt: Vec<u32>,
    stream: bool,
    include_usage: bool,
    logprobs: bool,
    stops: Vec<String>,
    events: mpsc::UnboundedReceiver<Event>,
    /// Reads tool calls out of the answer, when the model may call tools.
    calls: Option<CallScanner>,
    /// Counts the request open until its answer ends (dropped with it).
    _open: Open,
}

/// The request body, unless the server drains, its weights changed on disk, or the body is
/// refused (too large, unreadable).
fn read_body(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    if state.draining.load(Ordering::Relaxed) {
        return Err(draining());
    }
    if let Some(what) = state.weights.check() {
        let mut e = ApiError::internal(format!("{what}; the server must be restarted to serve the new weights"))
            .status(StatusCode::SERVICE_UNAVAILABLE);
        e.code = "checkpoint_changed";
        return Err(e);
    }
    body.map_err(|e| {
        let status = e.status();
        ApiError::invalid(
            if status == StatusCode::PAYLOAD_TOO_LARGE { "body_too_large" } else { "invalid_body" },
            e.body_text(),
        )
        .status(status)
    })
}

fn check_model(state: &AppState, model: &str) -> Result<(), ApiError> {
    if model != state.model_id {
        return Err(ApiError::invalid(
            "model_not_found",
            format!("the model `{model}` does not exist; this server serves `{}`", state.model_id),
        )
        .param("model")
        .status(StatusCode::NOT_FOUND));
    }
    Ok(())
}

async fn start_chat(
    state: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let body = read_body(state, body)?;
    let request: ChatRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid("invalid_json", format!("the request body is not a valid chat request: {e}")))?;
    check_model(state, &request.model)?;
    let mut options = Options::from_request(&request, &state.text)?;
    // The family declares how its models write calls; without a plugin there is no declaration.
    let format = state.media.and_then(|m| m.plugin().manifest().chat.tool_call_format.clone());
    let tools = Tools::from_request(
        request.tools.as_deref(),
        request.tool_choice.as_ref(),
        request.parallel_tool_calls,
        format.as_deref(),
        state.text.template.renders_tools(),
    )?;
    if let Some(tools) = &tools {
        if options.grammar.is_some() && tools.choice != ToolChoice::None {
            return Err(ApiError::invalid(
                "unsupported_value",
                "response_format with tools the model may call: an answer cannot be both JSON and a call (send tool_choice: none)",
            )
            .param("response_format"));
        }
        options.grammar = tools.grammar().map(|g| (g, "tools"));
        options.calls = tools.scanner();
    }
    let definitions = tools.map(|t| t.definitions);
    let (messages, sources) = request::messages(request.messages, state.remote.is_some())?;
    admit_media(state, &sources)?;
    let mut images = Vec::with_capacity(sources.len());
    for ImagePart { source, detail, modality } in sources {
        let bytes = match source {
            ImageSource::Inline(bytes) => bytes,
            ImageSource::Remote(url) => {
                let remote = state.remote.as_ref().ok_or_else(|| ApiError::internal("remote images are off"))?;
                remote
                    .fetch(&url)
                    .await
                    .map_err(|e| ApiError::invalid("image_fetch_failed", e.to_string()).param("messages"))?
            }
        };
        images.push(MediaInput { bytes, modality, detail });
    }
    // Admitted by the media's encoded bytes, before anything is decoded or preprocessed.
    let held = if images.is_empty() {
        None
    } else {
        let bytes = images.iter().map(|i| i.bytes.len() as u64).sum();
        Some(state.media_bytes.reserve(bytes).ok_or_else(|| media_budget_full(&state.media_bytes, bytes))?)
    };

    // Template, tokens and media preprocessing on the blocking pool.
    let prep_state = Arc::clone(state);
    let grammar = options.grammar.take();
    let ends = options.stop_tokens.clone();
    let prepared = preparing(state, move || {
        // The grammar first: a schema it cannot follow is refused before any media work.
        let constraint = grammar.map(|(g, param)| prep_state.text.constrain(&g, ends, param)).transpose()?;
        let (prompt, media) = prepare(&prep_state, &messages, definitions.as_deref(), &images)?;
        // What the request holds from here: its preprocessed tensors (or cached features), not
        // the files. The share goes back here if preparing fails, or with this thread if it was
        // given up at its deadline: the files are held until then.
        let media = match (media, held) {
            (Some(media), Some(mut held)) => {
                held.resize(media.host_bytes());
                Some((media, held))
            }
            _ => None,
        };
        Ok((prompt, media, constraint))
    })
    .await?;
    let (prompt, media, constraint) = prepared;
    if let Some(constraint) = constraint {
        options.sampler = options.sampler.with_constraint(constraint);
    }
    run(state, Api::Chat, options, prompt, media, arrived).await
}

async fn start_completion(
    state: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let body = read_body(state, body)?;
    let request: CompletionRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid("invalid_json", format!("the request body is not a valid completion request: {e}"))
    })?;
    if request.echo {
        return Err(
            ApiError::invalid("unsupported_value", "echo: the prompt is not repeated in the answer").param("echo")
        );
    }
    if request.suffix.is_some() {
        return Err(
            ApiError::invalid("unsupported_value", "suffix: text after the completion is not served").param("suffix")
        );
    }
    if let Some(n) = request.best_of
        && n != 1
    {
        return Err(ApiError::invalid("unsupported_value", format!("best_of = {n}: one completion is generated"))
            .param("best_of"));
    }
    let (prompt, fields) = request.into_parts();
    check_model(state, &fields.model)?;
    let options = Options::from_request(&fields, &state.text)?;
    let one = |n: usize| {
        ApiError::invalid("unsupported_value", format!("{n} prompts: one prompt per request is served")).param("prompt")
    };
    let ids = match prompt {
        PromptField::Text(text) => tokenize_prompt(state, text).await?,
        PromptField::Texts(mut texts) if texts.len() == 1 => tokenize_prompt(state, texts.remove(0)).await?,
        PromptField::Tokens(ids) => ids,
        PromptField::TokenLists(mut lists) if lists.len() == 1 => lists.remove(0),
        PromptField::Texts(texts) => return Err(one(texts.len())),
        PromptField::TokenLists(lists) => return Err(one(lists.len())),
    };
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= state.text.vocab) {
        return Err(ApiError::invalid(
            "invalid_value",
            format!("prompt token {bad} is not a token id of this model's vocabulary (0 to {})", state.text.vocab - 1),
        )
        .param("prompt"));
    }
    if ids.is_empty() {
        return Err(ApiError::invalid("empty_prompt", "the prompt is empty").param("prompt"));
    }
    run(state, Api::Completion, options, ids, None, arrived).await
}

/// A completion's text prompt as the checkpoint's tokenizer makes it, special tokens included
/// (what `tokenizer(prompt)` gives in transformers), on the blocking pool.
async fn tokenize_prompt(state: &Arc<AppState>, text: String) -> Result<Vec<u32>, ApiError> {
    let text_side = Arc::clone(&state.text);
    preparing(state, move || text_side.tokenizer.encode(&text, true).map_err(|e| ApiError::internal(e.to_string())))
        .await
}

/// Runs a request's preparation (`work`: template, tokenizer, image decoding and the plugin's
/// preprocessing, layout and prefill program) on the blocking pool, at most
/// `--prepare-workers` at a time, for at most `--prepare-deadline`.
///
/// Nothing can stop a plugin call from outside, so a preparation past its deadline is given
/// up, not cancelled: the request gets a 500, its permit goes back (the other requests are
/// prepared as before), and its thread counts in `mlxcel_preparations_overdue` until the code
/// returns. As many overdue as there are workers make `/ready` fail: the server still serves,
/// but its cores may be spinning in a plugin, and only a restart takes them back.
async fn preparing<T: Send + 'static>(
    state: &Arc<AppState>,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    const RUNNING: u8 = 0;
    const RETURNED: u8 = 1;
    const GIVEN_UP: u8 = 2;
    let permit = state.preparing.clone().acquire_owned().await.map_err(|_| draining())?;
    let call = Arc::new(std::sync::atomic::AtomicU8::new(RUNNING));
    let (theirs, metrics) = (Arc::clone(&call), Arc::clone(&state.metrics));
    let started = Instant::now();
    let mut handle = tokio::task::spawn_blocking(move || {
        let out = work();
        if theirs.compare_exchange(RUNNING, RETURNED, Ordering::AcqRel, Ordering::Acquire).is_err() {
            metrics.preparations_overdue.fetch_sub(1, Ordering::Relaxed);
            let after = started.elapsed().as_secs_f64();
            tracing::warn!(after_seconds = after, "a preparation given up at its deadline has returned");
        }
        out
    });
    let joined = match tokio::time::timeout(state.prepare_deadline, &mut handle).await {
        Ok(joined) => joined,
        Err(_) => {
            // Counted before it is marked, so the thread never uncounts what is not counted.
            state.metrics.preparations_overdue.fetch_add(1, Ordering::Relaxed);
            if call.compare_exchange(RUNNING, GIVEN_UP, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                drop(permit);
                let seconds = state.prepare_deadline.as_secs_f64();
                tracing::error!(deadline_seconds = seconds, "a request's preparation passed its deadline; given up");
                let mut error = ApiError::internal(format!(
                    "preparing the request (template, tokenizer, media preprocessing) did not finish within \
                     {seconds} s (--prepare-deadline); the server gave up on it"
                ));
                error.code = "deadline_exceeded";
                return Err(error);
            }
            // It returned just as the deadline passed.
            state.metrics.preparations_overdue.fetch_sub(1, Ordering::Relaxed);
            handle.await
        }
    };
    drop(permit);
    joined.map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
}

/// Hands a prepared request to the engine and answers it, whole or streamed, in `api`'s shape.
async fn run(
    state: &Arc<AppState>,
    api: Api,
    options: Options,
    prompt: Vec<u32>,
    media: Option<(MediaRequest<'static>, Held)>,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let (tx, mut events) = mpsc::unbounded_channel();
    let job = Job {
        prompt: prompt.clone(),
        media,
        max_tokens: options.max_tokens,
        stop_tokens: options.stop_tokens,
        sampler: options.sampler,
        events: tx,
    };
    if !state.engine.submit(job) {
        return Err(ApiError::internal("the engine has stopped").status(StatusCode::SERVICE_UNAVAILABLE));
    }
    match events.recv().await {
        Some(Event::Queued) => {}
        Some(Event::Refused(refusal)) => return Err(refused(refusal)),
        Some(other) => return Err(ApiError::internal(format!("the engine answered {other:?} before accepting"))),
        // The engine stopped (after a drain) with the job still in its inbox.
        None if state.draining.load(Ordering::Relaxed) => return Err(draining()),
        None => return Err(ApiError::internal("the engine dropped the request")),
    }
    let prefix = match api {
        Api::Chat => "chatcmpl",
        Api::Completion => "cmpl",
    };
    let accepted = Accepted {
        api,
        id: format!("{prefix}-{}", uuid_like()),
        prompt,
        stream: options.stream,
        include_usage: options.include_usage,
        logprobs: options.logprobs,
        stops: options.stop_strings,
        events,
        calls: options.calls,
        _open: Open::new(&state.metrics),
    };
    let output = Output::new(&state.text, &accepted.prompt, &accepted.stops, accepted.logprobs)?;
    if accepted.stream {
        Ok(stream(Arc::clone(state), accepted, output, arrived))
    } else {
        whole(state, accepted, output, arrived).await
    }
}

fn draining() -> ApiError {
    let mut e =
        ApiError::invalid("shutting_down", "the server is shutting down").status(StatusCode::SERVICE_UNAVAILABLE);
    e.kind = "server_error";
    e.retry_after = Some(1);
    e
}

/// 429 when a request's media does not fit beside what the requests in flight hold; 413 when it
/// would not fit even alone.
fn media_budget_full(pool: &MediaBytes, bytes: u64) -> ApiError {
    // Megabytes as the flag takes them, and small amounts in bytes.
    let size = |b: u64| match b {
        0..=99_999 => format!("{b} bytes"),
        _ => format!("{:.1} MB", b as f64 / f64::from(1 << 20)),
    };
    let limit = format!("--max-media-mb {} MB, {} bytes", pool.limit() as f64 / f64::from(1 << 20), pool.limit());
    if bytes > pool.limit() {
        return ApiError::invalid(
            "media_too_large",
            format!(
                "the request's media ({}) is more than the server holds for all requests in flight ({limit})",
                size(bytes)
            ),
        )
        .status(StatusCode::PAYLOAD_TOO_LARGE)
        .param("messages");
    }
    let mut e = ApiError::invalid(
        "media_budget_full",
        format!(
            "the request's media ({}) does not fit beside the {} that requests in flight hold ({limit}); retry \
             after 1s",
            size(bytes),
            size(pool.held())
        ),
    )
    .status(StatusCode::TOO_MANY_REQUESTS);
    e.kind = "rate_limit_error";
    e.retry_after = Some(1);
    e
}

fn refused(refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::Submit(SubmitError::QueueFull { depth, retry_after }) => {
            let mut e = ApiError::invalid(
                "queue_full",
                format!(
                    "the server is at capacity ({depth} requests waiting); retry after {}s",
                    retry_after.as_secs().max(1)
                ),
            )
            .status(StatusCode::TOO_MANY_REQUESTS);
            e.kind = "rate_limit_error";
            e.retry_after = Some(retry_after.as_secs().max(1));
            e
        }
        Refusal::Submit(e @ (SubmitError::ContextExceeded { .. } | SubmitError::PromptTooLong { .. })) => {
            ApiError::invalid("context_length_exceeded", e.to_string()).param("max_tokens")
        }
        Refusal::Submit(e @ SubmitError::ZeroMaxTokens) => {
            ApiError::invalid("invalid_value", e.to_string()).param("max_tokens")
        }
        Refusal::Submit(e @ SubmitError::EmptyPrompt) => {
            ApiError::invalid("empty_prompt", e.to_string()).param("messages")
        }
        Refusal::Draining => draining(),
        Refusal::Media(e) => media_error(e),
    }
}

/// The one mapping of a media failure to a status: the request's media is a 400 naming the
/// image, a fault of ours (the plugin's or an encoder's) a 500 that does not blame the client.
fn media_error(e: MediaError) -> ApiError {
    match e.fault {
        Fault::Input => ApiError::invalid("invalid_image", e.to_string()).param("messages"),
        Fault::Server => {
            tracing::error!(error = %e, "a media request failed on the server's side");
            let mut api = ApiError::internal(format!("the server failed to process the request's media: {e}"));
            api.code = "media_failed";
            api
        }
    }
}

/// The request's generation options, checked.
struct Options {
    stream: bool,
    include_usage: bool,
    max_tokens: Option<usize>,
    sampler: Sampler,
    logprobs: bool,
    stop_strings: Vec<String>,
    stop_tokens: Vec<u32>,
    /// What the answer's text must be, if the request constrains it, and the field that asked.
    grammar: Option<(Grammar, &'static str)>,
    /// Reads the model's tool calls out of its text, when it may call tools.
    calls: Option<CallScanner>,
}

impl Options {
    fn from_request(r: &ChatRequest, text: &TextSide) -> Result<Self, ApiError> {
        let fields = request::fields(r, text.vocab)?;
        let params = SamplingParams {
            temperature: r.temperature.unwrap_or(1.0),
            top_k: fields.top_k,
            top_p: r.top_p.unwrap_or(1.0),
            min_p: r.min_p.unwrap_or(0.0),
            repetition_penalty: r.repetition_penalty.unwrap_or(1.0),
            frequency_penalty: r.frequency_penalty.unwrap_or(0.0),
            presence_penalty: r.presence_penalty.unwrap_or(0.0),
        };
        let sampler = Sampler::new(params, r.seed.map(|s| s as u64))
            .map_err(|e| ApiError::invalid("invalid_value", e.to_string()))?
            .with_logprobs(fields.top_logprobs)
            .map_err(|e| ApiError::invalid("invalid_value", e.to_string()).param("top_logprobs"))?
            .with_logit_bias(fields.logit_bias)
            .map_err(|e| ApiError::invalid("invalid_value", e.to_string()).param("logit_bias"))?;
        if r.store == Some(true) || r.service_tier.is_some() {
            // Nothing is stored and every request is served alike; the client is told so in the log.
            tracing::info!(store = ?r.store, service_tier = ?r.service_tier, "fields accepted that change nothing here");
        }
        let mut stop_tokens = if r.ignore_eos { Vec::new() } else { text.stop_tokens.clone() };
        stop_tokens.extend(&r.stop_token_ids);
        Ok(Options {
            stream: r.stream,
            include_usage: r.stream_options.as_ref().is_some_and(|o| o.include_usage),
            max_tokens: fields.max_tokens,
            sampler,
            logprobs: r.logprobs,
            stop_strings: fields.stop_strings,
            stop_tokens,
            grammar: fields.schema.map(|schema| (Grammar::JsonSchema(schema), "response_format")),
            calls: None,
        })
    }
}

/// Checks a request's media against the model (a family plugin that takes it, the capability
/// gate, the manifest's image count) before any of it is fetched or decoded.
fn admit_media(state: &AppState, parts: &[ImagePart]) -> Result<(), ApiError> {
    if parts.is_empty() {
        return Ok(());
    }
    let Some(media) = state.media else {
        return Err(ApiError::invalid(
            "model_not_multimodal",
            format!("`{}` is served without a family plugin and takes no images", state.model_id),
        )
        .param("messages"));
    };
    let clips = parts.iter().filter(|p| p.modality == Modality::Audio).count();
    media.admit(parts.len() - clips, clips, state.policy).map_err(|e| {
        let code = match &e {
            MediaRefusal::Capability(PluginApiError::Unqualified { .. }) => "capability_not_qualified",
            MediaRefusal::Capability(_) => "capability_unsupported",
            MediaRefusal::TooMany { .. } => "too_many_images",
        };
        ApiError::invalid(code, e.to_string()).param("messages")
    })
}

/// The rendered, tokenized prompt and its preprocessed media (blocking work).
fn prepare(
    state: &AppState,
    messages: &[Message],
    tools: Option<&[serde_json::Value]>,
    images: &[MediaInput],
) -> Result<(Vec<u32>, Option<MediaRequest<'static>>), ApiError> {
    let text = &state.text;
    let prompt = text
        .template
        .render_with_tools(messages, tools, true)
        .map_err(|e| ApiError::invalid("template_error", format!("the chat template refused the messages: {e}")))?;
    let (ids, media) = match (images.is_empty(), state.media) {
        (true, media) => {
            let ids = text.tokenizer.encode(&prompt, false).map_err(|e| ApiError::internal(e.to_string()))?;
            (crate::multimodal::started(ids, media.and_then(|m| m.prompt_start())), None)
        }
        (false, None) => return Err(ApiError::invalid("model_not_multimodal", "this model takes no images")),
        (false, Some(media)) => {
            let mut request = media.request(images, state.max_input_pixels).map_err(media_error)?;
            let ids = request.expand(&prompt, &text.tokenizer).map_err(media_error)?;
            (ids, Some(request))
        }
    };
    if ids.is_empty() {
        return Err(ApiError::invalid("empty_prompt", "the prompt is empty after tokenization").param("messages"));
    }
    Ok((ids, media))
}

/// Turns a request's tokens into text: streaming detokenization, stop strings, logprobs.
struct Output {
    text: Arc<TextSide>,
    detok: Detokenizer,
    stops: StopStrings,
    logprobs: bool,
    /// Tokens received.
    tokens: usize,
}

/// What one token added.
struct Piece {
    text: String,
    logprobs: Option<TokenLogprobBody>,
    /// A stop string matched: nothing after `text` is emitted.
    stopped: bool,
}

impl Output {
    fn new(text: &Arc<TextSide>, prompt: &[u32], stops: &[String], logprobs: bool) -> Result<Self, ApiError> {
        let stops = StopStrings::new(stops.to_vec())
            .map_err(|e| ApiError::invalid("invalid_value", e.to_string()).param("stop"))?;
        Ok(Output { text: Arc::clone(text), detok: Detokenizer::new(prompt, true), stops, logprobs, tokens: 0 })
    }

    fn token(&mut self, token: u32, logprobs: Option<TokenLogprobs>) -> Result<Piece, ApiError> {
        self.tokens += 1;
        let piece = self.detok.push(&self.text.tokenizer, token).map_err(|e| ApiError::internal(e.to_string()))?;
        let scan = self.stops.push(&piece);
        let logprobs = match (self.logprobs, logprobs) {
            (true, Some(lp)) => Some(self.logprob_body(token, &lp)),
            _ => None,
        };
        Ok(Piece { text: scan.emit, logprobs, stopped: scan.stopped.is_some() })
    }

    /// The text held back at the end (an unfinished character, a partial stop string).
    fn finish(&mut self) -> Result<Piece, ApiError> {
        let rest = self.detok.finish(&self.text.tokenizer).map_err(|e| ApiError::internal(e.to_string()))?;
        let scan = self.stops.push(&rest);
        let mut text = scan.emit;
        if scan.stopped.is_none() {
            text.push_str(&self.stops.finish());
        }
        Ok(Piece { text, logprobs: None, stopped: scan.stopped.is_some() })
    }

    fn logprob_body(&self, token: u32, lp: &TokenLogprobs) -> TokenLogprobBody {
        let name = |id: u32| self.text.tokenizer.decode(&[id], false).unwrap_or_default();
        let token_text = name(token);
        TokenLogprobBody {
            bytes: token_text.as_bytes().to_vec(),
            token: token_text,
            logprob: lp.logprob,
            top_logprobs: lp
                .top
                .iter()
                .map(|&(id, logprob)| {
                    let text = name(id);
                    TopLogprobBody { bytes: text.as_bytes().to_vec(), token: text, logprob }
                })
                .collect(),
        }
    }
}

fn finish_reason(reason: &FinishReason) -> Result<&'static str, ApiError> {
    match reason {
        FinishReason::Stop { .. } => Ok("stop"),
        FinishReason::Length | FinishReason::Capacity => Ok("length"),
        // Cancelled by the server (shutdown deadline); a client's own cancellation has no reader.
        FinishReason::Cancelled => Ok("abort"),
        FinishReason::Error(e) => Err(ApiError::internal(format!("generation failed: {e}"))),
    }
}

fn outcome(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop { .. } => "stop",
        FinishReason::Length | FinishReason::Capacity => "length",
        FinishReason::Cancelled => "cancelled",
        FinishReason::Error(_) => "error",
    }
}

/// A non-streaming answer: every token, then one body.
async fn whole(
    state: &Arc<AppState>,
    mut a: Accepted,
    mut out: Output,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    // Each token's log-probabilities, and where its text starts in the answer (in characters).
    let mut logprobs = Vec::new();
    let mut chars = 0;
    let mut first: Option<Instant> = None;
    let mut usage = None;
    let mut cached = 0;
    let reason = loop {
        match a.events.recv().await {
            Some(Event::Admitted { cached_rows }) => cached = cached_rows,
            Some(Event::Token { token, logprobs: lp }) => {
                if first.is_none() {
                    first = Some(Instant::now());
                    state.metrics.first_token(arrived.elapsed());
                }
                let piece = out.token(token, lp)?;
                logprobs.extend(piece.logprobs.map(|lp| (lp, chars)));
                chars += piece.text.chars().count();
                take(&mut a.calls, &piece.text, false, &mut text, &mut tool_calls);
                if piece.stopped || a.calls.as_ref().is_some_and(CallScanner::is_full) {
                    // Dropping the receiver below cancels the rest in the engine.
                    state.metrics.finished("stop", a.prompt.len(), out.tokens, decoding(first));
                    break "stop";
                }
            }
            Some(Event::Finished { reason, usage: used }) => {
                usage = Some(UsageBody::new(used.prompt_tokens, used.completion_tokens, used.cached_rows));
                let tail = out.finish()?;
                take(&mut a.calls, &tail.text, true, &mut text, &mut tool_calls);
                state.metrics.finished(outcome(&reason), a.prompt.len(), out.tokens, decoding(first));
                break finish_reason(&reason)?;
            }
            Some(other) => return Err(ApiError::internal(format!("unexpected engine event {other:?}"))),
            None => return Err(ApiError::internal("the engine dropped the request")),
        }
    };
    drop(a.events);
    // Ended by a stop string: the tokens received so far.
    let usage = usage.unwrap_or_else(|| UsageBody::new(a.prompt.len(), out.tokens, cached));
    // OpenAI's shape for calls: the calls, and text only if the model wrote some beside them.
    let (content, reason) = match tool_calls.is_empty() {
        true => (Some(text.clone()), reason),
        false => {
            (Some(text.clone()).filter(|c| !c.trim().is_empty()), if reason == "stop" { "tool_calls" } else { reason })
        }
    };
    let (id, created, model) = (a.id, now(), state.model_id.clone());
    Ok(match a.api {
        Api::Chat => Json(ChatCompletion {
            id,
            object: "chat.completion",
            created,
            model,
            choices: vec![Choice {
                index: 0,
                message: AssistantMessage { role: "assistant", content, tool_calls },
                finish_reason: reason,
                logprobs: a
                    .logprobs
                    .then(|| LogprobsBody { content: logprobs.into_iter().map(|(lp, _)| lp).collect() }),
            }],
            usage,
        })
        .into_response(),
        Api::Completion => Json(Completion {
            id,
            object: "text_completion",
            created,
            model,
            choices: vec![CompletionChoice {
                index: 0,
                text,
                finish_reason: Some(reason),
                logprobs: a.logprobs.then(|| {
                    let mut body = CompletionLogprobs::default();
                    for (lp, offset) in logprobs {
                        body.push(lp, offset);
                    }
                    body
                }),
            }],
            usage: Some(usage),
        })
        .into_response(),
    })
}

/// A piece of the answer into its text and, when the model may call tools, its calls; `end`
/// is the answer's last piece (a call cut short there still counts when it is whole).
fn take(calls: &mut Option<CallScanner>, piece: &str, end: bool, text: &mut String, found: &mut Vec<ToolCallBody>) {
    let Some(scanner) = calls else {
        text.push_str(piece);
        return;
    };
    let mut read = scanner.push(piece);
    if end {
        let rest = scanner.finish();
        read.content.push_str(&rest.content);
        read.calls.extend(rest.calls);
    }
    text.push_str(&read.content);
    found.extend(read.calls);
}

/// A streamed answer: a role chunk, a chunk per piece of text, a finish chunk, the usage chunk
/// when asked, then `[DONE]`.
fn stream(state: Arc<AppState>, mut a: Accepted, mut out: Output, arrived: Instant) -> Response {
    let (tx, rx) = mpsc::channel::<Result<SseEvent, std::convert::Infallible>>(64);
    let created = now();
    let id = a.id.clone();
    let model = state.model_id.clone();
    let task_state = Arc::clone(&state);
    let chunks = Chunks { api: a.api, id, created, model, logprobs: a.logprobs };
    tokio::spawn(async move {
        let state = task_state;
        let data = |value: serde_json::Value| SseEvent::default().data(value.to_string());
        if let Some(role) = chunks.role()
            && tx.send(Ok(data(role))).await.is_err()
        {
            return;
        }
        // Characters of the answer sent so far (where the next token's text starts).
        let mut chars = 0;
        // Tool calls sent so far.
        let mut called = 0;
        let mut first: Option<Instant> = None;
        let mut cached = 0;
        let finish: Result<&'static str, ApiError> = loop {
            let event = tokio::select! {
                event = a.events.recv() => event,
                // The client went away: drop the engine's receiver, which cancels the request.
                () = tx.closed() => {
                    state.metrics.finished("cancelled", a.prompt.len(), out.tokens, decoding(first));
                    return;
                }
            };
            match event {
                Some(Event::Admitted { cached_rows }) => cached = cached_rows,
                Some(Event::Token { token, logprobs }) => {
                    if first.is_none() {
                        first = Some(Instant::now());
                        state.metrics.first_token(arrived.elapsed());
                    }
                    let piece = match out.token(token, logprobs) {
                        Ok(p) => p,
                        Err(e) => break Err(e),
                    };
                    let (mut text, mut calls) = (String::new(), Vec::new());
                    take(&mut a.calls, &piece.text, false, &mut text, &mut calls);
                    let mut sent = Vec::new();
                    if !text.is_empty() || piece.logprobs.is_some() {
                        sent.push(chunks.piece(text.clone(), piece.logprobs, chars));
                        chars += text.chars().count();
                    }
                    sent.extend(chunks.calls(calls, &mut called));
                    for c in sent {
                        if tx.send(Ok(data(c))).await.is_err() {
                            state.metrics.finished("cancelled", a.prompt.len(), out.tokens, decoding(first));
                            return;
                        }
                    }
                    if piece.stopped {
                        state.metrics.finished("stop", a.prompt.len(), out.tokens, decoding(first));
                        break Ok("stop");
                    }
                    if a.calls.as_ref().is_some_and(CallScanner::is_full) {
                        state.metrics.finished("stop", a.prompt.len(), out.tokens, decoding(first));
                        break Ok("tool_calls");
                    }
                }
                Some(Event::Finished { reason, .. }) => {
                    state.metrics.finished(outcome(&reason), a.prompt.len(), out.tokens, decoding(first));
                    let tail = match out.finish() {
                        Ok(tail) => tail.text,
                        Err(e) => break Err(e),
                    };
                    let (mut text, mut calls) = (String::new(), Vec::new());
                    take(&mut a.calls, &tail, true, &mut text, &mut calls);
                    if !text.is_empty() {
                        let _ = tx.send(Ok(data(chunks.piece(text, None, chars)))).await;
                    }
                    for c in chunks.calls(calls, &mut called) {
                        let _ = tx.send(Ok(data(c))).await;
                    }
                    break finish_reason(&reason).map(|r| if r == "stop" && called > 0 { "tool_calls" } else { r });
                }
                Some(other) => break Err(ApiError::internal(format!("unexpected engine event {other:?}"))),
                None => break Err(ApiError::internal("the engine dropped the request")),
            }
        };
        drop(a.events);
        match finish {
            Ok(reason) => {
                let _ = tx.send(Ok(data(chunks.finish(reason)))).await;
                if a.include_usage {
                    let usage = UsageBody::new(a.prompt.len(), out.tokens, cached);
                    let _ = tx.send(Ok(data(chunks.usage(usage)))).await;
                }
            }
            Err(e) => {
                let _ = tx.send(Ok(SseEvent::default().data(e.body().to_string()))).await;
            }
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

/// A streamed answer's chunks, in its API's shape.
struct Chunks {
    api: Api,
    id: String,
    created: u64,
    model: String,
    /// Log-probabilities were asked for.
    logprobs: bool,
}

impl Chunks {
    /// Chat's first chunk, naming the role; completions have none.
    fn role(&self) -> Option<serde_json::Value> {
        let role = ChunkChoice {
            index: 0,
            delta: Delta { role: Some("assistant"), ..Delta::default() },
            finish_reason: None,
            logprobs: None,
        };
        (self.api == Api::Chat).then(|| self.chat(vec![role], None))
    }

    /// A piece of the answer (with its token's log-probabilities, the token's text starting at
    /// character `offset`).
    fn piece(&self, text: String, lp: Option<TokenLogprobBody>, offset: usize) -> serde_json::Value {
        match self.api {
            Api::Chat => {
                let logprobs = self.logprobs.then(|| LogprobsBody { content: lp.into_iter().collect() });
                let delta = Delta { content: Some(text), ..Delta::default() };
                self.chat(vec![ChunkChoice { index: 0, delta, finish_reason: None, logprobs }], None)
            }
            Api::Completion => {
                let logprobs = self.logprobs.then(|| {
                    let mut body = CompletionLogprobs::default();
                    if let Some(lp) = lp {
                        body.push(lp, offset);
                    }
                    body
                });
                self.completion(vec![CompletionChoice { index: 0, text, finish_reason: None, logprobs }], None)
            }
        }
    }

    /// Chat chunks for tool calls read from the answer, numbered on from `called`: a first
    /// delta naming each call, then one with its arguments.
    fn calls(&self, calls: Vec<ToolCallBody>, called: &mut usize) -> Vec<serde_json::Value> {
        let mut out = Vec::with_capacity(2 * calls.len());
        for call in calls {
            let named = ToolCallDelta {
                index: *called,
                id: Some(call.id),
                kind: Some("function"),
                function: FunctionDelta { name: Some(call.function.name), arguments: String::new() },
            };
            let arguments = ToolCallDelta {
                index: *called,
                id: None,
                kind: None,
                function: FunctionDelta { name: None, arguments: call.function.arguments },
            };
            for delta in [named, arguments] {
                let delta = Delta { tool_calls: vec![delta], ..Delta::default() };
                out.push(self.chat(vec![ChunkChoice { index: 0, delta, finish_reason: None, logprobs: None }], None));
            }
            *called += 1;
        }
        out
    }

    fn finish(&self, reason: &'static str) -> serde_json::Value {
        match self.api {
            Api::Chat => {
                let choice =
                    ChunkChoice { index: 0, delta: Delta::default(), finish_reason: Some(reason), logprobs: None };
                self.chat(vec![choice], None)
            }
            Api::Completion => {
                let choice =
                    CompletionChoice { index: 0, text: String::new(), finish_reason: Some(reason), logprobs: None };
                self.completion(vec![choice], None)
            }
        }
    }

    fn usage(&self, usage: UsageBody) -> serde_json::Value {
        match self.api {
            Api::Chat => self.chat(Vec::new(), Some(usage)),
            Api::Completion => self.completion(Vec::new(), Some(usage)),
        }
    }

    fn chat(&self, choices: Vec<ChunkChoice>, usage: Option<UsageBody>) -> serde_json::Value {
        let chunk = ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        };
        serde_json::to_value(chunk).unwrap_or_default()
    }

    fn completion(&self, choices: Vec<CompletionChoice>, usage: Option<UsageBody>) -> serde_json::Value {
        let chunk = Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        };
        serde_json::to_value(chunk).unwrap_or_default()
    }
}

fn decoding(first: Option<Instant>) -> Duration {
    first.map_or(Duration::ZERO, |f| f.elapsed())
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A unique-enough completion id: time and a process-wide counter.
pub(super) fn uuid_like() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{t:x}{n:04x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_failures_blame_the_client_only_when_the_input_is_at_fault() {
        let input = MediaError::classify(
            anyhow::Error::new(mlxcel_media::Error::Unrecognized).context("image 1"),
            Fault::Server,
        );
        let e = media_error(input);
        assert_eq!(
            (e.status, e.kind, e.code, e.param),
            (StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_image", Some("messages"))
        );
        let ours = MediaError::server(anyhow::anyhow!("the encoder did not compile"));
        let e = media_error(ours);
        assert_eq!((e.status, e.kind, e.code), (StatusCode::INTERNAL_SERVER_ERROR, "server_error", "media_failed"));
        assert!(e.message.contains("the encoder did not compile"), "{}", e.message);
    }

    fn bearer(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, value.parse().expect("header"));
        headers
    }

    #[test]
    fn only_the_key_opens_the_api_and_health_stays_open() {
        let access = Access::new(Some("sk-right"), true);
        assert!(access.allows("/v1/chat/completions", &bearer("Bearer sk-right")));
        assert!(access.allows("/v1/models", &bearer("bearer  sk-right ")), "scheme case and spaces");
        for wrong in ["Bearer sk-wrong", "Bearer sk-righ", "Bearer sk-right2", "Basic sk-right", "sk-right", "Bearer"] {
            assert!(!access.allows("/v1/chat/completions", &bearer(wrong)), "{wrong}");
        }
        assert!(!access.allows("/v1/models", &HeaderMap::new()));
        assert!(!access.allows("/metrics", &HeaderMap::new()), "metrics follow the key");
        assert!(!access.allows("/no/such/route", &HeaderMap::new()), "nothing is learnt about routes");
        for probe in ["/health", "/live", "/ready"] {
            assert!(access.allows(probe, &HeaderMap::new()), "{probe}");
        }
        let open_metrics = Access::new(Some("sk-right"), false);
        assert!(open_metrics.allows("/metrics", &HeaderMap::new()));
        assert!(!open_metrics.allows("/v1/models", &HeaderMap::new()));
        let none = Access::new(None, true);
        assert!(none.allows("/v1/chat/completions", &HeaderMap::new()));
    }
}
