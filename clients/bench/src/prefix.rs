//! The prefix KV cache benchmark of issue 5: `inferd-bench --scenario prefix`.
//!
//! One run measures, on inferd:
//! - the time to first token of a chat prompt (a long shared system prompt plus a short
//!   question): cold (a fresh, empty store), warm from the memory tier (same system
//!   prompt, a new question each repetition) and warm from the disk tier after a restart
//!   (SIGTERM, a new daemon on the same store, one restart per repetition);
//! - single-stream decode with the disk tier writing vs. not: the same daemon, each round
//!   one request with the cache on (its blocks are written) and one with `"cache": false`
//!   (nothing written), alternating which goes first; median paired ratio;
//!
//! then, after the daemons are gone, llama.cpp's cold and warm TTFT of the same prompts
//! with its prompt cache within one slot (`peer_prefix_llama_cpp.py`). It prints a table
//! with the goals and writes everything to `target/bench/prefix_bench.json`. See
//! `docs/bench-harness.md`, section "Prefix cache (issue 5)".

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use crate::client::{self, Conn, Trace};
use crate::daemon::{Daemon, DaemonSpec};
use crate::Cli;

/// Seconds a daemon may take to exit after SIGTERM (it flushes the store first).
const STOP_TIMEOUT: Duration = Duration::from_secs(120);
/// Relative TTFT goals of issue 5: warm (memory) and after a restart (disk), × cold.
const GOAL_WARM: f64 = 0.025;
const GOAL_DISK: f64 = 0.05;
/// Decode with the store writing: the median paired ratio within 1 ± this.
const GOAL_DECODE_BAND: f64 = 0.03;

/// What `main` resolved for every scenario.
pub struct Setup {
    pub root: PathBuf,
    pub threads: usize,
    pub bin: PathBuf,
    pub config: PathBuf,
    pub model: PathBuf,
    pub out: PathBuf,
    pub out_dir: PathBuf,
    /// `INFERD__MODEL__THREADS` and the `--env` pairs.
    pub env: Vec<(String, String)>,
}

/// User questions; each TTFT request gets a different one (distinct first words, so two
/// prompts share the system prompt and the chat template's user header, hardly more).
const QUESTIONS: [&str; 20] = [
    "How many miles does the river wind through the valley?",
    "When did the town council vote to build the new library?",
    "Which fruit do the farmers grow on the hillsides?",
    "For how long has the old lighthouse guided ships?",
    "What did the scientists measure every morning?",
    "Who kept a notebook of recipes?",
    "At what time does the train leave the northern station?",
    "Where is the small museum?",
    "Why is the mountain pass closed in winter?",
    "Name one piece the orchestra rehearsed.",
    "Summarize the notes in one sentence.",
    "List two facts about the fishing boat.",
    "Tell me what the committee reviewed.",
    "Does the forest trail climb through pine trees?",
    "Give the number of meteors the astronomers counted.",
    "In which month did the astronomers watch the sky?",
    "Explain what the factory produced.",
    "Could the children plant trees near the playground?",
    "Is the weather station measuring rain or snow?",
    "Are there musicians at the summer festival?",
];

/// Question `i` (distinct for any `i`).
fn question(i: usize) -> String {
    let q = QUESTIONS[i % QUESTIONS.len()];
    match i / QUESTIONS.len() {
        0 => q.to_owned(),
        round => format!("({round}) {q}"),
    }
}

/// The system prompt built from `sentences` sentences of reference notes.
fn system_text(sentences: usize) -> String {
    format!(
        "You are the archive assistant of a small town. Answer the user's question in one \
         short sentence, using only the reference notes below.\n\nReference notes:\n\n{}",
        crate::prompts::long_text(11, sentences)
    )
}

/// The prompt text inferd's chat template renders for [system, user] with the
/// generation prompt, for SmolLM2's ChatML template (checked against the daemon's
/// `started.prompt_tokens` for every request).
pub fn chatml(system: &str, question: &str) -> String {
    format!(
        "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n\
         <|im_start|>assistant\n"
    )
}

/// One chat prompt of the TTFT runs.
#[derive(Debug, Clone, Serialize)]
struct ChatPrompt {
    question: String,
    /// The ChatML text (what llama.cpp is given).
    text: String,
    /// inferd's `tokenize` of `text` with special tokens.
    ids: Vec<u32>,
}

/// How a daemon was stopped with SIGTERM.
#[derive(Debug, Clone, Serialize)]
struct Shutdown {
    /// The daemon's log.
    log: String,
    /// `ExitStatus` as text (`exit status: 0`).
    status: String,
    /// Exit code (`None` when killed by a signal).
    code: Option<i32>,
    /// SIGTERM → exit, milliseconds.
    stop_ms: f64,
}

/// One inferd TTFT request.
#[derive(Debug, Clone, Serialize)]
struct TtftRun {
    question: String,
    /// Whether the request used the cache (`"cache": false` otherwise).
    cache: bool,
    ttft_ms: f64,
    /// `started.prompt_tokens`.
    prompt_tokens: u64,
    /// `started.cached_tokens`.
    cached_tokens: u64,
    /// `done.usage.cached_tokens`.
    usage_cached_tokens: Option<u64>,
    /// Full blocks of the longest common prefix with an earlier cached request's prompt
    /// (what a complete cache would serve).
    expected_cached_tokens: u64,
    /// Increase of `stats.prefix_cache.memory_hit_tokens` over the request.
    memory_hit_tokens: Option<u64>,
    /// Increase of `stats.prefix_cache.disk_hit_tokens` over the request.
    disk_hit_tokens: Option<u64>,
    tokens: u64,
    finish_reason: String,
    /// Length of the ChatML rendering tokenized by inferd (equals `prompt_tokens` when
    /// llama.cpp is given the same prompt).
    chatml_tokens: usize,
    /// For runs after a restart: the daemon's start (spawn → ready line), milliseconds.
    start_ms: Option<f64>,
    /// For runs after a restart: the daemon's log.
    log: Option<String>,
}

