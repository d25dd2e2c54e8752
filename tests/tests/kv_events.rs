//! KV-cache events (`[kv_events]`) read by a subscriber written as vLLM's example is
//! (tests/python/kv_events_subscriber.py: pyzmq, msgspec types): every message decodes,
//! sequence numbers run without a gap, stores follow the prefix cache (memory and
//! disk), evictions are removed, a replay out of range is refused, a replica killed
//! with -9 announces AllBlocksCleared, then its disk blocks, a subscriber that never
//! reads harms nothing and one that loses messages gets them back through replay. No
//! token changes.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use inferd_e2e::{python, run_python, workspace_root, Client, Daemon};

/// 24 blocks of 16 tokens of the default model's K/V (23,040 bytes per token): small
/// enough that a 340-token prompt evicts cached blocks.
const KV_BYTES: &str = "8847360";

fn events_env(store: &str) -> Vec<(&'static str, String)> {
    vec![
        ("INFERD__KV_EVENTS__ENABLED", "true".into()),
        ("INFERD__KV_EVENTS__ENDPOINT", "tcp://127.0.0.1:0".into()),
        (
            "INFERD__KV_EVENTS__REPLAY_ENDPOINT",
            "tcp://127.0.0.1:0".into(),
        ),
        ("INFERD__SCHEDULER__KV_CACHE_BYTES", KV_BYTES.into()),
        ("INFERD__PREFIX_STORE__PATH", store.into()),
    ]
}

