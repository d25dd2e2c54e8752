//! `inferd-bench`: the serving benchmark of issue 3.
//!
//! Starts the inferd daemon, measures it through its WebSocket (single-stream prefill
//! and decode, N concurrent streams, peak RSS), then runs the same measurements on
//! llama.cpp through `peer_llama_cpp.py` (llama-cpp-python, its own batching), prints a
//! comparison table with the goals of issue 3 and writes everything to
//! `target/bench/serve_bench.json`. See `docs/bench-harness.md`.
//!
//! ```text
//! cargo run --release -p inferd-bench -- --concurrency 1,4,16,64 --max-tokens 128
//! ```
//!
//! `--scenario prefix` runs the prefix KV cache benchmark of issue 5 instead (cold, warm
//! and after-restart TTFT, decode with the disk tier writing vs. off, llama.cpp's prompt
//! cache) and writes `target/bench/prefix_bench.json`; see [`prefix`]. `--scenario http`
//! compares the OpenAI-compatible SSE edge with the WebSocket (issue 6) and writes
//! `target/bench/http_bench.json`; see [`http`].

mod client;
mod daemon;
mod figures;
mod http;
mod peer;
mod prefix;
mod prompts;
mod report;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use serde_json::{json, Value};

use crate::daemon::{Daemon, DaemonSpec};
use crate::figures::Figures;
use crate::peer::PeerSpec;

/// Default llama-cpp-python interpreter.
const DEFAULT_PEER_PYTHON: &str = "/work/llama-venv/bin/python";
/// Model file name looked up in the default places.
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Which benchmark a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    /// Serving figures of issue 3 (prefill, decode, concurrency, RSS).
    Serve,
    /// The prefix KV cache of issue 5 (cold / warm / after-restart TTFT, decode with
    /// the disk tier writing).
    Prefix,
    /// The OpenAI-compatible HTTP edge (SSE) against the WebSocket (issue 6).
    Http,
}

