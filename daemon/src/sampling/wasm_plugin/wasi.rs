//! The deny-by-default WASI 0.2 sandbox for plugins whose components import `wasi:*`
//! (componentize-py's Python interpreter, ComponentizeJS's StarlingMonkey, Rust `std`).
//! Components that import only `inferd:plugin/*` are linked without any of this.
//!
//! - Which interfaces a plugin may import: [`ALLOWED_INTERFACES`], checked at load by
//!   [`check_import`], any `0.2.x` version (wasmtime-wasi 48 implements 0.2.12 and links
//!   older 0.2 minors to it by semver).
//! - What they grant ([`sandbox_ctx`]): no preopened directories (a guest `open` fails
//!   inside the guest), no sockets and no name lookup (`access-denied`), no environment
//!   variables, no arguments, an empty stdin; stdout and stderr go line by line to the
//!   plugin's rate-limited log ([`LogSink`]).
//! - Clocks are virtual and per instance ([`VirtualClock`]): monotonic time starts at 0
//!   and advances [`CLOCK_STEP_NS`] per read and by the full length of every sleep, which
//!   returns at once; the wall clock is [`VIRTUAL_EPOCH_S`] plus that monotonic time.
//!   Neither leaks the host's time, and a sleeping plugin cannot hold a thread.
//! - Random bytes, secure and insecure, come from a ChaCha8 stream seeded by the
//!   request's seed and the plugin's place in the request ([`SeededRandom`]), so a seeded
//!   request with such a plugin reproduces exactly.
//!
//! wasmtime-wasi's synchronous bindings run some host calls (stream flushes, `poll`)
//! through a Tokio runtime of their own, which panics on a thread that is already inside
//! one (the scheduler's actix thread): [`off_runtime`] moves those plugins' calls to a
//! small pool of plain threads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use wasmtime::component::{Linker, Resource};
use wasmtime::StoreContextMut;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{DynPollable, OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{
    HostMonotonicClock, HostWallClock, ResourceTable, WasiCtx, WasiCtxBuilder, WasiCtxView,
    WasiView,
};

use super::host::{HostState, PluginLog};

/// The WASI interfaces a plugin may import (any `0.2.x` version). Everything else —
/// `wasi:http/*`, `wasi:keyvalue/*`, any other package — is refused at load.
pub const ALLOWED_INTERFACES: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "wasi:filesystem/types",
    "wasi:filesystem/preopens",
    "wasi:sockets/network",
    "wasi:sockets/instance-network",
    "wasi:sockets/tcp",
    "wasi:sockets/tcp-create-socket",
    "wasi:sockets/udp",
    "wasi:sockets/udp-create-socket",
    "wasi:sockets/ip-name-lookup",
];

/// Nanoseconds the virtual monotonic clock advances on every read.
pub const CLOCK_STEP_NS: u64 = 1_000;

/// What the virtual wall clock reads at a plugin's start: 2000-01-01T00:00:00Z, in
/// seconds since the Unix epoch.
pub const VIRTUAL_EPOCH_S: u64 = 946_684_800;

/// The version of `wasi:clocks/monotonic-clock` wasmtime-wasi 48 defines (the one our
/// `subscribe-*` replacements shadow).
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// Classifies one import of a plugin component: `Ok(false)` for `inferd:plugin/*`,
/// `Ok(true)` for an allowed WASI 0.2 interface.
///
/// # Errors
/// A message naming the import when it is neither.
pub fn check_import(name: &str) -> Result<bool, String> {
    if name.starts_with("inferd:plugin/") {
        return Ok(false);
    }
    let (interface, version) = name.split_once('@').unwrap_or((name, ""));
    if ALLOWED_INTERFACES.contains(&interface) && version.starts_with("0.2.") {
        return Ok(true);
    }
    Err(format!(
        "imports `{name}`, which the sandbox does not provide (plugins may import \
         inferd:plugin/host, inferd:plugin/types and these WASI 0.2 interfaces: {})",
        ALLOWED_INTERFACES.join(", ")
    ))
}

/// The WASI state of one plugin store.
pub(super) struct PluginWasi {
    ctx: WasiCtx,
    table: ResourceTable,
    clock: VirtualClock,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi.ctx,
            table: &mut self.wasi.table,
        }
    }
}

/// A context that grants nothing (see the module docs). `seed` seeds both random
/// sources; `log` receives stdout and stderr.
pub(super) fn sandbox_ctx(seed: u64, log: &Arc<Mutex<PluginLog>>) -> PluginWasi {
    let clock = VirtualClock::default();
    let mut b = WasiCtxBuilder::new();
    b.stdout(LogSink::new(log, "stdout"))
        .stderr(LogSink::new(log, "stderr"))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }))
        .wall_clock(clock.clone())
        .monotonic_clock(clock.clone())
        .secure_random(SeededRandom::new(seed, 0))
        .insecure_random(SeededRandom::new(seed, 1))
        .insecure_random_seed(u128::from(seed) << 64 | u128::from(seed.rotate_left(17)));
    PluginWasi {
        ctx: b.build(),
        table: ResourceTable::new(),
        clock,
    }
}

