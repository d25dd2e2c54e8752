//! The prefix KV cache end to end on the real model: a cache hit never changes the
//! output (greedy, token for token, against the same prompt with `"cache": false`) for
//! a repeated prompt, a shared prefix with another suffix, a prefix ending exactly on
//! a block boundary and one ending mid-block, after memory eviction, after a restart
//! (served from disk), after a kill -9 during heavy writing, and with a store written
//! under another block size. `cached_tokens` is checked against the value the block
//! arithmetic gives: `16 · min(⌊common / 16⌋, ⌊(prompt − 1) / 16⌋)`.

use std::time::Duration;

use inferd_e2e::{
    ids, model_path, plugins_dir, start_failure, workspace_root, Client, Daemon, Generation,
};
use serde_json::{json, Value};

const BLOCK: usize = 16;

/// A ~420-token document shared by the prompts.
fn document() -> String {
    let mut s = String::from(
        "The following is a field guide to the lighthouses of a small northern coast. ",
    );
    for (i, (name, fact)) in [
        (
            "Greyhaven",
            "was built in 1871 of granite quarried on the island itself",
        ),
        (
            "Selkie Point",
            "has a foghorn that can be heard twelve miles out to sea",
        ),
        (
            "Marrow Rock",
            "is reachable only at low tide across a causeway of shingle",
        ),
        (
            "Tern Head",
            "was the last light on the coast to be automated, in 1998",
        ),
        (
            "Lantern Bay",
            "houses a museum of lenses, including a first-order Fresnel",
        ),
        (
            "Blackskerry",
            "stands on a reef that wrecked three ships before it was lit",
        ),
        (
            "Old Wick",
            "flashes white twice every ten seconds and red once a minute",
        ),
        (
            "Harrow Ness",
            "is painted in red and white bands so it is seen by day",
        ),
    ]
    .iter()
    .enumerate()
    {
        s.push_str(&format!(
            "Light number {} is {name}. {name} {fact}. Keepers at {name} kept a log of \
             every passing vessel, the weather at each watch, and the oil burned each night. ",
            i + 1
        ));
    }
    s
}

fn req(id: &str, prompt: &str, max_tokens: u64, extra: Value) -> Value {
    let mut r = json!({"type":"generate","id":id,"prompt":prompt,
                       "max_tokens":max_tokens,"temperature":0});
    if let (Value::Object(m), Value::Object(e)) = (&mut r, extra) {
        m.extend(e);
    }
    r
}

async fn run(c: &mut Client, id: &str, prompt: &str, extra: Value) -> Generation {
    let g = c
        .generate(req(id, prompt, 24, extra))
        .await
        .expect("generate");
    assert!(g.error.is_none(), "{id}: {:?}", g.error);
    g
}

fn cached(g: &Generation) -> usize {
    let s = g.started.as_ref().expect("started")["cached_tokens"]
        .as_u64()
        .expect("started.cached_tokens") as usize;
    let d = g.done.as_ref().expect("done")["usage"]["cached_tokens"]
        .as_u64()
        .expect("usage.cached_tokens") as usize;
    assert_eq!(s, d, "started and done.usage agree");
    s
}

fn prompt_tokens(g: &Generation) -> usize {
    g.started.as_ref().expect("started")["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens") as usize
}

async fn tokenize(c: &mut Client, text: &str) -> Vec<u32> {
    c.send(&json!({"type":"tokenize","id":"tok","text":text}))
        .await
        .expect("send");
    let f = c.recv().await.expect("tokens");
    ids(&f["token_ids"])
}

/// Tokens two prompts share from the start (as the engine sees them: a BOS the model
/// adds counts).
async fn common_prefix(c: &mut Client, a: &str, b: &str, a_prompt_tokens: usize) -> usize {
    let (ta, tb) = (tokenize(c, a).await, tokenize(c, b).await);
    let bos = a_prompt_tokens - ta.len();
    bos + ta.iter().zip(&tb).take_while(|(x, y)| x == y).count()
}

