//! Stop-sequence matching on decoded text, across token boundaries, with hold-back.
//!
//! Text that might be the beginning of a stop string is not released until the
//! following text rules the stop out (then it is released) or completes it (then it
//! is cut, with everything after it). The held text is always the longest suffix of
//! the not-yet-released text that is a proper prefix of some stop string, so it is
//! shorter than the longest stop string. A push of `t` bytes costs
//! O(#stops · (t + L)) for the search plus O(#stops · L²) for the hold-back check,
//! with `L` the longest stop's length: never proportional to the text generated so far.
//!
//! Semantics follow vLLM / llama.cpp server: generation ends as soon as any stop
//! string appears in the output; the stop string is not part of the output.

/// Stop-sequence matcher (one per generated sequence).
#[derive(Debug, Clone)]
pub struct StopMatcher {
    /// Non-empty stop strings.
    stops: Vec<String>,
    /// Length in bytes of the longest stop string (0 when there are none).
    max_len: usize,
    /// Text not yet released: always a proper prefix of some stop string while not stopped.
    held: String,
    /// A stop string matched; everything afterwards is dropped.
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`. Empty strings are ignored (they would match before any
    /// text); duplicates are harmless.
    pub fn new(stops: Vec<String>) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        Self {
            stops,
            max_len,
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Bytes of text currently held back as a possible stop-string prefix.
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Adds decoded `text` and appends to `out` what can be released now. Returns
    /// `true` when a stop string matched: then `out` receives the text before the
    /// earliest-starting match, the rest is dropped, and later pushes release nothing.
    pub fn push(&mut self, text: &str, out: &mut String) -> bool {
        if self.stopped {
            return true;
        }
        if self.stops.is_empty() {
            out.push_str(text);
            return false;
        }
        if text.is_empty() {
            return false;
        }
        // The held text contained no complete stop string, so any match must end in
        // `text`; searching `held + text` (held < max_len bytes) finds them all.
        self.held.push_str(text);
        if let Some(start) = self.earliest_match() {
            out.push_str(&self.held[..start]);
            self.held.clear();
            self.stopped = true;
            return true;
        }
        let keep = self.longest_stop_prefix_suffix();
        let release = self.held.len() - keep;
        out.push_str(&self.held[..release]);
        self.held.drain(..release);
        false
    }

    /// Ends the text stream without a stop: appends the held text to `out` (nothing
    /// once stopped). The matcher can then keep going as if freshly started.
    pub fn finish(&mut self, out: &mut String) {
        if !self.stopped {
            out.push_str(&self.held);
        }
        self.held.clear();
    }

    /// Byte offset in `held` of the earliest-starting complete stop string.
    fn earliest_match(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
    }

    /// Length of the longest suffix of `held` (starting on a char boundary) that is a
    /// proper prefix of some stop string; 0 when none.
    fn longest_stop_prefix_suffix(&self) -> usize {
        let len = self.held.len();
        // A proper prefix of a stop is at most max_len - 1 bytes long.
        let first = len.saturating_sub(self.max_len.saturating_sub(1));
        for start in first..len {
            if !self.held.is_char_boundary(start) {
                continue;
            }
            let suffix = &self.held[start..];
            if self.stops.iter().any(|s| s.starts_with(suffix)) {
                return len - start;
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (Vec<String>, bool, String) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut outs = Vec::new();
        let mut stopped = false;
        for c in chunks {
            let mut o = String::new();
            stopped = m.push(c, &mut o);
            outs.push(o);
        }
        let mut tail = String::new();
        m.finish(&mut tail);
        (outs, stopped, tail)
    }

    #[test]
    fn no_stops_passes_through() {
        let (outs, stopped, tail) = run(&[], &["ab", "c"]);
        assert_eq!(outs, vec!["ab", "c"]);
        assert!(!stopped);
        assert_eq!(tail, "");
    }

    #[test]
    fn held_suffix_is_longest_prefix() {
        let (outs, stopped, tail) = run(&["abc"], &["xxab"]);
        assert_eq!(outs, vec!["xx"]);
        assert!(!stopped);
        assert_eq!(tail, "ab");
    }

    #[test]
    fn empty_stop_strings_ignored() {
        let (outs, stopped, _) = run(&["", "END"], &["hi"]);
        assert_eq!(outs, vec!["hi"]);
        assert!(!stopped);
    }

    #[test]
    fn earliest_start_wins_when_two_complete_in_one_push() {
        let (outs, stopped, tail) = run(&["cd", "bcde"], &["abcdef"]);
        assert_eq!(outs, vec!["a"]);
        assert!(stopped);
        assert_eq!(tail, "");
    }

    #[test]
    fn stop_completes_as_soon_as_it_appears() {
        // "bc" is complete before "abcd" could be: generation stops at "bc".
        let (outs, stopped, _) = run(&["abcd", "bc"], &["a", "b", "c", "d"]);
        assert_eq!(outs, vec!["", "", "a", ""]);
        assert!(stopped);
    }
}
