//! The publishing side: a replay buffer the engine pushes encoded batches into, and
//! one thread owning the ZeroMQ sockets.
//!
//! The engine (scheduler loop, prefix store writer) calls [`KvEventSink::publish`]:
//! under one short lock the batch gets the next sequence number, is encoded and
//! appended to the buffer (the oldest message leaves when it holds
//! `kv_events.buffer_steps`), and the thread is woken. Nothing on that path waits
//! for a socket, so a subscriber that lags, disconnects or never reads cannot slow a
//! step. The thread sends each new message on the PUB socket as
//! `[topic, seq (8 bytes big-endian), payload]` (vLLM's `ZmqEventPublisher`);
//! ZeroMQ drops what a slow subscriber's queue cannot take, and that subscriber sees
//! a gap in the sequence numbers which the replay socket fills from the buffer.
//!
//! Replay (ROUTER): a request `[identity, "", start (8 bytes big-endian)]` (a REQ
//! socket adds the empty frame; a DEALER may omit it) is answered with
//! `[identity, "", seq, payload]` for every buffered message from `start` on, then the
//! end marker `[identity, "", -1 (8 bytes), ""]`, as vLLM does. A start older than the
//! buffer's first message, or beyond the next one to be published, is out of range:
//! the only reply is `[identity, "", -1, "error: …"]`, naming the messages held and the
//! next one. A request of another shape (not one 8-byte frame after the optional empty
//! one) is answered the same way.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::Notify;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::wire::{encode, EventBatch};
use super::KvEvent;
use crate::config::KvEventsConfig;

/// The replay reply's end marker: −1 as 8 big-endian bytes.
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Where the sockets were bound (with the port a `:0` endpoint was given).
#[derive(Debug, Clone)]
pub struct Bound {
    /// The PUB socket.
    pub endpoint: String,
    /// The ROUTER socket, when configured.
    pub replay_endpoint: Option<String>,
}

#[derive(Debug, Default)]
struct Buffer {
    /// `(seq, payload)`, oldest first.
    messages: VecDeque<(u64, Bytes)>,
    /// The sequence number the next batch gets.
    next_seq: u64,
    /// The first sequence number the thread has not sent yet.
    next_to_send: u64,
}

#[derive(Debug)]
struct Shared {
    buffer: Mutex<Buffer>,
    capacity: usize,
    wake: Notify,
    rank: i32,
    encoding: crate::config::EventEncoding,
    /// Messages that left the buffer before the thread sent them.
    dropped: AtomicU64,
    /// Messages sent on the PUB socket.
    sent: AtomicU64,
}

/// The engine's handle to the publisher: cheap to clone, never blocks on I/O.
#[derive(Debug, Clone)]
pub struct KvEventSink {
    shared: Arc<Shared>,
}

impl KvEventSink {
    /// Publishes one batch (nothing when `events` is empty).
    pub fn publish(&self, events: &[KvEvent]) {
        if events.is_empty() {
            return;
        }
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let payload = Bytes::from(encode(&EventBatch {
            ts,
            events,
            data_parallel_rank: self.shared.rank,
            encoding: self.shared.encoding,
        }));
        {
            let mut b = match self.shared.buffer.lock() {
                Ok(b) => b,
                Err(poisoned) => poisoned.into_inner(),
            };
            let seq = b.next_seq;
            b.next_seq += 1;
            b.messages.push_back((seq, payload));
            while b.messages.len() > self.shared.capacity {
                if let Some((old, _)) = b.messages.pop_front() {
                    if old >= b.next_to_send {
                        self.shared.dropped.fetch_add(1, Ordering::Relaxed);
                        b.next_to_send = old + 1;
                    }
                }
            }
        }
        self.shared.wake.notify_one();
    }

