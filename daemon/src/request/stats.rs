//! Engine counters shared by the scheduler (which counts), the engine handle (which
//! sums several engines) and the edges (`stats` message, metrics): plain data, so the
//! wire and the metrics never depend on the scheduler.

/// Prefix cache counters (`stats.prefix_cache`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct PrefixCacheStats {
    /// Whether prefix caching is on (`prefix_store.enabled`).
    pub enabled: bool,
    /// Whether the disk tier is on.
    pub disk_enabled: bool,
    /// Prompt tokens of admitted requests that used the cache.
    pub prompt_tokens: u64,
    /// Of those, tokens whose K/V came from the cache (memory or disk).
    pub hit_tokens: u64,
    /// `hit_tokens / prompt_tokens` (0 when no prompt was seen).
    pub hit_rate: f64,
    /// Tokens served from the memory tier.
    pub memory_hit_tokens: u64,
    /// Tokens served from the disk tier.
    pub disk_hit_tokens: u64,
    /// KV pool blocks holding a cached prefix block (in use or evictable).
    pub memory_blocks: usize,
    /// Of those, blocks no sequence uses (reusable, evicted LRU first).
    pub memory_evictable_blocks: usize,
    /// Blocks in the disk tier.
    pub disk_blocks: u64,
    /// Bytes of the disk tier's entries.
    pub disk_bytes: u64,
    /// Blocks written to disk since start.
    pub disk_written_blocks: u64,
    /// Blocks evicted from disk to stay within `prefix_store.max_bytes`.
    pub disk_evicted_blocks: u64,
    /// Disk entries that failed verification (corrupt, truncated), deleted.
    pub disk_dropped_corrupt: u64,
    /// Blocks not written because the write queue was full or writing failed.
    pub disk_dropped_writes: u64,
    /// Blocks not written because the earlier blocks of their chain are not stored (or
    /// would have had to be evicted to make room): no lookup could reach them.
    pub disk_unreachable_writes: u64,
}

/// Engine counters, for the `stats` message and the log.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
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
    /// Prompt positions run through the model since start (prefill work: cached
    /// tokens are not counted, recomputation after a preemption is; the choices of an
    /// `n > 1` request share one prefill).
    pub prompt_tokens_computed: u64,
    /// Prefix cache counters.
    pub prefix_cache: PrefixCacheStats,
    /// Speculative decoding counters.
    pub speculative: SpecStats,
    /// LoRA adapters of the running and the waiting sequences.
    pub lora: LoraStats,
    /// KV-cache event publishing (`[kv_events]`; zero when off).
    pub kv_events: KvEventStats,
    /// Each engine's share (`[[engines]]`; one entry for one engine), filled in by
    /// the engine handle; empty from a single scheduler loop.
    pub engines: Vec<EngineShare>,
}

/// One engine's share of the daemon's state (`stats.engines[i]`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct EngineShare {
    /// Sequences running on it.
    pub running: usize,
    /// Sequences waiting on it.
    pub waiting: usize,
    /// Its KV blocks owned by sequences.
    pub kv_blocks_used: usize,
    /// Its KV pool's blocks.
    pub kv_blocks_total: usize,
    /// Requests placed on it since start.
    pub placed: u64,
    /// Prompt tokens it served from its prefix cache (memory and disk) since start.
    pub prefix_hit_tokens: u64,
}

/// KV-cache event messages since start (filled in by the scheduler loop, which holds
/// the publisher).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct KvEventStats {
    /// Messages sent on the PUB socket.
    pub published: u64,
    /// Messages that left the replay buffer before they could be sent.
    pub dropped: u64,
}

/// Which LoRA adapters the engine's sequences use now (the Gateway API Inference
/// Extension's `running_lora_adapters` / `waiting_lora_adapters`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct LoraStats {
    /// Adapters of running sequences, sorted, each once.
    pub running: Vec<String>,
    /// Adapters of waiting sequences, sorted, each once.
    pub waiting: Vec<String>,
}

/// Engine-wide speculation counters (`stats.speculative`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SpecStats {
    /// `speculative.method` (`"off"` or `"ngram"`).
    pub method: &'static str,
    /// `speculative.k`.
    pub k: usize,
    /// Measured cost of a verification row, as a fraction of a one-row decode step.
    pub row_cost: f64,
    /// Measured cost of a draft model step, as that fraction (0 without one).
    pub draft_cost: f64,
    /// Draft tokens verified since start.
    pub draft_tokens: u64,
    /// Of those, drafts accepted.
    pub accepted_tokens: u64,
    /// `accepted_tokens / draft_tokens` (0 before any draft).
    pub acceptance_rate: f64,
    /// Sequence steps that verified drafts.
    pub verification_steps: u64,
    /// Tokens those steps produced per step (accepted drafts plus the one sampled
    /// after them): `(accepted_tokens + verification_steps) / verification_steps`.
    pub tokens_per_verification: f64,
}

impl SpecStats {
    /// Adds one sequence step that verified `drafted` drafts and accepted `accepted`.
    pub fn add(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.draft_tokens += drafted as u64;
        self.accepted_tokens += accepted as u64;
        self.verification_steps += 1;
    }

    /// The counters with their ratios filled in.
    pub fn with_ratios(mut self) -> Self {
        let (a, d, v) = (
            self.accepted_tokens as usize,
            self.draft_tokens as usize,
            self.verification_steps as usize,
        );
        self.acceptance_rate = ratio(a, d);
        self.tokens_per_verification = ratio(a + v, v);
        self
    }
}

/// `a / b`, 0 when `b` is 0.
pub(crate) fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}
