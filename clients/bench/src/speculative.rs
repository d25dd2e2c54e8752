//! `--scenario speculative`: speculative decoding (n-gram prompt lookup) on against off,
//! in one daemon run, and llama.cpp with and without its n-gram speculation.
//!
//! Workloads (chat prompts of [`crate::spec_prompts`], greedy, seeded, `--spec-max-tokens`
//! each):
//! - **extractive**: answers that quote or edit a document in the prompt (summarise a
//!   passage with quotes, output a code file with one line fixed, repeat a list with one
//!   item changed), where n-gram lookup finds long drafts;
//! - **open-ended**: questions without a document;
//! - **N streams** (`--spec-streams`, 16): mixed extractive prompts sent together.
//!
//! Each prompt runs `--spec-reps` times per arm, the arms alternating (ABBA) so drift
//! on a shared machine hits both; the fastest run per prompt and arm counts, as in the
//! serving scenario's decode (see [`crate::spec_figures`]). Every run's token ids must
//! equal those of the prompt's first run without speculation: a difference is printed as
//! MISMATCH and kept in the JSON. inferd runs first ([`crate::spec_inferd`]), then, after
//! it has exited, llama-server ([`crate::spec_peer`]). Prints one table and writes
//! `target/bench/speculative_bench.json`. See `docs/bench-harness.md`, section
//! "Speculative decoding".

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::Barrier;

use crate::client::Trace;
use crate::daemon::DaemonSpec;
use crate::gguf::Gguf;
use crate::llama_cpp::LlamaCpp;
use crate::machine::{self, Machine};
use crate::prefix::Setup;
use crate::spec_figures::{concurrent, single_stream, Round, Run, Workload};
use crate::spec_inferd::InferdPhase;
use crate::spec_peer::{PeerPhase, PeerSpec};
use crate::spec_prompts::PromptText;
use crate::{spec_inferd, spec_peer, spec_report, Cli};

/// The seed of every request (greedy decoding does not draw, but the request is then
/// fully determined).
pub const SEED: u64 = 7;
/// Drafts per verification for llama.cpp when the daemon's `stats` do not say
/// (`speculative.k`).
const DEFAULT_K: usize = 5;
/// Prompt tokens each stream is given room for when sizing the KV pool.
const PROMPT_ROOM: u64 = 2048;

/// The scenario's settings.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub max_tokens: u64,
    /// Repetitions of each single-stream prompt per arm.
    pub reps: usize,
    /// Concurrent streams (0: none).
    pub streams: usize,
    /// Rounds of the concurrent streams per arm.
    pub rounds: usize,
    #[serde(skip)]
    pub timeout: Duration,
}

/// A prompt as both engines get it: the chat messages (inferd) and the ids of their
/// ChatML rendering (llama-server; BOS first when inferd adds one).
#[derive(Debug, Clone, Serialize)]
pub struct ChatPrompt {
    #[serde(flatten)]
    pub prompt: PromptText,
    /// The ChatML rendering.
    pub text: String,
    pub ids: Vec<u32>,
}

/// `on` or `off`.
pub fn arm_name(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// The single-threaded tokio runtime the measurements run on.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build the tokio runtime")
}

/// Runs `f(i, session)` for every session at once: the sessions are opened by the
/// caller, the requests start together behind a barrier. The traces in session order.
pub async fn together<S, F, Fut>(sessions: Vec<S>, f: F) -> Result<Vec<Trace>>
where
    S: Send + 'static,
    F: Fn(usize, S) -> Fut,
    Fut: Future<Output = Result<Trace>> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(sessions.len()));
    let mut tasks = Vec::with_capacity(sessions.len());
    for (i, s) in sessions.into_iter().enumerate() {
        let request = f(i, s);
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            request.await
        }));
    }
    let mut traces = Vec::with_capacity(tasks.len());
    for t in tasks {
        traces.push(t.await.context("stream task panicked")??);
    }
    Ok(traces)
}

