//! Incremental scanning of the JSON object of one tool call,
//! `{"name": "…", "arguments": {…}}` (`"parameters"` in Llama 3's format), for
//! [`super::tool_calls`]: the name is known as soon as its string closes, and the
//! arguments value is released character by character as it arrives, so calls stream.

/// Tracks nesting through JSON text: strings (with escapes) and brackets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JsonDepth {
    depth: usize,
    in_string: bool,
    escape: bool,
    started: bool,
}

impl JsonDepth {
    /// Feeds one character; returns true when it closed the outermost bracket (the
    /// value is complete).
    pub fn feed(&mut self, c: char) -> bool {
        if self.in_string {
            if self.escape {
                self.escape = false;
            } else if c == '\\' {
                self.escape = true;
            } else if c == '"' {
                self.in_string = false;
            }
            return false;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => {
                self.depth += 1;
                self.started = true;
            }
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                return self.started && self.depth == 0;
            }
            _ => {}
        }
        false
    }

    /// Whether the scan is inside a string or a bracket.
    pub fn open(&self) -> bool {
        self.in_string || self.depth > 0
    }
}

/// What [`header`] found at the start of a call object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Header {
    /// The text ends before the header does.
    Incomplete,
    /// Not `{"name": "…", "arguments": ` (keys in another order, another shape).
    Mismatch,
    /// The header: the function name and the byte length of the text up to the first
    /// character of the arguments value (whitespace after the colon included).
    Done {
        /// The decoded function name.
        name: String,
        /// Bytes of the header.
        len: usize,
    },
}

struct Cursor<'a> {
    s: &'a str,
    at: usize,
}

/// A cursor step: `Err(true)` = the text ran out, `Err(false)` = mismatch.
type Step<T> = Result<T, bool>;

impl Cursor<'_> {
    fn ws(&mut self) {
        let rest = &self.s[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    fn expect(&mut self, c: char) -> Step<()> {
        self.ws();
        match self.s[self.at..].chars().next() {
            None => Err(true),
            Some(x) if x == c => {
                self.at += c.len_utf8();
                Ok(())
            }
            Some(_) => Err(false),
        }
    }

    /// A JSON string literal, decoded.
    fn string(&mut self) -> Step<String> {
        self.expect('"')?;
        let start = self.at - 1;
        let mut escape = false;
        for (i, c) in self.s[self.at..].char_indices() {
            if escape {
                escape = false;
            } else if c == '\\' {
                escape = true;
            } else if c == '"' {
                let end = self.at + i + 1;
                self.at = end;
                return serde_json::from_str(&self.s[start..end]).map_err(|_| false);
            }
        }
        Err(true)
    }
}

/// Reads `{"name": "…", "arguments": ` (or `"parameters"`) at the start of `s`
/// (leading whitespace allowed).
pub fn header(s: &str) -> Header {
    let mut c = Cursor { s, at: 0 };
    let run = |c: &mut Cursor<'_>| -> Step<String> {
        c.expect('{')?;
        if c.string()? != "name" {
            return Err(false);
        }
        c.expect(':')?;
        let name = c.string()?;
        c.expect(',')?;
        let key = c.string()?;
        if key != "arguments" && key != "parameters" {
            return Err(false);
        }
        c.expect(':')?;
        c.ws();
        if c.at == c.s.len() {
            return Err(true);
        }
        Ok(name)
    };
    match run(&mut c) {
        Ok(name) => Header::Done { name, len: c.at },
        Err(true) => Header::Incomplete,
        Err(false) => Header::Mismatch,
    }
}

/// A whole call object in any key order: `(name, arguments JSON text)`, where
/// `arguments` (or `parameters`) may be an object or a string holding JSON.
pub fn whole_call(text: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let obj = v.as_object()?;
    let (name, args) = match obj.get("function") {
        // {"type": "function", "function": {"name", "arguments"}}
        Some(serde_json::Value::Object(f)) => (f.get("name")?, f.get("arguments")),
        _ => (
            obj.get("name")?,
            obj.get("arguments").or_else(|| obj.get("parameters")),
        ),
    };
    let name = name.as_str()?.to_string();
    let arguments = match args {
        None => "{}".to_string(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(v) => serde_json::to_string(v).ok()?,
    };
    Some((name, arguments))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_at_every_cut() {
        let text = r#" {"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let full = text.find("{\"city").unwrap_or(0);
        for cut in 0..text.len() {
            let h = header(&text[..cut]);
            if cut <= full {
                assert_eq!(h, Header::Incomplete, "cut {cut}");
            } else {
                assert_eq!(
                    h,
                    Header::Done {
                        name: "get_weather".into(),
                        len: full
                    }
                );
            }
        }
        assert_eq!(
            header(r#"{"arguments": {}, "name": "f"}"#),
            Header::Mismatch
        );
        assert_eq!(header(r#"{"name": 3"#), Header::Mismatch);
        assert_eq!(
            header(r#"{"name":"f\u00e9","parameters":{"#),
            Header::Done {
                name: "fé".into(),
                len: 31
            }
        );
    }

    #[test]
    fn depth_ends_at_the_outer_close_only() {
        let mut d = JsonDepth::default();
        let v = r#"{"a": "}]\"{", "b": [1, {"c": 2}]}"#;
        let ends: Vec<usize> = v
            .chars()
            .enumerate()
            .filter_map(|(i, c)| d.feed(c).then_some(i))
            .collect();
        assert_eq!(ends, vec![v.len() - 1]);
        assert!(!d.open());
    }

    #[test]
    fn whole_calls_in_other_shapes() {
        assert_eq!(
            whole_call(r#"{"arguments": {"x": 1}, "name": "f"}"#),
            Some(("f".into(), r#"{"x":1}"#.into()))
        );
        assert_eq!(
            whole_call(r#"{"type": "function", "name": "g", "parameters": {}}"#),
            Some(("g".into(), "{}".into()))
        );
        assert_eq!(
            whole_call(r#"{"name": "h", "arguments": "{\"y\": 2}"}"#),
            Some(("h".into(), r#"{"y": 2}"#.into()))
        );
        assert_eq!(whole_call(r#"{"nam": "h"}"#), None);
        assert_eq!(whole_call("not json"), None);
    }
}
