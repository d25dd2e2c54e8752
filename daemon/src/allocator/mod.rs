//! The global allocator's own statistics, for `/metrics` and the soak (issue 21): how
//! many bytes the program holds (`allocated`) against how many the allocator keeps
//! resident for it (`resident`). A leak grows the first; fragmentation, or freed
//! memory the allocator does not give back, grows only the second.
//!
//! With the `jemalloc` feature (off by default) the daemon's global allocator is jemalloc
//! (`tikv-jemallocator`, set in `src/main.rs`) and the figures are its `stats.allocated`
//! and `stats.resident` (jemalloc(3), "MALLCTL NAMESPACE"), refreshed by advancing its
//! epoch. Without it the allocator is the C library's; on glibc the figures come from
//! `mallinfo2(3)` plus [`large`]'s counts for the allocations of 128 KiB and more, which
//! the daemon's allocator ([`large::LargeFirst`]) maps itself: allocated = `uordblks +
//! hblkhd` (bytes in use in the arenas plus mmapped chunks) + the large mappings in use,
//! resident = `arena + hblkhd` (bytes obtained from the OS, free or not) + the large
//! mappings in use or cached. Resident is an upper bound, since a freed page inside an
//! arena may have been returned, and both count a large zeroed allocation such as the
//! KV pool whole before its pages are touched.

#[cfg(all(not(feature = "jemalloc"), target_os = "linux"))]
pub mod large;

/// One reading of the allocator's statistics, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatorStats {
    /// `"jemalloc"` or `"glibc"`.
    pub allocator: &'static str,
    /// Bytes allocated by the program and not yet freed.
    pub allocated: u64,
    /// Bytes the allocator holds in memory for the program, in use or free.
    pub resident: u64,
}

/// The statistics now; `None` where the allocator offers none (neither jemalloc nor
/// glibc).
#[cfg(feature = "jemalloc")]
pub fn stats() -> Option<AllocatorStats> {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().ok()?;
    Some(AllocatorStats {
        allocator: "jemalloc",
        allocated: stats::allocated::read().ok()? as u64,
        resident: stats::resident::read().ok()? as u64,
    })
}

/// The statistics now; `None` where the allocator offers none (neither jemalloc nor
/// glibc).
#[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
pub fn stats() -> Option<AllocatorStats> {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    let l = large::stats();
    Some(AllocatorStats {
        allocator: "glibc",
        allocated: (m.uordblks + m.hblkhd + l.live) as u64,
        resident: (m.arena + m.hblkhd + l.live + l.cached) as u64,
    })
}

/// The statistics now; `None` where the allocator offers none (neither jemalloc nor
/// glibc).
#[cfg(all(
    not(feature = "jemalloc"),
    not(all(target_os = "linux", target_env = "gnu"))
))]
pub fn stats() -> Option<AllocatorStats> {
    None
}

/// How often the daemon hands the allocator's free memory back to the OS
/// ([`release_free_memory`], from a thread of its own started by `src/main.rs`).
pub const TRIM_PERIOD: std::time::Duration = std::time::Duration::from_secs(30);

