//! Scheduler tests: scripts of events checked against the trace of what the
//! scheduler answers, and a seeded random walk checked against invariants.

use std::{cell::Cell, collections::HashMap, fmt::Write, ops::Range, rc::Rc, time::Duration};

use rand_chacha::{
    ChaCha8Rng,
    rand_core::{RngCore, SeedableRng},
};

use super::*;
use crate::sampling::{Sampler, SamplingParams};

/// A prepared prompt that counts its drops, standing in for the engine's
/// large host buffers.
#[derive(Debug)]
struct Payload {
    rows: usize,
    /// What its rows hold: by default media rows of an item named by `media`.
    keys: Vec<RowKey>,
    atomic: Vec<Range<usize>>,
    drops: Rc<Cell<usize>>,
}

impl Payload {
    /// `rows` rows of text tokens `base + 1..` with the item `media`'s rows at `at`.
    fn new(rows: usize, base: u32, media: u8, at: Range<usize>, atomic: bool, drops: Rc<Cell<usize>>) -> Self {
        let keys = (0..rows)
            .map(|i| {
                let content = if at.contains(&i) {
                    RowContent::Media { digest: [media; 16], row: (i - at.start) as u32, token: 99 }
                } else {
                    RowContent::Token(base + i as u32 + 1)
                };
                RowKey { content, position: [i as i32; 3] }
            })
            .collect();
        let atomic = if atomic && !at.is_empty() { vec![at] } else { Vec::new() };
        Payload { rows, keys, atomic, drops }
    }
}

impl Prepared for Payload {
    fn rows(&self) -> usize {
        self.rows
    }

    fn row_keys(&self) -> Vec<RowKey> {
        self.keys.clone()
    }

    fn atomic(&self) -> Vec<Range<usize>> {
        self.atomic.clone()
    }
}

impl Drop for Payload {
    fn drop(&mut self) {
        self.drops.set(self.drops.get() + 1);
    }
}

const VOCAB: usize = 16;
/// The token every slot samples unless a script says otherwise.
const DEFAULT_TOKEN: u32 = 7;

fn one_hot(token: u32) -> Vec<f32> {
    let mut logits = vec![0.0; VOCAB];
    logits[token as usize] = 1.0;
    logits
}

/// Logits falling from 1 (token 0) by 1/16 a token, all positive: a
/// repetition penalty of 2 sends a seen token below every unseen one.
fn ramp() -> Vec<f32> {
    (0..VOCAB).map(|i| (VOCAB - i) as f32 / VOCAB as f32).collect()
}

fn config(slots: usize, queue_bound: usize, capacity: usize, prefills_per_step: usize) -> SchedulerConfig {
    SchedulerConfig {
        slots,
        capacity,
        queue_bound,
        prefills_per_step,
        // Prompts are prefilled whole unless a test says otherwise.
        chunk: 4,
        prefill_chunks_per_step: usize::MAX,
        retry_after: Duration::from_secs(2),
        prefix_cache: true,
    }
}

fn greedy() -> Sampler {
    Sampler::new(SamplingParams::GREEDY, Some(0)).expect("invariant: greedy parameters are valid")
}

/// A greedy sampler with a repetition penalty, reporting `logprobs` top
/// log-probabilities when asked.
fn penalised(repetition_penalty: f32, logprobs: Option<usize>) -> Sampler {
    sampler(SamplingParams { repetition_penalty, ..SamplingParams::GREEDY }, logprobs)
}

fn sampler(params: SamplingParams, logprobs: Option<usize>) -> Sampler {
    Sampler::new(params, Some(0)).and_then(|s| s.with_logprobs(logprobs)).expect("valid sampling parameters")
}

