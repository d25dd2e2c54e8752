//! The `host` interface plugins import: vocabulary queries and a rate-limited `log`,
//! served from the per-store [`HostState`] (which also carries the WASI sandbox of
//! plugins that import WASI; see `wasi`).

use std::sync::{Arc, Mutex};

use super::bindings::{self, LogLevel, SpecialTokenIds, VocabBlob};
use super::limits::Limiter;
use super::vocab::PluginVocab;
use super::wasi::PluginWasi;

/// Most `log` bytes kept per line; longer messages are cut at a character boundary.
pub(super) const LOG_LINE_MAX_BYTES: usize = 1024;

/// One instance's log: `log` calls and, for WASI plugins, stdout and stderr lines share
/// one budget of `plugins.log_lines_per_request` lines.
pub(super) struct PluginLog {
    /// `plugin-name (request id)`, for log lines.
    pub(super) label: Arc<str>,
    pub(super) left: u32,
    pub(super) dropped: u32,
}

impl PluginLog {
    /// Logs `message` at `level` under the plugin's label, or counts it as dropped once
    /// the budget is spent.
    pub(super) fn emit(&mut self, level: LogLevel, message: &str) {
        if self.left == 0 {
            self.dropped += 1;
            return;
        }
        self.left -= 1;
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

    /// A line the guest wrote to `stream` (`stdout` or `stderr`), logged at info level.
    pub(super) fn write(&mut self, stream: &str, line: &str) {
        self.emit(LogLevel::Info, &format!("{stream}: {line}"));
    }
}

/// The data of one plugin store: what the `host` imports need.
pub(super) struct HostState {
    pub(super) vocab: Arc<PluginVocab>,
    pub(super) limiter: Limiter,
    pub(super) log: Arc<Mutex<PluginLog>>,
    /// The WASI context (used only when the component imports WASI).
    pub(super) wasi: PluginWasi,
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
        if let Ok(mut log) = self.log.lock() {
            log.emit(level, &message);
        }
    }
}
