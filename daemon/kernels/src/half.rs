//! f16 and bf16 conversions as ggml's CPU backend does them on x86.
//!
//! ggml converts f16 with F16C (`_cvtsh_ss` / `_cvtss_sh(x, 0)`: exact widening, round to
//! nearest even when narrowing), which the `half` crate's conversions equal bit for bit.
//! bf16 narrowing is `ggml_compute_fp32_to_bf16` (`ggml/src/ggml-impl.h`): NaN → quiet
//! NaN, otherwise round to nearest even on the upper 16 bits.

/// IEEE f16 bits → f32 (exact).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    ::half::f16::from_bits(h).to_f32()
}

/// f32 → IEEE f16 bits, round to nearest even.
#[inline(always)]
pub fn f32_to_f16(v: f32) -> u16 {
    ::half::f16::from_f32(v).to_bits()
}

/// Rounds through f16 and back (`GGML_CPU_FP16_TO_FP32(GGML_CPU_FP32_TO_FP16(v))`).
#[inline(always)]
pub fn f16_round(v: f32) -> f32 {
    f16_to_f32(f32_to_f16(v))
}

/// bf16 bits → f32 (exact: the upper half of the f32).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// f32 → bf16 bits, ggml's `ggml_compute_fp32_to_bf16`.
#[inline(always)]
pub fn f32_to_bf16(v: f32) -> u16 {
    let u = v.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        // NaN: force quiet.
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// Little-endian u16 at byte offset `at`.
#[inline(always)]
pub fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Little-endian f16 at byte offset `at`, widened to f32.
#[inline(always)]
pub fn le_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(le_u16(b, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_and_ties() {
        // 1 + 2^-11 is halfway between 1 and the next f16 (1 + 2^-10): ties to even → 1.
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        // 1 + 3·2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: ties to even → 1 + 2^-9.
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x0001), f32::powi(2.0, -24));
        assert_eq!(f32_to_f16(65520.0), 0x7c00, "rounds up to infinity");
    }

    #[test]
    fn bf16_is_ggml_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even → 1.
        assert_eq!(f32_to_bf16(1.0 + f32::powi(2.0, -8)), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 * f32::powi(2.0, -8)), 0x3f82);
        assert_eq!(
            f32_to_bf16(f32::from_bits(0x7f80_0001)),
            0x7fc0,
            "NaN stays NaN, quiet"
        );
        assert_eq!(bf16_to_f32(0xbf80), -1.0);
    }
}
