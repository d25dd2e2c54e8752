//! Placing prepared requests on one of several engines (`[[engines]]`) by prefix
//! score, the data-parallel routing of vLLM and SGLang inside one process.
//!
//! Every engine's scheduler loop reports into its [`EngineLoad`]: the sequences it
//! holds, and the block hashes of its memory tier, taken from the same KV-cache events
//! a router reads.
//! For a request the [`Placer`] hashes the prompt's full blocks as that engine's
//! policy will (`crate::prefix_store::hash`: the chain from the salt's and the
//! adapter's root) and counts the leading blocks the engine holds, the overlap that
//! Dynamo's KV router and llm-d's precise prefix scorer compute from the events.
//!
//! The choice ([`choose`]) is the cost NVIDIA Dynamo's KV router gives a worker, in
//! the shape of `dynamo-kv-router` 1.6.1's `scheduling/selector/reference.rs`
//! (`logit = prefill blocks less the overlap credit + decode blocks`, weights 1): the
//! prompt blocks the engine would have to compute (those it does not hold) plus the KV
//! blocks its sequences already hold or wait for; the cheapest engine wins, ties to
//! the less loaded, then to the one holding fewer blocks (new prefixes spread over the
//! engines), then the lower index. A shared prefix draws a request to its engine only
//! while that engine's load costs less than the prefill it saves, so requests that
//! share a system prompt still spread when they arrive together.

use std::sync::Arc;

use actix::Addr;

use crate::adapters::AdapterRegistry;
use crate::error::{ErrorKind, InferError};
use crate::kv_events::external_hash;
use crate::prefix_store::hash::extend_hashes_with;
use crate::prefix_store::{root_hash_with, ModelFingerprint};
use crate::request::StreamEvent;
use crate::scheduler::{EngineLoad, Prepared, SchedulerActor, Submit};

/// One engine as the placer sees it.
pub struct Replica {
    /// Its scheduler loop.
    pub scheduler: Addr<SchedulerActor>,
    /// What the loop reports.
    pub load: Arc<EngineLoad>,
    /// Its adapters (each engine keeps its own resident set on its own device).
    pub adapters: Arc<AdapterRegistry>,
    /// Its prefix hashing (`None`: prefix caching off): the fingerprint that enters
    /// every hash (it names the device), and tokens per block.
    pub prefix: Option<(ModelFingerprint, usize)>,
    /// Tokens per KV block.
    pub block_size: usize,
}

/// One candidate engine for [`choose`], in KV blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The prompt's blocks (full or not).
    pub prompt_blocks: usize,
    /// Leading prompt blocks it holds.
    pub cached_blocks: usize,
    /// Blocks its sequences hold or need, and those of requests on their way to it.
    pub load: usize,
    /// Blocks its memory tier holds in all.
    pub held_blocks: usize,
}

impl Candidate {
    /// Blocks to compute plus blocks already in use.
    pub fn cost(&self) -> usize {
        self.prompt_blocks.saturating_sub(self.cached_blocks) + self.load
    }
}

/// The engine for a request: the lowest [`Candidate::cost`], ties to the lower load,
/// then fewer held blocks, then the lower index; 0 for no candidate.
pub fn choose(c: &[Candidate]) -> usize {
    (0..c.len())
        .min_by_key(|&i| (c[i].cost(), c[i].load, c[i].held_blocks, i))
        .unwrap_or(0)
}

/// Sends prepared requests to the engines' scheduler loops: the only way in (the
/// prepare pools hold it; nothing else sends `Submit`).
pub struct Placer {
    replicas: Vec<Replica>,
    /// Held from a choice until it is counted, so that requests prepared at once on
    /// several prepare threads see each other's placements.
    placing: std::sync::Mutex<()>,
}

impl Placer {
    /// A placer over `replicas` (at least one).
    pub fn new(replicas: Vec<Replica>) -> Self {
        Self {
            replicas,
            placing: std::sync::Mutex::new(()),
        }
    }

