//! Paged KV cache storage, and the door to the CPU paged-attention kernels.
//!
//! KV memory is a pool of fixed-size blocks (PagedAttention, Kwon et al. 2023,
//! "Efficient Memory Management for Large Language Model Serving with
//! PagedAttention"): position `p` of a sequence lives in block `table[p / block_size]`,
//! slot `p % block_size`. Which blocks a sequence owns is decided by the scheduler's
//! block manager; the pool only stores values.
//!
//! Keys and values are stored as IEEE f16, like llama.cpp's default `--cache-type-k/v
//! f16` (GGUF models and F16/BF16 checkpoints), or as f32 for an F32 checkpoint (what
//! transformers computes with; vLLM's `kv_cache_dtype = "auto"` also follows the
//! weights), so a token costs `2 × layers × kv_heads × head_dim × element bytes`. On
//! the CPU the pool is one host array per layer and attention runs in
//! [`inferd_kernels::attention`] ([`KvBlockPool::attend_host`]); on other devices it is one f16 device tensor per layer and
//! the tensor backend gathers a sequence's slots with `index_select`.

use candle_core::{DType, Device, Tensor};
use half::f16;
use half::slice::HalfFloatSliceExt;
use inferd_kernels::attention::{self, AttnShape, KvLayer, SeqRows};

/// The element type of stored K and V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// IEEE half (llama.cpp's default).
    F16,
    /// f32 (exact for F32 checkpoints; host pools only).
    F32,
}

impl KvDtype {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }

    /// Name for logs and the prefix-store fingerprint.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
        }
    }
}

/// The shape of a model's KV cache, from its [`super::ModelSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Layers.
    pub n_layer: usize,
    /// Key/value heads per layer.
    pub n_kv_head: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// Element type.
    pub dtype: KvDtype,
}

impl KvLayout {
    /// Bytes per cached token: `2 × layers × kv_heads × head_dim × element bytes`.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.n_layer * self.n_kv_head * self.head_dim * self.dtype.bytes()
    }
}

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
    /// How many of the last positions' logits are wanted: 0 for a prefill chunk that
    /// is not the prompt's last, 1 for the next token, more to verify draft tokens.
    pub logit_rows: usize,
    /// Length of the request's prompt (positions below it are prompt tokens; 0 when the
    /// caller does not say). GGUF models give prompt rows of long prompts llama.cpp's
    /// tiled attention arithmetic, as llama-server's prefill does
    /// ([`inferd_kernels::attention::tiled`]); this depends only on the position and the
    /// prompt length, never on how the prompt is chunked.
    pub prompt_len: usize,
    /// The LoRA adapter this sequence runs with (and its scale); `None` for the base
    /// model. Its K/V differ from the base's, so the caller keeps its blocks apart.
    pub adapter: Option<crate::model::lora::AdapterUse<'a>>,
    /// Image rows and bidirectional ranges of this step (`None`: text only).
    pub media: Option<&'a SeqMedia<'a>>,
}

/// What images change in one sequence's step: the rows that replace token
/// embeddings, and the position ranges that attend bidirectionally.
#[derive(Debug, Clone, Default)]
pub struct SeqMedia<'a> {
    /// `(row in tokens, values)`: `values` (`k · n_embd` f32, `k` rows) replace the
    /// embeddings of rows `row .. row + k` of this step's tokens, after the embedding
    /// scale (transformers' `masked_scatter` into `inputs_embeds`).
    pub rows: Vec<(usize, &'a [f32])>,
    /// [`SeqRows::bidirectional`], absolute positions.
    pub bidirectional: Vec<std::ops::Range<usize>>,
    /// Multimodal RoPE positions `[t, h, w]` of each of the step's rows (Qwen2-VL's
    /// `get_rope_index`); empty: each row at its position on all three.
    pub mrope: Vec<[u32; 3]>,
}

