//! `busy_loop`: a test fixture that burns CPU, to exercise the daemon's per-call
//! deadline.
//!
//! Config:
//! - `{}` (violates the deadline): `process` never returns;
//! - `{"iterations": N}` (obeys it): each `process` spins `N` iterations, then `keep`;
//! - `{"in_configure": true}`: `configure` never returns (takes precedence).
#![no_std]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use core::hint::black_box;
use guest_support::{Config, Global};

wit_bindgen::generate!({ path: "../../wit", world: "logits-processor-plugin" });

use exports::inferd::plugin::logits_processor::{Guest, LogitsEdit, PluginInfo, StepContext};

/// One iteration of work the optimizer cannot remove: an LCG step through `black_box`.
#[inline(always)]
fn work(x: u64, i: u64) -> u64 {
    black_box(
        x.wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(i | 1),
    )
}

/// Spins `iterations` iterations of `work`.
pub fn spin(iterations: u64) -> u64 {
    (0..iterations).fold(0, work)
}

/// Spins forever.
pub fn spin_forever() -> ! {
    let mut x = 0;
    let mut i = 0u64;
    loop {
        x = work(x, i);
        i = i.wrapping_add(1);
    }
}

/// Iterations per `process` call; `None` means forever. Set by `configure`.
static ITERATIONS: Global<Option<u64>> = Global::new(None);

/// The exported component.
struct BusyLoop;

impl Guest for BusyLoop {
    /// Name, version and description of the plugin.
    fn info() -> PluginInfo {
        PluginInfo {
            name: "busy_loop".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Test fixture: spins N iterations per step, or forever".into(),
        }
    }

    /// Validates `config` and sets up the per-request state.
    fn configure(config: String, _seed: u64) -> Result<(), String> {
        let config = Config::parse(&config, &["iterations", "in_configure"])?;
        let iterations = config.integer("iterations", 0, u64::MAX)?;
        if config.boolean("in_configure")? == Some(true) {
            spin_forever();
        }
        ITERATIONS.with(|n| *n = iterations);
        Ok(())
    }

    /// One decode step.
    fn process(_ctx: StepContext, _logits: Vec<f32>) -> Result<LogitsEdit, String> {
        match ITERATIONS.with(|n| *n) {
            Some(n) => {
                black_box(spin(n));
                Ok(LogitsEdit::Keep)
            }
            None => spin_forever(),
        }
    }
}

export!(BusyLoop);