/// What the engine reuses: whole blocks of the shared prefix, keeping at least the
/// prompt's last token to compute.
fn expected_cached(common: usize, prompt_tokens: usize) -> usize {
    BLOCK * (common / BLOCK).min((prompt_tokens - 1) / BLOCK)
}

/// Greedy output with the cache equals the output without it.
fn assert_same(what: &str, got: &Generation, reference: &Generation) {
    assert!(!reference.token_ids.is_empty());
    assert_eq!(got.token_ids, reference.token_ids, "{what}: token ids");
    assert_eq!(got.text, reference.text, "{what}: text");
}

async fn stats(url: &str) -> Value {
    let mut c = Client::connect(url).await.expect("connect");
    c.stats().await.expect("stats")["prefix_cache"].clone()
}

/// Waits until the store has written at least `blocks` blocks: writing is behind
/// generation, on a thread that only gets CPU time nobody else wants, so on a busy
/// machine it lags. Returns the stats then.
async fn wait_for_writes(url: &str, blocks: u64) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let s = stats(url).await;
        if s["disk_written_blocks"].as_u64().unwrap_or(0) >= blocks {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the store wrote fewer than {blocks} blocks in 120 s: {s}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn repeated_and_shared_prefixes_hit_memory_with_identical_output() {
    let daemon =
        Daemon::start_with_env(&[("INFERD__PREFIX_STORE__ENABLED", "false")]).expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let doc = document();
    let p1 = format!("{doc}Question: which light was automated last? Answer:");
    let p2 = format!("{doc}Question: how often does Old Wick flash white? Answer:");
    let off = json!({"cache": false});
    let ref1 = run(&mut c, "ref1", &p1, off.clone()).await;
    let ref2 = run(&mut c, "ref2", &p2, off.clone()).await;
    assert_eq!(cached(&ref1), 0);
    let n1 = prompt_tokens(&ref1);
    assert!(n1 > 400, "a long prompt ({n1} tokens)");

    // `cache: false` neither reads nor writes: this first cached run is cold.
    let cold = run(&mut c, "cold", &p1, json!({})).await;
    assert_eq!(cached(&cold), 0);
    assert_same("cold", &cold, &ref1);

    let warm = run(&mut c, "warm", &p1, json!({})).await;
    assert_eq!(cached(&warm), expected_cached(n1, n1));
    assert_same("repeated prompt", &warm, &ref1);

    let common = common_prefix(&mut c, &p1, &p2, n1).await;
    let n2 = prompt_tokens(&ref2);
    let shared = run(&mut c, "shared", &p2, json!({})).await;
    assert_eq!(cached(&shared), expected_cached(common, n2));
    assert!(cached(&shared) > 300);
    assert_same("shared prefix, other suffix", &shared, &ref2);

    // Another tenant's salt shares nothing; its own repeat hits.
    let salted = run(&mut c, "salt1", &p1, json!({"cache_salt": "tenant-b"})).await;
    assert_eq!(cached(&salted), 0);
    assert_same("salted cold", &salted, &ref1);
    let salted2 = run(&mut c, "salt2", &p1, json!({"cache_salt": "tenant-b"})).await;
    assert_eq!(cached(&salted2), expected_cached(n1, n1));
    assert_same("salted warm", &salted2, &ref1);

    // cache: false still ignores what is cached.
    let again_off = run(&mut c, "off2", &p1, off).await;
    assert_eq!(cached(&again_off), 0);

    let s = stats(&daemon.url).await;
    let hits = (expected_cached(n1, n1) * 2 + expected_cached(common, n2)) as u64;
    assert_eq!(s["enabled"], true);
    assert_eq!(s["disk_enabled"], false);
    assert_eq!(s["hit_tokens"].as_u64(), Some(hits));
    assert_eq!(s["memory_hit_tokens"].as_u64(), Some(hits));
    assert_eq!(s["disk_hit_tokens"].as_u64(), Some(0));
    // Counted for requests that use the cache: cold, warm, shared, salt1, salt2.
    let prompts = (4 * n1 + n2) as u64;
    assert_eq!(s["prompt_tokens"].as_u64(), Some(prompts));
    let rate = s["hit_rate"].as_f64().expect("hit_rate");
    assert!((rate - hits as f64 / prompts as f64).abs() < 1e-9, "{rate}");
    assert!(s["memory_blocks"].as_u64().expect("memory_blocks") > 0);
}

/// Prompts sharing exactly `k` filler tokens, for `k` on a block boundary and mid-block.
#[tokio::test]
async fn prefix_ending_on_a_block_boundary_and_mid_block() {
    let daemon =
        Daemon::start_with_env(&[("INFERD__PREFIX_STORE__ENABLED", "false")]).expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let filler = |k: usize| "Lorem ipsum dolor sit amet.".to_string() + &" data".repeat(k);
    let mut seen = Vec::new();
    for k in 40..80 {
        let a = format!("{} The end.", filler(k));
        let b = format!("{} Then a different ending follows here.", filler(k));
        let (ta, tb) = (tokenize(&mut c, &a).await, tokenize(&mut c, &b).await);
        let common = ta.iter().zip(&tb).take_while(|(x, y)| x == y).count();
        let residue = common % BLOCK;
        if seen.iter().any(|&(r, _, _)| r == residue) || !(residue == 0 || residue == 7) {
            continue;
        }
        seen.push((residue, a, b));
        if seen.len() == 2 {
            break;
        }
    }
    assert_eq!(seen.len(), 2, "found a boundary and a mid-block case");
    for (residue, a, b) in seen {
        let reference = run(&mut c, "ref", &b, json!({"cache": false})).await;
        let nb = prompt_tokens(&reference);
        let first = run(&mut c, "a", &a, json!({})).await;
        let common = common_prefix(&mut c, &a, &b, prompt_tokens(&first)).await;
        assert_eq!(common % BLOCK, residue);
        let got = run(&mut c, "b", &b, json!({})).await;
        assert_eq!(
            cached(&got),
            expected_cached(common, nb),
            "residue {residue}"
        );
        assert!(cached(&got) >= 32);
        assert_same(
            &format!("common prefix ≡ {residue} mod {BLOCK}"),
            &got,
            &reference,
        );
    }
}

/// A KV pool of 80 blocks (1,280 tokens): three other long prompts evict the first
/// one's blocks, which then come from disk when the disk tier is on, and are
/// recomputed when it is off; the output is the same either way.
#[tokio::test]
async fn after_memory_eviction_from_disk_or_recomputed() {
    // 80 blocks × 16 tokens × 23,040 bytes per token.
    let kv = (80 * 16 * 23_040).to_string();
    for disk in [false, true] {
        let daemon = Daemon::start_with_env(&[
            ("INFERD__SCHEDULER__KV_CACHE_BYTES", kv.as_str()),
            (
                "INFERD__PREFIX_STORE__ENABLED",
                if disk { "true" } else { "false" },
            ),
        ])
        .expect("daemon");
        let mut c = daemon.connect().await.expect("connect");
        let doc = document();
        let p1 = format!("{doc}Question: which light has a museum? Answer:");
        let reference = run(&mut c, "ref", &p1, json!({"cache": false})).await;
        let n1 = prompt_tokens(&reference);
        let first = run(&mut c, "first", &p1, json!({})).await;
        assert_same("first", &first, &reference);
        if disk {
            wait_for_writes(&daemon.url, (n1 / BLOCK) as u64).await;
        }
        for i in 0..3 {
            let other = format!("Variant {i}. {doc}Question: name light {i}. Answer:");
            run(&mut c, &format!("evict{i}"), &other, json!({})).await;
        }
        let s = stats(&daemon.url).await;
        assert!(s["memory_blocks"].as_u64().expect("memory_blocks") <= 80);
        let again = run(&mut c, "again", &p1, json!({})).await;
        assert_same(&format!("after eviction (disk {disk})"), &again, &reference);
        let s = stats(&daemon.url).await;
        if disk {
            assert_eq!(cached(&again), expected_cached(n1, n1));
            assert_eq!(
                s["disk_hit_tokens"].as_u64(),
                Some(expected_cached(n1, n1) as u64),
                "served from disk: {s}"
            );
        } else {
            assert_eq!(cached(&again), 0, "evicted, recomputed: {s}");
        }
    }
}

#[tokio::test]
async fn after_a_restart_served_from_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_str().expect("utf-8 path").to_string();
    let env = [("INFERD__PREFIX_STORE__PATH", path.as_str())];
    let doc = document();
    let p1 = format!("{doc}Question: what is Harrow Ness painted with? Answer:");
    let reference;
    {
        let mut daemon = Daemon::start_with_env(&env).expect("daemon");
        let mut c = daemon.connect().await.expect("connect");
        reference = run(&mut c, "ref", &p1, json!({})).await;
        assert_eq!(cached(&reference), 0);
        let n = prompt_tokens(&reference);
        // Full blocks of the prompt and of the answer so far are written behind.
        wait_for_writes(&daemon.url, (n / BLOCK) as u64).await;
        drop(c);
        daemon.signal("TERM").expect("SIGTERM");
        assert_eq!(
            daemon.wait_exit(Duration::from_secs(30)).expect("exit"),
            Some(0)
        );
    }
    let daemon = Daemon::start_with_env(&env).expect("daemon restarted");
    let mut c = daemon.connect().await.expect("connect");
    let n = prompt_tokens(&reference);
    let s = stats(&daemon.url).await;
    assert!(s["disk_blocks"].as_u64().expect("disk_blocks") >= (n / BLOCK) as u64);
    assert!(s["disk_bytes"].as_u64().expect("disk_bytes") > 0);
    let warm = run(&mut c, "warm", &p1, json!({})).await;
    assert_eq!(cached(&warm), expected_cached(n, n));
    assert_same("after restart", &warm, &reference);
    let s = stats(&daemon.url).await;
    assert_eq!(
        s["disk_hit_tokens"].as_u64(),
        Some(expected_cached(n, n) as u64)
    );
    assert_eq!(s["disk_dropped_corrupt"].as_u64(), Some(0));
    // And the answer's own blocks: a follow-up prompt that contains the answer reuses
    // them too.
    let follow = format!("{p1}{}", warm.text);
    let follow_ref = run(&mut c, "fref", &follow, json!({"cache": false})).await;
    let f = run(&mut c, "follow", &follow, json!({})).await;
    assert!(cached(&f) >= expected_cached(n, n));
    assert_same("follow-up", &f, &follow_ref);
}

