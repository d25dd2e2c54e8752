//! `inferd-cli`: a small command-line client for the inferd WebSocket protocol v1
//! (see `docs/protocol.md`).
//!
//! ```text
//! inferd-cli chat "Why is the sky blue?" --system "Be brief." --max-tokens 128
//! inferd-cli complete "Once upon a time" --temperature 0 --raw
//! inferd-cli complete "Once upon a time" --no-cache          # bypass the prefix cache
//! inferd-cli chat "Hello" --cache-salt tenant-a              # share cache only within a salt
//! ```
//!
//! The answer streams to stdout as deltas arrive; a stats line goes to stderr. With
//! `--raw`, every protocol frame is printed as received, one JSON object per line.
//! Ctrl-C sends a `cancel` for the request; a second Ctrl-C exits at once.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;

/// Default endpoint of a local daemon.
const DEFAULT_URL: &str = "ws://127.0.0.1:8080/v1/ws";
/// The id of the one request this client sends per run.
const REQUEST_ID: &str = "cli-1";

/// Command-line client for the inferd daemon.
#[derive(Debug, Parser)]
#[command(name = "inferd-cli", version, about)]
struct Cli {
    /// WebSocket endpoint of the daemon.
    #[arg(long, global = true, env = "INFERD_URL", default_value = DEFAULT_URL)]
    url: String,
    /// The daemon's `server.api_key`, sent as `Authorization: Bearer KEY`.
    #[arg(long, global = true, env = "INFERD_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Ask a question with the model's chat template.
    Chat {
        /// The user message.
        question: String,
        /// A system message sent before the question.
        #[arg(long)]
        system: Option<String>,
        #[command(flatten)]
        options: GenerateOptions,
    },
    /// Continue a raw prompt (no chat template).
    Complete {
        /// The prompt text, tokenized as is.
        prompt: String,
        #[command(flatten)]
        options: GenerateOptions,
    },
}

/// Options shared by `chat` and `complete`. Absent sampling values use the daemon's
/// defaults.
#[derive(Debug, Args)]
struct GenerateOptions {
    /// Maximum number of tokens to generate.
    #[arg(long)]
    max_tokens: Option<u64>,
    /// Sampling temperature (0 = greedy).
    #[arg(long)]
    temperature: Option<f64>,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Bypass the daemon's prefix cache: neither reuse cached K/V nor store this
    /// prompt's blocks (sends `"cache": false`; the output is the same).
    #[arg(long)]
    no_cache: bool,
    /// Share cached prefix blocks only with requests sending the same salt (1-256 bytes;
    /// sends `"cache_salt"`).
    #[arg(long, value_name = "SALT")]
    cache_salt: Option<String>,
    /// Print every protocol frame as received (one JSON per line) instead of the text.
    #[arg(long)]
    raw: bool,
}

/// Builds the `generate` frame for `command`.
fn generate_frame(command: &Command) -> (Value, &GenerateOptions) {
    let mut frame = Map::new();
    frame.insert("type".into(), json!("generate"));
    frame.insert("id".into(), json!(REQUEST_ID));
    let options = match command {
        Command::Chat {
            question,
            system,
            options,
        } => {
            let mut messages = Vec::new();
            if let Some(system) = system {
                messages.push(json!({"role": "system", "content": system}));
            }
            messages.push(json!({"role": "user", "content": question}));
            frame.insert("messages".into(), Value::Array(messages));
            options
        }
        Command::Complete { prompt, options } => {
            frame.insert("prompt".into(), json!(prompt));
            options
        }
    };
    if let Some(n) = options.max_tokens {
        frame.insert("max_tokens".into(), json!(n));
    }
    if let Some(t) = options.temperature {
        frame.insert("temperature".into(), json!(t));
    }
    if let Some(s) = options.seed {
        frame.insert("seed".into(), json!(s));
    }
    if options.no_cache {
        frame.insert("cache".into(), json!(false));
    }
    if let Some(salt) = &options.cache_salt {
        frame.insert("cache_salt".into(), json!(salt));
    }
    (Value::Object(frame), options)
}

