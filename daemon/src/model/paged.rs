//! Paged KV cache storage and the CPU paged-attention kernel.
//!
//! KV memory is a pool of fixed-size blocks (PagedAttention, Kwon et al. 2023,
//! "Efficient Memory Management for Large Language Model Serving with
//! PagedAttention"): position `p` of a sequence lives in block `table[p / block_size]`,
//! slot `p % block_size`. Which blocks a sequence owns is decided by the scheduler's
//! block manager; the pool only stores values.
//!
//! Keys and values are stored as IEEE f16, like llama.cpp's default `--cache-type-k/v
//! f16`, so a token costs `2 × layers × kv_heads × head_dim × 2` bytes. On the CPU the
//! pool is one host array per layer and attention is computed here ([`attend_cpu`]);
//! on other devices it is one device tensor per layer and the model gathers a
//! sequence's slots with `index_select`.

use candle_core::{DType, Device, Tensor};
use half::f16;
use half::slice::HalfFloatSliceExt;

use super::LlamaConfig;

/// Bytes of one stored K or V element (f16).
pub const KV_ELEMENT_BYTES: usize = 2;

/// One sequence's part of a batched forward pass.
#[derive(Debug, Clone, Copy)]
pub struct ForwardSeq<'a> {
    /// Tokens to run, at positions `start_pos .. start_pos + tokens.len()`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`: the number of this sequence's tokens already in the cache.
    pub start_pos: usize,
    /// Block ids holding positions `0 .. start_pos + tokens.len()` (at least
    /// `⌈(start_pos + len) / block_size⌉` entries).
    pub block_table: &'a [u32],
    /// Whether the logits of the last token are wanted (false for a prefill chunk that
    /// is not the prompt's last).
    pub want_logits: bool,
}

/// Per-layer storage.
#[derive(Debug)]
enum LayerStore {
    /// Host arrays, each `num_blocks × n_kv_head × block_size × head_dim` f16, indexed
    /// `((block · n_kv_head + head) · block_size + slot) · head_dim + d`: one block of one
    /// head is contiguous, so attention reads it in one sweep.
    Host { k: Vec<f16>, v: Vec<f16> },
    /// Device tensors, each `(num_blocks · block_size, n_kv_head, head_dim)` f16, indexed
    /// by slot `block · block_size + offset`.
    Device { k: Tensor, v: Tensor },
}

/// Refuses an empty pool.
fn check_pool_size(block_size: usize, num_blocks: usize) -> candle_core::Result<()> {
    if block_size == 0 || num_blocks == 0 {
        candle_core::bail!(
            "KV block pool needs block_size ≥ 1 and num_blocks ≥ 1 (got {block_size}, {num_blocks})"
        );
    }
    Ok(())
}

/// The KV block pool of one model: `num_blocks` blocks of `block_size` positions for
/// every layer.
#[derive(Debug)]
pub struct KvBlockPool {
    block_size: usize,
    num_blocks: usize,
    n_kv_head: usize,
    head_dim: usize,
    device: Device,
    layers: Vec<LayerStore>,
}

impl KvBlockPool {
    /// A pool of `num_blocks` blocks of `block_size` tokens for a model with `config`.
    /// Host memory is zero-filled here, so the whole budget is resident from start-up
    /// (the daemon checks it against the machine's RAM first).
    ///
    /// # Errors
    /// `block_size` or `num_blocks` is 0, or the device allocation failed.
    pub fn new(
        config: &LlamaConfig,
        block_size: usize,
        num_blocks: usize,
        device: &Device,
    ) -> candle_core::Result<Self> {
        check_pool_size(block_size, num_blocks)?;
        let mut pool = Self {
            block_size,
            num_blocks: 0,
            n_kv_head: config.n_kv_head,
            head_dim: config.head_dim,
            device: device.clone(),
            layers: Vec::with_capacity(config.n_layer),
        };
        for _ in 0..config.n_layer {
            pool.layers.push(pool.empty_layer(0)?);
        }
        pool.grow(num_blocks)?;
        Ok(pool)
    }

