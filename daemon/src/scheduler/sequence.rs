//! One accepted sequence: its tokens, its sampler and output stream, and its event channel.

use std::time::Instant;

use crate::detokenizer::channels::ChannelOut;
use crate::detokenizer::{ChannelSpec, Channels, OutputStream};
use crate::error::InferError;
use crate::prefix_store::{chain_hash_with, BlockHash, ModelFingerprint};
use crate::request::DiskHit;
use crate::request::{
    CancelFlag, EventSender, FinishReason, PreparedRequest, SeqId, StreamEvent, Timings, Usage,
};
use crate::sampling::{Sampled, SamplerChain, StepContext, TokenLogprobs};

use super::echo::PromptEcho;
use super::speculative::{ngram_propose, SpecState, Speculation};

mod fork;

/// A prepared request as the scheduler takes it: its chains are [`SamplerChain`]s.
pub type Prepared = PreparedRequest<SamplerChain>;

/// Prefix-cache state of one sequence.
#[derive(Debug)]
pub struct SeqCache {
    /// Root of the hash chain (fingerprint and salt).
    pub root: BlockHash,
    /// Hashes of the first `hashes.len()` full blocks of prompt + generated tokens.
    pub hashes: Vec<BlockHash>,
    /// Full blocks already registered in the memory tier (or found there).
    pub registered: usize,
    /// Disk payloads not yet loaded (taken at admission).
    pub disk: Option<DiskHit>,
    /// What entered the hashes besides tokens (the adapter, `cache_salt`), for the
    /// KV-cache events.
    pub keys: crate::kv_events::BlockKeys,
}

/// What [`Sequence::accept_token`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenOutcome {
    /// Keep generating.
    Continue,
    /// Generation ended.
    Finished(FinishReason),
}

/// A sequence admitted by the scheduler.
#[derive(Debug)]
pub struct Sequence {
    /// Engine id.
    pub id: SeqId,
    /// The client's id.
    pub client_id: String,
    /// Prompt ids.
    pub prompt: Vec<u32>,
    /// Generated ids so far (an end-of-generation token included when it ended one).
    pub generated: Vec<u32>,
    /// Tokens (prompt then generated) whose K/V the model runner holds.
    pub computed: usize,
    /// Tokens handed to the runner in the step now running (added to `computed` when
    /// the step returns).
    pub in_flight: usize,
    /// Generation budget: `min(max_tokens, context_window − prompt length)`, tokens.
    pub max_new_tokens: usize,
    chain: SamplerChain,
    output: OutputStream,
    events: EventSender,
    /// Cancellation flag.
    pub cancel: CancelFlag,
    received_at: Instant,
    first_token_at: Option<Instant>,
    last_token_at: Option<Instant>,
    /// Ids sampled since the last delta was sent.
    unsent_ids: Vec<u32>,
    /// Reasoning and tool-call splitting of the released text.
    channels: Channels,
    /// Control tokens the splitters see as text; empty for a plain request.
    markers: Vec<(u32, String)>,
    /// What `channels` was made from (for the choices forked from this one).
    channel_spec: ChannelSpec,
    /// Their log-probabilities, when the request asked for them.
    unsent_logprobs: Vec<TokenLogprobs>,
    /// Whether `started` was sent (the sequence was admitted to run).
    pub started: bool,
    /// Times this sequence was preempted (its KV freed, to be recomputed).
    pub preemptions: u32,
    /// Prefix-cache state; `None` when the request or the daemon has caching off.
    pub cache: Option<SeqCache>,
    /// Prompt tokens whose K/V came from the prefix cache at first admission.
    pub cached_tokens: usize,
    /// This sequence's choice (`0..choices`).
    pub choice: usize,
    /// The request's number of choices (`n`); above 1, deltas and `done` are sent as
    /// [`StreamEvent::Choice`].
    pub choices: usize,
    /// Choices `1..n` not yet forked from this one (they fork once its prompt is
    /// computed, see [`Sequence::fork`]).
    forks: Vec<PendingFork>,
    /// The prompt to echo (`echo`), until it is sent.
    pub echo: Option<PromptEcho>,
    /// Speculative decoding state; `None` when the daemon or the request has it off.
    pub spec: Option<SpecState>,
    /// Draft tokens of the step now running, verified after the pending token (set by
    /// [`Sequence::propose_drafts`], taken when the step returns).
    pub drafts: Vec<u32>,
    /// Drafts the draft model is to propose in the step now running (draft method).
    pub model_drafts: usize,
    /// Full blocks (table indices) that accepted drafts completed, for the next step to
    /// hand to the disk tier.
    pub unpersisted: Vec<usize>,
    /// The request's LoRA adapter; `None` for the base model.
    pub adapter: Option<SeqAdapter>,
    /// The prompt's images (empty for text).
    pub images: Vec<std::sync::Arc<crate::request::PromptImage>>,
}

