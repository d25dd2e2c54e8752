//! SentencePiece-style BPE for GGUF vocabularies with `tokenizer.ggml.model = "llama"`.
//!
//! A port of llama.cpp's `llm_tokenizer_spm_session` (`src/llama-vocab.cpp`, release b11312,
//! itself from llama.cpp commit 074bea2): the text, with spaces escaped as `▁` (U+2581), is split
//! into UTF-8 characters; every adjacent pair whose concatenation is a vocabulary entry is a
//! candidate; the candidate whose merged token has the highest `tokenizer.ggml.scores` value is
//! merged first (ties: the leftmost), new candidates with the merged symbol's neighbours are
//! queued, and so on until no pair is in the vocabulary. Symbols that are not tokens (characters
//! missing from the vocabulary) become byte tokens `<0xNN>` ("byte fallback").
//!
//! There is no pre-tokenizer: each text fragment between special tokens is one sequence.
//!
//! Why not the `tokenizers` crate: its BPE model only merges pairs listed as explicit merges and
//! turns an out-of-vocabulary character into byte tokens before merging, whereas llama.cpp
//! merges any adjacent pair whose concatenation is a token, including pairs with a character
//! that is not itself a token. Emulating that would need every split of every token as a merge
//! (millions for a 262k vocabulary) and would still differ on such characters; its Unigram model
//! is a different algorithm (Viterbi over piece scores). The loop below is llama.cpp's, with the
//! same tie-breaking, and needs only a hash map at load.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use candle_core::quantized::gguf_file::Value;

use super::gguf::{self, Metadata};
use super::special::TokenType;
use super::TokenizerError;

/// `tokenizer.ggml.scores`: one float (or int) per token, the merge priority.
pub const KEY_SCORES: &str = "tokenizer.ggml.scores";
/// `tokenizer.ggml.add_space_prefix`: prepend `▁` to text that starts the input or follows a
/// special token (llama.cpp default for SPM: true).
pub const KEY_ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
/// `tokenizer.ggml.add_eos_token`: append EOS when special tokens are added.
pub const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";

/// The whitespace escape SentencePiece uses inside tokens (U+2581 LOWER ONE EIGHTH BLOCK).
pub const ESCAPED_SPACE: char = '\u{2581}';

/// Sentinel for "no symbol" in the linked list of symbols.
const NONE: usize = usize::MAX;

/// An SPM vocabulary as read from GGUF metadata.
#[derive(Debug, Clone)]
pub struct SpmVocab {
    /// Token texts by id (empty texts replaced by `[EMPTY_<id>]`, as llama.cpp does).
    pub tokens: Vec<String>,
    /// Merge scores by id.
    pub scores: Vec<f32>,
    /// Raw `tokenizer.ggml.token_type` values by id.
    pub token_types: Vec<i64>,
}

impl SpmVocab {
    /// Reads `tokenizer.ggml.{tokens,scores,token_type}`.
    ///
    /// llama.cpp lets scores and types be absent (all 0.0 / all normal); without them an SPM
    /// vocabulary cannot tokenize as its model was trained, so both are required here.
    ///
    /// # Errors
    /// A missing key, a value of the wrong type, an array whose length differs from the token
    /// list, a NaN score, or an empty vocabulary.
    pub fn read(md: &Metadata) -> Result<Self, TokenizerError> {
        let tokens = gguf::read_tokens(md)?;
        let scores = read_scores(md, tokens.len())?;
        let token_types = gguf::required_int_array(md, gguf::KEY_TOKEN_TYPE)?;
        if token_types.len() != tokens.len() {
            return Err(TokenizerError::InvalidValue {
                key: gguf::KEY_TOKEN_TYPE.to_string(),
                value: format!("{} entries", token_types.len()),
                reason: format!("expected one per token ({} tokens)", tokens.len()),
            });
        }
        Ok(Self {
            tokens,
            scores,
            token_types,
        })
    }
}

