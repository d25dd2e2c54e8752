//! The msgpack encoding of an event batch, as vLLM's `msgspec` types decode it
//! (`vllm/distributed/kv_events.py`, and the subscriber example
//! `examples/features/kv_events/kv_events_subscriber.py`):
//!
//! - the batch is an array `[ts, events, data_parallel_rank]` (`EventBatch` with
//!   `array_like=True`; Dynamo's `zmq_wire::KvEventBatch` reads the same triple);
//! - each event is a map tagged by `"type"` (`KVCacheEvent` with `tag=True`):
//!   `BlockStored {block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//!   medium, lora_name, extra_keys}`, `BlockRemoved {block_hashes, medium}`,
//!   `AllBlocksCleared {}`. `lora_id` (deprecated upstream) is always nil.

use serde::ser::{SerializeMap, SerializeTuple};
use serde::{Serialize, Serializer};

use super::KvEvent;

/// One message's payload.
pub struct EventBatch<'a> {
    /// Seconds since the Unix epoch.
    pub ts: f64,
    /// The events, in order.
    pub events: &'a [KvEvent],
    /// `[kv_events] data_parallel_rank`.
    pub data_parallel_rank: i32,
}

impl Serialize for EventBatch<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&self.ts)?;
        t.serialize_element(&Events(self.events))?;
        t.serialize_element(&self.data_parallel_rank)?;
        t.end()
    }
}

struct Events<'a>(&'a [KvEvent]);

impl Serialize for Events<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0)
    }
}

impl Serialize for KvEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                medium,
                lora_name,
                extra_keys,
            } => {
                let with_keys = !extra_keys.is_empty();
                let mut m = s.serialize_map(Some(8 + usize::from(with_keys)))?;
                m.serialize_entry("type", "BlockStored")?;
                m.serialize_entry("block_hashes", block_hashes)?;
                m.serialize_entry("parent_block_hash", parent_block_hash)?;
                m.serialize_entry("token_ids", token_ids)?;
                m.serialize_entry("block_size", block_size)?;
                m.serialize_entry("lora_id", &None::<u64>)?;
                m.serialize_entry("medium", medium.as_str())?;
                m.serialize_entry("lora_name", lora_name)?;
                if with_keys {
                    m.serialize_entry("extra_keys", extra_keys)?;
                }
                m.end()
            }
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } => {
                let mut m = s.serialize_map(Some(3))?;
                m.serialize_entry("type", "BlockRemoved")?;
                m.serialize_entry("block_hashes", block_hashes)?;
                m.serialize_entry("medium", medium.as_str())?;
                m.end()
            }
            KvEvent::AllBlocksCleared => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("type", "AllBlocksCleared")?;
                m.end()
            }
        }
    }
}

/// The msgpack bytes of `batch`.
pub fn encode(batch: &EventBatch<'_>) -> Vec<u8> {
    // Serializing plain integers, strings, options and sequences into a Vec cannot fail.
    rmp_serde::to_vec(batch).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::Medium;

    #[test]
    fn a_batch_is_a_triple_of_tagged_maps() {
        let events = [
            KvEvent::AllBlocksCleared,
            KvEvent::BlockStored {
                block_hashes: vec![u64::MAX, 7],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
                medium: Medium::Cpu,
                lora_name: Some("sql".into()),
                extra_keys: vec![
                    Some(vec!["sql".into(), "s".into()]),
                    Some(vec!["sql".into()]),
                ],
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![7],
                medium: Medium::Disk,
            },
        ];
        let bytes = encode(&EventBatch {
            ts: 1.5,
            events: &events,
            data_parallel_rank: 0,
        });
        // Through serde's data model into JSON: arrays stay arrays, maps maps.
        let v: serde_json::Value = rmp_serde::from_slice(&bytes).expect("msgpack");
        assert_eq!(v[0], 1.5);
        assert_eq!(v[2], 0);
        assert_eq!(v.as_array().map(Vec::len), Some(3));
        assert_eq!(v[1][0], serde_json::json!({"type": "AllBlocksCleared"}));
        assert_eq!(
            v[1][1],
            serde_json::json!({
                "type": "BlockStored", "block_hashes": [u64::MAX, 7],
                "parent_block_hash": null, "token_ids": [1, 2, 3, 4], "block_size": 2,
                "lora_id": null, "medium": "CPU", "lora_name": "sql",
                "extra_keys": [["sql", "s"], ["sql"]],
            })
        );
        assert_eq!(
            v[1][2],
            serde_json::json!({"type": "BlockRemoved", "block_hashes": [7], "medium": "DISK"})
        );
    }
}
