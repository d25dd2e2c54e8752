//! WebSocket sessions (`ws://HOST:PORT/v1/ws`, protocol v1 in `docs/protocol.md`),
//! started by the HTTP layer after the upgrade.
//!
//! Each session runs on the actix system's executor as one reader loop plus one
//! writer task; each accepted request gets a forwarding task that turns its
//! [`StreamEvent`]s into frames. A connection tracks its active request ids; closing it
//! cancels them all.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::rc::Rc;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::error::{CapacityError, Error as WsError};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::{Engine, State, Tracked};
use crate::api::{self, ClientMessage};
use crate::error::{ErrorKind, InferError};
use crate::request::{CancelFlag, SeqId, StreamEvent};

/// WebSocket endpoint path.
pub const WS_PATH: &str = "/v1/ws";

/// Frames queued for one connection's writer before its reader stops reading.
const OUTBOUND_QUEUE_FRAMES: usize = 64;

/// `tokenize`/`detokenize` requests one connection may have in flight; more get an
/// `overloaded` error at once.
const MAX_UTILITY_IN_FLIGHT: usize = 16;

/// An active request of one connection.
struct Active {
    seq: SeqId,
    cancel: CancelFlag,
}

type ActiveMap = Rc<RefCell<HashMap<String, Active>>>;

/// The WebSocket settings of a new session: messages and frames up to
/// `server.max_message_bytes`.
pub(super) fn ws_config(max_message_bytes: usize) -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(max_message_bytes))
        .max_frame_size(Some(max_message_bytes))
}