/// A sequence's LoRA adapter: the request's lease (keeps the adapter from unloading)
/// and, while the sequence is admitted, the resident weights its batch rows use.
#[derive(Debug, Clone)]
pub struct SeqAdapter {
    /// The lease (name, fingerprint, scale).
    pub lease: crate::adapters::AdapterLease,
    /// The weights, set at admission and dropped at preemption.
    pub lora: Option<std::sync::Arc<crate::model::lora::LoraAdapter>>,
}

/// A choice waiting to fork: its sampling chain and output stream.
#[derive(Debug)]
struct PendingFork {
    index: usize,
    chain: SamplerChain,
    output: OutputStream,
}

impl Sequence {
    /// Builds the sequence state for `req` with the given generation budget, without
    /// prefix caching.
    pub fn new(req: Prepared, max_new_tokens: usize) -> Self {
        Self::with_cache(req, max_new_tokens, None)
    }

    /// Builds the sequence state; with `fingerprint`, the sequence uses the prefix
    /// cache if its request allows it.
    pub fn with_cache(
        req: Prepared,
        max_new_tokens: usize,
        fingerprint: Option<&ModelFingerprint>,
    ) -> Self {
        let new_output = || OutputStream::new(req.sampling.stop.clone());
        let forks = req
            .forks
            .into_iter()
            .enumerate()
            .map(|(i, chain)| PendingFork {
                index: i + 1,
                chain,
                output: new_output(),
            })
            .collect();
        let key = req.adapter.as_ref().map(crate::adapters::AdapterLease::key);
        let cache = match fingerprint {
            Some(fp) if req.cache.enabled => Some(SeqCache {
                root: crate::prefix_store::root_hash_with(fp, &req.cache.salt, key.as_ref()),
                hashes: Vec::new(),
                registered: 0,
                disk: req.disk_hit,
                keys: crate::kv_events::BlockKeys {
                    lora_name: req.adapter.as_ref().map(|a| a.name().to_owned()),
                    cache_salt: req.cache.salt.clone(),
                },
            }),
            _ => None,
        };
        Self {
            cache,
            cached_tokens: 0,
            id: req.seq,
            client_id: req.client_id,
            chain: req.chain,
            output: new_output(),
            channels: Channels::new(&req.channels, req.seq.0),
            markers: if req.channels.is_plain() {
                Vec::new()
            } else {
                req.channels.markers.clone()
            },
            channel_spec: req.channels.clone(),
            choice: 0,
            choices: req.sampling.n.max(1),
            forks,
            echo: req
                .sampling
                .echo
                .then(|| PromptEcho::new(req.sampling.logprobs)),
            prompt: req.prompt,
            images: req.images,
            generated: Vec::new(),
            computed: 0,
            in_flight: 0,
            max_new_tokens,
            events: req.events,
            cancel: req.cancel,
            received_at: req.received_at,
            first_token_at: None,
            last_token_at: None,
            unsent_ids: Vec::new(),
            unsent_logprobs: Vec::new(),
            started: false,
            preemptions: 0,
            spec: None,
            drafts: Vec::new(),
            model_drafts: 0,
            unpersisted: Vec::new(),
            adapter: req.adapter.map(|lease| SeqAdapter { lease, lora: None }),
        }
    }

    /// Prompt plus generated tokens.
    pub fn total_len(&self) -> usize {
        self.prompt.len() + self.generated.len()
    }

    /// Number of tokens not yet computed: the rest of the prompt while prefilling (or
    /// everything after a preemption), then the last sampled token.
    pub fn pending_len(&self) -> usize {
        self.total_len() - self.computed
    }

    /// Whether more than the next decode token is pending: a prompt not fully computed,
    /// or a preempted sequence being recomputed. Such sequences run as prefill chunks.
    pub fn is_prefilling(&self) -> bool {
        self.computed < self.prompt.len() || self.pending_len() > 1
    }

    /// The next `max` uncomputed tokens (prompt first, then generated).
    pub fn pending_tokens(&self, max: usize) -> Vec<u32> {
        let total = (self.prompt.len() + self.generated.len()).min(self.computed + max);
        (self.computed..total).map(|i| self.token_at(i)).collect()
    }

