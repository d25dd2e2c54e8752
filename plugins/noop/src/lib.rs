//! `noop`: a logits processor that always answers `keep`, to measure the per-step
//! overhead of calling a plugin. Config: `{}` only.
#![no_std]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use guest_support::Config;

wit_bindgen::generate!({ path: "../../wit", world: "logits-processor-plugin" });

use exports::inferd::plugin::logits_processor::{Guest, LogitsEdit, PluginInfo, StepContext};

/// The exported component.
struct Noop;

impl Guest for Noop {
    /// Name, version and description of the plugin.
    fn info() -> PluginInfo {
        PluginInfo {
            name: "noop".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Leaves the logits unchanged (for overhead benchmarks)".into(),
        }
    }

    /// Validates `config` and sets up the per-request state.
    fn configure(config: String, _seed: u64) -> Result<(), String> {
        Config::parse(&config, &[]).map(|_| ())
    }

    /// One decode step.
    fn process(_ctx: StepContext, _logits: Vec<f32>) -> Result<LogitsEdit, String> {
        Ok(LogitsEdit::Keep)
    }
}

export!(Noop);
