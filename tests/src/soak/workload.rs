//! The soak's traffic: each connection loops over a weighted mix of actions until the
//! deadline — WebSocket greedy and seeded-sampled chat, requests with a plugin,
//! cancels mid-stream, abrupt disconnects, malformed frames, `tokenize`, OpenAI HTTP/SSE
//! streams (some dropped mid-stream), and long prompts. Prompts share documents, so
//! requests hit the prefix cache: a few hot ones from memory, many cold ones that the
//! memory tier has evicted by the time they come back, from disk.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::Client;

/// Longest wait for a request's next frame (a `started` frame waits for admission
/// behind every other connection's request on a machine of two cores) before the action
/// counts as failed.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(180);

/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", OOPSLA 2014): a seeded, reproducible mix.
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}

const WORDS: &[&str] = &[
    "the", "river", "engine", "quiet", "morning", "signal", "garden", "copper", "winter", "market",
    "letter", "stone", "bridge", "memory", "orchard", "lantern", "harbor", "window", "silver",
    "forest", "clock", "paper", "thunder", "valley", "mirror", "candle", "road", "island",
    "whisper", "meadow", "anchor", "feather", "canyon", "ember", "glacier", "violin", "compass",
    "tower", "pebble", "ocean", "and", "of", "under", "beside", "through", "every",
];

/// A document of `words` pseudo-random words, the same for the same `seed`.
pub fn document(seed: u64, words: usize) -> String {
    let mut r = Rng::new(seed);
    let mut s = String::with_capacity(words * 7);
    for i in 0..words {
        if i > 0 {
            s.push(if i % 12 == 0 { '.' } else { ' ' });
            if i % 12 == 0 {
                s.push(' ');
            }
        }
        s.push_str(WORDS[(r.next_u64() % WORDS.len() as u64) as usize]);
    }
    s
}

/// Outcomes of the actions, counted across connections (written to the report).
#[derive(Debug, Default, Serialize)]
pub struct Outcomes {
    /// Generations that ended with `length` or `stop` (WebSocket).
    pub finished: AtomicU64,
    /// Generations cancelled mid-stream that ended with `cancelled`.
    pub cancelled: AtomicU64,
    /// Generations whose connection the client dropped mid-stream (WebSocket and HTTP).
    pub dropped: AtomicU64,
    /// Malformed frames answered with an `error` frame.
    pub bad_frames_answered: AtomicU64,
    /// `tokenize` calls answered with `tokens`.
    pub tokenized: AtomicU64,
    /// OpenAI streams that ended with `data: [DONE]`.
    pub http_streams: AtomicU64,
    /// Prompt tokens served from the prefix cache (`started.cached_tokens`), WebSocket.
    pub cached_tokens: AtomicU64,
    /// Anything else: an unexpected frame, error, status or a timeout.
    pub failures: AtomicU64,
}

/// What every connection shares.
pub struct Workload {
    /// `ws://HOST:PORT/v1/ws`.
    pub url: String,
    /// `HOST:PORT`.
    pub addr: String,
    /// The model id for OpenAI bodies.
    pub model_id: String,
    /// Hot documents (most requests; memory hits).
    pub hot: Vec<String>,
    /// Cold documents (revisited after the memory tier evicted them: disk hits).
    pub cold: Vec<String>,
    /// Long prompts (about 1,500 tokens).
    pub long: Vec<String>,
    /// Counters.
    pub outcomes: Outcomes,
    /// The first failures' descriptions (at most 20).
    pub failure_log: Mutex<Vec<String>>,
}

impl Workload {
    /// The documents for `seed`.
    pub fn new(url: String, addr: String, model_id: String, seed: u64) -> Self {
        Self {
            url,
            addr,
            model_id,
            hot: (0..4).map(|i| document(seed ^ (100 + i), 180)).collect(),
            cold: (0..48).map(|i| document(seed ^ (1000 + i), 200)).collect(),
            long: (0..6).map(|i| document(seed ^ (5000 + i), 1150)).collect(),
            outcomes: Outcomes::default(),
            failure_log: Mutex::new(Vec::new()),
        }
    }

