//! The CPU paged-attention kernels: causal (optionally sliding-window) grouped-query
//! attention of one layer over a paged KV cache, split over the compute thread team
//! ([`crate::team`]).
//!
//! One scaffold ([`attend`]) cuts a layer's work into items of one query head and a
//! run of one sequence's query rows ([`HeadRows`]: the query rows, the key offsets
//! through the block table, each row's visible keys), and three head kernels compute an
//! item:
//! - [`flash`]: llama.cpp's one-chunk flash attention for an f16 cache (decode, short
//!   prompts);
//! - [`tiled`]: llama.cpp's tiled flash attention for an f16 cache (the prompt rows of
//!   long prompts), with its register blocks in [`blocks`];
//! - [`exact`]: transformers' eager softmax for an f32 cache (Hugging Face weights).

pub mod blocks;
pub mod exact;
pub mod flash;
pub mod tiled;

#[cfg(test)]
mod bidirectional_tests;

use std::ops::Range;

use half::f16;

/// Below this many (query row × key) pairs in a layer the attention runs on the calling
/// thread: handing out tasks costs more than it saves.
const PAR_MIN_PAIRS: usize = 256;

/// Query rows per attention work item.
const ROW_CHUNK: usize = 64;

/// Attention parameters of one layer.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_kv_head: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Score scale.
    pub scale: f32,
    /// Sliding window (keys `j` with `i − window < j ≤ i`), `None` for full causal.
    pub window: Option<usize>,
}

/// One layer's K and V arrays of a paged cache, each `num_blocks × n_kv_head ×
/// block_size × head_dim`, indexed `((block · n_kv_head + head) · block_size + slot) ·
/// head_dim + d`: one block of one head is contiguous.
#[derive(Debug, Clone, Copy)]
pub enum KvLayer<'a> {
    /// f16 storage (GGUF models, and Hugging Face models in half precision).
    F16(&'a [f16], &'a [f16]),
    /// f32 storage.
    F32(&'a [f32], &'a [f32]),
}

/// The query rows of one sequence in a batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqRows<'a> {
    /// Query rows (tokens run this step), at positions `start_pos .. start_pos + rows`.
    pub rows: usize,
    /// Position of the first row: the sequence's tokens already in the cache.
    pub start_pos: usize,
    /// Block ids holding positions `0 .. start_pos + rows`.
    pub block_table: &'a [u32],
    /// Length of the request's prompt (0 when unknown): with `ggml`, prompt rows of long
    /// prompts take the tiled kernel ([`tiled::tiled_row`]).
    pub prompt_len: usize,
    /// Position ranges attended bidirectionally (sorted, disjoint): a query inside one
    /// also sees the keys after it up to the range's end (Gemma 3's image tokens,
    /// transformers `modeling_gemma3.py` `token_type_ids_mask_function`). Their keys
    /// must be in the cache by this step: a range is never split between steps.
    pub bidirectional: &'a [Range<usize>],
}

impl SeqRows<'_> {
    /// End of the keys a query at `pos` sees: past itself, or its range's end.
    #[inline]
    pub fn key_end(&self, pos: usize) -> usize {
        key_end(self.bidirectional, pos)
    }
}

#[inline]
fn key_end(bidirectional: &[Range<usize>], pos: usize) -> usize {
    let causal = pos + 1;
    if bidirectional.is_empty() {
        return causal;
    }
    bidirectional
        .iter()
        .find(|s| s.contains(&pos))
        .map_or(causal, |s| s.end.max(causal))
}

