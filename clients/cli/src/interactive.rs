//! `chat` without a question: an interactive, multi-turn session on one connection.
//!
//! Each line is a user turn sent with the whole conversation so far, or a slash command
//! (see [`crate::commands::HELP`]). On a terminal the lines are edited with rustyline
//! and kept in a history; from a pipe they are read plainly and each one is echoed to
//! stdout as `>>> LINE` before its answer, so the transcript shows where each turn
//! starts. With `--json`, stdout holds exactly one JSON line per user turn (the answer
//! summary, or `{"error": …}`) and everything else goes to stderr.
//!
//! Ctrl-C while an answer streams sends `cancel`: the answer ends with `[cancelled]`
//! and the turn (question and partial answer) is left out of the conversation, as if it
//! had not been asked, so the next turn sees only complete exchanges; the question stays
//! in the line history (Up brings it back). A second Ctrl-C during the same answer ends
//! the session (exit status 130). Ctrl-C at the prompt only prints a hint.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use serde_json::json;
use tokio::runtime::Runtime;

use crate::answer::{self, Interrupted, Render, ServerError};
use crate::args::GenerateOptions;
use crate::commands::{Line, HELP};
use crate::connection::{Connection, Endpoint};
use crate::conversation::Conversation;
use crate::input::{LineSource, Read};
use crate::request::{self, Input};

/// The prompt shown on a terminal (and before echoed lines from a pipe).
pub const PROMPT: &str = ">>> ";

/// What the session needs besides its input and output.
pub struct Settings {
    /// The daemon.
    pub endpoint: Endpoint,
    /// The system prompt to start with.
    pub system: Option<String>,
    /// Generation options applied to every turn.
    pub options: GenerateOptions,
    /// `--json`: one JSON line per turn on stdout.
    pub json: bool,
}

/// An interactive session.
pub struct Session<'a, O, E> {
    runtime: &'a Runtime,
    settings: Settings,
    render: Render,
    connection: Option<Connection>,
    conversation: Conversation,
    turns: u64,
    out: O,
    err: E,
}

/// How a line left the session.
enum Next {
    Continue,
    Exit(ExitCode),
}

impl<'a, O: Write, E: Write> Session<'a, O, E> {
    /// Connects to the daemon (failing at once when it is not there).
    pub fn connect(runtime: &'a Runtime, settings: Settings, out: O, err: E) -> Result<Self> {
        let connection = runtime.block_on(Connection::open(&settings.endpoint))?;
        // From now on SIGINT is the session's (see `answer::stream`): a Ctrl-C that
        // arrives between answers is ignored instead of killing the session.
        runtime.block_on(async {
            use futures_util::FutureExt;
            let mut listener = Box::pin(tokio::signal::ctrl_c());
            let _ = (&mut listener).now_or_never();
        });
        let render = crate::oneshot::render(&settings.options, settings.json);
        Ok(Self {
            runtime,
            conversation: Conversation::new(settings.system.clone()),
            settings,
            render,
            connection: Some(connection),
            turns: 0,
            out,
            err,
        })
    }

    /// Runs the session until `/exit`, the end of the input, or a second Ctrl-C within
    /// one answer.
    pub fn run(mut self, input: &mut dyn LineSource) -> Result<ExitCode> {
        if input.is_terminal() && !self.settings.json {
            writeln!(
                self.err,
                "Connected to {}. /help lists the commands; Ctrl-D or /exit quits.",
                self.settings.endpoint.url
            )?;
        }
        let code = loop {
            let line = match input.read(PROMPT)? {
                Read::Eof => {
                    if input.is_terminal() {
                        writeln!(self.err)?;
                    }
                    break ExitCode::SUCCESS;
                }
                Read::Interrupted => {
                    writeln!(
                        self.err,
                        "(Ctrl-C cancels an answer while it streams; /exit or Ctrl-D quits)"
                    )?;
                    continue;
                }
                Read::Line(line) => line,
            };
            if line.trim().is_empty() {
                continue;
            }
            if let Some(warning) = input.remember(&line) {
                writeln!(self.err, "inferd-cli: {warning}")?;
            }
            if !input.is_terminal() && !self.settings.json {
                writeln!(self.out, "{PROMPT}{line}")?;
                self.out.flush()?;
            }
            match self.handle(Line::parse(&line))? {
                Next::Continue => {}
                Next::Exit(code) => break code,
            }
        };
        if let Some(connection) = self.connection.take() {
            self.runtime.block_on(connection.close());
        }
        Ok(code)
    }

