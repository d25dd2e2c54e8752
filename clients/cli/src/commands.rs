//! What one line typed in the interactive session means: a message to the model or a
//! slash command.

/// The commands, for `/help`.
pub const HELP: &str = "\
Commands:
  /help              show this help
  /reset             forget the conversation (the system prompt stays)
  /system TEXT       set the system prompt and forget the conversation
  /system            show the system prompt
  /exit, /quit       end the session (or Ctrl-D)
Anything else is sent to the model with the conversation so far; start a message
with // to send one that begins with /. Ctrl-C while an answer streams cancels it
(the turn is dropped from the conversation); a second Ctrl-C exits.";

/// One input line, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// Blank: nothing to do.
    Empty,
    /// A message for the model.
    Message(String),
    /// `/help`.
    Help,
    /// `/reset`.
    Reset,
    /// `/system` (`None`: show it) or `/system TEXT` (set it).
    System(Option<String>),
    /// `/exit` or `/quit`.
    Exit,
    /// An unknown `/command` (the word as typed, with its slash).
    Unknown(String),
}

impl Line {
    /// Parses one line. Leading and trailing whitespace is dropped; `//text` is the
    /// message `/text`.
    pub fn parse(line: &str) -> Self {
        let line = line.trim();
        if line.is_empty() {
            return Self::Empty;
        }
        if let Some(escaped) = line.strip_prefix("//") {
            return Self::Message(format!("/{escaped}"));
        }
        let Some(command) = line.strip_prefix('/') else {
            return Self::Message(line.to_owned());
        };
        let (name, rest) = command
            .split_once(char::is_whitespace)
            .map_or((command, ""), |(n, r)| (n, r.trim()));
        match name {
            "help" | "?" => Self::Help,
            "reset" | "clear" => Self::Reset,
            "system" if rest.is_empty() => Self::System(None),
            "system" => Self::System(Some(rest.to_owned())),
            "exit" | "quit" => Self::Exit,
            _ => Self::Unknown(format!("/{name}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse() {
        assert_eq!(Line::parse("  "), Line::Empty);
        assert_eq!(
            Line::parse(" Hi there \n"),
            Line::Message("Hi there".into())
        );
        assert_eq!(Line::parse("/help"), Line::Help);
        assert_eq!(Line::parse("/?"), Line::Help);
        assert_eq!(Line::parse("/reset"), Line::Reset);
        assert_eq!(Line::parse("/clear"), Line::Reset);
        assert_eq!(Line::parse("/system"), Line::System(None));
        assert_eq!(Line::parse("/system   "), Line::System(None));
        assert_eq!(
            Line::parse("/system  Be brief. Very. "),
            Line::System(Some("Be brief. Very.".into()))
        );
        assert_eq!(Line::parse("/exit"), Line::Exit);
        assert_eq!(Line::parse("/quit"), Line::Exit);
        assert_eq!(
            Line::parse("/frobnicate now"),
            Line::Unknown("/frobnicate".into())
        );
        assert_eq!(
            Line::parse("//etc/hosts?"),
            Line::Message("/etc/hosts?".into())
        );
        assert_eq!(Line::parse("/systemx"), Line::Unknown("/systemx".into()));
    }
}