/// kill -9 while the store writes the blocks of four long prompts (about 260 blocks,
/// 96 MB, queued while they ran; the kill comes once the first of them are written):
/// the restarted daemon serves what survived intact (at least the prompt written and
/// flushed well before the kill) and every output equals the uncached one.
#[tokio::test]
async fn kill_9_during_heavy_writing_never_serves_wrong_kv() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_str().expect("utf-8 path").to_string();
    let env = [("INFERD__PREFIX_STORE__PATH", path.as_str())];
    let doc = document();
    let prompts: Vec<String> = (0..5)
        .map(|i| format!("Copy {i} of the guide. {doc}Question: how many lights? Answer:"))
        .collect();
    {
        let daemon = Daemon::start_with_env(&env).expect("daemon");
        let mut c = daemon.connect().await.expect("connect");
        let p0 = run(&mut c, "p0", &prompts[0], json!({})).await;
        let base = wait_for_writes(&daemon.url, (prompt_tokens(&p0) / BLOCK) as u64).await
            ["disk_written_blocks"]
            .as_u64()
            .expect("written");
        // sled flushes every 500 ms: p0's blocks are on disk after this.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut clients = Vec::new();
        for (i, p) in prompts.iter().enumerate().skip(1) {
            let mut c = daemon.connect().await.expect("connect");
            c.send(&req(&format!("p{i}"), p, 24, json!({})))
                .await
                .expect("send");
            clients.push(c);
        }
        for c in &mut clients {
            while !matches!(
                c.recv().await.expect("frame")["type"].as_str(),
                Some("done")
            ) {}
        }
        // The writer works through the queued blocks now; kill it in the middle.
        let s = wait_for_writes(&daemon.url, base + 8).await;
        daemon.signal("KILL").expect("SIGKILL");
        let written = s["disk_written_blocks"].as_u64().unwrap_or(0) - base;
        eprintln!("killed with {written} of about 260 queued blocks written");
    }
    let daemon = Daemon::start_with_env(&env).expect("daemon restarted");
    let mut c = daemon.connect().await.expect("connect");
    for (i, p) in prompts.iter().enumerate() {
        let got = run(&mut c, &format!("w{i}"), p, json!({})).await;
        let reference = run(&mut c, &format!("r{i}"), p, json!({"cache": false})).await;
        assert_same(&format!("prompt {i} after kill -9"), &got, &reference);
        if i == 0 {
            let n = prompt_tokens(&got);
            assert_eq!(cached(&got), expected_cached(n, n), "p0 survived on disk");
        }
    }
}