fn start(env: &[(&'static str, String)]) -> Daemon {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Daemon::start_with_env(&env).expect("daemon")
}

/// The `collect` subscriber, connected and caught up (it printed "ready").
struct Subscriber {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
}

impl Subscriber {
    fn start(d: &Daemon) -> Self {
        let (pub_ep, replay) = d.kv_events().expect("kv events line on stdout");
        Self::spawn(&["collect", &pub_ep, &replay, "kv-events"])
    }

    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(python())
            .arg(workspace_root().join("tests/python/kv_events_subscriber.py"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("subscriber");
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("ready line");
        assert_eq!(line.trim(), "ready");
        Self { child, stdin, out }
    }

    /// Closes stdin; the subscriber reads 0.5 s more and prints what it got.
    fn finish(mut self) -> Value {
        drop(self.stdin.take());
        let mut line = String::new();
        self.out.read_line(&mut line).expect("summary");
        let _ = self.child.wait();
        serde_json::from_str(&line).expect("summary JSON")
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

async fn greedy(c: &mut Client, id: &str, prompt: &[u32], salt: Option<&str>) -> Vec<u32> {
    let mut req = json!({"type": "generate", "id": id, "prompt": prompt, "max_tokens": 8,
                         "temperature": 0});
    if let Some(s) = salt {
        req["cache_salt"] = json!(s);
    }
    let g = c.generate(req).await.expect("generate");
    assert_eq!(g.error, None, "{id}");
    g.token_ids
}

/// Waits until the disk tier holds at least `n` blocks.
async fn wait_disk_blocks(c: &mut Client, n: u64) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let st = c.stats().await.expect("stats");
        if st["prefix_cache"]["disk_blocks"].as_u64().unwrap_or(0) >= n {
            return;
        }
        assert!(
            Instant::now() < end,
            "the disk tier never held {n} blocks: {st}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn of_type<'a>(events: &'a [Value], ty: &str, medium: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["type"] == ty && e["medium"] == medium)
        .collect()
}

/// The integers of a JSON array (empty when `v` is not one).
fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

fn hashes(e: &Value) -> Vec<u64> {
    u64s(&e["block_hashes"])
}

fn prompt(first: u32, n: u32) -> Vec<u32> {
    (first..first + n).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_follow_the_prefix_cache_and_decode_with_vllm_types() {
    let store = tempfile::tempdir().expect("store");
    let d = start(&events_env(&store.path().to_string_lossy()));
    let sub = Subscriber::start(&d);
    let mut c = d.connect().await.expect("connect");
    let p1 = prompt(1000, 40);
    let tokens = greedy(&mut c, "r1", &p1, None).await;
    wait_disk_blocks(&mut c, 2).await;
    greedy(&mut c, "r2", &p1, Some("tenant-a")).await;
    wait_disk_blocks(&mut c, 4).await;
    // 340 other tokens (and 8 generated) need 22 of the 24 blocks, 20 of them never
    // hashed: two cached ones are evicted, r1's chain first, its tail first.
    greedy(&mut c, "r3", &prompt(5000, 340), None).await;
    let (_, replay) = d.kv_events().expect("endpoints");
    let summary = sub.finish();
    let events = summary["events"].as_array().expect("events").clone();
    let seqs = u64s(&summary["seqs"]);
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "no gap");
    assert_eq!(events[0]["type"], "AllBlocksCleared", "{summary}");
    let stored = of_type(&events, "BlockStored", "CPU");
    let first = stored[0];
    assert_eq!(first["parent_block_hash"], Value::Null);
    assert_eq!(
        first["token_ids"],
        json!(p1[..32]),
        "two full prompt blocks"
    );
    assert_eq!(first["block_size"], 16);
    assert_eq!(first["lora_id"], Value::Null);
    let h1 = hashes(first);
    assert_eq!(h1.len(), 2);
    // The disk tier stored the same blocks, each naming its parent.
    let disk = of_type(&events, "BlockStored", "DISK");
    let disk_hashes: Vec<u64> = disk.iter().flat_map(|e| hashes(e)).collect();
    assert!(disk_hashes.starts_with(&h1), "{disk_hashes:?} vs {h1:?}");
    assert_eq!(disk[1]["parent_block_hash"], json!(h1[0]));
    // The salted request: the same tokens under other hashes, the salt on block 0.
    let salted = stored
        .iter()
        .find(|e| e["extra_keys"][0] == json!(["tenant-a"]))
        .expect("a salted store");
    assert_eq!(salted["token_ids"], json!(p1[..32]));
    assert!(hashes(salted).iter().all(|h| !h1.contains(h)));
    assert_eq!(
        first["extra_keys"],
        Value::Null,
        "nothing but tokens in r1's hashes"
    );
    // The disk tier's store of the salted chain's first block carries the salt too.
    let salted_head = hashes(salted)[0];
    let on_disk = disk
        .iter()
        .find(|e| hashes(e) == [salted_head])
        .expect("the salted head on disk");
    assert_eq!(on_disk["extra_keys"], json!([["tenant-a"]]));
    // Evictions: some of r1's cached blocks, tail first.
    let removed: Vec<u64> = of_type(&events, "BlockRemoved", "CPU")
        .iter()
        .flat_map(|e| hashes(e))
        .collect();
    assert!(removed.contains(&h1[1]), "{removed:?}");
    // Replay: out of range is an error naming the range; from 1 gives the rest.
    let r = run_python(
        "kv_events_subscriber.py",
        &["replay", &replay, "100000"],
        None,
    )
    .expect("replay");
    let err = r["error"].as_str().unwrap_or_default();
    assert!(
        err.starts_with(
            "error: start sequence number 100000 is out of range: the buffer holds 0 to "
        ),
        "{r}"
    );
    let r = run_python("kv_events_subscriber.py", &["replay", &replay, "1"], None).expect("replay");
    assert_eq!(r["error"], Value::Null);
    assert_eq!(r["seqs"], json!(seqs[1..]));
    // The counters: every message published, none dropped.
    let st = c.stats().await.expect("stats");
    assert_eq!(st["kv_events"]["published"], json!(seqs.len()));
    assert_eq!(st["kv_events"]["dropped"], 0);
    // Publishing changes no token.
    let plain = Daemon::start().expect("daemon without events");
    let mut pc = plain.connect().await.expect("connect");
    assert_eq!(greedy(&mut pc, "r1", &p1, None).await, tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_and_restarted_clears_then_announces_its_disk_blocks() {
    let store = tempfile::tempdir().expect("store");
    let env = events_env(&store.path().to_string_lossy());
    let mut d = start(&env);
    let mut c = d.connect().await.expect("connect");
    let sub = Subscriber::start(&d);
    let p1 = prompt(2000, 40);
    let tokens = greedy(&mut c, "r1", &p1, None).await;
    wait_disk_blocks(&mut c, 2).await;
    let before = sub.finish();
    let before = before["events"].as_array().expect("events").clone();
    let on_disk: Vec<u64> = of_type(&before, "BlockStored", "DISK")
        .iter()
        .flat_map(|e| hashes(e))
        .collect();
    assert_eq!(on_disk.len(), 2);
    d.signal("KILL").expect("kill -9");
    let _ = d.wait_exit(Duration::from_secs(10));
    drop(c);

    let d = start(&env);
    let sub = Subscriber::start(&d);
    let mut c = d.connect().await.expect("connect");
    let after = sub.finish();
    let events = after["events"].as_array().expect("events");
    assert_eq!(events[0]["type"], "AllBlocksCleared");
    let announced = &events[1..];
    assert!(announced.iter().all(|e| e["medium"] == "DISK"), "{after}");
    let hashes_after: Vec<u64> = announced.iter().flat_map(hashes).collect();
    assert_eq!(hashes_after, on_disk, "chain order, parents first");
    assert_eq!(announced[0]["token_ids"], json!(p1[..16]));
    assert_eq!(announced[1]["parent_block_hash"], json!(on_disk[0]));
    // The restarted replica serves the same tokens (its prompt now from the disk tier).
    assert_eq!(greedy(&mut c, "r1", &p1, None).await, tokens);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_harms_nothing_and_gaps_are_filled_by_replay() {
    let store = tempfile::tempdir().expect("store");
    let d = start(&events_env(&store.path().to_string_lossy()));
    let (pub_ep, replay) = d.kv_events().expect("endpoints");
    // One subscriber never reads; another loses every third message it reads.
    let stalled = Subscriber::spawn(&["stall", &pub_ep, "kv-events"]);
    let lossy = Subscriber::spawn(&["collect", &pub_ep, &replay, "kv-events", "3"]);
    let mut c = d.connect().await.expect("connect");
    let mut all = Vec::new();
    for r in 0..6u32 {
        let salt = format!("s{r}");
        all.push(
            greedy(
                &mut c,
                &format!("r{r}"),
                &prompt(3000 + 100 * r, 40),
                Some(&salt),
            )
            .await,
        );
    }
    wait_disk_blocks(&mut c, 12).await;
    let st = c.stats().await.expect("stats");
    let published = st["kv_events"]["published"].as_u64().expect("published");
    assert_eq!(st["kv_events"]["dropped"], 0);
    let got = lossy.finish();
    let seqs = u64s(&got["seqs"]);
    assert_eq!(seqs, (0..published).collect::<Vec<_>>(), "{got}");
    let skipped = got["skipped"].as_array().expect("skipped");
    assert!(!skipped.is_empty(), "the test lost no message: {got}");
    for s in skipped {
        assert!(
            got["replayed"].as_array().expect("replayed").contains(s),
            "{s} was lost and not replayed: {got}"
        );
    }
    assert_eq!(stalled.finish(), json!({"stalled": true}));
    // The stalled subscriber changed no token.
    let plain = Daemon::start().expect("daemon without events");
    let mut pc = plain.connect().await.expect("connect");
    assert_eq!(
        greedy(&mut pc, "r0", &prompt(3000, 40), Some("s0")).await,
        all[0]
    );
}