/// Runs a script, one command a line, and returns the trace: each command,
/// then `-> ` and what the scheduler answered.
///
/// - `config slots=N queue=N capacity=N prefills=N [chunk=N budget=N]`
///   (first, optional; prompts are prefilled whole unless `budget` is given)
/// - `submit tokens=N | prompt=T,T,... | embeds=ROWS logical=N [media=D@S..E [bidi]] [from=B]
///   [max=N] [stop=T] [rep=F] [freq=F] [logprobs=N]`: a greedy request
///   whose logical prompt is tokens `1..=N` and whose cache rows are tokens
///   `B+1..` (`B` is 100 times the submission's ordinal unless given, so that
///   prompts share no prefix unless a script says so), the rows `S..E` of an
///   embeddings prompt those of media item `D` (one bidirectional block with
///   `bidi`); `prompt` lists the token prompt's rows; with a repetition or frequency penalty `F`, reporting `N` top
///   log-probabilities
/// - `plan`: the next step; its prefill payloads are dropped as the engine
///   drops them once prefilled
/// - `complete [rI=T | rI=ramp | rI=err] [decode=err]`: the step's logits,
///   each slot's one-hot on token T (7 by default) or [`ramp`], or a failure
/// - `step [...]`: `plan` then `complete [...]`
/// - `cancel rI`, `progress rI`, `drops`
fn run(script: &str) -> String {
    let drops = Rc::new(Cell::new(0));
    let mut sched = Scheduler::<Payload>::new(config(2, 4, 32, 1));
    let mut flight: Option<(Vec<RequestId>, Vec<usize>)> = None;
    let mut out = String::new();
    let mut submitted = 0;
    for line in script.lines().map(str::trim).filter(|l| !l.is_empty()) {
        writeln!(out, "{line}").unwrap();
        let (cmd, rest) = line.split_once(' ').unwrap_or((line, ""));
        let args: HashMap<&str, &str> = rest.split_whitespace().filter_map(|a| a.split_once('=')).collect();
        let num = |k: &str| args.get(k).map(|v| v.parse::<usize>().unwrap());
        let id = |s: &str| RequestId(s.trim_start_matches('r').parse().unwrap());
        match cmd {
            "config" => {
                let base = config(
                    num("slots").unwrap(),
                    num("queue").unwrap(),
                    num("capacity").unwrap(),
                    num("prefills").unwrap_or(1),
                );
                sched = Scheduler::new(SchedulerConfig {
                    chunk: num("chunk").unwrap_or(base.chunk),
                    prefill_chunks_per_step: num("budget").unwrap_or(base.prefill_chunks_per_step),
                    ..base
                })
            }
            "submit" => {
                let base = num("from").unwrap_or(100 * submitted) as u32;
                submitted += 1;
                let listed = args.get("prompt").map(|p| p.split(',').map(|t| t.parse().unwrap()).collect::<Vec<u32>>());
                let (input, logical) = match (num("tokens"), listed) {
                    (_, Some(tokens)) => {
                        let n = tokens.len();
                        (PendingInput::Tokens(tokens), n)
                    }
                    (Some(n), None) => (PendingInput::Tokens((base + 1..=base + n as u32).collect()), n),
                    (None, None) => {
                        // `media=D@S..E`: item D's rows at S..E (`bidi` makes them one block).
                        let (media, at) = match args.get("media") {
                            Some(m) => {
                                let (d, span) = m.split_once('@').unwrap();
                                let (a, b) = span.split_once("..").unwrap();
                                (d.parse().unwrap(), a.parse().unwrap()..b.parse().unwrap())
                            }
                            None => (0, 0..0),
                        };
                        let rows = num("embeds").unwrap();
                        let atomic = rest.split_whitespace().any(|w| w == "bidi");
                        let payload = Payload::new(rows, base, media, at, atomic, drops.clone());
                        (PendingInput::Embeddings(payload), num("logical").unwrap())
                    }
                };
                let request = Request {
                    prompt_tokens: (1..=logical as u32).collect(),
                    input,
                    max_tokens: num("max"),
                    stop_tokens: num("stop").map(|t| vec![t as u32]).unwrap_or_default(),
                    sampler: sampler(
                        SamplingParams {
                            repetition_penalty: args.get("rep").map_or(1.0, |r| r.parse().unwrap()),
                            frequency_penalty: args.get("freq").map_or(0.0, |f| f.parse().unwrap()),
                            ..SamplingParams::GREEDY
                        },
                        num("logprobs"),
                    ),
                };
                match sched.submit(request) {
                    Ok(id) => writeln!(out, "-> {id}").unwrap(),
                    Err(e) => writeln!(out, "-> refused: {e}").unwrap(),
                }
            }
            "plan" | "step" => {
                flight = plan(&mut sched, &mut out);
                if cmd == "step" && flight.is_some() {
                    complete(&mut sched, flight.take().unwrap(), &args, &mut out);
                }
            }
            "complete" => complete(&mut sched, flight.take().unwrap(), &args, &mut out),
            "cancel" => trace(&sched.cancel(id(rest.trim())), &mut out),
            "progress" => {
                let p = sched.progress(id(rest.trim())).unwrap();
                writeln!(out, "-> slot {}, history {:?}, cache {}", p.slot, p.history, p.cache_len).unwrap()
            }
            "drops" => writeln!(out, "-> {} dropped", drops.get()).unwrap(),
            _ => panic!("unknown command {cmd:?}"),
        }
    }
    out
}

fn plan(sched: &mut Scheduler<Payload>, out: &mut String) -> Option<(Vec<RequestId>, Vec<usize>)> {
    let Some(step) = sched.plan().unwrap() else {
        writeln!(out, "-> idle").unwrap();
        return None;
    };
    for p in &step.prefill {
        match &p.input {
            // A whole prompt in one piece.
            Some(input) if p.last => {
                let kept = if p.rows.start > 0 { format!(", {} kept", p.rows.start) } else { String::new() };
                writeln!(out, "-> prefill {} slot {} ({} rows{kept})", p.id, p.slot, input.rows()).unwrap()
            }
            _ => {
                let last = if p.last { ", last" } else { "" };
                writeln!(out, "-> prefill {} slot {} rows {:?}{last}", p.id, p.slot, p.rows).unwrap()
            }
        }
    }
    if !step.decode.is_empty() {
        let slots: Vec<String> = step.decode.iter().map(|(s, t)| format!("{s}:{t}")).collect();
        writeln!(out, "-> decode [{}]", slots.join(", ")).unwrap();
    }
    let ids = step.prefill.iter().map(|p| p.id).collect();
    let slots = step.decode.iter().map(|&(s, _)| s).collect();
    // The engine drops each input once its prefill has run.
    drop(step);
    Some((ids, slots))
}

fn complete(
    sched: &mut Scheduler<Payload>,
    (ids, slots): (Vec<RequestId>, Vec<usize>),
    args: &HashMap<&str, &str>,
    out: &mut String,
) {
    let logits = |id: RequestId| match args.get(id.to_string().as_str()) {
        Some(&"err") => Err("injected failure".to_owned()),
        Some(&"ramp") => Ok(ramp()),
        Some(t) => Ok(one_hot(t.parse().unwrap())),
        None => Ok(one_hot(DEFAULT_TOKEN)),
    };
    let prefill = ids.iter().map(|&id| logits(id)).collect();
    let decode = if args.get("decode") == Some(&"err") {
        Err("injected decode failure".to_owned())
    } else {
        slots.iter().map(|&s| logits(sched.slot_owner(s).unwrap())).collect()
    };
    trace(&sched.complete(StepResult { prefill, decode }).unwrap(), out);
}

fn trace(actions: &[Action], out: &mut String) {
    for a in actions {
        match a {
            Action::Release { slot } => writeln!(out, "-> release slot {slot}"),
            Action::Token { id, token, logprobs: None } => writeln!(out, "-> token {id} {token}"),
            Action::Token { id, token, logprobs: Some(lp) } => {
                let top: Vec<String> = lp.top.iter().map(|(t, l)| format!("{t} {l:.4}")).collect();
                writeln!(out, "-> token {id} {token} (logprob {:.4}, top [{}])", lp.logprob, top.join(", "))
            }
            Action::Finished { id, reason, usage } => {
                let reason = match reason {
                    FinishReason::Stop { token } => format!("stop {token}"),
                    FinishReason::Length => "length".into(),
                    FinishReason::Capacity => "capacity".into(),
                    FinishReason::Cancelled => "cancelled".into(),
                    FinishReason::Error(e) => format!("error: {e}"),
                };
                let Usage { prompt_tokens, completion_tokens, cache_rows, cached_rows: _ } = usage;
                writeln!(
                    out,
                    "-> finished {id} {reason} (prompt {prompt_tokens}, completion {completion_tokens}, cache {cache_rows})"
                )
            }
        }
        .unwrap();
    }
}

