//! Text → token ids and back for GGUF models, plus chat templates.
//!
//! [`TextTokenizer::from_gguf`] builds a byte-level BPE tokenizer from `tokenizer.ggml.*`
//! metadata ([`gguf`]) and tokenizes like llama.cpp (`llama-vocab.cpp`, release b11312):
//! special-token text is split out first ([`special`]), the remaining fragments go through a
//! Hugging Face [`tokenizers::Tokenizer`] that has no added tokens. Chat messages are rendered
//! with the model's Jinja template ([`chat_template`]); special-token text typed inside message
//! content stays plain text.

pub mod actor;
pub mod chat_template;
pub mod gguf;
pub mod special;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ops::Range;

use candle_core::quantized::gguf_file;

use crate::error::InferError;
use crate::request::ChatMessage;

pub use actor::TokenizerActor;
pub use chat_template::{ChatTemplate, RenderedPrompt};
pub use gguf::PreTokenizerKind;
pub use special::TokenType;

use gguf::{GgufVocab, Metadata};
use special::{DetectedRole, Fragment, SpecialTokens};

/// Why a tokenizer could not be built or could not encode.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required GGUF metadata key is absent.
    #[error("GGUF metadata key `{key}` is missing")]
    MissingKey {
        /// The key, e.g. `tokenizer.ggml.tokens`.
        key: String,
    },
    /// A metadata value has the wrong GGUF type.
    #[error("GGUF metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        /// The key (with `[index]` for an array element).
        key: String,
        /// The type this crate needs.
        expected: &'static str,
        /// The type found in the file.
        found: &'static str,
    },
    /// A metadata value names something this crate does not implement.
    #[error("GGUF metadata key `{key}` = {value:?} is not supported (supported: {supported})")]
    Unsupported {
        /// The key, e.g. `tokenizer.ggml.model`.
        key: String,
        /// The value found.
        value: String,
        /// What would be accepted.
        supported: String,
    },
    /// A metadata value is out of range or malformed.
    #[error("GGUF metadata key `{key}` = {value:?} is invalid: {reason}")]
    InvalidValue {
        /// The key (with `[index]` for an array element).
        key: String,
        /// The value found (or a summary of it).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The chat template does not compile.
    #[error("chat template does not compile: {message}")]
    Template {
        /// The template engine's message.
        message: String,
    },
    /// The Hugging Face tokenizer could not be built from the metadata.
    #[error("cannot build the tokenizer: {reason}")]
    Build {
        /// What failed.
        reason: String,
    },
    /// Encoding a text fragment failed inside the `tokenizers` crate.
    #[error("tokenization failed: {reason}")]
    Encode {
        /// The `tokenizers` error message.
        reason: String,
    },
}

/// A GGUF model's tokenizer: encode (with llama.cpp's special-token handling), decode to bytes,
/// special-token ids and the chat template. `Send + Sync`; every method takes `&self`.
#[derive(Debug)]
pub struct TextTokenizer {
    /// BPE model + pre-tokenizer + byte-level decoder, with no added tokens.
    bpe: tokenizers::Tokenizer,
    /// Token texts by id (GPT-2 byte-to-unicode alphabet for normal tokens).
    tokens: Vec<String>,
    /// Token types by id, after llama.cpp's text-based fix-ups.
    types: Vec<TokenType>,
    /// Concatenated [`Self::token_bytes`] of every token.
    bytes: Vec<u8>,
    /// `bytes[offsets[id]..offsets[id + 1]]` is token `id`'s bytes.
    offsets: Vec<usize>,
    /// Control, user-defined and unknown tokens, longest text first.
    special: SpecialTokens,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    chat_template: Option<ChatTemplate>,
}

