//! `inferd-cli`: a small command-line client for the inferd WebSocket protocol v1
//! (see `docs/protocol.md`).
//!
//! ```text
//! inferd-cli chat "Why is the sky blue?" --system "Be brief." --max-tokens 128
//! inferd-cli complete "Once upon a time" --temperature 0 --raw
//! inferd-cli complete "Once upon a time" --no-cache          # bypass the prefix cache
//! inferd-cli chat "Hello" --cache-salt tenant-a              # share cache only within a salt
//! inferd-cli chat "List three rivers" --top-p 0.9 --top-k 40 --stop "4."
//! inferd-cli chat "SELECT?" --adapter sql --lora-scale 0.5    # a LoRA adapter, scaled
//! inferd-cli chat                                            # interactive session
//! inferd-cli chat --system "You are a pirate." --temperature 0
//! inferd-cli stats                                           # engine state
//! inferd-cli plugins                                         # loaded Wasm plugins
//! inferd-cli models                                          # base model, LoRA adapters
//! inferd-cli --json chat "2+2?"                              # one JSON object
//! ```
//!
//! **One-shot** (`chat QUESTION`, `complete PROMPT`): the answer streams to stdout as
//! deltas arrive; a stats line (tokens, prompt and cached tokens, TTFT, tok/s, finish
//! reason) goes to stderr. With `--raw`, every protocol frame is printed as received,
//! one JSON object per line. Ctrl-C sends a `cancel` for the request (exit status 130);
//! a second Ctrl-C exits at once (status 1). A server error is printed to stderr as
//! `inferd-cli: server error (TAG): MESSAGE` and the exit status is 1.
//!
//! **Interactive** (`chat` without a question): a multi-turn session on one connection.
//! Each line is a user turn sent with the whole conversation so far; `/help`,
//! `/reset` (forget the conversation, keep the system prompt), `/system TEXT` (set the
//! system prompt and reset), `/system` (show it), `/exit` or Ctrl-D. On a terminal,
//! lines are edited with rustyline and kept in a history (Up/Down, Ctrl-R), also
//! appended to `$XDG_STATE_HOME/inferd/cli-history` (default
//! `~/.local/state/inferd/cli-history`; `--history-file PATH`, or `--no-history` for
//! memory only). Ctrl-C while an answer streams cancels it: `[cancelled]` is shown and
//! the turn (question and partial answer) is left out of the conversation, as if never
//! asked (Up brings the question back); a second Ctrl-C within the same answer ends
//! the session (status 130). Ctrl-C at the prompt only prints a hint. A server error
//! (e.g. a validation error) is printed and the session goes on. When stdin is not a
//! terminal, lines are read plainly (for scripts) and each one is echoed to stdout as
//! `>>> LINE` before its answer; the session ends at the end of the input with status 0.
//!
//! **`stats`, `plugins`**: the engine state (running and waiting requests, KV blocks,
//! prefix cache hit rate, speculative acceptance, ...) and the loaded plugins (name,
//! world, version, description), for people.
//!
//! **`models`**: the base model and the LoRA adapters the daemon serves (name, file),
//! from `GET /v1/models` on the `--url`'s host and port (plain HTTP, with the API key).
//! `chat` and `complete` generate with an adapter with `--adapter NAME` (sent as the
//! `generate` frame's `adapter`; the base model without it) and scale its delta with
//! `--lora-scale X` (`lora_scale`, default 1); a name the daemon does not serve is a
//! server error `model_not_found` that lists the names it does. In a session the
//! adapter applies to every turn.
//!
//! **`--json`** (any subcommand): machine-readable stdout. `chat QUESTION` / `complete`
//! print one object when the answer ends:
//! `{"text": "...", "finish_reason": "stop", "usage": {...}, "timings": {...}}`, where
//! `usage` and `timings` are the `done` frame's objects unchanged (`prompt_tokens`,
//! `completion_tokens`, `cached_tokens`, `draft_tokens`, `accepted_draft_tokens`;
//! `ttft_ms`, `decode_tokens_per_s`), or `{"error": {"type": TAG, "message": ...}}` for
//! a server error (also on stderr, status 1); a connection that cannot be opened is
//! `{"error": {"type": "invalid_api_key" | "connection", ...}}` (any subcommand), a bad
//! `--url` or `--api-key` and any other failure `{"error": {"type": "client", ...}}`.
//! No stats line. An interactive session
//! prints one such line per user turn (a connection lost mid-turn is
//! `{"error": {"type": "connection", ...}}`) and nothing else on stdout: slash command
//! output goes to stderr. `stats` and `plugins` print the server's frame as received,
//! `models` the daemon's `/v1/models` body (a refusal other than HTTP 401 as
//! `{"error": {"type": CODE, "message": ...}}`).
//! `--json` and `--raw` cannot be combined.