/// Links WASI 0.2 into `linker`, with the monotonic clock's `subscribe-duration` and
/// `subscribe-instant` replaced by virtual sleeps that return at once.
///
/// # Errors
/// When wasmtime-wasi's definitions do not link (a version mismatch).
pub(super) fn link(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK)?;
    clock.func_wrap(
        "subscribe-duration",
        |cx: StoreContextMut<'_, HostState>, (ns,): (u64,)| sleep(cx, |c| c.advance(ns)),
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |cx: StoreContextMut<'_, HostState>, (when,): (u64,)| sleep(cx, |c| c.advance_to(when)),
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A pollable that is ready at once: a sleep on the virtual clock.
struct Elapsed;

#[wasmtime_wasi::async_trait]
impl Pollable for Elapsed {
    async fn ready(&mut self) {}
}

/// A virtual sleep: moves the instance's clock with `advance`, then hands the guest a
/// pollable that is already ready.
fn sleep(
    mut cx: StoreContextMut<'_, HostState>,
    advance: impl FnOnce(&VirtualClock),
) -> wasmtime::Result<(Resource<DynPollable>,)> {
    let wasi = &mut cx.data_mut().wasi;
    advance(&wasi.clock);
    let ready = wasi.table.push(Elapsed)?;
    Ok((wasmtime_wasi::p2::subscribe(&mut wasi.table, ready)?,))
}

/// Per-instance virtual time, nanoseconds since the instance started.
#[derive(Clone, Default)]
pub struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    fn advance(&self, ns: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(ns))
            });
    }

    fn advance_to(&self, when: u64) {
        self.0.fetch_max(when, Ordering::Relaxed);
    }

    fn read(&self) -> u64 {
        self.0.fetch_add(CLOCK_STEP_NS, Ordering::Relaxed)
    }
}

impl HostMonotonicClock for VirtualClock {
    fn resolution(&self) -> u64 {
        CLOCK_STEP_NS
    }

    fn now(&self) -> u64 {
        self.read()
    }
}

impl HostWallClock for VirtualClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(CLOCK_STEP_NS)
    }

    fn now(&self) -> Duration {
        Duration::from_secs(VIRTUAL_EPOCH_S) + Duration::from_nanos(self.read())
    }
}

/// A guest's random source: ChaCha8 seeded from the request's seed and a stream number
/// (0 for `wasi:random/random`, 1 for `wasi:random/insecure`).
pub struct SeededRandom(ChaCha8Rng);

impl SeededRandom {
    fn new(seed: u64, stream: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        Self(rng)
    }
}

impl rand_core_wasi::TryRng for SeededRandom {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok(self.0.next_u32())
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        Ok(self.0.next_u64())
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        self.0.fill_bytes(dst);
        Ok(())
    }
}

/// A guest's stdout or stderr: complete lines go to the plugin's log (rate-limited with
/// its `log` calls); a partial line waits for its end, or for the stream's drop.
pub struct LogSink {
    log: Arc<Mutex<PluginLog>>,
    stream: &'static str,
    line: Vec<u8>,
}

impl LogSink {
    fn new(log: &Arc<Mutex<PluginLog>>, stream: &'static str) -> Self {
        Self {
            log: log.clone(),
            stream,
            line: Vec::new(),
        }
    }

    fn emit(&mut self) {
        let text = String::from_utf8_lossy(&self.line).into_owned();
        self.line.clear();
        if let Ok(mut log) = self.log.lock() {
            log.write(self.stream, &text);
        }
    }
}

impl Drop for LogSink {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.emit();
        }
    }
}

impl IsTerminal for LogSink {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogSink {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(tokio::io::sink())
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(Self::new(&self.log, self.stream))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LogSink {
    async fn ready(&mut self) {}
}

impl OutputStream for LogSink {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        for &b in &bytes {
            if b == b'\n' {
                self.emit();
            } else if self.line.len() < super::host::LOG_LINE_MAX_BYTES {
                self.line.push(b);
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

/// Runs `f` on a thread outside any Tokio runtime: inline when the caller is not in one,
/// else on the plugin pool (two plain threads), blocking the caller until it returns.
pub(super) fn off_runtime<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    let pool = POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .thread_name(|i| format!("inferd-wasi-{i}"))
            .build()
            .ok()
    });
    match pool {
        Some(pool) => pool.install(f),
        // No thread could be started: a scoped one per call.
        None => std::thread::scope(|s| match s.spawn(f).join() {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }),
    }
}
