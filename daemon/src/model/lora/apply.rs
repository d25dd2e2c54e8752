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

/// Adds the adapters' deltas to `y` `(n, out)`, the base output of `lin` for host rows
/// `xs` `(n, in)`. Each adapter's rows are gathered; every (adapter, part) product
/// `B(A x)` is one task of a single dispatch of the thread team when the groups are
/// small (decode: inside a task the kernels run on its thread), or, when some adapter
/// has [`SPLIT_ROWS`] rows or more (prefill), each product in turn on the whole team —
/// on llama.cpp's kernel for the rows' micro-batch places when `batch` is given; then
/// each delta is scaled and added in place, in adapter and part order.
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
    struct Group<'a> {
        adapter: AdapterUse<'a>,
        rows: Vec<usize>,
        x: Vec<f32>,
        batch: Vec<BatchRow>,
    }
    let groups: Vec<Group<'_>> = rows
        .groups()
        .into_iter()
        .map(|(adapter, group)| {
            let mut x = Vec::with_capacity(group.len() * k);
            for &r in &group {
                x.extend_from_slice(&xs[r * k..(r + 1) * k]);
            }
            let batch = if batch.len() == n {
                group.iter().map(|&r| batch[r]).collect()
            } else {
                Vec::new()
            };
            Group {
                adapter,
                rows: group,
                x,
                batch,
            }
        })
        .collect();
    // (group, part, first output column) of every adapted part.
    let mut jobs = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        let mut at = 0;
        for (p, part) in lin.parts.iter().enumerate() {
            if part
                .site
                .is_some_and(|s| group.adapter.adapter.pairs.contains_key(&s))
            {
                jobs.push((g, p, at));
            }
            at += part.width;
        }
    }
    let delta = |j: usize| {
        let (g, p, _) = jobs[j];
        let (group, part) = (&groups[g], &lin.parts[p]);
        let pair = part
            .site
            .and_then(|s| group.adapter.adapter.pairs.get(&s))
            .ok_or_else(|| candle_core::Error::Msg("adapter pair vanished".into()))?;
        let t = pair
            .a
            .forward_host_batch(&group.x, group.rows.len(), &group.batch)?;
        pair.b
            .forward_host_batch(&t, group.rows.len(), &group.batch)
    };
    // Decode steps: many small products, one per task. Prefill chunks: products large
    // enough to split over the team themselves, one after another (a single product per
    // task would leave the other threads idle).
    let deltas: Vec<candle_core::Result<Vec<f32>>> =
        if groups.iter().any(|g| g.rows.len() >= SPLIT_ROWS) {
            (0..jobs.len()).map(delta).collect()
        } else {
            inferd_kernels::team::map(jobs.len(), delta)
        };
    for (&(g, p, at), d) in jobs.iter().zip(deltas) {
        let d = d?;
        let (group, w) = (&groups[g], lin.parts[p].width);
        let scale = group.adapter.adapter.scale(group.adapter.scale);
        for (j, &r) in group.rows.iter().enumerate() {
            let dst = &mut y[r * out + at..r * out + at + w];
            for (yv, &dv) in dst.iter_mut().zip(&d[j * w..(j + 1) * w]) {
                // ggml_scale, then ggml_add (PEFT: `result + delta * scaling`).
                *yv += dv * scale;
            }
        }
    }
    Ok(())
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
