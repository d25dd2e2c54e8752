//! The batched forward pass on the real model: a sequence's logits do not depend on its
//! batch company, on how its prompt is chunked, or on which blocks hold its KV; and the
//! tensor attention path (the one CUDA uses) agrees with the CPU kernel.

use candle_core::Device;

use super::parity_tests::{argmax, load};
use super::runner::{BatchItem, ModelRunner, RunBatch};
use crate::model::{ForwardSeq, Kernels, KvBlockPool, MatrixPolicy, Model, Quantize, SoloKv};
use crate::request::SeqId;

const BLOCK: usize = 16;

/// Prompts of ordinary tokens whose lengths straddle block boundaries.
fn prompts() -> Vec<Vec<u32>> {
    [5usize, 16, 17, 40]
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            (0..n as u32)
                .map(|i| 300 + (i * 37 + k as u32 * 1001) % 20000)
                .collect()
        })
        .collect()
}

/// Solo run: prefill, then `steps` greedy decodes. Returns the logits after each.
fn solo(model: &Model, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
    let mut out = Vec::new();
    let mut next = prompt.to_vec();
    for _ in 0..=steps {
        let l = model
            .forward(&next, &mut cache)
            .and_then(|t| t.to_vec1::<f32>())
            .expect("forward");
        next = vec![argmax(&l)];
        out.push(l);
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Block tables that interleave the sequences' blocks in the pool, descending ids.
fn tables(n_seqs: usize, blocks_each: usize, pool_blocks: usize) -> Vec<Vec<u32>> {
    (0..n_seqs)
        .map(|s| {
            (0..blocks_each)
                .map(|b| (pool_blocks - 1 - (b * n_seqs + s)) as u32)
                .collect()
        })
        .collect()
}

/// Runs every prompt in one batch, then `steps` batched greedy decodes; returns the
/// logits per sequence per step.
fn batched(runner: &mut ModelRunner, prompts: &[Vec<u32>], steps: usize) -> Vec<Vec<Vec<f32>>> {
    let tables = tables(prompts.len(), 8, 64);
    let mut out = vec![Vec::new(); prompts.len()];
    let mut next: Vec<Vec<u32>> = prompts.to_vec();
    let mut pos = vec![0usize; prompts.len()];
    for _ in 0..=steps {
        let items = (0..prompts.len())
            .map(|i| BatchItem {
                images: Vec::new(),
                seq: SeqId(i as u64),
                tokens: next[i].clone(),
                start_pos: pos[i],
                block_table: tables[i].clone(),
                logit_rows: 1,
                prompt_len: prompts[i].len(),
                persist: Vec::new(),
                draft: None,
                adapter: None,
            })
            .collect();
        let step = runner.run(RunBatch {
            items,
            ..RunBatch::default()
        });
        for (i, item) in step.items.into_iter().enumerate() {
            let l = item.logits.expect("forward").pop().expect("logits");
            pos[i] += next[i].len();
            next[i] = vec![argmax(&l)];
            out[i].push(l);
        }
    }
    out
}

#[test]
fn batched_logits_equal_solo_bit_for_bit() {
    let model = load(MatrixPolicy::default());
    let prompts = prompts();
    let reference: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| solo(&model, p, 3)).collect();
    let pool = KvBlockPool::new(&model.kv_layout(), BLOCK, 64, &Device::Cpu).expect("pool");
    let mut runner = ModelRunner::new(model, pool);
    let got = batched(&mut runner, &prompts, 3);
    for (i, (r, g)) in reference.iter().zip(&got).enumerate() {
        for (step, (a, b)) in r.iter().zip(g).enumerate() {
            assert_eq!(
                bits(a),
                bits(b),
                "sequence {i} step {step} differs from solo"
            );
        }
    }
}

#[test]
fn chunked_prefill_mixed_with_decodes_equals_solo() {
    let model = load(MatrixPolicy::default());
    let prompts = prompts();
    let long = &prompts[3]; // 40 tokens: chunks of 16, 16, 8
    let short = &prompts[0];
    let ref_long = solo(&model, long, 0);
    let ref_short = solo(&model, short, 3);
    let pool = KvBlockPool::new(&model.kv_layout(), BLOCK, 16, &Device::Cpu).expect("pool");
    let mut runner = ModelRunner::new(model, pool);
    let (t_long, t_short) = (vec![9u32, 3, 12], vec![0u32, 15]);
    // Step 0: the short prompt whole + the long prompt's first chunk.
    let mut short_next = short.clone();
    let mut short_pos = 0;
    let mut long_pos = 0;
    let mut short_logits = Vec::new();
    let mut long_last = None;
    for chunk in [16usize, 16, 8] {
        let items = vec![
            BatchItem {
                images: Vec::new(),
                seq: SeqId(1),
                tokens: long[long_pos..long_pos + chunk].to_vec(),
                start_pos: long_pos,
                block_table: t_long.clone(),
                logit_rows: usize::from(long_pos + chunk == long.len()),
                prompt_len: long.len(),
                persist: Vec::new(),
                draft: None,
                adapter: None,
            },
            BatchItem {
                images: Vec::new(),
                seq: SeqId(2),
                tokens: short_next.clone(),
                start_pos: short_pos,
                block_table: t_short.clone(),
                logit_rows: 1,
                prompt_len: short.len(),
                persist: Vec::new(),
                draft: None,
                adapter: None,
            },
        ];
        let mut out = runner
            .run(RunBatch {
                items,
                ..RunBatch::default()
            })
            .items
            .into_iter();
        let l = out.next().expect("long").logits.expect("forward").pop();
        assert_eq!(
            l.is_some(),
            long_pos + chunk == long.len(),
            "logits only when wanted"
        );
        long_last = l.or(long_last);
        let s = out
            .next()
            .expect("short")
            .logits
            .expect("forward")
            .pop()
            .expect("logits");
        long_pos += chunk;
        short_pos += short_next.len();
        short_next = vec![argmax(&s)];
        short_logits.push(s);
    }
    assert_eq!(bits(&long_last.expect("long logits")), bits(&ref_long[0]));
    for (step, (a, b)) in ref_short.iter().zip(&short_logits).enumerate() {
        assert_eq!(bits(a), bits(b), "short sequence step {step}");
    }
}

/// The tensor path (candle ops over gathered slots, as on CUDA) against the CPU kernel:
/// the CPU kernel follows llama.cpp's flash attention (f16 query, f16 value
/// accumulator) while the tensor path computes in f32, and per-layer Q8_1
/// re-quantization amplifies the difference, so logits agree within 1.5 (they span
/// about 40) and the greedy tokens are equal at every step but near ties (a gap ≤ 0.5
/// in the reference's logits). A wrong mask, position or head mapping moves logits by
/// far more and changes the tokens.
#[test]
fn tensor_attention_path_agrees_with_cpu_kernel() {
    let model = load(MatrixPolicy::default());
    let prompts = prompts();
    let reference: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| solo(&model, p, 2)).collect();
    let pool =
        KvBlockPool::new_tensor_backed(&model.kv_layout(), BLOCK, 64, &Device::Cpu).expect("pool");
    let mut runner = ModelRunner::new(model, pool);
    let got = batched(&mut runner, &prompts, 2);
    let mut worst = 0f32;
    for (r, g) in reference.iter().zip(&got) {
        for (a, b) in r.iter().zip(g) {
            let (ia, ib) = (argmax(a) as usize, argmax(b) as usize);
            if ia != ib {
                // Only a near tie may flip (the two kernels round differently); the
                // generations then part, so later steps are not comparable.
                let gap = a[ia] - a[ib];
                assert!(gap <= 0.5, "tokens {ia} vs {ib}: not a near tie ({gap})");
                break;
            }
            let d = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            worst = worst.max(d);
        }
    }
    eprintln!("tensor path vs CPU kernel: max |Δlogit| = {worst}");
    assert!(worst < 1.5, "max |Δlogit| = {worst}");
}