/// The batch's multimodal RoPE positions, row by row, when a sequence has any (the
/// others at `[p, p, p]`); `None` otherwise.
pub fn batch_mrope(seqs: &[ForwardSeq<'_>]) -> Option<Vec<[u32; 3]>> {
    if !seqs
        .iter()
        .any(|s| s.media.is_some_and(|m| !m.mrope.is_empty()))
    {
        return None;
    }
    let mut out = Vec::new();
    for s in seqs {
        match s.media.filter(|m| m.mrope.len() == s.tokens.len()) {
            Some(m) => out.extend_from_slice(&m.mrope),
            None => out.extend((s.start_pos..s.start_pos + s.tokens.len()).map(|p| {
                let p = p as u32;
                [p, p, p]
            })),
        }
    }
    Some(out)
}

impl<'a> ForwardSeq<'a> {
    /// What the attention kernels and llama.cpp's micro-batch placement read of it.
    pub fn rows(&self) -> SeqRows<'a> {
        SeqRows {
            rows: self.tokens.len(),
            start_pos: self.start_pos,
            block_table: self.block_table,
            prompt_len: self.prompt_len,
            bidirectional: self.media.map_or(&[], |m| m.bidirectional.as_slice()),
        }
    }
}

/// Per-layer storage.
#[derive(Debug)]
enum LayerStore {
    /// Host arrays, each `num_blocks × n_kv_head × block_size × head_dim` f16, indexed
    /// `((block · n_kv_head + head) · block_size + slot) · head_dim + d`: one block of one
    /// head is contiguous, so attention reads it in one sweep.
    Host { k: Vec<f16>, v: Vec<f16> },
    /// The same layout in f32.
    HostF32 { k: Vec<f32>, v: Vec<f32> },
    /// Device tensors, each `(num_blocks · block_size, n_kv_head, head_dim)` f16, indexed
    /// by slot `block · block_size + offset`.
    Device { k: Tensor, v: Tensor },
}

