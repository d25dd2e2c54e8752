//! Per-token bytes for a Hugging Face `tokenizer.json` decoder.
//!
//! The streaming detokenizer needs the raw bytes of each token on its own, but a `tokenizers`
//! decoder works on the whole id list and returns a `String` (lossy for partial UTF-8). This
//! module reads the `decoder` section and splits it into steps applied to every token (what the
//! decoders in `tokenizers/src/decoders/` do token by token) and steps that only touch the
//! start or end of the sequence (a `Strip` after `Fuse`, `Metaspace`'s first-token rule).
//!
//! Supported decoder types (`tokenizers` 0.23 names): `ByteLevel`, `Metaspace`, `Replace` (with
//! a `String` pattern), `ByteFallback`, `Fuse`, `Strip`, and `Sequence` of these. `WordPiece`,
//! `BPEDecoder` and `CTC` (encoder-model decoders) and a missing decoder are refused.

use serde_json::Value as Json;

use super::gguf::unicode_to_byte;
use std::collections::HashMap;

/// One step applied to every token's bytes, in order.
#[derive(Debug, Clone)]
enum TokenStep {
    /// `ByteLevel`: GPT-2 alphabet chars back to bytes; a token with any char outside the
    /// alphabet keeps its own UTF-8 bytes (`ByteLevel::decode_chain`).
    ByteLevel,
    /// `Replace`: every occurrence of `from` becomes `to`.
    Replace { from: Vec<u8>, to: Vec<u8> },
    /// `ByteFallback`: a token that is exactly `<0xNN>` becomes that byte.
    ByteFallback,
    /// `Metaspace`: the replacement char becomes a space (dropped in the first token unless
    /// `prepend_scheme` is `never`).
    Metaspace { replacement: char },
    /// `Strip` before `Fuse`: up to `start` leading and `stop` trailing `content` chars are
    /// removed from each token.
    Strip {
        content: char,
        start: usize,
        stop: usize,
    },
}

/// The decoder split into per-token steps and sequence-level edits.
#[derive(Debug, Clone)]
pub(crate) struct DecoderPlan {
    steps: Vec<TokenStep>,
    /// A `Metaspace` decoder whose first token loses its replacement chars.
    metaspace_first: bool,
    /// `Strip` after fusion: up to `.1` leading `.0` chars of the decoded text are removed.
    strip_start: Option<(char, usize)>,
    /// `Strip` after fusion: up to `.1` trailing `.0` chars of the decoded text are removed
    /// (applied by `decode` only; a stream cannot know where the end is).
    strip_end: Option<(char, usize)>,
    byte_of: HashMap<char, u8>,
}

impl DecoderPlan {
    /// Reads the `decoder` value of tokenizer.json. `Err` is a reason naming the offending
    /// part (the caller adds the file and key).
    pub(crate) fn from_json(decoder: &Json) -> Result<Self, String> {
        let mut plan = Self {
            steps: Vec::new(),
            metaspace_first: false,
            strip_start: None,
            strip_end: None,
            byte_of: unicode_to_byte(),
        };
        if decoder.is_null() {
            return Err("a null decoder (tokens joined with spaces) is not supported".to_string());
        }
        let mut fused = false;
        plan.add(decoder, &mut fused, 0)?;
        Ok(plan)
    }