fn check(script: &str, expect: &str) {
    let actual = run(script);
    let norm = |s: &str| s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join("\n");
    assert_eq!(norm(&actual), norm(expect), "\nactual trace:\n{actual}");
}

#[test]
fn admission_up_to_the_queue_bound_then_refusal() {
    check(
        "
        config slots=1 queue=2 capacity=32
        submit tokens=3 max=2
        submit tokens=3 max=2
        submit tokens=3 max=2
        step
        submit tokens=3 max=2
        submit tokens=3 max=2
        ",
        "
        config slots=1 queue=2 capacity=32
        submit tokens=3 max=2
        -> r0
        submit tokens=3 max=2
        -> r1
        submit tokens=3 max=2
        -> refused: the queue is full (2 waiting); retry after 2s
        step
        -> prefill r0 slot 0 (3 rows)
        -> token r0 7
        submit tokens=3 max=2
        -> r2
        submit tokens=3 max=2
        -> refused: the queue is full (2 waiting); retry after 2s
        ",
    );
}

#[test]
fn fifo_admission_fills_slots_and_reuses_them() {
    check(
        "
        config slots=2 queue=4 capacity=32
        submit tokens=3 max=2
        submit tokens=4 max=2
        submit tokens=5 max=2
        submit tokens=6 max=2
        step
        step
        step
        step
        step
        step
        ",
        "
        config slots=2 queue=4 capacity=32
        submit tokens=3 max=2
        -> r0
        submit tokens=4 max=2
        -> r1
        submit tokens=5 max=2
        -> r2
        submit tokens=6 max=2
        -> r3
        step
        -> prefill r0 slot 0 (3 rows)
        -> token r0 7
        step
        -> prefill r1 slot 1 (4 rows)
        -> decode [0:7]
        -> token r1 7
        -> token r0 7
        -> release slot 0
        -> finished r0 length (prompt 3, completion 2, cache 4)
        step
        -> prefill r2 slot 0 (5 rows)
        -> decode [1:7]
        -> token r2 7
        -> token r1 7
        -> release slot 1
        -> finished r1 length (prompt 4, completion 2, cache 5)
        step
        -> prefill r3 slot 1 (6 rows)
        -> decode [0:7]
        -> token r3 7
        -> token r2 7
        -> release slot 0
        -> finished r2 length (prompt 5, completion 2, cache 6)
        step
        -> decode [1:7]
        -> token r3 7
        -> release slot 1
        -> finished r3 length (prompt 6, completion 2, cache 7)
        step
        -> idle
        ",
    );
}

#[test]
fn several_prefills_per_step() {
    check(
        "
        config slots=2 queue=4 capacity=32 prefills=2
        submit tokens=3 max=1
        submit tokens=4 max=1
        submit tokens=5 max=1
        step
        step
        step
        ",
        "
        config slots=2 queue=4 capacity=32 prefills=2
        submit tokens=3 max=1
        -> r0
        submit tokens=4 max=1
        -> r1
        submit tokens=5 max=1
        -> r2
        step
        -> prefill r0 slot 0 (3 rows)
        -> prefill r1 slot 1 (4 rows)
        -> token r0 7
        -> release slot 0
        -> finished r0 length (prompt 3, completion 1, cache 3)
        -> token r1 7
        -> release slot 1
        -> finished r1 length (prompt 4, completion 1, cache 4)
        step
        -> prefill r2 slot 0 (5 rows)
        -> token r2 7
        -> release slot 0
        -> finished r2 length (prompt 5, completion 1, cache 5)
        step
        -> idle
        ",
    );
}

#[test]
fn cancellation_in_every_state() {
    check(
        "
        config slots=1 queue=4 capacity=32
        submit embeds=8 logical=3 max=4
        submit embeds=8 logical=3 max=4
        submit tokens=3 max=4
        submit tokens=3 max=4
        cancel r1
        drops
        step
        drops
        cancel r0
        cancel r0
        plan
        cancel r2
        complete
        step
        plan
        cancel r3
        complete
        step
        ",
        "
        config slots=1 queue=4 capacity=32
        submit embeds=8 logical=3 max=4
        -> r0
        submit embeds=8 logical=3 max=4
        -> r1
        submit tokens=3 max=4
        -> r2
        submit tokens=3 max=4
        -> r3
        cancel r1
        -> finished r1 cancelled (prompt 3, completion 0, cache 0)
        drops
        -> 1 dropped
        step
        -> prefill r0 slot 0 (8 rows)
        -> token r0 7
        drops
        -> 2 dropped
        cancel r0
        -> release slot 0
        -> finished r0 cancelled (prompt 3, completion 1, cache 8)
        cancel r0
        plan
        -> prefill r2 slot 0 (3 rows)
        cancel r2
        -> finished r2 cancelled (prompt 3, completion 0, cache 0)
        complete
        -> release slot 0
        step
        -> prefill r3 slot 0 (3 rows)
        -> token r3 7
        plan
        -> decode [0:7]
        cancel r3
        -> finished r3 cancelled (prompt 3, completion 1, cache 3)
        complete
        -> release slot 0
        step
        -> idle
        ",
    );
}

