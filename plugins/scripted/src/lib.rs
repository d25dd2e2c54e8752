//! `scripted`: a test fixture that makes the daemon emit a scripted token sequence on any
//! model, so that what parses the output (reasoning blocks, tool calls split at awkward
//! token boundaries, invalid UTF-8) can be tested without a model that produces it.
//!
//! Not loaded by default: `scripts/build-plugins.sh` writes it to `target/test-plugins/`,
//! not to `target/plugins/`; a test copies it into the `plugins.dir` of its daemon.
//!
//! Config, exactly one of `tokens` and `text`:
//! - `{"tokens": [id, ...]}`: at most 4096 token ids, each below the vocabulary size;
//! - `{"text": "...", "split": "greedy" | "bytes"}`: at most 4096 bytes, encoded in
//!   `configure` over the vocabulary's bytes (control tokens skipped): `"greedy"`
//!   (default) takes the longest token matching at each byte, lowest id on ties;
//!   `"bytes"` takes one single-byte token per byte (byte-level BPE has all 256), an
//!   error naming the byte when the vocabulary lacks one;
//! - `"then"`: `"eos"` (default) or `"free"`: what happens after the script.
//!
//! Step `i` (`i` = tokens generated so far) allows only the script's `i`-th token. After
//! the script, `"eos"` allows only the first end-of-generation token the host reports
//! (the model's EOS when it reports none), so generation ends; `"free"` keeps the logits.
#![no_std]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use guest_support::{show, Config, Global};
use serde_json::Value;

wit_bindgen::generate!({ path: "../../wit", world: "logits-processor-plugin" });

use exports::inferd::plugin::logits_processor::{Guest, LogitsEdit, PluginInfo, StepContext};
use inferd::plugin::host;

/// Most tokens a script may have (`tokens` entries).
pub const MAX_TOKENS: usize = 4096;
/// Longest `text`, in bytes.
pub const MAX_TEXT_BYTES: usize = 4096;

/// How `text` becomes tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// Longest match over the vocabulary's bytes at each position.
    Greedy,
    /// One single-byte token per byte.
    Bytes,
}

/// What follows the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Only the first end-of-generation token: generation ends.
    Eos,
    /// The logits unchanged: the model continues freely.
    Free,
}

/// Where the script comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Token ids, already checked against the vocabulary size.
    Tokens(Vec<u32>),
    /// Text to encode over the vocabulary.
    Text {
        /// The text's UTF-8 bytes.
        text: Vec<u8>,
        /// How to encode it.
        split: Split,
    },
}

/// A validated config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The script's tokens or text.
    pub source: Source,
    /// What follows the script.
    pub then: Then,
}

/// Validates `config` against a vocabulary of `vocab_size` tokens.
pub fn parse_config(config: &str, vocab_size: u32) -> Result<Spec, String> {
    let config = Config::parse(config, &["tokens", "text", "split", "then"])?;
    let then = match config.get("then") {
        None => Then::Eos,
        Some(v) => match v.as_str() {
            Some("eos") => Then::Eos,
            Some("free") => Then::Free,
            _ => {
                return Err(format!(
                    "then: must be \"eos\" or \"free\", got {}",
                    show(v)
                ))
            }
        },
    };
    let source = match (config.get("tokens"), config.get("text")) {
        (Some(_), Some(_)) => {
            return Err(String::from(
                "tokens, text: give exactly one of them, got both",
            ))
        }
        (None, None) => {
            return Err(String::from(
                "tokens or text: required, exactly one (a list of token ids or a string)",
            ))
        }
        (Some(tokens), None) => {
            if let Some(split) = config.get("split") {
                return Err(format!(
                    "split: only applies to text, not tokens, got {}",
                    show(split)
                ));
            }
            Source::Tokens(parse_tokens(tokens, vocab_size)?)
        }
        (None, Some(text)) => {
            let split = match config.get("split") {
                None => Split::Greedy,
                Some(v) => match v.as_str() {
                    Some("greedy") => Split::Greedy,
                    Some("bytes") => Split::Bytes,
                    _ => {
                        return Err(format!(
                            "split: must be \"greedy\" or \"bytes\", got {}",
                            show(v)
                        ))
                    }
                },
            };
            match text.as_str() {
                Some(s) if s.len() <= MAX_TEXT_BYTES => Source::Text {
                    text: s.as_bytes().to_vec(),
                    split,
                },
                _ => {
                    return Err(format!(
                        "text: must be a string of at most {MAX_TEXT_BYTES} bytes, got {}",
                        show(text)
                    ))
                }
            }
        }
    };
    Ok(Spec { source, then })
}

