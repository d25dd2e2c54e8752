//! Llama-family decoder (Llama, Mistral, SmolLM) over GGUF weights.
//!
//! Follows llama.cpp's `LLM_ARCH_LLAMA` graph (src/models/llama.cpp) and candle's
//! `quantized_llama.rs`: pre-norm blocks with RMSNorm, grouped-query attention with
//! RoPE in the "normal" (adjacent-pair, GPT-J style) layout that GGUF llama files use,
//! and a SwiGLU MLP. Tensor names mirror the file (`blk.N.attn_q.weight`, ...).

use candle_core::quantized::{QMatMul, QTensor};

use super::q4_1::Q4_1Matrix;
use candle_core::{DType, Device, Module, Tensor, D};

use super::KvCache;

/// Hyper-parameters read from the `llama.*` GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// Number of transformer blocks (`llama.block_count`).
    pub n_layer: usize,
    /// Hidden size (`llama.embedding_length`).
    pub n_embd: usize,
    /// Query heads (`llama.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`llama.attention.head_count_kv`); query head `h` uses KV head
    /// `h / (n_head / n_kv_head)`.
    pub n_kv_head: usize,
    /// Per-head dimension (`n_embd / n_head`).
    pub head_dim: usize,
    /// Dimensions rotated by RoPE (`llama.rope.dimension_count`, defaults to `head_dim`).
    pub rope_dim: usize,
    /// RoPE base θ (`llama.rope.freq_base`, default 10000).
    pub rope_theta: f32,
    /// RMSNorm ε (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Context window in tokens (`llama.context_length`).
    pub context_length: usize,
    /// Vocabulary size (rows of `token_embd.weight`).
    pub vocab_size: usize,
}

impl LlamaConfig {
    /// KV cache bytes per token for an element size of `dtype_bytes`:
    /// `2 × layers × kv_heads × head_dim × dtype_bytes`.
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> usize {
        2 * self.n_layer * self.n_kv_head * self.head_dim * dtype_bytes
    }
}

/// A weight matrix `(out, in)` applied as `y = x · Wᵀ`: candle's quantized matmul, or our
/// Q4_1 kernel.
#[derive(Debug)]
pub(super) enum Linear {
    /// candle `QMatMul` (Q8_0, F32, other ggml types, or Q4_1 through candle's portable kernel).
    Candle(QMatMul),
    /// Q4_1 through [`Q4_1Matrix`] (ggml numerics, AVX2).
    Q4_1(Q4_1Matrix),
}

impl Linear {
    /// `x` `(..., in)` → `(..., out)`.
    pub(super) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Linear::Candle(m) => m.forward(x),
            Linear::Q4_1(m) => m.forward(x),
        }
    }
}

/// The weights of one transformer block.
#[derive(Debug)]
pub(super) struct Block {
    pub attn_norm: Tensor,
    pub attn_q: Linear,
    pub attn_k: Linear,
    pub attn_v: Linear,
    pub attn_output: Linear,
    pub ffn_norm: Tensor,
    pub ffn_gate: Linear,
    pub ffn_up: Linear,
    pub ffn_down: Linear,
}

/// A loaded llama-family model. Immutable after loading: all per-sequence state is in
/// the [`KvCache`] passed to [`LlamaModel::forward`].
#[derive(Debug)]
pub struct LlamaModel {
    pub(super) config: LlamaConfig,
    /// `token_embd.weight`, `(vocab, n_embd)`, kept quantized; rows are dequantized on lookup.
    pub(super) token_embd: QTensor,
    pub(super) blocks: Vec<Block>,
    pub(super) output_norm: Tensor,
    /// `output.weight`, or `token_embd.weight` when the embeddings are tied.
    pub(super) output: Linear,
    /// RoPE tables, `(context_length, rope_dim / 2)`.
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    pub(super) device: Device,
}

