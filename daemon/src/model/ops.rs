//! The tensor-ops backend of the decoder loop: candle ops on any device (CUDA in
//! production). With a host KV pool (tests on the CPU) RoPE and attention take the
//! host kernels, so this backend then gives the host backend's bits.

use candle_core::{DType, Device, Tensor, D};

use super::kv_pool::{ForwardSeq, KvBlockPool};
use super::layers::Linear;
use super::lora::RowAdapters;
use super::matrix::Matrix;
use super::moe::{route, Route};
use super::rope::RopeTable;
use super::spec::{Activation, ModelSpec, Numerics};
use super::transformer::{AttnShape, Backend};
use super::weights::{MoeWeights, Projection, Vector};

/// The tensor backend over one batch. Activations are `(T, width)` tensors.
pub struct TensorBackend<'a> {
    pool: &'a mut KvBlockPool,
    seqs: &'a [ForwardSeq<'a>],
    positions: &'a [u32],
    /// Positions as a device tensor (for gathering RoPE rows).
    pos: Tensor,
    device: Device,
    /// ggml numerics run the host's element-wise ops when the device is the CPU (so
    /// this backend keeps giving the host backend's bits); candle's elsewhere.
    host_ops: bool,
    /// Each current row's LoRA adapter.
    adapters: RowAdapters<'a>,
    /// Multimodal RoPE positions of the rows ([`super::kv_pool::batch_mrope`]).
    mrope: Option<Vec<[u32; 3]>>,
}

impl<'a> TensorBackend<'a> {
    /// A backend for `seqs` at `positions` on `device`.
    ///
    /// # Errors
    /// A device error.
    pub fn new(
        pool: &'a mut KvBlockPool,
        seqs: &'a [ForwardSeq<'a>],
        positions: &'a [u32],
        numerics: Numerics,
        device: &Device,
    ) -> candle_core::Result<Self> {
        Ok(Self {
            pool,
            seqs,
            positions,
            pos: Tensor::new(positions, device)?,
            device: device.clone(),
            host_ops: numerics == Numerics::Ggml && device.is_cpu(),
            adapters: RowAdapters::new(seqs),
            mrope: super::kv_pool::batch_mrope(seqs),
        })
    }
}

