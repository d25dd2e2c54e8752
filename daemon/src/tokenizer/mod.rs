//! Text → token ids and back, plus chat templates, for GGUF models and Hugging Face
//! directories.
//!
//! [`TextTokenizer::from_gguf`] builds the tokenizer from `tokenizer.ggml.*` metadata and
//! tokenizes like llama.cpp (`src/llama-vocab.cpp`, release b11312): special-token text is split
//! out first ([`special`], llama.cpp `tokenizer_st_partition`), the remaining fragments go
//! through byte-level BPE (`gpt2`: a Hugging Face [`tokenizers::Tokenizer`] that has no added
//! tokens, [`gguf`]) or SentencePiece BPE (`llama`: [`spm`], llama.cpp `llm_tokenizer_spm`).
//! [`TextTokenizer::from_hf_dir`] uses a Hugging Face directory's `tokenizer.json` as is, with
//! `tokenizer_config.json` and `generation_config.json` ([`hf`], [`hf_config`]).
//! Chat messages are rendered with the model's Jinja template ([`chat_template`]);
//! special-token text typed inside message content stays plain text.
//!
//! Pure: no actor and no address. The prepare stage (`prepare/`) calls it on its pool.

mod chat;
pub mod chat_template;
pub mod gguf;
pub mod hf;
pub mod hf_config;
mod hf_decode;
pub mod special;
pub mod spm;
pub mod tool_prompt;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_gemma3;
#[cfg(test)]
mod tests_hf;
#[cfg(test)]
mod tests_media_text;
#[cfg(test)]
mod tests_spm;

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use candle_core::quantized::gguf_file;

pub use chat::ChatPrompt;
pub use chat_template::{ChatTemplate, ContentParts, RenderedPrompt, TemplateExtras};
pub use gguf::PreTokenizerKind;
pub use hf_config::GenerationDefaults;
pub use special::TokenType;

use gguf::{GgufVocab, Metadata};
use special::{DetectedRole, Fragment, SpecialTokens};
use spm::{SpmModel, SpmVocab};

/// Longest excerpt of a file or metadata value quoted in an error message, in characters.
pub const QUOTE_MAX_CHARS: usize = 200;

/// `s` cut to [`QUOTE_MAX_CHARS`] characters (with `…` when cut), not escaped.
pub(crate) fn cut(s: &str) -> String {
    match s.char_indices().nth(QUOTE_MAX_CHARS) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

/// `s` cut to [`QUOTE_MAX_CHARS`] characters and quoted with escapes (Rust `{:?}` style), so a
/// value from a file never breaks an error message or a log line.
pub(crate) fn quote(s: &str) -> String {
    format!("{:?}", cut(s))
}

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
    #[error(
        "GGUF metadata key `{key}` = {:?} is not supported (supported: {supported})",
        cut(value)
    )]
    Unsupported {
        /// The key, e.g. `tokenizer.ggml.model`.
        key: String,
        /// The value found.
        value: String,
        /// What would be accepted.
        supported: String,
    },
    /// A metadata value is out of range or malformed.
    #[error("GGUF metadata key `{key}` = {:?} is invalid: {reason}", cut(value))]
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
    /// Encoding a text fragment failed (inside the `tokenizers` crate, or a missing byte
    /// token in SentencePiece byte fallback).
    #[error("tokenization failed: {reason}")]
    Encode {
        /// What failed.
        reason: String,
    },
    /// A file of a Hugging Face tokenizer directory is unreadable or holds a bad value.
    #[error("{}: {}{reason}", file, key_prefix(key))]
    HfFile {
        /// The file's path.
        file: String,
        /// The JSON key (dotted path, e.g. `added_tokens_decoder.5.content`); empty when the
        /// whole file is at fault.
        key: String,
        /// What is wrong, with any quoted value cut to [`QUOTE_MAX_CHARS`] and escaped.
        reason: String,
    },
}

fn key_prefix(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("key `{key}`: ")
    }
}

