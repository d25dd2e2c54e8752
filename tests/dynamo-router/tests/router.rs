//! NVIDIA Dynamo's KV router over three inferd replicas, from inferd's KV-cache
//! events alone: Dynamo's own crate (`dynamo-kv-router`) decodes each ZeroMQ payload
//! with its vLLM wire types (`zmq_wire::decode_event_batch`), normalizes it
//! (`ZmqEventNormalizer`) and indexes it in its radix tree (`RadixTree`); each request
//! goes to the replica with the longest predicted prefix overlap
//! (`RadixTree::find_matches` over `compute_block_hash_for_seq`).
//!
//! Workload: 32 two-turn conversations over 8 shared system prompts (token-id prompts),
//! one request at a time. Checked: routed placement keeps at least 90 % of the cached
//! prompt tokens one daemon gets, and for every request the router's predicted overlap
//! equals the `cached_tokens` the chosen replica reports, to the block. Round-robin
//! placement is measured beside it. The figures are printed and written to
//! `target/bench/dynamo-router.json`.
//!
//! The CPU runner's KV pool publishes medium `CPU`: its events are the replica's
//! resident blocks, indexed here. `DISK` events (the prefix store) are left out: a
//! replica serves a prompt from memory first and this workload never evicts.

use std::time::Duration;

use bytes::Bytes;
use dynamo_kv_router::protocols::{BlockHashOptions, WorkerWithDpRank};
use dynamo_kv_router::zmq_wire::{decode_event_batch, ZmqEventNormalizer};
use dynamo_kv_router::{compute_block_hash_for_seq, RadixTree};
use serde_json::{json, Value};
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use inferd_e2e::{workspace_root, Client, Daemon};

const BLOCK: usize = 16;
const SYSTEM_PROMPTS: u32 = 8;
const CONVERSATIONS: u32 = 32;
const SYSTEM_TOKENS: u32 = 64;
const USER_TOKENS: u32 = 20;
const MAX_TOKENS: usize = 4;

fn events_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("INFERD__KV_EVENTS__ENABLED", "true"),
        ("INFERD__KV_EVENTS__ENDPOINT", "tcp://127.0.0.1:0"),
        ("INFERD__KV_EVENTS__REPLAY_ENDPOINT", "tcp://127.0.0.1:0"),
        // No speculative drafts: one sampled token per step keeps the runs simple to
        // read (the events do not depend on it).
        ("INFERD__SPECULATIVE__METHOD", "off"),
    ]
}

/// One replica's event feed into the router's tree.
struct Feed {
    sub: SubSocket,
    replay: DealerSocket,
    next_seq: u64,
    normalizer: ZmqEventNormalizer,
    worker: WorkerWithDpRank,
    event_id: u64,
}

fn seq_of(b: &Bytes) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

impl Feed {
    async fn connect(d: &Daemon, worker_id: u64) -> Self {
        let (pub_ep, replay_ep) = d.kv_events().expect("kv events endpoints");
        let mut sub = SubSocket::new();
        sub.connect(&pub_ep).await.expect("SUB connect");
        sub.subscribe("kv-events").await.expect("subscribe");
        let mut replay = DealerSocket::new();
        replay.connect(&replay_ep).await.expect("DEALER connect");
        Self {
            sub,
            replay,
            next_seq: 0,
            normalizer: ZmqEventNormalizer::new(BLOCK as u32),
            worker: WorkerWithDpRank::new(worker_id, 0),
            event_id: 0,
        }
    }

    /// Applies every message up to (not including) `published`, in order: from the
    /// SUB socket, and from the replay socket for what it missed (messages before the
    /// subscription took effect, or a gap).
    async fn sync_to(&mut self, published: u64, tree: &mut RadixTree) {
        while self.next_seq < published {
            let msg = tokio::time::timeout(Duration::from_millis(500), self.sub.recv()).await;
            let frames = match msg {
                Ok(Ok(m)) => m.into_vec(),
                _ => {
                    self.replay_from(tree).await;
                    continue;
                }
            };
            assert_eq!(frames.len(), 3, "[topic, seq, payload]");
            let seq = seq_of(&frames[1]);
            if seq < self.next_seq {
                continue;
            }
            if seq > self.next_seq {
                self.replay_from(tree).await;
                if seq < self.next_seq {
                    continue;
                }
            }
            self.apply(seq, &frames[2], tree);
        }
    }

