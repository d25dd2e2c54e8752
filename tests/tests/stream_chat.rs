//! A chat request streams the real model's greedy answer, token for token equal to
//! llama.cpp's reference, with consistent started/delta/done frames.

use inferd_e2e::{fixture, ids, Daemon};
use serde_json::json;

#[tokio::test]
async fn greedy_chat_b_and_raw_completion_match_llama_cpp() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    let reference = fixture("llamacpp/reference.json");

    // Conversation b ends with EOS: the stream must stop there with finish_reason stop.
    let b = &reference["chat"][1];
    let expected = ids(&b["generated_token_ids"]);
    let g = c
        .chat_greedy("b", b["messages"].clone(), 64)
        .await
        .expect("generate");
    assert_eq!(g.error, None);
    let started = g.started.as_ref().expect("started");
    assert_eq!(started["prompt_tokens"], json!(b["n_prompt_tokens"]));
    assert_eq!(started["cached_tokens"], json!(0));
    assert_eq!(g.token_ids, expected, "token ids differ from llama.cpp");
    assert_eq!(g.text, b["generated_text"].as_str().expect("text"));
    assert_eq!(g.finish_reason(), Some("stop"));
    let done = g.done.as_ref().expect("done");
    assert_eq!(done["usage"]["prompt_tokens"], json!(25));
    assert_eq!(done["usage"]["completion_tokens"], json!(expected.len()));
    assert!(done["timings"]["ttft_ms"].as_f64().expect("ttft") > 0.0);

    // Raw completion (no template): 48 tokens, finish_reason length.
    let raw = &reference["raw_completion"];
    let g = c
        .generate(json!({"type":"generate","id":"raw","prompt":raw["prompt"],"max_tokens":48,"temperature":0}))
        .await
        .expect("generate");
    // Equal to llama.cpp's for the first 4 tokens; token 5 is a near tie (logit gap
    // 0.085) that float summation order decides, after which the texts part ways
    // (docs/performance.md, Greedy parity; teacher-forced, 46 of 48 positions agree).
    let reference_ids = ids(&raw["generated_token_ids"]);
    assert_eq!(g.token_ids.len(), 48);
    assert_eq!(g.token_ids[..4], reference_ids[..4]);
    assert_eq!(g.finish_reason(), Some("length"));
    assert_eq!(
        g.started.as_ref().expect("started")["prompt_tokens"],
        json!(4)
    );
}

#[tokio::test]
async fn deltas_concatenate_to_the_decode_of_all_ids() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    // Sampled (seeded) so the text is varied; French and emoji push multi-byte characters.
    let g = c
        .generate(json!({"type":"generate","id":"u","messages":[{"role":"user","content":"Écris une phrase avec des émojis 🎉 et des accents: été, çà, œuvre."}],
            "max_tokens":60,"temperature":1.0,"top_k":0,"top_p":1.0,"min_p":0.0,"seed":7}))
        .await
        .expect("generate");
    assert_eq!(g.error, None);
    for d in &g.deltas {
        assert!(!d.contains('\u{FFFD}') || g.text.contains('\u{FFFD}'));
    }
    c.send(&json!({"type":"detokenize","id":"d","token_ids":g.token_ids}))
        .await
        .expect("send");
    let f = c.recv().await.expect("text frame");
    assert_eq!(f["type"], "text");
    assert_eq!(f["text"].as_str().expect("text"), g.text);
}
