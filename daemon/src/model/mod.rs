//! Pure candle model code: GGUF loading, architecture dispatch and the llama-family
//! forward pass. The KV cache lives outside the weights, in a paged block pool
//! ([`KvBlockPool`]) that the model runner owns and the scheduler's block manager
//! allocates, so sequences can be batched, preempted and (later) share prefixes.

mod gguf;
mod llama;
pub mod paged;
pub mod q4_1;
pub mod q8_0;
pub mod team;

pub use gguf::{load_gguf, LoadOptions, LoadedModel, Q4_1Policy};
pub use llama::{LlamaConfig, LlamaModel};
pub use paged::{ForwardSeq, KvBlockPool, SoloKv, KV_ELEMENT_BYTES};

/// Errors while loading a model file. Start-up reports them and exits; they never panic.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be opened or read.
    #[error("cannot read model file {path}: {source}")]
    Io {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid GGUF file (bad magic, truncated, inconsistent offsets).
    #[error("model file {path} is not a valid GGUF file: {message}")]
    Corrupt {
        /// The path given.
        path: String,
        /// What the parser found.
        message: String,
    },
    /// `general.architecture` names an architecture this build does not implement.
    #[error("unsupported model architecture `{0}` (general.architecture); supported: llama")]
    UnsupportedArchitecture(String),
    /// A required metadata key is missing or has the wrong type.
    #[error("GGUF metadata key `{key}`: {message}")]
    Metadata {
        /// The metadata key.
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
