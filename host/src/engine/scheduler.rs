//! The continuous-batch scheduler as a pure state machine: requests wait in a
//! bounded FIFO queue, are admitted into a fixed number of KV slots, prefilled
//! and then decoded together, one batched decode per step. It owns each
//! request's logical token history and sampler; the caller (the engine
//! thread) runs the prefills and decodes it asks for and hands back logits.
//!
//! The protocol, all on one thread:
//!
//! - [`Scheduler::submit`] queues a request or refuses it (queue full, or the
//!   prompt plus `max_tokens` does not fit the context);
//! - [`Scheduler::plan`] returns the next [`Step`]: the prefills admitted this
//!   step (each with its input, moved out) and one batched decode of every
//!   slot that has a token to feed;
//! - [`Scheduler::complete`] takes that step's logits, samples each slot's
//!   next token with its request's sampler (penalties over the request's own
//!   logical prompt and generated tokens) and returns [`Action`]s: tokens
//!   (with log-probabilities when asked for), finished requests and the
//!   slots to release;
//! - [`Scheduler::cancel`] may come at any time, including between `plan` and
//!   `complete`.
//!
//! The caller executes every returned [`Action::Release`] before the next
//! `plan`, since a released slot may be prefilled again in that step.
//!
//! The prefix cache: a released slot's rows stay on the device, and the
//! scheduler remembers what each prompt row holds ([`RowKey`]: a token, or a
//! media item's row under its content digest, at its position). A request is
//! admitted into the free slot whose prompt rows share the longest prefix with
//! its own, and its prefill keeps that prefix ([`PrefillWork::keep`]) and
//! computes only the rest, exactly as a cold prefill would.

use std::{collections::VecDeque, fmt, ops::Range, time::Duration};

use crate::sampling::{History, Sampler, TokenLogprobs};

/// A request's identity, assigned by [`Scheduler::submit`] in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "r{}", self.0)
    }
}

/// What one cache row holds, as far as reusing it goes: two rows with equal
/// keys at the same index after equal prefixes hold the same values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowKey {
    pub content: RowContent,
    /// The row's rotary position: its three M-RoPE streams, or a 1-D
    /// position repeated (as M-RoPE gives a text row).
    pub position: [i32; 3],
}

/// The input of one cache row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowContent {
    /// A text token's embedding.
    Token(u32),
    /// Row `row` of a media item's placement, the item named by its content
    /// digest (over its bytes, the preprocessing and the encoder: the
    /// encoder cache's key), at the prompt's placeholder `token`.
    Media { digest: [u8; 16], row: u32, token: u32 },
}

impl RowKey {
    /// A token at 1-D position `position`.
    pub fn token(token: u32, position: usize) -> Self {
        let p = i32::try_from(position).unwrap_or(i32::MAX);
        RowKey { content: RowContent::Token(token), position: [p; 3] }
    }
}

/// A prepared prompt: whatever the engine prefills from embeddings. The
/// scheduler only needs its number of cache rows and what they hold; the
/// payload itself (large host buffers) is owned, moved to the engine with the
/// prefill that uses it and dropped there, or dropped here when the request is
/// refused or cancelled before its prefill.
pub trait Prepared {
    /// Cache rows the prefill writes (the expanded prompt length).
    fn rows(&self) -> usize;
    /// What each of those rows holds.
    fn row_keys(&self) -> Vec<RowKey>;
    /// Row ranges computed in one call (bidirectional blocks): a kept prefix
    /// never ends strictly inside one.
    fn atomic(&self) -> Vec<Range<usize>>;
}

/// What a request's prefill starts from.
#[derive(Debug)]
pub enum PendingInput<P> {
    /// Token ids, embedded by the decoder itself.
    Tokens(Vec<u32>),
    /// Prepared embeddings (text with media features merged in).
    Embeddings(P),
}

impl<P: Prepared> PendingInput<P> {
    /// Cache rows the prefill writes.
    pub fn rows(&self) -> usize {
        match self {
            PendingInput::Tokens(t) => t.len(),
            PendingInput::Embeddings(p) => p.rows(),
        }
    }
}

/// One request as the scheduler takes it.
#[derive(Debug)]
pub struct Request<P> {
    /// The prompt's logical tokens: what penalties, stop strings and usage
    /// count. For an embeddings prompt this differs from the cache rows
    /// (a media item is one logical part but many rows).
    pub prompt_tokens: Vec<u32>,
    pub input: PendingInput<P>,
    /// At most this many new tokens; `None` runs until the context is full.
    pub max_tokens: Option<usize>,
    /// Token ids that end the request (not emitted, not counted).
    pub stop_tokens: Vec<u32>,
    pub sampler: Sampler,
}

