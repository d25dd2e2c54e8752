//! Start-up refuses bad models and bad configuration with a message, never a panic.

use inferd_e2e::{model_path, start_failure, workspace_root};

fn assert_refused(code: Option<i32>, stderr: &str, fragment: &str) {
    assert!(
        matches!(code, Some(c) if c != 0),
        "exit code {code:?}, stderr: {stderr}"
    );
    assert!(
        stderr.contains(fragment),
        "stderr lacks {fragment:?}: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
}

#[test]
fn corrupt_and_foreign_model_files_are_refused() {
    let dir = std::env::temp_dir().join(format!("inferd-startup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    // Not a GGUF file at all.
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"this is not a model").expect("write");
    let (code, err) = start_failure(
        &[
            "--model",
            junk.to_str().expect("p"),
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    )
    .expect("run");
    assert_refused(code, &err, "not a valid GGUF file");
    // A truncated copy of the real model.
    let bytes = std::fs::read(model_path()).expect("model");
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).expect("write");
    let (code, err) = start_failure(
        &[
            "--model",
            cut.to_str().expect("p"),
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
    )
    .expect("run");
    assert_refused(code, &err, "cut.gguf");
    // Missing file.
    let (code, err) = start_failure(
        &["--model", "/nonexistent/m.gguf", "--listen", "127.0.0.1:0"],
        &[],
    )
    .expect("run");
    assert_refused(code, &err, "/nonexistent/m.gguf");
    // Another architecture: the real file with general.architecture rewritten in place
    // ("llama" -> "gamma", same length).
    let mut foreign = bytes.clone();
    let key = b"general.architecture";
    let pos = foreign
        .windows(key.len())
        .position(|w| w == key)
        .expect("key");
    let val = foreign[pos..pos + 64]
        .windows(5)
        .position(|w| w == b"llama")
        .expect("value")
        + pos;
    foreign[val..val + 5].copy_from_slice(b"gamma");
    let f = dir.join("foreign.gguf");
    std::fs::write(&f, &foreign).expect("write");
    let (code, err) = start_failure(
        &["--model", f.to_str().expect("p"), "--listen", "127.0.0.1:0"],
        &[],
    )
    .expect("run");
    assert_refused(code, &err, "unsupported model architecture `gamma`");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_configuration_names_the_key() {
    let dir = std::env::temp_dir().join(format!("inferd-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let cfg = dir.join("bad.toml");
    std::fs::write(&cfg, "[server]\nlisten = \"127.0.0.1:0\"\nbogus_key = 1\n").expect("write");
    let (code, err) = start_failure(&["--config", cfg.to_str().expect("p")], &[]).expect("run");
    assert_refused(code, &err, "bogus_key");
    std::fs::write(&cfg, "[sampling]\ntop_p = 2.0\n").expect("write");
    let (code, err) = start_failure(&["--config", cfg.to_str().expect("p")], &[]).expect("run");
    assert_refused(code, &err, "sampling.top_p");
    let (code, err) = start_failure(&[], &[("INFERD__SCHEDULER__MAX_RUNNING", "0")]).expect("run");
    assert_refused(code, &err, "scheduler.max_running");
    let (code, err) = start_failure(&["--listen", "not-an-address"], &[]).expect("run");
    assert_refused(code, &err, "server.listen");
    let default_cfg = workspace_root().join("configs/inferd.toml");
    let (code, err) = start_failure(
        &[
            "--config",
            default_cfg.to_str().expect("p"),
            "--listen",
            "127.0.0.1:0",
        ],
        &[("INFERD__MODEL__DEVICE", "tpu:0")],
    )
    .expect("run");
    assert_refused(code, &err, "model.device");
    let _ = std::fs::remove_dir_all(&dir);
}
