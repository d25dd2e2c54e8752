//! K-quant products in the order of llama.cpp's batched kernels ([`Path::Tiled`],
//! [`Path::Gemv`], [`Path::Gemm`]; see [`crate::paths`]).
//!
//! All three sum the same exact integers per 256-value block `b` of weight row `w` and
//! activation row `a`:
//! `s1 = Σ_g sc_g · (Σ_{e∈g} u_e · a_e − BIAS · bsum_g)` and `s2 = Σ_g mn_g · bsum_g`
//! over the block's sixteen 16-value groups `g` (unsigned codes `u`, the type's code
//! offset `BIAS`, its scales `sc` and mins `mn`, the activation's group sums `bsum`),
//! and differ only in how they round the float accumulation:
//!
//! - **Tiled** (`ggml-cpu/tiled/tiled-kernel.cpp`, `tiled_run_micro_vnni_8x16`, the
//!   microkernel of llama.cpp's AVX-512 VNNI build; slabs of 256 values in order, the
//!   accumulator zeroed once per output): `r = f32(s1) · d`, with a min
//!   `r = fnmadd(dmin, f32(s2), r)` (one rounding); `acc = fma(r, d_a, acc)` (the source
//!   writes `add(acc, mul(r, d_a))`, which GCC contracts: its `_mm512_mul_ps` and
//!   `_mm512_add_ps` are plain vector arithmetic, and `-ffp-contract=fast` is its
//!   default for GNU C++).
//! - **Gemv** (`ggml_gemv_q4_K_8x8_q8_K`, `ggml-cpu/arch/x86/repack.cpp`, AVX2):
//!   `acc = fma(f32(s1), d · d_a, acc)`, `acc_m = fma(f32(s2), dmin · d_a, acc_m)` per
//!   block; the output is `acc − acc_m`.
//! - **Gemm** (`ggml_gemm_q4_K_8x8_q8_K`, same file, AVX-512 and AVX2 branches alike):
//!   the same two FMA chains, but one step per 64-value quarter of each block (its two
//!   32-value sub-blocks), so `s1` and `s2` are split in four.
//!
//! The integer sums are exact on every path (the AVX2 code's `maddubs` pairs stay below
//! `2 · 63 · 127`), so the SIMD and portable code give the same bits.

use std::ops::Range;

use crate::act::{Q8KBlock, Q8K};
use crate::paths::Path;
use crate::{Activations, Isa, Quant};

/// One K-quant block unpacked for the batched kernels.
#[derive(Clone, Copy, Debug)]
pub struct KBlock {
    /// The 256 unsigned codes, in value order (the value is `code − BIAS`).
    pub u: [u8; 256],
    /// The scale of each 16-value group (a 32-value sub-block's scale twice).
    pub sc: [i16; 16],
    /// The min of each 16-value group (zeros for types without mins).
    pub mn: [i16; 16],
    /// The block's `d`, widened from f16.
    pub d: f32,
    /// The block's `dmin`, widened from f16 (0 for types without mins).
    pub dmin: f32,
}

/// A K-quant type's block as the batched kernels read it (`tiled_unpack_src0` in
/// `ggml-cpu/tiled/tiled.cpp`).
pub trait KQuant: Quant<Act = Q8K> {
    /// The code offset (`BIAS` of `tiled_matmul_dispatch`): 32 for Q6_K, 4 for Q3_K,
    /// 0 for the types whose codes are the values.
    const BIAS: i32;
    /// Whether blocks have mins (Q2_K, Q4_K, Q5_K).
    const HAS_MIN: bool;
    /// Unpacks one block (`BLOCK_BYTES` bytes).
    fn k_block(b: &[u8]) -> KBlock;
}

/// `(s1, s2)` of each 64-value quarter of a block (see the module documentation).
pub type Quarters = [(i32, i32); 4];

/// The exact quarter sums of `k` against `a`, portable.
pub fn quarter_sums_portable(k: &KBlock, a: &Q8KBlock, bias: i32) -> Quarters {
    let mut out = [(0, 0); 4];
    for (q, o) in out.iter_mut().enumerate() {
        for g in 4 * q..4 * q + 4 {
            let raw: i32 = k.u[16 * g..16 * g + 16]
                .iter()
                .zip(&a.qs[16 * g..16 * g + 16])
                .map(|(&u, &x)| i32::from(u) * i32::from(x))
                .sum();
            let bsum = i32::from(a.bsums[g]);
            o.0 += i32::from(k.sc[g]) * (raw - bias * bsum);
            o.1 += i32::from(k.mn[g]) * bsum;
        }
    }
    out
}

