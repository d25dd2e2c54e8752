//! Loading a GGUF file (format: ggml's docs/gguf.md) into a [`LlamaModel`].
//!
//! Parsing is candle's bounded `gguf_file` reader; every metadata key and tensor shape
//! the forward pass relies on is checked here so a corrupt or foreign file is refused at
//! start-up with a message, never a panic.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::Device;

use super::llama::{rope_tables, Block, Linear, LlamaConfig, LlamaModel, Mlp, Qkv, TokenEmbedding};
use super::q4_1::Q4_1Matrix;
use super::q8_0::Q8_0Matrix;
use super::{candle_error_message, ModelError};

/// What to do with Q4_1 weight matrices.
///
/// candle 0.11 has no SIMD kernel for Q4_1 on x86: the SmolLM2 Q4_1 file decodes at
/// ~24 tok/s on 2 cores through it, against ~69 tok/s for the same weights as Q8_0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Q4_1Policy {
    /// Dequantize each Q4_1 matrix at load and re-quantize it to Q8_0 (32-value blocks,
    /// one f16 scale), which candle runs with AVX2/AVX-512 kernels. The added rounding
    /// error is at most 1/254 of each block's largest magnitude, about 1/17 of a Q4_1 step.
    RequantizeQ8_0,
    /// Keep Q4_1 and run it through our AVX2 kernel ([`super::q4_1::Q4_1Matrix`]), which
    /// quantizes activations to Q8_1 like ggml: llama.cpp's numerics at SIMD speed.
    /// Q8_0 matrices (the output head) go through [`super::q8_0::Q8_0Matrix`], also in
    /// ggml's numerics; the query/key/value and gate/up projections are fused.
    Native,
    /// Keep Q4_1 and use candle's portable kernel (same numerics as `native`, slow;
    /// kept as a reference for tests and benchmarks).
    CandlePortable,
}

/// Options for [`load_gguf`].
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Device for the weights.
    pub device: Device,
    /// Handling of Q4_1 matrices.
    pub q4_1: Q4_1Policy,
}

/// A model file loaded into memory.
#[derive(Debug)]
pub struct LoadedModel {
    /// The model weights.
    pub model: LlamaModel,
    /// All GGUF metadata (tokenizer keys included), for the tokenizer and templates.
    pub metadata: HashMap<String, Value>,
    /// The path the model was loaded from.
    pub path: PathBuf,
    /// `general.architecture`.
    pub architecture: String,
}

fn meta_u32(md: &HashMap<String, Value>, key: &str) -> Result<Option<u32>, ModelError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => v.to_u32().map(Some).or_else(|_| {
            v.to_u64()
                .ok()
                .and_then(|x| u32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| ModelError::Metadata {
                    key: key.to_string(),
                    message: format!("expected an unsigned integer, found {v:?}"),
                })
        }),
    }
}

fn require_u32(md: &HashMap<String, Value>, key: &str) -> Result<usize, ModelError> {
    match meta_u32(md, key)? {
        Some(0) => Err(ModelError::Metadata {
            key: key.to_string(),
            message: "must be > 0".into(),
        }),
        Some(v) => Ok(v as usize),
        None => Err(ModelError::Metadata {
            key: key.to_string(),
            message: "missing".into(),
        }),
    }
}

fn meta_f32(md: &HashMap<String, Value>, key: &str) -> Result<Option<f32>, ModelError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => v.to_f32().map(Some).map_err(|_| ModelError::Metadata {
            key: key.to_string(),
            message: format!("expected a float, found {v:?}"),
        }),
    }
}

/// Reads the `llama.*` hyper-parameters and checks them for consistency.
fn llama_config(md: &HashMap<String, Value>, arch: &str) -> Result<LlamaConfig, ModelError> {
    let k = |s: &str| format!("{arch}.{s}");
    let n_layer = require_u32(md, &k("block_count"))?;
    let n_embd = require_u32(md, &k("embedding_length"))?;
    let n_head = require_u32(md, &k("attention.head_count"))?;
    let n_kv_head = meta_u32(md, &k("attention.head_count_kv"))?.map_or(n_head, |v| v as usize);
    if n_kv_head == 0 || n_head % n_kv_head != 0 || n_embd % n_head != 0 {
        return Err(ModelError::Metadata {
            key: k("attention.head_count_kv"),
            message: format!(
                "inconsistent heads: embedding_length {n_embd}, head_count {n_head}, head_count_kv {n_kv_head}"
            ),
        });
    }
    let head_dim = n_embd / n_head;
    let rope_dim = meta_u32(md, &k("rope.dimension_count"))?.map_or(head_dim, |v| v as usize);
    if rope_dim == 0 || rope_dim > head_dim || rope_dim % 2 != 0 {
        return Err(ModelError::Metadata {
            key: k("rope.dimension_count"),
            message: format!("must be even and in [2, {head_dim}] (got {rope_dim})"),
        });
    }
    let rope_theta = meta_f32(md, &k("rope.freq_base"))?.unwrap_or(10_000.0);
    let rms_eps = meta_f32(md, &k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5);
    let context_length = require_u32(md, &k("context_length"))?;
    Ok(LlamaConfig {
        n_layer,
        n_embd,
        n_head,
        n_kv_head,
        head_dim,
        rope_dim,
        rope_theta,
        rms_eps,
        context_length,
        vocab_size: 0,
    })
}

