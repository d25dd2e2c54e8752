//! Structure-aware fuzzing of the edge at volume: a million generated inputs per
//! target through the WebSocket frame parser (`api::parse_client_message`) and the
//! OpenAI body translation (`api::openai::parse_body`, chat and completions), with the
//! generators, mutations and checks of the `cargo test` fuzz module
//! (`daemon/src/api/fuzz/`, included here with `#[path]`).
//!
//! `cargo bench -p inferd --bench fuzz_edge` (release). `INFERD_FUZZ_INPUTS` sets the
//! inputs per target (default 1,000,000), `INFERD_FUZZ_SEED` the generator's seed
//! (default 0: the same inputs every run). Each input runs under `catch_unwind`;
//! prints a table (target, inputs, accepted, rejected, panics, property failures,
//! inputs/s, µs per input in the target), the count of each mutation, writes
//! `target/bench/fuzz_edge.json`, and exits 1 on any panic or failed property.

// Only `size` is used here.
#[allow(dead_code)]
mod common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::json;

// The included files name crate items as `crate::api::…`, `crate::error::…` and
// `crate::request::…`: these imports give those paths the library's items.
use inferd::{api, error, request};

#[allow(dead_code)]
#[path = "../src/api/fuzz/mod.rs"]
mod fuzz;

use fuzz::check::{run, Outcome};
use fuzz::mutate::{cases, MUTATIONS};
use fuzz::Edge;

/// The tally of one target.
#[derive(Default)]
struct Tally {
    inputs: u64,
    accepted: u64,
    rejected: u64,
    panics: u64,
    failures: u64,
    wall: Duration,
    in_target: Duration,
    mutations: BTreeMap<&'static str, u64>,
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(non-string panic)".into())
}

fn fuzz(edge: Edge, inputs: u64, seed: u64) -> Tally {
    let defaults = api::SamplingDefaults::default();
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8] = edge as u8;
    let config = Config {
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &key));
    let strategy = cases(edge);
    let mut t = Tally::default();
    let start = Instant::now();
    for _ in 0..inputs {
        let case = match strategy.new_tree(&mut runner) {
            Ok(tree) => tree.current(),
            Err(e) => {
                // A bench defect, not the parser's: counted so that the run fails.
                if t.panics + t.failures < 5 {
                    eprintln!("{edge:?}: the generator refused: {e}");
                }
                t.failures += 1;
                continue;
            }
        };
        *t.mutations.entry(case.mutation).or_default() += 1;
        let at = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| run(&case, &defaults)));
        t.in_target += at.elapsed();
        t.inputs += 1;
        let shown = t.panics + t.failures < 5;
        match result {
            Ok(Ok(Outcome::Accepted)) => t.accepted += 1,
            Ok(Ok(Outcome::Rejected)) => t.rejected += 1,
            Ok(Err(why)) => {
                t.failures += 1;
                if shown {
                    eprintln!(
                        "{edge:?} property failed ({}, {:?}): {why}\n  input: {}",
                        case.mutation,
                        case.want,
                        String::from_utf8_lossy(&case.bytes)
                    );
                }
            }
            Err(p) => {
                t.panics += 1;
                if shown {
                    eprintln!(
                        "{edge:?} PANIC ({}): {}\n  input: {}",
                        case.mutation,
                        panic_text(&*p),
                        String::from_utf8_lossy(&case.bytes)
                    );
                }
            }
        }
    }
    t.wall = start.elapsed();
    t
}

fn main() {
    let inputs = common::size("INFERD_FUZZ_INPUTS", 1_000_000) as u64;
    let seed = common::size("INFERD_FUZZ_SEED", 0) as u64;
    // Panics are counted and shown with their input; the default hook's report would
    // only repeat them.
    std::panic::set_hook(Box::new(|_| {}));
    let targets = [
        ("websocket frame", Edge::Ws),
        ("openai chat body", Edge::Chat),
        ("openai completions body", Edge::Completion),
    ];
    let mut rows = Vec::new();
    for (name, edge) in targets {
        eprintln!("fuzzing {name}: {inputs} inputs");
        rows.push((name, fuzz(edge, inputs, seed)));
    }
    let _ = std::panic::take_hook();
    println!("| target | inputs | accepted | rejected | panics | property failures | inputs/s | µs/input in the target |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, t) in &rows {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {:.0} | {:.1} |",
            t.inputs,
            t.accepted,
            t.rejected,
            t.panics,
            t.failures,
            t.inputs as f64 / t.wall.as_secs_f64(),
            t.in_target.as_secs_f64() * 1e6 / t.inputs.max(1) as f64
        );
    }
    println!();
    println!("| mutation | {} |", targets.map(|t| t.0).join(" | "));
    println!("|---|---|---|---|");
    for m in MUTATIONS {
        let counts: Vec<String> = rows
            .iter()
            .map(|(_, t)| t.mutations.get(m).copied().unwrap_or(0).to_string())
            .collect();
        println!("| {m} | {} |", counts.join(" | "));
    }
    let json = json!(rows
        .iter()
        .map(|(name, t)| json!({
            "target": name,
            "inputs": t.inputs,
            "accepted": t.accepted,
            "rejected": t.rejected,
            "panics": t.panics,
            "property_failures": t.failures,
            "inputs_per_s": t.inputs as f64 / t.wall.as_secs_f64(),
            "us_per_input_in_target": t.in_target.as_secs_f64() * 1e6 / t.inputs.max(1) as f64,
            "seed": seed,
            "mutations": t.mutations,
        }))
        .collect::<Vec<_>>());
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("fuzz_edge.json");
    match std::fs::write(&path, format!("{json:#}\n")) {
        Ok(()) => println!("wrote {}", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
    if rows.iter().any(|(_, t)| t.panics + t.failures > 0) {
        eprintln!("fuzz_edge: panics or failed properties (see above)");
        std::process::exit(1);
    }
}
