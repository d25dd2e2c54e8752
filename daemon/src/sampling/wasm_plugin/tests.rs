//! Host tests against the bundled plugins (built by `scripts/build-plugins.sh` into
//! `target/e2e-plugins/`, or `INFERD_PLUGINS_DIR`), on a small synthetic vocabulary.
//! Every sandbox limit is tested as an obeyed/violated pair.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::bindings::SpecialTokenIds;
use super::*;
use crate::error::{ErrorKind, InferError};
use crate::request::PluginSpec;

/// Token ids of the synthetic vocabulary: 0..=255 are the single bytes, then words.
const WORDS: &[&str] = &[
    "Par", "is", "Paris", " Paris", " Par", "P", "aris", "London", " the", "<|eos|>",
];
const EOS: u32 = 256 + 9;

fn word_id(w: &str) -> u32 {
    256 + WORDS.iter().position(|x| *x == w).expect("word in vocab") as u32
}

pub(super) fn vocab() -> Arc<PluginVocab> {
    let tokens = (0..=255u8)
        .map(|b| vec![b])
        .chain(WORDS.iter().map(|w| w.as_bytes().to_vec()));
    Arc::new(PluginVocab::new(
        tokens,
        SpecialTokenIds {
            bos: None,
            eos: Some(EOS),
            end_of_generation: vec![EOS],
            control: vec![EOS],
        },
    ))
}

pub(super) fn plugin_dir() -> PathBuf {
    std::env::var_os("INFERD_PLUGINS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-plugins"),
        PathBuf::from,
    )
}

pub(super) fn limits() -> PluginLimits {
    PluginLimits {
        // Generous: tests share 2 cores with other test binaries; the violating plugins
        // never return, so the margin does not weaken the tests.
        call_deadline: Duration::from_millis(100),
        configure_deadline: Duration::from_millis(500),
        memory_bytes: 64 << 20,
        ..PluginLimits::default()
    }
}

fn registry_with(limits: PluginLimits) -> PluginRegistry {
    let dir = plugin_dir();
    let (reg, errors) = PluginRegistry::load_dir(&dir, vocab(), limits).expect("engine");
    assert!(errors.is_empty(), "plugin load errors: {errors:?}");
    assert!(
        reg.list().len() >= 8,
        "expected the bundled plugins in {} (run scripts/build-plugins.sh); found {:?}",
        dir.display(),
        reg.list()
    );
    reg
}

/// One registry shared by the tests (compiling the plugins is the slow part).
pub(super) fn registry() -> &'static PluginRegistry {
    static REG: OnceLock<PluginRegistry> = OnceLock::new();
    REG.get_or_init(|| registry_with(limits()))
}

pub(super) fn spec(name: &str, config: &str) -> PluginSpec {
    PluginSpec {
        name: name.into(),
        config: config.into(),
    }
}

pub(super) fn chain(specs: &[PluginSpec]) -> PluginChain {
    registry()
        .instantiate(specs, 7, "test")
        .expect("instantiate")
        .expect("a chain")
}

pub(super) fn logits() -> Vec<f32> {
    (0..vocab().len()).map(|i| (i % 13) as f32 * 0.1).collect()
}

pub(super) fn step(generated: &[u32]) -> StepView<'_> {
    StepView {
        sequence_id: 1,
        prompt_tokens: 3,
        generated,
    }
}

pub(super) fn expect_trap(r: Result<(), InferError>, fragments: &[&str]) {
    let e = r.expect_err("plugin should fail");
    assert_eq!(e.kind, ErrorKind::PluginTrap, "{}", e.message);
    for f in fragments {
        assert!(e.message.contains(f), "{:?} lacks {f:?}", e.message);
    }
}

