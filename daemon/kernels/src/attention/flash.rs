//! llama.cpp's one-chunk CPU flash attention for an f16 KV cache
//! (`ggml_compute_forward_flash_attn_ext_f16_one_chunk` in `ggml/src/ggml-cpu/ops.cpp`):
//! the path llama-server takes for decode rows and for prompts under 64 tokens.

use half::f16;

use super::HeadRows;

/// Attention of one work item ([`HeadRows`]), reading K and V (f16) straight from the
/// sequence's blocks. Returns `(rows.len(), head_dim)`.
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
pub fn attend_head(kc: &[f16], vc: &[f16], item: &HeadRows<'_>, simd: Simd) -> Vec<f32> {
    let (hd, shape) = (item.shape.head_dim, item.shape);
    let first = item.rows.start;
    let mut out = vec![0f32; item.rows.len() * hd];
    let mut qh = vec![0f32; hd];
    let max_keys = item.max_keys();
    let offs = item.offs;
    let mut scores = vec![0f32; max_keys];
    let mut rescale = vec![0f32; max_keys];
    let mut weight = vec![0f32; max_keys];
    for r in item.rows.clone() {
        let keys = item.keys(r);
        let (lo, n_keys) = (keys.start, keys.end);
        for (d, &x) in qh.iter_mut().zip(item.q_row(r)) {
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

/// The attention inner loops, with x86 AVX2/FMA/F16C when the CPU has them and a
/// scalar path giving the same bits otherwise.
#[derive(Debug, Clone, Copy)]
pub enum Simd {
    /// Portable code.
    Scalar,
    /// AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

impl Simd {
    /// The best the CPU has.
    pub fn detect() -> Self {
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
pub fn dot_f16_order(a: &[f32], b: &[f32]) -> f32 {
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
    use super::super::{key_offsets, test_values, AttnShape, SeqRows};
    use super::*;

    /// Seeded values in `[-2, 2]` that f16 holds exactly.
    fn rand_vec(n: usize, seed: u32) -> Vec<f32> {
        test_values(n, seed)
            .iter()
            .map(|&x| f16::from_f32(2.0 * x).to_f32())
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
    #[test]
    fn attention_head_simd_equals_scalar() {
        let (bs, hd, n_blocks) = (16, 64, 12);
        let table: Vec<u32> = vec![7, 2, 9, 0, 11, 4, 5];
        let n = 100;
        let seq = SeqRows {
            rows: n,
            start_pos: 0,
            block_table: &table,
            prompt_len: 0,
            bidirectional: &[],
        };
        let mut k = rand_vec(n * hd, 3);
        let v = rand_vec(n * hd, 4);
        // Keys 40.. equal key 39: equal scores (no new maximum).
        let k39 = k[39 * hd..40 * hd].to_vec();
        for j in 40..50 {
            k[j * hd..(j + 1) * hd].copy_from_slice(&k39);
        }
        // The cache layout with one KV head: position j in block table[j / bs], slot j % bs.
        let (mut kc, mut vc) = (
            vec![f16::ZERO; n_blocks * bs * hd],
            vec![f16::ZERO; n_blocks * bs * hd],
        );
        for j in 0..n {
            let o = (table[j / bs] as usize * bs + j % bs) * hd;
            for d in 0..hd {
                kc[o + d] = f16::from_f32(k[j * hd + d]);
                vc[o + d] = f16::from_f32(v[j * hd + d]);
            }
        }
        let q = rand_vec(n * 3 * hd, 5);
        let shape = AttnShape {
            n_head: 3,
            n_kv_head: 1,
            head_dim: hd,
            scale: 0.125,
            window: None,
        };
        for h in 0..3 {
            let offs = key_offsets(bs, &seq, h, n, shape);
            for rows in [0..16, 60..61, 99..100, 30..100] {
                let item = HeadRows {
                    shape,
                    h,
                    rows: rows.clone(),
                    start_pos: 0,
                    q: &q,
                    offs: &offs,
                    bidirectional: &[],
                };
                let a = attend_head(&kc, &vc, &item, Simd::detect());
                let b = attend_head(&kc, &vc, &item, Simd::Scalar);
                let (a, b): (Vec<u32>, Vec<u32>) = (
                    a.iter().map(|x| x.to_bits()).collect(),
                    b.iter().map(|x| x.to_bits()).collect(),
                );
                assert_eq!(a, b, "head {h} rows {rows:?}");
            }
        }
    }
}
