//! Connection floods: with `server.max_connections = 16` and `server.header_timeout_ms =
//! 1000`, a running greedy stream meets 2,000 idle sockets and a few slowloris clients
//! dribbling a WebSocket upgrade request. Connections beyond the limit get the `503` at
//! once, the daemon's descriptors stay bounded, slowloris and idle keep-alive sockets
//! are cut off after the header timeout, the stream ends with exactly the tokens it
//! gives without the flood, and new connections are served afterwards.
//!
//! `cargo test -p inferd-e2e --test flood -- --nocapture` prints the figures
//! (docs/performance.md, "Connection floods").

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inferd_e2e::{parse_response, Client, Daemon};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MAX_CONNECTIONS: usize = 16;
const HEADER_TIMEOUT: Duration = Duration::from_millis(1000);
const FLOOD: usize = 2000;
const SLOWLORIS: usize = 4;
/// Descriptors the daemon may hold beyond its connections: `RESERVED_FDS` of
/// `daemon/src/server/nofile.rs`.
const FD_MARGIN: usize = 64;
/// Descriptors beyond the connections' that may come and go during the flood: the
/// socket being refused, and files the daemon opens on its own while the stream runs
/// (the prefix store's, `/proc` reads).
const FD_TRANSIENT: usize = 3;
/// How far the client's view of when a slot was taken or given back may be off the
/// daemon's (the accept and the close happen a little before the client sees them).
const SPAN_SLACK: Duration = Duration::from_millis(50);
/// Generated tokens of the streamed request (long enough to outlast the flood).
const TOKENS: u64 = 96;

/// Raises this process's soft open-file limit to `need` (with `prlimit(1)`: the test
/// crate has no libc), or fails saying why.
fn raise_own_nofile(need: u64) {
    let limits = || -> (u64, u64) {
        let text = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
        let line = text
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .expect("open files line");
        let mut n = line
            .split_whitespace()
            .skip(3)
            .map(|v| v.parse().unwrap_or(u64::MAX));
        (n.next().expect("soft"), n.next().expect("hard"))
    };
    let (soft, hard) = limits();
    if soft >= need {
        return;
    }
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("prlimit")
        .args(["--pid", &pid, &format!("--nofile={hard}:{hard}")])
        .status();
    let (soft, hard) = limits();
    assert!(
        soft >= need,
        "this test opens {need} sockets but RLIMIT_NOFILE is {soft} (hard {hard}): \
         raise it (ulimit -n {need})"
    );
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// A sample of a Prometheus text exposition (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The daemon's metrics once only the WebSocket that streamed (and this scrape) holds a
/// connection slot; fails after 5 s.
async fn metrics_once_settled(daemon: &Daemon) -> String {
    let end = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let m = daemon.http("GET", "/metrics", &[], None).expect("metrics");
        assert_eq!(m.status, 200);
        if metric(&m.body, "inferd_connections_open") == 2.0 || Instant::now() > end {
            break m.body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(metric(&text, "inferd_connections_open"), 2.0, "{text}");
    text
}

/// Streams a greedy request on `c`; the token ids and each delta's arrival time.
async fn stream(
    c: &mut Client,
    id: &str,
    started: Option<tokio::sync::oneshot::Sender<()>>,
) -> (Vec<u32>, Vec<Instant>) {
    c.send(&json!({"type":"generate","id":id,"prompt":"Once upon a time","max_tokens":TOKENS,"min_tokens":TOKENS,"temperature":0}))
        .await
        .expect("send");
    let (mut ids, mut times) = (Vec::new(), Vec::new());
    let mut started = started;
    loop {
        let f = c.recv().await.expect("frame");
        match f["type"].as_str() {
            Some("delta") => {
                let now = Instant::now();
                for t in f["token_ids"].as_array().expect("ids") {
                    ids.push(t.as_u64().expect("id") as u32);
                    times.push(now);
                }
                if let Some(s) = started.take() {
                    let _ = s.send(());
                }
            }
            Some("done") => {
                assert_eq!(f["finish_reason"], "length", "{f}");
                return (ids, times);
            }
            Some("started") => {}
            _ => panic!("unexpected frame {f}"),
        }
    }
}

/// Inter-token gaps (ms) of the tokens that arrived within `[from, to]` (all when
/// `None`): mean, median and largest.
fn itl(times: &[Instant], window: Option<(Instant, Instant)>) -> (f64, f64, f64, usize) {
    let mut gaps: Vec<f64> = times
        .windows(2)
        .filter(|w| window.is_none_or(|(a, b)| w[1] >= a && w[1] <= b))
        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e3)
        .collect();
    gaps.sort_by(f64::total_cmp);
    let n = gaps.len().max(1);
    let mean = gaps.iter().sum::<f64>() / n as f64;
    (
        mean,
        gaps.get(gaps.len() / 2).copied().unwrap_or(0.0),
        gaps.last().copied().unwrap_or(0.0),
        gaps.len(),
    )
}

/// What became of one flood socket.
enum Fate {
    /// The 503 arrived, this long after the connect; its bytes.
    Refused(Duration, Vec<u8>),
    /// Closed with nothing sent (it held a slot until the header timeout): how long
    /// after the connect, and when.
    Closed(Duration, Instant),
}

/// Reads `s` to its end (at most 10 s).
async fn fate(mut s: TcpStream, t0: Instant) -> Fate {
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "a flood socket stayed open for 10 s");
    if buf.is_empty() {
        Fate::Closed(t0.elapsed(), Instant::now())
    } else {
        Fate::Refused(t0.elapsed(), buf)
    }
}

