//! The runner proper, without actix: executes one [`RunBatch`] at a time as one
//! forward pass over every sequence in it.

use crate::error::InferError;
use crate::model::lora::AdapterUse;
use crate::model::{ForwardSeq, KvBlockPool, Model};
use crate::prefix_store::{BlockHash, PersistSink, StoreBlock};
use crate::request::SeqId;

/// A full block to copy out after the step's forward pass and hand to the prefix
/// store (the step computes its last positions).
#[derive(Debug, Clone, PartialEq)]
pub struct PersistBlock {
    /// Pool block holding it.
    pub block: u32,
    /// Its chained hash.
    pub hash: BlockHash,
    /// The hash of the block before it in the prompt (`None` for the first block).
    pub parent: Option<BlockHash>,
    /// Its token ids.
    pub tokens: Vec<u32>,
    /// What else entered its hash (for the disk tier's KV-cache events).
    pub keys: crate::kv_events::OneBlockKeys,
}

/// K/V from the prefix store's disk tier to write into a pool block before the step's
/// forward pass.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockLoad {
    /// Destination pool block.
    pub block: u32,
    /// [`KvBlockPool::read_block`] layout, [`KvBlockPool::block_bytes`] long.
    pub kv: Vec<u8>,
}

/// A block to copy before the step's forward pass: a sequence forked from another (one
/// of a request's `n` choices) gets its own copy of their partly filled last prompt
/// block, which both go on writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    /// Pool block read.
    pub src: u32,
    /// Pool block overwritten.
    pub dst: u32,
}

