//! The LoRA section of the serve scenario (`--lora FILE`, `--lora-make N`), per model file:
//!
//! 1. One daemon serving every adapter (`--lora-modules lora0=FILE ...`): single-stream
//!    prefill and decode with `lora0` against the base model on the same daemon (the
//!    two arms alternate, repetition by repetition; the best of each counts), and
//!    `--lora-streams` concurrent streams all on `lora0`, spread round-robin over the
//!    first `--lora-mix` adapters, and on the base (the three arms alternate over
//!    `--lora-rounds`; the best of each counts). Adapters are named in the WebSocket
//!    `generate` frame (`"adapter"`; the OpenAI edge would take them as `"model"`), and
//!    each is loaded by a warm-up request before anything is timed.
//! 2. llama-server `-np 1 --lora FILE` (scale 1, applied to every request) with the same
//!    file as `lora0`, measured by the same code as the main section's llama-server.
//!
//! The same prompts as the main section; prefix caching is off as there.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Value};

use crate::client::{Conn, Trace};
use crate::daemon::{Daemon, DaemonSpec};
use crate::figures::{Decode, Figures, Level, Prefill};
use crate::llama_cpp::LlamaCpp;
use crate::llama_server::{LlamaServer, ServerSpec};
use crate::measure::{self, Prompt, Target};
use crate::report::{self, Goal};
use crate::serve::{self, Prompts};
use crate::{http_client, Cli};

/// Whether the run has a LoRA section.
pub fn wanted(cli: &Cli) -> bool {
    !cli.lora.is_empty() || cli.lora_make > 0
}

/// The adapter files for `model`: the `--lora` files, then `--lora-make` generated ones
/// (`scripts/lora-bench-adapters.sh`). Two files with the same bytes are refused.
pub fn adapters(cli: &Cli, root: &Path, model: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = cli
        .lora
        .iter()
        .map(|f| {
            if f.is_absolute() {
                f.clone()
            } else {
                root.join(f)
            }
        })
        .collect();
    if cli.lora_make > 0 {
        let script = root.join("scripts/lora-bench-adapters.sh");
        eprintln!(
            "inferd-bench: LoRA: {} adapter(s) for {} (seeds from {})",
            cli.lora_make,
            model.display(),
            cli.lora_seed
        );
        let out = Command::new("bash")
            .arg(&script)
            .arg(model)
            .arg(cli.lora_make.to_string())
            .arg(cli.lora_seed.to_string())
            .stderr(std::process::Stdio::inherit())
            .output()
            .with_context(|| format!("cannot run {}", script.display()))?;
        if !out.status.success() {
            bail!("{} failed ({})", script.display(), out.status);
        }
        files.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| PathBuf::from(l.trim())),
        );
    }
    let mut contents = Vec::new();
    for f in &files {
        let bytes =
            std::fs::read(f).with_context(|| format!("cannot read adapter {}", f.display()))?;
        if let Some(i) = contents.iter().position(|c: &Vec<u8>| *c == bytes) {
            bail!(
                "adapters {} and {} are the same bytes (--lora-make seeds start at --lora-seed; \
                 smollm2-lora-f16.gguf is SmolLM2's seed 1)",
                files[i].display(),
                f.display()
            );
        }
        contents.push(bytes);
    }
    Ok(files)
}

/// Name of adapter `i` on the daemon.
fn name(i: usize) -> String {
    format!("lora{i}")
}

/// Single-stream figures of one arm.
#[derive(Debug, Clone, Serialize)]
pub struct Single {
    pub prefill: Prefill,
    /// Every prefill repetition's tok/s.
    pub prefill_runs_tok_per_s: Vec<f64>,
    pub decode: Decode,
    /// Every decode repetition's tok/s.
    pub decode_runs_tok_per_s: Vec<f64>,
    pub decode_finish_reason: String,
    pub decode_text: String,
}

/// One concurrency arm: its best round, every round's aggregate and the best round's
/// texts.
#[derive(Debug, Clone, Serialize)]
pub struct Streams {
    /// The adapter of each stream (`null`: the base).
    pub adapters: Vec<Option<String>>,
    pub best: Level,
    pub rounds_aggregate_tok_per_s: Vec<f64>,
    #[serde(skip)]
    texts: Vec<String>,
}

