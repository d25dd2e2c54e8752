//! Chat templates: Hugging Face Jinja templates rendered with minijinja.
//!
//! The environment mimics what transformers (`apply_chat_template`) and llama.cpp's Jinja engine
//! give a template: `trim_blocks` and `lstrip_blocks` on, loop controls, Python string/dict/list
//! methods (`.strip()`, `.startswith()`, `.split()`, `.items()`, ... via
//! `minijinja_contrib::pycompat`), the variables `messages`, `add_generation_prompt`,
//! `bos_token`, `eos_token`, the functions `raise_exception(msg)` and `strftime_now(fmt)`, and a
//! `tojson` filter that prints like Python's `json.dumps` (`", "` and `": "` separators, keys in
//! insertion order, non-ASCII kept).

use std::fmt::Write as _;
use std::ops::Range;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind as JinjaErrorKind};

use crate::error::InferError;
use crate::request::ChatMessage;

use super::TokenizerError;

/// Name under which the template is stored in its environment.
const TEMPLATE_NAME: &str = "chat";

/// Opens a span of message content in a marked rendering (a Unicode noncharacter).
pub(crate) const CONTENT_OPEN: char = '\u{FDD0}';
/// Closes a span of message content in a marked rendering.
pub(crate) const CONTENT_CLOSE: char = '\u{FDD1}';

/// The error a template raises through `raise_exception(msg)`; carried as the source of the
/// minijinja error so rendering can report `msg` verbatim.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct RaisedException(String);

/// A compiled chat template with the BOS/EOS token texts it may reference.
///
/// `Send + Sync`; rendering takes `&self`.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    /// The Jinja source (read to choose the tool-call and reasoning formats).
    source: String,
    /// Whether the template reads a message's content only as a list of parts
    /// ([`Self::typed_only`]), found on first need.
    typed_only: std::sync::OnceLock<bool>,
}

/// Variables a template gets besides `messages`: the request's `tools` (OpenAI's
/// `[{"type": "function", "function": {…}}]` shape, absent when the request has none or
/// `tool_choice` is `none`) and its `chat_template_kwargs`.
#[derive(Debug, Clone, Default)]
pub struct TemplateExtras {
    /// `tools`, passed as transformers' `apply_chat_template(tools=…)` does.
    pub tools: Option<serde_json::Value>,
    /// Extra variables (`chat_template_kwargs`), e.g. `enable_thinking`.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// How each message's `content` reaches the template.
    pub content_parts: ContentParts,
}

/// How message content reaches a chat template.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ContentParts {
    /// One string (a text model).
    #[default]
    Text,
    /// A list of parts, `{"type": "text", "text": …}` and `{"type": "image"}` where an
    /// image sits, as transformers' processors pass it to a vision-language model's
    /// template.
    Typed,
    /// As llama-server gives a GGUF's template a message (the GGUF + mmproj path): its
    /// text with this marker where each image sits (outside the message text), as a
    /// string, or as one text part when the template reads only parts (its
    /// `common/chat.cpp` normalizes every message so).
    MediaText(String),
}

/// A rendered prompt with the byte ranges that came from message content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// The prompt text.
    pub text: String,
    /// Byte ranges of `text` that hold message content (sorted, non-overlapping): special-token
    /// text inside them must stay plain text.
    pub content_spans: Vec<Range<usize>>,
}

