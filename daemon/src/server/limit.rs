//! The connection limit, `server.max_connections`: every accepted TCP connection holds a
//! [`Slot`] for as long as its socket is open. The slot rides inside the socket's I/O
//! object ([`Counted`]), so it follows the socket through HTTP keep-alive and into a
//! WebSocket session after the upgrade, and is released when the socket is closed,
//! whoever closes it. A connection beyond the limit is refused at accept ([`refuse`]):
//! a canned `503` written without waiting, then closed, with no task spawned for it.

use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::config::ServerConfig;
use crate::metrics::metrics;

/// The connection settings, read at every accept (`server.max_connections`,
/// `server.header_timeout_ms`; reloaded on SIGHUP).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most TCP connections open at once.
    pub max_connections: usize,
    /// Time a client has to send a request's headers (also the keep-alive idle time).
    pub header_timeout: Duration,
}

impl ConnectionLimits {
    /// The limits `server` configures.
    pub fn from_config(server: &ServerConfig) -> Self {
        Self {
            max_connections: server.max_connections,
            header_timeout: Duration::from_millis(server.header_timeout_ms),
        }
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self::from_config(&ServerConfig::default())
    }
}

/// The open connections, counted by their slots.
#[derive(Default)]
pub(super) struct Slots(Arc<AtomicUsize>);

impl Slots {
    /// Connections open now.
    pub(super) fn open(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// A slot for a new connection, or `None` when `max` are open. Only the accept loop
    /// takes slots, so the check and the increment cannot race each other.
    pub(super) fn try_take(&self, max: usize) -> Option<Slot> {
        if self.open() >= max {
            return None;
        }
        self.0.fetch_add(1, Ordering::Relaxed);
        metrics().connections_open.inc();
        Some(Slot(self.0.clone()))
    }
}

/// One open connection's place under `server.max_connections`; released on drop.
pub(super) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        metrics().connections_open.dec();
    }
}

/// A TCP stream with its slot: the slot is released when the stream is dropped
/// (`Send`, so hyper can hand it to a WebSocket session as the upgraded I/O).
pub(super) struct Counted {
    stream: TcpStream,
    _slot: Slot,
}

impl Counted {
    /// `stream`, holding `slot` until it is dropped.
    pub(super) fn new(stream: TcpStream, slot: Slot) -> Self {
        Self {
            stream,
            _slot: slot,
        }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The bytes a refused connection gets: `503 Service Unavailable`, `Connection: close`,
/// `Retry-After: 1` and the daemon's JSON error body (type `overloaded_error`, code
/// `overloaded`) naming `server.max_connections` and its value.
pub(super) fn refusal_response(max_connections: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "error": {
            "message": format!(
                "too many connections: server.max_connections = {max_connections} are \
                 open; retry later"
            ),
            "type": "overloaded_error",
            "param": null,
            "code": "overloaded",
        }
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Refuses a connection without waiting for it: one non-blocking write of `response`
/// (a fresh socket's send buffer takes it whole; a client that cannot take it gets
/// less), one non-blocking read of what the client already sent (closing a socket with
/// unread data would reset the connection and could destroy the response before the
/// client reads it), then close.
pub(super) fn refuse(stream: TcpStream, response: &[u8]) {
    let _ = stream.try_write(response);
    let mut sink = [0u8; 4096];
    let _ = stream.try_read(&mut sink);
    metrics().connections_refused.inc();
}

/// Rate-limits the warning about refused connections: one line per 10 s at most, with
/// the count since the previous line.
#[derive(Default)]
pub(super) struct RefusalLog {
    unlogged: Cell<u64>,
    last: Cell<Option<Instant>>,
}

impl RefusalLog {
    const EVERY: Duration = Duration::from_secs(10);

    /// Counts one refusal; logs when the previous line is old enough.
    pub(super) fn refused(&self, limits: ConnectionLimits) {
        self.unlogged.set(self.unlogged.get() + 1);
        if self.last.get().is_some_and(|t| t.elapsed() < Self::EVERY) {
            return;
        }
        self.last.set(Some(Instant::now()));
        tracing::warn!(
            refused = self.unlogged.replace(0),
            max_connections = limits.max_connections,
            "connection limit reached (server.max_connections): refusing new connections \
             with 503"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_and_released_on_drop() {
        let slots = Slots::default();
        let a = slots.try_take(2).expect("first");
        let b = slots.try_take(2).expect("second");
        assert!(slots.try_take(2).is_none());
        assert_eq!(slots.open(), 2);
        drop(a);
        assert_eq!(slots.open(), 1);
        let _c = slots.try_take(2).expect("freed");
        drop(b);
        assert_eq!(slots.open(), 1);
    }

    #[test]
    fn refusal_is_a_complete_503_naming_the_limit() {
        let raw = String::from_utf8(refusal_response(16)).expect("utf-8");
        let (head, body) = raw.split_once("\r\n\r\n").expect("head");
        assert!(
            head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\nconnection: close"), "{head}");
        assert!(
            head.contains(&format!("\r\ncontent-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(v["error"]["code"], "overloaded");
        assert_eq!(
            v["error"]["message"],
            "too many connections: server.max_connections = 16 are open; retry later"
        );
    }
}