/// How text fragments between special tokens become ids.
#[derive(Debug)]
enum Backend {
    /// GGUF `gpt2`: byte-level BPE (a `tokenizers` BPE model + pre-tokenizer, no added tokens).
    Bpe(Box<tokenizers::Tokenizer>),
    /// GGUF `llama`: SentencePiece BPE (llama.cpp `llm_tokenizer_spm`).
    Spm {
        /// The merge model.
        model: Box<SpmModel>,
        /// `tokenizer.ggml.add_space_prefix`.
        add_space_prefix: bool,
    },
    /// A Hugging Face `tokenizer.json`, used as is.
    Hf(Box<hf::HfBackend>),
}

impl Backend {
    /// Appends the ids of `text[range]`, a fragment between special tokens; `after_special`
    /// is true for the first fragment and for one that follows a special token.
    fn encode_fragment(
        &self,
        text: &str,
        range: Range<usize>,
        after_special: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        match self {
            Backend::Bpe(bpe) => {
                let encoding =
                    bpe.encode(&text[range], false)
                        .map_err(|e| TokenizerError::Encode {
                            reason: e.to_string(),
                        })?;
                out.extend_from_slice(encoding.get_ids());
                Ok(())
            }
            Backend::Spm {
                model,
                add_space_prefix,
            } => model.encode(&text[range], *add_space_prefix && after_special, out),
            Backend::Hf(hf) => hf.encode_fragment(text, range, out),
        }
    }
}

/// What every constructor gathers before [`TextTokenizer::assemble`].
struct Parts {
    backend: Backend,
    tokens: Vec<String>,
    types: Vec<TokenType>,
    /// Bytes of each token ([`TextTokenizer::token_bytes`]), by id.
    token_bytes: Vec<Vec<u8>>,
    special: SpecialTokens,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<ChatTemplate>,
    generation: GenerationDefaults,
}

/// A model's tokenizer: encode (with llama.cpp's special-token handling), decode to bytes,
/// special-token ids and the chat template. `Send + Sync`; every method takes `&self`.
#[derive(Debug)]
pub struct TextTokenizer {
    backend: Backend,
    /// Token texts by id (GPT-2 byte-to-unicode alphabet for byte-level BPE tokens, `▁` for
    /// spaces in SentencePiece tokens).
    tokens: Vec<String>,
    /// Token types by id, after llama.cpp's text-based fix-ups (GGUF) or from the added
    /// tokens (Hugging Face).
    types: Vec<TokenType>,
    /// Concatenated [`Self::token_bytes`] of every token.
    bytes: Vec<u8>,
    /// `bytes[offsets[id]..offsets[id + 1]]` is token `id`'s bytes.
    offsets: Vec<usize>,
    /// Tokens split out before the backend runs, longest text first.
    special: SpecialTokens,
    bos: Option<u32>,
    eos: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<ChatTemplate>,
    /// The operator's template (`model.chat_template`), used instead of the model's;
    /// replaced on SIGHUP.
    template_override: std::sync::RwLock<Option<std::sync::Arc<ChatTemplate>>>,
    generation: GenerationDefaults,
    /// How messages' content reaches the template ([`TemplateExtras::content_parts`]).
    content_parts: ContentParts,
}

