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
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{ErrorKind, InferError};
use crate::model_runner::{BatchItem, BlockCopy, BlockLoad, PersistBlock, RunBatch};
use crate::prefix_store::{DiskCounters, ModelFingerprint};
use crate::request::{EngineStats, KvEventStats, LoraStats, PrefixCacheStats, SeqId, SpecStats};

use super::block_manager::BlockManager;
use super::sequence::{Prepared, Sequence};
use super::speculative::{RowCost, SpecState, Speculation};

mod fork;
mod kv_events;

/// A block copy for a forked choice, shipped with the next batch if the choice still
/// owns `copy.dst` at table index `index` then.
#[derive(Debug, Clone, Copy)]
struct PendingCopy {
    seq: SeqId,
    index: usize,
    copy: BlockCopy,
}

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

/// Prefix caching as the scheduler uses it.
#[derive(Debug, Clone)]
pub struct PrefixCaching {
    /// Fingerprint of the model and KV layout (enters every block hash).
    pub fingerprint: ModelFingerprint,
    /// The disk tier's counters when it is enabled (full blocks are then sent to it).
    pub disk: Option<Arc<DiskCounters>>,
    /// Bytes of one block's K/V over every layer (`KvBlockPool::block_bytes`).
    pub block_bytes: usize,
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
    prefix: Option<PrefixCaching>,
    prefix_stats: PrefixCacheStats,
    /// Disk blocks to load in the next step.
    loads: Vec<BlockLoad>,
    /// Blocks of forked choices to copy in the next step.
    copies: Vec<PendingCopy>,
    prompt_tokens_computed: u64,
    /// Speculative decoding, when on.
    spec: Option<Speculation>,
    spec_stats: SpecStats,
    row_cost: RowCost,
    /// Waiting sequences whose adapter is gone (unloaded, or it failed to load), with
    /// why: the actor fails them.
    gone: Vec<(Sequence, String)>,
    /// The adapter registry the sequences' leases come from (loads to start).
    adapters: Option<std::sync::Arc<crate::adapters::AdapterRegistry>>,
    /// KV-cache events of the memory tier, when published.
    kv_events: Option<kv_events::KvEventLog>,
}

/// Whether a waiting sequence's adapter lets it be admitted now.
enum AdapterGate {
    /// No adapter, or it is resident.
    Ready,
    /// Its adapter is loading, or waits for a slot: try the next sequence.
    Wait,
    /// It was removed from the queue (its adapter is gone).
    Gone,
}

impl Scheduler {
    /// An empty scheduler over the KV blocks of `blocks`, without prefix caching.
    pub fn new(limits: SchedulerLimits, blocks: BlockManager) -> Self {
        Self {
            limits,
            blocks,
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions_total: 0,
            tokens_generated: 0,
            steps: 0,
            prefix: None,
            prefix_stats: PrefixCacheStats::default(),
            loads: Vec::new(),
            copies: Vec::new(),
            prompt_tokens_computed: 0,
            spec: None,
            row_cost: RowCost::new(0.0),
            spec_stats: SpecStats {
                method: "off",
                ..SpecStats::default()
            },
            gone: Vec::new(),
            adapters: None,
            kv_events: None,
        }
    }

    /// Sequences whose adapter is gone, with why (to fail with `model_not_found`).
    pub fn take_gone(&mut self) -> Vec<(Sequence, String)> {
        std::mem::take(&mut self.gone)
    }

    /// Adapter loads the last [`Self::schedule`] asked for: the registry and
    /// `(name, path)` each, to run off the scheduler's thread
    /// ([`crate::adapters::AdapterRegistry::load_resident`]).
    pub fn take_adapter_loads(&mut self) -> Option<crate::adapters::AdapterLoads> {
        let reg = self.adapters.as_ref()?;
        let loads = reg.take_loads();
        (!loads.is_empty()).then(|| (reg.clone(), loads))
    }

