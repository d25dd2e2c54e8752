//! Starting the inferd daemon as a child process and reading its memory use.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// The line prefix the daemon prints on stdout once it listens.
const READY_PREFIX: &str = "inferd: listening on ";

/// How to start the daemon.
#[derive(Debug, Clone)]
pub struct DaemonSpec {
    /// The `inferd` binary.
    pub bin: PathBuf,
    /// Working directory (the repository root).
    pub root: PathBuf,
    /// `--config` file.
    pub config: PathBuf,
    /// `--model` file.
    pub model: PathBuf,
    /// Environment overrides (`INFERD__MODEL__THREADS` and the `--env` pairs).
    pub env: Vec<(String, String)>,
    /// Where the daemon's stderr (its log) goes.
    pub log: PathBuf,
    /// How long to wait for the ready line.
    pub startup_timeout: Duration,
    /// More `serve` arguments, after the others (e.g. `--lora-modules NAME=PATH`).
    pub extra_args: Vec<String>,
}

impl DaemonSpec {
    /// The arguments after the binary.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--config".into(),
            self.config.display().to_string(),
            "--model".into(),
            self.model.display().to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
        ];
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// The environment overrides and the whole command line, as a shell would run it.
    pub fn command_line(&self) -> String {
        let mut parts: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        parts.push(self.bin.display().to_string());
        parts.extend(self.args());
        parts.join(" ")
    }
}

/// A running daemon; killed when dropped.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    /// WebSocket URL parsed from the ready line.
    pub url: String,
    log: PathBuf,
}

impl Daemon {
    /// Starts the daemon on `127.0.0.1:0` and waits for its ready line.
    pub fn start(spec: &DaemonSpec) -> Result<Self> {
        if !spec.bin.is_file() {
            bail!(
                "daemon binary {} not found (build it with `cargo build --release -p inferd` \
                 or pass --bin)",
                spec.bin.display()
            );
        }
        let log = File::create(&spec.log)
            .with_context(|| format!("cannot create {}", spec.log.display()))?;
        let mut command = Command::new(&spec.bin);
        command
            .current_dir(&spec.root)
            .args(spec.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        for (key, value) in &spec.env {
            command.env(key, value);
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {}", spec.bin.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("daemon stdout was not captured"))?;
        // Read stdout on a thread for the daemon's whole life, so it never blocks on a
        // full pipe; the first ready line is handed over.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.trim().strip_prefix(READY_PREFIX) {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(rest.trim().to_owned());
                    }
                }
            }
        });
        let mut daemon = Daemon {
            child,
            url: String::new(),
            log: spec.log.clone(),
        };
        match rx.recv_timeout(spec.startup_timeout) {
            Ok(url) => {
                daemon.url = url;
                Ok(daemon)
            }
            Err(_) => {
                let status = daemon.child.try_wait().ok().flatten();
                let why = match status {
                    Some(status) => format!("the daemon exited ({status})"),
                    None => format!("no ready line within {} s", spec.startup_timeout.as_secs()),
                };
                bail!("{why}; log tail:\n{}", log_tail(&daemon.log, 20))
            }
        }
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Peak resident set size (VmHWM) in bytes.
    pub fn peak_rss_bytes(&self) -> Result<u64> {
        proc_status_kib(self.pid(), "VmHWM:").map(|kib| kib * 1024)
    }

    /// Fails with the log tail when the daemon has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the daemon exited ({status}); log tail:\n{}",
                log_tail(&self.log, 20)
            );
        }
        Ok(())
    }

    /// Sends SIGTERM (through `kill -TERM`) and waits up to `timeout` for the daemon to
    /// exit; returns its exit status and how long it took. Kills it after the timeout.
    pub fn terminate(&mut self, timeout: Duration) -> Result<(ExitStatus, Duration)> {
        let start = Instant::now();
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the daemon had already exited ({status}); log tail:\n{}",
                log_tail(&self.log, 20)
            );
        }
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status()
            .context("cannot run kill -TERM")?;
        if !sent.success() {
            bail!("kill -TERM {} failed ({sent})", self.pid());
        }
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok((status, start.elapsed()));
            }
            if start.elapsed() > timeout {
                self.stop();
                bail!(
                    "the daemon did not exit within {} s of SIGTERM (killed); log tail:\n{}",
                    timeout.as_secs(),
                    log_tail(&self.log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// CPU time (user + system) the daemon has used so far, in clock ticks
    /// (`/proc/PID/stat` fields 14 and 15; 100 per second on Linux).
    pub fn cpu_ticks(&self) -> Result<u64> {
        proc_cpu_ticks(self.pid())
    }

    /// Kills the daemon and waits for it.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// CPU time (user + system) process `pid` has used so far, in clock ticks
/// (`/proc/PID/stat` fields 14 and 15; 100 per second on Linux).
pub fn proc_cpu_ticks(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .ok_or_else(|| anyhow!("bad {path}: {stat}"))?
        .1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .ok_or_else(|| anyhow!("short {path}"))?
            .parse()
            .with_context(|| format!("bad {path}"))
    };
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    Ok(field(11)? + field(12)?)
}

/// Reads a `kB` field such as `VmHWM:` from `/proc/PID/status`.
pub fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .ok_or_else(|| anyhow!("{path} has no {field} line"))?;
    line[field.len()..]
        .split_whitespace()
        .next()
        .ok_or_else(|| anyhow!("empty {field} line in {path}"))?
        .parse()
        .with_context(|| format!("bad {field} line in {path}: {line}"))
}

/// The last `n` lines of a log file (or a note that it cannot be read).
pub fn log_tail(path: &Path, n: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}
