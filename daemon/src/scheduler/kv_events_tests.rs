//! The memory tier's KV-cache events from the policy, driven without actix: stored
//! runs with their parents, tokens and extra keys; nothing for blocks already held;
//! evictions as `BlockRemoved`, the chain's tail first.

use super::prefix_tests::{admit, prompt, request, sched};
use crate::kv_events::{external_hash, KvEvent, Medium};
use crate::prefix_store::{chain_hash, root_hash_with, ModelFingerprint};
use crate::request::{CacheOptions, SeqId};

const BS: usize = 4;

#[test]
fn stored_runs_name_their_parent_tokens_and_salt_and_evictions_are_removed() {
    let mut s = sched(6).with_kv_events(Medium::Cpu);
    let salted = CacheOptions {
        enabled: true,
        salt: "tenant-a".into(),
    };
    let fp = ModelFingerprint([1; 32]);
    let root = root_hash_with(&fp, "tenant-a", None);
    let p = prompt(9);
    let h0 = chain_hash(&root, &fp, &p[..BS]);
    let h1 = chain_hash(&h0, &fp, &p[BS..2 * BS]);

    let (r1, _k1) = request(1, p.clone(), salted.clone());
    admit(&mut s, r1);
    assert_eq!(
        s.take_kv_events(),
        vec![KvEvent::BlockStored {
            block_hashes: vec![external_hash(&h0), external_hash(&h1)],
            parent_block_hash: None,
            token_ids: p[..2 * BS].to_vec(),
            block_size: BS,
            medium: Medium::Cpu,
            lora_name: None,
            extra_keys: vec![Some(vec!["tenant-a".into()]), None],
        }]
    );
    assert!(s.take_kv_events().is_empty(), "taken once");

    // Generated tokens fill block 2: one more stored block, child of h1.
    let seq = s.running_mut(SeqId(1)).expect("running");
    for t in [900, 901, 902] {
        seq.generated.push(t);
    }
    seq.computed = 12;
    s.commit_step(SeqId(1));
    match s.take_kv_events().as_slice() {
        [KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            extra_keys,
            ..
        }] => {
            assert_eq!(block_hashes.len(), 1);
            assert_eq!(*parent_block_hash, Some(external_hash(&h1)));
            assert_eq!(token_ids, &vec![108, 900, 901, 902]);
            assert_eq!(extra_keys, &vec![None]);
        }
        other => panic!("expected one stored block, got {other:?}"),
    }

    // The same prompt again: its blocks are held already, nothing new is stored.
    let (r2, _k2) = request(2, p.clone(), salted);
    admit(&mut s, r2);
    assert!(s.take_kv_events().is_empty());

    // Both finish; 20 other tokens need 5 of the 6 blocks: the allocator evicts
    // cached blocks, the chain's tail first.
    s.remove_running(SeqId(1));
    s.remove_running(SeqId(2));
    let (r3, _k3) = request(3, (500..520).collect(), CacheOptions::default());
    admit(&mut s, r3);
    let events = s.take_kv_events();
    match events.first() {
        Some(KvEvent::BlockRemoved {
            block_hashes,
            medium: Medium::Cpu,
        }) => {
            assert_eq!(block_hashes.len(), 2, "{events:?}");
            assert!(!block_hashes.contains(&external_hash(&h0)), "head kept");
            assert!(block_hashes.contains(&external_hash(&h1)));
        }
        other => panic!("expected the evictions first, got {other:?}"),
    }
    assert!(
        matches!(events.get(1), Some(KvEvent::BlockStored { block_hashes, .. }) if block_hashes.len() == 5),
        "{events:?}"
    );
}

#[test]
fn without_kv_events_nothing_is_recorded() {
    let mut s = sched(6);
    let (r1, _k1) = request(1, prompt(9), CacheOptions::default());
    admit(&mut s, r1);
    assert!(s.take_kv_events().is_empty());
}
