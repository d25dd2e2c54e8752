//! A minimal GGUF header reader: the metadata the benchmark needs (layers, KV heads,
//! head dimensions, BOS handling) and every tensor's type and size, so the KV budget
//! and the bytes a decode step reads can be computed from the file itself.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

/// Arrays longer than this (vocabularies, merges) are skipped, not stored.
const MAX_STORED_ARRAY: u64 = 4096;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Meta {
    UInt(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Meta>),
    /// An array too long to keep; its length.
    Skipped(u64),
}

impl Meta {
    fn as_u64(&self) -> Option<u64> {
        match *self {
            Meta::UInt(v) => Some(v),
            Meta::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// One tensor of the file.
#[derive(Debug, Clone, Serialize)]
pub struct Tensor {
    pub name: String,
    /// ggml type id (`ggml_type`).
    pub ggml_type: u32,
    pub elements: u64,
    /// Bytes of its data in the file.
    pub bytes: u64,
}

/// What the benchmark reads from a GGUF file.
#[derive(Debug, Clone)]
pub struct Gguf {
    pub path: PathBuf,
    pub file_bytes: u64,
    pub version: u32,
    pub meta: BTreeMap<String, Meta>,
    pub tensors: Vec<Tensor>,
}

/// The bytes one decode step reads from the weights, and what was counted.
#[derive(Debug, Clone, Serialize)]
pub struct DecodeBytes {
    pub bytes: u64,
    /// Tensors counted / in the file.
    pub tensors_counted: usize,
    pub tensors_total: usize,
    /// Which tensors were counted, in words.
    pub counted: String,
}

/// The f16 KV cache size per token and how it was derived.
#[derive(Debug, Clone, Serialize)]
pub struct KvPerToken {
    pub bytes: u64,
    pub n_layer: u64,
    /// KV heads per layer (usually all equal).
    pub n_head_kv: Vec<u64>,
    pub key_length: u64,
    pub value_length: u64,
    /// `{arch}.attention.sliding_window`, if the model has sliding-window layers.
    pub sliding_window: Option<u64>,
    /// The formula with the numbers.
    pub formula: String,
}

/// (elements per block, bytes per block) of a ggml type, `None` when unknown.
fn type_block(ggml_type: u32) -> Option<(u64, u64)> {
    Some(match ggml_type {
        0 => (1, 4),      // F32
        1 => (1, 2),      // F16
        2 => (32, 18),    // Q4_0
        3 => (32, 20),    // Q4_1
        6 => (32, 22),    // Q5_0
        7 => (32, 24),    // Q5_1
        8 => (32, 34),    // Q8_0
        9 => (32, 36),    // Q8_1
        10 => (256, 84),  // Q2_K
        11 => (256, 110), // Q3_K
        12 => (256, 144), // Q4_K
        13 => (256, 176), // Q5_K
        14 => (256, 210), // Q6_K
        15 => (256, 292), // Q8_K
        16 => (256, 66),  // IQ2_XXS
        17 => (256, 74),  // IQ2_XS
        18 => (256, 98),  // IQ3_XXS
        19 => (256, 50),  // IQ1_S
        20 => (32, 18),   // IQ4_NL
        21 => (256, 110), // IQ3_S
        22 => (256, 82),  // IQ2_S
        23 => (256, 136), // IQ4_XS
        24 => (1, 1),     // I8
        25 => (1, 2),     // I16
        26 => (1, 4),     // I32
        27 => (1, 8),     // I64
        28 => (1, 8),     // F64
        29 => (256, 56),  // IQ1_M
        30 => (1, 2),     // BF16
        34 => (256, 54),  // TQ1_0
        35 => (256, 66),  // TQ2_0
        39 => (32, 17),   // MXFP4
        _ => return None,
    })
}

/// Name of a ggml type id, for messages.
pub fn type_name(ggml_type: u32) -> &'static str {
    match ggml_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        20 => "IQ4_NL",
        23 => "IQ4_XS",
        30 => "BF16",
        _ => "other",
    }
}

struct Reader<R> {
    r: R,
}

impl<R: Read + Seek> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).context("truncated GGUF header")?;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self) -> Result<String> {
        let n = self.u64()?;
        if n > 1 << 24 {
            bail!("GGUF string of {n} bytes");
        }
        let mut b = vec![0u8; n as usize];
        self.r.read_exact(&mut b).context("truncated GGUF string")?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
    fn skip_string(&mut self) -> Result<()> {
        let n = self.u64()?;
        self.r
            .seek_relative(n as i64)
            .context("truncated GGUF string")?;
        Ok(())
    }

