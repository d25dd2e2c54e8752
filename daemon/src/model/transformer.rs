//! The one decoder loop. [`Model::forward_batch`] runs any [`ModelSpec`] over a batch of
//! sequences through a [`Backend`]: host memory on the CPU ([`super::host`]), candle
//! tensor ops elsewhere ([`super::ops`]). The loop is written once; the backends only
//! implement its steps.
//!
//! Per block (transformers' `*DecoderLayer.forward`; llama.cpp `src/models/*.cpp`):
//! `h = norm(x)`, q/k/v (+bias), per-head q/k norm, RoPE, paged attention (causal,
//! sliding window per layer), output projection (+ post-norm), residual; `h = norm(x)`,
//! gated MLP or MoE (+ post-norm), residual. Then the final norm, the output head and
//! the optional soft-cap, for the rows asked.

use candle_core::{Device, Tensor};

use super::kv_pool::{ForwardSeq, KvBlockPool, KvDtype, KvLayout, SoloKv};
use super::layers::Linear;
use super::matrix::Matrix;
use super::rope::RopeTable;
use super::spec::{Activation, ModelSpec};
use super::weights::{LayerWeights, MoeWeights, Projection, Vector, Weights};

/// Attention parameters of one layer (defined beside the CPU attention kernels).
pub use inferd_kernels::attention::AttnShape;

/// The steps of the decoder loop on one kind of memory. `Act` holds activations of the
/// batch's `T` tokens, `(T, width)`.
pub trait Backend {
    /// Activations.
    type Act;
    /// Embedding rows of `ids`, `(T, n_embd)`.
    fn embed(&mut self, m: &Matrix, ids: &[u32]) -> candle_core::Result<Self::Act>;
    /// `x` with rows `row .. row + k` replaced by `values` (`k · width` f32) for each
    /// `(row, values)`: image features in place of their placeholder tokens.
    fn set_rows(
        &mut self,
        x: Self::Act,
        rows: &[(usize, &[f32])],
    ) -> candle_core::Result<Self::Act>;
    /// `x · s`.
    fn scale(&mut self, x: Self::Act, s: f32) -> candle_core::Result<Self::Act>;
    /// RMSNorm of each row (`x / √(mean(x²) + ε) · w`; Zhang & Sennrich 2019).
    fn rms_norm(&mut self, x: &Self::Act, w: &Vector, eps: f32) -> candle_core::Result<Self::Act>;
    /// RMSNorm of each `head_dim` slice of each row (q/k norm).
    fn head_norm(
        &mut self,
        x: Self::Act,
        w: &Vector,
        eps: f32,
        heads: usize,
    ) -> candle_core::Result<Self::Act>;
    /// The projections of `x`, one activation per part.
    fn project(&mut self, x: &Self::Act, p: &Projection) -> candle_core::Result<Vec<Self::Act>>;
    /// `x · Wᵀ` through the linear layer.
    fn matmul(&mut self, x: &Self::Act, m: &Linear) -> candle_core::Result<Self::Act>;
    /// `x + b` per row.
    fn add_bias(&mut self, x: Self::Act, b: &Vector) -> candle_core::Result<Self::Act>;
    /// `x += y`.
    fn add(&mut self, x: &mut Self::Act, y: &Self::Act) -> candle_core::Result<()>;
    /// RoPE on q or k rows of `heads` heads.
    fn rope(
        &mut self,
        x: Self::Act,
        heads: usize,
        head_dim: usize,
        table: &RopeTable,
    ) -> candle_core::Result<Self::Act>;
    /// Writes k/v of `layer` into the pool and attends; `(T, n_head · head_dim)`.
    fn attention(
        &mut self,
        layer: usize,
        q: Self::Act,
        k: Self::Act,
        v: Self::Act,
        shape: AttnShape,
    ) -> candle_core::Result<Self::Act>;
    /// `act(gate) · up` for gate and up `(T, n)`.
    fn glu(
        &mut self,
        gate: Self::Act,
        up: Self::Act,
        act: Activation,
    ) -> candle_core::Result<Self::Act>;
    /// The gated MLP's input to `down`: `act(x · Gᵀ) · (x · Uᵀ)` from the gate/up
    /// projection (its two parts through [`Self::project`] and [`Self::glu`]; a backend
    /// may skip splitting a fused product).
    fn gated(
        &mut self,
        x: &Self::Act,
        gate_up: &Projection,
        act: Activation,
    ) -> candle_core::Result<Self::Act>
    where
        Self: Sized,
    {
        project_then_glu(self, x, gate_up, act)
    }
    /// The MoE MLP of `x`.
    fn moe(
        &mut self,
        x: &Self::Act,
        w: &MoeWeights,
        spec: &ModelSpec,
    ) -> candle_core::Result<Self::Act>;
    /// Rows `rows` of `x`.
    fn rows(&mut self, x: &Self::Act, rows: &[u32]) -> candle_core::Result<Self::Act>;
    /// Rows `rows` of `x` as the last block's feed-forward input: as llama.cpp
    /// (`inp_out_ids` in `src/models/*.cpp`), the last block's feed-forward runs on the
    /// rows whose logits are wanted only, each as the one output row of llama-server's
    /// step for a single sequence. Backends that choose kernels per row switch here.
    fn output_rows(&mut self, x: &Self::Act, rows: &[u32]) -> candle_core::Result<Self::Act> {
        self.rows(x, rows)
    }
    /// Logits `(rows, vocab)` f32 as a tensor, soft-capped when `cap` is set.
    fn logits(
        &mut self,
        x: Self::Act,
        rows: usize,
        cap: Option<f32>,
    ) -> candle_core::Result<Tensor>;
}

