//! Reading `tokenizer.ggml.*` GGUF metadata and building a byte-level BPE
//! [`tokenizers::Tokenizer`] from it.
//!
//! The key names and their meaning follow llama.cpp (`llama-vocab.cpp`, `llama-arch.cpp`) and the
//! GGUF spec (`docs/gguf.md` in ggml): `tokenizer.ggml.model` names the tokenizer family,
//! `tokenizer.ggml.pre` the pre-tokenizer (a regex list in llama.cpp's `llm_tokenizer_bpe`),
//! `tokenizer.ggml.tokens` the vocabulary, `tokenizer.ggml.merges` the BPE merges as
//! `"left right"` strings in GPT-2's byte-to-unicode alphabet, and `tokenizer.ggml.token_type`
//! one [`TokenType`](super::special::TokenType) integer per token.

use std::collections::{HashMap, HashSet};

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{SplitDelimiterBehavior, Tokenizer};

use super::TokenizerError;

/// GGUF metadata as candle returns it (`Content::metadata`).
pub type Metadata = HashMap<String, Value>;

/// `tokenizer.ggml.model`: tokenizer family (only `gpt2`, byte-level BPE, is supported).
pub const KEY_MODEL: &str = "tokenizer.ggml.model";
/// `tokenizer.ggml.pre`: pre-tokenizer name.
pub const KEY_PRE: &str = "tokenizer.ggml.pre";
/// `tokenizer.ggml.tokens`: token texts, indexed by id.
pub const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
/// `tokenizer.ggml.merges`: BPE merges, highest priority first.
pub const KEY_MERGES: &str = "tokenizer.ggml.merges";
/// `tokenizer.ggml.token_type`: one type integer per token.
pub const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
/// `tokenizer.ggml.bos_token_id`.
pub const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
/// `tokenizer.ggml.eos_token_id`.
pub const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
/// `tokenizer.ggml.add_bos_token`: whether a BOS token is prepended to prompts.
pub const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
/// `tokenizer.chat_template`: the Jinja chat template.
pub const KEY_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// Short type name of a GGUF value, for error messages.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::U8(_) => "u8",
        Value::I8(_) => "i8",
        Value::U16(_) => "u16",
        Value::I16(_) => "i16",
        Value::U32(_) => "u32",
        Value::I32(_) => "i32",
        Value::U64(_) => "u64",
        Value::I64(_) => "i64",
        Value::F32(_) => "f32",
        Value::F64(_) => "f64",
        Value::Bool(_) => "bool",
        Value::String(_) => "string",
        Value::Array(_) => "array",
    }
}

/// Integer value of a GGUF scalar, `None` when it is not an integer type.
fn as_int(v: &Value) -> Option<i128> {
    Some(match v {
        Value::U8(x) => i128::from(*x),
        Value::I8(x) => i128::from(*x),
        Value::U16(x) => i128::from(*x),
        Value::I16(x) => i128::from(*x),
        Value::U32(x) => i128::from(*x),
        Value::I32(x) => i128::from(*x),
        Value::U64(x) => i128::from(*x),
        Value::I64(x) => i128::from(*x),
        _ => return None,
    })
}

fn wrong_type(key: &str, expected: &'static str, v: &Value) -> TokenizerError {
    TokenizerError::WrongType {
        key: key.to_string(),
        expected,
        found: type_name(v),
    }
}

/// The value under `key`, or [`TokenizerError::MissingKey`].
pub fn required<'a>(md: &'a Metadata, key: &str) -> Result<&'a Value, TokenizerError> {
    md.get(key).ok_or_else(|| TokenizerError::MissingKey {
        key: key.to_string(),
    })
}

/// A required string value.
pub fn required_str<'a>(md: &'a Metadata, key: &str) -> Result<&'a str, TokenizerError> {
    match required(md, key)? {
        Value::String(s) => Ok(s),
        other => Err(wrong_type(key, "string", other)),
    }
}

/// An optional string value (`None` when absent; wrong type is an error).
pub fn optional_str<'a>(md: &'a Metadata, key: &str) -> Result<Option<&'a str>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(key, "string", other)),
    }
}

/// An optional boolean value.
pub fn optional_bool(md: &Metadata, key: &str) -> Result<Option<bool>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(wrong_type(key, "bool", other)),
    }
}

/// An optional token id: any integer type, checked against `vocab_size`.
pub fn optional_token_id(
    md: &Metadata,
    key: &str,
    vocab_size: usize,
) -> Result<Option<u32>, TokenizerError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let n = as_int(v).ok_or_else(|| wrong_type(key, "integer", v))?;
    match u32::try_from(n) {
        Ok(id) if (id as usize) < vocab_size => Ok(Some(id)),
        _ => Err(TokenizerError::InvalidValue {
            key: key.to_string(),
            value: n.to_string(),
            reason: format!("token id out of range for a vocabulary of {vocab_size} tokens"),
        }),
    }
}