/// Causal grouped-query attention of one layer over the paged cache `kv` with blocks
/// of `block_size` positions.
///
/// `q` is `(T, n_head · head_dim)` f32 after RoPE, rows in batch order (the rows of
/// `seqs[0]`, then `seqs[1]`, ...). Query row `r` of a sequence sits at position
/// `start_pos + r` and attends to that sequence's positions `0 ..= start_pos + r`
/// (the last `window` of them under a sliding window; to the end of its
/// [`SeqRows::bidirectional`] range inside one), which the cache must already hold. Returns `(T, n_head · head_dim)` f32.
///
/// Per query head: `s_j = (q · k_j) · scale`, `w = softmax(s)`, `y = Σ_j w_j v_j`, in
/// ascending `j`. Every query row is computed by the same code whatever else is in the
/// batch, so a sequence's output does not depend on its batch company, and a prompt
/// prefilled in chunks gives the same values as one prefilled whole. With `ggml` (GGUF
/// models) an f16 cache takes llama.cpp's arithmetic: the tiled kernel for the prompt
/// rows of long prompts ([`tiled::tiled_row`], chosen by position and prompt length
/// alone), the one-chunk kernel otherwise ([`flash`]); an f32 cache takes
/// transformers' ([`exact`]).
pub fn attend(
    kv: KvLayer<'_>,
    block_size: usize,
    seqs: &[SeqRows<'_>],
    q: &[f32],
    shape: AttnShape,
    ggml: bool,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let row_width = shape.n_head * hd;
    let mut row0 = Vec::with_capacity(seqs.len());
    let mut acc = 0;
    for s in seqs {
        row0.push(acc);
        acc += s.rows;
    }
    let total_rows = acc;
    // Work items: (sequence, query head, first query row, end row); long prefill chunks
    // are split by rows so both cores share them.
    let work: Vec<(usize, usize, usize, usize)> = (0..seqs.len())
        .flat_map(|i| {
            let rows = seqs[i].rows;
            (0..shape.n_head).flat_map(move |h| {
                (0..rows)
                    .step_by(ROW_CHUNK)
                    .map(move |r0| (i, h, r0, (r0 + ROW_CHUNK).min(rows)))
            })
        })
        .collect();
    let pairs: usize = seqs.iter().map(|s| s.rows * (s.start_pos + s.rows)).sum();
    let simd = flash::Simd::detect();
    let run = |&(i, h, r0, r1): &(usize, usize, usize, usize)| -> Vec<f32> {
        let seq = &seqs[i];
        let item = |rows: Range<usize>| HeadRows {
            shape,
            h,
            rows,
            start_pos: seq.start_pos,
            q: &q[row0[i] * row_width..],
            offs: &[],
            bidirectional: seq.bidirectional,
        };
        let offs = key_offsets(block_size, seq, h, item(r0..r1).max_keys(), shape);
        let item = |rows: Range<usize>| HeadRows {
            offs: &offs,
            ..item(rows)
        };
        match kv {
            KvLayer::F16(kc, vc) if ggml => {
                // Runs of rows with the same kernel: llama.cpp's tiled one for prompt rows
                // of long prompts, the one-chunk one otherwise.
                let is_tiled = |r: usize| tiled::tiled_row(seq.start_pos + r, seq.prompt_len);
                let mut out = Vec::with_capacity((r1 - r0) * hd);
                let mut a = r0;
                while a < r1 {
                    let t = is_tiled(a);
                    let b = (a..r1).find(|&r| is_tiled(r) != t).unwrap_or(r1);
                    if t {
                        out.extend(tiled::attend_head(kc, vc, &item(a..b)));
                    } else {
                        out.extend(flash::attend_head(kc, vc, &item(a..b), simd));
                    }
                    a = b;
                }
                out
            }
            KvLayer::F16(kc, vc) => flash::attend_head(kc, vc, &item(r0..r1), simd),
            KvLayer::F32(kc, vc) => exact::attend_head(kc, vc, &item(r0..r1)),
        }
    };
    let outs: Vec<Vec<f32>> = if pairs * shape.n_head >= PAR_MIN_PAIRS && work.len() > 1 {
        crate::team::map(work.len(), |i| run(&work[i]))
    } else {
        work.iter().map(run).collect()
    };
    let mut y = vec![0f32; total_rows * row_width];
    for (&(i, h, r0, r1), out) in work.iter().zip(outs) {
        for r in r0..r1 {
            let dst = (row0[i] + r) * row_width + h * hd;
            let src = (r - r0) * hd;
            y[dst..dst + hd].copy_from_slice(&out[src..src + hd]);
        }
    }
    y
}

/// One work item of [`attend`], what every head kernel reads: query head `h`, query
/// rows `rows` of one sequence, and where its keys are.
#[derive(Debug, Clone)]
pub struct HeadRows<'a> {
    /// The layer's shape.
    pub shape: AttnShape,
    /// Query head.
    pub h: usize,
    /// Query rows of the sequence (row `r` at position `start_pos + r`).
    pub rows: Range<usize>,
    /// Position of the sequence's row 0.
    pub start_pos: usize,
    /// The sequence's query rows from its row 0, `n_head · head_dim` values each.
    pub q: &'a [f32],
    /// `offs[j]`: where key/value `j` of this head's KV head starts in the layer's
    /// arrays, for every key any of the rows sees.
    pub offs: &'a [usize],
    /// [`SeqRows::bidirectional`].
    pub bidirectional: &'a [Range<usize>],
}

impl HeadRows<'_> {
    /// Query row `r`'s vector for this head (`head_dim` values).
    #[inline]
    pub fn q_row(&self, r: usize) -> &[f32] {
        let (hd, w) = (self.shape.head_dim, self.shape.n_head * self.shape.head_dim);
        &self.q[r * w + self.h * hd..r * w + (self.h + 1) * hd]
    }

    /// The keys row `r` sees: the last `window` of `0 ..= start_pos + r`, or all; up
    /// to its bidirectional range's end inside one.
    #[inline]
    pub fn keys(&self, r: usize) -> Range<usize> {
        let pos = self.start_pos + r;
        first_key(pos + 1, self.shape.window)..key_end(self.bidirectional, pos)
    }

    /// Keys seen by any of the rows end before this.
    #[inline]
    pub fn max_keys(&self) -> usize {
        let causal = self.start_pos + self.rows.end;
        let first = self.start_pos + self.rows.start;
        self.bidirectional
            .iter()
            .filter(|s| s.start < causal && s.end > first)
            .map(|s| s.end)
            .fold(causal, usize::max)
    }
}

/// Offset of key/value `j < n_keys` of query head `h`'s KV head in a layer's arrays
/// (the `(block, head, slot, d)` layout of [`KvLayer`]).
fn key_offsets(
    block_size: usize,
    seq: &SeqRows<'_>,
    h: usize,
    n_keys: usize,
    shape: AttnShape,
) -> Vec<usize> {
    let (hd, bs) = (shape.head_dim, block_size);
    let g = h / (shape.n_head / shape.n_kv_head);
    (0..n_keys)
        .map(|j| ((seq.block_table[j / bs] as usize * shape.n_kv_head + g) * bs + j % bs) * hd)
        .collect()
}

/// The first key a query with `n_keys` causal keys sees: the last `window` of them
/// (`i − window < j ≤ i`), or all.
fn first_key(n_keys: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| n_keys.saturating_sub(w))
}

/// Seeded values in `[-1, 1]` (xorshift) for the attention tests.
#[cfg(test)]
pub(crate) fn test_values(len: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}