impl ChatTemplate {
    /// Compiles `source` (a Hugging Face style Jinja chat template). `bos_token` / `eos_token`
    /// are the token texts exposed to the template as `bos_token` / `eos_token`.
    ///
    /// # Errors
    /// [`TokenizerError::Template`] when the template does not parse.
    pub fn new(
        source: &str,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, without_generation_tags(source))
            .map_err(|e| TokenizerError::Template {
                message: e.to_string(),
            })?;
        Ok(Self {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            source: source.to_string(),
            typed_only: std::sync::OnceLock::new(),
        })
    }

    /// Whether the template shows a user message's content given as a list of text
    /// parts but not given as a string: llama.cpp's capability probe
    /// (`common/chat.cpp`, `supports_string_content` / `supports_typed_content`), by
    /// which llama-server decides how a message with media reaches the template.
    fn typed_only(&self) -> bool {
        *self.typed_only.get_or_init(|| {
            let shows = |content: Value, probe: &str| -> bool {
                let Ok(t) = self.env.get_template(TEMPLATE_NAME) else {
                    return false;
                };
                let messages = vec![context! { role => "user", content => content }];
                t.render(context! {
                    messages => messages,
                    add_generation_prompt => false,
                    bos_token => self.bos_token.as_str(),
                    eos_token => self.eos_token.as_str(),
                })
                .is_ok_and(|out| out.contains(probe))
            };
            let (string, typed) = ("<inferd string probe>", "<inferd typed probe>");
            let parts = Value::from(vec![context! { type => "text", text => typed }]);
            !shows(Value::from(string), string) && shows(parts, typed)
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` as given (no content markers).
    ///
    /// # Errors
    /// [`InferError`] of kind `validation`: the template's own message for
    /// `raise_exception(msg)`, otherwise `chat template error: ...`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, InferError> {
        let extras = TemplateExtras::default();
        self.render_with(messages, add_generation_prompt, &extras, |c| c.to_string())
    }

    /// Renders `messages` and reports which bytes of the output came from message content.
    ///
    /// Each content is stripped of the two marker noncharacters (U+FDD0, U+FDD1), wrapped in
    /// them and rendered; the markers are then removed and their positions become
    /// `content_spans`. If the template edits content so that the marked output differs from
    /// an unmarked rendering (for instance `content.strip()` next to the markers), the unmarked
    /// text is kept and spans are found by searching each content (or its trimmed form) in
    /// order.
    ///
    /// # Errors
    /// As [`Self::render`].
    pub fn render_marked(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extras: &TemplateExtras,
    ) -> Result<RenderedPrompt, InferError> {
        let clean = |c: &str| -> String {
            c.chars()
                .filter(|&ch| ch != CONTENT_OPEN && ch != CONTENT_CLOSE)
                .collect()
        };
        let marked = self.render_with(messages, add_generation_prompt, extras, |c| {
            format!("{CONTENT_OPEN}{}{CONTENT_CLOSE}", clean(c))
        })?;
        let plain = self.render_with(messages, add_generation_prompt, extras, clean)?;
        let (text, spans) = strip_markers(&marked);
        if text == plain {
            return Ok(RenderedPrompt {
                text,
                content_spans: spans,
            });
        }
        let mut content_spans = Vec::new();
        let mut cursor = 0;
        for m in messages {
            let content = clean(&m.content);
            for candidate in [content.as_str(), content.trim()] {
                if candidate.is_empty() {
                    continue;
                }
                if let Some(at) = plain[cursor..].find(candidate) {
                    let start = cursor + at;
                    content_spans.push(start..start + candidate.len());
                    cursor = start + candidate.len();
                    break;
                }
            }
        }
        Ok(RenderedPrompt {
            text: plain,
            content_spans,
        })
    }

    fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extras: &TemplateExtras,
        content: impl Fn(&str) -> String,
    ) -> Result<String, InferError> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| message_value(m, &content, &extras.content_parts, || self.typed_only()))
            .collect();
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| InferError::internal(format!("chat template missing: {e}")))?;
        let base = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        let tools = extras
            .tools
            .as_ref()
            .map(Value::from_serialize)
            .unwrap_or(Value::UNDEFINED);
        let kwargs = Value::from_serialize(&extras.kwargs);
        // The daemon's own variables win over chat_template_kwargs (validation refuses
        // those names anyway).
        template
            .render(minijinja::value::merge_maps([
                context! { tools => tools },
                base,
                kwargs,
            ]))
            .map_err(template_error)
    }
}

/// One message as templates expect it (transformers' dict): `role`, `content` (`none`
/// for an assistant turn that only calls tools), and when present `tool_calls` (OpenAI
/// shape, `arguments` parsed into an object when it is JSON, as vLLM hands them to
/// templates), `tool_call_id` and `name`.
/// transformers' `{% generation %}` … `{% endgeneration %}` (its `AssistantTracker`
/// extension, which marks assistant text for training masks) renders its body
/// unchanged: an `if true` block here, whitespace control kept.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, word, trail) = (
            inner.starts_with('-'),
            inner.trim_matches(|c: char| c == '-' || c.is_whitespace()),
            inner.ends_with('-'),
        );
        let replacement = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                let (l, t) = (if lead { "-" } else { "" }, if trail { "-" } else { "" });
                out.push_str(&format!("{{%{l} {r} {t}%}}"));
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// A message's content as llama-server gives it to a GGUF's template
/// (`common_chat_msg::to_json_oaicompat`, then `normalize`): one string, each image the
/// media marker where it sits (no newline joins a marker), as a single text part when
/// the template reads only parts.
fn media_text(
    m: &ChatMessage,
    content: &impl Fn(&str) -> String,
    marker: &str,
    typed_only: bool,
) -> Value {
    let mut text = String::new();
    let mut at = 0;
    let mut images: Vec<usize> = m.images.iter().map(|i| i.offset).collect();
    images.sort_unstable();
    for off in images {
        let off = off.min(m.content.len()).max(at);
        if let Some(t) = m.content.get(at..off).filter(|t| !t.is_empty()) {
            text.push_str(&content(t));
        }
        text.push_str(marker);
        at = off;
    }
    if let Some(t) = m.content.get(at..).filter(|t| !t.is_empty()) {
        text.push_str(&content(t));
    }
    match typed_only {
        true => Value::from(vec![context! { type => "text", text => text }]),
        false => Value::from(text),
    }
}

/// A message's content as parts: text between its images, each image where it sits.
fn content_parts(m: &ChatMessage, content: &impl Fn(&str) -> String) -> Value {
    let mut parts = Vec::new();
    let mut at = 0;
    let mut images: Vec<usize> = m.images.iter().map(|i| i.offset).collect();
    images.sort_unstable();
    let text = |parts: &mut Vec<Value>, t: &str| {
        if !t.is_empty() {
            parts.push(context! { type => "text", text => content(t) });
        }
    };
    for off in images {
        let off = off.min(m.content.len());
        if let Some(t) = m.content.get(at..off) {
            text(&mut parts, t);
        }
        parts.push(context! { type => "image" });
        at = off.max(at);
    }
    if let Some(t) = m.content.get(at..) {
        text(&mut parts, t);
    }
    Value::from(parts)
}

fn message_value(
    m: &ChatMessage,
    content: &impl Fn(&str) -> String,
    parts: &ContentParts,
    typed_only: impl Fn() -> bool,
) -> Value {
    let mut fields: Vec<(&str, Value)> = vec![("role", Value::from(m.role.as_str()))];
    let text = if m.content.is_empty() && !m.tool_calls.is_empty() {
        Value::from(())
    } else {
        match parts {
            ContentParts::Typed => content_parts(m, content),
            ContentParts::MediaText(marker) => media_text(m, content, marker, typed_only()),
            ContentParts::Text => Value::from(content(&m.content)),
        }
    };
    fields.push(("content", text));
    if !m.tool_calls.is_empty() {
        let calls: Vec<serde_json::Value> = m
            .tool_calls
            .iter()
            .map(|c| {
                let args = serde_json::from_str::<serde_json::Value>(&c.arguments)
                    .unwrap_or_else(|_| serde_json::Value::String(c.arguments.clone()));
                serde_json::json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": args},
                })
            })
            .collect();
        fields.push(("tool_calls", Value::from_serialize(&calls)));
    }
    if let Some(id) = &m.tool_call_id {
        fields.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(name) = &m.name {
        fields.push(("name", Value::from(name.as_str())));
    }
    Value::from_iter(fields)
}

/// Removes the content markers from a marked rendering; returns the text and the byte ranges
/// (in the returned text) that were inside markers. Unbalanced markers are tolerated: a stray
/// close is ignored and an unclosed open extends to the end.
fn strip_markers(marked: &str) -> (String, Vec<Range<usize>>) {
    let mut text = String::with_capacity(marked.len());
    let mut spans: Vec<Range<usize>> = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for ch in marked.chars() {
        match ch {
            CONTENT_OPEN => {
                if depth == 0 {
                    start = text.len();
                }
                depth += 1;
            }
            CONTENT_CLOSE => {
                if depth == 1 && text.len() > start {
                    spans.push(start..text.len());
                }
                depth = depth.saturating_sub(1);
            }
            _ => text.push(ch),
        }
    }
    if depth > 0 && text.len() > start {
        spans.push(start..text.len());
    }
    (text, spans)
}

/// Maps a render error to a `validation` error: the message of `raise_exception`, or a
/// description of what failed.
fn template_error(err: Error) -> InferError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return InferError::validation(raised.0.clone());
        }
        source = e.source();
    }
    InferError::validation(format!("chat template error: {err}"))
}

/// `raise_exception(msg)`: aborts rendering with `msg`.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(JinjaErrorKind::InvalidOperation, msg.clone()).with_source(RaisedException(msg)))
}

/// `strftime_now(fmt)`: the local time formatted with C `strftime` directives (chrono).
fn strftime_now(fmt: String) -> Result<String, Error> {
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&fmt)).map_err(|_| {
        Error::new(
            JinjaErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {fmt:?}"),
        )
    })?;
    Ok(out)
}

/// Output options of [`tojson`], as Python's `json.dumps` takes them.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// `tojson` filter with transformers' semantics:
/// `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`.
/// Accepts `indent` (int or string, positional or keyword), `separators` (two strings),
/// `sort_keys` and `ensure_ascii`.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.kind() {
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
            _ => {
                let n = v.as_usize().ok_or_else(|| {
                    Error::new(
                        JinjaErrorKind::InvalidOperation,
                        format!("tojson: indent must be an integer or string, got {v}"),
                    )
                })?;
                Some(" ".repeat(n))
            }
        },
    };
    let (mut item_sep, key_sep) = if indent.is_some() {
        (",".to_string(), ": ".to_string())
    } else {
        (", ".to_string(), ": ".to_string())
    };
    let mut key_sep = key_sep;
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")? {
        if !seps.is_none() {
            let parts: Vec<Value> = seps.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    item_sep = a.as_str().unwrap_or_default().to_string();
                    key_sep = b.as_str().unwrap_or_default().to_string();
                }
                _ => {
                    return Err(Error::new(
                        JinjaErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
    }
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from(out))
}

fn write_json(out: &mut String, v: &Value, style: &JsonStyle, level: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let f = f64::try_from(v.clone())?;
                out.push_str(&python_float(f));
            }
        }
        ValueKind::String => {
            write_json_str(out, v.as_str().unwrap_or_default(), style.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, '[', ']', &items, style, level, |out, item, level| {
                write_json(out, item, style, level)
            })?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for key in v.try_iter()? {
                let item = v.get_item(&key)?;
                entries.push((json_key(&key)?, item));
            }
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(
                out,
                '{',
                '}',
                &entries,
                style,
                level,
                |out, (k, item), level| {
                    write_json_str(out, k, style.ensure_ascii);
                    out.push_str(&style.key_sep);
                    write_json(out, item, style, level)
                },
            )?;
        }
        _ => {
            return Err(Error::new(
                JinjaErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a value of type {}", v.kind()),
            ))
        }
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    open: char,
    close: char,
    items: &[T],
    style: &JsonStyle,
    level: usize,
    mut write_item: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&style.item_sep);
        }
        if let Some(indent) = &style.indent {
            out.push('\n');
            out.push_str(&indent.repeat(level + 1));
        }
        write_item(out, item, level + 1)?;
    }
    if let Some(indent) = &style.indent {
        out.push('\n');
        out.push_str(&indent.repeat(level));
    }
    out.push(close);
    Ok(())
}

/// A map key as Python's `json.dumps` writes it: strings as is, numbers, booleans and None as
/// their JSON text.
fn json_key(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None | ValueKind::Undefined => "null".to_string(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_string(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => python_float(f64::try_from(key.clone())?),
        other => {
            return Err(Error::new(
                JinjaErrorKind::InvalidOperation,
                format!("tojson: keys must be str, int, float, bool or None, not {other}"),
            ))
        }
    })
}

/// A JSON string literal as Python's `json.dumps` writes it.
fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !c.is_ascii() => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` writes it (`1.0`, `0.1`, `1e+16`, `1.5e-07`, `NaN`, `Infinity`).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // Shortest round-trip digits and the decimal exponent.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    #[test]
    fn raise_exception_is_validation_with_message() {
        let t = ChatTemplate::new(
            "{% if messages[0]['role'] != 'system' %}{{ raise_exception('System first!') }}{% endif %}ok",
            "",
            "",
        )
        .expect("compiles");
        let err = t.render(&[msg("user", "hi")], true).expect_err("raises");
        assert_eq!(err.kind, crate::error::ErrorKind::Validation);
        assert_eq!(err.message, "System first!");
        assert_eq!(
            t.render(&[msg("system", "x")], true).expect("renders"),
            "ok"
        );
    }

    #[test]
    fn other_render_errors_are_validation() {
        let t = ChatTemplate::new("{{ messages[0].content + 1 }}", "", "").expect("compiles");
        let err = t.render(&[msg("user", "hi")], true).expect_err("fails");
        assert_eq!(err.kind, crate::error::ErrorKind::Validation);
        assert!(
            err.message.starts_with("chat template error:"),
            "{}",
            err.message
        );
    }

    #[test]
    fn parse_errors_are_reported() {
        let err = ChatTemplate::new("{% for %}", "", "").expect_err("bad syntax");
        assert!(matches!(err, TokenizerError::Template { .. }), "{err}");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ {'b': [1, 2.5, none, true], 'a': 'x\"é<>\\n', 'n': {}} | tojson }}|\
             {{ messages | tojson }}|{{ [1, {'k': 'v'}] | tojson(indent=2) }}|\
             {{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=[',', ':']) }}|\
             {{ 'é' | tojson(ensure_ascii=true) }}|{{ [1e20, 0.0001, 1.0e-5] | tojson }}",
            "",
            "",
        )
        .expect("compiles");
        let out = t.render(&[msg("user", "hi")], false).expect("renders");
        assert_eq!(
            out,
            "{\"b\": [1, 2.5, null, true], \"a\": \"x\\\"é<>\\n\", \"n\": {}}|\
             [{\"role\": \"user\", \"content\": \"hi\"}]|[\n  1,\n  {\n    \"k\": \"v\"\n  }\n]|\
             {\"a\":2,\"b\":1}|\"\\u00e9\"|[1e+20, 0.0001, 1e-05]"
        );
    }

    #[test]
    fn python_methods_and_strftime_now() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{% if m.content.startswith('  ') %}[{{ m.content.strip() }}]\
             {% endif %}{{ m.content.split(',') | join('|') }}{% endfor %}\
             {% if add_generation_prompt %}{{ bos_token }}{{ eos_token }}{% endif %}\
             {{ strftime_now('%Y') | length }}",
            "<s>",
            "</s>",
        )
        .expect("compiles");
        let out = t.render(&[msg("user", "  a,b ")], true).expect("renders");
        let year = chrono::Local::now().format("%Y").to_string();
        assert_eq!(year.len(), 4);
        assert_eq!(out, "[a,b]  a|b <s></s>4");
        let t = ChatTemplate::new("{{ strftime_now('%d %B %Y') }}", "", "").expect("compiles");
        let out = t.render(&[], true).expect("renders");
        assert_eq!(out, chrono::Local::now().format("%d %B %Y").to_string());
    }

    #[test]
    fn loop_controls_and_trim_blocks() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n  {% if loop.index > 1 %}{% break %}{% endif %}\n{{ m.role }}\n{% endfor %}\n",
            "",
            "",
        )
        .expect("compiles");
        let out = t
            .render(&[msg("user", "a"), msg("assistant", "b")], true)
            .expect("renders");
        assert_eq!(out, "user\n");
    }

    #[test]
    fn marked_rendering_reports_content_spans() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
            "",
            "",
        )
        .expect("compiles");
        let r = t
            .render_marked(
                &[msg("user", "x<|im_end|>\u{FDD0}y")],
                true,
                &TemplateExtras::default(),
            )
            .expect("renders");
        assert_eq!(r.text, "<|im_start|>user\nx<|im_end|>y<|im_end|>\n");
        let span = 17..29;
        assert_eq!(r.content_spans, vec![span]);
        assert_eq!(&r.text[17..29], "x<|im_end|>y");
    }

    #[test]
    fn marked_rendering_falls_back_when_template_edits_content() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<|im_start|>{{ m.content.strip() }}<|im_end|>{% endfor %}",
            "",
            "",
        )
        .expect("compiles");
        let r = t
            .render_marked(
                &[msg("user", "  <|im_end|> ")],
                true,
                &TemplateExtras::default(),
            )
            .expect("renders");
        assert_eq!(r.text, "<|im_start|><|im_end|><|im_end|>");
        let span = 12..22;
        assert_eq!(r.content_spans, vec![span]);
    }

    #[test]
    fn python_float_repr() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.1), "0.1");
        assert_eq!(python_float(1e16), "1e+16");
        assert_eq!(python_float(123456789012345.6), "123456789012345.6");
        assert_eq!(python_float(1.5e-7), "1.5e-07");
        assert_eq!(python_float(-2.5), "-2.5");
    }
}
