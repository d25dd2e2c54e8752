//! The disk tier: cached blocks as checksummed files, indexed in sled, bounded by a
//! byte budget with LRU eviction.
//!
//! Layout of `prefix_store.path` (the directory belongs to the store):
//!
//! | path | content |
//! |---|---|
//! | `STORE` | marker: `inferd prefix store` and the layout version ([`LAYOUT`]) |
//! | `index/` | sled: `L` ‖ hash → 56 bytes: last use (a logical clock, u64 LE), entry size in bytes (u64 LE), the first 8 bytes of the writer's fingerprint, the parent block's hash (32 bytes, zero for a chain's first block) |
//! | `blocks/xx/<hash>` | one block's entry ([`super::entry`]: version, fingerprint, hash, tokens, K/V, CRC-32); `xx` = the hash's first byte in hex, `<hash>` = all 32 bytes in hex |
//! | `tmp/` | entries being written (emptied at open) |
//! | `index.broken/` | the last index sled could not open, kept for inspection (one) |
//!
//! An entry is written to `tmp/`, renamed into `blocks/` (atomic), and only then
//! recorded in the index, so every indexed block has a whole file unless the machine
//! lost power; a torn or corrupt file fails its checksum when read and is deleted,
//! never served. Evicting a block deletes its file, so the directory stays within the
//! budget (plus the small index and file system rounding) whatever the traffic. sled
//! holds only the 56-byte records, so its cache and log stay small.
//!
//! Eviction takes the least recently used block's deepest descendant first (a leaf of
//! the chain tree): a lookup matches a prompt from its first block, so evicting a
//! block while its descendants stay would strand them. The budget is also lowered for
//! the run when the file system has less room than `max_bytes` (keeping 5 % of it, at
//! least 1 MiB and at most 256 MiB, free) or fills up while writing.
//!
//! At open the index's records are matched with the files: a record without a file is
//! dropped; a file without a record (the index was lost, or a crash came between the
//! rename and the record) is adopted as least recently used if its header names its
//! own hash, else deleted. So a lost or unreadable index costs only the LRU order.
//! Entries of another fingerprint or format version are never served (they cannot
//! match a key of this model), are logged once and evicted first.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::entry::{self, HEADER_BYTES};

mod events;
use super::hash::{BlockHash, ModelFingerprint};

/// Layout version of the store directory (the `STORE` marker's `layout` line).
/// Layout 1 (an earlier inferd) kept the entries inside sled; such a directory is
/// recognised and emptied.
pub const LAYOUT: u32 = 2;

const MARKER: &str = "STORE";
const MARKER_HEAD: &str = "inferd prefix store";

/// How long [`DiskStore::open`] waits for a lock another process holds (sled releases
/// its lock shortly after the previous daemon exits).
pub const LOCK_WAIT: Duration = Duration::from_secs(5);

/// Counters of the disk tier, shared with the scheduler for the `stats` message.
#[derive(Debug, Default)]
pub struct DiskCounters {
    /// Blocks stored (this model's and others').
    pub blocks: AtomicU64,
    /// Bytes of stored block files (file lengths; the index and file system rounding
    /// not counted).
    pub bytes: AtomicU64,
    /// Blocks served to requests.
    pub hit_blocks: AtomicU64,
    /// Blocks written.
    pub written_blocks: AtomicU64,
    /// Blocks evicted to stay within the budget.
    pub evicted_blocks: AtomicU64,
    /// Entries found corrupt, truncated, foreign or unreadable when read, deleted.
    pub dropped_corrupt: AtomicU64,
    /// Blocks not written: the write queue was over its byte bound, or writing the
    /// file failed (e.g. a full disk).
    pub dropped_writes: AtomicU64,
    /// Blocks not written because their chain's earlier blocks are not stored (or
    /// would have to be evicted to make room): a lookup could never reach them.
    pub unreachable_writes: AtomicU64,
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

    fn listed(&self, hash: &BlockHash) -> bool {
        self.stored_run(std::slice::from_ref(hash)) == 1
    }
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Another process holds the store's lock.
    #[error(
        "prefix_store.path {}: another inferd process uses this prefix store (one daemon \
         per store directory); stop it or set another prefix_store.path",
        path.display()
    )]
    Locked {
        /// The store directory.
        path: PathBuf,
    },
    /// The directory holds files that are not a prefix store's.
    #[error(
        "prefix_store.path {}: the directory is not empty and is not an inferd prefix \
         store (no STORE marker of one); set prefix_store.path to a new or empty directory",
        path.display()
    )]
    Foreign {
        /// The store directory.
        path: PathBuf,
    },
    /// A store of a layout this build does not know (a newer inferd's).
    #[error(
        "prefix_store.path {}: store layout {found} (this build reads layout {LAYOUT}); \
         set another prefix_store.path",
        path.display()
    )]
    Layout {
        /// The store directory.
        path: PathBuf,
        /// The layout its marker names.
        found: String,
    },
    /// The file system refused (permissions, a full disk, ...).
    #[error("prefix store at {}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// sled cannot open even a fresh index.
    #[error("prefix store index at {}: {reason}", path.display())]
    Index {
        /// The index directory.
        path: PathBuf,
        /// sled's error or panic message.
        reason: String,
    },
}

impl StoreError {
    /// Whether the failure is a configuration mistake the daemon should refuse to start
    /// with (the directory is someone else's, or another daemon's), rather than one to
    /// run through without the disk tier (the file system failed).
    pub fn is_config_error(&self) -> bool {
        matches!(
            self,
            Self::Locked { .. } | Self::Foreign { .. } | Self::Layout { .. }
        )
    }
}

