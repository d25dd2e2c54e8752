//! Bounded structure-aware fuzzing of the edge (`cargo test`): valid and mutated
//! WebSocket frames and OpenAI bodies from `fuzz::gen` / `fuzz::mutate`, each run
//! through its entry point and checked by `fuzz::check` (never a panic; a refusal is a
//! `validation` error naming the field; a valid input is accepted with every field
//! as generated). `benches/fuzz_edge.rs` runs the same targets a million times each.
//! Also here: tests that each property can fail, and the inputs the fuzzer found.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

use super::fuzz::check::{names, run, Outcome};
use super::fuzz::mutate::{cases, valid_cases, Case, Want, MUTATIONS};
use super::fuzz::Edge;
use super::SamplingDefaults;

/// Cases per property: a few seconds for all of them in the dev profile.
const CASES: u32 = 2000;

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

fn check(case: &Case) -> Result<Outcome, TestCaseError> {
    run(case, &SamplingDefaults::default()).map_err(|e| {
        TestCaseError::fail(format!(
            "{} ({:?}, {}): {e}\ninput: {}",
            case.mutation,
            case.want,
            case.bytes.len(),
            String::from_utf8_lossy(&case.bytes)
        ))
    })
}

proptest! {
    #![proptest_config(config(CASES))]

    #[test]
    fn websocket_frames_hold_every_property(case in cases(Edge::Ws)) {
        check(&case)?;
    }

    #[test]
    fn chat_bodies_hold_every_property(case in cases(Edge::Chat)) {
        check(&case)?;
    }

    #[test]
    fn completion_bodies_hold_every_property(case in cases(Edge::Completion)) {
        check(&case)?;
    }

    #[test]
    fn valid_inputs_are_accepted_as_generated(
        ws in valid_cases(Edge::Ws),
        chat in valid_cases(Edge::Chat),
        completion in valid_cases(Edge::Completion),
    ) {
        for case in [ws, chat, completion] {
            prop_assert_eq!(check(&case)?, Outcome::Accepted);
        }
    }
}

/// `n` cases of `edge` from a fixed seed.
fn sample(edge: Edge, n: usize, valid: bool) -> Vec<Case> {
    let mut runner = TestRunner::deterministic();
    let strategy = if valid {
        valid_cases(edge)
    } else {
        cases(edge)
    };
    (0..n)
        .map(|_| strategy.new_tree(&mut runner).expect("case").current())
        .collect()
}

/// Every mutation occurs, and each target both accepts and refuses: no property is
/// checked on an empty set.
#[test]
fn the_mix_covers_every_mutation_and_both_outcomes() {
    for edge in [Edge::Ws, Edge::Chat, Edge::Completion] {
        let cases = sample(edge, 3000, false);
        for m in MUTATIONS {
            assert!(cases.iter().any(|c| c.mutation == *m), "{edge:?}: no {m}");
        }
        let outcomes: Vec<Outcome> = cases.iter().filter_map(|c| check(c).ok()).collect();
        assert_eq!(outcomes.len(), cases.len(), "{edge:?}: a property broke");
        for o in [Outcome::Accepted, Outcome::Rejected] {
            let share = outcomes.iter().filter(|x| **x == o).count() * 100 / outcomes.len();
            assert!(share >= 10, "{edge:?}: only {share}% {o:?}");
        }
    }
}

/// Each property fails on an input that breaks it.
#[test]
fn each_property_can_fail() {
    let defaults = SamplingDefaults::default();
    for edge in [Edge::Ws, Edge::Chat, Edge::Completion] {
        let valid = sample(edge, 50, true);
        let case = valid
            .iter()
            .find(|c| String::from_utf8_lossy(&c.bytes).contains("\"temperature\":"))
            .expect("a body with a temperature");
        // The round trip: the body says 0.25, the oracle something else.
        let mut v: serde_json::Value = serde_json::from_slice(&case.bytes).expect("json");
        v["temperature"] = serde_json::json!(0.25);
        let changed = Case {
            bytes: serde_json::to_vec(&v).expect("json"),
            ..case.clone()
        };
        let err = run(&changed, &defaults).expect_err("round trip");
        assert!(err.starts_with("temperature:"), "{err}");
        // A refusal must name the field it is about.
        v["temperature"] = serde_json::json!(-1);
        let wrong_field = Case {
            bytes: serde_json::to_vec(&v).expect("json"),
            want: Want::Reject("top_p".into()),
            ..case.clone()
        };
        let err = run(&wrong_field, &defaults).expect_err("names");
        assert!(err.contains("does not name \"top_p\""), "{err}");
        // A valid input refused, malformed JSON accepted: both caught.
        let refused = Case {
            want: Want::Accept,
            ..wrong_field.clone()
        };
        assert!(run(&refused, &defaults)
            .expect_err("refused")
            .starts_with("refused a valid"));
        let accepted = Case {
            want: Want::Malformed,
            ..case.clone()
        };
        assert!(run(&accepted, &defaults)
            .expect_err("accepted")
            .starts_with("accepted"));
    }
}

#[test]
fn names_is_a_word_match() {
    assert!(names("n must be >= 1 (got 0)", "n"));
    assert!(!names("min_tokens must be <= max_tokens = 5 (got 9)", "n"));
    assert!(names(
        "messages[2].role must be a string (got 5)",
        "messages"
    ));
    assert!(names(
        "logit_bias[\"7\"] must be a number (got null)",
        "logit_bias"
    ));
    assert!(!names("stop must be a string", "stop_words"));
    assert!(names(
        "unknown field \"x\\u0000\" in generate message",
        "x\u{0}"
    ));
    assert!(names(
        "unknown field \"x\\0\"; this endpoint accepts",
        "x\u{0}"
    ));
    assert!(names("unknown field \"\" in stats message", ""));
}
