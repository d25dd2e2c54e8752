//! Per-sequence KV cache tensors, owned by the model runner.
//!
//! One key and one value tensor per layer, each `(1, n_kv_heads, capacity, head_dim)`
//! f32, filled front to back. Capacity grows by doubling (in multiples of
//! [`GROWTH_QUANTUM`] tokens) up to the context window, so a short chat does not
//! reserve a whole context's worth of memory and appends stay amortized O(new tokens).

use candle_core::{DType, Device, Tensor};

use crate::model::{KvCache, LlamaConfig};

/// Capacity is always a multiple of this many tokens.
pub const GROWTH_QUANTUM: usize = 64;

/// The KV cache of one sequence.
#[derive(Debug)]
pub struct SequenceKvCache {
    /// Per layer `(k, v)`, each `(1, n_kv_heads, capacity, head_dim)`; `None` until first use.
    layers: Vec<Option<(Tensor, Tensor)>>,
    /// Positions stored so far.
    len: usize,
    /// Positions the tensors can hold.
    capacity: usize,
    /// Upper bound on `capacity` (the context window), in tokens.
    max_tokens: usize,
    n_kv_head: usize,
    head_dim: usize,
    device: Device,
}

impl SequenceKvCache {
    /// An empty cache for a model with `config`, on `device`.
    pub fn new(config: &LlamaConfig, device: &Device) -> Self {
        Self {
            layers: vec![None; config.n_layer],
            len: 0,
            capacity: 0,
            max_tokens: config.context_length,
            n_kv_head: config.n_kv_head,
            head_dim: config.head_dim,
            device: device.clone(),
        }
    }

    fn grow(&mut self, needed: usize) -> candle_core::Result<()> {
        if needed > self.max_tokens {
            candle_core::bail!(
                "KV cache needs {needed} positions but the context window is {}",
                self.max_tokens
            );
        }
        let new_cap = (needed.max(self.capacity * 2))
            .div_ceil(GROWTH_QUANTUM)
            .saturating_mul(GROWTH_QUANTUM)
            .min(self.max_tokens);
        let shape = (1, self.n_kv_head, new_cap, self.head_dim);
        for slot in self.layers.iter_mut() {
            let k = Tensor::zeros(shape, DType::F32, &self.device)?;
            let v = Tensor::zeros(shape, DType::F32, &self.device)?;
            if let Some((old_k, old_v)) = slot.as_ref() {
                if self.len > 0 {
                    k.slice_set(&old_k.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                    v.slice_set(&old_v.narrow(2, 0, self.len)?.contiguous()?, 2, 0)?;
                }
            }
            *slot = Some((k, v));
        }
        self.capacity = new_cap;
        Ok(())
    }
}

impl KvCache for SequenceKvCache {
    fn append(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let new = k.dim(2)?;
        // Every layer appends the same positions; `len` advances after the last layer.
        if self.len + new > self.capacity {
            self.grow(self.len + new)?;
        }
        let last_layer = self.layers.len().saturating_sub(1);
        let (kc, vc) = match self.layers.get(layer).and_then(|s| s.as_ref()) {
            Some(kv) => kv,
            None => candle_core::bail!("layer {layer} out of range"),
        };
        kc.slice_set(k, 2, self.len)?;
        vc.slice_set(v, 2, self.len)?;
        let total = self.len + new;
        let out = (kc.narrow(2, 0, total)?, vc.narrow(2, 0, total)?);
        if layer == last_layer {
            self.len = total;
        }
        Ok(out)
    }

    fn len(&self) -> usize {
        self.len
    }
}