    /// Messages dropped before the publishing thread could send them.
    pub fn dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::Relaxed)
    }

    /// Messages sent on the PUB socket.
    pub fn sent(&self) -> u64 {
        self.shared.sent.load(Ordering::Relaxed)
    }

    /// Binds the sockets on a thread of their own and publishes `AllBlocksCleared` as
    /// message 0 (nothing this replica said before a restart holds).
    ///
    /// # Errors
    /// A socket cannot be bound (the message names the key and the endpoint).
    pub fn start(config: &KvEventsConfig) -> anyhow::Result<(Self, Bound)> {
        let shared = Arc::new(Shared {
            buffer: Mutex::new(Buffer::default()),
            capacity: config.buffer_steps.max(1),
            wake: Notify::new(),
            rank: i32::try_from(config.data_parallel_rank).unwrap_or(i32::MAX),
            encoding: config.event_encoding,
            dropped: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        });
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        let (thread_shared, cfg) = (shared.clone(), config.clone());
        std::thread::Builder::new()
            .name("inferd-kv-events".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = bound_tx.send(Err(anyhow::anyhow!("kv_events: runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(serve(thread_shared, cfg, bound_tx));
            })?;
        let bound = bound_rx
            .recv()
            .map_err(|_| anyhow::anyhow!("kv_events: the publishing thread died"))??;
        let sink = Self { shared };
        sink.publish(&[KvEvent::AllBlocksCleared]);
        Ok((sink, bound))
    }
}

async fn bind<S: Socket>(socket: &mut S, key: &str, endpoint: &str) -> anyhow::Result<String> {
    let at = KvEventsConfig::bind_address(endpoint);
    match socket.bind(&at).await {
        Ok(e) => Ok(e.to_string()),
        Err(e) => Err(anyhow::anyhow!("{key} = {endpoint:?}: cannot bind: {e}")),
    }
}

/// The thread's loop: send what is new, answer replay requests.
async fn serve(
    shared: Arc<Shared>,
    config: KvEventsConfig,
    bound_tx: std::sync::mpsc::Sender<anyhow::Result<Bound>>,
) {
    let mut publisher = PubSocket::new();
    let endpoint = match bind(&mut publisher, "kv_events.endpoint", &config.endpoint).await {
        Ok(e) => e,
        Err(e) => {
            let _ = bound_tx.send(Err(e));
            return;
        }
    };
    let mut replay = None;
    if !config.replay_endpoint.is_empty() {
        let mut router = RouterSocket::new();
        match bind(
            &mut router,
            "kv_events.replay_endpoint",
            &config.replay_endpoint,
        )
        .await
        {
            Ok(e) => replay = Some((router, e)),
            Err(e) => {
                let _ = bound_tx.send(Err(e));
                return;
            }
        }
    }
    let replay_endpoint = replay.as_ref().map(|(_, e)| e.clone());
    let _ = bound_tx.send(Ok(Bound {
        endpoint,
        replay_endpoint,
    }));
    let topic = Bytes::from(config.topic.clone().into_bytes());
    let (mut replay_tx, mut replay_rx) = match replay {
        Some((router, _)) => {
            let (tx, rx) = router.split();
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    loop {
        let request = async {
            match replay_rx.as_mut() {
                Some(rx) => rx.recv().await.ok(),
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shared.wake.notified() => {
                for (seq, payload) in take_unsent(&shared) {
                    let frames = vec![topic.clone(), Bytes::copy_from_slice(&seq.to_be_bytes()), payload];
                    if let Ok(m) = ZmqMessage::try_from(frames) {
                        if publisher.send(m).await.is_ok() {
                            shared.sent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            Some(req) = request => {
                if let Some(tx) = replay_tx.as_mut() {
                    for reply in answer_replay(&shared, req.into_vec()) {
                        if let Ok(m) = ZmqMessage::try_from(reply) {
                            if tx.send(m).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The buffered messages not sent yet, marked sent.
fn take_unsent(shared: &Shared) -> Vec<(u64, Bytes)> {
    let mut b = match shared.buffer.lock() {
        Ok(b) => b,
        Err(poisoned) => poisoned.into_inner(),
    };
    let from = b.next_to_send;
    let out: Vec<(u64, Bytes)> = b
        .messages
        .iter()
        .filter(|(s, _)| *s >= from)
        .cloned()
        .collect();
    b.next_to_send = b.next_seq;
    out
}

/// The reply frames to one replay request (`frames` as the ROUTER received them,
/// the peer's identity first).
fn answer_replay(shared: &Shared, frames: Vec<Bytes>) -> Vec<Vec<Bytes>> {
    let Some(identity) = frames.first().cloned() else {
        return Vec::new();
    };
    let head = |seq: &[u8]| vec![identity.clone(), Bytes::new(), Bytes::copy_from_slice(seq)];
    let error = |text: String| {
        let mut f = head(&END_SEQ);
        f.push(Bytes::from(format!("error: {text}").into_bytes()));
        vec![f]
    };
    let start = match frames.as_slice() {
        [_, empty, s] if empty.is_empty() && s.len() == 8 => s,
        [_, s] if s.len() == 8 => s,
        _ => {
            return error(format!(
                "a replay request is the start sequence number as one 8-byte big-endian \
                 frame (got {} frames after the identity)",
                frames.len() - 1
            ))
        }
    };
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(start);
    let start = u64::from_be_bytes(bytes);
    let b = match shared.buffer.lock() {
        Ok(b) => b,
        Err(poisoned) => poisoned.into_inner(),
    };
    let first = b.messages.front().map_or(b.next_seq, |(s, _)| *s);
    if start < first || start > b.next_seq {
        let held = if first == b.next_seq {
            "nothing".to_string()
        } else {
            format!("{first} to {}", b.next_seq - 1)
        };
        return error(format!(
            "start sequence number {start} is out of range: the buffer holds {held}, the \
             next message is {} (kv_events.buffer_steps = {})",
            b.next_seq, shared.capacity
        ));
    }
    let mut out: Vec<Vec<Bytes>> = b
        .messages
        .iter()
        .filter(|(s, _)| *s >= start)
        .map(|(s, p)| {
            let mut f = head(&s.to_be_bytes());
            f.push(p.clone());
            f
        })
        .collect();
    let mut end = head(&END_SEQ);
    end.push(Bytes::new());
    out.push(end);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(capacity: usize) -> KvEventSink {
        KvEventSink {
            shared: Arc::new(Shared {
                buffer: Mutex::new(Buffer::default()),
                capacity,
                wake: Notify::new(),
                rank: 0,
                encoding: crate::config::EventEncoding::Array,
                dropped: AtomicU64::new(0),
                sent: AtomicU64::new(0),
            }),
        }
    }

    fn seqs(replies: &[Vec<Bytes>]) -> Vec<i64> {
        replies
            .iter()
            .map(|f| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&f[2]);
                i64::from_be_bytes(b)
            })
            .collect()
    }

    #[test]
    fn the_buffer_drops_the_oldest_and_counts_unsent_losses() {
        let sink = shared(3);
        for _ in 0..5 {
            sink.publish(&[KvEvent::AllBlocksCleared]);
        }
        assert_eq!(sink.dropped(), 2, "0 and 1 left before any send");
        let sent: Vec<u64> = take_unsent(&sink.shared)
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        assert_eq!(sent, vec![2, 3, 4]);
        sink.publish(&[KvEvent::AllBlocksCleared]);
        assert_eq!(sink.dropped(), 2, "2 was sent before it left");
        sink.publish(&[]);
        assert_eq!(
            take_unsent(&sink.shared).len(),
            1,
            "an empty batch is not a message"
        );
    }

    #[test]
    fn replay_sends_from_start_then_the_end_marker_and_refuses_out_of_range() {
        let sink = shared(3);
        for _ in 0..5 {
            sink.publish(&[KvEvent::AllBlocksCleared]);
        }
        let id = Bytes::from_static(b"peer");
        let req = |s: u64| {
            vec![
                id.clone(),
                Bytes::new(),
                Bytes::copy_from_slice(&s.to_be_bytes()),
            ]
        };
        let r = answer_replay(&sink.shared, req(3));
        assert_eq!(seqs(&r), vec![3, 4, -1]);
        assert!(r.iter().all(|f| f[0] == id && f[1].is_empty()));
        assert!(r[2][3].is_empty(), "the end marker's payload is empty");
        // DEALER-style, no empty frame; start = next sequence number: only the end.
        let r = answer_replay(
            &sink.shared,
            vec![id.clone(), Bytes::copy_from_slice(&5u64.to_be_bytes())],
        );
        assert_eq!(seqs(&r), vec![-1]);
        for s in [1, 6] {
            let r = answer_replay(&sink.shared, req(s));
            assert_eq!(seqs(&r), vec![-1]);
            let text = String::from_utf8_lossy(&r[0][3]).into_owned();
            assert_eq!(
                text,
                format!(
                    "error: start sequence number {s} is out of range: the buffer holds 2 to \
                     4, the next message is 5 (kv_events.buffer_steps = 3)"
                )
            );
        }
        let r = answer_replay(
            &sink.shared,
            vec![id.clone(), Bytes::new(), Bytes::from_static(b"x")],
        );
        assert!(String::from_utf8_lossy(&r[0][3]).starts_with("error: a replay request is"));
    }
}