/// inferd's side of the section.
pub struct InferdLora {
    pub adapter_files: Vec<PathBuf>,
    pub base: Single,
    pub adapter: Single,
    pub one_adapter: Streams,
    pub mixed: Streams,
    pub base_streams: Streams,
    pub peak_rss_bytes: u64,
    pub command: String,
    pub stats_after: Option<Value>,
    /// The mixed streams' texts against the all-`lora0` run's, prompt by prompt.
    pub mixed_texts: Value,
    pub notes: Vec<String>,
}

/// llama-server `--lora` (one slot).
pub struct PeerLora {
    pub figures: Figures,
    pub decode_text: String,
    pub command: String,
    pub notes: Vec<String>,
}

/// Starts the daemon with every adapter, measures it, stops it.
pub fn run_inferd(
    cli: &Cli,
    base_spec: &DaemonSpec,
    stem: &str,
    files: &[PathBuf],
    prompts: &Prompts,
) -> Result<InferdLora> {
    let mut extra_args = Vec::new();
    for (i, f) in files.iter().enumerate() {
        extra_args.push("--lora-modules".to_owned());
        extra_args.push(format!("{}={}", name(i), f.display()));
    }
    let spec = DaemonSpec {
        extra_args,
        log: base_spec
            .log
            .with_file_name(format!("{stem}.inferd-lora.log")),
        ..base_spec.clone()
    };
    let mut daemon = Daemon::start(&spec)?;
    eprintln!(
        "inferd-bench: LoRA daemon pid {} at {} with {} adapter(s) (log: {})",
        daemon.pid(),
        daemon.url,
        files.len(),
        spec.log.display()
    );
    let runtime = serve::runtime()?;
    let measured = runtime.block_on(measure_inferd(cli, &daemon.url, files.len(), prompts));
    let mut run = match measured {
        Ok(m) => m,
        Err(e) => {
            daemon.check_alive().context(e.to_string())?;
            return Err(e);
        }
    };
    run.peak_rss_bytes = daemon.peak_rss_bytes()?;
    daemon.stop();
    run.command = spec.command_line();
    run.adapter_files = files.to_vec();
    Ok(run)
}

fn merge_prefill(runs: &[Prefill]) -> Prefill {
    Prefill {
        prompt_tokens: runs.first().map_or(0, |p| p.prompt_tokens),
        ttft_ms: runs
            .iter()
            .flat_map(|p| p.ttft_ms.iter().copied())
            .collect(),
        tok_per_s: runs.iter().map(|p| p.tok_per_s).fold(0.0, f64::max),
    }
}

