//! Logging: `tracing` to stderr, journald-friendly (no ANSI colours unless stderr is a
//! terminal). The filter comes from `RUST_LOG` when set, else from `log.level`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Calling it twice is harmless (the second call is ignored).
///
/// # Errors
/// An invalid filter directive in `level`, naming it.
pub fn init(level: &str) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            EnvFilter::try_new(&v).map_err(|e| format!("RUST_LOG = \"{v}\": {e}"))?
        }
        _ => EnvFilter::try_new(level).map_err(|e| format!("log.level = \"{level}\": {e}"))?,
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
    Ok(())
}
