//! Llama-family decoder (Llama, Mistral, SmolLM) over GGUF weights.
//!
//! Follows llama.cpp's `LLM_ARCH_LLAMA` graph (src/models/llama.cpp) and candle's
//! `quantized_llama.rs`: pre-norm blocks with RMSNorm, grouped-query attention with
//! RoPE in the "normal" (adjacent-pair, GPT-J style) layout that GGUF llama files use,
//! and a SwiGLU MLP. Tensor names mirror the file (`blk.N.attn_q.weight`, ...).

use candle_core::quantized::{QMatMul, QTensor};

use super::q4_1::Q4_1Matrix;
use super::q8_0::Q8_0Matrix;
use candle_core::{DType, Device, Module, Tensor, D};

use super::paged::{attend_cpu, AttnShape, ForwardSeq, KvBlockPool, SoloKv};

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

/// A weight matrix `(out, in)` applied as `y = x · Wᵀ`: candle's quantized matmul, or
/// our Q4_1 / Q8_0 kernels (ggml numerics).
#[derive(Debug)]
pub(super) enum Linear {
    /// candle `QMatMul` (F32, other ggml types, or Q4_1/Q8_0 under the non-native
    /// policies and on other devices).
    Candle(QMatMul),
    /// Q4_1 through [`Q4_1Matrix`].
    Q4_1(Q4_1Matrix),
    /// Q8_0 through [`Q8_0Matrix`].
    Q8_0(Q8_0Matrix),
}

impl Linear {
    /// `x` `(..., in)` → `(..., out)`.
    pub(super) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Linear::Candle(m) => m.forward(x),
            Linear::Q4_1(m) => m.forward(x),
            Linear::Q8_0(m) => m.forward(x),
        }
    }

    /// `xs` `(rows, in)` row-major on the host → `(rows, out)`.
    ///
    /// # Errors
    /// A candle error (the candle variant on a non-CPU device, shape mismatch).
    pub(super) fn forward_host(&self, xs: &[f32], rows: usize) -> candle_core::Result<Vec<f32>> {
        match self {
            Linear::Q4_1(m) => Ok(m.matmul_host(xs, rows)),
            Linear::Q8_0(m) => Ok(m.matmul_host(xs, rows)),
            Linear::Candle(m) => {
                let k = xs.len().checked_div(rows).unwrap_or(0);
                let x = Tensor::from_slice(xs, (rows, k), &Device::Cpu)?;
                m.forward(&x)?.flatten_all()?.to_vec1::<f32>()
            }
        }
    }
}

/// The query, key and value projections of a block.
#[derive(Debug)]
pub(super) enum Qkv {
    /// Three matrices `(n_head·d, e)`, `(n_kv_head·d, e)`, `(n_kv_head·d, e)`.
    Separate { q: Linear, k: Linear, v: Linear },
    /// One Q4_1 matrix with the rows of q, then k, then v.
    Fused(Q4_1Matrix),
}

/// The gate and up projections of a block's SwiGLU MLP.
#[derive(Debug)]
pub(super) enum Mlp {
    /// Two matrices `(n_ff, e)`.
    Separate { gate: Linear, up: Linear },
    /// One Q4_1 matrix `(2·n_ff, e)`: the gate rows, then the up rows.
    Fused(Q4_1Matrix),
}

/// Where token embeddings come from.
#[derive(Debug)]
pub(super) enum TokenEmbedding {
    /// `token_embd.weight` `(vocab, n_embd)` as a candle tensor; rows are dequantized on
    /// lookup.
    Candle(QTensor),
    /// The rows of the tied output head ([`Linear::Q8_0`]), one copy for both.
    TiedOutput,
}

/// The weights of one transformer block.
#[derive(Debug)]
pub(super) struct Block {
    pub attn_norm: Tensor,
    /// `attn_norm` on the host, for the CPU path.
    pub attn_norm_host: Vec<f32>,
    pub qkv: Qkv,
    pub attn_output: Linear,
    pub ffn_norm: Tensor,
    /// `ffn_norm` on the host.
    pub ffn_norm_host: Vec<f32>,
    pub mlp: Mlp,
    pub ffn_down: Linear,
    /// MLP width (`feed_forward_length`).
    pub n_ff: usize,
}

