//! [`OutputStream`]: per-sequence detokenization = incremental UTF-8 decoding
//! ([`Utf8Decoder`]) followed by stop-sequence matching ([`StopMatcher`]).

use super::stop::StopMatcher;
use super::utf8::Utf8Decoder;

/// What one [`OutputStream::push`] releases.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Emit {
    /// Text that may be sent to the client now: whole UTF-8 characters only, never
    /// any part of a stop string. May be empty (bytes or a stop prefix held back).
    pub text: String,
    /// A stop sequence matched: `text` is everything before it, the stop and all that
    /// follows are dropped, and generation should end with `finish_reason = stop`.
    pub stopped: bool,
}

/// Turns the raw bytes of generated tokens into releasable text (one per sequence).
///
/// Guarantees:
/// - every released piece is valid UTF-8 made of whole characters; a character
///   split across tokens is released with its last byte;
/// - invalid bytes become U+FFFD exactly as `String::from_utf8_lossy` of all bytes;
/// - without a stop, the concatenation of all [`push`](Self::push) texts and
///   [`finish`](Self::finish) equals `String::from_utf8_lossy(all bytes)`;
/// - with a stop, the concatenation equals that text cut before the stop occurrence
///   (the earliest-starting one among those completed by the same push);
/// - work per push is linear in the token's bytes plus the stop strings' lengths.
#[derive(Debug, Clone)]
pub struct OutputStream {
    decoder: Utf8Decoder,
    matcher: StopMatcher,
    /// Reused buffer for decoded text before stop matching.
    decoded: String,
    /// `finish` was called: later pushes release nothing.
    finished: bool,
}

impl OutputStream {
    /// A stream that ends at the first occurrence of any of `stop` (empty strings are
    /// ignored; an empty list means no stop sequences).
    pub fn new(stop: Vec<String>) -> Self {
        Self {
            decoder: Utf8Decoder::new(),
            matcher: StopMatcher::new(stop),
            decoded: String::new(),
            finished: false,
        }
    }

