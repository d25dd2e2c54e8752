//! The CPU backend of the decoder loop: activations are row-major `Vec<f32>` on the
//! host, no tensor ops between our kernels. Every step computes each row independently
//! of the others, so a sequence's logits never depend on its batch company.

use candle_core::{Device, Tensor};

use super::kv_pool::{ForwardSeq, KvBlockPool};
use super::layers::Linear;
use super::lora::RowAdapters;
use super::matrix::Matrix;
use super::moe::{route, Route};
use super::rope::RopeTable;
use super::spec::{Activation, ModelSpec, Numerics};
use super::transformer::{AttnShape, Backend};
use super::weights::{MoeWeights, Projection, Vector};
use inferd_kernels::BatchRow;

/// `(n, width)` activations, row-major.
#[derive(Debug, Clone)]
pub struct Rows {
    /// Values.
    pub v: Vec<f32>,
    /// Row count.
    pub n: usize,
}

impl Rows {
    fn width(&self) -> usize {
        self.v.len().checked_div(self.n).unwrap_or(0)
    }
}

/// The host backend over one batch.
pub struct HostBackend<'a> {
    pool: &'a mut KvBlockPool,
    seqs: &'a [ForwardSeq<'a>],
    positions: &'a [u32],
    numerics: Numerics,
    /// With ggml numerics, each current row's place in llama-server's micro-batch
    /// ([`inferd_kernels::ubatch`]), so that matrix products take llama.cpp's kernel per row;
    /// empty otherwise (every product through `vec_dot`).
    batch: Vec<BatchRow>,
    /// Each current row's LoRA adapter.
    adapters: RowAdapters<'a>,
    /// Multimodal RoPE positions of the rows ([`super::kv_pool::batch_mrope`]).
    mrope: Option<Vec<[u32; 3]>>,
}

impl<'a> HostBackend<'a> {
    /// A backend writing K/V into `pool` for `seqs` at `positions`, with the model's
    /// element-wise numerics.
    pub fn new(
        pool: &'a mut KvBlockPool,
        seqs: &'a [ForwardSeq<'a>],
        positions: &'a [u32],
        numerics: Numerics,
    ) -> Self {
        let batch = match numerics {
            Numerics::Ggml => {
                let rows: Vec<_> = seqs.iter().map(ForwardSeq::rows).collect();
                inferd_kernels::ubatch::batch_rows(&rows)
            }
            Numerics::Transformers => Vec::new(),
        };
        Self {
            pool,
            seqs,
            positions,
            numerics,
            batch,
            adapters: RowAdapters::new(seqs),
            mrope: super::kv_pool::batch_mrope(seqs),
        }
    }

    /// The micro-batch places of `n` current rows (none for other row sets).
    fn batch_for(&self, n: usize) -> &[BatchRow] {
        if self.batch.len() == n {
            &self.batch
        } else {
            &[]
        }
    }
}

/// RMSNorm of host rows under `numerics` ([`rms_norm_rows`] or ggml's).
pub fn rms_norm_with(numerics: Numerics, x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    match numerics {
        Numerics::Ggml => inferd_kernels::eltwise::rms_norm_rows(x, w, eps, out),
        Numerics::Transformers => rms_norm_rows(x, w, eps, out),
    }
}

/// candle's `rms_norm` on host rows: `y = x / √(Σx²/e + ε) · α`, the sum sequential in
/// f32 (bit-identical to `candle_nn::ops::rms_norm` on the CPU).
pub fn rms_norm_rows(x: &[f32], alpha: &[f32], eps: f32, out: &mut Vec<f32>) {
    let e = alpha.len();
    out.clear();
    for row in x.chunks_exact(e) {
        let sum2 = row.iter().map(|&v| v * v).sum::<f32>();
        let m = (sum2 / e as f32 + eps).sqrt();
        out.extend(row.iter().zip(alpha).map(|(&v, &a)| v / m * a));
    }
}