    /// Where messages that are not answers go: stdout, or stderr with `--json`.
    fn notes(&mut self) -> &mut dyn Write {
        if self.settings.json {
            &mut self.err
        } else {
            &mut self.out
        }
    }

    /// Carries out one parsed line.
    fn handle(&mut self, line: Line) -> Result<Next> {
        match line {
            Line::Empty => {}
            Line::Message(question) => return self.turn(question),
            Line::Help => writeln!(self.notes(), "{HELP}")?,
            Line::Reset => {
                self.conversation.reset();
                let kept = if self.conversation.system().is_some() {
                    " (the system prompt stays)"
                } else {
                    ""
                };
                writeln!(self.err, "[conversation cleared{kept}]")?;
            }
            Line::System(None) => {
                let text = match self.conversation.system() {
                    Some(system) => format!("system prompt: {system}"),
                    None => "no system prompt (set one with /system TEXT)".to_owned(),
                };
                writeln!(self.notes(), "{text}")?;
            }
            Line::System(Some(system)) => {
                self.conversation.set_system(system);
                writeln!(self.err, "[system prompt set; conversation cleared]")?;
            }
            Line::Exit => return Ok(Next::Exit(ExitCode::SUCCESS)),
            Line::Unknown(name) => writeln!(
                self.err,
                "inferd-cli: unknown command {name}: /help lists the commands (start a \
                 message with // to send one that begins with /)"
            )?,
        }
        self.out.flush()?;
        Ok(Next::Continue)
    }

    /// Sends `question` with the conversation and streams the answer.
    fn turn(&mut self, question: String) -> Result<Next> {
        self.turns += 1;
        let id = format!("chat-{}", self.turns);
        let frame = request::generate(
            &id,
            Input::Messages(self.conversation.messages_for(&question)),
            &self.settings.options,
        );
        let result = match self.connection.take() {
            Some(connection) => Ok(connection),
            // The last connection broke: try a new one for this turn.
            None => self
                .runtime
                .block_on(Connection::open(&self.settings.endpoint)),
        }
        .and_then(|mut connection| {
            let tracker = answer::Tracker::new(&id, self.render).mark_cancelled();
            let streamed = self.runtime.block_on(answer::stream(
                &mut connection,
                tracker,
                &frame,
                &mut self.out,
                &mut self.err,
            ));
            // Keep the connection unless it broke (an error that is not the server's).
            if streamed.is_ok()
                || streamed
                    .as_ref()
                    .err()
                    .is_some_and(|e| e.is::<ServerError>())
            {
                self.connection = Some(connection);
            }
            streamed
        });
        match result {
            Ok(answer) => {
                if self.settings.json {
                    writeln!(self.out, "{}", answer.to_json())?;
                }
                if !answer.cancelled() {
                    self.conversation.push(question, answer.text);
                }
            }
            Err(e) if e.is::<Interrupted>() => {
                let _ = self.out.flush();
                writeln!(self.err, "\ninferd-cli: interrupted")?;
                return Ok(Next::Exit(ExitCode::from(130)));
            }
            Err(e) => {
                if self.settings.json {
                    let error = match e.downcast_ref::<ServerError>() {
                        Some(server) => server.to_json(),
                        None => {
                            json!({"error": {"type": "connection", "message": format!("{e:#}")}})
                        }
                    };
                    writeln!(self.out, "{error}")?;
                }
                let _ = self.out.flush();
                writeln!(self.err, "inferd-cli: {e:#}")?;
            }
        }
        self.out.flush()?;
        Ok(Next::Continue)
    }
}

#[cfg(test)]
mod tests {
    use futures_util::{SinkExt, StreamExt};
    use serde_json::Value;
    use tokio::net::TcpListener;
    use tokio_tungstenite::tungstenite::Message;

    use super::*;
    use crate::input::Plain;

