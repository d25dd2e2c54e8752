//! `ban_words`: a logits processor that guarantees the generated text (the concatenated
//! bytes of the generated tokens) never contains any of the configured words.
//!
//! Config: `{"words": ["Paris", ...]}`, 1 to 64 non-empty strings of at most 256 bytes.
//!
//! A word can appear in the text in two ways when the next token `t` is appended:
//! entirely inside `t` (the *static* ban: precomputed in `configure`), or starting in
//! the text generated so far and ending inside `t`: when the text ends with `w[..k]`,
//! every token whose bytes start with `w[k..]` is banned (the *dynamic* ban). Tokens are
//! kept sorted by bytes, so "every token starting with X" is one binary-searched range,
//! and a step costs O(words × word length² + banned tokens), not O(vocabulary).
//!
//! Control tokens (e.g. `<|im_end|>`) are not text: they are never banned and add no
//! bytes to the generated text.
#![no_std]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use guest_support::{show, Config, Global};

wit_bindgen::generate!({ path: "../../wit", world: "logits-processor-plugin" });

use exports::inferd::plugin::logits_processor::{Guest, LogitsEdit, PluginInfo, StepContext};
use inferd::plugin::host;

/// Most words a config may list.
const MAX_WORDS: usize = 64;
/// Longest word, in bytes.
const MAX_WORD_BYTES: usize = 256;

/// The vocabulary as byte strings, with what `ban_words` precomputes from it.
pub struct Matcher {
    /// The banned words (non-empty byte strings).
    words: Vec<Vec<u8>>,
    /// Concatenated bytes of every token, in id order.
    bytes: Vec<u8>,
    /// Start of each token in `bytes`, plus the total length at the end.
    offsets: Vec<u32>,
    /// `is_control[id]`: the token is a control token (no text; never banned).
    is_control: Vec<bool>,
    /// Tokens whose bytes contain a word, ascending: banned at every step.
    static_bans: Vec<u32>,
    /// Every other non-control, non-empty token, sorted by bytes.
    sorted: Vec<u32>,
    /// Length of the longest word, in bytes.
    max_word_len: usize,
}

impl Matcher {
    /// Precomputes the static bans and the sorted token table.
    ///
    /// `offsets` must have `vocabulary size + 1` non-decreasing entries within `bytes`.
    pub fn new(words: Vec<Vec<u8>>, bytes: Vec<u8>, offsets: Vec<u32>, control: &[u32]) -> Self {
        let vocab = offsets.len().saturating_sub(1);
        let mut is_control = alloc::vec![false; vocab];
        for &id in control {
            if let Some(slot) = is_control.get_mut(id as usize) {
                *slot = true;
            }
        }
        let mut matcher = Self {
            max_word_len: words.iter().map(Vec::len).max().unwrap_or(0),
            words,
            bytes,
            offsets,
            is_control,
            static_bans: Vec::new(),
            sorted: Vec::new(),
        };
        for id in 0..vocab as u32 {
            if matcher.is_control[id as usize] {
                continue;
            }
            let token = matcher.token(id);
            if matcher.words.iter().any(|w| contains(token, w)) {
                matcher.static_bans.push(id);
            } else if !token.is_empty() {
                matcher.sorted.push(id);
            }
        }
        let (bytes, offsets) = (&matcher.bytes, &matcher.offsets);
        matcher
            .sorted
            .sort_unstable_by(|&a, &b| slice(bytes, offsets, a).cmp(slice(bytes, offsets, b)));
        matcher
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.is_control.len()
    }

    /// Longest word length in bytes; the text tail must keep this many bytes minus one.
    pub fn max_word_len(&self) -> usize {
        self.max_word_len
    }

    /// The bytes of token `id` (empty if out of range).
    fn token(&self, id: u32) -> &[u8] {
        slice(&self.bytes, &self.offsets, id)
    }