    /// Whether a stop sequence has matched (from a push or from `finish`).
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Feeds the raw bytes of one generated token (byte-level BPE bytes; may be part
    /// of a UTF-8 character, or empty for a control token) and returns what may be
    /// released now. After a stop matched, or after [`finish`](Self::finish), pushes
    /// are ignored and return empty text (`stopped` still reports an earlier stop).
    pub fn push(&mut self, token_bytes: &[u8]) -> Emit {
        let mut emit = Emit {
            text: String::new(),
            stopped: self.matcher.is_stopped(),
        };
        if emit.stopped || self.finished {
            return emit;
        }
        self.decoded.clear();
        self.decoder.push(token_bytes, &mut self.decoded);
        emit.stopped = self.matcher.push(&self.decoded, &mut emit.text);
        emit
    }

    /// Generation ended for another reason (EOS, length, cancel): returns everything
    /// still held — incomplete UTF-8 bytes as one U+FFFD (as `from_utf8_lossy` would)
    /// and any held stop-string prefix. If the flushed U+FFFD completes a stop string,
    /// the text is cut there as in `push`. Returns `""` after a stop or a second call.
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        if self.finished || self.matcher.is_stopped() {
            self.finished = true;
            return out;
        }
        self.finished = true;
        self.decoded.clear();
        self.decoder.finish(&mut self.decoded);
        if !self.matcher.push(&self.decoded, &mut out) {
            self.matcher.finish(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn stream(stops: &[&str]) -> OutputStream {
        OutputStream::new(stops.iter().map(|s| s.to_string()).collect())
    }

    /// Pushes each chunk; returns the texts, the `stopped` flags and `finish()`.
    fn run(stops: &[&str], chunks: &[&[u8]]) -> (Vec<String>, Vec<bool>, String) {
        let mut s = stream(stops);
        let (mut texts, mut flags) = (Vec::new(), Vec::new());
        for c in chunks {
            let e = s.push(c);
            texts.push(e.text);
            flags.push(e.stopped);
        }
        (texts, flags, s.finish())
    }

    #[test]
    fn emoji_split_over_four_tokens_waits_for_last_byte() {
        let b = "😀".as_bytes();
        let (texts, flags, tail) = run(&[], &[&b[..1], &b[1..2], &b[2..3], &b[3..]]);
        assert_eq!(texts, vec!["", "", "", "😀"]);
        assert_eq!(flags, vec![false; 4]);
        assert_eq!(tail, "");
    }

    #[test]
    fn two_byte_chars_split_and_control_token() {
        // "Grüße" with ü = C3 BC, ß = C3 9F split across tokens, plus an empty control token.
        let (texts, _, tail) = run(&[], &[b"Gr\xC3", b"\xBC\xC3", b"", b"\x9Fe"]);
        assert_eq!(texts, vec!["Gr", "ü", "", "ße"]);
        assert_eq!(tail, "");
    }

    #[test]
    fn invalid_bytes_become_replacement() {
        let (texts, _, tail) = run(&[], &[b"a\xFF", b"\xE2\x82", b"b", b"\xC3"]);
        assert_eq!(texts, vec!["a\u{FFFD}", "", "\u{FFFD}b", ""]);
        assert_eq!(tail, "\u{FFFD}");
        assert_eq!(
            texts.concat() + &tail,
            String::from_utf8_lossy(b"a\xFF\xE2\x82b\xC3")
        );
    }

    #[test]
    fn stop_inside_one_token() {
        let (texts, flags, tail) = run(&["STOP"], &[b"Hello", b" worldSTOPmore", b"x"]);
        assert_eq!(texts, vec!["Hello", " world", ""]);
        assert_eq!(flags, vec![false, true, true]);
        assert_eq!(tail, "");
    }

    #[test]
    fn stop_across_two_tokens() {
        let (texts, flags, _) = run(&["\n\n"], &[b"line\n", b"\nnext"]);
        assert_eq!(texts, vec!["line", ""]);
        assert_eq!(flags, vec![false, true]);
    }

    #[test]
    fn stop_across_three_tokens() {
        let (texts, flags, _) = run(&["<|im_end|>"], &[b"ok <|", b"im_", b"end|> tail"]);
        assert_eq!(texts, vec!["ok ", "", ""]);
        assert_eq!(flags, vec![false, false, true]);
    }

    #[test]
    fn stop_at_start() {
        let (texts, flags, tail) = run(&["User:"], &[b"User:", b" hi"]);
        assert_eq!(texts, vec!["", ""]);
        assert_eq!(flags, vec![true, true]);
        assert_eq!(tail, "");
    }

    #[test]
    fn stop_with_multibyte_chars_split_mid_char() {
        // Stop "→ end"; "→" = E2 86 92, split inside the character.
        let (texts, flags, _) = run(&["→ end"], &[b"a \xE2", b"\x86", b"\x92 e", b"nd!"]);
        assert_eq!(texts, vec!["a ", "", "", ""]);
        assert_eq!(flags, vec![false, false, false, true]);
        // Same prefix but not the stop: released whole once ruled out.
        let (texts, flags, tail) = run(&["→ end"], &[b"a \xE2", b"\x86\x92", b" x"]);
        assert_eq!(texts, vec!["a ", "", "→ x"]);
        assert_eq!(flags, vec![false; 3]);
        assert_eq!(tail, "");
    }

    #[test]
    fn hold_back_respects_char_boundaries() {
        // Stop "éa": text ending in "é" holds exactly "é" (2 bytes), never half of it.
        let (texts, _, tail) = run(&["éa"], &["xé".as_bytes(), "é".as_bytes()]);
        assert_eq!(texts, vec!["x", "é"]);
        assert_eq!(tail, "é");
    }

    #[test]
    fn one_stop_prefix_of_another() {
        let (texts, flags, _) = run(&["<|end|>", "<|end"], &[b"hi <|", b"end", b"|>"]);
        assert_eq!(texts, vec!["hi ", "", ""]);
        assert_eq!(flags, vec![false, true, true]);
        // Both complete in one push: cut at the earliest start.
        let (texts, flags, _) = run(&["ab", "abc"], &[b"xabcy"]);
        assert_eq!(texts, vec!["x"]);
        assert_eq!(flags, vec![true]);
    }

    #[test]
    fn false_partial_match_released_later() {
        let (texts, flags, tail) = run(&["</answer>"], &[b"a </", b"ans", b"wer", b"s> b"]);
        assert_eq!(texts, vec!["a ", "", "", "</answers> b"]);
        assert_eq!(flags, vec![false; 4]);
        assert_eq!(tail, "");
        // A new partial match can start inside the released false one.
        let (texts, _, tail) = run(&["aab"], &[b"aa", b"aa"]);
        assert_eq!(texts, vec!["", "aa"]);
        assert_eq!(tail, "aa");
    }

    #[test]
    fn finish_flushes_held_prefix_and_bytes() {
        let (texts, flags, tail) = run(&["###"], &[b"x #", b"#\xF0\x9F"]);
        assert_eq!(texts, vec!["x ", ""]);
        assert_eq!(flags, vec![false, false]);
        assert_eq!(tail, "##\u{FFFD}");
        let (texts, _, tail) = run(&["###"], &[b"x ##"]);
        assert_eq!(texts, vec!["x "]);
        assert_eq!(tail, "##");
    }

    #[test]
    fn finish_can_complete_a_stop_with_replacement_char() {
        let mut s = stream(&["a\u{FFFD}"]);
        assert_eq!(s.push(b"xa\xC3").text, "x");
        assert_eq!(s.finish(), "");
        assert!(s.is_stopped());
    }

    #[test]
    fn pushes_after_finish_are_ignored() {
        let mut s = stream(&[]);
        assert_eq!(s.push(b"a").text, "a");
        assert_eq!(s.finish(), "");
        assert_eq!(s.push(b"b"), Emit::default());
        assert_eq!(s.finish(), "");
    }

    /// Random text of valid characters and invalid byte sequences.
    fn random_bytes(rng: &mut ChaCha8Rng) -> Vec<u8> {
        const PIECES: &[&[u8]] = &[
            b"a",
            b"b",
            b"x",
            b" ",
            b"\n",
            "é".as_bytes(),
            "€".as_bytes(),
            "😀".as_bytes(),
            "ß".as_bytes(),
            "\u{FFFD}".as_bytes(),
            b"\x80",
            b"\xFF",
            b"\xC3",
            b"\xE2\x82",
            b"\xF0\x9F\x98",
            b"\xED\xA0\x80",
            b"\xC0\xAF",
        ];
        let n = rng.random_range(0..60);
        (0..n)
            .flat_map(|_| PIECES[rng.random_range(0..PIECES.len())].iter().copied())
            .collect()
    }

    /// Splits `bytes` at random positions (chunks of 0–6 bytes, empty ones included).
    fn random_split<'a>(rng: &mut ChaCha8Rng, bytes: &'a [u8]) -> Vec<&'a [u8]> {
        let mut chunks = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            let n = rng.random_range(0..=6).min(bytes.len() - i);
            chunks.push(&bytes[i..i + n]);
            i += n;
        }
        chunks
    }

