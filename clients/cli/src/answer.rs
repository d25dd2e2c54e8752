//! One `generate` request's answer: its frames shown as they arrive (text, raw frames,
//! or nothing until the JSON summary), collected into an [`Answer`], and Ctrl-C turned
//! into a `cancel`.

use std::fmt;
use std::io::Write;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::connection::Connection;
use crate::request;

/// How an answer is shown while it streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Render {
    /// The text to stdout as deltas arrive, then a newline; a stats line to stderr.
    Text,
    /// Every frame of the request to stdout as received, one JSON object per line.
    Raw,
    /// Nothing while streaming: the caller prints [`Answer::to_json`] at the end.
    Json,
}

/// A finished answer (a `done` frame arrived).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The concatenated delta texts.
    pub text: String,
    /// `done.finish_reason`: `stop`, `length`, `tool_calls` or `cancelled`.
    pub finish_reason: String,
    /// `done.usage`, as the server sent it.
    pub usage: Value,
    /// `done.timings`, as the server sent it.
    pub timings: Value,
}

impl Answer {
    /// Whether the answer was cut short by a `cancel`.
    pub fn cancelled(&self) -> bool {
        self.finish_reason == "cancelled"
    }

    /// The `--json` summary of a chat or completion answer:
    /// `{"text", "finish_reason", "usage", "timings"}` (`usage` and `timings` are the
    /// `done` frame's objects, unchanged).
    pub fn to_json(&self) -> Value {
        json!({
            "text": self.text,
            "finish_reason": self.finish_reason,
            "usage": self.usage,
            "timings": self.timings,
        })
    }
}

/// The daemon refused or failed the request with an `error` frame.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerError {
    /// The frame's `error` object: `{"type": tag, "message": text}`.
    pub error: Value,
}

impl ServerError {
    /// The stable tag (`validation`, `context_length_exceeded`, ...).
    pub fn tag(&self) -> &str {
        self.error
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
    }

    /// The human-readable message.
    pub fn message(&self) -> &str {
        self.error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("(no message)")
    }

    /// The `--json` form: `{"error": {"type", "message"}}`.
    pub fn to_json(&self) -> Value {
        json!({"error": self.error})
    }
}

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server error ({}): {}", self.tag(), self.message())
    }
}

impl std::error::Error for ServerError {}

/// Ctrl-C was pressed a second time while the same answer streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted;

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

/// Follows one request's frames.
#[derive(Debug)]
pub struct Tracker {
    id: String,
    render: Render,
    prompt_tokens: u64,
    cached_tokens: u64,
    text: String,
    mark_cancelled: bool,
}

impl Tracker {
    /// Follows request `id`, showing it as `render` says.
    pub fn new(id: &str, render: Render) -> Self {
        Self {
            id: id.to_owned(),
            render,
            prompt_tokens: 0,
            cached_tokens: 0,
            text: String::new(),
            mark_cancelled: false,
        }
    }

    /// With [`Render::Text`], ends a cancelled answer with a `[cancelled]` line on
    /// stdout (before the stats line).
    pub fn mark_cancelled(mut self) -> Self {
        self.mark_cancelled = true;
        self
    }

    /// The request's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Handles one server frame. Returns the answer once `done` arrives; an `error`
    /// frame for this request (or with a null id) is a [`ServerError`]; a frame that
    /// is not JSON is an error too. Frames of other requests are ignored.
    pub fn handle(
        &mut self,
        text: &str,
        out: &mut impl Write,
        err: &mut impl Write,
    ) -> Result<Option<Answer>> {
        if self.render == Render::Raw {
            writeln!(out, "{text}")?;
            out.flush()?;
        }
        let frame: Value = serde_json::from_str(text)
            .with_context(|| format!("server sent invalid JSON: {text}"))?;
        let kind = frame.get("type").and_then(Value::as_str).unwrap_or("");
        let for_us = matches!(frame.get("id"), Some(Value::String(id)) if *id == self.id);
        let text_mode = self.render == Render::Text;
        match kind {
            "error" if for_us || frame.get("id").is_none_or(Value::is_null) => {
                if text_mode && !self.text.is_empty() {
                    // End a partially streamed answer before the error goes to stderr.
                    writeln!(out)?;
                }
                let error = frame.get("error").cloned().unwrap_or_else(|| json!({}));
                Err(ServerError { error }.into())
            }
            _ if !for_us => Ok(None),
            "started" => {
                self.prompt_tokens = count(&frame, "/prompt_tokens");
                self.cached_tokens = count(&frame, "/cached_tokens");
                Ok(None)
            }
            "delta" => {
                let delta = frame.get("text").and_then(Value::as_str).unwrap_or("");
                self.text.push_str(delta);
                if text_mode {
                    write!(out, "{delta}")?;
                    out.flush()?;
                }
                Ok(None)
            }
            "done" => {
                let answer = Answer {
                    text: std::mem::take(&mut self.text),
                    finish_reason: frame
                        .get("finish_reason")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                        .to_owned(),
                    usage: frame.get("usage").cloned().unwrap_or_else(|| json!({})),
                    timings: frame.get("timings").cloned().unwrap_or_else(|| json!({})),
                };
                if text_mode {
                    writeln!(out)?;
                    if self.mark_cancelled && answer.cancelled() {
                        writeln!(out, "[cancelled]")?;
                    }
                    out.flush()?;
                    writeln!(err, "{}", self.stats_line(&answer))?;
                }
                Ok(Some(answer))
            }
            _ => Ok(None),
        }
    }

