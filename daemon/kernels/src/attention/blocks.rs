//! The register blocks of the tiled attention ([`super::tiled`]): the
//! scores of `R` query rows against one key tile, and their value sums.
//!
//! llama.cpp computes both with `simd_gemm` (`ggml/src/ggml-cpu/simd-gemm.h`): each
//! output an fma chain in `d` order (scores) or key order (value sums), several rows
//! and lanes at once. The blocks here keep `R` rows × `NV` eight-lane vectors of
//! outputs in registers (`NV` = 4 with AVX-512's 32 registers, 2 with AVX2's 16), which
//! changes nothing of any output's operations: every SIMD block equals the portable
//! loops bit for bit (tested).

use super::tiled::TILE;

/// Which block kernels the CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Simd {
    /// Portable loops.
    Portable,
    /// Eight-lane FMA blocks, two vectors per row.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Eight-lane FMA blocks, four vectors per row (32 registers).
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Simd {
    /// The best the CPU has.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if avx2 && is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl") {
                return Simd::Avx512;
            }
            if avx2 {
                return Simd::Avx2;
            }
        }
        Simd::Portable
    }
}

/// `s[r][tk] = Σ_d k[d][tk] · q_r[d]`, one fma chain per score from 0 in `d` order, for
/// the `TILE` keys of the tile `kt` (`[d][key]`, `hd × TILE`) and the query rows `qs`
/// (`hd` values each).
pub fn scores<const R: usize>(
    simd: Simd,
    kt: &[f32],
    qs: [&[f32]; R],
    hd: usize,
) -> [[f32; TILE]; R] {
    assert!(kt.len() >= hd * TILE && qs.iter().all(|q| q.len() >= hd));
    let mut s = [[0f32; TILE]; R];
    match simd {
        // SAFETY: the CPU has the kernels' features (`Simd::detect`); lengths checked.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 => unsafe { x86::scores_avx512(kt, qs, hd, &mut s) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { x86::scores_avx2(kt, qs, hd, &mut s) },
        Simd::Portable => {
            for (sr, qr) in s.iter_mut().zip(&qs) {
                for (d, &x) in qr[..hd].iter().enumerate() {
                    for (sv, &k) in sr.iter_mut().zip(&kt[d * TILE..(d + 1) * TILE]) {
                        *sv = k.mul_add(x, *sv);
                    }
                }
            }
        }
    }
    s
}

