//! Op-by-op comparison with llama.cpp's intermediate tensors (a diagnostic, run by
//! hand): `scripts/llamacpp-dump.sh MODEL TOKENS…` writes llama.cpp's tensors for a
//! prefill, then
//! `INFERD_LLAMA_DUMP=dump.bin INFERD_LLAMA_MODEL=MODEL INFERD_LLAMA_TOKENS="1 2 3"
//! cargo test -p inferd --lib trace_tests -- --ignored --nocapture`
//! prints, in graph order, each tensor's bit-equal fraction and largest difference.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::Device;

use crate::model::{ForwardSeq, KvBlockPool, LoadOptions, MatrixPolicy};

/// `(name, step, values)` records of a llama.cpp dump.
fn read_dump(path: &str) -> Vec<(String, u32, Vec<f32>)> {
    let b = std::fs::read(path).expect("dump");
    let mut at = 0;
    let mut take = |n: usize| {
        let s = &b[at..at + n];
        at += n;
        (s, at >= b.len())
    };
    let mut out = Vec::new();
    loop {
        let len = u32::from_le_bytes(take(4).0.try_into().expect("len")) as usize;
        let name = String::from_utf8_lossy(take(len).0).into_owned();
        let step = u32::from_le_bytes(take(4).0.try_into().expect("step"));
        let mut n = 1usize;
        for _ in 0..4 {
            n *= i64::from_le_bytes(take(8).0.try_into().expect("ne")) as usize;
        }
        let (data, end) = take(4 * n);
        let v = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("f32")))
            .collect();
        out.push((name, step, v));
        if end {
            return out;
        }
    }
}

#[test]
#[ignore = "diagnostic: needs a llama.cpp dump (scripts/llamacpp-dump.sh)"]
fn compare_with_llama_cpp_dump() {
    let dump = std::env::var("INFERD_LLAMA_DUMP").expect("INFERD_LLAMA_DUMP");
    let model_path =
        PathBuf::from(std::env::var("INFERD_LLAMA_MODEL").expect("INFERD_LLAMA_MODEL"));
    let tokens: Vec<u32> = std::env::var("INFERD_LLAMA_TOKENS")
        .expect("INFERD_LLAMA_TOKENS")
        .split_whitespace()
        .map(|t| t.parse().expect("token id"))
        .collect();
    let opts = LoadOptions {
        device: Device::Cpu,
        matrices: MatrixPolicy::default(),
    };
    let model = crate::model::load(&model_path, &opts).expect("load").model;
    let blocks = tokens.len().div_ceil(16) + 1;
    let mut pool = KvBlockPool::new(&model.kv_layout(), 16, blocks, &Device::Cpu).expect("pool");
    let table: Vec<u32> = (0..blocks as u32).collect();
    let seq = ForwardSeq {
        tokens: &tokens,
        start_pos: 0,
        block_table: &table,
        logit_rows: 1,
        prompt_len: tokens.len(),
        adapter: None,
        media: None,
    };
    let step: u32 = std::env::var("INFERD_LLAMA_STEP")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut ours = model.forward_traced(&[seq], &mut pool).expect("forward");
    let mut tokens = tokens;
    if step == 1 {
        // The decode step: llama.cpp's prefill argmax, one token at the next position.
        let last = ours
            .iter()
            .rev()
            .find(|(n, _)| n == "result_output")
            .map(|(_, v)| v.clone());
        let logits = model
            .forward_batch(
                &[ForwardSeq {
                    tokens: &tokens,
                    start_pos: 0,
                    block_table: &table,
                    logit_rows: 1,
                    prompt_len: tokens.len(),
                    adapter: None,
                    media: None,
                }],
                &mut KvBlockPool::new(&model.kv_layout(), 16, blocks, &Device::Cpu).expect("pool"),
            )
            .expect("forward")
            .expect("logits")
            .flatten_all()
            .expect("flat")
            .to_vec1::<f32>()
            .expect("logits");
        let _ = last;
        let best = logits
            .iter()
            .enumerate()
            .fold(0, |b, (i, &v)| if v > logits[b] { i } else { b }) as u32;
        eprintln!("decode step for token {best}");
        let next = [best];
        let seq = ForwardSeq {
            tokens: &next,
            start_pos: tokens.len(),
            block_table: &table,
            logit_rows: 1,
            prompt_len: tokens.len(),
            adapter: None,
            media: None,
        };
        ours = model.forward_traced(&[seq], &mut pool).expect("decode");
        tokens = vec![best];
    }
    // llama.cpp's step-0 tensors by name, in order (a name can repeat: Qcur after the
    // matmul, then after RoPE).
    let want_step = step;
    let mut theirs: HashMap<String, Vec<Vec<f32>>> = HashMap::new();
    for (name, step, v) in read_dump(&dump) {
        if step == want_step {
            theirs.entry(name).or_default().push(v);
        }
    }
    let pick = |name: &str| -> Option<&Vec<f32>> {
        let (base, which) = match name.split_once('.') {
            Some((b, rest)) => {
                let (rest, layer) = rest.split_once('-').unwrap_or((rest, ""));
                (format!("{b}-{layer}"), rest)
            }
            None => (name.to_string(), ""),
        };
        let list = theirs.get(&base)?;
        match which {
            "mm" => list.first(),
            "rope" => list.last(),
            _ => list.last(),
        }
    };
    let mut first_bad = None;
    for (name, v) in &ours {
        let Some(t) = pick(name) else {
            eprintln!("{name:>16}: (no llama.cpp tensor)");
            continue;
        };
        // llama.cpp keeps only the output row in its last layer's tail.
        let v = if t.len() < v.len() {
            &v[v.len() - t.len()..]
        } else {
            &v[..]
        };
        let t = if t.len() > v.len() {
            &t[t.len() - v.len()..]
        } else {
            &t[..]
        };
        let same = v
            .iter()
            .zip(t)
            .filter(|(a, b)| a.to_bits() == b.to_bits())
            .count();
        let max = v
            .iter()
            .zip(t)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "{name:>16}: {same}/{} bit-equal, max |Δ| {max:.3e}",
            v.len()
        );
        if same != v.len() && first_bad.is_none() {
            first_bad = Some(name.clone());
            let width = v.len() / tokens.len().max(1);
            let bad: Vec<String> = v
                .iter()
                .zip(t)
                .enumerate()
                .filter(|(_, (a, b))| a.to_bits() != b.to_bits())
                .take(12)
                .map(|(i, (a, b))| {
                    format!(
                        "(row {}, col {}: {a:e} vs {b:e})",
                        i / width.max(1),
                        i % width.max(1)
                    )
                })
                .collect();
            eprintln!("    first differences: {}", bad.join(" "));
        }
    }
    eprintln!("first difference: {first_bad:?}");
}