/// One decode run.
#[derive(Debug, Clone, Serialize)]
struct DecodeRun {
    round: usize,
    /// `true`: the daemon with `prefix_store.enabled = true`.
    store: bool,
    prompt_tokens: u64,
    cached_tokens: u64,
    tokens: u64,
    finish_reason: String,
    ttft_ms: f64,
    /// First to last token, seconds.
    span_s: f64,
    /// (tokens − tokens of the first delta) / span.
    tok_per_s: f64,
    /// Median gap between tokens, milliseconds (less sensitive to single stalls).
    p50_itl_ms: f64,
    /// CPU time the hypervisor gave to others meanwhile (steal, all cores), seconds.
    steal_s: Option<f64>,
    /// CPU seconds the other (idle) daemon used meanwhile.
    other_daemon_cpu_s: f64,
    /// Seconds waited before the run for both daemons to be idle.
    quiesce_s: f64,
}

/// A table row: one figure for both engines.
#[derive(Debug, Clone, Serialize)]
struct Row {
    metric: String,
    inferd: Option<f64>,
    peer: Option<f64>,
}

/// A goal of issue 5 and whether it was met.
#[derive(Debug, Clone, Serialize)]
struct Goal {
    goal: String,
    measured: Option<f64>,
    /// Lowest allowed value, if any.
    low: Option<f64>,
    /// Highest allowed value, if any.
    high: Option<f64>,
    /// `"yes"`, `"no"`, or `"n/a"` (a figure is missing).
    met: String,
}

fn goal(text: &str, measured: Option<f64>, low: Option<f64>, high: Option<f64>) -> Goal {
    let met = match measured {
        None => "n/a",
        Some(m) if low.is_none_or(|l| m >= l) && high.is_none_or(|h| m <= h) => "yes",
        Some(_) => "no",
    };
    Goal {
        goal: text.to_owned(),
        measured,
        low,
        high,
        met: met.to_owned(),
    }
}

