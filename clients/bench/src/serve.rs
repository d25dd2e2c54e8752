//! The serving scenario (issue 3), per model file: inferd through its WebSocket, then
//! native llama-server through its streaming `/completion` with the same prompts (token
//! ids), then `llama-bench`, then this machine's streaming read bandwidth as the bound of
//! single-stream decode. One table per file; the JSON file holds one object per file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use crate::bandwidth::{self, Bandwidth};
use crate::client::{self, Conn, Trace};
use crate::daemon::{Daemon, DaemonSpec};
use crate::figures::Figures;
use crate::gguf::{DecodeBytes, Gguf, KvPerToken};
use crate::llama_bench::{self, LlamaBench};
use crate::llama_cpp::LlamaCpp;
use crate::llama_server::{LlamaServer, ServerSpec};
use crate::machine::{self, Machine};
use crate::measure::{self, Prompt, Target};
use crate::{lora, prompts, report, Cli};

/// The warm-up prompt of both engines (also tells whether inferd adds a BOS token).
const WARM_UP: &str = "Hello, my name is";

/// What `main` resolved.
pub struct Setup {
    pub root: PathBuf,
    pub threads: usize,
    pub bin: PathBuf,
    pub config: PathBuf,
    pub models: Vec<PathBuf>,
    pub out: PathBuf,
    pub out_dir: PathBuf,
    /// `INFERD__MODEL__THREADS`, `INFERD__SCHEDULER__PREFIX_CACHING=false` and the
    /// `--env` pairs.
    pub env: Vec<(String, String)>,
}

/// The prompts of one file, as both engines get them.
#[derive(Debug, Clone, Serialize)]
pub struct Prompts {
    pub warm_up: Prompt,
    pub prefill: Vec<Prompt>,
    pub decode: Prompt,
    pub concurrent: Vec<Prompt>,
    /// Whether inferd put a BOS token before the prompt (then the ids start with it).
    pub bos_added: bool,
}

/// inferd's side of one file.
struct InferdRun {
    figures: Figures,
    prompts: Prompts,
    decode_text: String,
    /// `kv_blocks_total`, `kv_block_size` of the `stats` reply.
    kv_blocks: Option<(u64, u64)>,
    /// `kv_bytes_per_token` from the daemon's "KV cache budget" log line.
    logged_kv_bytes_per_token: Option<u64>,
    command: String,
    notes: Vec<String>,
}

/// llama-server's side of one file.
struct PeerRun {
    figures: Figures,
    decode_text: String,
    commands: Vec<String>,
    notes: Vec<String>,
}

/// How llama.cpp's `-c` was chosen.
#[derive(Debug, Clone, Serialize)]
struct KvPlan {
    per_token: KvPerToken,
    inferd_blocks: Option<u64>,
    inferd_block_size: Option<u64>,
    inferd_tokens: u64,
    inferd_bytes: u64,
    /// `-c` of every llama-server.
    llama_ctx: u64,
    source: String,
    reasoning: String,
}

/// Runs the scenario on every file of `setup.models`.
pub fn run(cli: &Cli, setup: Setup) -> Result<()> {
    let machine = Machine::probe();
    let llama = if cli.no_peer {
        Err("skipped (--no-peer)".to_owned())
    } else {
        LlamaCpp::locate(&setup.root, cli.llama_bin.clone()).map_err(|e| format!("{e:#}"))
    };
    if let Err(e) = &llama {
        eprintln!("inferd-bench: no llama.cpp: {e}");
    }
    let mut results: Vec<Value> = Vec::new();
    for model in &setup.models {
        let result = run_file(cli, &setup, &machine, &llama, model)
            .with_context(|| format!("benchmark of {}", model.display()))?;
        results.push(result);
        // Rewritten after every file, so a failure later keeps the earlier ones.
        std::fs::write(&setup.out, serde_json::to_vec_pretty(&results)?)
            .with_context(|| format!("cannot write {}", setup.out.display()))?;
    }
    println!("\nwritten: {}", setup.out.display());
    Ok(())
}