#[test]
fn bad_block_tables_are_errors_not_panics() {
    let model = load(MatrixPolicy::default());
    let pool = KvBlockPool::new(&model.kv_layout(), BLOCK, 4, &Device::Cpu).expect("pool");
    let mut runner = ModelRunner::new(model, pool);
    let item = |tokens: usize, table: Vec<u32>| BatchItem {
        images: Vec::new(),
        seq: SeqId(1),
        tokens: vec![300; tokens],
        start_pos: 0,
        block_table: table,
        logit_rows: 1,
        prompt_len: tokens,
        persist: Vec::new(),
        draft: None,
        adapter: None,
    };
    for (tokens, table, want) in [
        (
            17,
            vec![0],
            "block table has 1 blocks but positions 0..17 need 2 blocks",
        ),
        (
            3,
            vec![4],
            "block id 4 is out of range (the pool has 4 blocks)",
        ),
        (0, vec![0], "a sequence has no tokens"),
    ] {
        let out = runner.run(RunBatch {
            items: vec![item(tokens, table)],
            ..RunBatch::default()
        });
        let e = out.items[0].logits.as_ref().expect_err("must fail");
        assert!(e.message.contains(want), "{}", e.message);
    }
}

/// The host forward path (fused projections, no tensor ops) gives exactly the bits of
/// the tensor-ops path on the same host pool: a prefill batch of four prompts, then a
/// decode step, under both Q4_1 policies that use our kernels or candle's.
#[test]
fn host_path_equals_tensor_ops_path_bit_for_bit() {
    for policy in [
        MatrixPolicy::default(),
        MatrixPolicy {
            kernels: Kernels::Native,
            quantize: Quantize::Q8_0,
        },
    ] {
        let model = load(policy);
        let prompts = prompts();
        let tables = tables(prompts.len(), 4, 64);
        let mut pools = [
            KvBlockPool::new(&model.kv_layout(), BLOCK, 64, &Device::Cpu).expect("pool"),
            KvBlockPool::new(&model.kv_layout(), BLOCK, 64, &Device::Cpu).expect("pool"),
        ];
        let mut next: Vec<Vec<u32>> = prompts.clone();
        let mut pos = vec![0usize; prompts.len()];
        for step in 0..2 {
            let seqs: Vec<ForwardSeq<'_>> = (0..prompts.len())
                .map(|i| ForwardSeq {
                    tokens: &next[i],
                    start_pos: pos[i],
                    block_table: &tables[i],
                    logit_rows: usize::from(i != 1),
                    prompt_len: prompts[i].len(),
                    adapter: None,
                    media: None,
                })
                .collect();
            let [host_pool, ops_pool] = &mut pools;
            let host = model
                .forward_batch(&seqs, host_pool)
                .expect("host")
                .expect("logits");
            let ops = model
                .forward_batch_ops(&seqs, ops_pool)
                .expect("ops")
                .expect("logits");
            assert_eq!(host.dims(), &[3, model.spec().vocab_size]);
            let (h, o) = (
                host.to_vec2::<f32>().expect("host"),
                ops.to_vec2::<f32>().expect("ops"),
            );
            for (r, (a, b)) in h.iter().zip(&o).enumerate() {
                assert_eq!(bits(a), bits(b), "{policy:?} step {step} row {r}");
            }
            let mut row = 0;
            for i in 0..prompts.len() {
                pos[i] += next[i].len();
                next[i] = if i == 1 {
                    vec![42]
                } else {
                    vec![argmax(&h[row])]
                };
                row += usize::from(i != 1);
            }
        }
    }
}