/// `act(g) · u`: SiLU as candle computes it (`g / (1 + e^{−g})`), GELU-tanh as
/// PyTorch's `gelu(approximate="tanh")`: `½g(1 + tanh(√(2/π)(g + 0.044715 g³)))`.
#[inline]
pub fn glu_value(act: Activation, g: f32, u: f32) -> f32 {
    match act {
        Activation::Silu => (g / (1.0 + (-g).exp())) * u,
        Activation::GeluTanh => {
            const SQRT_2_OVER_PI: f32 = 0.797_884_6;
            let inner = SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g);
            0.5 * g * (1.0 + inner.tanh()) * u
        }
    }
}

/// [`glu_value`] (or ggml's GLU, [`inferd_kernels::eltwise::glu_row`]) over whole rows, on
/// the thread team from a few rows on.
pub fn glu_rows(
    gate: &[f32],
    up: &[f32],
    n: usize,
    act: Activation,
    numerics: Numerics,
) -> Vec<f32> {
    let width = gate.len().checked_div(n).unwrap_or(0);
    glu_rows_by(n, width, act, numerics, |r| {
        (
            &gate[r * width..(r + 1) * width],
            &up[r * width..(r + 1) * width],
        )
    })
}

/// [`glu_rows`] of `n` rows of `width`, row `r`'s gate and up values given by
/// `parts(r)`.
fn glu_rows_by<'a>(
    n: usize,
    width: usize,
    act: Activation,
    numerics: Numerics,
    parts: impl Fn(usize) -> (&'a [f32], &'a [f32]) + Sync,
) -> Vec<f32> {
    let mut out = vec![0f32; n * width];
    let row = |r: usize, dst: &mut [f32]| {
        let (g, u) = parts(r);
        match numerics {
            Numerics::Ggml => inferd_kernels::eltwise::glu_row(act, g, u, dst),
            Numerics::Transformers => {
                for ((d, &g), &u) in dst.iter_mut().zip(g).zip(u) {
                    *d = glu_value(act, g, u);
                }
            }
        }
    };
    if n >= 4 && width > 0 {
        inferd_kernels::team::for_each_chunk_mut(&mut out, width, row);
    } else if width > 0 {
        out.chunks_exact_mut(width)
            .enumerate()
            .for_each(|(r, d)| row(r, d));
    }
    out
}

/// Splits rows of the concatenated widths into one row-major array per part.
fn split_rows(all: &[f32], n: usize, widths: &[usize]) -> Vec<Vec<f32>> {
    let total: usize = widths.iter().sum();
    let mut parts: Vec<Vec<f32>> = widths.iter().map(|w| Vec::with_capacity(n * w)).collect();
    for row in all.chunks_exact(total) {
        let mut at = 0;
        for (p, &w) in parts.iter_mut().zip(widths) {
            p.extend_from_slice(&row[at..at + w]);
            at += w;
        }
    }
    parts
}

/// The projections of host rows `x` (`n` rows), one row-major array per part; each row
/// on llama.cpp's kernel for its micro-batch place `batch[j]` (empty: `vec_dot`), with
/// its adapter's delta.
pub fn project_rows(
    x: &[f32],
    n: usize,
    p: &Projection,
    batch: &[BatchRow],
    adapters: &RowAdapters<'_>,
) -> candle_core::Result<Vec<Vec<f32>>> {
    let mut out = Vec::with_capacity(p.n_parts());
    for l in &p.0 {
        let y = l.forward_host(x, n, batch, adapters)?;
        if l.parts.len() == 1 {
            out.push(y);
        } else {
            let widths: Vec<usize> = l.widths().collect();
            out.extend(split_rows(&y, n, &widths));
        }
    }
    Ok(out)
}

