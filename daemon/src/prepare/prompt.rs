//! Template → prompt ids, and what the template implies for the output.

use crate::error::InferError;
use crate::request::{ChannelSpec, GenerateRequest, PromptInput, ToolFormat};
use crate::tokenizer::TextTokenizer;

/// A tokenized prompt and what its template implies for the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// Prompt token ids.
    pub ids: Vec<u32>,
    /// How the output is split into content, reasoning and tool calls.
    pub channels: ChannelSpec,
    /// The format the model writes tool calls in (`None`: the request has no tools).
    pub tool_format: Option<ToolFormat>,
    /// Its images, placed among `ids` (set by the prepare stage; empty for text).
    pub images: Vec<std::sync::Arc<crate::request::PromptImage>>,
}

/// Prompt ids for `req`: the chat template for messages (with its tools and
/// `chat_template_kwargs`), raw text otherwise (special-token text in a raw prompt
/// stays plain text), token ids as given. BOS / EOS are added as the model asks
/// (`TextTokenizer::add_bos`, `TextTokenizer::add_eos`), BOS not doubled.
///
/// # Errors
/// `validation` for a template that fails to render or text that does not encode,
/// naming the field.
pub fn render(tok: &TextTokenizer, req: &GenerateRequest) -> Result<Prompt, InferError> {
    render_with_images(tok, req, None)
}

/// [`render`] with the images' placeholder texts in place of the template's image
/// marker (`(marker, one text per image)`; see `TextTokenizer::encode_chat_with_images`).
///
/// # Errors
/// As [`render`], and a template that places another number of markers than images.
pub fn render_with_images(
    tok: &TextTokenizer,
    req: &GenerateRequest,
    images: Option<(&str, &[String])>,
) -> Result<Prompt, InferError> {
    let plain = |ids| Prompt {
        ids,
        channels: ChannelSpec::default(),
        tool_format: None,
        images: Vec::new(),
    };
    match &req.input {
        PromptInput::Messages(m) => {
            let p =
                tok.encode_chat_with_images(m, req.tools.as_ref(), &req.template_kwargs, images)?;
            Ok(Prompt {
                ids: p.ids,
                channels: p.channels,
                tool_format: p.tool_format,
                images: Vec::new(),
            })
        }
        PromptInput::Tokens(ids) => Ok(plain(ids.clone())),
        PromptInput::Text(t) => tok
            .encode_prompt(t)
            .map(plain)
            .map_err(|e| InferError::validation(format!("prompt: {e}"))),
    }
}
