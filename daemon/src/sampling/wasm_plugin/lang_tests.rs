//! Host tests of the Python (componentize-py) and JavaScript (ComponentizeJS) plugins,
//! built by `scripts/build-plugins.sh` into `target/e2e-lang-plugins/` (or
//! `INFERD_LANG_PLUGINS_DIR`), on the synthetic vocabulary of `tests`: the limit pairs
//! the Rust fixtures have (deadline, memory, trap), the sandbox as a Python plugin sees
//! it, and the bundled Python and JavaScript plugins against their specifications.
//!
//! Compiling an interpreter component takes seconds, so the registry keeps compiled
//! components in `target/plugin-compile-cache/` (shared with the end-to-end daemons).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use super::tests::{chain as rust_chain, expect_trap, logits, spec, step, vocab};
use super::wasi_tests::{field, pairs};
use super::*;
use crate::error::ErrorKind;
use crate::request::PluginSpec;

fn lang_dir() -> PathBuf {
    std::env::var_os("INFERD_LANG_PLUGINS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-lang-plugins"),
        PathBuf::from,
    )
}

/// The default limits but for the deadlines: an interpreter that reads the whole row
/// needs more than 10 ms per call (docs/plugins.md), and the tests share 2 cores (the
/// violating plugins never return, so the margin does not weaken the tests).
fn lang_limits() -> PluginLimits {
    PluginLimits {
        call_deadline: Duration::from_millis(300),
        configure_deadline: Duration::from_secs(5),
        ..PluginLimits::default()
    }
}

fn registry() -> &'static PluginRegistry {
    static REG: OnceLock<PluginRegistry> = OnceLock::new();
    REG.get_or_init(|| {
        let cache =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/plugin-compile-cache");
        let (reg, errors) = PluginRegistry::empty(vocab(), lang_limits())
            .map(|r| r.with_compile_cache(CompileCache::new(Some(cache))))
            .and_then(|r| r.load_all(&lang_dir()))
            .expect("engine");
        assert!(errors.is_empty(), "plugin load errors: {errors:?}");
        reg
    })
}

fn chain(specs: &[PluginSpec]) -> PluginChain {
    registry()
        .instantiate(specs, 7, "test")
        .expect("instantiate")
        .expect("a chain")
}

fn configure_error(name: &str, config: &str, seed: u64) -> String {
    let e = registry()
        .instantiate(&[spec(name, config)], seed, "t")
        .expect_err("the config is refused");
    assert_eq!(e.kind, ErrorKind::Validation, "{}", e.message);
    let prefix = format!("plugins[0].config: plugin {name:?} rejected it: ");
    e.message
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{:?} lacks {prefix:?}", e.message))
        .to_string()
}

#[test]
fn the_python_and_javascript_plugins_load_with_their_worlds() {
    let list = registry().list();
    let world = |name: &str| {
        list.iter()
            .find(|d| d.name == name)
            .unwrap_or_else(|| {
                panic!(
                    "{name} not in {} (run scripts/build-plugins.sh)",
                    lang_dir().display()
                )
            })
            .world
    };
    assert_eq!(world("ban_words_py"), PluginWorld::ContextProcessor);
    assert_eq!(world("no_digits_js"), PluginWorld::ContextProcessor);
    assert_eq!(world("temperature_schedule_py"), PluginWorld::Sampler);
    assert_eq!(world("py_probe"), PluginWorld::LogitsProcessor);
    assert_eq!(world("js_probe"), PluginWorld::LogitsProcessor);
    for d in &list {
        assert_eq!(d.interface, INTERFACE, "{}", d.name);
    }
}