/// The exact quarter sums on the best available instruction set.
#[inline]
pub fn quarter_sums(isa: Isa, k: &KBlock, a: &Q8KBlock, bias: i32) -> Quarters {
    #[cfg(target_arch = "x86_64")]
    if isa.has_avx2() {
        // SAFETY: `has_avx2` means AVX2 was detected.
        return unsafe { x86::quarter_sums(k, a, bias) };
    }
    let _ = isa;
    quarter_sums_portable(k, a, bias)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{KBlock, Quarters};
    use crate::act::Q8KBlock;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quarter_sums(k: &KBlock, a: &Q8KBlock, bias: i32) -> Quarters {
        let mut out = [(0, 0); 4];
        for (q, o) in out.iter_mut().enumerate() {
            let mut acc = _mm256_setzero_si256();
            for v in 2 * q..2 * q + 2 {
                let u = _mm256_loadu_si256(k.u.as_ptr().add(32 * v) as *const __m256i);
                let x = _mm256_loadu_si256(a.qs.as_ptr().add(32 * v) as *const __m256i);
                // i16 lanes 0..8 are group 2v's pairs, 8..16 group 2v + 1's.
                let s =
                    _mm256_set_m128i(_mm_set1_epi16(k.sc[2 * v + 1]), _mm_set1_epi16(k.sc[2 * v]));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), s));
            }
            let h = _mm_add_epi32(
                _mm256_castsi256_si128(acc),
                _mm256_extracti128_si256(acc, 1),
            );
            let h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0b01_00_11_10));
            let h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0b10_11_00_01));
            let mut s1 = _mm_cvtsi128_si32(h);
            let mut s2 = 0;
            for g in 4 * q..4 * q + 4 {
                let bsum = i32::from(a.bsums[g]);
                s1 -= i32::from(k.sc[g]) * bias * bsum;
                s2 += i32::from(k.mn[g]) * bsum;
            }
            *o = (s1, s2);
        }
        out
    }
}

/// The `Quant::path_rows` of a K-quant whose only batched path is [`Path::Tiled`]
/// (through `$tile`, its SIMD tile kernel for that order, when given and the CPU has
/// AVX2; otherwise [`rows`]); every other path is its `vec_dot`.
macro_rules! tiled_path_rows {
    ($($tile:ty)?) => {
        fn path_rows(
            isa: $crate::Isa,
            path: $crate::Path,
            w: &[u8],
            a: &$crate::Activations<$crate::act::Q8K>,
            rows: std::ops::Range<usize>,
            out: &mut [f32],
        ) {
            if path != $crate::Path::Tiled {
                return <Self as $crate::Quant>::vec_dot_rows(isa, w, a, rows, out);
            }
            $(
            #[cfg(target_arch = "x86_64")]
            if isa.has_avx2() {
                // SAFETY: `has_avx2` means AVX2, FMA and F16C were detected.
                return unsafe { $crate::tiles::in_tiles::<_, $tile>(w, a, rows, out) };
            }
            )?
            $crate::kbatch::rows::<Self>(isa, $crate::Path::Tiled, w, a, rows, out)
        }
    };
}
pub(crate) use tiled_path_rows;

/// The [`KBlock`] of a Q4_K or Q5_K block: the twelve packed bytes of six-bit scales and
/// mins at `scales` (each for 32 values), f16 `d` at 0 and `dmin` at 2, codes `u`.
pub fn k4_style_block(b: &[u8], scales: usize, u: [i8; 256]) -> KBlock {
    let (sc, mn) = crate::lanes::k4_scales_mins(&b[scales..scales + 12]);
    KBlock {
        u: u.map(|q| q as u8),
        sc: std::array::from_fn(|g| i16::from(sc[g / 2])),
        mn: std::array::from_fn(|g| i16::from(mn[g / 2])),
        d: crate::half::le_f16(b, 0),
        dmin: crate::half::le_f16(b, 2),
    }
}

/// Rows handled per pass over a weight row's blocks (each block unpacked once per pass).
const PASS: usize = 16;