/// Sizes and policy.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// KV slots of the decoder bundle.
    pub slots: usize,
    /// Cache rows per slot (the bundle's context capacity).
    pub capacity: usize,
    /// Requests that may wait for a slot; past it, submissions are refused.
    pub queue_bound: usize,
    /// Prefills admitted per step, so that prefills do not starve the
    /// decoding slots.
    pub prefills_per_step: usize,
    /// The bundle's prefill chunk: rows per prefill call.
    pub chunk: usize,
    /// Prefill calls (chunks) per step while other slots decode: a long
    /// prompt is prefilled a few chunks at a time between decode steps, so
    /// the running streams never wait for a whole prompt. With nothing
    /// decoding, a prompt is prefilled whole.
    pub prefill_chunks_per_step: usize,
    /// The `Retry-After` hint of a queue-full refusal.
    pub retry_after: Duration,
    /// Whether a prefill may keep a free slot's rows (off: every prefill is cold, and no
    /// request's rows are reused for another, for servers whose tenants must not share even
    /// timing).
    pub prefix_cache: bool,
}

/// Why a request was refused at submission; nothing of it is kept.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("the queue is full ({depth} waiting); retry after {}s", retry_after.as_secs())]
    QueueFull { depth: usize, retry_after: Duration },
    #[error(
        "the prompt takes {prompt_rows} cache rows and asks for up to {max_tokens} new tokens; {} exceeds the context capacity of {capacity}",
        prompt_rows + max_tokens
    )]
    ContextExceeded { prompt_rows: usize, max_tokens: usize, capacity: usize },
    #[error("the prompt takes {prompt_rows} cache rows, more than the context capacity of {capacity}")]
    PromptTooLong { prompt_rows: usize, capacity: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
}

/// Misuse of the step protocol by the caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchedulerError {
    #[error("a step is in flight; complete it before planning the next")]
    StepInFlight,
    #[error("no step is in flight")]
    NoStepInFlight,
}

/// Why a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// One of its stop tokens was sampled.
    Stop {
        token: u32,
    },
    /// `max_tokens` were generated.
    Length,
    /// The slot's context is full.
    Capacity,
    Cancelled,
    /// Prefill, decode or sampling failed.
    Error(String),
}

/// What a finished request used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Logical prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated (a stop token not included).
    pub completion_tokens: usize,
    /// Cache rows the slot held at the end (expanded prompt plus fed tokens).
    pub cache_rows: usize,
    /// Prompt rows kept from the slot's earlier request (the prefix cache), not computed.
    pub cached_rows: usize,
}

/// What the caller does after `complete` or `cancel`.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Free the decoder's slot (`Decoder::release`). Emitted exactly once per
    /// prefill admitted into that slot.
    Release { slot: usize },
    /// A new token of a request, with its log-probabilities when its
    /// sampler reports them.
    Token { id: RequestId, token: u32, logprobs: Option<TokenLogprobs> },
    /// The request ended; emitted exactly once per accepted request.
    Finished { id: RequestId, reason: FinishReason, usage: Usage },
}

/// One piece of a request's prefill in a step: rows `rows` of its prompt.
/// The first piece carries the input (the engine keeps it for the later
/// pieces and drops it after the last, or when the slot is released).
#[derive(Debug)]
pub struct PrefillWork<P> {
    pub id: RequestId,
    pub slot: usize,
    /// `Some` with the first piece only.
    pub input: Option<PendingInput<P>>,
    /// The prompt rows this piece computes. The first piece starts after
    /// the rows kept from the slot's earlier request (the prefix cache);
    /// each piece is whole prefill calls, as a whole prefill would make them.
    pub rows: Range<usize>,
    /// Whether this piece ends the prompt: its logits (of the last row) are
    /// sampled; the other pieces' are not looked at.
    pub last: bool,
}

/// The work of one step: the prefills first, then one batched decode.
#[derive(Debug)]
pub struct Step<P> {
    pub prefill: Vec<PrefillWork<P>>,
    /// `(slot, token)` for `Decoder::decode`, in slot order.
    pub decode: Vec<(usize, u32)>,
}