impl TextTokenizer {
    /// Builds the tokenizer from GGUF metadata; `tokenizer.ggml.model` picks the family.
    ///
    /// * `gpt2` (byte-level BPE), required: `tokenizer.ggml.pre` (see [`PreTokenizerKind`]),
    ///   `tokenizer.ggml.tokens`, `tokenizer.ggml.token_type`, `tokenizer.ggml.merges`.
    ///   `tokenizer.ggml.add_bos_token` defaults to false.
    /// * `llama` (SentencePiece BPE, [`spm`]), required: `tokenizer.ggml.tokens`,
    ///   `tokenizer.ggml.scores`, `tokenizer.ggml.token_type`; `tokenizer.ggml.pre` is ignored.
    ///   Defaults as llama.cpp's `llama_vocab::impl::load` for `LLAMA_VOCAB_TYPE_SPM`:
    ///   `tokenizer.ggml.add_space_prefix` true, `add_bos_token` true, `add_eos_token` false,
    ///   BOS id 1 and EOS id 2 when their keys are absent (and the ids exist).
    ///
    /// Optional for both: `tokenizer.ggml.{bos,eos,eot,eom}_token_id`, the FIM token ids,
    /// `tokenizer.ggml.add_eos_token` (default false) and `tokenizer.chat_template`.
    ///
    /// # Errors
    /// A [`TokenizerError`] naming the key and value that is missing, mistyped, out of range
    /// or unsupported, or the template's compile error.
    pub fn from_gguf(metadata: &HashMap<String, gguf_file::Value>) -> Result<Self, TokenizerError> {
        let md: &Metadata = metadata;
        let model = gguf::required_str(md, gguf::KEY_MODEL)?;
        let parts = match model {
            "gpt2" => Self::gguf_bpe_parts(md)?,
            "llama" => Self::gguf_spm_parts(md)?,
            other => {
                return Err(TokenizerError::Unsupported {
                    key: gguf::KEY_MODEL.to_string(),
                    value: other.to_string(),
                    supported: "gpt2 (byte-level BPE), llama (SentencePiece BPE)".to_string(),
                })
            }
        };
        Ok(Self::assemble(parts))
    }

