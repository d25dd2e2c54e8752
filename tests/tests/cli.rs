//! `inferd-cli` end to end against the real daemon: the interactive session driven
//! through piped stdin (multi-turn history, `/reset`, `/system`, Ctrl-C cancelling one
//! answer), `stats` and `plugins`, `--json`, and bad input.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inferd_e2e::{inferd_binary, Daemon};
use serde_json::{json, Value};

const FRANCE: &str = "What is the capital of France? Answer in one short sentence.";
const GERMANY: &str = "And of Germany?";

/// The built `inferd-cli`, next to `inferd`.
fn cli_path() -> PathBuf {
    inferd_binary().with_file_name(format!("inferd-cli{}", std::env::consts::EXE_SUFFIX))
}

/// `inferd-cli --url DAEMON ARGS...` with the environment's endpoint and key removed.
fn cli(daemon: &Daemon, args: &[&str]) -> Command {
    let mut c = Command::new(cli_path());
    c.arg("--url")
        .arg(&daemon.url)
        .args(args)
        .env_remove("INFERD_URL")
        .env_remove("INFERD_API_KEY");
    c
}

/// Runs `inferd-cli` with `stdin` piped in (then closed) and waits for it.
fn run(daemon: &Daemon, args: &[&str], stdin: &str) -> Output {
    let mut child = cli(daemon, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("inferd-cli starts");
    if let Some(mut input) = child.stdin.take() {
        // A CLI that fails at once (a refused key, no daemon) may exit before it reads.
        if let Err(e) = input.write_all(stdin.as_bytes()) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
        }
    }
    child.wait_with_output().expect("inferd-cli runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The JSON lines of a `--json` run's stdout.
fn json_lines(output: &Output) -> Vec<Value> {
    text(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

/// `usage.prompt_tokens` of a `--json` answer.
fn prompt_tokens(answer: &Value) -> u64 {
    answer["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no usage.prompt_tokens in {answer}"))
}

/// The prompt length the daemon gives `messages` (one greedy token generated).
async fn daemon_prompt_tokens(daemon: &Daemon, messages: Value) -> u64 {
    let mut c = daemon.connect().await.expect("connect");
    let g = c.chat_greedy("count", messages, 1).await.expect("generate");
    let done = g.done.unwrap_or_else(|| panic!("no done: {:?}", g.error));
    done["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens")
}

#[tokio::test]
async fn a_scripted_session_keeps_the_conversation_and_obeys_reset_and_system() {
    let daemon = Daemon::start().expect("daemon");
    let greedy = ["--temperature", "0", "--max-tokens", "24"];

    // One-shot answers for reference: the text form and the --json form agree.
    let oneshot = run(&daemon, &[&["chat", FRANCE][..], &greedy].concat(), "");
    assert!(oneshot.status.success(), "{}", text(&oneshot.stderr));
    let oneshot_text = text(&oneshot.stdout);
    let oneshot_answer = oneshot_text
        .strip_suffix('\n')
        .expect("one-shot answer ends with a newline");
    let oneshot_json = run(
        &daemon,
        &[&["--json", "chat", FRANCE][..], &greedy].concat(),
        "",
    );
    assert!(oneshot_json.status.success());
    let summary = json_lines(&oneshot_json);
    assert_eq!(summary.len(), 1, "{summary:?}");
    assert_eq!(summary[0]["text"], oneshot_answer);
    let finish = summary[0]["finish_reason"].as_str().expect("finish_reason");
    assert!(finish == "stop" || finish == "length", "{finish}");
    let completion = summary[0]["usage"]["completion_tokens"]
        .as_u64()
        .expect("n");
    assert!((1..=24).contains(&completion), "{completion}");
    assert!(summary[0]["timings"]["ttft_ms"].as_f64().is_some());
    assert!(
        oneshot_json.stderr.is_empty(),
        "{}",
        text(&oneshot_json.stderr)
    );

    // The session: a question, a follow-up that needs it, /reset, the first question
    // again, /system and the question once more.
    let system = "Answer in one word.";
    let script =
        format!("{FRANCE}\n{GERMANY}\n/reset\n{FRANCE}\n/system {system}\n/system\n{FRANCE}\n");
    let session = run(
        &daemon,
        &[&["--json", "chat"][..], &greedy].concat(),
        &script,
    );
    assert!(session.status.success(), "{}", text(&session.stderr));
    let turns = json_lines(&session);
    assert_eq!(turns.len(), 4, "one JSON line per user turn: {turns:?}");
    // Turn 1 is the one-shot question, token for token.
    assert_eq!(turns[0]["text"], oneshot_answer);
    // Turn 2 carried turn 1: its prompt is exactly the daemon's count of the three
    // messages, longer than turn 1's prompt.
    let first = turns[0]["text"].as_str().expect("text");
    let with_history = daemon_prompt_tokens(
        &daemon,
        json!([{"role": "user", "content": FRANCE},
               {"role": "assistant", "content": first},
               {"role": "user", "content": GERMANY}]),
    )
    .await;
    assert_eq!(prompt_tokens(&turns[1]), with_history);
    assert!(prompt_tokens(&turns[1]) > prompt_tokens(&turns[0]) + 5);
    // After /reset the same question has the same prompt (and greedy answer).
    assert_eq!(prompt_tokens(&turns[2]), prompt_tokens(&turns[0]));
    assert_eq!(turns[2]["text"], turns[0]["text"]);
    // /system resets too and puts the system prompt first.
    let with_system = daemon_prompt_tokens(
        &daemon,
        json!([{"role": "system", "content": system}, {"role": "user", "content": FRANCE}]),
    )
    .await;
    assert_eq!(prompt_tokens(&turns[3]), with_system);
    assert_ne!(with_system, prompt_tokens(&turns[0]));
    // With --json, stdout held only the turns; the notes went to stderr.
    let notes = text(&session.stderr);
    assert!(
        notes.contains(&format!("system prompt: {system}")),
        "{notes}"
    );
    assert!(notes.contains("[conversation cleared]"), "{notes}");

    // The same session without --json: each line echoed as `>>> LINE`, then its answer.
    let plain = run(
        &daemon,
        &[&["chat"][..], &greedy].concat(),
        &format!("{FRANCE}\n{GERMANY}\n"),
    );
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let second = turns[1]["text"].as_str().expect("text");
    assert_eq!(
        text(&plain.stdout),
        format!(">>> {FRANCE}\n{oneshot_answer}\n>>> {GERMANY}\n{second}\n")
    );
    let stats_lines = text(&plain.stderr);
    assert_eq!(
        stats_lines.matches("tokens, prompt").count(),
        2,
        "{stats_lines}"
    );
}

/// Reads a child's pipe in a thread into a shared string; join the thread for all of it.
fn collect(
    mut pipe: impl Read + Send + 'static,
) -> (Arc<Mutex<String>>, std::thread::JoinHandle<()>) {
    let buffer = Arc::new(Mutex::new(String::new()));
    let sink = buffer.clone();
    let reader = std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            if let Ok(mut s) = sink.lock() {
                s.push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
        }
    });
    (buffer, reader)
}

/// Waits until `buffer` satisfies `done` (60 s at most).
fn wait_for(buffer: &Arc<Mutex<String>>, what: &str, done: impl Fn(&str) -> bool) {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let now = buffer.lock().map(|s| s.clone()).unwrap_or_default();
        if done(&now) {
            return;
        }
        assert!(
            Instant::now() < end,
            "timed out waiting for {what}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The prompt size of a stats line `[N tokens, prompt P (C cached), ...]`.
fn stats_prompt(line: &str) -> u64 {
    line.split("prompt ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt size in {line:?}"))
}

#[tokio::test]
async fn ctrl_c_cancels_the_answer_and_the_session_goes_on() {
    let daemon = Daemon::start().expect("daemon");
    // Every answer is exactly 200 tokens (end of turn banned until then): long enough
    // to interrupt, short enough to wait for.
    let mut child = cli(
        &daemon,
        &[
            "chat",
            "--temperature",
            "0",
            "--max-tokens",
            "200",
            "--min-tokens",
            "200",
        ],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("inferd-cli starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let (stdout, stdout_reader) = collect(child.stdout.take().expect("stdout"));
    let (stderr, stderr_reader) = collect(child.stderr.take().expect("stderr"));

    let story = "Tell me a long story about a dragon.";
    writeln!(stdin, "{story}").expect("write");
    let echo = format!(">>> {story}\n");
    wait_for(&stdout, "the first answer's first text", |s| {
        s.len() > echo.len()
    });
    let status = Command::new("kill")
        .arg("-INT")
        .arg(child.id().to_string())
        .status()
        .expect("kill runs");
    assert!(status.success());
    wait_for(&stdout, "[cancelled]", |s| s.contains("\n[cancelled]\n"));

    // The session is still there: the next line gets a whole answer.
    writeln!(stdin, "{FRANCE}").expect("write");
    drop(stdin);
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(exit.success(), "{exit}");
    // The readers reach the pipes' ends after the exit; what they hold before that may
    // lack the last lines (CI under load once missed the second stats line).
    for reader in [stdout_reader, stderr_reader] {
        reader.join().expect("a pipe reader");
    }
    let (out, err) = (
        stdout.lock().map(|s| s.clone()).unwrap_or_default(),
        stderr.lock().map(|s| s.clone()).unwrap_or_default(),
    );
    let (first, rest) = out.split_once("\n[cancelled]\n").expect("cancelled");
    assert!(first.starts_with(&echo), "{out:?}");
    assert!(
        rest.starts_with(&format!(">>> {FRANCE}\n")),
        "the session went on: {out:?}"
    );
    let second = rest
        .strip_prefix(&format!(">>> {FRANCE}\n"))
        .expect("second turn");
    assert!(
        second.trim().len() > 20,
        "a whole second answer: {second:?}"
    );

    let stats: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("tokens, prompt"))
        .collect();
    assert_eq!(stats.len(), 2, "{err}");
    assert!(stats[0].ends_with("finish: cancelled]"), "{err}");
    let cancelled_after: u64 = stats[0]
        .trim_start_matches('[')
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("token count");
    assert!(cancelled_after < 200, "{err}");
    assert!(stats[1].starts_with("[200 tokens"), "{err}");
    assert!(stats[1].ends_with("finish: length]"), "{err}");
    // The cancelled turn is not part of the conversation: the second prompt is the
    // question alone.
    let alone = daemon_prompt_tokens(&daemon, json!([{"role": "user", "content": FRANCE}])).await;
    assert_eq!(stats_prompt(stats[1]), alone, "{err}");

    // Nothing is left running in the engine.
    let mut c = daemon.connect().await.expect("connect");
    let engine = c.stats().await.expect("stats");
    assert_eq!(engine["running"], 0, "{engine}");
    assert_eq!(engine["waiting"], 0, "{engine}");
}

#[tokio::test]
async fn stats_and_plugins_for_people_and_for_scripts() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let engine = c.stats().await.expect("stats");
    c.send(&json!({"type": "plugins", "id": "p"}))
        .await
        .expect("send");
    let plugins = c.recv().await.expect("plugins frame");
    let names: Vec<&str> = plugins["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();

    // stats --json is the server's frame.
    let out = run(&daemon, &["stats", "--json"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let frame = json_lines(&out);
    assert_eq!(frame.len(), 1);
    assert_eq!(frame[0]["type"], "stats");
    assert_eq!(frame[0]["kv_blocks_total"], engine["kv_blocks_total"]);
    assert_eq!(frame[0]["kv_block_size"], engine["kv_block_size"]);
    assert_eq!(frame[0]["running"], 0);

    // stats for people: labelled lines with the same figures.
    let out = run(&daemon, &["stats"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let human = text(&out.stdout);
    let total = engine["kv_blocks_total"].as_u64().expect("total");
    let kv = human
        .lines()
        .find(|l| l.starts_with("KV blocks"))
        .unwrap_or_else(|| panic!("{human}"));
    assert!(kv.contains(&format!(" / {total} used")), "{human}");
    for label in ["running", "waiting", "prefix cache", "speculative"] {
        assert!(
            human.lines().any(|l| l.starts_with(label)),
            "{label}: {human}"
        );
    }

    // plugins --json is the server's frame; the table lists the same names.
    let out = run(&daemon, &["--json", "plugins"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let frame = json_lines(&out);
    let cli_names: Vec<&str> = frame[0]["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(cli_names, names);
    let out = run(&daemon, &["plugins"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let rows: Vec<&str> = table
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with("interface:"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    if names.is_empty() {
        assert!(table.starts_with("no plugins loaded"), "{table}");
    } else {
        assert!(table.starts_with("NAME "), "{table}");
        assert_eq!(rows, names, "{table}");
        for p in plugins["plugins"].as_array().expect("plugins") {
            let name = p["name"].as_str().expect("name");
            let row = table
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name))
                .expect("row");
            for field in ["world", "version"] {
                assert!(row.contains(p[field].as_str().expect("field")), "{row}");
            }
        }
    }
    assert!(
        table.contains(&format!(
            "interface: {}",
            plugins["interface"].as_str().expect("interface")
        )),
        "{table}"
    );
}

#[test]
fn bad_input_is_reported_and_only_one_shot_gives_up() {
    let daemon = Daemon::start().expect("daemon");
    // The CLI sends the number as written, so the message quotes the user's value.
    let refused = "server error (validation): temperature must be >= 0 (got -1)";

    // One-shot: the server's message, non-zero exit, nothing on stdout; --json also
    // prints it as JSON.
    let out = run(&daemon, &["chat", "Hi", "--temperature", "-1"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(refused), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    let out = run(
        &daemon,
        &["chat", "Hi", "--temperature", "-1", "--json"],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    let error = json_lines(&out);
    assert_eq!(error[0]["error"]["type"], "validation");
    assert_eq!(
        error[0]["error"]["message"],
        "temperature must be >= 0 (got -1)"
    );

    // Interactive: every turn is refused, the session goes on (the /system after the
    // refused turn is answered) and ends normally.
    let out = run(
        &daemon,
        &["chat", "--temperature", "-1"],
        "Hi\n/bogus\n/system\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains(refused), "{err}");
    assert!(err.contains("unknown command /bogus"), "{err}");
    assert!(
        text(&out.stdout).ends_with(">>> /system\nno system prompt (set one with /system TEXT)\n"),
        "{}",
        text(&out.stdout)
    );

    // An unknown command does not end a working session either.
    let out = run(
        &daemon,
        &["chat", "--temperature", "0", "--max-tokens", "8"],
        "/nope\nHi\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let answer = stdout
        .strip_prefix(">>> /nope\n>>> Hi\n")
        .unwrap_or_else(|| panic!("{stdout:?}"));
    assert!(!answer.trim().is_empty(), "{stdout:?}");
    assert!(text(&out.stderr).contains("finish: length"));

    // --raw and --json together are refused by the argument parser.
    let out = run(&daemon, &["chat", "Hi", "--raw", "--json"], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--raw and --json cannot be combined"));
}

/// A connection that cannot be opened: a clear message, status 1, and with `--json` one
/// `{"error": ...}` object on stdout whose type says why.
#[test]
fn a_refused_key_or_a_missing_daemon_is_reported_on_stdout_with_json() {
    let daemon = Daemon::start_with_env(&[("INFERD__SERVER__API_KEY", "secret")]).expect("daemon");
    for (key, reason) in [
        (None, "requires an API key"),
        (Some("wrong"), "refused the API key"),
    ] {
        for args in [
            &["--json", "chat", "Hi"][..],
            &["stats", "--json"],
            &["--json", "chat"],
        ] {
            let mut args = args.to_vec();
            if let Some(key) = key {
                args.extend(["--api-key", key]);
            }
            let out = run(&daemon, &args, "Hi\n");
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            let lines = json_lines(&out);
            assert_eq!(lines.len(), 1, "{args:?}: {lines:?}");
            assert_eq!(lines[0]["error"]["type"], "invalid_api_key", "{args:?}");
            let message = format!("{} {reason} (HTTP 401)", daemon.url);
            let got = lines[0]["error"]["message"].as_str().unwrap_or_default();
            assert!(got.starts_with(&message), "{args:?}: {got}");
            assert!(text(&out.stderr).contains(&message), "{args:?}");
        }
    }
    // The right key works.
    let out = run(&daemon, &["--json", "--api-key", "secret", "stats"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(json_lines(&out)[0]["type"], "stats");

    // Nothing listening: a port that was free a moment ago.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("ws://127.0.0.1:{port}/v1/ws");
    let out = Command::new(cli_path())
        .args(["--url", &url, "--json", "plugins"])
        .env_remove("INFERD_URL")
        .env_remove("INFERD_API_KEY")
        .output()
        .expect("inferd-cli runs");
    assert_eq!(out.status.code(), Some(1));
    let lines = json_lines(&out);
    assert_eq!(lines[0]["error"]["type"], "connection");
    let got = lines[0]["error"]["message"].as_str().unwrap_or_default();
    assert!(
        got.starts_with(&format!("cannot connect to {url}: is inferd running?")),
        "{got}"
    );
}

/// A message above the daemon's `server.max_message_bytes` (here an attached image):
/// the daemon answers with an error frame and closes while the CLI is still writing;
/// the CLI shows the daemon's reason, not the write's "connection reset".
#[test]
fn an_oversized_message_shows_the_daemons_limit() {
    let daemon =
        Daemon::start_with_env(&[("INFERD__SERVER__MAX_MESSAGE_BYTES", "65536")]).expect("daemon");
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("big.png");
    // Base64 makes 3 bytes 4: the message is about 4/3 of this, far above the limit.
    let bytes: Vec<u8> = (0..3_000_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761) as u8)
        .collect();
    std::fs::write(&image, bytes).expect("write");
    let path = image.display().to_string();
    let out = run(&daemon, &["chat", "--image", &path, "What is this?"], "");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("server error (validation): message of ")
            && err.contains("bytes exceeds the limit of 65536 bytes (server.max_message_bytes)"),
        "{err}"
    );
}
