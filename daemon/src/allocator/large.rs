//! Large allocations outside malloc's heaps, with their pages kept for the next one.
//!
//! [`LargeFirst`] is the daemon's global allocator on Linux with glibc (set in
//! `src/main.rs`): every allocation of at least [`LARGE_MIN`] bytes gets a mapping of its
//! own (`mmap(2)`), and a freed one goes to a small cache from which a later allocation
//! of the same size or a little smaller takes it back with its pages still mapped and
//! resident, so a forward pass's buffers fault no pages in once the first pass has run.
//! Everything smaller goes to the C library's `malloc` ([`System`]).
//!
//! Why (issue 39): the forward pass frees and allocates buffers of tens of MB for every
//! layer. glibc keeps a freed chunk that size only if its trim threshold is raised, and
//! then `free` no longer shrinks the tops of its heaps; a soak kept the tops of the
//! arenas other than the main one resident and RSS rose for two hours
//! (docs/performance.md, section Soak). With this cache glibc sees no large requests, so
//! its defaults (an mmap threshold of 128 KiB, tops trimmed beyond 128 KiB; mallopt(3))
//! hold, and the daemon's memory is its small objects in glibc's heaps plus the large
//! buffers here, which the trim thread unmaps once unused for a trim period
//! ([`release_idle`]).
//!
//! Each mapping starts with a header page holding its length; the caller's pointer is
//! the page after it, so it is page-aligned, and `dealloc` finds the mapping's true
//! length there (a cached mapping may serve a request up to half its size).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The smallest allocation served by a mapping, bytes: glibc's default mmap threshold
/// (`M_MMAP_THRESHOLD`, mallopt(3)), so glibc never sees a request it would map itself.
pub const LARGE_MIN: usize = 128 << 10;

/// The page size this module assumes for its header and alignment; on a machine with
/// larger pages `mmap` still returns page-aligned memory, and alignments above this go
/// to [`System`].
pub const PAGE: usize = 4096;

/// The most mappings the cache keeps.
pub const CACHE_SLOTS: usize = 64;

/// The most bytes the cache keeps mapped while unused.
pub const CACHE_MAX_BYTES: usize = 1 << 30;

/// A cached mapping serves a request of at least `len / REUSE_RATIO` bytes of it, so
/// that a buffer never holds more than twice the pages it asked for.
const REUSE_RATIO: usize = 2;

/// A free mapping in the cache: its start (the header page), length in bytes, and the
/// trim period in which it was freed.
#[derive(Debug, Clone, Copy)]
struct Slot {
    base: usize,
    len: usize,
    tick: u64,
}

/// The cache of free mappings, most recently freed last.
struct Cache {
    slots: [Slot; CACHE_SLOTS],
    n: usize,
    bytes: usize,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache {
    slots: [Slot {
        base: 0,
        len: 0,
        tick: 0,
    }; CACHE_SLOTS],
    n: 0,
    bytes: 0,
});

/// Whether freed mappings are cached ([`keep_freed`]); until then they are unmapped at
/// once, as glibc does, so that the loader's temporaries do not stay resident.
static CACHING: AtomicBool = AtomicBool::new(false);
/// The current trim period, advanced by [`release_idle`].
static TICK: AtomicU64 = AtomicU64::new(0);
/// Bytes of mappings in use (header pages included).
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Bytes of mappings in the cache.
static CACHED: AtomicUsize = AtomicUsize::new(0);
/// Fresh mappings made (`mmap` calls), ever.
static MAPPED: AtomicUsize = AtomicUsize::new(0);
/// Allocations served from the cache, ever.
static REUSED: AtomicUsize = AtomicUsize::new(0);
/// Mappings unmapped (freed while not caching, evicted, or idle), ever.
static UNMAPPED: AtomicUsize = AtomicUsize::new(0);

