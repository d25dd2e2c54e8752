//! [`ToolCallParser`]: finds tool calls in the streamed answer text and turns them into
//! OpenAI `delta.tool_calls` pieces (index, id and name once, then argument pieces);
//! the text around the calls stays content.
//!
//! Formats, chosen from the chat template ([`ToolFormat::of_template`]):
//! - Hermes / Qwen (NousResearch's Hermes function calling, Qwen2.5 and Qwen3
//!   templates): `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, repeated;
//! - Llama 3.1+ JSON (Meta's llama3.1 prompt format): the answer is
//!   `{"name": …, "parameters": {…}}` (optionally after `<|python_tag|>`), several
//!   separated by `;`;
//! - Mistral v3 (mistral-common's tokenizer v3): `[TOOL_CALLS][{"name": …,
//!   "arguments": {…}}, …]`.
//!
//! A call whose object is `{"name": "…", "arguments": ` streams its arguments as they
//! arrive; any other shape is buffered to its end and parsed whole. A call that does
//! not parse goes back to the content as text, as vLLM's parsers do.

use super::json_scan::{header, whole_call, Header, JsonDepth};
use super::reasoning::partial_suffix;
pub use crate::request::channels::{ToolFormat, HERMES_CLOSE, HERMES_OPEN};
use crate::request::ToolCallDelta;

/// A random number drawn once per process: call ids (`call_` + this + the sequence
/// id + the call's index, 24 hex digits) do not repeat across restarts.
fn process_salt() -> u32 {
    static SALT: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *SALT.get_or_init(rand::random::<u32>)
}

/// Llama 3's marker before a call.
const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// Llama 3: at the start of the answer (or after a `;`), deciding.
    Start,
    /// Plain content, looking for the opener.
    Content,
    /// Mistral: after `[TOOL_CALLS]`, expecting `[`.
    ArrayOpen,
    /// Reading a call object's header.
    Header,
    /// Streaming the arguments value.
    Arguments(JsonDepth),
    /// After the arguments: up to the call object's closing brace.
    Tail(JsonDepth),
    /// A call of another shape, buffered to its end (`buf` holds it from its `{`; the
    /// number is how many bytes of it were scanned).
    Whole(JsonDepth, usize),
    /// After a call: its framing (`</tool_call>`, `;`, `,` or `]`).
    AfterCall,
    /// No further calls are wanted (`parallel_tool_calls: false`): the rest is dropped.
    Discard,
}

/// Content and call pieces released by one push.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolSplit {
    /// Answer text outside the calls.
    pub content: String,
    /// Call pieces, in order.
    pub calls: Vec<ToolCallDelta>,
}

/// Parses tool calls out of one sequence's answer text.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    format: ToolFormat,
    state: State,
    /// Text not yet consumed.
    buf: String,
    /// The text of the call being read since its opener, given back as content if it
    /// turns out not to be a call.
    raw: String,
    /// Trailing whitespace of the content, held (dropped before a call).
    held_ws: String,
    /// Calls started so far.
    calls: usize,
    parallel: bool,
    /// Prefix of the call ids (`call_`, the process salt, the sequence id).
    id_base: String,
}

impl ToolCallParser {
    /// A parser for `format`; `parallel` = `parallel_tool_calls`; `seq` makes the call
    /// ids unique for the daemon's lifetime.
    pub fn new(format: ToolFormat, parallel: bool, seq: u64) -> Self {
        Self {
            format,
            state: if format == ToolFormat::Llama3Json {
                State::Start
            } else {
                State::Content
            },
            buf: String::new(),
            raw: String::new(),
            held_ws: String::new(),
            calls: 0,
            parallel,
            id_base: format!("call_{:08x}{seq:08x}", process_salt()),
        }
    }

    /// Whether any call was found.
    pub fn has_calls(&self) -> bool {
        self.calls > 0
    }

    /// Parses the next piece of answer text into `out`.
    pub fn push(&mut self, text: &str, out: &mut ToolSplit) {
        self.buf.push_str(text);
        while self.step(out) {}
    }

