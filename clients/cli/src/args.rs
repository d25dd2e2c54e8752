//! The command line, as clap derive types: global connection options, the subcommands
//! and the generation options `chat` and `complete` share.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde_json::Number;

/// Default endpoint of a local daemon.
pub const DEFAULT_URL: &str = "ws://127.0.0.1:8080/v1/ws";

/// Command-line client for the inferd daemon.
#[derive(Debug, Parser)]
#[command(name = "inferd-cli", version, about)]
pub struct Cli {
    /// WebSocket endpoint of the daemon.
    #[arg(long, global = true, env = "INFERD_URL", default_value = DEFAULT_URL)]
    pub url: String,
    /// The daemon's `server.api_key`, sent as `Authorization: Bearer KEY`.
    #[arg(long, global = true, env = "INFERD_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Machine-readable output on stdout: one JSON object per answer (`chat`,
    /// `complete`), the server's frame (`stats`, `plugins`) or body (`models`).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Ask a question with the model's chat template; without QUESTION, start an
    /// interactive session (multi-turn, line editing, history; `/help` inside).
    Chat(ChatArgs),
    /// Continue a raw prompt (no chat template).
    Complete {
        /// The prompt text, tokenized as is.
        prompt: String,
        #[command(flatten)]
        options: GenerateOptions,
    },
    /// Show the engine state: running and waiting requests, KV blocks, prefix cache,
    /// speculative decoding.
    Stats,
    /// List the Wasm plugins the daemon loaded.
    Plugins,
    /// List the base model and the LoRA adapters the daemon serves (`GET /v1/models`
    /// beside the WebSocket); `--adapter NAME` picks one.
    Models,
}

/// Arguments of `chat`.
#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The user message; without it, an interactive session starts.
    pub question: Option<String>,
    /// A system message sent before the conversation (`/system` changes it in a session).
    #[arg(long)]
    pub system: Option<String>,
    /// Interactive session: the file its line history is loaded from and appended to
    /// (default: $XDG_STATE_HOME/inferd/cli-history, or
    /// ~/.local/state/inferd/cli-history). Only used when stdin is a terminal.
    #[arg(long, value_name = "PATH", conflicts_with = "no_history")]
    pub history_file: Option<PathBuf>,
    /// Interactive session: keep the line history in memory only.
    #[arg(long)]
    pub no_history: bool,
    /// An image sent with QUESTION, as a `data:` URL content part after its text
    /// (repeatable; PNG, JPEG, WebP or GIF; the model must have a vision tower, see
    /// the daemon's docs/vision.md).
    #[arg(long = "image", value_name = "FILE", requires = "question")]
    pub images: Vec<PathBuf>,
    #[command(flatten)]
    pub options: GenerateOptions,
}