    /// A value of GGUF type `t`; with `keep` false, arrays are skipped.
    fn value(&mut self, t: u32, keep: bool) -> Result<Meta> {
        Ok(match t {
            0 => Meta::UInt(self.bytes::<1>()?[0] as u64),
            1 => Meta::Int(self.bytes::<1>()?[0] as i8 as i64),
            2 => Meta::UInt(u16::from_le_bytes(self.bytes()?) as u64),
            3 => Meta::Int(i16::from_le_bytes(self.bytes()?) as i64),
            4 => Meta::UInt(self.u32()? as u64),
            5 => Meta::Int(i32::from_le_bytes(self.bytes()?) as i64),
            6 => Meta::Float(f32::from_le_bytes(self.bytes()?) as f64),
            7 => Meta::Bool(self.bytes::<1>()?[0] != 0),
            8 if keep => Meta::Str(self.string()?),
            8 => {
                self.skip_string()?;
                Meta::Skipped(0)
            }
            9 => {
                let item = self.u32()?;
                let n = self.u64()?;
                let keep = keep && n <= MAX_STORED_ARRAY;
                let mut items = Vec::new();
                for _ in 0..n {
                    let v = self.value(item, keep)?;
                    if keep {
                        items.push(v);
                    }
                }
                if keep {
                    Meta::Array(items)
                } else {
                    Meta::Skipped(n)
                }
            }
            10 => Meta::UInt(self.u64()?),
            11 => Meta::Int(i64::from_le_bytes(self.bytes()?)),
            12 => Meta::Float(f64::from_le_bytes(self.bytes()?)),
            other => bail!("unknown GGUF value type {other}"),
        })
    }
}

