//! LoRA deltas per batch row: which adapter (and scale) each row of the current
//! activations uses, and the delta `s · B(A x)` added to a [`Linear`]'s output for the
//! rows of each adapter (rows grouped by adapter; the base product stays shared).

use candle_core::{Device, Tensor};
use inferd_kernels::BatchRow;

use super::LoraAdapter;
use crate::model::layers::Linear;
use crate::model::ForwardSeq;

/// A sequence's adapter in one forward pass: the adapter and the request's scale.
#[derive(Debug, Clone, Copy)]
pub struct AdapterUse<'a> {
    /// The adapter.
    pub adapter: &'a LoraAdapter,
    /// The request's scale (1 unless it asked for another; `lora_scale`).
    pub scale: f32,
}

impl AdapterUse<'_> {
    fn same(&self, o: &AdapterUse<'_>) -> bool {
        std::ptr::eq(self.adapter, o.adapter) && self.scale.to_bits() == o.scale.to_bits()
    }
}

/// Which adapter each row of the current activations uses.
#[derive(Debug, Clone, Default)]
pub struct RowAdapters<'a> {
    /// The distinct adapter uses of the batch.
    uses: Vec<AdapterUse<'a>>,
    /// Per row: 0 for the base model alone, `k + 1` for `uses[k]`.
    row: Vec<u16>,
}

impl<'a> RowAdapters<'a> {
    /// The rows of `seqs` in batch order (each sequence's tokens).
    pub fn new(seqs: &[ForwardSeq<'a>]) -> Self {
        let mut out = Self::default();
        if seqs.iter().all(|s| s.adapter.is_none()) {
            return out;
        }
        for s in seqs {
            let k = match s.adapter {
                None => 0,
                Some(u) => match out.uses.iter().position(|x| x.same(&u)) {
                    Some(k) => k + 1,
                    None => {
                        out.uses.push(u);
                        out.uses.len()
                    }
                },
            };
            out.row
                .extend(std::iter::repeat_n(k as u16, s.tokens.len()));
        }
        out
    }

    /// Whether no row uses an adapter.
    pub fn is_empty(&self) -> bool {
        self.uses.is_empty()
    }

    /// The same for rows `rows` of the current ones, in that order.
    pub fn select(&self, rows: &[u32]) -> Self {
        if self.is_empty() {
            return Self::default();
        }
        Self {
            uses: self.uses.clone(),
            row: rows
                .iter()
                .map(|&r| self.row.get(r as usize).copied().unwrap_or(0))
                .collect(),
        }
    }

    /// Each adapter use with the rows that use it (ascending); uses without rows are
    /// left out.
    fn groups(&self) -> Vec<(AdapterUse<'a>, Vec<usize>)> {
        let mut g: Vec<(AdapterUse<'a>, Vec<usize>)> =
            self.uses.iter().map(|&u| (u, Vec::new())).collect();
        for (i, &k) in self.row.iter().enumerate() {
            if k > 0 {
                g[usize::from(k) - 1].1.push(i);
            }
        }
        g.retain(|(_, rows)| !rows.is_empty());
        g
    }
}

/// Rows of one adapter from which its products are split over the thread team each,
/// rather than run one product per task.
const SPLIT_ROWS: usize = 8;

/// Rows per product on the split path: bounds the gathered activations and the deltas
/// (each a `(rows, width)` buffer) to a size the allocator reuses.
const CHUNK_ROWS: usize = 64;

/// Some rows of one adapter: their activations `(len, in)` and micro-batch places —
/// borrowed when the rows are consecutive, else gathered.
struct Piece<'x> {
    rows: &'x [usize],
    x: std::borrow::Cow<'x, [f32]>,
    batch: std::borrow::Cow<'x, [BatchRow]>,
}

impl<'x> Piece<'x> {
    fn of(xs: &'x [f32], k: usize, batch: &'x [BatchRow], n: usize, rows: &'x [usize]) -> Self {
        use std::borrow::Cow;
        let (first, len) = (rows.first().copied().unwrap_or(0), rows.len());
        let consecutive = rows.iter().enumerate().all(|(i, &r)| r == first + i);
        if consecutive {
            return Self {
                rows,
                x: Cow::Borrowed(&xs[first * k..(first + len) * k]),
                batch: if batch.len() == n {
                    Cow::Borrowed(&batch[first..first + len])
                } else {
                    Cow::Borrowed(&[])
                },
            };
        }
        let mut x = Vec::with_capacity(len * k);
        for &r in rows {
            x.extend_from_slice(&xs[r * k..(r + 1) * k]);
        }
        Self {
            rows,
            x: Cow::Owned(x),
            batch: if batch.len() == n {
                Cow::Owned(rows.iter().map(|&r| batch[r]).collect())
            } else {
                Cow::Borrowed(&[])
            },
        }
    }