/// A warning logged the first time, then at most once a minute with the count of
/// occurrences in between (a full disk fails every write).
#[derive(Debug, Default)]
struct Throttle {
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    /// `Some(occurrences not logged since the last time)` when due.
    fn due(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(t) if now.duration_since(t) < Duration::from_secs(60) => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

fn hex(h: &BlockHash) -> String {
    h.0.iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex(s: &str) -> Option<BlockHash> {
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        let pair = s.get(2 * i..2 * i + 2)?;
        if pair
            .bytes()
            .any(|c| !matches!(c, b'0'..=b'9' | b'a'..=b'f'))
        {
            return None;
        }
        *o = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(BlockHash(out))
}

/// `blocks/xx/<hash hex>`.
fn block_path(blocks: &Path, h: &BlockHash) -> PathBuf {
    blocks.join(format!("{:02x}", h.0[0])).join(hex(h))
}

/// Removes a file or a directory tree; a missing one is not an error.
fn remove_any(p: &Path) -> std::io::Result<()> {
    let r = match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(e) => Err(e),
    };
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// A read-only handle on the store for another thread: reads and verifies runs of
/// blocks without the writer's LRU state (the [`DiskStore`] owner applies the uses and
/// deletions it reports).
#[derive(Debug, Clone)]
pub struct DiskReader {
    blocks: PathBuf,
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
    /// An entry that failed verification or could not be read (to delete).
    pub bad: Option<BlockHash>,
}

impl DiskReader {
    /// Reads the longest run of stored blocks `hashes[0..]` whose entries are intact
    /// and carry `tokens[i]`. The run stops at the first block missing or rejected; a
    /// rejected or unreadable entry is counted, leaves the shared index at once, and is
    /// reported in [`RunRead::bad`] for the writer to delete.
    pub fn read_run(&self, hashes: &[BlockHash], tokens: &[Vec<u32>]) -> RunRead {
        let mut out = RunRead::default();
        for (h, toks) in hashes.iter().zip(tokens) {
            let mut value = match std::fs::read(block_path(&self.blocks, h)) {
                Ok(v) => v,
                Err(e) => {
                    // Evicted since the index was consulted: a plain miss.
                    if e.kind() == std::io::ErrorKind::NotFound && !self.counters.listed(h) {
                        break;
                    }
                    self.reject(h, &e.to_string(), &mut out);
                    break;
                }
            };
            match entry::decode(&value, &self.fingerprint, h, toks, self.block_bytes) {
                Ok(kv) => {
                    // The payload ends 4 bytes (the CRC) before the entry's end: keep
                    // the file's buffer instead of copying it.
                    let end = value.len() - 4;
                    let start = end - kv.len();
                    value.truncate(end);
                    value.drain(..start);
                    out.blocks.push(value);
                    out.used.push(*h);
                }
                Err(e) => {
                    self.reject(h, &e.to_string(), &mut out);
                    break;
                }
            }
        }
        self.counters
            .hit_blocks
            .fetch_add(out.blocks.len() as u64, Ordering::Relaxed);
        out
    }

    fn reject(&self, h: &BlockHash, reason: &str, out: &mut RunRead) {
        tracing::warn!(
            block = %h,
            reason,
            "prefix store: dropped an entry that failed verification or could not be read; \
             it will be recomputed"
        );
        self.counters
            .dropped_corrupt
            .fetch_add(1, Ordering::Relaxed);
        if let Ok(mut set) = self.counters.index.write() {
            set.remove(h);
        }
        out.bad = Some(*h);
    }
}

#[derive(Debug, Clone, Copy)]
struct Meta {
    last_use: u64,
    size: u64,
    /// The block before it in its chain (`None`: the first block, or unknown).
    parent: Option<BlockHash>,
}

/// One index record as read at open.
struct Record {
    hash: BlockHash,
    meta: Meta,
    fp8: [u8; 8],
}

/// Why the index did not open.
enum IndexFailure {
    Locked,
    /// sled cannot read it (corrupt, missing files, a panic): move it aside.
    Broken(String),
    /// The file system refused (a full disk, permissions): leave it be.
    Io(std::io::Error),
}

/// One model's view of the prefix store. Single-threaded: the
/// [`super::PrefixStoreActor`] owns it.
#[derive(Debug)]
pub struct DiskStore {
    db: sled::Db,
    path: PathBuf,
    blocks: PathBuf,
    tmp: PathBuf,
    fingerprint: ModelFingerprint,
    block_bytes: usize,
    max_bytes: u64,
    clock: u64,
    entries: HashMap<BlockHash, Meta>,
    lru: BTreeMap<u64, BlockHash>,
    /// Stored blocks by parent hash (the chain tree, for eviction).
    children: HashMap<BlockHash, Vec<BlockHash>>,
    bytes: u64,
    counters: Arc<DiskCounters>,
    write_warn: Throttle,
    remove_warn: Throttle,
    /// KV-cache events, when published (`events`).
    kv_events: Option<events::DiskEvents>,
}

fn key(h: &BlockHash) -> [u8; 33] {
    let mut k = [0u8; 33];
    k[0] = b'L';
    k[1..].copy_from_slice(&h.0);
    k
}

/// Bytes of one index record.
const RECORD_BYTES: usize = 56;

fn record_value(m: Meta, fp8: &[u8]) -> [u8; RECORD_BYTES] {
    let mut v = [0u8; RECORD_BYTES];
    v[..8].copy_from_slice(&m.last_use.to_le_bytes());
    v[8..16].copy_from_slice(&m.size.to_le_bytes());
    v[16..24].copy_from_slice(&fp8[..8]);
    if let Some(p) = m.parent {
        v[24..].copy_from_slice(&p.0);
    }
    v
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Reads every `L` record; malformed ones are removed.
fn read_records(db: &sled::Db) -> Result<Vec<Record>, sled::Error> {
    let mut out = Vec::new();
    let mut broken = Vec::new();
    for kv in db.scan_prefix(b"L") {
        let (k, v) = kv?;
        if k.len() != 33 || v.len() != RECORD_BYTES {
            broken.push(k);
            continue;
        }
        let mut h = [0u8; 32];
        h.copy_from_slice(&k[1..]);
        let mut fp8 = [0u8; 8];
        fp8.copy_from_slice(&v[16..24]);
        let mut parent = [0u8; 32];
        parent.copy_from_slice(&v[24..]);
        out.push(Record {
            hash: BlockHash(h),
            meta: Meta {
                last_use: u64_at(&v, 0),
                size: u64_at(&v, 8),
                parent: (parent != [0u8; 32]).then_some(BlockHash(parent)),
            },
            fp8,
        });
    }
    for k in broken {
        db.remove(k)?;
    }
    Ok(out)
}

/// Opens the sled index at `dir` and reads its records. sled panics on some damaged
/// files instead of returning an error: a panic counts as a broken index. A lock held
/// by another process is retried until `lock_wait` has passed.
fn open_index(dir: &Path, lock_wait: Duration) -> Result<(sled::Db, Vec<Record>), IndexFailure> {
    let config = sled::Config::new()
        .path(dir)
        .cache_capacity(8 << 20)
        .flush_every_ms(Some(500));
    // A snapshot sled was generating when it failed (a full disk) or was killed is
    // left as `snap.*.generating`; sled would read it as the newest snapshot and call
    // the index corrupt. It is never needed: remove it.
    if let Ok(files) = std::fs::read_dir(dir) {
        for f in files.flatten() {
            let name = f.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("snap.") && name.ends_with(".generating") {
                let _ = std::fs::remove_file(f.path());
            }
        }
    }
    let deadline = Instant::now() + lock_wait;
    loop {
        let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let db = config.open()?;
            let records = read_records(&db)?;
            Ok::<_, sled::Error>((db, records))
        }));
        match attempt {
            Ok(Ok(x)) => return Ok(x),
            Ok(Err(sled::Error::Io(e))) if e.to_string().contains("could not acquire lock") => {
                if Instant::now() >= deadline {
                    return Err(IndexFailure::Locked);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(Err(sled::Error::Io(e)))
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound
                        | std::io::ErrorKind::InvalidData
                        | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                return Err(IndexFailure::Io(e));
            }
            Ok(Err(e)) => return Err(IndexFailure::Broken(e.to_string())),
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                return Err(IndexFailure::Broken(format!("sled panicked: {msg}")));
            }
        }
    }
}

/// Makes `path` a store directory: creates it, accepts it when it has the `STORE`
/// marker of this layout or is empty (writing the marker), empties a layout-1 store,
/// and refuses anything else.
fn prepare_dir(path: &Path) -> Result<(), StoreError> {
    let io = |p: &Path, source| StoreError::Io {
        path: p.to_path_buf(),
        source,
    };
    if path.exists() && !path.is_dir() {
        return Err(io(
            path,
            std::io::Error::other("it exists and is not a directory"),
        ));
    }
    std::fs::create_dir_all(path).map_err(|e| io(path, e))?;
    let marker = path.join(MARKER);
    match std::fs::read_to_string(&marker) {
        Ok(text) => {
            let layout = text
                .lines()
                .find_map(|l| l.strip_prefix("layout "))
                .map(str::trim);
            let expected = LAYOUT.to_string();
            if text.starts_with(MARKER_HEAD) && layout == Some(expected.as_str()) {
                return Ok(());
            }
            if !text.starts_with(MARKER_HEAD) {
                return Err(StoreError::Foreign {
                    path: path.to_path_buf(),
                });
            }
            return Err(StoreError::Layout {
                path: path.to_path_buf(),
                found: layout.unwrap_or("(none)").to_string(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&marker, e)),
    }
    let mut names = Vec::new();
    for e in std::fs::read_dir(path).map_err(|e| io(path, e))? {
        let e = e.map_err(|e| io(path, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    if !names.is_empty() {
        let sled_file = |n: &str| matches!(n, "conf" | "db" | "blobs") || n.starts_with("snap.");
        let layout1 = names.iter().all(|n| sled_file(n))
            && names.iter().any(|n| n == "conf")
            && names.iter().any(|n| n == "db");
        if !layout1 {
            return Err(StoreError::Foreign {
                path: path.to_path_buf(),
            });
        }
        tracing::warn!(
            path = %path.display(),
            "prefix store: removing a store of layout 1 (written by an earlier inferd); \
             it starts empty"
        );
        for n in &names {
            let p = path.join(n);
            remove_any(&p).map_err(|e| io(&p, e))?;
        }
    }
    std::fs::write(&marker, format!("{MARKER_HEAD}\nlayout {LAYOUT}\n"))
        .map_err(|e| io(&marker, e))?;
    Ok(())
}

impl DiskStore {
    /// Opens (creating) the store at `path` for blocks of `block_bytes` K/V bytes
    /// written under `fingerprint`, bounded by `max_bytes` of block files. An index
    /// sled cannot open (or panics on) is moved to `index.broken` and rebuilt from the
    /// block files. Entries of another fingerprint or format version stay ignored
    /// (they can never match a key of this model) and are evicted first as space is
    /// needed; that is logged once.
    ///
    /// # Errors
    /// [`StoreError::Locked`] after waiting [`LOCK_WAIT`] for another process's lock;
    /// [`StoreError::Foreign`] / [`StoreError::Layout`] when `path` is not (this
    /// layout's) store; [`StoreError::Io`] / [`StoreError::Index`] when the file system
    /// fails.
    pub fn open(
        path: &Path,
        fingerprint: ModelFingerprint,
        block_bytes: usize,
        max_bytes: u64,
        counters: Arc<DiskCounters>,
    ) -> Result<Self, StoreError> {
        Self::open_waiting(
            path,
            fingerprint,
            block_bytes,
            max_bytes,
            counters,
            LOCK_WAIT,
        )
    }

    /// [`DiskStore::open`] with another wait for a held lock.
    ///
    /// # Errors
    /// As [`DiskStore::open`].
    pub fn open_waiting(
        path: &Path,
        fingerprint: ModelFingerprint,
        block_bytes: usize,
        max_bytes: u64,
        counters: Arc<DiskCounters>,
        lock_wait: Duration,
    ) -> Result<Self, StoreError> {
        let io = |p: &Path, source| StoreError::Io {
            path: p.to_path_buf(),
            source,
        };
        prepare_dir(path)?;
        let index_dir = path.join("index");
        let fatal = |f: IndexFailure| match f {
            IndexFailure::Locked => StoreError::Locked {
                path: path.to_path_buf(),
            },
            IndexFailure::Io(e) => io(&index_dir, e),
            IndexFailure::Broken(reason) => StoreError::Index {
                path: index_dir.clone(),
                reason,
            },
        };
        let (db, records) = match open_index(&index_dir, lock_wait) {
            Ok(x) => x,
            Err(IndexFailure::Broken(reason)) => {
                let aside = path.join("index.broken");
                tracing::error!(
                    path = %index_dir.display(),
                    moved_to = %aside.display(),
                    reason,
                    "prefix store: the index cannot be read; moved aside, rebuilding it \
                     from the block files"
                );
                remove_any(&aside).map_err(|e| io(&aside, e))?;
                std::fs::rename(&index_dir, &aside).map_err(|e| io(&index_dir, e))?;
                open_index(&index_dir, lock_wait).map_err(fatal)?
            }
            Err(f) => return Err(fatal(f)),
        };
        let blocks = path.join("blocks");
        let tmp = path.join("tmp");
        remove_any(&tmp).map_err(|e| io(&tmp, e))?;
        for d in [&blocks, &tmp] {
            std::fs::create_dir_all(d).map_err(|e| io(d, e))?;
        }
        let mut store = Self {
            db,
            path: path.to_path_buf(),
            blocks,
            tmp,
            fingerprint,
            block_bytes,
            max_bytes,
            clock: 0,
            entries: HashMap::new(),
            lru: BTreeMap::new(),
            children: HashMap::new(),
            bytes: 0,
            counters,
            write_warn: Throttle::default(),
            remove_warn: Throttle::default(),
            kv_events: None,
        };
        let (mut files, strays) = store.scan_files().map_err(|e| io(&store.blocks, e))?;
        let mut foreign: HashSet<BlockHash> = HashSet::new();
        let mut dropped_records = 0usize;
        for r in records {
            match files.remove(&r.hash) {
                Some(len) => {
                    if r.fp8 != fingerprint.0[..8] {
                        foreign.insert(r.hash);
                    }
                    store.entries.insert(
                        r.hash,
                        Meta {
                            size: len,
                            ..r.meta
                        },
                    );
                    store.bytes += len;
                }
                None => {
                    dropped_records += 1;
                    let _ = store.db.remove(key(&r.hash));
                }
            }
        }
        // Files the index does not list: adopt those whose header names them.
        let mut adopted = 0usize;
        for (h, len) in files {
            let file = block_path(&store.blocks, &h);
            match read_header(&file) {
                Some((fp, named)) if named == h => {
                    let meta = Meta {
                        last_use: 0,
                        size: len,
                        parent: None,
                    };
                    if fp != fingerprint {
                        foreign.insert(h);
                    }
                    let _ = store.db.insert(key(&h), &record_value(meta, &fp.0)[..]);
                    store.entries.insert(h, meta);
                    store.bytes += len;
                    adopted += 1;
                }
                _ => {
                    let _ = remove_any(&file);
                }
            }
        }
        // LRU order: foreign entries first (evicted first), then by last use.
        let mut order: Vec<(bool, u64, BlockHash)> = store
            .entries
            .iter()
            .map(|(h, m)| (!foreign.contains(h), m.last_use, *h))
            .collect();
        order.sort();
        for (i, (_, _, h)) in order.into_iter().enumerate() {
            store.lru.insert(i as u64, h);
            if let Some(m) = store.entries.get_mut(&h) {
                m.last_use = i as u64;
            }
        }
        store.clock = store.entries.len() as u64;
        for (h, m) in &store.entries {
            if let Some(p) = m.parent {
                store.children.entry(p).or_default().push(*h);
            }
        }
        if !foreign.is_empty() {
            tracing::warn!(
                path = %path.display(),
                foreign_blocks = foreign.len(),
                "prefix store holds blocks written for another model, KV dtype, block size \
                 or format version: they are never served and are evicted first as space \
                 is needed"
            );
        }
        if let Ok(mut set) = store.counters.index.write() {
            set.clear();
            set.extend(store.entries.keys().copied());
        }
        store.fit_budget_to_free_space();
        store.evict_to(store.max_bytes);
        store.publish();
        tracing::info!(
            path = %path.display(),
            blocks = store.entries.len(),
            bytes = store.bytes,
            max_bytes = store.max_bytes,
            adopted_files = adopted,
            dropped_records,
            removed_stray_files = strays,
            "prefix store opened"
        );
        Ok(store)
    }

    /// Lists `blocks/`: hash → file length, and how many stray entries were deleted:
    /// anything that is not `xx/<hash>` with a matching first byte, or is too short to
    /// be an entry (the directory belongs to the store).
    fn scan_files(&self) -> std::io::Result<(HashMap<BlockHash, u64>, usize)> {
        let mut found = HashMap::new();
        let mut strays = 0;
        for sub in std::fs::read_dir(&self.blocks)? {
            let sub = sub?;
            let name = sub.file_name();
            let first = name
                .to_str()
                .filter(|n| n.len() == 2)
                .and_then(|n| u8::from_str_radix(n, 16).ok())
                .filter(|b| name.to_str() == Some(format!("{b:02x}").as_str()));
            let Some(first) = first.filter(|_| sub.file_type().is_ok_and(|t| t.is_dir())) else {
                remove_any(&sub.path())?;
                strays += 1;
                continue;
            };
            for f in std::fs::read_dir(sub.path())? {
                let f = f?;
                let h = f
                    .file_name()
                    .to_str()
                    .and_then(parse_hex)
                    .filter(|h| h.0[0] == first);
                let len = f.metadata()?.len();
                match h {
                    Some(h)
                        if f.file_type().is_ok_and(|t| t.is_file())
                            && len > HEADER_BYTES as u64 =>
                    {
                        found.insert(h, len);
                    }
                    _ => {
                        remove_any(&f.path())?;
                        strays += 1;
                    }
                }
            }
        }
        Ok((found, strays))
    }

    /// Lowers the budget for this run when the file system cannot hold `max_bytes`
    /// more than the store already does while keeping 5 % of its size (at least
    /// 1 MiB, at most 256 MiB) free.
    fn fit_budget_to_free_space(&mut self) {
        let Some((avail, total)) = fs_space(&self.path) else {
            return;
        };
        let reserve = (total / 20).clamp(1 << 20, 256 << 20);
        let room = (self.bytes + avail).saturating_sub(reserve);
        if room < self.max_bytes {
            tracing::warn!(
                path = %self.path.display(),
                configured = self.max_bytes,
                lowered_to = room,
                free_bytes = avail,
                "prefix store: prefix_store.max_bytes is more than the file system has \
                 room for; the budget is lowered for this run"
            );
            self.max_bytes = room;
        }
    }

    /// The store directory.
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

    /// Bytes of stored block files.
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
        let v = record_value(*m, &self.fingerprint.0);
        if let Err(e) = self.db.insert(key(hash), &v[..]) {
            tracing::warn!(error = %e, "prefix store: updating an LRU record failed");
        }
    }

    /// Deletes a block: index first (readers stop finding it), then the file, then the
    /// record.
    fn remove(&mut self, hash: &BlockHash) {
        self.index_remove(hash);
        if let Some(m) = self.entries.remove(hash) {
            self.note_removed(hash);
            self.lru.remove(&m.last_use);
            self.bytes = self.bytes.saturating_sub(m.size);
            if let Some(p) = m.parent {
                if let Some(kids) = self.children.get_mut(&p) {
                    kids.retain(|k| k != hash);
                    if kids.is_empty() {
                        self.children.remove(&p);
                    }
                }
            }
        }
        let file = block_path(&self.blocks, hash);
        if let Err(e) = remove_any(&file) {
            if let Some(more) = self.remove_warn.due() {
                tracing::warn!(
                    file = %file.display(),
                    error = %e,
                    similar_since_last = more,
                    "prefix store: deleting a block file failed"
                );
            }
        }
        if let Err(e) = self.db.remove(key(hash)) {
            tracing::warn!(error = %e, "prefix store: removing an LRU record failed");
        }
    }

    fn evict_to(&mut self, bound: u64) {
        while self.bytes > bound {
            let Some(h) = self.eviction_victim() else {
                break;
            };
            self.remove(&h);
            self.counters.evicted_blocks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The least recently used block's least recently used descendant that has no
    /// stored child: a lookup matches a chain from its first block, so evicting a block
    /// while blocks after it stay would strand them.
    fn eviction_victim(&self) -> Option<BlockHash> {
        let (_, &oldest) = self.lru.first_key_value()?;
        let mut victim = oldest;
        for _ in 0..self.entries.len() {
            let next = self.children.get(&victim).and_then(|kids| {
                kids.iter()
                    .filter_map(|k| self.entries.get(k).map(|m| (m.last_use, *k)))
                    .min()
            });
            match next {
                Some((_, k)) => victim = k,
                None => break,
            }
        }
        Some(victim)
    }

    /// A read-only handle for another thread ([`DiskReader`]).
    pub fn reader(&self) -> DiskReader {
        DiskReader {
            blocks: self.blocks.clone(),
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

    fn write_failed(&mut self, what: &str, file: &Path, e: &dyn std::fmt::Display) {
        self.counters.dropped_writes.fetch_add(1, Ordering::Relaxed);
        if let Some(more) = self.write_warn.due() {
            tracing::warn!(
                file = %file.display(),
                error = %e,
                similar_since_last = more,
                "prefix store: {what} failed; the block is not stored"
            );
        }
    }

    /// Stores one block (a no-op apart from the LRU when it is already stored), the
    /// child of `parent` in its chain (`None` for a prompt's first block): evicts until
    /// the new file fits the budget ([`Self::make_room`]: not when the block would be
    /// unreachable), writes it to `tmp/`, renames it into `blocks/`, then records it. A full file system lowers the budget for the run (to 7/8 of the
    /// bytes stored), evicts and retries once. A failure drops the block, counts it in
    /// `dropped_writes` and is logged at most once a minute.
    pub fn put(&mut self, hash: &BlockHash, parent: Option<&BlockHash>, tokens: &[u32], kv: &[u8]) {
        self.put_keyed(hash, parent, tokens, kv, &Default::default());
    }

    /// [`Self::put`], with what else entered the block's hash for its KV-cache event.
    pub fn put_keyed(
        &mut self,
        hash: &BlockHash,
        parent: Option<&BlockHash>,
        tokens: &[u32],
        kv: &[u8],
        keys: &crate::kv_events::OneBlockKeys,
    ) {
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
        let size = value.len() as u64;
        let file = block_path(&self.blocks, hash);
        if size > self.max_bytes {
            let reason = format!(
                "one block is {size} bytes, more than the budget of {} bytes",
                self.max_bytes
            );
            self.write_failed("storing a block", &file, &reason);
            return;
        }
        if !self.make_room(size, parent) {
            return;
        }
        let mut written = self.write_entry(hash, &file, &value);
        if let Err(e) = &written {
            if e.raw_os_error() == Some(libc::ENOSPC) && self.bytes > 0 {
                let lowered = self.bytes - self.bytes / 8;
                tracing::warn!(
                    path = %self.path.display(),
                    lowered_to = lowered,
                    "prefix store: the file system is full; the budget is lowered for \
                     this run"
                );
                self.max_bytes = self.max_bytes.min(lowered);
                if !self.make_room(size, parent) {
                    return;
                }
                written = self.write_entry(hash, &file, &value);
            }
        }
        if let Err(e) = written {
            self.write_failed("writing a block file", &file, &e);
            self.publish();
            return;
        }
        self.clock += 1;
        let meta = Meta {
            last_use: self.clock,
            size,
            parent: parent.copied(),
        };
        if let Err(e) = self
            .db
            .insert(key(hash), &record_value(meta, &self.fingerprint.0)[..])
        {
            let _ = remove_any(&file);
            let index = self.path.join("index");
            self.write_failed("recording a block in the index", &index, &e);
            self.publish();
            return;
        }
        self.entries.insert(*hash, meta);
        self.lru.insert(meta.last_use, *hash);
        if let Some(p) = meta.parent {
            self.children.entry(p).or_default().push(*hash);
        }
        self.bytes += size;
        self.index_insert(*hash);
        self.note_stored(hash, parent, tokens, keys);
        self.counters.written_blocks.fetch_add(1, Ordering::Relaxed);
        self.publish();
    }

    /// Evicts until `size` more bytes fit the budget, for a block that follows `parent`.
    /// Returns `false`, storing nothing, when the block would be unreachable: its
    /// parent is not stored (evicted: a lookup could never get past it), or making
    /// room would evict the parent itself (the budget holds no more of this chain; the
    /// chain's first blocks are worth more than its tail).
    fn make_room(&mut self, size: u64, parent: Option<&BlockHash>) -> bool {
        if parent.is_some_and(|p| !self.entries.contains_key(p)) {
            self.counters
                .unreachable_writes
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        while self.bytes + size > self.max_bytes {
            let Some(victim) = self.eviction_victim() else {
                break;
            };
            if Some(&victim) == parent {
                self.counters
                    .unreachable_writes
                    .fetch_add(1, Ordering::Relaxed);
                return false;
            }
            self.remove(&victim);
            self.counters.evicted_blocks.fetch_add(1, Ordering::Relaxed);
        }
        self.bytes + size <= self.max_bytes
    }

    /// Writes `value` to `tmp/<hash>` and renames it to `file`, creating either
    /// directory if it went missing. On failure nothing is left in `tmp/`.
    fn write_entry(&self, hash: &BlockHash, file: &Path, value: &[u8]) -> std::io::Result<()> {
        let tmp = self.tmp.join(hex(hash));
        let missing = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        let r = std::fs::write(&tmp, value)
            .or_else(|e| {
                if missing(&e) {
                    std::fs::create_dir_all(&self.tmp)?;
                    std::fs::write(&tmp, value)
                } else {
                    Err(e)
                }
            })
            .and_then(|()| {
                std::fs::rename(&tmp, file).or_else(|e| {
                    if missing(&e) {
                        if let Some(dir) = file.parent() {
                            std::fs::create_dir_all(dir)?;
                        }
                        std::fs::rename(&tmp, file)
                    } else {
                        Err(e)
                    }
                })
            });
        if r.is_err() {
            let _ = remove_any(&tmp);
        }
        r
    }

    /// Writes the index to disk (sled's `flush`); block files are complete once
    /// renamed. Returns the bytes sled wrote.
    ///
    /// # Errors
    /// sled's I/O error.
    pub fn flush(&self) -> Result<usize, StoreError> {
        self.db.flush().map_err(|e| StoreError::Index {
            path: self.path.join("index"),
            reason: e.to_string(),
        })
    }
}

/// (available, total) bytes of the file system holding `path` (`statvfs`).
fn fs_space(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path; statvfs only writes into `st`, a
    // plain C struct for which all-zero bytes are a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
}

/// The fingerprint and hash in a block file's header, or `None` when it cannot be
/// read or is not an entry.
fn read_header(file: &Path) -> Option<(ModelFingerprint, BlockHash)> {
    let mut head = [0u8; HEADER_BYTES];
    std::fs::File::open(file)
        .and_then(|mut f| f.read_exact(&mut head))
        .ok()?;
    entry::header(&head).ok()
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

    /// Bytes of one test block's entry (file).
    fn entry_bytes() -> u64 {
        entry::encode(
            &ModelFingerprint([0; 32]),
            &BlockHash([0; 32]),
            &[0; 4],
            &[0; BB],
        )
        .len() as u64
    }

    fn file_of(s: &DiskStore, h: &BlockHash) -> PathBuf {
        block_path(&s.blocks, h)
    }

    /// Total bytes of the files under `p`.
    fn du(p: &Path) -> u64 {
        let mut n = 0;
        for e in std::fs::read_dir(p).expect("read_dir").flatten() {
            let m = e.metadata().expect("metadata");
            n += if m.is_dir() { du(&e.path()) } else { m.len() };
        }
        n
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
                s.put(&h, None, &t, &kv);
            }
            assert_eq!(s.len(), 3);
            assert_eq!(s.bytes(), 3 * entry_bytes());
            assert_eq!(du(&s.blocks), 3 * entry_bytes(), "one file per block");
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
            assert!(!file_of(&s, &hs[1]).exists(), "its file is deleted");
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
    fn the_directory_stays_within_the_budget_under_constant_eviction() {
        let dir = tempfile::tempdir().expect("tempdir");
        let max = 20 * entry_bytes();
        let mut s = open(dir.path(), 7, max);
        for i in 0..2000u32 {
            let mut h = [0u8; 32];
            h[..4].copy_from_slice(&i.to_le_bytes());
            s.put(&BlockHash(h), None, &[i; 4], &[i as u8; BB]);
            assert!(s.bytes() <= max);
        }
        s.flush().expect("flush");
        assert_eq!(s.len(), 20);
        assert_eq!(du(&s.blocks), s.bytes(), "evicted files are deleted");
        assert_eq!(s.counters.evicted_blocks.load(Ordering::Relaxed), 1980);
        // The index holds 24-byte records: sled's files stay small however many
        // blocks passed through (about 4 MiB of log after 200,000 writes, measured;
        // bound here: 8 MiB).
        let index = du(&dir.path().join("index"));
        assert!(index < 8 << 20, "index is {index} bytes");
        assert_eq!(du(&s.tmp), 0);
    }

    #[test]
    fn a_lost_or_unreadable_index_is_rebuilt_from_the_block_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("store");
        let (h1, t1, kv1) = block(1);
        let (h2, t2, kv2) = block(2);
        {
            let mut s = open(&path, 7, 1 << 20);
            s.put(&h1, None, &t1, &kv1);
            s.put(&h2, None, &t2, &kv2);
            s.flush().expect("flush");
        }
        // Overwrite every file sled wrote with garbage.
        fn scribble(p: &Path) {
            for e in std::fs::read_dir(p).expect("read_dir").flatten() {
                let p = e.path();
                if p.is_dir() {
                    scribble(&p);
                } else {
                    let len = std::fs::metadata(&p).map_or(0, |m| m.len()) as usize;
                    std::fs::write(&p, vec![0xA5u8; len.max(64)]).expect("write");
                }
            }
        }
        scribble(&path.join("index"));
        let mut s = open(&path, 7, 1 << 20);
        assert!(
            path.join("index.broken").is_dir(),
            "the damaged index is kept aside"
        );
        assert_eq!(s.len(), 2, "both files adopted");
        assert_eq!(
            s.get_run(&[h1, h2], &[t1.clone(), t2]),
            vec![kv1.clone(), kv2]
        );
        drop(s);
        // No index at all: likewise.
        std::fs::remove_dir_all(path.join("index")).expect("rm");
        let mut s = open(&path, 7, 1 << 20);
        assert_eq!(s.get_run(&[h1], &[t1]), vec![kv1]);
    }

    #[test]
    fn records_without_files_and_stray_files_are_cleaned_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (h1, t1, kv1) = block(1);
        let (h2, t2, kv2) = block(2);
        let blocks;
        {
            let mut s = open(dir.path(), 7, 1 << 20);
            s.put(&h1, None, &t1, &kv1);
            s.put(&h2, None, &t2, &kv2);
            blocks = s.blocks.clone();
            std::fs::remove_file(file_of(&s, &h2)).expect("rm");
            s.flush().expect("flush");
        }
        // A file named for another hash than its header's, junk, a half-written file.
        let liar = block_path(&blocks, &BlockHash([3; 32]));
        std::fs::create_dir_all(liar.parent().expect("dir")).expect("mkdir");
        std::fs::copy(block_path(&blocks, &h1), &liar).expect("copy");
        std::fs::write(blocks.join("junk"), b"x").expect("write");
        std::fs::write(dir.path().join("tmp").join(hex(&h2)), b"half").expect("write");
        let mut s = open(dir.path(), 7, 1 << 20);
        assert_eq!(s.len(), 1);
        assert!(s.contains(&h1) && !s.contains(&h2));
        assert!(!liar.exists() && !blocks.join("junk").exists());
        assert_eq!(du(&s.tmp), 0);
        assert_eq!(s.get_run(&[h1], &[t1]), vec![kv1]);
    }

    #[test]
    fn corrupt_truncated_missing_or_unreadable_entries_are_dropped_not_served() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = open(dir.path(), 7, 1 << 20);
        let (h, t, kv) = block(1);
        let dropped = |s: &DiskStore| s.counters.dropped_corrupt.load(Ordering::Relaxed);
        s.put(&h, None, &t, &kv);
        let f = file_of(&s, &h);
        let mut v = std::fs::read(&f).expect("read");
        v[120] ^= 0x40; // a flipped bit in the K/V payload
        std::fs::write(&f, &v).expect("write");
        assert!(s.get_run(&[h], std::slice::from_ref(&t)).is_empty());
        assert!(!s.contains(&h) && !f.exists(), "deleted");
        assert_eq!(dropped(&s), 1);
        // A truncated file likewise.
        s.put(&h, None, &t, &kv);
        std::fs::write(&f, &v[..v.len() / 2]).expect("write");
        assert!(s.get_run(&[h], std::slice::from_ref(&t)).is_empty());
        assert_eq!(dropped(&s), 2);
        // A file deleted behind the store's back.
        s.put(&h, None, &t, &kv);
        std::fs::remove_file(&f).expect("rm");
        assert!(s.get_run(&[h], std::slice::from_ref(&t)).is_empty());
        assert!(!s.contains(&h));
        assert_eq!(dropped(&s), 3);
        // A file that cannot be read (here: a directory in its place).
        s.put(&h, None, &t, &kv);
        std::fs::remove_file(&f).expect("rm");
        std::fs::create_dir(&f).expect("mkdir");
        assert!(s.get_run(&[h], std::slice::from_ref(&t)).is_empty());
        assert!(!s.contains(&h) && !f.exists(), "removed");
        assert_eq!(dropped(&s), 4);
        // Recomputed and stored again: served.
        s.put(&h, None, &t, &kv);
        assert_eq!(s.get_run(&[h], &[t]), vec![kv]);
        assert_eq!(dropped(&s), 4);
    }

    #[test]
    fn a_write_that_fails_drops_the_block_and_the_store_goes_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = open(dir.path(), 7, 1 << 20);
        let (h1, t1, kv1) = block(1);
        // tmp/ replaced by a file: every write fails (as on a full disk).
        std::fs::remove_dir(&s.tmp).expect("rm");
        std::fs::write(&s.tmp, b"").expect("write");
        s.put(&h1, None, &t1, &kv1);
        s.put(&BlockHash([2; 32]), None, &t1, &kv1);
        assert!(s.is_empty());
        assert_eq!(s.counters.dropped_writes.load(Ordering::Relaxed), 2);
        std::fs::remove_file(&s.tmp).expect("rm");
        std::fs::create_dir(&s.tmp).expect("mkdir");
        s.put(&h1, None, &t1, &kv1);
        assert_eq!(s.get_run(&[h1], &[t1]), vec![kv1]);
    }

    #[test]
    fn eviction_takes_a_chains_tail_before_its_head() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = open(dir.path(), 7, 3 * entry_bytes());
        let (a, ta, kva) = block(1);
        let (b, tb, kvb) = block(2);
        let (c, tc, kvc) = block(3);
        s.put(&a, None, &ta, &kva);
        s.put(&b, Some(&a), &tb, &kvb);
        s.put(&c, Some(&b), &tc, &kvc);
        // The chain's head is the least recently used block, but evicting it would
        // strand b and c: the leaf c goes, then b.
        let (d, td, kvd) = block(4);
        s.put(&d, None, &td, &kvd);
        assert!(!s.contains(&c) && s.contains(&a) && s.contains(&b));
        assert_eq!(
            s.get_run(&[a, b, c], &[ta.clone(), tb.clone(), tc.clone()])
                .len(),
            2
        );
        // a and b were just used: d is now the least recently used.
        let (e, te, kve) = block(5);
        s.put(&e, None, &te, &kve);
        assert!(!s.contains(&d));
        drop(s);
        // The chain survives a reopen (parents are in the records).
        let mut s = open(dir.path(), 7, 2 * entry_bytes());
        assert!(s.contains(&a) && !s.contains(&b) && s.contains(&e));
        assert_eq!(s.get_run(&[a], &[ta]).len(), 1);
    }

    #[test]
    fn a_chain_longer_than_the_budget_keeps_its_first_blocks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = open(dir.path(), 7, 3 * entry_bytes());
        let chain: Vec<_> = (1..=6).map(block).collect();
        for (i, (h, t, kv)) in chain.iter().enumerate() {
            let parent = i.checked_sub(1).map(|p| &chain[p].0);
            s.put(h, parent, t, kv);
        }
        let hashes: Vec<_> = chain.iter().map(|c| c.0).collect();
        let tokens: Vec<_> = chain.iter().map(|c| c.1.clone()).collect();
        assert_eq!(s.len(), 3);
        assert_eq!(s.get_run(&hashes, &tokens).len(), 3, "blocks 1-3 are kept");
        assert_eq!(s.counters.unreachable_writes.load(Ordering::Relaxed), 3);
        // A block whose parent is not stored is not written either.
        let (h, t, kv) = block(9);
        s.put(&h, Some(&BlockHash([8; 32])), &t, &kv);
        assert!(!s.contains(&h));
        // A new chain takes the room of the least recently used chain, tail first.
        let other: Vec<_> = (20..=21).map(block).collect();
        s.put(&other[0].0, None, &other[0].1, &other[0].2);
        s.put(&other[1].0, Some(&other[0].0), &other[1].1, &other[1].2);
        assert!(s.contains(&hashes[0]) && !s.contains(&hashes[1]));
        assert_eq!(s.get_run(&hashes, &tokens).len(), 1);
    }

    #[test]
    fn missing_directories_are_recreated_and_short_files_removed_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = open(dir.path(), 7, 1 << 20);
        let (h1, t1, kv1) = block(1);
        std::fs::remove_dir_all(&s.tmp).expect("rm tmp");
        std::fs::remove_dir_all(&s.blocks).expect("rm blocks");
        s.put(&h1, None, &t1, &kv1);
        assert_eq!(s.get_run(&[h1], &[t1]), vec![kv1]);
        assert_eq!(s.counters.dropped_writes.load(Ordering::Relaxed), 0);
        let empty = block_path(&s.blocks, &BlockHash([2; 32]));
        std::fs::create_dir_all(empty.parent().expect("dir")).expect("mkdir");
        std::fs::write(&empty, b"").expect("write");
        drop(s);
        let s = open(dir.path(), 7, 1 << 20);
        assert_eq!(s.len(), 1);
        assert!(!empty.exists(), "an empty block file is not adopted");
    }

    #[test]
    fn a_budget_beyond_the_free_space_is_lowered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = open(dir.path(), 7, 1 << 50);
        let (avail, _) = fs_space(dir.path()).expect("statvfs");
        assert!(
            s.max_bytes < 1 << 50 && s.max_bytes <= avail,
            "{}",
            s.max_bytes
        );
    }

    #[test]
    fn budget_evicts_least_recently_used() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = entry_bytes();
        let mut s = open(dir.path(), 7, 3 * one);
        for i in 1..=3 {
            let (h, t, kv) = block(i);
            s.put(&h, None, &t, &kv);
        }
        assert_eq!(s.bytes(), 3 * one);
        // Use block 1, so block 2 is now the least recently used.
        let (h1, t1, _) = block(1);
        assert_eq!(s.get_run(&[h1], &[t1]).len(), 1);
        let (h4, t4, kv4) = block(4);
        s.put(&h4, None, &t4, &kv4);
        assert_eq!(s.len(), 3);
        assert!(s.contains(&h1) && s.contains(&BlockHash([3; 32])) && s.contains(&h4));
        assert!(!s.contains(&BlockHash([2; 32])));
        assert!(!file_of(&s, &BlockHash([2; 32])).exists());
        assert_eq!(s.counters.evicted_blocks.load(Ordering::Relaxed), 1);
        drop(s);
        // A smaller budget at the next start evicts down to it, oldest first.
        let s = open(dir.path(), 7, 2 * one);
        assert_eq!(s.len(), 2);
        assert!(s.contains(&h1) && s.contains(&h4));
        assert_eq!(du(&s.blocks), 2 * one);
    }

    #[test]
    fn another_models_blocks_are_ignored_and_evicted_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (h, t, kv) = block(1);
        {
            let mut s = open(dir.path(), 7, 1 << 20);
            s.put(&h, None, &t, &kv);
        }
        let one = entry_bytes();
        let mut s = open(dir.path(), 8, 2 * one);
        // Same hash, other model: rejected by the entry's fingerprint and deleted.
        assert!(s.get_run(&[h], std::slice::from_ref(&t)).is_empty());
        assert!(!s.contains(&h));
        s.put(&BlockHash([5; 32]), None, &t, &kv);
        drop(s);
        let mut s7 = open(dir.path(), 7, 1 << 20);
        let (h2, t2, kv2) = block(2);
        s7.put(&h2, None, &t2, &kv2);
        drop(s7);
        // Model 8 again with room for 1: model 7's block goes first although newer.
        let s8 = open(dir.path(), 8, one);
        assert_eq!(s8.len(), 1);
        assert!(s8.contains(&BlockHash([5; 32])));
        assert!(!s8.contains(&h2));
    }