/// Options shared by `chat` and `complete`. Absent sampling values use the daemon's
/// defaults; numbers are passed on as written (negative ones too, `-1` stays an
/// integer): the daemon validates them and its message names the bound.
#[derive(Debug, Args, Clone, Default)]
pub struct GenerateOptions {
    /// Maximum number of tokens to generate.
    #[arg(long, allow_negative_numbers = true)]
    pub max_tokens: Option<u64>,
    /// Sampling temperature (0 = greedy).
    #[arg(long, allow_hyphen_values = true, value_parser = number)]
    pub temperature: Option<Number>,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass (1
    /// disables).
    #[arg(long, allow_hyphen_values = true, value_parser = number)]
    pub top_p: Option<Number>,
    /// Keep the k most likely tokens (0 disables).
    #[arg(long, allow_negative_numbers = true)]
    pub top_k: Option<u64>,
    /// Drop tokens less likely than MIN_P times the most likely one (0 disables).
    #[arg(long, allow_hyphen_values = true, value_parser = number)]
    pub min_p: Option<Number>,
    /// Do not end the answer before this many tokens (end-of-turn tokens are banned
    /// until then).
    #[arg(long, allow_negative_numbers = true)]
    pub min_tokens: Option<u64>,
    /// A stop sequence: generation ends before it (repeatable, up to 16).
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Seed for reproducible sampling.
    #[arg(long, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Bypass the daemon's prefix cache: neither reuse cached K/V nor store this
    /// prompt's blocks (sends `"cache": false`; the output is the same).
    #[arg(long)]
    pub no_cache: bool,
    /// Share cached prefix blocks only with requests sending the same salt (1-256 bytes;
    /// sends `"cache_salt"`).
    #[arg(long, value_name = "SALT")]
    pub cache_salt: Option<String>,
    /// Generate with this LoRA adapter of the daemon's (`inferd-cli models` lists
    /// them) instead of the base model alone (sends `"adapter"`).
    #[arg(long, value_name = "NAME")]
    pub adapter: Option<String>,
    /// Scale of the adapter's delta (the daemon's default 1; it takes -16 to 16; sends
    /// `"lora_scale"`).
    #[arg(long, value_name = "X", allow_hyphen_values = true, value_parser = number, requires = "adapter")]
    pub lora_scale: Option<Number>,
    /// Print every protocol frame as received (one JSON per line) instead of the text.
    #[arg(long)]
    pub raw: bool,
}

/// A JSON number exactly as written on the command line (`-1` stays `-1`, not `-1.0`),
/// so that the daemon's message quotes the value the user gave. `nan`, `inf` and other
/// text that is not a JSON number are refused here, as JSON cannot carry them.
fn number(text: &str) -> Result<Number, String> {
    serde_json::from_str::<Number>(text.trim())
        .map_err(|_| format!("must be a finite number such as 0.7 (got {text:?})"))
}

#[cfg(test)]
pub(crate) fn parse(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("inferd-cli").chain(args.iter().copied()))
        .expect("valid arguments")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn chat_without_a_question_is_interactive() {
        let cli = parse(&["chat", "--system", "brief", "--no-history"]);
        let Command::Chat(chat) = cli.command else {
            panic!("chat expected");
        };
        assert_eq!(chat.question, None);
        assert_eq!(chat.system.as_deref(), Some("brief"));
        assert!(chat.no_history);
    }

    #[test]
    fn json_is_accepted_before_and_after_the_subcommand() {
        assert!(parse(&["--json", "stats"]).json);
        assert!(parse(&["plugins", "--json"]).json);
        assert!(parse(&["models", "--json"]).json);
        assert!(parse(&["chat", "hi", "--json"]).json);
        assert!(!parse(&["complete", "x"]).json);
    }

    #[test]
    fn negative_numbers_reach_the_daemon() {
        let cli = parse(&["chat", "hi", "--temperature", "-1", "--top-p", "-0.5"]);
        let Command::Chat(chat) = cli.command else {
            panic!("chat expected");
        };
        assert_eq!(chat.options.temperature, Some(Number::from(-1)));
        assert_eq!(chat.options.top_p, Number::from_f64(-0.5));
    }

    #[test]
    fn lora_scale_needs_an_adapter() {
        let cli = parse(&["complete", "x", "--adapter", "sql", "--lora-scale", "-0.5"]);
        let Command::Complete { options, .. } = cli.command else {
            panic!("complete expected");
        };
        assert_eq!(options.adapter.as_deref(), Some("sql"));
        assert_eq!(options.lora_scale, Number::from_f64(-0.5));
        let e = Cli::try_parse_from(["inferd-cli", "chat", "hi", "--lora-scale", "2"])
            .expect_err("a scale without an adapter")
            .to_string();
        assert!(e.contains("--adapter <NAME>"), "{e}");
    }

    #[test]
    fn stop_repeats() {
        let cli = parse(&["complete", "x", "--stop", "\n", "--stop", "END"]);
        let Command::Complete { options, .. } = cli.command else {
            panic!("complete expected");
        };
        assert_eq!(options.stop, ["\n", "END"]);
    }
}
