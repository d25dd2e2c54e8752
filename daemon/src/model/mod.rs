//! Model code over kernels: weight sources (GGUF files, Hugging Face directories),
//! architecture specs, the one decoder loop and its CPU and tensor backends, and the
//! paged KV pool. The KV cache lives outside the weights, in a [`KvBlockPool`] that the
//! model runner owns and the scheduler's block manager allocates. Every CPU kernel —
//! the quant types, attention, ggml's element-wise numerics, the thread team — lives
//! in the `inferd-kernels` crate (`daemon/kernels`); nothing here names a quant type.
//!
//! Layout: `spec.rs` (what differs between architectures, as data), `source/` (GGUF and
//! HF readers), `weights.rs` (the internal layout), `layers/` (`Linear`: the one place a matrix is
//! applied), `matrix.rs` (the one matrix type:
//! `inferd_kernels::CpuMatrix` on the CPU, candle's on other devices and for Hugging
//! Face weights), `transformer.rs` (the decoder loop), `host.rs` / `ops.rs` (its
//! backends), `rope.rs`, `moe.rs`, `kv_pool.rs` (with the door to the CPU attention).

pub mod host;
pub mod kv_pool;
pub mod layers;
pub mod lora;
pub mod matrix;
pub mod moe;
pub mod ops;
pub mod rope;
pub mod source;
pub mod spec;
pub mod transformer;
pub mod vision;
pub mod weights;

#[cfg(test)]
pub(crate) mod reference_tests;
#[cfg(test)]
mod trace;
#[cfg(test)]
mod trace_tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;
use candle_core::{DType, Device};

pub use kv_pool::{ForwardSeq, KvBlockPool, KvDtype, KvLayout, SeqMedia, SoloKv};
pub use matrix::{Kernels, MatrixPolicy, Quantize};
pub use spec::{Architecture, ModelSpec};
pub use transformer::Model;

