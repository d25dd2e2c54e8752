//! Block hashes and the model fingerprint.
//!
//! A full KV block is named by a chained hash (vLLM's automatic prefix caching and
//! llama.cpp's `--cache-reuse` both key blocks by their token prefix; the chain is
//! vLLM's `hash_block_tokens`):
//!
//! ```text
//! root = sha256("inferd-prefix-root\0" ‖ fingerprint ‖ len(salt) as u64 LE ‖ salt)
//! h_0  = sha256(root    ‖ fingerprint ‖ tokens of block 0 as u32 LE)
//! h_i  = sha256(h_{i-1} ‖ fingerprint ‖ tokens of block i as u32 LE)
//! ```
//!
//! so `h_i` names the whole prefix `0 ..= i`, the model and KV layout that produced
//! its K/V (the fingerprint) and the request's `cache_salt`. SHA-256 (FIPS 180-4) is
//! used rather than `std`'s `DefaultHasher` because persisted keys must be the same on
//! every build and machine, and a collision must be out of reach.

use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use sha2::{Digest, Sha256};

/// A 32-byte SHA-256 digest naming a full KV block and everything before it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({self})")
    }
}

impl fmt::Display for BlockHash {
    /// The first 8 bytes in hex (enough to tell blocks apart in a log).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Identity of everything that determines the K/V values a model writes for a token
/// prefix: the weights file, the architecture's shape, the KV element type, the block
/// size, the device kind and the cache format version. Blocks written under one
/// fingerprint are never served under another (it enters every [`BlockHash`] and every
/// stored entry).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModelFingerprint(pub [u8; 32]);

impl fmt::Debug for ModelFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModelFingerprint({})", BlockHash(self.0))
    }
}

/// Bytes of the weights file read for its identity: the first and last
/// [`EDGE_BYTES`] (GGUF header, metadata and tensor index at the front) plus
/// [`SAMPLES`] evenly spread windows of [`SAMPLE_BYTES`].
const EDGE_BYTES: u64 = 1 << 20;
const SAMPLES: u64 = 64;
const SAMPLE_BYTES: u64 = 64 << 10;

/// What goes into a [`ModelFingerprint`] besides the weights file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FingerprintParts<'a> {
    /// Version of the cache entry format and hashing scheme
    /// ([`super::entry::FORMAT_VERSION`]).
    pub format_version: u32,
    /// Architecture and shape (the model's [`crate::model::ModelSpec`] as text): any
    /// field that changes K or V.
    pub architecture: String,
    /// Element type of stored K/V, e.g. `"f16"`.
    pub kv_dtype: &'a str,
    /// Tokens per block.
    pub block_size: usize,
    /// Device kind (`"cpu"`, `"cuda"`): kernels differ in rounding between devices.
    pub device: &'a str,
    /// Kernels and weight conversion applied at load (`model.kernels`,
    /// `model.quantize`), as text.
    pub weights_policy: String,
}

/// Adds a file's identity to `h`: its length plus its first and last MiB and 64 spread
/// 64 KiB windows.
fn hash_file(h: &mut Sha256, path: &Path) -> std::io::Result<()> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    h.update(len.to_le_bytes());
    let mut windows = vec![(0, EDGE_BYTES.min(len))];
    if len > 2 * EDGE_BYTES {
        let span = len - 2 * EDGE_BYTES;
        for i in 0..SAMPLES {
            let start = EDGE_BYTES + span * i / SAMPLES;
            windows.push((start, SAMPLE_BYTES.min(len - start)));
        }
    }
    windows.push((len.saturating_sub(EDGE_BYTES), EDGE_BYTES.min(len)));
    let mut buf = Vec::new();
    for (start, n) in windows {
        f.seek(SeekFrom::Start(start))?;
        buf.resize(n as usize, 0);
        f.read_exact(&mut buf)?;
        h.update(&buf);
    }
    Ok(())
}

