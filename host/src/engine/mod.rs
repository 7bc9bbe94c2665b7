//! The serving engine. For now its scheduler: a pure state machine over
//! slots, an admission queue and each request's tokens, driven by the
//! thread that owns the decoder (which follows, with the server).

mod scheduler;

pub use scheduler::{
    Action, FinishReason, PendingInput, PrefillWork, Prepared, Progress, Request, RequestId, RowContent, RowKey,
    Scheduler, SchedulerConfig, SchedulerError, Step, StepResult, SubmitError, Usage,
};

use std::ops::Range;

use mlxcel_shim::HostTensor;

use crate::decoder::{Extras, Positions};

/// The engine's prepared prompt: what `Decoder::prefill_embeddings` takes,
/// owned, so its buffers are freed once, after the prefill that uses them
/// (or when the request is refused or cancelled before it).
#[derive(Debug)]
pub struct PreparedPrompt {
    /// `[rows, hidden]` in the bundle's activation dtype.
    pub embeddings: HostTensor,
    pub positions: Positions,
    pub extras: Extras,
    /// What each row holds, with its position: the prefix cache's keys.
    keys: Vec<RowKey>,
}

/// A prepared prompt whose row contents and positions disagree in length with its embeddings.
#[derive(Debug, thiserror::Error)]
#[error("{contents} row contents and {positions} positions for {rows} embedding rows")]
pub struct RowsMismatch {
    rows: usize,
    contents: usize,
    positions: usize,
}

impl PreparedPrompt {
    /// The prompt with what each of its rows holds (`contents`, one per embedding row).
    pub fn new(
        embeddings: HostTensor,
        positions: Positions,
        extras: Extras,
        contents: Vec<RowContent>,
    ) -> Result<Self, RowsMismatch> {
        let rows = embeddings.shape().first().copied().unwrap_or(0);
        let at: Vec<[i32; 3]> = match &positions {
            Positions::Sequential => (0..rows).map(|i| [i32::try_from(i).unwrap_or(i32::MAX); 3]).collect(),
            Positions::OneD(p) => p.iter().map(|&p| [p; 3]).collect(),
            Positions::MRope([t, h, w]) if t.len() == h.len() && h.len() == w.len() => {
                t.iter().zip(h).zip(w).map(|((&t, &h), &w)| [t, h, w]).collect()
            }
            Positions::MRope(_) => Vec::new(),
        };
        if contents.len() != rows || at.len() != rows {
            return Err(RowsMismatch { rows, contents: contents.len(), positions: at.len() });
        }
        let keys = contents.into_iter().zip(at).map(|(content, position)| RowKey { content, position }).collect();
        Ok(PreparedPrompt { embeddings, positions, extras, keys })
    }
}

impl Prepared for PreparedPrompt {
    fn rows(&self) -> usize {
        self.embeddings.shape().first().copied().unwrap_or(0)
    }

    fn row_keys(&self) -> Vec<RowKey> {
        self.keys.clone()
    }

    fn atomic(&self) -> Vec<Range<usize>> {
        // A bidirectional group is computed in one call: its span, first run to last.
        self.extras.bidirectional.iter().filter_map(|g| crate::decoder::span(g)).collect()
    }
}