/// Errors while loading a model. Start-up reports them and exits; they never panic.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be opened or read.
    #[error("cannot read {path}: {error}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error (not a `source`: the message already says it once).
        error: std::io::Error,
    },
    /// The file is not valid (bad magic, truncated, inconsistent offsets, bad JSON).
    #[error("model file {path} is not a valid {format}: {message}")]
    Corrupt {
        /// The path.
        path: String,
        /// What it should have been (`GGUF file`, `JSON file`, `safetensors file`).
        format: &'static str,
        /// What the parser found.
        message: String,
    },
    /// The architecture is not one this build implements.
    #[error("unsupported model architecture `{value}` ({key}); supported: {supported}")]
    UnsupportedArchitecture {
        /// Where it was read (`general.architecture`, `config.json: architectures[0]`).
        key: String,
        /// The value, escaped and cut ([`source::bounded`]).
        value: String,
        /// What is supported.
        supported: String,
    },
    /// A tensor's ggml type has no kernel in this build (IQ*, TQ*, MXFP4, …).
    #[error("tensor `{tensor}` has ggml type {ty}, which inferd does not implement (supported: {supported})")]
    UnsupportedTensorType {
        /// The tensor's name, escaped and cut.
        tensor: String,
        /// ggml's name of the type (`iq4_nl`), or `id N` for an unknown id.
        ty: String,
        /// The implemented types.
        supported: &'static str,
    },
    /// A required metadata key is missing or has the wrong type.
    #[error("model metadata `{key}`: {message}")]
    Metadata {
        /// The key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
    /// A tensor is missing or has an unexpected shape.
    #[error("tensor `{name}`: {message}")]
    Tensor {
        /// The tensor name as stored in the file (e.g. `blk.0.attn_q.weight`).
        name: String,
        /// What is wrong with it.
        message: String,
    },
    /// An error from candle while building the weights.
    #[error("candle: {}", candle_error_message(.0))]
    Candle(#[from] candle_core::Error),
    /// Settings that do not fit the model (naming the key).
    #[error("configuration error: {0}")]
    Config(String),
}

/// The message of a candle error without the backtrace candle attaches when
/// `RUST_BACKTRACE` is set (operators get one line, not a stack dump).
pub fn candle_error_message(e: &candle_core::Error) -> String {
    match e {
        candle_core::Error::WithBacktrace { inner, .. } => candle_error_message(inner),
        candle_core::Error::Context { inner, context } => {
            format!("{context}: {}", candle_error_message(inner))
        }
        other => other.to_string(),
    }
}

/// A vision tower of either kind.
#[derive(Debug)]
pub enum Tower {
    /// SigLIP / CLIP towers with their projectors (Gemma 3, LLaVA, Idefics3).
    Vit(vision::VisionTower),
    /// Qwen2.5-VL's ViT and merger.
    Qwen25Vl(vision::qwen2_5_vl::Qwen25VlTower),
}

impl Tower {
    /// From the checkpoint's whole `config.json` and its vision tensors.
    ///
    /// # Errors
    /// As the towers' `from_hf`.
    pub fn from_hf(
        config: &serde_json::Value,
        tensors: HashMap<String, candle_core::Tensor>,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let class = config
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(serde_json::Value::as_str);
        Ok(match class {
            Some("Qwen2_5_VLForConditionalGeneration") => Self::Qwen25Vl(
                vision::qwen2_5_vl::Qwen25VlTower::from_hf(config, tensors, device)?,
            ),
            _ => Self::Vit(vision::VisionTower::from_hf(config, tensors, device)?),
        })
    }

    /// One image's rows `(tokens, out_dim)` f32 on the device.
    ///
    /// # Errors
    /// A candle error, or pixels of the other tower's form.
    pub fn encode(&self, px: vision::VisionPixels<'_>) -> candle_core::Result<candle_core::Tensor> {
        match (self, px) {
            (Self::Vit(t), px) => t.encode(px),
            (Self::Qwen25Vl(t), vision::VisionPixels::Patches { data, grid_thw }) => {
                t.encode(data, grid_thw)
            }
            (Self::Qwen25Vl(_), _) => {
                candle_core::bail!("Qwen2.5-VL's tower takes patch rows, not frames")
            }
        }
    }

    /// The text hidden size (columns of [`Self::encode`]).
    pub fn out_dim(&self) -> usize {
        match self {
            Self::Vit(t) => t.out_dim(),
            Self::Qwen25Vl(t) => t.out_dim(),
        }
    }

    /// Placeholder tokens per frame (0 for Qwen2.5-VL, whose count follows the grid).
    pub fn tokens_per_frame(&self) -> usize {
        match self {
            Self::Vit(t) => t.tokens_per_frame(),
            Self::Qwen25Vl(_) => 0,
        }
    }
}

/// Options for [`load`].
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Device for the weights.
    pub device: Device,
    /// Kernels and re-quantization.
    pub matrices: MatrixPolicy,
}

/// The format a model was loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// A GGUF file.
    Gguf,
    /// A Hugging Face checkpoint directory.
    HfDir,
}

/// A model loaded into memory.
#[derive(Debug)]
pub struct LoadedModel {
    /// The model.
    pub model: Model,
    /// GGUF metadata (tokenizer keys included); empty for an HF directory.
    pub metadata: HashMap<String, Value>,
    /// The path given.
    pub path: PathBuf,
    /// Its format.
    pub format: ModelFormat,
    /// The vision side of a vision-language checkpoint (`None`: a text model).
    pub vision: Option<LoadedVision>,
}

/// A vision-language model's vision side as loaded.
#[derive(Debug)]
pub struct LoadedVision {
    /// The tower and projector.
    pub tower: Tower,
    /// The checkpoint's whole `config.json` (token ids, family, projector settings).
    pub config: serde_json::Value,
    /// The image processor's settings made from an mmproj file's `clip.*` keys (`None`:
    /// the checkpoint directory's `preprocessor_config.json`).
    pub preprocessor: Option<serde_json::Value>,
}