/// Hands free memory the allocator keeps back to the OS. With glibc's malloc this is
/// `malloc_trim(0)` (malloc_trim(3)): since glibc 2.8 it returns the free pages inside
/// every arena, not only at the top of the main heap, which is what a 30-minute soak
/// saw glibc keep: its RSS rose 0.95 MB a minute while the bytes allocated stayed flat
/// (docs/performance.md, section Soak). With [`large::LargeFirst`] as the allocator it
/// also unmaps the large buffers cached unused for a trim period
/// ([`large::release_idle`]). jemalloc returns them by itself (decay), so there it does
/// nothing. Returns whether memory was released.
pub fn release_free_memory() -> bool {
    #[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
    {
        let unmapped = large::release_idle();
        // SAFETY: malloc_trim only takes the allocator's own locks.
        unsafe { libc::malloc_trim(0) == 1 || unmapped > 0 }
    }
    #[cfg(not(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Keeps the forward passes' large buffers once freed, mapped and resident for the next
/// pass, instead of unmapping them and faulting fresh zeroed pages in again
/// ([`large::keep_freed`]; what stays unused for a trim period is unmapped by the trim
/// thread). In the daemon this cut the 1.5B model's page faults per 580-token prefill
/// from about 128,000 (glibc's own heaps, which unmap a free 64 MiB heap whatever the
/// trim threshold) to 5,000, and its prefill ran 1.12× as fast (docs/performance.md,
/// section Soak, "Large buffers out of glibc's heaps"). The
/// daemon calls it once the model is loaded (the loader's freed temporaries would
/// otherwise stay resident until the trim thread's second pass). Returns whether
/// freed buffers are now kept: false with jemalloc or off Linux, where the global
/// allocator is not [`large::LargeFirst`].
pub fn keep_freed_buffers() -> bool {
    #[cfg(all(not(feature = "jemalloc"), target_os = "linux"))]
    {
        large::keep_freed(true);
        true
    }
    #[cfg(not(all(not(feature = "jemalloc"), target_os = "linux")))]
    {
        false
    }
}

/// The most arenas glibc's malloc may keep for the daemon: one per core plus two, and
/// at least four: room for an arena per compute thread (one per core) with the daemon's
/// other threads sharing the rest (glibc gives threads arenas first come, so this is a
/// bound, not an assignment), where glibc's own limit is eight per core (mallopt(3),
/// `M_ARENA_MAX`).
pub fn arena_limit(cores: usize) -> usize {
    (cores + 2).max(4)
}

/// Caps glibc's arenas at [`arena_limit`] for this machine's cores:
/// `mallopt(M_ARENA_MAX, n)` (mallopt(3)). Must run before the process starts its second
/// thread: glibc fixes its arena limit when a thread first needs an arena of its own.
///
/// Why: each arena keeps free memory of its own, and `malloc_trim(0)`
/// ([`release_free_memory`]) shrinks the top of the main arena only (glibc's `mtrim`
/// calls `systrim` for `main_arena` alone; malloc/malloc.c); the others shrink their
/// tops on `free`, beyond the trim threshold. While the daemon raised that threshold to
/// 1 GiB to keep its forward passes' buffers (before [`large::LargeFirst`] took those
/// out of glibc's heaps), every other arena kept its free top, up to its heap's 64 MiB.
/// With glibc's default of eight arenas per core the daemon's threads spread over
/// sixteen on 2 cores, whose tops kept reaching new highs for two hours: the soak's RSS
/// floor rose 0.49 MB a minute while the bytes allocated stayed flat. One arena stopped
/// that but cost 28 % of the 16-stream throughput on its lock; four arenas cost nothing
/// measurable and brought the rise to 0.18 MB a minute (docs/performance.md, section
/// Soak). Returns whether glibc took the setting; does nothing (false) with jemalloc or
/// another C library.
pub fn bound_arenas() -> bool {
    #[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let limit = libc::c_int::try_from(arena_limit(cores)).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only changes the allocator's parameters, under its own lock.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, limit) == 1 }
    }
    #[cfg(not(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Starts the thread that calls [`release_free_memory`] every [`TRIM_PERIOD`] for the
/// life of the process (a no-op thread is not started with jemalloc).
pub fn spawn_trimmer() {
    if cfg!(feature = "jemalloc") {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("inferd-trim".into())
        .spawn(|| loop {
            std::thread::sleep(TRIM_PERIOD);
            release_free_memory();
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start the allocator trim thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // release_returns_freed_arena_memory: in daemon/tests/allocator_trim.rs, a process of
    // its own (other tests' allocations and frees in parallel made it flaky here).

    #[test]
    fn stats_name_the_allocator_and_hold_allocated_within_resident() {
        let Some(s) = stats() else {
            return; // no allocator statistics on this platform
        };
        let want = if cfg!(feature = "jemalloc") {
            "jemalloc"
        } else {
            "glibc"
        };
        assert_eq!(s.allocator, want);
        assert!(s.resident > 0, "{s:?}");
        // Test binaries keep the system allocator, so with the jemalloc feature its
        // counters see only jemalloc's own bookkeeping; allocated stays within resident.
        assert!(s.allocated <= s.resident, "{s:?}");
    }
}
