//! The disk tier: cached blocks in a sled database, bounded by a byte budget with LRU
//! eviction.
//!
//! Keys in the default tree:
//! - `B` ‖ hash → the block's entry ([`super::entry`]: version, fingerprint, tokens,
//!   K/V, CRC-32).
//! - `L` ‖ hash → 24 bytes: last use (a logical clock, u64 LE), entry size in bytes
//!   (u64 LE), the first 8 bytes of the writer's fingerprint.
//! - `M` → format version (u32 LE) ‖ fingerprint of the last daemon that opened it.
//!
//! `B` and `L` of one block are written and removed in one atomic sled batch, so after
//! a crash (kill -9) the pair is present or absent together; a torn or corrupt value
//! fails its checksum when read and is deleted, never served. Start-up reads only the
//! small `L` records to rebuild the LRU order and byte count. sled writes its log in
//! the background and flushes it every 500 ms and on [`DiskStore::flush`].

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::entry::{self, FORMAT_VERSION};
use super::hash::{BlockHash, ModelFingerprint};

/// Counters of the disk tier, shared with the scheduler for the `stats` message.
#[derive(Debug, Default)]
pub struct DiskCounters {
    /// Blocks stored (this model's and others').
    pub blocks: AtomicU64,
    /// Bytes of stored entries (values as written; sled's own overhead not counted).
    pub bytes: AtomicU64,
    /// Blocks served to requests.
    pub hit_blocks: AtomicU64,
    /// Blocks written.
    pub written_blocks: AtomicU64,
    /// Blocks evicted to stay within the budget.
    pub evicted_blocks: AtomicU64,
    /// Entries found corrupt, truncated or foreign when read, deleted.
    pub dropped_corrupt: AtomicU64,
    /// Blocks not written because the write queue was over its byte bound.
    pub dropped_writes: AtomicU64,
    /// Bytes of K/V handed to the store and not yet written.
    pub queued_bytes: AtomicU64,
    /// Hashes of the stored blocks, so the scheduler can tell without a round trip to
    /// the store's thread (which may be busy writing) whether a lookup can find
    /// anything.
    pub index: std::sync::RwLock<HashSet<BlockHash>>,
}

impl DiskCounters {
    /// How many of `hashes`, from the first, the store holds (by the index; the
    /// entries are verified when read).
    pub fn stored_run(&self, hashes: &[BlockHash]) -> usize {
        match self.index.read() {
            Ok(set) => hashes.iter().take_while(|h| set.contains(h)).count(),
            Err(_) => hashes.len(), // a poisoned lock: let the store decide
        }
    }
}

/// Why the store could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled failed (I/O, a corrupt database it cannot recover, a lock held by another
    /// process).
    #[error("prefix store at {path}: {source}")]
    Sled {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        source: sled::Error,
    },
}

/// A read-only handle on the store for another thread: reads and verifies runs of
/// blocks without the writer's LRU state (the [`DiskStore`] owner applies the uses and
/// deletions it reports). sled handles are shared and thread-safe.
#[derive(Debug, Clone)]
pub struct DiskReader {
    db: sled::Db,
    fingerprint: ModelFingerprint,
    block_bytes: usize,
    counters: Arc<DiskCounters>,
}

/// What [`DiskReader::read_run`] found.
#[derive(Debug, Default)]
pub struct RunRead {
    /// K/V payloads of the run, in order.
    pub blocks: Vec<Vec<u8>>,
    /// The hashes of those blocks (to mark as used).
    pub used: Vec<BlockHash>,
    /// An entry that failed verification (to delete), or that the index listed but the
    /// database no longer holds.
    pub bad: Option<BlockHash>,
}

