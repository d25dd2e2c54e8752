//! Weight sources: one per file format, each reading a [`super::ModelSpec`] from its
//! metadata and mapping its tensor names onto the internal layout
//! ([`super::weights::Role`]).

pub mod gguf;
pub mod gguf_types;
pub mod hf;
pub mod hf_vlm;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod refusal_tests;

use std::io::Read;
use std::path::Path;

use super::ModelError;

/// At most this many characters of a value taken from a file go into a message.
pub const QUOTE_CHARS: usize = 120;

/// `s` as it may appear in a one-line message: control characters and quotes escaped
/// (Rust's `escape_debug`), cut to [`QUOTE_CHARS`] characters with the original length
/// said, so a corrupt file cannot flood the log.
pub fn quote(s: &str) -> String {
    format!("\"{}\"", bounded(s))
}

/// [`quote`] without the quotes.
pub fn bounded(s: &str) -> String {
    let total = s.chars().count();
    let cut: String = s.chars().take(QUOTE_CHARS).collect();
    let esc: String = cut.escape_debug().collect();
    if total > QUOTE_CHARS {
        format!("{esc}… ({total} characters)")
    } else {
        esc
    }
}

/// Reads `path` whole, refusing files over `max` bytes (never allocating more).
///
/// # Errors
/// Unreadable, or larger than `max`.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, ModelError> {
    let io = |error| ModelError::Io {
        path: path.display().to_string(),
        error,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut buf = Vec::new();
    file.take(max + 1).read_to_end(&mut buf).map_err(io)?;
    if buf.len() as u64 > max {
        return Err(ModelError::Corrupt {
            path: path.display().to_string(),
            format: "file of this kind",
            message: format!("larger than {max} bytes"),
        });
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_escapes_and_bounds() {
        assert_eq!(quote("llama"), "\"llama\"");
        assert_eq!(quote("a\nb\u{1b}"), "\"a\\nb\\u{1b}\"");
        let long = "x".repeat(5000);
        let q = quote(&long);
        assert!(q.len() < 200, "{q}");
        assert!(q.ends_with("(5000 characters)\""), "{q}");
    }
}