impl Block {
    /// `(q, k, v)` for `h` `(1, T, e)` with tensor ops.
    fn qkv_tensor(
        &self,
        h: &Tensor,
        n_q: usize,
        n_kv: usize,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        match &self.qkv {
            Qkv::Separate { q, k, v } => Ok((q.forward(h)?, k.forward(h)?, v.forward(h)?)),
            Qkv::Fused(m) => {
                let all = m.forward(h)?;
                Ok((
                    all.narrow(D::Minus1, 0, n_q)?.contiguous()?,
                    all.narrow(D::Minus1, n_q, n_kv)?.contiguous()?,
                    all.narrow(D::Minus1, n_q + n_kv, n_kv)?.contiguous()?,
                ))
            }
        }
    }

    /// `silu(gate(h)) · up(h)` with tensor ops.
    fn mlp_tensor(&self, h: &Tensor, n_ff: usize) -> candle_core::Result<Tensor> {
        let (gate, up) = match &self.mlp {
            Mlp::Separate { gate, up } => (gate.forward(h)?, up.forward(h)?),
            Mlp::Fused(m) => {
                let all = m.forward(h)?;
                (
                    all.narrow(D::Minus1, 0, n_ff)?.contiguous()?,
                    all.narrow(D::Minus1, n_ff, n_ff)?.contiguous()?,
                )
            }
        };
        candle_nn::ops::silu(&gate)? * up
    }

    /// `(q, k, v)` row-major for host rows `h` `(n, e)`.
    fn qkv_host(
        &self,
        h: &[f32],
        n: usize,
        n_q: usize,
        n_kv: usize,
    ) -> candle_core::Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        match &self.qkv {
            Qkv::Separate { q, k, v } => Ok((
                q.forward_host(h, n)?,
                k.forward_host(h, n)?,
                v.forward_host(h, n)?,
            )),
            Qkv::Fused(m) => {
                let all = m.matmul_host(h, n);
                let width = n_q + 2 * n_kv;
                let (mut q, mut k, mut v) = (
                    Vec::with_capacity(n * n_q),
                    Vec::with_capacity(n * n_kv),
                    Vec::with_capacity(n * n_kv),
                );
                for row in all.chunks_exact(width) {
                    q.extend_from_slice(&row[..n_q]);
                    k.extend_from_slice(&row[n_q..n_q + n_kv]);
                    v.extend_from_slice(&row[n_q + n_kv..]);
                }
                Ok((q, k, v))
            }
        }
    }

    /// `silu(gate(h)) · up(h)` `(n, n_ff)` for host rows `h` `(n, e)`, with candle's
    /// `silu` arithmetic (`g / (1 + exp(-g))`, then the product).
    fn mlp_host(&self, h: &[f32], n: usize, n_ff: usize) -> candle_core::Result<Vec<f32>> {
        let silu_mul = |g: f32, u: f32| (g / (1.0 + (-g).exp())) * u;
        match &self.mlp {
            Mlp::Separate { gate, up } => {
                let g = gate.forward_host(h, n)?;
                let u = up.forward_host(h, n)?;
                Ok(g.iter().zip(&u).map(|(&g, &u)| silu_mul(g, u)).collect())
            }
            Mlp::Fused(m) => {
                let all = m.matmul_host(h, n);
                let mut out = vec![0f32; n * n_ff];
                let row = |r: usize, dst: &mut [f32]| {
                    let (g, u) = all[r * 2 * n_ff..(r + 1) * 2 * n_ff].split_at(n_ff);
                    for ((d, &g), &u) in dst.iter_mut().zip(g).zip(u) {
                        *d = silu_mul(g, u);
                    }
                };
                // One `exp` per value: worth the team from a few rows on.
                if n >= 4 {
                    super::team::for_each_chunk_mut(&mut out, n_ff, row);
                } else {
                    out.chunks_exact_mut(n_ff)
                        .enumerate()
                        .for_each(|(r, d)| row(r, d));
                }
                Ok(out)
            }
        }
    }
}

