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
//! The choice ([`choose`]) is SGLang's cache-aware policy in shape
//! (`sgl-model-gateway`, `policies/cache_aware.rs`): the engine with the longest cached
//! prefix, unless that would leave the engines out of balance, in which case the least
//! loaded; ties go to the less loaded, then to the engine holding fewer blocks (new
//! prefixes spread over the engines instead of piling onto the first).

use std::sync::Arc;

use actix::Addr;

use super::{EngineLoad, SchedulerActor, Submit, TokenizedRequest};
use crate::adapters::AdapterRegistry;
use crate::error::{ErrorKind, InferError};
use crate::kv_events::external_hash;
use crate::prefix_store::hash::extend_hashes;
use crate::prefix_store::{root_hash_with, ModelFingerprint};
use crate::request::StreamEvent;

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
}

/// One candidate engine for [`choose`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// Leading prompt blocks it holds.
    pub cached_blocks: usize,
    /// Sequences held or on their way.
    pub load: usize,
    /// Blocks its memory tier holds in all.
    pub held_blocks: usize,
}

/// The engine for a request: the longest cached prefix, unless its load exceeds the
/// least loaded engine's by more than `balance` sequences (then the least loaded);
/// ties to the lower load, then fewer held blocks, then the lower index.
///
/// # Panics
/// Never for a non-empty `c`; an empty one is a caller bug and gives 0.
pub fn choose(c: &[Candidate], balance: usize) -> usize {
    let by = |key: fn(&Candidate) -> (usize, usize, usize)| {
        (0..c.len()).min_by_key(|&i| (key(&c[i]), i)).unwrap_or(0)
    };
    let least = by(|x| (x.load, x.held_blocks, 0));
    let best = by(|x| (usize::MAX - x.cached_blocks, x.load, x.held_blocks));
    if c[best].load > c[least].load + balance {
        least
    } else {
        best
    }
}

/// Sends prepared requests to the engines' scheduler loops: the only way in.
pub struct Placer {
    replicas: Vec<Replica>,
    /// [`choose`]'s `balance`: `scheduler.max_running`, a whole batch.
    balance: usize,
    /// Held from a choice until it is counted, so that requests prepared at once on
    /// several tokenizer threads see each other's placements.
    placing: std::sync::Mutex<()>,
}

impl Placer {
    /// A placer over `replicas` (at least one).
    pub fn new(replicas: Vec<Replica>, balance: usize) -> Self {
        Self {
            replicas,
            balance,
            placing: std::sync::Mutex::new(()),
        }
    }

    /// The engines.
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// Places `req` and hands it to that engine's loop.
    pub fn submit(&self, mut req: TokenizedRequest) {
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
        r.load.placed_one();
        drop(placing);
        r.scheduler.do_send(Submit(req));
    }

    /// The engine [`choose`] picks for `req`.
    fn place(&self, req: &TokenizedRequest) -> usize {
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
                                extend_hashes(&mut chain, &root, &fp, &req.prompt, bs, full);
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
                    cached_blocks,
                    load: r.load.load(),
                    held_blocks,
                }
            })
            .collect();
        let i = choose(&candidates, self.balance);
        tracing::debug!(seq = %req.seq, engine = i, ?candidates, "placed");
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(cached_blocks: usize, load: usize, held_blocks: usize) -> Candidate {
        Candidate {
            cached_blocks,
            load,
            held_blocks,
        }
    }

    #[test]
    fn the_longest_cached_prefix_wins_unless_it_unbalances() {
        // Cache first.
        assert_eq!(choose(&[c(1, 0, 9), c(3, 2, 9)], 4), 1);
        // Out of balance by more than a batch: the least loaded.
        assert_eq!(choose(&[c(1, 0, 9), c(3, 5, 9)], 4), 0);
        assert_eq!(choose(&[c(1, 1, 9), c(3, 5, 9)], 4), 1);
        // Equal prefixes: the lower load, then fewer held blocks, then the index.
        assert_eq!(choose(&[c(2, 3, 0), c(2, 1, 9)], 4), 1);
        assert_eq!(choose(&[c(0, 0, 9), c(0, 0, 2)], 4), 1);
        assert_eq!(choose(&[c(0, 0, 2), c(0, 0, 2), c(0, 0, 2)], 4), 0);
        // Nothing cached anywhere: the least loaded.
        assert_eq!(choose(&[c(0, 2, 0), c(0, 1, 5), c(0, 3, 0)], 4), 1);
    }
}