/// How a finished request ended, as seen by the client.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// A `done` frame arrived; carries its `finish_reason`.
    Done(String),
}

/// Prompt size from the `started` frame, kept for the stats line.
#[derive(Debug, Default)]
struct Progress {
    prompt_tokens: u64,
    cached_tokens: u64,
}

/// Handles one server frame. Returns `Some` when the request is over, an error on an
/// `error` frame or a frame that is not valid protocol JSON.
fn handle_frame(
    text: &str,
    raw: bool,
    progress: &mut Progress,
    out: &mut impl Write,
    err: &mut impl Write,
) -> Result<Option<Outcome>> {
    if raw {
        writeln!(out, "{text}")?;
        out.flush()?;
    }
    let frame: Value =
        serde_json::from_str(text).with_context(|| format!("server sent invalid JSON: {text}"))?;
    let kind = frame.get("type").and_then(Value::as_str).unwrap_or("");
    let for_us = matches!(frame.get("id"), Some(Value::String(id)) if id == REQUEST_ID);
    match kind {
        "error" if for_us || frame.get("id").is_none_or(Value::is_null) => {
            let tag = frame
                .pointer("/error/type")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            let message = frame
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)");
            if !raw {
                // End a partially streamed answer before the error goes to stderr.
                writeln!(out)?;
            }
            bail!("server error ({tag}): {message}")
        }
        _ if !for_us => Ok(None),
        "started" => {
            progress.prompt_tokens = count(&frame, "/prompt_tokens");
            progress.cached_tokens = count(&frame, "/cached_tokens");
            Ok(None)
        }
        "delta" => {
            if !raw {
                let delta = frame.get("text").and_then(Value::as_str).unwrap_or("");
                write!(out, "{delta}")?;
                out.flush()?;
            }
            Ok(None)
        }
        "done" => {
            let reason = frame
                .get("finish_reason")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_owned();
            if !raw {
                writeln!(out)?;
                out.flush()?;
                let ttft = frame
                    .pointer("/timings/ttft_ms")
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0);
                let speed = frame
                    .pointer("/timings/decode_tokens_per_s")
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0);
                writeln!(
                    err,
                    "[{} tokens, prompt {} ({} cached), TTFT {ttft:.0} ms, {speed:.1} tok/s, finish: {reason}]",
                    count(&frame, "/usage/completion_tokens"),
                    progress.prompt_tokens,
                    progress.cached_tokens,
                )?;
            }
            Ok(Some(Outcome::Done(reason)))
        }
        _ => Ok(None),
    }
}

