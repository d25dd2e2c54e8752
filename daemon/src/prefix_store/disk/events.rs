//! The disk tier's KV-cache events (`medium` = `DISK`): every block written
//! (`BlockStored`) or deleted (`BlockRemoved`), and at start every block the store
//! holds, announced after the publisher's `AllBlocksCleared` (parents before
//! children, so a consumer can chain them). Events gather while the writer handles one
//! message and go out as one batch ([`DiskStore::flush_kv_events`]).

use std::collections::HashMap;
use std::io::Read;

use super::{block_path, DiskStore};
use crate::kv_events::{external_hash, KvEvent, KvEventSink, Medium, OneBlockKeys};
use crate::prefix_store::entry::HEADER_BYTES;
use crate::prefix_store::hash::BlockHash;

/// Largest token count a block file may claim (`scheduler.block_size`'s bound).
const MAX_BLOCK_TOKENS: usize = 1024;

/// The publisher and the events not handed to it yet.
#[derive(Debug)]
pub(super) struct DiskEvents {
    sink: KvEventSink,
    pending: Vec<KvEvent>,
    block_size: usize,
}

impl DiskStore {
    /// Publishes this store's events from now on, starting with every block it holds
    /// (`block_size` tokens each).
    pub fn with_kv_events(&mut self, sink: KvEventSink, block_size: usize) {
        self.kv_events = Some(DiskEvents {
            sink,
            pending: Vec::new(),
            block_size,
        });
        self.announce_held();
        self.flush_kv_events();
    }

    /// Hands the events gathered since the last call to the publisher.
    pub fn flush_kv_events(&mut self) {
        if let Some(e) = self.kv_events.as_mut() {
            e.sink.publish(&std::mem::take(&mut e.pending));
        }
    }

    /// Notes a block written.
    pub(super) fn note_stored(
        &mut self,
        hash: &BlockHash,
        parent: Option<&BlockHash>,
        tokens: &[u32],
        keys: &OneBlockKeys,
    ) {
        if let Some(e) = self.kv_events.as_mut() {
            e.pending.push(KvEvent::BlockStored {
                block_hashes: vec![external_hash(hash)],
                parent_block_hash: parent.map(external_hash),
                token_ids: tokens.to_vec(),
                block_size: e.block_size,
                medium: Medium::Disk,
                lora_name: keys.lora_name.clone(),
                extra_keys: vec![keys.extra_keys.clone()],
            });
        }
    }

    /// Notes a block deleted.
    pub(super) fn note_removed(&mut self, hash: &BlockHash) {
        if let Some(e) = self.kv_events.as_mut() {
            e.pending.push(KvEvent::BlockRemoved {
                block_hashes: vec![external_hash(hash)],
                medium: Medium::Disk,
            });
        }
    }

    /// Queues a `BlockStored` for every held block whose tokens its file gives,
    /// chains from their first block on.
    fn announce_held(&mut self) {
        let mut order: Vec<BlockHash> = self
            .entries
            .iter()
            .filter(|(_, m)| m.parent.is_none_or(|p| !self.entries.contains_key(&p)))
            .map(|(h, _)| *h)
            .collect();
        order.sort();
        let mut i = 0;
        while i < order.len() {
            if let Some(kids) = self.children.get(&order[i]) {
                let mut kids = kids.clone();
                kids.sort();
                order.extend(kids);
            }
            i += 1;
        }
        let parents: HashMap<BlockHash, Option<BlockHash>> =
            self.entries.iter().map(|(h, m)| (*h, m.parent)).collect();
        for h in order {
            if let Some(tokens) = read_tokens(&block_path(&self.blocks, &h)) {
                let parent = parents.get(&h).copied().flatten();
                // The store keeps hashes and tokens, not the adapter or salt.
                self.note_stored(&h, parent.as_ref(), &tokens, &OneBlockKeys::default());
            }
        }
    }
}

/// The token ids in a block file's header (after magic, version, fingerprint and
/// hash: a u32 count and the ids, little-endian), or `None` when unreadable.
fn read_tokens(file: &std::path::Path) -> Option<Vec<u32>> {
    let mut f = std::fs::File::open(file).ok()?;
    let mut head = [0u8; HEADER_BYTES + 4];
    f.read_exact(&mut head).ok()?;
    let mut n = [0u8; 4];
    n.copy_from_slice(&head[HEADER_BYTES..]);
    let n = u32::from_le_bytes(n) as usize;
    if n > MAX_BLOCK_TOKENS {
        return None;
    }
    let mut ids = vec![0u8; n * 4];
    f.read_exact(&mut ids).ok()?;
    Some(
        ids.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}