/// `acc_r[d] = fma(v[tk][d], p_r[tk], acc_r[d])` for the keys `tk` in `0..kv` in order
/// and every `d < hd`, for the value tile `vt` (`[key][d]`) and the rows' weights `p`.
pub fn values<const R: usize>(
    simd: Simd,
    vt: &[f32],
    hd: usize,
    kv: usize,
    p: &[[f32; TILE]; R],
    acc: &mut [&mut [f32]; R],
) {
    assert!(kv <= TILE && vt.len() >= kv * hd && acc.iter().all(|a| a.len() >= hd));
    match simd {
        // SAFETY: the CPU has the kernels' features (`Simd::detect`); lengths checked.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx512 => unsafe { x86::values_avx512(vt, hd, kv, p, acc) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Simd::Avx2 => unsafe { x86::values_avx2(vt, hd, kv, p, acc) },
        Simd::Portable => {
            for (a, pr) in acc.iter_mut().zip(p) {
                for (tk, &pv) in pr.iter().enumerate().take(kv) {
                    for (av, &v) in a[..hd].iter_mut().zip(&vt[tk * hd..(tk + 1) * hd]) {
                        *av = v.mul_add(pv, *av);
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The blocks with eight-lane FMAs; `NV` vectors of keys (scores) or dimensions
    //! (value sums) per row.
    use super::TILE;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) unsafe fn scores_avx512<const R: usize>(
        kt: &[f32],
        qs: [&[f32]; R],
        hd: usize,
        s: &mut [[f32; TILE]; R],
    ) {
        scores::<R, 4>(kt, qs, hd, s);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores_avx2<const R: usize>(
        kt: &[f32],
        qs: [&[f32]; R],
        hd: usize,
        s: &mut [[f32; TILE]; R],
    ) {
        scores::<R, 2>(kt, qs, hd, s);
    }

    /// # Safety
    /// AVX2 and FMA; `kt` holds `hd × TILE` values, each `qs[r]` `hd`.
    #[inline(always)]
    unsafe fn scores<const R: usize, const NV: usize>(
        kt: &[f32],
        qs: [&[f32]; R],
        hd: usize,
        s: &mut [[f32; TILE]; R],
    ) {
        for k0 in (0..TILE).step_by(8 * NV) {
            let mut acc = [[_mm256_setzero_ps(); NV]; R];
            for d in 0..hd {
                let kp = kt.as_ptr().add(d * TILE + k0);
                let k: [__m256; NV] = std::array::from_fn(|v| _mm256_loadu_ps(kp.add(8 * v)));
                for (a, q) in acc.iter_mut().zip(&qs) {
                    let x = _mm256_set1_ps(*q.get_unchecked(d));
                    for (av, &kv) in a.iter_mut().zip(&k) {
                        *av = _mm256_fmadd_ps(kv, x, *av);
                    }
                }
            }
            for (sr, a) in s.iter_mut().zip(&acc) {
                for (v, &av) in a.iter().enumerate() {
                    _mm256_storeu_ps(sr.as_mut_ptr().add(k0 + 8 * v), av);
                }
            }
        }
    }

    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    pub(super) unsafe fn values_avx512<const R: usize>(
        vt: &[f32],
        hd: usize,
        kv: usize,
        p: &[[f32; TILE]; R],
        acc: &mut [&mut [f32]; R],
    ) {
        values::<R, 4>(vt, hd, kv, p, acc);
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn values_avx2<const R: usize>(
        vt: &[f32],
        hd: usize,
        kv: usize,
        p: &[[f32; TILE]; R],
        acc: &mut [&mut [f32]; R],
    ) {
        values::<R, 2>(vt, hd, kv, p, acc);
    }

    /// Blocks of `NV` vectors of dimensions, then of one, then single dimensions.
    ///
    /// # Safety
    /// AVX2 and FMA; `vt` holds `kv × hd` values, each `acc[r]` `hd`.
    #[inline(always)]
    unsafe fn values<const R: usize, const NV: usize>(
        vt: &[f32],
        hd: usize,
        kv: usize,
        p: &[[f32; TILE]; R],
        acc: &mut [&mut [f32]; R],
    ) {
        let mut d0 = 0;
        while d0 + 8 * NV <= hd {
            value_block::<R, NV>(vt, hd, kv, p, acc, d0);
            d0 += 8 * NV;
        }
        while d0 + 8 <= hd {
            value_block::<R, 1>(vt, hd, kv, p, acc, d0);
            d0 += 8;
        }
        for d in d0..hd {
            for (a, pr) in acc.iter_mut().zip(p) {
                let mut x = a[d];
                for (tk, &pv) in pr.iter().enumerate().take(kv) {
                    x = vt[tk * hd + d].mul_add(pv, x);
                }
                a[d] = x;
            }
        }
    }

    /// Dimensions `d0..d0 + 8 · NV` of every row.
    #[inline(always)]
    unsafe fn value_block<const R: usize, const NV: usize>(
        vt: &[f32],
        hd: usize,
        kv: usize,
        p: &[[f32; TILE]; R],
        acc: &mut [&mut [f32]; R],
        d0: usize,
    ) {
        let mut a: [[__m256; NV]; R] = std::array::from_fn(|r| {
            std::array::from_fn(|v| _mm256_loadu_ps(acc[r].as_ptr().add(d0 + 8 * v)))
        });
        for tk in 0..kv {
            let vp = vt.as_ptr().add(tk * hd + d0);
            let v: [__m256; NV] = std::array::from_fn(|i| _mm256_loadu_ps(vp.add(8 * i)));
            for (ar, pr) in a.iter_mut().zip(p) {
                let pv = _mm256_set1_ps(*pr.get_unchecked(tk));
                for (av, &vv) in ar.iter_mut().zip(&v) {
                    *av = _mm256_fmadd_ps(vv, pv, *av);
                }
            }
        }
        for (r, ar) in a.iter().enumerate() {
            for (v, &av) in ar.iter().enumerate() {
                _mm256_storeu_ps(acc[r].as_mut_ptr().add(d0 + 8 * v), av);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_values as values_of;
    use super::*;

    fn check<const R: usize>(hd: usize, kv: usize) {
        let kt = values_of(hd * TILE, 1);
        let vt = values_of(TILE * hd, 2);
        let q = values_of(R * hd, 3);
        let qs: [&[f32]; R] = std::array::from_fn(|r| &q[r * hd..(r + 1) * hd]);
        let want = scores(Simd::Portable, &kt, qs, hd);
        let p: [[f32; TILE]; R] = std::array::from_fn(|r| want[r].map(|x| x * 0.01));
        let mut want_v = values_of(R * hd, 4);
        {
            let mut it = want_v.chunks_exact_mut(hd);
            let mut acc: [&mut [f32]; R] = std::array::from_fn(|_| it.next().unwrap_or_default());
            values(Simd::Portable, &vt, hd, kv, &p, &mut acc);
        }
        {
            let simd = Simd::detect();
            let got = scores(simd, &kt, qs, hd);
            for (r, (g, w)) in got.iter().zip(&want).enumerate() {
                for (tk, (a, b)) in g.iter().zip(w).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{simd:?} hd {hd}: score ({r}, {tk})"
                    );
                }
            }
            let mut got_v = values_of(R * hd, 4);
            {
                let mut it = got_v.chunks_exact_mut(hd);
                let mut acc: [&mut [f32]; R] =
                    std::array::from_fn(|_| it.next().unwrap_or_default());
                values(simd, &vt, hd, kv, &p, &mut acc);
            }
            for (i, (a, b)) in got_v.iter().zip(&want_v).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{simd:?} hd {hd} kv {kv}: value sum {i}"
                );
            }
        }
    }

    /// Every block shape and remainder (head dims 64, 96, 100, 256; partial tiles).
    #[test]
    fn simd_blocks_equal_portable_loops() {
        for (hd, kv) in [(64, 64), (96, 37), (100, 64), (256, 1)] {
            check::<4>(hd, kv);
            check::<3>(hd, kv);
            check::<1>(hd, kv);
        }
    }
}
