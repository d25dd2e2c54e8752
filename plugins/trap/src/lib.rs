//! `trap`: a test fixture that panics (a WebAssembly trap), to exercise the daemon's
//! handling of a crashed plugin.
//!
//! Config:
//! - `{}` or `{"after_steps": N}` (violates): the (N+1)-th `process` call panics
//!   (default N = 0: the first call);
//! - `{"never": true}` (obeys): never panics; every call returns `keep`;
//! - `{"in_configure": true}`: `configure` panics (takes precedence over the others);
//! - `{"never": true, "answer": A}` (violates the edit contract instead of trapping):
//!   every `process` call returns an invalid answer, `A` one of `"out_of_range"` (bans
//!   token id `vocab-size`), `"nan"` (a NaN bias), `"remove_all"` (`allow-only` of
//!   nothing) or `"err"` (an `err` result).
#![no_std]

extern crate alloc;

use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use guest_support::{Config, Global};

wit_bindgen::generate!({ path: "../../wit", world: "logits-processor-plugin" });

use exports::inferd::plugin::logits_processor::{Guest, LogitsEdit, PluginInfo, StepContext};
use inferd::plugin::host;
use inferd::plugin::types::TokenBias;

/// A deliberately invalid answer (`answer` in the config).
#[derive(Clone, Copy)]
enum Answer {
    /// `ban([vocab-size])`: a token id out of range.
    OutOfRange,
    /// `bias([{token 0, NaN}])`.
    Nan,
    /// `allow-only([])`: no token left.
    RemoveAll,
    /// `err("...")`.
    Err,
}

/// Per-request state.
struct State {
    /// Number of `process` calls that return before the panic; `None`: never panic.
    after_steps: Option<u64>,
    /// `process` calls so far.
    steps: u64,
    /// An invalid answer to give instead of `keep`.
    answer: Option<Answer>,
}

/// The state of this instance (one request).
static STATE: Global<State> = Global::new(State {
    after_steps: Some(0),
    steps: 0,
    answer: None,
});

/// The exported component.
struct Trap;

impl Guest for Trap {
    /// Name, version and description of the plugin.
    fn info() -> PluginInfo {
        PluginInfo {
            name: "trap".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Test fixture: panics after N steps, in configure, or never".into(),
        }
    }

    /// Validates `config` and sets up the per-request state.
    fn configure(config: String, _seed: u64) -> Result<(), String> {
        let config = Config::parse(&config, &["after_steps", "never", "in_configure", "answer"])?;
        let after_steps = config.integer("after_steps", 0, u64::MAX)?.unwrap_or(0);
        let never = config.boolean("never")?.unwrap_or(false);
        if config.boolean("in_configure")? == Some(true) {
            panic!("trap: panic in configure, as configured");
        }
        let answer = match config.get("answer") {
            None => None,
            Some(v) => Some(match v.as_str() {
                Some("out_of_range") => Answer::OutOfRange,
                Some("nan") => Answer::Nan,
                Some("remove_all") => Answer::RemoveAll,
                Some("err") => Answer::Err,
                _ => {
                    return Err(alloc::format!(
                        "answer: must be one of \"out_of_range\", \"nan\", \"remove_all\", \"err\", got {}",
                        guest_support::show(v)
                    ))
                }
            }),
        };
        STATE.with(|s| {
            s.after_steps = (!never).then_some(after_steps);
            s.answer = answer;
        });
        Ok(())
    }

    /// One decode step.
    fn process(_ctx: StepContext, _logits: Vec<f32>) -> Result<LogitsEdit, String> {
        STATE.with(|s| {
            if s.after_steps == Some(s.steps) {
                panic!("trap: panic at step {}, as configured", s.steps);
            }
            s.steps += 1;
            match s.answer {
                None => Ok(LogitsEdit::Keep),
                Some(Answer::OutOfRange) => Ok(LogitsEdit::Ban(vec![host::vocab_size()])),
                Some(Answer::Nan) => Ok(LogitsEdit::Bias(vec![TokenBias {
                    token: 0,
                    bias: f32::NAN,
                }])),
                Some(Answer::RemoveAll) => Ok(LogitsEdit::AllowOnly(Vec::new())),
                Some(Answer::Err) => Err("trap: an error result, as configured".to_string()),
            }
        })
    }
}

export!(Trap);