    /// The adapters of the running sequences (not to be evicted).
    fn adapters_in_use(&self) -> std::collections::HashSet<String> {
        self.running
            .iter()
            .filter_map(|s| s.adapter.as_ref())
            .map(|a| a.lease.name().to_string())
            .collect()
    }

    /// Sees whether `waiting[at]`'s adapter is resident (taking its weights), asks
    /// for its load when not, or removes the sequence when its adapter is gone.
    fn adapter_gate(
        &mut self,
        at: usize,
        in_use: &std::collections::HashSet<String>,
    ) -> AdapterGate {
        use crate::adapters::Residency;
        let Some(a) = self.waiting.get_mut(at).and_then(|s| s.adapter.as_mut()) else {
            return AdapterGate::Ready;
        };
        if a.lora.is_some() {
            return AdapterGate::Ready;
        }
        match a.lease.registry().residency(a.lease.name(), in_use) {
            Residency::Ready(l) => {
                a.lora = Some(l);
                AdapterGate::Ready
            }
            Residency::Pending => AdapterGate::Wait,
            Residency::Gone(why) => {
                if let Some(s) = self.waiting.remove(at) {
                    self.gone.push((s, why));
                }
                AdapterGate::Gone
            }
        }
    }

    /// Serves LoRA adapters from `reg`: the registry every request's lease comes from,
    /// whose loads [`Self::take_adapter_loads`] hands out.
    pub fn with_adapters(mut self, reg: std::sync::Arc<crate::adapters::AdapterRegistry>) -> Self {
        self.adapters = Some(reg);
        self
    }

    /// Turns speculative decoding on (n-gram drafts, see [`super::speculative`]).
    pub fn with_speculation(mut self, spec: Speculation) -> Self {
        self.spec_stats.method = if spec.draft_cost.is_some() {
            "draft"
        } else {
            "ngram"
        };
        self.spec_stats.k = spec.k;
        self.spec_stats.row_cost = spec.row_cost;
        self.row_cost = RowCost::new(spec.row_cost);
        self.spec_stats.draft_cost = spec.draft_cost.unwrap_or(0.0);
        self.spec = Some(spec);
        self
    }

    /// Turns prefix caching on.
    pub fn with_prefix_caching(mut self, prefix: PrefixCaching) -> Self {
        self.prefix_stats.enabled = true;
        self.prefix_stats.disk_enabled = prefix.disk.is_some();
        self.prefix = Some(prefix);
        self
    }

    /// Bytes of disk-tier K/V held by waiting sequences (loaded into the pool and
    /// released at admission).
    pub fn disk_hit_bytes_waiting(&self) -> usize {
        self.waiting
            .iter()
            .filter_map(|s| s.cache.as_ref()?.disk.as_ref())
            .flat_map(|d| d.blocks.iter().map(Vec::len))
            .sum()
    }

    /// The prefix caching settings, when on.
    pub fn prefix_caching(&self) -> Option<&PrefixCaching> {
        self.prefix.as_ref()
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

    /// KV blocks the sequences own plus the blocks the waiting ones' tokens need: the
    /// engine's load as the placer of several engines weighs it.
    pub fn load_blocks(&self) -> usize {
        let bs = self.blocks.block_size().max(1);
        let waiting: usize = self
            .waiting
            .iter()
            .map(|s| s.total_len().div_ceil(bs))
            .sum();
        self.blocks.used_blocks() + waiting
    }

    /// Tokens per KV block.
    pub fn block_size(&self) -> usize {
        self.blocks.block_size()
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
            prompt_tokens_computed: self.prompt_tokens_computed,
            prefix_cache: self.prefix_cache_stats(),
            speculative: self.spec_stats.with_ratios(),
            lora: LoraStats {
                running: adapter_names(self.running.iter()),
                waiting: adapter_names(self.waiting.iter()),
            },
            kv_events: KvEventStats::default(),
            engines: Vec::new(),
        }
    }

