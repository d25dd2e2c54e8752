//! The Python (componentize-py) and JavaScript (ComponentizeJS) plugins end to end on the
//! default model: the Python `ban_words_py` gives the same text as the Rust `ban_words`,
//! a seeded Python sampler reproduces alone and beside another stream, the JavaScript
//! `no_digits_js` keeps digits out of an answer, and an exception in either language
//! fails only its own request.
//!
//! The daemon loads `target/e2e-lang-plugins/` (built by `scripts/build-plugins.sh`) plus
//! the Rust `ban_words`, with the deadline docs/plugins.md gives for interpreters, and
//! shares the compiled components in `target/plugin-compile-cache/` with the host tests.

use inferd_e2e::{plugins_dir, workspace_root, Daemon, Generation};
use serde_json::{json, Value};

const FRANCE: &str = "What is the capital of France? Answer in one short sentence.";
const PY_JS: [&str; 5] = [
    "ban_words_py",
    "temperature_schedule_py",
    "py_probe",
    "no_digits_js",
    "js_probe",
];

/// A daemon with the Python and JavaScript plugins; keep the directory alive as long as
/// the daemon.
fn lang_daemon() -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let lang = std::env::var_os("INFERD_LANG_PLUGINS_DIR").map_or_else(
        || workspace_root().join("target/e2e-lang-plugins"),
        std::path::PathBuf::from,
    );
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).expect("mkdir");
    let copies = PY_JS
        .iter()
        .map(|n| (lang.join(format!("{n}.wasm")), format!("{n}.wasm")))
        .chain([(
            plugins_dir().join("ban_words.wasm"),
            "ban_words.wasm".into(),
        )]);
    for (src, name) in copies {
        std::fs::copy(&src, plugins.join(name))
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/build-plugins.sh)", src.display()));
    }
    let mut config = std::fs::read_to_string(workspace_root().join("configs/test.toml"))
        .expect("configs/test.toml");
    for name in PY_JS {
        // The default limits suffice but for the deadline of the plugins that read the
        // row (docs/plugins.md); generous, as the tests share 2 cores.
        config.push_str(&format!(
            "\n[plugins.limits.{name}]\ncall_deadline_ms = 2000\n"
        ));
    }
    let config_path = dir.path().join("inferd.toml");
    std::fs::write(&config_path, config).expect("write config");
    let cache = workspace_root().join("target/plugin-compile-cache");
    let daemon = Daemon::start_config(
        &config_path,
        &[],
        &[
            (
                "INFERD__PLUGINS__DIR",
                plugins.to_str().expect("utf-8 path"),
            ),
            (
                "INFERD__PLUGINS__COMPILE_CACHE",
                cache.to_str().expect("utf-8 path"),
            ),
        ],
    )
    .expect("daemon");
    (daemon, dir)
}

fn chat(id: &str, content: &str, max_tokens: u64, plugins: Value) -> Value {
    json!({"type":"generate","id":id,"messages":[{"role":"user","content":content}],
           "max_tokens":max_tokens,"temperature":0,"plugins":plugins})
}

fn ok(g: &Generation) {
    assert_eq!(g.error, None);
    assert!(g.done.is_some());
}

#[tokio::test]
async fn python_ban_words_gives_the_text_the_rust_one_gives() {
    let (daemon, _dir) = lang_daemon();
    let mut c = daemon.connect().await.expect("connect");
    let ban = |name: &str| json!([{"name": name, "config": {"words": ["Paris", " capital"]}}]);
    let plain = c
        .generate(chat("plain", FRANCE, 40, json!([])))
        .await
        .expect("generate");
    let rust = c
        .generate(chat("rust", FRANCE, 40, ban("ban_words")))
        .await
        .expect("generate");
    let py = c
        .generate(chat("py", FRANCE, 40, ban("ban_words_py")))
        .await
        .expect("generate");
    ok(&rust);
    ok(&py);
    assert!(
        plain.text.contains("Paris"),
        "precondition: {:?}",
        plain.text
    );
    assert!(
        !rust.text.contains("Paris") && !rust.text.contains(" capital"),
        "{:?}",
        rust.text
    );
    assert_eq!(
        py.token_ids, rust.token_ids,
        "{:?} vs {:?}",
        py.text, rust.text
    );
    assert_eq!(py.text, rust.text);
}