/// Builds the RoPE cos/sin tables, each `(max_pos, rope_dim / 2)`, with
/// `θ_i = base^(-2i / rope_dim)` (Su et al. 2021, RoFormer).
pub(super) fn rope_tables(
    rope_dim: usize,
    base: f32,
    max_pos: usize,
    device: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let inv_freq: Vec<f32> = (0..rope_dim)
        .step_by(2)
        .map(|i| 1f32 / base.powf(i as f32 / rope_dim as f32))
        .collect();
    let n = inv_freq.len();
    let inv_freq = Tensor::from_vec(inv_freq, (1, n), device)?;
    let pos = Tensor::arange(0u32, max_pos as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((max_pos, 1))?;
    let freqs = pos.matmul(&inv_freq)?;
    Ok((freqs.cos()?, freqs.sin()?))
}

impl LlamaModel {
    /// The model's hyper-parameters.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The device holding the weights.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Runs `tokens` (positions `cache.len() .. cache.len() + tokens.len()`) through the
    /// model, appending their K/V to `cache`, and returns the logits of the last position,
    /// shape `(vocab_size,)`, f32.
    ///
    /// # Errors
    /// A candle error, or the context window would be exceeded.
    pub fn forward(&self, tokens: &[u32], cache: &mut dyn KvCache) -> candle_core::Result<Tensor> {
        let seq_len = tokens.len();
        let start = cache.len();
        if seq_len == 0 {
            candle_core::bail!("forward called with no tokens");
        }
        if start + seq_len > self.config.context_length {
            candle_core::bail!(
                "positions {start}..{} exceed the context window of {} tokens",
                start + seq_len,
                self.config.context_length
            );
        }
        let ids = Tensor::new(tokens, &self.device)?;
        // (seq_len, n_embd) -> (1, seq_len, n_embd)
        let mut x = self.token_embd.embedding(&ids)?.unsqueeze(0)?;
        let cos = self.cos.narrow(0, start, seq_len)?;
        let sin = self.sin.narrow(0, start, seq_len)?;
        let mask = if seq_len > 1 {
            Some(causal_mask(seq_len, start, &self.device)?)
        } else {
            None
        };
        for (layer, block) in self.blocks.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &block.attn_norm, self.config.rms_eps)?;
            let attn = self.attention(block, layer, &h, &cos, &sin, mask.as_ref(), cache)?;
            x = (x + attn)?;
            let h = candle_nn::ops::rms_norm(&x, &block.ffn_norm, self.config.rms_eps)?;
            let gate = candle_nn::ops::silu(&block.ffn_gate.forward(&h)?)?;
            let up = block.ffn_up.forward(&h)?;
            x = (x + block.ffn_down.forward(&(gate * up)?)?)?;
        }
        let last = x.narrow(1, seq_len - 1, 1)?;
        let last = candle_nn::ops::rms_norm(&last, &self.output_norm, self.config.rms_eps)?;
        let logits = self.output.forward(&last)?;
        logits.flatten_all()?.to_dtype(DType::F32)
    }

    /// Grouped-query self-attention for one block. `h` is `(1, L, n_embd)`; returns
    /// the attention output after `attn_output`, `(1, L, n_embd)`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        block: &Block,
        layer: usize,
        h: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        cache: &mut dyn KvCache,
    ) -> candle_core::Result<Tensor> {
        let cfg = &self.config;
        let (_, seq_len, _) = h.dims3()?;
        let group = cfg.n_head / cfg.n_kv_head;
        let q = block
            .attn_q
            .forward(h)?
            .reshape((1, seq_len, cfg.n_head, cfg.head_dim))?
            .transpose(1, 2)?
            .contiguous()?;
        let k = block
            .attn_k
            .forward(h)?
            .reshape((1, seq_len, cfg.n_kv_head, cfg.head_dim))?
            .transpose(1, 2)?
            .contiguous()?;
        let v = block
            .attn_v
            .forward(h)?
            .reshape((1, seq_len, cfg.n_kv_head, cfg.head_dim))?
            .transpose(1, 2)?
            .contiguous()?;
        let q = self.rope(&q, cos, sin)?;
        let k = self.rope(&k, cos, sin)?;
        // llama.cpp keeps K and V in f16 by default; round them the same way so greedy
        // decisions follow it (storage stays f32 for candle's CPU matmul).
        let k = k.to_dtype(DType::F16)?.to_dtype(DType::F32)?;
        let v = v.to_dtype(DType::F16)?.to_dtype(DType::F32)?;
        let (k_all, v_all) = cache.append(layer, &k, &v)?;
        let kv_len = k_all.dim(2)?;

        // Query heads of one KV group are adjacent, so (1, n_head, L, d) reshapes to
        // (1, n_kv_head, group·L, d) and attends against the KV head without copying it.
        let q = q.reshape((1, cfg.n_kv_head, group * seq_len, cfg.head_dim))?;
        let scale = 1.0 / (cfg.head_dim as f64).sqrt();
        let att = (q.matmul(&k_all.t()?)? * scale)?;
        let att = match mask {
            Some(mask) => att
                .reshape((1, cfg.n_kv_head, group, seq_len, kv_len))?
                .broadcast_add(mask)?
                .reshape((1, cfg.n_kv_head, group * seq_len, kv_len))?,
            None => att,
        };
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        let y = att.matmul(&v_all)?; // (1, n_kv_head, group·L, d)
        let y = y
            .reshape((1, cfg.n_head, seq_len, cfg.head_dim))?
            .transpose(1, 2)?
            .reshape((1, seq_len, cfg.n_head * cfg.head_dim))?;
        block.attn_output.forward(&y)
    }

    /// Applies RoPE to `x` `(1, heads, L, head_dim)` in the adjacent-pair layout.
    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        let cfg = &self.config;
        if cfg.rope_dim == cfg.head_dim {
            candle_nn::rotary_emb::rope_i(x, cos, sin)
        } else {
            let rot = x.narrow(D::Minus1, 0, cfg.rope_dim)?.contiguous()?;
            let pass = x.narrow(D::Minus1, cfg.rope_dim, cfg.head_dim - cfg.rope_dim)?;
            let rot = candle_nn::rotary_emb::rope_i(&rot, cos, sin)?;
            Tensor::cat(&[&rot, &pass], D::Minus1)?.contiguous()
        }
    }
}

/// Additive causal mask `(L, start + L)`: 0 where key `j ≤ start + i`, -inf after.
fn causal_mask(seq_len: usize, start: usize, device: &Device) -> candle_core::Result<Tensor> {
    let kv_len = start + seq_len;
    let mask: Vec<f32> = (0..seq_len)
        .flat_map(|i| {
            (0..kv_len).map(move |j| {
                if j <= start + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (seq_len, kv_len), device)
}
