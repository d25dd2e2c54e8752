//! `inferd-bench`: the serving benchmark of issue 3.
//!
//! For each model file (`--model`, repeatable): starts the inferd daemon and measures it
//! through its WebSocket (single-stream prefill and decode, N concurrent streams, peak
//! RSS), then native llama.cpp on the same file: `llama-server` (same threads, `-np N`
//! slots for N streams, the same KV bytes) driven by the same measuring code over its
//! streaming `/completion` with the same prompts as token ids, and `llama-bench`. Then
//! it measures this machine's streaming read bandwidth for the bound of single-stream
//! decode, prints one table per file and writes `target/bench/serve_bench.json` (one
//! object per file). See `docs/bench-harness.md`; [`serve`].
//!
//! ```text
//! cargo build --release -p inferd -p inferd-bench
//! target/release/inferd-bench --model models/SmolLM2-135M-Instruct.Q4_1.gguf
//! ```
//!
//! `--lora FILE` (repeatable) and/or `--lora-make N` add a LoRA section to the serve
//! scenario: a daemon serving the adapters, single-stream prefill and decode with the
//! first against the base, concurrent streams on one adapter against streams spread over
//! several, and llama-server `--lora FILE` with the same file; see [`lora`].
//!
//! `--scenario prefix` runs the prefix KV cache benchmark of issue 5 instead (cold, warm
//! and after-restart TTFT, decode with the disk tier writing vs. off, llama.cpp's prompt
//! cache through llama-cpp-python) and writes `target/bench/prefix_bench.json`; see
//! [`prefix`]. `--scenario http` compares the OpenAI-compatible SSE edge with the
//! WebSocket (issue 6) and writes `target/bench/http_bench.json`; see [`http`].
//! `--scenario speculative` measures speculative decoding (n-gram prompt lookup) on
//! against off on extractive and open-ended chat prompts and 16 streams, with llama.cpp's
//! n-gram speculation beside it, and writes `target/bench/speculative_bench.json`; see
//! [`speculative`].

mod bandwidth;
mod client;
mod completion;
mod daemon;
mod figures;
mod gguf;
mod http;
mod http_client;
mod llama_bench;
mod llama_cpp;
mod llama_server;
mod lora;
mod machine;
mod measure;
mod prefix;
mod prompts;
mod python_peer;
mod report;
mod serve;
mod spec_figures;
mod spec_inferd;
mod spec_peer;
mod spec_prompts;
mod spec_report;
mod speculative;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;

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
    /// Speculative decoding on against off (extractive, open-ended, 16 streams), with
    /// llama.cpp's n-gram speculation beside it.
    Speculative,
}

