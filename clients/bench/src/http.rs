//! `--scenario http`: what the OpenAI-compatible HTTP edge (server-sent events) costs
//! against the WebSocket for the same work (issue 6).
//!
//! One daemon; at each concurrency level (`--concurrency`, default here `1,8`), rounds
//! of the same greedy completions (`--max-tokens` each) run over the WebSocket and over
//! `POST /v1/completions` with `stream: true`, alternating which goes first (ABBA), so
//! drift on a shared machine cancels. Per round: aggregate tokens/s (all tokens over
//! the round's wall time), TTFT (request sent to the first text, client side) and ITL
//! (time between text arrivals per token). The texts must be equal (greedy). A scrape of
//! `/metrics` under load is timed as well. Writes `target/bench/http_bench.json`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Barrier;

use crate::client::Conn;
use crate::daemon::{Daemon, DaemonSpec};
use crate::http_client::{self, EventStream};
use crate::prefix::Setup;
use crate::report::{goal_list, table};
use crate::Cli;

/// One stream as the client saw it.
#[derive(Debug, Clone)]
struct Stream {
    /// Seconds from sending the request to the first text.
    ttft_s: f64,
    /// Seconds from sending to the final event.
    end_s: f64,
    /// Generated tokens.
    tokens: u64,
    /// The whole text.
    text: String,
}

impl Stream {
    /// Mean time between tokens after the first, seconds.
    fn itl_s(&self) -> Option<f64> {
        (self.tokens > 1).then(|| (self.end_s - self.ttft_s) / (self.tokens - 1) as f64)
    }
}

/// One round of `n` concurrent streams over one edge.
#[derive(Debug, Clone)]
struct Round {
    streams: Vec<Stream>,
    wall_s: f64,
}