/// `tokenizer.ggml.scores` as floats (llama.cpp accepts f32 or i32 arrays).
fn read_scores(md: &Metadata, n: usize) -> Result<Vec<f32>, TokenizerError> {
    let items = match gguf::required(md, KEY_SCORES)? {
        Value::Array(items) => items,
        other => {
            return Err(TokenizerError::WrongType {
                key: KEY_SCORES.to_string(),
                expected: "array of f32",
                found: gguf::type_name(other),
            })
        }
    };
    if items.len() != n {
        return Err(TokenizerError::InvalidValue {
            key: KEY_SCORES.to_string(),
            value: format!("{} entries", items.len()),
            reason: format!("expected one per token ({n} tokens)"),
        });
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let score = match v {
                Value::F32(x) => *x,
                // llama.cpp: `static_cast<float>(iscores[i])`.
                Value::I32(x) => *x as f32,
                other => {
                    return Err(TokenizerError::WrongType {
                        key: format!("{KEY_SCORES}[{i}]"),
                        expected: "f32",
                        found: gguf::type_name(other),
                    })
                }
            };
            if score.is_nan() {
                return Err(TokenizerError::InvalidValue {
                    key: format!("{KEY_SCORES}[{i}]"),
                    value: "NaN".to_string(),
                    reason: "a merge score must be a number".to_string(),
                });
            }
            Ok(score)
        })
        .collect()
}

/// The SPM merge model: text → id, scores, byte-fallback ids.
#[derive(Debug, Clone)]
pub struct SpmModel {
    /// Token text → id; the last of duplicated texts wins (llama.cpp `token_to_id[word] = i`).
    token_to_id: HashMap<String, u32>,
    /// Merge score by id.
    scores: Vec<f32>,
    /// llama.cpp `byte_to_token`: `<0xNN>` (upper-case hex), else the one-byte text (ASCII).
    byte_tokens: [Option<u32>; 256],
}

impl SpmModel {
    /// Builds the lookup tables from a vocabulary (one hash-map insert per token).
    pub fn new(tokens: &[String], scores: Vec<f32>) -> Self {
        let mut token_to_id = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            if let Ok(id) = u32::try_from(i) {
                token_to_id.insert(t.clone(), id);
            }
        }
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = token_to_id.get(hex.as_str()).copied().or_else(|| {
                u8::try_from(b)
                    .ok()
                    .filter(u8::is_ascii)
                    .and_then(|byte| token_to_id.get(char::from(byte).to_string().as_str()))
                    .copied()
            });
        }
        Self {
            token_to_id,
            scores,
            byte_tokens,
        }
    }

    /// Id of the token whose text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// Appends the ids of one text fragment to `out`, like llama.cpp's SPM branch of
    /// `llama_vocab::impl::tokenize`: a `▁` is prepended when `prefix_space` is set (llama.cpp:
    /// `add_space_prefix && is_prev_special`), every space becomes `▁`, then the merge loop runs.
    ///
    /// # Errors
    /// [`TokenizerError::Encode`] when a character is not in the vocabulary and one of its
    /// bytes has no byte token (llama.cpp throws `std::out_of_range` there).
    pub fn encode(
        &self,
        text: &str,
        prefix_space: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        let mut escaped = String::with_capacity(text.len() + text.len() / 2 + 3);
        if prefix_space {
            escaped.push(ESCAPED_SPACE);
        }
        for ch in text.chars() {
            escaped.push(if ch == ' ' { ESCAPED_SPACE } else { ch });
        }
        self.encode_escaped(&escaped, out)
    }

    /// The merge loop of `llm_tokenizer_spm_session::tokenize` on already escaped text.
    fn encode_escaped(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        if text.is_empty() {
            return Ok(());
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (start, ch) in text.char_indices() {
            let index = symbols.len();
            symbols.push(Symbol {
                start,
                len: ch.len_utf8(),
                prev: index.wrapping_sub(1),
                next: index + 1,
            });
        }
        if let Some(last) = symbols.last_mut() {
            last.next = NONE;
        }
        // `prev` of the first symbol is 0 - 1 = usize::MAX = NONE.

        let mut queue = BinaryHeap::with_capacity(symbols.len());
        for right in 1..symbols.len() {
            self.try_add_bigram(text, &symbols, right - 1, right, &mut queue);
        }
        while let Some(bigram) = queue.pop() {
            let (left, right) = (bigram.left, bigram.right);
            let (left_len, right_len) = (symbols[left].len, symbols[right].len);
            // One side already merged away or grown since this pair was queued.
            if left_len == 0 || right_len == 0 || left_len + right_len != bigram.size {
                continue;
            }
            symbols[left].len += right_len;
            symbols[right].len = 0;
            let after = symbols[right].next;
            symbols[left].next = after;
            if after != NONE {
                symbols[after].prev = left;
            }
            let before = symbols[left].prev;
            self.try_add_bigram(text, &symbols, before, left, &mut queue);
            self.try_add_bigram(text, &symbols, left, after, &mut queue);
        }

        let mut i = if symbols.is_empty() { NONE } else { 0 };
        while i != NONE {
            let sym = &symbols[i];
            let piece = &text[sym.start..sym.start + sym.len];
            match self.token_to_id.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    // A merged symbol is always a token, so this is a single character that is
                    // not in the vocabulary (llama.cpp's `rev_merge` lookup cannot match it).
                    for &b in piece.as_bytes() {
                        let id = self.byte_tokens[usize::from(b)].ok_or_else(|| {
                            TokenizerError::Encode {
                                reason: format!(
                                    "character {piece:?} is not in the vocabulary and byte \
                                     0x{b:02X} has no byte token <0x{b:02X}>"
                                ),
                            }
                        })?;
                        out.push(id);
                    }
                }
            }
            i = sym.next;
        }
        Ok(())
    }

    /// `try_add_bigram`: queues the pair if the two symbols' concatenation is a token.
    fn try_add_bigram(
        &self,
        text: &str,
        symbols: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Bigram>,
    ) {
        if left == NONE || right == NONE {
            return;
        }
        let (l, r) = (&symbols[left], &symbols[right]);
        let size = l.len + r.len;
        let Some(&id) = self.token_to_id.get(&text[l.start..l.start + size]) else {
            return;
        };
        let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
        queue.push(Bigram {
            left,
            right,
            score,
            size,
        });
    }
}

