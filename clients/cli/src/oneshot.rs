//! `chat QUESTION` and `complete PROMPT`: one request, streamed to stdout, then exit.

use std::io::Write;

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::answer::{self, Answer, Render};
use crate::args::GenerateOptions;
use crate::connection::{Connection, Endpoint};
use crate::request::{self, Input};

/// The id of the one request a one-shot run sends.
pub const REQUEST_ID: &str = "cli-1";

/// How the answer is shown: `--raw` frames, the `--json` summary, or the text.
pub fn render(options: &GenerateOptions, json: bool) -> Render {
    if options.raw {
        Render::Raw
    } else if json {
        Render::Json
    } else {
        Render::Text
    }
}

/// The chat messages of a one-shot question: the system message when given, then the
/// question with its images (`--image`, each read and sent as a `data:` URL part).
///
/// # Errors
/// An image file that cannot be read, naming it.
pub fn chat_input(system: Option<&str>, question: &str, images: &[PathBuf]) -> Result<Input> {
    let mut messages = Vec::new();
    if let Some(system) = system {
        messages.push(request::message("system", system));
    }
    if images.is_empty() {
        messages.push(request::message("user", question));
    } else {
        let mut parts = vec![serde_json::json!({"type": "text", "text": question})];
        for path in images {
            let bytes = std::fs::read(path)
                .with_context(|| format!("--image {}: cannot read it", path.display()))?;
            parts.push(request::image_part(path, &bytes));
        }
        messages.push(serde_json::json!({"role": "user", "content": parts}));
    }
    Ok(Input::Messages(messages))
}

/// Connects, sends the request and streams the answer until `done` or `error`. With
/// [`Render::Json`] the summary (or a server error as `{"error": …}`) is printed to
/// `out` as one line.
pub async fn run(
    endpoint: &Endpoint,
    input: Input,
    options: &GenerateOptions,
    render: Render,
    out: &mut impl Write,
    err: &mut impl Write,
) -> Result<Answer> {
    let frame = request::generate(REQUEST_ID, input, options);
    let mut connection = Connection::open(endpoint).await?;
    let tracker = answer::Tracker::new(REQUEST_ID, render);
    let result = answer::stream(&mut connection, tracker, &frame, out, err).await;
    if render == Render::Json {
        let summary = match &result {
            Ok(answer) => Some(answer.to_json()),
            Err(e) => e
                .downcast_ref::<answer::ServerError>()
                .map(answer::ServerError::to_json),
        };
        if let Some(summary) = summary {
            writeln!(out, "{summary}")?;
            out.flush()?;
        }
    }
    if result.is_ok() {
        connection.close().await;
    }
    result
}

#[cfg(test)]
mod tests {
    use futures_util::{SinkExt, StreamExt};
    use serde_json::{json, Value};
    use tokio::net::TcpListener;
    use tokio_tungstenite::tungstenite::Message;

    use super::*;

    /// A fake daemon that answers one generate with a scripted stream; returns its URL
    /// and a receiver for the request it got.
    async fn fake_daemon(replies: Vec<String>) -> (String, tokio::sync::oneshot::Receiver<Value>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let mut ws = tokio_tungstenite::accept_async(tcp)
                .await
                .expect("handshake");
            let first = ws.next().await.expect("a frame").expect("ok");
            let request: Value =
                serde_json::from_str(first.to_text().expect("text")).expect("json");
            let _ = tx.send(request);
            for r in replies {
                ws.send(Message::text(r)).await.expect("send");
            }
            // Close (a client still waiting sees an early close), then drain.
            let _ = ws.close(None).await;
            while let Some(Ok(_)) = ws.next().await {}
        });
        (format!("ws://{addr}/v1/ws"), rx)
    }

    fn endpoint(url: &str) -> Endpoint {
        Endpoint {
            url: url.to_owned(),
            api_key: None,
        }
    }

    const STARTED: &str = r#"{"type":"started","id":"cli-1","prompt_tokens":4,"cached_tokens":0}"#;
    const DELTA: &str = r#"{"type":"delta","id":"cli-1","text":"4","token_ids":[19]}"#;
    const DONE: &str = r#"{"type":"done","id":"cli-1","finish_reason":"stop","usage":{"prompt_tokens":4,"completion_tokens":2,"cached_tokens":0},"timings":{"ttft_ms":3.0,"decode_tokens_per_s":0.0}}"#;

    #[tokio::test]
    async fn streams_from_a_daemon() {
        let (url, request) = fake_daemon(vec![STARTED.into(), DELTA.into(), DONE.into()]).await;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let options = GenerateOptions::default();
        let answer = run(
            &endpoint(&url),
            chat_input(None, "2+2?", &[]).expect("input"),
            &options,
            Render::Text,
            &mut out,
            &mut err,
        )
        .await
        .expect("done");
        assert_eq!(answer.finish_reason, "stop");
        assert_eq!(String::from_utf8(out).expect("utf8"), "4\n");
        assert_eq!(
            request.await.expect("request"),
            json!({"type": "generate", "id": "cli-1",
                   "messages": [{"role": "user", "content": "2+2?"}]})
        );
    }

    #[tokio::test]
    async fn json_prints_one_summary_line() {
        let (url, _) = fake_daemon(vec![STARTED.into(), DELTA.into(), DONE.into()]).await;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let options = GenerateOptions::default();
        run(
            &endpoint(&url),
            Input::Prompt("2+2=".into()),
            &options,
            Render::Json,
            &mut out,
            &mut err,
        )
        .await
        .expect("done");
        let out = String::from_utf8(out).expect("utf8");
        assert_eq!(out.lines().count(), 1, "{out}");
        let summary: Value = serde_json::from_str(&out).expect("json");
        assert_eq!(summary["text"], "4");
        assert_eq!(summary["usage"]["completion_tokens"], 2);
        assert!(err.is_empty());
    }

    #[tokio::test]
    async fn error_and_early_close_fail() {
        let (url, _) = fake_daemon(vec![
            r#"{"type":"error","id":"cli-1","error":{"type":"context_length_exceeded","message":"prompt has 9000 tokens, context window is 8192"}}"#.into(),
        ])
        .await;
        let options = GenerateOptions::default();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let e = run(
            &endpoint(&url),
            Input::Prompt("x".into()),
            &options,
            Render::Json,
            &mut out,
            &mut err,
        )
        .await
        .expect_err("error frame");
        assert!(e.to_string().contains("context_length_exceeded"), "{e}");
        let summary: Value = serde_json::from_slice(&out).expect("json error line");
        assert_eq!(summary["error"]["type"], "context_length_exceeded");

        let (url, _) = fake_daemon(vec![]).await;
        let e = run(
            &endpoint(&url),
            Input::Prompt("x".into()),
            &options,
            Render::Text,
            &mut out,
            &mut err,
        )
        .await
        .expect_err("closed early");
        assert!(e.to_string().contains("closed the connection"), "{e:#}");
    }

    #[tokio::test]
    async fn connection_failure_is_explained() {
        // Bind and drop to get a port nobody listens on.
        let port = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let url = format!("ws://127.0.0.1:{port}/v1/ws");
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let e = run(
            &endpoint(&url),
            chat_input(None, "hi", &[]).expect("input"),
            &GenerateOptions::default(),
            Render::Text,
            &mut out,
            &mut err,
        )
        .await
        .expect_err("refused");
        assert!(
            e.to_string()
                .starts_with(&format!("cannot connect to {url}: is inferd running?")),
            "{e}"
        );
    }
}