    fn prefix_cache_stats(&self) -> PrefixCacheStats {
        let mut p = self.prefix_stats;
        p.hit_rate = if p.prompt_tokens == 0 {
            0.0
        } else {
            p.hit_tokens as f64 / p.prompt_tokens as f64
        };
        p.memory_blocks = self.blocks.cache().cached_blocks();
        p.memory_evictable_blocks = self.blocks.cache().evictable_blocks();
        if let Some(d) = self.prefix.as_ref().and_then(|p| p.disk.as_ref()) {
            let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            p.disk_blocks = get(&d.blocks);
            p.disk_bytes = get(&d.bytes);
            p.disk_written_blocks = get(&d.written_blocks);
            p.disk_evicted_blocks = get(&d.evicted_blocks);
            p.disk_dropped_corrupt = get(&d.dropped_corrupt);
            p.disk_dropped_writes = get(&d.dropped_writes);
            p.disk_unreachable_writes = get(&d.unreachable_writes);
        }
        p
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
    pub fn submit(&mut self, req: Prepared) -> Result<(), Box<(Prepared, InferError)>> {
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
        let fp = self.prefix.as_ref().map(|p| &p.fingerprint);
        let spec = self.spec.filter(|_| req.sampling.speculative);
        let mut seq = Sequence::with_cache(req, budget, fp);
        seq.spec = spec.as_ref().map(SpecState::new);
        self.waiting.push_back(seq);
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
        s.drafts.clear();
        s.model_drafts = 0;
        s.unpersisted.clear();
        if let Some(st) = s.spec.as_mut() {
            st.draft_computed = 0;
        }
        s.preemptions += 1;
        if let Some(a) = s.adapter.as_mut() {
            a.lora = None;
        }
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
        // 2. Admission, first come first served, whole prompt's blocks up front. A
        // sequence whose LoRA adapter is not resident stays queued (its load asked for)
        // while those behind it are admitted.
        let mut admitted = Vec::new();
        let mut in_use = self.adapters_in_use();
        let mut at = 0;
        while self.running.len() < self.limits.max_running && at < self.waiting.len() {
            match self.adapter_gate(at, &in_use) {
                AdapterGate::Ready => {}
                AdapterGate::Wait => {
                    at += 1;
                    continue;
                }
                AdapterGate::Gone => continue,
            }
            let total = self.waiting[at].total_len();
            let reserve = if self.running.is_empty() {
                0
            } else {
                self.watermark()
            };
            let (hits, from_disk) = self.plan_prefix(at);
            let need = self.blocks.blocks_for(total) - hits.len();
            let free = self.blocks.free_blocks() - self.blocks.evictable_among(&hits);
            if need + reserve > free {
                // Not admitted: it holds no adapter weights while it waits (an idle
                // adapter may be evicted meanwhile; it is looked up again).
                if let Some(a) = self.waiting[at].adapter.as_mut() {
                    a.lora = None;
                }
                break;
            }
            let Some(mut seq) = self.waiting.remove(at) else {
                break;
            };
            if self.blocks.admit_with_prefix(seq.id, &hits, total).is_err() {
                self.waiting.insert(at, seq); // unreachable: checked above
                break;
            }
            if let Some(a) = &seq.adapter {
                in_use.insert(a.lease.name().to_string());
            }
            self.start_from_cache(&mut seq, hits.len(), from_disk);
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
            let mut n = s.pending_len().min(limits.chunk_at(s.computed, budget));
            if !s.images.is_empty() {
                // An image's run is computed in one step.
                let end = crate::request::media::chunk_end(&s.images, s.computed, s.computed + n);
                n = end - s.computed;
            }
            if n == 0 {
                continue;
            }
            budget = budget.saturating_sub(n);
            s.in_flight = n;
        }
        // 4. Drafts from what the budget has left.
        self.plan_drafts(budget);
        let mut items = Vec::new();
        for i in 0..self.running.len() {
            if self.running[i].in_flight == 0 {
                continue;
            }
            let persist = self.blocks_to_persist(i);
            let s = &self.running[i];
            let (start, end) = (s.computed, s.computed + s.in_flight);
            let next_token = usize::from(end == s.total_len());
            let scores = s
                .echo
                .as_ref()
                .map_or(0, |e| e.rows_wanted(start, end, s.prompt.len()));
            self.prompt_tokens_computed += end.min(s.prompt.len()).saturating_sub(start) as u64;
            let mut tokens = s.pending_tokens(s.in_flight);
            tokens.extend_from_slice(&s.drafts);
            items.push(BatchItem {
                seq: s.id,
                images: s
                    .images
                    .iter()
                    // Every image up to this step: Qwen2-VL's positions after an
                    // image depend on it.
                    .filter(|im| im.runs.first().is_some_and(|r| r.start < end))
                    .cloned()
                    .collect(),
                tokens,
                start_pos: start,
                block_table: self.blocks.table(s.id).to_vec(),
                logit_rows: next_token.max(scores) + s.planned_drafts(),
                draft: s.draft_work(),
                prompt_len: s.prompt.len(),
                persist,
                adapter: s.adapter.as_ref().and_then(|a| {
                    Some(crate::model_runner::BatchAdapter {
                        lora: a.lora.clone()?,
                        scale: a.lease.key().scale,
                    })
                }),
            });
        }
        if !items.is_empty() {
            self.steps += 1;
        }
        let loads = std::mem::take(&mut self.loads);
        let copies = self.take_copies();
        (
            RunBatch {
                items,
                loads,
                copies,
            },
            admitted,
        )
    }

    /// Gives decoding sequences drafts to verify after their pending token, within
    /// `budget` tokens, while at most `speculative.max_running` sequences decode (more
    /// make the step compute-bound, where extra rows cost what they save). Each draft
    /// needs a KV slot: a sequence whose blocks cannot grow for them runs without.
    fn plan_drafts(&mut self, mut budget: usize) {
        for s in &mut self.running {
            s.drafts.clear();
            s.model_drafts = 0;
        }
        let Some(spec) = self.spec else {
            return;
        };
        let decoding = |s: &Sequence| s.in_flight == 1 && !s.is_prefilling();
        let n = self.running.iter().filter(|s| decoding(s)).count();
        if n == 0 || n > spec.max_running {
            return;
        }
        for i in 0..self.running.len() {
            if budget == 0 {
                break;
            }
            let s = &mut self.running[i];
            if !decoding(s) {
                continue;
            }
            let m = s.propose_drafts(&spec, budget);
            if m == 0 {
                continue;
            }
            let (id, need) = (s.id, s.computed + 1 + m);
            if self.blocks.ensure(id, need).is_err() {
                self.running[i].drop_drafts();
                continue;
            }
            budget -= m;
        }
    }

    /// A step that ran one decoding sequence alone, with `rows` rows (no draft model),
    /// took `secs`: the row cost estimate follows (see [`RowCost`]).
    pub fn observe_step(&mut self, rows: usize, secs: f64) {
        let Some(spec) = self.spec.as_mut().filter(|s| s.follow_row_cost) else {
            return;
        };
        self.row_cost.observe(rows, secs);
        spec.row_cost = self.row_cost.cost;
        self.spec_stats.row_cost = self.row_cost.cost;
    }

    /// After `id`'s step verified `drafted` drafts and accepted the first `accepted`:
    /// their positions (written by the step) count as computed, full blocks they
    /// complete join the memory tier, and the blocks past the sequence's end (written
    /// by rejected drafts) are released. The counters follow.
    pub fn commit_drafts(&mut self, id: SeqId, drafted: usize, accepted: usize) {
        self.spec_stats.add(drafted, accepted);
        let Some(i) = self.running.iter().position(|s| s.id == id) else {
            return;
        };
        let s = &mut self.running[i];
        let from = s.computed;
        let model = std::mem::take(&mut s.model_drafts) > 0;
        if let Some(st) = s.spec.as_mut() {
            st.observe_verification(drafted, accepted);
            if model {
                // The draft model ran up to the pending token, then its first
                // `drafted − 1` drafts: valid as far as they were accepted.
                st.draft_computed = from + accepted.min(drafted.saturating_sub(1));
            }
        }
        let total = s.total_len();
        s.computed += accepted;
        self.note_unpersisted(i, from);
        self.register_computed(i);
        self.blocks.truncate(id, total);
    }

    /// With a disk tier: remembers the full blocks `running[i]`'s accepted drafts
    /// completed (positions `from ..` its computed end) that the memory tier does not
    /// hold yet, for the next step to persist (the step that computed them could not
    /// know they would be kept).
    fn note_unpersisted(&mut self, i: usize, from: usize) {
        let Some(prefix) = self.prefix.as_ref().filter(|p| p.disk.is_some()) else {
            return;
        };
        let bs = self.blocks.block_size();
        let s = &mut self.running[i];
        let (a, b) = (from / bs, s.computed / bs);
        if s.cache.is_none() || b <= a {
            return;
        }
        let hashes = s.prefix_hashes(b, bs, &prefix.fingerprint).to_vec();
        let cache = self.blocks.cache();
        let fresh = (a..b.min(hashes.len())).filter(|&j| !cache.contains(&hashes[j]));
        s.unpersisted.extend(fresh);
    }

    /// For `waiting[at]`: the cached memory blocks its prefix can start with,
    /// and how many blocks right after them its disk hit provides. At most
    /// `⌊(total − 1) / block_size⌋` blocks are reused, so at least one token is computed
    /// (its logits are needed) and no shared block is ever written.
    fn plan_prefix(&mut self, at: usize) -> (Vec<u32>, usize) {
        let Some(prefix) = self.prefix.as_ref() else {
            return (Vec::new(), 0);
        };
        let Some(seq) = self.waiting.get_mut(at) else {
            return (Vec::new(), 0);
        };
        // A prompt being scored (`echo` with `logprobs`) needs every position's logits:
        // it reads nothing from the cache.
        let scoring = seq
            .echo
            .as_ref()
            .is_some_and(|e| e.needs_rows(seq.prompt.len()));
        if seq.cache.is_none() || scoring {
            return (Vec::new(), 0);
        }
        let bs = self.blocks.block_size();
        let cap = (seq.total_len() - 1) / bs;
        let hashes = seq.prefix_hashes(cap, bs, &prefix.fingerprint).to_vec();
        let seq = &*seq;
        let hits = self
            .blocks
            .match_prefix(&hashes, |i| seq.block_tokens(i, bs));
        let from_disk = match seq.cache.as_ref().and_then(|c| c.disk.as_ref()) {
            Some(d) if d.first_block <= hits.len() => (d.first_block + d.blocks.len())
                .min(hashes.len())
                .saturating_sub(hits.len()),
            _ => 0,
        };
        (hits, from_disk)
    }

    /// After admission with `hits` memory blocks: queues the `from_disk` disk blocks
    /// that follow for loading (registering them in the memory tier), skips the cached
    /// positions, and counts the hit.
    fn start_from_cache(&mut self, seq: &mut Sequence, hits: usize, from_disk: usize) {
        let bs = self.blocks.block_size();
        let disk = seq.cache.as_mut().and_then(|c| c.disk.take());
        if let (Some(mut disk), Some(prefix)) = (disk, self.prefix.as_ref()) {
            let hashes = seq
                .prefix_hashes(hits + from_disk, bs, &prefix.fingerprint)
                .to_vec();
            let table = self.blocks.table(seq.id).to_vec();
            let mut stored = Vec::new();
            // The table covers the whole sequence, so every block index here is in it.
            for (idx, (&hash, &block)) in hashes.iter().zip(&table).enumerate().skip(hits) {
                let kv = std::mem::take(&mut disk.blocks[idx - disk.first_block]);
                let tokens = seq.block_tokens(idx, bs);
                self.register_block(seq.id, idx, hash, tokens, &mut stored);
                self.loads.push(BlockLoad { block, kv });
            }
            if let Some(keys) = seq.cache.as_ref().map(|c| c.keys.clone()) {
                self.record_stored(stored, &hashes, &keys);
            }
        }
        let cached = hits + from_disk;
        if let Some(c) = seq.cache.as_mut() {
            c.registered = cached;
        }
        seq.computed = cached * bs;
        if !seq.started && seq.cache.is_some() {
            seq.cached_tokens = seq.computed;
            let p = &mut self.prefix_stats;
            p.prompt_tokens += seq.prompt.len() as u64;
            p.hit_tokens += seq.computed as u64;
            p.memory_hit_tokens += (hits * bs) as u64;
            p.disk_hit_tokens += (from_disk * bs) as u64;
        }
    }

    /// Full blocks that `running[i]`'s chunk in this step completes and that no block
    /// of the memory tier holds yet (and those its accepted drafts completed before): the runner copies them to the disk tier after the
    /// forward pass. Empty without a disk tier or for a request with caching off.
    fn blocks_to_persist(&mut self, i: usize) -> Vec<PersistBlock> {
        let Some(prefix) = self.prefix.as_ref().filter(|p| p.disk.is_some()) else {
            return Vec::new();
        };
        let bs = self.blocks.block_size();
        let s = &mut self.running[i];
        if s.cache.is_none() {
            return Vec::new();
        }
        let (from, to) = (s.computed / bs, (s.computed + s.in_flight) / bs);
        let earlier = std::mem::take(&mut s.unpersisted);
        if to <= from && earlier.is_empty() {
            return Vec::new();
        }
        let hashes = s.prefix_hashes(to, bs, &prefix.fingerprint).to_vec();
        let table = self.blocks.table(s.id);
        let fresh =
            (from..to.min(hashes.len())).filter(|&b| !self.blocks.cache().contains(&hashes[b]));
        earlier
            .into_iter()
            .chain(fresh)
            .filter_map(|b| {
                Some(PersistBlock {
                    block: *table.get(b)?,
                    hash: hashes[b],
                    parent: b.checked_sub(1).map(|p| hashes[p]),
                    tokens: s.block_tokens(b, bs),
                    keys: s
                        .cache
                        .as_ref()
                        .map(|c| c.keys.of_block(b))
                        .unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Records that the step running `id`'s in-flight tokens finished: they count as
    /// computed, and the full blocks they completed join the memory tier.
    pub fn commit_step(&mut self, id: SeqId) {
        let Some(i) = self.running.iter().position(|s| s.id == id) else {
            return;
        };
        let s = &mut self.running[i];
        s.computed += std::mem::take(&mut s.in_flight);
        self.register_computed(i);
    }

    /// Registers the full blocks of `running[i]`'s computed positions not registered
    /// yet in the memory tier.
    fn register_computed(&mut self, i: usize) {
        let bs = self.blocks.block_size();
        let s = &mut self.running[i];
        let (Some(prefix), Some(from)) =
            (self.prefix.as_ref(), s.cache.as_ref().map(|c| c.registered))
        else {
            return;
        };
        let to = s.computed / bs;
        if to <= from {
            return;
        }
        let hashes = s.prefix_hashes(to, bs, &prefix.fingerprint).to_vec();
        let id = s.id;
        let blocks: Vec<Vec<u32>> = (from..hashes.len())
            .map(|b| s.block_tokens(b, bs))
            .collect();
        let keys = s.cache.as_mut().map(|c| {
            c.registered = to;
            c.keys.clone()
        });
        let mut stored = Vec::new();
        for (b, tokens) in (from..).zip(blocks) {
            self.register_block(id, b, hashes[b], tokens, &mut stored);
        }
        if let Some(keys) = keys {
            self.record_stored(stored, &hashes, &keys);
        }
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

/// The distinct adapter names of `seqs`, sorted.
fn adapter_names<'a>(seqs: impl Iterator<Item = &'a Sequence>) -> Vec<String> {
    let set: std::collections::BTreeSet<&str> = seqs
        .filter_map(|s| s.adapter.as_ref())
        .map(|a| a.lease.name())
        .collect();
    set.into_iter().map(str::to_string).collect()
}
