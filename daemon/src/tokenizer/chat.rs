//! Chat requests: the template rendered with the request's tools and
//! `chat_template_kwargs`, tokenized, and the output channels the template implies
//! (reasoning, the tool-call format).

use super::chat_template::TemplateExtras;
use super::tool_prompt::{fallback_messages, tools_value};
use super::TextTokenizer;
use crate::error::InferError;
use crate::request::channels::{
    ChannelSpec, ReasoningStart, ToolFormat, HERMES_CLOSE, HERMES_OPEN, THINK_CLOSE, THINK_OPEN,
};
use crate::request::{ChatMessage, ToolOptions};

/// Marker texts the output parsers look for; those that are one control token in a
/// vocabulary are fed to the parsers by id (control tokens add no text otherwise).
const MARKERS: &[&str] = &[
    THINK_OPEN,
    THINK_CLOSE,
    HERMES_OPEN,
    HERMES_CLOSE,
    "[TOOL_CALLS]",
    "<|python_tag|>",
];

/// A rendered and tokenized chat prompt.
#[derive(Debug, Clone)]
pub struct ChatPrompt {
    /// The rendered text (without BOS text).
    pub text: String,
    /// Its token ids (BOS / EOS as the model asks).
    pub ids: Vec<u32>,
    /// How the output is split (reasoning, tool calls).
    pub channels: ChannelSpec,
    /// The tool-call format the output is parsed in (`None` without active tools).
    pub tool_format: Option<ToolFormat>,
}

impl TextTokenizer {
    /// Renders the chat template with `add_generation_prompt = true` and tokenizes the
    /// result: template text parses special tokens, message content never does (see
    /// [`super::ChatTemplate::render_marked`]). BOS is prepended only when
    /// [`Self::add_bos`] is true and the prompt does not already start with it; EOS is
    /// appended when [`Self::add_eos`].
    ///
    /// Returns the rendered prompt (without BOS text) and its token ids.
    ///
    /// # Errors
    /// `validation` when the model has no chat template or the template fails (the
    /// template's own message for `raise_exception`); `internal` when encoding fails.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<(String, Vec<u32>), InferError> {
        let p = self.encode_chat_request(messages, None, &serde_json::Map::new())?;
        Ok((p.text, p.ids))
    }

    /// [`Self::encode_chat`] for a whole chat request: active `tools` go to the
    /// template's `tools` variable when the template renders tools (it mentions
    /// `tools`), else into a Hermes-style system message
    /// ([`super::tool_prompt::fallback_messages`]); `kwargs` become template
    /// variables. The output channels follow the template: reasoning when it mentions
    /// `<think>`, tool calls in the format it writes ([`ToolFormat::of_template`]).
    ///
    /// # Errors
    /// As [`Self::encode_chat`].
    pub fn encode_chat_request(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ToolOptions>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<ChatPrompt, InferError> {
        self.encode_chat_with_images(messages, tools, kwargs, None)
    }

    /// [`Self::encode_chat_request`] for a prompt with images: each occurrence of the
    /// template's image `marker` outside message content becomes the next of
    /// `expansions` (a vision-language processor's placeholder text) before the prompt
    /// is encoded, as transformers' processors replace it in the rendered text.
    ///
    /// # Errors
    /// As [`Self::encode_chat`]; `validation` when the template places another number
    /// of markers than there are images.
    pub fn encode_chat_with_images(
        &self,
        messages: &[ChatMessage],
        tools: Option<&ToolOptions>,
        kwargs: &serde_json::Map<String, serde_json::Value>,
        images: Option<(&str, &[String])>,
    ) -> Result<ChatPrompt, InferError> {
        let custom = self.template_override.read().ok().and_then(|g| g.clone());
        let template = custom
            .as_deref()
            .or(self.chat_template.as_ref())
            .ok_or_else(|| {
                InferError::validation(
                    "this model has no chat template (GGUF `tokenizer.chat_template`, or \
                 chat_template.jinja / `chat_template` in tokenizer_config.json): send a raw \
                 prompt (`prompt`, or /v1/completions), or give the daemon a Jinja template \
                 file with model.chat_template",
                )
            })?;
        let (format, native) = ToolFormat::of_template(template.source());
        let active = tools.filter(|t| t.active());
        let history_has_tools = messages
            .iter()
            .any(|m| m.role == "tool" || !m.tool_calls.is_empty());
        let mut extras = TemplateExtras {
            tools: None,
            kwargs: kwargs.clone(),
            content_parts: self.content_parts.clone(),
        };
        let rewritten;
        let messages = if native {
            extras.tools = active.map(|t| tools_value(&t.tools));
            messages
        } else if active.is_some() || history_has_tools {
            rewritten = fallback_messages(messages, active.map_or(&[][..], |t| &t.tools));
            &rewritten
        } else {
            messages
        };
        let mut rendered = template.render_marked(messages, true, &extras)?;
        if let Some((marker, expansions)) = images {
            rendered = expand_markers(rendered, marker, expansions)?;
        }
        let mut ids = self
            .encode_with_plain_spans(&rendered.text, true, &rendered.content_spans)
            .map_err(|e| InferError::internal(e.to_string()))?;
        self.add_special_ids(&mut ids);
        let reasoning = template
            .source()
            .contains(THINK_OPEN)
            .then(|| ReasoningStart::of_prompt(&rendered.text));
        let tool_format = active.map(|_| format);
        let channels = ChannelSpec {
            reasoning,
            tools: active.map(|t| (format, t.parallel)),
            markers: self.marker_tokens(),
        };
        Ok(ChatPrompt {
            text: rendered.text,
            ids,
            channels,
            tool_format,
        })
    }

    /// The [`MARKERS`] that are a single control token of this vocabulary.
    fn marker_tokens(&self) -> Vec<(u32, String)> {
        MARKERS
            .iter()
            .filter_map(|m| match self.encode(m, true).ok()?.as_slice() {
                [id] if self.is_control(*id) => Some((*id, (*m).to_string())),
                _ => None,
            })
            .collect()
    }
}

/// `rendered` with each `marker` outside its content spans replaced by the next of
/// `expansions`, the spans moved with the text.
fn expand_markers(
    rendered: crate::tokenizer::RenderedPrompt,
    marker: &str,
    expansions: &[String],
) -> Result<crate::tokenizer::RenderedPrompt, InferError> {
    let text = &rendered.text;
    let inside = |at: usize| rendered.content_spans.iter().any(|s| s.contains(&at));
    let mut at_list = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find(marker) {
        let at = from + i;
        if !inside(at) {
            at_list.push(at);
        }
        from = at + marker.len().max(1);
    }
    if at_list.len() != expansions.len() {
        return Err(InferError::validation(format!(
            "messages: the chat template placed {} image markers ({marker:?}) for {} images",
            at_list.len(),
            expansions.len()
        )));
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    // (position in the old text, length change) at each replacement.
    let mut shifts: Vec<(usize, isize)> = Vec::new();
    for (&at, e) in at_list.iter().zip(expansions) {
        out.push_str(&text[last..at]);
        out.push_str(e);
        last = at + marker.len();
        shifts.push((at, e.len() as isize - marker.len() as isize));
    }
    out.push_str(&text[last..]);
    let moved = |p: usize| -> usize {
        let d: isize = shifts.iter().filter(|(a, _)| *a < p).map(|(_, d)| d).sum();
        (p as isize + d) as usize
    };
    let content_spans = rendered
        .content_spans
        .iter()
        .map(|s| moved(s.start)..moved(s.end))
        .collect();
    Ok(crate::tokenizer::RenderedPrompt {
        text: out,
        content_spans,
    })
}