/// Serving benchmark: inferd over its WebSocket against llama.cpp.
#[derive(Debug, Parser)]
#[command(name = "inferd-bench", version, about)]
struct Cli {
    /// Benchmark to run: `serve` (issue 3), `prefix` (prefix KV cache, issue 5) or `http`
    /// (the OpenAI-compatible SSE edge against the WebSocket, issue 6).
    #[arg(long, value_enum, default_value_t = Scenario::Serve)]
    scenario: Scenario,
    /// Repository root (default: the nearest folder above the current one holding
    /// `configs/inferd.toml`).
    #[arg(long)]
    root: Option<PathBuf>,
    /// The inferd binary (default: ROOT/target/release/inferd).
    #[arg(long = "bin")]
    bin: Option<PathBuf>,
    /// Daemon configuration file, relative to the root.
    #[arg(long, default_value = "configs/inferd.toml")]
    config: PathBuf,
    /// GGUF model (default: ROOT/../shared/models/, else ROOT/target/models/, else
    /// ROOT/models/ SmolLM2-135M-Instruct.Q4_1.gguf).
    #[arg(long)]
    model: Option<PathBuf>,
    /// CPU threads for both engines (default: the number of available cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Extra environment for the daemon, KEY=VALUE (repeatable), e.g.
    /// INFERD__SCHEDULER__KV_CACHE_BYTES=100000000.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Concurrency levels (streams started at once).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    concurrency: Vec<usize>,
    /// Tokens generated per stream (decode and concurrency runs).
    #[arg(long, default_value_t = 128)]
    max_tokens: u64,
    /// Prompt length of the prefill run, in tokens.
    #[arg(long, default_value_t = 512)]
    prefill_tokens: usize,
    /// Repetitions of the prefill run (the best counts).
    #[arg(long, default_value_t = 3)]
    prefill_reps: usize,
    /// Repetitions of the single-stream decode run (the best counts; one run moves by
    /// ±20 % on a shared VM).
    #[arg(long, default_value_t = 3)]
    decode_reps: usize,
    /// Python with llama-cpp-python for the peer (default: /work/llama-venv/bin/python
    /// when it exists).
    #[arg(long)]
    peer_python: Option<PathBuf>,
    /// The peer script (default: ROOT/clients/bench/peer_llama_cpp.py, or
    /// peer_prefix_llama_cpp.py for `--scenario prefix`).
    #[arg(long)]
    peer_script: Option<PathBuf>,
    /// Skip the llama.cpp peer.
    #[arg(long)]
    no_peer: bool,
    /// inferd's KV budget in bytes, for the peer's n_ctx (default: from the daemon's
    /// `stats` reply, `kv_cache_bytes` or `kv_blocks_total` x `kv_block_size` x
    /// --kv-bytes-per-token; else a size that fits the largest run).
    #[arg(long)]
    kv_bytes: Option<u64>,
    /// KV bytes per token in f16 (2 x layers x kv_heads x head_dim x 2; SmolLM2-135M:
    /// 2 x 30 x 3 x 64 x 2).
    #[arg(long, default_value_t = 23_040)]
    kv_bytes_per_token: u64,
    /// Seconds to wait for the daemon's ready line.
    #[arg(long, default_value_t = 300)]
    startup_timeout: u64,
    /// Seconds to wait for any one frame of a request.
    #[arg(long, default_value_t = 600)]
    request_timeout: u64,
    /// Seconds the peer may run in all.
    #[arg(long, default_value_t = 3600)]
    peer_timeout: u64,
    /// JSON output file (default: ROOT/target/bench/serve_bench.json, or
    /// prefix_bench.json for `--scenario prefix`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Prefix scenario: tokens of the shared system prompt (its text alone; the chat
    /// template and the question add about 25).
    #[arg(long, default_value_t = 1000)]
    system_tokens: usize,
    /// Prefix scenario: cold TTFT repetitions. The first is the first request on an
    /// empty store; the others send `"cache": false` (full prefill, nothing stored).
    #[arg(long, default_value_t = 3)]
    cold_reps: usize,
    /// Prefix scenario: warm TTFT repetitions served from the memory tier, each with a
    /// new question (also llama.cpp's warm repetitions).
    #[arg(long, default_value_t = 7)]
    warm_reps: usize,
    /// Prefix scenario: TTFT repetitions after a restart (SIGTERM, a new daemon on the
    /// same store), one restart and a new question each.
    #[arg(long, default_value_t = 5)]
    disk_reps: usize,
    /// Prefix scenario: tokens generated by each TTFT request.
    #[arg(long, default_value_t = 8)]
    ttft_max_tokens: u64,
    /// Prefix scenario: rounds of the decode comparison (each runs the store-on and the
    /// store-off daemon once, in alternating order).
    #[arg(long, default_value_t = 60)]
    decode_rounds: usize,
    /// HTTP scenario: measured rounds per concurrency level (each runs the WebSocket
    /// and the SSE edge once, in alternating order).
    #[arg(long, default_value_t = 10)]
    http_rounds: usize,
    /// Prefix scenario: tokens generated by each decode run.
    #[arg(long, default_value_t = 256)]
    decode_tokens: u64,
    /// Prefix scenario: folder the temporary store folders are made in (default: the
    /// system's temporary folder).
    #[arg(long)]
    store_parent: Option<PathBuf>,
    /// Prefix scenario: keep the store folders instead of deleting them at the end.
    #[arg(long)]
    keep_store: bool,
}

/// Prompts used by both engines.
struct Prompts {
    prefill: Vec<String>,
    decode: String,
    concurrent: Vec<String>,
}

/// What the inferd side produced besides its figures.
struct InferdRun {
    figures: Figures,
    prompts: Prompts,
    stats_kv_bytes: Option<u64>,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if cli.concurrency.is_empty() || cli.concurrency.contains(&0) {
        bail!("--concurrency needs levels >= 1");
    }
    if cli.prefill_reps == 0
        || cli.decode_reps == 0
        || cli.prefill_tokens == 0
        || cli.max_tokens == 0
    {
        bail!("--prefill-reps, --decode-reps, --prefill-tokens and --max-tokens must be >= 1");
    }
    let root = match &cli.root {
        Some(root) => root.clone(),
        None => find_root()?,
    };
    let root = root
        .canonicalize()
        .with_context(|| format!("bad root {}", root.display()))?;
    let threads = cli.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    let bin = absolute(
        &root,
        cli.bin.clone().unwrap_or("target/release/inferd".into()),
    );
    let config = absolute(&root, cli.config.clone());
    let model = match &cli.model {
        Some(m) => absolute(&root, m.clone()),
        None => default_model(&root)?,
    };
    let default_out = match cli.scenario {
        Scenario::Serve => "target/bench/serve_bench.json",
        Scenario::Prefix => "target/bench/prefix_bench.json",
        Scenario::Http => "target/bench/http_bench.json",
    };
    let out = absolute(&root, cli.out.clone().unwrap_or(default_out.into()));
    let out_dir = out
        .parent()
        .ok_or_else(|| anyhow!("bad --out {}", out.display()))?
        .to_path_buf();
    std::fs::create_dir_all(&out_dir)
        .with_context(|| format!("cannot create {}", out_dir.display()))?;

