//! llama.cpp's tiled CPU flash attention (`ggml_compute_forward_flash_attn_ext_tiled` in
//! `ggml/src/ggml-cpu/ops.cpp`), the path llama.cpp takes for an f16 KV cache when a
//! batch has at least [`TILE`] query rows (`GGML_FA_TILE_Q`): a long prompt's prefill.
//!
//! Per query row, the keys are taken in tiles of [`TILE`] positions from position 0
//! (`GGML_FA_TILE_KV`): scores `s = (Σ_d fma(k_d, q_d, ·)) · scale` with `q` in f32 and
//! `k` widened from f16, summed in `d` order (`simd_gemm`); a tile's maximum updates the
//! running maximum `M` (rescaling the f32 value accumulator and the sum by
//! `expf(M_old − M)`), `p = ggml_v_expf(s − M)`, the tile's sum of `p` is GCC's
//! `_mm512_reduce_add_ps` per 16 added in f64 onto `S`; `acc_d = fma(v_jd, p_j, acc_d)`
//! in key order; the output is `acc · (1 / S)`. Rows are independent of each other.

use half::f16;

use super::ggml_ops::v_expf;
use super::kv_pool::ForwardSeq;
use super::transformer::AttnShape;

/// Query rows from which llama.cpp tiles, and the key tile length.
pub const TILE: usize = 64;

/// Attention of query head `h` for rows `rows` of `seq` in the tiled kernel's
/// arithmetic; `q` starts at the sequence's first row, `offs[j]` is key `j`'s offset in
/// `kc`/`vc`. Returns `(rows.len(), head_dim)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_head_tiled(
    kc: &[f16],
    vc: &[f16],
    offs: &[usize],
    seq: &ForwardSeq<'_>,
    h: usize,
    rows: std::ops::Range<usize>,
    q: &[f32],
    shape: AttnShape,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") {
        // SAFETY: FMA was detected; the function only changes how `mul_add` compiles.
        return unsafe { tiled_fma(kc, vc, offs, seq, h, rows, q, shape) };
    }
    tiled(kc, vc, offs, seq, h, rows, q, shape)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tiled_fma(
    kc: &[f16],
    vc: &[f16],
    offs: &[usize],
    seq: &ForwardSeq<'_>,
    h: usize,
    rows: std::ops::Range<usize>,
    q: &[f32],
    shape: AttnShape,
) -> Vec<f32> {
    tiled(kc, vc, offs, seq, h, rows, q, shape)
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tiled(
    kc: &[f16],
    vc: &[f16],
    offs: &[usize],
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
    let mut s = [0f32; TILE];
    let mut kf = vec![0f32; hd];
    for r in rows {
        let n_keys = seq.start_pos + r + 1;
        let lo = shape.window.map_or(0, |w| n_keys.saturating_sub(w));
        let qr = &q[r * row_width + h * hd..r * row_width + (h + 1) * hd];
        let acc = &mut out[(r - first) * hd..(r - first + 1) * hd];
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0f32);
        for t0 in (lo / TILE * TILE..n_keys).step_by(TILE) {
            for (tk, sv) in s.iter_mut().enumerate() {
                let j = t0 + tk;
                *sv = if j < lo || j >= n_keys {
                    f32::NEG_INFINITY
                } else {
                    for (f, k) in kf.iter_mut().zip(&kc[offs[j]..offs[j] + hd]) {
                        *f = k.to_f32();
                    }
                    let dot = kf.iter().zip(qr).fold(0f32, |a, (&k, &x)| k.mul_add(x, a));
                    dot * shape.scale
                };
            }
            let tile_max = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            if tile_max == f32::NEG_INFINITY {
                continue;
            }
            let m_new = m.max(tile_max);
            if m_new > m {
                let ms = (m - m_new).exp();
                acc.iter_mut().for_each(|a| *a *= ms);
                sum *= ms;
            }
            m = m_new;
            let mut tile_sum = 0f64;
            for chunk in s.chunks_exact_mut(16) {
                let mut lanes = [0f32; 16];
                for (l, v) in lanes.iter_mut().zip(chunk.iter_mut()) {
                    *v = v_expf(*v - m_new);
                    *l = *v;
                }
                tile_sum += f64::from(inferd_kernels::lanes::reduce_add_16(&lanes));
            }
            sum = (f64::from(sum) + tile_sum) as f32;
            for (tk, &p) in s.iter().enumerate() {
                let j = t0 + tk;
                if j < lo || j >= n_keys {
                    // p = 0: fma(v, 0, a) leaves a unchanged.
                    continue;
                }
                for (a, v) in acc.iter_mut().zip(&vc[offs[j]..offs[j] + hd]) {
                    *a = v.to_f32().mul_add(p, *a);
                }
            }
        }
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        acc.iter_mut().for_each(|a| *a *= inv);
    }
    out
}

/// llama-server's micro-batch (`n_ubatch`, default 512): a prompt is prefilled in
/// batches of this many rows.
const UBATCH: usize = 512;

/// Whether llama-server computes the attention of the prompt row at `pos` (of a prompt
/// of `prompt_len` tokens) with the tiled kernel: the row's micro-batch has at least
/// [`TILE`] rows (`neq1 >= Q_TILE_SZ` in `ggml_compute_forward_flash_attn_ext_f16`).
pub fn tiled_row(pos: usize, prompt_len: usize) -> bool {
    if pos >= prompt_len {
        return false;
    }
    let start = pos / UBATCH * UBATCH;
    prompt_len.min(start + UBATCH) - start >= TILE
}