/// Runs one WebSocket session (after the HTTP upgrade) until the client closes it, or
/// the server does at the end of a shutdown.
pub(super) async fn run<S>(ws: WebSocketStream<S>, state: Rc<State>)
where
    S: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let _open = state.connection_opened();
    let (mut sink, mut source) = ws.split();
    // Bounded: when a client stops reading, the writer blocks, this queue fills, and then
    // the reader stops reading that client's frames too (TCP backpressure), so one slow
    // or hostile client cannot grow the daemon's memory without bound.
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(OUTBOUND_QUEUE_FRAMES);
    let utility_in_flight = Rc::new(Cell::new(0usize));
    let writer = actix_rt::spawn(async move {
        while let Some(msg) = out_rx.recv().await {
            if sink.send(msg).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let active: ActiveMap = Rc::new(RefCell::new(HashMap::new()));
    let closing = state.closing();
    tokio::pin!(closing);

    loop {
        let frame = tokio::select! {
            f = source.next() => match f {
                Some(f) => f,
                None => break,
            },
            () = &mut closing => {
                // Shutdown: every request has ended (drained or cancelled); say goodbye
                // (1001, "going away").
                let _ = out_tx
                    .send(Message::Close(Some(CloseFrame {
                        code: CloseCode::Away,
                        reason: "server shutting down".into(),
                    })))
                    .await;
                break;
            }
        };
        let frame = match frame {
            Ok(f) => f,
            Err(WsError::Capacity(CapacityError::MessageTooLong { size, max_size })) => {
                // The frame stream cannot be resynchronised after an oversized message:
                // say why, then close with 1009 (RFC 6455 §7.4.1, "message too big").
                let e = InferError::validation(format!(
                    "message of {size} bytes exceeds the limit of {max_size} bytes \
                     (server.max_message_bytes); closing the connection"
                ));
                tracing::warn!(size, max_size, "oversized websocket message");
                let _ = out_tx.send(Message::text(api::error_frame(None, &e))).await;
                let _ = out_tx
                    .send(Message::Close(Some(CloseFrame {
                        code: CloseCode::Size,
                        reason: "message too big".into(),
                    })))
                    .await;
                break;
            }
            Err(e) => {
                if let Some((code, reason)) = protocol_violation(&e) {
                    // A frame broke RFC 6455: fail the connection (§7.1.7) with the code
                    // §7.4.1 assigns and a reason naming what was wrong.
                    tracing::warn!(
                        code = u16::from(code),
                        reason = %reason,
                        error = %e,
                        "websocket protocol error; closing the connection"
                    );
                    let _ = out_tx
                        .send(Message::Close(Some(CloseFrame {
                            code,
                            reason: reason.into(),
                        })))
                        .await;
                } else {
                    tracing::debug!(error = %e, "websocket read error");
                }
                break;
            }
        };
        match frame {
            Message::Text(text) => {
                let Some(engine) = state.engine() else { break };
                handle_text(
                    text.as_str(),
                    &state,
                    &engine,
                    &active,
                    &out_tx,
                    &utility_in_flight,
                )
                .await
            }
            Message::Binary(_) => {
                let e = InferError::validation(
                    "binary frames are not supported: send JSON text frames",
                );
                let _ = out_tx.send(Message::text(api::error_frame(None, &e))).await;
            }
            Message::Close(_) => break,
            _ => {} // ping/pong are answered by tungstenite
        }
    }

    // Connection gone: cancel everything it started.
    if let Some(engine) = state.engine() {
        for (_, a) in active.borrow_mut().drain() {
            a.cancel.cancel();
            engine.cancel(a.seq);
        }
    }
    drop(out_tx);
    let _ = writer.await;
}

/// The close code (RFC 6455 §7.4.1) and reason for a frame the client got wrong: 1007
/// for a text message that is not UTF-8, 1002 for any other protocol violation. `None`
/// for errors that are not the client's frames (I/O, a connection already gone).
/// Reasons stay well under the 123 bytes a close frame has room for.
fn protocol_violation(e: &WsError) -> Option<(CloseCode, String)> {
    use tokio_tungstenite::tungstenite::error::ProtocolError as P;
    let reason = match e {
        WsError::Utf8(_) => {
            return Some((
                CloseCode::Invalid,
                "text message (or close reason) is not valid UTF-8".into(),
            ))
        }
        WsError::Protocol(p) => match p {
            P::NonZeroReservedBits => "reserved bits set (no extension was negotiated)".into(),
            P::UnmaskedFrameFromClient => "client frames must be masked".into(),
            P::FragmentedControlFrame => "fragmented control frame".into(),
            P::ControlFrameTooBig => "control frame payload over 125 bytes".into(),
            P::UnknownControlFrameType(op) | P::UnknownDataFrameType(op) | P::InvalidOpcode(op) => {
                format!("reserved opcode {op}")
            }
            P::UnexpectedContinueFrame => "continuation frame with no message to continue".into(),
            P::ExpectedFragment(_) => "new data frame before the fragmented message ended".into(),
            P::InvalidCloseSequence => "invalid close frame payload".into(),
            _ => return None,
        },
        _ => return None,
    };
    Some((CloseCode::Protocol, reason))
}

async fn handle_text(
    text: &str,
    state: &State,
    engine: &Engine,
    active: &ActiveMap,
    out: &mpsc::Sender<Message>,
    utility_in_flight: &Rc<Cell<usize>>,
) {
    // An error about a rejected frame carries the frame's id unless that id belongs to a
    // request still active on this connection: then `id` is null (the message names the
    // id), so the active request's stream is never ended by someone else's error.
    let reject_id = |id: Option<&str>| {
        id.filter(|i| !active.borrow().contains_key(*i))
            .map(str::to_owned)
    };
    let msg = match api::parse_client_message(text, &engine.defaults, engine.vocab_size) {
        Ok(m) => m,
        Err(e) => {
            let id = reject_id(e.id.as_deref());
            let _ = out
                .send(Message::text(api::error_frame(id.as_deref(), &e.error)))
                .await;
            return;
        }
    };
    match msg {
        ClientMessage::Generate(request) => {
            let id = request.client_id.clone();
            if active.borrow().contains_key(&id) {
                let e = InferError::validation(format!(
                    "id: a request with id \"{id}\" is already active on this connection"
                ));
                let _ = out.send(Message::text(api::error_frame(None, &e))).await;
                return;
            }
            let (tracked, rx) = match state.start_request(engine, *request) {
                Ok(started) => started,
                Err(e) => {
                    let _ = out
                        .send(Message::text(api::error_frame(Some(&id), &e)))
                        .await;
                    return;
                }
            };
            active.borrow_mut().insert(
                id.clone(),
                Active {
                    seq: tracked.seq(),
                    cancel: tracked.cancel_flag(),
                },
            );
            actix_rt::spawn(forward_events(id, tracked, rx, active.clone(), out.clone()));
        }
        ClientMessage::Cancel { id } => {
            // Cancelling an id that is not active (unknown, or finished while the cancel
            // was in flight) is a no-op, as docs/protocol.md specifies.
            if let Some(a) = active.borrow().get(&id) {
                a.cancel.cancel();
                engine.cancel(a.seq);
            }
        }
        ClientMessage::Tokenize { id, text, special } => {
            let engine = engine.clone();
            let err_id = reject_id(Some(&id));
            spawn_utility(
                id,
                err_id,
                out,
                utility_in_flight,
                move |id, err_id| async move {
                    match engine.tokenize(text, special).await {
                        Ok(ids) => api::tokens_frame(&id, &ids),
                        Err(e) => api::error_frame(err_id.as_deref(), &e),
                    }
                },
            )
            .await;
        }
        ClientMessage::Stats { id } => {
            // Error frames never carry the id of a request still active here.
            let err_id = reject_id(id.as_deref());
            let Some(guard) = UtilityGuard::acquire(utility_in_flight) else {
                let frame = api::error_frame(err_id.as_deref(), &utility_overloaded());
                let _ = out.send(Message::text(frame)).await;
                return;
            };
            let engine = engine.clone();
            let out = out.clone();
            actix_rt::spawn(async move {
                let frame = match engine.stats().await {
                    Ok(stats) => api::stats_frame(id.as_deref(), &stats),
                    Err(e) => api::error_frame(err_id.as_deref(), &e),
                };
                let _ = out.send(Message::text(frame)).await;
                drop(guard);
            });
        }
        ClientMessage::Plugins { id } => {
            let list = match engine.plugins.read() {
                Ok(p) => p.list(),
                Err(poisoned) => poisoned.into_inner().list(),
            };
            let frame = api::plugins_frame(id.as_deref(), &list);
            let _ = out.send(Message::text(frame)).await;
        }
        ClientMessage::Detokenize { id, token_ids } => {
            let engine = engine.clone();
            let err_id = reject_id(Some(&id));
            spawn_utility(
                id,
                err_id,
                out,
                utility_in_flight,
                move |id, err_id| async move {
                    match engine.detokenize(token_ids).await {
                        Ok(text) => api::text_frame(&id, &text),
                        Err(e) => api::error_frame(err_id.as_deref(), &e),
                    }
                },
            )
            .await;
        }
    }
}

/// Runs a `tokenize`/`detokenize` request in the background and queues its reply, or
/// answers `overloaded` at once when the connection already has
/// [`MAX_UTILITY_IN_FLIGHT`] of them waiting. Error frames carry `err_id`: the request's
/// id, or `None` when that id belongs to a generate request still active on the
/// connection (an error frame with its id would read as that request's end).
async fn spawn_utility<F, Fut>(
    id: String,
    err_id: Option<String>,
    out: &mpsc::Sender<Message>,
    in_flight: &Rc<Cell<usize>>,
    reply: F,
) where
    F: FnOnce(String, Option<String>) -> Fut + 'static,
    Fut: Future<Output = String> + 'static,
{
    let Some(guard) = UtilityGuard::acquire(in_flight) else {
        let frame = api::error_frame(err_id.as_deref(), &utility_overloaded());
        let _ = out.send(Message::text(frame)).await;
        return;
    };
    let out = out.clone();
    actix_rt::spawn(async move {
        let frame = reply(id, err_id).await;
        let _ = out.send(Message::text(frame)).await;
        drop(guard);
    });
}

/// Counts a connection's `tokenize`/`detokenize` requests until their reply is queued.
struct UtilityGuard(Rc<Cell<usize>>);

impl UtilityGuard {
    fn acquire(counter: &Rc<Cell<usize>>) -> Option<Self> {
        if counter.get() >= MAX_UTILITY_IN_FLIGHT {
            return None;
        }
        counter.set(counter.get() + 1);
        Some(Self(counter.clone()))
    }
}

impl Drop for UtilityGuard {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

fn utility_overloaded() -> InferError {
    InferError::new(
        ErrorKind::Overloaded,
        format!(
            "too many tokenize/detokenize/stats requests in flight on this connection \
             (limit {MAX_UTILITY_IN_FLIGHT}); wait for replies before sending more"
        ),
    )
}

/// Forwards one request's events as frames; on the final event the id becomes free
/// for reuse before the final frame is queued.
async fn forward_events(
    id: String,
    mut tracked: Tracked,
    mut events: mpsc::UnboundedReceiver<StreamEvent>,
    active: ActiveMap,
    out: mpsc::Sender<Message>,
) {
    let seq = tracked.seq();
    while let Some(ev) = events.recv().await {
        if active.borrow().get(&id).is_none_or(|a| a.seq != seq) {
            // The connection is gone (the session dropped its requests): like an HTTP
            // client that disconnects, the request counts as cancelled, nothing more.
            return;
        }
        let last = tracked.observe(&ev);
        if last {
            let mut map = active.borrow_mut();
            if map.get(&id).is_some_and(|a| a.seq == seq) {
                map.remove(&id);
            }
        }
        if out
            .send(Message::text(api::event_frame(&id, &ev)))
            .await
            .is_err()
            || last
        {
            return;
        }
    }
    // The engine dropped the channel without a final event: report it, never hang.
    let was_active = {
        let mut map = active.borrow_mut();
        let mine = map.get(&id).is_some_and(|a| a.seq == seq);
        if mine {
            map.remove(&id);
        }
        mine
    };
    if was_active {
        let e = InferError::internal("the request ended without a result");
        let _ = out
            .send(Message::text(api::error_frame(Some(&id), &e)))
            .await;
    }
}
