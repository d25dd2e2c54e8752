//! `memory_bomb`: a test fixture that allocates memory, to exercise the daemon's
//! per-instance memory limit.
//!
//! Config:
//! - `{}` (violates the limit): every `process` call grows memory by 1 MiB chunks
//!   (reserved, not touched, so the growth is as fast as the host allows) until an
//!   allocation fails, then traps;
//! - `{"mib": N}` (obeys a limit above N MiB): the first `process` call allocates and
//!   touches N MiB once and keeps it until the request ends; every call returns `keep`.
#![no_std]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use guest_support::{Config, Global};

wit_bindgen::generate!({ path: "../../wit", world: "logits-processor-plugin" });

use exports::inferd::plugin::logits_processor::{Guest, LogitsEdit, PluginInfo, StepContext};
use inferd::plugin::host::{self, LogLevel};

/// One chunk: 1 MiB.
const MIB: usize = 1 << 20;
/// Largest `mib` accepted (a wasm32 memory is at most 4 GiB).
const MAX_MIB: u64 = 4095;

/// Per-request state.
struct State {
    /// `Some(n)`: allocate `n` MiB once; `None`: grow without bound.
    mib: Option<u64>,
    /// The allocations, kept alive until the instance is dropped.
    chunks: Vec<Vec<u8>>,
}

/// The state of this instance (one request).
static STATE: Global<State> = Global::new(State {
    mib: None,
    chunks: Vec::new(),
});

/// Allocates one 1 MiB chunk with every byte written (so every page is touched);
/// `None` when the allocation fails.
fn touched_chunk() -> Option<Vec<u8>> {
    let mut chunk = Vec::new();
    chunk.try_reserve_exact(MIB).ok()?;
    chunk.resize(MIB, 0xA5);
    Some(chunk)
}

/// 1 MiB of capacity, not written (growing linear memory is what the fixture tests);
/// `None` when the allocation fails.
fn reserved_chunk() -> Option<Vec<u8>> {
    let mut chunk = Vec::new();
    chunk.try_reserve_exact(MIB).ok()?;
    Some(chunk)
}

/// The exported component.
struct MemoryBomb;

impl Guest for MemoryBomb {
    /// Name, version and description of the plugin.
    fn info() -> PluginInfo {
        PluginInfo {
            name: "memory_bomb".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Test fixture: allocates N MiB once, or memory without bound".into(),
        }
    }

    /// Validates `config` and sets up the per-request state.
    fn configure(config: String, _seed: u64) -> Result<(), String> {
        let config = Config::parse(&config, &["mib"])?;
        let mib = config.integer("mib", 1, MAX_MIB)?;
        STATE.with(|s| s.mib = mib);
        Ok(())
    }

    /// One decode step.
    fn process(_ctx: StepContext, _logits: Vec<f32>) -> Result<LogitsEdit, String> {
        STATE.with(|s| {
            match s.mib {
                Some(n) => {
                    while (s.chunks.len() as u64) < n {
                        let chunk = touched_chunk()
                            .ok_or_else(|| format!("memory_bomb: could not allocate {n} MiB"))?;
                        s.chunks.push(chunk);
                    }
                }
                None => {
                    while let Some(chunk) = reserved_chunk() {
                        s.chunks.push(chunk);
                    }
                    let message = format!(
                        "memory_bomb: allocation failed after {} MiB; trapping",
                        s.chunks.len()
                    );
                    host::log(LogLevel::Warn, &message);
                    core::panic!("{message}");
                }
            }
            Ok(LogitsEdit::Keep)
        })
    }
}

export!(MemoryBomb);
