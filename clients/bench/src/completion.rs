//! Requests to llama-server's native streaming `POST /completion`, recorded as the same
//! [`Trace`] an inferd `generate` gives, so one set of measurements serves both engines.
//!
//! The prompt is sent as token ids (inferd's tokenization of the same text, BOS as
//! inferd adds it), greedy (`temperature` 0), `n_predict` = max_tokens, no prompt cache.
//! llama-server sends one event per sampled token whose text is ready (a token ending
//! inside a UTF-8 character or a possible stop string is held back and sent with a later
//! one); each event carries `tokens_predicted`, the tokens sampled so far, so an arrival
//! counts the tokens sampled since the previous event, like inferd's `delta.token_ids`.
//! The events' `tokens` (the id of the token each event is for) are kept as
//! [`Trace::token_ids`]; a token held back inside a UTF-8 character is missing from them.
//! The final event (`stop: true`) has the prompt length, the stop reason and the
//! server's own timings.

use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};
use tokio::net::TcpStream;

use crate::client::Trace;
use crate::figures::StreamTiming;
use crate::http_client::{self, EventStream};

/// The request body for `ids` and `max_tokens`.
pub fn request_body(ids: &[u32], max_tokens: u64) -> Value {
    json!({
        "prompt": ids,
        "n_predict": max_tokens,
        "stream": true,
        "temperature": 0.0,
        "cache_prompt": false,
    })
}

/// One greedy completion of `ids` on the llama-server at `addr`, over `sock` when given
/// (a connection opened in advance), else a new connection.
pub async fn generate(
    addr: &str,
    sock: Option<TcpStream>,
    ids: &[u32],
    max_tokens: u64,
    timeout: Duration,
) -> Result<Trace> {
    let sock = match sock {
        Some(s) => s,
        None => http_client::connect(addr).await?,
    };
    let body = request_body(ids, max_tokens).to_string();
    let mut stream = EventStream::post(sock, addr, "/completion", &body, timeout).await?;
    let mut trace = Trace {
        sent: stream.sent,
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
    let mut sampled = 0u64;
    while let Some((at, data)) = stream.next_event().await? {
        let event: Value = serde_json::from_str(&data)
            .map_err(|e| anyhow!("llama-server sent invalid JSON ({e}): {data}"))?;
        if let Some(error) = event.get("error") {
            bail!("llama-server error: {error}");
        }
        trace
            .text
            .push_str(event["content"].as_str().unwrap_or_default());
        if let Some(ids) = event["tokens"].as_array() {
            trace.token_ids.extend(
                ids.iter()
                    .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok())),
            );
        }
        if let Some(n) = event["tokens_predicted"].as_u64() {
            if n > sampled {
                trace.timing.arrivals.push((at, (n - sampled) as usize));
                sampled = n;
            }
        }
        if event["stop"].as_bool() == Some(true) {
            trace.timing.end_s = at;
            trace.prompt_tokens = event["tokens_evaluated"].as_u64().unwrap_or(0);
            trace.cached_tokens = event["timings"]["cache_n"].as_u64().unwrap_or(0);
            trace.usage_cached_tokens = Some(trace.cached_tokens);
            trace.finish_reason = finish_reason(event["stop_type"].as_str().unwrap_or(""));
            trace.engine_timings = event["timings"].clone();
            return Ok(trace);
        }
    }
    bail!("llama-server ended the stream without a final event")
}

/// llama-server's `stop_type` in inferd's `finish_reason` words.
fn finish_reason(stop_type: &str) -> String {
    match stop_type {
        "limit" => "length",
        "eos" | "word" => "stop",
        "" => "unknown",
        other => other,
    }
    .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn counts_tokens_by_tokens_predicted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = sock.read(&mut buf).await;
            sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
                .await
                .unwrap();
            for event in [
                r#"{"content":" a","tokens":[1],"stop":false,"tokens_predicted":1}"#,
                // The second token was held back (incomplete character): two at once.
                r#"{"content":"bc","tokens":[3],"stop":false,"tokens_predicted":3}"#,
                r#"{"content":"","tokens":[],"stop":true,"tokens_predicted":4,
                   "tokens_evaluated":7,"stop_type":"limit","timings":{"cache_n":0}}"#,
            ] {
                let e = format!("data: {}\n\n", event.replace('\n', ""));
                sock.write_all(e.as_bytes()).await.unwrap();
            }
        });
        let t = generate(&addr, None, &[1, 2, 3], 4, Duration::from_secs(5))
            .await
            .unwrap();
        let counts: Vec<usize> = t.timing.arrivals.iter().map(|a| a.1).collect();
        assert_eq!(counts, [1, 2, 1]);
        assert_eq!(t.timing.tokens(), 4);
        assert_eq!(t.prompt_tokens, 7);
        assert_eq!(t.finish_reason, "length");
        assert_eq!(t.text, " abc");
        assert_eq!(t.token_ids, [1, 3]);
    }
}
