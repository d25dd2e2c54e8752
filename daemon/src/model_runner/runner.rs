//! The runner proper, without actix: executes one [`RunBatch`] at a time.

use std::collections::HashMap;

use crate::error::InferError;
use crate::model::{KvCache, LlamaModel};
use crate::request::SeqId;

use super::kv_cache::SequenceKvCache;

/// Work for one sequence in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchItem {
    /// The sequence.
    pub seq: SeqId,
    /// Tokens to run, at positions `cached .. cached + tokens.len()` of the sequence:
    /// the (rest of the) prompt for a prefill, one token for a decode.
    pub tokens: Vec<u32>,
}

/// One engine step: sequences to free first, then the items to run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunBatch {
    /// Sequences whose KV caches are released before running (finished or cancelled).
    pub free: Vec<SeqId>,
    /// Forward work for this step.
    pub items: Vec<BatchItem>,
}

impl RunBatch {
    /// Whether there is neither work nor anything to free.
    pub fn is_empty(&self) -> bool {
        self.free.is_empty() && self.items.is_empty()
    }
}

/// Result for one [`BatchItem`]: the logits of its last position, `(vocab_size,)` f32.
#[derive(Debug)]
pub struct ItemOutput {
    /// The sequence.
    pub seq: SeqId,
    /// Logits, or why this sequence's forward failed (only that sequence is affected).
    pub logits: Result<Vec<f32>, InferError>,
}

/// Result of one step, in the order of [`RunBatch::items`].
#[derive(Debug, Default)]
pub struct StepOutput {
    /// One entry per item.
    pub items: Vec<ItemOutput>,
}

/// Owns the model and the per-sequence KV caches.
#[derive(Debug)]
pub struct ModelRunner {
    model: LlamaModel,
    caches: HashMap<SeqId, SequenceKvCache>,
}

impl ModelRunner {
    /// Wraps a loaded model.
    pub fn new(model: LlamaModel) -> Self {
        Self {
            model,
            caches: HashMap::new(),
        }
    }

    /// The model.
    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    /// Executes one step. A failing item yields an `internal` error for its sequence only
    /// and drops that sequence's cache.
    pub fn run(&mut self, batch: RunBatch) -> StepOutput {
        for seq in &batch.free {
            self.caches.remove(seq);
        }
        let mut out = StepOutput {
            items: Vec::with_capacity(batch.items.len()),
        };
        for item in batch.items {
            let cache = self
                .caches
                .entry(item.seq)
                .or_insert_with(|| SequenceKvCache::new(self.model.config(), self.model.device()));
            let logits = self
                .model
                .forward(&item.tokens, cache as &mut dyn KvCache)
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|e| {
                    InferError::internal(format!(
                        "forward pass failed: {}",
                        crate::model::candle_error_message(&e)
                    ))
                });
            if logits.is_err() {
                self.caches.remove(&item.seq);
            }
            out.items.push(ItemOutput {
                seq: item.seq,
                logits,
            });
        }
        out
    }
}