/// The gated MLP of host rows `x` through `gate_up` and `down` (an MoE expert's: no
/// adapter applies).
pub fn mlp_rows(
    x: &[f32],
    n: usize,
    gate_up: &Projection,
    down: &Linear,
    act: Activation,
    numerics: Numerics,
) -> candle_core::Result<Vec<f32>> {
    let none = RowAdapters::default();
    let parts = project_rows(x, n, gate_up, &[], &none)?;
    let [g, u] = parts.as_slice() else {
        candle_core::bail!("gate/up projection has {} parts", parts.len());
    };
    down.forward_host(&glu_rows(g, u, n, act, numerics), n, &[], &none)
}

impl Backend for HostBackend<'_> {
    type Act = Rows;

    fn embed(&mut self, m: &Matrix, ids: &[u32]) -> candle_core::Result<Rows> {
        Ok(Rows {
            v: m.rows_host(ids)?,
            n: ids.len(),
        })
    }

    fn set_rows(&mut self, mut x: Rows, rows: &[(usize, &[f32])]) -> candle_core::Result<Rows> {
        let w = x.width();
        for &(r, v) in rows {
            x.v[r * w..r * w + v.len()].copy_from_slice(v);
        }
        Ok(x)
    }

    fn scale(&mut self, mut x: Rows, s: f32) -> candle_core::Result<Rows> {
        x.v.iter_mut().for_each(|a| *a *= s);
        Ok(x)
    }

    fn rms_norm(&mut self, x: &Rows, w: &Vector, eps: f32) -> candle_core::Result<Rows> {
        let mut out = Vec::with_capacity(x.v.len());
        rms_norm_with(self.numerics, &x.v, &w.host, eps, &mut out);
        Ok(Rows { v: out, n: x.n })
    }

    fn head_norm(
        &mut self,
        x: Rows,
        w: &Vector,
        eps: f32,
        _heads: usize,
    ) -> candle_core::Result<Rows> {
        let mut out = Vec::with_capacity(x.v.len());
        rms_norm_with(self.numerics, &x.v, &w.host, eps, &mut out);
        Ok(Rows { v: out, n: x.n })
    }

    fn project(&mut self, x: &Rows, p: &Projection) -> candle_core::Result<Vec<Rows>> {
        Ok(
            project_rows(&x.v, x.n, p, self.batch_for(x.n), &self.adapters)?
                .into_iter()
                .map(|v| Rows { v, n: x.n })
                .collect(),
        )
    }

    fn matmul(&mut self, x: &Rows, m: &Linear) -> candle_core::Result<Rows> {
        Ok(Rows {
            v: m.forward_host(&x.v, x.n, self.batch_for(x.n), &self.adapters)?,
            n: x.n,
        })
    }

    fn add_bias(&mut self, mut x: Rows, b: &Vector) -> candle_core::Result<Rows> {
        let w = b.host.len();
        for row in x.v.chunks_exact_mut(w) {
            row.iter_mut().zip(&b.host).for_each(|(a, b)| *a += b);
        }
        Ok(x)
    }

    fn add(&mut self, x: &mut Rows, y: &Rows) -> candle_core::Result<()> {
        x.v.iter_mut().zip(&y.v).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn rope(
        &mut self,
        mut x: Rows,
        heads: usize,
        head_dim: usize,
        t: &RopeTable,
    ) -> candle_core::Result<Rows> {
        match &self.mrope {
            Some(p3) if t.mrope_section.is_some() => {
                t.apply_host_mrope(&mut x.v, heads, head_dim, p3);
            }
            _ => t.apply_host(&mut x.v, heads, head_dim, self.positions),
        }
        Ok(x)
    }

    fn attention(
        &mut self,
        layer: usize,
        q: Rows,
        k: Rows,
        v: Rows,
        shape: AttnShape,
    ) -> candle_core::Result<Rows> {
        self.pool.write_host(layer, self.seqs, &k.v, &v.v)?;
        Ok(Rows {
            v: self.pool.attend_host(
                layer,
                self.seqs,
                &q.v,
                shape,
                self.numerics == Numerics::Ggml,
            )?,
            n: q.n,
        })
    }

    fn glu(&mut self, gate: Rows, up: Rows, act: Activation) -> candle_core::Result<Rows> {
        Ok(Rows {
            v: glu_rows(&gate.v, &up.v, gate.n, act, self.numerics),
            n: gate.n,
        })
    }

    /// A fused gate/up product of two equal parts goes to the GLU as it is (each row
    /// `[gate | up]`), without splitting it into two arrays first.
    fn gated(
        &mut self,
        x: &Rows,
        gate_up: &Projection,
        act: Activation,
    ) -> candle_core::Result<Rows> {
        if let [fused] = gate_up.0.as_slice() {
            if let &[g, u] = fused.parts.as_slice() {
                let g = g.width;
                if g == u.width {
                    let all = fused.forward_host(&x.v, x.n, self.batch_for(x.n), &self.adapters)?;
                    let v = glu_rows_by(x.n, g, act, self.numerics, |r| {
                        let row = &all[r * 2 * g..(r + 1) * 2 * g];
                        row.split_at(g)
                    });
                    return Ok(Rows { v, n: x.n });
                }
            }
        }
        super::transformer::project_then_glu(self, x, gate_up, act)
    }

    fn moe(&mut self, x: &Rows, w: &MoeWeights, spec: &ModelSpec) -> candle_core::Result<Rows> {
        let Some(m) = &spec.moe else {
            candle_core::bail!("MoE weights without an MoE spec");
        };
        let e = x.width();
        let logits = w
            .router
            .forward_host(&x.v, x.n, &[], &RowAdapters::default())?;
        let Route { per_expert } = route(&logits, x.n, m);
        let mut out = vec![0f32; x.v.len()];
        // Expert by expert over the tokens routed to it (transformers'
        // Qwen3MoeSparseMoeBlock order: experts ascending, `index_add_` of w · y).
        for (ex, tokens) in per_expert.iter().enumerate() {
            if tokens.is_empty() {
                continue;
            }
            let mut rows = Vec::with_capacity(tokens.len() * e);
            for &(t, _) in tokens {
                rows.extend_from_slice(&x.v[t * e..(t + 1) * e]);
            }
            let (gate_up, down) = &w.experts[ex];
            let y = mlp_rows(
                &rows,
                tokens.len(),
                gate_up,
                down,
                spec.activation,
                spec.numerics,
            )?;
            for (i, &(t, wt)) in tokens.iter().enumerate() {
                let dst = &mut out[t * e..(t + 1) * e];
                for (d, &yv) in dst.iter_mut().zip(&y[i * e..(i + 1) * e]) {
                    *d += yv * wt;
                }
            }
        }
        Ok(Rows { v: out, n: x.n })
    }

    fn rows(&mut self, x: &Rows, rows: &[u32]) -> candle_core::Result<Rows> {
        let e = x.width();
        let mut v = Vec::with_capacity(rows.len() * e);
        for &r in rows {
            let r = r as usize;
            v.extend_from_slice(&x.v[r * e..(r + 1) * e]);
        }
        Ok(Rows { v, n: rows.len() })
    }

    fn output_rows(&mut self, x: &Rows, rows: &[u32]) -> candle_core::Result<Rows> {
        if !self.batch.is_empty() {
            self.batch = vec![BatchRow::SINGLE; rows.len()];
        }
        self.adapters = self.adapters.select(rows);
        self.rows(x, rows)
    }

    fn logits(
        &mut self,
        mut x: Rows,
        rows: usize,
        cap: Option<f32>,
    ) -> candle_core::Result<Tensor> {
        if let Some(c) = cap {
            x.v.iter_mut().for_each(|l| *l = c * (*l / c).tanh());
        }
        let vocab = x.v.len().checked_div(rows).unwrap_or(0);
        Tensor::from_vec(x.v, (rows, vocab), &Device::Cpu)
    }
}
