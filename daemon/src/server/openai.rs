//! The OpenAI-compatible endpoints `POST /v1/chat/completions` and
//! `POST /v1/completions` (request and response shapes of the OpenAI API reference,
//! <https://platform.openai.com/docs/api-reference/chat>), with `stream: true` as
//! server-sent events (`data: {chunk}` lines, then `data: [DONE]`).
//!
//! A request body is read and validated in [`crate::api::openai`] (typed, with the same
//! validation as a WebSocket frame, so both edges accept and refuse the same values with
//! the same messages); this file answers it. `n` choices and the completions' `echo` are
//! assembled in [`super::openai_choices`].

use std::collections::VecDeque;
use std::rc::Rc;

use bytes::Bytes;
use http_body_util::{BodyExt, Either, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Map, Value};

pub use crate::api::openai::Endpoint;

use super::http::{self, Body, FrameStream};
use super::openai_choices::{split_choice, with_index, Collected, Collector, UsageSum};
use super::openai_logprobs::{chat_logprobs, completion_logprobs};
use super::{unix_now, Engine, State, Tracked};
use crate::api::openai::{parse_body, BodyError, ResponseOptions};
use crate::error::{ErrorKind, InferError};
use crate::request::tools::fold_tool_calls;
use crate::request::TokenLogprobs;
use crate::request::{EventReceiver, FinishReason, StreamEvent, ToolCallDelta, Usage};

/// Longest wait for a request body to arrive, as for its headers (hyper's
/// `header_read_timeout`), so half-sent requests cannot hold connections open.
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A refused request: the error response (boxed: it is the rare path).
pub(super) struct Refusal(pub(super) Box<Response<Body>>);

impl From<InferError> for Refusal {
    fn from(e: InferError) -> Self {
        Refusal(Box::new(http::infer_error(&e)))
    }
}

/// The refusal of a request error. A prompt over the context window gets OpenAI's
/// `param` for it: `messages` on chat, `prompt` on completions (the scheduler that finds
/// it does not know which endpoint the prompt came from).
fn refusal(e: InferError, endpoint: Endpoint) -> Refusal {
    if e.kind != ErrorKind::ContextLengthExceeded {
        return e.into();
    }
    let (status, kind) = http::status_of(e.kind);
    let param = match endpoint {
        Endpoint::Chat => "messages",
        Endpoint::Completion => "prompt",
    };
    Refusal(Box::new(http::error_with_param(
        status,
        kind,
        e.kind.as_str(),
        &e.message,
        Some(param),
    )))
}

impl From<BodyError> for Refusal {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::Invalid(e) => e.into(),
        }
    }
}

fn invalid(message: String) -> Refusal {
    InferError::validation(message).into()
}

/// What the response needs of the request.
struct Options {
    /// Streaming, usage chunk and `logprobs`, as the body asked.
    response: ResponseOptions,
    /// Choices per request (`n`, validated).
    n: usize,
}

/// Handles a completion request end to end.
pub async fn generate(
    req: Request<Incoming>,
    state: &Rc<State>,
    engine: &Engine,
    endpoint: Endpoint,
) -> Response<Body> {
    match try_generate(req, state, engine, endpoint).await {
        Ok(r) => r,
        Err(Refusal(r)) => *r,
    }
}