/// The `tokens` list: at most [`MAX_TOKENS`] integers, each `< vocab_size`.
fn parse_tokens(value: &Value, vocab_size: u32) -> Result<Vec<u32>, String> {
    let Some(list) = value.as_array() else {
        return Err(format!(
            "tokens: must be a list of token ids, got {}",
            show(value)
        ));
    };
    if list.len() > MAX_TOKENS {
        return Err(format!(
            "tokens: must have at most {MAX_TOKENS} entries, got {}",
            list.len()
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, item)| match item.as_u64() {
            Some(id) if id < u64::from(vocab_size) => Ok(id as u32),
            _ => Err(format!(
                "tokens[{i}]: must be a token id below the vocabulary size {vocab_size}, got {}",
                show(item)
            )),
        })
        .collect()
}

/// The vocabulary's bytes, indexed for encoding text.
pub struct Vocab {
    /// Concatenated bytes of every token, in id order.
    bytes: Vec<u8>,
    /// Start of each token in `bytes`, plus the total length at the end.
    offsets: Vec<u32>,
    /// Every non-control, non-empty token, sorted by bytes, then id.
    sorted: Vec<u32>,
    /// The lowest non-control token id whose bytes are exactly that byte.
    single: [Option<u32>; 256],
}

impl Vocab {
    /// Indexes a vocabulary blob (`offsets`: vocabulary size + 1 entries); the `control`
    /// ids are left out (they are not text).
    pub fn new(bytes: Vec<u8>, offsets: Vec<u32>, control: &[u32]) -> Self {
        let size = offsets.len().saturating_sub(1);
        let mut is_control = vec![false; size];
        for &id in control {
            if let Some(slot) = is_control.get_mut(id as usize) {
                *slot = true;
            }
        }
        let mut vocab = Self {
            bytes,
            offsets,
            sorted: Vec::new(),
            single: [None; 256],
        };
        for id in 0..size as u32 {
            if is_control[id as usize] || vocab.token(id).is_empty() {
                continue;
            }
            vocab.sorted.push(id);
            if let [b] = *vocab.token(id) {
                vocab.single[b as usize].get_or_insert(id);
            }
        }
        let (bytes, offsets) = (&vocab.bytes, &vocab.offsets);
        vocab.sorted.sort_unstable_by(|&a, &b| {
            slice(bytes, offsets, a)
                .cmp(slice(bytes, offsets, b))
                .then(a.cmp(&b))
        });
        vocab
    }

    /// The bytes of token `id` (empty if out of range).
    fn token(&self, id: u32) -> &[u8] {
        slice(&self.bytes, &self.offsets, id)
    }

    /// The longest token that `text` starts with, and its length in bytes (lowest id
    /// among tokens with the same bytes).
    fn longest_prefix(&self, text: &[u8]) -> Option<(u32, usize)> {
        // Invariant: `sorted[lo..hi]` holds the tokens starting with `text[..k - 1]`;
        // each step narrows it to those starting with `text[..k]`, whose first entry
        // (a prefix sorts before its extensions) is the exact match if there is one.
        let (mut lo, mut hi) = (0, self.sorted.len());
        let mut best = None;
        for k in 1..=text.len() {
            let prefix = &text[..k];
            lo += self.sorted[lo..hi].partition_point(|&id| self.token(id) < prefix);
            hi = lo + self.sorted[lo..hi].partition_point(|&id| self.token(id).starts_with(prefix));
            if lo == hi {
                break;
            }
            if self.token(self.sorted[lo]) == prefix {
                best = Some((self.sorted[lo], k));
            }
        }
        best
    }

    /// Encodes `text` (the error names the field `text` and the byte offset).
    pub fn encode(&self, text: &[u8], split: Split) -> Result<Vec<u32>, String> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < text.len() {
            let byte = text[pos];
            match split {
                Split::Bytes => match self.single[byte as usize] {
                    Some(id) => {
                        out.push(id);
                        pos += 1;
                    }
                    None => {
                        return Err(format!(
                            "text: the vocabulary has no single-byte token for byte 0x{byte:02x} \
                             at offset {pos} (split \"bytes\")"
                        ))
                    }
                },
                Split::Greedy => match self.longest_prefix(&text[pos..]) {
                    Some((id, len)) => {
                        out.push(id);
                        pos += len;
                    }
                    None => {
                        return Err(format!(
                            "text: no token of the vocabulary starts with byte 0x{byte:02x} \
                             at offset {pos}"
                        ))
                    }
                },
            }
        }
        Ok(out)
    }
}