    fn fail(&self, what: String) {
        self.outcomes.failures.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = self.failure_log.lock() {
            if l.len() < 20 {
                l.push(what);
            }
        }
    }

    fn messages(&self, r: &mut Rng) -> Value {
        let pick = r.range(0, 99);
        let doc = if pick < 55 {
            &self.hot[r.range(0, self.hot.len() as u64 - 1) as usize]
        } else if pick < 95 {
            &self.cold[r.range(0, self.cold.len() as u64 - 1) as usize]
        } else {
            &self.long[r.range(0, self.long.len() as u64 - 1) as usize]
        };
        let q = document(r.next_u64(), 6);
        json!([{"role":"system","content":doc},{"role":"user","content":q}])
    }
}

/// One connection's loop until `deadline`: actions drawn from `seed`.
pub async fn connection(w: &Workload, seed: u64, deadline: Instant) {
    let mut r = Rng::new(seed);
    let mut client: Option<Client> = None;
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let id = format!("s{seed}-{n}");
        let action = r.range(0, 99);
        if action >= 85 {
            if let Err(e) = http_stream(w, &mut r, action >= 95).await {
                w.fail(format!("http: {e:#}"));
            }
            continue;
        }
        let c = match client.take() {
            Some(c) => c,
            None => match Client::connect(&w.url).await {
                Ok(c) => c,
                Err(e) => {
                    w.fail(format!("connect: {e:#}"));
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        let kept = match action {
            0..=34 => ws_generate(w, c, &mut r, &id, Mode::Greedy).await,
            35..=54 => ws_generate(w, c, &mut r, &id, Mode::Sampled).await,
            55..=61 => ws_generate(w, c, &mut r, &id, Mode::Plugin).await,
            62..=69 => ws_generate(w, c, &mut r, &id, Mode::Cancel).await,
            70..=75 => ws_generate(w, c, &mut r, &id, Mode::Disconnect).await,
            76..=80 => bad_frame(w, c, &mut r).await,
            _ => tokenize(w, c, &mut r, &id).await,
        };
        match kept {
            Ok(c) => client = c,
            Err(e) => w.fail(format!("{id}: {e:#}")),
        }
    }
    if let Some(c) = client {
        let _ = c.close().await;
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Greedy,
    Sampled,
    Plugin,
    Cancel,
    Disconnect,
}

/// Runs one generate request; returns the connection unless it was dropped.
async fn ws_generate(
    w: &Workload,
    mut c: Client,
    r: &mut Rng,
    id: &str,
    mode: Mode,
) -> Result<Option<Client>> {
    let mut req = json!({"type":"generate","id":id,"messages":w.messages(r),
        "max_tokens": r.range(8, 96), "temperature": 0});
    if mode != Mode::Greedy {
        req["temperature"] = json!(0.8);
        req["top_p"] = json!(0.95);
        req["seed"] = json!(r.next_u64() >> 11);
    }
    if mode == Mode::Plugin {
        req["plugins"] = json!([{"name":"ban_words","config":{"words":["the","river"]}}]);
    }
    c.send(&req).await?;
    let stop_after = r.range(1, 6);
    let mut deltas = 0;
    loop {
        let f = c.recv_within(FRAME_TIMEOUT).await?;
        match f["type"].as_str() {
            Some("started") => {
                let cached = f["cached_tokens"].as_u64().unwrap_or(0);
                w.outcomes
                    .cached_tokens
                    .fetch_add(cached, Ordering::Relaxed);
            }
            Some("delta") => {
                deltas += 1;
                if deltas == stop_after {
                    if mode == Mode::Cancel {
                        c.send(&json!({"type":"cancel","id":id})).await?;
                    } else if mode == Mode::Disconnect {
                        w.outcomes.dropped.fetch_add(1, Ordering::Relaxed);
                        return Ok(None);
                    }
                }
            }
            Some("done") => {
                let reason = f["finish_reason"].as_str().unwrap_or_default();
                let ok = match reason {
                    "length" | "stop" => {
                        w.outcomes.finished.fetch_add(1, Ordering::Relaxed);
                        true
                    }
                    "cancelled" if mode == Mode::Cancel => {
                        w.outcomes.cancelled.fetch_add(1, Ordering::Relaxed);
                        true
                    }
                    _ => false,
                };
                if !ok {
                    bail!("unexpected finish: {f}");
                }
                return Ok(Some(c));
            }
            _ => bail!("unexpected frame: {f}"),
        }
    }
}

/// Sends one malformed frame and expects an `error` frame on the same connection.
async fn bad_frame(w: &Workload, mut c: Client, r: &mut Rng) -> Result<Option<Client>> {
    match r.range(0, 3) {
        0 => c.send_text("{\"type\":\"generate\",\"id\":").await?,
        1 => c.send_binary(vec![0xff, 0x00, 0xfe, 0x7b]).await?,
        2 => {
            c.send(
                &json!({"type":"generate","id":"bad","messages":[{"role":"user","content":"hi"}],
                "max_tokens":8,"top_p":1.5}),
            )
            .await?
        }
        _ => {
            c.send(&json!({"type":"no_such_message","id":"bad"}))
                .await?
        }
    }
    let f = c.recv().await?;
    if f["type"] != "error" {
        bail!("a malformed frame got {f}, not an error");
    }
    w.outcomes
        .bad_frames_answered
        .fetch_add(1, Ordering::Relaxed);
    Ok(Some(c))
}

async fn tokenize(w: &Workload, mut c: Client, r: &mut Rng, id: &str) -> Result<Option<Client>> {
    let text = document(r.next_u64(), 40);
    c.send(&json!({"type":"tokenize","id":id,"text":text}))
        .await?;
    let f = c.recv().await?;
    if f["type"] != "tokens" || f["id"] != id {
        bail!("tokenize got {f}");
    }
    w.outcomes.tokenized.fetch_add(1, Ordering::Relaxed);
    Ok(Some(c))
}

/// `POST /v1/chat/completions` with `stream: true` on a fresh connection, read to
/// `data: [DONE]`, or dropped after the first events when `drop_early`.
async fn http_stream(w: &Workload, r: &mut Rng, drop_early: bool) -> Result<()> {
    let mut body = json!({"model": w.model_id, "messages": w.messages(r),
        "max_tokens": r.range(8, 64), "stream": true});
    if r.range(0, 1) == 1 {
        body["temperature"] = json!(0.7);
        body["seed"] = json!(r.next_u64() >> 11);
    } else {
        body["temperature"] = json!(0);
    }
    let body = body.to_string();
    let mut s = TcpStream::connect(&w.addr).await.context("connect")?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        w.addr,
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(FRAME_TIMEOUT, s.read(&mut buf))
            .await
            .map_err(|_| anyhow!("timed out reading the stream"))??;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if drop_early && got.windows(6).filter(|x| x == b"data: ").count() >= 2 {
            w.outcomes.dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
    }
    let text = String::from_utf8_lossy(&got);
    if !text.starts_with("HTTP/1.1 200") || !text.contains("data: [DONE]") {
        bail!(
            "stream did not end with [DONE]: {}",
            text.chars().take(300).collect::<String>()
        );
    }
    w.outcomes.http_streams.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_reproducible_and_differ_by_seed() {
        assert_eq!(document(7, 50), document(7, 50));
        assert_ne!(document(7, 50), document(8, 50));
        assert_eq!(
            document(7, 50)
                .split([' ', '.'])
                .filter(|w| !w.is_empty())
                .count(),
            50
        );
    }

    #[test]
    fn splitmix64_reference_values() {
        // First outputs of SplitMix64 seeded with 0 (as in the reference implementation).
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }
}