    async fn replay_from(&mut self, tree: &mut RadixTree) {
        let req = ZmqMessage::try_from(vec![
            Bytes::new(),
            Bytes::copy_from_slice(&self.next_seq.to_be_bytes()),
        ])
        .expect("frames");
        self.replay.send(req).await.expect("replay request");
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), self.replay.recv())
                .await
                .expect("replay reply in time")
                .expect("replay reply")
                .into_vec();
            assert_eq!(m.len(), 3, "[\"\", seq, payload]");
            if m[1][..] == (-1i64).to_be_bytes() {
                assert!(
                    m[2].is_empty(),
                    "replay refused: {:?}",
                    String::from_utf8_lossy(&m[2])
                );
                return;
            }
            let seq = seq_of(&m[1]);
            if seq == self.next_seq {
                self.apply(seq, &m[2], tree);
            }
        }
    }

    fn apply(&mut self, seq: u64, payload: &[u8], tree: &mut RadixTree) {
        let batch = decode_event_batch(payload).expect("Dynamo decodes inferd's payload");
        for raw in batch.events {
            if raw.medium() == Some("DISK") {
                continue;
            }
            self.event_id += 1;
            let placed = self
                .normalizer
                .normalize(raw, self.event_id, self.worker)
                .and_then(|p| p.into_router_event());
            if let Some(event) = placed {
                tree.apply_event(event)
                    .expect("the radix tree takes the event");
            }
        }
        self.next_seq = seq + 1;
    }
}

/// The workload: (conversation, turn-1 prompt, the user tokens of turn 2), ids offset
/// by `base` so that the arms never share a block.
fn conversations(base: u32) -> Vec<(Vec<u32>, Vec<u32>)> {
    (0..CONVERSATIONS)
        .map(|c| {
            let sys = c % SYSTEM_PROMPTS;
            let system = (0..SYSTEM_TOKENS).map(|i| base + 100 + sys * 100 + i);
            let user = (0..USER_TOKENS).map(|i| base + 2000 + c * 50 + i);
            let turn2 = (0..USER_TOKENS).map(|i| base + 4000 + c * 50 + i).collect();
            (system.chain(user).collect(), turn2)
        })
        .collect()
}

async fn generate(c: &mut Client, id: &str, prompt: &[u32]) -> (Vec<u32>, usize) {
    let g = c
        .generate(json!({"type": "generate", "id": id, "prompt": prompt,
                         "max_tokens": MAX_TOKENS, "temperature": 0}))
        .await
        .expect("generate");
    assert_eq!(g.error, None, "{id}");
    let cached = g
        .started
        .as_ref()
        .and_then(|s| s["cached_tokens"].as_u64())
        .expect("started.cached_tokens") as usize;
    (g.token_ids, cached)
}

/// How an arm places request `k` (turn 1 of conversation c is 2c, turn 2 is 2c + 1).
enum Placement {
    Single,
    RoundRobin,
    Router,
}

struct Arm {
    cached: usize,
    prompt: usize,
    predicted_equal: usize,
    requests: usize,
}

