//! Epoch-based call deadlines: one ticker thread per registry advances the engine's
//! epoch every [`EPOCH_TICK`] while any plugin call runs.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use wasmtime::Engine;

use super::EPOCH_TICK;

/// State shared by the epoch ticker thread and the plugin calls.
#[derive(Debug, Default)]
pub(super) struct TickerShared {
    stop: AtomicBool,
    /// Plugin calls running now; the ticker sleeps while there are none.
    active: AtomicUsize,
    thread: OnceLock<thread::Thread>,
}

/// Marks one plugin call as running (the ticker advances the epoch while any is).
pub(super) struct ActiveCall(Arc<TickerShared>);

impl ActiveCall {
    pub(super) fn start(shared: &Arc<TickerShared>) -> Self {
        if shared.active.fetch_add(1, Ordering::AcqRel) == 0 {
            if let Some(t) = shared.thread.get() {
                t.unpark();
            }
        }
        Self(shared.clone())
    }
}

impl Drop for ActiveCall {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Advances the engine's epoch every [`EPOCH_TICK`] while a plugin call runs, and
/// sleeps otherwise (an idle daemon gets no 1 kHz wake-ups); stops when dropped.
pub(super) struct EpochTicker {
    pub(super) shared: Arc<TickerShared>,
}

impl EpochTicker {
    pub(super) fn start(engine: &Engine) -> std::io::Result<Self> {
        let shared = Arc::new(TickerShared::default());
        let (s, weak) = (shared.clone(), engine.weak());
        let handle = thread::Builder::new()
            .name("plugin-epoch".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Acquire) {
                    if s.active.load(Ordering::Acquire) == 0 {
                        // Woken by the next call (`unpark`); the timeout only bounds
                        // how long a stop request waits.
                        thread::park_timeout(Duration::from_millis(100));
                        continue;
                    }
                    thread::sleep(EPOCH_TICK);
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })?;
        let _ = shared.thread.set(handle.thread().clone());
        Ok(Self { shared })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.shared.thread.get() {
            t.unpark();
        }
    }
}

/// The epoch deadline, in ticks, of a call that may last `d`.
pub(super) fn ticks(d: Duration) -> u64 {
    // +1: the current tick may be about to end, so a deadline of d lasts at least d.
    d.as_nanos().div_ceil(EPOCH_TICK.as_nanos()) as u64 + 1
}
