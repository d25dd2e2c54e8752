//! Incremental byte → text decoding that releases whole UTF-8 characters only.
//!
//! Byte-level BPE tokens carry raw bytes, so one character may be split across
//! several tokens and a model may emit byte sequences that are not UTF-8 at all.
//! [`Utf8Decoder`] keeps the (at most 3) trailing bytes of an incomplete character
//! and replaces invalid bytes with U+FFFD using exactly the rule of
//! [`String::from_utf8_lossy`]: one U+FFFD per *maximal invalid subpart* (the
//! "substitution of maximal subparts" practice of the Unicode Standard, ch. 3,
//! U+FFFD substitution), which is what [`std::str::Utf8Error::error_len`] reports.
//!
//! Invariant: for any split of a byte string `b` into pushes, the concatenation of
//! everything written by [`Utf8Decoder::push`] and [`Utf8Decoder::finish`] equals
//! `String::from_utf8_lossy(b)`.

/// The replacement character written for invalid or truncated byte sequences.
pub const REPLACEMENT: char = '\u{FFFD}';

/// Incremental UTF-8 decoder (one per generated sequence).
///
/// Work per push is linear in the pushed bytes plus at most 3 held bytes.
#[derive(Debug, Clone, Default)]
pub struct Utf8Decoder {
    /// Bytes of an incomplete (but so far valid) character, at most 3.
    pending: Vec<u8>,
    /// Reused buffer joining `pending` with the next pushed bytes.
    scratch: Vec<u8>,
}

impl Utf8Decoder {
    /// A decoder with nothing held.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of bytes held back because they may start a character not yet complete (0–3).
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Decodes `bytes` (appended to any held bytes) and appends the text of every
    /// complete character to `out`; invalid bytes become U+FFFD. A trailing
    /// incomplete character is held until a later push completes or invalidates it,
    /// or until [`finish`](Self::finish).
    pub fn push(&mut self, bytes: &[u8], out: &mut String) {
        if bytes.is_empty() {
            return;
        }
        let mut input = std::mem::take(&mut self.scratch);
        input.clear();
        input.extend_from_slice(&self.pending);
        input.extend_from_slice(bytes);
        self.pending.clear();

        let mut rest: &[u8] = &input;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` is valid UTF-8 by the contract of `valid_up_to`.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        // A maximal invalid subpart of `n` bytes: one replacement, go on.
                        Some(n) => {
                            out.push(REPLACEMENT);
                            rest = &after[n..];
                        }
                        // Input ends inside a character that may still complete: hold it.
                        None => {
                            self.pending.extend_from_slice(after);
                            break;
                        }
                    }
                }
            }
        }
        self.scratch = input;
    }

    /// Ends the byte stream: held bytes of an incomplete character become one
    /// U+FFFD (as `String::from_utf8_lossy` does for a truncated sequence at the
    /// end of its input). The decoder is empty afterwards and may be reused.
    pub fn finish(&mut self, out: &mut String) {
        if !self.pending.is_empty() {
            out.push_str(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_split(chunks: &[&[u8]]) -> (Vec<String>, String) {
        let mut d = Utf8Decoder::new();
        let mut outs = Vec::new();
        for c in chunks {
            let mut s = String::new();
            d.push(c, &mut s);
            outs.push(s);
        }
        let mut tail = String::new();
        d.finish(&mut tail);
        (outs, tail)
    }

    #[test]
    fn four_byte_emoji_split_over_four_pushes() {
        let b = "😀".as_bytes();
        assert_eq!(b, &[0xF0, 0x9F, 0x98, 0x80]);
        let (outs, tail) = decode_split(&[&b[0..1], &b[1..2], &b[2..3], &b[3..4]]);
        assert_eq!(outs, vec!["", "", "", "😀"]);
        assert_eq!(tail, "");
    }

    #[test]
    fn two_byte_chars_split() {
        // "é" = C3 A9, "ß" = C3 9F
        let (outs, tail) = decode_split(&[b"a\xC3", b"\xA9\xC3", b"\x9Fb"]);
        assert_eq!(outs, vec!["a", "é", "ßb"]);
        assert_eq!(tail, "");
    }

    #[test]
    fn invalid_bytes_match_lossy() {
        // Lone continuation, overlong, surrogate, bad lead, truncated 3-byte then ASCII.
        let cases: &[&[u8]] = &[
            b"\x80",
            b"\xC0\xAF",
            b"\xED\xA0\x80",
            b"\xFF\xFEa",
            b"\xE2\x82a",
            b"\xF0\x9F\x98",
        ];
        for bytes in cases {
            let (outs, tail) = decode_split(&[bytes]);
            let got = outs.concat() + &tail;
            assert_eq!(got, String::from_utf8_lossy(bytes), "bytes {bytes:?}");
        }
        // Concrete values: "\xE2\x82a" → one U+FFFD for the truncated "€" then "a".
        let (outs, tail) = decode_split(&[b"\xE2", b"\x82", b"a"]);
        assert_eq!(outs, vec!["", "", "\u{FFFD}a"]);
        assert_eq!(tail, "");
        // Overlong C0 AF → two replacements (C0 is never valid).
        let (outs, _) = decode_split(&[b"\xC0", b"\xAF"]);
        assert_eq!(outs, vec!["\u{FFFD}", "\u{FFFD}"]);
    }

    #[test]
    fn truncated_char_at_end_flushed_as_one_replacement() {
        let (outs, tail) = decode_split(&[b"ok\xF0\x9F", b"\x98"]);
        assert_eq!(outs, vec!["ok", ""]);
        assert_eq!(tail, "\u{FFFD}");
        assert_eq!(
            outs.concat() + &tail,
            String::from_utf8_lossy(b"ok\xF0\x9F\x98")
        );
    }

    #[test]
    fn empty_push_changes_nothing() {
        let (outs, tail) = decode_split(&[b"\xC3", b"", b"\xA9"]);
        assert_eq!(outs, vec!["", "", "é"]);
        assert_eq!(tail, "");
    }
}
