//! Where the interactive session's lines come from: a terminal, with line editing and
//! history (rustyline), or plain lines from a pipe or file, for scripts.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rustyline::config::Config;
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;

/// The most lines the history keeps (in memory and in its file).
const HISTORY_SIZE: usize = 1000;

/// The outcome of reading one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// A line, without its line ending.
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    /// Ctrl-D or the end of the input.
    Eof,
}

/// A source of input lines.
pub trait LineSource {
    /// Reads the next line, showing `prompt` where the user types.
    fn read(&mut self, prompt: &str) -> Result<Read>;
    /// Adds `line` to the history (and its file). Returns a warning to show once when
    /// the file cannot be written.
    fn remember(&mut self, line: &str) -> Option<String>;
    /// Whether a person types at a terminal (who sees the prompt and the typed line).
    fn is_terminal(&self) -> bool;
}

/// The default history file: `$XDG_STATE_HOME/inferd/cli-history`, else
/// `$HOME/.local/state/inferd/cli-history`; `None` when neither variable is set to an
/// absolute path.
pub fn default_history_file() -> Option<PathBuf> {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    absolute("XDG_STATE_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".local/state")))
        .map(|state| state.join("inferd").join("cli-history"))
}

/// A terminal with line editing (arrows, Ctrl-A/E, ...) and history (Up/Down,
/// Ctrl-R), kept in memory and appended to `file` after each line.
pub struct Terminal {
    editor: DefaultEditor,
    file: Option<PathBuf>,
}

impl Terminal {
    /// Opens the terminal, loading the history from `file` when it exists.
    pub fn new(file: Option<PathBuf>) -> Result<Self> {
        let config = Config::builder()
            .max_history_size(HISTORY_SIZE)
            .and_then(|b| b.history_ignore_dups(true))
            .context("configuring line editing")?
            .history_ignore_space(true)
            .auto_add_history(false)
            .build();
        let mut editor =
            DefaultEditor::with_config(config).context("opening the terminal for line editing")?;
        if let Some(path) = &file {
            if path.exists() {
                // A history that cannot be read is not worth refusing the session over;
                // appending will report a file that is really unusable.
                let _ = editor.load_history(path);
            }
        }
        Ok(Self { editor, file })
    }

    /// Appends the new history entries to `path`, creating its folder.
    fn append(&mut self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        self.editor
            .append_history(path)
            .with_context(|| format!("writing {}", path.display()))
    }
}

impl LineSource for Terminal {
    fn read(&mut self, prompt: &str) -> Result<Read> {
        match self.editor.readline(prompt) {
            Ok(line) => Ok(Read::Line(line)),
            Err(ReadlineError::Interrupted) => Ok(Read::Interrupted),
            Err(ReadlineError::Eof) => Ok(Read::Eof),
            Err(e) => Err(e).context("reading a line from the terminal"),
        }
    }

    fn remember(&mut self, line: &str) -> Option<String> {
        // Ignored entries (blank, duplicate) are fine.
        let _ = self.editor.add_history_entry(line);
        let path = self.file.clone()?;
        match self.append(&path) {
            Ok(()) => None,
            Err(e) => {
                // Keep the history in memory only from now on.
                self.file = None;
                Some(format!("history not saved: {e:#}"))
            }
        }
    }

    fn is_terminal(&self) -> bool {
        true
    }
}

/// Plain lines from any reader (a pipe, a file): no prompt, no history.
pub struct Plain<R> {
    reader: R,
}

impl<R: BufRead> Plain<R> {
    /// Reads lines from `reader`.
    pub fn new(reader: R) -> Self {
        Self { reader }
    }
}

impl<R: BufRead> LineSource for Plain<R> {
    fn read(&mut self, _prompt: &str) -> Result<Read> {
        let mut line = String::new();
        if self
            .reader
            .read_line(&mut line)
            .context("reading a line from stdin")?
            == 0
        {
            return Ok(Read::Eof);
        }
        let trimmed = line.strip_suffix('\n').unwrap_or(&line);
        let trimmed = trimmed.strip_suffix('\r').unwrap_or(trimmed);
        Ok(Read::Line(trimmed.to_owned()))
    }

    fn remember(&mut self, _line: &str) -> Option<String> {
        None
    }

    fn is_terminal(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_reads_lines_then_eof() {
        let mut input = Plain::new("one\r\ntwo\n\nlast".as_bytes());
        assert_eq!(input.read(">>> ").expect("ok"), Read::Line("one".into()));
        assert_eq!(input.read(">>> ").expect("ok"), Read::Line("two".into()));
        assert_eq!(input.read(">>> ").expect("ok"), Read::Line(String::new()));
        assert_eq!(input.read(">>> ").expect("ok"), Read::Line("last".into()));
        assert_eq!(input.read(">>> ").expect("ok"), Read::Eof);
        assert!(!input.is_terminal());
    }

    #[test]
    fn history_file_is_under_the_state_dir() {
        // Only checks the shape: the variables are the process's own.
        if let Some(p) = default_history_file() {
            assert!(p.is_absolute());
            assert!(p.ends_with("inferd/cli-history"), "{}", p.display());
        }
    }
}