/// A chunked prefill that asks for every row (a scored prompt, `echo`) returns, for each
/// position, the logits a one-token decode step at that position gives, bit for bit:
/// the rows come back in position order, chunk by chunk, and under llama.cpp's tiled
/// prefill threshold (64 rows) a prompt row and a decode row share their arithmetic.
#[test]
fn every_prompt_row_equals_the_decode_step_at_its_position() {
    let model = load(MatrixPolicy::default());
    let prompt = prompts()[3][..17].to_vec();
    let mut cache = SoloKv::new(&model.kv_layout(), model.device()).expect("kv");
    let decoded: Vec<Vec<f32>> = prompt
        .iter()
        .map(|&t| {
            model
                .forward(&[t], &mut cache)
                .and_then(|l| l.to_vec1::<f32>())
                .expect("decode")
        })
        .collect();
    let pool = KvBlockPool::new(&model.kv_layout(), BLOCK, 8, &Device::Cpu).expect("pool");
    let mut runner = ModelRunner::new(model, pool);
    let mut rows = Vec::new();
    for (start, end) in [(0usize, 9usize), (9, 17)] {
        let item = BatchItem {
            images: Vec::new(),
            seq: SeqId(1),
            tokens: prompt[start..end].to_vec(),
            start_pos: start,
            block_table: vec![3, 5],
            logit_rows: end - start,
            prompt_len: prompt.len(),
            persist: Vec::new(),
            draft: None,
            adapter: None,
        };
        let out = runner.run(RunBatch {
            items: vec![item],
            ..RunBatch::default()
        });
        let got = out
            .items
            .into_iter()
            .next()
            .expect("item")
            .logits
            .expect("rows");
        assert_eq!(got.len(), end - start);
        rows.extend(got);
    }
    for (pos, (a, b)) in decoded.iter().zip(&rows).enumerate() {
        assert_eq!(bits(a), bits(b), "position {pos}");
    }
}