/// One symbol of the text: a byte range, linked to its neighbours (llama.cpp `llm_symbol`).
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: usize,
    next: usize,
}

/// A candidate merge (llama.cpp `llm_bigram_spm`).
#[derive(Debug, Clone, Copy)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    /// Byte length of the merged text, to detect stale entries.
    size: usize,
}

impl Ord for Bigram {
    /// Max-heap order of `llm_bigram_spm::comparator`: higher score first, then lower `left`.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// Bytes of an SPM token as llama.cpp's `token_to_piece` gives them with `special = false`:
/// normal tokens with `▁` turned back into spaces, byte tokens as their byte, user-defined
/// tokens as their raw text, everything else (control, unknown, unused, undefined) empty.
///
/// # Errors
/// [`TokenizerError::InvalidValue`] for a byte-type token whose text is not `<0xNN>`
/// (llama.cpp would read garbage through `strtol`).
pub fn token_bytes(id: usize, text: &str, ty: TokenType) -> Result<Vec<u8>, TokenizerError> {
    Ok(match ty {
        TokenType::Normal => text.replace(ESCAPED_SPACE, " ").into_bytes(),
        TokenType::UserDefined => text.as_bytes().to_vec(),
        TokenType::Byte => {
            vec![
                parse_byte_token(text).ok_or_else(|| TokenizerError::InvalidValue {
                    key: format!("{}[{id}]", gguf::KEY_TOKENS),
                    value: super::quote(text),
                    reason: "a byte token (type 6) must be written <0xNN>".to_string(),
                })?,
            ]
        }
        _ => Vec::new(),
    })
}

/// The byte of a `<0xNN>` token text (two hex digits, either case).
pub fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny hand-made vocabulary: byte tokens for a few bytes, single characters, merges.
    fn model() -> (Vec<String>, SpmModel) {
        let entries: &[(&str, f32)] = &[
            ("<unk>", 0.0),    // 0
            ("<0x0A>", 0.0),   // 1
            ("<0xC3>", 0.0),   // 2
            ("<0xA9>", 0.0),   // 3
            ("▁", -1.0),       // 4
            ("a", -2.0),       // 5
            ("b", -2.0),       // 6
            ("c", -2.0),       // 7
            ("ab", -3.0),      // 8
            ("bc", -1.5),      // 9
            ("▁a", -0.5),      // 10
            ("▁ab", -4.0),     // 11
            ("abc", -0.1),     // 12
            ("▁▁", -0.2),      // 13
            ("▁▁▁▁", -0.3),    // 14
            ("aa", -5.0),      // 15
            ("▁abc", -0.05),   // 16
            ("▁▁▁", -9.0),     // 17
            ("<0x41>", 0.0),   // 18
            ("A", 0.0),        // 19 (the plain-text fallback is used only without <0x41>)
            ("\u{e9}x", -1.0), // 20 "éx": a token with a character that is not a token
        ];
        let tokens: Vec<String> = entries.iter().map(|(t, _)| t.to_string()).collect();
        let scores = entries.iter().map(|(_, s)| *s).collect();
        let m = SpmModel::new(&tokens, scores);
        (tokens, m)
    }