struct TensorReader<'a> {
    content: &'a Content,
    reader: BufReader<File>,
    device: &'a Device,
}

impl TensorReader<'_> {
    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Reads tensor `name` and checks its shape (candle order: rows first).
    fn read(&mut self, name: &str, dims: &[usize]) -> Result<QTensor, ModelError> {
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| ModelError::Tensor {
                name: name.to_string(),
                message: "missing".into(),
            })?;
        if info.shape.dims() != dims {
            return Err(ModelError::Tensor {
                name: name.to_string(),
                message: format!("expected shape {dims:?}, found {:?}", info.shape.dims()),
            });
        }
        self.content
            .tensor(&mut self.reader, name, self.device)
            .map_err(|e| ModelError::Tensor {
                name: name.to_string(),
                message: candle_error_message(&e),
            })
    }

    fn matmul(
        &mut self,
        name: &str,
        dims: &[usize],
        q4_1: Q4_1Policy,
    ) -> Result<Linear, ModelError> {
        let t = self.read(name, dims)?;
        let linear = match (t.dtype(), q4_1) {
            (GgmlDType::Q4_1, Q4_1Policy::RequantizeQ8_0) if dims[1].is_multiple_of(32) => {
                let f = t.dequantize(self.device)?;
                Linear::Candle(QMatMul::from_qtensor(QTensor::quantize(
                    &f,
                    GgmlDType::Q8_0,
                )?)?)
            }
            (GgmlDType::Q4_1, Q4_1Policy::Native) if self.device.is_cpu() => Linear::Q4_1(
                Q4_1Matrix::from_qtensor(&t).map_err(|e| ModelError::Tensor {
                    name: name.to_string(),
                    message: candle_error_message(&e),
                })?,
            ),
            (GgmlDType::Q8_0, Q4_1Policy::Native) if self.device.is_cpu() => Linear::Q8_0(
                Q8_0Matrix::from_qtensor(&t).map_err(|e| ModelError::Tensor {
                    name: name.to_string(),
                    message: candle_error_message(&e),
                })?,
            ),
            _ => Linear::Candle(QMatMul::from_qtensor(t)?),
        };
        Ok(linear)
    }

    /// The query/key/value projections, fused into one Q4_1 matrix when all three are
    /// Q4_1 kernels (one activation quantization and one parallel pass per layer).
    fn qkv(
        &mut self,
        layer: usize,
        e: usize,
        kv_dim: usize,
        q4_1: Q4_1Policy,
    ) -> Result<Qkv, ModelError> {
        let p = |s: &str| format!("blk.{layer}.{s}.weight");
        let q = self.matmul(&p("attn_q"), &[e, e], q4_1)?;
        let k = self.matmul(&p("attn_k"), &[kv_dim, e], q4_1)?;
        let v = self.matmul(&p("attn_v"), &[kv_dim, e], q4_1)?;
        Ok(match (q, k, v) {
            (Linear::Q4_1(q), Linear::Q4_1(k), Linear::Q4_1(v))
                if e.is_multiple_of(4) && kv_dim.is_multiple_of(4) =>
            {
                Qkv::Fused(
                    Q4_1Matrix::concat(&[&q, &k, &v]).map_err(|err| ModelError::Tensor {
                        name: p("attn_q"),
                        message: candle_error_message(&err),
                    })?,
                )
            }
            (q, k, v) => Qkv::Separate { q, k, v },
        })
    }

    /// The gate and up projections, fused like [`Self::qkv`].
    fn mlp(
        &mut self,
        layer: usize,
        e: usize,
        n_ff: usize,
        q4_1: Q4_1Policy,
    ) -> Result<Mlp, ModelError> {
        let p = |s: &str| format!("blk.{layer}.{s}.weight");
        let gate = self.matmul(&p("ffn_gate"), &[n_ff, e], q4_1)?;
        let up = self.matmul(&p("ffn_up"), &[n_ff, e], q4_1)?;
        Ok(match (gate, up) {
            (Linear::Q4_1(g), Linear::Q4_1(u)) if n_ff.is_multiple_of(4) => Mlp::Fused(
                Q4_1Matrix::concat(&[&g, &u]).map_err(|err| ModelError::Tensor {
                    name: p("ffn_gate"),
                    message: candle_error_message(&err),
                })?,
            ),
            (gate, up) => Mlp::Separate { gate, up },
        })
    }

    fn vector(&mut self, name: &str, len: usize) -> Result<candle_core::Tensor, ModelError> {
        Ok(self.read(name, &[len])?.dequantize(self.device)?)
    }
}