impl DiskReader {
    /// Reads the longest run of stored blocks `hashes[0..]` whose entries are intact
    /// and carry `tokens[i]`. The run stops at the first block missing or rejected; a
    /// rejected entry is counted, leaves the shared index at once, and is reported in
    /// [`RunRead::bad`] for the writer to delete.
    pub fn read_run(&self, hashes: &[BlockHash], tokens: &[Vec<u32>]) -> RunRead {
        let mut out = RunRead::default();
        for (h, toks) in hashes.iter().zip(tokens) {
            let value = match self.db.get(key(b'B', h)) {
                Ok(Some(v)) => v,
                Ok(None) => {
                    if self.counters.stored_run(std::slice::from_ref(h)) == 1 {
                        out.bad = Some(*h);
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "prefix store: read failed");
                    break;
                }
            };
            match entry::decode(&value, &self.fingerprint, h, toks, self.block_bytes) {
                Ok(kv) => {
                    out.blocks.push(kv.to_vec());
                    out.used.push(*h);
                }
                Err(e) => {
                    tracing::warn!(
                        block = %h,
                        reason = %e,
                        "prefix store: dropped an entry that failed verification; it will be recomputed"
                    );
                    self.counters
                        .dropped_corrupt
                        .fetch_add(1, Ordering::Relaxed);
                    if let Ok(mut set) = self.counters.index.write() {
                        set.remove(h);
                    }
                    out.bad = Some(*h);
                    break;
                }
            }
        }
        self.counters
            .hit_blocks
            .fetch_add(out.blocks.len() as u64, Ordering::Relaxed);
        out
    }
}

#[derive(Debug, Clone, Copy)]
struct Meta {
    last_use: u64,
    size: u64,
}

/// One model's view of the sled prefix store. Single-threaded: the
/// [`super::PrefixStoreActor`] owns it.
#[derive(Debug)]
pub struct DiskStore {
    db: sled::Db,
    path: PathBuf,
    fingerprint: ModelFingerprint,
    block_bytes: usize,
    max_bytes: u64,
    clock: u64,
    entries: HashMap<BlockHash, Meta>,
    lru: BTreeMap<u64, BlockHash>,
    bytes: u64,
    counters: Arc<DiskCounters>,
}

fn key(tag: u8, h: &BlockHash) -> [u8; 33] {
    let mut k = [0u8; 33];
    k[0] = tag;
    k[1..].copy_from_slice(&h.0);
    k
}

