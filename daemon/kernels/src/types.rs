//! ggml's weight type ids and block layouts (`enum ggml_type` and `type_traits` in
//! `ggml/src/ggml.c`), the ones this crate implements and the names of the others.

use crate::KernelError;

/// A weight type this crate has kernels for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

/// ggml's names of the type ids 0..=39 (`type_traits[].type_name`); `None` for ids that
/// ggml has removed.
const NAMES: [Option<&str>; 40] = [
    Some("f32"),
    Some("f16"),
    Some("q4_0"),
    Some("q4_1"),
    None,
    None,
    Some("q5_0"),
    Some("q5_1"),
    Some("q8_0"),
    Some("q8_1"),
    Some("q2_K"),
    Some("q3_K"),
    Some("q4_K"),
    Some("q5_K"),
    Some("q6_K"),
    Some("q8_K"),
    Some("iq2_xxs"),
    Some("iq2_xs"),
    Some("iq3_xxs"),
    Some("iq1_s"),
    Some("iq4_nl"),
    Some("iq3_s"),
    Some("iq2_s"),
    Some("iq4_xs"),
    Some("i8"),
    Some("i16"),
    Some("i32"),
    Some("i64"),
    Some("f64"),
    Some("iq1_m"),
    Some("bf16"),
    None,
    None,
    None,
    Some("tq1_0"),
    Some("tq2_0"),
    None,
    None,
    None,
    Some("mxfp4"),
];

impl GgmlType {
    /// Every implemented type, in ggml id order.
    pub const ALL: [GgmlType; 13] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Bf16,
    ];

    /// The implemented types' names, for error messages.
    pub const SUPPORTED_NAMES: &'static str =
        "f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, bf16";

    /// ggml's type id (`enum ggml_type`).
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Bf16 => 30,
        }
    }

    /// The type of ggml id `id`; an error naming the type (or the bare id) otherwise.
    pub fn from_id(id: u32) -> Result<Self, KernelError> {
        Self::ALL.into_iter().find(|t| t.id() == id).ok_or_else(|| {
            KernelError::Unsupported(match NAMES.get(id as usize).copied().flatten() {
                Some(name) => name.to_string(),
                None => format!("id {id}"),
            })
        })
    }

    /// ggml's name of a type id, implemented or not.
    pub fn name_of_id(id: u32) -> Option<&'static str> {
        NAMES.get(id as usize).copied().flatten()
    }

    /// ggml's name (`q4_K`, `bf16`, …).
    pub fn name(self) -> &'static str {
        NAMES[self.id() as usize].unwrap_or("?")
    }

    /// `(values, bytes)` per block.
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q5_0 => (32, 22),
            GgmlType::Q5_1 => (32, 24),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q2K => (256, 84),
            GgmlType::Q3K => (256, 110),
            GgmlType::Q4K => (256, 144),
            GgmlType::Q5K => (256, 176),
            GgmlType::Q6K => (256, 210),
        }
    }

    /// Whether the type is one of the 256-value K-quants (Q2_K–Q6_K).
    pub fn is_k_quant(self) -> bool {
        matches!(
            self,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K
        )
    }

    /// Bytes of a row of `k` values (`k` a multiple of the block).
    pub fn row_bytes(self, k: usize) -> usize {
        let (v, b) = self.block();
        k / v * b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unsupported_types_are_named() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Ok(t));
        }
        assert_eq!(GgmlType::Q4K.name(), "q4_K");
        assert_eq!(GgmlType::Bf16.name(), "bf16");
        let e = GgmlType::from_id(20).unwrap_err();
        assert_eq!(e, KernelError::Unsupported("iq4_nl".into()));
        assert!(e
            .to_string()
            .starts_with("weight type iq4_nl is not supported (supported: f32"));
        assert_eq!(
            GgmlType::from_id(39).unwrap_err(),
            KernelError::Unsupported("mxfp4".into())
        );
        assert_eq!(
            GgmlType::from_id(35).unwrap_err(),
            KernelError::Unsupported("tq2_0".into())
        );
        assert_eq!(
            GgmlType::from_id(77).unwrap_err(),
            KernelError::Unsupported("id 77".into())
        );
    }
}