#[tokio::test]
async fn a_seeded_python_sampler_reproduces_alone_and_beside_another_stream() {
    let (daemon, _dir) = lang_daemon();
    let mut c = daemon.connect().await.expect("connect");
    let req = |id: &str, seed: u64| {
        json!({"type":"generate","id":id,"prompt":"Once upon a time","max_tokens":16,
               "seed":seed,"plugins":[{"name":"temperature_schedule_py",
               "config":{"start":1.2,"end":0.4,"tokens":16}}]})
    };
    let a = c.generate(req("a", 42)).await.expect("generate");
    ok(&a);
    assert_eq!(a.token_ids.len(), 16);
    let mut both = c
        .generate_all(&[req("b", 42), chat("other", FRANCE, 16, json!([]))])
        .await
        .expect("generate");
    let b = both.remove("b").expect("b");
    ok(&b);
    assert_eq!(b.token_ids, a.token_ids, "same seed, same tokens");
    ok(&both.remove("other").expect("other"));
    let d = c.generate(req("d", 43)).await.expect("generate");
    ok(&d);
    assert_ne!(d.token_ids, a.token_ids, "another seed, other tokens");
}

#[tokio::test]
async fn javascript_no_digits_keeps_digits_out_of_the_answer() {
    let (daemon, _dir) = lang_daemon();
    let mut c = daemon.connect().await.expect("connect");
    let count = "Count from 1 to 10, separated by commas.";
    let plain = c
        .generate(chat("plain", count, 30, json!([])))
        .await
        .expect("generate");
    assert!(
        plain.text.chars().any(|ch| ch.is_ascii_digit()),
        "precondition: {:?}",
        plain.text
    );
    let js = c
        .generate(chat("js", count, 30, json!([{"name":"no_digits_js"}])))
        .await
        .expect("generate");
    ok(&js);
    assert!(!js.text.is_empty());
    assert!(
        !js.text.chars().any(|ch| ch.is_ascii_digit()),
        "{:?}",
        js.text
    );
}

#[tokio::test]
async fn exceptions_in_python_and_javascript_fail_only_their_own_requests() {
    let (daemon, _dir) = lang_daemon();
    let mut c = daemon.connect().await.expect("connect");
    let alone = c
        .generate(chat("alone", FRANCE, 16, json!([])))
        .await
        .expect("generate");
    let probe = |name: &str, config: Value| json!([{"name": name, "config": config}]);
    let mut all = c
        .generate_all(&[
            chat("py", FRANCE, 16, probe("py_probe", json!({"raise": true}))),
            chat("js", FRANCE, 16, probe("js_probe", json!({"throw": true}))),
            chat("spin", FRANCE, 16, probe("py_probe", json!({"spin": true}))),
            chat("plain", FRANCE, 16, json!([])),
        ])
        .await
        .expect("generate");
    for id in ["py", "js", "spin"] {
        let g = all.remove(id).expect(id);
        assert_eq!(g.error_type(), Some("plugin_trap"), "{id}: {:?}", g.error);
    }
    let plain = all.remove("plain").expect("plain");
    ok(&plain);
    assert_eq!(
        plain.token_ids, alone.token_ids,
        "the neighbour is unaffected"
    );
    // The daemon still serves, plugins included.
    let again = c
        .generate(chat("again", FRANCE, 16, probe("py_probe", json!({}))))
        .await
        .expect("generate");
    ok(&again);
    assert_eq!(again.token_ids, alone.token_ids);
}