/// Gives a loaded GGUF text model the vision tower of the mmproj file at `path`
/// ([`vision::mmproj`]), on `device`.
///
/// # Errors
/// [`ModelError::Config`] when the model is not a GGUF file (a Hugging Face directory);
/// the mmproj file's errors; a projector whose output width is not the text model's
/// hidden size.
pub fn attach_mmproj(
    loaded: &mut LoadedModel,
    path: &Path,
    device: &Device,
) -> Result<(), ModelError> {
    if loaded.format != ModelFormat::Gguf || loaded.vision.is_some() {
        return Err(ModelError::Config(format!(
            "model.mmproj: a vision projector file goes with a GGUF text model, and {} is {}",
            loaded.path.display(),
            match loaded.vision {
                Some(_) => "a Hugging Face directory with its own vision tower",
                None => "a Hugging Face directory (a vision-language checkpoint carries its tower)",
            }
        )));
    }
    let tokens: Vec<String> = match loaded.metadata.get("tokenizer.ggml.tokens") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| match t {
                Value::String(s) => s.clone(),
                _ => String::new(),
            })
            .collect(),
        _ => Vec::new(),
    };
    let hidden = loaded.model.spec().n_embd;
    let m = vision::mmproj::read(path, hidden, &tokens)?;
    let tower = Tower::from_hf(&m.config, m.tensors, device)?;
    if tower.out_dim() != hidden {
        return Err(ModelError::Metadata {
            key: "clip.vision.projection_dim".into(),
            message: format!(
                "the projector gives rows of {} but the text model's hidden size is {hidden}",
                tower.out_dim()
            ),
        });
    }
    loaded.vision = Some(LoadedVision {
        tower,
        config: m.config,
        preprocessor: Some(m.preprocessor),
    });
    Ok(())
}

/// Loads a GGUF file, or a Hugging Face directory (a path that is a directory).
///
/// # Errors
/// [`ModelError`] for an unreadable or corrupt file, an unsupported architecture,
/// missing or inconsistent metadata, or a missing or mis-shaped tensor.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<LoadedModel, ModelError> {
    let device = &opts.device;
    if path.is_dir() {
        let mut src = source::hf::HfSource::open(path)?;
        let spec = src.spec()?;
        // An F32 checkpoint keeps exact f32 K/V on the host (transformers' numerics).
        let kv = if src.dtype() == DType::F32 && device.is_cpu() {
            KvDtype::F32
        } else {
            KvDtype::F16
        };
        let vision = match src.take_vision() {
            Some((config, tensors)) => Some(LoadedVision {
                tower: Tower::from_hf(&config, tensors, device)?,
                config,
                preprocessor: None,
            }),
            None => None,
        };
        let weights = weights::build(&mut src, &spec, opts.matrices, device)?;
        return Ok(LoadedModel {
            model: Model::new(spec, weights, kv, device)?,
            metadata: HashMap::new(),
            path: path.to_path_buf(),
            format: ModelFormat::HfDir,
            vision,
        });
    }
    let mut src = source::gguf::GgufSource::open(path)?;
    let spec = src.spec()?;
    // f16 K/V as llama.cpp's default; an all-F32 file (the tiny converted fixtures)
    // keeps exact f32 K/V like an F32 checkpoint.
    let kv = if src.embedding_is_f32() && device.is_cpu() {
        KvDtype::F32
    } else {
        KvDtype::F16
    };
    let weights = weights::build(&mut src, &spec, opts.matrices, device)?;
    let metadata = src.metadata().clone();
    Ok(LoadedModel {
        model: Model::new(spec, weights, kv, device)?,
        metadata,
        path: path.to_path_buf(),
        format: ModelFormat::Gguf,
        vision: None,
    })
}