fn meta_value(m: Meta, fp: &ModelFingerprint) -> [u8; 24] {
    let mut v = [0u8; 24];
    v[..8].copy_from_slice(&m.last_use.to_le_bytes());
    v[8..16].copy_from_slice(&m.size.to_le_bytes());
    v[16..].copy_from_slice(&fp.0[..8]);
    v
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl DiskStore {
    /// Opens (creating) the store at `path` for blocks of `block_bytes` K/V bytes
    /// written under `fingerprint`, bounded by `max_bytes` of entries. Entries of
    /// another fingerprint or format version stay ignored (they can never match a key
    /// of this model) and are evicted first as space is needed; that is logged once.
    ///
    /// # Errors
    /// [`StoreError`] when sled cannot open the directory.
    pub fn open(
        path: &Path,
        fingerprint: ModelFingerprint,
        block_bytes: usize,
        max_bytes: u64,
        counters: Arc<DiskCounters>,
    ) -> Result<Self, StoreError> {
        let err = |source| StoreError::Sled {
            path: path.to_path_buf(),
            source,
        };
        let config = sled::Config::new()
            .path(path)
            .cache_capacity(64 << 20)
            .flush_every_ms(Some(500));
        // sled releases its file lock when its background flusher lets go of the
        // database, shortly after the last handle is dropped (or a previous daemon
        // exits): retry a held lock for up to 5 s before giving up.
        let mut attempts = 0;
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                Err(sled::Error::Io(e)) if e.to_string().contains("lock") && attempts < 250 => {
                    attempts += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(err(e)),
            }
        };
        let mut store = Self {
            db,
            path: path.to_path_buf(),
            fingerprint,
            block_bytes,
            max_bytes,
            clock: 0,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            bytes: 0,
            counters,
        };
        let mut foreign: Vec<(u64, BlockHash)> = Vec::new();
        let mut broken = Vec::new();
        for kv in store.db.scan_prefix(b"L") {
            let (k, v) = kv.map_err(err)?;
            if k.len() != 33 || v.len() != 24 {
                broken.push(k);
                continue;
            }
            let mut h = [0u8; 32];
            h.copy_from_slice(&k[1..]);
            let h = BlockHash(h);
            let meta = Meta {
                last_use: u64_at(&v, 0),
                size: u64_at(&v, 8),
            };
            store.clock = store.clock.max(meta.last_use);
            if v[16..] != fingerprint.0[..8] {
                foreign.push((meta.last_use, h));
            }
            store.entries.insert(h, meta);
            store.bytes += meta.size;
        }
        for k in broken {
            let _ = store.db.remove(k);
        }
        // Foreign entries go to the front of the LRU order: evicted first.
        let foreign_set: std::collections::HashSet<BlockHash> =
            foreign.iter().map(|&(_, h)| h).collect();
        let mut order: Vec<(bool, u64, BlockHash)> = store
            .entries
            .iter()
            .map(|(h, m)| (!foreign_set.contains(h), m.last_use, *h))
            .collect();
        order.sort();
        for (i, (_, _, h)) in order.into_iter().enumerate() {
            store.lru.insert(i as u64, h);
            if let Some(m) = store.entries.get_mut(&h) {
                m.last_use = i as u64;
            }
        }
        store.clock = store.entries.len() as u64;
        let stamp = {
            let mut s = FORMAT_VERSION.to_le_bytes().to_vec();
            s.extend_from_slice(&fingerprint.0);
            s
        };
        match store.db.get(b"M").map_err(err)? {
            Some(old) if old.as_ref() != stamp.as_slice() => tracing::warn!(
                path = %path.display(),
                foreign_blocks = foreign.len(),
                "prefix store was written by another model, KV dtype, block size or format \
                 version: its blocks are ignored and evicted first as space is needed"
            ),
            _ if !foreign.is_empty() => tracing::warn!(
                path = %path.display(),
                foreign_blocks = foreign.len(),
                "prefix store holds blocks of another model or format: they are ignored"
            ),
            _ => {}
        }
        store.db.insert(b"M", stamp).map_err(err)?;
        if let Ok(mut set) = store.counters.index.write() {
            set.clear();
            set.extend(store.entries.keys().copied());
        }
        store.evict_to(store.max_bytes);
        store.publish();
        tracing::info!(
            path = %path.display(),
            blocks = store.entries.len(),
            bytes = store.bytes,
            max_bytes,
            "prefix store opened"
        );
        Ok(store)
    }

    /// [`DiskStore::open`], but a database sled cannot read (corrupt, or a format it
    /// does not support) is moved aside to `<path>.corrupt-<unix seconds>` and a fresh one is
    /// created, so a damaged store costs its contents, never the daemon's start.
    ///
    /// # Errors
    /// As [`DiskStore::open`] for anything but corruption (e.g. a lock another daemon
    /// holds, permissions).
    pub fn open_or_reset(
        path: &Path,
        fingerprint: ModelFingerprint,
        block_bytes: usize,
        max_bytes: u64,
        counters: Arc<DiskCounters>,
    ) -> Result<Self, StoreError> {
        match Self::open(path, fingerprint, block_bytes, max_bytes, counters.clone()) {
            Err(StoreError::Sled {
                source:
                    e @ (sled::Error::Corruption { .. }
                    | sled::Error::ReportableBug(_)
                    | sled::Error::Unsupported(_)),
                ..
            }) => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let mut aside = path.as_os_str().to_owned();
                aside.push(format!(".corrupt-{secs}"));
                tracing::error!(
                    path = %path.display(),
                    moved_to = %PathBuf::from(&aside).display(),
                    error = %e,
                    "prefix store is corrupt: moved aside, starting an empty one"
                );
                std::fs::rename(path, &aside).map_err(|io| StoreError::Sled {
                    path: path.to_path_buf(),
                    source: sled::Error::Io(io),
                })?;
                Self::open(path, fingerprint, block_bytes, max_bytes, counters)
            }
            other => other,
        }
    }

    /// The database directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Blocks stored.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no block is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of stored entries.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the block `hash` is stored (no check of its value).
    pub fn contains(&self, hash: &BlockHash) -> bool {
        self.entries.contains_key(hash)
    }

    fn index_insert(&self, hash: BlockHash) {
        if let Ok(mut set) = self.counters.index.write() {
            set.insert(hash);
        }
    }

    fn index_remove(&self, hash: &BlockHash) {
        if let Ok(mut set) = self.counters.index.write() {
            set.remove(hash);
        }
    }

    fn publish(&self) {
        let c = &self.counters;
        c.blocks.store(self.entries.len() as u64, Ordering::Relaxed);
        c.bytes.store(self.bytes, Ordering::Relaxed);
    }

    fn touch(&mut self, hash: &BlockHash) {
        let Some(m) = self.entries.get_mut(hash) else {
            return;
        };
        self.lru.remove(&m.last_use);
        self.clock += 1;
        m.last_use = self.clock;
        self.lru.insert(self.clock, *hash);
        let v = meta_value(*m, &self.fingerprint);
        if let Err(e) = self.db.insert(key(b'L', hash), &v) {
            tracing::warn!(error = %e, "prefix store: updating an LRU record failed");
        }
    }

    fn remove(&mut self, hash: &BlockHash) {
        self.index_remove(hash);
        if let Some(m) = self.entries.remove(hash) {
            self.lru.remove(&m.last_use);
            self.bytes = self.bytes.saturating_sub(m.size);
        }
        let mut batch = sled::Batch::default();
        batch.remove(&key(b'B', hash)[..]);
        batch.remove(&key(b'L', hash)[..]);
        if let Err(e) = self.db.apply_batch(batch) {
            tracing::warn!(error = %e, "prefix store: removing a block failed");
        }
    }

    fn evict_to(&mut self, bound: u64) {
        while self.bytes > bound {
            let Some((_, h)) = self.lru.pop_first() else {
                break;
            };
            self.remove(&h);
            self.counters.evicted_blocks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A read-only handle for another thread ([`DiskReader`]).
    pub fn reader(&self) -> DiskReader {
        DiskReader {
            db: self.db.clone(),
            fingerprint: self.fingerprint,
            block_bytes: self.block_bytes,
            counters: self.counters.clone(),
        }
    }

    /// Applies what a reader found: `used` blocks become the most recently used, `bad`
    /// is deleted.
    pub fn apply_read(&mut self, used: &[BlockHash], bad: Option<BlockHash>) {
        for h in used {
            self.touch(h);
        }
        if let Some(h) = bad {
            self.remove(&h);
        }
        self.publish();
    }

    /// Reads a run on this thread ([`DiskReader::read_run`] plus [`Self::apply_read`]),
    /// returning the K/V payloads.
    pub fn get_run(&mut self, hashes: &[BlockHash], tokens: &[Vec<u32>]) -> Vec<Vec<u8>> {
        let n = self.counters.stored_run(hashes);
        let read = self
            .reader()
            .read_run(&hashes[..n], &tokens[..n.min(tokens.len())]);
        self.apply_read(&read.used, read.bad);
        read.blocks
    }

    /// Stores one block (a no-op apart from the LRU when it is already stored), then
    /// evicts least recently used blocks until the budget holds.
    pub fn put(&mut self, hash: &BlockHash, tokens: &[u32], kv: &[u8]) {
        if self.entries.contains_key(hash) {
            self.touch(hash);
            return;
        }
        if kv.len() != self.block_bytes {
            tracing::warn!(
                got = kv.len(),
                want = self.block_bytes,
                "prefix store: refused a block of the wrong size"
            );
            return;
        }
        let value = entry::encode(&self.fingerprint, hash, tokens, kv);
        self.clock += 1;
        let meta = Meta {
            last_use: self.clock,
            size: value.len() as u64,
        };
        let mut batch = sled::Batch::default();
        batch.insert(&key(b'B', hash)[..], value);
        batch.insert(
            &key(b'L', hash)[..],
            &meta_value(meta, &self.fingerprint)[..],
        );
        if let Err(e) = self.db.apply_batch(batch) {
            tracing::warn!(error = %e, "prefix store: write failed");
            return;
        }
        self.entries.insert(*hash, meta);
        self.index_insert(*hash);
        self.lru.insert(meta.last_use, *hash);
        self.bytes += meta.size;
        self.counters.written_blocks.fetch_add(1, Ordering::Relaxed);
        self.evict_to(self.max_bytes);
        self.publish();
    }

    /// Writes everything to disk (sled's `flush`).
    ///
    /// # Errors
    /// sled's I/O error.
    pub fn flush(&self) -> Result<usize, StoreError> {
        self.db.flush().map_err(|source| StoreError::Sled {
            path: self.path.clone(),
            source,
        })
    }

    /// The raw database (tests corrupt entries through it).
    #[cfg(test)]
    pub(crate) fn db(&self) -> &sled::Db {
        &self.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BB: usize = 256;

    fn open(dir: &Path, fp: u8, max: u64) -> DiskStore {
        DiskStore::open(
            dir,
            ModelFingerprint([fp; 32]),
            BB,
            max,
            Arc::new(DiskCounters::default()),
        )
        .expect("open")
    }

    fn block(i: u8) -> (BlockHash, Vec<u32>, Vec<u8>) {
        (BlockHash([i; 32]), vec![u32::from(i); 4], vec![i; BB])
    }

    #[test]
    fn put_get_run_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (hs, ts): (Vec<_>, Vec<_>) = (1..=3)
            .map(|i| {
                let (h, t, _) = block(i);
                (h, t)
            })
            .unzip();
        {
            let mut s = open(dir.path(), 7, 1 << 20);
            for i in 1..=3 {
                let (h, t, kv) = block(i);
                s.put(&h, &t, &kv);
            }
            assert_eq!(s.len(), 3);
            assert_eq!(s.counters.stored_run(&hs), 3, "the shared index lists them");
            let run = s.get_run(&hs, &ts);
            assert_eq!(run, vec![vec![1u8; BB], vec![2u8; BB], vec![3u8; BB]]);
            // The run stops at the first block that is missing.
            let gap = [hs[0], BlockHash([9; 32]), hs[2]];
            assert_eq!(s.get_run(&gap, &ts).len(), 1);
            // Other tokens under the same hash: not served, deleted.
            let wrong = vec![vec![1u32; 4], vec![0u32; 4]];
            assert_eq!(s.get_run(&hs[..2], &wrong).len(), 1);
            assert!(!s.contains(&hs[1]));
            assert_eq!(
                s.counters.stored_run(&hs),
                1,
                "a deleted entry leaves the index"
            );
            s.flush().expect("flush");
        }
        let mut s = open(dir.path(), 7, 1 << 20);
        assert_eq!(s.len(), 2, "survives a reopen");
        assert_eq!(
            s.counters.stored_run(&hs[2..]),
            1,
            "the index is rebuilt at open"
        );
        assert_eq!(s.get_run(&hs[..1], &ts[..1]), vec![vec![1u8; BB]]);
        assert_eq!(s.get_run(&hs[2..], &ts[2..]), vec![vec![3u8; BB]]);
    }

    #[test]
    fn a_database_sled_cannot_read_is_moved_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store");
        let (h, t, kv) = block(1);
        {
            let mut s = open(&path, 7, 1 << 20);
            s.put(&h, &t, &kv);
            s.flush().expect("flush");
        }
        // Overwrite every file sled wrote with garbage.
        fn scribble(p: &Path) {
            for e in std::fs::read_dir(p).expect("read_dir").flatten() {
                let p = e.path();
                if p.is_dir() {
                    scribble(&p);
                } else if p.file_name().is_some_and(|n| n != "db.lock") {
                    let len = std::fs::metadata(&p).map_or(0, |m| m.len()) as usize;
                    std::fs::write(&p, vec![0xA5u8; len.max(64)]).expect("write");
                }
            }
        }
        scribble(&path);
        let mut s = DiskStore::open_or_reset(
            &path,
            ModelFingerprint([7; 32]),
            BB,
            1 << 20,
            Arc::new(DiskCounters::default()),
        )
        .expect("a fresh store");
        // sled either refused the garbage (moved aside) or recovered a database without
        // the block: either way it opens and serves nothing wrong.
        assert!(
            s.get_run(&[h], &[t]).is_empty(),
            "nothing served from garbage"
        );
    }

    #[test]
    fn corrupt_entry_is_dropped_not_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = open(dir.path(), 7, 1 << 20);
        let (h, t, kv) = block(1);
        s.put(&h, &t, &kv);
        let k = key(b'B', &h);
        let mut v = s.db().get(k).expect("get").expect("present").to_vec();
        v[120] ^= 0x40; // a flipped bit in the K/V payload
        s.db().insert(k, v.clone()).expect("insert");
        assert!(s.get_run(&[h], std::slice::from_ref(&t)).is_empty());
        assert!(!s.contains(&h), "deleted");
        assert_eq!(s.counters.dropped_corrupt.load(Ordering::Relaxed), 1);
        // A truncated value likewise.
        s.put(&h, &t, &kv);
        s.db().insert(k, &v[..v.len() / 2]).expect("insert");
        assert!(s.get_run(&[h], std::slice::from_ref(&t)).is_empty());
        assert_eq!(s.counters.dropped_corrupt.load(Ordering::Relaxed), 2);
        // Recomputed and stored again: served.
        s.put(&h, &t, &kv);
        assert_eq!(s.get_run(&[h], &[t]), vec![kv]);
    }

    #[test]
    fn budget_evicts_least_recently_used() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = entry::encode(
            &ModelFingerprint([7; 32]),
            &BlockHash([0; 32]),
            &[0; 4],
            &[0; BB],
        )
        .len() as u64;
        let mut s = open(dir.path(), 7, 3 * one);
        for i in 1..=3 {
            let (h, t, kv) = block(i);
            s.put(&h, &t, &kv);
        }
        assert_eq!(s.bytes(), 3 * one);
        // Use block 1, so block 2 is now the least recently used.
        let (h1, t1, _) = block(1);
        assert_eq!(s.get_run(&[h1], &[t1]).len(), 1);
        let (h4, t4, kv4) = block(4);
        s.put(&h4, &t4, &kv4);
        assert_eq!(s.len(), 3);
        assert!(s.contains(&h1) && s.contains(&BlockHash([3; 32])) && s.contains(&h4));
        assert!(!s.contains(&BlockHash([2; 32])));
        assert_eq!(s.counters.evicted_blocks.load(Ordering::Relaxed), 1);
        drop(s);
        // A smaller budget at the next start evicts down to it, oldest first.
        let s = open(dir.path(), 7, 2 * one);
        assert_eq!(s.len(), 2);
        assert!(s.contains(&h1) && s.contains(&h4));
    }

    #[test]
    fn another_models_blocks_are_ignored_and_evicted_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (h, t, kv) = block(1);
        {
            let mut s = open(dir.path(), 7, 1 << 20);
            s.put(&h, &t, &kv);
        }
        let one = entry::encode(
            &ModelFingerprint([8; 32]),
            &BlockHash([0; 32]),
            &[0; 4],
            &[0; BB],
        )
        .len() as u64;
        let mut s = open(dir.path(), 8, 2 * one);
        // Same hash, other model: rejected by the entry's fingerprint and deleted.
        assert!(s.get_run(&[h], std::slice::from_ref(&t)).is_empty());
        assert!(!s.contains(&h));
        s.put(&BlockHash([5; 32]), &t, &kv);
        drop(s);
        let mut s7 = open(dir.path(), 7, 1 << 20);
        let (h2, t2, kv2) = block(2);
        s7.put(&h2, &t2, &kv2);
        drop(s7);
        // Model 8 again with room for 1: model 7's block goes first although newer.
        let s8 = open(dir.path(), 8, one);
        assert_eq!(s8.len(), 1);
        assert!(s8.contains(&BlockHash([5; 32])));
        assert!(!s8.contains(&h2));
    }
}