    /// The bytes token `id` adds to the generated text: none for control tokens and
    /// out-of-range ids.
    pub fn text_bytes(&self, id: u32) -> &[u8] {
        match self.is_control.get(id as usize) {
            Some(false) => self.token(id),
            _ => &[],
        }
    }

    /// Index range in `sorted` of the tokens whose bytes start with `prefix`.
    fn prefix_range(&self, prefix: &[u8]) -> (usize, usize) {
        let start = self.sorted.partition_point(|&id| self.token(id) < prefix);
        let len = self.sorted[start..].partition_point(|&id| self.token(id).starts_with(prefix));
        (start, start + len)
    }

    /// Every token that must not follow a text ending with `tail`: the static bans plus
    /// each token starting with `w[k..]` where `tail` ends with `w[..k]`. No duplicates.
    pub fn banned(&self, tail: &[u8]) -> Vec<u32> {
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        for word in &self.words {
            for k in 1..word.len() {
                if tail.ends_with(&word[..k]) {
                    let range = self.prefix_range(&word[k..]);
                    if range.0 < range.1 {
                        ranges.push(range);
                    }
                }
            }
        }
        // Ranges over `sorted` are disjoint or nested (one remainder a prefix of the
        // other): merge them so each token is listed once.
        ranges.sort_unstable();
        let mut out = self.static_bans.clone();
        let mut covered = 0;
        for (start, end) in ranges {
            let start = start.max(covered);
            if start < end {
                out.extend_from_slice(&self.sorted[start..end]);
                covered = end;
            }
        }
        out
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

/// Whether `needle` (non-empty) occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Appends `bytes` to `tail`, keeping only its last `keep` bytes.
pub fn push_tail(tail: &mut Vec<u8>, bytes: &[u8], keep: usize) {
    tail.extend_from_slice(bytes);
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
    }
}

/// Validates the config and returns the words as byte strings.
pub fn parse_words(config: &str) -> Result<Vec<Vec<u8>>, String> {
    let config = Config::parse(config, &["words"])?;
    let Some(value) = config.get("words") else {
        return Err(format!(
            "words: required, a list of 1 to {MAX_WORDS} non-empty strings"
        ));
    };
    let Some(list) = value.as_array() else {
        return Err(format!(
            "words: must be a list of strings, got {}",
            show(value)
        ));
    };
    if list.is_empty() || list.len() > MAX_WORDS {
        return Err(format!(
            "words: must have 1 to {MAX_WORDS} entries, got {}",
            list.len()
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, item)| match item.as_str() {
            Some(s) if !s.is_empty() && s.len() <= MAX_WORD_BYTES => Ok(s.as_bytes().to_vec()),
            _ => Err(format!(
                "words[{i}]: must be a non-empty string of at most {MAX_WORD_BYTES} bytes, got {}",
                show(item)
            )),
        })
        .collect()
}

/// Per-request state, set by `configure`.
struct State {
    /// The precomputed vocabulary tables.
    matcher: Matcher,
    /// The last `max_word_len - 1` bytes of the generated text.
    tail: Vec<u8>,
    /// How many of `ctx.generated` are already folded into `tail`.
    consumed: usize,
}

/// The state of this instance (one request).
static STATE: Global<Option<State>> = Global::new(None);

/// The exported component.
struct BanWords;

impl Guest for BanWords {
    /// Name, version and description of the plugin.
    fn info() -> PluginInfo {
        PluginInfo {
            name: "ban_words".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Bans tokens so the generated text never contains any listed word".into(),
        }
    }

    /// Validates `config` and sets up the per-request state.
    fn configure(config: String, _seed: u64) -> Result<(), String> {
        let words = parse_words(&config)?;
        let blob = host::vocab_bytes();
        let special = host::special_tokens();
        let matcher = Matcher::new(words, blob.bytes, blob.offsets, &special.control);
        STATE.with(|s| {
            *s = Some(State {
                matcher,
                tail: Vec::new(),
                consumed: 0,
            })
        });
        Ok(())
    }

    /// One decode step.
    fn process(ctx: StepContext, _logits: Vec<f32>) -> Result<LogitsEdit, String> {
        STATE.with(|s| {
            let state = s
                .as_mut()
                .ok_or("ban_words: process called before configure")?;
            let keep = state.matcher.max_word_len() - 1;
            if ctx.generated.len() < state.consumed {
                // Not expected (one instance per request); start over from the list.
                state.tail.clear();
                state.consumed = 0;
            }
            for &id in &ctx.generated[state.consumed..] {
                push_tail(&mut state.tail, state.matcher.text_bytes(id), keep);
            }
            state.consumed = ctx.generated.len();
            let banned = state.matcher.banned(&state.tail);
            Ok(if banned.is_empty() {
                LogitsEdit::Keep
            } else {
                LogitsEdit::Ban(banned)
            })
        })
    }
}

export!(BanWords);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use alloc::vec;

    /// A toy vocabulary; id 7 is a control token.
    fn matcher(words: &[&str]) -> Matcher {
        let tokens = [
            "P", "aris", "ar", "is", " Paris", "Pa", "ris!", "<|end|>", "x", "Par", "s",
        ];
        let mut bytes = Vec::new();
        let mut offsets = vec![0u32];
        for t in tokens {
            bytes.extend_from_slice(t.as_bytes());
            offsets.push(bytes.len() as u32);
        }
        let words = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        Matcher::new(words, bytes, offsets, &[7])
    }

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v
    }

