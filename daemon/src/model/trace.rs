//! A tracing wrapper around the host backend (tests only): every op's output is kept,
//! named as llama.cpp's graph names the same tensor (`attn_norm-3`, `Qcur-3`, …), so
//! that our intermediate values can be compared op by op with a dump of llama.cpp's
//! (`scripts/llamacpp-dump.sh`).

use candle_core::Tensor;

use super::host::{HostBackend, Rows};
use super::layers::Linear;
use super::matrix::Matrix;
use super::rope::RopeTable;
use super::spec::{Activation, ModelSpec};
use super::transformer::{AttnShape, Backend};
use super::weights::{MoeWeights, Projection, Vector};

/// The host backend, recording `(name, values)` per op.
pub struct TraceBackend<'a> {
    inner: HostBackend<'a>,
    /// Recorded tensors in op order.
    pub out: Vec<(String, Vec<f32>)>,
    layer: usize,
    norms_in_layer: usize,
    adds_in_layer: usize,
    ropes_in_layer: usize,
}

impl<'a> TraceBackend<'a> {
    /// Wraps `inner`.
    pub fn new(inner: HostBackend<'a>) -> Self {
        Self {
            inner,
            out: Vec::new(),
            layer: 0,
            norms_in_layer: 0,
            adds_in_layer: 0,
            ropes_in_layer: 0,
        }
    }

    fn keep(&mut self, name: &str, x: &Rows) {
        self.out
            .push((format!("{name}-{}", self.layer), x.v.clone()));
    }
}

impl Backend for TraceBackend<'_> {
    type Act = Rows;

    fn embed(&mut self, m: &Matrix, ids: &[u32]) -> candle_core::Result<Rows> {
        let x = self.inner.embed(m, ids)?;
        self.out.push(("inp_embd".into(), x.v.clone()));
        Ok(x)
    }

    fn set_rows(&mut self, x: Rows, rows: &[(usize, &[f32])]) -> candle_core::Result<Rows> {
        self.inner.set_rows(x, rows)
    }

    fn scale(&mut self, x: Rows, s: f32) -> candle_core::Result<Rows> {
        let x = self.inner.scale(x, s)?;
        // The embedding scale comes first; later scales are the queries' (Gemma 3).
        let name = if self.out.iter().any(|(n, _)| n == "inp_scaled") {
            "q_scaled"
        } else {
            "inp_scaled"
        };
        self.out.push((name.into(), x.v.clone()));
        Ok(x)
    }

    fn rms_norm(&mut self, x: &Rows, w: &Vector, eps: f32) -> candle_core::Result<Rows> {
        let y = self.inner.rms_norm(x, w, eps)?;
        let name = match self.norms_in_layer {
            0 => "attn_norm",
            1 => "ffn_norm",
            _ => "norm",
        };
        self.norms_in_layer += 1;
        self.keep(name, &y);
        Ok(y)
    }

    fn head_norm(
        &mut self,
        x: Rows,
        w: &Vector,
        eps: f32,
        heads: usize,
    ) -> candle_core::Result<Rows> {
        let y = self.inner.head_norm(x, w, eps, heads)?;
        self.keep("head_norm", &y);
        Ok(y)
    }

    fn project(&mut self, x: &Rows, p: &Projection) -> candle_core::Result<Vec<Rows>> {
        let parts = self.inner.project(x, p)?;
        let names: &[&str] = if parts.len() == 3 {
            &["Qcur", "Kcur", "Vcur"]
        } else {
            &["ffn_gate", "ffn_up"]
        };
        for (n, part) in names.iter().zip(&parts) {
            let n = format!("{n}.mm");
            self.keep(&n, part);
        }
        Ok(parts)
    }

    fn matmul(&mut self, x: &Rows, m: &Linear) -> candle_core::Result<Rows> {
        let y = self.inner.matmul(x, m)?;
        let name = if self.adds_in_layer == 0 {
            "attn_out"
        } else {
            "ffn_out"
        };
        self.keep(name, &y);
        Ok(y)
    }

    fn add_bias(&mut self, x: Rows, b: &Vector) -> candle_core::Result<Rows> {
        self.inner.add_bias(x, b)
    }

    fn add(&mut self, x: &mut Rows, y: &Rows) -> candle_core::Result<()> {
        self.inner.add(x, y)?;
        if self.adds_in_layer == 0 {
            self.keep("ffn_inp", x);
            self.adds_in_layer = 1;
        } else {
            self.keep("l_out", x);
            self.layer += 1;
            self.norms_in_layer = 0;
            self.adds_in_layer = 0;
            self.ropes_in_layer = 0;
        }
        Ok(())
    }

    fn rope(
        &mut self,
        x: Rows,
        heads: usize,
        head_dim: usize,
        t: &RopeTable,
    ) -> candle_core::Result<Rows> {
        let y = self.inner.rope(x, heads, head_dim, t)?;
        let name = if self.ropes_in_layer == 0 {
            "Qcur.rope"
        } else {
            "Kcur.rope"
        };
        self.ropes_in_layer += 1;
        self.keep(name, &y);
        Ok(y)
    }

    fn attention(
        &mut self,
        layer: usize,
        q: Rows,
        k: Rows,
        v: Rows,
        shape: AttnShape,
    ) -> candle_core::Result<Rows> {
        let y = self.inner.attention(layer, q, k, v, shape)?;
        self.keep("kqv_out", &y);
        Ok(y)
    }

    fn glu(&mut self, gate: Rows, up: Rows, act: Activation) -> candle_core::Result<Rows> {
        let y = self.inner.glu(gate, up, act)?;
        self.keep("ffn_glu", &y);
        Ok(y)
    }

    fn moe(&mut self, x: &Rows, w: &MoeWeights, spec: &ModelSpec) -> candle_core::Result<Rows> {
        self.inner.moe(x, w, spec)
    }

    fn rows(&mut self, x: &Rows, rows: &[u32]) -> candle_core::Result<Rows> {
        self.inner.rows(x, rows)
    }

    fn output_rows(&mut self, x: &Rows, rows: &[u32]) -> candle_core::Result<Rows> {
        self.inner.output_rows(x, rows)
    }

    fn logits(&mut self, x: Rows, rows: usize, cap: Option<f32>) -> candle_core::Result<Tensor> {
        self.out.push(("result_output".into(), x.v.clone()));
        self.inner.logits(x, rows, cap)
    }
}
