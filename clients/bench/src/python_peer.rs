//! The Python peer of `--scenario prefix`: `peer_prefix_llama_cpp.py` on
//! llama-cpp-python, run as a subprocess with a JSON spec. (The serving scenario's peer
//! is native llama-server, see [`crate::llama_server`].)

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::Cli;

/// Default llama-cpp-python interpreter.
const DEFAULT_PEER_PYTHON: &str = "/work/llama-venv/bin/python";

/// The peer's Python: `--peer-python`, else the default one when it exists.
pub fn peer_python(cli: &Cli) -> std::result::Result<PathBuf, String> {
    match &cli.peer_python {
        Some(p) => Ok(p.clone()),
        None if Path::new(DEFAULT_PEER_PYTHON).exists() => Ok(DEFAULT_PEER_PYTHON.into()),
        None => Err(format!(
            "no peer: {DEFAULT_PEER_PYTHON} does not exist (pass --peer-python)"
        )),
    }
}

/// Writes `spec` to `spec_file`, runs `python script --spec FILE` (killed after
/// `timeout`) and returns the last line of its stdout that starts with `{` (its JSON
/// result). Its stderr (progress) passes through.
pub fn run_script(
    python: &Path,
    script: &Path,
    spec: &impl Serialize,
    spec_file: &Path,
    timeout: Duration,
) -> Result<String> {
    std::fs::write(spec_file, serde_json::to_vec_pretty(spec)?)
        .with_context(|| format!("cannot write {}", spec_file.display()))?;
    let mut child = Command::new(python)
        .arg(script)
        .arg("--spec")
        .arg(spec_file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {} {}", python.display(), script.display()))?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("peer stdout was not captured"))?;
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        stdout.read_to_string(&mut out).map(|_| out)
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the peer ran longer than {} s and was killed",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = reader
        .join()
        .map_err(|_| anyhow!("peer reader thread panicked"))?
        .context("cannot read the peer's stdout")?;
    if !status.success() {
        bail!("the peer failed ({status})");
    }
    out.lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("the peer printed no JSON; stdout:\n{out}"))
}