impl ModelFingerprint {
    /// Fingerprint of the model at `weights` loaded as `parts` describes. The file's
    /// identity is its length plus SHA-256 over its first and last MiB and 64 spread
    /// 64 KiB windows (about 6 MiB read, whatever the model's size; a changed GGUF
    /// header, tensor index or any sampled weight changes it).
    ///
    /// `mmproj`, a vision projector file loaded beside a GGUF model (`model.mmproj`),
    /// joins the identity the same way: image blocks' K/V come from its tower. A Hugging
    /// Face directory's `preprocessor_config.json` counts too (an image's hash is of its
    /// decoded pixels, the processor's output is not).
    ///
    /// # Errors
    /// A file cannot be read.
    pub fn compute(
        weights: &Path,
        mmproj: Option<&Path>,
        parts: &FingerprintParts<'_>,
    ) -> std::io::Result<Self> {
        let mut h = Sha256::new();
        h.update(b"inferd-model-fingerprint\0");
        if weights.is_dir() {
            // A Hugging Face directory: its config, image processor and every safetensors
            // file, by name.
            let mut files: Vec<_> = std::fs::read_dir(weights)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension().is_some_and(|x| x == "safetensors")
                        || p.file_name()
                            .is_some_and(|n| n == "config.json" || n == "preprocessor_config.json")
                })
                .collect();
            files.sort();
            for f in files {
                h.update(
                    f.file_name()
                        .map(|n| n.as_encoded_bytes())
                        .unwrap_or_default(),
                );
                hash_file(&mut h, &f)?;
            }
        } else {
            hash_file(&mut h, weights)?;
        }
        if let Some(m) = mmproj {
            h.update(b"mmproj\0");
            hash_file(&mut h, m)?;
        }
        Ok(Self::from_parts(h.finalize().into(), parts))
    }

    /// Fingerprint from an already computed file identity (tests use synthetic ones).
    pub fn from_parts(file_identity: [u8; 32], parts: &FingerprintParts<'_>) -> Self {
        let mut h = Sha256::new();
        h.update(b"inferd-kv-fingerprint\0");
        h.update(file_identity);
        for field in [
            parts.format_version.to_string().as_str(),
            parts.architecture.as_str(),
            parts.kv_dtype,
            parts.block_size.to_string().as_str(),
            parts.device,
            parts.weights_policy.as_str(),
        ] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field.as_bytes());
        }
        Self(h.finalize().into())
    }
}

/// The chain's starting point for requests with `cache_salt` = `salt` (empty: no salt).
pub fn root_hash(fingerprint: &ModelFingerprint, salt: &str) -> BlockHash {
    let mut h = Sha256::new();
    h.update(b"inferd-prefix-root\0");
    h.update(fingerprint.0);
    h.update((salt.len() as u64).to_le_bytes());
    h.update(salt.as_bytes());
    BlockHash(h.finalize().into())
}

/// The chain's starting point for a request that runs with a LoRA adapter: the
/// adapter's file fingerprint and the request's scale follow the salt, so its blocks
/// never match the base model's or another adapter's (vLLM's `extra_keys`, mistral.rs's
/// `ExtraHashKey`). `None` is [`root_hash`] itself.
///
/// root = sha256("inferd-prefix-root\0" ‖ fingerprint ‖ len(salt) as u64 LE ‖ salt
///               ‖ "lora\0" ‖ adapter fingerprint ‖ scale as f32 bits LE)
pub fn root_hash_with(
    fingerprint: &ModelFingerprint,
    salt: &str,
    adapter: Option<&crate::adapters::AdapterKey>,
) -> BlockHash {
    let Some(a) = adapter else {
        return root_hash(fingerprint, salt);
    };
    let mut h = Sha256::new();
    h.update(b"inferd-prefix-root\0");
    h.update(fingerprint.0);
    h.update((salt.len() as u64).to_le_bytes());
    h.update(salt.as_bytes());
    h.update(b"lora\0");
    h.update(a.fingerprint);
    h.update(a.scale.to_bits().to_le_bytes());
    BlockHash(h.finalize().into())
}