/// A store written with another block size (another fingerprint) is ignored, and
/// said so once in the log.
#[tokio::test]
async fn a_store_of_another_fingerprint_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_str().expect("utf-8 path").to_string();
    let doc = document();
    let p1 = format!("{doc}Question: where is Marrow Rock? Answer:");
    let reference;
    {
        let mut daemon = Daemon::start_with_env(&[("INFERD__PREFIX_STORE__PATH", path.as_str())])
            .expect("daemon");
        let mut c = daemon.connect().await.expect("connect");
        reference = run(&mut c, "ref", &p1, json!({})).await;
        daemon.signal("TERM").expect("SIGTERM");
        assert_eq!(
            daemon.wait_exit(Duration::from_secs(30)).expect("exit"),
            Some(0)
        );
    }
    let daemon = Daemon::start_with_env(&[
        ("INFERD__PREFIX_STORE__PATH", path.as_str()),
        ("INFERD__SCHEDULER__BLOCK_SIZE", "32"),
        ("INFERD__LOG__LEVEL", "warn"),
    ])
    .expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let got = run(&mut c, "other", &p1, json!({})).await;
    assert_eq!(cached(&got), 0);
    assert_same("other block size", &got, &reference);
    let log = daemon.stderr_tail();
    assert_eq!(
        log.matches("prefix store holds blocks written for another model")
            .count(),
        1,
        "{log}"
    );
}

