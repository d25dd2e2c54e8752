//! End-to-end test support: starts the real `inferd` binary on `127.0.0.1:0` with the
//! real model and talks to it over a real WebSocket.
//!
//! The binary must be built first (`cargo build --workspace --bins`, which
//! `scripts/test.sh` does); the harness finds it next to the test executable's folder.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub mod soak;

/// File name of the default model.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// The default model: `$INFERD_TEST_MODEL`, `models/`, or `../shared/models/`.
///
/// # Panics
/// When it is in none of them (run `scripts/fetch-model.sh`).
pub fn model_path() -> PathBuf {
    if let Ok(p) = std::env::var("INFERD_TEST_MODEL") {
        return PathBuf::from(p);
    }
    let root = workspace_root();
    for c in [
        root.join("models").join(DEFAULT_MODEL_FILE),
        root.join("../shared/models").join(DEFAULT_MODEL_FILE),
    ] {
        if c.is_file() {
            return c;
        }
    }
    panic!("default model not found: run scripts/fetch-model.sh");
}

/// Parsed `../shared/fixtures/<rel>`.
///
/// # Panics
/// When missing or not JSON.
pub fn fixture(rel: &str) -> Value {
    let p = workspace_root().join("../shared/fixtures").join(rel);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Path of the built `inferd` binary (`target/<profile>/inferd`).
///
/// # Panics
/// When it has not been built.
pub fn inferd_binary() -> PathBuf {
    // Another build to test (the soak's allocator comparison): INFERD_BINARY.
    if let Some(b) = std::env::var_os("INFERD_BINARY") {
        return PathBuf::from(b);
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test-exe> -> target/<profile>/inferd; a binary of this
    // crate (target/<profile>/inferd-soak) has it beside itself.
    let name = format!("inferd{}", std::env::consts::EXE_SUFFIX);
    let beside = exe.parent().map(|d| d.join(&name));
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = match beside {
        Some(b) if b.is_file() => b,
        _ => dir.join(&name),
    };
    assert!(
        bin.is_file(),
        "{} not found: build it first with `cargo build --workspace --bins`",
        bin.display()
    );
    bin
}

/// Runs `systemd-analyze verify` on the unit text `unit` (written to a temporary
/// `inferd.service`; its `ExecStart` must name a binary that exists) and panics when it
/// fails or warns about the unit.
///
/// # Panics
/// When systemd-analyze is missing (Debian package systemd), fails, or names the unit.
pub fn systemd_analyze_verify(unit: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("inferd.service");
    std::fs::write(&path, unit).expect("write the unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (install the Debian package systemd)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
    assert!(
        !stderr.contains("inferd.service"),
        "warnings about the unit: {stderr}"
    );
}

/// A running daemon; killed on drop.
pub struct Daemon {
    child: Child,
    /// The prefix store directory this daemon got when the caller named none (removed
    /// with the daemon).
    _store_dir: Option<tempfile::TempDir>,
    /// `ws://127.0.0.1:PORT/v1/ws`.
    pub url: String,
    /// stderr lines collected so far are available through [`Daemon::stderr_tail`].
    stderr: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// The KV-cache event sockets (`inferd: kv events on PUB replay ROUTER`).
    kv_events: std::sync::Arc<std::sync::Mutex<Option<(String, String)>>>,
}

impl Daemon {
    /// Starts `inferd serve --config configs/test.toml --model <default> --listen 127.0.0.1:0`
    /// with extra environment variables, and waits until it listens.
    pub fn start_with_env(env: &[(&str, &str)]) -> Result<Self> {
        Self::start_args(&[], env)
    }

    /// Starts with the default test settings.
    pub fn start() -> Result<Self> {
        Self::start_args(&[], &[])
    }

    /// Starts with extra CLI arguments and environment variables, and waits until the
    /// model is loaded and the daemon serves (`inferd: listening on ws://...`).
    pub fn start_args(args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        Self::spawn(None, args, env, false)
    }

    /// Like [`Daemon::start_args`] with another config file than `configs/test.toml`.
    pub fn start_config(config: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        Self::spawn(Some(config), args, env, false)
    }

    /// Like [`Daemon::start_args`] but returns as soon as the listener is bound
    /// (`inferd: bound to ADDR, loading`), while the model still loads.
    pub fn start_bound(args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        Self::spawn(None, args, env, true)
    }

    /// `127.0.0.1:PORT` of the listener.
    pub fn addr(&self) -> String {
        self.url
            .trim_start_matches("ws://")
            .trim_end_matches("/v1/ws")
            .to_string()
    }

    /// One HTTP/1.1 request to this daemon (see [`http`]).
    pub fn http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Result<HttpResponse> {
        http(&self.addr(), method, path, headers, body)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Like [`Daemon::start_config`] with another model (a GGUF file or a Hugging Face
    /// directory) than the default.
    pub fn start_model(model: &Path, config: Option<&Path>, env: &[(&str, &str)]) -> Result<Self> {
        Self::spawn_model(config, model, &[], env, false)
    }

    fn spawn(
        config: Option<&Path>,
        args: &[&str],
        env: &[(&str, &str)],
        bound_only: bool,
    ) -> Result<Self> {
        Self::spawn_model(config, &model_path(), args, env, bound_only)
    }

    fn spawn_model(
        config: Option<&Path>,
        model: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        bound_only: bool,
    ) -> Result<Self> {
        let root = workspace_root();
        let mut cmd = Command::new(inferd_binary());
        cmd.arg("serve")
            .arg("--config")
            .arg(config.map_or_else(|| root.join("configs/test.toml"), Path::to_path_buf))
            .arg("--model")
            .arg(model)
            .arg("--listen")
            .arg("127.0.0.1:0")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // The bundled and the test-only plugins, built by scripts/build-plugins.sh
            // (absolute: the daemon's working directory is the test's).
            .env("INFERD__PLUGINS__DIR", plugins_dir());
        // Every daemon gets its own prefix store unless the test names one (two sled
        // databases cannot share a directory).
        let mut store_dir = None;
        if !env.iter().any(|(k, _)| *k == "INFERD__PREFIX_STORE__PATH") {
            let dir = tempfile::tempdir().context("prefix store tempdir")?;
            cmd.env("INFERD__PREFIX_STORE__PATH", dir.path());
            store_dir = Some(dir);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().context("spawning inferd")?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let lines2 = lines.clone();
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut l) = lines2.lock() {
                    l.push(line);
                }
            }
        });
        let (tx, rx) = mpsc::channel();
        let kv_events = std::sync::Arc::new(std::sync::Mutex::new(None));
        let kv_events2 = kv_events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("inferd: kv events on ") {
                    let mut parts = rest.split(" replay ");
                    let local = |s: &str| s.trim().replace("tcp://0.0.0.0:", "tcp://127.0.0.1:");
                    if let (Some(p), Some(r), Ok(mut k)) =
                        (parts.next(), parts.next(), kv_events2.lock())
                    {
                        *k = Some((local(p), local(r)));
                    }
                } else if let Some(url) = line.strip_prefix("inferd: listening on ") {
                    if !bound_only {
                        let _ = tx.send(url.trim().to_string());
                    }
                } else if let Some(rest) = line.strip_prefix("inferd: bound to ") {
                    if bound_only {
                        let addr = rest.split(',').next().unwrap_or_default().trim();
                        let _ = tx.send(format!("ws://{addr}/v1/ws"));
                    }
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(u) => u,
            Err(_) => {
                // A daemon that exits closes stdout at once; its stderr may still be
                // unread, so wait for it to end before reporting it.
                let _ = child.kill();
                let _ = child.wait();
                let _ = stderr_reader.join();
                let tail = lines.lock().map(|l| l.join("\n")).unwrap_or_default();
                bail!("inferd did not start listening; stderr:\n{tail}");
            }
        };
        Ok(Self {
            child,
            _store_dir: store_dir,
            url,
            stderr: lines,
            kv_events,
        })
    }

    /// The KV-cache event sockets, `(PUB, replay)` as `tcp://127.0.0.1:PORT`, when
    /// `[kv_events]` is on.
    pub fn kv_events(&self) -> Option<(String, String)> {
        self.kv_events.lock().ok().and_then(|k| k.clone())
    }

    /// Sends `signal` (`"TERM"`, `"KILL"`, ...) to the daemon with `kill(1)`.
    pub fn signal(&self, signal: &str) -> Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .context("running kill")?;
        if !status.success() {
            bail!("kill -{signal} failed: {status}");
        }
        Ok(())
    }

    /// Waits up to `timeout` for the process to exit; returns its exit code (`None`
    /// when killed by a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<i32>> {
        let end = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status.code());
            }
            if std::time::Instant::now() > end {
                bail!("inferd did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Collected stderr output.
    pub fn stderr_tail(&self) -> String {
        self.stderr.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Opens a WebSocket connection.
    pub async fn connect(&self) -> Result<Client> {
        Client::connect(&self.url).await
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The plugins directory every harness daemon loads: `$INFERD_PLUGINS_DIR` or
/// `target/e2e-plugins/`, where `scripts/build-plugins.sh` (which the test command runs
/// first) puts the bundled plugins together with the test-only fixtures (`busy_loop`,
/// `memory_bomb`, `trap`, `scripted`, `wasi_probe`) that the daemon does not load by
/// default.
pub fn plugins_dir() -> PathBuf {
    std::env::var_os("INFERD_PLUGINS_DIR").map_or_else(
        || workspace_root().join("target/e2e-plugins"),
        PathBuf::from,
    )
}

/// The bundled plugins alone, as `scripts/run.sh` serves them: `target/plugins/`.
pub fn bundled_plugins_dir() -> PathBuf {
    workspace_root().join("target/plugins")
}

/// Where the test-only plugins are (e.g. `scripted.wasm`): `$INFERD_TEST_PLUGINS_DIR` or
/// `target/test-plugins/`, where `scripts/build-plugins.sh` writes them apart from the
/// bundled ones so that no daemon loads them by default. A test copies the ones it
/// needs into a directory of its own and passes it as `INFERD__PLUGINS__DIR`.
pub fn test_plugins_dir() -> PathBuf {
    std::env::var_os("INFERD_TEST_PLUGINS_DIR").map_or_else(
        || workspace_root().join("target/test-plugins"),
        PathBuf::from,
    )
}

/// Runs `inferd serve` expecting it to fail at start-up; returns (exit code, stderr).
pub fn start_failure(args: &[&str], env: &[(&str, &str)]) -> Result<(Option<i32>, String)> {
    let mut cmd = Command::new(inferd_binary());
    cmd.arg("serve").args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().context("running inferd")?;
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// A WebSocket client speaking protocol v1.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl Client {
    /// Connects to `url`.
    pub async fn connect(url: &str) -> Result<Self> {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .context("connect")?;
        Ok(Self { ws })
    }

    /// Connects to `url` with extra handshake headers (e.g. `Authorization`).
    pub async fn connect_with_headers(url: &str, headers: &[(&str, &str)]) -> Result<Self> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        use tokio_tungstenite::tungstenite::http::{HeaderName, HeaderValue};
        let mut req = url.into_client_request().context("request")?;
        for (k, v) in headers {
            req.headers_mut().insert(
                HeaderName::from_bytes(k.as_bytes())?,
                HeaderValue::from_str(v)?,
            );
        }
        let (ws, _) = tokio_tungstenite::connect_async(req)
            .await
            .context("connect")?;
        Ok(Self { ws })
    }

    /// Sends a JSON value as a text frame.
    pub async fn send(&mut self, v: &Value) -> Result<()> {
        self.send_text(&v.to_string()).await
    }

    /// Sends raw text.
    pub async fn send_text(&mut self, s: &str) -> Result<()> {
        self.ws.send(Message::text(s.to_string())).await?;
        Ok(())
    }

    /// Sends a binary frame.
    pub async fn send_binary(&mut self, b: Vec<u8>) -> Result<()> {
        self.ws.send(Message::binary(b)).await?;
        Ok(())
    }

    /// Next JSON frame (60 s timeout).
    pub async fn recv(&mut self) -> Result<Value> {
        self.recv_within(Duration::from_secs(60)).await
    }

    /// Next JSON frame, waiting at most `timeout`.
    pub async fn recv_within(&mut self, timeout: Duration) -> Result<Value> {
        loop {
            let msg = tokio::time::timeout(timeout, self.ws.next())
                .await
                .map_err(|_| anyhow!("timed out waiting for a frame"))?
                .ok_or_else(|| anyhow!("connection closed"))??;
            match msg {
                Message::Text(t) => return Ok(serde_json::from_str(t.as_str())?),
                Message::Close(_) => bail!("connection closed"),
                _ => continue,
            }
        }
    }

    /// Closes the connection.
    pub async fn close(mut self) -> Result<()> {
        self.ws.close(None).await?;
        Ok(())
    }

    /// Sends `req` and collects its frames until `done` or `error` for its id.
    pub async fn generate(&mut self, req: Value) -> Result<Generation> {
        let id = req["id"]
            .as_str()
            .ok_or_else(|| anyhow!("request needs an id"))?
            .to_string();
        self.send(&req).await?;
        let mut g = Generation::default();
        loop {
            let f = self.recv().await?;
            if f["id"].as_str() != Some(id.as_str()) {
                bail!("unexpected frame for another id: {f}");
            }
            if g.absorb(f) {
                return Ok(g);
            }
        }
    }

    /// Sends every request, then collects frames until each has ended; by request id.
    pub async fn generate_all(
        &mut self,
        reqs: &[Value],
    ) -> Result<std::collections::HashMap<String, Generation>> {
        for r in reqs {
            self.send(r).await?;
        }
        let mut out = std::collections::HashMap::<String, Generation>::new();
        let mut open = reqs.len();
        while open > 0 {
            let f = self.recv().await?;
            let id = f["id"]
                .as_str()
                .ok_or_else(|| anyhow!("frame without an id: {f}"))?
                .to_string();
            if out.entry(id).or_default().absorb(f) {
                open -= 1;
            }
        }
        Ok(out)
    }

    /// Sends `{"type":"stats"}` and returns the `stats` frame (other frames on this
    /// connection are an error: use a connection of its own).
    pub async fn stats(&mut self) -> Result<Value> {
        self.send(&json!({"type":"stats"})).await?;
        let f = self.recv().await?;
        if f["type"] != "stats" {
            bail!("expected a stats frame, got {f}");
        }
        Ok(f)
    }

    /// Greedy chat request with `messages`.
    pub async fn chat_greedy(
        &mut self,
        id: &str,
        messages: Value,
        max_tokens: u64,
    ) -> Result<Generation> {
        self.generate(json!({"type":"generate","id":id,"messages":messages,"max_tokens":max_tokens,"temperature":0}))
            .await
    }
}

/// The frames of one request, collected.
#[derive(Debug, Default, Clone)]
pub struct Generation {
    /// The `started` frame.
    pub started: Option<Value>,
    /// Concatenated delta texts.
    pub text: String,
    /// Each delta's text, in order.
    pub deltas: Vec<String>,
    /// Concatenated delta token ids.
    pub token_ids: Vec<u32>,
    /// Concatenated delta `logprobs` entries (one per token id when asked for).
    pub logprobs: Vec<Value>,
    /// The `done` frame.
    pub done: Option<Value>,
    /// The `error` frame.
    pub error: Option<Value>,
}

impl Generation {
    /// Adds a frame; returns true once it is the final one.
    pub fn absorb(&mut self, f: Value) -> bool {
        match f["type"].as_str() {
            Some("started") => self.started = Some(f),
            Some("delta") => {
                let t = f["text"].as_str().unwrap_or_default().to_string();
                self.text.push_str(&t);
                self.deltas.push(t);
                if let Some(ids) = f["token_ids"].as_array() {
                    self.token_ids
                        .extend(ids.iter().filter_map(|x| x.as_u64()).map(|x| x as u32));
                }
                if let Some(lp) = f["logprobs"].as_array() {
                    self.logprobs.extend(lp.iter().cloned());
                }
            }
            Some("done") => {
                self.done = Some(f);
                return true;
            }
            Some("error") => {
                self.error = Some(f);
                return true;
            }
            _ => {}
        }
        false
    }

    /// `done.finish_reason`.
    pub fn finish_reason(&self) -> Option<&str> {
        self.done.as_ref().and_then(|d| d["finish_reason"].as_str())
    }

    /// `error.error.type`.
    pub fn error_type(&self) -> Option<&str> {
        self.error
            .as_ref()
            .and_then(|e| e["error"]["type"].as_str())
    }
}

/// A whole HTTP response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Header names (lower case) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked), as text.
    pub body: String,
}

impl HttpResponse {
    /// The body as JSON.
    ///
    /// # Panics
    /// When it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON payloads of a server-sent-event body's `data:` lines, in order
    /// (`[DONE]` as the string `"[DONE]"`).
    pub fn sse_data(&self) -> Vec<Value> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_string())))
            .collect()
    }
}

