//! `llama-bench` on the same file with the same threads: llama.cpp's own prompt
//! processing (`pp<N>`) and generation (`tg<N>`) figures, without any server, parsed
//! from its JSON output (`-o json`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

/// One llama-bench test.
#[derive(Debug, Clone, Serialize)]
pub struct BenchTest {
    /// `pp512`, `tg128`, ...
    pub name: String,
    /// Mean tokens per second over the repetitions (`avg_ts`).
    pub avg_tok_per_s: f64,
    pub stddev_tok_per_s: f64,
    pub samples_tok_per_s: Vec<f64>,
}

/// What one llama-bench run gave.
#[derive(Debug, Clone, Serialize)]
pub struct LlamaBench {
    pub command: Vec<String>,
    pub pp: Option<BenchTest>,
    pub tg: Option<BenchTest>,
    /// llama-bench's JSON, unchanged.
    pub raw: Value,
}

/// Runs `llama-bench -m model -t threads -p pp -n tg -r reps -o json` (killed after
/// `timeout`); its stderr goes to `log`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    binary: &Path,
    model: &Path,
    threads: usize,
    pp: usize,
    tg: u64,
    reps: usize,
    log: &PathBuf,
    timeout: Duration,
) -> Result<LlamaBench> {
    let args: Vec<String> = [
        "-m",
        &model.display().to_string(),
        "-t",
        &threads.to_string(),
        "-p",
        &pp.to_string(),
        "-n",
        &tg.to_string(),
        "-r",
        &reps.to_string(),
        "-o",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut command = vec![binary.display().to_string()];
    command.extend(args.iter().cloned());
    eprintln!("inferd-bench: {}", command.join(" "));
    let err =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut child = Command::new(binary)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err))
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let mut stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).map(|_| s)
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
                "llama-bench ran longer than {} s and was killed",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = reader
        .join()
        .map_err(|_| anyhow!("llama-bench reader panicked"))?
        .context("cannot read llama-bench's output")?;
    if !status.success() {
        bail!(
            "llama-bench failed ({status}); log tail:\n{}",
            crate::daemon::log_tail(log, 10)
        );
    }
    let raw: Value = serde_json::from_str(&out)
        .with_context(|| format!("cannot parse llama-bench's JSON: {out}"))?;
    let (pp, tg) = parse(&raw)?;
    Ok(LlamaBench {
        command,
        pp,
        tg,
        raw,
    })
}

/// The prompt-processing and generation tests of llama-bench's JSON array.
fn parse(raw: &Value) -> Result<(Option<BenchTest>, Option<BenchTest>)> {
    let tests = raw
        .as_array()
        .ok_or_else(|| anyhow!("llama-bench's JSON is not an array"))?;
    let mut pp = None;
    let mut tg = None;
    for t in tests {
        let n_prompt = t["n_prompt"].as_u64().unwrap_or(0);
        let n_gen = t["n_gen"].as_u64().unwrap_or(0);
        let test = |name: String| BenchTest {
            name,
            avg_tok_per_s: t["avg_ts"].as_f64().unwrap_or(0.0),
            stddev_tok_per_s: t["stddev_ts"].as_f64().unwrap_or(0.0),
            samples_tok_per_s: t["samples_ts"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default(),
        };
        match (n_prompt, n_gen) {
            (p, 0) if p > 0 => pp = Some(test(format!("pp{p}"))),
            (0, g) if g > 0 => tg = Some(test(format!("tg{g}"))),
            _ => {}
        }
    }
    Ok((pp, tg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pp_and_tg() {
        let raw: Value = serde_json::from_str(
            r#"[{"n_prompt":512,"n_gen":0,"avg_ts":300.5,"stddev_ts":2.0,"samples_ts":[300,301]},
                {"n_prompt":0,"n_gen":128,"avg_ts":140.0,"stddev_ts":1.0,"samples_ts":[140]}]"#,
        )
        .unwrap();
        let (pp, tg) = parse(&raw).unwrap();
        let (pp, tg) = (pp.unwrap(), tg.unwrap());
        assert_eq!((pp.name.as_str(), pp.avg_tok_per_s), ("pp512", 300.5));
        assert_eq!((tg.name.as_str(), tg.samples_tok_per_s.len()), ("tg128", 1));
    }
}
