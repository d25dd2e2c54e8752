//! Starting native `llama-server` as a child process, waiting for `/health`, reading
//! its memory use and what it logged about its KV cache.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::daemon::{log_tail, proc_status_kib};
use crate::http_client;

/// How to start one llama-server.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    pub binary: PathBuf,
    pub model: PathBuf,
    /// `-t` and `-tb`.
    pub threads: usize,
    /// `-np`: parallel slots.
    pub parallel: usize,
    /// `-c`: KV cache cells (tokens) over all slots (unified).
    pub ctx: u64,
    pub log: PathBuf,
    pub startup_timeout: Duration,
    /// More arguments, after the others (e.g. speculative decoding's `--spec-type`).
    pub extra: Vec<String>,
}

impl ServerSpec {
    /// The arguments after the binary, for `port`.
    ///
    /// `-kvu`: one KV pool shared by all slots, as inferd's paged pool is (llama-server
    /// only unifies by default when `-np` is left on auto). `-cb`: continuous batching
    /// (its default, made explicit). `--no-cache-prompt` and `-cram 0`: no prompt
    /// reuse, neither in the slot nor in the host-memory prompt cache, as inferd runs
    /// with prefix caching off. `-lv 4` logs the context and KV buffer sizes at start-up
    /// (and a few lines per request, none per token).
    pub fn args(&self, port: u16) -> Vec<String> {
        let mut args: Vec<String> = vec!["-m".into(), self.model.display().to_string()];
        for (flag, value) in [
            ("-t", self.threads.to_string()),
            ("-tb", self.threads.to_string()),
            ("-np", self.parallel.to_string()),
            ("-c", self.ctx.to_string()),
        ] {
            args.push(flag.into());
            args.push(value);
        }
        for flag in ["-kvu", "-cb", "--no-cache-prompt", "--no-webui"] {
            args.push(flag.into());
        }
        for (flag, value) in [
            ("-cram", "0".to_owned()),
            ("-lv", "4".to_owned()),
            ("--host", "127.0.0.1".to_owned()),
            ("--port", port.to_string()),
        ] {
            args.push(flag.into());
            args.push(value);
        }
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// What llama-server logged about its context at start-up.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerLog {
    /// `llama_context: n_ctx = N` (after llama.cpp's padding).
    pub n_ctx: Option<u64>,
    /// Sum of the `KV buffer size = X MiB` lines, in bytes.
    pub kv_buffer_bytes: Option<u64>,
    /// The `llama_kv_cache: size = ...` lines.
    pub kv_cache_lines: Vec<String>,
    /// `llama_context: flash_attn = ...` and whether it was enabled.
    pub flash_attn: Vec<String>,
    /// The `system_info` line.
    pub system_info: Option<String>,
}

/// A running llama-server; killed when dropped.
#[derive(Debug)]
pub struct LlamaServer {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The whole command line.
    pub command: Vec<String>,
    log: PathBuf,
}

impl LlamaServer {
    /// Starts it on a free port of 127.0.0.1 and waits until `/health` answers 200.
    pub fn start(spec: &ServerSpec) -> Result<Self> {
        let port = free_port()?;
        let args = spec.args(port);
        let mut command = vec![spec.binary.display().to_string()];
        command.extend(args.iter().cloned());
        let log = File::create(&spec.log)
            .with_context(|| format!("cannot create {}", spec.log.display()))?;
        let err = log.try_clone()?;
        let child = Command::new(&spec.binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .with_context(|| format!("cannot start {}", spec.binary.display()))?;
        let mut server = LlamaServer {
            child,
            addr: format!("127.0.0.1:{port}"),
            command,
            log: spec.log.clone(),
        };
        let start = Instant::now();
        loop {
            if let Some(status) = server.child.try_wait()? {
                bail!(
                    "llama-server exited ({status}); log tail:\n{}",
                    log_tail(&server.log, 20)
                );
            }
            if let Ok((200, _)) = http_client::get(&server.addr, "/health", Duration::from_secs(5))
            {
                return Ok(server);
            }
            if start.elapsed() > spec.startup_timeout {
                bail!(
                    "llama-server not healthy within {} s; log tail:\n{}",
                    spec.startup_timeout.as_secs(),
                    log_tail(&server.log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The file its stdout and stderr go to.
    pub fn log_path(&self) -> &std::path::Path {
        &self.log
    }

    /// Peak resident set size (VmHWM) in bytes.
    pub fn peak_rss_bytes(&self) -> Result<u64> {
        proc_status_kib(self.pid(), "VmHWM:").map(|kib| kib * 1024)
    }

    /// Fails with the log tail when the server has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "llama-server exited ({status}); log tail:\n{}",
                log_tail(&self.log, 20)
            );
        }
        Ok(())
    }

    /// `GET /props` as JSON (null when it fails).
    pub fn props(&self) -> serde_json::Value {
        http_client::get(&self.addr, "/props", Duration::from_secs(10))
            .ok()
            .and_then(|(_, body)| serde_json::from_str(&body).ok())
            .unwrap_or(serde_json::Value::Null)
    }

    /// What the log says about the context and KV cache.
    pub fn parse_log(&self) -> ServerLog {
        parse_log(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }

    /// Sends SIGTERM, waits up to 10 s, then kills it.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(self.pid().to_string())
                .status();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A port that was free a moment ago (bound to port 0, then released).
fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

fn parse_log(text: &str) -> ServerLog {
    let mut out = ServerLog::default();
    let mut kv_mib = 0.0;
    let mut kv_seen = false;
    for line in text.lines() {
        if let Some(rest) = line.split("llama_context: n_ctx ").nth(1) {
            if let Some(v) = rest.trim_start().strip_prefix('=') {
                out.n_ctx = v.trim().parse().ok();
            }
        }
        if let Some(rest) = line.split("KV buffer size =").nth(1) {
            if let Some(mib) = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
            {
                kv_mib += mib;
                kv_seen = true;
            }
        }
        if line.contains("llama_kv_cache: size =") {
            out.kv_cache_lines.push(
                line.split("llama_kv_cache:")
                    .nth(1)
                    .unwrap_or(line)
                    .trim()
                    .to_owned(),
            );
        }
        if line.contains("flash_attn") || line.contains("Flash Attention") {
            out.flash_attn.push(line.trim().to_owned());
        }
        if out.system_info.is_none() && line.contains("system_info:") {
            out.system_info = line
                .split("system_info:")
                .nth(1)
                .map(|s| s.trim().to_owned());
        }
    }
    if kv_seen {
        out.kv_buffer_bytes = Some((kv_mib * 1024.0 * 1024.0).round() as u64);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_start_up_log() {
        let log = "0.00.495.367 I llama_context: n_ctx                 = 11776\n\
                   0.00.495.369 I llama_context: flash_attn            = auto\n\
                   0.00.495.531 I llama_kv_cache:        CPU KV buffer size =   258.75 MiB\n\
                   0.00.671.480 I llama_kv_cache: size =  258.75 MiB ( 11776 cells,  30 layers,  4/1 seqs)\n";
        let l = parse_log(log);
        assert_eq!(l.n_ctx, Some(11776));
        assert_eq!(l.kv_buffer_bytes, Some(271_319_040));
        assert_eq!(l.kv_cache_lines.len(), 1);
        assert_eq!(l.flash_attn.len(), 1);
    }

    #[test]
    fn args_carry_the_settings() {
        let spec = ServerSpec {
            binary: "llama-server".into(),
            model: "m.gguf".into(),
            threads: 2,
            parallel: 16,
            ctx: 11648,
            log: "x.log".into(),
            startup_timeout: Duration::from_secs(1),
            extra: Vec::new(),
        };
        let a = spec.args(8080).join(" ");
        assert!(a.contains("-t 2 -tb 2 -np 16 -c 11648 -kvu -cb"));
        assert!(a.ends_with("--host 127.0.0.1 --port 8080"));
        let spec = ServerSpec {
            extra: vec!["--spec-type".into(), "ngram-simple".into()],
            ..spec
        };
        assert!(spec
            .args(8080)
            .join(" ")
            .ends_with("--port 8080 --spec-type ngram-simple"));
    }
}
