//! The serving engine. For now its scheduler: a pure state machine over
//! slots, an admission queue and each request's tokens, driven by the
//! thread that owns the decoder (which follows, with the server).

mod scheduler;

pub use scheduler::{
    Action, FinishReason, PendingInput, PrefillWork, Prepared, Progress, Request, RequestId, Scheduler,
    SchedulerConfig, SchedulerError, Step, StepResult, SubmitError, Usage,
};

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
}

impl Prepared for PreparedPrompt {
    fn rows(&self) -> usize {
        self.embeddings.shape().first().copied().unwrap_or(0)
    }
}