/// `out[i] = w · a_{rows.start + i}` along `path`. [`Path::VecDot`] is the type's own
/// `vec_dot` and is not taken here (callers dispatch it; given, or given [`Path::Sgemm`], which is for float weights, it computes as Tiled). Gemv and Gemm exist for Q4_K only (llama.cpp repacks Q2_K
/// too, on AVX-512; that order is not followed here, see [`crate::q2_k`]).
pub fn rows<Q: KQuant>(
    isa: Isa,
    path: Path,
    w: &[u8],
    a: &Activations<Q8K>,
    rows: Range<usize>,
    out: &mut [f32],
) {
    let nb = w.len() / Q::BLOCK_BYTES;
    for (c, o) in out[..rows.len()].chunks_mut(PASS).enumerate() {
        let j0 = rows.start + c * PASS;
        let mut acc = [0f32; PASS];
        let mut acc_m = [0f32; PASS];
        for b in 0..nb {
            let k = Q::k_block(&w[b * Q::BLOCK_BYTES..(b + 1) * Q::BLOCK_BYTES]);
            for (r, (acc, acc_m)) in acc.iter_mut().zip(&mut acc_m).take(o.len()).enumerate() {
                let ab = &a.row(j0 + r)[b];
                let qs = quarter_sums(isa, &k, ab, Q::BIAS);
                match path {
                    Path::Tiled | Path::VecDot | Path::Sgemm => {
                        let s1: i32 = qs.iter().map(|q| q.0).sum();
                        let mut res = s1 as f32 * k.d;
                        if Q::HAS_MIN {
                            let s2: i32 = qs.iter().map(|q| q.1).sum();
                            res = (-k.dmin).mul_add(s2 as f32, res);
                        }
                        *acc = res.mul_add(ab.d, *acc);
                    }
                    Path::Gemv => {
                        let (s1, s2) = qs.iter().fold((0, 0), |t, q| (t.0 + q.0, t.1 + q.1));
                        *acc = (s1 as f32).mul_add(k.d * ab.d, *acc);
                        *acc_m = (s2 as f32).mul_add(k.dmin * ab.d, *acc_m);
                    }
                    Path::Gemm => {
                        let (ds, dm) = (k.d * ab.d, k.dmin * ab.d);
                        for &(s1, s2) in &qs {
                            *acc = (s1 as f32).mul_add(ds, *acc);
                            *acc_m = (s2 as f32).mul_add(dm, *acc_m);
                        }
                    }
                }
            }
        }
        for ((o, &acc), &acc_m) in o.iter_mut().zip(&acc).zip(&acc_m) {
            *o = match path {
                Path::Gemv | Path::Gemm => acc - acc_m,
                Path::Tiled | Path::VecDot | Path::Sgemm => acc,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{quantize, random};
    use candle_core::quantized::GgmlDType;

    fn sums_agree<Q: KQuant>(dtype: GgmlDType) {
        let (w, _) = quantize(&random(256, 7), 1, 256, dtype);
        let a = Activations::<Q8K>::quantize(&random(256, 2), 1, 256).expect("q8_K");
        let k = Q::k_block(&w);
        let p = quarter_sums_portable(&k, &a.row(0)[0], Q::BIAS);
        assert_eq!(quarter_sums(Isa::detect(), &k, &a.row(0)[0], Q::BIAS), p);
        // The integers are those of the dequantized block (d = dmin = 1).
        let mut deq = [0f32; 256];
        Q::dequantize_block(&w, &mut deq);
        let (s1, s2): (i64, i64) = p
            .iter()
            .fold((0, 0), |t, q| (t.0 + i64::from(q.0), t.1 + i64::from(q.1)));
        let want: f64 = deq
            .iter()
            .zip(&a.row(0)[0].qs)
            .map(|(&v, &x)| f64::from(v) * f64::from(x))
            .sum();
        let got = s1 as f64 * f64::from(k.d) - s2 as f64 * f64::from(k.dmin);
        assert!(
            (got - want).abs() <= 1e-3 * want.abs().max(1.0),
            "{}: {got} vs {want}",
            Q::TYPE.name()
        );
    }

    /// Every ISA's `path_rows` equals the portable [`rows`] bit for bit (13 rows: tiles
    /// of 8, 4 and 1; 3 blocks per row).
    fn paths_agree<Q: KQuant>(dtype: GgmlDType, paths: &[Path]) {
        let (n, k, r) = (5, 768, 13);
        let (w, _) = quantize(&random(n * k, 3), n, k, dtype);
        let x = random(r * k, 4);
        for &p in paths {
            let a = Activations::<Q8K>::quantize_for(&x, r, k, |_| p == Path::Gemm).expect("a");
            for wr in w.chunks_exact(w.len() / n) {
                let mut want = vec![0f32; r];
                rows::<Q>(Isa::Portable, p, wr, &a, 0..r, &mut want);
                for isa in Isa::available() {
                    let mut got = vec![0f32; r];
                    Q::path_rows(isa, p, wr, &a, 0..r, &mut got);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{} {p:?} {}",
                        Q::TYPE.name(),
                        isa.name()
                    );
                }
            }
        }
    }

    #[test]
    fn simd_paths_equal_portable() {
        let all = [Path::Tiled, Path::Gemv, Path::Gemm];
        paths_agree::<crate::q4_k::Q4K>(GgmlDType::Q4K, &all);
        paths_agree::<crate::q6_k::Q6K>(GgmlDType::Q6K, &[Path::Tiled]);
        paths_agree::<crate::q5_k::Q5K>(GgmlDType::Q5K, &[Path::Tiled]);
        paths_agree::<crate::q3_k::Q3K>(GgmlDType::Q3K, &[Path::Tiled]);
        paths_agree::<crate::q2_k::Q2K>(GgmlDType::Q2K, &[Path::Tiled]);
    }

    #[test]
    fn quarter_sums_are_exact_on_every_isa() {
        sums_agree::<crate::q2_k::Q2K>(GgmlDType::Q2K);
        sums_agree::<crate::q3_k::Q3K>(GgmlDType::Q3K);
        sums_agree::<crate::q4_k::Q4K>(GgmlDType::Q4K);
        sums_agree::<crate::q5_k::Q5K>(GgmlDType::Q5K);
        sums_agree::<crate::q6_k::Q6K>(GgmlDType::Q6K);
    }
}