fn run_file(
    cli: &Cli,
    setup: &Setup,
    machine: &Machine,
    llama: &std::result::Result<LlamaCpp, String>,
    model: &Path,
) -> Result<Value> {
    let gguf = Gguf::read(model)?;
    let per_token = gguf.kv_per_token()?;
    let decode_bytes = gguf.decode_bytes();
    let stem = model
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let threads = setup.threads;
    // Made (or checked) before anything runs, so a bad adapter fails at once.
    let lora_files = if lora::wanted(cli) {
        Some(lora::adapters(cli, &setup.root, model)?)
    } else {
        None
    };
    eprintln!(
        "\ninferd-bench: {} ({}, {} B) with {threads} threads",
        model.display(),
        gguf.arch()?,
        gguf.file_bytes
    );

    let spec = DaemonSpec {
        bin: setup.bin.clone(),
        root: setup.root.clone(),
        config: setup.config.clone(),
        model: model.to_path_buf(),
        env: setup.env.clone(),
        log: setup.out_dir.join(format!("{stem}.inferd.log")),
        startup_timeout: Duration::from_secs(cli.startup_timeout),
        extra_args: Vec::new(),
    };
    let busy_before_inferd = machine::other_cpu_busy();
    let inferd = run_inferd(cli, &spec, &gguf)?;
    let mut notes = inferd.notes.clone();
    let (lora_run, lora_error) = match &lora_files {
        Some(files) => match lora::run_inferd(cli, &spec, &stem, files, &inferd.prompts) {
            Ok(r) => (Some(r), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        },
        None => (None, None),
    };
    if let Some(e) = &lora_error {
        eprintln!("inferd-bench: LoRA daemon: {e}");
    }

    let plan = kv_plan(cli, &inferd, per_token);
    if let Some(logged) = inferd.logged_kv_bytes_per_token {
        if logged != plan.per_token.bytes {
            notes.push(format!(
                "the daemon logged {logged} KV bytes per token, the file gives {}",
                plan.per_token.bytes
            ));
        }
    }
    eprintln!("inferd-bench: KV: {}", plan.reasoning);

    // llama.cpp runs after the daemon is gone, so the engines never share the cores.
    let busy_before_peer = llama.as_ref().ok().and_then(|_| machine::other_cpu_busy());
    let (peer, peer_error) = match llama {
        Ok(l) => match run_peer(cli, setup, l, model, &stem, &plan, &inferd.prompts) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        },
        Err(e) => (None, Some(e.clone())),
    };
    if let Some(e) = &peer_error {
        eprintln!("inferd-bench: llama-server: {e}");
    }
    let (lora_peer, lora_peer_error) = match (&lora_run, llama) {
        (Some(r), Ok(l)) => match lora::run_peer(
            cli,
            l,
            model,
            threads,
            plan.llama_ctx,
            &setup.out_dir,
            &stem,
            &r.adapter_files[0],
            &inferd.prompts,
        ) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        },
        (Some(_), Err(e)) => (None, Some(e.clone())),
        (None, _) => (None, None),
    };
    if let Some(e) = &lora_peer_error {
        eprintln!("inferd-bench: llama-server --lora: {e}");
    }
    let (bench, bench_error) = match llama {
        Ok(_) if cli.no_llama_bench => (None, Some("skipped (--no-llama-bench)".to_owned())),
        Ok(l) => match llama_bench::run(
            &l.tool("llama-bench"),
            model,
            threads,
            cli.prefill_tokens,
            cli.max_tokens,
            cli.llama_bench_reps,
            &setup.out_dir.join(format!("{stem}.llama-bench.log")),
            Duration::from_secs(cli.peer_timeout),
        ) {
            Ok(b) => (Some(b), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        },
        Err(e) => (None, Some(e.clone())),
    };
    if let Some(e) = &bench_error {
        eprintln!("inferd-bench: llama-bench: {e}");
    }

    eprintln!(
        "inferd-bench: read bandwidth, {threads} threads over {} B x{}",
        decode_bytes.bytes, cli.bw_runs
    );
    let bw = bandwidth::measure(decode_bytes.bytes, threads, cli.bw_runs);

    if let Some(p) = &peer {
        notes.extend(p.notes.iter().cloned());
        // The client's decode rate against llama-server's own: a gap would be the
        // transport's (e.g. delayed TCP writes), not the engine's.
        let server =
            p.figures.extra["measure"]["decode_engine_timings"]["predicted_per_second"].as_f64();
        if let Some(server) = server.filter(|&s| s > 0.0) {
            let client = p.figures.decode.tok_per_s;
            if (client / server - 1.0).abs() > 0.05 {
                notes.push(format!(
                    "llama-server decode: {client:.1} tok/s on the client, {server:.1} by its \
                     own timings"
                ));
            }
        }
        let same = p.decode_text == inferd.decode_text;
        if !same {
            notes.push(
                "the greedy decode texts of the two engines differ (see decode_texts)".into(),
            );
        }
    }

    let peer_figures = peer.as_ref().map(|p| &p.figures);
    let mut rows = report::rows(&inferd.figures, peer_figures);
    if let Some(b) = &bench {
        rows.extend(report::bench_rows(&inferd.figures, b));
    }
    let goals = report::goals(&inferd.figures, peer_figures);
    let bound = bound(
        &decode_bytes,
        &bw,
        machine,
        &inferd,
        peer.as_ref(),
        bench.as_ref(),
    );

    println!(
        "\n== {} ({}), {threads} threads, max_tokens {}, llama-server -c {} ==\n",
        model.display(),
        gguf.arch()?,
        cli.max_tokens,
        plan.llama_ctx
    );
    print!("{}", report::render(&rows, &goals));
    print!("{}", render_bound(&bound));
    println!("\nKV: {}", plan.reasoning);
    if let Ok(l) = llama {
        println!(
            "llama.cpp: {} ({})",
            l.server_version,
            l.build_info_path
                .as_ref()
                .map_or("no build-info.txt".into(), |p| p.display().to_string())
        );
    }
    for n in &notes {
        println!("note: {n}");
    }
    let lora_json = match (&lora_run, &lora_error) {
        (Some(r), _) => {
            let (rows, goals) =
                lora::rows_and_goals(cli, r, lora_peer.as_ref(), &inferd.figures, peer_figures);
            print!("{}", lora::render(r, &rows, &goals));
            if let Some(e) = &lora_peer_error {
                println!("LoRA: no llama-server --lora: {e}");
            }
            if let Some(p) = &lora_peer {
                if p.decode_text != r.adapter.decode_text {
                    println!(
                        "LoRA note: the greedy decode texts of inferd and llama-server with the \
                         adapter differ (see lora.decode_texts)"
                    );
                }
            }
            for n in r
                .notes
                .iter()
                .chain(lora_peer.iter().flat_map(|p| p.notes.iter()))
            {
                println!("LoRA note: {n}");
            }
            Some(lora::to_json(
                r,
                lora_peer.as_ref(),
                lora_peer_error.as_deref(),
                &rows,
                &goals,
            ))
        }
        (None, Some(e)) => {
            println!("\nLoRA: failed: {e}");
            Some(json!({"error": e}))
        }
        (None, None) => None,
    };

    let (commit, dirty) = crate::git_state(&setup.root);
    let decode_texts = json!({
        "inferd": inferd.decode_text,
        "llama_server": peer.as_ref().map(|p| &p.decode_text),
        "equal": peer.as_ref().map(|p| p.decode_text == inferd.decode_text),
    });
    let mut result = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "date": chrono::Utc::now().to_rfc3339(),
        "git_commit": commit,
        "git_dirty": dirty,
        "machine": machine,
        "threads": threads,
        "model": {
            "path": model,
            "file_bytes": gguf.file_bytes,
            "architecture": gguf.arch()?,
            "gguf_version": gguf.version,
            "tensors": gguf.tensors.len(),
            "weight_bytes": gguf.weight_bytes(),
            "decode_bytes": decode_bytes,
        },
        "llama_cpp": llama.as_ref().ok(),
        "commands": {
            "inferd": inferd.command,
            "llama_server": peer.as_ref().map(|p| &p.commands),
            "llama_bench": bench.as_ref().map(|b| b.command.join(" ")),
        },
        "binary": setup.bin,
        "config": setup.config,
        "env": setup.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "max_tokens": cli.max_tokens,
        "prefill_target_tokens": cli.prefill_tokens,
        "concurrency": cli.concurrency,
        "other_cpu_busy": {
            "before_inferd": busy_before_inferd,
            "before_peer": busy_before_peer,
        },
        "kv": plan,
        "prompts": inferd.prompts,
        "inferd": inferd.figures,
        "peer": peer_figures,
        "peer_error": peer_error,
        "llama_bench": bench,
        "llama_bench_error": bench_error,
        "bandwidth": bw,
        "bound": bound,
        "decode_texts": decode_texts,
        "table": rows,
        "goals": goals,
        "notes": notes,
    });
    if let Some(l) = lora_json {
        result["lora"] = l;
    }
    Ok(result)
}

