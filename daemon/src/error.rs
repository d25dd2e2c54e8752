//! The one error enum at the request boundary and its stable wire tags.
//!
//! Every stage returns [`InferError`]; `api::wire` is the one place that maps it to
//! the `error` frame `{ "type": "error", "id": ..., "error": { "type": TAG, "message": ... } }`.

use serde::Serialize;

/// Stable error categories. The `snake_case` name is the wire tag (`error.type`) and
/// never changes once shipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request is malformed or a value is out of range.
    Validation,
    /// The prompt (plus at least one generated token) does not fit the context window.
    ContextLengthExceeded,
    /// A queue bound was hit; retry later.
    Overloaded,
    /// A user plugin trapped, timed out or broke a limit.
    PluginTrap,
    /// The request was cancelled by the client.
    Cancelled,
    /// A bug or an unexpected failure inside the daemon.
    Internal,
    /// The request named a model or LoRA adapter this daemon does not serve.
    ModelNotFound,
}

impl ErrorKind {
    /// The wire tag, e.g. `"validation"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Validation => "validation",
            ErrorKind::ContextLengthExceeded => "context_length_exceeded",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::PluginTrap => "plugin_trap",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Internal => "internal",
            ErrorKind::ModelNotFound => "model_not_found",
        }
    }
}

/// An error that ends one request (never the daemon). `message` is meant for the
/// client: it names the field, the bound and the value given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct InferError {
    /// Category, mapped to the wire tag.
    pub kind: ErrorKind,
    /// Human-readable explanation.
    pub message: String,
}

impl InferError {
    /// Builds an error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// A `validation` error.
    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Validation, message)
    }

    /// An `internal` error.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}
