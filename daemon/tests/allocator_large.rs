//! `allocator::large::LargeFirst` as this process's global allocator, as in the
//! daemon: large buffers come back with their pages, zeroed ones are zero, reallocation
//! keeps contents, and idle mappings are unmapped. The cases share the allocator's one
//! cache, so they run one at a time (`SERIAL`).

#[cfg(all(not(feature = "jemalloc"), target_os = "linux"))]
mod linux {
    use std::alloc::{GlobalAlloc, Layout};
    use std::sync::Mutex;

    use inferd::allocator::large::{self, LargeFirst, CACHE_SLOTS, LARGE_MIN, PAGE};

    #[global_allocator]
    static GLOBAL: LargeFirst = LargeFirst;

    static SERIAL: Mutex<()> = Mutex::new(());

    /// One case at a time, with freed mappings cached (as the daemon sets once its model
    /// is loaded).
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        let guard = SERIAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        large::keep_freed(true);
        guard
    }

    /// Minor page faults of the calling thread so far (getrusage(2), `RUSAGE_THREAD`).
    fn thread_minor_faults() -> i64 {
        // SAFETY: getrusage writes the struct it is given, zeroed here.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pointer to a rusage.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
        assert_eq!(rc, 0, "getrusage");
        u.ru_minflt
    }

    /// Anonymous resident memory of this process, kB (`RssAnon`, proc(5)).
    fn rss_anon_kb() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        s.lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("RssAnon")
    }

    /// Writes one byte into every page of `v`.
    fn touch(v: &mut [u8]) {
        for i in (0..v.len()).step_by(PAGE) {
            v[i] = i as u8;
        }
    }

    /// A 48 MiB buffer (a 512-row micro-batch's fused gate/up output is 36 MiB on the
    /// 1.5B model) freed and allocated again gets the same pages back: no fresh faults,
    /// where a mapping of its own without the cache would fault all 12,288 in again.
    #[test]
    fn freed_large_buffers_are_reused_without_page_faults() {
        let _s = serial();
        const LEN: usize = 48 << 20;
        let mut first = vec![1u8; LEN];
        touch(&mut first);
        let at = first.as_ptr() as usize;
        drop(std::hint::black_box(first));
        let before = thread_minor_faults();
        let mut second: Vec<std::mem::MaybeUninit<u8>> = Vec::with_capacity(LEN);
        // SAFETY: `MaybeUninit` needs no initialisation.
        unsafe { second.set_len(LEN) };
        // Escaped before the writes, so that they stay between the two fault readings.
        let mut second = std::hint::black_box(second);
        for i in (0..LEN).step_by(PAGE) {
            second[i] = std::mem::MaybeUninit::new(i as u8);
        }
        let faults = thread_minor_faults() - before;
        assert_eq!(
            second.as_ptr() as usize,
            at,
            "the cached mapping was not reused"
        );
        assert!(
            faults < 100,
            "{faults} page faults for {} pages",
            LEN / PAGE
        );
    }

    /// A zeroed allocation served from the cache is zeroed, though the mapping it
    /// reuses was written.
    #[test]
    fn zeroed_allocations_from_the_cache_are_zero() {
        let _s = serial();
        let dirty = vec![0xA5u8; 3 << 20];
        let at = dirty.as_ptr() as usize;
        drop(std::hint::black_box(dirty));
        let clean = vec![0u8; 3 << 20];
        assert_eq!(
            clean.as_ptr() as usize,
            at,
            "the cached mapping was not reused"
        );
        assert!(
            clean.iter().all(|&b| b == 0),
            "a dirty byte in a zeroed buffer"
        );
    }

    /// Growing a vector through the threshold and far past it (moves by mremap), then
    /// shrinking it below (back to malloc), keeps every value.
    #[test]
    fn reallocation_keeps_contents_across_the_threshold() {
        let _s = serial();
        let mut v: Vec<u32> = Vec::new();
        for i in 0..3_000_000u32 {
            v.push(i.wrapping_mul(2_654_435_761));
        }
        assert!(v.capacity() * 4 >= LARGE_MIN);
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, &x)| x == (i as u32).wrapping_mul(2_654_435_761)));
        v.truncate(1000);
        v.shrink_to_fit();
        assert!(v.capacity() * 4 < LARGE_MIN, "capacity {}", v.capacity());
        assert!(v
            .iter()
            .enumerate()
            .all(|(i, &x)| x == (i as u32).wrapping_mul(2_654_435_761)));
    }

    /// A cached mapping serves a request down to half its size, not smaller: a buffer
    /// never holds more than twice the pages it asked for.
    #[test]
    fn a_cached_mapping_serves_requests_down_to_half_its_size() {
        let _s = serial();
        large::release_all();
        let big = vec![1u8; 8 << 20];
        let at = big.as_ptr() as usize;
        drop(std::hint::black_box(big));
        let small = std::hint::black_box(vec![2u8; 1 << 20]);
        assert_ne!(small.as_ptr() as usize, at, "1 MiB took an 8 MiB mapping");
        let half = std::hint::black_box(vec![3u8; 5 << 20]);
        assert_eq!(
            half.as_ptr() as usize,
            at,
            "5 MiB did not take the 8 MiB mapping"
        );
    }

    /// The cache keeps at most `CACHE_SLOTS` mappings; the trim thread's call unmaps
    /// those unused for a whole period, and the resident memory goes with them.
    #[test]
    fn idle_mappings_are_unmapped_after_a_trim_period() {
        let _s = serial();
        large::release_all();
        assert_eq!(large::stats().cached, 0);
        const LEN: usize = 1 << 20;
        let bufs: Vec<Vec<u8>> = (0..CACHE_SLOTS + 8)
            .map(|i| {
                let mut v = vec![i as u8; LEN];
                touch(&mut v);
                v
            })
            .collect();
        let live = large::stats().live;
        assert!(live >= (CACHE_SLOTS + 8) * LEN, "live {live}");
        drop(bufs);
        let len = large::mapping_len(LEN).expect("length");
        assert_eq!(large::stats().cached, CACHE_SLOTS * len);
        let before = rss_anon_kb();
        // Freed in the current period: kept by the first call, unmapped by the second.
        assert_eq!(large::release_idle(), 0);
        assert_eq!(large::release_idle(), CACHE_SLOTS * len);
        assert_eq!(large::stats().cached, 0);
        let after = rss_anon_kb();
        assert!(
            before - after >= (CACHE_SLOTS * LEN / 1024) as u64 * 9 / 10,
            "RssAnon {before} -> {after} kB"
        );
    }

    /// Before caching is on (while the daemon loads its model), a freed mapping is
    /// unmapped at once.
    #[test]
    fn nothing_is_cached_before_caching_is_on() {
        let _s = serial();
        large::keep_freed(false);
        assert_eq!(large::stats().cached, 0);
        drop(std::hint::black_box(vec![1u8; 4 << 20]));
        assert_eq!(large::stats().cached, 0);
        large::keep_freed(true);
        drop(std::hint::black_box(vec![1u8; 4 << 20]));
        assert_eq!(
            large::stats().cached,
            large::mapping_len(4 << 20).expect("length")
        );
    }

    /// Alignments beyond a page go to malloc (a mapping's pointer is only page-aligned).
    #[test]
    fn alignment_beyond_a_page_is_honoured() {
        let _s = serial();
        let layout = Layout::from_size_align(LARGE_MIN * 2, 4 * PAGE).expect("layout");
        // SAFETY: a non-zero size; freed with the same layout.
        unsafe {
            let p = GLOBAL.alloc(layout);
            assert!(!p.is_null());
            assert_eq!(p as usize % (4 * PAGE), 0);
            p.write_bytes(7, layout.size());
            GLOBAL.dealloc(p, layout);
        }
    }

    /// Threads allocating, filling, checking and freeing buffers of many sizes at once
    /// never see another's bytes, and every mapping comes back.
    #[test]
    fn threads_share_the_cache_without_mixing_buffers() {
        let _s = serial();
        let live_before = large::stats().live;
        let workers: Vec<_> = (0..8u8)
            .map(|t| {
                std::thread::spawn(move || {
                    for i in 0..200usize {
                        let size = LARGE_MIN + ((i * 7919 + usize::from(t) * 104_729) % 64) * PAGE;
                        let tag = t.wrapping_mul(31).wrapping_add(i as u8);
                        let v = std::hint::black_box(vec![tag; size]);
                        assert!(v.iter().all(|&b| b == tag), "thread {t} round {i}");
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a worker");
        }
        assert_eq!(large::stats().live, live_before);
    }
}