/// `h_i` from `h_{i-1}` (`parent`) and block `i`'s token ids.
pub fn chain_hash(parent: &BlockHash, fingerprint: &ModelFingerprint, tokens: &[u32]) -> BlockHash {
    let mut h = Sha256::new();
    h.update(parent.0);
    h.update(fingerprint.0);
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    BlockHash(h.finalize().into())
}

/// [`chain_hash`] of a block that holds image placeholder tokens: the content hashes
/// of its images (in prompt order) follow the token ids, so equal tokens with other
/// pictures give another hash (vLLM's `extra_keys` of multimodal blocks). With no
/// image it is [`chain_hash`].
pub fn chain_hash_with(
    parent: &BlockHash,
    fingerprint: &ModelFingerprint,
    tokens: &[u32],
    images: &[[u8; 32]],
) -> BlockHash {
    if images.is_empty() {
        return chain_hash(parent, fingerprint, tokens);
    }
    let mut h = Sha256::new();
    h.update(parent.0);
    h.update(fingerprint.0);
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    h.update(b"images");
    for i in images {
        h.update(i);
    }
    BlockHash(h.finalize().into())
}

/// Extends `hashes` (the hashes of the first `hashes.len()` full blocks of `tokens`) to
/// cover the first `n_blocks` full blocks of `block_size` tokens, starting the chain at
/// `root`. Does nothing when `tokens` holds fewer full blocks.
pub fn extend_hashes(
    hashes: &mut Vec<BlockHash>,
    root: &BlockHash,
    fingerprint: &ModelFingerprint,
    tokens: &[u32],
    block_size: usize,
    n_blocks: usize,
) {
    extend_hashes_with(hashes, root, fingerprint, tokens, &[], block_size, n_blocks);
}