/// A 1-D tensor's values on the host.
fn host_vec(t: &candle_core::Tensor) -> Result<Vec<f32>, ModelError> {
    Ok(t.to_device(&Device::Cpu)?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1::<f32>()?)
}

/// Loads a GGUF model file of the llama architecture.
///
/// # Errors
/// [`ModelError`] for an unreadable or corrupt file, another architecture, missing or
/// inconsistent metadata, or a missing or mis-shaped tensor.
pub fn load_gguf(path: &Path, opts: &LoadOptions) -> Result<LoadedModel, ModelError> {
    let display = path.display().to_string();
    let file = File::open(path).map_err(|source| ModelError::Io {
        path: display.clone(),
        source,
    })?;
    let mut reader = BufReader::new(file);
    let content = Content::read(&mut reader).map_err(|e| ModelError::Corrupt {
        path: display.clone(),
        message: candle_error_message(&e),
    })?;
    let md = &content.metadata;
    let arch = match md.get("general.architecture") {
        Some(v) => v
            .to_string()
            .map_err(|_| ModelError::Metadata {
                key: "general.architecture".into(),
                message: format!("expected a string, found {v:?}"),
            })?
            .clone(),
        None => {
            return Err(ModelError::Metadata {
                key: "general.architecture".into(),
                message: "missing".into(),
            })
        }
    };
    if arch != "llama" {
        return Err(ModelError::UnsupportedArchitecture(arch));
    }
    let mut config = llama_config(md, &arch)?;
    let vocab_size = content
        .tensor_infos
        .get("token_embd.weight")
        .map(|i| i.shape.dims().first().copied().unwrap_or(0))
        .ok_or_else(|| ModelError::Tensor {
            name: "token_embd.weight".into(),
            message: "missing".into(),
        })?;
    if vocab_size == 0 {
        return Err(ModelError::Tensor {
            name: "token_embd.weight".into(),
            message: "has no rows".into(),
        });
    }
    config.vocab_size = vocab_size;

    let device = &opts.device;
    let mut tr = TensorReader {
        content: &content,
        reader,
        device,
    };
    let e = config.n_embd;
    let kv_dim = config.n_kv_head * config.head_dim;
    let n_ff = require_u32(md, &format!("{arch}.feed_forward_length"))?;
    let output_norm = tr.vector("output_norm.weight", e)?;
    let (token_embd, output) = if tr.has("output.weight") {
        let embd = tr.read("token_embd.weight", &[vocab_size, e])?;
        let out = tr.matmul("output.weight", &[vocab_size, e], opts.q4_1)?;
        (TokenEmbedding::Candle(embd), out)
    } else {
        // Tied embeddings: the output head reuses the embedding matrix; when our Q8_0
        // kernel holds it, the embedding lookup reads the same copy.
        match tr.matmul("token_embd.weight", &[vocab_size, e], opts.q4_1)? {
            out @ Linear::Q8_0(_) => (TokenEmbedding::TiedOutput, out),
            out => (
                TokenEmbedding::Candle(tr.read("token_embd.weight", &[vocab_size, e])?),
                out,
            ),
        }
    };
    let mut blocks = Vec::with_capacity(config.n_layer);
    for i in 0..config.n_layer {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        let attn_norm = tr.vector(&p("attn_norm"), e)?;
        let ffn_norm = tr.vector(&p("ffn_norm"), e)?;
        blocks.push(Block {
            attn_norm_host: host_vec(&attn_norm)?,
            attn_norm,
            qkv: tr.qkv(i, e, kv_dim, opts.q4_1)?,
            attn_output: tr.matmul(&p("attn_output"), &[e, e], opts.q4_1)?,
            ffn_norm_host: host_vec(&ffn_norm)?,
            ffn_norm,
            mlp: tr.mlp(i, e, n_ff, opts.q4_1)?,
            ffn_down: tr.matmul(&p("ffn_down"), &[e, n_ff], opts.q4_1)?,
            n_ff,
        });
    }
    let (cos, sin) = rope_tables(
        config.rope_dim,
        config.rope_theta,
        config.context_length,
        device,
    )?;
    let cos_host = cos
        .to_device(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let sin_host = sin
        .to_device(&candle_core::Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let model = LlamaModel {
        config,
        token_embd,
        blocks,
        output_norm_host: host_vec(&output_norm)?,
        output_norm,
        output,
        cos,
        sin,
        cos_host,
        sin_host,
        device: device.clone(),
    };
    Ok(LoadedModel {
        model,
        metadata: content.metadata.clone(),
        path: path.to_path_buf(),
        architecture: arch,
    })
}