    /// `[N tokens, prompt P (C cached), TTFT T ms, S tok/s, finish: R]`; the prompt's
    /// image tokens after the cached ones when it has any (`(C cached, I image)`).
    fn stats_line(&self, answer: &Answer) -> String {
        let ttft = answer
            .timings
            .get("ttft_ms")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let speed = answer
            .timings
            .get("decode_tokens_per_s")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        let images = match count(&answer.usage, "/image_tokens") {
            0 => String::new(),
            n => format!(", {n} image"),
        };
        format!(
            "[{} tokens, prompt {} ({} cached{images}), TTFT {ttft:.0} ms, {speed:.1} tok/s, \
             finish: {}]",
            count(&answer.usage, "/completion_tokens"),
            self.prompt_tokens,
            self.cached_tokens,
            answer.finish_reason,
        )
    }
}

/// The unsigned integer at `pointer`, 0 when absent.
pub fn count(frame: &Value, pointer: &str) -> u64 {
    frame.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

/// Sends `frame` (a `generate` with the tracker's id) and follows its answer until
/// `done` or `error`. The first Ctrl-C sends a `cancel` (the answer then ends with
/// `finish_reason: "cancelled"`); a second one while the same answer streams returns
/// [`Interrupted`].
pub async fn stream(
    connection: &mut Connection,
    mut tracker: Tracker,
    frame: &Value,
    out: &mut impl Write,
    err: &mut impl Write,
) -> Result<Answer> {
    connection.send(frame, "the request").await?;
    let mut cancel_sent = false;
    let mut interrupt = Box::pin(tokio::signal::ctrl_c());
    loop {
        tokio::select! {
            text = connection.next_text() => {
                if let Some(answer) = tracker.handle(&text?, out, err)? {
                    return Ok(answer);
                }
            }
            signal = &mut interrupt => {
                signal.context("waiting for Ctrl-C")?;
                if cancel_sent {
                    return Err(Interrupted.into());
                }
                cancel_sent = true;
                interrupt = Box::pin(tokio::signal::ctrl_c());
                connection.send(&request::cancel(tracker.id()), "cancel").await?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(tracker: &mut Tracker, frames: &[&str]) -> (String, String, Result<Option<Answer>>) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let mut last = Ok(None);
        for f in frames {
            last = tracker.handle(f, &mut out, &mut err);
            if !matches!(last, Ok(None)) {
                break;
            }
        }
        (
            String::from_utf8(out).expect("utf8"),
            String::from_utf8(err).expect("utf8"),
            last,
        )
    }

    const DONE: &str = r#"{"type":"done","id":"cli-1","finish_reason":"length","usage":{"prompt_tokens":7,"completion_tokens":2,"cached_tokens":3},"timings":{"ttft_ms":12.4,"decode_tokens_per_s":50.0}}"#;
    const FRAMES: [&str; 5] = [
        r#"{"type":"started","id":"cli-1","prompt_tokens":7,"cached_tokens":3}"#,
        r#"{"type":"delta","id":"cli-1","text":"Hel","token_ids":[1]}"#,
        r#"{"type":"delta","id":"other","text":"NOPE","token_ids":[1]}"#,
        r#"{"type":"delta","id":"cli-1","text":"lo","token_ids":[2]}"#,
        DONE,
    ];

    #[test]
    fn image_tokens_join_the_stats_when_the_prompt_has_them() {
        let done = DONE.replace(
            r#""cached_tokens":3}"#,
            r#""cached_tokens":3,"image_tokens":16}"#,
        );
        let frames = [FRAMES[0], FRAMES[1], FRAMES[3], done.as_str()];
        let (_, err, _) = feed(&mut Tracker::new("cli-1", Render::Text), &frames);
        assert_eq!(
            err,
            "[2 tokens, prompt 7 (3 cached, 16 image), TTFT 12 ms, 50.0 tok/s, finish: length]\n"
        );
    }

    #[test]
    fn frames_stream_text_and_stats() {
        let (out, err, last) = feed(&mut Tracker::new("cli-1", Render::Text), &FRAMES);
        let answer = last.expect("ok").expect("done");
        assert_eq!(answer.text, "Hello");
        assert_eq!(answer.finish_reason, "length");
        assert_eq!(out, "Hello\n");
        assert_eq!(
            err,
            "[2 tokens, prompt 7 (3 cached), TTFT 12 ms, 50.0 tok/s, finish: length]\n"
        );
    }

    #[test]
    fn a_cancelled_answer_can_be_marked() {
        let cancelled = DONE.replace("\"length\"", "\"cancelled\"");
        let frames = [FRAMES[0], FRAMES[1], cancelled.as_str()];
        let (out, err, _) = feed(&mut Tracker::new("cli-1", Render::Text), &frames);
        assert_eq!(out, "Hel\n");
        assert!(err.ends_with("finish: cancelled]\n"), "{err}");
        let mut marked = Tracker::new("cli-1", Render::Text).mark_cancelled();
        let (out, _, last) = feed(&mut marked, &frames);
        assert!(last.expect("ok").expect("done").cancelled());
        assert_eq!(out, "Hel\n[cancelled]\n");
    }

    #[test]
    fn json_render_prints_nothing_and_summarizes() {
        let (out, err, last) = feed(&mut Tracker::new("cli-1", Render::Json), &FRAMES);
        assert_eq!((out.as_str(), err.as_str()), ("", ""));
        let answer = last.expect("ok").expect("done");
        assert_eq!(
            answer.to_json(),
            json!({"text": "Hello", "finish_reason": "length",
                   "usage": {"prompt_tokens": 7, "completion_tokens": 2, "cached_tokens": 3},
                   "timings": {"ttft_ms": 12.4, "decode_tokens_per_s": 50.0}})
        );
    }

    #[test]
    fn error_frame_is_a_server_error() {
        let frame = r#"{"type":"error","id":null,"error":{"type":"validation","message":"malformed JSON"}}"#;
        let (out, _, last) = feed(&mut Tracker::new("cli-1", Render::Text), &[frame]);
        let e = last.expect_err("error frame");
        assert_eq!(e.to_string(), "server error (validation): malformed JSON");
        let server = e.downcast_ref::<ServerError>().expect("a ServerError");
        assert_eq!(server.tag(), "validation");
        assert_eq!(
            server.to_json(),
            json!({"error": {"type": "validation", "message": "malformed JSON"}})
        );
        assert_eq!(out, "", "nothing was streamed, so no line is ended");
        // After some text, the line is ended before the error goes to stderr.
        let (out, _, last) = feed(
            &mut Tracker::new("cli-1", Render::Text),
            &[FRAMES[0], FRAMES[1], frame],
        );
        assert!(last.is_err());
        assert_eq!(out, "Hel\n");
        // Another request's error is not ours.
        let other = r#"{"type":"error","id":"x","error":{"type":"validation","message":"m"}}"#;
        let (_, _, last) = feed(&mut Tracker::new("cli-1", Render::Json), &[other]);
        assert!(matches!(last, Ok(None)));
    }

    #[test]
    fn raw_prints_every_frame() {
        let started = r#"{"type":"started","id":"cli-1","prompt_tokens":1,"cached_tokens":0}"#;
        let done = r#"{"type":"done","id":"cli-1","finish_reason":"stop","usage":{},"timings":{}}"#;
        let (out, err, last) = feed(&mut Tracker::new("cli-1", Render::Raw), &[started, done]);
        assert!(last.expect("ok").is_some());
        assert_eq!(out, format!("{started}\n{done}\n"));
        assert!(err.is_empty());
    }

    #[test]
    fn invalid_json_is_an_error() {
        let (_, _, last) = feed(&mut Tracker::new("cli-1", Render::Text), &["{nope"]);
        assert!(last
            .expect_err("invalid")
            .to_string()
            .contains("invalid JSON"));
    }
}