async fn try_generate(
    req: Request<Incoming>,
    state: &Rc<State>,
    engine: &Engine,
    endpoint: Endpoint,
) -> Result<Response<Body>, Refusal> {
    let body = read_body(req, engine.max_message_bytes).await?;
    let id = format!(
        "{}-{:016x}",
        match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        },
        rand::random::<u64>()
    );
    let (request, response) = parse_body(
        &body,
        endpoint,
        &engine.model_id,
        id.clone(),
        &engine.defaults,
        engine.vocab_size,
    )?;
    let options = Options {
        response,
        n: request.sampling.n,
    };
    // The response names what the request asked for: the base model or the adapter.
    let model = request
        .adapter
        .as_ref()
        .map_or_else(|| engine.model_id.clone(), |a| a.name.clone());
    let (tracked, mut rx) = state.start_request(engine, request)?;
    let reply = Reply {
        endpoint,
        id,
        created: unix_now(),
        model,
    };
    if options.response.stream {
        // Errors found before generation (context length, plugin configuration) still
        // get their HTTP status: wait for the first event before the headers.
        let mut tracked = tracked;
        let first = rx.recv().await;
        if let Some(StreamEvent::Error(e)) = first {
            let refused = refusal(e.clone(), endpoint);
            tracked.observe(&StreamEvent::Error(e));
            return Err(refused);
        }
        Ok(sse(reply, tracked, rx, first, &options))
    } else {
        collect(reply, tracked, rx, &options).await
    }
}

/// Reads the body, refusing one over `limit` bytes with 413. The message gives the size
/// sent when the request declared it (`Content-Length`); a chunked body is cut off at
/// the limit, so its size is unknown.
pub(super) async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, Refusal> {
    let too_large = |sent: Option<u64>| {
        let size = match sent {
            Some(n) => format!("of {n} bytes"),
            None => format!("(more than {limit} bytes, chunked)"),
        };
        Refusal(Box::new(http::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "validation",
            &format!("the request body {size} exceeds server.max_message_bytes = {limit} bytes"),
        )))
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > limit as u64) {
        return Err(too_large(Some(n)));
    }
    let read = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        Limited::new(req.into_body(), limit).collect(),
    );
    match read.await {
        Ok(Ok(c)) => Ok(c.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(None)),
        Ok(Err(e)) => Err(invalid(format!("could not read the request body: {e}"))),
        Err(_) => Err(Refusal(Box::new(http::error(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "timeout",
            &format!(
                "the request body did not arrive within {} s",
                BODY_READ_TIMEOUT.as_secs()
            ),
        )))),
    }
}

/// The identity of one response (shared by its chunks).
struct Reply {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
}

fn finish_reason(r: FinishReason) -> Value {
    serde_json::to_value(r).unwrap_or(Value::Null)
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": u.cached_tokens,
            "image_tokens": u.image_tokens,
        },
        "completion_tokens_details": {
            "accepted_prediction_tokens": u.accepted_draft_tokens,
            "rejected_prediction_tokens": u.draft_tokens - u.accepted_draft_tokens,
        },
    })
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), json!(self.id));
        m.insert("object".into(), json!(self.object(chunk)));
        m.insert("created".into(), json!(self.created));
        m.insert("model".into(), json!(self.model));
        m.insert("choices".into(), choices);
        m
    }

    /// The `logprobs` of a choice: `null` unless the request asked for them.
    fn logprobs(&self, asked: bool, entries: &[TokenLogprobs], emitted: &mut Vec<u8>) -> Value {
        match (asked, self.endpoint) {
            (false, _) => Value::Null,
            (true, Endpoint::Chat) => chat_logprobs(entries),
            (true, Endpoint::Completion) => completion_logprobs(entries, emitted),
        }
    }

    /// One streamed choice: `delta` (chat) or `text` (completion).
    fn chunk(&self, delta: Value, text: &str, logprobs: Value, finish: Value) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                json!({ "index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish })
            }
            Endpoint::Completion => {
                json!({ "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish })
            }
        };
        Value::Object(self.envelope(true, json!([choice])))
    }
}

