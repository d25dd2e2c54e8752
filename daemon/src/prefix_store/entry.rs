//! The on-disk value of one cached block, self-describing and checksummed.
//!
//! Layout (little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `IKVB` |
//! | 4 | format version ([`FORMAT_VERSION`]) |
//! | 32 | model fingerprint |
//! | 32 | the block's hash (its key) |
//! | 4 | `n` = tokens in the block |
//! | 4·n | token ids |
//! | 8 | `m` = K/V payload bytes |
//! | m | K/V payload ([`crate::model::KvBlockPool::read_block`] layout) |
//! | 4 | CRC-32 (IEEE 802.3, as zlib) of every byte before it |
//!
//! A value that is short, has another magic, version or fingerprint, names another
//! hash or other tokens, or fails its checksum is rejected ([`EntryError`]); the store
//! deletes it and the block is recomputed.

use super::hash::{BlockHash, ModelFingerprint};

/// Version of the entry layout and of the hashing scheme; part of the fingerprint too.
pub const FORMAT_VERSION: u32 = 1;

const MAGIC: &[u8; 4] = b"IKVB";

/// Why a stored value was not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Shorter than its own lengths say (a torn write).
    #[error("truncated entry ({0} bytes)")]
    Truncated(usize),
    /// Not an entry of this store.
    #[error("bad magic")]
    BadMagic,
    /// Written by another format version.
    #[error("format version {0} (this build reads {FORMAT_VERSION})")]
    Version(u32),
    /// Written for another model, dtype or block size.
    #[error("written for another model fingerprint")]
    Fingerprint,
    /// The entry names another block.
    #[error("entry names another block hash")]
    Hash,
    /// The token ids differ from the request's.
    #[error("token ids differ from the request's")]
    Tokens,
    /// The payload is not one block of this model.
    #[error("K/V payload is {got} bytes, expected {want}")]
    PayloadSize {
        /// Bytes found.
        got: usize,
        /// Bytes of one block.
        want: usize,
    },
    /// The CRC-32 does not match.
    #[error("checksum mismatch")]
    Checksum,
}

/// Encodes one block's entry.
pub fn encode(fp: &ModelFingerprint, hash: &BlockHash, tokens: &[u32], kv: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 4 + 32 + 32 + 4 + 4 * tokens.len() + 8 + kv.len() + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&fp.0);
    out.extend_from_slice(&hash.0);
    out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&(kv.len() as u64).to_le_bytes());
    out.extend_from_slice(kv);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// A cursor that fails with [`EntryError::Truncated`] past the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EntryError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or(EntryError::Truncated(self.bytes.len()))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32, EntryError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, EntryError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

/// Bytes of the header [`header`] reads: magic, version, fingerprint, hash.
pub const HEADER_BYTES: usize = 4 + 4 + 32 + 32;

/// Reads the fingerprint and block hash from the first [`HEADER_BYTES`] of an entry
/// without checking the rest (the store adopts block files its index lost by these;
/// the whole entry is still verified by [`decode`] before it is served).
///
/// # Errors
/// [`EntryError::Truncated`], [`EntryError::BadMagic`] or [`EntryError::Version`].
pub fn header(bytes: &[u8]) -> Result<(ModelFingerprint, BlockHash), EntryError> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(4)? != MAGIC {
        return Err(EntryError::BadMagic);
    }
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(EntryError::Version(version));
    }
    let mut fp = [0u8; 32];
    fp.copy_from_slice(r.take(32)?);
    let mut h = [0u8; 32];
    h.copy_from_slice(r.take(32)?);
    Ok((ModelFingerprint(fp), BlockHash(h)))
}