/// Sends one HTTP/1.1 request to `addr` (`host:port`) with `Connection: close` and reads
/// the whole response (120 s timeout).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<HttpResponse> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.unwrap_or_default());
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// Parses a whole HTTP/1.1 response (`Content-Length`, chunked, or read to close).
pub fn parse_response(raw: &[u8]) -> Result<HttpResponse> {
    let text = String::from_utf8_lossy(raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no end of headers in {text:?}"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        let mut out = String::new();
        let mut rest = rest;
        loop {
            let (size, after) = rest
                .split_once("\r\n")
                .ok_or_else(|| anyhow!("truncated chunked body"))?;
            let n = usize::from_str_radix(size.trim(), 16)
                .map_err(|_| anyhow!("bad chunk size {size:?}"))?;
            if n == 0 {
                break;
            }
            out.push_str(after.get(..n).ok_or_else(|| anyhow!("truncated chunk"))?);
            rest = after.get(n + 2..).unwrap_or_default();
        }
        out
    } else {
        rest.to_string()
    };
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

/// The Python interpreter with the `openai` and `prometheus_client` packages:
/// `$INFERD_TEST_PYTHON`, or `target/pyenv/bin/python` (made by `scripts/test.sh`).
///
/// # Panics
/// When neither exists.
pub fn python() -> PathBuf {
    let p = std::env::var_os("INFERD_TEST_PYTHON").map_or_else(
        || workspace_root().join("target/pyenv/bin/python"),
        PathBuf::from,
    );
    assert!(
        p.is_file(),
        "{} not found: run scripts/test.sh (it makes target/pyenv with the openai and \
         prometheus_client packages) or set INFERD_TEST_PYTHON",
        p.display()
    );
    p
}

/// Runs `tests/python/<script>` with `args`; returns its stdout parsed as JSON.
///
/// # Errors
/// The script failed or printed no JSON (its stderr is in the message).
pub fn run_python(script: &str, args: &[&str], stdin: Option<&str>) -> Result<Value> {
    use std::io::Write;
    let mut child = Command::new(python())
        .arg(workspace_root().join("tests/python").join(script))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning python")?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.unwrap_or_default().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "{script} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "{script} printed no JSON: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// An OpenAI `image_url` content part carrying the PNG file at `path` as a `data:` URL.
///
/// # Panics
/// When the file cannot be read.
pub fn png_part(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let b64 = data_encoding::BASE64.encode(&bytes);
    serde_json::json!({"type": "image_url",
                       "image_url": {"url": format!("data:image/png;base64,{b64}")}})
}

/// Token ids of a JSON array.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_u64())
                .map(|x| x as u32)
                .collect()
        })
        .unwrap_or_default()
}