    #[test]
    fn a_foreign_directory_is_refused_untouched_and_layout_1_is_emptied() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("notes.txt"), b"mine").expect("write");
        let err = DiskStore::open(
            dir.path(),
            ModelFingerprint([7; 32]),
            BB,
            1 << 20,
            Arc::new(DiskCounters::default()),
        )
        .expect_err("foreign");
        assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
        assert!(err.is_config_error());
        assert!(err.to_string().contains("prefix_store.path"), "{err}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read_dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("notes.txt")]);

        // A layout-1 store (sled's files directly in the directory).
        let old = tempfile::tempdir().expect("tempdir");
        for f in ["conf", "db", "snap.0000000000000060"] {
            std::fs::write(old.path().join(f), b"old").expect("write");
        }
        std::fs::create_dir(old.path().join("blobs")).expect("mkdir");
        let mut s = open(old.path(), 7, 1 << 20);
        assert!(s.is_empty());
        assert!(!old.path().join("conf").exists() && !old.path().join("blobs").exists());
        let (h, t, kv) = block(1);
        s.put(&h, None, &t, &kv);
        assert_eq!(s.get_run(&[h], &[t]), vec![kv]);

        // A marker of another layout.
        let newer = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            newer.path().join("STORE"),
            "inferd prefix store\nlayout 9\n",
        )
        .expect("write");
        let err = DiskStore::open(
            newer.path(),
            ModelFingerprint([7; 32]),
            BB,
            1 << 20,
            Arc::new(DiskCounters::default()),
        )
        .expect_err("layout");
        assert!(
            matches!(&err, StoreError::Layout { found, .. } if found == "9"),
            "{err}"
        );
    }

    #[test]
    fn a_store_in_use_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _first = open(dir.path(), 7, 1 << 20);
        let err = DiskStore::open_waiting(
            dir.path(),
            ModelFingerprint([7; 32]),
            BB,
            1 << 20,
            Arc::new(DiskCounters::default()),
            Duration::from_millis(100),
        )
        .expect_err("locked");
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("another inferd process uses this prefix store"),
            "{err}"
        );
    }
}