/// A loaded model: spec, weights and RoPE tables. Immutable; per-sequence state is in
/// the KV pool passed to [`Model::forward_batch`].
#[derive(Debug)]
pub struct Model {
    pub(super) spec: ModelSpec,
    pub(super) weights: Weights,
    /// Distinct RoPE tables (global; local when its base differs).
    pub(super) rope: Vec<RopeTable>,
    /// Index into `rope` per layer.
    pub(super) layer_rope: Vec<usize>,
    /// Element type of this model's KV cache.
    pub(super) kv_dtype: KvDtype,
    pub(super) device: Device,
}

/// A batch flattened for one forward pass.
pub(super) struct BatchInputs {
    /// Token ids `(T,)`, sequences in batch order.
    pub ids: Vec<u32>,
    /// Position of each token.
    pub positions: Vec<u32>,
    /// Rows whose logits are returned.
    pub wanted: Vec<u32>,
}

/// Image rows of the batch, `(row in the batch, values)` ([`super::kv_pool::SeqMedia`]).
fn batch_media_rows<'a>(seqs: &[ForwardSeq<'a>]) -> Vec<(usize, &'a [f32])> {
    let mut out = Vec::new();
    let mut row0 = 0;
    for s in seqs {
        if let Some(m) = s.media {
            out.extend(m.rows.iter().map(|&(r, v)| (row0 + r, v)));
        }
        row0 += s.tokens.len();
    }
    out
}

impl Model {
    /// Builds the model from its parts, with RoPE tables for `spec.context_length`
    /// positions (one table per distinct base).
    ///
    /// # Errors
    /// A device error.
    pub(super) fn new(
        spec: ModelSpec,
        weights: Weights,
        kv_dtype: KvDtype,
        device: &Device,
    ) -> candle_core::Result<Self> {
        let mut rope = vec![RopeTable::new(
            &spec.rope,
            spec.rope.theta,
            true,
            spec.context_length,
            spec.numerics,
            device,
        )?];
        let layer_rope = match spec.rope.local_theta {
            Some(local) => {
                rope.push(RopeTable::new(
                    &spec.rope,
                    local,
                    false,
                    spec.context_length,
                    spec.numerics,
                    device,
                )?);
                spec.window
                    .iter()
                    .map(|w| usize::from(w.is_some()))
                    .collect()
            }
            None => vec![0; spec.n_layer],
        };
        Ok(Self {
            spec,
            weights,
            rope,
            layer_rope,
            kv_dtype,
            device: device.clone(),
        })
    }

    /// The shape and element type of this model's KV cache.
    pub fn kv_layout(&self) -> KvLayout {
        KvLayout {
            n_layer: self.spec.n_layer,
            n_kv_head: self.spec.n_kv_head,
            head_dim: self.spec.head_dim,
            dtype: self.kv_dtype,
        }
    }

    /// The architecture instance.
    pub fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// `(out, in)` of every projection an adapter may target, by site.
    pub fn site_shapes(&self) -> std::collections::HashMap<super::layers::Site, (usize, usize)> {
        self.weights.site_shapes()
    }

    /// The device holding the weights.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Runs `tokens` of a single sequence (positions `cache.len() ..`), appending their
    /// K/V to `cache`; returns the logits of the last position `(vocab,)` f32.
    ///
    /// # Errors
    /// A candle error, no tokens, or the context window would be exceeded.
    pub fn forward(&self, tokens: &[u32], cache: &mut SoloKv) -> candle_core::Result<Tensor> {
        self.forward_with(tokens, cache, None)
    }