async fn measure_inferd(
    cli: &Cli,
    url: &str,
    adapters: usize,
    prompts: &Prompts,
) -> Result<InferdLora> {
    let timeout = Duration::from_secs(cli.request_timeout);
    let target = |adapter: Option<String>| Target::Inferd {
        url: url.to_owned(),
        adapter,
    };
    let base = target(None);
    let one = target(Some(name(0)));
    let mut notes = Vec::new();

    // Loads every adapter before anything is timed.
    eprintln!("inferd-bench: LoRA: warm-up, base and {adapters} adapter(s)");
    measure::warm_up(&base, &prompts.warm_up, timeout).await?;
    for i in 0..adapters {
        measure::warm_up(&target(Some(name(i))), &prompts.warm_up, timeout)
            .await
            .with_context(|| format!("warm-up of adapter {}", name(i)))?;
    }

    // Prefill and decode, the arms alternating (which goes first, too).
    let arms = [&base, &one];
    let mut prefill: [Vec<Prefill>; 2] = [Vec::new(), Vec::new()];
    eprintln!(
        "inferd-bench: LoRA: prefill x{}, base and {}",
        prompts.prefill.len(),
        name(0)
    );
    for (i, p) in prompts.prefill.iter().enumerate() {
        for k in [i % 2, 1 - i % 2] {
            let (f, traces) = measure::prefill(arms[k], std::slice::from_ref(p), timeout).await?;
            check(&mut notes, k, "prefill", &traces[0], p);
            prefill[k].push(f);
        }
    }
    eprintln!(
        "inferd-bench: LoRA: decode {} tokens x{}, base and {}",
        cli.max_tokens,
        cli.decode_reps,
        name(0)
    );
    let mut decode: [Option<(Decode, Trace)>; 2] = [None, None];
    let mut decode_runs: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for i in 0..cli.decode_reps {
        for k in [i % 2, 1 - i % 2] {
            let (d, trace, _) =
                measure::decode(arms[k], &prompts.decode, cli.max_tokens, 1, timeout).await?;
            check(&mut notes, k, "decode", &trace, &prompts.decode);
            decode_runs[k].push(d.tok_per_s);
            if decode[k]
                .as_ref()
                .is_none_or(|(b, _)| d.tok_per_s > b.tok_per_s)
            {
                decode[k] = Some((d, trace));
            }
        }
    }
    let mut singles = Vec::new();
    for k in 0..2 {
        let (d, trace) = decode[k].take().ok_or_else(|| anyhow!("no decode run"))?;
        singles.push(Single {
            prefill: merge_prefill(&prefill[k]),
            prefill_runs_tok_per_s: prefill[k].iter().map(|p| p.tok_per_s).collect(),
            decode: d,
            decode_runs_tok_per_s: std::mem::take(&mut decode_runs[k]),
            decode_finish_reason: trace.finish_reason,
            decode_text: trace.text,
        });
    }
    let adapter = singles.pop().expect("two arms");
    let base_single = singles.pop().expect("two arms");
    if adapter.decode_text == base_single.decode_text {
        notes.push(format!(
            "{}'s greedy decode text equals the base model's: is the adapter applied?",
            name(0)
        ));
    }

    // Concurrent streams: all on lora0, round-robin over the mix, all on the base.
    let n = cli.lora_streams;
    let mix = cli.lora_mix.min(adapters).max(1);
    if mix < cli.lora_mix {
        notes.push(format!(
            "only {adapters} adapter(s): the mixed streams use {mix}, not --lora-mix {}",
            cli.lora_mix
        ));
    }
    let stream_prompts = &prompts.concurrent[..n];
    let plans: [Vec<Option<String>>; 3] = [
        vec![Some(name(0)); n],
        (0..n).map(|i| Some(name(i % mix))).collect(),
        vec![None; n],
    ];
    let what = [
        format!("{n} streams on {}", name(0)),
        format!("{n} streams over {mix} adapters"),
        format!("{n} streams on the base"),
    ];
    let mut best: [Option<(Level, Vec<Trace>)>; 3] = [None, None, None];
    let mut rounds: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..cli.lora_rounds {
        for j in 0..3 {
            let k = (j + round) % 3;
            eprintln!("inferd-bench: LoRA: {}", what[k]);
            let targets: Vec<Target> = plans[k].iter().cloned().map(target).collect();
            let (level, traces) =
                measure::level_on(&targets, stream_prompts, cli.max_tokens, timeout).await?;
            eprintln!(
                "inferd-bench:   {:.1} tok/s aggregate, TTFT {:.0} ms, ITL {:.1} ms",
                level.aggregate_tok_per_s, level.mean_ttft_ms, level.mean_itl_ms
            );
            rounds[k].push(level.aggregate_tok_per_s);
            if best[k]
                .as_ref()
                .is_none_or(|(b, _)| level.aggregate_tok_per_s > b.aggregate_tok_per_s)
            {
                best[k] = Some((level, traces));
            }
        }
    }
    let mut streams = Vec::new();
    for k in 0..3 {
        let (level, traces) = best[k].take().ok_or_else(|| anyhow!("no streams run"))?;
        streams.push(Streams {
            adapters: plans[k].clone(),
            best: level,
            rounds_aggregate_tok_per_s: std::mem::take(&mut rounds[k]),
            texts: traces.into_iter().map(|t| t.text).collect(),
        });
    }
    let base_streams = streams.pop().expect("three arms");
    let mixed = streams.pop().expect("three arms");
    let one_adapter = streams.pop().expect("three arms");
    // A stream of the mix on lora0 should write what the same prompt did with every
    // stream on lora0; one on another adapter should not (each adapter changes most
    // greedy tokens).
    let (mut same0, mut on0, mut differ, mut others) = (0, 0, 0, 0);
    for (i, (a, b)) in mixed.texts.iter().zip(&one_adapter.texts).enumerate() {
        if i % mix == 0 {
            on0 += 1;
            same0 += usize::from(a == b);
        } else {
            others += 1;
            differ += usize::from(a != b);
        }
    }
    if same0 < on0 || differ < others {
        notes.push(format!(
            "mixed streams: {same0} of {on0} on {} wrote the text of the all-{} run, {differ} of \
             {others} on other adapters wrote another (batch composition can move a greedy tie)",
            name(0),
            name(0)
        ));
    }
    let mixed_texts = json!({
        "on_lora0": on0,
        "on_lora0_same_as_all_lora0": same0,
        "on_other_adapters": others,
        "on_other_adapters_different": differ,
    });
    let stats_after = Conn::connect(url).await?.stats().await;
    Ok(InferdLora {
        adapter_files: Vec::new(),
        base: base_single,
        adapter,
        one_adapter,
        mixed,
        base_streams,
        peak_rss_bytes: 0,
        command: String::new(),
        stats_after,
        mixed_texts,
        notes,
    })
}

