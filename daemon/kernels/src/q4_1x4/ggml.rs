//! ggml's x86 numerics (`ggml/src/ggml-cpu/arch/x86/quants.c`, as llama.cpp runs Q4_1 on
//! AVX2 / AVX-512 CPUs), the default order of [`Q4_1Matrix`]:
//!
//! - `quantize_row_q8_1`: `d = amax / 127` (stored as f16), `q = round_half_even(x ·
//!   (127 / amax))`, `s = f16(d · Σq)` with the f32 `d`;
//! - `ggml_vec_dot_q4_1_q8_1`: per block, the eight 4-value integer dot products of the
//!   32 nibbles with the 32 quants (exact, as `maddubs`+`madd` or `dpbusd` give them)
//!   are accumulated in eight f32 lanes with `acc = fma(d4 · d8, xy, acc)`; beside it
//!   `summs = fma(m4, s8, summs)` (GCC contracts `summs += m * s`); the result is
//!   `hsum_float_8(acc) + summs`, `hsum_float_8` adding lanes `(4..8) + (0..4)`, then
//!   `(l0 + l2) + (l1 + l3)`.
//!
//! Every operation rounds the same in the scalar and the AVX2 code, which the tests
//! check bit for bit; the eight independent lanes (instead of one sequential sum) are
//! what lets the kernel run at the speed of the integer dot products.

use super::{f16_bits_to_f32, f32_to_f16_bits, Nibbles, Q4_1Matrix, Q8Quants, QK};

/// [`super::quantize_row_body`]'s counterpart in ggml's numerics.
#[inline(always)]
pub(super) fn quantize_row(x: &[f32], q: &mut [Q8Quants], d: &mut [f32], s: &mut [f32]) {
    for (((xb, qb), db), sb) in x.chunks_exact(QK).zip(q).zip(d).zip(s) {
        let amax = super::block_amax(xb);
        let dd = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0i32;
        for (qv, &xv) in qb.0.iter_mut().zip(xb) {
            *qv = ((xv * id).round_ties_even() as i32).clamp(-128, 127) as i8;
            sum += i32::from(*qv);
        }
        *db = f16_bits_to_f32(f32_to_f16_bits(dd));
        *sb = f16_bits_to_f32(f32_to_f16_bits(dd * sum as f32));
    }
}

/// The eight 4-value integer dot products of one block: lane `l` is
/// `Σ_{i=4l}^{4l+3} nibble_i · q_i` (nibble `i < 16` is the low half of byte `i`,
/// nibble `i ≥ 16` the high half of byte `i − 16`).
#[inline(always)]
fn lane_dots(w: &Nibbles, a: &Q8Quants) -> [i32; 8] {
    let mut out = [0i32; 8];
    for (l, o) in out.iter_mut().enumerate() {
        for i in 4 * l..4 * l + 4 {
            let nib = if i < 16 {
                w.0[i] & 0x0f
            } else {
                w.0[i - 16] >> 4
            };
            *o += i32::from(nib) * i32::from(a.0[i]);
        }
    }
    out
}

/// `hsum_float_8(acc) + summs`.
#[inline(always)]
pub(super) fn finish(acc: [f32; 8], summs: f32) -> f32 {
    let r: [f32; 4] = std::array::from_fn(|i| acc[4 + i] + acc[i]);
    ((r[0] + r[2]) + (r[1] + r[3])) + summs
}

/// One output in ggml's order (portable reference for the AVX2 kernel).
pub(super) fn vec_dot(w: &Q4_1Matrix, r: usize, xq: &[Q8Quants], xd: &[f32], xs: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for b in 0..w.nb {
        let (q, d, m) = w.block(r, b);
        summs = m.mul_add(xs[b], summs);
        let d0d1 = d * xd[b];
        for (a, xy) in acc.iter_mut().zip(lane_dots(q, &xq[b])) {
            *a = d0d1.mul_add(xy as f32, *a);
        }
    }
    finish(acc, summs)
}
