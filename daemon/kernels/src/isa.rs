//! Instruction-set selection, once at start-up.
//!
//! Every kernel has a portable path and, on x86-64, AVX2 (with FMA and F16C) and AVX-512
//! (F, BW, VL and VNNI) paths that give the same bits. [`Isa::detect`] picks the widest
//! the CPU has; tests run every [`Isa::available`] one against the portable path.

/// A kernel instruction set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, any CPU; the reference the SIMD paths are tested against.
    Portable,
    /// x86-64 AVX2 + FMA + F16C (ggml's `__AVX2__` code).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL/VNNI (also AVX2, FMA and F16C).
    Avx512,
}

impl Isa {
    /// The widest instruction set this CPU runs, or `INFERD_KERNEL_ISA` when set to
    /// `portable`, `avx2` or `avx512` (clamped to what the CPU has).
    pub fn detect() -> Self {
        let best = Self::best();
        match std::env::var("INFERD_KERNEL_ISA").ok().as_deref() {
            Some("portable") => Isa::Portable,
            Some("avx2") if best != Isa::Portable => Isa::Avx2,
            _ => best,
        }
    }

    fn best() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            let avx512 = avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni");
            if avx512 {
                return Isa::Avx512;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Every instruction set this CPU runs, portable first.
    pub fn available() -> Vec<Isa> {
        match Self::best() {
            Isa::Portable => vec![Isa::Portable],
            Isa::Avx2 => vec![Isa::Portable, Isa::Avx2],
            Isa::Avx512 => vec![Isa::Portable, Isa::Avx2, Isa::Avx512],
        }
    }

    /// Whether AVX2 code may run (true for [`Isa::Avx2`] and [`Isa::Avx512`]).
    pub fn has_avx2(self) -> bool {
        self != Isa::Portable
    }

    /// The name used in logs and benchmark JSON.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}