    fn add(&mut self, d: &Json, fused: &mut bool, depth: usize) -> Result<(), String> {
        if depth > 8 {
            return Err("decoder sequences nested too deeply".to_string());
        }
        let ty = d.get("type").and_then(Json::as_str).unwrap_or_default();
        match ty {
            "Sequence" => {
                let items = d
                    .get("decoders")
                    .and_then(Json::as_array)
                    .ok_or("a Sequence decoder needs a `decoders` array")?;
                for item in items {
                    self.add(item, fused, depth + 1)?;
                }
            }
            "ByteLevel" => {
                // Its output is one fused string, so later steps are sequence-level.
                self.steps.push(TokenStep::ByteLevel);
                *fused = true;
            }
            "Fuse" => *fused = true,
            "ByteFallback" => {
                if !*fused {
                    self.steps.push(TokenStep::ByteFallback);
                }
                // After fusion only a text that is exactly `<0xNN>` would change: ignored.
            }
            "Replace" => {
                let from = d
                    .get("pattern")
                    .and_then(|p| p.get("String"))
                    .and_then(Json::as_str)
                    .ok_or("only Replace decoders with a `String` pattern are supported")?;
                let to = d
                    .get("content")
                    .and_then(Json::as_str)
                    .ok_or("a Replace decoder needs a string `content`")?;
                if *fused && from.chars().count() != 1 {
                    return Err(format!(
                        "a Replace decoder after Fuse with the multi-character pattern {} \
                         cannot be applied token by token",
                        super::quote(from)
                    ));
                }
                if !from.is_empty() {
                    self.steps.push(TokenStep::Replace {
                        from: from.as_bytes().to_vec(),
                        to: to.as_bytes().to_vec(),
                    });
                }
            }
            "Metaspace" => {
                if *fused {
                    return Err("a Metaspace decoder after Fuse is not supported".to_string());
                }
                let replacement = d
                    .get("replacement")
                    .and_then(Json::as_str)
                    .and_then(|s| s.chars().next())
                    .unwrap_or('\u{2581}');
                // tokenizers: `prepend_scheme` (always/first/never); older files have
                // `add_prefix_space` (true = always).
                let prepends = match d.get("prepend_scheme").and_then(Json::as_str) {
                    Some(scheme) => scheme != "never",
                    None => d
                        .get("add_prefix_space")
                        .and_then(Json::as_bool)
                        .unwrap_or(true),
                };
                self.metaspace_first |= prepends;
                self.steps.push(TokenStep::Metaspace { replacement });
            }
            "Strip" => {
                let content = d
                    .get("content")
                    .and_then(Json::as_str)
                    .and_then(|s| s.chars().next())
                    .ok_or("a Strip decoder needs a one-character `content`")?;
                let count = |key: &str| -> Result<usize, String> {
                    match d.get(key) {
                        None | Some(Json::Null) => Ok(0),
                        Some(v) => v
                            .as_u64()
                            .and_then(|n| usize::try_from(n).ok())
                            .ok_or(format!("Strip `{key}` must be a non-negative integer")),
                    }
                };
                let (start, stop) = (count("start")?, count("stop")?);
                if *fused {
                    self.strip_start = Some((content, start)).filter(|s| s.1 > 0);
                    self.strip_end = Some((content, stop)).filter(|s| s.1 > 0);
                } else {
                    self.steps.push(TokenStep::Strip {
                        content,
                        start,
                        stop,
                    });
                }
            }
            other => {
                return Err(format!(
                    "decoder type {} is not supported (supported: ByteLevel, Metaspace, \
                     Replace, ByteFallback, Fuse, Strip, Sequence)",
                    super::quote(other)
                ))
            }
        }
        Ok(())
    }

    /// Bytes of one token (`first`: it is the first token of the sequence).
    pub(crate) fn token_bytes(&self, text: &str, first: bool) -> Vec<u8> {
        let mut bytes = text.as_bytes().to_vec();
        for step in &self.steps {
            bytes = match step {
                TokenStep::ByteLevel => {
                    let s = String::from_utf8_lossy(&bytes);
                    let mapped: Option<Vec<u8>> =
                        s.chars().map(|c| self.byte_of.get(&c).copied()).collect();
                    mapped.unwrap_or(bytes)
                }
                TokenStep::Replace { from, to } => replace(&bytes, from, to),
                TokenStep::ByteFallback => match std::str::from_utf8(&bytes)
                    .ok()
                    .and_then(super::spm::parse_byte_token)
                {
                    Some(b) => vec![b],
                    None => bytes,
                },
                TokenStep::Metaspace { replacement } => {
                    let mut rep = [0u8; 4];
                    let rep = replacement.encode_utf8(&mut rep).as_bytes();
                    let to: &[u8] = if first && self.metaspace_first {
                        b""
                    } else {
                        b" "
                    };
                    replace(&bytes, rep, to)
                }
                TokenStep::Strip {
                    content,
                    start,
                    stop,
                } => strip(&bytes, *content, *start, *stop),
            };
        }
        bytes
    }