    let mut env = vec![("INFERD__MODEL__THREADS".to_owned(), threads.to_string())];
    for pair in &cli.env {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| anyhow!("--env wants KEY=VALUE (got {pair:?})"))?;
        env.push((key.to_owned(), value.to_owned()));
    }
    if cli.scenario != Scenario::Prefix {
        // The serve scenario measures the engine itself: its repeated prompts must not be
        // served from the prefix cache (a later --env can turn it back on).
        env.insert(
            1,
            (
                "INFERD__SCHEDULER__PREFIX_CACHING".to_owned(),
                "false".to_owned(),
            ),
        );
    }
    if cli.scenario != Scenario::Serve {
        let setup = prefix::Setup {
            root,
            threads,
            bin,
            config,
            model,
            out,
            out_dir,
            env,
        };
        return match cli.scenario {
            Scenario::Http => http::run(&cli, setup),
            _ => prefix::run(&cli, setup),
        };
    }

    eprintln!(
        "inferd-bench: {} with {threads} threads, model {}",
        bin.display(),
        model.display()
    );
    let spec = DaemonSpec {
        bin: bin.clone(),
        root: root.clone(),
        config: config.clone(),
        model: model.clone(),
        env: env.clone(),
        log: out_dir.join("inferd.stderr.log"),
        startup_timeout: Duration::from_secs(cli.startup_timeout),
    };
    let busy_before_inferd = other_cpu_busy();
    let inferd = run_inferd(&cli, &spec)?;

    // The peer runs after the daemon is gone, so the two never share the cores.
    let (kv_bytes, kv_source) = match (cli.kv_bytes, inferd.stats_kv_bytes) {
        (Some(b), _) => (b, "--kv-bytes"),
        (None, Some(b)) => (b, "daemon stats (kv_cache_bytes, or blocks x block size)"),
        (None, None) => {
            let largest = cli.concurrency.iter().copied().max().unwrap_or(1) as u64;
            let fit = (largest * (64 + cli.max_tokens))
                .max(cli.prefill_tokens as u64 + cli.max_tokens + 64);
            (
                fit.div_ceil(256) * 256 * cli.kv_bytes_per_token,
                "fit to the largest run (no --kv-bytes, no stats)",
            )
        }
    };
    let n_ctx = kv_bytes / cli.kv_bytes_per_token.max(1);
    let busy_before_peer = if cli.no_peer { None } else { other_cpu_busy() };
    let (peer, peer_error) = run_peer_if_wanted(
        &cli,
        &root,
        &out_dir,
        PeerSpec {
            model: model.clone(),
            threads,
            n_ctx,
            max_tokens: cli.max_tokens,
            prefill_prompts: inferd.prompts.prefill.clone(),
            decode_prompt: inferd.prompts.decode.clone(),
            decode_reps: cli.decode_reps,
            concurrency: cli.concurrency.clone(),
            concurrent_prompts: inferd.prompts.concurrent.clone(),
        },
    );
    if let Some(e) = &peer_error {
        eprintln!("inferd-bench: peer: {e}");
    }

    let rows = report::rows(&inferd.figures, peer.as_ref());
    let goals = report::goals(&inferd.figures, peer.as_ref());
    println!(
        "\ninferd-bench: {threads} threads, max_tokens {}, KV {kv_bytes} B = {n_ctx} tokens ({kv_source})\n",
        cli.max_tokens
    );
    print!("{}", report::render(&rows, &goals));

    let (commit, dirty) = git_state(&root);
    let result = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "date": chrono::Utc::now().to_rfc3339(),
        "git_commit": commit,
        "git_dirty": dirty,
        "threads": threads,
        "binary": bin,
        "config": config,
        "model": model,
        "env": env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "max_tokens": cli.max_tokens,
        "prefill_target_tokens": cli.prefill_tokens,
        "concurrency": cli.concurrency,
        "other_cpu_busy": {
            "before_inferd": busy_before_inferd,
            "before_peer": busy_before_peer,
        },
        "kv": {
            "bytes": kv_bytes,
            "source": kv_source,
            "bytes_per_token": cli.kv_bytes_per_token,
            "peer_n_ctx": n_ctx,
        },
        "prompts": {
            "prefill": inferd.prompts.prefill,
            "decode": inferd.prompts.decode,
            "concurrent": inferd.prompts.concurrent,
        },
        "inferd": inferd.figures,
        "peer": peer,
        "peer_error": peer_error,
        "table": rows,
        "goals": goals,
    });
    std::fs::write(&out, serde_json::to_vec_pretty(&result)?)
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("\nwritten: {}", out.display());
    Ok(())
}