/// Bytes of the mappings in use and of those cached, now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LargeStats {
    /// Mappings holding live allocations, header pages included.
    pub live: usize,
    /// Free mappings kept for reuse.
    pub cached: usize,
    /// Fresh mappings made so far (`mmap(2)` calls; each faults its pages in).
    pub mapped: usize,
    /// Allocations served from the cache so far.
    pub reused: usize,
    /// Mappings unmapped so far.
    pub unmapped: usize,
}

/// The current [`LargeStats`] (both 0 where [`LargeFirst`] is not the allocator).
pub fn stats() -> LargeStats {
    LargeStats {
        live: LIVE.load(Ordering::Relaxed),
        cached: CACHED.load(Ordering::Relaxed),
        mapped: MAPPED.load(Ordering::Relaxed),
        reused: REUSED.load(Ordering::Relaxed),
        unmapped: UNMAPPED.load(Ordering::Relaxed),
    }
}

/// Whether an allocation of `layout` is served by a mapping.
#[inline]
pub fn is_large(layout: Layout) -> bool {
    layout.size() >= LARGE_MIN && layout.align() <= PAGE
}

/// The mapping length for `size` bytes: the header page plus the bytes rounded up to
/// whole pages; `None` on overflow.
pub fn mapping_len(size: usize) -> Option<usize> {
    size.checked_add(2 * PAGE - 1).map(|n| n / PAGE * PAGE)
}

fn lock() -> std::sync::MutexGuard<'static, Cache> {
    // A panic while holding the lock cannot leave the cache inconsistent (each update
    // is complete before anything that could panic), so a poisoned lock is taken as is.
    CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Takes the cached mapping that serves `len` bytes best: the smallest of those at
/// least `len` and at most `REUSE_RATIO · len` long, the most recently freed among
/// equals. Returns `(base, mapping length)`.
fn take_cached(len: usize) -> Option<(usize, usize)> {
    let mut c = lock();
    let mut best: Option<usize> = None;
    for i in (0..c.n).rev() {
        let s = c.slots[i];
        if s.len >= len && s.len / REUSE_RATIO <= len && best.is_none_or(|b| s.len < c.slots[b].len)
        {
            best = Some(i);
        }
    }
    let i = best?;
    let s = c.slots[i];
    let n = c.n;
    c.slots.copy_within(i + 1..n, i);
    c.n -= 1;
    c.bytes -= s.len;
    CACHED.store(c.bytes, Ordering::Relaxed);
    Some((s.base, s.len))
}

/// Unmaps `len` bytes at `base`.
fn unmap(base: usize, len: usize) {
    UNMAPPED.fetch_add(1, Ordering::Relaxed);
    // SAFETY: `base..base + len` is a whole mapping this module made and no longer
    // hands out.
    unsafe {
        libc::munmap(base as *mut libc::c_void, len);
    }
}

/// Starts caching freed mappings (the daemon does once the model is loaded:
/// `src/app.rs`); `false` stops it and unmaps what the cache holds.
pub fn keep_freed(on: bool) {
    CACHING.store(on, Ordering::Relaxed);
    if !on {
        release_all();
    }
}

/// Puts a free mapping into the cache, unmapping the oldest ones (or this one, when it
/// alone is over the byte budget) to stay within [`CACHE_SLOTS`] and
/// [`CACHE_MAX_BYTES`].
fn put_cached(base: usize, len: usize) {
    if len > CACHE_MAX_BYTES || !CACHING.load(Ordering::Relaxed) {
        unmap(base, len);
        return;
    }
    let mut evicted = [(0usize, 0usize); CACHE_SLOTS];
    let mut n_evicted = 0;
    {
        let mut c = lock();
        while c.n > 0 && (c.n == CACHE_SLOTS || c.bytes + len > CACHE_MAX_BYTES) {
            let old = c.slots[0];
            let n = c.n;
            c.slots.copy_within(1..n, 0);
            c.n -= 1;
            c.bytes -= old.len;
            evicted[n_evicted] = (old.base, old.len);
            n_evicted += 1;
        }
        let n = c.n;
        c.slots[n] = Slot {
            base,
            len,
            tick: TICK.load(Ordering::Relaxed),
        };
        c.n += 1;
        c.bytes += len;
        CACHED.store(c.bytes, Ordering::Relaxed);
    }
    for &(b, l) in &evicted[..n_evicted] {
        unmap(b, l);
    }
}