    /// Whether the first token of a sequence decodes differently from the same token later.
    pub(crate) fn first_differs(&self) -> bool {
        self.metaspace_first
    }

    /// The sequence-level edits on fully decoded bytes (a `Strip` after `Fuse`).
    pub(crate) fn finish(&self, buf: &mut Vec<u8>) {
        let (start, stop) = (
            self.strip_start.map_or(0, |s| s.1),
            self.strip_end.map_or(0, |s| s.1),
        );
        if let Some((content, _)) = self.strip_start.or(self.strip_end) {
            if start > 0 || stop > 0 {
                *buf = strip(buf, content, start, stop);
            }
        }
    }
}

/// `bytes` with every non-overlapping `from` replaced by `to`.
fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() || bytes.len() < from.len() {
        return bytes.to_vec();
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// `bytes` without up to `start` leading and `stop` trailing `content` chars
/// (`tokenizers::decoders::strip::Strip`).
fn strip(bytes: &[u8], content: char, start: usize, stop: usize) -> Vec<u8> {
    let mut c = [0u8; 4];
    let c = content.encode_utf8(&mut c).as_bytes();
    let mut s = bytes;
    for _ in 0..start {
        match s.strip_prefix(c) {
            Some(rest) => s = rest,
            None => break,
        }
    }
    for _ in 0..stop {
        match s.strip_suffix(c) {
            Some(rest) => s = rest,
            None => break,
        }
    }
    s.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: &str) -> DecoderPlan {
        DecoderPlan::from_json(&serde_json::from_str(json).expect("json")).expect("plan")
    }

    #[test]
    fn byte_level() {
        let p = plan(r#"{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true}"#);
        assert_eq!(p.token_bytes("Ġhi", false), b" hi");
        // Ċ is '\n'; "ðŁ" are the first two bytes of an emoji.
        assert_eq!(p.token_bytes("Ċ", false), b"\n");
        assert_eq!(p.token_bytes("ðŁ", false), [0xF0, 0x9F]);
        // A char outside the alphabet keeps the token's own bytes.
        assert_eq!(p.token_bytes("a b", false), b"a b");
    }

    #[test]
    fn sentencepiece_style_sequence() {
        let p = plan(
            r#"{"type":"Sequence","decoders":[
                {"type":"Replace","pattern":{"String":"▁"},"content":" "},
                {"type":"ByteFallback"},{"type":"Fuse"},
                {"type":"Strip","content":" ","start":1,"stop":0}]}"#,
        );
        assert_eq!(p.token_bytes("▁Hello", false), b" Hello");
        assert_eq!(p.token_bytes("<0x0A>", false), b"\n");
        assert_eq!(p.token_bytes("<0xE6>", true), [0xE6]);
        assert!(!p.first_differs());
        let mut buf = b"  Hi ".to_vec();
        p.finish(&mut buf);
        assert_eq!(buf, b" Hi ");
    }

    #[test]
    fn metaspace_first_token() {
        let p = plan(
            r#"{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}"#,
        );
        assert_eq!(p.token_bytes("▁a▁b", false), b" a b");
        assert_eq!(p.token_bytes("▁a▁b", true), b"ab");
        assert!(p.first_differs());
        let p = plan(r#"{"type":"Metaspace","replacement":"▁","prepend_scheme":"never"}"#);
        assert_eq!(p.token_bytes("▁a", true), b" a");
    }

    #[test]
    fn unsupported_decoders_are_refused() {
        for json in [
            r###"{"type":"WordPiece","prefix":"##","cleanup":true}"###,
            r#"null"#,
            r#"{"type":"Replace","pattern":{"Regex":"\\s"},"content":" "}"#,
        ] {
            let v: Json = serde_json::from_str(json).expect("json");
            assert!(DecoderPlan::from_json(&v).is_err(), "{json}");
        }
    }
}
