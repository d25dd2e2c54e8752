//! [`Scheduler`]: the continuous-batching policy, free of actix so tests drive it directly.
//!
//! Every step is one forward pass over all running sequences: each decoding sequence
//! contributes its one new token, and prefilling sequences (new prompts, or sequences
//! recomputing after preemption) contribute chunks within the per-step token budget
//! `max_batch_tokens` (chunked prefill, as in vLLM and Sarathi-Serve), shortest
//! remaining prompt first, so a long prompt never stalls the running streams for more
//! than one chunk's worth of compute.
//!
//! KV memory is a pool of blocks ([`BlockManager`]). Admission is first come, first
//! served while fewer than `max_running` run and the head of the queue's whole prompt
//! fits in the free blocks (keeping a 1 % watermark free for running sequences to grow
//! into, as vLLM does). When a decoding sequence needs a block and none is free, the
//! newest running sequence is preempted: its blocks are freed and it goes back to the
//! front of the queue with its generated tokens, to be recomputed later (vLLM's
//! recompute preemption). Its stream pauses; nothing is lost or sent twice.

use std::collections::VecDeque;

use crate::error::{ErrorKind, InferError};
use crate::model_runner::{BatchItem, RunBatch};
use crate::request::SeqId;

use super::block_manager::BlockManager;
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
    /// Tokens per step over all sequences (decode tokens + prefill chunk tokens), ≥
    /// `max_running` so every running sequence can decode in every step.
    pub max_batch_tokens: usize,
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

/// Engine counters, for the `stats` message and the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineStats {
    /// Sequences running (admitted, holding KV blocks).
    pub running: usize,
    /// Sequences waiting for admission (preempted ones included).
    pub waiting: usize,
    /// Waiting sequences that were preempted and will be recomputed.
    pub preempted: usize,
    /// Preemptions since start.
    pub preemptions_total: u64,
    /// KV blocks owned by sequences.
    pub kv_blocks_used: usize,
    /// KV blocks in the pool.
    pub kv_blocks_total: usize,
    /// Tokens per KV block.
    pub kv_block_size: usize,
    /// Tokens generated since start (all requests).
    pub tokens_generated: u64,
    /// Forward passes (engine steps) since start.
    pub steps: u64,
}

/// Queues, running set and KV blocks.
#[derive(Debug)]
pub struct Scheduler {
    limits: SchedulerLimits,
    blocks: BlockManager,
    /// Waiting sequences; preempted ones are put back at the front.
    waiting: VecDeque<Sequence>,
    /// Running sequences in admission order (the last is the newest).
    running: Vec<Sequence>,
    preemptions_total: u64,
    tokens_generated: u64,
    steps: u64,
}

impl Scheduler {
    /// An empty scheduler over the KV blocks of `blocks`.
    pub fn new(limits: SchedulerLimits, blocks: BlockManager) -> Self {
        Self {
            limits,
            blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions_total: 0,
            tokens_generated: 0,
            steps: 0,
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

    /// The block manager (read only).
    pub fn blocks(&self) -> &BlockManager {
        &self.blocks
    }

    /// Whether there is nothing to run.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            preempted: self.waiting.iter().filter(|s| s.preemptions > 0).count(),
            preemptions_total: self.preemptions_total,
            kv_blocks_used: self.blocks.used_blocks(),
            kv_blocks_total: self.blocks.total_blocks(),
            kv_block_size: self.blocks.block_size(),
            tokens_generated: self.tokens_generated,
            steps: self.steps,
        }
    }

    /// Counts one generated token (for [`EngineStats::tokens_generated`]).
    pub fn note_generated(&mut self) {
        self.tokens_generated += 1;
    }

    /// Blocks kept free for running sequences to grow into when admitting (1 % of the
    /// pool, at least 1).
    fn watermark(&self) -> usize {
        (self.blocks.total_blocks() / 100).max(1)
    }

    /// Queues a request.
    ///
    /// # Errors
    /// `context_length_exceeded` when the prompt leaves no room for one generated token
    /// in the context window or in the whole KV cache (the message names both counts);
    /// `validation` for an empty prompt; `overloaded` when `max_waiting` sequences
    /// already wait. The request is handed back with the error.
    pub fn submit(
        &mut self,
        req: TokenizedRequest,
    ) -> Result<(), Box<(TokenizedRequest, InferError)>> {
        let ctx = self.limits.context_length;
        let kv_tokens = self.blocks.capacity_tokens();
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
        if n >= kv_tokens {
            let e = InferError::new(
                ErrorKind::ContextLengthExceeded,
                format!(
                    "the prompt has {n} tokens but the KV cache holds {kv_tokens} tokens \
                     (scheduler.kv_cache_bytes; at least 1 token must remain for generation)"
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
        // A sequence alone must always fit in the pool, or it could never be resumed
        // after a preemption.
        let budget = req.sampling.max_tokens.min(ctx - n).min(kv_tokens - n);
        self.waiting.push_back(Sequence::new(req, budget));
        Ok(())
    }

    /// Removes every cancelled sequence (waiting or running), frees their KV blocks at
    /// once, and returns them.
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
                let s = self.running.remove(i);
                self.blocks.free(s.id);
                out.push(s);
            } else {
                i += 1;
            }
        }
        out
    }