/// Unmaps every cached mapping freed before the previous call (so unused for at least
/// one trim period), then starts a new period. Returns the bytes unmapped. Called by the
/// trim thread (`allocator::release_free_memory`).
pub fn release_idle() -> usize {
    let tick = TICK.fetch_add(1, Ordering::Relaxed);
    let mut released = [(0usize, 0usize); CACHE_SLOTS];
    let mut n_released = 0;
    {
        let mut c = lock();
        let mut kept = 0;
        for i in 0..c.n {
            let s = c.slots[i];
            if s.tick < tick {
                released[n_released] = (s.base, s.len);
                n_released += 1;
                c.bytes -= s.len;
            } else {
                c.slots[kept] = s;
                kept += 1;
            }
        }
        c.n = kept;
        CACHED.store(c.bytes, Ordering::Relaxed);
    }
    released[..n_released]
        .iter()
        .map(|&(b, l)| {
            unmap(b, l);
            l
        })
        .sum()
}

/// Unmaps every cached mapping now; returns the bytes unmapped.
pub fn release_all() -> usize {
    TICK.fetch_add(1, Ordering::Relaxed);
    release_idle()
}

/// A fresh mapping of `len` bytes (zero pages, mapped in when first touched), or null.
fn map_fresh(len: usize) -> usize {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        0
    } else {
        MAPPED.fetch_add(1, Ordering::Relaxed);
        p as usize
    }
}

/// Writes the mapping length into the header page at `base`; returns the caller's
/// pointer.
///
/// # Safety
/// `base` starts a mapping of at least two pages owned by the caller.
unsafe fn publish(base: usize, len: usize) -> *mut u8 {
    // SAFETY: the header page is mapped and owned (caller's contract).
    unsafe { (base as *mut usize).write(len) };
    LIVE.fetch_add(len, Ordering::Relaxed);
    (base + PAGE) as *mut u8
}

/// The mapping behind a pointer this module returned: `(base, length)`.
///
/// # Safety
/// `p` was returned by [`alloc_large`] (or moved by [`realloc_large`]) and not yet freed.
unsafe fn mapping_of(p: *mut u8) -> (usize, usize) {
    let base = p as usize - PAGE;
    // SAFETY: the header page precedes `p` and holds the length (`publish`).
    (base, unsafe { (base as *const usize).read() })
}

/// Allocates `size` bytes from a cached mapping or a fresh one, zeroed when asked; null
/// when the OS refuses.
fn alloc_large(size: usize, zeroed: bool) -> *mut u8 {
    let Some(len) = mapping_len(size) else {
        return std::ptr::null_mut();
    };
    if let Some((base, len)) = take_cached(len) {
        REUSED.fetch_add(1, Ordering::Relaxed);
        // SAFETY: a cached mapping of at least `len` ≥ two pages, now ours.
        let p = unsafe { publish(base, len) };
        if zeroed {
            // SAFETY: `size` bytes after the header are within the mapping.
            unsafe { std::ptr::write_bytes(p, 0, size) };
        }
        return p;
    }
    let base = map_fresh(len);
    if base == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: a fresh mapping of `len` ≥ two pages.
    unsafe { publish(base, len) }
}

/// Frees a pointer from [`alloc_large`] into the cache.
///
/// # Safety
/// As [`mapping_of`].
unsafe fn free_large(p: *mut u8) {
    // SAFETY: caller's contract.
    let (base, len) = unsafe { mapping_of(p) };
    LIVE.fetch_sub(len, Ordering::Relaxed);
    put_cached(base, len);
}

