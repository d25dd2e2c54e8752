//! The adapter loaders against damaged files, as `model::source::fuzz_tests` does for
//! models: a GGUF adapter (`scripts/lora-gguf.sh files`) truncated and with bytes
//! changed in its header, and a PEFT directory with every `adapter_config.json` key
//! removed or of a wrong kind and a damaged safetensors header. Every case ends in `Ok`
//! or one line naming the adapter (≤ 600 characters, no control characters), never a
//! panic. Deterministic (xorshift), bounded to about 20 s.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{LoraAdapter, LoraBase};
use crate::model::reference_tests::{load_model, tiny_dir};
use crate::test_support::default_model_path;

/// Where `scripts/lora-gguf.sh files` puts the GGUF adapters.
fn lora_dir() -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("INFERD_LORA_DIR") {
        return d.into();
    }
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/inferd/lora")
}

const BUDGET: Duration = Duration::from_secs(20);
const MAX_MESSAGE: usize = 600;

fn try_load(path: &Path, base: &LoraBase, case: &str) -> bool {
    let r = std::panic::catch_unwind(|| LoraAdapter::load("fuzz", path, base, Some(64)));
    match r {
        Err(_) => panic!("{case}: the adapter loader panicked"),
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            let msg = e.to_string();
            assert!(msg.starts_with("LoRA adapter `fuzz`: "), "{case}: {msg}");
            assert!(
                msg.chars().count() <= MAX_MESSAGE,
                "{case}: {} chars",
                msg.len()
            );
            assert!(!msg.chars().any(char::is_control), "{case}: {msg:?}");
            false
        }
    }
}

#[test]
fn damaged_gguf_adapters_are_refused_with_one_line() {
    let file = lora_dir().join("smollm2-lora-f32-r4.gguf");
    assert!(
        file.is_file(),
        "{} missing: run scripts/lora-gguf.sh files",
        file.display()
    );
    let good = std::fs::read(&file).expect("adapter");
    let model = load_model(&default_model_path());
    let base = LoraBase::of(&model);
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("a.gguf");
    let run = |bytes: &[u8], case: &str| {
        std::fs::write(&path, bytes).expect("write");
        try_load(&path, &base, case)
    };
    assert!(run(&good, "the undamaged adapter"));
    let header = good.len().min(32 * 1024);
    for cut in (0..header).step_by(1499).chain([good.len() - 1]) {
        assert!(
            !run(&good[..cut], &format!("truncated at {cut}")),
            "truncated at {cut} loaded"
        );
    }
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let started = Instant::now();
    let mut cases = 0;
    while started.elapsed() < BUDGET && cases < 400 {
        let mut b = good.clone();
        let at = (next() % header as u64) as usize;
        if next() % 2 == 0 {
            b[at] ^= 1 << (next() % 8);
        } else {
            let at = at & !7;
            b[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        }
        run(&b, &format!("byte {at} changed"));
        cases += 1;
    }
    assert!(cases >= 50, "only {cases} cases ran");
}

#[test]
fn damaged_peft_directories_are_refused_with_one_line() {
    let model = load_model(&tiny_dir("llama"));
    let base = LoraBase::of(&model);
    let src = super::tests::peft_dir("llama");
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(src.join("adapter_config.json")).expect("cfg"),
    )
    .expect("json");
    let weights = std::fs::read(src.join("adapter_model.safetensors")).expect("weights");
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    std::fs::write(d.join("adapter_model.safetensors"), &weights).expect("w");
    let wrong = [
        serde_json::json!("text"),
        serde_json::json!(-1),
        serde_json::json!(0),
        serde_json::json!(1e30),
        serde_json::json!([1, "x"]),
        serde_json::json!({"a": 1}),
        serde_json::json!(true),
    ];
    for key in config.as_object().expect("object").keys() {
        let mut c = config.clone();
        c.as_object_mut().expect("o").remove(key);
        std::fs::write(d.join("adapter_config.json"), c.to_string()).expect("w");
        try_load(d, &base, &format!("without {key}"));
        for v in &wrong {
            let mut c = config.clone();
            c[key] = v.clone();
            std::fs::write(d.join("adapter_config.json"), c.to_string()).expect("w");
            try_load(d, &base, &format!("{key} = {v}"));
        }
    }
    std::fs::write(d.join("adapter_config.json"), config.to_string()).expect("w");
    assert!(try_load(d, &base, "the undamaged directory"));
    let header_len = u64::from_le_bytes(weights[..8].try_into().expect("len")) as usize;
    for at in (0..8 + header_len).step_by(7) {
        let mut b = weights.clone();
        b[at] ^= 0x5A;
        std::fs::write(d.join("adapter_model.safetensors"), &b).expect("w");
        try_load(d, &base, &format!("safetensors byte {at}"));
    }
    for cut in [0, 4, 8, 8 + header_len / 2, weights.len() - 1] {
        std::fs::write(d.join("adapter_model.safetensors"), &weights[..cut]).expect("w");
        assert!(!try_load(d, &base, &format!("safetensors cut at {cut}")));
    }
}