    fn enc(m: &SpmModel, text: &str, prefix: bool) -> Vec<u32> {
        let mut out = Vec::new();
        m.encode(text, prefix, &mut out).expect("encode");
        out
    }

    #[test]
    fn merges_follow_scores_and_leftmost_ties() {
        let (_, m) = model();
        // "abc": ab(-3) vs bc(-1.5): bc merges first, then a+bc = "abc" (-0.1).
        assert_eq!(enc(&m, "abc", false), vec![12]);
        // "▁abc": ▁a(-0.5) and bc(-1.5): ▁a first; then ▁a+b = "▁ab"(-4) and b+c = bc(-1.5):
        // bc; then ▁a+bc = "▁abc"(-0.05).
        assert_eq!(enc(&m, "abc", true), vec![16]);
        // "aaa": aa(-5) at 0 and 1 tie: the leftmost merges, the last a stays.
        assert_eq!(enc(&m, "aaa", false), vec![15, 5]);
        // "ab" alone merges to ab.
        assert_eq!(enc(&m, "ab", false), vec![8]);
    }

    #[test]
    fn whitespace_runs_are_escaped_and_merged() {
        let (_, m) = model();
        // 5 spaces: ▁▁(-0.2) pairs at 0..4 tie, leftmost first: (▁▁)(▁▁)▁, then ▁▁+▁▁ = ▁▁▁▁
        // (-0.3) vs ▁▁+▁ = ▁▁▁ (-9): ▁▁▁▁ then ▁.
        assert_eq!(enc(&m, "     ", false), vec![14, 4]);
        // 3 spaces: (▁▁)▁ then ▁▁▁ (-9).
        assert_eq!(enc(&m, "   ", false), vec![17]);
        // prefix space + "a b": ▁a ▁ b -> [▁a, ▁, b]; ▁+b is no token.
        assert_eq!(enc(&m, "a b", true), vec![10, 4, 6]);
        assert!(enc(&m, "", false).is_empty());
        assert_eq!(enc(&m, "", true), vec![4]);
    }

    #[test]
    fn byte_fallback_for_unknown_characters() {
        let (_, m) = model();
        // "\n" is no token: <0x0A>. "é" is no token: <0xC3><0xA9>.
        assert_eq!(enc(&m, "a\né", false), vec![5, 1, 2, 3]);
        // "é" next to "x" merges into the token "éx" even though "é" alone is not a token
        // (llama.cpp merges by concatenation; a merges-list BPE would not).
        assert_eq!(enc(&m, "éx", false), vec![20]);
        // <0x41> wins over the plain one-byte text "A".
        assert_eq!(m.byte_tokens[0x41], Some(18));
        // A byte with no token at all is an error, not a panic.
        let mut out = Vec::new();
        let err = m.encode("ü", false, &mut out).expect_err("no byte token");
        assert!(err.to_string().contains("byte 0xBC"), "{err}");
    }

    #[test]
    fn token_bytes_like_token_to_piece() {
        assert_eq!(
            token_bytes(0, "▁a▁b", TokenType::Normal).expect("ok"),
            b" a b"
        );
        assert_eq!(
            token_bytes(0, "<0x0A>", TokenType::Byte).expect("ok"),
            b"\n"
        );
        assert_eq!(
            token_bytes(0, "▁<x>", TokenType::UserDefined).expect("ok"),
            "▁<x>".as_bytes()
        );
        assert!(token_bytes(0, "<s>", TokenType::Control)
            .expect("ok")
            .is_empty());
        assert!(token_bytes(7, "<0xZZ>", TokenType::Byte)
            .expect_err("bad byte token")
            .to_string()
            .contains("tokenizer.ggml.tokens[7]"));
        assert_eq!(parse_byte_token("<0xff>"), Some(0xFF));
        assert_eq!(parse_byte_token("<0x1>"), None);
    }
}