#[test]
fn large_buffers_are_dropped_exactly_once() {
    check(
        "
        config slots=1 queue=1 capacity=32
        submit embeds=40 logical=2
        drops
        submit embeds=8 logical=2 max=1
        submit embeds=8 logical=2 max=1
        drops
        plan
        drops
        complete
        cancel r0
        drops
        ",
        "
        config slots=1 queue=1 capacity=32
        submit embeds=40 logical=2
        -> refused: the prompt takes 40 cache rows, more than the context capacity of 32
        drops
        -> 1 dropped
        submit embeds=8 logical=2 max=1
        -> r0
        submit embeds=8 logical=2 max=1
        -> refused: the queue is full (1 waiting); retry after 2s
        drops
        -> 2 dropped
        plan
        -> prefill r0 slot 0 (8 rows)
        drops
        -> 3 dropped
        complete
        -> token r0 7
        -> release slot 0
        -> finished r0 length (prompt 2, completion 1, cache 8)
        cancel r0
        drops
        -> 3 dropped
        ",
    );
}

#[test]
fn logical_history_is_apart_from_the_cache_length() {
    check(
        "
        config slots=1 queue=1 capacity=32
        submit embeds=10 logical=4 max=3
        step r0=11
        progress r0
        step r0=12
        progress r0
        step r0=13
        ",
        "
        config slots=1 queue=1 capacity=32
        submit embeds=10 logical=4 max=3
        -> r0
        step r0=11
        -> prefill r0 slot 0 (10 rows)
        -> token r0 11
        progress r0
        -> slot 0, history [1, 2, 3, 4, 11], cache 10
        step r0=12
        -> decode [0:11]
        -> token r0 12
        progress r0
        -> slot 0, history [1, 2, 3, 4, 11, 12], cache 11
        step r0=13
        -> decode [0:12]
        -> token r0 13
        -> release slot 0
        -> finished r0 length (prompt 4, completion 3, cache 12)
        ",
    );
}

#[test]
fn prompt_plus_max_tokens_is_checked_against_the_capacity() {
    check(
        "
        config slots=1 queue=4 capacity=16
        submit tokens=12 max=5
        submit embeds=17 logical=3
        submit tokens=0 max=1
        submit tokens=3 max=0
        submit tokens=12 max=4
        submit embeds=16 logical=3
        drops
        ",
        "
        config slots=1 queue=4 capacity=16
        submit tokens=12 max=5
        -> refused: the prompt takes 12 cache rows and asks for up to 5 new tokens; 17 exceeds the context capacity of 16
        submit embeds=17 logical=3
        -> refused: the prompt takes 17 cache rows, more than the context capacity of 16
        submit tokens=0 max=1
        -> refused: the prompt is empty
        submit tokens=3 max=0
        -> refused: max_tokens must be at least 1
        submit tokens=12 max=4
        -> r0
        submit embeds=16 logical=3
        -> r1
        drops
        -> 1 dropped
        ",
    );
}

#[test]
fn finish_reasons() {
    check(
        "
        config slots=4 queue=4 capacity=6 prefills=4
        submit tokens=2 max=4 stop=9
        submit tokens=2 max=2
        submit tokens=4
        submit tokens=2 max=4
        step
        step r0=9
        submit tokens=2 max=1
        step r4=err
        step decode=err
        ",
        "
        config slots=4 queue=4 capacity=6 prefills=4
        submit tokens=2 max=4 stop=9
        -> r0
        submit tokens=2 max=2
        -> r1
        submit tokens=4
        -> r2
        submit tokens=2 max=4
        -> r3
        step
        -> prefill r0 slot 0 (2 rows)
        -> prefill r1 slot 1 (2 rows)
        -> prefill r2 slot 2 (4 rows)
        -> prefill r3 slot 3 (2 rows)
        -> token r0 7
        -> token r1 7
        -> token r2 7
        -> token r3 7
        step r0=9
        -> decode [0:7, 1:7, 2:7, 3:7]
        -> release slot 0
        -> finished r0 stop 9 (prompt 2, completion 1, cache 3)
        -> token r1 7
        -> release slot 1
        -> finished r1 length (prompt 2, completion 2, cache 3)
        -> token r2 7
        -> token r3 7
        submit tokens=2 max=1
        -> r4
        step r4=err
        -> prefill r4 slot 0 (2 rows)
        -> decode [2:7, 3:7]
        -> release slot 0
        -> finished r4 error: injected failure (prompt 2, completion 0, cache 0)
        -> token r2 7
        -> release slot 2
        -> finished r2 capacity (prompt 4, completion 3, cache 6)
        -> token r3 7
        step decode=err
        -> decode [3:7]
        -> release slot 3
        -> finished r3 error: injected decode failure (prompt 2, completion 3, cache 4)
        ",
    );
}

#[test]
fn repetition_penalty_over_prompt_and_generated_tokens() {
    // Prompt 1, 2, 3 and every generated token are divided by 2: after 0
    // (the top of the ramp, unseen) come 4, 5, 6, never a token seen before.
    check(
        "
        config slots=1 queue=1 capacity=32
        submit tokens=3 max=4 rep=2
        step r0=ramp
        step r0=ramp
        step r0=ramp
        step r0=ramp
        submit tokens=3 max=2
        step r1=ramp
        step r1=ramp
        ",
        "
        config slots=1 queue=1 capacity=32
        submit tokens=3 max=4 rep=2
        -> r0
        step r0=ramp
        -> prefill r0 slot 0 (3 rows)
        -> token r0 0
        step r0=ramp
        -> decode [0:0]
        -> token r0 4
        step r0=ramp
        -> decode [0:4]
        -> token r0 5
        step r0=ramp
        -> decode [0:5]
        -> token r0 6
        -> release slot 0
        -> finished r0 length (prompt 3, completion 4, cache 6)
        submit tokens=3 max=2
        -> r1
        step r1=ramp
        -> prefill r1 slot 0 (3 rows)
        -> token r1 0
        step r1=ramp
        -> decode [0:0]
        -> token r1 0
        -> release slot 0
        -> finished r1 length (prompt 3, completion 2, cache 4)
        ",
    );
}