/// A required array of strings.
pub fn required_str_array<'a>(md: &'a Metadata, key: &str) -> Result<Vec<&'a str>, TokenizerError> {
    let items = match required(md, key)? {
        Value::Array(items) => items,
        other => return Err(wrong_type(key, "array of strings", other)),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(s) => Ok(s.as_str()),
            other => Err(TokenizerError::WrongType {
                key: format!("{key}[{i}]"),
                expected: "string",
                found: type_name(other),
            }),
        })
        .collect()
}

/// A required array of integers.
pub fn required_int_array(md: &Metadata, key: &str) -> Result<Vec<i64>, TokenizerError> {
    let items = match required(md, key)? {
        Value::Array(items) => items,
        other => return Err(wrong_type(key, "array of integers", other)),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            as_int(v)
                .and_then(|n| i64::try_from(n).ok())
                .ok_or_else(|| TokenizerError::WrongType {
                    key: format!("{key}[{i}]"),
                    expected: "integer",
                    found: type_name(v),
                })
        })
        .collect()
}

/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2` regex.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3` regex.
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A supported pre-tokenizer family (llama.cpp `llama_vocab_pre_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// `smollm`, `starcoder`, `refact`, `command-r`, `codeshell`, `exaone`, `minerva-7b`:
    /// each digit alone (`\p{N}`), then the GPT-2 regex
    /// (`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`). Verified against llama.cpp on SmolLM2.
    Smollm,
    /// `gpt-2`, `mpt`, `olmo`, `jais`, `trillion`, `granite-docling`: the GPT-2 regex.
    Gpt2,
    /// `qwen2`, `deepseek-r1-qwen`, `megrez`: Qwen2's regex.
    Qwen2,
    /// `llama3`, `llama-v3`, `llama-bpe`, `falcon3`, `falcon-h1`, `pixtral`, `midm-2.0`, `lfm2`:
    /// Llama 3's regex; BPE ignores merges for words already in the vocabulary.
    Llama3,
}

impl PreTokenizerKind {
    /// Maps a `tokenizer.ggml.pre` value to its family, `None` when unsupported.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => PreTokenizerKind::Smollm,
            "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => {
                PreTokenizerKind::Gpt2
            }
            "qwen2" | "deepseek-r1-qwen" | "megrez" => PreTokenizerKind::Qwen2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => PreTokenizerKind::Llama3,
            _ => return None,
        })
    }

    /// All names accepted by [`Self::from_name`], for error messages.
    pub const SUPPORTED: &'static str = "smollm, starcoder, refact, command-r, codeshell, exaone, \
        minerva-7b, gpt-2, gpt2, mpt, olmo, jais, trillion, granite-docling, qwen2, \
        deepseek-r1-qwen, megrez, llama3, llama-v3, llama-bpe, falcon3, falcon-h1, pixtral, \
        midm-2.0, lfm2";

    /// Whether BPE keeps a pre-token whole when it is itself a vocabulary entry
    /// (llama.cpp `ignore_merges`).
    pub fn ignore_merges(self) -> bool {
        self == PreTokenizerKind::Llama3
    }

    /// The equivalent Hugging Face pre-tokenizer: llama.cpp applies its regexes in turn, keeping
    /// both matches and the text between them as words, which is `Split(regex, Isolated)`;
    /// then bytes are mapped to GPT-2's unicode alphabet.
    pub fn build(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        let split = |regex: &str| -> Result<PreTokenizerWrapper, TokenizerError> {
            Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map(PreTokenizerWrapper::Split)
            .map_err(|e| TokenizerError::Build {
                reason: format!("pre-tokenizer regex {regex:?}: {e}"),
            })
        };
        let byte_level_only = PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false));
        Ok(match self {
            PreTokenizerKind::Smollm => PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, true)),
            ])),
            PreTokenizerKind::Gpt2 => {
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, true))
            }
            PreTokenizerKind::Qwen2 => PreTokenizerWrapper::Sequence(Sequence::new(vec![
                split(QWEN2_REGEX)?,
                byte_level_only,
            ])),
            PreTokenizerKind::Llama3 => PreTokenizerWrapper::Sequence(Sequence::new(vec![
                split(LLAMA3_REGEX)?,
                byte_level_only,
            ])),
        })
    }
}

/// `tokenizer.ggml.tokens`, with empty texts replaced by `[EMPTY_<id>]` as llama.cpp's
/// `llama_vocab::impl::load` does.
///
/// # Errors
/// A missing key, a non-string entry, or a vocabulary of 0 or 2^32 and more tokens.
pub fn read_tokens(md: &Metadata) -> Result<Vec<String>, TokenizerError> {
    let tokens: Vec<String> = required_str_array(md, KEY_TOKENS)?
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t.to_string()
            }
        })
        .collect();
    if tokens.is_empty() || u32::try_from(tokens.len()).is_err() {
        return Err(TokenizerError::InvalidValue {
            key: KEY_TOKENS.to_string(),
            value: format!("{} tokens", tokens.len()),
            reason: "the vocabulary must hold between 1 and 2^32-1 tokens".to_string(),
        });
    }
    Ok(tokens)
}

/// The vocabulary read from metadata.
#[derive(Debug, Clone)]
pub struct GgufVocab {
    /// Token texts by id (empty texts replaced by `[EMPTY_<id>]`, as llama.cpp does).
    pub tokens: Vec<String>,
    /// Raw `tokenizer.ggml.token_type` values by id.
    pub token_types: Vec<i64>,
    /// Merges as pairs, in priority order (duplicates dropped, first kept, as llama.cpp's
    /// `bpe_ranks.emplace`).
    pub merges: Vec<(String, String)>,
    /// Pre-tokenizer family.
    pub pre: PreTokenizerKind,
}

impl GgufVocab {
    /// Reads and checks `tokenizer.ggml.{model,pre,tokens,token_type,merges}`.
    ///
    /// # Errors
    /// A missing key, a value of the wrong type, a model other than `gpt2`, an unknown
    /// pre-tokenizer, a `token_type` array whose length differs from `tokens`, or a merge
    /// without a space separator.
    pub fn read(md: &Metadata) -> Result<Self, TokenizerError> {
        let model = required_str(md, KEY_MODEL)?;
        if model != "gpt2" {
            return Err(TokenizerError::Unsupported {
                key: KEY_MODEL.to_string(),
                value: model.to_string(),
                supported: "gpt2 (byte-level BPE)".to_string(),
            });
        }
        let pre_name = required_str(md, KEY_PRE)?;
        let pre =
            PreTokenizerKind::from_name(pre_name).ok_or_else(|| TokenizerError::Unsupported {
                key: KEY_PRE.to_string(),
                value: pre_name.to_string(),
                supported: PreTokenizerKind::SUPPORTED.to_string(),
            })?;
        let tokens = read_tokens(md)?;
        let token_types = required_int_array(md, KEY_TOKEN_TYPE)?;
        if token_types.len() != tokens.len() {
            return Err(TokenizerError::InvalidValue {
                key: KEY_TOKEN_TYPE.to_string(),
                value: format!("{} entries", token_types.len()),
                reason: format!("expected one per token ({} tokens)", tokens.len()),
            });
        }
        let raw_merges = required_str_array(md, KEY_MERGES)?;
        let mut seen = HashSet::with_capacity(raw_merges.len());
        let mut merges = Vec::with_capacity(raw_merges.len());
        for (i, m) in raw_merges.iter().enumerate() {
            // llama.cpp: `word.find(' ', 1)`, so a merge may start with a space character.
            let split = m
                .char_indices()
                .skip(1)
                .find(|&(_, c)| c == ' ')
                .map(|(p, _)| p);
            let Some(pos) = split else {
                return Err(TokenizerError::InvalidValue {
                    key: format!("{KEY_MERGES}[{i}]"),
                    value: (*m).to_string(),
                    reason: "a merge must be two tokens separated by a space".to_string(),
                });
            };
            let pair = (m[..pos].to_string(), m[pos + 1..].to_string());
            if seen.insert(pair.clone()) {
                merges.push(pair);
            }
        }
        Ok(Self {
            tokens,
            token_types,
            merges,
            pre,
        })
    }

    /// Builds the Hugging Face tokenizer: BPE model over the whole vocabulary (no added tokens,
    /// so special-token text is ordinary BPE input), the pre-tokenizer, a byte-level decoder.
    ///
    /// # Errors
    /// [`TokenizerError::Build`] when the BPE model rejects the merges (a merge whose parts or
    /// result are not in the vocabulary) or a regex does not compile.
    pub fn build_tokenizer(&self) -> Result<Tokenizer, TokenizerError> {
        // Last occurrence of a duplicated text wins, as in llama.cpp's `token_to_id[word] = i`.
        let vocab: Vocab = self
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, self.merges.clone())
            .ignore_merges(self.pre.ignore_merges())
            .build()
            .map_err(|e| TokenizerError::Build {
                reason: format!("BPE model from {KEY_TOKENS} and {KEY_MERGES}: {e}"),
            })?;
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(self.pre.build()?));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
        Ok(tokenizer)
    }
}

/// GPT-2's byte-to-unicode table inverted: the byte each alphabet char stands for
/// (OpenAI `encoder.py` `bytes_to_unicode`).
pub fn unicode_to_byte() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable =
            (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(256 + n).unwrap_or(char::REPLACEMENT_CHARACTER);
            n += 1;
            c
        };
        map.insert(c, b);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_is_a_bijection() {
        let m = unicode_to_byte();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'Ġ'], b' ');
        assert_eq!(m[&'Ċ'], b'\n');
        assert_eq!(m[&'A'], b'A');
    }

    #[test]
    fn pre_tokenizer_names() {
        assert_eq!(
            PreTokenizerKind::from_name("smollm"),
            Some(PreTokenizerKind::Smollm)
        );
        assert_eq!(PreTokenizerKind::from_name("nope"), None);
        for kind in [
            PreTokenizerKind::Smollm,
            PreTokenizerKind::Gpt2,
            PreTokenizerKind::Qwen2,
            PreTokenizerKind::Llama3,
        ] {
            assert!(kind.build().is_ok(), "{kind:?}");
        }
    }
}