    /// Preempts `running[idx]`: frees its blocks and puts it at the front of the queue
    /// to be recomputed (prompt and generated tokens) when it is admitted again.
    fn preempt(&mut self, idx: usize) {
        let mut s = self.running.remove(idx);
        self.blocks.free(s.id);
        s.computed = 0;
        s.in_flight = 0;
        s.preemptions += 1;
        self.preemptions_total += 1;
        tracing::info!(
            seq = %s.id,
            tokens = s.total_len(),
            kv_blocks_free = self.blocks.free_blocks(),
            "KV cache full: preempted the newest sequence (it will be recomputed)"
        );
        self.waiting.push_front(s);
    }

    /// Builds the next step: gives every decoding sequence a block for its next token
    /// (preempting the newest sequences when blocks run out), admits waiting sequences,
    /// and fills the token budget with prefill chunks. Newly started sequences are
    /// returned too, so the caller can send their `started` event.
    pub fn schedule(&mut self) -> (RunBatch, Vec<SeqId>) {
        // 1. Room for every decode token, oldest sequence first.
        let mut idx = 0;
        while idx < self.running.len() {
            let s = &self.running[idx];
            if s.is_prefilling() {
                idx += 1;
                continue;
            }
            let (id, tokens) = (s.id, s.computed + 1);
            while self.blocks.ensure(id, tokens).is_err() {
                let victim = self.running.len() - 1;
                self.preempt(victim);
                if victim == idx {
                    break;
                }
            }
            idx += 1;
        }
        // 2. Admission, first come first served, whole prompt's blocks up front.
        let mut admitted = Vec::new();
        while self.running.len() < self.limits.max_running {
            let Some(head) = self.waiting.front() else {
                break;
            };
            let need = self.blocks.blocks_for(head.total_len());
            let reserve = if self.running.is_empty() {
                0
            } else {
                self.watermark()
            };
            if need + reserve > self.blocks.free_blocks() {
                break;
            }
            let Some(seq) = self.waiting.pop_front() else {
                break;
            };
            if self.blocks.ensure(seq.id, seq.total_len()).is_err() {
                self.waiting.push_front(seq); // unreachable: checked above
                break;
            }
            if !seq.started {
                admitted.push(seq.id);
            }
            self.running.push(seq);
        }
        // 3. Token budget: decodes always run; prefill chunks share the rest, fewest
        // remaining tokens first (ties: admission order), so a short prompt is not
        // queued behind a long one.
        let mut budget = self.limits.max_batch_tokens.max(1);
        let mut prefilling: Vec<usize> = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            if s.is_prefilling() {
                s.in_flight = 0;
                prefilling.push(i);
            } else {
                s.in_flight = s.pending_len();
                budget = budget.saturating_sub(s.in_flight);
            }
        }
        prefilling.sort_by_key(|&i| self.running[i].pending_len());
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
        let blocks = &self.blocks;
        let items: Vec<BatchItem> = self
            .running
            .iter()
            .filter(|s| s.in_flight > 0)
            .map(|s| BatchItem {
                seq: s.id,
                tokens: s.pending_tokens(s.in_flight),
                start_pos: s.computed,
                block_table: blocks.table(s.id).to_vec(),
                want_logits: s.computed + s.in_flight == s.total_len(),
            })
            .collect();
        if !items.is_empty() {
            self.steps += 1;
        }
        (RunBatch { items }, admitted)
    }

    /// The running sequence `id`.
    pub fn running_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.running.iter_mut().find(|s| s.id == id)
    }

    /// Removes the running sequence `id` (finished or failed) and frees its KV blocks.
    pub fn remove_running(&mut self, id: SeqId) -> Option<Sequence> {
        let pos = self.running.iter().position(|s| s.id == id)?;
        let seq = self.running.remove(pos);
        self.blocks.free(id);
        Some(seq)
    }

    /// Removes any sequence, running first (used when the runner is gone).
    pub fn pop_any(&mut self) -> Option<Sequence> {
        if let Some(seq) = self.running.pop() {
            self.blocks.free(seq.id);
            return Some(seq);
        }
        self.waiting.pop_front()
    }
}