fn count(frame: &Value, pointer: &str) -> u64 {
    frame.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

/// Connects, sends the request and streams the answer until `done` or `error`.
async fn run(cli: Cli, out: &mut impl Write, err: &mut impl Write) -> Result<Outcome> {
    let (frame, options) = generate_frame(&cli.command);
    let raw = options.raw;
    let mut request = cli
        .url
        .as_str()
        .into_client_request()
        .with_context(|| format!("--url {}", cli.url))?;
    if let Some(key) = &cli.api_key {
        let value = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| anyhow!("--api-key must be printable ASCII"))?;
        request.headers_mut().insert("authorization", value);
    }
    let (ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(r) if r.status() == 401 => anyhow!(
                "{} {} (HTTP 401): pass the daemon's server.api_key with --api-key or \
                 INFERD_API_KEY",
                cli.url,
                if cli.api_key.is_some() {
                    "refused the API key"
                } else {
                    "requires an API key"
                }
            ),
            e => anyhow!("cannot connect to {}: is inferd running? ({e})", cli.url),
        })?;
    let (mut sink, mut stream) = ws.split();
    sink.send(Message::text(frame.to_string()))
        .await
        .context("sending the request")?;
    let mut progress = Progress::default();
    let mut cancel_sent = false;
    loop {
        tokio::select! {
            message = stream.next() => {
                let message = match message {
                    None => bail!("the daemon closed the connection before the answer finished"),
                    Some(m) => m.context("reading from the daemon")?,
                };
                match message {
                    Message::Text(text) => {
                        if let Some(outcome) = handle_frame(text.as_str(), raw, &mut progress, out, err)? {
                            // Best effort: the answer is complete either way.
                            let _ = sink.send(Message::Close(None)).await;
                            return Ok(outcome);
                        }
                    }
                    Message::Close(_) => {
                        bail!("the daemon closed the connection before the answer finished")
                    }
                    _ => {}
                }
            }
            signal = tokio::signal::ctrl_c() => {
                signal.context("waiting for Ctrl-C")?;
                if cancel_sent {
                    bail!("interrupted");
                }
                cancel_sent = true;
                let cancel = json!({"type": "cancel", "id": REQUEST_ID});
                sink.send(Message::text(cancel.to_string()))
                    .await
                    .context("sending cancel")?;
            }
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    match run(cli, &mut out, &mut err).await {
        Ok(Outcome::Done(reason)) if reason == "cancelled" => ExitCode::from(130),
        Ok(Outcome::Done(_)) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = out.flush();
            eprintln!("inferd-cli: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

    use super::*;

    fn parse_cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("inferd-cli").chain(args.iter().copied()))
            .expect("valid arguments")
    }

    #[test]
    fn chat_frame_has_system_and_options() {
        let cli = parse_cli(&[
            "chat",
            "why?",
            "--system",
            "brief",
            "--max-tokens",
            "5",
            "--temperature",
            "0.5",
            "--seed",
            "9",
        ]);
        let (frame, options) = generate_frame(&cli.command);
        assert!(!options.raw);
        assert_eq!(
            frame,
            json!({"type": "generate", "id": "cli-1",
                   "messages": [{"role": "system", "content": "brief"}, {"role": "user", "content": "why?"}],
                   "max_tokens": 5, "temperature": 0.5, "seed": 9})
        );
    }

    #[test]
    fn complete_frame_leaves_defaults_to_the_daemon() {
        let cli = parse_cli(&["--url", "ws://h:1/v1/ws", "complete", "Once", "--raw"]);
        assert_eq!(cli.url, "ws://h:1/v1/ws");
        let (frame, options) = generate_frame(&cli.command);
        assert!(options.raw);
        assert_eq!(
            frame,
            json!({"type": "generate", "id": "cli-1", "prompt": "Once"})
        );
    }

    #[test]
    fn cache_flags_set_cache_and_salt() {
        let cli = parse_cli(&["complete", "Once", "--no-cache", "--cache-salt", "tenant-a"]);
        let (frame, _) = generate_frame(&cli.command);
        assert_eq!(
            frame,
            json!({"type": "generate", "id": "cli-1", "prompt": "Once",
                   "cache": false, "cache_salt": "tenant-a"})
        );
        let cli = parse_cli(&["chat", "hi", "--cache-salt", "s"]);
        let (frame, _) = generate_frame(&cli.command);
        assert_eq!(frame["cache_salt"], json!("s"));
        assert!(frame.get("cache").is_none());
    }

    #[test]
    fn frames_stream_text_and_stats() {
        let (mut out, mut err, mut progress) = (Vec::new(), Vec::new(), Progress::default());
        let frames = [
            r#"{"type":"started","id":"cli-1","prompt_tokens":7,"cached_tokens":3}"#,
            r#"{"type":"delta","id":"cli-1","text":"Hel","token_ids":[1]}"#,
            r#"{"type":"delta","id":"other","text":"NOPE","token_ids":[1]}"#,
            r#"{"type":"delta","id":"cli-1","text":"lo","token_ids":[2]}"#,
        ];
        for f in frames {
            let r = handle_frame(f, false, &mut progress, &mut out, &mut err).expect("ok");
            assert_eq!(r, None);
        }
        let done = r#"{"type":"done","id":"cli-1","finish_reason":"length","usage":{"prompt_tokens":7,"completion_tokens":2,"cached_tokens":3},"timings":{"ttft_ms":12.4,"decode_tokens_per_s":50.0}}"#;
        let r = handle_frame(done, false, &mut progress, &mut out, &mut err).expect("ok");
        assert_eq!(r, Some(Outcome::Done("length".into())));
        assert_eq!(String::from_utf8(out).expect("utf8"), "Hello\n");
        assert_eq!(
            String::from_utf8(err).expect("utf8"),
            "[2 tokens, prompt 7 (3 cached), TTFT 12 ms, 50.0 tok/s, finish: length]\n"
        );
    }

    #[test]
    fn error_frame_is_an_error() {
        let (mut out, mut err, mut progress) = (Vec::new(), Vec::new(), Progress::default());
        let frame = r#"{"type":"error","id":null,"error":{"type":"validation","message":"malformed JSON"}}"#;
        let e =
            handle_frame(frame, false, &mut progress, &mut out, &mut err).expect_err("error frame");
        assert_eq!(e.to_string(), "server error (validation): malformed JSON");
    }

    #[test]
    fn raw_prints_every_frame() {
        let (mut out, mut err, mut progress) = (Vec::new(), Vec::new(), Progress::default());
        let started = r#"{"type":"started","id":"cli-1","prompt_tokens":1,"cached_tokens":0}"#;
        let done = r#"{"type":"done","id":"cli-1","finish_reason":"stop","usage":{},"timings":{}}"#;
        handle_frame(started, true, &mut progress, &mut out, &mut err).expect("ok");
        handle_frame(done, true, &mut progress, &mut out, &mut err).expect("ok");
        assert_eq!(
            String::from_utf8(out).expect("utf8"),
            format!("{started}\n{done}\n")
        );
        assert!(err.is_empty());
    }

    /// A fake daemon that answers one generate with a scripted stream.
    async fn fake_daemon(replies: Vec<String>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let mut ws = tokio_tungstenite::accept_async(tcp)
                .await
                .expect("handshake");
            let first = ws.next().await.expect("a frame").expect("ok");
            let request: Value =
                serde_json::from_str(first.to_text().expect("text")).expect("json");
            assert_eq!(request["type"], "generate");
            for r in replies {
                ws.send(Message::text(r)).await.expect("send");
            }
            // Close (a client still waiting sees an early close), then drain.
            let _ = ws.close(None).await;
            while let Some(Ok(_)) = ws.next().await {}
        });
        format!("ws://{addr}/v1/ws")
    }

    #[tokio::test]
    async fn streams_from_a_daemon() {
        let url = fake_daemon(vec![
            r#"{"type":"started","id":"cli-1","prompt_tokens":4,"cached_tokens":0}"#.into(),
            r#"{"type":"delta","id":"cli-1","text":"4","token_ids":[19]}"#.into(),
            r#"{"type":"done","id":"cli-1","finish_reason":"stop","usage":{"prompt_tokens":4,"completion_tokens":2,"cached_tokens":0},"timings":{"ttft_ms":3.0,"decode_tokens_per_s":0.0}}"#.into(),
        ])
        .await;
        let cli = parse_cli(&["--url", &url, "chat", "2+2?"]);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let outcome = run(cli, &mut out, &mut err).await.expect("done");
        assert_eq!(outcome, Outcome::Done("stop".into()));
        assert_eq!(String::from_utf8(out).expect("utf8"), "4\n");
    }

    #[tokio::test]
    async fn error_and_early_close_fail() {
        let url = fake_daemon(vec![
            r#"{"type":"error","id":"cli-1","error":{"type":"context_length_exceeded","message":"prompt has 9000 tokens, context window is 8192"}}"#.into(),
        ])
        .await;
        let cli = parse_cli(&["--url", &url, "complete", "x"]);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let e = run(cli, &mut out, &mut err).await.expect_err("error frame");
        assert!(e.to_string().contains("context_length_exceeded"), "{e}");

        let url = fake_daemon(vec![]).await;
        let cli = parse_cli(&["--url", &url, "complete", "x"]);
        let e = run(cli, &mut out, &mut err)
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
        let cli = parse_cli(&["--url", &url, "chat", "hi"]);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let e = run(cli, &mut out, &mut err).await.expect_err("refused");
        assert!(
            e.to_string()
                .starts_with(&format!("cannot connect to {url}: is inferd running?")),
            "{e}"
        );
    }
}
