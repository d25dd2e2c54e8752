//! The network edge: one TCP listener speaking HTTP/1.1 (hyper), where `GET /v1/ws`
//! upgrades to a WebSocket session (protocol v1, `docs/protocol.md`) and the other
//! routes are the browser chat page, health, readiness, metrics and the
//! OpenAI-compatible API (`docs/http-api.md`). No inference logic lives here: requests
//! are validated through `api`, handed to the prepare stage, and each request's events
//! are forwarded back.
//!
//! Every accepted TCP connection holds a slot under `server.max_connections` until its
//! socket closes; one beyond it gets a canned `503` at accept (`limit`), and the
//! open-file limit is raised and checked against it at start-up (`nofile`).
//!
//! Everything here runs on the actix system thread (connections are spawned with
//! `actix_rt::spawn`), so shared state is `Rc`/`RefCell`.

mod http;
mod limit;
mod lora;
mod nofile;
mod openai;
mod openai_choices;
mod openai_logprobs;
mod page;
mod session;
mod subprotocol;
mod tracker;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::rc::Rc;

use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};

use crate::api::SamplingDefaults;
pub use crate::engine::{Engine, SharedPlugins};
use crate::error::{ErrorKind, InferError};
use crate::request::{CancelFlag, EventReceiver, GenerateRequest, SeqId};
pub use limit::ConnectionLimits;
use limit::{Counted, RefusalLog, Slots};
pub use nofile::{ensure_nofile, Nofile, RESERVED_FDS};
pub use tracker::{Tracked, Tracker};

/// Seconds since the Unix epoch (OpenAI's `created` fields).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What every connection shares: the engine once loaded, the API key, the requests in
/// flight and the shutdown state.
pub struct State {
    engine: RefCell<Option<Engine>>,
    api_key: RefCell<Option<String>>,
    tracker: Tracker,
    draining: Cell<bool>,
    /// Set to `true` when connections should close (after the drain).
    closing: watch::Sender<bool>,
    connections: Cell<usize>,
    connections_changed: Notify,
    /// `server.max_connections` and `server.header_timeout_ms`.
    limits: Cell<ConnectionLimits>,
    /// The open TCP connections, each holding a slot until its socket closes.
    slots: Slots,
    /// What a connection beyond the limit is sent (built when the limits change).
    refusal: RefCell<Rc<[u8]>>,
    refusal_log: RefusalLog,
}

impl State {
    /// A server still loading its model (`/ready` answers 503 until
    /// [`State::set_engine`]).
    pub fn new(api_key: Option<String>) -> Rc<Self> {
        Rc::new(Self {
            engine: RefCell::new(None),
            api_key: RefCell::new(api_key),
            tracker: Tracker::default(),
            draining: Cell::new(false),
            closing: watch::channel(false).0,
            connections: Cell::new(0),
            connections_changed: Notify::new(),
            limits: Cell::new(ConnectionLimits::default()),
            slots: Slots::default(),
            refusal: RefCell::new(
                limit::refusal_response(ConnectionLimits::default().max_connections).into(),
            ),
            refusal_log: RefusalLog::default(),
        })
    }

    /// Sets `server.max_connections` and `server.header_timeout_ms` (at start-up and on
    /// SIGHUP); they apply from the next accepted connection. Lowering the limit closes
    /// nothing: connections beyond it are refused until enough have closed.
    pub fn set_connection_limits(&self, limits: ConnectionLimits) {
        if limits.max_connections != self.limits.get().max_connections {
            *self.refusal.borrow_mut() = limit::refusal_response(limits.max_connections).into();
        }
        self.limits.set(limits);
    }

    /// TCP connections open now (each counts once, through a WebSocket upgrade too).
    pub fn open_connections(&self) -> usize {
        self.slots.open()
    }

    /// The model is loaded and the pipeline runs: start serving requests.
    pub fn set_engine(&self, engine: Engine) {
        *self.engine.borrow_mut() = Some(engine);
    }

    /// A snapshot of the engine handles; `None` while loading.
    pub fn engine(&self) -> Option<Engine> {
        self.engine.borrow().clone()
    }

    /// Applies reloaded settings to the running engine (SIGHUP).
    pub fn reconfigure(
        &self,
        api_key: Option<String>,
        defaults: SamplingDefaults,
        max_message_bytes: usize,
    ) {
        *self.api_key.borrow_mut() = api_key;
        if let Some(e) = self.engine.borrow_mut().as_mut() {
            e.defaults = defaults;
            e.max_message_bytes = max_message_bytes;
        }
    }

    /// Whether the server answers requests: loaded and not shutting down (`/ready`).
    pub fn is_ready(&self) -> bool {
        self.engine.borrow().is_some() && !self.draining.get()
    }