    /// `B(A x)` of these rows, `(len, out of B)`.
    fn delta(&self, pair: &super::LoraPair) -> candle_core::Result<Vec<f32>> {
        let t = pair
            .a
            .forward_host_batch(&self.x, self.rows.len(), &self.batch)?;
        pair.b.forward_host_batch(&t, self.rows.len(), &self.batch)
    }
}

/// `y[r, at..at + w] += d[j] · scale` for the piece's rows `r` (ggml_scale, then
/// ggml_add; PEFT: `result + delta * scaling`).
fn add_delta(
    y: &mut [f32],
    out: usize,
    at: usize,
    w: usize,
    scale: f32,
    rows: &[usize],
    d: &[f32],
) {
    for (j, &r) in rows.iter().enumerate() {
        let dst = &mut y[r * out + at..r * out + at + w];
        for (yv, &dv) in dst.iter_mut().zip(&d[j * w..(j + 1) * w]) {
            *yv += dv * scale;
        }
    }
}

/// Adds the adapters' deltas to `y` `(n, out)`, the base output of `lin` for host rows
/// `xs` `(n, in)`, on llama.cpp's kernel for the rows' micro-batch places when `batch`
/// is given. When some adapter has [`SPLIT_ROWS`] rows or more (prefill), each product
/// `B(A x)` runs in turn on the whole thread team, [`CHUNK_ROWS`] rows at a time.
/// Otherwise (decode) each adapter's rows are gathered and every (adapter, part)
/// product is one task of a single dispatch (the products are small: inside a task the
/// kernels run on its thread). Each delta is scaled and added in place, in adapter and
/// part order; a row's result does not depend on the path.
///
/// # Errors
/// A candle error from a kernel; `rows` not matching the row count.
pub fn add_host(
    lin: &Linear,
    xs: &[f32],
    n: usize,
    batch: &[BatchRow],
    rows: &RowAdapters<'_>,
    y: &mut [f32],
) -> candle_core::Result<()> {
    if rows.is_empty() || !lin.parts.iter().any(|p| p.site.is_some()) {
        return Ok(());
    }
    if rows.row.len() != n {
        candle_core::bail!("{} adapter rows for {n} activation rows", rows.row.len());
    }
    let (out, k) = lin.dims();
    let groups = rows.groups();
    if groups.iter().any(|(_, g)| g.len() >= SPLIT_ROWS) {
        for (u, group) in &groups {
            let scale = u.adapter.scale(u.scale);
            let pairs = adapted(lin, u);
            for chunk in group.chunks(CHUNK_ROWS) {
                let piece = Piece::of(xs, k, batch, n, chunk);
                for &(pair, at, w) in &pairs {
                    add_delta(y, out, at, w, scale, chunk, &piece.delta(pair)?);
                }
            }
        }
        return Ok(());
    }
    let pieces: Vec<Piece<'_>> = groups
        .iter()
        .map(|(_, g)| Piece::of(xs, k, batch, n, g))
        .collect();
    // (group, pair, first output column, width) of every adapted part.
    let mut jobs = Vec::new();
    for (g, (u, _)) in groups.iter().enumerate() {
        jobs.extend(adapted(lin, u).into_iter().map(|(p, at, w)| (g, p, at, w)));
    }
    let deltas = inferd_kernels::team::map(jobs.len(), |j| pieces[jobs[j].0].delta(jobs[j].1));
    for (&(g, _, at, w), d) in jobs.iter().zip(deltas) {
        let (u, group) = &groups[g];
        add_delta(y, out, at, w, u.adapter.scale(u.scale), group, &d?);
    }
    Ok(())
}

/// The parts of `lin` that `u`'s adapter adapts: its pair, the part's first output
/// column and its width each, in part order.
fn adapted<'u>(lin: &Linear, u: &AdapterUse<'u>) -> Vec<(&'u super::LoraPair, usize, usize)> {
    let mut v = Vec::new();
    let mut at = 0;
    for part in &lin.parts {
        if let Some(pair) = part.site.and_then(|s| u.adapter.pairs.get(&s)) {
            v.push((pair, at, part.width));
        }
        at += part.width;
    }
    v
}

/// [`add_host`] for a device tensor: `y` `(n, out)` plus each adapter's delta at its
/// rows (`index_add`), the delta `(n_g, out)` zero in columns its adapter leaves alone.
///
/// # Errors
/// A candle error.
pub fn add_tensor(
    lin: &Linear,
    x: &Tensor,
    rows: &RowAdapters<'_>,
    y: Tensor,
) -> candle_core::Result<Tensor> {
    if rows.is_empty() || !lin.parts.iter().any(|p| p.site.is_some()) {
        return Ok(y);
    }
    let device: Device = x.device().clone();
    let mut y = y;
    for (u, group) in rows.groups() {
        let scale = f64::from(u.adapter.scale(u.scale));
        let ids: Vec<u32> = group.iter().map(|&r| r as u32).collect();
        let idx = Tensor::new(ids.as_slice(), &device)?;
        let xg = x.index_select(&idx, 0)?;
        let mut cols = Vec::with_capacity(lin.parts.len());
        let mut any = false;
        for part in &lin.parts {
            match part.site.and_then(|s| u.adapter.pairs.get(&s)) {
                Some(p) => {
                    let d = p.b.forward(&p.a.forward(&xg)?)?;
                    cols.push((d * scale)?);
                    any = true;
                }
                None => cols.push(Tensor::zeros(
                    (group.len(), part.width),
                    candle_core::DType::F32,
                    &device,
                )?),
            }
        }
        if any {
            let delta = Tensor::cat(&cols, 1)?;
            y = y.index_add(&idx, &delta, 0)?;
        }
    }
    Ok(y)
}