/// One progress line for a run.
pub fn log_run(engine: &str, r: &Run) {
    let count = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
    eprintln!(
        "inferd-bench:   {engine} {} rep {} speculation {}: {} tokens ({}), {:.1} tok/s, drafts \
         {}, accepted {}, verifications {}",
        r.prompt,
        r.rep,
        arm_name(r.speculative),
        r.tokens,
        r.finish_reason,
        r.tok_per_s,
        count(r.drafts.draft_tokens),
        count(r.drafts.accepted_tokens),
        count(r.drafts.verification_steps),
    );
}

/// The workloads of one engine's runs.
fn workloads(
    prompts: &[ChatPrompt],
    runs: &[Run],
    rounds: &[Round],
    streams: usize,
) -> Vec<Workload> {
    let names = |extractive: bool| -> Vec<&str> {
        prompts
            .iter()
            .filter(|p| p.prompt.kind.extractive() == extractive)
            .map(|p| p.prompt.name.as_str())
            .collect()
    };
    let mut out = vec![
        single_stream("extractive", &names(true), runs),
        single_stream("open-ended", &names(false), runs),
    ];
    if !rounds.is_empty() {
        out.push(concurrent(&format!("{streams} streams"), rounds));
    }
    out
}

/// Runs the scenario (see the module documentation).
pub fn run(cli: &Cli, setup: Setup) -> Result<()> {
    if cli.spec_max_tokens < 2 || cli.spec_reps == 0 || cli.spec_rounds == 0 {
        bail!("--spec-max-tokens must be >= 2, --spec-reps and --spec-rounds >= 1");
    }
    if cli.spec_peer_ngram_n == 0 {
        bail!("--spec-peer-ngram-n must be >= 1");
    }
    let settings = Settings {
        max_tokens: cli.spec_max_tokens,
        reps: cli.spec_reps,
        streams: cli.spec_streams,
        rounds: cli.spec_rounds,
        timeout: Duration::from_secs(cli.request_timeout),
    };
    let machine = Machine::probe();
    let gguf = Gguf::read(&setup.model)?;
    let per_token = gguf.kv_per_token()?;
    let stem = setup
        .model
        .file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned());

    // A KV pool for every stream's prompt and answer (the default 256 MiB holds 11,648
    // tokens of SmolLM2-135M, fewer than 16 long extractive streams need); an --env
    // setting of the key comes later and wins.
    let kv_bytes = cli.kv_bytes.unwrap_or(
        per_token.bytes * settings.streams.max(1) as u64 * (PROMPT_ROOM + settings.max_tokens),
    );
    let mut env = setup.env.clone();
    env.insert(
        1,
        (
            "INFERD__SCHEDULER__KV_CACHE_BYTES".into(),
            kv_bytes.to_string(),
        ),
    );
    let spec = DaemonSpec {
        bin: setup.bin.clone(),
        root: setup.root.clone(),
        config: setup.config.clone(),
        model: setup.model.clone(),
        env: env.clone(),
        log: setup.out_dir.join(format!("{stem}.speculative.inferd.log")),
        startup_timeout: Duration::from_secs(cli.startup_timeout),
        extra_args: Vec::new(),
    };
    eprintln!(
        "inferd-bench: speculative scenario: {} with {} threads, {} tokens per answer, {} reps, \
         {} streams x {} rounds",
        setup.model.display(),
        setup.threads,
        settings.max_tokens,
        settings.reps,
        settings.streams,
        settings.rounds
    );
    let busy_before_inferd = machine::other_cpu_busy();
    let inferd = spec_inferd::run(&spec, &settings, gguf.bos().1)?;
    let mut notes = inferd.notes.clone();

    let daemon_spec = |s: &Option<Value>| s.as_ref().map(|s| s["speculative"].clone());
    let k = [&inferd.stats_end, &inferd.stats_start]
        .iter()
        .find_map(|s| s.as_ref()?["speculative"]["k"].as_u64())
        .map_or(DEFAULT_K, |k| k as usize);
    let peer_k = cli.spec_peer_draft_max.unwrap_or(k);
    let pool_tokens = inferd
        .stats_start
        .as_ref()
        .and_then(|s| Some(s["kv_blocks_total"].as_u64()? * s["kv_block_size"].as_u64()?));
    let ctx = pool_tokens.unwrap_or(kv_bytes / per_token.bytes.max(1));
    let spec_args = spec_peer::spec_args(cli.spec_peer_ngram_n, peer_k);

    let llama = if cli.no_peer {
        Err("skipped (--no-peer)".to_owned())
    } else {
        LlamaCpp::locate_tools(&setup.root, cli.llama_bin.clone(), &["llama-server"])
            .map_err(|e| format!("{e:#}"))
    };
    let busy_before_peer = llama.as_ref().ok().and_then(|_| machine::other_cpu_busy());
    let (peer, peer_error): (Option<PeerPhase>, Option<String>) = match &llama {
        Ok(l) => {
            let peer_spec = PeerSpec {
                llama: l,
                model: &setup.model,
                threads: setup.threads,
                ctx,
                out_dir: &setup.out_dir,
                startup_timeout: Duration::from_secs(cli.startup_timeout),
                spec_args: spec_args.clone(),
            };
            match spec_peer::run(
                &peer_spec,
                &settings,
                &inferd.prompts,
                &inferd.stream_prompts,
            ) {
                Ok(p) => (Some(p), None),
                Err(e) => (None, Some(format!("{e:#}"))),
            }
        }
        Err(e) => (None, Some(e.clone())),
    };
    if let Some(e) = &peer_error {
        eprintln!("inferd-bench: llama.cpp: {e}");
    }

    let ours = workloads(
        &inferd.prompts,
        &inferd.runs,
        &inferd.rounds,
        settings.streams,
    );
    let theirs = peer
        .as_ref()
        .map(|p| workloads(&inferd.prompts, &p.runs, &p.rounds, settings.streams));
    if let Some(p) = &peer {
        notes.extend(p.notes.iter().cloned());
        let differ: Vec<&str> = ours
            .iter()
            .flat_map(|w| &w.prompts)
            .filter(|r| {
                theirs
                    .iter()
                    .flatten()
                    .flat_map(|w| &w.prompts)
                    .any(|q| q.prompt == r.prompt && q.text != r.text)
            })
            .map(|r| r.prompt.as_str())
            .collect();
        if !differ.is_empty() {
            notes.push(format!(
                "the greedy texts of inferd and llama.cpp differ (speculation off) for: {}",
                differ.join(", ")
            ));
        }
    }
    let goals = spec_report::goals(&ours);
    let rendered = spec_report::render(&ours, theirs.as_deref(), &goals);

    println!(
        "\n== speculative decoding: {} ({}), {} threads, max_tokens {}, best of {} reps per \
         prompt and arm, {} streams best of {} rounds ==\n",
        setup.model.display(),
        gguf.arch()?,
        setup.threads,
        settings.max_tokens,
        settings.reps,
        settings.streams,
        settings.rounds
    );
    match daemon_spec(&inferd.stats_end) {
        Some(s) if !s.is_null() => println!("inferd [speculative]: {s}"),
        _ => println!("inferd [speculative]: not reported"),
    }
    match &peer {
        Some(_) => println!("llama.cpp: llama-server {}", spec_args.join(" ")),
        None => println!("llama.cpp: {}", peer_error.as_deref().unwrap_or("not run")),
    }
    println!();
    print!("{rendered}");
    for n in &notes {
        println!("note: {n}");
    }

    let json = report_json(ReportParts {
        cli,
        setup: &setup,
        machine: &machine,
        gguf: &gguf,
        env: &env,
        settings: &settings,
        busy: (busy_before_inferd, busy_before_peer),
        inferd: &inferd,
        ours: &ours,
        llama: llama.as_ref().ok(),
        peer: peer.as_ref(),
        theirs: theirs.as_deref(),
        peer_error: peer_error.as_deref(),
        spec_args: &spec_args,
        peer_k,
        goals: &goals,
        rendered: &rendered,
        notes: &notes,
    })?;
    std::fs::write(&setup.out, serde_json::to_vec_pretty(&json)?)
        .with_context(|| format!("cannot write {}", setup.out.display()))?;
    println!("\nwritten: {}", setup.out.display());
    Ok(())
}

