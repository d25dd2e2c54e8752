//! Logging: `tracing` to stderr, journald-friendly (no ANSI colours unless stderr is a
//! terminal). The filter comes from `RUST_LOG` when set, else from `log.level`, which a
//! SIGHUP reload can change ([`set_level`]).

use std::io::IsTerminal;
use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{fmt, reload, EnvFilter, Registry};

/// The handle that swaps the filter; set when `log.level` (not `RUST_LOG`) governs.
static LEVEL: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Level names a bare directive may be.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Parses `log.level`. Stricter than `EnvFilter` itself, which reads a bare word that is
/// not a level (`"loud"`, `"warning"`) as a target name and so silently turns every
/// other log line off: a bare directive must be a level; targets need `TARGET=LEVEL`.
fn filter(level: &str) -> Result<EnvFilter, String> {
    for d in level.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if !d.contains('=') && !d.contains('[') && !LEVELS.iter().any(|l| d.eq_ignore_ascii_case(l))
        {
            return Err(format!(
                "log.level = \"{level}\": {d:?} is neither a level ({}) nor a \
                 TARGET=LEVEL directive",
                LEVELS.join(", ")
            ));
        }
    }
    EnvFilter::try_new(level).map_err(|e| format!("log.level = \"{level}\": {e}"))
}

/// Installs the global subscriber. Calling it twice is harmless (the second call is ignored).
///
/// # Errors
/// An invalid filter directive in `level`, naming it.
pub fn init(level: &str) -> Result<(), String> {
    // log.level is checked even when RUST_LOG overrides it, so a bad value never waits
    // silently for the day RUST_LOG is unset.
    check_level(level)?;
    let from_env = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            Some(EnvFilter::try_new(&v).map_err(|e| format!("RUST_LOG = \"{v}\": {e}"))?)
        }
        _ => None,
    };
    let governed_by_config = from_env.is_none();
    let (layer, handle) = reload::Layer::new(match from_env {
        Some(f) => f,
        None => filter(level)?,
    });
    let installed = tracing_subscriber::registry()
        .with(layer)
        .with(
            fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_target(false),
        )
        .try_init()
        .is_ok();
    if installed && governed_by_config {
        let _ = LEVEL.set(handle);
    }
    Ok(())
}

/// Checks a `log.level` value without applying it.
///
/// # Errors
/// An invalid filter directive, naming `log.level`.
pub fn check_level(level: &str) -> Result<(), String> {
    filter(level).map(drop)
}

/// Applies a new `log.level` (SIGHUP). Returns `false` when `RUST_LOG` governs the
/// filter instead (the value is then ignored).
///
/// # Errors
/// An invalid filter directive, naming `log.level`.
pub fn set_level(level: &str) -> Result<bool, String> {
    let f = filter(level)?;
    match LEVEL.get() {
        Some(handle) => handle
            .reload(f)
            .map(|()| true)
            .map_err(|e| format!("log.level: {e}")),
        None => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_word_that_is_no_level_is_refused() {
        for ok in [
            "info",
            "WARN",
            "info,inferd=debug",
            "off",
            "inferd::server=trace",
        ] {
            assert!(check_level(ok).is_ok(), "{ok}");
        }
        let e = check_level("loud").expect_err("not a level");
        assert!(
            e.starts_with("log.level = \"loud\": \"loud\" is neither a level"),
            "{e}"
        );
        assert!(check_level("info,warning").is_err());
        assert!(check_level("info,foo=bar=baz").is_err());
    }
}
