//! `allocator::use_one_arena`, each case in a process of its own: glibc fixes its arena
//! limit when a thread first needs an arena, so the setting has to come before any
//! other thread, as in `src/main.rs`. Without a harness (`harness = false`): `main`
//! runs each case as a child of this binary, with the daemon's allocator settings, and
//! reads how much of 32 MiB freed on a worker thread `malloc_trim` hands back.

#[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::process::Command;

    /// The variable naming the case a child runs.
    const CASE: &str = "INFERD_ARENA_TEST_CASE";
    /// Bytes the worker thread allocates, touches and frees: eight 4 MiB buffers, the
    /// size of a forward pass's activations, below the 256 MiB mmap threshold the daemon
    /// sets, so they come from the thread's arena.
    const BUFFERS: usize = 8;
    const BUFFER: usize = 4 << 20;

    /// Resident bytes of this process (`/proc/self/statm`, field 2, in pages).
    fn resident_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
        let pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|f| f.parse().ok())
            .expect("statm's resident field");
        // SAFETY: sysconf only reads a constant.
        pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
    }

    /// One case, in the child: the daemon's settings in the daemon's order, then the
    /// worker's buffers, then the trim. Prints the MiB the trim handed back.
    fn child(one_arena: bool) {
        if one_arena {
            assert!(
                inferd::allocator::use_one_arena(),
                "glibc refused M_ARENA_MAX"
            );
        }
        assert!(
            inferd::allocator::keep_freed_buffers(),
            "glibc refused the thresholds"
        );
        std::thread::spawn(|| {
            let buffers: Vec<Vec<u8>> = (0..BUFFERS).map(|i| vec![i as u8 + 1; BUFFER]).collect();
            drop(std::hint::black_box(buffers));
        })
        .join()
        .expect("the worker thread");
        let before = resident_bytes();
        inferd::allocator::release_free_memory();
        let after = resident_bytes();
        println!("released_mib={}", before.saturating_sub(after) >> 20);
    }

    /// Runs one case in a child of this binary and returns the MiB its trim released.
    fn released_mib(case: &str) -> u64 {
        let exe = std::env::current_exe().expect("this test binary");
        let out = Command::new(exe)
            .env(CASE, case)
            .output()
            .expect("the child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "case {case} failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("released_mib="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("case {case} printed no figure: {stdout}"))
    }

    pub fn main() {
        match std::env::var(CASE).as_deref() {
            Ok("one") => return child(true),
            Ok("per-thread") => return child(false),
            _ => {}
        }
        let total = (BUFFERS * BUFFER) as u64 >> 20;
        // With one arena the freed 32 MiB lie in the main heap, whose top the trim
        // shrinks whatever the trim threshold.
        let one = released_mib("one");
        assert!(
            one >= total - 4,
            "one arena: the trim released {one} of {total} MiB"
        );
        // The reason for the setting: with glibc's per-thread arenas the worker's freed
        // buffers merge into its arena's top, which neither `free` (threshold 1 GiB) nor
        // `malloc_trim` (main arena's top only) shrinks. Should a glibc release trim
        // those tops too, this fails and the setting can go.
        let per_thread = released_mib("per-thread");
        assert!(
            per_thread <= 4,
            "per-thread arenas: the trim released {per_thread} of {total} MiB"
        );
        println!("allocator_arena: one arena released {one} MiB, per-thread arenas {per_thread} MiB of {total}: ok");
    }
}

fn main() {
    #[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
    glibc::main();
}
