//! The open-file limit (`RLIMIT_NOFILE`) against `server.max_connections`: at start-up
//! the soft limit is raised to the hard one (as nginx's `worker_rlimit_nofile` and Go's
//! runtime do), and a `max_connections` that, with a reserve for everything else the
//! daemon opens, would not fit is refused, so that a connection flood meets the 503 of
//! the connection limit rather than `EMFILE` in the middle of loading a plugin or
//! writing the prefix store.

use crate::config::ConfigError;

/// Descriptors kept for everything but client connections: the model file, the prefix
/// store (sled), the plugin compile cache, the runtime's epoll and event descriptors,
/// the standard streams, and the connection being refused at the limit. An idle daemon
/// holds about 28 (measured by `tests/tests/flood.rs`).
pub const RESERVED_FDS: u64 = 64;

/// The open-file limit after [`ensure_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    /// The soft limit now in force.
    pub soft: u64,
    /// The hard limit.
    pub hard: u64,
    /// The soft limit before it was raised, if it was.
    pub raised_from: Option<u64>,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit if it is lower, then checks that
/// `max_connections` plus [`RESERVED_FDS`] fit under it.
///
/// # Errors
/// The limit cannot hold `max_connections` (the message names the key, the need and the
/// limit, and what to change).
pub fn ensure_nofile(max_connections: usize) -> Result<Nofile, ConfigError> {
    let nofile = raise_soft_limit();
    check(max_connections, nofile).map_err(ConfigError)?;
    Ok(nofile)
}

/// The current limits, the soft one raised to the hard one where the kernel allows.
#[allow(clippy::unnecessary_cast)] // `rlim_t` is not `u64` on every target
fn raise_soft_limit() -> Nofile {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "getrlimit(RLIMIT_NOFILE) failed");
        return Nofile {
            soft: u64::MAX,
            hard: u64::MAX,
            raised_from: None,
        };
    }
    let (soft, hard) = (lim.rlim_cur as u64, lim.rlim_max as u64);
    // An unlimited hard limit cannot be the soft one (the kernel caps descriptors at
    // fs.nr_open): aim at that cap instead.
    let target = if lim.rlim_max == libc::RLIM_INFINITY {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20)
    } else {
        hard
    };
    if soft >= target {
        return Nofile {
            soft,
            hard,
            raised_from: None,
        };
    }
    let new = libc::rlimit {
        rlim_cur: target as libc::rlim_t,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: setrlimit reads one `rlimit` through a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            soft,
            target,
            "could not raise the open-file limit (RLIMIT_NOFILE)"
        );
        return Nofile {
            soft,
            hard,
            raised_from: None,
        };
    }
    Nofile {
        soft: target,
        hard,
        raised_from: Some(soft),
    }
}

/// Whether `max_connections` plus the reserve fit under `nofile.soft`.
fn check(max_connections: usize, nofile: Nofile) -> Result<(), String> {
    let need = (max_connections as u64).saturating_add(RESERVED_FDS);
    if need <= nofile.soft {
        return Ok(());
    }
    Err(format!(
        "server.max_connections = {max_connections} needs {need} file descriptors \
         ({RESERVED_FDS} reserved for the model, the prefix store and plugins) but the \
         open-file limit (RLIMIT_NOFILE) is {} (hard limit {}): lower \
         server.max_connections to at most {}, or raise the limit (systemd LimitNOFILE=, \
         ulimit -n)",
        nofile.soft,
        nofile.hard,
        nofile.soft.saturating_sub(RESERVED_FDS)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_connections_beyond_the_open_file_limit_is_a_config_error() {
        let lim = |soft, hard| Nofile {
            soft,
            hard,
            raised_from: None,
        };
        assert_eq!(check(960, lim(1024, 1024)), Ok(()));
        assert_eq!(
            check(1024, lim(1024, 1024)),
            Err(
                "server.max_connections = 1024 needs 1088 file descriptors (64 reserved for \
                 the model, the prefix store and plugins) but the open-file limit \
                 (RLIMIT_NOFILE) is 1024 (hard limit 1024): lower server.max_connections to \
                 at most 960, or raise the limit (systemd LimitNOFILE=, ulimit -n)"
                    .into()
            )
        );
        // The process's own limit, raised: the default setting fits on any usual system.
        let now = ensure_nofile(1).expect("one connection fits");
        assert!(now.soft >= 65 && now.soft <= now.hard, "{now:?}");
        assert!(ensure_nofile(usize::MAX >> 1).is_err());
    }
}