impl Gguf {
    /// Reads the header (metadata and tensor table) of `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let file_bytes = file.metadata()?.len();
        let mut r = Reader {
            r: BufReader::with_capacity(1 << 20, file),
        };
        if &r.bytes::<4>()? != b"GGUF" {
            bail!("{} is not a GGUF file", path.display());
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            bail!(
                "{}: GGUF version {version} is not supported",
                path.display()
            );
        }
        let n_tensors = r.u64()?;
        let n_kv = r.u64()?;
        let mut meta = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            let t = r.u32()?;
            meta.insert(key, r.value(t, true)?);
        }
        let mut infos = Vec::new();
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            let mut elements: u64 = 1;
            for _ in 0..n_dims {
                elements = elements.saturating_mul(r.u64()?);
            }
            let ggml_type = r.u32()?;
            let offset = r.u64()?;
            infos.push((name, ggml_type, elements, offset));
        }
        let header_end = r.r.stream_position()?;
        let alignment = meta
            .get("general.alignment")
            .and_then(Meta::as_u64)
            .unwrap_or(32)
            .max(1);
        let data_start = header_end.div_ceil(alignment) * alignment;
        // Sizes from the types; a type this reader does not know gets the distance to the
        // next tensor's offset (its size plus alignment padding).
        let mut offsets: Vec<u64> = infos.iter().map(|i| i.3).collect();
        offsets.sort_unstable();
        let tensors = infos
            .into_iter()
            .map(|(name, ggml_type, elements, offset)| {
                let bytes = match type_block(ggml_type) {
                    Some((block, size)) => elements.div_ceil(block) * size,
                    None => {
                        let next = offsets
                            .iter()
                            .find(|&&o| o > offset)
                            .map_or(file_bytes.saturating_sub(data_start), |&o| o);
                        next - offset
                    }
                };
                Tensor {
                    name,
                    ggml_type,
                    elements,
                    bytes,
                }
            })
            .collect();
        Ok(Gguf {
            path: path.to_path_buf(),
            file_bytes,
            version,
            meta,
            tensors,
        })
    }

    /// `general.architecture`.
    pub fn arch(&self) -> Result<&str> {
        match self.meta.get("general.architecture") {
            Some(Meta::Str(s)) => Ok(s),
            _ => bail!("{}: no general.architecture", self.path.display()),
        }
    }

    fn arch_u64(&self, key: &str) -> Option<u64> {
        let arch = self.arch().ok()?;
        self.meta.get(&format!("{arch}.{key}"))?.as_u64()
    }

    /// Whether raw prompts get a BOS token, and its id. The key's absence means no BOS
    /// for BPE (`gpt2`) vocabularies and BOS for the others, as in llama.cpp.
    pub fn bos(&self) -> (bool, Option<u32>) {
        let id = self
            .meta
            .get("tokenizer.ggml.bos_token_id")
            .and_then(Meta::as_u64)
            .map(|v| v as u32);
        let add = match self.meta.get("tokenizer.ggml.add_bos_token") {
            Some(Meta::Bool(b)) => *b,
            _ => {
                !matches!(self.meta.get("tokenizer.ggml.model"), Some(Meta::Str(m)) if m == "gpt2")
            }
        };
        (add && id.is_some(), id)
    }

    /// Bytes of every tensor.
    pub fn weight_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes).sum()
    }

    /// The bytes a single-stream decode step reads: every tensor, except the token
    /// embedding when a separate output matrix exists (the embedding is then only
    /// looked up, one row per token). With tied embeddings the embedding is the output
    /// matrix and is read whole, so it counts.
    pub fn decode_bytes(&self) -> DecodeBytes {
        let has_output = self.tensors.iter().any(|t| t.name == "output.weight");
        let skip = |t: &Tensor| has_output && t.name == "token_embd.weight";
        let counted: Vec<&Tensor> = self.tensors.iter().filter(|t| !skip(t)).collect();
        let embd = self.tensors.iter().find(|t| t.name == "token_embd.weight");
        let words = match (has_output, embd) {
            (true, Some(e)) => format!(
                "all {} tensors except token_embd.weight ({} B, {}): output.weight is a \
                 separate output matrix, so the embedding is only looked up one row per token",
                counted.len(),
                e.bytes,
                type_name(e.ggml_type)
            ),
            (false, Some(e)) => format!(
                "all {} tensors, token_embd.weight ({} B, {}) included: it is also the output \
                 matrix (tied embeddings), read whole every step",
                counted.len(),
                e.bytes,
                type_name(e.ggml_type)
            ),
            _ => format!("all {} tensors", counted.len()),
        };
        DecodeBytes {
            bytes: counted.iter().map(|t| t.bytes).sum(),
            tensors_counted: counted.len(),
            tensors_total: self.tensors.len(),
            counted: words,
        }
    }

    /// f16 K and V bytes per token: the sum over layers of
    /// kv_heads x (key_length + value_length) x 2 bytes, i.e.
    /// 2 x layers x kv_heads x head_dim x 2 when K and V have the same width. The head
    /// dimensions are `{arch}.attention.key_length` / `value_length` when present, else
    /// embedding_length / head_count.
    pub fn kv_per_token(&self) -> Result<KvPerToken> {
        let arch = self.arch()?.to_owned();
        let n_layer = self
            .arch_u64("block_count")
            .ok_or_else(|| anyhow!("no {arch}.block_count"))?;
        let n_head = self
            .arch_u64("attention.head_count")
            .ok_or_else(|| anyhow!("no {arch}.attention.head_count"))?;
        let n_head_kv: Vec<u64> = match self.meta.get(&format!("{arch}.attention.head_count_kv")) {
            Some(Meta::Array(a)) => a.iter().filter_map(Meta::as_u64).collect(),
            Some(m) => vec![m.as_u64().unwrap_or(n_head); n_layer as usize],
            None => vec![n_head; n_layer as usize],
        };
        if n_head_kv.len() != n_layer as usize {
            bail!(
                "{arch}.attention.head_count_kv has {} entries for {n_layer} layers",
                n_head_kv.len()
            );
        }
        let embd = self
            .arch_u64("embedding_length")
            .ok_or_else(|| anyhow!("no {arch}.embedding_length"))?;
        let key_length = self
            .arch_u64("attention.key_length")
            .unwrap_or(embd / n_head.max(1));
        let value_length = self
            .arch_u64("attention.value_length")
            .unwrap_or(key_length);
        let bytes: u64 = n_head_kv
            .iter()
            .map(|h| h * (key_length + value_length) * 2)
            .sum();
        let uniform = n_head_kv.iter().all(|&h| h == n_head_kv[0]);
        let formula = if uniform && key_length == value_length {
            format!(
                "2 (K and V) x {n_layer} layers x {} kv_heads x {key_length} head_dim x 2 B (f16) \
                 = {bytes} B",
                n_head_kv[0]
            )
        } else {
            format!(
                "sum over {n_layer} layers of kv_heads x ({key_length} key + {value_length} value \
                 dims) x 2 B (f16) = {bytes} B"
            )
        };
        Ok(KvPerToken {
            bytes,
            n_layer,
            n_head_kv,
            key_length,
            value_length,
            sliding_window: self.arch_u64("attention.sliding_window"),
            formula,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF file with the given metadata (string keys, u32 values) and tensors.
    fn write_gguf(meta: &[(&str, u32)], tensors: &[(&str, &[u64], u32)]) -> PathBuf {
        let mut b = Vec::new();
        let s = |b: &mut Vec<u8>, t: &str| {
            b.extend((t.len() as u64).to_le_bytes());
            b.extend(t.as_bytes());
        };
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend((tensors.len() as u64).to_le_bytes());
        b.extend((meta.len() as u64 + 2).to_le_bytes());
        s(&mut b, "general.architecture");
        b.extend(8u32.to_le_bytes());
        s(&mut b, "llama");
        s(&mut b, "tokenizer.ggml.tokens");
        b.extend(9u32.to_le_bytes());
        b.extend(8u32.to_le_bytes());
        b.extend(5000u64.to_le_bytes());
        for i in 0..5000 {
            s(&mut b, &format!("t{i}"));
        }
        for (k, v) in meta {
            s(&mut b, k);
            b.extend(4u32.to_le_bytes());
            b.extend(v.to_le_bytes());
        }
        let mut offset = 0u64;
        for (name, dims, t) in tensors {
            s(&mut b, name);
            b.extend((dims.len() as u32).to_le_bytes());
            for d in *dims {
                b.extend(d.to_le_bytes());
            }
            b.extend(t.to_le_bytes());
            b.extend(offset.to_le_bytes());
            offset += 4096;
        }
        let path =
            std::env::temp_dir().join(format!("inferd-bench-gguf-{}.gguf", std::process::id()));
        std::fs::write(&path, b).unwrap();
        path
    }

    /// Every GGUF file in the repository's `models/` (none in a fresh checkout).
    #[test]
    fn reads_the_repository_models() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for path in entries.flatten().map(|e| e.path()) {
            if path.extension().is_none_or(|e| e != "gguf") {
                continue;
            }
            let g = Gguf::read(&path).unwrap();
            let kv = g.kv_per_token().unwrap();
            assert!(kv.bytes > 0, "{}", path.display());
            let w = g.weight_bytes();
            assert!(
                w <= g.file_bytes && w > g.file_bytes / 2,
                "{}",
                path.display()
            );
            assert!(g.decode_bytes().bytes <= w);
        }
    }

    #[test]
    fn reads_kv_and_decode_bytes() {
        let path = write_gguf(
            &[
                ("llama.block_count", 30),
                ("llama.attention.head_count", 9),
                ("llama.attention.head_count_kv", 3),
                ("llama.embedding_length", 576),
                ("tokenizer.ggml.bos_token_id", 1),
            ],
            &[
                ("token_embd.weight", &[576, 49152], 8),
                ("blk.0.attn_q.weight", &[576, 576], 3),
                ("blk.0.attn_norm.weight", &[576], 0),
            ],
        );
        let g = Gguf::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            g.meta["tokenizer.ggml.tokens"],
            Meta::Skipped(5000)
        ));
        let kv = g.kv_per_token().unwrap();
        assert_eq!(kv.bytes, 23_040);
        assert_eq!(kv.key_length, 64);
        // Q8_0 embedding: 576 x 49152 / 32 x 34; Q4_1: 576 x 576 / 32 x 20; F32 norm.
        let embd = 576 * 49152 / 32 * 34;
        let q = 576 * 576 / 32 * 20;
        assert_eq!(g.weight_bytes(), embd + q + 576 * 4);
        // Tied embeddings: the embedding is the output matrix and counts.
        let d = g.decode_bytes();
        assert_eq!(d.bytes, g.weight_bytes());
        assert!(d.counted.contains("tied"));
        // No add_bos_token key and no tokenizer model: BOS is added (llama.cpp's default
        // for non-BPE vocabularies).
        assert_eq!(g.bos(), (true, Some(1)));
    }
}