#[test]
fn bundled_plugins_load_with_their_world_and_version() {
    let list = registry().list();
    let worlds: Vec<(&str, PluginWorld)> =
        list.iter().map(|d| (d.name.as_str(), d.world)).collect();
    for (name, world) in [
        ("ban_words", PluginWorld::LogitsProcessor),
        ("busy_loop", PluginWorld::LogitsProcessor),
        ("memory_bomb", PluginWorld::LogitsProcessor),
        ("min_tokens", PluginWorld::LogitsProcessor),
        ("mirostat", PluginWorld::Sampler),
        ("noop", PluginWorld::LogitsProcessor),
        ("repetition_guard", PluginWorld::LogitsProcessor),
        ("trap", PluginWorld::LogitsProcessor),
    ] {
        assert!(
            worlds.contains(&(name, world)),
            "{name} missing in {worlds:?}"
        );
    }
    for d in &list {
        assert_eq!(d.interface, INTERFACE, "{}", d.name);
        assert!(!d.version.is_empty(), "{} has no version", d.name);
    }
}

#[test]
fn noop_keeps_the_logits_whether_or_not_it_reads_them() {
    for config in ["{}", r#"{"scan": true}"#, r#"{"scan": false}"#] {
        let mut c = chain(&[spec("noop", config)]);
        let mut l = logits();
        c.process(&step(&[1, 2]), &mut l).expect("process");
        assert_eq!(l, logits(), "{config}");
    }
    let e = registry()
        .instantiate(&[spec("noop", r#"{"scan": 1}"#)], 1, "t")
        .expect_err("not a boolean");
    assert_eq!(e.kind, ErrorKind::Validation);
    assert!(
        e.message.ends_with("scan: must be true or false, got 1"),
        "{}",
        e.message
    );
}

#[test]
fn a_file_that_is_not_a_component_is_refused_with_a_reason() {
    let dir = std::env::temp_dir().join(format!("inferd-plugin-junk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join("junk.wasm"), b"\0asm\x01\0\0\0garbage").expect("write");
    let (reg, errors) = PluginRegistry::load_dir(&dir, vocab(), limits()).expect("engine");
    assert!(reg.list().is_empty());
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].reason.starts_with("not loadable"),
        "{}",
        errors[0]
    );
    let missing = dir.join("nope");
    let (reg, errors) = PluginRegistry::load_dir(&missing, vocab(), limits()).expect("engine");
    assert!(reg.list().is_empty() && errors.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_names_bad_configs_and_misplaced_samplers_are_validation_errors() {
    let reg = registry();
    let e = reg
        .instantiate(&[spec("noop", "{}"), spec("nope", "{}")], 1, "t")
        .expect_err("unknown");
    assert_eq!(e.kind, ErrorKind::Validation);
    assert!(
        e.message
            .starts_with("plugins[1].name: no plugin named \"nope\" is loaded (loaded: ban_words,"),
        "{}",
        e.message
    );
    let e = reg
        .instantiate(&[spec("mirostat", "{}"), spec("noop", "{}")], 1, "t")
        .expect_err("sampler first");
    assert_eq!(e.kind, ErrorKind::Validation);
    assert!(
        e.message
            .contains("plugins[0]: \"mirostat\" is a sampler and must be the last entry"),
        "{}",
        e.message
    );
    let e = reg
        .instantiate(&[spec("ban_words", r#"{"words":[]}"#)], 1, "t")
        .expect_err("bad config");
    assert_eq!(e.kind, ErrorKind::Validation);
    assert!(
        e.message
            .starts_with("plugins[0].config: plugin \"ban_words\" rejected it: words"),
        "{}",
        e.message
    );
    let e = reg
        .instantiate(&[spec("min_tokens", r#"{"min_tokens":0}"#)], 1, "t")
        .expect_err("bad config (C plugin)");
    assert_eq!(e.kind, ErrorKind::Validation);
    assert!(e.message.contains("min_tokens"), "{}", e.message);
    assert!(reg.instantiate(&[], 1, "t").expect("empty").is_none());
    let long = "x".repeat(1000);
    let e = reg
        .instantiate(&[spec(&long, "{}")], 1, "t")
        .expect_err("unknown long name");
    assert!(
        e.message.starts_with(&format!(
            "plugins[0].name: no plugin named {:?} (cut) is loaded",
            "x".repeat(64)
        )),
        "{}",
        e.message
    );
}

#[test]
fn deadline_obeyed_and_violated() {
    let mut ok = chain(&[spec("busy_loop", r#"{"iterations":1000}"#)]);
    let mut l = logits();
    for n in 0..3u32 {
        let generated: Vec<u32> = (0..n).collect();
        ok.process(&step(&generated), &mut l)
            .expect("obeys the deadline");
    }
    assert_eq!(l, logits(), "busy_loop keeps the logits");

    let mut bad = chain(&[spec("busy_loop", "{}")]);
    expect_trap(
        bad.process(&step(&[]), &mut logits()),
        &[
            "plugin busy_loop (request test) (plugins[0])",
            "exceeded its deadline of 100 ms in process",
        ],
    );
    let e = registry()
        .instantiate(&[spec("busy_loop", r#"{"in_configure":true}"#)], 1, "t")
        .expect_err("configure never returns");
    assert_eq!(e.kind, ErrorKind::PluginTrap);
    assert!(
        e.message
            .contains("exceeded its deadline of 500 ms in configure"),
        "{}",
        e.message
    );
    // The obeying request is unaffected by its neighbour's timeout.
    ok.process(&step(&[1]), &mut logits()).expect("still fine");
}

#[test]
fn memory_limit_obeyed_and_violated() {
    let mut ok = chain(&[spec("memory_bomb", r#"{"mib":8}"#)]);
    ok.process(&step(&[]), &mut logits())
        .expect("8 MiB fits in 64 MiB");
    ok.process(&step(&[1]), &mut logits()).expect("and stays");
    let mut bad = chain(&[spec("memory_bomb", "{}")]);
    expect_trap(
        bad.process(&step(&[]), &mut logits()),
        &[
            "plugin memory_bomb (request test) (plugins[0]) broke its memory limit",
            "plugins.memory_bytes = 67108864 in process",
        ],
    );
    // A lower limit turns the obeying config into a violation.
    let small = registry_with(PluginLimits {
        memory_bytes: 4 << 20,
        ..limits()
    });
    let mut c = small
        .instantiate(&[spec("memory_bomb", r#"{"mib":8}"#)], 1, "t")
        .expect("instantiate")
        .expect("chain");
    expect_trap(
        c.process(&step(&[]), &mut logits()),
        &["broke its memory limit", "plugins.memory_bytes = 4194304"],
    );
    ok.process(&step(&[1, 2]), &mut logits())
        .expect("the neighbour still runs");
}

#[test]
fn a_plugin_with_limits_of_its_own_and_its_cost_in_the_list() {
    let global = PluginLimits {
        memory_bytes: 4 << 20,
        ..limits()
    };
    let own = PluginLimits {
        memory_bytes: 32 << 20,
        call_deadline: Duration::from_millis(250),
        ..limits()
    };
    let (reg, errors) = PluginRegistry::empty(vocab(), global)
        .expect("engine")
        .with_overrides([("memory_bomb".to_string(), own)].into())
        .load_all(&plugin_dir())
        .expect("plugins dir");
    assert!(errors.is_empty(), "{errors:?}");
    // 8 MiB fits memory_bomb's own 32 MiB, not the 4 MiB of everyone else.
    let mut c = reg
        .instantiate(&[spec("memory_bomb", r#"{"mib":8}"#)], 1, "t")
        .expect("instantiate")
        .expect("chain");
    c.process(&step(&[]), &mut logits()).expect("8 MiB fits");
    drop(c);
    let mut c = reg
        .instantiate(&[spec("memory_bomb", r#"{"mib":40}"#)], 1, "t")
        .expect("instantiate")
        .expect("chain");
    expect_trap(
        c.process(&step(&[]), &mut logits()),
        &[
            "broke its memory limit",
            "plugins.limits.memory_bomb.memory_bytes = 33554432",
        ],
    );
    drop(c);
    let list = reg.list();
    let find = |name: &str| list.iter().find(|p| p.name == name).expect(name);
    let (bomb, ban) = (find("memory_bomb"), find("ban_words"));
    assert_eq!(
        (bomb.limits.memory_bytes, bomb.limits.call_deadline_ms),
        (32 << 20, 250.0)
    );
    assert_eq!(
        (ban.limits.memory_bytes, ban.limits.call_deadline_ms),
        (4 << 20, 100.0)
    );
    // The load-time probe and two requests; two process calls; the 8 MiB it wrote.
    assert_eq!((bomb.cost.instantiations, bomb.cost.calls), (3, 2));
    assert!(bomb.cost.instantiate_ms_mean > 0.0 && bomb.cost.call_us_mean > 0.0);
    assert!(
        (8 << 20..=32 << 20).contains(&bomb.cost.memory_bytes_peak),
        "{:?}",
        bomb.cost
    );
    assert_eq!((ban.cost.instantiations, ban.cost.calls), (1, 0));
}

#[test]
fn trap_obeyed_and_violated() {
    let mut ok = chain(&[spec("trap", r#"{"never":true}"#)]);
    let mut bad = chain(&[spec("trap", r#"{"after_steps":2}"#)]);
    for n in 0..2u32 {
        let generated: Vec<u32> = (0..n).collect();
        ok.process(&step(&generated), &mut logits()).expect("ok");
        bad.process(&step(&generated), &mut logits())
            .expect("first two steps are fine");
    }
    expect_trap(
        bad.process(&step(&[0, 1]), &mut logits()),
        &[
            "plugin trap (request test) (plugins[0]) trapped: unreachable instruction",
            "in process",
        ],
    );
    ok.process(&step(&[0, 1]), &mut logits())
        .expect("the neighbour still runs");
    let e = registry()
        .instantiate(&[spec("trap", r#"{"in_configure":true}"#)], 1, "t")
        .expect_err("panics in configure");
    assert_eq!(e.kind, ErrorKind::PluginTrap);
    assert!(
        e.message.contains("trapped: unreachable instruction"),
        "{}",
        e.message
    );
    assert!(e.message.ends_with("in configure"), "{}", e.message);
}

#[test]
fn invalid_answers_are_rejected_as_plugin_traps() {
    for (answer, fragment) in [
        (
            "out_of_range",
            "returned an invalid edit: ban: token id 266 is out of range (vocabulary size 266)",
        ),
        (
            "nan",
            "returned an invalid edit: bias: value for token 0 must be finite or -inf, got NaN",
        ),
        (
            "remove_all",
            "returned an invalid edit: the edit left no token with a finite logit",
        ),
        (
            "err",
            "returned an error in process: trap: an error result, as configured",
        ),
    ] {
        let config = format!(r#"{{"never":true,"answer":"{answer}"}}"#);
        let mut c = chain(&[spec("noop", "{}"), spec("trap", &config)]);
        expect_trap(
            c.process(&step(&[]), &mut logits()),
            &["plugin trap (request test) (plugins[1]) ", fragment],
        );
    }
}

#[test]
fn ban_words_bans_whole_and_completing_tokens() {
    let mut c = chain(&[spec("ban_words", r#"{"words":["Paris"]}"#)]);
    let mut l = logits();
    c.process(&step(&[]), &mut l).expect("process");
    let banned = |l: &[f32]| -> Vec<u32> {
        (0..l.len() as u32)
            .filter(|&i| l[i as usize] == f32::NEG_INFINITY)
            .collect()
    };
    // Nothing generated yet: only the tokens that contain "Paris" themselves.
    assert_eq!(banned(&l), vec![word_id("Paris"), word_id(" Paris")]);
    // After " Par", the tokens completing "Paris" ("is", "i" is only a prefix) are banned.
    let mut l = logits();
    c.process(&step(&[word_id(" Par")]), &mut l)
        .expect("process");
    let mut want = vec![word_id("is"), word_id("Paris"), word_id(" Paris")];
    want.sort_unstable();
    assert_eq!(banned(&l), want);
    // After " Par" + "i": only "s" completes it.
    let mut l = logits();
    c.process(&step(&[word_id(" Par"), u32::from(b'i')]), &mut l)
        .expect("process");
    let mut want = vec![u32::from(b's'), word_id("Paris"), word_id(" Paris")];
    want.sort_unstable();
    assert_eq!(banned(&l), want);
    // "P" then: "aris" completes.
    let mut l = logits();
    c.process(
        &step(&[
            word_id(" Par"),
            u32::from(b'i'),
            u32::from(b'x'),
            word_id("P"),
        ]),
        &mut l,
    )
    .expect("process");
    let mut want = vec![word_id("aris"), word_id("Paris"), word_id(" Paris")];
    want.sort_unstable();
    assert_eq!(banned(&l), want);
}

#[test]
fn repetition_guard_blocks_a_repeated_ngram() {
    let mut c = chain(&[spec("repetition_guard", r#"{"ngram":3}"#)]);
    let mut l = logits();
    c.process(&step(&[5, 6, 7, 8, 5, 6]), &mut l)
        .expect("process");
    let banned: Vec<usize> = (0..l.len())
        .filter(|&i| l[i] == f32::NEG_INFINITY)
        .collect();
    assert_eq!(banned, vec![7]);
    let mut l = logits();
    c.process(&step(&[5, 6, 7, 8, 6]), &mut l).expect("process");
    assert_eq!(l, logits(), "no repeated 2-gram prefix: keep");
}

#[test]
fn min_tokens_c_plugin_bans_end_of_generation_until_the_minimum() {
    let mut c = chain(&[spec("min_tokens", r#"{"min_tokens":2}"#)]);
    for (generated, banned) in [(vec![], true), (vec![1], true), (vec![1, 2], false)] {
        let mut l = logits();
        c.process(&step(&generated), &mut l).expect("process");
        assert_eq!(
            l[EOS as usize] == f32::NEG_INFINITY,
            banned,
            "after {} tokens",
            generated.len()
        );
        let others_unchanged = l
            .iter()
            .zip(logits())
            .enumerate()
            .all(|(i, (a, b))| i == EOS as usize || *a == b);
        assert!(others_unchanged);
    }
}

#[test]
fn mirostat_reproduces_with_the_same_randoms_and_stays_in_the_distribution() {
    let run = |randoms: &[f64]| -> Vec<u32> {
        let mut c = chain(&[spec("mirostat", r#"{"tau":3.0,"eta":0.1}"#)]);
        assert!(c.has_sampler());
        let mut generated = Vec::new();
        for &u in randoms {
            let mut l = logits();
            // A processor-removed token must never be chosen.
            l[12] = f32::NEG_INFINITY;
            let t = c.sample(&step(&generated), &l, u).expect("sample");
            assert_ne!(t, 12);
            generated.push(t);
        }
        generated
    };
    let u: Vec<f64> = (0..32).map(|i| f64::from((i * 37) % 100) / 100.0).collect();
    let a = run(&u);
    assert_eq!(a, run(&u), "same randoms, same tokens");
    let v: Vec<f64> = u.iter().map(|x| (x + 0.5) % 1.0).collect();
    assert_ne!(a, run(&v), "other randoms, other tokens");
    let e = registry()
        .instantiate(&[spec("mirostat", r#"{"tau":0}"#)], 1, "t")
        .expect_err("tau 0");
    assert_eq!(e.kind, ErrorKind::Validation);
    assert!(e.message.contains("tau"), "{}", e.message);
}

#[test]
fn processors_apply_in_order_before_the_sampler() {
    // ban_words removes the "Paris" tokens, then noop keeps; the chain's sampler never
    // picks a banned token even when it has by far the largest logit.
    let mut c = chain(&[
        spec("ban_words", r#"{"words":["Paris"]}"#),
        spec("noop", "{}"),
        spec("mirostat", "{}"),
    ]);
    for i in 0..20u32 {
        let mut l = logits();
        l[word_id("Paris") as usize] = 50.0;
        l[word_id(" Paris") as usize] = 49.0;
        l[word_id("London") as usize] = 10.0;
        c.process(&step(&[]), &mut l).expect("process");
        let t = c
            .sample(&step(&[]), &l, f64::from(i) / 20.0)
            .expect("sample");
        assert_eq!(t, word_id("London"));
    }
}