/// A note when the engine counted another prompt length than the ids.
fn check(notes: &mut Vec<String>, arm: usize, what: &str, trace: &Trace, prompt: &Prompt) {
    if trace.prompt_tokens as usize != prompt.ids.len() {
        notes.push(format!(
            "inferd LoRA {} {what}: prompt_tokens {} but the prompt has {} ids",
            if arm == 0 { "base" } else { "adapter" },
            trace.prompt_tokens,
            prompt.ids.len()
        ));
    }
}

/// llama-server `-np 1 --lora FILE`: prefill and decode by the main section's code.
#[allow(clippy::too_many_arguments)]
pub fn run_peer(
    cli: &Cli,
    llama: &LlamaCpp,
    model: &Path,
    threads: usize,
    ctx: u64,
    out_dir: &Path,
    stem: &str,
    file: &Path,
    prompts: &Prompts,
) -> Result<PeerLora> {
    let timeout = Duration::from_secs(cli.request_timeout);
    let spec = ServerSpec {
        binary: llama.tool("llama-server"),
        model: model.to_path_buf(),
        threads,
        parallel: 1,
        ctx,
        log: out_dir.join(format!("{stem}.llama-server-lora.log")),
        startup_timeout: Duration::from_secs(cli.startup_timeout),
        extra: vec!["--lora".into(), file.display().to_string()],
    };
    let mut server = LlamaServer::start(&spec)?;
    eprintln!(
        "inferd-bench: llama-server --lora: pid {} at {} (log: {})",
        server.pid(),
        server.addr,
        spec.log.display()
    );
    let target = Target::LlamaServer {
        addr: server.addr.clone(),
    };
    let mut notes = Vec::new();
    let runtime = serve::runtime()?;
    let result = runtime.block_on(async {
        measure::warm_up(&target, &prompts.warm_up, timeout).await?;
        serve::measure_engine(
            cli,
            &target,
            prompts,
            &[],
            &mut notes,
            "llama-server --lora",
        )
        .await
    });
    let (mut figures, decode_text, extra) = match result {
        Ok(r) => r,
        Err(e) => {
            server.check_alive().context(e.to_string())?;
            return Err(e);
        }
    };
    figures.peak_rss_bytes = server.peak_rss_bytes()?;
    // What the server says it applies (id, path, scale).
    let adapters = http_client::get(&server.addr, "/lora-adapters", Duration::from_secs(10))
        .ok()
        .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
        .unwrap_or(Value::Null);
    figures.extra = json!({
        "measure": extra,
        "log": server.parse_log(),
        "lora_adapters": adapters,
    });
    let command = server.command.join(" ");
    server.stop();
    Ok(PeerLora {
        figures,
        decode_text,
        command,
        notes,
    })
}

/// One row of the LoRA table: a figure, what it is compared with, their ratio.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub metric: String,
    pub measured: Option<f64>,
    pub against: Option<f64>,
    pub ratio: Option<f64>,
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// The median over repetitions of `a[i] / b[i]`: the two arms ran back to back in each
/// repetition (alternating which went first), so each ratio sees one state of a shared
/// machine whose speed drifts by ±20 % over minutes, where the best of each arm may come
/// from different states.
fn paired_median(a: &[f64], b: &[f64]) -> Option<f64> {
    let mut r: Vec<f64> = a
        .iter()
        .zip(b)
        .filter(|(_, &y)| y > 0.0)
        .map(|(x, y)| x / y)
        .collect();
    if r.is_empty() {
        return None;
    }
    r.sort_by(f64::total_cmp);
    let m = r.len() / 2;
    Some(if r.len() % 2 == 1 {
        r[m]
    } else {
        (r[m - 1] + r[m]) / 2.0
    })
}