/// Everything the JSON is made of.
struct ReportParts<'a> {
    cli: &'a Cli,
    setup: &'a Setup,
    machine: &'a Machine,
    gguf: &'a Gguf,
    env: &'a [(String, String)],
    settings: &'a Settings,
    busy: (Option<f64>, Option<f64>),
    inferd: &'a InferdPhase,
    ours: &'a [Workload],
    llama: Option<&'a LlamaCpp>,
    peer: Option<&'a PeerPhase>,
    theirs: Option<&'a [Workload]>,
    peer_error: Option<&'a str>,
    spec_args: &'a [String],
    peer_k: usize,
    goals: &'a [crate::report::Goal],
    rendered: &'a str,
    notes: &'a [String],
}

fn report_json(p: ReportParts) -> Result<Value> {
    let (commit, dirty) = crate::git_state(&p.setup.root);
    let all_identical = p
        .ours
        .iter()
        .chain(p.theirs.unwrap_or_default())
        .all(|w| w.identical);
    let inferd = p.inferd;
    Ok(json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "date": chrono::Utc::now().to_rfc3339(),
        "git_commit": commit,
        "git_dirty": dirty,
        "machine": p.machine,
        "threads": p.setup.threads,
        "model": {
            "path": p.setup.model,
            "file_bytes": p.gguf.file_bytes,
            "architecture": p.gguf.arch().map_err(|e| anyhow!("{e:#}"))?,
        },
        "binary": p.setup.bin,
        "config": p.setup.config,
        "env": p.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "settings": p.settings,
        "seed": SEED,
        "statistic": "fastest run per prompt and arm (workload tok/s = sum of their tokens \
                      after the first / sum of their first-to-last spans); fastest round per \
                      arm for the concurrent streams",
        "other_cpu_busy": {"before_inferd": p.busy.0, "before_peer": p.busy.1},
        "prompts": {"single_stream": inferd.prompts, "streams": inferd.stream_prompts},
        "inferd": {
            "command": inferd.command,
            "speculative_flag_accepted": inferd.flag_accepted,
            "speculative": inferd.stats_end.as_ref().map(|s| &s["speculative"]),
            "stats_start": inferd.stats_start,
            "stats_end": inferd.stats_end,
            "peak_rss_bytes": inferd.peak_rss_bytes,
            "workloads": p.ours,
            "runs": inferd.runs,
            "rounds": inferd.rounds,
        },
        "peer": p.peer.map(|peer| json!({
            "llama_cpp": p.llama,
            "spec_type": "ngram-simple",
            "spec_args": p.spec_args,
            "ngram_n": p.cli.spec_peer_ngram_n,
            "draft_max": p.peer_k,
            "commands": peer.commands,
            "servers": peer.servers,
            "workloads": p.theirs,
            "runs": peer.runs,
            "rounds": peer.rounds,
        })),
        "peer_error": p.peer_error,
        "identical": all_identical,
        "mismatches": {
            "inferd": p.ours.iter().flat_map(|w| &w.mismatches).collect::<Vec<_>>(),
            "llama_cpp": p.theirs.unwrap_or_default().iter().flat_map(|w| &w.mismatches)
                .collect::<Vec<_>>(),
        },
        "goals": p.goals,
        "table": p.rendered.lines().collect::<Vec<_>>(),
        "notes": p.notes,
    }))
}
