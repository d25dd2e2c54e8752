//! inferd's side of the speculative scenario: one daemon; every prompt is sent with
//! `"speculative": true` and with `"speculative": false` in turn, so both arms run in the
//! same process under the same noise. Draft counters come from each `done` frame's
//! `usage` (`draft_tokens`, `accepted_draft_tokens`) and verification steps from the
//! increase of the `stats` reply's `speculative.verification_steps` over the request
//! (or round); a daemon without them leaves them unknown.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::client::{Conn, Trace};
use crate::daemon::{Daemon, DaemonSpec};
use crate::spec_figures::{arm_order, Drafts, Round, Run};
use crate::spec_prompts::{PromptText, SYSTEM};
use crate::speculative::{arm_name, together, ChatPrompt, Settings, SEED};

/// What inferd measured.
pub struct InferdPhase {
    /// The single-stream prompts and the concurrent streams' prompts, with the ids
    /// llama-server gets.
    pub prompts: Vec<ChatPrompt>,
    pub stream_prompts: Vec<ChatPrompt>,
    pub runs: Vec<Run>,
    pub rounds: Vec<Round>,
    /// Whether the daemon accepts `"speculative"` in a `generate` (an older one refuses
    /// the field; both arms then run with the daemon's setting).
    pub flag_accepted: bool,
    pub stats_start: Option<Value>,
    pub stats_end: Option<Value>,
    pub peak_rss_bytes: u64,
    pub command: String,
    pub notes: Vec<String>,
}

/// The daemon at `url` and how requests are sent to it.
struct Client {
    url: String,
    flag_accepted: bool,
    timeout: Duration,
}

impl Client {
    /// A chat `generate` of `prompt` (system message [`SYSTEM`]), greedy, seeded, with
    /// `"speculative": on` when the daemon accepts the field.
    fn frame(&self, id: &str, prompt: &PromptText, max_tokens: u64, on: bool) -> Value {
        let mut frame = json!({
            "type": "generate", "id": id,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": prompt.user},
            ],
            "max_tokens": max_tokens, "temperature": 0, "seed": SEED,
        });
        if self.flag_accepted {
            frame["speculative"] = json!(on);
        }
        frame
    }

    /// One request on a new connection.
    async fn generate(
        &self,
        id: &str,
        prompt: &PromptText,
        max_tokens: u64,
        on: bool,
    ) -> Result<Trace> {
        let mut conn = Conn::connect(&self.url).await?;
        let frame = self.frame(id, prompt, max_tokens, on);
        conn.generate_frame(id, &frame, self.timeout).await
    }

    async fn stats(&self) -> Option<Value> {
        Conn::connect(&self.url).await.ok()?.stats().await
    }
}

/// `stats.speculative.KEY`.
fn spec_counter(stats: &Option<Value>, key: &str) -> Option<u64> {
    stats.as_ref()?["speculative"][key].as_u64()
}

/// Increase of `stats.speculative.KEY` from `before` to `after`.
fn delta(before: &Option<Value>, after: &Option<Value>, key: &str) -> Option<u64> {
    Some(spec_counter(after, key)?.saturating_sub(spec_counter(before, key)?))
}

fn stats_delta(before: &Option<Value>, after: &Option<Value>) -> Value {
    json!({
        "draft_tokens": delta(before, after, "draft_tokens"),
        "accepted_tokens": delta(before, after, "accepted_tokens"),
        "verification_steps": delta(before, after, "verification_steps"),
    })
}

/// Draft counters of one request's `usage` (steps unknown).
fn usage_drafts(trace: &Trace) -> Drafts {
    Drafts {
        draft_tokens: trace.usage["draft_tokens"].as_u64(),
        accepted_tokens: trace.usage["accepted_draft_tokens"].as_u64(),
        verification_steps: None,
    }
}

/// Starts the daemon, measures it, stops it.
pub fn run(spec: &DaemonSpec, settings: &Settings, bos: Option<u32>) -> Result<InferdPhase> {
    let mut daemon = Daemon::start(spec)?;
    eprintln!(
        "inferd-bench: daemon pid {} at {} (log: {})",
        daemon.pid(),
        daemon.url,
        spec.log.display()
    );
    let runtime = crate::speculative::runtime()?;
    let measured = runtime.block_on(measure(&daemon.url, settings, bos));
    let mut phase = match measured {
        Ok(p) => p,
        Err(e) => {
            daemon.check_alive().context(e.to_string())?;
            return Err(e);
        }
    };
    phase.peak_rss_bytes = daemon.peak_rss_bytes()?;
    daemon.stop();
    phase.command = spec.command_line();
    Ok(phase)
}