    /// Like [`KvBlockPool::new`] but with tensor storage even on the CPU, so the
    /// device attention path (candle ops, used on CUDA) can be tested here.
    ///
    /// # Errors
    /// As [`KvBlockPool::new`].
    pub fn new_tensor_backed(
        config: &LlamaConfig,
        block_size: usize,
        num_blocks: usize,
        device: &Device,
    ) -> candle_core::Result<Self> {
        check_pool_size(block_size, num_blocks)?;
        let shape = (num_blocks * block_size, config.n_kv_head, config.head_dim);
        let layers = (0..config.n_layer)
            .map(|_| {
                Ok(LayerStore::Device {
                    k: Tensor::zeros(shape, DType::F16, device)?,
                    v: Tensor::zeros(shape, DType::F16, device)?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self {
            block_size,
            num_blocks,
            n_kv_head: config.n_kv_head,
            head_dim: config.head_dim,
            device: device.clone(),
            layers,
        })
    }

    fn empty_layer(&self, blocks: usize) -> candle_core::Result<LayerStore> {
        if self.device.is_cpu()
            && self
                .layers
                .first()
                .is_none_or(|l| matches!(l, LayerStore::Host { .. }))
        {
            let n = blocks * self.block_elems();
            Ok(LayerStore::Host {
                k: vec![f16::ZERO; n],
                v: vec![f16::ZERO; n],
            })
        } else {
            let shape = (blocks * self.block_size, self.n_kv_head, self.head_dim);
            Ok(LayerStore::Device {
                k: Tensor::zeros(shape, DType::F16, &self.device)?,
                v: Tensor::zeros(shape, DType::F16, &self.device)?,
            })
        }
    }

    /// Grows the pool to `num_blocks` blocks, keeping the stored values (used by
    /// [`SoloKv`]; the serving pool is sized once).
    ///
    /// # Errors
    /// A device error.
    pub fn grow(&mut self, num_blocks: usize) -> candle_core::Result<()> {
        if num_blocks <= self.num_blocks {
            return Ok(());
        }
        let elems = num_blocks * self.block_elems();
        let extra_blocks = num_blocks - self.num_blocks;
        for i in 0..self.layers.len() {
            let extra = if self.is_host() {
                None
            } else {
                Some(self.empty_layer(extra_blocks)?)
            };
            match (&mut self.layers[i], extra) {
                (LayerStore::Host { k, v }, _) => {
                    k.resize(elems, f16::ZERO);
                    v.resize(elems, f16::ZERO);
                }
                (LayerStore::Device { k, v }, Some(LayerStore::Device { k: ek, v: ev })) => {
                    *k = Tensor::cat(&[&*k, &ek], 0)?;
                    *v = Tensor::cat(&[&*v, &ev], 0)?;
                }
                _ => candle_core::bail!("KV pool storage kind changed while growing"),
            }
        }
        self.num_blocks = num_blocks;
        Ok(())
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Elements of one block of one layer's K (or V): `n_kv_head × block_size × head_dim`.
    fn block_elems(&self) -> usize {
        self.n_kv_head * self.block_size * self.head_dim
    }

    /// Checks that `seq`'s block table covers its positions with valid block ids.
    pub(super) fn check_table(&self, seq: &ForwardSeq<'_>) -> candle_core::Result<()> {
        let end = seq.start_pos + seq.tokens.len();
        let needed = end.div_ceil(self.block_size);
        if seq.block_table.len() < needed {
            candle_core::bail!(
                "block table has {} blocks but positions 0..{end} need {needed} blocks of {}",
                seq.block_table.len(),
                self.block_size
            );
        }
        if let Some(&b) = seq.block_table[..needed]
            .iter()
            .find(|&&b| b as usize >= self.num_blocks)
        {
            candle_core::bail!(
                "block id {b} is out of range (the pool has {} blocks)",
                self.num_blocks
            );
        }
        Ok(())
    }

    /// Slot index (`block · block_size + offset`) of position `pos` under `table`.
    fn slot(&self, table: &[u32], pos: usize) -> usize {
        table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    /// Stores K and V of the batch's new tokens for `layer`. `k` and `v` are host rows
    /// `(T, n_kv_head · head_dim)` f32 (CPU pool) in batch order; values are rounded to
    /// f16.
    pub(super) fn write_host(
        &mut self,
        layer: usize,
        seqs: &[ForwardSeq<'_>],
        k: &[f32],
        v: &[f32],
    ) -> candle_core::Result<()> {
        let (bs, kvh, hd) = (self.block_size, self.n_kv_head, self.head_dim);
        let slots: Vec<usize> = seqs
            .iter()
            .flat_map(|s| (0..s.tokens.len()).map(move |i| (s.block_table, s.start_pos + i)))
            .map(|(t, p)| self.slot(t, p))
            .collect();
        let Some(LayerStore::Host { k: kc, v: vc }) = self.layers.get_mut(layer) else {
            candle_core::bail!("layer {layer}: no host KV storage");
        };
        for (row, slot) in slots.into_iter().enumerate() {
            let (block, off) = (slot / bs, slot % bs);
            for h in 0..kvh {
                let dst = ((block * kvh + h) * bs + off) * hd;
                let src = (row * kvh + h) * hd;
                kc[dst..dst + hd].convert_from_f32_slice(&k[src..src + hd]);
                vc[dst..dst + hd].convert_from_f32_slice(&v[src..src + hd]);
            }
        }
        Ok(())
    }

    /// Stores K and V `(T, n_kv_head, head_dim)` (any float dtype, on the pool's device)
    /// for `layer` on a device pool.
    pub(super) fn write_device(
        &mut self,
        layer: usize,
        seqs: &[ForwardSeq<'_>],
        k: &Tensor,
        v: &Tensor,
    ) -> candle_core::Result<()> {
        let slots: Vec<usize> = seqs
            .iter()
            .flat_map(|s| (0..s.tokens.len()).map(move |i| (s.block_table, s.start_pos + i)))
            .map(|(t, p)| self.slot(t, p))
            .collect();
        let Some(LayerStore::Device { k: kc, v: vc }) = self.layers.get(layer) else {
            candle_core::bail!("layer {layer}: no device KV storage");
        };
        let k = k.to_dtype(DType::F16)?;
        let v = v.to_dtype(DType::F16)?;
        for (row, slot) in slots.into_iter().enumerate() {
            kc.slice_set(&k.narrow(0, row, 1)?, 0, slot)?;
            vc.slice_set(&v.narrow(0, row, 1)?, 0, slot)?;
        }
        Ok(())
    }

    /// K and V of positions `0..len` of a sequence on a device pool, each
    /// `(n_kv_head, len, head_dim)` f32.
    pub(super) fn gather_device(
        &self,
        layer: usize,
        table: &[u32],
        len: usize,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let Some(LayerStore::Device { k, v }) = self.layers.get(layer) else {
            candle_core::bail!("layer {layer}: no device KV storage");
        };
        let slots: Vec<u32> = (0..len).map(|p| self.slot(table, p) as u32).collect();
        let idx = Tensor::new(slots.as_slice(), &self.device)?;
        let k = k
            .index_select(&idx, 0)?
            .transpose(0, 1)?
            .to_dtype(DType::F32)?;
        let v = v
            .index_select(&idx, 0)?
            .transpose(0, 1)?
            .to_dtype(DType::F32)?;
        Ok((k.contiguous()?, v.contiguous()?))
    }

    /// Bytes of one block's K and V over every layer:
    /// `layers × 2 × n_kv_head × block_size × head_dim × 2` (f16).
    pub fn block_bytes(&self) -> usize {
        self.layers.len() * 2 * self.block_elems() * KV_ELEMENT_BYTES
    }

    /// Copies out block `block`'s K and V: for each layer, K then V, each
    /// `(n_kv_head, block_size, head_dim)` f16 little-endian ([`Self::block_bytes`]
    /// bytes). The layout is the same for host and device pools, so it is what the
    /// prefix store persists.
    ///
    /// # Errors
    /// `block` out of range, or a device error.
    pub fn read_block(&self, block: u32) -> candle_core::Result<Vec<u8>> {
        self.check_block(block)?;
        let (b, n) = (block as usize, self.block_elems());
        let mut out = Vec::with_capacity(self.block_bytes());
        for layer in &self.layers {
            match layer {
                LayerStore::Host { k, v } => {
                    for part in [&k[b * n..(b + 1) * n], &v[b * n..(b + 1) * n]] {
                        out.extend(part.iter().flat_map(|x| x.to_bits().to_le_bytes()));
                    }
                }
                LayerStore::Device { k, v } => {
                    for t in [k, v] {
                        let vals = t
                            .narrow(0, b * self.block_size, self.block_size)?
                            .transpose(0, 1)?
                            .flatten_all()?
                            .to_vec1::<f16>()?;
                        for x in vals {
                            out.extend_from_slice(&x.to_le_bytes());
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// Overwrites block `block`'s K and V with `bytes` in the layout of
    /// [`Self::read_block`].
    ///
    /// # Errors
    /// `block` out of range, `bytes` not [`Self::block_bytes`] long, or a device error.
    pub fn write_block(&mut self, block: u32, bytes: &[u8]) -> candle_core::Result<()> {
        self.check_block(block)?;
        if bytes.len() != self.block_bytes() {
            candle_core::bail!(
                "KV block data is {} bytes, a block of this model is {}",
                bytes.len(),
                self.block_bytes()
            );
        }
        let (b, n) = (block as usize, self.block_elems());
        let (bs, kvh, hd) = (self.block_size, self.n_kv_head, self.head_dim);
        let device = self.device.clone();
        let half_of = |chunk: &[u8]| -> Vec<f16> {
            chunk
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]))
                .collect()
        };
        let mut parts = bytes.chunks_exact(n * KV_ELEMENT_BYTES);
        for layer in &mut self.layers {
            let (Some(kb), Some(vb)) = (parts.next(), parts.next()) else {
                candle_core::bail!("KV block data ended early");
            };
            match layer {
                LayerStore::Host { k, v } => {
                    for (dst, src) in [
                        (&mut k[b * n..(b + 1) * n], kb),
                        (&mut v[b * n..(b + 1) * n], vb),
                    ] {
                        for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                            *d = f16::from_bits(u16::from_le_bytes([c[0], c[1]]));
                        }
                    }
                }
                LayerStore::Device { k, v } => {
                    for (dst, src) in [(&*k, kb), (&*v, vb)] {
                        let t = Tensor::from_vec(half_of(src), (kvh, bs, hd), &device)?
                            .transpose(0, 1)?
                            .contiguous()?;
                        dst.slice_set(&t, 0, b * bs)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn check_block(&self, block: u32) -> candle_core::Result<()> {
        if block as usize >= self.num_blocks {
            candle_core::bail!(
                "block id {block} is out of range (the pool has {} blocks)",
                self.num_blocks
            );
        }
        Ok(())
    }

    /// Host K and V arrays of `layer`, or `None` on a device pool.
    fn host_layer(&self, layer: usize) -> Option<(&[f16], &[f16])> {
        match self.layers.get(layer)? {
            LayerStore::Host { k, v } => Some((k, v)),
            LayerStore::Device { .. } => None,
        }
    }

    /// Whether the pool lives in host memory (the CPU attention kernel applies).
    pub fn is_host(&self) -> bool {
        matches!(self.layers.first(), Some(LayerStore::Host { .. }))
    }
}

/// Shapes for [`attend_cpu`].
#[derive(Debug, Clone, Copy)]
pub(super) struct AttnShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Score scale, `1 / √head_dim`.
    pub scale: f32,
}

/// Below this many (query row × key) pairs in a layer the attention runs on the calling
/// thread: handing out tasks costs more than it saves.
const PAR_MIN_PAIRS: usize = 256;

/// Query rows per attention work item.
const ROW_CHUNK: usize = 16;

/// Causal grouped-query attention of one layer over the paged host pool.
///
/// `q` is `(T, n_head · head_dim)` f32 after RoPE, rows in batch order (the rows of
/// `seqs[0]`, then `seqs[1]`, ...). Query row `r` of a sequence sits at position
/// `start_pos + r` and attends to that sequence's positions `0 ..= start_pos + r`
/// (which [`KvBlockPool::write_host`] must already hold). Returns `(T, n_head ·
/// head_dim)` f32.
///
/// Per query head: `s_j = (q · k_j) · scale`, `w = softmax(s)`, `y = Σ_j w_j v_j`, in
/// ascending `j`. Every query row is computed by the same code whatever else is in the
/// batch, so a sequence's output does not depend on its batch company, and a prompt
/// prefilled in chunks gives the same values as one prefilled whole.
///
/// # Errors
/// The pool is not a host pool.
pub(super) fn attend_cpu(
    pool: &KvBlockPool,
    layer: usize,
    seqs: &[ForwardSeq<'_>],
    q: &[f32],
    shape: AttnShape,
) -> candle_core::Result<Vec<f32>> {
    let Some((kc, vc)) = pool.host_layer(layer) else {
        candle_core::bail!("layer {layer}: the CPU attention kernel needs a host KV pool");
    };
    let AttnShape {
        n_head,
        n_kv_head: _,
        head_dim: hd,
        ..
    } = shape;
    let row_width = n_head * hd;
    let mut row0 = Vec::with_capacity(seqs.len());
    let mut acc = 0;
    for s in seqs {
        row0.push(acc);
        acc += s.tokens.len();
    }
    let total_rows = acc;
    // Work items: (sequence, query head, first query row, end row); long prefill chunks
    // are split by rows so both cores share them.
    let work: Vec<(usize, usize, usize, usize)> = (0..seqs.len())
        .flat_map(|i| {
            let rows = seqs[i].tokens.len();
            (0..n_head).flat_map(move |h| {
                (0..rows)
                    .step_by(ROW_CHUNK)
                    .map(move |r0| (i, h, r0, (r0 + ROW_CHUNK).min(rows)))
            })
        })
        .collect();
    let pairs: usize = seqs
        .iter()
        .map(|s| s.tokens.len() * (s.start_pos + s.tokens.len()))
        .sum();
    let run = |&(i, h, r0, r1): &(usize, usize, usize, usize)| -> Vec<f32> {
        attend_head(
            pool,
            kc,
            vc,
            &seqs[i],
            h,
            r0..r1,
            &q[row0[i] * row_width..],
            shape,
            Simd::detect(),
        )
    };
    let outs: Vec<Vec<f32>> = if pairs * n_head >= PAR_MIN_PAIRS && work.len() > 1 {
        super::team::map(work.len(), |i| run(&work[i]))
    } else {
        work.iter().map(run).collect()
    };
    let mut y = vec![0f32; total_rows * row_width];
    for (&(i, h, r0, r1), out) in work.iter().zip(outs) {
        for r in r0..r1 {
            let dst = (row0[i] + r) * row_width + h * hd;
            let src = (r - r0) * hd;
            y[dst..dst + hd].copy_from_slice(&out[src..src + hd]);
        }
    }
    Ok(y)
}

/// Attention of query head `h` for query rows `rows` of `seq`, reading K and V (f16)
/// straight from the sequence's blocks. `q` starts at the sequence's first row.
/// Returns `(rows.len(), head_dim)`.
///
/// The arithmetic is llama.cpp's CPU flash-attention kernel for an f16 KV cache
/// (`ggml_compute_forward_flash_attn_ext_f16_one_chunk` in ggml-cpu/ops.cpp, the path
/// llama-server takes for decode and for prompts under 64 tokens): the query is
/// rounded to f16; `s_j = (q · k_j) · scale` with the products summed in ggml's
/// AVX-512 `ggml_vec_dot_f16` order ([`dot_f16_order`]); an online softmax (Rabe &
/// Staats 2021, arXiv:2112.05682) keeps the running maximum `M`, the sum `S` and the
/// weighted value sum in an f16 accumulator (`acc = f16(fma(v_j, e, acc))`, rescaled by
/// `f16(acc · e^{M_old − M})` when the maximum grows); the output is `acc / S`.
/// Matching its rounding keeps our greedy tokens on llama.cpp's path at near ties.
#[allow(clippy::too_many_arguments)]
fn attend_head(
    pool: &KvBlockPool,
    kc: &[f16],
    vc: &[f16],
    seq: &ForwardSeq<'_>,
    h: usize,
    rows: std::ops::Range<usize>,
    q: &[f32],
    shape: AttnShape,
    simd: Simd,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let g = h / (shape.n_head / shape.n_kv_head);
    let bs = pool.block_size;
    let row_width = shape.n_head * hd;
    let first = rows.start;
    let mut out = vec![0f32; rows.len() * hd];
    let mut qh = vec![0f32; hd];
    // Offset of key/value `j` of this KV head in the layer's arrays, for every key the
    // last row sees.
    let max_keys = seq.start_pos + rows.end;
    let offs: Vec<usize> = (0..max_keys)
        .map(|j| ((seq.block_table[j / bs] as usize * shape.n_kv_head + g) * bs + j % bs) * hd)
        .collect();
    let mut scores = vec![0f32; max_keys];
    let mut rescale = vec![0f32; max_keys];
    let mut weight = vec![0f32; max_keys];
    for r in rows {
        let n_keys = seq.start_pos + r + 1;
        let src = &q[r * row_width + h * hd..r * row_width + (h + 1) * hd];
        for (d, &x) in qh.iter_mut().zip(src) {
            *d = f16::from_f32(x).to_f32();
        }
        // Pass 1: every score (independent of the softmax state).
        simd.scores(&qh, kc, &offs[..n_keys], shape.scale, &mut scores[..n_keys]);
        // Pass 2: ggml's online softmax decisions, in key order: a new maximum rescales
        // the accumulator by `exp(m_old − s)` and adds `v` with weight 1, otherwise `v`
        // gets `exp(s − m)`. `rescale[j] < 0` marks "no rescale".
        let mut m = f32::NEG_INFINITY;
        let mut sum = 0f32;
        for j in 0..n_keys {
            let s = scores[j];
            let (ms, vs) = if s > m {
                let ms = (m - s).exp();
                m = s;
                rescale[j] = ms;
                (ms, 1.0)
            } else {
                rescale[j] = -1.0;
                (1.0, (s - m).exp())
            };
            weight[j] = vs;
            sum = sum.mul_add(ms, vs);
        }
        // Pass 3: the f16 value accumulator, key by key.
        let acc = &mut out[(r - first) * hd..(r - first + 1) * hd];
        simd.accumulate(
            acc,
            vc,
            &offs[..n_keys],
            &rescale[..n_keys],
            &weight[..n_keys],
        );
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        for a in acc.iter_mut() {
            *a *= inv;
        }
    }
    out
}

/// The attention inner loops, with x86 AVX2/FMA/F16C when the CPU has them and a
/// scalar path giving the same bits otherwise.
#[derive(Debug, Clone, Copy)]
enum Simd {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Simd {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
            {
                return Simd::Avx2;
            }
        }
        Simd::Scalar
    }

    /// `Σ q_i k_i` in [`dot_f16_order`].
    #[inline]
    fn dot(self, q: &[f32], k: &[f16]) -> f32 {
        match self {
            Simd::Scalar => {
                let k: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
                dot_f16_order(q, &k)
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has AVX2, FMA and F16C (checked in `detect`).
            Simd::Avx2 => unsafe { x86::dot(q, k) },
        }
    }

    /// `scores[j] = (q · k_j) · scale` for the keys at `offs[j]` in `kc`.
    fn scores(self, q: &[f32], kc: &[f16], offs: &[usize], scale: f32, scores: &mut [f32]) {
        match self {
            Simd::Scalar => {
                for (s, &o) in scores.iter_mut().zip(offs) {
                    *s = self.dot(q, &kc[o..o + q.len()]) * scale;
                }
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has AVX2, FMA and F16C (checked in `detect`).
            Simd::Avx2 => unsafe { x86::scores(q, kc, offs, scale, scores) },
        }
    }

    /// The value accumulator over keys `j` in order: when `rescale[j] ≥ 0`,
    /// `acc = f16(acc · rescale[j])`; then `acc = f16(fma(v_j, weight[j], acc))`, with
    /// `v_j` at `offs[j]` in `vc`.
    fn accumulate(
        self,
        acc: &mut [f32],
        vc: &[f16],
        offs: &[usize],
        rescale: &[f32],
        weight: &[f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if let Simd::Avx2 = self {
            if acc.len() == 64 {
                // SAFETY: the CPU has AVX2, FMA and F16C (checked in `detect`).
                unsafe { x86::accumulate_64(acc, vc, offs, rescale, weight) };
                return;
            }
        }
        let hd = acc.len();
        for ((&o, &ms), &vs) in offs.iter().zip(rescale).zip(weight) {
            if ms >= 0.0 {
                self.scale_f16(acc, ms);
            }
            self.mad_f16(acc, &vc[o..o + hd], vs);
        }
    }

    /// `acc_d = f16(acc_d · e)`.
    #[inline]
    fn scale_f16(self, acc: &mut [f32], e: f32) {
        match self {
            Simd::Scalar => {
                for a in acc.iter_mut() {
                    *a = f16::from_f32(*a * e).to_f32();
                }
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Simd::Avx2 => unsafe { x86::scale_f16(acc, e) },
        }
    }

    /// `acc_d = f16(fma(v_d, e, acc_d))`.
    #[inline]
    fn mad_f16(self, acc: &mut [f32], v: &[f16], e: f32) {
        match self {
            Simd::Scalar => {
                for (a, x) in acc.iter_mut().zip(v) {
                    *a = f16::from_f32(x.to_f32().mul_add(e, *a)).to_f32();
                }
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as above.
            Simd::Avx2 => unsafe { x86::mad_f16(acc, v, e) },
        }
    }
}

/// `Σ a_i b_i` in the order of ggml's `ggml_vec_dot_f16` built for AVX-512F
/// (ggml-cpu/vec.cpp, simd-mappings.h): four 16-lane accumulators over each 64-element
/// step (`acc = fma(a, b, acc)`), reduced as `(acc0 + acc2) + (acc1 + acc3)` lane-wise,
/// then `_mm512_reduce_add_ps` (halves: 16 → 8 → 4 lanes, then `(l0 + l2) + (l1 + l3)`);
/// a tail past the last multiple of 64 is added product by product in f64.
fn dot_f16_order(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let np = n / 64 * 64;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, accj) in acc.iter_mut().enumerate() {
            for (l, x) in accj.iter_mut().enumerate() {
                let idx = i + j * 16 + l;
                *x = a[idx].mul_add(b[idx], *x);
            }
        }
    }
    let mut x = [0f32; 16];
    for (l, xl) in x.iter_mut().enumerate() {
        *xl = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let t3: [f32; 8] = std::array::from_fn(|i| x[8 + i] + x[i]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[4 + i] + t3[i]);
    let mut sum = f64::from((t6[0] + t6[2]) + (t6[1] + t6[3]));
    for i in np..n {
        sum += f64::from(a[i] * b[i]);
    }
    sum as f32
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// [`super::Simd::scores`]: the dot products in one function, [`dot`] inlined.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scores(
        q: &[f32],
        kc: &[half::f16],
        offs: &[usize],
        scale: f32,
        out: &mut [f32],
    ) {
        let hd = q.len();
        for (s, &o) in out.iter_mut().zip(offs) {
            *s = dot(q, &kc[o..o + hd]) * scale;
        }
    }

    /// [`super::Simd::accumulate`] for a head dimension of 64: the accumulator stays in
    /// eight registers (as f32 values that are exactly f16) across the keys.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn accumulate_64(
        acc: &mut [f32],
        vc: &[half::f16],
        offs: &[usize],
        rescale: &[f32],
        weight: &[f32],
    ) {
        let mut a = [_mm256_setzero_ps(); 8];
        for (c, slot) in a.iter_mut().enumerate() {
            *slot = _mm256_loadu_ps(acc[c * 8..c * 8 + 8].as_ptr());
        }
        for ((&o, &ms), &vs) in offs.iter().zip(rescale).zip(weight) {
            let v = &vc[o..o + 64];
            if ms >= 0.0 {
                let e = _mm256_set1_ps(ms);
                for slot in a.iter_mut() {
                    let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(*slot, e));
                    *slot = _mm256_cvtph_ps(h);
                }
            }
            let e = _mm256_set1_ps(vs);
            for (c, slot) in a.iter_mut().enumerate() {
                let x = _mm256_cvtph_ps(_mm_loadu_si128(v[c * 8..].as_ptr().cast()));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_fmadd_ps(x, e, *slot));
                *slot = _mm256_cvtph_ps(h);
            }
        }
        for (c, slot) in a.iter().enumerate() {
            _mm256_storeu_ps(acc[c * 8..c * 8 + 8].as_mut_ptr(), *slot);
        }
    }

    /// [`super::dot_f16_order`] with AVX2 + FMA + F16C (a 16-lane accumulator is two
    /// `__m256`; `b` is converted from f16 on load, exactly).
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn dot(a: &[f32], b: &[half::f16]) -> f32 {
        let n = a.len().min(b.len());
        let np = n / 64 * 64;
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 8]; // accumulator j = (acc[2j], acc[2j + 1])
        let mut i = 0;
        while i < np {
            for (c, slot) in acc.iter_mut().enumerate() {
                let off = i + c * 8;
                *slot = _mm256_fmadd_ps(
                    _mm256_loadu_ps(pa.add(off)),
                    _mm256_cvtph_ps(_mm_loadu_si128(pb.add(off).cast())),
                    *slot,
                );
            }
            i += 64;
        }
        // (acc0 + acc2) + (acc1 + acc3), per 8-lane half.
        let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
        let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
        let t3 = _mm256_add_ps(hi, lo);
        let t6 = _mm_add_ps(_mm256_extractf128_ps::<1>(t3), _mm256_castps256_ps128(t3));
        let mut l = [0f32; 4];
        _mm_storeu_ps(l.as_mut_ptr(), t6);
        let mut sum = f64::from((l[0] + l[2]) + (l[1] + l[3]));
        for j in np..n {
            sum += f64::from(a[j] * b[j].to_f32());
        }
        sum as f32
    }

    /// `acc = f16(acc · e)` (round to nearest even), 8 lanes at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn scale_f16(acc: &mut [f32], e: f32) {
        let n8 = acc.len() / 8 * 8;
        let ve = _mm256_set1_ps(e);
        let p = acc.as_mut_ptr();
        let mut i = 0;
        while i < n8 {
            let r = _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), ve);
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r);
            _mm256_storeu_ps(p.add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for a in acc[n8..].iter_mut() {
            *a = half::f16::from_f32(*a * e).to_f32();
        }
    }

    /// `acc = f16(fma(v, e, acc))`, 8 lanes at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn mad_f16(acc: &mut [f32], v: &[half::f16], e: f32) {
        let n = acc.len().min(v.len());
        let n8 = n / 8 * 8;
        let ve = _mm256_set1_ps(e);
        let (p, pv) = (acc.as_mut_ptr(), v.as_ptr());
        let mut i = 0;
        while i < n8 {
            let r = _mm256_fmadd_ps(
                _mm256_cvtph_ps(_mm_loadu_si128(pv.add(i).cast())),
                ve,
                _mm256_loadu_ps(p.add(i)),
            );
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r);
            _mm256_storeu_ps(p.add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for (a, x) in acc[n8..n].iter_mut().zip(&v[n8..n]) {
            *a = half::f16::from_f32(x.to_f32().mul_add(e, *a)).to_f32();
        }
    }
}

/// The KV cache of a single sequence in a pool of its own that grows as needed: for
/// tests, benchmarks and tools that run one sequence through [`super::LlamaModel::forward`].
#[derive(Debug)]
pub struct SoloKv {
    pool: KvBlockPool,
    table: Vec<u32>,
    len: usize,
}

/// Block size of [`SoloKv`] pools, tokens.
const SOLO_BLOCK_SIZE: usize = 16;

impl SoloKv {
    /// An empty cache for a model with `config` on `device`.
    ///
    /// # Errors
    /// A device allocation error.
    pub fn new(config: &LlamaConfig, device: &Device) -> candle_core::Result<Self> {
        Ok(Self {
            pool: KvBlockPool::new(config, SOLO_BLOCK_SIZE, 1, device)?,
            table: Vec::new(),
            len: 0,
        })
    }

    /// Positions cached so far (the position of the next token).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes room for `new` more tokens and returns the pool and the block table.
    pub(super) fn reserve(
        &mut self,
        new: usize,
    ) -> candle_core::Result<(&mut KvBlockPool, &[u32], usize)> {
        let blocks = (self.len + new).div_ceil(SOLO_BLOCK_SIZE);
        self.pool.grow(blocks.next_power_of_two())?;
        while self.table.len() < blocks {
            self.table.push(self.table.len() as u32);
        }
        Ok((&mut self.pool, &self.table, self.len))
    }

    /// Records that `n` tokens were appended.
    pub(super) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_vec(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                f16::from_f32((x as f32 / u32::MAX as f32 - 0.5) * 4.0).to_f32()
            })
            .collect()
    }

    #[test]
    fn simd_and_scalar_attention_loops_agree_bit_for_bit() {
        let simd = Simd::detect();
        for n in [64usize, 128, 80, 7] {
            for seed in 1..50 {
                let (a, b) = (rand_vec(n, seed), rand_vec(n, seed + 1000));
                let bh: Vec<f16> = b.iter().map(|&x| f16::from_f32(x)).collect();
                assert_eq!(
                    simd.dot(&a, &bh).to_bits(),
                    dot_f16_order(&a, &b).to_bits(),
                    "dot n={n} seed={seed}"
                );
                assert_eq!(
                    Simd::Scalar.dot(&a, &bh).to_bits(),
                    dot_f16_order(&a, &b).to_bits()
                );
                let mut x = rand_vec(n, seed + 7);
                let mut y = x.clone();
                simd.mad_f16(&mut x, &bh, 0.37);
                Simd::Scalar.mad_f16(&mut y, &bh, 0.37);
                assert_eq!(x, y, "mad n={n}");
                simd.scale_f16(&mut x, 0.61);
                Simd::Scalar.scale_f16(&mut y, 0.61);
                assert_eq!(x, y, "scale n={n}");
            }
        }
    }

    #[test]
    fn dot_order_is_ggml_avx512_tree() {
        // Association matters here: 1e8 + 1 rounds to 1e8 in f32.
        let mut a = vec![0f32; 64];
        let b = vec![1f32; 64];
        a[0] = 1e8; // lane 0 of accumulator 0
        a[32] = 1.0; // lane 0 of accumulator 2
        a[16] = -1e8; // lane 0 of accumulator 1
                      // (acc0 + acc2) + (acc1 + acc3) = (1e8 + 1) + (-1e8) = 0; left to right it is 1.
        assert_eq!(dot_f16_order(&a, &b), 0.0);
        // Lanes 8..16 fold onto lanes 0..8 before lanes 4..8 fold onto 0..4.
        let mut a = vec![0f32; 64];
        a[0] = 1e8;
        a[8] = 1.0;
        a[4] = -1e8;
        // (l8 + l0) + l4 = (1e8 + 1) - 1e8 = 0.
        assert_eq!(dot_f16_order(&a, &b), 0.0);
    }

    /// The three-pass head kernel with the register accumulator (AVX2) gives the bits
    /// of the portable per-key loops, over a scattered block table, for decode rows and
    /// a prefill chunk (scores with repeated and falling maxima included).
    /// `read_block` gives the same bytes for a host and a tensor-backed pool holding the
    /// same K/V, and `write_block` of those bytes into another block reproduces it.
    #[test]
    fn block_bytes_round_trip_on_host_and_device_layouts() {
        let config = crate::model::LlamaConfig {
            n_layer: 2,
            n_embd: 32,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 8,
            rope_dim: 8,
            rope_theta: 10000.0,
            rms_eps: 1e-5,
            context_length: 64,
            vocab_size: 10,
        };
        let (bs, blocks) = (4, 6);
        let mut host = KvBlockPool::new(&config, bs, blocks, &Device::Cpu).unwrap();
        let mut dev = KvBlockPool::new_tensor_backed(&config, bs, blocks, &Device::Cpu).unwrap();
        assert_eq!(host.block_bytes(), 2 * 2 * 2 * 4 * 8 * 2);
        let table = [3u32, 1];
        let tokens = [0u32; 8];
        let seq = ForwardSeq {
            tokens: &tokens,
            start_pos: 0,
            block_table: &table,
            want_logits: false,
        };
        for layer in 0..2 {
            let k = rand_vec(8 * 16, 10 + layer as u32);
            let v = rand_vec(8 * 16, 20 + layer as u32);
            host.write_host(layer, &[seq], &k, &v).unwrap();
            let kt = Tensor::from_vec(k, (8, 2, 8), &Device::Cpu).unwrap();
            let vt = Tensor::from_vec(v, (8, 2, 8), &Device::Cpu).unwrap();
            dev.write_device(layer, &[seq], &kt, &vt).unwrap();
        }
        for b in [3u32, 1] {
            let bytes = host.read_block(b).unwrap();
            assert_eq!(bytes.len(), host.block_bytes());
            assert_eq!(bytes, dev.read_block(b).unwrap(), "block {b}: same layout");
            assert!(bytes.iter().any(|&x| x != 0));
        }
        let bytes = host.read_block(3).unwrap();
        host.write_block(5, &bytes).unwrap();
        dev.write_block(5, &bytes).unwrap();
        assert_eq!(host.read_block(5).unwrap(), bytes);
        assert_eq!(dev.read_block(5).unwrap(), bytes);
        // Attention reads block 5 as it read block 3.
        for layer in 0..2 {
            let (a, _) = dev.gather_device(layer, &[3], 4).unwrap();
            let (b, _) = dev.gather_device(layer, &[5], 4).unwrap();
            assert_eq!(a.to_vec3::<f32>().unwrap(), b.to_vec3::<f32>().unwrap());
            let (kc, vc) = host.host_layer(layer).unwrap();
            let n = 2 * 4 * 8;
            assert_eq!(kc[3 * n..4 * n], kc[5 * n..6 * n]);
            assert_eq!(vc[3 * n..4 * n], vc[5 * n..6 * n]);
        }
        assert!(host.read_block(6).is_err());
        assert!(host.write_block(0, &bytes[1..]).is_err());
    }

    #[test]
    fn attention_head_simd_equals_scalar() {
        let config = crate::model::LlamaConfig {
            n_layer: 1,
            n_embd: 3 * 64,
            n_head: 3,
            n_kv_head: 1,
            head_dim: 64,
            rope_dim: 64,
            rope_theta: 10000.0,
            rms_eps: 1e-5,
            context_length: 512,
            vocab_size: 10,
        };
        let mut pool = KvBlockPool::new(&config, 16, 12, &Device::Cpu).unwrap();
        let table: Vec<u32> = vec![7, 2, 9, 0, 11, 4, 5];
        let n = 100;
        let tokens = vec![1u32; n];
        let seq = ForwardSeq {
            tokens: &tokens,
            start_pos: 0,
            block_table: &table,
            want_logits: false,
        };
        let mut k = rand_vec(n * 64, 3);
        let v = rand_vec(n * 64, 4);
        // Keys 40.. equal key 39: equal scores (no new maximum).
        let k39 = k[39 * 64..40 * 64].to_vec();
        for j in 40..50 {
            k[j * 64..(j + 1) * 64].copy_from_slice(&k39);
        }
        pool.write_host(0, &[seq], &k, &v).unwrap();
        let (kc, vc) = pool.host_layer(0).unwrap();
        let q = rand_vec(n * 3 * 64, 5);
        let shape = AttnShape {
            n_head: 3,
            n_kv_head: 1,
            head_dim: 64,
            scale: 0.125,
        };
        for h in 0..3 {
            for rows in [0..16, 60..61, 99..100, 30..100] {
                let a = attend_head(
                    &pool,
                    kc,
                    vc,
                    &seq,
                    h,
                    rows.clone(),
                    &q,
                    shape,
                    Simd::detect(),
                );
                let b = attend_head(
                    &pool,
                    kc,
                    vc,
                    &seq,
                    h,
                    rows.clone(),
                    &q,
                    shape,
                    Simd::Scalar,
                );
                let (a, b): (Vec<u32>, Vec<u32>) = (
                    a.iter().map(|x| x.to_bits()).collect(),
                    b.iter().map(|x| x.to_bits()).collect(),
                );
                assert_eq!(a, b, "head {h} rows {rows:?}");
            }
        }
    }
}