/// Work for one sequence in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchItem {
    /// The sequence.
    pub seq: SeqId,
    /// Tokens to run, at positions `start_pos .. start_pos + tokens.len()`: a prompt
    /// chunk for a prefill (or a recompute after preemption), one token for a decode.
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]` (tokens of this sequence already in the KV cache).
    pub start_pos: usize,
    /// KV blocks of the sequence, covering positions `0 .. start_pos + tokens.len()`
    /// (from the scheduler's block manager).
    pub block_table: Vec<u32>,
    /// How many of the last positions of `tokens` to return logits for: 0 for a prefill
    /// chunk that is not the prompt's last, 1 for the next token, more for a request
    /// that scores its prompt (`echo` with `logprobs`).
    pub logit_rows: usize,
    /// The request's prompt length ([`crate::model::ForwardSeq::prompt_len`]).
    pub prompt_len: usize,
    /// Blocks this step completes that the prefix store should keep.
    pub persist: Vec<PersistBlock>,
    /// Drafts for the runner's draft model to propose before the forward pass
    /// (`speculative.method = "draft"`); they are appended to `tokens`, and
    /// `logit_rows` already counts a row for each.
    pub draft: Option<DraftWork>,
    /// The sequence's LoRA adapter and its request scale (`None`: the base model). The
    /// draft model drafts for the base.
    pub adapter: Option<BatchAdapter>,
    /// The prompt's images with placeholder tokens among `tokens` (the runner encodes
    /// each on first use and puts its rows in their place).
    pub images: Vec<std::sync::Arc<crate::request::PromptImage>>,
}

/// A batch row's LoRA adapter: the resident weights and the request's scale (equal when
/// the same weights at the same scale).
#[derive(Debug, Clone)]
pub struct BatchAdapter {
    /// The weights.
    pub lora: std::sync::Arc<crate::model::lora::LoraAdapter>,
    /// `lora_scale`.
    pub scale: f32,
}

impl PartialEq for BatchAdapter {
    fn eq(&self, o: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.lora, &o.lora) && self.scale.to_bits() == o.scale.to_bits()
    }
}

/// What the draft model does for one item: catch up on the positions it has not
/// computed, then propose `k` tokens greedily, one forward pass each (batched with the
/// other items' drafting). Its K/V live in the draft pool under the item's block table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraftWork {
    /// The sequence's tokens from `start_pos` up to and including its pending token
    /// (at least that one).
    pub tokens: Vec<u32>,
    /// Position of `tokens[0]`: what the draft model has already computed.
    pub start_pos: usize,
    /// Drafts to propose (≥ 1).
    pub k: usize,
}

/// One engine step: the items run together in one forward pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunBatch {
    /// Forward work for this step.
    pub items: Vec<BatchItem>,
    /// Prefix-cache blocks to load before the forward pass.
    pub loads: Vec<BlockLoad>,
    /// Blocks to copy before the forward pass (before the loads).
    pub copies: Vec<BlockCopy>,
}

impl RunBatch {
    /// Whether there is no work (loads and copies come with items).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.loads.is_empty() && self.copies.is_empty()
    }

    /// Tokens in the step (decode tokens plus prefill chunk tokens).
    pub fn num_tokens(&self) -> usize {
        self.items.iter().map(|i| i.tokens.len()).sum()
    }
}

/// Result for one [`BatchItem`].
#[derive(Debug)]
pub struct ItemOutput {
    /// The sequence.
    pub seq: SeqId,
    /// Logits of the item's last `logit_rows` positions, in position order, each
    /// `(vocab_size,)` f32 (empty for none); or why the step failed (every item of the
    /// step gets the error).
    pub logits: Result<Vec<Vec<f32>>, InferError>,
    /// The drafts the draft model proposed for the item (run after its tokens), empty
    /// without [`BatchItem::draft`].
    pub drafts: Vec<u32>,
}

/// Result of one step, in the order of [`RunBatch::items`].
#[derive(Debug, Default)]
pub struct StepOutput {
    /// One entry per item.
    pub items: Vec<ItemOutput>,
}

/// Every item of a step fails with `internal`: `what` failed with `e`.
fn failed(items: &[BatchItem], what: &str, e: &candle_core::Error) -> StepOutput {
    let e = InferError::internal(format!(
        "{what} failed: {}",
        crate::model::candle_error_message(e)
    ));
    StepOutput {
        items: items
            .iter()
            .map(|i| ItemOutput {
                seq: i.seq,
                logits: Err(e.clone()),
                drafts: Vec::new(),
            })
            .collect(),
    }
}

/// Owns the model and the KV block pool. Holds no per-sequence state: block tables
/// come with every batch, so freeing a sequence is the block manager's business.
#[derive(Debug)]
pub struct ModelRunner {
    model: Model,
    pool: KvBlockPool,
    persist: Option<PersistSink>,
    /// The draft model and its KV pool (same block ids as `pool`).
    draft: Option<(Model, KvBlockPool)>,
    /// The vision tower of a vision-language model.
    vision: Option<crate::model::Tower>,
}

impl ModelRunner {
    /// Wraps a loaded model and its KV pool.
    pub fn new(model: Model, pool: KvBlockPool) -> Self {
        Self {
            model,
            pool,
            persist: None,
            draft: None,
            vision: None,
        }
    }

    /// Adds the vision tower that encodes prompt images.
    pub fn with_vision(mut self, tower: crate::model::Tower) -> Self {
        self.vision = Some(tower);
        self
    }

    /// Adds a draft model for speculative decoding, with its own KV pool of as many
    /// blocks as the target's (a sequence's block table serves both).
    pub fn with_draft(mut self, model: Model, pool: KvBlockPool) -> Self {
        self.draft = Some((model, pool));
        self
    }

    /// Sends the blocks batches ask to persist to `sink` (the prefix store's disk tier).
    pub fn with_persist(mut self, sink: PersistSink) -> Self {
        self.persist = Some(sink);
        self
    }

    /// The KV pool.
    pub fn pool(&self) -> &KvBlockPool {
        &self.pool
    }

    /// The model, its pool and the draft model with its pool, borrowed apart.
    pub(super) fn parts(
        &mut self,
    ) -> (&Model, &mut KvBlockPool, Option<(&Model, &mut KvBlockPool)>) {
        let draft = self.draft.as_mut().map(|(m, p)| (&*m, p));
        (&self.model, &mut self.pool, draft)
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Executes one step: copies the blocks of forked sequences, loads prefix-store
    /// blocks into the pool, runs one batched forward pass, then copies out the blocks
    /// to persist and offers them to the store (dropped when its queue is full; never
    /// waited on).
    pub fn run(&mut self, mut batch: RunBatch) -> StepOutput {
        // Copies first: a copy's source block was computed by the previous step and may
        // have been handed to a sequence whose disk blocks load into it now.
        let loaded = batch
            .copies
            .iter()
            .try_for_each(|c| self.pool.copy_block(c.src, c.dst))
            .map_err(|e| ("copying a KV block", e))
            .and_then(|()| {
                batch
                    .loads
                    .iter()
                    .try_for_each(|load| self.pool.write_block(load.block, &load.kv))
                    .map_err(|e| ("loading a cached KV block", e))
            });
        if let Err((what, e)) = loaded {
            return failed(&batch.items, what, &e);
        }
        if batch.items.is_empty() {
            return StepOutput::default();
        }
        let drafts = match self.propose_drafts(&batch.items) {
            Ok(d) => d,
            Err(e) => return failed(&batch.items, "the draft model's forward pass", &e),
        };
        for (item, d) in batch.items.iter_mut().zip(&drafts) {
            item.tokens.extend_from_slice(d);
        }
        let encoded = super::media::encode_pending(self.vision.as_ref(), &batch.items);
        if encoded.images > 0 {
            crate::metrics::record_images_encoded(encoded.images, encoded.time);
        }
        let mrope = self.model.spec().rope.mrope_section.is_some();
        // Text-only steps (the decode hot path) allocate nothing for images.
        let any_images = batch.items.iter().any(|i| !i.images.is_empty());
        let media: Vec<Option<crate::model::SeqMedia<'_>>> = if any_images {
            batch
                .items
                .iter()
                .map(|i| super::media::seq_media(i, mrope))
                .collect()
        } else {
            Vec::new()
        };
        let seqs: Vec<ForwardSeq<'_>> = batch
            .items
            .iter()
            .enumerate()
            .map(|(k, i)| (i, media.get(k).and_then(Option::as_ref)))
            .map(|(i, m)| ForwardSeq {
                tokens: &i.tokens,
                start_pos: i.start_pos,
                block_table: &i.block_table,
                logit_rows: i.logit_rows,
                prompt_len: i.prompt_len,
                adapter: i.adapter.as_ref().map(|a| AdapterUse {
                    adapter: &a.lora,
                    scale: a.scale,
                }),
                media: m,
            })
            .collect();
        let result = self
            .model
            .forward_batch(&seqs, &mut self.pool)
            .and_then(|t| t.map(|t| t.to_vec2::<f32>()).transpose())
            .map_err(|e| {
                InferError::internal(format!(
                    "forward pass failed: {}",
                    crate::model::candle_error_message(&e)
                ))
            });
        let mut out = StepOutput {
            items: Vec::with_capacity(batch.items.len()),
        };
        if let (Ok(_), Some(sink)) = (&result, &self.persist) {
            for p in batch.items.iter().flat_map(|i| &i.persist) {
                match self.pool.read_block(p.block) {
                    Ok(kv) => sink.offer(StoreBlock {
                        hash: p.hash,
                        parent: p.parent,
                        tokens: p.tokens.clone(),
                        kv,
                        keys: p.keys.clone(),
                    }),
                    Err(e) => tracing::warn!(
                        error = %crate::model::candle_error_message(&e),
                        "reading a KV block for the prefix store failed"
                    ),
                }
            }
        }
        match result {
            Ok(rows) => {
                let mut rows = rows.unwrap_or_default().into_iter();
                let mut failed = encoded.failed.into_iter();
                for (item, drafts) in batch.items.iter().zip(drafts) {
                    let logits: Vec<Vec<f32>> = rows.by_ref().take(item.logit_rows).collect();
                    out.items.push(ItemOutput {
                        seq: item.seq,
                        logits: failed.next().flatten().map_or(Ok(logits), Err),
                        drafts,
                    });
                }
            }
            Err(e) => {
                for item in &batch.items {
                    out.items.push(ItemOutput {
                        seq: item.seq,
                        logits: Err(e.clone()),
                        drafts: Vec::new(),
                    });
                }
            }
        }
        out
    }

    /// Runs the draft model for the items with [`BatchItem::draft`]: one forward pass
    /// over every such item's catch-up tokens, then one pass per further draft over
    /// the items still drafting, each proposing its row's argmax (greedy drafts: a
    /// point-mass proposal, see [`crate::sampling::speculative`]). Returns the drafts
    /// per item (empty for the others).
    fn propose_drafts(&mut self, items: &[BatchItem]) -> candle_core::Result<Vec<Vec<u32>>> {
        let mut drafts = vec![Vec::new(); items.len()];
        let Some((model, pool)) = self.draft.as_mut() else {
            return Ok(drafts);
        };
        // (item, tokens to run, their first position) for the items still drafting.
        let mut active: Vec<(usize, Vec<u32>, usize)> = items
            .iter()
            .enumerate()
            .filter_map(|(i, it)| {
                let w = it
                    .draft
                    .as_ref()
                    .filter(|w| w.k > 0 && !w.tokens.is_empty())?;
                Some((i, w.tokens.clone(), w.start_pos))
            })
            .collect();
        while !active.is_empty() {
            let seqs: Vec<ForwardSeq<'_>> = active
                .iter()
                .map(|(i, tokens, start_pos)| ForwardSeq {
                    tokens,
                    start_pos: *start_pos,
                    block_table: &items[*i].block_table,
                    logit_rows: 1,
                    prompt_len: items[*i].prompt_len,
                    adapter: None,
                    media: None,
                })
                .collect();
            let rows = match model.forward_batch(&seqs, pool)? {
                Some(t) => t.to_vec2::<f32>()?,
                None => Vec::new(),
            };
            if rows.len() != active.len() {
                candle_core::bail!(
                    "the draft model returned {} rows for {}",
                    rows.len(),
                    active.len()
                );
            }
            let mut next = Vec::with_capacity(active.len());
            for ((i, tokens, start_pos), row) in active.into_iter().zip(rows) {
                let t = crate::sampling::argmax(&row)
                    .map_err(|e| candle_core::Error::Msg(e.message))?;
                drafts[i].push(t);
                let k = items[i].draft.as_ref().map_or(0, |w| w.k);
                if drafts[i].len() < k {
                    next.push((i, vec![t], start_pos + tokens.len()));
                }
            }
            active = next;
        }
        Ok(drafts)
    }
}
