//! How a matrix's weight rows are laid out in memory: ggml's row-major rows, or rows
//! interleaved block by block in small groups for the decode tiles
//! ([`crate::block_tiles`]).

/// How a matrix's weight rows are stored. `1`: ggml's layout, each row's blocks in
/// order, row after row. `g > 1`: rows in groups of `g`, block by block (block `b` of
/// row `r` at byte `(r / g · g · nb + b · g + r % g) · BYTES`, `nb` blocks a row; the
/// last group padded with zero rows): a decode tile of `g` rows then reads one stream
/// from memory, which the hardware prefetcher follows, where `g` separate rows are `g`
/// streams (measured with `step_timing`, first quartile of the decode step, two runs:
/// the default model requantized to Q8_0 7.1 / 6.7 -> 6.0 / 6.5 ms).
pub type Interleave = usize;

/// Stores `n` ggml rows of `row_bytes` bytes in groups of `group` ([`Interleave`]),
/// the last group padded with zero bytes.
pub fn interleave(data: &[u8], row_bytes: usize, block: usize, group: usize) -> Vec<u8> {
    let n = data.len() / row_bytes;
    let nb = row_bytes / block;
    let mut out = vec![0u8; n.div_ceil(group) * group * row_bytes];
    for (r, row) in data.chunks_exact(row_bytes).enumerate() {
        for (b, blk) in row.chunks_exact(block).enumerate() {
            let at = (r / group * group * nb + b * group + r % group) * block;
            out[at..at + block].copy_from_slice(blk);
        }
    }
    out
}

/// Row `r` of a matrix stored in groups of `group` ([`interleave`]), in ggml's layout.
pub fn row_of(data: &[u8], row_bytes: usize, block: usize, group: usize, r: usize) -> Vec<u8> {
    let nb = row_bytes / block;
    let base = r / group * group * row_bytes + r % group * block;
    (0..nb)
        .flat_map(|b| {
            let at = base + b * group * block;
            data[at..at + block].iter().copied()
        })
        .collect()
}

/// Activation rows from which the block tiles take their prefill tiles
/// (`block_tiles::block_rows`); fewer are a decode product, which reads each weight row
/// once.
pub(crate) const PREFILL_MIN: usize = 4;
