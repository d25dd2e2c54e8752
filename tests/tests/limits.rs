//! Context window and stop conditions: a prompt longer than the window is refused
//! naming both counts; generation never runs past the window; stop strings are cut.

use inferd_e2e::{fixture, ids, Daemon};
use serde_json::json;

#[tokio::test]
async fn context_window_bounds_prompt_and_generation() {
    // The env layer of the config sets a small window.
    let daemon =
        Daemon::start_with_env(&[("INFERD__MODEL__CONTEXT_LENGTH", "40")]).expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let long = "word ".repeat(60);
    c.send(&json!({"type":"tokenize","id":"t","text":long}))
        .await
        .expect("send");
    let n = c.recv().await.expect("tokens")["token_ids"]
        .as_array()
        .expect("ids")
        .len();
    assert!(n > 40);
    let g = c
        .generate(json!({"type":"generate","id":"long","prompt":long,"max_tokens":5}))
        .await
        .expect("generate");
    assert_eq!(g.error_type(), Some("context_length_exceeded"), "{g:?}");
    let msg = g.error.as_ref().expect("error")["error"]["message"]
        .as_str()
        .expect("msg")
        .to_string();
    assert!(
        msg.contains(&format!("{n} tokens")) && msg.contains("40 tokens"),
        "{msg}"
    );

    // 4-token prompt, window 40: at most 36 new tokens whatever max_tokens says.
    let g = c
        .generate(json!({"type":"generate","id":"cap","prompt":"Once upon a time","max_tokens":500,"temperature":0}))
        .await
        .expect("generate");
    assert_eq!(g.finish_reason(), Some("length"));
    assert_eq!(g.token_ids.len(), 36);
}

#[tokio::test]
async fn stop_strings_are_cut_and_never_streamed() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let b = &fixture("llamacpp/reference.json")["chat"][1];
    // Greedy answer: "The primary colors are:\n\nRed: YELLOW\nBlue: WHITE"
    let g = c
        .generate(json!({"type":"generate","id":"s","messages":b["messages"],"max_tokens":64,"temperature":0,"stop":["\n\n", "YELLOW"]}))
        .await
        .expect("generate");
    assert_eq!(g.text, "The primary colors are:");
    assert_eq!(g.finish_reason(), Some("stop"));
    for d in &g.deltas {
        assert!(
            !d.contains('\n'),
            "part of a stop string was streamed: {d:?}"
        );
    }
    // A stop string that spans tokens ("colors are" is two tokens) is cut too.
    let g = c
        .generate(json!({"type":"generate","id":"s2","messages":b["messages"],"max_tokens":64,"temperature":0,"stop":"rs ar"}))
        .await
        .expect("generate");
    assert_eq!(g.text, "The primary colo");
    assert_eq!(g.finish_reason(), Some("stop"));
    // The stop string never appears in the concatenation of what was streamed.
    assert!(!g.deltas.concat().contains("rs ar"));
    let expected = ids(&b["generated_token_ids"]);
    assert_eq!(&g.token_ids[..], &expected[..g.token_ids.len()]);
}

#[tokio::test]
async fn seeded_sampling_reproduces_and_special_text_in_content_is_plain() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let req = |id: &str, seed: u64| {
        json!({"type":"generate","id":id,"messages":[{"role":"user","content":"Tell me a story about a dragon."}],
               "max_tokens":40,"temperature":1.0,"top_k":50,"top_p":0.95,"min_p":0.0,"seed":seed})
    };
    let a = c.generate(req("a", 42)).await.expect("a");
    let b = c.generate(req("b", 42)).await.expect("b");
    let d = c.generate(req("d", 43)).await.expect("d");
    assert_eq!(a.token_ids, b.token_ids);
    assert_ne!(a.token_ids, d.token_ids);

    // "<|im_end|>" typed by a user is text: it tokenizes to more than one plain token
    // and the prompt is longer than with a real control token.
    let plain = c
        .generate(json!({"type":"generate","id":"p","messages":[{"role":"user","content":"<|im_end|>"}],"max_tokens":1,"temperature":0}))
        .await
        .expect("p");
    let empty = c
        .generate(json!({"type":"generate","id":"e","messages":[{"role":"user","content":""}],"max_tokens":1,"temperature":0}))
        .await
        .expect("e");
    let n_plain = plain.started.as_ref().expect("s")["prompt_tokens"]
        .as_u64()
        .expect("n");
    let n_empty = empty.started.as_ref().expect("s")["prompt_tokens"]
        .as_u64()
        .expect("n");
    c.send(&json!({"type":"tokenize","id":"t","text":"<|im_end|>","special":false}))
        .await
        .expect("send");
    let t = c.recv().await.expect("tokens");
    let n_text = t["token_ids"].as_array().expect("ids").len() as u64;
    assert!(n_text > 1);
    assert_eq!(n_plain, n_empty + n_text);
}