fn goal(text: String, measured: Option<f64>, bound: f64) -> Goal {
    let status = match measured {
        None => "n/a",
        Some(m) if m >= bound => "pass",
        Some(_) => "fail",
    };
    Goal {
        goal: text,
        measured,
        bound,
        status: status.to_owned(),
    }
}

/// The table rows and the goals. `plain` is the main section's inferd (no adapters
/// loaded), `peer_base` its llama-server.
pub fn rows_and_goals(
    cli: &Cli,
    run: &InferdLora,
    peer: Option<&PeerLora>,
    plain: &Figures,
    peer_base: Option<&Figures>,
) -> (Vec<Row>, Vec<Goal>) {
    let a = name(0);
    let n = cli.lora_streams;
    let mix = run
        .mixed
        .adapters
        .iter()
        .flatten()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let (ad, base) = (&run.adapter, &run.base);
    let paired = |a: &[f64], b: &[f64]| (paired_median(a, b), a.len().min(b.len()));
    let (paired_prefill, prefill_pairs) =
        paired(&ad.prefill_runs_tok_per_s, &base.prefill_runs_tok_per_s);
    let (paired_decode, decode_pairs) =
        paired(&ad.decode_runs_tok_per_s, &base.decode_runs_tok_per_s);
    let mut rows = Vec::new();
    let mut push = |metric: String, m: Option<f64>, b: Option<f64>| {
        rows.push(Row {
            metric,
            measured: m,
            against: b,
            ratio: ratio(m, b),
        });
    };
    push(
        format!(
            "prefill tok/s ({} tok): {a} / base",
            ad.prefill.prompt_tokens
        ),
        Some(ad.prefill.tok_per_s),
        Some(base.prefill.tok_per_s),
    );
    push(
        format!("decode tok/s: {a} / base"),
        Some(ad.decode.tok_per_s),
        Some(base.decode.tok_per_s),
    );
    push(
        format!("decode tokens: {a} / base"),
        Some(ad.decode.tokens as f64),
        Some(base.decode.tokens as f64),
    );
    push(
        format!("prefill tok/s: {a} / base, daemon without adapters"),
        Some(ad.prefill.tok_per_s),
        Some(plain.prefill.tok_per_s),
    );
    push(
        format!("decode tok/s: {a} / base, daemon without adapters"),
        Some(ad.decode.tok_per_s),
        Some(plain.decode.tok_per_s),
    );
    let (one, mixed, bs) = (
        &run.one_adapter.best,
        &run.mixed.best,
        &run.base_streams.best,
    );
    push(
        format!("aggregate tok/s @{n}: {mix} adapters / all {a}"),
        Some(mixed.aggregate_tok_per_s),
        Some(one.aggregate_tok_per_s),
    );
    push(
        format!("aggregate tok/s @{n}: all {a} / base"),
        Some(one.aggregate_tok_per_s),
        Some(bs.aggregate_tok_per_s),
    );
    push(
        format!("mean ITL ms @{n}: {mix} adapters / all {a}"),
        Some(mixed.mean_itl_ms),
        Some(one.mean_itl_ms),
    );
    let pf = peer.map(|p| &p.figures);
    push(
        format!("prefill tok/s: inferd {a} / llama-server --lora"),
        Some(ad.prefill.tok_per_s),
        pf.map(|f| f.prefill.tok_per_s),
    );
    push(
        format!("decode tok/s: inferd {a} / llama-server --lora"),
        Some(ad.decode.tok_per_s),
        pf.map(|f| f.decode.tok_per_s),
    );
    push(
        "decode tokens: inferd / llama-server --lora".into(),
        Some(ad.decode.tokens as f64),
        pf.map(|f| f.decode.tokens as f64),
    );
    push(
        "prefill tok/s: llama-server --lora / base".into(),
        pf.map(|f| f.prefill.tok_per_s),
        peer_base.map(|f| f.prefill.tok_per_s),
    );
    push(
        "decode tok/s: llama-server --lora / base".into(),
        pf.map(|f| f.decode.tok_per_s),
        peer_base.map(|f| f.decode.tok_per_s),
    );
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    push(
        format!(
            "peak RSS MiB: inferd with {} adapter(s) / without",
            run.adapter_files.len()
        ),
        Some(mib(run.peak_rss_bytes)),
        Some(mib(plain.peak_rss_bytes)),
    );
    push(
        "peak RSS MiB: llama-server --lora -np 1 / inferd with adapters".into(),
        pf.map(|f| mib(f.peak_rss_bytes)),
        Some(mib(run.peak_rss_bytes)),
    );
    // The paired medians beside the best-of rows they qualify.
    for (at, what, r, pairs) in [
        (2, "prefill", paired_prefill, prefill_pairs),
        (3, "decode", paired_decode, decode_pairs),
    ] {
        rows.insert(
            at,
            Row {
                metric: format!("{what}: {a} / base, median of {pairs} back-to-back pairs"),
                measured: None,
                against: None,
                ratio: r,
            },
        );
    }
    let goals = vec![
        goal(
            "LoRA single-stream decode >= 0.85x base (paired median)".into(),
            paired_decode,
            0.85,
        ),
        goal(
            "LoRA prefill >= 0.8x base (paired median)".into(),
            paired_prefill,
            0.8,
        ),
        goal(
            format!("{n} streams over {mix} adapters >= 0.8x {n} streams on one adapter"),
            ratio(
                Some(mixed.aggregate_tok_per_s),
                Some(one.aggregate_tok_per_s),
            ),
            0.8,
        ),
        goal(
            "LoRA decode >= 1.2x llama-server --lora".into(),
            ratio(Some(ad.decode.tok_per_s), pf.map(|f| f.decode.tok_per_s)),
            1.2,
        ),
        goal(
            "LoRA prefill >= 1.0x llama-server --lora".into(),
            ratio(Some(ad.prefill.tok_per_s), pf.map(|f| f.prefill.tok_per_s)),
            1.0,
        ),
    ];
    (rows, goals)
}

