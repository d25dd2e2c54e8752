//! The choices of an `n > 1` request: forked from its first sequence once the prompt
//! is computed, sharing the prompt's full KV blocks (reference counts go up) and each
//! taking its own copy of a partly filled last block, which every choice goes on
//! writing. The prompt is prefilled once.

use super::{PendingCopy, Scheduler};
use crate::model_runner::BlockCopy;
use crate::request::SeqId;

impl Scheduler {
    /// Forks the pending choices of the running sequence `parent`, whose prompt was
    /// just computed (nothing generated yet). Returns, in choice order, the choices
    /// that hold the prompt's KV now and sample their first token from `parent`'s
    /// logits row; a choice that found no free block for its copy of the last block
    /// waits at the front of the queue instead and prefills the prompt itself when
    /// admitted (its KV blocks come back through the prefix cache when it is on).
    pub fn fork_choices(&mut self, parent: SeqId) -> Vec<SeqId> {
        let Some(i) = self.running.iter().position(|s| s.id == parent) else {
            return Vec::new();
        };
        let children = self.running[i].fork();
        let prompt_len = self.running[i].prompt.len();
        let bs = self.blocks.block_size();
        let full = prompt_len / bs;
        // The partly filled last block of the prompt, when there is one.
        let partial = !prompt_len.is_multiple_of(bs);
        let tail = if partial {
            self.blocks.table(parent).get(full).copied()
        } else {
            None
        };
        let mut ready = Vec::with_capacity(children.len());
        for mut child in children {
            self.blocks.share_prefix(parent, child.id, full);
            if partial {
                let copy = match (tail, self.blocks.ensure(child.id, prompt_len)) {
                    (Some(src), Ok(())) => self
                        .blocks
                        .table(child.id)
                        .get(full)
                        .map(|&dst| BlockCopy { src, dst }),
                    _ => None,
                };
                let Some(copy) = copy else {
                    self.blocks.free(child.id);
                    self.waiting.push_front(child);
                    continue;
                };
                self.copies.push(PendingCopy {
                    seq: child.id,
                    index: full,
                    copy,
                });
            }
            child.computed = prompt_len;
            ready.push(child.id);
            self.running.push(child);
        }
        ready
    }

    /// The pending copies whose choice still owns its destination block (a choice
    /// preempted, cancelled or finished since its fork gave the block back).
    pub(super) fn take_copies(&mut self) -> Vec<BlockCopy> {
        let pending = std::mem::take(&mut self.copies);
        pending
            .into_iter()
            .filter(|c| {
                self.running.iter().any(|s| s.id == c.seq)
                    && self.blocks.table(c.seq).get(c.index) == Some(&c.copy.dst)
            })
            .map(|c| c.copy)
            .collect()
    }
}