#[test]
fn frequency_penalty_counts_generated_tokens_only() {
    // 0.1 a time token 0 was generated: 0 (1.0), then 1 (0.9375 beats 0.9;
    // the prompt does not count), 0 (0.9 beats 0.8375 and 0.875), then 2
    // (0.875 beats 0.8).
    check(
        "
        config slots=1 queue=1 capacity=32
        submit tokens=3 max=4 freq=0.1
        step r0=ramp
        step r0=ramp
        step r0=ramp
        step r0=ramp
        ",
        "
        config slots=1 queue=1 capacity=32
        submit tokens=3 max=4 freq=0.1
        -> r0
        step r0=ramp
        -> prefill r0 slot 0 (3 rows)
        -> token r0 0
        step r0=ramp
        -> decode [0:0]
        -> token r0 1
        step r0=ramp
        -> decode [0:1]
        -> token r0 0
        step r0=ramp
        -> decode [0:0]
        -> token r0 2
        -> release slot 0
        -> finished r0 length (prompt 3, completion 4, cache 6)
        ",
    );
}

/// The `-> token` lines of request `id` in a trace, without the id.
fn tokens_of(trace: &str, id: &str) -> Vec<String> {
    let prefix = format!("-> token {id} ");
    trace.lines().filter_map(|l| l.trim().strip_prefix(prefix.as_str()).map(str::to_owned)).collect()
}

#[test]
fn a_penalised_request_samples_the_same_in_a_batch_as_alone() {
    let steps = "step r0=ramp r1=ramp r2=ramp\n".repeat(10);
    let alone = run(&format!(
        "
        config slots=1 queue=4 capacity=32
        submit tokens=3 max=6 rep=2 logprobs=3
        {steps}"
    ));
    // Batch mates with other prompts and penalties, the request in slot 1
    // and admitted a step later.
    let batched = run(&format!(
        "
        config slots=3 queue=4 capacity=32
        submit tokens=5 max=8 rep=1.5
        submit tokens=3 max=6 rep=2 logprobs=3
        submit embeds=6 logical=2 max=5
        {steps}"
    ));
    let want = tokens_of(&alone, "r0");
    assert_eq!(want.len(), 6, "{alone}");
    assert!(want.iter().all(|t| t.contains("logprob")), "{alone}");
    assert_eq!(tokens_of(&batched, "r1"), want, "\nalone:\n{alone}\nbatched:\n{batched}");
    assert!(batched.contains("-> prefill r1 slot 1"), "{batched}");
    // The batch mates follow their own histories.
    assert_ne!(tokens_of(&batched, "r0"), tokens_of(&batched, "r1"));
    assert_eq!(tokens_of(&batched, "r2"), vec!["0"; 5]);
}

#[test]
fn token_actions_carry_logprobs_when_asked() {
    // One-hot on 7 over 16 tokens: ln softmax is 1 - ln(e + 15) = -1.8746 for
    // token 7 and -2.8746 for the others, listed from the lowest id.
    check(
        "
        config slots=2 queue=4 capacity=32 prefills=2
        submit tokens=3 max=2 logprobs=2
        submit tokens=3 max=1
        submit tokens=3 max=1 logprobs=0
        step
        step
        ",
        "
        config slots=2 queue=4 capacity=32 prefills=2
        submit tokens=3 max=2 logprobs=2
        -> r0
        submit tokens=3 max=1
        -> r1
        submit tokens=3 max=1 logprobs=0
        -> r2
        step
        -> prefill r0 slot 0 (3 rows)
        -> prefill r1 slot 1 (3 rows)
        -> token r0 7 (logprob -1.8746, top [7 -1.8746, 0 -2.8746])
        -> token r1 7
        -> release slot 1
        -> finished r1 length (prompt 3, completion 1, cache 3)
        step
        -> prefill r2 slot 1 (3 rows)
        -> decode [0:7]
        -> token r2 7 (logprob -1.8746, top [])
        -> release slot 1
        -> finished r2 length (prompt 3, completion 1, cache 3)
        -> token r0 7 (logprob -1.8746, top [7 -1.8746, 0 -2.8746])
        -> release slot 0
        -> finished r0 length (prompt 3, completion 2, cache 4)
        ",
    );
}

/// A seeded random walk of submissions, cancellations (also while a step is
/// in flight), steps and failures, checked after every event: no slot is
/// owned twice, the queue stays within its bound, no request finishes twice
/// or gets a token after finishing, tokens carry the log-probabilities
/// their request asked for, a prefill keeps only rows the slot really holds
/// (as the walk's own record of every write says) and never splits a block;
/// and at the end every accepted request finished exactly once, every slot
/// was released and every payload dropped.
#[test]
fn random_walks_keep_the_invariants() {
    let kept: usize = (0..64).map(random_walk).sum();
    assert!(kept > 0, "the walks never reused a prefix: the prefix cache went untested");
}

