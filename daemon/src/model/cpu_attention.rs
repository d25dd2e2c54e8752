//! The CPU paged-attention kernels: causal (optionally sliding-window) grouped-query
//! attention of one layer over the host KV pool, split over the compute thread team.
//! An f16 pool runs llama.cpp's flash-attention arithmetic ([`attend_head`]); an f32
//! pool runs the exact softmax transformers computes ([`attend_head_exact`]).

use half::f16;

use super::cpu_attention_tiled::{attend_head_tiled, tiled_row};
use super::kv_pool::{ForwardSeq, HostKv, KvBlockPool};
use super::transformer::AttnShape;

/// Below this many (query row × key) pairs in a layer the attention runs on the calling
/// thread: handing out tasks costs more than it saves.
const PAR_MIN_PAIRS: usize = 256;

/// Query rows per attention work item.
const ROW_CHUNK: usize = 64;

/// Causal grouped-query attention of one layer over the paged host pool.
///
/// `q` is `(T, n_head · head_dim)` f32 after RoPE, rows in batch order (the rows of
/// `seqs[0]`, then `seqs[1]`, ...). Query row `r` of a sequence sits at position
/// `start_pos + r` and attends to that sequence's positions `0 ..= start_pos + r`
/// (the last `window` of them under a sliding window), which
/// [`KvBlockPool::write_host`] must already hold. Returns `(T, n_head · head_dim)` f32.
///
/// Per query head: `s_j = (q · k_j) · scale`, `w = softmax(s)`, `y = Σ_j w_j v_j`, in
/// ascending `j`. Every query row is computed by the same code whatever else is in the
/// batch, so a sequence's output does not depend on its batch company, and a prompt
/// prefilled in chunks gives the same values as one prefilled whole. With `ggml` (GGUF
/// models) the prompt rows of long prompts take llama.cpp's tiled arithmetic
/// ([`tiled_row`]), chosen by position and prompt length alone.
///
/// # Errors
/// The pool is not a host pool.
pub(super) fn attend_cpu(
    pool: &KvBlockPool,
    layer: usize,
    seqs: &[ForwardSeq<'_>],
    q: &[f32],
    shape: AttnShape,
    ggml: bool,
) -> candle_core::Result<Vec<f32>> {
    let Some(kv) = pool.host_layer(layer) else {
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
    let simd = Simd::detect();
    let run = |&(i, h, r0, r1): &(usize, usize, usize, usize)| -> Vec<f32> {
        let q = &q[row0[i] * row_width..];
        let seq = &seqs[i];
        match kv {
            HostKv::F16(kc, vc) if ggml => {
                // Runs of rows with the same kernel: llama.cpp's tiled one for prompt rows
                // of long prompts, the one-chunk one otherwise.
                let tiled = |r: usize| tiled_row(seq.start_pos + r, seq.prompt_len);
                let mut out = Vec::with_capacity((r1 - r0) * shape.head_dim);
                let mut a = r0;
                while a < r1 {
                    let t = tiled(a);
                    let b = (a..r1).find(|&r| tiled(r) != t).unwrap_or(r1);
                    if t {
                        let offs = key_offsets(pool, seq, h, seq.start_pos + b, shape);
                        out.extend(attend_head_tiled(kc, vc, &offs, seq, h, a..b, q, shape));
                    } else {
                        out.extend(attend_head(pool, kc, vc, seq, h, a..b, q, shape, simd));
                    }
                    a = b;
                }
                out
            }
            HostKv::F16(kc, vc) => attend_head(pool, kc, vc, seq, h, r0..r1, q, shape, simd),
            HostKv::F32(kc, vc) => attend_head_exact(pool, kc, vc, seq, h, r0..r1, q, shape),
        }
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
    let row_width = shape.n_head * hd;
    let first = rows.start;
    let mut out = vec![0f32; rows.len() * hd];
    let mut qh = vec![0f32; hd];
    let max_keys = seq.start_pos + rows.end;
    let offs = key_offsets(pool, seq, h, max_keys, shape);
    let mut scores = vec![0f32; max_keys];
    let mut rescale = vec![0f32; max_keys];
    let mut weight = vec![0f32; max_keys];
    for r in rows {
        let n_keys = seq.start_pos + r + 1;
        let lo = first_key(n_keys, shape.window);
        let src = &q[r * row_width + h * hd..r * row_width + (h + 1) * hd];
        for (d, &x) in qh.iter_mut().zip(src) {
            *d = f16::from_f32(x).to_f32();
        }
        // Pass 1: every score (independent of the softmax state).
        simd.scores(
            &qh,
            kc,
            &offs[lo..n_keys],
            shape.scale,
            &mut scores[lo..n_keys],
        );
        // Pass 2: ggml's online softmax decisions, in key order: a new maximum rescales
        // the accumulator by `exp(m_old − s)` and adds `v` with weight 1, otherwise `v`
        // gets `exp(s − m)`. `rescale[j] < 0` marks "no rescale".
        let mut m = f32::NEG_INFINITY;
        let mut sum = 0f32;
        for j in lo..n_keys {
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
            &offs[lo..n_keys],
            &rescale[lo..n_keys],
            &weight[lo..n_keys],
        );
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        for a in acc.iter_mut() {
            *a *= inv;
        }
    }
    out
}

/// Offset of key/value `j < n_keys` of query head `h`'s KV head in a layer's arrays
/// (the pool's `(block, head, slot, d)` layout).
fn key_offsets(
    pool: &KvBlockPool,
    seq: &ForwardSeq<'_>,
    h: usize,
    n_keys: usize,
    shape: AttnShape,
) -> Vec<usize> {
    let (hd, bs) = (shape.head_dim, pool.block_size());
    let g = h / (shape.n_head / shape.n_kv_head);
    (0..n_keys)
        .map(|j| ((seq.block_table[j / bs] as usize * shape.n_kv_head + g) * bs + j % bs) * hd)
        .collect()
}

/// The first key a query with `n_keys` causal keys sees: the last `window` of them
/// (`i − window < j ≤ i`), or all.
fn first_key(n_keys: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| n_keys.saturating_sub(w))
}

/// [`attend_head`] for an f32 pool with transformers' eager arithmetic
/// (`modeling_llama.eager_attention_forward`): `s_j = (q · k_j) · scale` summed in f32,
/// `w = softmax(s)` with the maximum subtracted, `y = Σ_j w_j v_j`; nothing rounded to
/// f16, so F32 checkpoints match transformers' logits within f32 noise.
#[allow(clippy::too_many_arguments)]
fn attend_head_exact(
    pool: &KvBlockPool,
    kc: &[f32],
    vc: &[f32],
    seq: &ForwardSeq<'_>,
    h: usize,
    rows: std::ops::Range<usize>,
    q: &[f32],
    shape: AttnShape,
) -> Vec<f32> {
    let hd = shape.head_dim;
    let row_width = shape.n_head * hd;
    let first = rows.start;
    let mut out = vec![0f32; rows.len() * hd];
    let max_keys = seq.start_pos + rows.end;
    let offs = key_offsets(pool, seq, h, max_keys, shape);
    let mut w = vec![0f32; max_keys];
    for r in rows {
        let n_keys = seq.start_pos + r + 1;
        let lo = first_key(n_keys, shape.window);
        let qr = &q[r * row_width + h * hd..r * row_width + (h + 1) * hd];
        let mut max = f32::NEG_INFINITY;
        for j in lo..n_keys {
            let k = &kc[offs[j]..offs[j] + hd];
            let s = qr.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * shape.scale;
            w[j] = s;
            max = max.max(s);
        }
        let mut sum = 0f32;
        for x in &mut w[lo..n_keys] {
            *x = (*x - max).exp();
            sum += *x;
        }
        let acc = &mut out[(r - first) * hd..(r - first + 1) * hd];
        for j in lo..n_keys {
            let p = w[j] / sum;
            for (a, &v) in acc.iter_mut().zip(&vc[offs[j]..offs[j] + hd]) {
                *a += p * v;
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    use crate::model::kv_pool::tests::rand_vec;

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
    fn attention_head_simd_equals_scalar() {
        let config = crate::model::KvLayout {
            n_layer: 1,
            n_kv_head: 1,
            head_dim: 64,
            dtype: crate::model::KvDtype::F16,
        };
        let mut pool = KvBlockPool::new(&config, 16, 12, &Device::Cpu).unwrap();
        let table: Vec<u32> = vec![7, 2, 9, 0, 11, 4, 5];
        let n = 100;
        let tokens = vec![1u32; n];
        let seq = ForwardSeq {
            tokens: &tokens,
            start_pos: 0,
            block_table: &table,
            logit_rows: 0,
            prompt_len: 0,
        };
        let mut k = rand_vec(n * 64, 3);
        let v = rand_vec(n * 64, 4);
        // Keys 40.. equal key 39: equal scores (no new maximum).
        let k39 = k[39 * 64..40 * 64].to_vec();
        for j in 40..50 {
            k[j * 64..(j + 1) * 64].copy_from_slice(&k39);
        }
        pool.write_host(0, &[seq], &k, &v).unwrap();
        let Some(HostKv::F16(kc, vc)) = pool.host_layer(0) else {
            panic!("f16 pool");
        };
        let q = rand_vec(n * 3 * 64, 5);
        let shape = AttnShape {
            n_head: 3,
            n_kv_head: 1,
            head_dim: 64,
            scale: 0.125,
            window: None,
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