    /// Plans this sequence's drafts for the next step and returns how many: with
    /// n-gram lookup, [`Self::drafts`] holds them (the lookup's proposal over prompt +
    /// generated, as many as the adaptive controller chooses; a proposal not run is
    /// shadowed); with a draft model, [`Self::model_drafts`] says how many the model
    /// runner's draft model is to propose. At most `limit`, and never more than the
    /// generation budget can still use (the step yields up to one token more than it
    /// has drafts).
    pub fn propose_drafts(&mut self, spec: &Speculation, limit: usize) -> usize {
        self.drafts.clear();
        self.model_drafts = 0;
        let room = self.max_new_tokens.saturating_sub(self.generated.len() + 1);
        let Some(state) = self.spec.as_mut() else {
            return 0;
        };
        let k = spec.k.min(room).min(limit);
        if let Some(cost) = spec.draft_cost {
            self.model_drafts = state.model_draft_len(k, spec.row_cost + cost);
            return self.model_drafts;
        }
        if k == 0 {
            return 0;
        }
        let (prompt, generated) = (&self.prompt, &self.generated);
        let token = |i: usize| {
            if i < prompt.len() {
                prompt[i]
            } else {
                generated[i - prompt.len()]
            }
        };
        let len = prompt.len() + generated.len();
        let mut drafts = ngram_propose(len, token, spec.ngram_min, spec.ngram_max, k);
        let m = state.draft_len(drafts.len(), spec.row_cost);
        if m == 0 {
            if let Some(&d) = drafts.first() {
                state.shadow(d);
            }
            return 0;
        }
        drafts.truncate(m);
        self.drafts = drafts;
        m
    }

    /// The draft model's work for the next step: the tokens it has not computed (up
    /// to and including the pending one) and how many drafts to propose; `None`
    /// without [`Self::model_drafts`].
    pub fn draft_work(&self) -> Option<crate::model_runner::DraftWork> {
        if self.model_drafts == 0 {
            return None;
        }
        let from = self.spec.as_ref()?.draft_computed.min(self.total_len() - 1);
        Some(crate::model_runner::DraftWork {
            tokens: (from..self.total_len()).map(|i| self.token_at(i)).collect(),
            start_pos: from,
            k: self.model_drafts,
        })
    }

    /// Drops this step's drafts (no KV room for them), shadowing the first.
    pub fn drop_drafts(&mut self) {
        if let (Some(state), Some(&d)) = (self.spec.as_mut(), self.drafts.first()) {
            state.shadow(d);
        }
        self.drafts.clear();
        self.model_drafts = 0;
    }

    /// Drafts planned for the next step, from either proposer.
    pub fn planned_drafts(&self) -> usize {
        self.drafts.len() + self.model_drafts
    }

    /// Token `i` of prompt + generated.
    fn token_at(&self, i: usize) -> u32 {
        if i < self.prompt.len() {
            self.prompt[i]
        } else {
            self.generated[i - self.prompt.len()]
        }
    }

    /// Token ids of block `index` (positions `index·block_size ..`), which must be full.
    pub fn block_tokens(&self, index: usize, block_size: usize) -> Vec<u32> {
        (index * block_size..(index + 1) * block_size)
            .map(|i| self.token_at(i))
            .collect()
    }

    /// Extends the cached hashes to the first `n_blocks` full blocks (fewer when the
    /// tokens do not fill them) and returns them; empty without prefix caching.
    pub fn prefix_hashes(
        &mut self,
        n_blocks: usize,
        block_size: usize,
        fingerprint: &ModelFingerprint,
    ) -> &[BlockHash] {
        let n_blocks = n_blocks.min(self.total_len() / block_size.max(1));
        let Some(mut cache) = self.cache.take() else {
            return &[];
        };
        while cache.hashes.len() < n_blocks {
            let i = cache.hashes.len();
            let parent = cache.hashes.last().copied().unwrap_or(cache.root);
            let keys = crate::request::media::block_images(
                &self.images,
                i * block_size,
                (i + 1) * block_size,
            );
            cache.hashes.push(chain_hash_with(
                &parent,
                fingerprint,
                &self.block_tokens(i, block_size),
                &keys,
            ));
        }
        let cache = self.cache.insert(cache);
        &cache.hashes[..n_blocks]
    }

    /// Sends an event (a delta or `done` as [`StreamEvent::Choice`] when the request
    /// has several choices); a closed channel (client gone) is not an error here, the
    /// connection's cancel flag handles it.
    pub fn send(&self, event: StreamEvent) {
        let event = match event {
            e @ (StreamEvent::Delta { .. } | StreamEvent::Done { .. }) if self.choices > 1 => {
                StreamEvent::Choice {
                    index: self.choice,
                    event: Box::new(e),
                }
            }
            e => e,
        };
        let _ = self.events.send(event);
    }

    /// Sends `started`.
    pub fn send_started(&mut self) {
        self.started = true;
        self.send(StreamEvent::Started {
            prompt_tokens: self.prompt.len(),
            cached_tokens: self.cached_tokens,
        });
    }

