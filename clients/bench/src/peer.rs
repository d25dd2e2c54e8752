//! Running the llama.cpp peer (`peer_llama_cpp.py`) as a subprocess.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::figures::Figures;

/// What the peer script is asked to measure; written to a JSON file passed as `--spec`.
#[derive(Debug, Clone, Serialize)]
pub struct PeerSpec {
    /// GGUF model file.
    pub model: PathBuf,
    /// CPU threads (`n_threads` and `n_threads_batch`).
    pub threads: usize,
    /// KV cache size in tokens (`n_ctx`), equal in bytes to inferd's KV budget.
    pub n_ctx: u64,
    /// Tokens generated per stream in the decode and concurrency runs.
    pub max_tokens: u64,
    /// Prompts of the prefill repetitions (`max_tokens` 1 each).
    pub prefill_prompts: Vec<String>,
    /// Prompt of the single-stream decode run.
    pub decode_prompt: String,
    /// Repetitions of the decode run (the best counts).
    pub decode_reps: usize,
    /// Concurrency levels.
    pub concurrency: Vec<usize>,
    /// Prompts of the concurrency runs (level N uses the first N).
    pub concurrent_prompts: Vec<String>,
}

/// Runs `python script --spec FILE` and parses the [`Figures`] it prints on stdout.
/// Its stderr (progress) passes through.
pub fn run_peer(
    python: &Path,
    script: &Path,
    spec: &PeerSpec,
    spec_file: &Path,
    timeout: Duration,
) -> Result<Figures> {
    let json = run_script(python, script, spec, spec_file, timeout)?;
    serde_json::from_str(&json).with_context(|| format!("cannot parse the peer's JSON: {json}"))
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