/// Median (mean of the two middle values for an even count); `None` when empty.
fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Sample standard deviation; `None` for fewer than two values.
fn stdev(values: &[f64]) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    Some((values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt())
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Full blocks of the longest common prefix of `ids` with any of `earlier`, at most
/// `ids.len() - 1` tokens (the last prompt token is always computed).
fn expected_cached(ids: &[u32], earlier: &[&[u32]], block: usize) -> u64 {
    let lcp = earlier
        .iter()
        .map(|e| common_prefix(ids, e))
        .max()
        .unwrap_or(0)
        .min(ids.len().saturating_sub(1));
    (lcp / block.max(1) * block.max(1)) as u64
}

/// `stats.prefix_cache.KEY`.
fn pc(stats: &Option<Value>, key: &str) -> Option<u64> {
    stats.as_ref()?["prefix_cache"][key].as_u64()
}

fn delta(before: &Option<Value>, after: &Option<Value>, key: &str) -> Option<u64> {
    Some(pc(after, key)?.saturating_sub(pc(before, key)?))
}

async fn stats(url: &str) -> Option<Value> {
    Conn::connect(url).await.ok()?.stats().await
}

/// A unique new folder under `parent`.
fn new_dir(parent: &Path, what: &str) -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = parent.join(format!(
        "inferd-bench-{what}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Everything the run keeps track of across daemons.
struct Run<'a> {
    cli: &'a Cli,
    setup: &'a Setup,
    runtime: tokio::runtime::Runtime,
    timeout: Duration,
    /// Every daemon log written, for the warning scan.
    logs: Vec<PathBuf>,
}

impl Run<'_> {
    /// Daemon environment: the common pairs, then the prefix cache keys.
    fn spec(&mut self, name: &str, store: &Path, disk: bool) -> DaemonSpec {
        let mut env = self.setup.env.clone();
        env.push(("INFERD__SCHEDULER__PREFIX_CACHING".into(), "true".into()));
        env.push(("INFERD__PREFIX_STORE__ENABLED".into(), disk.to_string()));
        env.push((
            "INFERD__PREFIX_STORE__PATH".into(),
            store.display().to_string(),
        ));
        let log = self.setup.out_dir.join(format!("prefix-{name}.stderr.log"));
        self.logs.push(log.clone());
        DaemonSpec {
            bin: self.setup.bin.clone(),
            root: self.setup.root.clone(),
            config: self.setup.config.clone(),
            model: self.setup.model.clone(),
            env,
            log,
            startup_timeout: Duration::from_secs(self.cli.startup_timeout),
            extra_args: Vec::new(),
        }
    }

    /// Starts a daemon and sends it one short warm-up request that bypasses the cache
    /// (`"cache": false`), so the measured request is not the process's first.
    /// Returns the daemon and its start time (spawn → ready line) in milliseconds.
    fn start(&mut self, spec: &DaemonSpec) -> Result<(Daemon, f64)> {
        let t0 = Instant::now();
        let daemon = Daemon::start(spec)?;
        let start_ms = t0.elapsed().as_secs_f64() * 1e3;
        eprintln!(
            "inferd-bench: daemon pid {} at {} (log: {}), started in {start_ms:.0} ms",
            daemon.pid(),
            daemon.url,
            spec.log.display()
        );
        let url = daemon.url.clone();
        let timeout = self.timeout;
        self.runtime.block_on(async {
            let mut conn = Conn::connect(&url).await?;
            let frame = json!({
                "type": "generate", "id": "warmup", "prompt": "Hello, my name is",
                "max_tokens": 8, "temperature": 0, "cache": false,
            });
            conn.generate_frame("warmup", &frame, timeout).await
        })?;
        Ok((daemon, start_ms))
    }

    /// SIGTERM, wait for the exit.
    fn stop(&self, mut daemon: Daemon, spec: &DaemonSpec) -> Result<Shutdown> {
        let (status, took) = daemon.terminate(STOP_TIMEOUT)?;
        if !status.success() {
            eprintln!("inferd-bench: warning: the daemon exited with {status} after SIGTERM");
        }
        Ok(Shutdown {
            log: spec.log.display().to_string(),
            status: status.to_string(),
            code: status.code(),
            stop_ms: took.as_secs_f64() * 1e3,
        })
    }
}

/// A chat `generate` of `prompt`, greedy.
async fn chat(
    conn: &mut Conn,
    id: &str,
    system: &str,
    question: &str,
    max_tokens: u64,
    cache: bool,
    timeout: Duration,
) -> Result<Trace> {
    let mut frame = json!({
        "type": "generate", "id": id,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "max_tokens": max_tokens, "temperature": 0,
    });
    if !cache {
        frame["cache"] = json!(false);
    }
    conn.generate_frame(id, &frame, timeout).await
}

/// One TTFT request with the stats around it.
#[allow(clippy::too_many_arguments)]
async fn ttft_run(
    url: &str,
    id: &str,
    system: &str,
    prompt: &ChatPrompt,
    cache: bool,
    expected_cached_tokens: u64,
    max_tokens: u64,
    timeout: Duration,
) -> Result<TtftRun> {
    let before = stats(url).await;
    let mut conn = Conn::connect(url).await?;
    let trace = chat(
        &mut conn,
        id,
        system,
        &prompt.question,
        max_tokens,
        cache,
        timeout,
    )
    .await?;
    let after = stats(url).await;
    let ttft = trace
        .timing
        .ttft_s()
        .ok_or_else(|| anyhow!("request {id} produced no token"))?;
    if trace.prompt_tokens as usize != prompt.ids.len() {
        eprintln!(
            "inferd-bench: warning: {id}: prompt_tokens {} but the ChatML rendering has {} \
             tokens (llama.cpp gets a different prompt)",
            trace.prompt_tokens,
            prompt.ids.len()
        );
    }
    Ok(TtftRun {
        question: prompt.question.clone(),
        cache,
        ttft_ms: ttft * 1e3,
        prompt_tokens: trace.prompt_tokens,
        cached_tokens: trace.cached_tokens,
        usage_cached_tokens: trace.usage_cached_tokens,
        expected_cached_tokens,
        memory_hit_tokens: delta(&before, &after, "memory_hit_tokens"),
        disk_hit_tokens: delta(&before, &after, "disk_hit_tokens"),
        tokens: trace.timing.tokens(),
        finish_reason: trace.finish_reason,
        chatml_tokens: prompt.ids.len(),
        start_ms: None,
        log: None,
    })
}

fn log_run(kind: &str, r: &TtftRun) {
    eprintln!(
        "inferd-bench:   {kind}: TTFT {:.1} ms, prompt {} tokens, cached {} (expected {}), \
         memory hits {}, disk hits {}",
        r.ttft_ms,
        r.prompt_tokens,
        r.cached_tokens,
        r.expected_cached_tokens,
        r.memory_hit_tokens.map_or("-".into(), |v| v.to_string()),
        r.disk_hit_tokens.map_or("-".into(), |v| v.to_string()),
    );
}

/// The TTFT part on inferd: cold, warm (memory), after restarts (disk).
struct TtftPart {
    system: String,
    system_tokens: usize,
    block_size: usize,
    prompts: Vec<ChatPrompt>,
    cold: Vec<TtftRun>,
    warm: Vec<TtftRun>,
    disk: Vec<TtftRun>,
    shutdowns: Vec<Shutdown>,
    stats_before_restart: Option<Value>,
    stats_end: Option<Value>,
}

fn ttft_part(run: &mut Run, store: &Path) -> Result<TtftPart> {
    let cli = run.cli;
    let timeout = run.timeout;
    let n_prompts = cli.cold_reps + cli.warm_reps + cli.disk_reps;
    let spec = run.spec("ttft-0", store, true);
    let (mut daemon, _) = run.start(&spec)?;
    let url = daemon.url.clone();

    // Prompts: the system prompt cut to --system-tokens, one question per request.
    let (system, system_tokens, prompts, block_size) = run.runtime.block_on(async {
        let mut conn = Conn::connect(&url).await?;
        let (system, count) =
            client::text_of_tokens(&mut conn, cli.system_tokens, system_text).await?;
        if count != cli.system_tokens {
            eprintln!(
                "inferd-bench: the system prompt has {count} tokens (wanted {})",
                cli.system_tokens
            );
        }
        let mut prompts = Vec::new();
        for i in 0..n_prompts {
            let q = question(i);
            let text = chatml(&system, &q);
            let ids = conn.tokenize_with(&text, true).await?;
            prompts.push(ChatPrompt {
                question: q,
                text,
                ids,
            });
        }
        let block = stats(&url)
            .await
            .and_then(|s| s["kv_block_size"].as_u64())
            .unwrap_or(16) as usize;
        anyhow::Ok((system, count, prompts, block))
    })?;
    eprintln!(
        "inferd-bench: system prompt {system_tokens} tokens, chat prompt {} tokens, KV block \
         {block_size} tokens",
        prompts[0].ids.len()
    );

    // Prompts (ids) of earlier requests that used the cache.
    let mut cached_before: Vec<usize> = Vec::new();
    let expected = |k: usize, earlier: &[usize]| {
        let e: Vec<&[u32]> = earlier.iter().map(|&j| prompts[j].ids.as_slice()).collect();
        expected_cached(&prompts[k].ids, &e, block_size)
    };

    let mut cold = Vec::new();
    let mut warm = Vec::new();
    eprintln!(
        "inferd-bench: cold TTFT x{} (first on the empty store, then \"cache\": false)",
        cli.cold_reps
    );
    for (i, prompt) in prompts.iter().enumerate().take(cli.cold_reps) {
        let cache = i == 0;
        let r = run.runtime.block_on(ttft_run(
            &url,
            &format!("cold-{i}"),
            &system,
            prompt,
            cache,
            if cache {
                expected(i, &cached_before)
            } else {
                0
            },
            cli.ttft_max_tokens,
            timeout,
        ));
        let r = check(r, &mut daemon)?;
        log_run("cold", &r);
        if cache {
            cached_before.push(i);
        }
        cold.push(r);
    }
    eprintln!("inferd-bench: warm TTFT (memory tier) x{}", cli.warm_reps);
    for k in 0..cli.warm_reps {
        let i = cli.cold_reps + k;
        let r = run.runtime.block_on(ttft_run(
            &url,
            &format!("warm-{k}"),
            &system,
            &prompts[i],
            true,
            expected(i, &cached_before),
            cli.ttft_max_tokens,
            timeout,
        ));
        let r = check(r, &mut daemon)?;
        log_run("warm", &r);
        cached_before.push(i);
        warm.push(r);
    }

    let stats_before_restart = run.runtime.block_on(stats(&url));
    let mut shutdowns = vec![run.stop(daemon, &spec)?];
    let mut disk = Vec::new();
    eprintln!(
        "inferd-bench: TTFT after a restart (disk tier) x{}",
        cli.disk_reps
    );
    let mut stats_end = stats_before_restart.clone();
    for k in 0..cli.disk_reps {
        let i = cli.cold_reps + cli.warm_reps + k;
        let spec = run.spec(&format!("ttft-{}", k + 1), store, true);
        let (mut daemon, start_ms) = run.start(&spec)?;
        let url = daemon.url.clone();
        let r = run.runtime.block_on(ttft_run(
            &url,
            &format!("disk-{k}"),
            &system,
            &prompts[i],
            true,
            expected(i, &cached_before),
            cli.ttft_max_tokens,
            timeout,
        ));
        let mut r = check(r, &mut daemon)?;
        r.start_ms = Some(start_ms);
        r.log = Some(spec.log.display().to_string());
        log_run("after restart", &r);
        cached_before.push(i);
        disk.push(r);
        stats_end = run.runtime.block_on(stats(&url));
        shutdowns.push(run.stop(daemon, &spec)?);
    }
    Ok(TtftPart {
        system,
        system_tokens,
        block_size,
        prompts,
        cold,
        warm,
        disk,
        shutdowns,
        stats_before_restart,
        stats_end,
    })
}

/// On failure, says whether the daemon died (which explains most failures).
fn check<T>(result: Result<T>, daemon: &mut Daemon) -> Result<T> {
    result.map_err(|e| match daemon.check_alive() {
        Err(dead) => e.context(format!("{dead:#}")),
        Ok(()) => e,
    })
}

/// The decode part: two daemons, disk tier on and off, alternating rounds.
struct DecodePart {
    runs: Vec<DecodeRun>,
    /// Per round: store-on tok/s / store-off tok/s.
    paired_ratios: Vec<f64>,
    /// Per round: the same ratio of 1 / median ITL.
    paired_ratios_p50_itl: Vec<f64>,
    stats_store: Option<Value>,
    stats_no_store: Option<Value>,
    shutdowns: Vec<Shutdown>,
}

/// Steal time of all CPUs so far, clock ticks (`/proc/stat`, field 8 of the `cpu` line).
fn steal_ticks() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    text.lines().next()?.split_whitespace().nth(8)?.parse().ok()
}