impl Round {
    fn tok_per_s(&self) -> f64 {
        let tokens: u64 = self.streams.iter().map(|s| s.tokens).sum();
        tokens as f64 / self.wall_s
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

fn prompt(i: usize) -> String {
    format!("Story number {i}. Once upon a time, in a small village by the sea,")
}

/// One greedy completion over the WebSocket.
async fn ws_stream(url: &str, i: usize, max_tokens: u64, timeout: Duration) -> Result<Stream> {
    let mut conn = Conn::connect(url).await?;
    let id = format!("h{i}");
    let frame = json!({
        "type": "generate", "id": id, "prompt": prompt(i),
        "max_tokens": max_tokens, "temperature": 0,
    });
    let trace = conn.generate_frame(&id, &frame, timeout).await?;
    Ok(Stream {
        ttft_s: trace.timing.ttft_s().unwrap_or(f64::NAN),
        end_s: trace.timing.end_s,
        tokens: trace.timing.tokens(),
        text: trace.text,
    })
}

/// One greedy completion over `POST /v1/completions` with `stream: true`: reads the
/// body as it arrives and timestamps each `data:` event.
async fn sse_stream(addr: &str, i: usize, max_tokens: u64, timeout: Duration) -> Result<Stream> {
    let body = json!({
        "prompt": prompt(i), "max_tokens": max_tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true},
    })
    .to_string();
    let sock = http_client::connect(addr).await?;
    let mut events = EventStream::post(sock, addr, "/v1/completions", &body, timeout).await?;
    let mut s = Stream {
        ttft_s: f64::NAN,
        end_s: f64::NAN,
        tokens: 0,
        text: String::new(),
    };
    while let Some((at, event)) = events.next_event().await? {
        if event == "[DONE]" {
            s.end_s = at;
            return Ok(s);
        }
        let v: Value = serde_json::from_str(&event)?;
        if let Some(e) = v.get("error") {
            bail!("error in stream: {e}");
        }
        if let Some(t) = v["choices"][0]["text"].as_str().filter(|t| !t.is_empty()) {
            if s.text.is_empty() {
                s.ttft_s = at;
            }
            s.text.push_str(t);
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            s.tokens = n;
        }
    }
    bail!("the daemon closed the stream before [DONE]")
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Edge {
    WebSocket,
    Sse,
}

async fn round(
    edge: Edge,
    daemon_url: &str,
    n: usize,
    max_tokens: u64,
    timeout: Duration,
) -> Result<Round> {
    let addr = daemon_url
        .trim_start_matches("ws://")
        .trim_end_matches("/v1/ws")
        .to_owned();
    let barrier = Arc::new(Barrier::new(n));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (barrier, url, addr) = (barrier.clone(), daemon_url.to_owned(), addr.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            match edge {
                Edge::WebSocket => ws_stream(&url, i, max_tokens, timeout).await,
                Edge::Sse => sse_stream(&addr, i, max_tokens, timeout).await,
            }
        }));
    }
    let mut streams = Vec::with_capacity(n);
    for t in tasks {
        streams.push(t.await.context("stream task panicked")??);
    }
    Ok(Round {
        streams,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Milliseconds one `GET /metrics` takes.
async fn scrape_ms(addr: &str) -> Result<f64> {
    let t0 = Instant::now();
    let mut sock = TcpStream::connect(addr).await?;
    sock.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = Vec::new();
    sock.read_to_end(&mut out).await?;
    if !out.starts_with(b"HTTP/1.1 200") {
        bail!("/metrics failed");
    }
    Ok(t0.elapsed().as_secs_f64() * 1e3)
}

/// Runs the scenario (see the module documentation).
pub fn run(cli: &Cli, setup: Setup) -> Result<()> {
    if cli.http_rounds == 0 || cli.max_tokens < 2 {
        bail!("--http-rounds must be >= 1 and --max-tokens >= 2");
    }
    let levels: Vec<usize> = if cli.concurrency == [1, 4, 16, 64] {
        vec![1, 8]
    } else {
        cli.concurrency.clone()
    };
    eprintln!(
        "inferd-bench: http scenario: {} with {} threads, levels {levels:?}, {} rounds",
        setup.bin.display(),
        setup.threads,
        cli.http_rounds
    );
    let spec = DaemonSpec {
        bin: setup.bin.clone(),
        root: setup.root.clone(),
        config: setup.config.clone(),
        model: setup.model.clone(),
        env: setup.env.clone(),
        log: setup.out_dir.join("inferd.stderr.log"),
        startup_timeout: Duration::from_secs(cli.startup_timeout),
        extra_args: Vec::new(),
    };
    let mut daemon = Daemon::start(&spec)?;
    let timeout = Duration::from_secs(cli.request_timeout);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let url = daemon.url.clone();
    let addr = url
        .trim_start_matches("ws://")
        .trim_end_matches("/v1/ws")
        .to_owned();
    let mut results = Vec::new();
    let mut rows = Vec::new();
    let mut goals = Vec::new();
    let mut same_text = true;
    let mut scrapes = Vec::new();
    for &n in &levels {
        // Warm-up: one round each, not counted.
        rt.block_on(round(Edge::WebSocket, &url, n, cli.max_tokens, timeout))?;
        rt.block_on(round(Edge::Sse, &url, n, cli.max_tokens, timeout))?;
        let mut ws_rounds = Vec::new();
        let mut sse_rounds = Vec::new();
        for r in 0..cli.http_rounds {
            let order = if r % 2 == 0 {
                [Edge::WebSocket, Edge::Sse]
            } else {
                [Edge::Sse, Edge::WebSocket]
            };
            for edge in order {
                let scrape = (edge == Edge::Sse).then(|| scrape_ms(&addr));
                let result = rt.block_on(async {
                    let measured = round(edge, &url, n, cli.max_tokens, timeout);
                    match scrape {
                        Some(s) => {
                            // One scrape while the streams run.
                            let (round, ms) = tokio::join!(measured, async {
                                tokio::time::sleep(Duration::from_millis(200)).await;
                                s.await
                            });
                            if let Ok(ms) = ms {
                                scrapes.push(ms);
                            }
                            round
                        }
                        None => measured.await,
                    }
                })?;
                match edge {
                    Edge::WebSocket => ws_rounds.push(result),
                    Edge::Sse => sse_rounds.push(result),
                }
            }
            daemon.check_alive()?;
        }
        for (w, s) in ws_rounds.iter().zip(&sse_rounds) {
            for (a, b) in w.streams.iter().zip(&s.streams) {
                same_text &= a.text == b.text && a.tokens == b.tokens;
            }
        }
        let figures = |rounds: &[Round]| {
            let all: Vec<&Stream> = rounds.iter().flat_map(|r| &r.streams).collect();
            (
                median(rounds.iter().map(Round::tok_per_s).collect()),
                median(all.iter().map(|s| s.ttft_s * 1e3).collect()),
                median(
                    all.iter()
                        .filter_map(|s| s.itl_s())
                        .map(|x| x * 1e3)
                        .collect(),
                ),
            )
        };
        let (ws_tps, ws_ttft, ws_itl) = figures(&ws_rounds);
        let (sse_tps, sse_ttft, sse_itl) = figures(&sse_rounds);
        // Paired per round: the two edges of one round ran back to back.
        let paired = median(
            ws_rounds
                .iter()
                .zip(&sse_rounds)
                .map(|(w, s)| s.tok_per_s() / w.tok_per_s())
                .collect(),
        );
        rows.push(vec![
            n.to_string(),
            format!("{ws_tps:.1}"),
            format!("{sse_tps:.1}"),
            format!("{paired:.3}"),
            format!("{ws_ttft:.1}"),
            format!("{sse_ttft:.1}"),
            format!("{ws_itl:.2}"),
            format!("{sse_itl:.2}"),
        ]);
        goals.push((
            if paired >= 0.95 { "met" } else { "NOT met" }.to_owned(),
            format!("{n} stream(s): SSE throughput within 5 % of the WebSocket's"),
            format!("median paired ratio {paired:.3}"),
        ));
        results.push(json!({
            "streams": n,
            "websocket": {"tok_per_s": ws_tps, "ttft_ms": ws_ttft, "itl_ms": ws_itl,
                          "rounds_tok_per_s": ws_rounds.iter().map(Round::tok_per_s).collect::<Vec<_>>()},
            "sse": {"tok_per_s": sse_tps, "ttft_ms": sse_ttft, "itl_ms": sse_itl,
                    "rounds_tok_per_s": sse_rounds.iter().map(Round::tok_per_s).collect::<Vec<_>>()},
            "paired_throughput_ratio_sse_over_ws": paired,
        }));
    }
    let (status, _) = daemon.terminate(Duration::from_secs(60))?;
    goals.push((
        if same_text { "met" } else { "NOT met" }.to_owned(),
        "greedy texts equal over both edges".to_owned(),
        if same_text { "equal" } else { "DIFFERENT" }.to_owned(),
    ));
    let scrape = median(scrapes.clone());
    println!(
        "\ninferd-bench: http scenario, {} threads, {} tokens per stream, {} rounds per level\n",
        setup.threads, cli.max_tokens, cli.http_rounds
    );
    print!(
        "{}",
        table(
            &[
                ("streams", 7),
                ("WS tok/s", 9),
                ("SSE tok/s", 9),
                ("SSE/WS", 6),
                ("WS TTFT ms", 10),
                ("SSE TTFT ms", 11),
                ("WS ITL ms", 9),
                ("SSE ITL ms", 10),
            ],
            &rows,
        )
    );
    println!(
        "\nGET /metrics under load: median {scrape:.2} ms over {} scrapes",
        scrapes.len()
    );
    print!("{}", goal_list("Goals", &goals));
    let out = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "date": chrono::Utc::now().to_rfc3339(),
        "threads": setup.threads,
        "max_tokens": cli.max_tokens,
        "rounds": cli.http_rounds,
        "levels": results,
        "metrics_scrape_ms": scrapes,
        "same_text": same_text,
        "daemon_exit": status.code(),
    });
    std::fs::write(&setup.out, serde_json::to_string_pretty(&out)?)
        .with_context(|| format!("cannot write {}", setup.out.display()))?;
    eprintln!("inferd-bench: wrote {}", setup.out.display());
    if !same_text {
        bail!("the two edges produced different greedy texts");
    }
    Ok(())
}