/// candle's `rms_norm` on host rows: per row of `x` `(n, e)`,
/// `y = x / sqrt(Σx²/e + ε) · α`, the sum sequential in f32 (Zhang & Sennrich 2019).
fn rms_norm_host(x: &[f32], alpha: &[f32], eps: f32, out: &mut Vec<f32>) {
    let e = alpha.len();
    out.clear();
    for row in x.chunks_exact(e) {
        let sum2 = row.iter().map(|&v| v * v).sum::<f32>();
        let m = (sum2 / e as f32 + eps).sqrt();
        out.extend(row.iter().zip(alpha).map(|(&v, &a)| v / m * a));
    }
}

/// A loaded llama-family model. Immutable after loading: all per-sequence state is in
/// the [`KvCache`] passed to [`LlamaModel::forward`].
#[derive(Debug)]
pub struct LlamaModel {
    pub(super) config: LlamaConfig,
    /// Token embeddings `(vocab, n_embd)`.
    pub(super) token_embd: TokenEmbedding,
    pub(super) blocks: Vec<Block>,
    pub(super) output_norm: Tensor,
    /// `output_norm` on the host.
    pub(super) output_norm_host: Vec<f32>,
    /// `output.weight`, or `token_embd.weight` when the embeddings are tied.
    pub(super) output: Linear,
    /// RoPE tables, `(context_length, rope_dim / 2)`.
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    /// The same tables on the host, row-major, for the CPU path.
    pub(super) cos_host: Vec<f32>,
    pub(super) sin_host: Vec<f32>,
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

    /// Runs `tokens` (positions `cache.len() .. cache.len() + tokens.len()`) of a single
    /// sequence through the model, appending their K/V to `cache`, and returns the
    /// logits of the last position, shape `(vocab_size,)`, f32.
    ///
    /// # Errors
    /// A candle error, no tokens, or the context window would be exceeded.
    pub fn forward(&self, tokens: &[u32], cache: &mut SoloKv) -> candle_core::Result<Tensor> {
        let (pool, table, start) = cache.reserve(tokens.len())?;
        let seq = ForwardSeq {
            tokens,
            start_pos: start,
            block_table: table,
            want_logits: true,
        };
        let logits = self.forward_batch(&[seq], pool)?;
        cache.advance(tokens.len());
        match logits {
            Some(l) => l.squeeze(0),
            None => candle_core::bail!("forward produced no logits"),
        }
    }