/// Whether the daemon accepts `"speculative"` (one short request with it; an error
/// naming the field means no). Also the process's first request (a warm-up).
async fn probe(url: &str, timeout: Duration) -> Result<bool> {
    let mut conn = Conn::connect(url).await?;
    let frame = json!({
        "type": "generate", "id": "probe",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Hello"},
        ],
        "max_tokens": 8, "temperature": 0, "speculative": false,
    });
    match conn.generate_frame("probe", &frame, timeout).await {
        Ok(_) => Ok(true),
        Err(e) if format!("{e:#}").contains("speculative") => Ok(false),
        Err(e) => Err(e),
    }
}

/// Renders and tokenizes `texts` (ChatML with special tokens).
async fn chat_prompts(conn: &mut Conn, texts: Vec<PromptText>) -> Result<Vec<ChatPrompt>> {
    let mut out = Vec::with_capacity(texts.len());
    for prompt in texts {
        let text = crate::prefix::chatml(SYSTEM, &prompt.user);
        let ids = conn.tokenize_with(&text, true).await?;
        out.push(ChatPrompt { prompt, text, ids });
    }
    Ok(out)
}

/// Sends every prompt once (`max_tokens` 1) and checks that inferd's chat prompt has as
/// many tokens as the ChatML rendering llama-server gets; when inferd adds a BOS the ids
/// get it too.
async fn check_prompts(
    client: &Client,
    prompts: &mut [ChatPrompt],
    bos: Option<u32>,
    seen: &mut HashMap<String, u64>,
    notes: &mut Vec<String>,
) -> Result<()> {
    for p in prompts {
        let n = match seen.get(&p.prompt.name) {
            Some(&n) => n,
            None => {
                let t = client.generate("check", &p.prompt, 1, false).await?;
                seen.insert(p.prompt.name.clone(), t.prompt_tokens);
                t.prompt_tokens
            }
        };
        match bos {
            Some(b) if n as usize == p.ids.len() + 1 => p.ids.insert(0, b),
            _ if n as usize != p.ids.len() => notes.push(format!(
                "{}: inferd's chat prompt has {n} tokens, its ChatML rendering {} (llama.cpp \
                 gets the rendering)",
                p.prompt.name,
                p.ids.len()
            )),
            _ => {}
        }
    }
    Ok(())
}

async fn measure(url: &str, settings: &Settings, bos: Option<u32>) -> Result<InferdPhase> {
    let mut notes = Vec::new();
    let stats_start = Conn::connect(url).await?.stats().await;
    eprintln!("inferd-bench: inferd warm-up");
    let flag_accepted = probe(url, settings.timeout).await?;
    if !flag_accepted {
        notes.push(
            "the daemon refuses \"speculative\" in a generate (an older daemon?): both arms ran \
             with its own setting"
                .into(),
        );
    }
    match stats_start.as_ref().map(|s| &s["speculative"]) {
        None | Some(Value::Null) => notes.push(
            "the daemon's stats have no \"speculative\" object (an older daemon?): no \
             verification steps"
                .into(),
        ),
        Some(s) if s["method"].as_str() == Some("off") => notes.push(
            "the daemon runs with speculative.method = \"off\": the arms do not differ".into(),
        ),
        Some(_) => {}
    }
    let client = Client {
        url: url.to_owned(),
        flag_accepted,
        timeout: settings.timeout,
    };
    let mut conn = Conn::connect(url).await?;
    let mut prompts = chat_prompts(&mut conn, crate::spec_prompts::single_stream()).await?;
    let mut stream_prompts =
        chat_prompts(&mut conn, crate::spec_prompts::streams(settings.streams)).await?;
    let mut seen = HashMap::new();
    check_prompts(&client, &mut prompts, bos, &mut seen, &mut notes).await?;
    check_prompts(&client, &mut stream_prompts, bos, &mut seen, &mut notes).await?;
    let pool = stats_start
        .as_ref()
        .and_then(|s| Some(s["kv_blocks_total"].as_u64()? * s["kv_block_size"].as_u64()?));
    let need: u64 = stream_prompts
        .iter()
        .map(|p| p.ids.len() as u64 + settings.max_tokens)
        .sum();
    if let Some(pool) = pool.filter(|&p| p < need) {
        notes.push(format!(
            "the KV pool holds {pool} tokens, the {} streams need up to {need}: some may be \
             preempted (raise INFERD__SCHEDULER__KV_CACHE_BYTES or --kv-bytes)",
            settings.streams
        ));
    }

    let runs = single_streams(&client, &prompts, settings, &mut notes).await?;
    let rounds = if settings.streams > 0 {
        concurrent(&client, &stream_prompts, settings).await?
    } else {
        Vec::new()
    };
    let stats_end = client.stats().await;
    Ok(InferdPhase {
        prompts,
        stream_prompts,
        runs,
        rounds,
        flag_accepted,
        stats_start,
        stats_end,
        peak_rss_bytes: 0,
        command: String::new(),
        notes,
    })
}