    #[test]
    fn static_and_dynamic_bans() {
        let m = matcher(&["Paris"]);
        assert_eq!(m.banned(b""), vec![4]);
        // Text ends with "P": ban tokens starting with "aris".
        assert_eq!(sorted(m.banned(b"xP")), vec![1, 4]);
        // Ends with "Pa": tokens starting with "ris".
        assert_eq!(sorted(m.banned(b"Pa")), vec![4, 6]);
        // Ends with "Par": tokens starting with "is".
        assert_eq!(sorted(m.banned(b"Par")), vec![3, 4]);
        // Ends with "Pari": tokens starting with "s".
        assert_eq!(sorted(m.banned(b"Pari")), vec![4, 10]);
    }

    #[test]
    fn nested_ranges_are_deduplicated() {
        // "aa" after "a" bans tokens starting with "a"; "aar" after "a" bans those
        // starting with "ar" (nested in the first range).
        let m = matcher(&["aar", "aa"]);
        assert_eq!(sorted(m.banned(b"a")), vec![1, 2]);
    }

    #[test]
    fn control_tokens_are_not_text() {
        let m = matcher(&["<|end|>", "x"]);
        assert_eq!(sorted(m.banned(b"")), vec![8]);
        assert_eq!(m.text_bytes(7), b"");
        assert_eq!(m.text_bytes(99), b"");
    }

    #[test]
    fn tail_keeps_last_bytes() {
        let mut tail = Vec::new();
        push_tail(&mut tail, b"abcdef", 4);
        assert_eq!(tail, b"cdef");
        push_tail(&mut tail, b"g", 4);
        assert_eq!(tail, b"defg");
        push_tail(&mut tail, b"", 0);
        assert!(tail.is_empty());
    }

    #[test]
    fn config_validation() {
        assert_eq!(parse_words(r#"{"words": ["a", "bc"]}"#).unwrap().len(), 2);
        assert_eq!(
            parse_words(r#"{"words": []}"#).unwrap_err(),
            "words: must have 1 to 64 entries, got 0"
        );
        assert_eq!(
            parse_words(r#"{"words": ["a", ""]}"#).unwrap_err(),
            "words[1]: must be a non-empty string of at most 256 bytes, got \"\""
        );
        assert!(parse_words("{}")
            .unwrap_err()
            .starts_with("words: required"));
        assert!(parse_words(r#"{"word": ["a"]}"#)
            .unwrap_err()
            .starts_with("word: unknown field"));
    }
}