/// Returns the rows its prefills kept.
fn random_walk(seed: u64) -> usize {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut below = |n: u64| rng.next_u64() % n;
    let (slots, queue_bound, capacity) = (3, 4, 24);
    let prefills = 1 + below(2) as usize;
    let budget = 1 + below(3) as usize;
    let mut sched = Scheduler::<Payload>::new(SchedulerConfig {
        chunk: 4,
        prefill_chunks_per_step: budget,
        ..config(slots, queue_bound, capacity, prefills)
    });
    let drops = Rc::new(Cell::new(0));
    let mut model = Model {
        owner: vec![None; slots],
        finished: HashMap::new(),
        accepted: Vec::new(),
        payloads: 0,
        logprobs: HashMap::new(),
        device: vec![Vec::new(); slots],
        prefilling: HashMap::new(),
        device_atomic: vec![Vec::new(); slots],
        kept: 0,
        budget,
        chunk: 4,
    };
    let mut next_id = 0;
    for _ in 0..400 {
        match below(10) {
            0..=3 => {
                let rows = 1 + below(12) as usize;
                let input = if below(2) == 0 {
                    // A shared stem, then tokens of its own: prompts share prefixes of every length.
                    let stem = below(rows as u64 + 1) as usize;
                    PendingInput::Tokens(
                        (0..rows).map(|i| if i < stem { 1 + i as u32 } else { below(4) as u32 }).collect(),
                    )
                } else {
                    model.payloads += 1;
                    let start = below(rows as u64) as usize;
                    let end = start + below((rows - start) as u64 + 1) as usize;
                    let media = 1 + below(2) as u8;
                    PendingInput::Embeddings(Payload::new(rows, 0, media, start..end, below(2) == 0, drops.clone()))
                };
                let max_tokens = if below(4) == 0 { None } else { Some(1 + below(16) as usize) };
                let logical = 1 + below(rows as u64) as usize;
                let depth = sched.queue_len();
                let logprobs = if below(3) == 0 { Some(below(4) as usize) } else { None };
                let sampler = if logprobs.is_some() || below(3) == 0 { penalised(1.5, logprobs) } else { greedy() };
                let request =
                    Request { prompt_tokens: vec![1; logical], input, max_tokens, stop_tokens: vec![3], sampler };
                match sched.submit(request) {
                    Ok(id) => {
                        assert_eq!(id, RequestId(next_id), "seed {seed}: ids are assigned in order");
                        next_id += 1;
                        model.accepted.push(id);
                        model.logprobs.insert(id, logprobs);
                    }
                    Err(SubmitError::QueueFull { .. }) => assert_eq!(depth, queue_bound, "seed {seed}"),
                    Err(_) => assert!(max_tokens.map_or(rows, |m| rows + m) > capacity, "seed {seed}"),
                }
            }
            4 | 5 => {
                let id = RequestId(below(next_id + 1));
                let actions = sched.cancel(id);
                model.apply(seed, &actions);
            }
            _ => {
                let Some(step) = sched.plan().unwrap() else { continue };
                model.admit(seed, &step);
                let (n_prefill, decoded) = (step.prefill.len(), step.decode.len());
                let prefilled: Vec<(usize, Range<usize>)> =
                    step.prefill.iter().map(|p| (p.slot, p.rows.clone())).collect();
                let fed = step.decode.clone();
                drop(step);
                if below(5) == 0 {
                    let id = RequestId(below(next_id + 1));
                    let actions = sched.cancel(id);
                    model.apply(seed, &actions);
                }
                let prefill: Vec<_> = (0..n_prefill)
                    .map(|_| if below(20) == 0 { Err("injected".into()) } else { Ok(one_hot(below(8) as u32)) })
                    .collect();
                let decode = if below(50) == 0 {
                    Err("injected".into())
                } else {
                    Ok((0..decoded).map(|_| one_hot(below(8) as u32)).collect())
                };
                model.wrote(&prefilled, &prefill, &fed, &decode);
                let actions = sched.complete(StepResult { prefill, decode }).unwrap();
                model.apply(seed, &actions);
            }
        }
        assert!(sched.queue_len() <= queue_bound, "seed {seed}: queue over its bound");
        assert_eq!(sched.active_slots(), model.owner.iter().flatten().count(), "seed {seed}: slots owned");
    }
    // Drain: cancel everything; nothing is left to plan.
    for i in 0..next_id {
        let actions = sched.cancel(RequestId(i));
        model.apply(seed, &actions);
    }
    assert!(sched.plan().unwrap().is_none(), "seed {seed}: work left after cancelling everything");
    assert!(sched.is_idle(), "seed {seed}: not idle");
    assert!(model.owner.iter().all(Option::is_none), "seed {seed}: a slot was never released");
    for id in &model.accepted {
        assert_eq!(model.finished.get(id), Some(&1), "seed {seed}: {id} did not finish exactly once");
    }
    assert_eq!(model.finished.len(), model.accepted.len(), "seed {seed}: a refused request finished");
    assert_eq!(drops.get(), model.payloads, "seed {seed}: payloads dropped");
    model.kept
}

/// A prompt being prefilled: its rows, the prefill calls a whole prefill from the kept rows
/// would make, and where its next piece starts.
type Prefilling = (Vec<RowKey>, Vec<(usize, usize)>, usize);

/// What the caller sees of the scheduler, rebuilt from its answers alone.
struct Model {
    owner: Vec<Option<RequestId>>,
    finished: HashMap<RequestId, usize>,
    accepted: Vec<RequestId>,
    payloads: usize,
    /// The top log-probabilities each accepted request asked for.
    logprobs: HashMap<RequestId, Option<usize>>,
    /// What each slot's rows hold, as written by the walk's prefills and decodes; `None` rows
    /// are unknown (a failed prefill's).
    device: Vec<Vec<Option<RowKey>>>,
    /// Per slot being prefilled.
    prefilling: HashMap<usize, Prefilling>,
    /// Per slot, the bidirectional blocks of the prompt last prefilled into it.
    device_atomic: Vec<Vec<Range<usize>>>,
    kept: usize,
    /// The prefill calls a step may hold while slots decode.
    budget: usize,
    chunk: usize,
}

