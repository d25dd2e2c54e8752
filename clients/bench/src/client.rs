//! inferd's WebSocket protocol (`docs/protocol.md`): requests and their traces.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::figures::StreamTiming;

/// One WebSocket connection to the daemon.
pub struct Conn {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

/// What one `generate` request produced.
#[derive(Debug, Clone)]
pub struct Trace {
    /// When the `generate` frame was sent.
    pub sent: Instant,
    /// Token arrivals and end, relative to `sent`.
    pub timing: StreamTiming,
    /// `prompt_tokens` of the `started` frame.
    pub prompt_tokens: u64,
    /// `cached_tokens` of the `started` frame.
    pub cached_tokens: u64,
    /// `finish_reason` of the `done` frame.
    pub finish_reason: String,
    /// `usage.cached_tokens` of the `done` frame.
    pub usage_cached_tokens: Option<u64>,
    /// The whole `usage` object of the `done` frame (null for llama-server).
    pub usage: Value,
    /// The deltas' text, concatenated.
    pub text: String,
    /// The generated token ids as streamed (inferd's `delta.token_ids`, llama-server's
    /// per-event `tokens`), concatenated.
    pub token_ids: Vec<u32>,
    /// The engine's own timings of the request where it reports them (llama-server's
    /// `timings`), else null.
    pub engine_timings: Value,
}

impl Conn {
    /// Connects to `url`.
    pub async fn connect(url: &str) -> Result<Self> {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .with_context(|| format!("cannot connect to {url}"))?;
        Ok(Conn { ws })
    }

    async fn send(&mut self, frame: &Value) -> Result<()> {
        self.ws
            .send(Message::text(frame.to_string()))
            .await
            .context("cannot send to the daemon")
    }

    /// The next text frame as JSON, with the time it was received.
    async fn next_frame(&mut self, timeout: Duration) -> Result<(Instant, Value)> {
        loop {
            let message = tokio::time::timeout(timeout, self.ws.next())
                .await
                .map_err(|_| anyhow!("no frame from the daemon within {} s", timeout.as_secs()))?
                .ok_or_else(|| anyhow!("the daemon closed the connection"))?
                .context("WebSocket error")?;
            let at = Instant::now();
            match message {
                Message::Text(text) => {
                    let value = serde_json::from_str(text.as_str())
                        .with_context(|| format!("daemon sent invalid JSON: {text}"))?;
                    return Ok((at, value));
                }
                Message::Close(frame) => bail!("the daemon closed the connection: {frame:?}"),
                _ => continue,
            }
        }
    }

    /// Waits for the frame about `id`, failing on an `error` frame for it (or with a
    /// null id).
    async fn reply_for(&mut self, id: &str, timeout: Duration) -> Result<(Instant, Value)> {
        loop {
            let (at, frame) = self.next_frame(timeout).await?;
            let frame_id = frame.get("id");
            let ours = frame_id.and_then(Value::as_str) == Some(id);
            let kind = frame.get("type").and_then(Value::as_str).unwrap_or("");
            if kind == "error" && (ours || frame_id.is_none_or(Value::is_null)) {
                bail!("daemon error for {id}: {}", frame["error"]);
            }
            if ours {
                return Ok((at, frame));
            }
        }
    }

    /// Token ids of `text` (no BOS, special-token text as plain text).
    pub async fn tokenize(&mut self, text: &str) -> Result<Vec<u32>> {
        self.tokenize_with(text, false).await
    }

    /// Token ids of `text` (no BOS); with `special`, special-token text such as
    /// `<|im_start|>` maps to its control id.
    pub async fn tokenize_with(&mut self, text: &str, special: bool) -> Result<Vec<u32>> {
        self.send(&json!({"type": "tokenize", "id": "tok", "text": text, "special": special}))
            .await?;
        let (_, frame) = self.reply_for("tok", Duration::from_secs(60)).await?;
        ids_of(&frame)
    }

    /// Text of `ids`.
    pub async fn detokenize(&mut self, ids: &[u32]) -> Result<String> {
        self.send(&json!({"type": "detokenize", "id": "detok", "token_ids": ids}))
            .await?;
        let (_, frame) = self.reply_for("detok", Duration::from_secs(60)).await?;
        frame
            .get("text")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("text frame without text: {frame}"))
    }

