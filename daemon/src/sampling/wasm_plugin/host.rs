//! The `host` interface plugins import: vocabulary queries and a rate-limited `log`,
//! served from the per-store [`HostState`].

use std::sync::Arc;

use super::bindings::{self, LogLevel, SpecialTokenIds, VocabBlob};
use super::limits::Limiter;
use super::vocab::PluginVocab;

/// Most `log` bytes kept per line; longer messages are cut at a character boundary.
const LOG_LINE_MAX_BYTES: usize = 1024;

/// The data of one plugin store: what the `host` imports need.
pub(super) struct HostState {
    pub(super) vocab: Arc<PluginVocab>,
    pub(super) limiter: Limiter,
    /// `plugin-name request-id`, for log lines.
    pub(super) label: Arc<str>,
    pub(super) logs_left: u32,
    pub(super) logs_dropped: u32,
}

impl bindings::TypesHost for HostState {}

impl bindings::Host for HostState {
    fn vocab_size(&mut self) -> u32 {
        self.vocab.len() as u32
    }

    fn token_bytes(&mut self, token: u32) -> Option<Vec<u8>> {
        self.vocab.token(token).map(<[u8]>::to_vec)
    }

    fn vocab_bytes(&mut self) -> VocabBlob {
        VocabBlob {
            bytes: self.vocab.bytes.clone(),
            offsets: self.vocab.offsets.clone(),
        }
    }

    fn special_tokens(&mut self) -> SpecialTokenIds {
        self.vocab.special.clone()
    }

    fn log(&mut self, level: LogLevel, message: String) {
        if self.logs_left == 0 {
            self.logs_dropped += 1;
            return;
        }
        self.logs_left -= 1;
        let mut end = message.len().min(LOG_LINE_MAX_BYTES);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let msg = &message[..end];
        let plugin = &*self.label;
        match level {
            LogLevel::Debug => tracing::debug!(plugin, "{msg}"),
            LogLevel::Info => tracing::info!(plugin, "{msg}"),
            LogLevel::Warn => tracing::warn!(plugin, "{msg}"),
            LogLevel::Error => tracing::error!(plugin, "{msg}"),
        }
    }
}