/// The most of `spans` (each a connection's `[slot taken, slot given back]` as the
/// client saw it) open at one instant, each span first trimmed by [`SPAN_SLACK`] at
/// both ends.
fn most_at_once(spans: &[(Instant, Instant)]) -> usize {
    let mut edges: Vec<(Instant, i32)> = spans
        .iter()
        .filter_map(|&(a, b)| {
            let (a, b) = (a + SPAN_SLACK, b.checked_sub(SPAN_SLACK)?);
            (a < b).then_some([(a, 1), (b, -1)])
        })
        .flatten()
        .collect();
    // Ends before starts at the same instant.
    edges.sort();
    let (mut open, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    most as usize
}

/// Opens a socket and dribbles a WebSocket upgrade request, a byte per 50 ms, until the
/// daemon closes it; when it connected, how long until the close and what it sent back.
async fn slowloris(addr: String) -> (Instant, Duration, Vec<u8>) {
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let t0 = Instant::now();
    let request = format!(
        "GET /v1/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    let (mut rd, mut wr) = s.split();
    let mut got = Vec::new();
    let dribble = async {
        for b in request.bytes() {
            if wr.write_all(&[b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = dribble => unreachable!(),
        _ = rd.read_to_end(&mut got) => {}
        () = tokio::time::sleep(Duration::from_secs(10)) => panic!("slowloris socket still open after 10 s"),
    }
    (t0, t0.elapsed(), got)
}

/// A keep-alive HTTP request answered, then idle: when it connected, how long after the
/// answer the daemon closed it, and when.
async fn idle_keep_alive(addr: String) -> (Instant, Duration, Instant) {
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let connected = Instant::now();
    s.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).await.expect("response");
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );
    let answered = Instant::now();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("an idle keep-alive connection is closed")
        .expect("read");
    (connected, answered.elapsed(), Instant::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_is_refused_and_running_streams_go_on() {
    let t_test = Instant::now();
    raise_own_nofile(FLOOD as u64 + 256);
    let daemon = Daemon::start_with_env(&[
        (
            "INFERD__SERVER__MAX_CONNECTIONS",
            &MAX_CONNECTIONS.to_string(),
        ),
        (
            "INFERD__SERVER__HEADER_TIMEOUT_MS",
            &HEADER_TIMEOUT.as_millis().to_string(),
        ),
    ])
    .expect("daemon");
    let (addr, pid) = (daemon.addr(), daemon.pid());

    // The greedy stream without a flood: the reference tokens and gaps.
    let mut c = daemon.connect().await.expect("connect");
    let (reference, ref_times) = stream(&mut c, "ref", None).await;
    assert_eq!(reference.len() as u64, TOKENS);
    let baseline_fds = open_fds(pid);

    // Descriptors, sampled every 2 ms from now on.
    let (stop, max_fds) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let sampler = {
        let (stop, max_fds) = (stop.clone(), max_fds.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                max_fds.fetch_max(open_fds(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    // The same request again, flooded once its first token has arrived.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let streamed = tokio::spawn(async move {
        let r = stream(&mut c, "flooded", Some(started_tx)).await;
        (r, c)
    });
    started_rx.await.expect("the stream started");
    let slow: Vec<_> = (0..SLOWLORIS)
        .map(|_| tokio::spawn(slowloris(addr.clone())))
        .collect();
    let keep_alive = tokio::spawn(idle_keep_alive(addr.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await; // they hold their slots
    let flood_start = Instant::now();
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        let s = TcpStream::connect(&addr)
            .await
            .expect("connect (the listener's backlog)");
        flood.push(tokio::spawn(fate(s, Instant::now())));
    }
    let connected = flood_start.elapsed();
    let mut fates = Vec::with_capacity(FLOOD);
    for f in flood {
        fates.push(f.await.expect("flood socket"));
    }
    let flood_end = Instant::now();

    // Refused at once, with the documented 503; the few that got a slot were cut off
    // by the header timeout.
    let mut refused_latency: Vec<Duration> = Vec::new();
    let mut closed = Vec::new();
    for f in &fates {
        match f {
            Fate::Refused(t, raw) => {
                refused_latency.push(*t);
                if refused_latency.len() == 1 {
                    let r = parse_response(raw).expect("a whole HTTP response");
                    assert_eq!(r.status, 503, "{}", r.body);
                    assert_eq!(r.header("connection"), Some("close"));
                    assert_eq!(
                        r.json()["error"]["message"],
                        format!(
                            "too many connections: server.max_connections = {MAX_CONNECTIONS} \
                             are open; retry later"
                        )
                    );
                } else {
                    assert!(raw.starts_with(b"HTTP/1.1 503 "));
                }
            }
            Fate::Closed(t, at) => closed.push((*t, *at)),
        }
    }
    refused_latency.sort();
    assert_eq!(refused_latency.len() + closed.len(), FLOOD);
    for (t, _) in &closed {
        assert!(*t >= HEADER_TIMEOUT - Duration::from_millis(100), "{t:?}");
    }
    let p99 = refused_latency[refused_latency.len() * 99 / 100];
    let worst = *refused_latency.last().expect("refusals");
    assert!(worst < HEADER_TIMEOUT, "a refusal took {worst:?}");

    // Slowloris and the idle keep-alive connection: cut off after the header timeout.
    let late = HEADER_TIMEOUT + Duration::from_secs(2);
    let mut spans = Vec::new();
    for s in slow {
        let (t0, t, got) = s.await.expect("slowloris");
        assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
        assert!(
            t >= HEADER_TIMEOUT - Duration::from_millis(50) && t <= late,
            "{t:?}"
        );
        spans.push((t0, t0 + t));
    }
    let (connected_at, idle, closed_at) = keep_alive.await.expect("keep-alive");
    assert!(
        idle >= HEADER_TIMEOUT - Duration::from_millis(50) && idle <= late,
        "{idle:?}"
    );
    spans.push((connected_at, closed_at));

    // The flood sockets that got a slot held it for the header timeout before their
    // close; with the slowloris and keep-alive sockets they never held more slots at
    // once than the stream left free. (Which sockets get one depends on timing: when
    // the listen backlog overflows, the kernel drops SYNs and clients retry a second
    // later, after some slots have been given back.)
    spans.extend(closed.iter().map(|&(_, at)| (at - HEADER_TIMEOUT, at)));
    let most = most_at_once(&spans);
    assert!(
        most < MAX_CONNECTIONS,
        "{most} slots held at once besides the stream's ({} flood sockets got one)",
        closed.len()
    );

    // The stream: the same tokens as without the flood.
    let ((flooded, times), mut c) = streamed.await.expect("stream");
    assert_eq!(flooded, reference);
    stop.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    let max_fds = max_fds.load(Ordering::Relaxed);
    assert!(
        max_fds <= MAX_CONNECTIONS + FD_MARGIN,
        "the daemon held {max_fds} descriptors (idle with one connection: {baseline_fds})"
    );
    // The baseline counts the stream's connection; the others can add one each.
    assert!(
        max_fds < baseline_fds + MAX_CONNECTIONS + FD_TRANSIENT,
        "{max_fds} descriptors, {baseline_fds} before the flood"
    );

    // Released: new connections are served, and the metrics tell what happened.
    let g = c
        .generate(
            json!({"type":"generate","id":"after","prompt":"Hello","max_tokens":4,"temperature":0}),
        )
        .await
        .expect("generate");
    assert_eq!(g.token_ids.len(), 4, "{g:?}");
    let mut fresh = daemon
        .connect()
        .await
        .expect("a new WebSocket after the flood");
    assert_eq!(stream(&mut fresh, "fresh", None).await.0, reference);
    drop(fresh);
    // The daemon sees that close a little later: wait until its slot is given back.
    metrics_once_settled(&daemon).await;

    // A WebSocket handshake at the limit fails with the 503 (the idle sockets holding
    // the other slots are well within their header timeout).
    let mut holders = Vec::new();
    for _ in 0..MAX_CONNECTIONS - 1 {
        holders.push(TcpStream::connect(&addr).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let e = daemon
        .connect()
        .await
        .err()
        .expect("no WebSocket beyond the limit");
    assert!(format!("{e:#}").contains("503"), "{e:#}");
    drop(holders);
    let text = metrics_once_settled(&daemon).await;
    // The flood's refusals and the WebSocket's; timeouts: slowloris, the idle
    // keep-alive connection and the flood sockets that got a slot.
    assert_eq!(
        metric(&text, "inferd_connections_refused_total"),
        (refused_latency.len() + 1) as f64
    );
    assert_eq!(
        metric(&text, "inferd_connection_header_timeouts_total"),
        (SLOWLORIS + 1 + closed.len()) as f64
    );

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let gaps = |times: &[Instant], window| {
        let (mean, median, max, n) = itl(times, window);
        format!("{mean:.1} / {median:.1} / {max:.1} ms over {n} gaps")
    };
    eprintln!(
        "flood: {FLOOD} sockets connected in {:.0} ms, {} refused with 503 (median {:.2} ms, \
         p99 {:.2} ms, worst {:.2} ms after connect), {} held a slot until the header \
         timeout ({most} slots at most at once besides the stream's); daemon descriptors: \
         {baseline_fds} before, at most {max_fds} during",
        ms(connected),
        refused_latency.len(),
        ms(refused_latency[refused_latency.len() / 2]),
        ms(p99),
        ms(worst),
        closed.len()
    );
    eprintln!(
        "ITL (mean / median / max): without a flood {}; the same stream while the 2,000 \
         sockets connected {}, from the flood's start to its last socket's end {}, all of \
         it {}; test {:.1} s",
        gaps(&ref_times, None),
        gaps(&times, Some((flood_start, flood_start + connected))),
        gaps(&times, Some((flood_start, flood_end))),
        gaps(&times, None),
        t_test.elapsed().as_secs_f64()
    );
}