/// The logits of a step, in the order of its [`Step`].
#[derive(Clone, Debug)]
pub struct StepResult {
    /// Per prefill piece, the logits of its last row (empty for a piece that
    /// does not end the prompt), or why it failed.
    pub prefill: Vec<Result<Vec<f32>, String>>,
    /// Per decoded slot, its logits; or why the batched decode failed.
    pub decode: Result<Vec<Vec<f32>>, String>,
}

/// What a slot's rows hold, kept while the slot is free for a later prefix.
#[derive(Debug, Default)]
struct Held {
    /// The last prompt prefilled into the slot. Decoded rows are not kept:
    /// the one-row decode computes a token's K and V with other kernels than
    /// a prefill does (1.3e-6 apart in the next logits, measured on Qwen3),
    /// and a kept prefix must give exactly what a cold prefill gives.
    rows: Vec<RowKey>,
    /// That prompt's rows computed in one call (bidirectional blocks): a row
    /// inside one saw the block's later rows too, so a kept prefix never ends
    /// inside one, whatever the new prompt's blocks are.
    atomic: Vec<Range<usize>>,
    /// The step at which the slot was last admitted into: the least recent
    /// is overwritten first.
    used: u64,
}

/// Where a request sits once it owns a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Its prefill of `rows` rows has computed rows up to `done`; the next
    /// piece is in flight or waits for the next step.
    Prefilling { rows: usize, done: usize, in_flight: bool },
    /// It has a token to feed at the next decode.
    Ready(u32),
    /// Its decode is in flight.
    Decoding,
}

#[derive(Debug)]
struct Queued<P> {
    id: RequestId,
    request: Request<P>,
}

#[derive(Debug)]
struct Active {
    id: RequestId,
    phase: Phase,
    /// Logical tokens: the prompt's, then every generated token.
    history: Vec<u32>,
    prompt_tokens: usize,
    generated: usize,
    /// Cache rows written (expanded prompt plus fed tokens).
    cache_len: usize,
    /// Prompt rows kept from the slot's earlier request.
    cached_rows: usize,
    max_tokens: Option<usize>,
    stop_tokens: Vec<u32>,
    sampler: Sampler,
    /// Cancelled while its step was in flight: finished already, the slot is
    /// released when the step completes.
    cancelled: bool,
    /// The prefill calls not yet run, `(start, rows)`, in order.
    calls: VecDeque<(usize, usize)>,
}

impl Active {
    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.generated,
            cache_rows: self.cache_len,
            cached_rows: self.cached_rows,
        }
    }
}

/// A view of a request in a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress<'a> {
    pub slot: usize,
    /// Logical tokens: prompt then generated.
    pub history: &'a [u32],
    /// Cache rows written.
    pub cache_len: usize,
}

/// The state machine. `P` is the prepared-prompt payload.
#[derive(Debug)]
pub struct Scheduler<P> {
    config: SchedulerConfig,
    queue: VecDeque<Queued<P>>,
    slots: Vec<Option<Active>>,
    /// Per slot, what its rows hold (valid rows only).
    held: Vec<Held>,
    in_flight: Option<InFlight>,
    next_id: u64,
    steps: u64,
    /// Prompt rows kept by prefills so far (the prefix cache's reuse).
    reused_rows: u64,
}

/// The slots of the step in flight, in the order of its results.
#[derive(Debug)]
struct InFlight {
    /// `(slot, end of the piece)`.
    prefill: Vec<(usize, usize)>,
    /// `(slot, token fed)`.
    decode: Vec<(usize, u32)>,
}

impl<P: Prepared> Scheduler<P> {
    pub fn new(config: SchedulerConfig) -> Self {
        let slots = (0..config.slots).map(|_| None).collect();
        let held = (0..config.slots).map(|_| Held::default()).collect();
        Scheduler { config, queue: VecDeque::new(), slots, held, in_flight: None, next_id: 0, steps: 0, reused_rows: 0 }
    }

    /// Prompt rows that prefills kept from earlier requests instead of computing them.
    pub fn reused_rows(&self) -> u64 {
        self.reused_rows
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Requests waiting for a slot.
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// Slots owned by a request (including ones awaiting release).
    pub fn active_slots(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// Cache rows that slot-owning requests hold: a prefilling prompt's rows (all of them: they
    /// are reserved), else the rows written. Rows a released slot keeps for the prefix cache are
    /// free: any request may take the slot.
    pub fn rows_in_use(&self) -> usize {
        self.slots
            .iter()
            .flatten()
            .map(|a| match a.phase {
                Phase::Prefilling { rows, .. } => rows.max(a.cache_len),
                Phase::Ready(_) | Phase::Decoding => a.cache_len,
            })
            .sum()
    }

    /// The request owning `slot`.
    pub fn slot_owner(&self, slot: usize) -> Option<RequestId> {
        self.slots.get(slot)?.as_ref().map(|a| a.id)
    }

    /// Whether nothing is queued, owned or in flight.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.in_flight.is_none() && self.slots.iter().all(Option::is_none)
    }

    /// A slotted request's history and cache length.
    pub fn progress(&self, id: RequestId) -> Option<Progress<'_>> {
        self.slots.iter().enumerate().find_map(|(slot, a)| match a {
            Some(a) if a.id == id => Some(Progress { slot, history: &a.history, cache_len: a.cache_len }),
            _ => None,
        })
    }