/// Waits (up to 10 s) until neither daemon uses CPU over 300 ms (the disk tier's writer
/// and sled's flusher finish behind a request), so one daemon's background work does
/// not slow the other's run. Returns the seconds waited.
async fn quiesce(daemons: [&Daemon; 2]) -> f64 {
    let t0 = Instant::now();
    let ticks = || -> Option<u64> {
        let mut sum = 0;
        for d in daemons {
            sum += d.cpu_ticks().ok()?;
        }
        Some(sum)
    };
    let mut last = ticks();
    while t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = ticks();
        if now.is_none() || now == last {
            break;
        }
        last = now;
    }
    t0.elapsed().as_secs_f64()
}

fn decode_part(run: &mut Run, store: &Path, unused_store: &Path) -> Result<DecodePart> {
    let cli = run.cli;
    let timeout = run.timeout;
    let spec_on = run.spec("decode-store", store, true);
    let spec_off = run.spec("decode-no-store", unused_store, false);
    let (mut on, _) = run.start(&spec_on)?;
    let (off, _) = run.start(&spec_off)?;
    // One untimed decode each, so the first timed run is not a process's first long one.
    run.runtime.block_on(async {
        for d in [&on, &off] {
            let mut conn = Conn::connect(&d.url).await?;
            let frame = json!({
                "type": "generate", "id": "warmup-decode",
                "prompt": "Once upon a time, in a small village by the sea,",
                "max_tokens": 32, "temperature": 0, "cache": false,
            });
            conn.generate_frame("warmup-decode", &frame, timeout)
                .await?;
        }
        anyhow::Ok(())
    })?;
    let prompts = crate::prompts::concurrent_prompts(cli.decode_rounds);
    let mut runs = Vec::new();
    let mut paired = Vec::new();
    let mut paired_itl = Vec::new();
    eprintln!(
        "inferd-bench: decode {} tokens, store on vs. off, {} rounds",
        cli.decode_tokens, cli.decode_rounds
    );
    for (round, prompt) in prompts.iter().enumerate() {
        let order = if round % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        let mut tps = [0.0; 2];
        let mut itl = [0.0; 2];
        for store in order {
            // Both arms run on the daemon with the store, so process placement cannot
            // bias the ratio: the "off" arm sends `"cache": false` (nothing is written),
            // the "on" arm writes every block it completes.
            let (this, other) = (&on, &off);
            let r = run.runtime.block_on(async {
                let quiesce_s = quiesce([this, other]).await;
                let other_before = other.cpu_ticks().unwrap_or(0);
                let steal_before = steal_ticks();
                let mut conn = Conn::connect(&this.url).await?;
                let frame = json!({
                    "type": "generate", "id": "decode", "prompt": prompt,
                    "max_tokens": cli.decode_tokens, "temperature": 0, "cache": store,
                });
                let trace = conn.generate_frame("decode", &frame, timeout).await?;
                let other_after = other.cpu_ticks().unwrap_or(other_before);
                let steal = steal_ticks()
                    .zip(steal_before)
                    .map(|(a, b)| a.saturating_sub(b) as f64 / 100.0);
                let mut gaps = trace.timing.itl_gaps_s();
                gaps.sort_by(f64::total_cmp);
                let (after_first, span_s) = trace.timing.decode_span();
                anyhow::Ok(DecodeRun {
                    round,
                    store,
                    prompt_tokens: trace.prompt_tokens,
                    cached_tokens: trace.cached_tokens,
                    tokens: trace.timing.tokens(),
                    finish_reason: trace.finish_reason,
                    ttft_ms: trace.timing.ttft_s().unwrap_or(0.0) * 1e3,
                    span_s,
                    tok_per_s: if span_s > 0.0 {
                        after_first as f64 / span_s
                    } else {
                        0.0
                    },
                    p50_itl_ms: crate::figures::percentile(&gaps, 0.5) * 1e3,
                    steal_s: steal,
                    other_daemon_cpu_s: other_after.saturating_sub(other_before) as f64 / 100.0,
                    quiesce_s,
                })
            });
            let r = check(r, &mut on)?;
            eprintln!(
                "inferd-bench:   round {round} store {}: {:.1} tok/s, median ITL {:.2} ms ({} \
                 tokens, other daemon {:.2} CPU s, steal {} s)",
                if store { "on " } else { "off" },
                r.tok_per_s,
                r.p50_itl_ms,
                r.tokens,
                r.other_daemon_cpu_s,
                r.steal_s.map_or("-".into(), |s| format!("{s:.2}"))
            );
            tps[usize::from(!store)] = r.tok_per_s;
            itl[usize::from(!store)] = r.p50_itl_ms;
            runs.push(r);
        }
        if tps[1] > 0.0 {
            paired.push(tps[0] / tps[1]);
        }
        if itl[0] > 0.0 {
            paired_itl.push(itl[1] / itl[0]);
        }
    }
    let (stats_store, stats_no_store) = run
        .runtime
        .block_on(async { (stats(&on.url).await, stats(&off.url).await) });
    let shutdowns = vec![run.stop(on, &spec_on)?, run.stop(off, &spec_off)?];
    Ok(DecodePart {
        runs,
        paired_ratios: paired,
        paired_ratios_p50_itl: paired_itl,
        stats_store,
        stats_no_store,
        shutdowns,
    })
}