/// `n` zero f16 values from the allocator's zeroed memory (`calloc`: for a pool this
/// large, fresh pages that the OS maps in only when a block is first written), so a
/// pool costs resident memory for the blocks sequences have used, not for its whole
/// size up front. (`vec![f16::ZERO; n]` writes every value: `f16` is not one of the
/// types whose zero the standard library recognises.)
fn zeroed_f16(n: usize) -> Vec<f16> {
    let v = std::mem::ManuallyDrop::new(vec![0u16; n]);
    let (ptr, len, cap) = (v.as_ptr().cast_mut(), v.len(), v.capacity());
    // SAFETY: `f16` is `repr(transparent)` over `u16` (same size and alignment, every
    // bit pattern valid), and the allocation changes hands without being freed.
    unsafe { Vec::from_raw_parts(ptr.cast::<f16>(), len, cap) }
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
    pub(super) n_kv_head: usize,
    head_dim: usize,
    dtype: KvDtype,
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
        config: &KvLayout,
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
            dtype: config.dtype,
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
        config: &KvLayout,
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
            dtype: KvDtype::F16,
            device: device.clone(),
            layers,
        })
    }

    fn empty_layer(&self, blocks: usize) -> candle_core::Result<LayerStore> {
        if self.device.is_cpu()
            && self
                .layers
                .first()
                .is_none_or(|l| !matches!(l, LayerStore::Device { .. }))
        {
            let n = blocks * self.block_elems();
            Ok(match self.dtype {
                KvDtype::F16 => LayerStore::Host {
                    k: zeroed_f16(n),
                    v: zeroed_f16(n),
                },
                KvDtype::F32 => LayerStore::HostF32 {
                    k: vec![0.0; n],
                    v: vec![0.0; n],
                },
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
                    for x in [k, v] {
                        // Into zeroed memory: only the values kept are written.
                        let mut grown = zeroed_f16(elems);
                        grown[..x.len()].copy_from_slice(x);
                        *x = grown;
                    }
                }
                (LayerStore::HostF32 { k, v }, _) => {
                    k.resize(elems, 0.0);
                    v.resize(elems, 0.0);
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

    /// The stored element type.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Elements of one block of one layer's K (or V): `n_kv_head × block_size × head_dim`.
    pub(super) fn block_elems(&self) -> usize {
        self.n_kv_head * self.block_size * self.head_dim
    }

    /// Checks that `seq`'s block table covers its positions with valid block ids.
    pub fn check_table(&self, seq: &ForwardSeq<'_>) -> candle_core::Result<()> {
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
    pub(super) fn slot(&self, table: &[u32], pos: usize) -> usize {
        table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    /// Stores K and V of the batch's new tokens for `layer`. `k` and `v` are host rows
    /// `(T, n_kv_head · head_dim)` f32 (CPU pool) in batch order; values are rounded to
    /// the pool's element type.
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
        let dst_src = slots.into_iter().enumerate().flat_map(|(row, slot)| {
            let (block, off) = (slot / bs, slot % bs);
            (0..kvh).map(move |h| (((block * kvh + h) * bs + off) * hd, (row * kvh + h) * hd))
        });
        match self.layers.get_mut(layer) {
            Some(LayerStore::Host { k: kc, v: vc }) => {
                for (dst, src) in dst_src {
                    kc[dst..dst + hd].convert_from_f32_slice(&k[src..src + hd]);
                    vc[dst..dst + hd].convert_from_f32_slice(&v[src..src + hd]);
                }
            }
            Some(LayerStore::HostF32 { k: kc, v: vc }) => {
                for (dst, src) in dst_src {
                    kc[dst..dst + hd].copy_from_slice(&k[src..src + hd]);
                    vc[dst..dst + hd].copy_from_slice(&v[src..src + hd]);
                }
            }
            _ => candle_core::bail!("layer {layer}: no host KV storage"),
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
    /// `layers × 2 × n_kv_head × block_size × head_dim × element bytes`.
    pub fn block_bytes(&self) -> usize {
        self.layers.len() * 2 * self.block_elems() * self.dtype.bytes()
    }

    /// Copies out block `block`'s K and V: for each layer, K then V, each
    /// `(n_kv_head, block_size, head_dim)` little-endian in the element type ([`Self::block_bytes`]
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
                LayerStore::HostF32 { k, v } => {
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
        let mut parts = bytes.chunks_exact(n * self.dtype.bytes());
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
                LayerStore::HostF32 { k, v } => {
                    for (dst, src) in [
                        (&mut k[b * n..(b + 1) * n], kb),
                        (&mut v[b * n..(b + 1) * n], vb),
                    ] {
                        for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                            *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
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

    /// Copies block `src`'s K and V over block `dst` in every layer (a sequence forked
    /// from another takes its own copy of their shared, partly filled last block).
    ///
    /// # Errors
    /// A block out of range, or a device error.
    pub fn copy_block(&mut self, src: u32, dst: u32) -> candle_core::Result<()> {
        self.check_block(src)?;
        self.check_block(dst)?;
        if src == dst {
            return Ok(());
        }
        let n = self.block_elems();
        let (s, d) = (src as usize * n, dst as usize * n);
        for layer in &mut self.layers {
            match layer {
                LayerStore::Host { k, v } => {
                    k.copy_within(s..s + n, d);
                    v.copy_within(s..s + n, d);
                }
                LayerStore::HostF32 { k, v } => {
                    k.copy_within(s..s + n, d);
                    v.copy_within(s..s + n, d);
                }
                LayerStore::Device { k, v } => {
                    let bs = self.block_size;
                    for t in [&*k, &*v] {
                        // A copy of its own: `slice_set` refuses a source sharing the
                        // destination's storage.
                        let part = t.narrow(0, src as usize * bs, bs)?.copy()?;
                        t.slice_set(&part, 0, dst as usize * bs)?;
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
    pub(super) fn host_layer(&self, layer: usize) -> Option<KvLayer<'_>> {
        match self.layers.get(layer)? {
            LayerStore::Host { k, v } => Some(KvLayer::F16(k, v)),
            LayerStore::HostF32 { k, v } => Some(KvLayer::F32(k, v)),
            LayerStore::Device { .. } => None,
        }
    }

    /// Causal attention of `layer` for the query rows `q` (`(T, n_head · head_dim)`,
    /// the rows of `seqs` in order) over this host pool, whose slots for those rows
    /// [`Self::write_host`] has filled: [`inferd_kernels::attention::attend`], with
    /// llama.cpp's arithmetic when `ggml`. Returns `(T, n_head · head_dim)`.
    ///
    /// # Errors
    /// The pool is not a host pool, or has no layer `layer`.
    pub fn attend_host(
        &self,
        layer: usize,
        seqs: &[ForwardSeq<'_>],
        q: &[f32],
        shape: AttnShape,
        ggml: bool,
    ) -> candle_core::Result<Vec<f32>> {
        let Some(kv) = self.host_layer(layer) else {
            candle_core::bail!("layer {layer}: the CPU attention kernel needs a host KV pool");
        };
        let rows: Vec<SeqRows<'_>> = seqs.iter().map(ForwardSeq::rows).collect();
        Ok(attention::attend(
            kv,
            self.block_size,
            &rows,
            q,
            shape,
            ggml,
        ))
    }

    /// Whether the pool lives in host memory (the CPU attention kernel applies).
    pub fn is_host(&self) -> bool {
        matches!(
            self.layers.first(),
            Some(LayerStore::Host { .. } | LayerStore::HostF32 { .. })
        )
    }
}

/// The KV cache of a single sequence in a pool of its own that grows as needed: for
/// tests, benchmarks and tools that run one sequence through [`super::Model::forward`].
#[derive(Debug)]
pub struct SoloKv {
    pool: KvBlockPool,
    table: Vec<u32>,
    len: usize,
    /// Tokens of the first forward call (the prompt).
    prompt_len: usize,
}

/// Block size of [`SoloKv`] pools, tokens.
const SOLO_BLOCK_SIZE: usize = 16;

impl SoloKv {
    /// An empty cache for a model with `config` on `device`.
    ///
    /// # Errors
    /// A device allocation error.
    pub fn new(config: &KvLayout, device: &Device) -> candle_core::Result<Self> {
        Ok(Self {
            pool: KvBlockPool::new(config, SOLO_BLOCK_SIZE, 1, device)?,
            table: Vec::new(),
            len: 0,
            prompt_len: 0,
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

    /// Records that `n` tokens were appended (the first call's `n` is the prompt).
    pub(super) fn advance(&mut self, n: usize) {
        if self.len == 0 {
            self.prompt_len = n;
        }
        self.len += n;
    }

    /// The prompt length: the first call's token count (or `pending` before it).
    pub(super) fn prompt_len(&self, pending: usize) -> usize {
        if self.len == 0 {
            pending
        } else {
            self.prompt_len
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `n` pseudo-random values that are exact f16 numbers in [-2, 2).
    pub(crate) fn rand_vec(n: usize, seed: u32) -> Vec<f32> {
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

    /// An f32 pool round-trips its blocks exactly (4 bytes per element).
    #[test]
    fn f32_pool_blocks_round_trip() {
        let config = KvLayout {
            n_layer: 1,
            n_kv_head: 1,
            head_dim: 4,
            dtype: KvDtype::F32,
        };
        let mut pool = KvBlockPool::new(&config, 2, 3, &Device::Cpu).unwrap();
        assert_eq!(pool.block_bytes(), 2 * 2 * 4 * 4);
        let tokens = [0u32; 2];
        let seq = ForwardSeq {
            tokens: &tokens,
            start_pos: 0,
            block_table: &[2],
            logit_rows: 0,
            prompt_len: 0,
            adapter: None,
            media: None,
        };
        let k = [0.1f32, 0.2, 0.3, 1e-9, -5.0, 6.0, 7.0, 8.0];
        pool.write_host(0, &[seq], &k, &k).unwrap();
        let bytes = pool.read_block(2).unwrap();
        assert_eq!(&bytes[..4], &0.1f32.to_le_bytes());
        pool.write_block(0, &bytes).unwrap();
        assert_eq!(pool.read_block(0).unwrap(), bytes);
    }

    #[test]
    fn block_bytes_round_trip_on_host_and_device_layouts() {
        let config = KvLayout {
            n_layer: 2,
            n_kv_head: 2,
            head_dim: 8,
            dtype: KvDtype::F16,
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
            logit_rows: 0,
            prompt_len: 0,
            adapter: None,
            media: None,
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
            let Some(KvLayer::F16(kc, vc)) = host.host_layer(layer) else {
                panic!("f16 host layer");
            };
            let n = 2 * 4 * 8;
            assert_eq!(kc[3 * n..4 * n], kc[5 * n..6 * n]);
            assert_eq!(vc[3 * n..4 * n], vc[5 * n..6 * n]);
        }
        assert!(host.read_block(6).is_err());
        assert!(host.write_block(0, &bytes[1..]).is_err());
        // copy_block gives the same bytes as a read and a write, on both layouts.
        for pool in [&mut host, &mut dev] {
            pool.copy_block(1, 0).unwrap();
            assert_eq!(pool.read_block(0).unwrap(), pool.read_block(1).unwrap());
            assert!(pool.copy_block(1, 6).is_err());
        }
        assert_eq!(host.read_block(0).unwrap(), dev.read_block(1).unwrap());
    }
}