    #[test]
    fn randomized_concat_equals_lossy_without_stops() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
        for _ in 0..3000 {
            let bytes = random_bytes(&mut rng);
            let chunks = random_split(&mut rng, &bytes);
            let mut s = stream(&[]);
            let mut all = String::new();
            for c in &chunks {
                let e = s.push(c);
                assert!(!e.stopped);
                // Whole characters only: valid UTF-8 by type; also no stray U+FFFD for
                // a character merely split (checked by the concatenation below).
                assert!(std::str::from_utf8(e.text.as_bytes()).is_ok());
                all.push_str(&e.text);
            }
            all.push_str(&s.finish());
            assert_eq!(all, String::from_utf8_lossy(&bytes), "chunks {chunks:?}");
        }
    }

    #[test]
    fn randomized_stops_cut_at_first_occurrence() {
        // Stop sets where no stop is a substring of another, so the first occurrence
        // (earliest start = earliest end) is the reference cut point.
        let stop_sets: &[&[&str]] = &[
            &["ab"],
            &["ab", "ba"],
            &["é€", "x\u{FFFD}"],
            &["😀 ", "aaa"],
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..3000 {
            let stops = stop_sets[rng.random_range(0..stop_sets.len())];
            let bytes = random_bytes(&mut rng);
            let chunks = random_split(&mut rng, &bytes);
            let full = String::from_utf8_lossy(&bytes);
            let cut = stops.iter().filter_map(|s| full.find(s)).min();
            let mut s = stream(stops);
            let mut all = String::new();
            let mut stopped = false;
            for c in &chunks {
                let e = s.push(c);
                stopped |= e.stopped;
                all.push_str(&e.text);
                // Never release part of a stop: the released text never extends past the cut.
                if let Some(cut) = cut {
                    assert!(all.len() <= cut);
                }
            }
            all.push_str(&s.finish());
            match cut {
                Some(cut) => {
                    assert_eq!(all, full[..cut], "stops {stops:?} chunks {chunks:?}");
                    assert!(s.is_stopped());
                }
                None => {
                    assert_eq!(all, full, "stops {stops:?} chunks {chunks:?}");
                    assert!(!stopped && !s.is_stopped());
                }
            }
        }
    }
}