async fn run_arm(
    how: Placement,
    base: u32,
    clients: &mut [Client],
    feeds: &mut [Feed],
    tree: &mut RadixTree,
) -> Arm {
    let mut arm = Arm {
        cached: 0,
        prompt: 0,
        predicted_equal: 0,
        requests: 0,
    };
    let mut k = 0usize;
    for (c, (turn1, user2)) in conversations(base).into_iter().enumerate() {
        let mut prompt = turn1;
        for turn in 0..2 {
            let (replica, predicted) = match how {
                Placement::Single => (0, None),
                Placement::RoundRobin => (k % clients.len(), None),
                Placement::Router => {
                    for (i, f) in feeds.iter_mut().enumerate() {
                        let st = clients[i].stats().await.expect("stats");
                        let published = st["kv_events"]["published"].as_u64().expect("published");
                        f.sync_to(published, tree).await;
                    }
                    let hashes = compute_block_hash_for_seq(
                        &prompt,
                        BLOCK as u32,
                        BlockHashOptions::default(),
                    );
                    let scores = tree.find_matches(hashes, false).scores;
                    // Best overlap; ties to the replica with fewer requests so far, then
                    // the lowest index.
                    let best = (0..feeds.len())
                        .max_by_key(|&i| {
                            let s = scores.get(&feeds[i].worker).copied().unwrap_or(0);
                            (s, std::cmp::Reverse((k + i) % feeds.len()))
                        })
                        .unwrap_or(0);
                    let s = scores.get(&feeds[best].worker).copied().unwrap_or(0);
                    (best, Some(s as usize))
                }
            };
            let (tokens, cached) =
                generate(&mut clients[replica], &format!("c{c}t{turn}"), &prompt).await;
            if let Some(p) = predicted {
                assert_eq!(
                    p * BLOCK,
                    cached,
                    "conversation {c} turn {turn} on replica {replica}: predicted {p} blocks"
                );
                arm.predicted_equal += 1;
            }
            arm.cached += cached;
            arm.prompt += prompt.len();
            arm.requests += 1;
            prompt.extend(tokens);
            prompt.extend(&user2);
            k += 1;
        }
    }
    arm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamo_routing_keeps_the_cache_hits_of_one_daemon() {
    let env = events_env();
    let replicas: Vec<Daemon> = (0..3)
        .map(|_| Daemon::start_with_env(&env).expect("replica"))
        .collect();
    let mut clients = Vec::new();
    for d in &replicas {
        clients.push(d.connect().await.expect("connect"));
    }
    let mut feeds = Vec::new();
    for (i, d) in replicas.iter().enumerate() {
        feeds.push(Feed::connect(d, 100 + i as u64).await);
    }
    let mut tree = RadixTree::new();
    let single = run_arm(Placement::Single, 0, &mut clients[..1], &mut [], &mut tree).await;
    let routed = run_arm(
        Placement::Router,
        10_000,
        &mut clients,
        &mut feeds,
        &mut tree,
    )
    .await;
    let rr = run_arm(
        Placement::RoundRobin,
        20_000,
        &mut clients,
        &mut [],
        &mut tree,
    )
    .await;
    let share = |a: &Arm| a.cached as f64 / single.cached as f64;
    println!("| placement | requests | prompt tokens | cached tokens | share of one daemon's |");
    println!("|---|---|---|---|---|");
    for (name, a) in [
        ("one daemon", &single),
        ("Dynamo KV router, 3 replicas", &routed),
        ("round-robin, 3 replicas", &rr),
    ] {
        println!(
            "| {name} | {} | {} | {} | {:.3} |",
            a.requests,
            a.prompt,
            a.cached,
            share(a)
        );
    }
    let out = workspace_root().join("target/bench");
    let _ = std::fs::create_dir_all(&out);
    let report: Value = json!({
        "single": {"cached_tokens": single.cached, "prompt_tokens": single.prompt},
        "router": {"cached_tokens": routed.cached, "prompt_tokens": routed.prompt,
                   "share": share(&routed), "predictions_equal": routed.predicted_equal},
        "round_robin": {"cached_tokens": rr.cached, "prompt_tokens": rr.prompt, "share": share(&rr)},
    });
    let _ = std::fs::write(out.join("dynamo-router.json"), report.to_string());
    assert_eq!(routed.predicted_equal, routed.requests);
    assert!(share(&routed) >= 0.9, "{report}");
    assert!(single.cached > 0, "{report}");
}