    /// One forward pass over a batch of sequences: every sequence's new tokens (decode
    /// tokens and prefill chunks alike) go through each layer together, their K/V are
    /// written into `pool` at the slots their block tables give, and each sequence
    /// attends over its own positions only.
    ///
    /// Returns the logits of the last token of every sequence with `want_logits`, in
    /// batch order, `(n_wanted, vocab_size)` f32, or `None` when none wants logits.
    /// Each row equals what the sequence would get alone in the batch, bit for bit
    /// (every kernel computes a row independently of the other rows).
    ///
    /// # Errors
    /// A candle error; an empty sequence; positions beyond the context window; a block
    /// table too short or naming a block outside the pool.
    pub fn forward_batch(
        &self,
        seqs: &[ForwardSeq<'_>],
        pool: &mut KvBlockPool,
    ) -> candle_core::Result<Option<Tensor>> {
        let Some(BatchInputs {
            ids,
            positions,
            wanted,
        }) = self.batch_inputs(seqs, pool)?
        else {
            return Ok(None);
        };
        if pool.is_host() && self.device.is_cpu() {
            self.forward_host(&ids, &positions, &wanted, seqs, pool)
        } else {
            self.forward_ops(&ids, &positions, &wanted, seqs, pool)
        }
    }

    /// [`Self::forward_batch`] through the tensor-ops path even for a host pool: the
    /// reference the host path is tested against (same results, bit for bit).
    ///
    /// # Errors
    /// As [`Self::forward_batch`].
    #[doc(hidden)]
    pub fn forward_batch_ops(
        &self,
        seqs: &[ForwardSeq<'_>],
        pool: &mut KvBlockPool,
    ) -> candle_core::Result<Option<Tensor>> {
        match self.batch_inputs(seqs, pool)? {
            Some(b) => self.forward_ops(&b.ids, &b.positions, &b.wanted, seqs, pool),
            None => Ok(None),
        }
    }

    /// Checks the batch (no empty sequence, positions within the context window, block
    /// tables inside the pool) and flattens it: token ids and positions in batch order,
    /// and the rows whose logits are wanted. `None` for a batch without tokens.
    fn batch_inputs(
        &self,
        seqs: &[ForwardSeq<'_>],
        pool: &KvBlockPool,
    ) -> candle_core::Result<Option<BatchInputs>> {
        let ctx = self.config.context_length;
        let mut b = BatchInputs {
            ids: Vec::new(),
            positions: Vec::new(),
            wanted: Vec::new(),
        };
        for s in seqs {
            if s.tokens.is_empty() {
                candle_core::bail!("forward_batch: a sequence has no tokens");
            }
            let end = s.start_pos + s.tokens.len();
            if end > ctx {
                candle_core::bail!(
                    "positions {}..{end} exceed the context window of {ctx} tokens",
                    s.start_pos
                );
            }
            pool.check_table(s)?;
            b.ids.extend_from_slice(s.tokens);
            b.positions.extend((s.start_pos..end).map(|p| p as u32));
            if s.want_logits {
                b.wanted.push((b.ids.len() - 1) as u32);
            }
        }
        Ok((!b.ids.is_empty()).then_some(b))
    }

    /// Embeddings of `ids`, `(T, n_embd)` row-major on the host.
    fn embed_host(&self, ids: &[u32]) -> candle_core::Result<Vec<f32>> {
        match (&self.token_embd, &self.output) {
            (TokenEmbedding::TiedOutput, Linear::Q8_0(m)) => m.rows_dequantized(ids),
            (TokenEmbedding::Candle(t), _) => {
                let ids = Tensor::new(ids, &self.device)?;
                t.embedding(&ids)?.flatten_all()?.to_vec1::<f32>()
            }
            (TokenEmbedding::TiedOutput, _) => {
                candle_core::bail!("tied embeddings without a Q8_0 output head")
            }
        }
    }

    /// The CPU forward pass on host memory (no tensor ops between the kernels): the
    /// same operations and roundings as [`Self::forward_ops`] with a host pool, bit for
    /// bit (tested), with the fused projections and fewer allocations.
    fn forward_host(
        &self,
        ids: &[u32],
        positions: &[u32],
        wanted: &[u32],
        seqs: &[ForwardSeq<'_>],
        pool: &mut KvBlockPool,
    ) -> candle_core::Result<Option<Tensor>> {
        let cfg = &self.config;
        let n = ids.len();
        let (e, n_q, n_kv) = (
            cfg.n_embd,
            cfg.n_head * cfg.head_dim,
            cfg.n_kv_head * cfg.head_dim,
        );
        let shape = AttnShape {
            n_head: cfg.n_head,
            n_kv_head: cfg.n_kv_head,
            head_dim: cfg.head_dim,
            scale: (1.0 / (cfg.head_dim as f64).sqrt()) as f32,
        };
        let mut x = self.embed_host(ids)?;
        let mut h = Vec::with_capacity(n * e);
        for (layer, block) in self.blocks.iter().enumerate() {
            rms_norm_host(&x, &block.attn_norm_host, cfg.rms_eps, &mut h);
            let (mut q, mut k, v) = block.qkv_host(&h, n, n_q, n_kv)?;
            self.rope_host(&mut q, cfg.n_head, positions);
            self.rope_host(&mut k, cfg.n_kv_head, positions);
            pool.write_host(layer, seqs, &k, &v)?;
            let y = attend_cpu(pool, layer, seqs, &q, shape)?;
            let o = block.attn_output.forward_host(&y, n)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            rms_norm_host(&x, &block.ffn_norm_host, cfg.rms_eps, &mut h);
            let n_ff = block.n_ff;
            let act = block.mlp_host(&h, n, n_ff)?;
            let d = block.ffn_down.forward_host(&act, n)?;
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
        if wanted.is_empty() {
            return Ok(None);
        }
        let mut last = Vec::with_capacity(wanted.len() * e);
        for &r in wanted {
            let r = r as usize;
            last.extend_from_slice(&x[r * e..(r + 1) * e]);
        }
        rms_norm_host(
            &last.clone(),
            &self.output_norm_host,
            cfg.rms_eps,
            &mut last,
        );
        let logits = self.output.forward_host(&last, wanted.len())?;
        let vocab = logits.len() / wanted.len();
        Ok(Some(Tensor::from_vec(
            logits,
            (wanted.len(), vocab),
            &Device::Cpu,
        )?))
    }

    /// The forward pass with candle tensor ops (any device; on the CPU with a
    /// tensor-backed pool in tests).
    fn forward_ops(
        &self,
        ids: &[u32],
        positions: &[u32],
        wanted: &[u32],
        seqs: &[ForwardSeq<'_>],
        pool: &mut KvBlockPool,
    ) -> candle_core::Result<Option<Tensor>> {
        let n = ids.len();
        // (T, n_embd) -> (1, T, n_embd)
        let mut x = match &self.token_embd {
            TokenEmbedding::Candle(t) => t.embedding(&Tensor::new(ids, &self.device)?)?,
            TokenEmbedding::TiedOutput => {
                let rows = self.embed_host(ids)?;
                Tensor::from_vec(rows, (n, self.config.n_embd), &self.device)?
            }
        }
        .unsqueeze(0)?;
        let rope = if pool.is_host() {
            Rope::Host(positions)
        } else {
            let pos = Tensor::new(positions, &self.device)?;
            Rope::Device(
                self.cos.index_select(&pos, 0)?,
                self.sin.index_select(&pos, 0)?,
            )
        };
        for (layer, block) in self.blocks.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &block.attn_norm, self.config.rms_eps)?;
            let attn = self.attention(block, layer, &h, n, seqs, &rope, pool)?;
            x = (x + attn)?;
            let h = candle_nn::ops::rms_norm(&x, &block.ffn_norm, self.config.rms_eps)?;
            let n_ff = block.n_ff;
            x = (x + block.ffn_down.forward(&block.mlp_tensor(&h, n_ff)?)?)?;
        }
        if wanted.is_empty() {
            return Ok(None);
        }
        let rows = Tensor::new(wanted, &self.device)?;
        let last = x.squeeze(0)?.index_select(&rows, 0)?;
        let last = candle_nn::ops::rms_norm(&last, &self.output_norm, self.config.rms_eps)?;
        let logits = self.output.forward(&last)?;
        Ok(Some(logits.to_dtype(DType::F32)?))
    }

    /// Grouped-query self-attention of one block over the batch. `h` is
    /// `(1, T, n_embd)`; returns the attention output after `attn_output`, `(1, T, n_embd)`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        block: &Block,
        layer: usize,
        h: &Tensor,
        n: usize,
        seqs: &[ForwardSeq<'_>],
        rope: &Rope<'_>,
        pool: &mut KvBlockPool,
    ) -> candle_core::Result<Tensor> {
        let cfg = &self.config;
        let (q, k, v) =
            block.qkv_tensor(h, cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim)?;
        let y = match rope {
            Rope::Host(positions) => {
                let mut q = q.flatten_all()?.to_vec1::<f32>()?;
                let mut k = k.flatten_all()?.to_vec1::<f32>()?;
                let v = v.flatten_all()?.to_vec1::<f32>()?;
                self.rope_host(&mut q, cfg.n_head, positions);
                self.rope_host(&mut k, cfg.n_kv_head, positions);
                // Stored as f16 like llama.cpp's default KV cache type.
                pool.write_host(layer, seqs, &k, &v)?;
                let shape = AttnShape {
                    n_head: cfg.n_head,
                    n_kv_head: cfg.n_kv_head,
                    head_dim: cfg.head_dim,
                    scale: (1.0 / (cfg.head_dim as f64).sqrt()) as f32,
                };
                let y = attend_cpu(pool, layer, seqs, &q, shape)?;
                Tensor::from_vec(y, (1, n, cfg.n_head * cfg.head_dim), &self.device)?
            }
            Rope::Device(cos, sin) => {
                self.attention_device(layer, q, k, v, n, seqs, cos, sin, pool)?
            }
        };
        block.attn_output.forward(&y)
    }

    /// Attention on a non-CPU device with candle ops: K/V go into the device pool, then
    /// each sequence gathers its slots and attends with a causal mask.
    #[allow(clippy::too_many_arguments)]
    fn attention_device(
        &self,
        layer: usize,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        n: usize,
        seqs: &[ForwardSeq<'_>],
        cos: &Tensor,
        sin: &Tensor,
        pool: &mut KvBlockPool,
    ) -> candle_core::Result<Tensor> {
        let cfg = &self.config;
        let group = cfg.n_head / cfg.n_kv_head;
        // (1, T, heads·d) -> (1, heads, T, d) for rope_i with per-row positions.
        let q = q
            .reshape((1, n, cfg.n_head, cfg.head_dim))?
            .transpose(1, 2)?
            .contiguous()?;
        let k = k
            .reshape((1, n, cfg.n_kv_head, cfg.head_dim))?
            .transpose(1, 2)?
            .contiguous()?;
        let q = self.rope(&q, cos, sin)?;
        let k = self.rope(&k, cos, sin)?;
        // (1, kvh, T, d) -> (T, kvh, d) for the slot writes.
        let k_rows = k.squeeze(0)?.transpose(0, 1)?.contiguous()?;
        let v_rows = v.reshape((n, cfg.n_kv_head, cfg.head_dim))?;
        pool.write_device(layer, seqs, &k_rows, &v_rows)?;
        let scale = 1.0 / (cfg.head_dim as f64).sqrt();
        let mut outs = Vec::with_capacity(seqs.len());
        let mut row = 0;
        for s in seqs {
            let len = s.tokens.len();
            let kv_len = s.start_pos + len;
            let (k_all, v_all) = pool.gather_device(layer, s.block_table, kv_len)?;
            // (1, n_head, len, d) -> (n_kv_head, group·len, d): query heads of one KV
            // group are adjacent.
            let qs = q.narrow(2, row, len)?.contiguous()?.reshape((
                cfg.n_kv_head,
                group * len,
                cfg.head_dim,
            ))?;
            let att = (qs.matmul(&k_all.t()?)? * scale)?;
            let att = if len > 1 {
                let mask = causal_mask(len, s.start_pos, &self.device)?;
                att.reshape((cfg.n_kv_head, group, len, kv_len))?
                    .broadcast_add(&mask)?
                    .reshape((cfg.n_kv_head, group * len, kv_len))?
            } else {
                att
            };
            let att = candle_nn::ops::softmax_last_dim(&att)?;
            let y = att
                .matmul(&v_all)?
                .reshape((cfg.n_head, len, cfg.head_dim))?
                .transpose(0, 1)?
                .reshape((len, cfg.n_head * cfg.head_dim))?;
            outs.push(y);
            row += len;
        }
        Tensor::cat(&outs, 0)?.unsqueeze(0)
    }

    /// RoPE in place on host rows `(T, heads · head_dim)`, row `t` at `positions[t]`,
    /// with candle's `rope_i` arithmetic (adjacent pairs; dimensions past `rope_dim`
    /// pass through).
    fn rope_host(&self, x: &mut [f32], heads: usize, positions: &[u32]) {
        let cfg = &self.config;
        let half = cfg.rope_dim / 2;
        for (t, &pos) in positions.iter().enumerate() {
            let cos = &self.cos_host[pos as usize * half..(pos as usize + 1) * half];
            let sin = &self.sin_host[pos as usize * half..(pos as usize + 1) * half];
            for h in 0..heads {
                let base = (t * heads + h) * cfg.head_dim;
                let row = &mut x[base..base + cfg.rope_dim];
                for i in 0..half {
                    let (a, b) = (row[2 * i], row[2 * i + 1]);
                    row[2 * i] = a * cos[i] - b * sin[i];
                    row[2 * i + 1] = a * sin[i] + b * cos[i];
                }
            }
        }
    }

    /// Applies RoPE to `x` `(1, heads, L, head_dim)` in the adjacent-pair layout; `cos`
    /// and `sin` are `(L, rope_dim / 2)`, one row per position.
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

/// A batch flattened for one forward pass (see [`LlamaModel::batch_inputs`]).
struct BatchInputs {
    /// Token ids, `(T,)`, sequences in batch order.
    ids: Vec<u32>,
    /// Position of each token.
    positions: Vec<u32>,
    /// Rows of `ids` whose logits are returned (each a sequence's last token).
    wanted: Vec<u32>,
}

/// Where RoPE angles come from in one forward pass.
enum Rope<'a> {
    /// Host tables indexed by these positions (CPU pool).
    Host(&'a [u32]),
    /// `cos` and `sin` rows gathered for the batch's positions, each `(T, rope_dim / 2)`.
    Device(Tensor, Tensor),
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
