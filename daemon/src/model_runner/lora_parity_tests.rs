//! GGUF LoRA adapters against natively built llama.cpp: random adapters for the default
//! model (F16 rank 8, Q8_0 rank 8, F32 rank 4) and Gemma 3 270M (F16 rank 8), made by
//! `scripts/lora-gguf.sh files` (`scripts/make-lora-gguf.py`, checked by SHA-256
//! against `daemon/tests/fixtures/lora-gguf/manifest.json`), and llama-server's greedy
//! outputs with `--lora` (scale 1.0) and `--lora-scaled` (0.5) in
//! `daemon/tests/fixtures/lora-gguf/<label>.json` (`scripts/lora-gguf.sh refs`, made on
//! the machine that checks them). Compared as the quant-parity references are
//! ([`super::quant_parity_tests`]): teacher-forced top-1 and its probability at every
//! position, free-running greedy to the first difference.

use super::quant_parity_tests::run_goals;
use crate::test_support::workspace_root;

/// `(label, free-running prompts equal in full, max |Δp|)` (measured; docs/lora.md).
/// - The default model's adapters: every prompt equal in full, probabilities to
///   llama-server's f32 softmax, at both scales and for all three adapter types.
/// - Gemma 3: its references could only be made on this machine (an Intel CPU with
///   AVX512-FP16), where llama.cpp's native build does its f16 vector ops in half
///   precision (see `quant_parity_tests`, the 1.5B's note); our kernels follow its
///   f32-converting path, whose references (for the base model) came from an AMD CPU.
///   Against base-model references made here, the base model itself gives 6 and 7 of 8
///   prompts in full with max |Δp| 0.050 and 0.106 (`INFERD_PARITY_REFS`, measured);
///   the random adapter moves the model to flatter distributions, where the same
///   rounding difference flips more near-ties: 4 or 5 of 8 in full, teacher-forced
///   top-1 250–253 of 256, max |Δp| 0.37 (measured). The bounds below are those.
///   The adapter arithmetic on Gemma 3 is checked exactly against PEFT on the tiny
///   Gemma 3 (`model::lora::tests`).
const GOALS: [(&str, usize, f64); 8] = [
    ("smollm2-f16-s1.0", 7, 1e-3),
    ("smollm2-f16-s0.5", 7, 1e-3),
    ("smollm2-q8_0-s1.0", 7, 1e-3),
    ("smollm2-f32-r4-s1.0", 7, 1e-3),
    ("gemma3-f16-s1.0-swa-full", 4, 0.4),
    ("gemma3-f16-s0.5-swa-full", 5, 0.4),
    ("gemma3-f16-s1.0", 4, 0.4),
    ("gemma3-f16-s0.5", 5, 0.4),
];

fn run(label: &str) {
    let dir = workspace_root().join("daemon/tests/fixtures/lora-gguf");
    run_goals(&dir, &GOALS, label);
}

#[test]
fn smollm2_f16_adapter_matches_llama_cpp() {
    run("smollm2-f16-s1.0");
}

#[test]
fn smollm2_f16_adapter_at_half_scale_matches_llama_cpp() {
    run("smollm2-f16-s0.5");
}

#[test]
fn smollm2_q8_0_adapter_matches_llama_cpp() {
    run("smollm2-q8_0-s1.0");
}

#[test]
fn smollm2_f32_rank_4_adapter_matches_llama_cpp() {
    run("smollm2-f32-r4-s1.0");
}

#[test]
fn gemma3_f16_adapter_against_llama_cpp_swa_full() {
    run("gemma3-f16-s1.0-swa-full");
}

#[test]
fn gemma3_f16_adapter_at_half_scale_against_llama_cpp_swa_full() {
    run("gemma3-f16-s0.5-swa-full");
}

#[test]
fn gemma3_f16_adapter_against_llama_cpp() {
    run("gemma3-f16-s1.0");
}

#[test]
fn gemma3_f16_adapter_at_half_scale_against_llama_cpp() {
    run("gemma3-f16-s0.5");
}