    /// Builds the tokenizer from a Hugging Face model directory: `tokenizer.json` (required,
    /// used as is), `tokenizer_config.json` (optional: chat template, BOS/EOS, `add_bos_token`,
    /// `added_tokens_decoder`), `chat_template.jinja` / `chat_template.json` (optional) and
    /// `generation_config.json` (optional: EOS ids and [`GenerationDefaults`]). See [`hf`].
    ///
    /// # Errors
    /// [`TokenizerError::HfFile`] naming the file and key of the first bad value.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TokenizerError> {
        hf::load(dir).map(Self::assemble)
    }

    /// The `gpt2` pieces: vocabulary, BPE model, bytes from GPT-2's alphabet.
    fn gguf_bpe_parts(md: &Metadata) -> Result<Parts, TokenizerError> {
        let vocab = GgufVocab::read(md)?;
        let bpe = vocab.build_tokenizer()?;
        let byte_of = gguf::unicode_to_byte();
        Self::gguf_parts(
            md,
            vocab.tokens,
            &vocab.token_types,
            Backend::Bpe(Box::new(bpe)),
            false,
            |_, text, ty| {
                Ok(match ty {
                    TokenType::Normal => {
                        let mut bytes = Vec::with_capacity(text.len());
                        for ch in text.chars() {
                            match byte_of.get(&ch) {
                                Some(b) => bytes.push(*b),
                                // Not in GPT-2's alphabet: keep the char's own UTF-8 bytes.
                                None => {
                                    bytes.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes())
                                }
                            }
                        }
                        bytes
                    }
                    TokenType::UserDefined => text.as_bytes().to_vec(),
                    _ => Vec::new(),
                })
            },
        )
    }

    /// The `llama` pieces: vocabulary with scores, the SPM model, `▁`-unescaped bytes.
    fn gguf_spm_parts(md: &Metadata) -> Result<Parts, TokenizerError> {
        let vocab = SpmVocab::read(md)?;
        let add_space_prefix = gguf::optional_bool(md, spm::KEY_ADD_SPACE_PREFIX)?.unwrap_or(true);
        let model = SpmModel::new(&vocab.tokens, vocab.scores);
        Self::gguf_parts(
            md,
            vocab.tokens,
            &vocab.token_types,
            Backend::Spm {
                model: Box::new(model),
                add_space_prefix,
            },
            true,
            spm::token_bytes,
        )
    }

    /// Special ids, fix-ups, EOG set, token bytes and chat template, shared by both GGUF
    /// families; `spm` selects llama.cpp's SPM defaults.
    fn gguf_parts(
        md: &Metadata,
        tokens: Vec<String>,
        raw_types: &[i64],
        backend: Backend,
        spm: bool,
        bytes_of: impl Fn(usize, &str, TokenType) -> Result<Vec<u8>, TokenizerError>,
    ) -> Result<Parts, TokenizerError> {
        let n = tokens.len();
        let default_id = |id: u32| Some(id).filter(|&i| spm && (i as usize) < n);
        let bos = gguf::optional_token_id(md, gguf::KEY_BOS, n)?.or_else(|| default_id(1));
        let eos = gguf::optional_token_id(md, gguf::KEY_EOS, n)?.or_else(|| default_id(2));
        let add_bos = gguf::optional_bool(md, gguf::KEY_ADD_BOS)?.unwrap_or(spm);
        let add_eos = gguf::optional_bool(md, spm::KEY_ADD_EOS)?.unwrap_or(false);
        for (flag, id, flag_key, id_key) in [
            (add_bos, bos, gguf::KEY_ADD_BOS, gguf::KEY_BOS),
            (add_eos, eos, spm::KEY_ADD_EOS, gguf::KEY_EOS),
        ] {
            if flag && id.is_none() {
                return Err(TokenizerError::MissingKey {
                    key: format!("{id_key} (required because {flag_key} is true)"),
                });
            }
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

        let mut types: Vec<TokenType> =
            raw_types.iter().map(|&t| TokenType::from_gguf(t)).collect();
        let eog = special::apply_fixups_and_eog(&tokens, &mut types, &role_ids, eos);
        let special = SpecialTokens::new(&tokens, &types);
        let token_bytes = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .map(|(i, (text, ty))| bytes_of(i, text, *ty))
            .collect::<Result<Vec<_>, _>>()?;

        let text_of = |id: Option<u32>| {
            id.and_then(|i| tokens.get(i as usize))
                .cloned()
                .unwrap_or_default()
        };
        let chat_template = match gguf::optional_str(md, gguf::KEY_CHAT_TEMPLATE)? {
            Some(source) => Some(ChatTemplate::new(source, text_of(bos), text_of(eos))?),
            None => None,
        };
        Ok(Parts {
            backend,
            tokens,
            types,
            token_bytes,
            special,
            bos,
            eos,
            eog,
            add_bos,
            add_eos,
            chat_template,
            generation: GenerationDefaults::default(),
        })
    }

    fn assemble(parts: Parts) -> Self {
        let total = parts.token_bytes.iter().map(Vec::len).sum();
        let mut bytes = Vec::with_capacity(total);
        let mut offsets = Vec::with_capacity(parts.token_bytes.len() + 1);
        offsets.push(0);
        for b in &parts.token_bytes {
            bytes.extend_from_slice(b);
            offsets.push(bytes.len());
        }
        Self {
            backend: parts.backend,
            tokens: parts.tokens,
            types: parts.types,
            bytes,
            offsets,
            special: parts.special,
            bos: parts.bos,
            eos: parts.eos,
            eog: parts.eog,
            add_bos: parts.add_bos,
            add_eos: parts.add_eos,
            chat_template: parts.chat_template,
            template_override: std::sync::RwLock::new(None),
            generation: parts.generation,
            content_parts: ContentParts::Text,
        }
    }

    /// How messages' content reaches the chat template: a string, or a list of parts
    /// for a vision-language model's template ([`ContentParts`]).
    pub fn set_content_parts(&mut self, parts: ContentParts) {
        self.content_parts = parts;
    }

    /// Token ids for `text`, never with BOS or EOS (llama.cpp `tokenize` with
    /// `add_special = false`).
    ///
    /// With `parse_special`, control-token text (`<|im_start|>`) becomes that token; without
    /// it, such text is encoded as ordinary text. User-defined tokens are always matched
    /// (Hugging Face: non-special added tokens).
    ///
    /// # Errors
    /// [`TokenizerError::Encode`] if the backend fails on a fragment.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_with_plain_spans(text, parse_special, &[])
    }

    /// A raw prompt as llama.cpp's server tokenizes it (`add_special = true`,
    /// `parse_special = false`): BOS first when [`Self::add_bos`] (not doubled when the ids
    /// already start with it), EOS last when [`Self::add_eos`].
    ///
    /// # Errors
    /// As [`Self::encode`].
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = self.encode(text, false)?;
        self.add_special_ids(&mut ids);
        Ok(ids)
    }

    /// Like [`Self::encode`] with `parse_special = true`, except that control tokens never
    /// match where they would overlap one of the byte ranges in `plain` (sorted,
    /// non-overlapping). Text is otherwise partitioned and encoded exactly as the whole
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
        // llama.cpp SPM: `is_prev_special` starts true, so the first fragment gets the prefix.
        let mut after_special = true;
        for fragment in self.special.partition(text, parse_special, plain) {
            match fragment {
                Fragment::Token(id) => {
                    ids.push(id);
                    after_special = true;
                }
                Fragment::Text(range) => {
                    self.backend
                        .encode_fragment(text, range, after_special, &mut ids)?;
                    after_special = false;
                }
            }
        }
        Ok(ids)
    }

    /// BOS first when [`Self::add_bos`] and absent, EOS last when [`Self::add_eos`].
    fn add_special_ids(&self, ids: &mut Vec<u32>) {
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        if let (true, Some(eos)) = (self.add_eos, self.eos) {
            ids.push(eos);
        }
    }

    /// The model's own chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Compiles `source` as a chat template with this tokenizer's BOS and EOS texts.
    ///
    /// # Errors
    /// [`TokenizerError::Template`] when it does not compile.
    pub fn compile_template(&self, source: &str) -> Result<ChatTemplate, TokenizerError> {
        let text = |id: Option<u32>| {
            id.and_then(|i| self.tokens.get(i as usize))
                .cloned()
                .unwrap_or_default()
        };
        ChatTemplate::new(source, text(self.bos), text(self.eos))
    }

    /// Uses `template` instead of the model's for chat requests from now on (`None`: the
    /// model's again). Requests already tokenized are not affected.
    pub fn set_template_override(&self, template: Option<ChatTemplate>) {
        if let Ok(mut g) = self.template_override.write() {
            *g = template.map(std::sync::Arc::new);
        }
    }

    /// Raw bytes of token `id` as it appears in generated text (llama.cpp `token_to_piece`
    /// with `special = false`, no `lstrip`): byte-level BPE tokens mapped back from GPT-2's
    /// alphabet; SentencePiece tokens with `▁` as a space and `<0xNN>` byte tokens as that
    /// byte; Hugging Face tokens through the `tokenizer.json` decoder's per-token steps;
    /// user-defined tokens as their text; control/unknown/unused tokens and out-of-range ids as
    /// an empty slice. A token may hold part of a UTF-8 sequence.
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

    /// The vocabulary text of token `id` (GPT-2 byte-to-unicode alphabet for byte-level BPE
    /// tokens, `▁` for spaces in SentencePiece tokens), `None` when out of range.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Type of token `id` after llama.cpp's fix-ups, `None` when out of range.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Lossy UTF-8 decoding of the concatenated [`Self::token_bytes`] (control tokens skipped),
    /// with the start of the text treated as the model's decoder treats it: llama.cpp
    /// `llama_detokenize` (`remove_special = false`) drops one leading space of the first
    /// token when `add_space_prefix` is set (so a BOS first keeps it); a Hugging Face
    /// `Metaspace` or `Strip` decoder drops what it drops at the start (see [`hf`]).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut buf = Vec::with_capacity(ids.len() * 4);
        for (i, &id) in ids.iter().enumerate() {
            let bytes = self.token_bytes(id);
            if i > 0 {
                buf.extend_from_slice(bytes);
                continue;
            }
            match &self.backend {
                Backend::Spm {
                    add_space_prefix: true,
                    ..
                } => buf.extend_from_slice(bytes.strip_prefix(b" ").unwrap_or(bytes)),
                Backend::Hf(hf) => {
                    let text = self.token_text(id).unwrap_or_default();
                    match hf.first_token_bytes(text, self.types.get(id as usize).copied()) {
                        Some(first) => buf.extend_from_slice(&first),
                        None => buf.extend_from_slice(bytes),
                    }
                }
                _ => buf.extend_from_slice(bytes),
            }
        }
        if let Backend::Hf(hf) = &self.backend {
            hf.finish_decode(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Number of tokens in the vocabulary (`tokenizer.ggml.tokens` length; for Hugging Face,
    /// the highest id + 1 over the model vocabulary and the added tokens).
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The BOS token id (`tokenizer.ggml.bos_token_id`, llama.cpp's SPM default 1, or
    /// `bos_token` of tokenizer_config.json), if any.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// The EOS token id (`tokenizer.ggml.eos_token_id`, llama.cpp's SPM default 2, or
    /// `eos_token` of tokenizer_config.json, else the first `eos_token_id` of
    /// generation_config.json), if any.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-generation ids (sorted, unique). GGUF: as llama.cpp's `special_eog_ids` — EOS,
    /// EOT/EOM (metadata or detected by text), the FIM pad/repo/file-separator tokens, and
    /// tokens whose text is a known end marker (`<|im_end|>`, `<|eot_id|>`, `<end_of_turn>`,
    /// `</s>`, ...). Hugging Face: every `eos_token_id` of generation_config.json plus
    /// tokenizer_config.json's `eos_token`.
    pub fn eog_token_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether generating `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Whether `id` is a control token (after llama.cpp's fix-ups; Hugging Face: a special
    /// added token); false when out of range.
    pub fn is_control(&self, id: u32) -> bool {
        self.types.get(id as usize) == Some(&TokenType::Control)
    }

    /// Whether prompts start with BOS (`tokenizer.ggml.add_bos_token`, default false for
    /// `gpt2` and true for `llama`; Hugging Face: see [`hf`]).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether prompts end with EOS (`tokenizer.ggml.add_eos_token`, default false; Hugging
    /// Face: see [`hf`]).
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Sampling defaults from generation_config.json (all `None` for GGUF models and for
    /// directories without that file).
    pub fn generation_defaults(&self) -> &GenerationDefaults {
        &self.generation
    }

    /// The underlying Hugging Face tokenizer, when there is one: for GGUF `gpt2` the BPE +
    /// pre-tokenizer + byte-level decoder with no added tokens (it encodes special-token text
    /// as plain text); for a Hugging Face directory the `tokenizer.json` tokenizer with
    /// special-token matching off (`encode_special_tokens`). `None` for GGUF `llama`.
    pub fn hf_tokenizer(&self) -> Option<&tokenizers::Tokenizer> {
        match &self.backend {
            Backend::Bpe(t) => Some(t),
            Backend::Hf(hf) => Some(hf.tokenizer()),
            Backend::Spm { .. } => None,
        }
    }
}

impl crate::request::Vocab for TextTokenizer {
    fn vocab_size(&self) -> usize {
        TextTokenizer::vocab_size(self)
    }
    fn token_bytes(&self, id: u32) -> &[u8] {
        TextTokenizer::token_bytes(self, id)
    }
    fn token_piece(&self, id: u32) -> &[u8] {
        TextTokenizer::token_piece(self, id)
    }
    fn is_control(&self, id: u32) -> bool {
        TextTokenizer::is_control(self, id)
    }
    fn bos_token_id(&self) -> Option<u32> {
        TextTokenizer::bos_token_id(self)
    }
    fn eos_token_id(&self) -> Option<u32> {
        TextTokenizer::eos_token_id(self)
    }
    fn eog_token_ids(&self) -> &[u32] {
        TextTokenizer::eog_token_ids(self)
    }
}