/// Serving benchmark: inferd over its WebSocket against llama.cpp.
#[derive(Debug, Parser)]
#[command(name = "inferd-bench", version, about)]
struct Cli {
    /// Benchmark to run: `serve` (issue 3), `prefix` (prefix KV cache, issue 5), `http`
    /// (the OpenAI-compatible SSE edge against the WebSocket, issue 6) or `speculative`
    /// (speculative decoding on against off).
    #[arg(long, value_enum, default_value_t = Scenario::Serve)]
    scenario: Scenario,
    /// Repository root (default: the nearest folder above the current one holding
    /// `configs/inferd.toml`).
    #[arg(long)]
    root: Option<PathBuf>,
    /// The inferd binary (default: `inferd` beside this binary, else
    /// ROOT/target/release/inferd).
    #[arg(long = "bin")]
    bin: Option<PathBuf>,
    /// Daemon configuration file, relative to the root.
    #[arg(long, default_value = "configs/inferd.toml")]
    config: PathBuf,
    /// GGUF model file for both engines; repeat it to benchmark several files one after
    /// the other (serve scenario only). Default: ROOT/../shared/models/, else
    /// ROOT/target/models/, else ROOT/models/ SmolLM2-135M-Instruct.Q4_1.gguf.
    #[arg(long, value_name = "PATH")]
    model: Vec<PathBuf>,
    /// CPU threads for both engines (inferd's INFERD__MODEL__THREADS, llama.cpp's -t).
    #[arg(long, default_value_t = 2)]
    threads: usize,
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
    /// Folder with llama.cpp's llama-server and llama-bench (default: what
    /// `scripts/llamacpp.sh bin` prints).
    #[arg(long, value_name = "DIR")]
    llama_bin: Option<PathBuf>,
    /// Repetitions of each llama-bench test (`-r`).
    #[arg(long, default_value_t = 5)]
    llama_bench_reps: usize,
    /// Skip llama-bench (llama-server still runs).
    #[arg(long)]
    no_llama_bench: bool,
    /// Runs of the read-bandwidth measurement (the best counts).
    #[arg(long, default_value_t = 5)]
    bw_runs: usize,
    /// Prefix scenario: Python with llama-cpp-python for its peer (default:
    /// /work/llama-venv/bin/python when it exists).
    #[arg(long)]
    peer_python: Option<PathBuf>,
    /// Prefix scenario: the peer script (default:
    /// ROOT/clients/bench/peer_prefix_llama_cpp.py).
    #[arg(long)]
    peer_script: Option<PathBuf>,
    /// Skip llama.cpp (llama-server and llama-bench; in the prefix scenario its Python
    /// peer).
    #[arg(long)]
    no_peer: bool,
    /// KV budget in bytes to give llama-server (its -c is this over the file's f16 KV
    /// bytes per token; default: inferd's pool, kv_blocks_total x kv_block_size tokens
    /// from its `stats` reply). Speculative scenario: inferd's pool
    /// (INFERD__SCHEDULER__KV_CACHE_BYTES; default: room for every stream's prompt and
    /// answer), which llama-server's -c then follows.
    #[arg(long)]
    kv_bytes: Option<u64>,
    /// Seconds to wait for the daemon's ready line.
    #[arg(long, default_value_t = 300)]
    startup_timeout: u64,
    /// Seconds to wait for any one frame of a request.
    #[arg(long, default_value_t = 600)]
    request_timeout: u64,
    /// Seconds llama-bench (or the prefix scenario's Python peer) may run.
    #[arg(long, default_value_t = 3600)]
    peer_timeout: u64,
    /// JSON output file (default: ROOT/target/bench/serve_bench.json, or
    /// prefix_bench.json, http_bench.json, speculative_bench.json for those scenarios).
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
    /// Speculative scenario: tokens generated per request (answers are long, so drafts
    /// have room to pay off).
    #[arg(long, default_value_t = 384)]
    spec_max_tokens: u64,
    /// Speculative scenario: repetitions of each single-stream prompt per arm (speculation
    /// on and off, alternating; the fastest counts).
    #[arg(long, default_value_t = 3)]
    spec_reps: usize,
    /// Speculative scenario: concurrent streams of mixed extractive prompts (0: none).
    #[arg(long, default_value_t = 16)]
    spec_streams: usize,
    /// Speculative scenario: rounds of the concurrent streams per arm (alternating; the
    /// fastest counts).
    #[arg(long, default_value_t = 3)]
    spec_rounds: usize,
    /// Speculative scenario: llama.cpp's n-gram length (`--spec-ngram-simple-size-n`).
    #[arg(long, default_value_t = 3)]
    spec_peer_ngram_n: usize,
    /// Speculative scenario: llama.cpp's most drafts per verification
    /// (`--spec-ngram-simple-size-m`; default: inferd's `speculative.k` from its stats,
    /// else 5).
    #[arg(long)]
    spec_peer_draft_max: Option<usize>,
    /// Serve scenario: a GGUF LoRA adapter of the model (repeatable) for the LoRA section;
    /// the first is the single-stream adapter and the one llama-server gets (`--lora`).
    /// Applies to every --model: with several, use --lora-make.
    #[arg(long, value_name = "FILE")]
    lora: Vec<PathBuf>,
    /// Serve scenario: make N random rank-8 F16 adapters of each model (after the --lora
    /// files) with scripts/lora-bench-adapters.sh, seeds --lora-seed.., cached as
    /// ~/.cache/inferd/lora/<model stem>-r8-s<seed>.gguf (INFERD_LORA_DIR), for the LoRA
    /// section.
    #[arg(long, value_name = "N", default_value_t = 0)]
    lora_make: usize,
    /// Serve scenario: the first seed of --lora-make.
    #[arg(long, default_value_t = 1)]
    lora_seed: u64,
    /// Serve scenario: adapters the LoRA section's mixed streams go round-robin over.
    #[arg(long, default_value_t = 4)]
    lora_mix: usize,
    /// Serve scenario: concurrent streams of the LoRA section (all on one adapter, over
    /// --lora-mix adapters, on the base).
    #[arg(long, default_value_t = 16)]
    lora_streams: usize,
    /// Serve scenario: rounds of the LoRA section's concurrent streams (the three arms
    /// alternate; the fastest round of each counts).
    #[arg(long, default_value_t = 1)]
    lora_rounds: usize,
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
    if lora::wanted(&cli) {
        if cli.scenario != Scenario::Serve {
            bail!("--lora and --lora-make belong to the serve scenario");
        }
        if cli.lora_mix == 0 || cli.lora_streams == 0 || cli.lora_rounds == 0 {
            bail!("--lora-mix, --lora-streams and --lora-rounds must be >= 1");
        }
    }
    let root = match &cli.root {
        Some(root) => root.clone(),
        None => find_root()?,
    };
    let root = root
        .canonicalize()
        .with_context(|| format!("bad root {}", root.display()))?;
    let threads = cli.threads.max(1);
    let bin = match &cli.bin {
        Some(b) => absolute(&root, b.clone()),
        None => default_bin(&root),
    };
    let config = absolute(&root, cli.config.clone());
    let models = if cli.model.is_empty() {
        vec![default_model(&root)?]
    } else {
        cli.model
            .iter()
            .map(|m| absolute(&root, m.clone()))
            .collect()
    };
    let default_out = match cli.scenario {
        Scenario::Serve => "target/bench/serve_bench.json",
        Scenario::Prefix => "target/bench/prefix_bench.json",
        Scenario::Http => "target/bench/http_bench.json",
        Scenario::Speculative => "target/bench/speculative_bench.json",
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
    if cli.scenario == Scenario::Serve {
        let setup = serve::Setup {
            root,
            threads,
            bin,
            config,
            models,
            out,
            out_dir,
            env,
        };
        return serve::run(&cli, setup);
    }
    let [model] = <[PathBuf; 1]>::try_from(models)
        .map_err(|_| anyhow!("--scenario prefix, http and speculative take one --model"))?;
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
    match cli.scenario {
        Scenario::Http => http::run(&cli, setup),
        Scenario::Speculative => speculative::run(&cli, setup),
        _ => prefix::run(&cli, setup),
    }
}

/// `inferd` beside this binary (both built into the same target folder), else
/// ROOT/target/release/inferd.
fn default_bin(root: &Path) -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("inferd")));
    match beside {
        Some(b) if b.is_file() => b,
        _ => root.join("target/release/inferd"),
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