/// `prefix_store.path` naming someone else's directory is refused at start-up with the
/// field named and nothing in it touched; a path the file system refuses (here: a
/// regular file) leaves the daemon serving with the memory tier only.
#[tokio::test]
async fn a_store_path_that_cannot_be_used() {
    let dir = tempfile::tempdir().expect("tempdir");
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "mine").expect("write");
    let config = workspace_root().join("configs/test.toml");
    let model = model_path();
    let plugins = plugins_dir();
    let (code, err) = start_failure(
        &[
            "--config",
            config.to_str().expect("utf-8 path"),
            "--model",
            model.to_str().expect("utf-8 path"),
            "--listen",
            "127.0.0.1:0",
        ],
        &[
            (
                "INFERD__PREFIX_STORE__PATH",
                dir.path().to_str().expect("utf-8"),
            ),
            ("INFERD__PLUGINS__DIR", plugins.to_str().expect("utf-8")),
        ],
    )
    .expect("run");
    assert!(code.is_some_and(|c| c != 0), "exit {code:?}: {err}");
    assert!(
        err.contains("prefix_store.path") && err.contains("is not an inferd prefix store"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("read_dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("notes.txt")]);
    assert_eq!(std::fs::read_to_string(&notes).expect("read"), "mine");

    let daemon =
        Daemon::start_with_env(&[("INFERD__PREFIX_STORE__PATH", notes.to_str().expect("utf-8"))])
            .expect("daemon");
    let s = stats(&daemon.url).await;
    assert_eq!(s["enabled"], true);
    assert_eq!(s["disk_enabled"], false);
    let log = daemon.stderr_tail();
    assert!(log.contains("running with the memory tier only"), "{log}");
}