impl Model {
    fn admit(&mut self, seed: u64, step: &Step<Payload>) {
        let mut calls_in_step = 0;
        for p in &step.prefill {
            assert!(!self.finished.contains_key(&p.id), "seed {seed}: {} prefilled after finishing", p.id);
            if let Some(input) = &p.input {
                assert_eq!(self.owner[p.slot], None, "seed {seed}: slot {} prefilled while owned", p.slot);
                self.owner[p.slot] = Some(p.id);
                let (keys, atomic) = match input {
                    PendingInput::Tokens(t) => {
                        (t.iter().enumerate().map(|(i, &t)| RowKey::token(t, i)).collect(), vec![])
                    }
                    PendingInput::Embeddings(e) => (e.row_keys(), e.atomic()),
                };
                let (keep, held) = (p.rows.start, &self.device[p.slot]);
                let held_atomic = &self.device_atomic[p.slot];
                assert!(
                    !held_atomic.iter().any(|r| r.start < keep && keep < r.end),
                    "seed {seed}: {} keeps {keep} rows, inside a block of the slot's last prompt {held_atomic:?}",
                    p.id
                );
                assert!(keep < keys.len(), "seed {seed}: {} keeps all {} rows", p.id, keys.len());
                assert!(keep <= held.len(), "seed {seed}: {} keeps {} of {} rows held", p.id, keep, held.len());
                for (row, (have, want)) in held.iter().zip(&keys).take(keep).enumerate() {
                    assert_eq!(have.as_ref(), Some(want), "seed {seed}: {} keeps row {row}, which differs", p.id);
                }
                assert!(
                    !atomic.iter().any(|r| r.start < keep && keep < r.end),
                    "seed {seed}: {} keeps {keep} rows, inside a block {atomic:?}",
                    p.id
                );
                self.kept += keep;
                let calls = crate::decoder::chunk_spans(keep, keys.len(), self.chunk, &atomic);
                self.device_atomic[p.slot] = atomic;
                self.prefilling.insert(p.slot, (keys, calls, keep));
            } else {
                assert_eq!(self.owner[p.slot], Some(p.id), "seed {seed}: a later piece of {} in another slot", p.id);
            }
            let (keys, calls, next) = &self.prefilling[&p.slot];
            assert_eq!(p.rows.start, *next, "seed {seed}: {}'s pieces are not contiguous", p.id);
            assert!(
                calls.iter().any(|&(start, n)| start + n == p.rows.end),
                "seed {seed}: {}'s piece {:?} does not end at a prefill call's end ({calls:?})",
                p.id,
                p.rows
            );
            assert_eq!(p.last, p.rows.end == keys.len(), "seed {seed}: {}'s piece {:?}", p.id, p.rows);
            calls_in_step += calls.iter().filter(|&&(start, _)| p.rows.contains(&start)).count();
        }
        if !step.decode.is_empty() {
            assert!(calls_in_step <= self.budget, "seed {seed}: {calls_in_step} prefill calls beside a decode");
        }
        for &(slot, _) in &step.decode {
            assert!(self.owner[slot].is_some(), "seed {seed}: decode of free slot {slot}");
        }
    }

    /// The rows a step's prefill pieces and decode wrote.
    fn wrote(
        &mut self,
        prefilled: &[(usize, Range<usize>)],
        prefill: &[Result<Vec<f32>, String>],
        fed: &[(usize, u32)],
        decode: &Result<Vec<Vec<f32>>, String>,
    ) {
        for ((slot, rows), result) in prefilled.iter().zip(prefill) {
            let (keys, _, next) = self.prefilling.get_mut(slot).unwrap();
            match result {
                Ok(_) => {
                    self.device[*slot] = keys[..rows.end].iter().copied().map(Some).collect();
                    *next = rows.end;
                }
                // What the failed piece wrote is unknown.
                Err(_) => self.device[*slot].truncate(rows.start),
            }
        }
        // A decoded row is a token's, but not as a prefill computes it: never to be kept.
        if decode.is_ok() {
            for &(slot, _) in fed {
                self.device[slot].push(None);
            }
        }
    }

    fn apply(&mut self, seed: u64, actions: &[Action]) {
        for a in actions {
            match a {
                Action::Release { slot } => {
                    assert!(self.owner[*slot].take().is_some(), "seed {seed}: slot {slot} released while free");
                }
                Action::Token { id, logprobs, .. } => {
                    assert!(!self.finished.contains_key(id), "seed {seed}: token for finished {id}");
                    let top = logprobs.as_ref().map(|l| l.top.len());
                    assert_eq!(top, self.logprobs[id], "seed {seed}: {id}'s logprobs");
                }
                Action::Finished { id, .. } => *self.finished.entry(*id).or_default() += 1,
            }
        }
        for (id, n) in &self.finished {
            assert_eq!(*n, 1, "seed {seed}: {id} finished {n} times");
        }
    }
}

#[test]
fn a_prompt_goes_to_the_slot_holding_its_longest_prefix_and_keeps_it() {
    check(
        "
        config slots=2 queue=4 capacity=32
        submit prompt=1,2,3,4 max=2
        step
        step
        submit prompt=1,2,3,4,7,9 max=1
        submit prompt=50,51 max=1
        step prefills=2
        step
        submit prompt=1,2,3,4,7 max=1
        step
        ",
        "
        config slots=2 queue=4 capacity=32
        submit prompt=1,2,3,4 max=2
        -> r0
        step
        -> prefill r0 slot 0 (4 rows)
        -> token r0 7
        step
        -> decode [0:7]
        -> token r0 7
        -> release slot 0
        -> finished r0 length (prompt 4, completion 2, cache 5)
        submit prompt=1,2,3,4,7,9 max=1
        -> r1
        submit prompt=50,51 max=1
        -> r2
        step prefills=2
        -> prefill r1 slot 0 (6 rows, 4 kept)
        -> token r1 7
        -> release slot 0
        -> finished r1 length (prompt 6, completion 1, cache 6)
        step
        -> prefill r2 slot 1 (2 rows)
        -> token r2 7
        -> release slot 1
        -> finished r2 length (prompt 2, completion 1, cache 2)
        submit prompt=1,2,3,4,7 max=1
        -> r3
        step
        -> prefill r3 slot 0 (5 rows, 4 kept)
        -> token r3 7
        -> release slot 0
        -> finished r3 length (prompt 5, completion 1, cache 5)
        ",
    );
}