/// Resizes a large allocation to `new_size` (≥ [`LARGE_MIN`]): in place while its
/// mapping holds it and is at most twice what it needs, otherwise moved with
/// `mremap(2)` (the kernel moves the pages, nothing is copied). Null when the OS
/// refuses; the old allocation is then untouched.
///
/// # Safety
/// As [`mapping_of`].
unsafe fn realloc_large(p: *mut u8, new_size: usize) -> *mut u8 {
    let Some(need) = mapping_len(new_size) else {
        return std::ptr::null_mut();
    };
    // SAFETY: caller's contract.
    let (base, len) = unsafe { mapping_of(p) };
    if need <= len && len / REUSE_RATIO <= need {
        return p;
    }
    // SAFETY: `base..base + len` is this allocation's whole mapping; the kernel keeps
    // the contents and may move it.
    let q = unsafe { libc::mremap(base as *mut libc::c_void, len, need, libc::MREMAP_MAYMOVE) };
    if q == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    LIVE.fetch_sub(len, Ordering::Relaxed);
    // SAFETY: a mapping of `need` ≥ two pages holding the old contents, now ours.
    unsafe { publish(q as usize, need) }
}

/// The daemon's global allocator: [`System`] (glibc's malloc) for everything under
/// [`LARGE_MIN`] bytes or aligned beyond a page, a mapping of its own with a reuse
/// cache for the rest (module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct LargeFirst;

// SAFETY: every pointer goes back to the allocator that made it: which one is decided
// by the layout alone (`is_large`), and `dealloc` and `realloc` get the layout the
// allocation was made with (GlobalAlloc's contract).
unsafe impl GlobalAlloc for LargeFirst {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_large(layout) {
            alloc_large(layout.size(), false)
        } else {
            // SAFETY: caller's contract, passed on.
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_large(layout) {
            alloc_large(layout.size(), true)
        } else {
            // SAFETY: caller's contract, passed on.
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_large(layout) {
            // SAFETY: a large layout means `alloc_large` made it.
            unsafe { free_large(ptr) }
        } else {
            // SAFETY: caller's contract, passed on.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc's contract: `new_size` rounded to the alignment does not
        // overflow isize, so this layout is valid.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (is_large(layout), is_large(new_layout)) {
            // SAFETY: caller's contract, passed on.
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            // SAFETY: a large layout means `alloc_large` made it.
            (true, true) => unsafe { realloc_large(ptr, new_size) },
            _ => {
                // SAFETY: caller's contract for the new layout.
                let q = unsafe { self.alloc(new_layout) };
                if !q.is_null() {
                    // SAFETY: both hold at least the smaller size; distinct allocations.
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, q, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                q
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The allocator itself, installed as the global one, is tested in a process of its
    // own: daemon/tests/allocator_large.rs.

    #[test]
    fn mapping_lengths_hold_a_header_page_and_whole_pages() {
        assert_eq!(mapping_len(LARGE_MIN), Some(LARGE_MIN + PAGE));
        assert_eq!(mapping_len(LARGE_MIN + 1), Some(LARGE_MIN + 2 * PAGE));
        assert_eq!(mapping_len(3 * PAGE - 1), Some(4 * PAGE));
        assert_eq!(mapping_len(usize::MAX - PAGE), None);
    }

    #[test]
    fn only_large_page_aligned_layouts_are_mapped() {
        let l = |size, align| Layout::from_size_align(size, align).expect("layout");
        assert!(is_large(l(LARGE_MIN, 8)));
        assert!(is_large(l(LARGE_MIN, PAGE)));
        assert!(!is_large(l(LARGE_MIN - 1, 8)));
        assert!(!is_large(l(LARGE_MIN, 2 * PAGE)));
    }
}
