//! systemd integration: readiness, status, reload, stop and watchdog notifications over
//! `$NOTIFY_SOCKET` (the sd_notify(3) datagram protocol, through the `sd-notify`
//! crate). Outside systemd (no `NOTIFY_SOCKET`) every call does nothing.
//!
//! The daemon sends `STATUS=` lines while it loads, `READY=1` once the model is loaded
//! and the listener accepts, `RELOADING=1` / `READY=1` around a configuration reload,
//! `STOPPING=1` when it begins to shut down, and `WATCHDOG=1` from the engine loop
//! ([`crate::scheduler::SchedulerActor`]) every half `WatchdogSec=` while the engine
//! makes progress.

use std::time::Duration;

use sd_notify::NotifyState;

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// `STATUS=<text>`: one line shown by `systemctl status`.
pub fn status(text: &str) {
    send(&[NotifyState::Status(text)]);
}

/// `READY=1` with a final `STATUS=`.
pub fn ready(text: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(text)]);
}

/// `RELOADING=1` with `MONOTONIC_USEC=` (systemd 253+ matches the two to the reload it
/// started; older ones ignore the field): a configuration reload has begun (end it with
/// [`ready`]).
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

/// `STOPPING=1`: shutdown has begun.
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("shutting down")]);
}

/// `WATCHDOG=1`: the engine is alive.
pub fn watchdog_ping() {
    send(&[NotifyState::Watchdog]);
}

/// When each engine loop last made progress (`[[engines]]`: one slot per loop).
static ENGINES_ALIVE: std::sync::Mutex<Vec<std::time::Instant>> = std::sync::Mutex::new(Vec::new());

/// A slot for one more engine loop in the watchdog's view; it counts as alive now.
pub fn watchdog_register() -> usize {
    let mut alive = ENGINES_ALIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    alive.push(std::time::Instant::now());
    alive.len() - 1
}

/// Engine loop `slot` is making progress: pings the watchdog when every engine loop
/// has said so within `within` (a hung engine among several stops the pings, as a hung
/// single engine does).
pub fn watchdog_alive(slot: usize, within: Duration) {
    let all = {
        let mut alive = ENGINES_ALIVE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(t) = alive.get_mut(slot) {
            *t = std::time::Instant::now();
        }
        alive.iter().all(|t| t.elapsed() < within)
    };
    if all {
        watchdog_ping();
    }
}

/// How often to send [`watchdog_ping`]: half the watchdog timeout systemd set for
/// this process, or `None` when the watchdog is off. As sd_watchdog_enabled(3):
/// `WATCHDOG_USEC` gives the timeout in microseconds; `WATCHDOG_PID`, when set, must
/// name this process (the `sd-notify` crate's check requires it to be set, which
/// systemd always does; tests start the daemon without knowing its pid).
pub fn watchdog_interval() -> Option<Duration> {
    let mut usec = 0u64;
    if sd_notify::watchdog_enabled(false, &mut usec) && usec > 0 {
        return Some(Duration::from_micros(usec / 2));
    }
    if std::env::var_os("WATCHDOG_PID").is_some() {
        return None; // set for another process
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}
