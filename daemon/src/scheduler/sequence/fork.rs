//! [`Sequence::fork`]: the other choices of an `n > 1` request, made from the first
//! once its prompt is computed.

use super::{SeqCache, Sequence, SpecState};
use crate::detokenizer::Channels;
use crate::request::{FinishReason, SeqId, StreamEvent, Timings, Usage};

impl Sequence {
    /// Whether choices still wait to fork from this sequence.
    pub fn has_forks(&self) -> bool {
        !self.forks.is_empty()
    }

    /// Ends the choices that never forked (the request ended before its prompt was
    /// computed, e.g. cancelled): each sends its `done` with `reason` and no tokens, so
    /// the request still ends with one `done` per choice.
    pub(super) fn end_pending_forks(&mut self, reason: FinishReason) {
        for f in std::mem::take(&mut self.forks) {
            let done = StreamEvent::Done {
                finish_reason: reason,
                usage: Usage {
                    prompt_tokens: self.prompt.len(),
                    completion_tokens: 0,
                    cached_tokens: self.cached_tokens,
                    ..Usage::default()
                },
                timings: Timings {
                    ttft_ms: 0.0,
                    decode_tokens_per_s: 0.0,
                },
            };
            let _ = self.events.send(StreamEvent::Choice {
                index: f.index,
                event: Box::new(done),
            });
        }
    }

    /// The sequences of the choices not yet forked (none after the first call): the
    /// same prompt, event channel, cancel flag, budget and prefix-cache state, each with
    /// its own id, sampling chain (its own seeded RNG) and output stream, marked started
    /// (the request's `started` is this sequence's) and with nothing computed: the
    /// caller gives them the prompt's KV.
    pub fn fork(&mut self) -> Vec<Sequence> {
        let forks = std::mem::take(&mut self.forks);
        forks
            .into_iter()
            .map(|f| {
                let id = SeqId::next();
                Sequence {
                    id,
                    channels: Channels::new(&self.channel_spec, id.0),
                    markers: self.markers.clone(),
                    channel_spec: self.channel_spec.clone(),
                    client_id: self.client_id.clone(),
                    prompt: self.prompt.clone(),
                    images: self.images.clone(),
                    generated: Vec::new(),
                    computed: 0,
                    in_flight: 0,
                    max_new_tokens: self.max_new_tokens,
                    chain: f.chain,
                    output: f.output,
                    events: self.events.clone(),
                    cancel: self.cancel.clone(),
                    received_at: self.received_at,
                    first_token_at: None,
                    last_token_at: None,
                    unsent_ids: Vec::new(),
                    unsent_logprobs: Vec::new(),
                    started: true,
                    preemptions: 0,
                    cache: self.cache.as_ref().map(|c| SeqCache {
                        root: c.root,
                        hashes: c.hashes.clone(),
                        registered: c.registered,
                        disk: None,
                        keys: c.keys.clone(),
                    }),
                    cached_tokens: self.cached_tokens,
                    choice: f.index,
                    choices: self.choices,
                    forks: Vec::new(),
                    echo: None,
                    spec: self.spec.as_ref().map(SpecState::fork),
                    drafts: Vec::new(),
                    model_drafts: 0,
                    unpersisted: Vec::new(),
                    adapter: self.adapter.clone(),
                }
            })
            .collect()
    }
}
