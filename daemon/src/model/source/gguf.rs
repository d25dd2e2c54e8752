//! GGUF files (format: ggml's docs/gguf.md): the spec from `<arch>.*` metadata as
//! llama.cpp's `llama-model.cpp` (`load_hparams`) reads it, and llama.cpp's tensor names
//! (`llama-arch.cpp`, `LLM_TENSOR_NAMES`) mapped onto [`Role`]s.
//!
//! Parsing is candle's bounded `gguf_file` reader; every key and tensor shape the decoder
//! relies on is checked, so a corrupt or foreign file is refused with one line.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;
use candle_core::Device;

use super::super::matrix::RawMatrix;
use super::super::spec::{
    Activation, Architecture, ModelSpec, MoeSpec, Numerics, RopeScaling, RopeSpec, RopeStyle,
    MAX_LAYERS, SUPPORTED_GGUF,
};
use super::super::weights::{ExpertRole, LayerRole, Role, WeightSource};
use super::super::{candle_error_message, ModelError};
use super::quote;

/// An open GGUF file: its header and a reader for tensor data.
pub struct GgufSource {
    content: Content,
    reader: BufReader<File>,
    arch: Architecture,
    /// `general.architecture` as written: the prefix of the `<arch>.*` keys (`qwen2vl`
    /// reads as [`Architecture::Qwen2`] with M-RoPE).
    prefix: String,
    path: String,
    /// Stacked `(n_expert, rows, cols)` expert tensors already read, by name.
    experts: HashMap<String, QTensor>,
}

type Md = HashMap<String, Value>;

fn meta_u32(md: &Md, key: &str) -> Result<Option<u32>, ModelError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => v.to_u32().map(Some).or_else(|_| {
            v.to_u64()
                .ok()
                .and_then(|x| u32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| ModelError::Metadata {
                    key: key.to_string(),
                    message: format!(
                        "expected an unsigned integer, found {}",
                        quote(&format!("{v:?}"))
                    ),
                })
        }),
    }
}

fn require_u32(md: &Md, key: &str) -> Result<usize, ModelError> {
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

fn meta_f32(md: &Md, key: &str) -> Result<Option<f32>, ModelError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => v.to_f32().map(Some).map_err(|_| ModelError::Metadata {
            key: key.to_string(),
            message: format!("expected a float, found {}", quote(&format!("{v:?}"))),
        }),
    }
}

/// Opens the GGUF file at `path` and reads its header (metadata and tensor index),
/// leaving the reader for tensor data; `format` names the kind of file in errors.
///
/// # Errors
/// [`ModelError::Io`] when unreadable, [`ModelError::UnsupportedTensorType`] naming the
/// first tensor of a type inferd lacks, else [`ModelError::Corrupt`].
pub fn read_header(
    path: &Path,
    format: &'static str,
) -> Result<(Content, BufReader<File>), ModelError> {
    let display = path.display().to_string();
    let file = File::open(path).map_err(|error| ModelError::Io {
        path: display.clone(),
        error,
    })?;
    let len = file.metadata().map_or(u64::MAX, |m| m.len());
    let mut reader = BufReader::new(file);
    if let Some(message) = magic_problem(&mut reader, len) {
        return Err(ModelError::Corrupt {
            path: display,
            format,
            message,
        });
    }
    match Content::read(&mut reader) {
        Ok(c) => Ok((c, reader)),
        Err(e) => {
            // candle stops at a type id it does not know without naming the tensor.
            if let Some((tensor, ty)) = super::gguf_types::first_unsupported(&mut reader) {
                return Err(ModelError::UnsupportedTensorType {
                    tensor: super::bounded(&tensor),
                    ty,
                    supported: inferd_kernels::GgmlType::SUPPORTED_NAMES,
                });
            }
            let found = candle_error_message(&e);
            let message = if found.contains("failed to fill whole buffer") {
                format!(
                    "the file ({len} bytes) ends inside its header: truncated, or still \
                     being copied? ({})",
                    quote(&found)
                )
            } else {
                quote(&found)
            };
            Err(ModelError::Corrupt {
                path: display,
                format,
                message,
            })
        }
    }
}

