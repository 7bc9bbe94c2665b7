//! The engine thread: the one thread that owns the decoder bundle and the encoders (IREE's
//! types are not `Send`), drives the scheduler and streams each request's events back to the
//! HTTP task that submitted it.
//!
//! A request's events channel is also its cancellation: when the HTTP side drops the receiver
//! (the client disconnected, or a stop string matched), the engine cancels the request at its
//! next step, which releases its slot and its buffers once.
//!
//! A request with media not in the encoder cache waits in the encoding queue first. Its items
//! go through the encoders one at a time, in arrival order; each encoder call runs on the
//! encoders' own device (IREE's asynchronous ABI, see `multimodal::Encoders::start`) while this
//! thread keeps stepping the running streams, and is polled between steps. Once every item is
//! encoded the request is merged and submitted to the scheduler like any other.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use mlxcel_host::decoder::{Decoder, Logits};
use mlxcel_host::engine::{
    Action, FinishReason, PendingInput, PreparedPrompt, Request, RequestId, Scheduler, SchedulerConfig, StepResult,
    SubmitError, Usage,
};
use mlxcel_host::sampling::{Sampler, TokenLogprobs};
use tokio::sync::mpsc::UnboundedSender;

use super::media_bytes::Held;
use super::metrics::{EngineGauges, Metrics};
use crate::multimodal::{Encoders, Encoding, MediaError, MediaRequest};

/// One request for the engine, prepared off the engine thread (template, tokens, decoded and
/// preprocessed media).
pub(crate) struct Job {
    /// The expanded prompt ids (one per cache row).
    pub(crate) prompt: Vec<u32>,
    /// The request's media and the host bytes it holds (given back when the media is merged
    /// into the prompt's rows, or the request ends before).
    pub(crate) media: Option<(MediaRequest<'static>, Held)>,
    pub(crate) max_tokens: Option<usize>,
    pub(crate) stop_tokens: Vec<u32>,
    pub(crate) sampler: Sampler,
    pub(crate) events: UnboundedSender<Event>,
}

/// What the engine tells a request's HTTP task.
#[derive(Debug)]
pub(crate) enum Event {
    /// Accepted into the queue.
    Queued,
    /// Given a slot and prefilled, keeping `cached_rows` of the slot's earlier rows.
    Admitted {
        cached_rows: usize,
    },
    Token {
        token: u32,
        logprobs: Option<TokenLogprobs>,
    },
    Finished {
        reason: FinishReason,
        usage: Usage,
    },
    /// Not accepted; nothing of it is kept.
    Refused(Refusal),
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    #[error(transparent)]
    Submit(#[from] SubmitError),
    #[error("the server is shutting down")]
    Draining,
    /// Encoding the request's media failed.
    #[error(transparent)]
    Media(MediaError),
}

enum Command {
    Submit(Box<Job>),
    /// Take no new requests; cancel what still runs at the deadline, then stop.
    Drain {
        deadline: Instant,
    },
}

/// The HTTP side's handle on the engine thread.
#[derive(Clone, Debug)]
pub(crate) struct EngineHandle {
    commands: Sender<Command>,
}

impl EngineHandle {
    /// Hands a job to the engine; `false` when the engine thread is gone.
    pub(crate) fn submit(&self, job: Job) -> bool {
        self.commands.send(Command::Submit(Box::new(job))).is_ok()
    }