/// A speculative verification item (the pending token plus drafts, a logits row each,
/// past the prompt) gives each row the bits of the one-token decode step at its
/// position, alone and beside another sequence's prefill chunk and decode, under both
/// Q4_1 policies: the rows of a k-row pass are row-independent, so greedy output is the
/// same with and without speculation.
#[test]
fn verification_rows_equal_one_row_decode_steps_bit_for_bit() {
    for policy in [
        MatrixPolicy::default(),
        MatrixPolicy {
            kernels: Kernels::Native,
            quantize: Quantize::Q8_0,
        },
    ] {
        let model = load(policy);
        let prompt = prompts()[2].clone(); // 17 tokens
        let want = solo(&model, &prompt, 6);
        let tokens: Vec<u32> = want[..6].iter().map(|l| argmax(l)).collect();
        let pool = KvBlockPool::new(&model.kv_layout(), BLOCK, 16, &Device::Cpu).expect("pool");
        let mut runner = ModelRunner::new(model, pool);
        let others = prompts();
        let item = |seq: u64,
                    tokens: Vec<u32>,
                    start_pos: usize,
                    rows: usize,
                    table: Vec<u32>,
                    prompt_len: usize| BatchItem {
            images: Vec::new(),
            seq: SeqId(seq),
            tokens,
            start_pos,
            block_table: table,
            logit_rows: rows,
            prompt_len,
            persist: Vec::new(),
            draft: None,
            adapter: None,
        };
        for company in [false, true] {
            let mut items = vec![item(1, prompt.clone(), 0, 1, vec![9, 4], prompt.len())];
            if company {
                items.push(item(2, others[3][..20].to_vec(), 0, 0, vec![1, 2, 3], 40));
                items.push(item(3, others[0].clone(), 0, 1, vec![7], 5));
            }
            let out = runner.run(RunBatch {
                items,
                ..RunBatch::default()
            });
            let first = out.items[0].logits.as_ref().expect("prefill");
            assert_eq!(bits(&first[0]), bits(&want[0]), "{policy:?} prefill");
            // Pending token t1 and drafts t2..t5 (the greedy continuation): rows 1..=5.
            let mut items = vec![item(
                1,
                tokens[..5].to_vec(),
                17,
                5,
                vec![9, 4],
                prompt.len(),
            )];
            if company {
                items.push(item(2, others[3][20..].to_vec(), 20, 1, vec![1, 2, 3], 40));
                items.push(item(3, vec![42], 5, 1, vec![7], 5));
            }
            let out = runner.run(RunBatch {
                items,
                ..RunBatch::default()
            });
            let rows = out.items[0].logits.as_ref().expect("verification");
            assert_eq!(rows.len(), 5);
            for (r, row) in rows.iter().enumerate() {
                assert_eq!(
                    bits(row),
                    bits(&want[r + 1]),
                    "{policy:?} company {company} row {r}"
                );
            }
        }
    }
}