    /// Registers and starts a validated generate request; its events arrive on the
    /// returned receiver (`Started`, `Delta`s, then `Done` or `Error`).
    ///
    /// # Errors
    /// `overloaded` once a shutdown has begun.
    pub fn start_request(
        &self,
        engine: &Engine,
        request: GenerateRequest,
    ) -> Result<(Tracked, EventReceiver), InferError> {
        if self.draining.get() {
            return Err(InferError::new(
                ErrorKind::Overloaded,
                "the daemon is shutting down and accepts no new requests",
            ));
        }
        let adapter = engine.lease_adapter(&request)?;
        let seq = SeqId::next();
        let cancel = CancelFlag::new();
        let (tx, rx) = mpsc::unbounded_channel();
        let tracked = self
            .tracker
            .track(seq, cancel.clone(), engine.canceller())
            .with_choices(request.sampling.n);
        engine.submit(seq, request, adapter, tx, cancel);
        Ok((tracked, rx))
    }

    /// Graceful shutdown after the listener has stopped accepting: new requests are
    /// refused, running ones get up to `grace` to finish (or until `hurry` resolves,
    /// e.g. a second signal), the rest are cancelled and end with `finish_reason:
    /// "cancelled"`; then every connection is closed once its final frames are written.
    pub async fn drain(&self, grace: Duration, hurry: impl Future<Output = ()>) {
        self.draining.set(true);
        let in_flight = self.tracker.len();
        if in_flight > 0 {
            tracing::info!(
                requests = in_flight,
                grace_s = grace.as_secs_f64(),
                "draining: waiting for running requests to finish"
            );
            let why = tokio::select! {
                () = self.tracker.wait_empty() => None,
                () = tokio::time::sleep(grace) => Some("the shutdown grace period is over"),
                () = hurry => Some("a second signal arrived"),
            };
            if let Some(why) = why {
                tracing::warn!(
                    requests = self.tracker.len(),
                    "{why}: cancelling the requests still running"
                );
                if let Some(engine) = self.engine() {
                    self.tracker.cancel_all(&engine.canceller());
                }
                let _ =
                    tokio::time::timeout(Duration::from_secs(5), self.tracker.wait_empty()).await;
            }
        }
        self.closing.send_replace(true);
        let closed = async {
            loop {
                let changed = self.connections_changed.notified();
                if self.connections.get() == 0 {
                    return;
                }
                changed.await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), closed).await;
    }

    fn connection_opened(self: &Rc<Self>) -> ConnectionGuard {
        self.connections.set(self.connections.get() + 1);
        ConnectionGuard(self.clone())
    }

    /// Resolves when connections should close.
    fn closing(&self) -> impl Future<Output = ()> + 'static {
        let mut rx = self.closing.subscribe();
        async move {
            let _ = rx.wait_for(|c| *c).await;
        }
    }
}

/// Counts an open connection (HTTP or WebSocket) until dropped.
struct ConnectionGuard(Rc<State>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let s = &self.0;
        s.connections.set(s.connections.get().saturating_sub(1));
        s.connections_changed.notify_waiters();
    }
}

/// Accepts connections on `listener` until `stop` resolves; then the listener is
/// dropped (new connections are refused) while open ones go on (see
/// [`State::drain`]). Must run inside an actix `System`.
pub async fn serve(listener: TcpListener, state: Rc<State>, stop: impl Future<Output = ()>) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let limits = state.limits.get();
                    match state.slots.try_take(limits.max_connections) {
                        Some(slot) => {
                            let _ = stream.set_nodelay(true);
                            let io = Counted::new(stream, slot);
                            actix_rt::spawn(connection(io, state.clone(), limits.header_timeout));
                        }
                        None => {
                            // Beyond the limit: answered and closed here, without a task
                            // and without waiting for the client.
                            let response = state.refusal.borrow().clone();
                            limit::refuse(stream, &response);
                            state.refusal_log.refused(limits);
                        }
                    }
                }
                Err(e) => {
                    // Out of file descriptors and similar: back off briefly, keep serving.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Serves one accepted connection. `header_timeout` bounds the wait for each request's
/// headers, counted from the accept or the previous response (hyper restarts it when a
/// keep-alive connection goes idle), so a slowloris client, an idle socket and an idle
/// keep-alive connection all give their slot back; a WebSocket session, once upgraded,
/// keeps the slot until it closes.
async fn connection(stream: Counted, state: Rc<State>, header_timeout: Duration) {
    let _open = state.connection_opened();
    let st = state.clone();
    let service = service_fn(move |req| {
        let st = st.clone();
        async move { Ok::<_, std::convert::Infallible>(http::route(req, st).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                if e.is_timeout() {
                    crate::metrics::metrics().connection_header_timeouts.inc();
                }
                tracing::debug!(error = %e, "http connection ended with an error");
            }
        }
        () = state.closing() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
