//! Speculative decoding with a draft model: the default model (Q4_1) drafting for the
//! same model converted to F16 by llama.cpp (`scripts/quant-parity.sh files`, which
//! the test command runs) gives the target's tokens, greedy and seeded, with most drafts
//! accepted; a draft with another vocabulary, or none named, is refused at start-up.

use std::path::PathBuf;

use inferd_e2e::{model_path, start_failure, workspace_root, Client, Daemon, Generation};
use serde_json::{json, Value};

/// The F16 file `scripts/quant-parity.sh files` makes.
fn f16() -> PathBuf {
    let dir = std::env::var_os("INFERD_QUANT_DIR").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/inferd/quant-files")
        },
        PathBuf::from,
    );
    let p = dir.join("SmolLM2-135M-Instruct.F16.gguf");
    assert!(
        p.is_file(),
        "{} missing: run scripts/quant-parity.sh files",
        p.display()
    );
    p
}

fn chat(id: &str, content: &str, extra: Value) -> Value {
    let mut v = json!({"type": "generate", "id": id, "max_tokens": 64, "temperature": 0,
                       "messages": [{"role": "user", "content": content}]});
    if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(e.clone());
    }
    v
}

async fn run(c: &mut Client, req: Value, speculative: bool) -> Generation {
    let mut r = req;
    r["speculative"] = json!(speculative);
    c.generate(r).await.expect("generate")
}

fn usage(g: &Generation, field: &str) -> u64 {
    g.done.as_ref().expect("done")["usage"][field]
        .as_u64()
        .expect("usage")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_q4_1_draft_for_the_f16_model_keeps_the_targets_tokens() {
    let draft = model_path();
    let draft = draft.to_string_lossy();
    let d = Daemon::start_model(
        &f16(),
        None,
        &[
            ("INFERD__SPECULATIVE__METHOD", "draft"),
            ("INFERD__SPECULATIVE__DRAFT_MODEL", draft.as_ref()),
            // Pinned, not measured: on a 2-core CPU a Q4_1 step plus a verification row
            // cost about a whole F16 step, and the controller would not draft at all.
            ("INFERD__SPECULATIVE__ROW_COST", "0.1"),
            ("INFERD__SPECULATIVE__DRAFT_COST", "0.2"),
        ],
    )
    .expect("daemon");
    let mut c = d.connect().await.expect("ws");
    let mut accepted = 0;
    for (i, prompt) in [
        "Write a short poem about the sea.",
        "Explain how rainbows form.",
        "List five colours.",
    ]
    .iter()
    .enumerate()
    {
        let on = run(&mut c, chat("on", prompt, json!({})), true).await;
        let off = run(&mut c, chat("off", prompt, json!({})), false).await;
        assert_eq!(on.token_ids, off.token_ids, "prompt {i}");
        assert_eq!(on.finish_reason(), off.finish_reason());
        assert_eq!(usage(&off, "draft_tokens"), 0);
        accepted += usage(&on, "accepted_draft_tokens");
        // Seeded sampling: the same tokens too.
        let extra = json!({"temperature": 0.8, "seed": 5 + i});
        let on = run(&mut c, chat("on", prompt, extra.clone()), true).await;
        let off = run(&mut c, chat("off", prompt, extra), false).await;
        assert_eq!(on.token_ids, off.token_ids, "prompt {i}, sampled");
    }
    // The same weights at two precisions agree on most tokens.
    assert!(
        accepted > 64,
        "accepted {accepted} drafts over 3 × 64 tokens"
    );
    let st = d.connect().await.expect("ws").stats().await.expect("stats");
    assert_eq!(st["speculative"]["method"], "draft", "{st}");
    assert!(
        st["speculative"]["acceptance_rate"].as_f64().unwrap_or(0.0) > 0.5,
        "{st}"
    );
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let tiny = workspace_root().join("../shared/fixtures/tiny-models/llama");
    let tiny = tiny.to_string_lossy();
    let (code, err) = start_failure(
        &[
            "--model",
            &model_path().to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[
            ("INFERD__SPECULATIVE__METHOD", "draft"),
            ("INFERD__SPECULATIVE__DRAFT_MODEL", tiny.as_ref()),
        ],
    )
    .expect("run");
    assert_ne!(code, Some(0));
    assert!(
        err.contains("speculative.draft_model")
            && err.contains("a draft model must have the model's vocabulary, but it has"),
        "{err}"
    );
}

#[test]
fn the_draft_method_needs_a_draft_model() {
    let (code, err) = start_failure(
        &[
            "--model",
            &model_path().to_string_lossy(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[("INFERD__SPECULATIVE__METHOD", "draft")],
    )
    .expect("run");
    assert_ne!(code, Some(0));
    assert!(
        err.contains("speculative.draft_model must name a model file or directory"),
        "{err}"
    );
}