/// The peer's JSON spec.
#[derive(Debug, Serialize)]
struct PeerPrefixSpec<'a> {
    model: &'a Path,
    threads: usize,
    n_ctx: u64,
    max_tokens: u64,
    cold: Vec<PeerPrompt<'a>>,
    warm: Vec<PeerPrompt<'a>>,
}

#[derive(Debug, Serialize)]
struct PeerPrompt<'a> {
    text: &'a str,
    ids: &'a [u32],
}

/// Runs `peer_prefix_llama_cpp.py` on the cold and warm prompts.
fn peer_part(run: &Run, ttft: &TtftPart) -> std::result::Result<Value, String> {
    let cli = run.cli;
    if cli.no_peer {
        return Err("skipped (--no-peer)".into());
    }
    let python = crate::python_peer::peer_python(cli)?;
    let script = cli
        .peer_script
        .clone()
        .map(|s| crate::absolute(&run.setup.root, s))
        .unwrap_or_else(|| {
            run.setup
                .root
                .join("clients/bench/peer_prefix_llama_cpp.py")
        });
    let longest = ttft.prompts.iter().map(|p| p.ids.len()).max().unwrap_or(0) as u64;
    let n_ctx = (longest + cli.ttft_max_tokens + 64).div_ceil(256) * 256;
    let pick = |range: std::ops::Range<usize>| {
        ttft.prompts[range]
            .iter()
            .map(|p| PeerPrompt {
                text: &p.text,
                ids: &p.ids,
            })
            .collect()
    };
    let spec = PeerPrefixSpec {
        model: &run.setup.model,
        threads: run.setup.threads,
        n_ctx,
        max_tokens: cli.ttft_max_tokens,
        cold: pick(0..cli.cold_reps),
        warm: pick(cli.cold_reps..cli.cold_reps + cli.warm_reps),
    };
    eprintln!(
        "inferd-bench: peer: {} {} (n_ctx {n_ctx})",
        python.display(),
        script.display()
    );
    let json = crate::python_peer::run_script(
        &python,
        &script,
        &spec,
        &run.setup.out_dir.join("peer_prefix_spec.json"),
        Duration::from_secs(cli.peer_timeout),
    )
    .map_err(|e| format!("{e:#}"))?;
    serde_json::from_str(&json).map_err(|e| format!("cannot parse the peer's JSON: {e}: {json}"))
}