fn host(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// Additive mask `(L, start + L)`: 0 where key `j ≤ start + i` (or, inside a
/// bidirectional range, `j` before its end; and, with a window, `j > start + i −
/// window`), −∞ elsewhere.
fn attention_mask(
    seq: &inferd_kernels::attention::SeqRows<'_>,
    window: Option<usize>,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let (len, start) = (seq.rows, seq.start_pos);
    let kv_len = start + len;
    let mask: Vec<f32> = (0..len)
        .flat_map(|i| {
            let pos = start + i;
            let end = seq.key_end(pos);
            (0..kv_len).map(move |j| {
                let seen = j < end && window.is_none_or(|w| j + w > pos);
                if seen {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (len, kv_len), device)
}

fn mlp(
    x: &Tensor,
    gate_up: &Projection,
    down: &Linear,
    act: Activation,
    host_ops: bool,
) -> candle_core::Result<Tensor> {
    let none = RowAdapters::default();
    let parts = project(x, gate_up, &none)?;
    let [g, u] = parts.as_slice() else {
        candle_core::bail!("gate/up projection has {} parts", parts.len());
    };
    down.forward(&glu(g, u, act, host_ops)?, &none)
}

/// `f` over the rows of a 2-D CPU tensor, as host values.
fn on_host(x: &Tensor, f: impl FnOnce(&[f32], usize) -> Vec<f32>) -> candle_core::Result<Tensor> {
    let (n, width) = x.dims2()?;
    let v = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
    Tensor::from_vec(f(&v, n), (n, width), x.device())
}

fn project(
    x: &Tensor,
    p: &Projection,
    adapters: &RowAdapters<'_>,
) -> candle_core::Result<Vec<Tensor>> {
    let mut out = Vec::with_capacity(p.n_parts());
    for l in &p.0 {
        let all = l.forward(x, adapters)?;
        if l.parts.len() == 1 {
            out.push(all);
            continue;
        }
        let mut at = 0;
        for w in l.widths() {
            out.push(all.narrow(D::Minus1, at, w)?.contiguous()?);
            at += w;
        }
    }
    Ok(out)
}

fn glu(g: &Tensor, u: &Tensor, act: Activation, host_ops: bool) -> candle_core::Result<Tensor> {
    if host_ops {
        let uv = u.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
        return on_host(g, |gv, n| {
            super::host::glu_rows(gv, &uv, n, act, Numerics::Ggml)
        });
    }
    let a = match act {
        Activation::Silu => candle_nn::ops::silu(g)?,
        Activation::GeluTanh => g.gelu()?,
    };
    a * u
}

impl TensorBackend<'_> {
    /// Attention on a device pool with candle ops: K/V go into the pool, then each
    /// sequence gathers its slots and attends under its mask.
    fn attention_device(
        &mut self,
        layer: usize,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        s: AttnShape,
    ) -> candle_core::Result<Tensor> {
        let n = q.dim(0)?;
        let group = s.n_head / s.n_kv_head;
        let k_rows = k.reshape((n, s.n_kv_head, s.head_dim))?;
        let v_rows = v.reshape((n, s.n_kv_head, s.head_dim))?;
        self.pool.write_device(layer, self.seqs, &k_rows, &v_rows)?;
        // (T, nh·d) -> (nh, T, d)
        let q = q
            .reshape((n, s.n_head, s.head_dim))?
            .transpose(0, 1)?
            .contiguous()?;
        let mut outs = Vec::with_capacity(self.seqs.len());
        let mut row = 0;
        for seq in self.seqs {
            let len = seq.tokens.len();
            let kv_len = seq.start_pos + len;
            let (k_all, v_all) = self.pool.gather_device(layer, seq.block_table, kv_len)?;
            // (nh, len, d) -> (n_kv_head, group·len, d): query heads of one KV group
            // are adjacent.
            let qs = q.narrow(1, row, len)?.contiguous()?.reshape((
                s.n_kv_head,
                group * len,
                s.head_dim,
            ))?;
            let att = (qs.matmul(&k_all.t()?)? * f64::from(s.scale))?;
            let needs_mask = len > 1 || s.window.is_some_and(|w| kv_len > w);
            let att = if needs_mask {
                let mask = attention_mask(&seq.rows(), s.window, &self.device)?;
                att.reshape((s.n_kv_head, group, len, kv_len))?
                    .broadcast_add(&mask)?
                    .reshape((s.n_kv_head, group * len, kv_len))?
            } else {
                att
            };
            let att = candle_nn::ops::softmax_last_dim(&att)?;
            let y = att
                .matmul(&v_all)?
                .reshape((s.n_head, len, s.head_dim))?
                .transpose(0, 1)?
                .reshape((len, s.n_head * s.head_dim))?;
            outs.push(y);
            row += len;
        }
        Tensor::cat(&outs, 0)
    }
}

impl Backend for TensorBackend<'_> {
    type Act = Tensor;

    fn embed(&mut self, m: &Matrix, ids: &[u32]) -> candle_core::Result<Tensor> {
        m.rows(ids, &self.device)
    }

    fn set_rows(&mut self, x: Tensor, rows: &[(usize, &[f32])]) -> candle_core::Result<Tensor> {
        let (n, w) = x.dims2()?;
        let mut v = host(&x)?;
        for &(r, vals) in rows {
            v[r * w..r * w + vals.len()].copy_from_slice(vals);
        }
        Tensor::from_vec(v, (n, w), &self.device)?.to_dtype(x.dtype())
    }

    fn scale(&mut self, x: Tensor, s: f32) -> candle_core::Result<Tensor> {
        x * f64::from(s)
    }

    fn rms_norm(&mut self, x: &Tensor, w: &Vector, eps: f32) -> candle_core::Result<Tensor> {
        if self.host_ops {
            return on_host(x, |v, _| {
                let mut out = Vec::with_capacity(v.len());
                inferd_kernels::eltwise::rms_norm_rows(v, &w.host, eps, &mut out);
                out
            });
        }
        candle_nn::ops::rms_norm(x, &w.tensor, eps)
    }

    fn head_norm(
        &mut self,
        x: Tensor,
        w: &Vector,
        eps: f32,
        heads: usize,
    ) -> candle_core::Result<Tensor> {
        if self.host_ops {
            return self.rms_norm(&x, w, eps);
        }
        let (n, width) = x.dims2()?;
        let y = candle_nn::ops::rms_norm(&x.reshape((n, heads, width / heads))?, &w.tensor, eps)?;
        y.reshape((n, width))
    }

    fn project(&mut self, x: &Tensor, p: &Projection) -> candle_core::Result<Vec<Tensor>> {
        project(x, p, &self.adapters)
    }

    fn matmul(&mut self, x: &Tensor, m: &Linear) -> candle_core::Result<Tensor> {
        m.forward(x, &self.adapters)
    }

    fn add_bias(&mut self, x: Tensor, b: &Vector) -> candle_core::Result<Tensor> {
        x.broadcast_add(&b.tensor)
    }

    fn add(&mut self, x: &mut Tensor, y: &Tensor) -> candle_core::Result<()> {
        *x = (&*x + y)?;
        Ok(())
    }

    fn rope(
        &mut self,
        x: Tensor,
        heads: usize,
        head_dim: usize,
        t: &RopeTable,
    ) -> candle_core::Result<Tensor> {
        let mrope = self.mrope.as_deref().filter(|_| t.mrope_section.is_some());
        if self.pool.is_host() || self.host_ops {
            let mut v = host(&x)?;
            match mrope {
                Some(p3) => t.apply_host_mrope(&mut v, heads, head_dim, p3),
                None => t.apply_host(&mut v, heads, head_dim, self.positions),
            }
            return Tensor::from_vec(v, x.shape(), x.device());
        }
        let n = x.dim(0)?;
        let (cos, sin) = match mrope {
            Some(p3) => {
                let (c, s) = t.mrope_rows(p3);
                let half = t.dim / 2;
                (
                    Tensor::from_vec(c, (n, half), &self.device)?.to_dtype(t.cos.dtype())?,
                    Tensor::from_vec(s, (n, half), &self.device)?.to_dtype(t.sin.dtype())?,
                )
            }
            None => (
                t.cos.index_select(&self.pos, 0)?,
                t.sin.index_select(&self.pos, 0)?,
            ),
        };
        // (T, h·d) -> (1, h, T, d) for the per-row positions, and back.
        let x4 = x
            .reshape((1, n, heads, head_dim))?
            .transpose(1, 2)?
            .contiguous()?;
        let y = t.apply(&x4, &cos, &sin)?;
        y.transpose(1, 2)?.reshape((n, heads * head_dim))
    }

    fn attention(
        &mut self,
        layer: usize,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        s: AttnShape,
    ) -> candle_core::Result<Tensor> {
        if self.pool.is_host() {
            // Stored as f16 like llama.cpp's default KV cache type (or f32).
            self.pool
                .write_host(layer, self.seqs, &host(&k)?, &host(&v)?)?;
            let y = self
                .pool
                .attend_host(layer, self.seqs, &host(&q)?, s, self.host_ops)?;
            return Tensor::from_vec(y, q.shape(), &self.device);
        }
        self.attention_device(layer, &q, &k, &v, s)
    }

    fn glu(&mut self, gate: Tensor, up: Tensor, act: Activation) -> candle_core::Result<Tensor> {
        glu(&gate, &up, act, self.host_ops)
    }

    fn moe(&mut self, x: &Tensor, w: &MoeWeights, spec: &ModelSpec) -> candle_core::Result<Tensor> {
        let Some(m) = &spec.moe else {
            candle_core::bail!("MoE weights without an MoE spec");
        };
        let n = x.dim(0)?;
        let logits = host(
            &w.router
                .forward(x, &RowAdapters::default())?
                .to_dtype(DType::F32)?,
        )?;
        let Route { per_expert } = route(&logits, n, m);
        let mut out = x.zeros_like()?;
        for (ex, tokens) in per_expert.iter().enumerate() {
            if tokens.is_empty() {
                continue;
            }
            let ids: Vec<u32> = tokens.iter().map(|&(t, _)| t as u32).collect();
            let wts: Vec<f32> = tokens.iter().map(|&(_, w)| w).collect();
            let idx = Tensor::new(ids.as_slice(), &self.device)?;
            let wts = Tensor::from_vec(wts, (tokens.len(), 1), &self.device)?;
            let (gate_up, down) = &w.experts[ex];
            let y = mlp(
                &x.index_select(&idx, 0)?,
                gate_up,
                down,
                spec.activation,
                self.host_ops,
            )?;
            out = out.index_add(&idx, &y.broadcast_mul(&wts)?, 0)?;
        }
        Ok(out)
    }

    fn rows(&mut self, x: &Tensor, rows: &[u32]) -> candle_core::Result<Tensor> {
        x.index_select(&Tensor::new(rows, &self.device)?, 0)
    }

    fn output_rows(&mut self, x: &Tensor, rows: &[u32]) -> candle_core::Result<Tensor> {
        self.adapters = self.adapters.select(rows);
        self.rows(x, rows)
    }

    fn logits(&mut self, x: Tensor, _rows: usize, cap: Option<f32>) -> candle_core::Result<Tensor> {
        let x = x.to_dtype(DType::F32)?;
        match cap {
            Some(c) => (x / f64::from(c))?.tanh()? * f64::from(c),
            None => Ok(x),
        }
    }
}
