//! Cancel ends a request with finish_reason `cancelled`; a closed connection cancels
//! its requests without harming others.

use inferd_e2e::{Daemon, Generation};
use serde_json::json;

#[tokio::test]
async fn cancel_mid_stream_gives_done_cancelled() {
    let daemon = Daemon::start().expect("daemon");
    let mut c = daemon.connect().await.expect("connect");
    c.send(&json!({"type":"generate","id":"long","prompt":"Once upon a time","max_tokens":2000,"temperature":0}))
        .await
        .expect("send");
    let mut g = Generation::default();
    let mut cancelled = false;
    loop {
        let f = c.recv().await.expect("frame");
        if f["type"] == "delta" && !cancelled {
            c.send(&json!({"type":"cancel","id":"long"}))
                .await
                .expect("cancel");
            cancelled = true;
        }
        if g.absorb(f) {
            break;
        }
    }
    assert_eq!(g.finish_reason(), Some("cancelled"));
    let n = g.done.as_ref().expect("done")["usage"]["completion_tokens"]
        .as_u64()
        .expect("n");
    assert!(n < 100, "cancel took effect only after {n} tokens");
    // The connection and engine keep working.
    let g = c
        .generate(
            json!({"type":"generate","id":"after","prompt":"Hi","max_tokens":3,"temperature":0}),
        )
        .await
        .expect("after");
    assert_eq!(g.finish_reason(), Some("length"));
}

#[tokio::test]
async fn disconnect_cancels_its_requests_and_others_continue() {
    let daemon = Daemon::start().expect("daemon");
    let mut doomed = daemon.connect().await.expect("connect");
    doomed
        .send(&json!({"type":"generate","id":"x","prompt":"Once upon a time","max_tokens":4000,"temperature":0}))
        .await
        .expect("send");
    let f = doomed.recv().await.expect("started");
    assert_eq!(f["type"], "started");
    doomed.close().await.expect("close");

    let mut c = daemon.connect().await.expect("connect");
    let g = c
        .generate(json!({"type":"generate","id":"y","prompt":"Once upon a time","max_tokens":16,"temperature":0}))
        .await
        .expect("generate");
    assert_eq!(g.finish_reason(), Some("length"));
    assert_eq!(g.token_ids.len(), 16);
}