/// Warning and error lines of the daemon logs.
fn scan_logs(logs: &[PathBuf]) -> Value {
    let mut out = serde_json::Map::new();
    for log in logs {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let hits: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        out.insert(
            log.display().to_string(),
            json!({
                "warn": hits.iter().filter(|l| l.contains(" WARN ")).count(),
                "error": hits.iter().filter(|l| l.contains(" ERROR ")).count(),
                "first": hits.iter().take(10).collect::<Vec<_>>(),
            }),
        );
    }
    Value::Object(out)
}

fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.trim().to_owned())
}

fn render(rows: &[Row], goals: &[Goal]) -> String {
    use crate::report::{cell, goal_list, table};
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| vec![r.metric.clone(), cell(r.inferd), cell(r.peer)])
        .collect();
    let mut out = table(&[("metric", 0), ("inferd", 10), ("llama.cpp", 10)], &cells);
    let lines: Vec<(String, String, String)> = goals
        .iter()
        .map(|g| {
            (
                g.met.clone(),
                g.goal.clone(),
                g.measured.map_or("-".into(), |x| format!("{x:.4}")),
            )
        })
        .collect();
    out.push_str(&goal_list("goals of issue 5:", &lines));
    out
}

/// Runs the prefix scenario.
pub fn run(cli: &Cli, setup: Setup) -> Result<()> {
    for (name, v) in [
        ("--system-tokens", cli.system_tokens),
        ("--cold-reps", cli.cold_reps),
        ("--warm-reps", cli.warm_reps),
        ("--disk-reps", cli.disk_reps),
        ("--decode-rounds", cli.decode_rounds),
    ] {
        if v == 0 {
            bail!("{name} must be >= 1");
        }
    }
    if cli.ttft_max_tokens == 0 || cli.decode_tokens < 2 {
        bail!("--ttft-max-tokens must be >= 1 and --decode-tokens >= 2");
    }
    let started = Instant::now();
    let load_start = load_average();
    eprintln!(
        "inferd-bench: prefix scenario: {} with {} threads, model {}",
        setup.bin.display(),
        setup.threads,
        setup.model.display()
    );
    let parent = cli
        .store_parent
        .clone()
        .map(|p| crate::absolute(&setup.root, p))
        .unwrap_or_else(std::env::temp_dir);
    let ttft_store = new_dir(&parent, "prefix-store")?;
    let decode_store = new_dir(&parent, "decode-store")?;
    let unused_store = new_dir(&parent, "decode-no-store")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build the tokio runtime")?;
    let mut run = Run {
        cli,
        setup: &setup,
        runtime,
        timeout: Duration::from_secs(cli.request_timeout),
        logs: Vec::new(),
    };

    let busy_before_inferd = crate::machine::other_cpu_busy();
    let result = ttft_part(&mut run, &ttft_store).and_then(|t| {
        let d = decode_part(&mut run, &decode_store, &unused_store)?;
        Ok((t, d))
    });
    let store_bytes = dir_bytes(&ttft_store);
    if !cli.keep_store {
        for dir in [&ttft_store, &decode_store, &unused_store] {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    let (ttft, decode) = result?;
    let busy_before_peer = if cli.no_peer {
        None
    } else {
        crate::machine::other_cpu_busy()
    };
    let peer = peer_part(&run, &ttft);
    if let Err(e) = &peer {
        eprintln!("inferd-bench: peer: {e}");
    }
    let peer_ok = peer.as_ref().ok();

    // Figures.
    let ms = |runs: &[TtftRun]| runs.iter().map(|r| r.ttft_ms).collect::<Vec<_>>();
    let peer_runs = |kind: &str| -> Vec<Value> {
        peer_ok
            .and_then(|p| p[kind].as_array().cloned())
            .unwrap_or_default()
    };
    let peer_ms = |kind: &str| {
        peer_runs(kind)
            .iter()
            .filter_map(|r| r["ttft_ms"].as_f64())
            .collect::<Vec<_>>()
    };
    let peer_field = |kind: &str, key: &str| {
        peer_runs(kind)
            .iter()
            .filter_map(|r| r[key].as_f64())
            .collect::<Vec<_>>()
    };
    let cold_first = ttft.cold.first().map(|r| r.ttft_ms);
    let cold_med = median(&ms(&ttft.cold));
    let warm_med = median(&ms(&ttft.warm));
    let disk_med = median(&ms(&ttft.disk));
    let peer_cold_first = peer_ms("cold").first().copied();
    let peer_cold_med = median(&peer_ms("cold"));
    let peer_warm_med = median(&peer_ms("warm"));
    let cached = |runs: &[TtftRun]| {
        median(
            &runs
                .iter()
                .map(|r| r.cached_tokens as f64)
                .collect::<Vec<_>>(),
        )
    };
    let on: Vec<f64> = decode
        .runs
        .iter()
        .filter(|r| r.store)
        .map(|r| r.tok_per_s)
        .collect();
    let off: Vec<f64> = decode
        .runs
        .iter()
        .filter(|r| !r.store)
        .map(|r| r.tok_per_s)
        .collect();
    let paired_med = median(&decode.paired_ratios);
    let paired_sd = stdev(&decode.paired_ratios);
    let prompt_tokens = ttft.cold.first().map(|r| r.prompt_tokens);
    let n = |v: usize| v.to_string();
    let rows = vec![
        Row {
            metric: format!(
                "chat prompt tokens (system prompt {} + question)",
                ttft.system_tokens
            ),
            inferd: prompt_tokens.map(|v| v as f64),
            peer: peer_field("cold", "prompt_tokens").first().copied(),
        },
        Row {
            metric: "cold TTFT ms, first request on the empty store".into(),
            inferd: cold_first,
            peer: peer_cold_first,
        },
        Row {
            metric: format!("cold TTFT ms, median of {}", n(cli.cold_reps)),
            inferd: cold_med,
            peer: peer_cold_med,
        },
        Row {
            metric: format!("warm TTFT ms (memory), median of {}", n(cli.warm_reps)),
            inferd: warm_med,
            peer: peer_warm_med,
        },
        Row {
            metric: "warm cached tokens, median".into(),
            inferd: cached(&ttft.warm),
            peer: median(&peer_field("warm", "reused_tokens")),
        },
        Row {
            metric: "warm / cold (median / median)".into(),
            inferd: ratio(warm_med, cold_med),
            peer: ratio(peer_warm_med, peer_cold_med),
        },
        Row {
            metric: format!(
                "TTFT ms after restart (disk), median of {}",
                n(cli.disk_reps)
            ),
            inferd: disk_med,
            peer: None,
        },
        Row {
            metric: "after-restart cached tokens, median".into(),
            inferd: cached(&ttft.disk),
            peer: None,
        },
        Row {
            metric: "after-restart stats disk_hit_tokens, median".into(),
            inferd: median(
                &ttft
                    .disk
                    .iter()
                    .filter_map(|r| r.disk_hit_tokens.map(|v| v as f64))
                    .collect::<Vec<_>>(),
            ),
            peer: None,
        },
        Row {
            metric: "after restart / cold (median / median)".into(),
            inferd: ratio(disk_med, cold_med),
            peer: None,
        },
        Row {
            metric: format!("decode tok/s, store writing, median of {}", n(on.len())),
            inferd: median(&on),
            peer: None,
        },
        Row {
            metric: format!("decode tok/s, store off, median of {}", n(off.len())),
            inferd: median(&off),
            peer: None,
        },
        Row {
            metric: "decode store on / off, median paired ratio".into(),
            inferd: paired_med,
            peer: None,
        },
        Row {
            metric: "decode paired ratios, standard deviation".into(),
            inferd: paired_sd,
            peer: None,
        },
        Row {
            metric: "decode on / off by median ITL, median paired ratio".into(),
            inferd: median(&decode.paired_ratios_p50_itl),
            peer: None,
        },
    ];
    let goals = vec![
        goal(
            &format!("warm TTFT <= {GOAL_WARM} x cold (median / median)"),
            ratio(warm_med, cold_med),
            None,
            Some(GOAL_WARM),
        ),
        goal(
            &format!("TTFT after restart <= {GOAL_DISK} x cold (median / median)"),
            ratio(disk_med, cold_med),
            None,
            Some(GOAL_DISK),
        ),
        goal(
            &format!(
                "decode with the store writing unchanged within +-{:.0} % (median paired ratio)",
                GOAL_DECODE_BAND * 100.0
            ),
            paired_med,
            Some(1.0 - GOAL_DECODE_BAND),
            Some(1.0 + GOAL_DECODE_BAND),
        ),
    ];

    // Cache counts below what a complete cache would serve.
    let mut notes = Vec::new();
    for r in ttft.cold.iter().chain(&ttft.warm).chain(&ttft.disk) {
        if r.cache && r.cached_tokens < r.expected_cached_tokens {
            notes.push(format!(
                "{:?}: cached_tokens {} < expected {}",
                r.question, r.cached_tokens, r.expected_cached_tokens
            ));
        }
        if r.usage_cached_tokens.is_some_and(|u| u != r.cached_tokens) {
            notes.push(format!(
                "{:?}: done.usage.cached_tokens {:?} != started.cached_tokens {}",
                r.question, r.usage_cached_tokens, r.cached_tokens
            ));
        }
        if r.prompt_tokens as usize != r.chatml_tokens {
            notes.push(format!(
                "{:?}: prompt_tokens {} != ChatML rendering {} tokens",
                r.question, r.prompt_tokens, r.chatml_tokens
            ));
        }
    }
    for r in &ttft.disk {
        if r.disk_hit_tokens.is_some_and(|d| d < r.cached_tokens) {
            notes.push(format!(
                "after restart {:?}: disk_hit_tokens {:?} < cached_tokens {} (part came \
                 from memory?)",
                r.question, r.disk_hit_tokens, r.cached_tokens
            ));
        }
    }
    for s in ttft.shutdowns.iter().chain(&decode.shutdowns) {
        if s.code != Some(0) {
            notes.push(format!("{}: exit after SIGTERM: {}", s.log, s.status));
        }
    }
    for r in &decode.runs {
        if r.cached_tokens > 0 {
            notes.push(format!(
                "decode round {} store {}: cached_tokens {}",
                r.round, r.store, r.cached_tokens
            ));
        }
    }
    for p in peer_runs("cold").iter().chain(&peer_runs("warm")) {
        if p["tokens_match"] == json!(false) {
            notes.push("llama.cpp tokenizes a prompt differently from inferd".into());
            break;
        }
    }
    let logs = scan_logs(&run.logs);
    let load_end = load_average();

    println!(
        "\ninferd-bench prefix: {} threads, system prompt {} tokens, TTFT max_tokens {}, \
         decode {} tokens, load average before {} / after {}\n",
        setup.threads,
        ttft.system_tokens,
        cli.ttft_max_tokens,
        cli.decode_tokens,
        load_start.as_deref().unwrap_or("-"),
        load_end.as_deref().unwrap_or("-"),
    );
    print!("{}", render(&rows, &goals));
    if !notes.is_empty() {
        println!("\nnotes:");
        for n in &notes {
            println!("  - {n}");
        }
    }
    if let Value::Object(map) = &logs {
        for (file, v) in map {
            let (w, e) = (
                v["warn"].as_u64().unwrap_or(0),
                v["error"].as_u64().unwrap_or(0),
            );
            if w + e > 0 {
                println!("\nlog {file}: {w} WARN, {e} ERROR; first:");
                for l in v["first"].as_array().into_iter().flatten() {
                    println!("  {}", l.as_str().unwrap_or(""));
                }
            }
        }
    }

    let (commit, dirty) = crate::git_state(&setup.root);
    let result = json!({
        "scenario": "prefix",
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "date": chrono::Utc::now().to_rfc3339(),
        "wall_s": started.elapsed().as_secs_f64(),
        "git_commit": commit,
        "git_dirty": dirty,
        "threads": setup.threads,
        "binary": setup.bin,
        "config": setup.config,
        "model": setup.model,
        "env": setup.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "load_average": {"start": load_start, "end": load_end},
        "other_cpu_busy": {
            "before_inferd": busy_before_inferd,
            "before_peer": busy_before_peer,
        },
        "stores": {
            "ttft": ttft_store,
            "decode": decode_store,
            "kept": cli.keep_store,
            "ttft_store_bytes_at_end": store_bytes,
        },
        "settings": {
            "system_tokens": ttft.system_tokens,
            "system_tokens_wanted": cli.system_tokens,
            "prompt_tokens": prompt_tokens,
            "kv_block_size": ttft.block_size,
            "ttft_max_tokens": cli.ttft_max_tokens,
            "cold_reps": cli.cold_reps,
            "warm_reps": cli.warm_reps,
            "disk_reps": cli.disk_reps,
            "decode_rounds": cli.decode_rounds,
            "decode_tokens": cli.decode_tokens,
        },
        "prompts": {
            "system": ttft.system,
            "chat": ttft.prompts.iter().map(|p| json!({
                "question": p.question, "text": p.text, "tokens": p.ids.len(),
            })).collect::<Vec<_>>(),
            "decode": crate::prompts::concurrent_prompts(cli.decode_rounds),
        },
        "inferd": {
            "cold": ttft.cold,
            "warm": ttft.warm,
            "disk": ttft.disk,
            "shutdowns": ttft.shutdowns,
            "stats_before_first_restart": ttft.stats_before_restart,
            "stats_last_daemon": ttft.stats_end,
            "medians_ms": {"cold": cold_med, "warm": warm_med, "disk": disk_med},
            "ratios": {
                "warm_over_cold": ratio(warm_med, cold_med),
                "disk_over_cold": ratio(disk_med, cold_med),
                "warm_over_first_cold": ratio(warm_med, cold_first),
                "disk_over_first_cold": ratio(disk_med, cold_first),
            },
            "decode": {
                "runs": decode.runs,
                "paired_ratios": decode.paired_ratios,
                "median_paired_ratio": paired_med,
                "paired_ratio_stdev": paired_sd,
                "paired_ratios_p50_itl": decode.paired_ratios_p50_itl,
                "median_paired_ratio_p50_itl": median(&decode.paired_ratios_p50_itl),
                "paired_ratio_p50_itl_stdev": stdev(&decode.paired_ratios_p50_itl),
                "paired_ratio_min": decode.paired_ratios.iter().copied().reduce(f64::min),
                "paired_ratio_max": decode.paired_ratios.iter().copied().reduce(f64::max),
                "median_tok_per_s_store": median(&on),
                "median_tok_per_s_no_store": median(&off),
                "stats_store": decode.stats_store,
                "stats_no_store": decode.stats_no_store,
                "shutdowns": decode.shutdowns,
            },
        },
        "peer": peer_ok,
        "peer_error": peer.as_ref().err(),
        "peer_summary": {
            "cold_first_ms": peer_cold_first,
            "cold_median_ms": peer_cold_med,
            "warm_median_ms": peer_warm_med,
            "warm_over_cold": ratio(peer_warm_med, peer_cold_med),
        },
        "table": rows,
        "goals": goals,
        "notes": notes,
        "daemon_logs": logs,
    });
    std::fs::write(&setup.out, serde_json::to_vec_pretty(&result)?)
        .with_context(|| format!("cannot write {}", setup.out.display()))?;
    println!(
        "\nwritten: {} ({:.0} s)",
        setup.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(stdev(&[1.0]), None);
        assert!((stdev(&[1.0, 3.0]).unwrap() - 2f64.sqrt()).abs() < 1e-12);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn expected_cached_counts_full_blocks() {
        let a: Vec<u32> = (0..40).collect();
        let mut b = a.clone();
        b[35] = 999;
        assert_eq!(expected_cached(&b, &[&a], 16), 32);
        assert_eq!(expected_cached(&b, &[], 16), 0);
        // A prompt equal to an earlier one still computes its last token.
        let c: Vec<u32> = (0..32).collect();
        assert_eq!(expected_cached(&c, &[&a], 16), 16);
    }

    #[test]
    fn questions_are_distinct() {
        let q: Vec<String> = (0..60).map(question).collect();
        let mut s = q.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), q.len());
    }

    #[test]
    fn goals_bands() {
        assert_eq!(goal("x", Some(0.02), None, Some(0.025)).met, "yes");
        assert_eq!(goal("x", Some(0.03), None, Some(0.025)).met, "no");
        assert_eq!(goal("x", Some(1.02), Some(0.97), Some(1.03)).met, "yes");
        assert_eq!(goal("x", Some(0.96), Some(0.97), Some(1.03)).met, "no");
        assert_eq!(goal("x", None, None, Some(1.0)).met, "n/a");
    }
}
