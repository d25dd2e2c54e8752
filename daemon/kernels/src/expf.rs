//! ggml's vectorized `expf`, shared by the model's element-wise operations (SwiGLU,
//! tiled attention) and the sampler's log-probabilities.

/// ggml's vectorized `expf` (`ggml_v_expf`, the AVX-512 variant in `vec.h`, after ARM's
/// optimized routines; at most 1.5 ulp from the true value), one lane: range reduction
/// `n = round(x / ln 2)`, a degree-5 polynomial in FMAs, `scalef(j, n)`. Written without
/// branches on the value so that loops over it vectorize.
#[inline(always)]
pub fn v_expf(x: f32) -> f32 {
    let c = f32::from_bits;
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)));
    let j = j.mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    // `_mm512_scalef_ps(j, n)`: j · 2^n rounded once. In two steps: j ∈ [0.7, 1.42], so
    // j · 2^a with a ∈ [−125, 127] is exact (normal), then · 2^(n − a) rounds once.
    let ni = n.clamp(-192.0, 192.0) as i32;
    let a = ni.clamp(-125, 127);
    let pow = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    let res = j * pow(a) * pow((ni - a).clamp(-126, 127));
    let big = n.abs() > 192.0;
    if big {
        if n <= 0.0 {
            0.0
        } else {
            f32::INFINITY
        }
    } else {
        res
    }
}

/// `Σ exp(l − max)` over `logits` in f64, each term by [`v_expf`] in f32 (NaN counts as
/// −∞), 16 lanes at a time: the log-softmax normaliser of a vocabulary-sized row.
/// Dispatched to AVX-512 or AVX2 with FMA when the CPU has them (the portable body
/// calls `mul_add`, a library call without FMA); the same terms either way, the f64
/// sum's order differs only between lanes.
pub fn exp_sum(logits: &[f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX-512 F, AVX2 (implied) and FMA were detected.
            return unsafe { exp_sum_avx512(logits, max) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA were detected.
            return unsafe { exp_sum_fma(logits, max) };
        }
    }
    exp_sum_body(logits, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn exp_sum_avx512(logits: &[f32], max: f32) -> f64 {
    exp_sum_body(logits, max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sum_fma(logits: &[f32], max: f32) -> f64 {
    exp_sum_body(logits, max)
}

#[inline(always)]
fn exp_sum_body(logits: &[f32], max: f32) -> f64 {
    const LANES: usize = 16;
    let term = |l: f32| {
        let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
        f64::from(v_expf(l - max))
    };
    let mut acc = [0.0f64; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &l) in acc.iter_mut().zip(c) {
            *a += term(l);
        }
    }
    acc.iter().sum::<f64>() + tail.iter().map(|&l| term(l)).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_sum_equals_the_f64_definition() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 997) as f32 * 0.03 - 15.0)
            .chain([f32::NAN, f32::NEG_INFINITY])
            .collect();
        let max = 14.88f32;
        let want: f64 = logits
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| (f64::from(l) - f64::from(max)).exp())
            .sum();
        let got = exp_sum(&logits, max);
        assert!(((got - want) / want).abs() < 1e-6, "{got} vs {want}");
        assert_eq!(exp_sum(&[], 0.0), 0.0);
    }
}
