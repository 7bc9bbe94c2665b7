//! `/metrics` in the Prometheus text format: queue depth, active slots and KV-cache use (set by
//! the engine thread), time-to-first-token and time-per-output-token histograms, token and request
//! counters, the prefix cache's reuse and the encoder cache's hits, misses and bytes.
//!
//! The gauges an inference gateway routes by (the Gateway API Inference Extension's model server
//! protocol) are `mlxcel_queue_depth` (its TotalQueuedRequests, vLLM's
//! `num_requests_waiting`), `mlxcel_active_slots` (TotalRunningRequests, `num_requests_running`)
//! and `mlxcel_kv_cache_usage` (KVCacheUtilization, `kv_cache_usage_perc`: a fraction from 0 to
//! 1, as vLLM's is). Its optional prefix-cache labels are `mlxcel_cache_config_info`'s
//! `block_size` (1: the prefix cache keeps any number of rows, not blocks) and `num_gpu_blocks`
//! (the rows of all slots).

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::media_bytes::MediaBytes;
use crate::encoder_cache::EncoderCache;

/// Histogram bucket upper bounds in seconds.
const TTFT_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
const TPOT_BUCKETS: [f64; 11] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram { bounds, counts: vec![0; bounds.len()], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, value: f64) {
        for (bound, count) in self.bounds.iter().zip(&mut self.counts) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// What the engine thread publishes after each step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EngineGauges {
    /// Requests waiting: for their images' encoder or for a slot.
    pub(crate) queue_depth: u64,
    /// KV slots owned by a request.
    pub(crate) active_slots: u64,
    /// Cache rows held by slot-owning requests (`Scheduler::rows_in_use`).
    pub(crate) kv_rows_in_use: u64,
}

/// The server's counters. Gauges are atomics the engine thread stores; histograms sit behind a
/// mutex held only to observe or render.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Published together after each engine step, so a scrape never mixes two steps.
    engine: Mutex<EngineGauges>,
    /// Cache rows in all: slots times rows per slot.
    kv_rows: u64,
    /// Prompt rows prefills kept from a slot's earlier request (the prefix cache).
    pub(crate) prefix_rows_reused: AtomicU64,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    /// Finished requests by outcome: stop, length, cancelled, error, refused.
    outcomes: Mutex<Vec<(&'static str, u64)>>,
    ttft: Mutex<Histogram>,
    tpot: Mutex<Histogram>,
    encoder_cache: Option<&'static EncoderCache>,
    media_bytes: std::sync::Arc<MediaBytes>,
    /// Requests handed to the engine whose answer has not ended (see [`Open`]).
    open: AtomicU64,
    /// Preparations given up at their deadline whose code has not returned yet: each holds a
    /// thread of the blocking pool (nothing can stop a plugin call from outside).
    pub(crate) preparations_overdue: AtomicU64,
}

/// One request between its hand-over to the engine and the end of its answer (whole, streamed,
/// cancelled or failed): counted while it lives, so a request that leaks shows.
#[derive(Debug)]
pub(crate) struct Open(std::sync::Arc<Metrics>);