/// Starts the daemon, measures it, stops it.
fn run_inferd(cli: &Cli, spec: &DaemonSpec) -> Result<InferdRun> {
    let mut daemon = Daemon::start(spec)?;
    eprintln!(
        "inferd-bench: daemon pid {} at {} (log: {})",
        daemon.pid(),
        daemon.url,
        spec.log.display()
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build the tokio runtime")?;
    let measured = runtime.block_on(measure_inferd(cli, &daemon.url));
    let measured = match measured {
        Ok(m) => m,
        Err(e) => {
            // Say whether the daemon died, which explains most failures.
            daemon.check_alive().context(e.to_string())?;
            return Err(e);
        }
    };
    let (mut figures, prompts, stats_before, stats_after, finish_reason) = measured;
    figures.peak_rss_bytes = daemon.peak_rss_bytes()?;
    daemon.stop();
    // `kv_cache_bytes` when the reply has it, else the pool's blocks x tokens per block
    // x KV bytes per token (the bytes the pool really holds).
    let per_token = cli.kv_bytes_per_token;
    let kv_of = |s: &Option<Value>| {
        let s = s.as_ref()?;
        s["kv_cache_bytes"].as_u64().or_else(|| {
            Some(s["kv_blocks_total"].as_u64()? * s["kv_block_size"].as_u64()? * per_token)
        })
    };
    let stats_kv_bytes = kv_of(&stats_after).or_else(|| kv_of(&stats_before));
    figures.extra = json!({
        "url": daemon.url,
        "decode_finish_reason": finish_reason,
        "stats_before": stats_before,
        "stats_after": stats_after,
    });
    Ok(InferdRun {
        figures,
        prompts,
        stats_kv_bytes,
    })
}

type Measured = (Figures, Prompts, Option<Value>, Option<Value>, String);

async fn measure_inferd(cli: &Cli, url: &str) -> Result<Measured> {
    let timeout = Duration::from_secs(cli.request_timeout);
    let mut conn = client::Conn::connect(url).await?;
    let stats_before = client::Conn::connect(url).await?.stats().await;

    eprintln!("inferd-bench: warm-up");
    conn.generate("warmup", "Hello, my name is", 8, timeout)
        .await?;

    let mut prefill_prompts = Vec::new();
    for variant in 0..cli.prefill_reps {
        let (text, count) =
            client::prompt_of_tokens(&mut conn, variant, cli.prefill_tokens).await?;
        if count != cli.prefill_tokens {
            eprintln!(
                "inferd-bench: prefill prompt {variant} has {count} tokens (wanted {})",
                cli.prefill_tokens
            );
        }
        prefill_prompts.push(text);
    }
    let prompts = Prompts {
        prefill: prefill_prompts,
        decode: prompts::decode_prompt(),
        concurrent: prompts::concurrent_prompts(cli.concurrency.iter().copied().max().unwrap_or(1)),
    };

    eprintln!("inferd-bench: prefill x{}", cli.prefill_reps);
    let prefill = client::measure_prefill(url, &prompts.prefill, timeout).await?;
    eprintln!(
        "inferd-bench: decode {} tokens x{}",
        cli.max_tokens, cli.decode_reps
    );
    let (mut decode, mut finish_reason) =
        client::measure_decode(url, &prompts.decode, cli.max_tokens, timeout).await?;
    for _ in 1..cli.decode_reps {
        let (d, f) = client::measure_decode(url, &prompts.decode, cli.max_tokens, timeout).await?;
        if d.tok_per_s > decode.tok_per_s {
            (decode, finish_reason) = (d, f);
        }
    }
    let mut levels = Vec::new();
    for &n in &cli.concurrency {
        eprintln!("inferd-bench: concurrency {n}");
        let level =
            client::measure_level(url, &prompts.concurrent[..n], cli.max_tokens, timeout).await?;
        eprintln!(
            "inferd-bench:   {:.1} tok/s aggregate, TTFT {:.0} ms, ITL {:.1} ms",
            level.aggregate_tok_per_s, level.mean_ttft_ms, level.mean_itl_ms
        );
        levels.push(level);
    }
    let stats_after = client::Conn::connect(url).await?.stats().await;
    let figures = Figures {
        prefill,
        decode,
        concurrency: levels,
        peak_rss_bytes: 0,
        extra: Value::Null,
    };
    Ok((figures, prompts, stats_before, stats_after, finish_reason))
}

/// Runs the peer unless skipped; returns its figures or why there are none.
fn run_peer_if_wanted(
    cli: &Cli,
    root: &Path,
    out_dir: &Path,
    spec: PeerSpec,
) -> (Option<Figures>, Option<String>) {
    if cli.no_peer {
        return (None, Some("skipped (--no-peer)".into()));
    }
    let python = match peer_python(cli) {
        Ok(p) => p,
        Err(e) => return (None, Some(e)),
    };
    let script = cli
        .peer_script
        .clone()
        .map(|s| absolute(root, s))
        .unwrap_or_else(|| root.join("clients/bench/peer_llama_cpp.py"));
    eprintln!(
        "inferd-bench: peer: {} {} (n_ctx {})",
        python.display(),
        script.display(),
        spec.n_ctx
    );
    match peer::run_peer(
        &python,
        &script,
        &spec,
        &out_dir.join("peer_spec.json"),
        Duration::from_secs(cli.peer_timeout),
    ) {
        Ok(f) => (Some(f), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    }
}

/// The peer's Python: `--peer-python`, else the default one when it exists.
fn peer_python(cli: &Cli) -> std::result::Result<PathBuf, String> {
    match &cli.peer_python {
        Some(p) => Ok(p.clone()),
        None if Path::new(DEFAULT_PEER_PYTHON).exists() => Ok(DEFAULT_PEER_PYTHON.into()),
        None => Err(format!(
            "no peer: {DEFAULT_PEER_PYTHON} does not exist (pass --peer-python)"
        )),
    }
}

/// The nearest folder at or above the current one holding `configs/inferd.toml`, else
/// the workspace this binary was built from.
fn find_root() -> Result<PathBuf> {
    let cwd = std::env::current_dir().context("no current directory")?;
    for dir in cwd.ancestors() {
        if dir.join("configs/inferd.toml").is_file() {
            return Ok(dir.to_path_buf());
        }
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if built.join("configs/inferd.toml").is_file() {
        return Ok(built);
    }
    bail!("cannot find the repository root (configs/inferd.toml); pass --root")
}

fn absolute(root: &Path, path: PathBuf) -> PathBuf {
    if path.is_absolute() {
        path
    } else {
        root.join(path)
    }
}

fn default_model(root: &Path) -> Result<PathBuf> {
    let candidates = [
        root.join("../shared/models").join(MODEL_FILE),
        root.join("target/models").join(MODEL_FILE),
        root.join("models").join(MODEL_FILE),
    ];
    for c in &candidates {
        if c.is_file() {
            return c
                .canonicalize()
                .with_context(|| format!("bad model path {}", c.display()));
        }
    }
    bail!(
        "model {MODEL_FILE} not found in ../shared/models, target/models or models \
         (run scripts/fetch-model.sh or pass --model)"
    )
}

/// Fraction of all CPU time that was busy over one second (from `/proc/stat`), measured
/// while no engine runs: other work on the machine. Warns on stderr above 10 %, since
/// the figures are then skewed. `None` where `/proc/stat` cannot be read.
fn other_cpu_busy() -> Option<f64> {
    fn sample() -> Option<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<u64> = text
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        let total: u64 = fields.iter().take(8).sum();
        let idle = fields.get(3)? + fields.get(4).unwrap_or(&0);
        Some((total, idle))
    }
    let (t0, i0) = sample()?;
    std::thread::sleep(Duration::from_secs(1));
    let (t1, i1) = sample()?;
    let total = t1.saturating_sub(t0);
    if total == 0 {
        return None;
    }
    let busy = 1.0 - i1.saturating_sub(i0) as f64 / total as f64;
    if busy > 0.1 {
        eprintln!(
            "inferd-bench: warning: the CPUs are {:.0} % busy with other work before \
             measuring; the figures are skewed",
            busy * 100.0
        );
    }
    Some(busy)
}

/// `git rev-parse HEAD` and whether tracked files differ from it.
fn git_state(root: &Path) -> (Option<String>, Option<bool>) {
    let run = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let commit = run(&["rev-parse", "HEAD"]);
    let dirty = run(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty());
    (commit, dirty)
}