impl TextTokenizer {
    /// Builds the tokenizer from GGUF metadata.
    ///
    /// Required: `tokenizer.ggml.model` (must be `gpt2`), `tokenizer.ggml.pre` (see
    /// [`PreTokenizerKind`]), `tokenizer.ggml.tokens`, `tokenizer.ggml.token_type`,
    /// `tokenizer.ggml.merges`. Optional: `tokenizer.ggml.{bos,eos,eot,eom}_token_id`, the FIM
    /// token ids, `tokenizer.ggml.add_bos_token` (default false) and `tokenizer.chat_template`.
    ///
    /// # Errors
    /// A [`TokenizerError`] naming the key and value that is missing, mistyped, out of range
    /// or unsupported, or the template's compile error.
    pub fn from_gguf(metadata: &HashMap<String, gguf_file::Value>) -> Result<Self, TokenizerError> {
        let md: &Metadata = metadata;
        let vocab = GgufVocab::read(md)?;
        let bpe = vocab.build_tokenizer()?;
        let n = vocab.tokens.len();
        let bos = gguf::optional_token_id(md, gguf::KEY_BOS, n)?;
        let eos = gguf::optional_token_id(md, gguf::KEY_EOS, n)?;
        let add_bos = gguf::optional_bool(md, gguf::KEY_ADD_BOS)?.unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingKey {
                key: format!(
                    "{} (required because {} is true)",
                    gguf::KEY_BOS,
                    gguf::KEY_ADD_BOS
                ),
            });
        }
        let mut role_ids = Vec::with_capacity(DetectedRole::ALL.len());
        for role in DetectedRole::ALL {
            let mut id = None;
            for key in role.metadata_keys() {
                if id.is_none() {
                    id = gguf::optional_token_id(md, key, n)?;
                }
            }
            role_ids.push((role, id));
        }

        let mut types: Vec<TokenType> = vocab
            .token_types
            .iter()
            .map(|&t| TokenType::from_gguf(t))
            .collect();
        let eog = special::apply_fixups_and_eog(&vocab.tokens, &mut types, &role_ids, eos);
        let special = SpecialTokens::new(&vocab.tokens, &types);

        let byte_of = gguf::unicode_to_byte();
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for (text, ty) in vocab.tokens.iter().zip(&types) {
            match ty {
                TokenType::Normal => {
                    for ch in text.chars() {
                        match byte_of.get(&ch) {
                            Some(b) => bytes.push(*b),
                            // Not in GPT-2's alphabet: keep the char's own UTF-8 bytes.
                            None => bytes.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                }
                TokenType::UserDefined => bytes.extend_from_slice(text.as_bytes()),
                _ => {}
            }
            offsets.push(bytes.len());
        }

        let text_of = |id: Option<u32>| {
            id.and_then(|i| vocab.tokens.get(i as usize))
                .cloned()
                .unwrap_or_default()
        };
        let chat_template = match gguf::optional_str(md, gguf::KEY_CHAT_TEMPLATE)? {
            Some(source) => Some(ChatTemplate::new(source, text_of(bos), text_of(eos))?),
            None => None,
        };

        Ok(Self {
            bpe,
            tokens: vocab.tokens,
            types,
            bytes,
            offsets,
            special,
            bos,
            eos,
            eog,
            add_bos,
            chat_template,
        })
    }

    /// Token ids for `text`, never with BOS.
    ///
    /// With `parse_special`, control-token text (`<|im_start|>`) becomes that token; without
    /// it, such text is encoded as ordinary BPE tokens. User-defined tokens are always matched.
    ///
    /// # Errors
    /// [`TokenizerError::Encode`] if the BPE model fails on a fragment.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with_plain_spans(text, parse_special, &[])
    }

    /// Like [`Self::encode`] with `parse_special = true`, except that control tokens never
    /// match where they would overlap one of the byte ranges in `plain` (sorted,
    /// non-overlapping). Text is otherwise partitioned and BPE-encoded exactly as the whole
    /// string would be.
    ///
    /// # Errors
    /// As [`Self::encode`].
    pub fn encode_with_plain_spans(
        &self,
        text: &str,
        parse_special: bool,
        plain: &[Range<usize>],
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        for fragment in self.special.partition(text, parse_special, plain) {
            match fragment {
                Fragment::Token(id) => ids.push(id),
                Fragment::Text(range) => {
                    let encoding = self.bpe.encode(&text[range], false).map_err(|e| {
                        TokenizerError::Encode {
                            reason: e.to_string(),
                        }
                    })?;
                    ids.extend_from_slice(encoding.get_ids());
                }
            }
        }
        Ok(ids)
    }

    /// Renders the chat template with `add_generation_prompt = true` and tokenizes the result:
    /// template text parses special tokens, message content never does (see
    /// [`ChatTemplate::render_marked`]). BOS is prepended only when
    /// [`Self::add_bos`] is true and the prompt does not already start with it.
    ///
    /// Returns the rendered prompt (without BOS text) and its token ids.
    ///
    /// # Errors
    /// `validation` when the model has no chat template or the template fails (the template's
    /// own message for `raise_exception`); `internal` when encoding fails.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<(String, Vec<u32>), InferError> {
        let template = self.chat_template.as_ref().ok_or_else(|| {
            InferError::validation(format!(
                "this model has no chat template (`{}`); send a raw prompt instead",
                gguf::KEY_CHAT_TEMPLATE
            ))
        })?;
        let rendered = template.render_marked(messages, true)?;
        let mut ids = self
            .encode_with_plain_spans(&rendered.text, true, &rendered.content_spans)
            .map_err(|e| InferError::internal(e.to_string()))?;
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok((rendered.text, ids))
    }

    /// The model's chat template, if the GGUF file has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Raw bytes of token `id` as it appears in generated text: byte-level BPE tokens mapped
    /// back from GPT-2's alphabet, user-defined tokens as their text, control/unknown/unused
    /// tokens and out-of-range ids as an empty slice (llama.cpp `token_to_piece` with
    /// `special = false`). A token may hold part of a UTF-8 sequence.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.bytes[a..b],
            _ => &[],
        }
    }

    /// Like [`Self::token_bytes`], but control and unknown tokens give their text
    /// (llama.cpp `token_to_piece` with `special = true`, what `/tokenize` returns as pieces).
    pub fn token_piece(&self, id: u32) -> &[u8] {
        match self.types.get(id as usize) {
            Some(t) if t.needs_parse_special() => {
                self.tokens.get(id as usize).map_or(&[], |s| s.as_bytes())
            }
            _ => self.token_bytes(id),
        }
    }

    /// The vocabulary text of token `id` (GPT-2 byte-to-unicode alphabet for normal tokens),
    /// `None` when out of range.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Type of token `id` after llama.cpp's fix-ups, `None` when out of range.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Lossy UTF-8 decoding of the concatenated [`Self::token_bytes`] (control tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut buf = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            buf.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Number of tokens in the vocabulary (`tokenizer.ggml.tokens` length).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// `tokenizer.ggml.bos_token_id`, if present.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id`, if present.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-generation ids (sorted, unique), as llama.cpp's `special_eog_ids`: EOS, EOT/EOM
    /// (metadata or detected by text), the FIM pad/repo/file-separator tokens, and tokens whose
    /// text is a known end marker (`<|im_end|>`, `<|eot_id|>`, `<|end|>`, `<end_of_turn>`,
    /// `<|endoftext|>`, ...; `</s>` when it is a control token).
    pub fn eog_token_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether generating `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Whether `id` is a control token (after llama.cpp's fix-ups); false when out of range.
    pub fn is_control(&self, id: u32) -> bool {
        self.types.get(id as usize) == Some(&TokenType::Control)
    }

    /// `tokenizer.ggml.add_bos_token` (false when absent): whether prompts start with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The underlying Hugging Face tokenizer (BPE + pre-tokenizer + byte-level decoder). It has
    /// no added tokens: it encodes special-token text as plain text.
    pub fn hf_tokenizer(&self) -> &tokenizers::Tokenizer {
        &self.bpe
    }
}