fn sse_line(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

const DONE_LINE: &[u8] = b"data: [DONE]\n\n";

/// The state of one SSE stream.
struct Sse {
    reply: Reply,
    tracked: Tracked,
    rx: EventReceiver,
    first: Option<StreamEvent>,
    include_usage: bool,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
    /// Per choice: bytes of the tokens streamed so far (for the completions
    /// `text_offset`).
    emitted: Vec<Vec<u8>>,
    /// The usage of the choices ended so far.
    usage: UsageSum,
    queue: VecDeque<Bytes>,
    finished: bool,
}

impl Sse {
    /// Turns one event into SSE lines.
    fn push(&mut self, event: StreamEvent) {
        if self.tracked.observe(&event) {
            self.finished = true;
        }
        let (index, event) = split_choice(event);
        let r = &self.reply;
        let n = self.emitted.len();
        let emitted = match self.emitted.get_mut(index) {
            Some(e) => e,
            None => return, // no such choice: the engine never sends one
        };
        match event {
            StreamEvent::Started { .. } => {
                if r.endpoint == Endpoint::Chat {
                    for i in 0..n {
                        let c = r.chunk(
                            json!({"role": "assistant", "content": ""}),
                            "",
                            Value::Null,
                            Value::Null,
                        );
                        self.queue.push_back(sse_line(&with_index(c, i)));
                    }
                }
            }
            // The prompt starts every choice (completions only: chat refuses echo).
            StreamEvent::Echo { text, logprobs, .. } => {
                for (i, emitted) in self.emitted.iter_mut().enumerate() {
                    let lp = r.logprobs(self.logprobs, &logprobs, emitted);
                    let c = r.chunk(json!({ "content": text }), &text, lp, Value::Null);
                    self.queue.push_back(sse_line(&with_index(c, i)));
                }
            }
            StreamEvent::Delta {
                text,
                logprobs,
                reasoning,
                tool_calls,
                ..
            } => {
                let any = !text.is_empty() || !reasoning.is_empty() || !tool_calls.is_empty();
                if any || (self.logprobs && !logprobs.is_empty()) {
                    let lp = r.logprobs(self.logprobs, &logprobs, emitted);
                    let delta = chat_delta(&text, &reasoning, &tool_calls);
                    let c = r.chunk(delta, &text, lp, Value::Null);
                    self.queue.push_back(sse_line(&with_index(c, index)));
                }
            }
            StreamEvent::Done {
                finish_reason: reason,
                usage,
                ..
            } => {
                let c = r.chunk(json!({}), "", Value::Null, finish_reason(reason));
                self.queue.push_back(sse_line(&with_index(c, index)));
                self.usage.add(&usage);
                if !self.finished {
                    return; // other choices go on
                }
                if self.include_usage {
                    let mut u = r.envelope(true, json!([]));
                    u.insert("usage".into(), usage_json(&self.usage.total()));
                    self.queue.push_back(sse_line(&Value::Object(u)));
                }
                self.queue.push_back(Bytes::from_static(DONE_LINE));
            }
            StreamEvent::Choice { .. } => {} // not nested
            StreamEvent::Error(e) => {
                let (_, kind) = http::status_of(e.kind);
                let err = json!({"error": {
                    "message": e.message, "type": kind, "param": null, "code": e.kind.as_str()
                }});
                self.queue.push_back(sse_line(&err));
                self.queue.push_back(Bytes::from_static(DONE_LINE));
            }
        }
    }

    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(b) = self.queue.pop_front() {
                return Some(b);
            }
            if self.finished {
                return None;
            }
            let event = match self.first.take() {
                Some(e) => e,
                None => match self.rx.recv().await {
                    Some(e) => e,
                    // The engine dropped the channel without a final event: say so.
                    None => StreamEvent::Error(InferError::internal(
                        "the request ended without a result",
                    )),
                },
            };
            self.push(event);
        }
    }
}

/// A `text/event-stream` response; dropping it (the client disconnected) cancels the
/// request through its [`Tracked`] guard.
fn sse(
    reply: Reply,
    tracked: Tracked,
    rx: EventReceiver,
    first: Option<StreamEvent>,
    options: &Options,
) -> Response<Body> {
    let state = Sse {
        reply,
        tracked,
        rx,
        first,
        include_usage: options.response.include_usage,
        logprobs: options.response.logprobs,
        emitted: vec![Vec::new(); options.n.max(1)],
        usage: UsageSum::default(),
        queue: VecDeque::new(),
        finished: false,
    };
    let stream = futures_util::stream::unfold(state, |mut s| async move {
        s.next()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(Frame::data(b)), s))
    });
    let body: FrameStream = Box::pin(stream);
    let mut r = Response::new(Either::Right(StreamBody::new(body)));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// A streamed chat `delta`: `content`, and `reasoning_content` / `tool_calls` when
