//! The serving measurements, the same code for both engines: single-stream prefill,
//! single-stream decode, and N concurrent streams. Only the transport differs: inferd
//! gets the prompt text over its WebSocket (`generate`), llama-server the same prompt's
//! token ids over its streaming `POST /completion` (see [`crate::completion`]); both
//! return a [`Trace`] of token arrivals timed on this client's clock from the moment the
//! request was written.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use serde::Serialize;
use serde_json::json;
use tokio::net::TcpStream;
use tokio::sync::Barrier;

use crate::client::{Conn, Trace};
use crate::figures::{level_from, Decode, Level, Prefill, StreamTiming};
use crate::{completion, http_client};

/// An engine to measure.
#[derive(Debug, Clone)]
pub enum Target {
    /// inferd's WebSocket URL, and the LoRA adapter its requests name (`"adapter"`;
    /// `None`: the base model).
    Inferd {
        url: String,
        adapter: Option<String>,
    },
    /// llama-server's `host:port`.
    LlamaServer { addr: String },
}

/// One prompt: the text inferd is sent, and its token ids (inferd's tokenization, BOS
/// included when inferd adds one) that llama-server is sent.
#[derive(Debug, Clone, Serialize)]
pub struct Prompt {
    pub text: String,
    pub ids: Vec<u32>,
}

/// An open connection to an engine: a WebSocket for inferd (reused by the requests
/// sent on it), a TCP connection made in advance for llama-server (used by the first
/// request; later ones connect anew, before their send time).
enum Session {
    /// The connection and the adapter its requests name.
    Ws(Box<Conn>, Option<String>),
    Http {
        addr: String,
        sock: Option<TcpStream>,
    },
}

impl Session {
    async fn open(target: &Target) -> Result<Self> {
        Ok(match target {
            Target::Inferd { url, adapter } => {
                Session::Ws(Box::new(Conn::connect(url).await?), adapter.clone())
            }
            Target::LlamaServer { addr } => Session::Http {
                addr: addr.clone(),
                sock: Some(http_client::connect(addr).await?),
            },
        })
    }

    /// One greedy completion of `prompt`.
    async fn generate(
        &mut self,
        id: &str,
        prompt: &Prompt,
        max_tokens: u64,
        timeout: Duration,
    ) -> Result<Trace> {
        match self {
            Session::Ws(conn, None) => conn.generate(id, &prompt.text, max_tokens, timeout).await,
            Session::Ws(conn, Some(adapter)) => {
                let frame = json!({
                    "type": "generate", "id": id, "prompt": prompt.text,
                    "max_tokens": max_tokens, "temperature": 0, "adapter": adapter,
                });
                conn.generate_frame(id, &frame, timeout).await
            }
            Session::Http { addr, sock } => {
                completion::generate(addr, sock.take(), &prompt.ids, max_tokens, timeout).await
            }
        }
    }
}

/// Sends one short request and waits for its end (not measured).
pub async fn warm_up(target: &Target, prompt: &Prompt, timeout: Duration) -> Result<Trace> {
    Session::open(target)
        .await?
        .generate("warmup", prompt, 8, timeout)
        .await
}

/// Single-stream prefill: each prompt once with `max_tokens` 1, one after the other on
/// one session. Returns the figures and the traces.
pub async fn prefill(
    target: &Target,
    prompts: &[Prompt],
    timeout: Duration,
) -> Result<(Prefill, Vec<Trace>)> {
    let mut session = Session::open(target).await?;
    let mut ttft_ms = Vec::new();
    let mut best: f64 = 0.0;
    let mut prompt_tokens = 0;
    let mut traces = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let trace = session
            .generate(&format!("prefill-{i}"), prompt, 1, timeout)
            .await?;
        let ttft = trace
            .timing
            .ttft_s()
            .ok_or_else(|| anyhow!("prefill request {i} produced no token"))?;
        let computed = trace.prompt_tokens.saturating_sub(trace.cached_tokens);
        if i == 0 {
            prompt_tokens = trace.prompt_tokens;
        }
        ttft_ms.push(ttft * 1e3);
        best = best.max(computed as f64 / ttft);
        traces.push(trace);
    }
    let figures = Prefill {
        prompt_tokens,
        ttft_ms,
        tok_per_s: best,
    };
    Ok((figures, traces))
}

/// Single-stream decode of up to `max_tokens` tokens, `reps` times on fresh sessions;
/// the fastest run counts. Returns its figures and trace, and every run's tok/s.
pub async fn decode(
    target: &Target,
    prompt: &Prompt,
    max_tokens: u64,
    reps: usize,
    timeout: Duration,
) -> Result<(Decode, Trace, Vec<f64>)> {
    let mut best: Option<(Decode, Trace)> = None;
    let mut all = Vec::new();
    for _ in 0..reps.max(1) {
        let mut session = Session::open(target).await?;
        let trace = session
            .generate("decode", prompt, max_tokens, timeout)
            .await?;
        let (tokens_after_first, span_s) = trace.timing.decode_span();
        let d = Decode {
            prompt_tokens: trace.prompt_tokens,
            tokens: trace.timing.tokens(),
            span_s,
            tok_per_s: if span_s > 0.0 {
                tokens_after_first as f64 / span_s
            } else {
                0.0
            },
            ttft_ms: trace.timing.ttft_s().unwrap_or(0.0) * 1e3,
        };
        all.push(d.tok_per_s);
        if best.as_ref().is_none_or(|(b, _)| d.tok_per_s > b.tok_per_s) {
            best = Some((d, trace));
        }
    }
    let (d, t) = best.expect("at least one decode run");
    Ok((d, t, all))
}

/// `prompts.len()` streams at once, one session and one request each. The sessions are
/// opened first; the requests are sent together behind a barrier. Returns the figures
/// and the traces.
pub async fn level(
    target: &Target,
    prompts: &[Prompt],
    max_tokens: u64,
    timeout: Duration,
) -> Result<(Level, Vec<Trace>)> {
    let targets = vec![target.clone(); prompts.len()];
    level_on(&targets, prompts, max_tokens, timeout).await
}

/// [`level`] with stream `i` sent to `targets[i]` (e.g. the same daemon with a different
/// adapter per stream); `targets` and `prompts` have the same length.
pub async fn level_on(
    targets: &[Target],
    prompts: &[Prompt],
    max_tokens: u64,
    timeout: Duration,
) -> Result<(Level, Vec<Trace>)> {
    let n = prompts.len();
    if targets.len() != n {
        return Err(anyhow!("{} targets for {n} streams", targets.len()));
    }
    let mut sessions = Vec::with_capacity(n);
    for target in targets {
        sessions.push(Session::open(target).await?);
    }
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for (i, (mut session, prompt)) in sessions
        .into_iter()
        .zip(prompts.iter().cloned())
        .enumerate()
    {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            session
                .generate(&format!("c{n}-{i}"), &prompt, max_tokens, timeout)
                .await
        }));
    }
    let mut traces = Vec::with_capacity(n);
    for task in tasks {
        traces.push(task.await.context("stream task panicked")??);
    }
    let first = traces
        .iter()
        .map(|t| t.sent)
        .min()
        .ok_or_else(|| anyhow!("no streams"))?;
    let streams: Vec<(f64, StreamTiming)> = traces
        .iter()
        .map(|t| (t.sent.duration_since(first).as_secs_f64(), t.timing.clone()))
        .collect();
    Ok((level_from(n, max_tokens, &streams), traces))
}