    /// A fake daemon on `runtime`: answers every generate with `started`, one delta
    /// (`reply N`, N counting from 1, or an error when the last message is "fail"), and
    /// `done`; sends every request it got to the returned channel.
    fn fake_daemon(runtime: &Runtime) -> (String, std::sync::mpsc::Receiver<Value>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        runtime.spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let mut ws = tokio_tungstenite::accept_async(tcp)
                .await
                .expect("handshake");
            let mut n = 0;
            while let Some(Ok(message)) = ws.next().await {
                let Ok(text) = message.to_text() else { continue };
                let Ok(request) = serde_json::from_str::<Value>(text) else {
                    continue;
                };
                let id = request["id"].clone();
                let last = request["messages"]
                    .as_array()
                    .and_then(|m| m.last())
                    .map(|m| m["content"].clone());
                let _ = tx.send(request);
                let frames = if last == Some(json!("fail")) {
                    vec![json!({"type": "error", "id": id,
                                "error": {"type": "validation", "message": "temperature must be >= 0 (got -1)"}})]
                } else {
                    n += 1;
                    vec![
                        json!({"type": "started", "id": id, "prompt_tokens": 3, "cached_tokens": 0}),
                        json!({"type": "delta", "id": id, "text": format!("reply {n}"), "token_ids": [1]}),
                        json!({"type": "done", "id": id, "finish_reason": "stop",
                               "usage": {"prompt_tokens": 3, "completion_tokens": 1},
                               "timings": {"ttft_ms": 1.0, "decode_tokens_per_s": 0.0}}),
                    ]
                };
                for f in frames {
                    ws.send(Message::text(f.to_string())).await.expect("send");
                }
            }
        });
        (format!("ws://{addr}/v1/ws"), rx)
    }

    fn session(script: &str, system: Option<&str>, json: bool) -> (String, String, Vec<Value>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (url, requests) = fake_daemon(&runtime);
        let settings = Settings {
            endpoint: Endpoint { url, api_key: None },
            system: system.map(str::to_owned),
            options: GenerateOptions::default(),
            json,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = Session::connect(&runtime, settings, &mut out, &mut err)
            .expect("connect")
            .run(&mut Plain::new(script.as_bytes()))
            .expect("run");
        assert_eq!(code, ExitCode::SUCCESS);
        (
            String::from_utf8(out).expect("utf8"),
            String::from_utf8(err).expect("utf8"),
            requests.try_iter().collect(),
        )
    }

    fn contents(request: &Value) -> Vec<(String, String)> {
        request["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap_or_default().to_owned(),
                    m["content"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(r, c)| (r.to_string(), c.to_string()))
            .collect()
    }

    #[test]
    fn turns_carry_the_conversation_and_commands_change_it() {
        let script = "one\ntwo\n/reset\nthree\n/system Be brief.\n/system\nfour\n/nope\nfail\nfive\n/exit\nnever\n";
        let (out, err, requests) = session(script, None, false);
        assert_eq!(requests.len(), 6, "{requests:?}");
        assert_eq!(contents(&requests[0]), pairs(&[("user", "one")]));
        assert_eq!(
            contents(&requests[1]),
            pairs(&[("user", "one"), ("assistant", "reply 1"), ("user", "two")])
        );
        assert_eq!(contents(&requests[2]), pairs(&[("user", "three")]));
        assert_eq!(
            contents(&requests[3]),
            pairs(&[("system", "Be brief."), ("user", "four")])
        );
        // The failed turn is not part of the conversation.
        assert_eq!(
            contents(&requests[5]),
            pairs(&[
                ("system", "Be brief."),
                ("user", "four"),
                ("assistant", "reply 4"),
                ("user", "five")
            ])
        );
        let ids: Vec<&str> = requests.iter().filter_map(|r| r["id"].as_str()).collect();
        assert_eq!(
            ids,
            ["chat-1", "chat-2", "chat-3", "chat-4", "chat-5", "chat-6"]
        );
        assert_eq!(
            out,
            "\
>>> one
reply 1
>>> two
reply 2
>>> /reset
>>> three
reply 3
>>> /system Be brief.
>>> /system
system prompt: Be brief.
>>> four
reply 4
>>> /nope
>>> fail
>>> five
reply 5
>>> /exit
"
        );
        assert!(err.contains("[conversation cleared]"), "{err}");
        assert!(err.contains("unknown command /nope"), "{err}");
        assert!(
            err.contains(
                "inferd-cli: server error (validation): temperature must be >= 0 (got -1)"
            ),
            "{err}"
        );
        assert_eq!(err.matches("tokens, prompt 3").count(), 5, "{err}");
    }

    #[test]
    fn json_prints_one_line_per_turn() {
        let (out, err, requests) = session("hi\n/help\nfail\nagain\n", Some("S"), true);
        assert_eq!(requests.len(), 3);
        let lines: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(lines[0]["text"], "reply 1");
        assert_eq!(lines[0]["finish_reason"], "stop");
        assert_eq!(lines[1]["error"]["type"], "validation");
        assert_eq!(lines[2]["text"], "reply 2");
        assert!(err.contains("/reset"), "help goes to stderr: {err}");
        assert!(!err.contains("tokens, prompt"), "no stats lines: {err}");
    }
}