/// present (a call's first piece carries `id`, `type` and the name).
fn chat_delta(text: &str, reasoning: &str, calls: &[ToolCallDelta]) -> Value {
    let mut d = Map::new();
    if !text.is_empty() || (reasoning.is_empty() && calls.is_empty()) {
        d.insert("content".into(), json!(text));
    }
    if !reasoning.is_empty() {
        d.insert("reasoning_content".into(), json!(reasoning));
    }
    if !calls.is_empty() {
        // One entry per call and chunk: consecutive pieces of a call are joined.
        let mut merged: Vec<ToolCallDelta> = Vec::new();
        for c in calls {
            match merged.last_mut() {
                Some(m) if m.index == c.index && c.id.is_none() => {
                    m.arguments.push_str(&c.arguments)
                }
                _ => merged.push(c.clone()),
            }
        }
        let pieces: Vec<Value> = merged
            .iter()
            .map(|c| {
                let mut function = Map::new();
                if let Some(name) = &c.name {
                    function.insert("name".into(), json!(name));
                }
                function.insert("arguments".into(), json!(c.arguments));
                let mut p = Map::new();
                p.insert("index".into(), json!(c.index));
                if let Some(id) = &c.id {
                    p.insert("id".into(), json!(id));
                    p.insert("type".into(), json!("function"));
                }
                p.insert("function".into(), Value::Object(function));
                Value::Object(p)
            })
            .collect();
        d.insert("tool_calls".into(), Value::Array(pieces));
    }
    Value::Object(d)
}

/// A whole chat `message`: `content` (`null` when the turn only called tools), and
/// `reasoning_content` / `tool_calls` when present, the calls folded from the same
/// pieces a stream sends.
fn chat_message(text: String, reasoning: &str, calls: &[ToolCallDelta]) -> Value {
    let calls = fold_tool_calls(calls);
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    let content = if text.is_empty() && !calls.is_empty() {
        Value::Null
    } else {
        json!(text)
    };
    m.insert("content".into(), content);
    if !reasoning.is_empty() {
        m.insert("reasoning_content".into(), json!(reasoning));
    }
    if !calls.is_empty() {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(m)
}

/// Waits for the whole completion, every choice of it (a client that disconnects
/// meanwhile drops this future, and with it the [`Tracked`] guard, which cancels the
/// request).
async fn collect(
    reply: Reply,
    mut tracked: Tracked,
    mut rx: EventReceiver,
    options: &Options,
) -> Result<Response<Body>, Refusal> {
    let mut collector = Collector::new(options.n);
    loop {
        let event = rx.recv().await.unwrap_or_else(|| {
            StreamEvent::Error(InferError::internal("the request ended without a result"))
        });
        tracked.observe(&event);
        let usage = match collector.push(event) {
            Collected::Pending => continue,
            Collected::Failed(e) => return Err(refusal(e, reply.endpoint)),
            Collected::Complete(usage) => usage,
        };
        let choices: Vec<Value> = collector
            .choices()
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let lp = reply.logprobs(options.response.logprobs, &c.entries, &mut Vec::new());
                let reason = c.finish.map_or(Value::Null, finish_reason);
                match reply.endpoint {
                    Endpoint::Chat => json!({
                        "index": index,
                        "message": chat_message(c.text.clone(), &c.reasoning, &c.calls),
                        "logprobs": lp,
                        "finish_reason": reason,
                    }),
                    Endpoint::Completion => json!({
                        "index": index,
                        "text": c.text,
                        "logprobs": lp,
                        "finish_reason": reason,
                    }),
                }
            })
            .collect();
        let mut body = reply.envelope(false, Value::Array(choices));
        body.insert("usage".into(), usage_json(&usage));
        return Ok(http::json(StatusCode::OK, &Value::Object(body)));
    }
}