    /// [`Self::forward`] with a LoRA adapter applied (`None`: the base model).
    ///
    /// # Errors
    /// As [`Self::forward`].
    pub fn forward_with(
        &self,
        tokens: &[u32],
        cache: &mut SoloKv,
        adapter: Option<super::lora::AdapterUse<'_>>,
    ) -> candle_core::Result<Tensor> {
        let prompt_len = cache.prompt_len(tokens.len());
        let (pool, table, start) = cache.reserve(tokens.len())?;
        let seq = ForwardSeq {
            tokens,
            start_pos: start,
            block_table: table,
            logit_rows: 1,
            prompt_len,
            adapter,
            media: None,
        };
        let logits = self.forward_batch(&[seq], pool)?;
        cache.advance(tokens.len());
        match logits {
            Some(l) => l.squeeze(0),
            None => candle_core::bail!("forward produced no logits"),
        }
    }

    /// One forward pass over a batch: every sequence's new tokens go through each layer
    /// together, their K/V are written into `pool` at the slots their block tables
    /// give, and each sequence attends over its own positions only.
    ///
    /// Returns `(Σ logit_rows, vocab)` f32: for each sequence in batch order, the
    /// logits of its last `logit_rows` positions; `None` when no sequence wants any.
    /// A row equals what the sequence would get alone, bit for bit.
    ///
    /// # Errors
    /// A candle error; an empty sequence; positions beyond the context window; more
    /// logit rows than tokens; a block table too short or naming a block outside the
    /// pool.
    pub fn forward_batch(
        &self,
        seqs: &[ForwardSeq<'_>],
        pool: &mut KvBlockPool,
    ) -> candle_core::Result<Option<Tensor>> {
        let Some(b) = self.batch_inputs(seqs, pool)? else {
            return Ok(None);
        };
        if pool.is_host() && self.device.is_cpu() {
            let mut be =
                super::host::HostBackend::new(pool, seqs, &b.positions, self.spec.numerics);
            self.decode(&mut be, &b, seqs)
        } else {
            self.forward_ops_inner(seqs, pool, &b)
        }
    }

    /// [`Self::forward_batch`] through the tensor-ops backend even for a host pool:
    /// the reference the host backend is tested against (same bits).
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
            Some(b) => self.forward_ops_inner(seqs, pool, &b),
            None => Ok(None),
        }
    }

    fn forward_ops_inner(
        &self,
        seqs: &[ForwardSeq<'_>],
        pool: &mut KvBlockPool,
        b: &BatchInputs,
    ) -> candle_core::Result<Option<Tensor>> {
        let mut be = super::ops::TensorBackend::new(
            pool,
            seqs,
            &b.positions,
            self.spec.numerics,
            &self.device,
        )?;
        self.decode(&mut be, b, seqs)
    }

    /// Checks the batch and flattens it (ids, positions, wanted rows); `None` for a
    /// batch without tokens.
    fn batch_inputs(
        &self,
        seqs: &[ForwardSeq<'_>],
        pool: &KvBlockPool,
    ) -> candle_core::Result<Option<BatchInputs>> {
        let ctx = self.spec.context_length;
        let mut b = BatchInputs {
            ids: Vec::new(),
            positions: Vec::new(),
            wanted: Vec::new(),
        };
        for s in seqs {
            if s.tokens.is_empty() {
                candle_core::bail!("forward_batch: a sequence has no tokens");
            }
            if s.logit_rows > s.tokens.len() {
                candle_core::bail!(
                    "forward_batch: {} logit rows asked of {} tokens",
                    s.logit_rows,
                    s.tokens.len()
                );
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
            let last = b.ids.len() as u32;
            b.wanted.extend(last - s.logit_rows as u32..last);
        }
        Ok((!b.ids.is_empty()).then_some(b))
    }

    /// The decoder loop.
    /// [`Self::forward_batch`] through the tracing backend: every op's output, named as
    /// in llama.cpp's graph (tests only, `model::trace`).
    #[cfg(test)]
    pub(crate) fn forward_traced(
        &self,
        seqs: &[ForwardSeq<'_>],
        pool: &mut KvBlockPool,
    ) -> candle_core::Result<Vec<(String, Vec<f32>)>> {
        let Some(b) = self.batch_inputs(seqs, pool)? else {
            return Ok(Vec::new());
        };
        let host = super::host::HostBackend::new(pool, seqs, &b.positions, self.spec.numerics);
        let mut be = super::trace::TraceBackend::new(host);
        self.decode(&mut be, &b, seqs)?;
        Ok(be.out)
    }

    fn decode<B: Backend>(
        &self,
        be: &mut B,
        b: &BatchInputs,
        seqs: &[ForwardSeq<'_>],
    ) -> candle_core::Result<Option<Tensor>> {
        let s = &self.spec;
        let mut x = be.embed(self.weights.embedding_matrix(), &b.ids)?;
        if let Some(sc) = s.embed_scale {
            x = be.scale(x, sc)?;
        }
        let media = batch_media_rows(seqs);
        if !media.is_empty() {
            for &(r, v) in &media {
                if v.len() % s.n_embd != 0 || r + v.len() / s.n_embd > b.ids.len() {
                    candle_core::bail!(
                        "image rows at {r}: {} values for rows of {} in a batch of {}",
                        v.len(),
                        s.n_embd,
                        b.ids.len()
                    );
                }
            }
            x = be.set_rows(x, &media)?;
        }
        let last_layer = self.weights.layers.len().saturating_sub(1);
        for (l, w) in self.weights.layers.iter().enumerate() {
            let h = be.rms_norm(&x, &w.attn_norm, s.norm_eps)?;
            let o = self.attention_block(be, l, w, &h)?;
            be.add(&mut x, &o)?;
            if l == last_layer {
                // Only the wanted rows go on: their K/V are written, the rest of the
                // last block changes no other row.
                if b.wanted.is_empty() {
                    return Ok(None);
                }
                x = be.output_rows(&x, &b.wanted)?;
            }
            let h = be.rms_norm(&x, &w.ffn_norm, s.norm_eps)?;
            let mut m = match &w.ffn {
                super::weights::Ffn::Dense { gate_up, down } => {
                    let a = be
                        .gated(&h, gate_up, s.activation)
                        .map_err(|e| e.context(format!("layer {l}")))?;
                    be.matmul(&a, down)?
                }
                super::weights::Ffn::Moe(moe) => be.moe(&h, moe, s)?,
            };
            if let Some(n) = &w.post_ffn_norm {
                m = be.rms_norm(&m, n, s.norm_eps)?;
            }
            be.add(&mut x, &m)?;
        }
        if b.wanted.is_empty() {
            return Ok(None);
        }
        if self.weights.layers.is_empty() {
            x = be.output_rows(&x, &b.wanted)?;
        }
        let last = be.rms_norm(&x, &self.weights.output_norm, s.norm_eps)?;
        let logits = be.matmul(&last, &self.weights.output)?;
        be.logits(logits, b.wanted.len(), s.final_softcap).map(Some)
    }

    /// Attention of block `l` on normed rows `h`, through the output projection (and
    /// its post-norm).
    fn attention_block<B: Backend>(
        &self,
        be: &mut B,
        l: usize,
        w: &LayerWeights,
        h: &B::Act,
    ) -> candle_core::Result<B::Act> {
        let s = &self.spec;
        let mut parts = be.project(h, &w.qkv)?.into_iter();
        let (Some(mut q), Some(mut k), Some(mut v)) = (parts.next(), parts.next(), parts.next())
        else {
            candle_core::bail!("layer {l}: q/k/v projection has no three parts");
        };
        if let Some([qb, kb, vb]) = &w.qkv_bias {
            q = be.add_bias(q, qb)?;
            k = be.add_bias(k, kb)?;
            v = be.add_bias(v, vb)?;
        }
        if let Some([qn, kn]) = &w.qk_norm {
            q = be.head_norm(q, qn, s.norm_eps, s.n_head)?;
            k = be.head_norm(k, kn, s.norm_eps, s.n_kv_head)?;
        }
        let table = &self.rope[self.layer_rope[l]];
        let mut q = be.rope(q, s.n_head, s.head_dim, table)?;
        let k = be.rope(k, s.n_kv_head, s.head_dim, table)?;
        let mut scale = s.attn_scale;
        if s.q_prescaled {
            q = be.scale(q, scale)?;
            scale = 1.0;
        }
        let shape = AttnShape {
            n_head: s.n_head,
            n_kv_head: s.n_kv_head,
            head_dim: s.head_dim,
            scale,
            window: s.window[l],
        };
        let y = be.attention(l, q, k, v, shape)?;
        let o = be.matmul(&y, &w.attn_output)?;
        match &w.post_attn_norm {
            Some(n) => be.rms_norm(&o, n, s.norm_eps),
            None => Ok(o),
        }
    }
}

/// [`Backend::gated`] through the two parts: [`Backend::project`], then
/// [`Backend::glu`].
pub(super) fn project_then_glu<B: Backend>(
    be: &mut B,
    x: &B::Act,
    gate_up: &Projection,
    act: Activation,
) -> candle_core::Result<B::Act> {
    let mut parts = be.project(x, gate_up)?.into_iter();
    let (Some(g), Some(u)) = (parts.next(), parts.next()) else {
        candle_core::bail!("gate/up projection has no two parts");
    };
    be.glu(g, u, act)
}