mod answer;
mod args;
mod commands;
mod connection;
mod conversation;
mod info;
mod input;
mod interactive;
mod models;
mod oneshot;
mod request;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser};

use crate::args::{ChatArgs, Cli, Command, GenerateOptions};
use crate::connection::Endpoint;
use crate::info::Query;
use crate::input::{LineSource, Plain, Terminal};
use crate::request::Input;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let raw = match &cli.command {
        Command::Chat(chat) => chat.options.raw,
        Command::Complete { options, .. } => options.raw,
        Command::Stats | Command::Plugins | Command::Models => false,
    };
    if raw && cli.json {
        Cli::command()
            .error(
                clap::error::ErrorKind::ArgumentConflict,
                "--raw and --json cannot be combined",
            )
            .exit();
    }
    let json = cli.json;
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // A server error was already printed as JSON where it was answered.
            if json && !e.is::<answer::ServerError>() {
                println!("{}", error_json(&e));
            }
            let _ = std::io::stdout().flush();
            eprintln!("inferd-cli: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The `--json` form of a failure that is not a server error frame:
/// `{"error": {"type": TAG, "message": ...}}`, with the [`connection::OpenError`]'s tag
/// when the connection could not be opened, else `client`.
fn error_json(e: &anyhow::Error) -> serde_json::Value {
    let tag = e
        .downcast_ref::<connection::OpenError>()
        .map_or("client", |open| open.tag);
    serde_json::json!({"error": {"type": tag, "message": format!("{e:#}")}})
}

/// Runs the subcommand.
fn run(cli: Cli) -> Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let endpoint = Endpoint {
        url: cli.url,
        api_key: cli.api_key,
    };
    let json = cli.json;
    match cli.command {
        Command::Chat(chat) => match chat.question.as_deref() {
            Some(question) => {
                let input = oneshot::chat_input(chat.system.as_deref(), question, &chat.images)?;
                one_shot(&runtime, &endpoint, input, &chat.options, json)
            }
            None => interactive(&runtime, endpoint, chat, json),
        },
        Command::Complete { prompt, options } => {
            one_shot(&runtime, &endpoint, Input::Prompt(prompt), &options, json)
        }
        Command::Stats => query(&runtime, &endpoint, Query::Stats, json),
        Command::Plugins => query(&runtime, &endpoint, Query::Plugins, json),
        Command::Models => {
            runtime.block_on(models::run(&endpoint, json, &mut std::io::stdout()))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `chat QUESTION` and `complete`: status 0, or 130 when the answer was cancelled.
fn one_shot(
    runtime: &tokio::runtime::Runtime,
    endpoint: &Endpoint,
    input: Input,
    options: &GenerateOptions,
    json: bool,
) -> Result<ExitCode> {
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let render = oneshot::render(options, json);
    let answer = runtime.block_on(oneshot::run(
        endpoint, input, options, render, &mut out, &mut err,
    ))?;
    Ok(if answer.cancelled() {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// `chat` without a question.
fn interactive(
    runtime: &tokio::runtime::Runtime,
    endpoint: Endpoint,
    chat: ChatArgs,
    json: bool,
) -> Result<ExitCode> {
    let mut input: Box<dyn LineSource> = if std::io::stdin().is_terminal() {
        let file = if chat.no_history {
            None
        } else {
            chat.history_file.or_else(input::default_history_file)
        };
        Box::new(Terminal::new(file)?)
    } else {
        Box::new(Plain::new(std::io::stdin().lock()))
    };
    let settings = interactive::Settings {
        endpoint,
        system: chat.system,
        options: chat.options,
        json,
    };
    interactive::Session::connect(runtime, settings, std::io::stdout(), std::io::stderr())?
        .run(input.as_mut())
}

/// `stats` and `plugins`.
fn query(
    runtime: &tokio::runtime::Runtime,
    endpoint: &Endpoint,
    query: Query,
    json: bool,
) -> Result<ExitCode> {
    runtime.block_on(info::run(endpoint, query, json, &mut std::io::stdout()))?;
    Ok(ExitCode::SUCCESS)
}