    /// Queues a request, or refuses it; a refused request (its payload
    /// included) is dropped here.
    pub fn submit(&mut self, request: Request<P>) -> Result<RequestId, SubmitError> {
        let (rows, capacity) = (request.input.rows(), self.config.capacity);
        if rows == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        match request.max_tokens {
            Some(0) => return Err(SubmitError::ZeroMaxTokens),
            // Conservative: room for every new token's row, so a request
            // with `max_tokens` always ends by length, never by capacity.
            Some(max_tokens) if rows + max_tokens > capacity => {
                return Err(SubmitError::ContextExceeded { prompt_rows: rows, max_tokens, capacity });
            }
            None if rows > capacity => return Err(SubmitError::PromptTooLong { prompt_rows: rows, capacity }),
            _ => {}
        }
        if self.queue.len() >= self.config.queue_bound {
            return Err(SubmitError::QueueFull { depth: self.queue.len(), retry_after: self.config.retry_after });
        }
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.queue.push_back(Queued { id, request });
        Ok(id)
    }

    /// Cancels a request wherever it is. Queued: dequeued (its payload
    /// dropped). In a slot with no step in flight: released now. In a step in
    /// flight: finished now, released when the step completes. Unknown or
    /// finished requests: nothing.
    pub fn cancel(&mut self, id: RequestId) -> Vec<Action> {
        if let Some(at) = self.queue.iter().position(|q| q.id == id) {
            let prompt_tokens = self.queue.remove(at).map_or(0, |q| q.request.prompt_tokens.len());
            let usage = Usage { prompt_tokens, completion_tokens: 0, cache_rows: 0, cached_rows: 0 };
            return vec![Action::Finished { id, reason: FinishReason::Cancelled, usage }];
        }
        let Some(slot) = self.slots.iter().position(|a| a.as_ref().is_some_and(|a| a.id == id && !a.cancelled)) else {
            return Vec::new();
        };
        let Some(active) = self.slots[slot].as_mut() else {
            return Vec::new();
        };
        match active.phase {
            Phase::Ready(_) | Phase::Prefilling { in_flight: false, .. } => {
                let mut actions = Vec::new();
                self.finish(slot, FinishReason::Cancelled, &mut actions);
                actions
            }
            Phase::Prefilling { in_flight: true, .. } | Phase::Decoding => {
                active.cancelled = true;
                vec![Action::Finished { id, reason: FinishReason::Cancelled, usage: active.usage() }]
            }
        }
    }

