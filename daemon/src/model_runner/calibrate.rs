//! What speculative verification costs on this device and model, measured once at
//! start-up: the time of extra logits rows in a decode step, and of a draft model's
//! decode step, each against the target's one-row decode step. The scheduler's draft
//! controller weighs drafts with them, so the same daemon speculates a lot where extra
//! rows are nearly free (a memory-bound GPU) and little where they are not (a small CPU
//! that is compute-bound already at one row).

use std::time::Instant;

use crate::model::{ForwardSeq, KvBlockPool, Model};

use super::runner::ModelRunner;

/// Measured costs, as fractions of the target's one-row decode step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecCosts {
    /// Each extra row of a decode step (a draft being verified).
    pub row_cost: f64,
    /// One decode step of the draft model, when there is one.
    pub draft_cost: Option<f64>,
}

/// Context of the probe sequence, tokens.
const PROBE_PROMPT: usize = 64;
/// Rows of the multi-row probe step.
const PROBE_ROWS: usize = 5;
/// Timed repetitions per figure (the median counts).
const REPS: usize = 9;

/// Median seconds of `REPS` runs of `f` after one warm-up.
fn median_secs(mut f: impl FnMut() -> candle_core::Result<()>) -> candle_core::Result<f64> {
    f()?;
    let mut t = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[REPS / 2])
}

/// Median time of a decode step of `rows` rows after a `PROBE_PROMPT`-token context in
/// blocks `table` (prefilled by the caller).
fn step(
    model: &Model,
    pool: &mut KvBlockPool,
    table: &[u32],
    rows: usize,
) -> candle_core::Result<f64> {
    let tokens = vec![200u32; rows];
    median_secs(|| {
        let seq = ForwardSeq {
            tokens: &tokens,
            start_pos: PROBE_PROMPT,
            block_table: table,
            logit_rows: rows,
            prompt_len: PROBE_PROMPT,
            adapter: None,
            media: None,
        };
        model.forward_batch(&[seq], pool).map(drop)
    })
}

/// Prefills the probe context in `table`.
fn prefill(model: &Model, pool: &mut KvBlockPool, table: &[u32]) -> candle_core::Result<()> {
    let tokens: Vec<u32> = (0..PROBE_PROMPT as u32).map(|i| 300 + i * 7).collect();
    let seq = ForwardSeq {
        tokens: &tokens,
        start_pos: 0,
        block_table: table,
        logit_rows: 1,
        prompt_len: PROBE_PROMPT,
        adapter: None,
        media: None,
    };
    model.forward_batch(&[seq], pool).map(drop)
}

impl ModelRunner {
    /// Measures [`SpecCosts`] on the first blocks of the pool, which must hold nothing
    /// yet (call it before serving: it overwrites their K/V). `None` when the pool is
    /// too small for the probe.
    ///
    /// # Errors
    /// A forward pass that fails.
    pub fn measure_spec_costs(&mut self) -> candle_core::Result<Option<SpecCosts>> {
        let bs = self.pool().block_size();
        let n = (PROBE_PROMPT + PROBE_ROWS).div_ceil(bs);
        if self.pool().num_blocks() < n {
            return Ok(None);
        }
        let table: Vec<u32> = (0..n as u32).collect();
        let (model, pool, draft) = self.parts();
        prefill(model, pool, &table)?;
        let one = step(model, pool, &table, 1)?;
        let many = step(model, pool, &table, PROBE_ROWS)?;
        let row_cost = ((many / one - 1.0) / (PROBE_ROWS - 1) as f64).clamp(0.01, 4.0);
        let draft_cost = match draft {
            Some((dm, dp)) => {
                prefill(dm, dp, &table)?;
                Some((step(dm, dp, &table, 1)? / one).clamp(0.01, 4.0))
            }
            None => None,
        };
        Ok(Some(SpecCosts {
            row_cost,
            draft_cost,
        }))
    }
}