/// Every prompt `reps` times with speculation on and off, one request at a time; the
/// order within a pair alternates with the repetition and the prompt.
async fn single_streams(
    client: &Client,
    prompts: &[ChatPrompt],
    settings: &Settings,
    notes: &mut Vec<String>,
) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    let mut counters_differ = false;
    for rep in 0..settings.reps {
        for (j, p) in prompts.iter().enumerate() {
            let order = arm_order(rep + j);
            let mut pair: Vec<Run> = Vec::new();
            for on in order {
                let before = client.stats().await;
                let id = format!("{}-{}-{rep}", p.prompt.name, arm_name(on));
                let trace = client
                    .generate(&id, &p.prompt, settings.max_tokens, on)
                    .await?;
                let after = client.stats().await;
                let mut drafts = usage_drafts(&trace);
                drafts.verification_steps = delta(&before, &after, "verification_steps");
                let stats_drafts = delta(&before, &after, "draft_tokens");
                if stats_drafts.is_some() && stats_drafts != drafts.draft_tokens {
                    counters_differ = true;
                }
                let run = Run::new(
                    &p.prompt.name,
                    on,
                    rep,
                    &trace,
                    drafts,
                    json!({"usage": trace.usage, "stats_delta": stats_delta(&before, &after)}),
                );
                crate::speculative::log_run("inferd", &run);
                pair.push(run);
            }
            if pair[0].token_ids != pair[1].token_ids {
                eprintln!(
                    "inferd-bench: MISMATCH: inferd {} rep {rep}: the token ids with and \
                     without speculation differ",
                    p.prompt.name
                );
            }
            runs.extend(pair);
        }
    }
    if counters_differ {
        notes.push(
            "inferd: usage.draft_tokens differs from the stats' draft_tokens increase for some \
             requests (see runs[].extra)"
                .into(),
        );
    }
    Ok(runs)
}

/// `settings.rounds` rounds of all `prompts` at once, each round once with speculation
/// on and once off (ABBA order).
async fn concurrent(
    client: &Client,
    prompts: &[ChatPrompt],
    settings: &Settings,
) -> Result<Vec<Round>> {
    let n = prompts.len();
    let mut rounds = Vec::new();
    for round in 0..settings.rounds {
        let order = arm_order(round);
        for on in order {
            eprintln!(
                "inferd-bench: inferd: {n} streams, round {round}, speculation {}",
                arm_name(on)
            );
            let mut conns = Vec::with_capacity(n);
            for _ in 0..n {
                conns.push(Conn::connect(&client.url).await?);
            }
            let before = client.stats().await;
            let frames: Vec<(String, Value)> = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let id = format!("s{i}-{}-{round}", arm_name(on));
                    let frame = client.frame(&id, &p.prompt, settings.max_tokens, on);
                    (id, frame)
                })
                .collect();
            let timeout = client.timeout;
            let traces = together(conns, |i, mut conn: Conn| {
                let (id, frame) = frames[i].clone();
                async move { conn.generate_frame(&id, &frame, timeout).await }
            })
            .await?;
            let after = client.stats().await;
            let runs: Vec<Run> = traces
                .iter()
                .zip(prompts)
                .enumerate()
                .map(|(i, (t, p))| {
                    let name = format!("s{i}:{}", p.prompt.name);
                    Run::new(
                        &name,
                        on,
                        round,
                        t,
                        usage_drafts(t),
                        json!({"usage": t.usage}),
                    )
                })
                .collect();
            let sum = |f: fn(&Drafts) -> Option<u64>| -> Option<u64> {
                runs.iter().map(|r| f(&r.drafts)).sum()
            };
            let drafts = Drafts {
                draft_tokens: sum(|d| d.draft_tokens),
                accepted_tokens: sum(|d| d.accepted_tokens),
                verification_steps: delta(&before, &after, "verification_steps"),
            };
            let r = Round::new(
                round,
                on,
                settings.max_tokens,
                &traces,
                runs,
                drafts,
                json!({"stats_delta": stats_delta(&before, &after)}),
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