    /// The next step: the next piece of each prompt being prefilled, up to
    /// `prefills_per_step` queued requests admitted (FIFO) into free slots with
    /// their first piece, and one decode of every slot with a token to feed.
    /// While slots decode, the pieces of a step hold `prefill_chunks_per_step`
    /// calls in all (the oldest prompt first); otherwise each prompt is
    /// prefilled whole. `None` when there is nothing to do. Each request goes
    /// to the free slot whose rows share the longest prefix with its own;
    /// without one, to an empty slot, else the least recently used, the
    /// lowest first.
    pub fn plan(&mut self) -> Result<Option<Step<P>>, SchedulerError> {
        if self.in_flight.is_some() {
            return Err(SchedulerError::StepInFlight);
        }
        // Slots prefilled in this step decode from the next one: their first
        // token comes from the prefill's logits.
        let decode: Vec<(usize, u32)> = self
            .slots
            .iter_mut()
            .enumerate()
            .filter_map(|(slot, a)| {
                let a = a.as_mut()?;
                let Phase::Ready(token) = a.phase else { return None };
                a.phase = Phase::Decoding;
                Some((slot, token))
            })
            .collect();
        self.steps += 1;
        let mut budget = if decode.is_empty() { usize::MAX } else { self.config.prefill_chunks_per_step.max(1) };
        // Prompts already part-prefilled go first, oldest first.
        let mut waiting: Vec<(RequestId, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, a)| {
                let a = a.as_ref()?;
                matches!(a.phase, Phase::Prefilling { in_flight: false, .. }).then_some((a.id, slot))
            })
            .collect();
        waiting.sort();
        let mut prefill = Vec::new();
        for (id, slot) in waiting {
            if budget == 0 {
                break;
            }
            if let Some(work) = self.next_piece(slot, id, None, &mut budget) {
                prefill.push(work);
            }
        }
        let mut admitted = 0;
        while admitted < self.config.prefills_per_step && budget > 0 {
            if self.slots.iter().all(Option::is_some) {
                break;
            }
            let Some(Queued { id, request }) = self.queue.pop_front() else { break };
            let Request { prompt_tokens, input, max_tokens, stop_tokens, sampler } = request;
            let (rows, atomic) = match &input {
                PendingInput::Tokens(t) => {
                    (t.iter().enumerate().map(|(i, &t)| RowKey::token(t, i)).collect(), Vec::new())
                }
                PendingInput::Embeddings(p) => (p.row_keys(), p.atomic()),
            };
            let (slot, keep) = self.choose_slot(&rows, &atomic);
            self.held[slot] = Held { rows, atomic: atomic.clone(), used: self.steps };
            self.reused_rows += keep as u64;
            let calls = crate::decoder::chunk_spans(keep, input.rows(), self.config.chunk, &atomic).into();
            self.slots[slot] = Some(Active {
                id,
                phase: Phase::Prefilling { rows: input.rows(), done: keep, in_flight: false },
                prompt_tokens: prompt_tokens.len(),
                history: prompt_tokens,
                generated: 0,
                cache_len: 0,
                cached_rows: keep,
                max_tokens,
                stop_tokens,
                sampler,
                cancelled: false,
                calls,
            });
            admitted += 1;
            if let Some(work) = self.next_piece(slot, id, Some(input), &mut budget) {
                prefill.push(work);
            }
        }
        if prefill.is_empty() && decode.is_empty() {
            return Ok(None);
        }
        let pieces = prefill.iter().map(|p| (p.slot, p.rows.end)).collect();
        self.in_flight = Some(InFlight { prefill: pieces, decode: decode.clone() });
        Ok(Some(Step { prefill, decode }))
    }

    /// The next piece of `slot`'s prefill: up to `budget` of its remaining calls, taken from it.
    fn next_piece(
        &mut self,
        slot: usize,
        id: RequestId,
        input: Option<PendingInput<P>>,
        budget: &mut usize,
    ) -> Option<PrefillWork<P>> {
        let active = self.slots[slot].as_mut()?;
        let Phase::Prefilling { rows, done, .. } = active.phase else { return None };
        let take = active.calls.len().min(*budget);
        let end = active.calls.drain(..take).next_back().map_or(done, |(start, n)| start + n);
        *budget -= take;
        active.phase = Phase::Prefilling { rows, done, in_flight: true };
        Some(PrefillWork { id, slot, input, rows: done..end, last: end == rows })
    }

    /// The free slot for a prompt of `rows`, and how many of its rows it keeps: the longest
    /// shared prefix, at most all rows but the last (whose logits the prefill returns), and
    /// never ending strictly inside an `atomic` range of the new prompt or of the held one (a
    /// held row inside a block saw rows past the prefix: two images' tokens see each other).
    fn choose_slot(&self, rows: &[RowKey], atomic: &[Range<usize>]) -> (usize, usize) {
        let keep = |held: &Held| {
            if !self.config.prefix_cache {
                return 0;
            }
            let shared = held.rows.iter().zip(rows).take_while(|(a, b)| a == b).count();
            let mut keep = shared.min(rows.len().saturating_sub(1));
            // Backing off to one block's start may land inside another (the two prompts' blocks
            // differ): until none holds it.
            while let Some(r) = atomic.iter().chain(&held.atomic).find(|r| r.start < keep && keep < r.end) {
                keep = r.start;
            }
            keep
        };
        let free = (0..self.slots.len()).filter(|&s| self.slots[s].is_none());
        // The longest prefix; then an empty slot; then the least recently used; then the lowest.
        let best = free.min_by_key(|&s| {
            let held = &self.held[s];
            (std::cmp::Reverse(keep(held)), !held.rows.is_empty(), held.used, s)
        });
        let slot = best.expect("invariant: plan admits only while a slot is free");
        (slot, keep(&self.held[slot]))
    }

    /// Takes the logits of the step in flight, samples each slot's next
    /// token and returns what follows. A result that does not match the step
    /// (wrong counts) fails every request of the step.
    pub fn complete(&mut self, result: StepResult) -> Result<Vec<Action>, SchedulerError> {
        let flight = self.in_flight.take().ok_or(SchedulerError::NoStepInFlight)?;
        let mut actions = Vec::new();
        if result.prefill.len() != flight.prefill.len() {
            let error = format!("{} prefill results for {} prefills", result.prefill.len(), flight.prefill.len());
            for &(slot, _) in &flight.prefill {
                self.finish(slot, FinishReason::Error(error.clone()), &mut actions);
            }
        } else {
            for (&(slot, end), logits) in flight.prefill.iter().zip(result.prefill) {
                let Some(a) = self.slots[slot].as_mut() else { continue };
                let Phase::Prefilling { rows, done, .. } = a.phase else { continue };
                match &logits {
                    // A piece that does not end the prompt: the next one waits for the next step.
                    Ok(_) if end < rows => {
                        a.phase = Phase::Prefilling { rows, done: end, in_flight: false };
                        if a.cancelled {
                            self.finish(slot, FinishReason::Cancelled, &mut actions);
                        }
                        continue;
                    }
                    Ok(_) => {
                        a.phase = Phase::Prefilling { rows, done: end, in_flight: false };
                        a.cache_len = rows;
                    }
                    // What a failed piece left past its start is unknown.
                    Err(_) => a.phase = Phase::Prefilling { rows, done, in_flight: false },
                }
                self.advance(slot, logits, &mut actions);
            }
        }
        match result.decode {
            Ok(rows) if rows.len() == flight.decode.len() => {
                for (&(slot, _), logits) in flight.decode.iter().zip(rows) {
                    if let Some(a) = self.slots[slot].as_mut() {
                        // The token fed by this decode now has its row.
                        a.cache_len += 1;
                    }
                    self.advance(slot, Ok(logits), &mut actions);
                }
            }
            Ok(rows) => {
                let error = format!("{} decode results for {} slots", rows.len(), flight.decode.len());
                for &(slot, _) in &flight.decode {
                    self.finish(slot, FinishReason::Error(error.clone()), &mut actions);
                }
            }
            Err(error) => {
                for &(slot, _) in &flight.decode {
                    self.finish(slot, FinishReason::Error(error.clone()), &mut actions);
                }
            }
        }
        Ok(actions)
    }

    /// One slot's logits (or failure) from the step in flight.
    fn advance(&mut self, slot: usize, logits: Result<Vec<f32>, String>, actions: &mut Vec<Action>) {
        let Some(active) = self.slots[slot].as_mut() else { return };
        if active.cancelled {
            self.finish(slot, FinishReason::Cancelled, actions);
            return;
        }
        // The penalties see the logical prompt, then the tokens generated so far.
        let (prompt, generated) = active.history.split_at(active.prompt_tokens);
        let history = History { prompt, generated };
        let sampled = logits.and_then(|l| active.sampler.sample(&l, history).map_err(|e| e.to_string()));
        let (token, logprobs) = match sampled {
            Ok(sampled) => (sampled.token, sampled.logprobs),
            Err(error) => {
                self.finish(slot, FinishReason::Error(error), actions);
                return;
            }
        };
        if active.stop_tokens.contains(&token) {
            self.finish(slot, FinishReason::Stop { token }, actions);
            return;
        }
        active.history.push(token);
        active.generated += 1;
        actions.push(Action::Token { id: active.id, token, logprobs });
        if active.max_tokens.is_some_and(|m| active.generated >= m) {
            self.finish(slot, FinishReason::Length, actions);
        } else if active.cache_len >= self.config.capacity {
            // No row left to feed the token just sampled.
            self.finish(slot, FinishReason::Capacity, actions);
        } else {
            active.phase = Phase::Ready(token);
        }
    }

    /// Frees `slot` and reports its request finished, unless a cancellation
    /// reported it already. A prompt cut short keeps only the rows it wrote.
    fn finish(&mut self, slot: usize, reason: FinishReason, actions: &mut Vec<Action>) {
        let Some(active) = self.slots[slot].take() else { return };
        if let Phase::Prefilling { done, .. } = active.phase {
            self.held[slot].rows.truncate(done);
        }
        actions.push(Action::Release { slot });
        if !active.cancelled {
            actions.push(Action::Finished { id: active.id, reason, usage: active.usage() });
        }
    }
}

#[cfg(test)]
mod tests;