/// Token `id`'s bytes from a vocabulary blob (empty if out of range or malformed).
fn slice<'a>(bytes: &'a [u8], offsets: &[u32], id: u32) -> &'a [u8] {
    let i = id as usize;
    match (offsets.get(i), offsets.get(i + 1)) {
        (Some(&start), Some(&end)) => bytes.get(start as usize..end as usize).unwrap_or(&[]),
        _ => &[],
    }
}

/// The token that `"then": "eos"` allows after the script: the first end-of-generation
/// id, else the EOS id.
pub fn end_token(end_of_generation: &[u32], eos: Option<u32>) -> Result<u32, String> {
    end_of_generation.first().copied().or(eos).ok_or_else(|| {
        String::from(
            "then: \"eos\" needs an end-of-generation token and this model has none; use \"free\"",
        )
    })
}

/// The script of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// The tokens to emit, in order.
    pub tokens: Vec<u32>,
    /// The only token allowed after them (`"then": "eos"`); `None`: the logits are kept.
    pub end: Option<u32>,
}

impl Script {
    /// The only token allowed once `generated` tokens exist; `None`: keep the logits.
    pub fn step(&self, generated: usize) -> Option<u32> {
        self.tokens.get(generated).copied().or(self.end)
    }
}

/// The script of this instance (one request), set by `configure`.
static SCRIPT: Global<Option<Script>> = Global::new(None);

/// The exported component.
struct Scripted;

impl Guest for Scripted {
    /// Name, version and description of the plugin.
    fn info() -> PluginInfo {
        PluginInfo {
            name: "scripted".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Test fixture: emits a scripted token sequence, then ends or runs free"
                .into(),
        }
    }

    /// Validates `config`, encodes `text` when given, and stores the script.
    fn configure(config: String, _seed: u64) -> Result<(), String> {
        let spec = parse_config(&config, host::vocab_size())?;
        let special = host::special_tokens();
        let end = match spec.then {
            Then::Eos => Some(end_token(&special.end_of_generation, special.eos)?),
            Then::Free => None,
        };
        let tokens = match spec.source {
            Source::Tokens(tokens) => tokens,
            Source::Text { text, split } => {
                let blob = host::vocab_bytes();
                Vocab::new(blob.bytes, blob.offsets, &special.control).encode(&text, split)?
            }
        };
        SCRIPT.with(|s| *s = Some(Script { tokens, end }));
        Ok(())
    }

    /// One decode step: only the script's next token, then the end token or nothing.
    fn process(ctx: StepContext, _logits: Vec<f32>) -> Result<LogitsEdit, String> {
        SCRIPT.with(|s| {
            let script = s
                .as_ref()
                .ok_or("scripted: process called before configure")?;
            Ok(match script.step(ctx.generated.len()) {
                Some(id) => LogitsEdit::AllowOnly(vec![id]),
                None => LogitsEdit::Keep,
            })
        })
    }
}