    /// The answer ended: what is held is released. An unfinished call keeps what it
    /// streamed; the markup of a call cut off before its name was read (the answer hit
    /// `max_tokens` inside it) is dropped, never released as content, as is a held
    /// opener prefix after a call.
    pub fn finish(&mut self, out: &mut ToolSplit) {
        while self.step(out) {}
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Header | State::Whole(..) | State::ArrayOpen => self.raw.clear(),
            State::Arguments(_) => out.calls.push(self.piece(rest)),
            State::Content if self.has_calls() && self.format.opener().is_some() => {}
            State::Content | State::Start | State::AfterCall => self.content(&rest, out),
            State::Tail(_) | State::Discard => {}
        }
        let ws = std::mem::take(&mut self.held_ws);
        if !self.has_calls() {
            out.content.push_str(&ws);
        }
    }

    /// Content text: held trailing whitespace goes out first; this text's own
    /// trailing whitespace is held.
    fn content(&mut self, text: &str, out: &mut ToolSplit) {
        if text.is_empty() {
            return;
        }
        let body = text.trim_end();
        if !body.is_empty() {
            out.content.push_str(&std::mem::take(&mut self.held_ws));
            out.content.push_str(body);
        }
        self.held_ws.push_str(&text[body.len()..]);
    }

    fn piece(&self, arguments: String) -> ToolCallDelta {
        ToolCallDelta {
            index: self.calls - 1,
            id: None,
            name: None,
            arguments,
        }
    }

    fn start_call(&mut self, name: String, arguments: String, out: &mut ToolSplit) {
        self.held_ws.clear();
        self.raw.clear();
        out.calls.push(ToolCallDelta {
            index: self.calls,
            id: Some(format!("{}{:08x}", self.id_base, self.calls)),
            name: Some(name),
            arguments,
        });
        self.calls += 1;
    }

    fn after_call(&mut self) {
        self.state = if self.parallel {
            State::AfterCall
        } else {
            State::Discard
        };
    }

    /// Consumes what it can of `buf`; returns whether to go on.
    fn step(&mut self, out: &mut ToolSplit) -> bool {
        match self.state.clone() {
            State::Discard => {
                self.buf.clear();
                false
            }
            State::Start => {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    return false;
                }
                if let Some(after) = t.strip_prefix(PYTHON_TAG) {
                    self.buf = after.to_string();
                    self.state = State::Header;
                } else if t.starts_with('{') {
                    self.buf = t.to_string();
                    self.state = State::Header;
                } else if PYTHON_TAG.starts_with(t) {
                    return false;
                } else {
                    self.state = State::Content;
                }
                true
            }
            State::Content => {
                let Some(opener) = self.format.opener() else {
                    let rest = std::mem::take(&mut self.buf);
                    self.content(&rest, out);
                    return false;
                };
                if let Some(at) = self.buf.find(opener) {
                    let before = self.buf[..at].to_string();
                    self.content(&before, out);
                    self.raw = opener.to_string();
                    self.buf.drain(..at + opener.len());
                    self.state = if self.format == ToolFormat::MistralV3 {
                        State::ArrayOpen
                    } else {
                        State::Header
                    };
                    return true;
                }
                let keep = partial_suffix(&self.buf, opener);
                let cut = self.buf.len() - keep;
                let released: String = self.buf.drain(..cut).collect();
                self.content(&released, out);
                false
            }
            State::ArrayOpen => {
                let t = self.buf.trim_start();
                match t.chars().next() {
                    None => false,
                    Some('[') => {
                        self.raw.push_str(&self.buf[..self.buf.len() - t.len() + 1]);
                        self.buf = t[1..].to_string();
                        self.state = State::Header;
                        true
                    }
                    Some('{') => {
                        self.state = State::Header;
                        true
                    }
                    Some(_) => {
                        let raw = std::mem::take(&mut self.raw);
                        self.content(&raw, out);
                        self.state = State::Content;
                        true
                    }
                }
            }
            State::Header => match header(&self.buf) {
                Header::Incomplete => false,
                Header::Done { name, len } if self.buf[len..].starts_with(['{', '[']) => {
                    self.buf.drain(..len);
                    self.start_call(name, String::new(), out);
                    self.state = State::Arguments(JsonDepth::default());
                    true
                }
                // Arguments given as a string of JSON (or another value): read whole.
                Header::Done { .. } => {
                    self.state = State::Whole(JsonDepth::default(), 0);
                    true
                }
                Header::Mismatch => {
                    if self.buf.trim_start().starts_with('{') {
                        self.state = State::Whole(JsonDepth::default(), 0);
                    } else {
                        // Not a call after all: the opener and the text are content.
                        let raw = std::mem::take(&mut self.raw) + &std::mem::take(&mut self.buf);
                        self.content(&raw, out);
                        self.state = State::Content;
                        if self.format == ToolFormat::Llama3Json {
                            return false;
                        }
                    }
                    true
                }
            },
            State::Arguments(mut depth) => {
                let end = self
                    .buf
                    .char_indices()
                    .find(|&(_, c)| depth.feed(c))
                    .map(|(i, c)| i + c.len_utf8());
                let n = end.unwrap_or(self.buf.len());
                let piece: String = self.buf.drain(..n).collect();
                if !piece.is_empty() {
                    out.calls.push(self.piece(piece));
                }
                if end.is_some() {
                    self.state = State::Tail(JsonDepth::default());
                    true
                } else {
                    self.state = State::Arguments(depth);
                    false
                }
            }
            State::Tail(mut depth) => {
                // Up to the `}` closing the call object (skipping any further keys).
                for (i, c) in self.buf.char_indices() {
                    if c == '}' && !depth.open() {
                        self.buf.drain(..=i);
                        self.after_call();
                        return true;
                    }
                    depth.feed(c);
                }
                self.buf.clear();
                self.state = State::Tail(depth);
                false
            }
            State::Whole(mut depth, scanned) => {
                let end = self.buf[scanned..]
                    .char_indices()
                    .find(|&(_, c)| depth.feed(c))
                    .map(|(i, c)| scanned + i + c.len_utf8());
                let Some(end) = end else {
                    self.state = State::Whole(depth, self.buf.len());
                    return false;
                };
                let text: String = self.buf.drain(..end).collect();
                match whole_call(&text) {
                    Some((name, args)) => {
                        self.start_call(name, args, out);
                        self.after_call();
                    }
                    None => {
                        let raw = std::mem::take(&mut self.raw) + &text;
                        self.content(&raw, out);
                        self.state = State::Content;
                    }
                }
                true
            }
            State::AfterCall => self.after_call_framing(out),
        }
    }

    fn after_call_framing(&mut self, out: &mut ToolSplit) -> bool {
        let t = self.buf.trim_start();
        if t.is_empty() {
            return false;
        }
        let skip = self.buf.len() - t.len();
        match self.format {
            ToolFormat::Hermes => {
                if let Some(after) = t.strip_prefix(HERMES_CLOSE) {
                    self.buf = after.to_string();
                    self.state = State::Content;
                } else if HERMES_CLOSE.starts_with(t) {
                    return false;
                } else {
                    self.state = State::Content;
                }
            }
            ToolFormat::Llama3Json => match t.chars().next() {
                Some(';') => {
                    self.buf = t[1..].to_string();
                    self.state = State::Start;
                }
                Some('{') => self.state = State::Start,
                _ => {
                    self.buf.drain(..skip);
                    self.state = State::Content;
                }
            },
            ToolFormat::MistralV3 => match t.chars().next() {
                Some(',') => {
                    self.buf = t[1..].to_string();
                    self.state = State::Header;
                }
                Some(']') => {
                    self.buf = t[1..].to_string();
                    self.state = State::Content;
                }
                _ => self.state = State::Content,
            },
        }
        let _ = out;
        true
    }
}

#[cfg(test)]
mod tests;