/// Starts the daemon, builds the prompts with its tokenizer, measures it, stops it.
fn run_inferd(cli: &Cli, spec: &DaemonSpec, gguf: &Gguf) -> Result<InferdRun> {
    let mut daemon = Daemon::start(spec)?;
    eprintln!(
        "inferd-bench: daemon pid {} at {} (log: {})",
        daemon.pid(),
        daemon.url,
        spec.log.display()
    );
    let runtime = runtime()?;
    let measured = runtime.block_on(measure_inferd(cli, &daemon.url, gguf));
    let mut run = match measured {
        Ok(m) => m,
        Err(e) => {
            // Say whether the daemon died, which explains most failures.
            daemon.check_alive().context(e.to_string())?;
            return Err(e);
        }
    };
    run.figures.peak_rss_bytes = daemon.peak_rss_bytes()?;
    daemon.stop();
    run.logged_kv_bytes_per_token = logged_kv_bytes_per_token(&spec.log);
    run.command = spec.command_line();
    Ok(run)
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build the tokio runtime")
}

/// `kv_bytes_per_token=N` of the daemon's first log line that has it.
fn logged_kv_bytes_per_token(log: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(log).ok()?;
    let rest = text.split("kv_bytes_per_token=").nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// A prompt's ids: inferd's tokenization of the text, after BOS when inferd adds one.
async fn prompt_of(conn: &mut Conn, text: String, bos: Option<u32>) -> Result<Prompt> {
    let mut ids: Vec<u32> = bos.into_iter().collect();
    ids.extend(conn.tokenize(&text).await?);
    Ok(Prompt { text, ids })
}

async fn measure_inferd(cli: &Cli, url: &str, gguf: &Gguf) -> Result<InferdRun> {
    let timeout = Duration::from_secs(cli.request_timeout);
    let target = Target::Inferd {
        url: url.to_owned(),
        adapter: None,
    };
    let mut conn = Conn::connect(url).await?;
    let stats_before = Conn::connect(url).await?.stats().await;
    let mut notes = Vec::new();

    eprintln!("inferd-bench: inferd warm-up");
    let warm_ids = conn.tokenize(WARM_UP).await?;
    let warm = conn.generate("warmup", WARM_UP, 8, timeout).await?;
    // Whether inferd adds BOS to a raw prompt: its prompt is one token longer than the
    // text's tokens. llama-server gets the ids as they are, so the BOS goes in them.
    let (gguf_bos, bos_id) = gguf.bos();
    let bos_added = warm.prompt_tokens as usize == warm_ids.len() + 1;
    if bos_added != gguf_bos {
        notes.push(format!(
            "the file says add_bos = {gguf_bos}, inferd's raw prompts {} a BOS; the \
             token-id prompts follow inferd",
            if bos_added { "get" } else { "do not get" }
        ));
    }
    if warm.prompt_tokens as usize != warm_ids.len() + usize::from(bos_added) {
        notes.push(format!(
            "inferd's warm-up prompt has {} tokens, its tokenize gives {}",
            warm.prompt_tokens,
            warm_ids.len()
        ));
    }
    let bos = match (bos_added, bos_id) {
        (true, Some(id)) => Some(id),
        (true, None) => return Err(anyhow!("inferd adds a BOS but the file names no BOS id")),
        (false, _) => None,
    };

    let mut prefill = Vec::new();
    for variant in 0..cli.prefill_reps {
        let (text, count) =
            client::prompt_of_tokens(&mut conn, variant, cli.prefill_tokens).await?;
        if count != cli.prefill_tokens {
            eprintln!(
                "inferd-bench: prefill prompt {variant} has {count} tokens (wanted {})",
                cli.prefill_tokens
            );
        }
        prefill.push(prompt_of(&mut conn, text, bos).await?);
    }
    let decode = prompt_of(&mut conn, prompts::decode_prompt(), bos).await?;
    let mut concurrent = Vec::new();
    let mut streams = cli.concurrency.iter().copied().max().unwrap_or(1);
    if lora::wanted(cli) {
        streams = streams.max(cli.lora_streams);
    }
    for text in prompts::concurrent_prompts(streams) {
        concurrent.push(prompt_of(&mut conn, text, bos).await?);
    }
    let prompts = Prompts {
        warm_up: prompt_of(&mut conn, WARM_UP.to_owned(), bos).await?,
        prefill,
        decode,
        concurrent,
        bos_added,
    };

    let (figures, decode_text, extra) = measure_engine(
        cli,
        &target,
        &prompts,
        &cli.concurrency,
        &mut notes,
        "inferd",
    )
    .await?;
    let stats_after = Conn::connect(url).await?.stats().await;
    let blocks_of = |s: &Option<Value>| {
        let s = s.as_ref()?;
        Some((s["kv_blocks_total"].as_u64()?, s["kv_block_size"].as_u64()?))
    };
    let kv_blocks = blocks_of(&stats_after).or_else(|| blocks_of(&stats_before));
    let mut figures = figures;
    figures.extra = json!({
        "url": url,
        "stats_before": stats_before,
        "stats_after": stats_after,
        "measure": extra,
    });
    Ok(InferdRun {
        figures,
        prompts,
        decode_text,
        kv_blocks,
        logged_kv_bytes_per_token: None,
        command: String::new(),
        notes,
    })
}

/// Prefill, decode and the given levels on one engine (the same code for both). Returns
/// the figures (without RSS), the decode text and per-run details for the JSON. Prompt
/// lengths the engine reports that differ from the ids are added to `notes`.
pub async fn measure_engine(
    cli: &Cli,
    target: &Target,
    prompts: &Prompts,
    levels: &[usize],
    notes: &mut Vec<String>,
    engine: &str,
) -> Result<(Figures, String, Value)> {
    let timeout = Duration::from_secs(cli.request_timeout);
    let mut check = |what: &str, trace: &Trace, prompt: &Prompt| {
        if trace.prompt_tokens as usize != prompt.ids.len() {
            notes.push(format!(
                "{engine} {what}: prompt_tokens {} but the prompt has {} ids",
                trace.prompt_tokens,
                prompt.ids.len()
            ));
        }
    };
    eprintln!("inferd-bench: {engine}: prefill x{}", cli.prefill_reps);
    let (prefill, prefill_traces) = measure::prefill(target, &prompts.prefill, timeout).await?;
    for (i, (t, p)) in prefill_traces.iter().zip(&prompts.prefill).enumerate() {
        check(&format!("prefill {i}"), t, p);
    }
    eprintln!(
        "inferd-bench: {engine}: decode {} tokens x{}",
        cli.max_tokens, cli.decode_reps
    );
    let (decode, decode_trace, decode_runs) = measure::decode(
        target,
        &prompts.decode,
        cli.max_tokens,
        cli.decode_reps,
        timeout,
    )
    .await?;
    check("decode", &decode_trace, &prompts.decode);
    let mut figures = Figures {
        prefill,
        decode,
        concurrency: Vec::new(),
        peak_rss_bytes: 0,
        extra: Value::Null,
    };
    let levels_extra = measure_levels(cli, target, prompts, levels, &mut figures, engine).await?;
    let extra = json!({
        "prefill_engine_timings": prefill_traces.iter().map(|t| &t.engine_timings).collect::<Vec<_>>(),
        "decode_runs_tok_per_s": decode_runs,
        "decode_finish_reason": decode_trace.finish_reason,
        "decode_engine_timings": decode_trace.engine_timings,
        "levels": levels_extra,
    });
    Ok((figures, decode_trace.text, extra))
}

/// The concurrency levels `levels` on one engine, appended to `figures.concurrency`.
async fn measure_levels(
    cli: &Cli,
    target: &Target,
    prompts: &Prompts,
    levels: &[usize],
    figures: &mut Figures,
    engine: &str,
) -> Result<Vec<Value>> {
    let timeout = Duration::from_secs(cli.request_timeout);
    let mut extra = Vec::new();
    for &n in levels {
        eprintln!("inferd-bench: {engine}: concurrency {n}");
        let (level, traces) =
            measure::level(target, &prompts.concurrent[..n], cli.max_tokens, timeout).await?;
        eprintln!(
            "inferd-bench:   {:.1} tok/s aggregate, TTFT {:.0} ms, ITL {:.1} ms",
            level.aggregate_tok_per_s, level.mean_ttft_ms, level.mean_itl_ms
        );
        let finish: Vec<&str> = traces.iter().map(|t| t.finish_reason.as_str()).collect();
        extra.push(json!({"n": n, "finish_reasons": finish}));
        figures.concurrency.push(level);
    }
    Ok(extra)
}

/// llama.cpp's `-c`: the same KV bytes as inferd's pool. Both hold f16 K and V for
/// every layer, so equal bytes means equal tokens.
fn kv_plan(cli: &Cli, inferd: &InferdRun, per_token: KvPerToken) -> KvPlan {
    let (tokens, source, blocks) = match (cli.kv_bytes, inferd.kv_blocks) {
        (Some(b), _) => (
            b / per_token.bytes.max(1),
            format!("--kv-bytes {b} / {} B per token", per_token.bytes),
            None,
        ),
        (None, Some((blocks, size))) => (
            blocks * size,
            format!("inferd's stats: kv_blocks_total {blocks} x kv_block_size {size}"),
            Some((blocks, size)),
        ),
        (None, None) => {
            let largest = cli.concurrency.iter().copied().max().unwrap_or(1) as u64;
            let fit = (largest * (64 + cli.max_tokens))
                .max(cli.prefill_tokens as u64 + cli.max_tokens + 64);
            (
                fit.div_ceil(256) * 256,
                "no stats from the daemon: a size that fits the largest run".to_owned(),
                None,
            )
        }
    };
    let bytes = tokens * per_token.bytes;
    let mut reasoning = format!(
        "KV bytes per token = {}; inferd's pool = {source} = {tokens} tokens = {bytes} B; \
         llama-server gets -c {tokens} (f16 K and V as well, one unified pool over its -np \
         slots), i.e. the same {bytes} B. llama.cpp rounds n_ctx up to a multiple of 256 \
         ({} tokens), and caps each slot at the model's training context.",
        per_token.formula,
        tokens.div_ceil(256) * 256
    );
    if let Some(w) = per_token.sliding_window {
        reasoning.push_str(&format!(
            " The model has sliding-window layers (window {w}): llama.cpp keeps only the \
             window for them unless --swa-full, so its real KV bytes are lower (see \
             kv_buffer_bytes of each server)."
        ));
    }
    KvPlan {
        per_token,
        inferd_blocks: blocks.map(|b| b.0),
        inferd_block_size: blocks.map(|b| b.1),
        inferd_tokens: tokens,
        inferd_bytes: bytes,
        llama_ctx: tokens,
        source,
        reasoning,
    }
}

/// llama-server with `-np 1` for prefill, decode and one stream, then one server per
/// further level with `-np N`; the same measurements as inferd's.
fn run_peer(
    cli: &Cli,
    setup: &Setup,
    llama: &LlamaCpp,
    model: &Path,
    stem: &str,
    plan: &KvPlan,
    prompts: &Prompts,
) -> Result<PeerRun> {
    let timeout = Duration::from_secs(cli.request_timeout);
    let runtime = runtime()?;
    let mut parallel: Vec<usize> = vec![1];
    for &n in &cli.concurrency {
        if !parallel.contains(&n) {
            parallel.push(n);
        }
    }
    let mut figures: Option<Figures> = None;
    let mut decode_text = String::new();
    let mut servers = Vec::new();
    let mut commands = Vec::new();
    let mut notes = Vec::new();
    let mut measure_extra = Value::Null;
    let mut level_extra = Vec::new();
    let mut peak = 0;
    for np in parallel {
        let spec = ServerSpec {
            binary: llama.tool("llama-server"),
            model: model.to_path_buf(),
            threads: setup.threads,
            parallel: np,
            ctx: plan.llama_ctx,
            log: setup
                .out_dir
                .join(format!("{stem}.llama-server-np{np}.log")),
            startup_timeout: Duration::from_secs(cli.startup_timeout),
            extra: Vec::new(),
        };
        let mut server = LlamaServer::start(&spec)?;
        eprintln!(
            "inferd-bench: llama-server -np {np}: pid {} at {} (log: {})",
            server.pid(),
            server.addr,
            spec.log.display()
        );
        commands.push(server.command.join(" "));
        let target = Target::LlamaServer {
            addr: server.addr.clone(),
        };
        let levels: Vec<usize> = cli
            .concurrency
            .iter()
            .copied()
            .filter(|&n| n == np)
            .collect();
        let result = runtime.block_on(async {
            measure::warm_up(&target, &prompts.warm_up, timeout).await?;
            if np == 1 {
                let (mut f, text, extra) =
                    measure_engine(cli, &target, prompts, &[], &mut notes, "llama-server").await?;
                level_extra.extend(
                    measure_levels(cli, &target, prompts, &levels, &mut f, "llama-server").await?,
                );
                decode_text = text;
                measure_extra = extra;
                figures = Some(f);
            } else if let Some(f) = figures.as_mut() {
                level_extra.extend(
                    measure_levels(cli, &target, prompts, &levels, f, "llama-server").await?,
                );
            }
            anyhow::Ok(())
        });
        if let Err(e) = result {
            server.check_alive().context(e.to_string())?;
            return Err(e);
        }
        let rss = server.peak_rss_bytes()?;
        peak = peak.max(rss);
        let log = server.parse_log();
        if let Some(kv) = log.kv_buffer_bytes {
            if log.n_ctx.is_some_and(|n| n * plan.per_token.bytes != kv)
                && plan.per_token.sliding_window.is_none()
            {
                notes.push(format!(
                    "llama-server -np {np}: KV buffers {kv} B, not n_ctx x {} B",
                    plan.per_token.bytes
                ));
            }
        }
        let props = server.props();
        servers.push(json!({
            "np": np,
            "pid": server.pid(),
            "command": server.command.join(" "),
            "peak_rss_bytes": rss,
            "log": log,
            "props": {
                "total_slots": props["total_slots"],
                "n_ctx_slot": props["default_generation_settings"]["n_ctx"],
                "build_info": props["build_info"],
                "model_path": props["model_path"],
            },
        }));
        server.stop();
    }
    let mut figures = figures.ok_or_else(|| anyhow!("no llama-server run"))?;
    // The levels in the order the command line gave them.
    figures
        .concurrency
        .sort_by_key(|l| cli.concurrency.iter().position(|&n| n == l.n));
    figures.peak_rss_bytes = peak;
    figures.extra = json!({
        "servers": servers,
        "peak_rss": "the largest VmHWM of the llama-server processes (one per -np)",
        "measure": measure_extra,
        "levels": level_extra,
    });
    Ok(PeerRun {
        figures,
        decode_text,
        commands,
        notes,
    })
}

/// Decode against the machine's read bandwidth.
#[derive(Debug, Clone, Serialize)]
struct Bound {
    decode_bytes: DecodeBytes,
    bandwidth_gb_s: f64,
    bandwidth_buffer_bytes: u64,
    threads: usize,
    l3_bytes: Option<u64>,
    l3_shared_cpus: Option<String>,
    /// L3 size / decode bytes, at most 1.
    l3_fraction_of_weights: Option<f64>,
    rows: Vec<BoundRow>,
}

#[derive(Debug, Clone, Serialize)]
struct BoundRow {
    what: String,
    tok_per_s: f64,
    /// decode bytes x tok/s.
    weight_gb_s: f64,
    fraction_of_bandwidth: f64,
}

fn bound(
    decode_bytes: &DecodeBytes,
    bw: &Bandwidth,
    machine: &Machine,
    inferd: &InferdRun,
    peer: Option<&PeerRun>,
    bench: Option<&LlamaBench>,
) -> Bound {
    let mut rows = Vec::new();
    let mut push = |what: String, tok_per_s: f64| {
        let gb_s = decode_bytes.bytes as f64 * tok_per_s / 1e9;
        rows.push(BoundRow {
            what,
            tok_per_s,
            weight_gb_s: gb_s,
            fraction_of_bandwidth: if bw.best_gb_s > 0.0 {
                gb_s / bw.best_gb_s
            } else {
                0.0
            },
        });
    };
    push(
        "inferd decode (single stream)".into(),
        inferd.figures.decode.tok_per_s,
    );
    if let Some(p) = peer {
        push(
            "llama-server decode (single stream)".into(),
            p.figures.decode.tok_per_s,
        );
    }
    if let Some(tg) = bench.and_then(|b| b.tg.as_ref()) {
        push(format!("llama-bench {}", tg.name), tg.avg_tok_per_s);
    }
    let l3 = machine.l3();
    Bound {
        decode_bytes: decode_bytes.clone(),
        bandwidth_gb_s: bw.best_gb_s,
        bandwidth_buffer_bytes: bw.buffer_bytes,
        threads: bw.threads,
        l3_bytes: l3.map(|c| c.bytes),
        l3_shared_cpus: l3.map(|c| c.shared_cpus.clone()),
        l3_fraction_of_weights: l3
            .map(|c| (c.bytes as f64 / decode_bytes.bytes.max(1) as f64).min(1.0)),
        rows,
    }
}

fn render_bound(b: &Bound) -> String {
    let mut out =
        String::from("\nphysical bound of single-stream decode (weights read once per token):\n");
    out.push_str(&format!(
        "  weight bytes per token: {} B = {:.1} MB ({})\n",
        b.decode_bytes.bytes,
        b.decode_bytes.bytes as f64 / 1e6,
        b.decode_bytes.counted
    ));
    out.push_str(&format!(
        "  streaming read bandwidth: {:.1} GB/s ({} threads summing a {:.1} MB buffer, best run)\n",
        b.bandwidth_gb_s,
        b.threads,
        b.bandwidth_buffer_bytes as f64 / 1e6
    ));
    match (b.l3_bytes, b.l3_fraction_of_weights) {
        (Some(l3), Some(f)) => out.push_str(&format!(
            "  L3: {:.1} MiB (shared by CPUs {}), {:.0} % of the weight bytes fit in it\n",
            l3 as f64 / (1024.0 * 1024.0),
            b.l3_shared_cpus.as_deref().unwrap_or("?"),
            f * 100.0
        )),
        _ => out.push_str("  L3: not reported\n"),
    }
    let rows: Vec<Vec<String>> = b
        .rows
        .iter()
        .map(|r| {
            vec![
                r.what.clone(),
                report::cell(Some(r.tok_per_s)),
                format!("{:.2}", r.weight_gb_s),
                format!("{:.2}", r.fraction_of_bandwidth),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&report::table(
        &[
            ("decode", 0),
            ("tok/s", 8),
            ("weight GB/s", 11),
            ("of bandwidth", 12),
        ],
        &rows,
    ));
    out
}