#[test]
fn deadline_obeyed_and_violated() {
    for probe in ["py_probe", "js_probe"] {
        let mut ok = chain(&[spec(probe, "{}")]);
        let mut scan = chain(&[spec(probe, r#"{"scan": true}"#)]);
        let mut bad = chain(&[spec(probe, r#"{"spin": true}"#)]);
        for n in 0..3u32 {
            let generated: Vec<u32> = (0..n).collect();
            let mut l = logits();
            ok.process(&step(&generated), &mut l).expect(probe);
            scan.process(&step(&generated), &mut l).expect(probe);
            assert_eq!(l, logits(), "{probe}: keep and a bias of 0 change nothing");
        }
        expect_trap(
            bad.process(&step(&[]), &mut logits()),
            &[probe, "exceeded its deadline of 300 ms in process"],
        );
        // The neighbour is unharmed.
        ok.process(&step(&[1]), &mut logits()).expect(probe);
    }
}

#[test]
fn memory_obeyed_and_violated() {
    for probe in ["py_probe", "js_probe"] {
        let mut ok = chain(&[spec(probe, r#"{"alloc_mb": 8}"#)]);
        for n in 0..3u32 {
            let generated: Vec<u32> = (0..n).collect();
            ok.process(&step(&generated), &mut logits())
                .unwrap_or_else(|e| panic!("{probe}: 24 MiB more in 64: {}", e.message));
        }
        let mut bad = chain(&[spec(probe, r#"{"alloc_mb": 512}"#)]);
        expect_trap(
            bad.process(&step(&[]), &mut logits()),
            &[
                probe,
                "broke its memory limit",
                "plugins.memory_bytes = 67108864",
            ],
        );
        let mut neighbour = chain(&[spec(probe, "{}")]);
        neighbour.process(&step(&[]), &mut logits()).expect(probe);
    }
}

#[test]
fn an_exception_fails_only_its_own_request() {
    let mut keep = chain(&[spec("py_probe", "{}"), spec("js_probe", "{}")]);
    for (probe, config, fragment) in [
        ("py_probe", r#"{"raise": true}"#, "trapped"),
        (
            "py_probe",
            r#"{"err": "no thanks"}"#,
            "returned an error in process: no thanks",
        ),
        ("js_probe", r#"{"throw": true}"#, "js_probe"),
        (
            "js_probe",
            r#"{"err": "no thanks"}"#,
            "returned an error in process: no thanks",
        ),
    ] {
        let mut bad = chain(&[spec(probe, config)]);
        expect_trap(bad.process(&step(&[]), &mut logits()), &[probe, fragment]);
        keep.process(&step(&[]), &mut logits())
            .expect("neighbour unaffected");
    }
}

/// The Python probe's sandbox report (see plugins/py_probe) for a request seeded with
/// `seed`, as `key=value` pairs.
fn py_report(seed: u64) -> Vec<(String, String)> {
    pairs(&configure_error("py_probe", r#"{"report": true}"#, seed))
}

#[test]
fn python_sees_no_files_sockets_or_environment_and_virtual_time() {
    let r = py_report(7);
    assert_eq!(field(&r, "file"), "FileNotFoundError", "{r:?}");
    assert_eq!(field(&r, "env"), "0", "{r:?}");
    assert_ne!(field(&r, "tcp"), "ok", "{r:?}");
    assert_ne!(field(&r, "dns"), "ok", "{r:?}");
    assert_eq!(field(&r, "stdin"), "0", "{r:?}");
    let wall: u64 = field(&r, "wall").parse().expect("secs");
    assert_eq!(wall, VIRTUAL_EPOCH_S);
    let mono: u64 = field(&r, "mono").parse().expect("ns");
    assert!(
        (1_500_000_000..1_500_000_000 + 100 * CLOCK_STEP_NS).contains(&mono),
        "{mono}"
    );
}

/// componentize-py keeps only what the build-time snapshot imported: with no files in
/// the sandbox, a module first imported at run time is not found.
#[test]
fn python_imports_only_what_the_snapshot_holds() {
    let e = configure_error("py_probe", r#"{"import": "statistics"}"#, 1);
    assert!(
        e.ends_with("ModuleNotFoundError: No module named 'statistics'"),
        "{e}"
    );
}

#[test]
fn python_random_comes_from_the_request_seed() {
    let (a, b, c) = (py_report(7), py_report(7), py_report(8));
    for key in ["random", "urandom"] {
        assert_eq!(field(&a, key), field(&b, key), "{key}");
        assert_ne!(field(&a, key), field(&c, key), "{key}");
    }
}

#[test]
fn javascript_sees_virtual_time_and_seeded_random() {
    let report = |seed| configure_error("js_probe", r#"{"report": true}"#, seed);
    let (a, b, c) = (report(7), report(7), report(8));
    let kv = pairs(&a);
    let wall: u64 = field(&kv, "wall").parse().expect("secs");
    assert_eq!(wall, VIRTUAL_EPOCH_S);
    assert_eq!(a, b, "same seed, same report");
    assert_ne!(field(&kv, "random"), "", "{a}");
    assert_ne!(a, c, "another seed, another random");
}

/// The Python port of `ban_words` bans exactly what the Rust one does, step by step.
#[test]
fn ban_words_py_bans_what_ban_words_bans() {
    let t = |w: &str| {
        256 + [
            "Par", "is", "Paris", " Paris", " Par", "P", "aris", "London", " the", "<|eos|>",
        ]
        .iter()
        .position(|x| *x == w)
        .expect("word") as u32
    };
    let configs = [
        r#"{"words": ["Paris"]}"#,
        r#"{"words": ["Paris", "London", "is P"]}"#,
        r#"{"words": ["a"]}"#,
    ];
    let histories: [Vec<u32>; 5] = [
        vec![],
        vec![t("Par")],
        vec![t("P"), u32::from(b'a'), u32::from(b'r')],
        vec![t(" the"), t("<|eos|>"), t(" Par")],
        vec![u32::from(b'i'), u32::from(b's'), u32::from(b' ')],
    ];
    for config in configs {
        let mut rust = rust_chain(&[spec("ban_words", config)]);
        let mut py = chain(&[spec("ban_words_py", config)]);
        for generated in &histories {
            let (mut a, mut b) = (logits(), logits());
            rust.process(&step(generated), &mut a).expect("rust");
            py.process(&step(generated), &mut b).expect("python");
            assert_eq!(a, b, "{config} after {generated:?}");
        }
    }
    for (config, message) in [
        (r#"{"words": []}"#, None),
        (r#"{"words": "Paris"}"#, None),
        (r#"{"nope": 1}"#, None),
    ] {
        let rust = super::tests::registry()
            .instantiate(&[spec("ban_words", config)], 1, "t")
            .expect_err("refused");
        let py = configure_error("ban_words_py", config, 1);
        let want = message.unwrap_or_else(|| {
            rust.message
                .split_once("rejected it: ")
                .map_or("", |(_, m)| m)
        });
        assert_eq!(py, want, "{config}");
    }
}

#[test]
fn no_digits_js_bans_digits_after_its_word() {
    let digits: Vec<usize> = (b'0'..=b'9').map(usize::from).collect();
    let mut c = chain(&[spec("no_digits_js", r#"{"after": "Paris"}"#)]);
    let mut l = logits();
    c.process(&step(&[256]), &mut l).expect("process");
    assert_eq!(l, logits(), "no trigger yet: Par");
    // "Par" + "is": the word spans two tokens.
    c.process(&step(&[256, 257]), &mut l).expect("process");
    for (i, (x, y)) in l.iter().zip(logits()).enumerate() {
        if digits.contains(&i) {
            assert_eq!(*x, f32::NEG_INFINITY, "digit {i}");
        } else {
            assert_eq!(*x, y, "token {i}");
        }
    }
    let e = configure_error("no_digits_js", r#"{"after": 7}"#, 1);
    assert_eq!(e, "after: must be a string of 1 to 256 bytes, got 7");
}

#[test]
fn temperature_schedule_py_samples_by_the_host_random_draw() {
    let mut c = chain(&[spec(
        "temperature_schedule_py",
        r#"{"start": 0, "end": 0, "tokens": 1}"#,
    )]);
    let mut l = logits();
    l[100] = 50.0;
    let argmax = l
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32)
        .expect("row");
    for r in [0.0, 0.5, 0.999] {
        assert_eq!(
            c.sample(&step(&[]), &l, r).expect("sample"),
            argmax,
            "greedy at T = 0"
        );
    }
    // T = 1: the draw picks by the cumulative softmax; the same draw, the same token.
    let mut hot = chain(&[spec(
        "temperature_schedule_py",
        r#"{"start": 1, "end": 1, "tokens": 1}"#,
    )]);
    let flat = logits();
    let a = hot.sample(&step(&[]), &flat, 0.25).expect("sample");
    let b = hot.sample(&step(&[]), &flat, 0.25).expect("sample");
    let z = hot.sample(&step(&[]), &flat, 0.0).expect("sample");
    assert_eq!(a, b);
    assert_eq!(z, 0, "a draw of 0 takes the first token");
    let e = configure_error("temperature_schedule_py", r#"{"start": -1}"#, 1);
    assert_eq!(e, "start: must be a number from 0 to 100, got -1");
}