    /// The daemon's `stats` reply, or `None` when it does not answer with one (older
    /// daemons reject the message).
    pub async fn stats(&mut self) -> Option<Value> {
        for frame in [
            json!({"type": "stats"}),
            json!({"type": "stats", "id": "stats"}),
        ] {
            if self.send(&frame).await.is_err() {
                return None;
            }
            match self.next_frame(Duration::from_secs(5)).await {
                Ok((_, reply)) if reply.get("type").and_then(Value::as_str) == Some("stats") => {
                    return Some(reply)
                }
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
        None
    }

    /// Sends one greedy raw-prompt `generate` and records every token arrival until its
    /// `done` frame.
    pub async fn generate(
        &mut self,
        id: &str,
        prompt: &str,
        max_tokens: u64,
        timeout: Duration,
    ) -> Result<Trace> {
        let frame = json!({
            "type": "generate", "id": id, "prompt": prompt,
            "max_tokens": max_tokens, "temperature": 0,
        });
        self.generate_frame(id, &frame, timeout).await
    }

    /// Sends `frame` (a `generate` message whose id is `id`) and records every token
    /// arrival until its `done` frame.
    pub async fn generate_frame(
        &mut self,
        id: &str,
        frame: &Value,
        timeout: Duration,
    ) -> Result<Trace> {
        let sent = Instant::now();
        self.send(frame).await?;
        let mut trace = Trace {
            sent,
            timing: StreamTiming::default(),
            prompt_tokens: 0,
            cached_tokens: 0,
            finish_reason: String::new(),
            usage_cached_tokens: None,
            usage: Value::Null,
            text: String::new(),
            token_ids: Vec::new(),
            engine_timings: Value::Null,
        };
        loop {
            let (at, frame) = self.reply_for(id, timeout).await?;
            let t = at.duration_since(sent).as_secs_f64();
            match frame.get("type").and_then(Value::as_str).unwrap_or("") {
                "started" => {
                    trace.prompt_tokens = frame["prompt_tokens"].as_u64().unwrap_or(0);
                    trace.cached_tokens = frame["cached_tokens"].as_u64().unwrap_or(0);
                }
                "delta" => {
                    trace
                        .text
                        .push_str(frame["text"].as_str().unwrap_or_default());
                    let ids = frame["token_ids"].as_array().map_or(&[][..], Vec::as_slice);
                    trace.token_ids.extend(
                        ids.iter()
                            .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok())),
                    );
                    if !ids.is_empty() {
                        trace.timing.arrivals.push((t, ids.len()));
                    }
                }
                "done" => {
                    trace.timing.end_s = t;
                    trace.finish_reason = frame["finish_reason"]
                        .as_str()
                        .unwrap_or("unknown")
                        .to_owned();
                    trace.usage_cached_tokens = frame["usage"]["cached_tokens"].as_u64();
                    trace.usage = frame["usage"].clone();
                    return Ok(trace);
                }
                other => bail!("unexpected frame type {other:?} for {id}: {frame}"),
            }
        }
    }
}

fn ids_of(frame: &Value) -> Result<Vec<u32>> {
    frame
        .get("token_ids")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("tokens frame without token_ids: {frame}"))?
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| anyhow!("bad token id {v}"))
        })
        .collect()
}

/// Builds a prompt of `target` tokens (without BOS) from [`crate::prompts::long_text`]
/// `variant`, checked with the daemon's own tokenizer. Returns the text and its count.
pub async fn prompt_of_tokens(
    conn: &mut Conn,
    variant: usize,
    target: usize,
) -> Result<(String, usize)> {
    text_of_tokens(conn, target, |sentences| {
        crate::prompts::long_text(variant, sentences)
    })
    .await
}

/// Builds a text of `target` tokens (without BOS) from `build(sentences)`, a text that
/// grows with `sentences`, cut to length with the daemon's own tokenizer. Returns the
/// text and its count (the nearest one found when no cut gives exactly `target`).
pub async fn text_of_tokens(
    conn: &mut Conn,
    target: usize,
    build: impl Fn(usize) -> String,
) -> Result<(String, usize)> {
    // About 20 tokens per sentence; grow until long enough.
    let mut sentences = target / 16 + 4;
    let (text, ids) = loop {
        let text = build(sentences);
        let ids = conn.tokenize(&text).await?;
        if ids.len() >= target {
            break (text, ids);
        }
        sentences = sentences * 3 / 2 + 1;
    };
    if ids.len() == target {
        return Ok((text, target));
    }
    // Cut at `target` ids; a cut inside a word may re-tokenize differently, so trim a few
    // more ids until the round trip gives exactly the cut length or give the nearest.
    let mut best = (text.clone(), ids.len());
    for cut in (target.saturating_sub(8)..=target).rev() {
        let candidate = conn.detokenize(&ids[..cut]).await?;
        let count = conn.tokenize(&candidate).await?.len();
        if count == target {
            return Ok((candidate, count));
        }
        if count.abs_diff(target) < best.1.abs_diff(target) {
            best = (candidate, count);
        }
    }
    Ok(best)
}