/// Checks an entry against what the request expects and returns its K/V payload.
///
/// # Errors
/// [`EntryError`]: the first check that failed.
pub fn decode<'a>(
    bytes: &'a [u8],
    fp: &ModelFingerprint,
    hash: &BlockHash,
    tokens: &[u32],
    block_bytes: usize,
) -> Result<&'a [u8], EntryError> {
    if bytes.len() < 4 {
        return Err(EntryError::Truncated(bytes.len()));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let mut r = Reader { bytes: body, at: 0 };
    if r.take(4)? != MAGIC {
        return Err(EntryError::BadMagic);
    }
    let version = r.u32()?;
    if version != FORMAT_VERSION {
        return Err(EntryError::Version(version));
    }
    if r.take(32)? != fp.0 {
        return Err(EntryError::Fingerprint);
    }
    if r.take(32)? != hash.0 {
        return Err(EntryError::Hash);
    }
    let n = r.u32()? as usize;
    if n != tokens.len() {
        return Err(EntryError::Tokens);
    }
    let ids = r.take(n.checked_mul(4).ok_or(EntryError::Truncated(bytes.len()))?)?;
    let m = usize::try_from(r.u64()?).map_err(|_| EntryError::Truncated(bytes.len()))?;
    let kv = r.take(m)?;
    if r.at != body.len() {
        return Err(EntryError::Truncated(bytes.len()));
    }
    if crc != crc32fast::hash(body).to_le_bytes() {
        return Err(EntryError::Checksum);
    }
    // Checked after the checksum: a flipped bit reports as corruption, not as a miss.
    if ids
        .chunks_exact(4)
        .zip(tokens)
        .any(|(b, &t)| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != t)
    {
        return Err(EntryError::Tokens);
    }
    if kv.len() != block_bytes {
        return Err(EntryError::PayloadSize {
            got: kv.len(),
            want: block_bytes,
        });
    }
    Ok(kv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_rejection() {
        let fp = ModelFingerprint([3; 32]);
        let h = BlockHash([9; 32]);
        let toks = [5u32, 6, 7, 8];
        let kv: Vec<u8> = (0..64).map(|i| i as u8).collect();
        let e = encode(&fp, &h, &toks, &kv);
        assert_eq!(e.len(), 4 + 4 + 32 + 32 + 4 + 16 + 8 + 64 + 4);
        assert_eq!(decode(&e, &fp, &h, &toks, 64), Ok(kv.as_slice()));
        assert_eq!(header(&e[..HEADER_BYTES]), Ok((fp, h)));
        assert_eq!(
            header(&e[..HEADER_BYTES - 1]),
            Err(EntryError::Truncated(71))
        );

        assert_eq!(
            decode(&e, &ModelFingerprint([4; 32]), &h, &toks, 64),
            Err(EntryError::Fingerprint)
        );
        assert_eq!(
            decode(&e, &fp, &BlockHash([1; 32]), &toks, 64),
            Err(EntryError::Hash)
        );
        assert_eq!(
            decode(&e, &fp, &h, &[5, 6, 7, 9], 64),
            Err(EntryError::Tokens)
        );
        assert_eq!(decode(&e, &fp, &h, &[5, 6, 7], 64), Err(EntryError::Tokens));
        assert_eq!(
            decode(&e, &fp, &h, &toks, 32),
            Err(EntryError::PayloadSize { got: 64, want: 32 })
        );
        // Every single flipped bit in the payload or the ids is caught by the checksum.
        for at in [0usize, 40, 75, 80, 100, e.len() - 5] {
            let mut bad = e.clone();
            bad[at] ^= 0x10;
            assert!(decode(&bad, &fp, &h, &toks, 64).is_err(), "flip at {at}");
        }
        let mut bad = e.clone();
        bad[100] ^= 1;
        assert_eq!(decode(&bad, &fp, &h, &toks, 64), Err(EntryError::Checksum));
        // Every truncation is rejected.
        for n in 0..e.len() {
            assert!(decode(&e[..n], &fp, &h, &toks, 64).is_err(), "cut at {n}");
        }
        let mut v = e.clone();
        v[4] = 2;
        assert_eq!(decode(&v, &fp, &h, &toks, 64), Err(EntryError::Version(2)));
        v = e.clone();
        v[0] = b'X';
        assert_eq!(decode(&v, &fp, &h, &toks, 64), Err(EntryError::BadMagic));
    }
}