/// What is wrong with the start of a file of `len` bytes that should be GGUF (ggml's
/// docs/gguf.md: the magic `GGUF`, then a version), or `None` when the magic is there.
/// Reads nothing from `reader` (it only fills the buffer).
fn magic_problem(reader: &mut BufReader<File>, len: u64) -> Option<String> {
    const MAGIC: &[u8; 4] = b"GGUF";
    if len < MAGIC.len() as u64 {
        return Some(format!(
            "the file is {len} bytes long; a GGUF file starts with the 4-byte magic \"GGUF\""
        ));
    }
    let head = std::io::BufRead::fill_buf(reader).ok()?;
    if head.len() < MAGIC.len() || &head[..MAGIC.len()] == MAGIC {
        return None;
    }
    let shown = String::from_utf8_lossy(&head[..head.len().min(16)]);
    Some(format!(
        "it starts with {} where a GGUF file starts with \"GGUF\"",
        quote(&shown)
    ))
}

impl GgufSource {
    /// Opens `path` and reads its header.
    ///
    /// # Errors
    /// Unreadable, not GGUF, no or an unknown `general.architecture`.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let display = path.display().to_string();
        let (content, reader) = read_header(path, "GGUF file")?;
        let name = match content.metadata.get("general.architecture") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => {
                return Err(ModelError::Metadata {
                    key: "general.architecture".into(),
                    message: format!("expected a string, found {}", quote(&format!("{v:?}"))),
                })
            }
            None => {
                return Err(ModelError::Metadata {
                    key: "general.architecture".into(),
                    message: "missing".into(),
                })
            }
        };
        if name == "clip" {
            return Err(ModelError::Config(format!(
                "model.path: {display} is a vision projector (mmproj, general.architecture \
                 \"clip\"): give it as model.mmproj (--mmproj) beside a GGUF text model"
            )));
        }
        let arch =
            Architecture::from_gguf(&name).ok_or_else(|| ModelError::UnsupportedArchitecture {
                key: "general.architecture".into(),
                value: super::bounded(&name),
                supported: SUPPORTED_GGUF.into(),
            })?;
        Ok(Self {
            content,
            reader,
            arch,
            prefix: name,
            path: display,
            experts: HashMap::new(),
        })
    }

    /// All metadata (the tokenizer reads its keys from here).
    pub fn metadata(&self) -> &Md {
        &self.content.metadata
    }

    /// Whether `token_embd.weight` is stored as F32 (an unquantized file).
    pub fn embedding_is_f32(&self) -> bool {
        self.content
            .tensor_infos
            .get("token_embd.weight")
            .is_some_and(|i| i.ggml_dtype == candle_core::quantized::GgmlDType::F32)
    }

    /// The architecture.
    pub fn architecture(&self) -> Architecture {
        self.arch
    }

    fn dims(&self, name: &str) -> Option<&[usize]> {
        self.content.tensor_infos.get(name).map(|i| i.shape.dims())
    }

    /// The spec from `<arch>.*` metadata and tensor shapes.
    ///
    /// # Errors
    /// A missing or inconsistent key, named.
    pub fn spec(&self) -> Result<ModelSpec, ModelError> {
        let md = &self.content.metadata;
        let a = self.prefix.as_str();
        let k = |s: &str| format!("{a}.{s}");
        let n_layer = require_u32(md, &k("block_count"))?;
        if n_layer > MAX_LAYERS {
            return Err(ModelError::Metadata {
                key: k("block_count").to_string(),
                message: format!("{n_layer} layers, above the supported {MAX_LAYERS}"),
            });
        }
        let n_embd = require_u32(md, &k("embedding_length"))?;
        let n_head = require_u32(md, &k("attention.head_count"))?;
        let n_kv_head = meta_u32(md, &k("attention.head_count_kv"))?.map_or(n_head, |v| v as usize);
        let head_dim = meta_u32(md, &k("attention.key_length"))?
            .map_or(n_embd / n_head.max(1), |v| v as usize);
        let rope_dim = meta_u32(md, &k("rope.dimension_count"))?.map_or(head_dim, |v| v as usize);
        let context_length = require_u32(md, &k("context_length"))?;
        let vocab_size = match self.dims("token_embd.weight") {
            Some([rows, _]) => *rows,
            Some(d) => {
                return Err(ModelError::Tensor {
                    name: "token_embd.weight".into(),
                    message: format!("expected 2 dimensions, found {d:?}"),
                })
            }
            None => {
                return Err(ModelError::Tensor {
                    name: "token_embd.weight".into(),
                    message: "missing".into(),
                })
            }
        };
        let moe = if self.arch == Architecture::Qwen3Moe {
            Some(MoeSpec {
                n_expert: require_u32(md, &k("expert_count"))?,
                n_expert_used: require_u32(md, &k("expert_used_count"))?,
                n_ff_expert: require_u32(md, &k("expert_feed_forward_length"))?,
                // llama.cpp's qwen3moe graph always renormalizes the top-k weights.
                norm_topk_prob: true,
                layers: vec![true; n_layer],
            })
        } else {
            None
        };
        let n_ff = match &moe {
            Some(m) => {
                meta_u32(md, &k("feed_forward_length"))?.map_or(m.n_ff_expert, |v| v as usize)
            }
            None => require_u32(md, &k("feed_forward_length"))?,
        };
        let window = self.windows(n_layer)?;
        let gemma = self.arch == Architecture::Gemma3;
        let spec = ModelSpec {
            architecture: self.arch,
            n_layer,
            n_embd,
            n_head,
            n_kv_head,
            head_dim,
            n_ff,
            vocab_size,
            context_length,
            norm_eps: meta_f32(md, &k("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
            rope: RopeSpec {
                // llama.cpp: LLAMA_ROPE_TYPE_NORM for llama, NEOX for the others.
                style: if self.arch == Architecture::Llama {
                    RopeStyle::Interleaved
                } else {
                    RopeStyle::Neox
                },
                dim: rope_dim,
                theta: meta_f32(md, &k("rope.freq_base"))?.unwrap_or(10_000.0),
                // Gemma 3's local layers: `rope.freq_base_swa`, default 10 000 as
                // llama.cpp's `rope_freq_base_train_swa`.
                local_theta: if gemma {
                    Some(meta_f32(md, &k("rope.freq_base_swa"))?.unwrap_or(10_000.0))
                } else {
                    None
                },
                scaling: self.rope_scaling(rope_dim, context_length)?,
                mrope_section: self.mrope_section(rope_dim)?,
            },
            activation: if gemma {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
            window,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            q_prescaled: gemma,
            qkv_bias: self.dims("blk.0.attn_q.bias").is_some(),
            qk_norm: self.dims("blk.0.attn_q_norm.weight").is_some(),
            post_norms: gemma,
            embed_scale: gemma.then(|| (n_embd as f32).sqrt()),
            final_softcap: meta_f32(md, &k("final_logit_softcapping"))?,
            moe,
            numerics: Numerics::Ggml,
        };
        spec.check().map_err(|e| {
            use super::super::spec::SpecField as F;
            let key = match e.field {
                F::Layers => k("block_count"),
                F::Hidden => k("embedding_length"),
                F::Heads => k("attention.head_count"),
                F::KvHeads => k("attention.head_count_kv"),
                F::HeadDim => k("attention.key_length"),
                F::Ffn => k("feed_forward_length"),
                F::Vocab => "token_embd.weight (rows)".into(),
                F::Context => k("context_length"),
                F::RopeDim => k("rope.dimension_count"),
                F::RopeScaling => "rope_freqs.weight / rope_factors_*.weight".into(),
                F::RopeTheta => k("rope.freq_base"),
                F::Window => k("attention.sliding_window"),
                F::NormEps => k("attention.layer_norm_rms_epsilon"),
                F::Experts => k("expert_count / expert_used_count"),
            };
            ModelError::Metadata {
                key,
                message: e.message,
            }
        })?;
        Ok(spec)
    }

    /// `<arch>.rope.dimension_sections` (llama.cpp's `LLM_KV_ROPE_DIMENSION_SECTIONS`,
    /// written for `qwen2vl`: four counts, the fourth 0 for Qwen2-VL / Qwen2.5-VL) as the
    /// three M-RoPE sections (temporal, height, width), which must sum to `rope_dim / 2`.
    fn mrope_section(&self, rope_dim: usize) -> Result<Option<[usize; 3]>, ModelError> {
        let key = format!("{}.rope.dimension_sections", self.prefix);
        let Some(v) = self.content.metadata.get(&key) else {
            return Ok(None);
        };
        let counts: Option<Vec<usize>> = match v {
            Value::Array(a) => a
                .iter()
                .map(|x| match x {
                    Value::I32(v) => usize::try_from(*v).ok(),
                    other => other.to_u32().ok().map(|v| v as usize),
                })
                .collect(),
            _ => None,
        };
        match counts.as_deref() {
            Some(&[t, h, w, 0]) | Some(&[t, h, w]) if t + h + w == rope_dim / 2 => {
                Ok(Some([t, h, w]))
            }
            _ => Err(ModelError::Metadata {
                key,
                message: format!(
                    "must be three counts (and a fourth 0) summing to {} (got {})",
                    rope_dim / 2,
                    quote(&format!("{v:?}"))
                ),
            }),
        }
    }

    /// Per-layer sliding windows: `<arch>.attention.sliding_window`, on Gemma 3 for the
    /// layers llama.cpp's `set_swa_pattern` marks (`il % n < n − 1`, n from
    /// `attention.sliding_window_pattern`, default 6), elsewhere on every layer.
    fn windows(&self, n_layer: usize) -> Result<Vec<Option<usize>>, ModelError> {
        let md = &self.content.metadata;
        let a = self.prefix.as_str();
        let Some(w) = meta_u32(md, &format!("{a}.attention.sliding_window"))?.filter(|&w| w > 0)
        else {
            return Ok(vec![None; n_layer]);
        };
        let w = Some(w as usize);
        if self.arch != Architecture::Gemma3 {
            return Ok(vec![w; n_layer]);
        }
        let key = format!("{a}.attention.sliding_window_pattern");
        let pattern = match md.get(&key) {
            // A per-layer list of booleans (newer converters).
            Some(Value::Array(v)) if v.len() == n_layer => {
                return Ok(v
                    .iter()
                    .map(|b| {
                        if b.to_bool().unwrap_or(false) {
                            w
                        } else {
                            None
                        }
                    })
                    .collect())
            }
            Some(_) => meta_u32(md, &key)?.unwrap_or(6) as usize,
            None => 6,
        };
        Ok((0..n_layer)
            .map(|il| {
                (pattern == 0 || il % pattern < pattern - 1)
                    .then_some(w)
                    .flatten()
            })
            .collect())
    }

    /// `rope_freqs.weight` (llama.cpp's frequency factors) or Phi-3's
    /// `rope_factors_long/short.weight` (long when the context exceeds
    /// `rope.scaling.original_context_length`, as llama.cpp decides at load).
    fn rope_scaling(&self, rope_dim: usize, ctx: usize) -> Result<RopeScaling, ModelError> {
        let md = &self.content.metadata;
        let a = self.prefix.as_str();
        let orig = meta_u32(md, &format!("{a}.rope.scaling.original_context_length"))?;
        let name = if self.dims("rope_freqs.weight").is_some() {
            "rope_freqs.weight"
        } else if self.dims("rope_factors_long.weight").is_some() {
            if orig.is_some_and(|o| ctx > o as usize) {
                "rope_factors_long.weight"
            } else {
                "rope_factors_short.weight"
            }
        } else {
            return Ok(RopeScaling::None);
        };
        let factors = self.read_vector_at(name, rope_dim / 2)?;
        let attention_factor =
            meta_f32(md, &format!("{a}.rope.scaling.attn_factor"))?.unwrap_or(1.0);
        Ok(RopeScaling::Factors {
            factors,
            attention_factor,
        })
    }

    fn read_vector_at(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let file = File::open(&self.path).map_err(|error| ModelError::Io {
            path: self.path.clone(),
            error,
        })?;
        let mut reader = BufReader::new(file);
        read_vector(&self.content, &mut reader, name, len)
    }

    fn tensor_name(&self, role: Role) -> Option<String> {
        use LayerRole as L;
        Some(match role {
            Role::TokenEmbd => "token_embd.weight".into(),
            Role::Output => "output.weight".into(),
            Role::OutputNorm => "output_norm.weight".into(),
            Role::Layer(l, r) => {
                let s = match r {
                    L::AttnNorm => "attn_norm.weight",
                    L::Q => "attn_q.weight",
                    L::K => "attn_k.weight",
                    L::V => "attn_v.weight",
                    L::Qkv => "attn_qkv.weight",
                    L::QBias => "attn_q.bias",
                    L::KBias => "attn_k.bias",
                    L::VBias => "attn_v.bias",
                    L::QNorm => "attn_q_norm.weight",
                    L::KNorm => "attn_k_norm.weight",
                    L::AttnOutput => "attn_output.weight",
                    L::PostAttnNorm => "post_attention_norm.weight",
                    L::FfnNorm => "ffn_norm.weight",
                    L::PostFfnNorm => "post_ffw_norm.weight",
                    L::Gate => "ffn_gate.weight",
                    L::Up if self.arch == Architecture::Phi3 => return None,
                    L::Up => "ffn_up.weight",
                    // Phi-3's converter keeps gate|up fused under the up name.
                    L::GateUp if self.arch == Architecture::Phi3 => "ffn_up.weight",
                    L::GateUp => return None,
                    L::Down => "ffn_down.weight",
                    L::Router => "ffn_gate_inp.weight",
                };
                format!("blk.{l}.{s}")
            }
            Role::Expert(l, _, r) => format!(
                "blk.{l}.{}",
                match r {
                    ExpertRole::Gate => "ffn_gate_exps.weight",
                    ExpertRole::Up => "ffn_up_exps.weight",
                    ExpertRole::Down => "ffn_down_exps.weight",
                }
            ),
        })
    }
}

/// Reads a 1-D tensor as f32, checking its length.
fn read_vector(
    content: &Content,
    reader: &mut BufReader<File>,
    name: &str,
    len: usize,
) -> Result<Vec<f32>, ModelError> {
    let t = read_checked(content, reader, name, &[len])?;
    let err = |e: candle_core::Error| ModelError::Tensor {
        name: name.into(),
        message: candle_error_message(&e),
    };
    t.dequantize(&Device::Cpu)
        .and_then(|t| t.to_vec1::<f32>())
        .map_err(err)
}

/// Reads tensor `name` (to the CPU) after checking its shape (rows first).
fn read_checked(
    content: &Content,
    reader: &mut BufReader<File>,
    name: &str,
    dims: &[usize],
) -> Result<QTensor, ModelError> {
    let info = content
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
    content
        .tensor(reader, name, &Device::Cpu)
        .map_err(|e| ModelError::Tensor {
            name: name.to_string(),
            message: quote(&candle_error_message(&e)),
        })
}

impl WeightSource for GgufSource {
    fn name(&self, role: Role) -> Option<String> {
        self.tensor_name(role)
    }

    fn has(&self, role: Role) -> bool {
        self.tensor_name(role)
            .is_some_and(|n| self.content.tensor_infos.contains_key(&n))
    }

    fn matrix(&mut self, role: Role, rows: usize, cols: usize) -> Result<RawMatrix, ModelError> {
        let Some(name) = self.tensor_name(role) else {
            return Err(ModelError::Tensor {
                name: format!("{role:?}"),
                message: "this architecture's GGUF files have no such tensor".into(),
            });
        };
        let Role::Expert(_, e, _) = role else {
            return read_checked(&self.content, &mut self.reader, &name, &[rows, cols])
                .map(RawMatrix::Quant);
        };
        // A stacked `(n_expert, rows, cols)` tensor, read once, cut per expert.
        if !self.experts.contains_key(&name) {
            let n_expert = match self.dims(&name) {
                Some([n, _, _]) => *n,
                _ => 0,
            };
            let t = read_checked(
                &self.content,
                &mut self.reader,
                &name,
                &[n_expert, rows, cols],
            )?;
            self.experts.insert(name.clone(), t);
        }
        let err = |message: String| ModelError::Tensor {
            name: name.clone(),
            message,
        };
        let t = self
            .experts
            .get(&name)
            .ok_or_else(|| err("not read".into()))?;
        let n_expert = t.shape().dims()[0];
        if e >= n_expert {
            return Err(err(format!("expert {e} of {n_expert}")));
        }
        let data = t.data().map_err(|e| err(candle_error_message(&e)))?;
        let each = data.len() / n_expert;
        let part = &data[e * each..(e + 1) * each];
        candle_core::quantized::ggml_file::qtensor_from_ggml(
            t.dtype(),
            part,
            vec![rows, cols],
            &Device::Cpu,
        )
        .map(RawMatrix::Quant)
        .map_err(|e| err(candle_error_message(&e)))
    }

    fn vector(&mut self, role: Role, len: usize) -> Result<Vec<f32>, ModelError> {
        let Some(name) = self.tensor_name(role) else {
            return Err(ModelError::Tensor {
                name: format!("{role:?}"),
                message: "this architecture's GGUF files have no such tensor".into(),
            });
        };
        read_vector(&self.content, &mut self.reader, &name, len)
    }
}