/// [`extend_hashes`] for a prompt with `images`: a block holding one of their tokens
/// is hashed with their content hashes ([`chain_hash_with`]).
pub fn extend_hashes_with(
    hashes: &mut Vec<BlockHash>,
    root: &BlockHash,
    fingerprint: &ModelFingerprint,
    tokens: &[u32],
    images: &[std::sync::Arc<crate::request::PromptImage>],
    block_size: usize,
    n_blocks: usize,
) {
    let n_blocks = n_blocks.min(tokens.len() / block_size.max(1));
    while hashes.len() < n_blocks {
        let i = hashes.len();
        let parent = hashes.last().copied().unwrap_or(*root);
        let block = &tokens[i * block_size..(i + 1) * block_size];
        let keys =
            crate::request::media::block_images(images, i * block_size, (i + 1) * block_size);
        hashes.push(chain_hash_with(&parent, fingerprint, block, &keys));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(tag: u8) -> ModelFingerprint {
        ModelFingerprint([tag; 32])
    }

    #[test]
    fn hash_is_sha256_of_the_documented_bytes() {
        // Reference computed independently: sha256(32 zero bytes ‖ 32 × 0x01 ‖ 1u32 LE ‖ 2u32 LE).
        let mut bytes = vec![0u8; 32];
        bytes.extend([1u8; 32]);
        bytes.extend(1u32.to_le_bytes());
        bytes.extend(2u32.to_le_bytes());
        let want: [u8; 32] = Sha256::digest(&bytes).into();
        assert_eq!(chain_hash(&BlockHash([0; 32]), &fp(1), &[1, 2]).0, want);
        // And a fixed value, so a change of the scheme cannot pass unnoticed.
        assert_eq!(
            chain_hash(&BlockHash([0; 32]), &fp(1), &[1, 2]).to_string(),
            BlockHash(want).to_string()
        );
    }

    #[test]
    fn chain_depends_on_prefix_salt_and_fingerprint() {
        let toks: Vec<u32> = (0..64).collect();
        let chain = |salt: &str, f: u8, toks: &[u32]| {
            let mut v = Vec::new();
            extend_hashes(&mut v, &root_hash(&fp(f), salt), &fp(f), toks, 16, 99);
            v
        };
        let a = chain("", 1, &toks);
        assert_eq!(a.len(), 4);
        assert_eq!(a, chain("", 1, &toks), "deterministic");
        assert_ne!(a[0], chain("tenant-b", 1, &toks)[0], "salt enters the hash");
        let key = |f: u8, scale: f32| crate::adapters::AdapterKey {
            fingerprint: [f; 32],
            scale,
        };
        let root = |k: Option<crate::adapters::AdapterKey>| root_hash_with(&fp(1), "", k.as_ref());
        assert_eq!(
            root(None),
            root_hash(&fp(1), ""),
            "the base's chain is unchanged"
        );
        assert_ne!(
            root(Some(key(1, 1.0))),
            root(None),
            "an adapter enters the root"
        );
        assert_ne!(
            root(Some(key(1, 1.0))),
            root(Some(key(2, 1.0))),
            "which adapter"
        );
        assert_ne!(
            root(Some(key(1, 1.0))),
            root(Some(key(1, 0.5))),
            "at which scale"
        );
        assert_ne!(a[0], chain("", 2, &toks)[0], "fingerprint enters the hash");
        let mut other = toks.clone();
        other[3] = 999; // block 0 differs → every later block differs too
        let b = chain("", 1, &other);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
        other = toks.clone();
        other[40] = 999; // block 2 differs → blocks 0, 1 shared
        let c = chain("", 1, &other);
        assert_eq!(a[..2], c[..2]);
        assert_ne!(a[2], c[2]);
        assert_ne!(a[3], c[3]);
        // Partial trailing block: not hashed.
        assert_eq!(chain("", 1, &toks[..47]).len(), 2);
    }

    #[test]
    fn fingerprint_covers_every_part_and_the_file() {
        let base = FingerprintParts {
            format_version: 1,
            architecture: "llama L2".into(),
            kv_dtype: "f16",
            block_size: 16,
            device: "cpu",
            weights_policy: "auto".into(),
        };
        let f0 = ModelFingerprint::from_parts([0; 32], &base);
        assert_ne!(f0, ModelFingerprint::from_parts([1; 32], &base));
        let variants = [
            FingerprintParts {
                format_version: 2,
                ..base.clone()
            },
            FingerprintParts {
                architecture: "llama L3".into(),
                ..base.clone()
            },
            FingerprintParts {
                kv_dtype: "f32",
                ..base.clone()
            },
            FingerprintParts {
                block_size: 32,
                ..base.clone()
            },
            FingerprintParts {
                device: "cuda",
                ..base.clone()
            },
            FingerprintParts {
                weights_policy: "repack".into(),
                ..base.clone()
            },
        ];
        for v in &variants {
            assert_ne!(f0, ModelFingerprint::from_parts([0; 32], v), "{v:?}");
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("w.bin");
        let mut data = vec![7u8; 5 << 20];
        std::fs::write(&p, &data).expect("write");
        let a = ModelFingerprint::compute(&p, None, &base).expect("fp");
        assert_eq!(a, ModelFingerprint::compute(&p, None, &base).expect("fp"));
        // A vision projector beside the model, and a changed one, each change it.
        let m = dir.path().join("mmproj.gguf");
        std::fs::write(&m, [1u8; 4096]).expect("write");
        let with = ModelFingerprint::compute(&p, Some(&m), &base).expect("fp");
        assert_ne!(a, with);
        std::fs::write(&m, [2u8; 4096]).expect("write");
        assert_ne!(
            with,
            ModelFingerprint::compute(&p, Some(&m), &base).expect("fp")
        );
        data[100] = 8; // inside the first MiB
        std::fs::write(&p, &data).expect("write");
        assert_ne!(a, ModelFingerprint::compute(&p, None, &base).expect("fp"));
    }
}