    pub(crate) fn drain(&self, deadline: Instant) {
        let _ = self.commands.send(Command::Drain { deadline });
    }
}

/// What the engine thread builds its decoder and encoders from (on the thread itself).
pub(crate) type Loader = Box<dyn FnOnce() -> Result<(Decoder, Option<Encoders<'static>>)> + Send>;

/// Starts the engine thread; returns once the decoder is loaded (or failed to load).
pub(crate) fn start(
    load: Loader,
    config: SchedulerConfig,
    metrics: Arc<Metrics>,
) -> Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (commands, inbox) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("mlxcel-engine".to_owned())
        .spawn(move || {
            let (decoder, encoders) = match load() {
                Ok(loaded) => {
                    let _ = ready_tx.send(Ok(()));
                    loaded
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            Engine {
                decoder,
                encoders,
                scheduler: Scheduler::new(config),
                clients: HashMap::new(),
                partial: HashMap::new(),
                encoding: VecDeque::new(),
                metrics,
                inbox,
            }
            .run();
        })
        .context("starting the engine thread")?;
    ready_rx.recv().context("the engine thread ended while loading")??;
    Ok((EngineHandle { commands }, thread))
}

struct Engine {
    decoder: Decoder,
    encoders: Option<Encoders<'static>>,
    scheduler: Scheduler<PreparedPrompt>,
    clients: HashMap<RequestId, UnboundedSender<Event>>,
    /// Per slot, the prompt whose prefill is part done (kept for its next piece).
    partial: HashMap<usize, PendingInput<PreparedPrompt>>,
    /// Media requests waiting for their encoders, in arrival order; the first one's item may be
    /// running on the encoders' device.
    encoding: VecDeque<Waiting>,
    metrics: Arc<Metrics>,
    inbox: Receiver<Command>,
}

/// A media request in the encoding queue (not yet accepted: the HTTP side hears `Queued` or a
/// refusal once it is encoded).
struct Waiting {
    job: Job,
    media: MediaRequest<'static>,
    held: Held,
    /// The item whose encoder call is running, and the call.
    running: Option<(usize, Encoding)>,
}

/// How long the engine waits for a running encoder call at a time when nothing else needs it:
/// how late a request that arrives meanwhile may be taken.
const ENCODER_POLL: Duration = Duration::from_millis(10);

impl Engine {
    fn run(mut self) {
        let mut deadline: Option<Instant> = None;
        loop {
            // Wait for work when there is none; otherwise take what arrived and step.
            let idle = self.is_idle();
            if idle && deadline.is_some() {
                break;
            }
            let first = if idle {
                match self.inbox.recv() {
                    Ok(command) => Some(command),
                    Err(_) => break,
                }
            } else {
                if self.scheduler.is_idle() {
                    // Only an encoder runs: wait for it a little, then look at the inbox.
                    self.wait_for_encoder(ENCODER_POLL);
                }
                None
            };
            let mut inbox_open = true;
            let mut next = first;
            loop {
                let command = match next.take() {
                    Some(c) => c,
                    None => match self.inbox.try_recv() {
                        Ok(c) => c,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            inbox_open = false;
                            break;
                        }
                    },
                };
                match command {
                    Command::Submit(job) if deadline.is_some() => {
                        let _ = job.events.send(Event::Refused(Refusal::Draining));
                    }
                    Command::Submit(job) => self.submit(*job),
                    Command::Drain { deadline: at } => deadline = Some(at),
                }
            }
            if !inbox_open && self.is_idle() {
                break;
            }
            self.cancel_abandoned();
            if deadline.is_some_and(|d| Instant::now() >= d) {
                let ids: Vec<RequestId> = self.clients.keys().copied().collect();
                for id in ids {
                    let actions = self.scheduler.cancel(id);
                    self.apply(actions);
                }
                // A running encoder call is waited for when its request is dropped here.
                for waiting in self.encoding.drain(..) {
                    let _ = waiting.job.events.send(Event::Refused(Refusal::Draining));
                }
            }
            self.advance_encoding();
            self.step();
            self.metrics.engine(EngineGauges {
                queue_depth: self.queue_len() as u64,
                active_slots: self.scheduler.active_slots() as u64,
                kv_rows_in_use: self.scheduler.rows_in_use() as u64,
            });
            self.metrics.prefix_rows_reused.store(self.scheduler.reused_rows(), Ordering::Relaxed);
        }
        // Requests submitted while the thread stops are refused, never left waiting.
        for command in self.inbox.try_iter() {
            if let Command::Submit(job) = command {
                let _ = job.events.send(Event::Refused(Refusal::Draining));
            }
        }
    }

    /// Nothing to decode, prefill or encode.
    fn is_idle(&self) -> bool {
        self.scheduler.is_idle() && self.encoding.is_empty()
    }

    /// Requests waiting: in the scheduler's queue and in the encoding queue.
    fn queue_len(&self) -> usize {
        self.scheduler.queue_len() + self.encoding.len()
    }

    fn submit(&mut self, mut job: Job) {
        let Some((media, held)) = job.media.take() else {
            let input = PendingInput::Tokens(job.prompt.clone());
            self.accept(job, input);
            return;
        };
        // Encoding is expensive: refuse a full queue before doing it.
        let config = self.scheduler.config();
        if self.queue_len() >= config.queue_bound {
            let refusal = SubmitError::QueueFull { depth: self.queue_len(), retry_after: config.retry_after };
            let _ = job.events.send(Event::Refused(refusal.into()));
            return;
        }
        if self.encoders.is_none() {
            let e = MediaError::server(anyhow::anyhow!("this server runs no encoders"));
            let _ = job.events.send(Event::Refused(Refusal::Media(e)));
            return;
        }
        self.encoding.push_back(Waiting { job, media, held, running: None });
    }

    /// Hands a prepared request to the scheduler and tells its HTTP side.
    fn accept(&mut self, job: Job, input: PendingInput<PreparedPrompt>) {
        let Job { prompt, media: _, max_tokens, stop_tokens, sampler, events } = job;
        let request = Request { prompt_tokens: prompt, input, max_tokens, stop_tokens, sampler };
        match self.scheduler.submit(request) {
            Ok(id) => {
                let _ = events.send(Event::Queued);
                self.clients.insert(id, events);
            }
            Err(e) => {
                let _ = events.send(Event::Refused(e.into()));
            }
        }
    }

    /// Moves the encoding queue on without waiting for the device: takes the features of a
    /// finished encoder call, starts the next item, and submits each request whose items are
    /// all encoded (an encoder-cache hit needs no call). A request whose client has gone is
    /// dropped once no call of it runs.
    fn advance_encoding(&mut self) {
        while let Some(mut waiting) = self.encoding.pop_front() {
            match self.advance(&mut waiting) {
                Ok(false) => {
                    self.encoding.push_front(waiting);
                    return;
                }
                Ok(true) if waiting.job.events.is_closed() => {}
                Ok(true) => {
                    let prepared = waiting.media.prefill_input(&mut self.decoder, &waiting.job.prompt).and_then(
                        |(embeddings, positions, extras, contents)| {
                            PreparedPrompt::new(embeddings, positions, extras, contents)
                                .map_err(|e| MediaError::server(anyhow::Error::new(e)))
                        },
                    );
                    match prepared {
                        Ok(prompt) => self.accept(waiting.job, PendingInput::Embeddings(prompt)),
                        Err(e) => {
                            let _ = waiting.job.events.send(Event::Refused(Refusal::Media(e)));
                        }
                    }
                }
                Err(e) => {
                    let _ = waiting.job.events.send(Event::Refused(Refusal::Media(e)));
                }
            }
        }
    }

    /// One request's encoding, as far as it goes without waiting: `Ok(true)` once every item is
    /// encoded (or the client has gone and no call runs), `Ok(false)` while a call runs.
    fn advance(&mut self, waiting: &mut Waiting) -> Result<bool, MediaError> {
        let encoders = self.encoders.as_mut().ok_or_else(|| {
            MediaError::server(anyhow::anyhow!("invariant: a media request waits on a server without encoders"))
        })?;
        loop {
            if let Some((index, encoding)) = waiting.running.take() {
                match encoding.is_done() {
                    Ok(false) => {
                        waiting.running = Some((index, encoding));
                        return Ok(false);
                    }
                    // `finish_item` reads the results, or reports the call's failure.
                    Ok(true) | Err(_) => {
                        waiting.media.finish_item(index, encoding)?;
                        waiting.held.resize(waiting.media.host_bytes());
                    }
                }
            }
            if waiting.job.events.is_closed() {
                return Ok(true);
            }
            match waiting.media.start_next(encoders)? {
                Some(next) => waiting.running = Some(next),
                None => return Ok(true),
            }
        }
    }

    /// Waits up to `timeout` for the running encoder call, if there is one.
    fn wait_for_encoder(&self, timeout: Duration) {
        if let Some((_, encoding)) = self.encoding.front().and_then(|w| w.running.as_ref()) {
            // A failure shows again when the call is finished; here it only ends the wait.
            let _ = encoding.wait(timeout);
        }
    }

    /// Cancels every request whose HTTP side has gone.
    fn cancel_abandoned(&mut self) {
        let gone: Vec<RequestId> =
            self.clients.iter().filter(|(_, events)| events.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            let actions = self.scheduler.cancel(id);
            self.apply(actions);
        }
    }

    /// Plans one step, runs its prefills and its batched decode, and applies what follows.
    fn step(&mut self) {
        let step = match self.scheduler.plan() {
            Ok(Some(step)) => step,
            Ok(None) => return,
            Err(e) => {
                tracing::error!("scheduler: {e}");
                return;
            }
        };
        let mut prefill = Vec::with_capacity(step.prefill.len());
        for work in step.prefill {
            let (slot, rows) = (work.slot, work.rows.clone());
            let input = match work.input {
                Some(input) => {
                    if let Some(events) = self.clients.get(&work.id) {
                        let _ = events.send(Event::Admitted { cached_rows: rows.start });
                    }
                    input
                }
                None => match self.partial.remove(&slot) {
                    Some(input) => input,
                    None => {
                        prefill.push(Err(format!("invariant: no prompt kept for slot {slot}'s next piece")));
                        continue;
                    }
                },
            };
            let logits = match &input {
                PendingInput::Tokens(tokens) => self.decoder.prefill_tokens_rows(slot, rows, tokens, Logits::Last),
                PendingInput::Embeddings(p) => self.decoder.prefill_embeddings_rows(
                    slot,
                    rows,
                    &p.embeddings,
                    &p.positions,
                    &p.extras,
                    Logits::Last,
                ),
            };
            // The prompt's buffers stay for its next piece, and go after its last.
            if !work.last && logits.is_ok() {
                self.partial.insert(slot, input);
            }
            prefill.push(logits.map_err(|e| format!("prefill failed: {e}")));
        }
        let decode = if step.decode.is_empty() {
            Ok(Vec::new())
        } else {
            self.decoder.decode(&step.decode).map_err(|e| format!("decode failed: {e}"))
        };
        match self.scheduler.complete(StepResult { prefill, decode }) {
            Ok(actions) => self.apply(actions),
            Err(e) => tracing::error!("scheduler: {e}"),
        }
    }

    fn apply(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Release { slot } => {
                    self.partial.remove(&slot);
                    if let Err(e) = self.decoder.release(slot) {
                        tracing::error!("releasing slot {slot}: {e}");
                    }
                }
                Action::Token { id, token, logprobs } => {
                    if let Some(events) = self.clients.get(&id) {
                        let _ = events.send(Event::Token { token, logprobs });
                    }
                }
                Action::Finished { id, reason, usage } => {
                    if let Some(events) = self.clients.remove(&id) {
                        let _ = events.send(Event::Finished { reason, usage });
                    }
                }
            }
        }
    }
}
