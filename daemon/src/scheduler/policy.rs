//! [`Scheduler`]: the queueing policy, free of actix so tests drive it directly.
//!
//! First come, first served: waiting sequences are admitted in arrival order while
//! fewer than `max_running` run. Every step gives each decoding sequence its one new
//! token, and prefilling sequences chunks of their prompts (in admission order) within a
//! per-step budget of `prefill_chunk_tokens`, so a long prompt never stalls the running
//! streams for more than one chunk's worth of compute (chunked prefill, as in vLLM and
//! Sarathi-Serve), and all running requests progress together.

use std::collections::VecDeque;

use crate::error::{ErrorKind, InferError};
use crate::model_runner::{BatchItem, RunBatch};
use crate::request::SeqId;

use super::sequence::{Sequence, TokenizedRequest};

/// Bounds of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerLimits {
    /// Sequences running at once.
    pub max_running: usize,
    /// Sequences allowed to wait; beyond it a submission is refused as `overloaded`.
    pub max_waiting: usize,
    /// Context window of the model, tokens.
    pub context_length: usize,
    /// Prompt tokens prefilled per step over all sequences (≥ 1), at position 0.
    pub prefill_chunk_tokens: usize,
    /// Context depth, in tokens, at which attention costs about as much as the rest of
    /// the forward pass per token. A chunk starting at position `p` is limited to
    /// `⌈budget × E / (E + p)⌉` tokens, so a step's compute, and with it the pause it
    /// imposes on running streams, stays roughly constant as a long prompt gets deeper.
    pub attention_cost_tokens: usize,
}

impl SchedulerLimits {
    /// Largest chunk for a prompt whose next token is at position `pos`, given `budget`.
    pub fn chunk_at(&self, pos: usize, budget: usize) -> usize {
        let e = self.attention_cost_tokens as u128;
        let n = (budget as u128 * e).div_ceil((e + pos as u128).max(1));
        (n as usize).clamp(1, budget.max(1))
    }
}

/// Queues and running set.
#[derive(Debug)]
pub struct Scheduler {
    limits: SchedulerLimits,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    /// Sequences whose KV the runner must free at the start of the next step.
    to_free: Vec<SeqId>,
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new(limits: SchedulerLimits) -> Self {
        Self {
            limits,
            waiting: VecDeque::new(),
            running: Vec::new(),
            to_free: Vec::new(),
        }
    }

    /// Number of running sequences.
    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// Number of waiting sequences.
    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether there is nothing to run or free.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty() && self.to_free.is_empty()
    }

    /// Queues a request.
    ///
    /// # Errors
    /// `context_length_exceeded` when the prompt leaves no room for one generated token
    /// (the message names both counts); `validation` for an empty prompt; `overloaded`
    /// when `max_waiting` sequences already wait. The request is handed back with the error.
    pub fn submit(
        &mut self,
        req: TokenizedRequest,
    ) -> Result<(), Box<(TokenizedRequest, InferError)>> {
        let ctx = self.limits.context_length;
        let n = req.prompt.len();
        if n == 0 {
            let e = InferError::validation("the prompt is empty after tokenization (0 tokens)");
            return Err(Box::new((req, e)));
        }
        if n >= ctx {
            let e = InferError::new(
                ErrorKind::ContextLengthExceeded,
                format!(
                    "the prompt has {n} tokens but the context window is {ctx} tokens \
                     (at least 1 token must remain for generation)"
                ),
            );
            return Err(Box::new((req, e)));
        }
        if self.waiting.len() >= self.limits.max_waiting {
            let e = InferError::new(
                ErrorKind::Overloaded,
                format!(
                    "the queue is full ({} requests waiting, scheduler.max_waiting = {}); retry later",
                    self.waiting.len(),
                    self.limits.max_waiting
                ),
            );
            return Err(Box::new((req, e)));
        }
        let budget = req.sampling.max_tokens.min(ctx - n);
        self.waiting.push_back(Sequence::new(req, budget));
        Ok(())
    }

    /// Removes every cancelled sequence (waiting or running) and returns them; running
    /// ones get their KV freed in the next step.
    pub fn take_cancelled(&mut self) -> Vec<Sequence> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].cancel.is_cancelled() {
                if let Some(s) = self.waiting.remove(i) {
                    out.push(s);
                }
            } else {
                i += 1;
            }
        }
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].cancel.is_cancelled() {
                let s = self.running.swap_remove(i);
                self.to_free.push(s.id);
                out.push(s);
            } else {
                i += 1;
            }
        }
        out
    }

    /// Admits waiting sequences (in arrival order, up to `max_running`) and builds the
    /// next step. Newly admitted sequences are returned too, so the caller can send
    /// their `started` event.
    pub fn schedule(&mut self) -> (RunBatch, Vec<SeqId>) {
        let mut admitted = Vec::new();
        while self.running.len() < self.limits.max_running {
            let Some(seq) = self.waiting.pop_front() else {
                break;
            };
            admitted.push(seq.id);
            self.running.push(seq);
        }
        // Decodes always run. The prefill budget goes to the prefilling sequences with the
        // fewest prompt tokens left first (ties: admission order), so a short prompt is
        // not queued behind a long one; the long one takes whatever budget remains.
        let mut budget = self.limits.prefill_chunk_tokens.max(1);
        let mut prefilling: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].is_prefilling())
            .collect();
        prefilling.sort_by_key(|&i| self.running[i].pending_len());
        for s in self.running.iter_mut() {
            s.in_flight = if s.is_prefilling() {
                0
            } else {
                s.pending_len()
            };
        }
        let limits = self.limits;
        for i in prefilling {
            if budget == 0 {
                break;
            }
            let s = &mut self.running[i];
            let n = s.pending_len().min(limits.chunk_at(s.computed, budget));
            budget -= n;
            s.in_flight = n;
        }
        let items = self
            .running
            .iter()
            .filter(|s| s.in_flight > 0)
            .map(|s| BatchItem {
                seq: s.id,
                tokens: s.pending_tokens(s.in_flight),
            })
            .collect();
        let batch = RunBatch {
            free: std::mem::take(&mut self.to_free),
            items,
        };
        (batch, admitted)
    }

    /// The running sequence `id`.
    pub fn running_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.running.iter_mut().find(|s| s.id == id)
    }

    /// Removes the running sequence `id` (finished or failed) and schedules its KV to be freed.
    pub fn remove_running(&mut self, id: SeqId) -> Option<Sequence> {
        let pos = self.running.iter().position(|s| s.id == id)?;
        let seq = self.running.remove(pos);
        self.to_free.push(id);
        Some(seq)
    }

    /// Removes any sequence, running first (used when the runner is gone).
    pub fn pop_any(&mut self) -> Option<Sequence> {
        if let Some(seq) = self.running.pop() {
            self.to_free.push(seq.id);
            return Some(seq);
        }
        self.waiting.pop_front()
    }

    /// Ids of sequences whose KV is to be freed at the next step.
    pub fn pending_frees(&self) -> &[SeqId] {
        &self.to_free
    }
}
