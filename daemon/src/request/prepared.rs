//! [`PreparedRequest`]: what `prepare/` sends to the scheduler, the one way in.

use std::time::Instant;

use super::{CacheOptions, CancelFlag, ChannelSpec, EventSender, SamplingParams, SeqId};

/// A request as `prepare/` hands it to the scheduler: prompt ids (template applied),
/// the output channels its template implies, and its sampling chains, built and
/// configured before it is queued. `C` is the sampling chain
/// (`sampling::SamplerChain`); generic so that these shared types do not depend on
/// the sampling stage.
#[derive(Debug)]
pub struct PreparedRequest<C> {
    /// Engine id, chosen by the connection when it accepted the request.
    pub seq: SeqId,
    /// The client's id (for logs).
    pub client_id: String,
    /// Prompt token ids (template applied, BOS added when the model wants it).
    pub prompt: Vec<u32>,
    /// Validated sampling parameters.
    pub sampling: SamplingParams,
    /// The request's sampling stage: native processors, its plugin instances
    /// (configured), the seeded sampler.
    pub chain: C,
    /// Where events go.
    pub events: EventSender,
    /// Set when the client cancels or disconnects.
    pub cancel: CancelFlag,
    /// When the connection accepted the request (TTFT is measured from here).
    pub received_at: Instant,
    /// Prefix caching for this request (`cache`, `cache_salt`).
    pub cache: CacheOptions,
    /// Blocks the disk tier returned for this prompt before it was queued.
    pub disk_hit: Option<DiskHit>,
    /// How the output is split into content, reasoning and tool calls.
    pub channels: ChannelSpec,
    /// The sampling chains of choices `1..n` (`n > 1`), each seeded with its choice's
    /// seed; empty for one choice.
    pub forks: Vec<C>,
    /// The lease on the request's LoRA adapter (`None`: the base model).
    pub adapter: Option<crate::adapters::AdapterLease>,
    /// The prompt's images, in prompt order (empty for text).
    pub images: Vec<std::sync::Arc<super::PromptImage>>,
}

/// K/V of consecutive full prompt blocks read from the disk tier: `blocks[j]` is block
/// `first_block + j` in `model::KvBlockPool::read_block` layout.
#[derive(Debug, Clone, Default)]
pub struct DiskHit {
    /// Index of the first block in the prompt.
    pub first_block: usize,
    /// One payload per block.
    pub blocks: Vec<Vec<u8>>,
}
