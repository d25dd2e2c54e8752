//! Finds the first tensor of a GGUF file whose ggml type has no kernel here, so that
//! start-up can name it (candle's reader stops at the type id without the tensor's
//! name).
//!
//! Format: GGUF v2/v3 (`gguf-py/gguf/constants.py` and `ggml/include/gguf.h` in
//! llama.cpp): magic, version u32, tensor count u64, metadata count u64; each metadata
//! entry a string key, a u32 value type and the value; each tensor info a string name,
//! u32 dimension count, that many u64 dimensions, u32 ggml type, u64 offset. Strings are
//! a u64 length and the bytes. Little endian throughout.

use std::io::{self, BufRead, Seek, SeekFrom};

use inferd_kernels::GgmlType;

/// Longest tensor name read (llama.cpp's `GGML_MAX_NAME` is 64); longer ones are cut.
const MAX_NAME: u64 = 256;

fn u32_of(r: &mut impl BufRead) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn u64_of(r: &mut impl BufRead) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn skip(r: &mut (impl BufRead + Seek), n: u64) -> io::Result<()> {
    let n = i64::try_from(n).map_err(|_| io::Error::other("length overflows"))?;
    r.seek(SeekFrom::Current(n)).map(|_| ())
}

/// Skips one metadata value of type `ty` (arrays recursively, one level as GGUF has).
fn skip_value(r: &mut (impl BufRead + Seek), ty: u32, depth: u32) -> io::Result<()> {
    let fixed = match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => {
            let n = u64_of(r)?;
            return skip(r, n);
        }
        9 if depth == 0 => {
            let item = u32_of(r)?;
            let n = u64_of(r)?;
            if matches!(item, 8 | 9) {
                for _ in 0..n {
                    skip_value(r, item, depth + 1)?;
                }
                return Ok(());
            }
            let size = match item {
                0 | 1 | 7 => 1,
                2 | 3 => 2,
                4..=6 => 4,
                10..=12 => 8,
                _ => return Err(io::Error::other(format!("array of value type {item}"))),
            };
            return skip(r, n.saturating_mul(size));
        }
        _ => return Err(io::Error::other(format!("value type {ty}"))),
    };
    skip(r, fixed)
}

/// `(tensor name, ggml type name or "id N")` of the first tensor whose type this build
/// has no kernel for, or `None` (all supported, or the header unreadable: the caller
/// reports its own error then).
pub fn first_unsupported(r: &mut (impl BufRead + Seek)) -> Option<(String, String)> {
    scan(r).ok().flatten()
}

fn scan(r: &mut (impl BufRead + Seek)) -> io::Result<Option<(String, String)>> {
    r.seek(SeekFrom::Start(0))?;
    if u32_of(r)? != u32::from_le_bytes(*b"GGUF") || u32_of(r)? < 2 {
        return Ok(None);
    }
    let tensors = u64_of(r)?;
    let entries = u64_of(r)?;
    for _ in 0..entries {
        let key_len = u64_of(r)?;
        skip(r, key_len)?;
        let ty = u32_of(r)?;
        skip_value(r, ty, 0)?;
    }
    for _ in 0..tensors {
        let len = u64_of(r)?;
        let mut name = vec![0u8; len.min(MAX_NAME) as usize];
        r.read_exact(&mut name)?;
        skip(r, len.saturating_sub(MAX_NAME))?;
        let dims = u32_of(r)?;
        skip(r, u64::from(dims).saturating_mul(8))?;
        let ty = u32_of(r)?;
        let _offset = u64_of(r)?;
        if GgmlType::from_id(ty).is_err() && !matches!(ty, 9 | 15) {
            let type_name = GgmlType::name_of_id(ty)
                .map(str::to_string)
                .unwrap_or_else(|| format!("id {ty}"));
            return Ok(Some((
                String::from_utf8_lossy(&name).into_owned(),
                type_name,
            )));
        }
    }
    Ok(None)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal GGUF v3 header: `general.architecture = llama`, a string array, and
    /// tensors `(name, ggml type id)` of shape (32, 2).
    pub(crate) fn header(tensors: &[(&str, u32)]) -> Vec<u8> {
        let mut b = Vec::new();
        let s = |b: &mut Vec<u8>, v: &str| {
            b.extend((v.len() as u64).to_le_bytes());
            b.extend(v.as_bytes());
        };
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend(2u64.to_le_bytes());
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "llama");
        s(&mut b, "tokenizer.ggml.tokens");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        s(&mut b, "a");
        s(&mut b, "bc");
        for (name, ty) in tensors {
            s(&mut b, name);
            b.extend(2u32.to_le_bytes());
            b.extend(32u64.to_le_bytes());
            b.extend(2u64.to_le_bytes());
            b.extend(ty.to_le_bytes());
            b.extend(0u64.to_le_bytes());
        }
        b
    }

    #[test]
    fn names_the_first_unsupported_tensor_and_type() {
        let f = header(&[
            ("token_embd.weight", 8),
            ("blk.0.attn_q.weight", 20),
            ("x", 39),
        ]);
        let got = first_unsupported(&mut io::Cursor::new(f));
        assert_eq!(got, Some(("blk.0.attn_q.weight".into(), "iq4_nl".into())));
        let f = header(&[("a", 12), ("b", 35)]);
        assert_eq!(
            first_unsupported(&mut io::Cursor::new(f)),
            Some(("b".into(), "tq2_0".into()))
        );
        let f = header(&[("a", 12), ("b", 99)]);
        assert_eq!(
            first_unsupported(&mut io::Cursor::new(f)),
            Some(("b".into(), "id 99".into()))
        );
        let f = header(&[("a", 12), ("b", 30), ("c", 0)]);
        assert_eq!(first_unsupported(&mut io::Cursor::new(f)), None);
        // Truncated: no answer, the caller reports its own error.
        let f = header(&[("a", 20)]);
        assert_eq!(
            first_unsupported(&mut io::Cursor::new(&f[..f.len() - 14])),
            None
        );
    }
}

#[cfg(test)]
mod open_tests {
    use crate::model::source::gguf::GgufSource;

    #[test]
    fn start_up_refuses_an_iq4_nl_tensor_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("iq.gguf");
        let mut bytes =
            super::tests::header(&[("token_embd.weight", 8), ("blk.0.ffn_down.weight", 20)]);
        bytes.resize(bytes.len() + 4096, 0);
        std::fs::write(&path, bytes).expect("write");
        let err = GgufSource::open(&path).err().expect("refused");
        assert_eq!(
            err.to_string(),
            "tensor `blk.0.ffn_down.weight` has ggml type iq4_nl, which inferd does not implement \
             (supported: f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, bf16)"
        );
    }
}
