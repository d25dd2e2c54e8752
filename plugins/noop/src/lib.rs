//! `noop`: a logits processor that changes nothing, to measure the per-step overhead of
//! calling a plugin. Config `{}`: answers `keep` without reading the logits;
//! `{"scan": true}`: reads every logit to find the largest and answers a bias of 0 on
//! it (the cost of a plugin that reads the whole row, e.g. for the per-language table in
//! docs/plugins.md).
#![no_std]

extern crate alloc;

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use guest_support::{Config, Global};

wit_bindgen::generate!({ path: "../../wit", world: "logits-processor-plugin" });

use exports::inferd::plugin::logits_processor::{Guest, LogitsEdit, PluginInfo, StepContext};
use inferd::plugin::types::TokenBias;

/// Whether `process` reads the row (`{"scan": true}`); per request (one instance each).
static SCAN: Global<bool> = Global::new(false);

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
        let config = Config::parse(&config, &["scan"])?;
        let scan = config.boolean("scan")?.unwrap_or(false);
        SCAN.with(|s| *s = scan);
        Ok(())
    }

    /// One decode step.
    fn process(_ctx: StepContext, logits: Vec<f32>) -> Result<LogitsEdit, String> {
        if !SCAN.with(|s| *s) {
            return Ok(LogitsEdit::Keep);
        }
        let mut best = (0u32, f32::NEG_INFINITY);
        for (i, &l) in logits.iter().enumerate() {
            if l > best.1 {
                best = (i as u32, l);
            }
        }
        Ok(LogitsEdit::Bias(vec![TokenBias {
            token: best.0,
            bias: 0.0,
        }]))
    }
}

export!(Noop);