export!(Scripted);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    /// A made-up vocabulary: id 0 is a control token, 9 is empty, 10 repeats 3's bytes.
    fn vocab() -> Vocab {
        let tokens: [&[u8]; 13] = [
            b"<|end|>", b"a", b"b", b"ab", b"abc", b"<", b"<th", b"ink>", b"c", b"", b"ab", b"\n",
            b"\xc3",
        ];
        let mut bytes = Vec::new();
        let mut offsets = vec![0u32];
        for t in tokens {
            bytes.extend_from_slice(t);
            offsets.push(bytes.len() as u32);
        }
        Vocab::new(bytes, offsets, &[0])
    }

    fn tokens(config: &str) -> Result<Spec, String> {
        parse_config(config, 100)
    }

    #[test]
    fn config_tokens_and_bounds() {
        assert_eq!(
            tokens(r#"{"tokens": [0, 99, 5]}"#),
            Ok(Spec {
                source: Source::Tokens(vec![0, 99, 5]),
                then: Then::Eos
            })
        );
        assert_eq!(
            tokens(r#"{"tokens": [], "then": "free"}"#).map(|s| s.then),
            Ok(Then::Free)
        );
        assert_eq!(
            tokens(r#"{"tokens": [1, 100]}"#).unwrap_err(),
            "tokens[1]: must be a token id below the vocabulary size 100, got 100"
        );
        for bad in ["-1", "1.0", "\"3\"", "null"] {
            let err = tokens(&format!(r#"{{"tokens": [{bad}]}}"#)).unwrap_err();
            assert_eq!(
                err,
                format!("tokens[0]: must be a token id below the vocabulary size 100, got {bad}")
            );
        }
        assert_eq!(
            tokens(r#"{"tokens": 5}"#).unwrap_err(),
            "tokens: must be a list of token ids, got 5"
        );
        let long = format!(r#"{{"tokens": [{}0]}}"#, "0,".repeat(MAX_TOKENS));
        assert_eq!(
            tokens(&long).unwrap_err(),
            "tokens: must have at most 4096 entries, got 4097"
        );
    }

    #[test]
    fn config_text_split_then_and_exactly_one_source() {
        assert_eq!(
            tokens(r#"{"text": "<think>", "split": "bytes"}"#).map(|s| s.source),
            Ok(Source::Text {
                text: b"<think>".to_vec(),
                split: Split::Bytes
            })
        );
        assert_eq!(
            tokens(r#"{"text": ""}"#).map(|s| s.source),
            Ok(Source::Text {
                text: Vec::new(),
                split: Split::Greedy
            })
        );
        assert_eq!(
            tokens(r#"{"tokens": [1], "text": "a"}"#).unwrap_err(),
            "tokens, text: give exactly one of them, got both"
        );
        assert!(tokens(r#"{"then": "eos"}"#)
            .unwrap_err()
            .starts_with("tokens or text: required"));
        assert_eq!(
            tokens(r#"{"tokens": [1], "split": "bytes"}"#).unwrap_err(),
            "split: only applies to text, not tokens, got \"bytes\""
        );
        assert_eq!(
            tokens(r#"{"text": "a", "split": "chars"}"#).unwrap_err(),
            "split: must be \"greedy\" or \"bytes\", got \"chars\""
        );
        assert_eq!(
            tokens(r#"{"tokens": [1], "then": "stop"}"#).unwrap_err(),
            "then: must be \"eos\" or \"free\", got \"stop\""
        );
        assert!(tokens(&format!(r#"{{"text": "{}"}}"#, "x".repeat(MAX_TEXT_BYTES))).is_ok());
        assert!(tokens(&format!(
            r#"{{"text": "{}"}}"#,
            "x".repeat(MAX_TEXT_BYTES + 1)
        ))
        .unwrap_err()
        .starts_with("text: must be a string of at most 4096 bytes, got \"xxx"));
        assert_eq!(
            tokens(r#"{"text": 1}"#).unwrap_err(),
            "text: must be a string of at most 4096 bytes, got 1"
        );
        assert!(tokens(r#"{"token": [1]}"#)
            .unwrap_err()
            .starts_with("token: unknown field"));
    }

    #[test]
    fn greedy_takes_the_longest_match_lowest_id_on_ties() {
        let v = vocab();
        assert_eq!(v.encode(b"abcab", Split::Greedy), Ok(vec![4, 3]));
        assert_eq!(v.encode(b"abba", Split::Greedy), Ok(vec![3, 2, 1]));
        assert_eq!(v.encode(b"<think>\n", Split::Greedy), Ok(vec![6, 7, 11]));
        assert_eq!(v.encode(b"<a", Split::Greedy), Ok(vec![5, 1]));
        assert_eq!(v.encode(b"", Split::Greedy), Ok(vec![]));
        assert_eq!(
            v.encode(b"abd", Split::Greedy).unwrap_err(),
            "text: no token of the vocabulary starts with byte 0x64 at offset 2"
        );
        // The control token's text is not matched: only "<" is.
        assert_eq!(
            v.encode(b"<|end|>", Split::Greedy).unwrap_err(),
            "text: no token of the vocabulary starts with byte 0x7c at offset 1"
        );
    }

    #[test]
    fn bytes_split_gives_one_token_per_byte() {
        let v = vocab();
        assert_eq!(v.encode(b"<abc\n", Split::Bytes), Ok(vec![5, 1, 2, 8, 11]));
        assert_eq!(v.encode(b"\xc3", Split::Bytes), Ok(vec![12]));
        assert_eq!(
            v.encode(b"ai", Split::Bytes).unwrap_err(),
            "text: the vocabulary has no single-byte token for byte 0x69 at offset 1 \
             (split \"bytes\")"
        );
    }

    #[test]
    fn steps_follow_the_script_then_end_or_run_free() {
        let eos = Script {
            tokens: vec![5, 6, 7],
            end: Some(0),
        };
        let picked: Vec<_> = (0..5).map(|i| eos.step(i)).collect();
        assert_eq!(picked, [Some(5), Some(6), Some(7), Some(0), Some(0)]);
        let free = Script {
            tokens: vec![5],
            end: None,
        };
        assert_eq!(free.step(0), Some(5));
        assert_eq!(free.step(1), None);
        assert_eq!(end_token(&[2, 0], Some(0)), Ok(2));
        assert_eq!(end_token(&[], Some(0)), Ok(0));
        assert!(end_token(&[], None)
            .unwrap_err()
            .starts_with("then: \"eos\""));
    }
}