    /// The engines.
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// Places `req` and hands it to that engine's loop.
    pub fn submit(&self, mut req: Prepared) {
        let placing = (self.replicas.len() > 1).then(|| {
            self.placing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        });
        let i = if placing.is_some() {
            self.place(&req)
        } else {
            0
        };
        let Some(r) = self.replicas.get(i) else {
            return;
        };
        if i > 0 {
            // The edge leased the adapter from the first engine's registry; this
            // engine keeps its own (same names: loads and unloads go to all).
            if let Some(lease) = req.adapter.take() {
                match r.adapters.lease(lease.name(), lease.key().scale) {
                    Some(l) => req.adapter = Some(l),
                    None => {
                        let _ = req.events.send(StreamEvent::Error(InferError::new(
                            ErrorKind::ModelNotFound,
                            format!("LoRA adapter {:?} was unloaded", lease.name()),
                        )));
                        return;
                    }
                }
            }
        }
        // One engine: counted, with no load to follow (its loop reports none).
        let blocks = match placing {
            Some(_) => req.prompt.len().div_ceil(r.block_size.max(1)),
            None => 0,
        };
        r.load.placed_one(blocks);
        drop(placing);
        r.scheduler.do_send(Submit(req));
    }

    /// The engine [`choose`] picks for `req`.
    fn place(&self, req: &Prepared) -> usize {
        let key = req.adapter.as_ref().map(|a| a.key());
        let mut chains: Vec<(ModelFingerprint, usize, Vec<u64>)> = Vec::new();
        let candidates: Vec<Candidate> = self
            .replicas
            .iter()
            .map(|r| {
                let hashes = match r.prefix {
                    Some((fp, bs)) if req.cache.enabled => {
                        match chains.iter().position(|(f, b, _)| *f == fp && *b == bs) {
                            Some(j) => &chains[j].2,
                            None => {
                                let root = root_hash_with(&fp, &req.cache.salt, key.as_ref());
                                let mut chain = Vec::new();
                                let full = req.prompt.len().saturating_sub(1) / bs.max(1);
                                extend_hashes_with(
                                    &mut chain,
                                    &root,
                                    &fp,
                                    &req.prompt,
                                    &req.images,
                                    bs,
                                    full,
                                );
                                let ext = chain.iter().map(external_hash).collect();
                                chains.push((fp, bs, ext));
                                &chains[chains.len() - 1].2
                            }
                        }
                    }
                    _ => &Vec::new(),
                };
                let (cached_blocks, held_blocks) = r.load.overlap(hashes);
                Candidate {
                    prompt_blocks: req.prompt.len().div_ceil(r.block_size.max(1)),
                    cached_blocks,
                    load: r.load.load(),
                    held_blocks,
                }
            })
            .collect();
        let i = choose(&candidates);
        tracing::debug!(seq = %req.seq, engine = i, ?candidates, "placed");
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(prompt_blocks: usize, cached_blocks: usize, load: usize, held_blocks: usize) -> Candidate {
        Candidate {
            prompt_blocks,
            cached_blocks,
            load,
            held_blocks,
        }
    }

    #[test]
    fn the_cheapest_engine_wins_prefill_saved_against_load() {
        // A cached prefix draws the request while the prefill it saves outweighs the load.
        assert_eq!(choose(&[c(6, 0, 0, 9), c(6, 5, 3, 9)]), 1);
        // Not once the engine holding it is busier than the prefill saved.
        assert_eq!(choose(&[c(6, 0, 0, 9), c(6, 5, 6, 9)]), 0);
        // Requests sharing a system prompt arriving together: the second goes to the
        // other engine once the first's blocks are on their way to the holder.
        assert_eq!(choose(&[c(30, 28, 0, 28), c(30, 0, 0, 0)]), 0);
        assert_eq!(choose(&[c(30, 28, 30, 28), c(30, 0, 0, 0)]), 1);
        // Equal cost: the lower load, then fewer held blocks, then the index.
        assert_eq!(choose(&[c(4, 2, 3, 0), c(4, 0, 1, 9)]), 1);
        assert_eq!(choose(&[c(4, 0, 0, 9), c(4, 0, 0, 2)]), 1);
        assert_eq!(choose(&[c(4, 0, 0, 2), c(4, 0, 0, 2), c(4, 0, 0, 2)]), 0);
        assert_eq!(choose(&[]), 0);
    }
}