    /// Chooses the next token from `logits` `(vocab_size,)` through the request's
    /// [`SamplerChain`] (penalties, logit bias, plugins, the seeded draw).
    ///
    /// # Errors
    /// `plugin_trap` from a plugin; the sampler's error (e.g. every logit NaN).
    pub fn sample(&mut self, logits: &mut [f32]) -> Result<Sampled, InferError> {
        let ctx = StepContext {
            sequence_id: self.id.0,
            prompt: &self.prompt,
            generated: &self.generated,
        };
        self.chain.step(&ctx, logits)
    }

    /// Work for the next [`Self::sample`] that does not need its logits (the
    /// constraint's mask), done while the model runner computes them.
    pub fn prepare_sample(&mut self) {
        self.chain.prepare();
    }

    /// Records the sampled token (whose raw bytes are `bytes`; `is_eog` for an
    /// end-of-generation token), tells the sampling chain, streams any releasable text,
    /// and decides whether generation ends.
    ///
    /// # Errors
    /// A processor of the chain that cannot follow the token.
    pub fn accept_token(
        &mut self,
        sampled: Sampled,
        bytes: &[u8],
        is_eog: bool,
    ) -> Result<TokenOutcome, InferError> {
        let token = sampled.token;
        self.chain.accept(token)?;
        if let Some(spec) = self.spec.as_mut() {
            spec.observe_sampled(token);
        }
        let now = Instant::now();
        self.first_token_at.get_or_insert(now);
        self.last_token_at = Some(now);
        self.generated.push(token);
        self.unsent_ids.push(token);
        self.unsent_logprobs.extend(sampled.logprobs);
        if is_eog {
            return Ok(TokenOutcome::Finished(FinishReason::Stop));
        }
        let bytes = self
            .markers
            .iter()
            .find(|(id, _)| *id == token)
            .map_or(bytes, |(_, text)| text.as_bytes());
        let emit = self.output.push(bytes);
        let out = self.channels.push(emit.text);
        if self.channels.reasoning_ended() {
            self.chain.reasoning_ended();
        }
        self.send_delta(out, false);
        Ok(if emit.stopped {
            TokenOutcome::Finished(FinishReason::Stop)
        } else if self.generated.len() >= self.max_new_tokens {
            TokenOutcome::Finished(FinishReason::Length)
        } else {
            TokenOutcome::Continue
        })
    }

    /// Sends what `out` released, with the token ids and log-probabilities not sent
    /// yet; nothing when no channel has text (the ids wait for the next delta) unless
    /// `flush`.
    fn send_delta(&mut self, out: ChannelOut, flush: bool) {
        let empty = out.content.is_empty() && out.reasoning.is_empty() && out.tool_calls.is_empty();
        if empty && !flush {
            return;
        }
        let event = StreamEvent::Delta {
            text: out.content,
            token_ids: std::mem::take(&mut self.unsent_ids),
            logprobs: std::mem::take(&mut self.unsent_logprobs),
            reasoning: out.reasoning,
            tool_calls: out.tool_calls,
        };
        self.send(event);
    }

    /// Flushes held-back text and sends `done`; a turn that ended normally after tool
    /// calls finishes with `tool_calls`. Returns the timings.
    pub fn finish(&mut self, reason: FinishReason) -> Timings {
        let rest = if self.output.is_stopped() {
            String::new()
        } else {
            self.output.finish()
        };
        let out = self.channels.finish(rest);
        let flush = !self.unsent_ids.is_empty();
        self.send_delta(out, flush);
        let reason = match reason {
            FinishReason::Stop if self.channels.has_tool_calls() => FinishReason::ToolCalls,
            r => r,
        };
        let timings = self.timings();
        self.send(StreamEvent::Done {
            finish_reason: reason,
            usage: Usage {
                prompt_tokens: self.prompt.len(),
                completion_tokens: self.generated.len(),
                cached_tokens: self.cached_tokens,
                draft_tokens: self.spec.as_ref().map_or(0, |s| s.drafted),
                accepted_draft_tokens: self.spec.as_ref().map_or(0, |s| s.accepted),
                image_tokens: self.images.iter().map(|im| im.tokens()).sum(),
            },
            timings,
        });
        self.end_pending_forks(reason);
        timings
    }

    /// TTFT and decode speed so far.
    pub fn timings(&self) -> Timings {
        let ttft_ms = self.first_token_at.map_or(0.0, |t| {
            t.duration_since(self.received_at).as_secs_f64() * 1e3
        });
        let decode_tokens_per_s = match (self.first_token_at, self.last_token_at) {
            (Some(a), Some(b)) if self.generated.len() > 1 && b > a => {
                (self.generated.len() - 1) as f64 / b.duration_since(a).as_secs_f64()
            }
            _ => 0.0,
        };
        Timings {
            ttft_ms,
            decode_tokens_per_s,
        }
    }
}
