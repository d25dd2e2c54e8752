//! llama.cpp's side of the speculative scenario: native `llama-server` on the same file
//! and threads, twice at once on the same prompts (their ChatML ids): one without
//! speculation and one with n-gram speculation, `--spec-type ngram-simple` (the last
//! `size-n` tokens are looked up in the prompt and the output so far, the `size-m`
//! tokens after the most recent earlier occurrence are the draft: prompt lookup decoding
//! with one n-gram length). Requests alternate between the two servers as inferd's arms
//! alternate, one request at a time (the idle server's CPU time during each request is
//! recorded); a pair with `-np 1` serves the single-stream prompts, a pair with `-np N`
//! the concurrent streams.
//!
//! Draft counters come from each final event's `timings` (`draft_n`,
//! `draft_n_accepted`); verification steps from the server's log line `draft acceptance
//! = … (A accepted / G generated), mean len = L` (L = 1 + A / steps, two decimals).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::client::Trace;
use crate::completion;
use crate::daemon::proc_cpu_ticks;
use crate::http_client;
use crate::llama_cpp::LlamaCpp;
use crate::llama_server::{LlamaServer, ServerSpec};
use crate::spec_figures::{arm_order, Drafts, Round, Run};
use crate::speculative::{arm_name, together, ChatPrompt, Settings};

/// How to run the two servers.
pub struct PeerSpec<'a> {
    pub llama: &'a LlamaCpp,
    pub model: &'a Path,
    pub threads: usize,
    /// `-c` of every server.
    pub ctx: u64,
    pub out_dir: &'a Path,
    pub startup_timeout: Duration,
    /// The speculation arguments of the n-gram server ([`spec_args`]).
    pub spec_args: Vec<String>,
}

/// What llama.cpp measured.
pub struct PeerPhase {
    pub runs: Vec<Run>,
    pub rounds: Vec<Round>,
    pub commands: Vec<String>,
    pub servers: Vec<Value>,
    pub notes: Vec<String>,
}

/// The n-gram server's arguments: `ngram-simple` looking up `n` tokens and drafting up
/// to `k` (`--spec-draft-n-max`, the cap of draft-model drafts, is set to `k` as well;
/// ngram-simple's drafts are capped by `size-m`).
pub fn spec_args(n: usize, k: usize) -> Vec<String> {
    [
        ("--spec-type", "ngram-simple".to_owned()),
        ("--spec-ngram-simple-size-n", n.to_string()),
        ("--spec-ngram-simple-size-m", k.to_string()),
        ("--spec-draft-n-max", k.to_string()),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_owned(), value])
    .collect()
}

/// One `draft acceptance` line of a llama-server log.
#[derive(Debug, Clone, Copy, PartialEq)]
struct DraftLine {
    accepted: u64,
    generated: u64,
    mean_len: f64,
}

impl DraftLine {
    /// Verification steps: `accepted / (mean_len − 1)`; unknown when nothing was
    /// accepted (then `mean_len` is 1 whatever the steps).
    fn steps(&self) -> Option<u64> {
        (self.accepted > 0 && self.mean_len > 1.0)
            .then(|| (self.accepted as f64 / (self.mean_len - 1.0)).round() as u64)
    }
}

/// `draft acceptance = 0.50000 (   10 accepted /    20 generated), mean len =  1.50`.
fn parse_draft_line(line: &str) -> Option<DraftLine> {
    let rest = line.split("draft acceptance =").nth(1)?;
    let inner = rest.split('(').nth(1)?;
    let accepted = inner.split("accepted").next()?.trim().parse().ok()?;
    let generated = inner
        .split('/')
        .nth(1)?
        .split("generated")
        .next()?
        .trim()
        .parse()
        .ok()?;
    let mean_len = rest
        .split("mean len =")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(DraftLine {
        accepted,
        generated,
        mean_len,
    })
}