#[test]
fn media_rows_match_only_under_the_same_digest_and_a_block_is_never_split() {
    check(
        "
        config slots=1 queue=4 capacity=32
        submit embeds=8 logical=8 media=1@2..6 from=0 max=1
        step
        submit embeds=9 logical=9 media=1@2..6 from=0 max=1
        step
        submit embeds=9 logical=9 media=2@2..6 from=0 max=1
        step
        submit embeds=9 logical=9 media=2@2..6 bidi from=0 max=1
        step
        submit embeds=4 logical=4 media=2@2..6 bidi from=0 max=1
        step
        submit embeds=9 logical=9 media=2@2..6 from=0 max=1
        step
        submit embeds=9 logical=9 media=2@2..6 from=0 max=1
        step
        ",
        "
        config slots=1 queue=4 capacity=32
        submit embeds=8 logical=8 media=1@2..6 from=0 max=1
        -> r0
        step
        -> prefill r0 slot 0 (8 rows)
        -> token r0 7
        -> release slot 0
        -> finished r0 length (prompt 8, completion 1, cache 8)
        submit embeds=9 logical=9 media=1@2..6 from=0 max=1
        -> r1
        step
        -> prefill r1 slot 0 (9 rows, 8 kept)
        -> token r1 7
        -> release slot 0
        -> finished r1 length (prompt 9, completion 1, cache 9)
        submit embeds=9 logical=9 media=2@2..6 from=0 max=1
        -> r2
        step
        -> prefill r2 slot 0 (9 rows, 2 kept)
        -> token r2 7
        -> release slot 0
        -> finished r2 length (prompt 9, completion 1, cache 9)
        submit embeds=9 logical=9 media=2@2..6 bidi from=0 max=1
        -> r3
        step
        -> prefill r3 slot 0 (9 rows, 8 kept)
        -> token r3 7
        -> release slot 0
        -> finished r3 length (prompt 9, completion 1, cache 9)
        submit embeds=4 logical=4 media=2@2..6 bidi from=0 max=1
        -> r4
        step
        -> prefill r4 slot 0 (4 rows, 2 kept)
        -> token r4 7
        -> release slot 0
        -> finished r4 length (prompt 4, completion 1, cache 4)
        submit embeds=9 logical=9 media=2@2..6 from=0 max=1
        -> r5
        step
        -> prefill r5 slot 0 (9 rows, 2 kept)
        -> token r5 7
        -> release slot 0
        -> finished r5 length (prompt 9, completion 1, cache 9)
        submit embeds=9 logical=9 media=2@2..6 from=0 max=1
        -> r6
        step
        -> prefill r6 slot 0 (9 rows, 8 kept)
        -> token r6 7
        -> release slot 0
        -> finished r6 length (prompt 9, completion 1, cache 9)
        ",
    );
}

#[test]
fn a_failed_prefill_leaves_nothing_to_reuse() {
    check(
        "
        config slots=1 queue=4 capacity=32
        submit prompt=1,2,3,4 max=1
        step r0=err
        submit prompt=1,2,3,4 max=1
        step
        submit prompt=1,2,3,4 max=1
        step
        ",
        "
        config slots=1 queue=4 capacity=32
        submit prompt=1,2,3,4 max=1
        -> r0
        step r0=err
        -> prefill r0 slot 0 (4 rows)
        -> release slot 0
        -> finished r0 error: injected failure (prompt 4, completion 0, cache 0)
        submit prompt=1,2,3,4 max=1
        -> r1
        step
        -> prefill r1 slot 0 (4 rows)
        -> token r1 7
        -> release slot 0
        -> finished r1 length (prompt 4, completion 1, cache 4)
        submit prompt=1,2,3,4 max=1
        -> r2
        step
        -> prefill r2 slot 0 (4 rows, 3 kept)
        -> token r2 7
        -> release slot 0
        -> finished r2 length (prompt 4, completion 1, cache 4)
        ",
    );
}

#[test]
/// A long prompt enters a budget of prefill calls per step while another slot decodes; a
/// prompt cancelled between its pieces leaves only the rows it wrote for a later prefix.
fn a_long_prompt_is_prefilled_a_budget_of_calls_at_a_time_between_decode_steps() {
    check(
        "
        config slots=2 queue=4 capacity=32 chunk=4 budget=1
        submit tokens=3 max=8
        step
        submit tokens=10 max=2
        step
        step
        step
        step
        submit tokens=10 max=1
        step
        cancel r2
        submit prompt=201,202,203,204,205,206,7 max=1
        step
        step
        ",
        "
        config slots=2 queue=4 capacity=32 chunk=4 budget=1
        submit tokens=3 max=8
        -> r0
        step
        -> prefill r0 slot 0 (3 rows)
        -> token r0 7
        submit tokens=10 max=2
        -> r1
        step
        -> prefill r1 slot 1 rows 0..4
        -> decode [0:7]
        -> token r0 7
        step
        -> prefill r1 slot 1 rows 4..8
        -> decode [0:7]
        -> token r0 7
        step
        -> prefill r1 slot 1 rows 8..10, last
        -> decode [0:7]
        -> token r1 7
        -> token r0 7
        step
        -> decode [0:7, 1:7]
        -> token r0 7
        -> token r1 7
        -> release slot 1
        -> finished r1 length (prompt 10, completion 2, cache 11)
        submit tokens=10 max=1
        -> r2
        step
        -> prefill r2 slot 1 rows 0..4
        -> decode [0:7]
        -> token r0 7
        cancel r2
        -> release slot 1
        -> finished r2 cancelled (prompt 10, completion 0, cache 0)
        submit prompt=201,202,203,204,205,206,7 max=1
        -> r3
        step
        -> prefill r3 slot 1 (7 rows, 4 kept)
        -> decode [0:7]
        -> token r3 7
        -> release slot 1
        -> finished r3 length (prompt 7, completion 1, cache 7)
        -> token r0 7
        step
        -> decode [0:7]
        -> token r0 7
        -> release slot 0
        -> finished r0 length (prompt 3, completion 8, cache 10)
        ",
    );
}

/// Two images' tokens see each other (one block over both): a later prompt with only the first
/// image shares its rows, but they saw the second image, so the prefix stops before the block.
#[test]
fn a_prefix_never_ends_inside_a_block_of_the_held_prompt() {
    check(
        "
        config slots=1 queue=4 capacity=32
        submit embeds=12 logical=12 media=1@2..9 bidi from=0 max=1
        step
        submit embeds=8 logical=8 media=1@2..9 from=0 max=1
        step
        ",
        "
        config slots=1 queue=4 capacity=32
        submit embeds=12 logical=12 media=1@2..9 bidi from=0 max=1
        -> r0
        step
        -> prefill r0 slot 0 (12 rows)
        -> token r0 7
        -> release slot 0
        -> finished r0 length (prompt 12, completion 1, cache 12)
        submit embeds=8 logical=8 media=1@2..9 from=0 max=1
        -> r1
        step
        -> prefill r1 slot 0 (8 rows, 2 kept)
        -> token r1 7
        -> release slot 0
        -> finished r1 length (prompt 8, completion 1, cache 8)
        ",
    );
}