/// The table and the goals as text.
pub fn render(run: &InferdLora, rows: &[Row], goals: &[Goal]) -> String {
    let mut out = String::from(
        "\nLoRA (inferd requests name the adapter; same daemon for base and adapters):\n",
    );
    for (i, f) in run.adapter_files.iter().enumerate() {
        out.push_str(&format!("  {} = {}\n", name(i), f.display()));
    }
    out.push('\n');
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.metric.clone(),
                report::cell(r.measured),
                report::cell(r.against),
                r.ratio.map_or("-".into(), |x| format!("{x:.2}x")),
            ]
        })
        .collect();
    out.push_str(&report::table(
        &[("metric", 0), ("measured", 9), ("against", 9), ("ratio", 6)],
        &cells,
    ));
    let lines: Vec<(String, String, String)> = goals
        .iter()
        .map(|g| {
            (
                g.status.clone(),
                g.goal.clone(),
                g.measured.map_or("-".into(), |x| format!("{x:.2}x")),
            )
        })
        .collect();
    out.push_str(&report::goal_list("LoRA goals:", &lines));
    out
}

/// The section's JSON.
pub fn to_json(
    run: &InferdLora,
    peer: Option<&PeerLora>,
    peer_error: Option<&str>,
    rows: &[Row],
    goals: &[Goal],
) -> Value {
    json!({
        "adapters": run.adapter_files.iter().enumerate()
            .map(|(i, f)| json!({"name": name(i), "file": f}))
            .collect::<Vec<_>>(),
        "commands": {
            "inferd": run.command,
            "llama_server": peer.map(|p| &p.command),
        },
        "inferd": {
            "base": run.base,
            "adapter": run.adapter,
            "streams_one_adapter": run.one_adapter,
            "streams_mixed": run.mixed,
            "streams_base": run.base_streams,
            "peak_rss_bytes": run.peak_rss_bytes,
            "stats_after": run.stats_after,
            "mixed_texts": run.mixed_texts,
        },
        "peer": peer.map(|p| &p.figures),
        "peer_error": peer_error,
        "decode_texts": {
            "inferd_base": run.base.decode_text,
            "inferd_adapter": run.adapter.decode_text,
            "llama_server_lora": peer.map(|p| &p.decode_text),
            "adapter_equal": peer.map(|p| p.decode_text == run.adapter.decode_text),
        },
        "table": rows,
        "goals": goals,
        "notes": run.notes.iter().chain(peer.iter().flat_map(|p| p.notes.iter())).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn single(prefill: f64, decode: f64) -> Single {
        Single {
            prefill: Prefill {
                prompt_tokens: 512,
                ttft_ms: vec![100.0],
                tok_per_s: prefill,
            },
            prefill_runs_tok_per_s: vec![prefill],
            decode: Decode {
                prompt_tokens: 20,
                tokens: 64,
                span_s: 1.0,
                tok_per_s: decode,
                ttft_ms: 10.0,
            },
            decode_runs_tok_per_s: vec![decode],
            decode_finish_reason: "length".into(),
            decode_text: String::new(),
        }
    }

    fn streams(agg: f64, adapters: Vec<Option<String>>) -> Streams {
        Streams {
            adapters,
            best: Level {
                n: 16,
                tokens: 1024,
                wall_s: 1.0,
                aggregate_tok_per_s: agg,
                mean_ttft_ms: 1.0,
                max_ttft_ms: 1.0,
                mean_itl_ms: 1.0,
                p50_itl_ms: 1.0,
                p99_itl_ms: 1.0,
                short_streams: 0,
            },
            rounds_aggregate_tok_per_s: vec![agg],
            texts: Vec::new(),
        }
    }

    fn figures(prefill: f64, decode: f64) -> Figures {
        let s = single(prefill, decode);
        Figures {
            prefill: s.prefill,
            decode: s.decode,
            concurrency: Vec::new(),
            peak_rss_bytes: 1 << 20,
            extra: Value::Null,
        }
    }

    /// The vs-base goals take the median of the back-to-back ratios, not the ratio of
    /// each arm's best repetition (here 800 / 1000 = 0.8 from different machine states).
    #[test]
    fn paired_repetitions_give_the_median_ratio() {
        let near = |m: Option<f64>, want: f64| m.is_some_and(|m| (m - want).abs() < 1e-12);
        let m = paired_median(&[800.0, 540.0, 450.0], &[1000.0, 600.0, 500.0]);
        assert!(near(m, 0.9), "{m:?}");
        let m = paired_median(&[800.0, 540.0], &[1000.0, 600.0]);
        assert!(near(m, 0.85), "{m:?}");
        assert_eq!(paired_median(&[1.0], &[0.0]), None);
        assert_eq!(paired_median(&[], &[]), None);
    }

    #[test]
    fn goals_of_the_section() {
        let cli = <Cli as clap::Parser>::parse_from(["inferd-bench", "--lora-make", "4"]);
        let run = InferdLora {
            adapter_files: (0..4)
                .map(|i| PathBuf::from(format!("a{i}.gguf")))
                .collect(),
            base: single(1000.0, 100.0),
            // decode 0.9x (pass), prefill 0.7x (fail)
            adapter: single(700.0, 90.0),
            one_adapter: streams(300.0, vec![Some(name(0)); 16]),
            // 0.85x (pass)
            mixed: streams(255.0, (0..16).map(|i| Some(name(i % 4))).collect()),
            base_streams: streams(330.0, vec![None; 16]),
            peak_rss_bytes: 2 << 20,
            command: String::new(),
            stats_after: None,
            mixed_texts: Value::Null,
            notes: Vec::new(),
        };
        let (rows, goals) = rows_and_goals(&cli, &run, None, &figures(1000.0, 100.0), None);
        let status: Vec<&str> = goals.iter().map(|g| g.status.as_str()).collect();
        assert_eq!(status, ["pass", "fail", "pass", "n/a", "n/a"]);
        assert!(goals[2].goal.starts_with("16 streams over 4 adapters"));
        let peer = PeerLora {
            // inferd decode 90 / 75 = 1.2x (pass), prefill 700 / 800 (fail)
            figures: figures(800.0, 75.0),
            decode_text: String::new(),
            command: String::new(),
            notes: Vec::new(),
        };
        let (_, goals) = rows_and_goals(&cli, &run, Some(&peer), &figures(1000.0, 100.0), None);
        let status: Vec<&str> = goals.iter().map(|g| g.status.as_str()).collect();
        assert_eq!(status, ["pass", "fail", "pass", "pass", "fail"]);
        let text = render(&run, &rows, &goals);
        assert!(text.contains("prefill: lora0 / base, median of 1 back-to-back pairs"));
        assert!(rows[3]
            .metric
            .starts_with("decode: lora0 / base, median of 1"));
        assert!(text.contains("lora3 = a3.gguf"));
        assert!(text.contains("aggregate tok/s @16: 4 adapters / all lora0"));
        assert!(text.contains("LoRA goals:"));
    }
}
