//! llama-server's micro-batches, for the kernels that follow llama.cpp's per-batch
//! choices (tiled attention, [`crate::Path`] of each matrix product).
//!
//! llama-server prefills a prompt in micro-batches of [`UBATCH`] rows (`n_ubatch`, with
//! `n_batch` 2048 ≥ it) from position 0 and decodes one token per step; which kernel
//! llama.cpp's CPU backend runs for a row depends on its micro-batch. We choose by a
//! row's position and its sequence's prompt length alone — never by how our scheduler
//! chunked or batched it — so chunked prefill, preemption, the prefix cache and batch
//! company leave a sequence's values unchanged, and a sequence computes as llama-server
//! computes it alone.

use crate::attention::SeqRows;
use crate::BatchRow;

/// llama-server's micro-batch (`n_ubatch`, default 512).
pub const UBATCH: usize = 512;

/// The micro-batch place of the row at `pos` of a sequence with a prompt of
/// `prompt_len` tokens: within the prompt, row `pos − start` of the micro-batch that
/// starts at `start = ⌊pos / 512⌋ · 512`; after it, a decode step of one row.
pub fn batch_row(pos: usize, prompt_len: usize) -> BatchRow {
    if pos >= prompt_len {
        return BatchRow::SINGLE;
    }
    let start = pos / UBATCH * UBATCH;
    BatchRow {
        index: (pos - start) as u32,
        len: (prompt_len.min(start + UBATCH) - start) as u32,
    }
}

/// [`batch_row`] of every row of `seqs`, in batch order.
pub fn batch_rows(seqs: &[SeqRows<'_>]) -> Vec<BatchRow> {
    seqs.iter()
        .flat_map(|s| (s.start_pos..s.start_pos + s.rows).map(|p| batch_row(p, s.prompt_len)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_rows_and_decode_rows() {
        assert_eq!(batch_row(0, 37), BatchRow { index: 0, len: 37 });
        assert_eq!(batch_row(36, 37), BatchRow { index: 36, len: 37 });
        assert_eq!(batch_row(37, 37), BatchRow::SINGLE);
        assert_eq!(
            batch_row(511, 700),
            BatchRow {
                index: 511,
                len: 512
            }
        );
        assert_eq!(batch_row(512, 700), BatchRow { index: 0, len: 188 });
        assert_eq!(
            batch_row(699, 700),
            BatchRow {
                index: 187,
                len: 188
            }
        );
    }
}
