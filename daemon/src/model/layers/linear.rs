//! The one place a weight matrix is applied: a [`Linear`] is the base [`Matrix`] (its
//! kernel chosen at load) and the [`Site`]s its output columns answer to, so that
//! anything applied per projection (LoRA deltas) finds its columns here and nowhere
//! else. Fusion (QKV, gate/up) is one `Linear` with several parts; both backends apply
//! a `Linear` through [`Linear::forward_host`] or [`Linear::forward`].

use candle_core::Tensor;
use inferd_kernels::BatchRow;

use crate::model::lora::{self, RowAdapters};
use crate::model::matrix::Matrix;

/// The seven projections of a transformer block an adapter may target (PEFT's
/// `q_proj` … `down_proj`; llama.cpp's `attn_q` … `ffn_down`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proj {
    /// Query `(q_dim, n_embd)`.
    Q,
    /// Key `(kv_dim, n_embd)`.
    K,
    /// Value `(kv_dim, n_embd)`.
    V,
    /// Attention output `(n_embd, q_dim)`.
    O,
    /// MLP gate `(n_ff, n_embd)`.
    Gate,
    /// MLP up `(n_ff, n_embd)`.
    Up,
    /// MLP down `(n_embd, n_ff)`.
    Down,
}

impl Proj {
    /// Every projection, in block order.
    pub const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];
}

/// One projection of one block: what an adapter's A/B pair is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Site {
    /// Block index.
    pub layer: usize,
    /// Which projection.
    pub proj: Proj,
}

/// A run of a [`Linear`]'s output columns: its width and, where an adapter may apply
/// to it, its site (none for the output head, the MoE router and the experts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// The projection these columns are, if adaptable.
    pub site: Option<Site>,
    /// Output width.
    pub width: usize,
}

/// A weight matrix `(out, in)` applied as `y = x · Wᵀ`, its output columns split into
/// [`Part`]s in order (one part unless fused).
#[derive(Debug)]
pub struct Linear {
    /// The base weights.
    pub base: Matrix,
    /// Output columns in order; the widths sum to `out`.
    pub parts: Vec<Part>,
}

impl Linear {
    /// A linear layer of one part.
    pub fn single(base: Matrix, site: Option<Site>) -> Self {
        let (out, _) = base.dims();
        Self {
            base,
            parts: vec![Part { site, width: out }],
        }
    }

    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        self.base.dims()
    }

    /// The parts' output widths.
    pub fn widths(&self) -> impl Iterator<Item = usize> + '_ {
        self.parts.iter().map(|p| p.width)
    }

    /// Host rows `xs` `(rows, in)` → `(rows, out)`, each row on llama.cpp's kernel for
    /// its micro-batch place `batch[j]` (empty: `vec_dot`; see
    /// [`Matrix::forward_host_batch`]), plus each row's adapter delta
    /// ([`lora::apply::add_host`]).
    ///
    /// # Errors
    /// A candle error (shape mismatch, a non-CPU matrix).
    pub fn forward_host(
        &self,
        xs: &[f32],
        rows: usize,
        batch: &[BatchRow],
        adapters: &RowAdapters<'_>,
    ) -> candle_core::Result<Vec<f32>> {
        let mut y = self.base.forward_host_batch(xs, rows, batch)?;
        lora::apply::add_host(self, xs, rows, batch, adapters, &mut y)?;
        Ok(y)
    }

    /// `x` `(rows, in)` f32 → `(rows, out)` f32 on the matrix's device, plus each row's
    /// adapter delta ([`lora::apply::add_tensor`]).
    ///
    /// # Errors
    /// A candle error (shape mismatch, device).
    pub fn forward(&self, x: &Tensor, adapters: &RowAdapters<'_>) -> candle_core::Result<Tensor> {
        let y = self.base.forward(x)?;
        lora::apply::add_tensor(self, x, adapters, y)
    }
}

/// Projections of the same input: the parts of its linear layers in order (one fused
/// layer, or one layer per part when the parts' stored types differ).
#[derive(Debug)]
pub struct Projection(pub Vec<Linear>);

impl Projection {
    /// Number of parts.
    pub fn n_parts(&self) -> usize {
        self.0.iter().map(|l| l.parts.len()).sum()
    }
}