/// The numbers of a JSON array (reference logits).
///
/// # Panics
/// When `v` is not an array of numbers.
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// The token ids of a JSON array, as `u64` (as `serde_json` reads them).
///
/// # Panics
/// When `v` is not an array of non-negative integers.
pub fn ids_u64(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

/// `ln softmax(logits)` in f64 (the reference for log-probabilities).
pub fn log_softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
    logits.iter().map(|l| l - lse).collect()
}

/// Runs `reqs` at once, one WebSocket connection each, on the daemon at `url`; returns
/// the generations in order.
///
/// # Panics
/// When a connection or a generation fails at the transport level.
pub async fn concurrently(url: &str, reqs: Vec<Value>) -> Vec<Generation> {
    let handles: Vec<_> = reqs
        .into_iter()
        .map(|r| {
            let url = url.to_string();
            tokio::spawn(async move {
                let mut c = Client::connect(&url).await.expect("connect");
                c.generate(r).await.expect("generate")
            })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("join"));
    }
    out
}

/// Sixteen short chat topics for tests that run many distinct streams at once.
pub const TOPICS: [&str; 16] = [
    "the sea",
    "Rust",
    "a cat",
    "the moon",
    "bread",
    "trains",
    "winter",
    "music",
    "a forest",
    "coffee",
    "mountains",
    "the city",
    "rain",
    "books",
    "a garden",
    "stars",
];