/// The `draft acceptance` lines of `log` after byte `offset`.
fn draft_lines(log: &Path, offset: u64) -> Vec<DraftLine> {
    let text = std::fs::read(log).unwrap_or_default();
    let start = (offset as usize).min(text.len());
    String::from_utf8_lossy(&text[start..])
        .lines()
        .filter_map(parse_draft_line)
        .collect()
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// `draft_n`, `draft_n_accepted` of a final event's timings (absent: 0).
fn timing_drafts(trace: &Trace) -> (u64, u64) {
    let t = &trace.engine_timings;
    (
        t["draft_n"].as_u64().unwrap_or(0),
        t["draft_n_accepted"].as_u64().unwrap_or(0),
    )
}

/// Draft counters of the requests `traces` from their timings and the log lines after
/// `offset` (each matched to a line with its accepted and generated counts). The server
/// writes the line before its final event, through its log thread, so this retries for
/// a moment.
async fn drafts_of(traces: &[&Trace], log: &Path, offset: u64) -> Vec<Drafts> {
    let want = traces.iter().filter(|t| timing_drafts(t).0 > 0).count();
    let mut lines = Vec::new();
    for _ in 0..20 {
        lines = draft_lines(log, offset);
        if lines.len() >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    traces
        .iter()
        .map(|t| {
            let (generated, accepted) = timing_drafts(t);
            let steps = if generated == 0 {
                Some(0)
            } else {
                lines
                    .iter()
                    .position(|l| l.generated == generated && l.accepted == accepted)
                    .and_then(|i| lines.remove(i).steps())
            };
            Drafts {
                draft_tokens: Some(generated),
                accepted_tokens: Some(accepted),
                verification_steps: steps,
            }
        })
        .collect()
}

/// The two servers of one `-np`.
struct Pair {
    off: LlamaServer,
    on: LlamaServer,
}

impl Pair {
    fn start(spec: &PeerSpec, np: usize, commands: &mut Vec<String>) -> Result<Pair> {
        let server = |on: bool| -> Result<LlamaServer> {
            let stem = spec
                .model
                .file_stem()
                .map_or("model".into(), |s| s.to_string_lossy().into_owned());
            let s = ServerSpec {
                binary: spec.llama.tool("llama-server"),
                model: spec.model.to_path_buf(),
                threads: spec.threads,
                parallel: np,
                ctx: spec.ctx,
                log: spec.out_dir.join(format!(
                    "{stem}.speculative.llama-server-{}-np{np}.log",
                    if on { "ngram" } else { "off" }
                )),
                startup_timeout: spec.startup_timeout,
                extra: if on {
                    spec.spec_args.clone()
                } else {
                    Vec::new()
                },
            };
            let server = LlamaServer::start(&s)?;
            eprintln!(
                "inferd-bench: llama-server -np {np} speculation {}: pid {} at {} (log: {})",
                arm_name(on),
                server.pid(),
                server.addr,
                s.log.display()
            );
            Ok(server)
        };
        let pair = Pair {
            off: server(false)?,
            on: server(true)?,
        };
        commands.push(pair.off.command.join(" "));
        commands.push(pair.on.command.join(" "));
        Ok(pair)
    }

    fn server(&self, on: bool) -> &LlamaServer {
        if on {
            &self.on
        } else {
            &self.off
        }
    }

    fn check_alive(&mut self) -> Result<()> {
        self.off.check_alive()?;
        self.on.check_alive()
    }

    /// Each server's command, peak RSS and `/props` for the JSON; then stops both.
    fn finish(mut self, np: usize) -> Vec<Value> {
        let mut out = Vec::new();
        for on in [false, true] {
            let s = self.server(on);
            let props = s.props();
            out.push(json!({
                "np": np,
                "speculative": on,
                "pid": s.pid(),
                "command": s.command.join(" "),
                "log": s.log_path(),
                "peak_rss_bytes": s.peak_rss_bytes().ok(),
                "props": {
                    "total_slots": props["total_slots"],
                    "n_ctx_slot": props["default_generation_settings"]["n_ctx"],
                    "speculative": props["default_generation_settings"]["speculative.types"],
                    "build_info": props["build_info"],
                },
            }));
        }
        self.off.stop();
        self.on.stop();
        out
    }
}

/// CPU seconds of `pid` between two tick readings.
fn cpu_s(before: Option<u64>, pid: u32) -> Option<f64> {
    Some(proc_cpu_ticks(pid).ok()?.saturating_sub(before?) as f64 / 100.0)
}

/// Runs both pairs; the servers are stopped before it returns.
pub fn run(
    spec: &PeerSpec,
    settings: &Settings,
    prompts: &[ChatPrompt],
    stream_prompts: &[ChatPrompt],
) -> Result<PeerPhase> {
    let runtime = crate::speculative::runtime()?;
    let mut phase = PeerPhase {
        runs: Vec::new(),
        rounds: Vec::new(),
        commands: Vec::new(),
        servers: Vec::new(),
        notes: Vec::new(),
    };
    let mut pair = Pair::start(spec, 1, &mut phase.commands)?;
    let result = runtime.block_on(single_streams(&pair, prompts, settings, &mut phase));
    if let Err(e) = result {
        pair.check_alive().context(e.to_string())?;
        return Err(e);
    }
    phase.servers.extend(pair.finish(1));
    if settings.streams > 0 && !stream_prompts.is_empty() {
        let np = stream_prompts.len();
        let mut pair = Pair::start(spec, np, &mut phase.commands)?;
        let result = runtime.block_on(concurrent(&pair, stream_prompts, settings));
        match result {
            Ok(rounds) => phase.rounds = rounds,
            Err(e) => {
                pair.check_alive().context(e.to_string())?;
                return Err(e);
            }
        }
        phase.servers.extend(pair.finish(np));
    }
    Ok(phase)
}

async fn warm_up(pair: &Pair, prompt: &ChatPrompt, timeout: Duration) -> Result<()> {
    for on in [false, true] {
        completion::generate(&pair.server(on).addr, None, &prompt.ids, 8, timeout).await?;
    }
    Ok(())
}

/// The same schedule as inferd's: every prompt `reps` times on each server, the order
/// within a pair alternating with the repetition and the prompt.
async fn single_streams(
    pair: &Pair,
    prompts: &[ChatPrompt],
    settings: &Settings,
    phase: &mut PeerPhase,
) -> Result<()> {
    let Some(first) = prompts.first() else {
        return Ok(());
    };
    eprintln!("inferd-bench: llama-server warm-up");
    warm_up(pair, first, settings.timeout).await?;
    let (mut off_timing, mut busy_twin) = (0, 0.0f64);
    for rep in 0..settings.reps {
        for (j, p) in prompts.iter().enumerate() {
            let order = arm_order(rep + j);
            let mut pair_runs: Vec<Run> = Vec::new();
            for on in order {
                let (server, twin) = (pair.server(on), pair.server(!on));
                let offset = file_len(server.log_path());
                let twin_ticks = proc_cpu_ticks(twin.pid()).ok();
                let trace = completion::generate(
                    &server.addr,
                    None,
                    &p.ids,
                    settings.max_tokens,
                    settings.timeout,
                )
                .await?;
                let twin_cpu_s = cpu_s(twin_ticks, twin.pid());
                busy_twin = busy_twin.max(twin_cpu_s.unwrap_or(0.0));
                let drafts = drafts_of(&[&trace], server.log_path(), offset).await;
                let mut run = Run::new(&p.prompt.name, on, rep, &trace, drafts[0], Value::Null);
                // The client's decode rate against the server's own (tokens after the
                // first over the generation time): a gap is the transport's.
                let server_rate = trace.engine_timings["predicted_per_second"].as_f64();
                let client_over_server =
                    server_rate.filter(|&s| s > 0.0).map(|s| run.tok_per_s / s);
                if client_over_server.is_some_and(|r| (r - 1.0).abs() > 0.05) {
                    off_timing += 1;
                }
                run.extra = json!({
                    "timings": trace.engine_timings,
                    "client_over_server_decode": client_over_server,
                    "idle_twin_cpu_s": twin_cpu_s,
                });
                crate::speculative::log_run("llama-server", &run);
                pair_runs.push(run);
            }
            if pair_runs[0].token_ids != pair_runs[1].token_ids {
                eprintln!(
                    "inferd-bench: MISMATCH: llama-server {} rep {rep}: the token ids with and \
                     without speculation differ",
                    p.prompt.name
                );
            }
            phase.runs.extend(pair_runs);
        }
    }
    if off_timing > 0 {
        phase.notes.push(format!(
            "llama-server: in {off_timing} of {} runs the client's decode rate differs by more \
             than 5 % from the server's own timings (runs[].extra.client_over_server_decode)",
            phase.runs.len()
        ));
    }
    if busy_twin > 0.1 {
        phase.notes.push(format!(
            "llama-server: the idle server of the pair used up to {busy_twin:.2} CPU s during a \
             request of the other (runs[].extra.idle_twin_cpu_s)"
        ));
    }
    Ok(())
}

/// The concurrent streams, `settings.rounds` rounds on each server in ABBA order.
async fn concurrent(
    pair: &Pair,
    prompts: &[ChatPrompt],
    settings: &Settings,
) -> Result<Vec<Round>> {
    let n = prompts.len();
    warm_up(pair, &prompts[0], settings.timeout).await?;
    let mut rounds = Vec::new();
    for round in 0..settings.rounds {
        let order = arm_order(round);
        for on in order {
            eprintln!(
                "inferd-bench: llama-server: {n} streams, round {round}, speculation {}",
                arm_name(on)
            );
            let (server, twin) = (pair.server(on), pair.server(!on));
            let addr = server.addr.clone();
            let mut socks = Vec::with_capacity(n);
            for _ in 0..n {
                socks.push(http_client::connect(&addr).await?);
            }
            let offset = file_len(server.log_path());
            let twin_ticks = proc_cpu_ticks(twin.pid()).ok();
            let ids: Vec<Vec<u32>> = prompts.iter().map(|p| p.ids.clone()).collect();
            let (max_tokens, timeout) = (settings.max_tokens, settings.timeout);
            let traces =
                together(socks, |i, sock| {
                    let (addr, ids) = (addr.clone(), ids[i].clone());
                    async move {
                        completion::generate(&addr, Some(sock), &ids, max_tokens, timeout).await
                    }
                })
                .await?;
            let twin_cpu_s = cpu_s(twin_ticks, twin.pid());
            let refs: Vec<&Trace> = traces.iter().collect();
            let drafts = drafts_of(&refs, server.log_path(), offset).await;
            let runs: Vec<Run> = traces
                .iter()
                .zip(prompts)
                .zip(&drafts)
                .enumerate()
                .map(|(i, ((t, p), d))| {
                    let name = format!("s{i}:{}", p.prompt.name);
                    Run::new(
                        &name,
                        on,
                        round,
                        t,
                        *d,
                        json!({"timings": t.engine_timings}),
                    )
                })
                .collect();
            let r = Round::new(
                round,
                on,
                max_tokens,
                &traces,
                runs,
                Drafts::total(&drafts),
                json!({"idle_twin_cpu_s": twin_cpu_s}),
            );
            eprintln!(
                "inferd-bench:   {:.1} tok/s aggregate, {} tokens",
                r.level.aggregate_tok_per_s, r.level.tokens
            );
            rounds.push(r);
        }
    }
    Ok(rounds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_draft_acceptance_line() {
        let line = "slot print_timing: id  0 | task 12 | draft acceptance = 0.50000 (   10 \
                    accepted /    20 generated), mean len =  1.50";
        let l = parse_draft_line(line).unwrap();
        assert_eq!((l.accepted, l.generated), (10, 20));
        assert_eq!(l.mean_len, 1.5);
        assert_eq!(l.steps(), Some(20));
        assert_eq!(parse_draft_line("prompt eval time = 1 ms"), None);
        let none = DraftLine {
            accepted: 0,
            generated: 5,
            mean_len: 1.0,
        };
        assert_eq!(none.steps(), None);
    }

    #[test]
    fn spec_args_name_ngram_simple() {
        assert_eq!(
            spec_args(3, 5).join(" "),
            "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 5 \
             --spec-draft-n-max 5"
        );
    }
}
