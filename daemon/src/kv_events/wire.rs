//! The msgpack encoding of an event batch, as vLLM's `msgspec` types
//! (`vllm/distributed/kv_events.py`) decode it. The batch is an array `[ts, events,
//! data_parallel_rank]` (`EventBatch` with `array_like=True`). vLLM's versions differ
//! on the events, so [`EventEncoding`] picks:
//!
//! - `Array` (the default): each event a tagged array, `["BlockStored", block_hashes,
//!   parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
//!   extra_keys]`, `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`
//!   (`KVCacheEvent` with `array_like=True, tag=True`): what llm-d's decoder
//!   (`pkg/kvcache/kvevents`) and vLLM's subscriber example with array-like events read;
//! - `Map`: each event a map tagged by `"type"` with the same fields (`tag=True`
//!   without `array_like`, later vLLM versions).
//!
//! Dynamo's `zmq_wire` reads both. `lora_id` (deprecated upstream) is always nil.

use serde::ser::{SerializeMap, SerializeSeq, SerializeTuple};
use serde::{Serialize, Serializer};

use super::KvEvent;
pub use crate::config::EventEncoding;

/// One message's payload.
pub struct EventBatch<'a> {
    /// Seconds since the Unix epoch.
    pub ts: f64,
    /// The events, in order.
    pub events: &'a [KvEvent],
    /// `[kv_events] data_parallel_rank`.
    pub data_parallel_rank: i32,
    /// How each event is laid out.
    pub encoding: EventEncoding,
}

impl Serialize for EventBatch<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(3)?;
        t.serialize_element(&self.ts)?;
        t.serialize_element(&Events(self.events, self.encoding))?;
        t.serialize_element(&self.data_parallel_rank)?;
        t.end()
    }
}

struct Events<'a>(&'a [KvEvent], EventEncoding);

impl Serialize for Events<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for e in self.0 {
            seq.serialize_element(&Event(e, self.1))?;
        }
        seq.end()
    }
}

/// One event's fields in order, the tag first.
fn fields(e: &KvEvent) -> Vec<(&'static str, serde_json::Value)> {
    use serde_json::json;
    match e {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            medium,
            lora_name,
            extra_keys,
        } => vec![
            ("type", json!("BlockStored")),
            ("block_hashes", json!(block_hashes)),
            ("parent_block_hash", json!(parent_block_hash)),
            ("token_ids", json!(token_ids)),
            ("block_size", json!(block_size)),
            ("lora_id", json!(null)),
            ("medium", json!(medium.as_str())),
            ("lora_name", json!(lora_name)),
            (
                "extra_keys",
                if extra_keys.iter().all(Option::is_none) {
                    json!(null)
                } else {
                    json!(extra_keys)
                },
            ),
        ],
        KvEvent::BlockRemoved {
            block_hashes,
            medium,
        } => vec![
            ("type", json!("BlockRemoved")),
            ("block_hashes", json!(block_hashes)),
            ("medium", json!(medium.as_str())),
        ],
        KvEvent::AllBlocksCleared => vec![("type", json!("AllBlocksCleared"))],
    }
}

struct Event<'a>(&'a KvEvent, EventEncoding);

impl Serialize for Event<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let f = fields(self.0);
        match self.1 {
            EventEncoding::Array => {
                let mut seq = s.serialize_seq(Some(f.len()))?;
                for (_, v) in &f {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            EventEncoding::Map => {
                let mut m = s.serialize_map(Some(f.len()))?;
                for (k, v) in &f {
                    m.serialize_entry(k, v)?;
                }
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

    fn sample() -> Vec<KvEvent> {
        vec![
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
            KvEvent::BlockStored {
                block_hashes: vec![9],
                parent_block_hash: Some(7),
                token_ids: vec![5, 6],
                block_size: 2,
                medium: Medium::Disk,
                lora_name: None,
                extra_keys: vec![None],
            },
        ]
    }

    /// Through serde's data model into JSON: arrays stay arrays, maps maps.
    fn decoded(encoding: EventEncoding) -> serde_json::Value {
        let events = sample();
        let bytes = encode(&EventBatch {
            ts: 1.5,
            events: &events,
            data_parallel_rank: 0,
            encoding,
        });
        rmp_serde::from_slice(&bytes).expect("msgpack")
    }

    #[test]
    fn a_batch_is_a_triple_of_tagged_arrays() {
        let v = decoded(EventEncoding::Array);
        assert_eq!(v[0], 1.5);
        assert_eq!(v[2], 0);
        assert_eq!(v.as_array().map(Vec::len), Some(3));
        assert_eq!(
            v[1],
            serde_json::json!([
                ["AllBlocksCleared"],
                [
                    "BlockStored",
                    [u64::MAX, 7],
                    null,
                    [1, 2, 3, 4],
                    2,
                    null,
                    "CPU",
                    "sql",
                    [["sql", "s"], ["sql"]]
                ],
                ["BlockRemoved", [7], "DISK"],
                ["BlockStored", [9], 7, [5, 6], 2, null, "DISK", null, null],
            ])
        );
    }

    #[test]
    fn the_map_encoding_tags_each_event_by_type() {
        let v = decoded(EventEncoding::Map);
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