impl Open {
    pub(crate) fn new(metrics: &std::sync::Arc<Metrics>) -> Self {
        metrics.open.fetch_add(1, Ordering::Relaxed);
        Open(std::sync::Arc::clone(metrics))
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The process's resident memory in bytes (`VmRSS` of /proc/self/status), 0 where unknown.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

impl Metrics {
    /// `kv_rows`: the decoder's cache rows in all (slots times rows per slot).
    pub(crate) fn new(
        encoder_cache: Option<&'static EncoderCache>,
        media_bytes: std::sync::Arc<MediaBytes>,
        kv_rows: u64,
    ) -> Self {
        Metrics {
            engine: Mutex::new(EngineGauges::default()),
            kv_rows,
            prefix_rows_reused: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            outcomes: Mutex::new(Vec::new()),
            ttft: Mutex::new(Histogram::new(&TTFT_BUCKETS)),
            tpot: Mutex::new(Histogram::new(&TPOT_BUCKETS)),
            encoder_cache,
            media_bytes,
            open: AtomicU64::new(0),
            preparations_overdue: AtomicU64::new(0),
        }
    }

    pub(crate) fn engine(&self, gauges: EngineGauges) {
        if let Ok(mut g) = self.engine.lock() {
            *g = gauges;
        }
    }

    pub(crate) fn first_token(&self, after: Duration) {
        if let Ok(mut h) = self.ttft.lock() {
            h.observe(after.as_secs_f64());
        }
    }

    /// A finished request: its tokens, and the mean time per output token after the first.
    pub(crate) fn finished(&self, outcome: &'static str, prompt: usize, generated: usize, decoding: Duration) {
        self.prompt_tokens.fetch_add(prompt as u64, Ordering::Relaxed);
        self.generation_tokens.fetch_add(generated as u64, Ordering::Relaxed);
        if generated > 1
            && let Ok(mut h) = self.tpot.lock()
        {
            h.observe(decoding.as_secs_f64() / (generated - 1) as f64);
        }
        self.count(outcome);
    }

    /// A request that ended without running (refused, or failed before the engine took it).
    pub(crate) fn count(&self, outcome: &'static str) {
        if let Ok(mut outcomes) = self.outcomes.lock() {
            match outcomes.iter_mut().find(|(o, _)| *o == outcome) {
                Some((_, n)) => *n += 1,
                None => outcomes.push((outcome, 1)),
            }
        }
    }

    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        let gauge = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        };
        gauge(
            &mut out,
            "mlxcel_requests_open",
            "Requests handed to the engine whose answer has not ended.",
            self.open.load(Ordering::Relaxed),
        );
        gauge(&mut out, "mlxcel_process_resident_bytes", "The server's resident memory.", resident_bytes());
        gauge(
            &mut out,
            "mlxcel_media_bytes_held",
            "Host bytes of media held by requests in flight (files, preprocessed tensors, features).",
            self.media_bytes.held(),
        );
        gauge(
            &mut out,
            "mlxcel_media_bytes_limit",
            "The most media bytes admission lets requests in flight hold (--max-media-mb).",
            self.media_bytes.limit(),
        );
        gauge(
            &mut out,
            "mlxcel_preparations_overdue",
            "Request preparations given up at their deadline whose code is still running.",
            self.preparations_overdue.load(Ordering::Relaxed),
        );
        let engine = self.engine.lock().map(|g| *g).unwrap_or_default();
        gauge(
            &mut out,
            "mlxcel_queue_depth",
            "Requests waiting: for their images' encoder or for a slot.",
            engine.queue_depth,
        );
        gauge(&mut out, "mlxcel_active_slots", "Requests running: KV slots owned by a request.", engine.active_slots);
        let usage = if self.kv_rows == 0 { 0.0 } else { engine.kv_rows_in_use as f64 / self.kv_rows as f64 };
        let _ = writeln!(
            out,
            "# HELP mlxcel_cache_config_info The KV cache's layout for prefix-aware routing: rows kept at a time and rows in all.\n# TYPE mlxcel_cache_config_info gauge\nmlxcel_cache_config_info{{block_size=\"1\",num_gpu_blocks=\"{}\"}} 1",
            self.kv_rows
        );
        let _ = writeln!(
            out,
            "# HELP mlxcel_kv_cache_usage KV-cache rows held by running requests, as a fraction of all slots' rows.\n# TYPE mlxcel_kv_cache_usage gauge\nmlxcel_kv_cache_usage {usage}"
        );
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        };
        counter(
            &mut out,
            "mlxcel_prompt_tokens_total",
            "Prompt tokens of finished requests.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mlxcel_generation_tokens_total",
            "Tokens generated by finished requests.",
            self.generation_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mlxcel_prefix_cache_reused_rows_total",
            "Prompt rows (tokens and media rows) kept from a slot's earlier request instead of prefilled.",
            self.prefix_rows_reused.load(Ordering::Relaxed),
        );
        let _ = writeln!(
            out,
            "# HELP mlxcel_requests_total Requests ended, by outcome.\n# TYPE mlxcel_requests_total counter"
        );
        if let Ok(outcomes) = self.outcomes.lock() {
            for (outcome, n) in outcomes.iter() {
                let _ = writeln!(out, "mlxcel_requests_total{{outcome=\"{outcome}\"}} {n}");
            }
        }
        if let Some(cache) = self.encoder_cache {
            let stats = cache.stats();
            let lookups = "Media items looked up in the encoder cache";
            counter(&mut out, "mlxcel_encoder_cache_hits_total", &format!("{lookups} and found."), stats.hits);
            counter(&mut out, "mlxcel_encoder_cache_misses_total", &format!("{lookups} and not found."), stats.misses);
            counter(
                &mut out,
                "mlxcel_encoder_cache_evictions_total",
                "Encoded items dropped to stay within the budget.",
                stats.evictions,
            );
            gauge(&mut out, "mlxcel_encoder_cache_entries", "Encoded items held.", stats.entries);
            gauge(&mut out, "mlxcel_encoder_cache_bytes", "Bytes of encoder outputs held.", stats.bytes);
            gauge(
                &mut out,
                "mlxcel_encoder_cache_budget_bytes",
                "The cache's bound (--encoder-cache-mb).",
                stats.budget,
            );
        }
        if let Ok(h) = self.ttft.lock() {
            h.render("mlxcel_time_to_first_token_seconds", "Request arrival to first token.", &mut out);
        }
        if let Ok(h) = self.tpot.lock() {
            h.render("mlxcel_time_per_output_token_seconds", "Mean time per token after the first.", &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_and_counters_add_up() {
        let m = Metrics::new(None, MediaBytes::new(1 << 30), 4 * 256);
        m.engine(EngineGauges { queue_depth: 3, active_slots: 2, kv_rows_in_use: 256 });
        m.first_token(Duration::from_millis(30));
        m.first_token(Duration::from_secs(3));
        m.finished("stop", 10, 5, Duration::from_millis(40));
        m.finished("length", 7, 1, Duration::ZERO);
        m.count("refused");
        let text = m.render();
        assert!(text.contains("mlxcel_time_to_first_token_seconds_bucket{le=\"0.05\"} 1\n"), "{text}");
        assert!(text.contains("mlxcel_time_to_first_token_seconds_bucket{le=\"5\"} 2\n"), "{text}");
        assert!(text.contains("mlxcel_time_to_first_token_seconds_count 2\n"), "{text}");
        // 40 ms over 4 tokens after the first; a one-token request has no per-token time.
        assert!(text.contains("mlxcel_time_per_output_token_seconds_bucket{le=\"0.01\"} 1\n"), "{text}");
        assert!(text.contains("mlxcel_time_per_output_token_seconds_count 1\n"), "{text}");
        assert!(text.contains("mlxcel_prompt_tokens_total 17\n"), "{text}");
        assert!(text.contains("mlxcel_generation_tokens_total 6\n"), "{text}");
        assert!(text.contains("mlxcel_requests_total{outcome=\"refused\"} 1\n"), "{text}");
        assert!(text.contains("# TYPE mlxcel_kv_cache_usage gauge\nmlxcel_kv_cache_usage 0.25\n"), "{text}");
        assert!(text.contains("mlxcel_queue_depth 3\n") && text.contains("mlxcel_active_slots 2\n"), "{text}");
        assert!(text.contains("mlxcel_cache_config_info{block_size=\"1\",num_gpu_blocks=\"1024\"} 1\n"), "{text}");
    }
}
