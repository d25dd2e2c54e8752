//! `allocator::bound_arenas`, each case in a process of its own: glibc fixes its arena
//! limit when a thread first needs an arena, so the setting has to come before any
//! other thread, as in `src/main.rs`. Without a harness (`harness = false`): `main`
//! runs each case as a child of this binary, which starts twice the limit's threads,
//! each allocating while all are alive, and reports glibc's arena count
//! (`malloc_info(3)`: one `<heap nr=...>` element per arena).

#[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::process::Command;
    use std::sync::{Arc, Barrier};

    /// The variable naming the case a child runs.
    const CASE: &str = "INFERD_ARENA_TEST_CASE";

    fn cores() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    /// One case, in the child: the daemon's settings in the daemon's order, then the
    /// threads, then glibc's own report on stdout.
    fn child(bounded: bool) {
        if bounded {
            assert!(
                inferd::allocator::bound_arenas(),
                "glibc refused M_ARENA_MAX"
            );
        }
        let threads = 2 * inferd::allocator::arena_limit(cores());
        let all_alive = Arc::new(Barrier::new(threads));
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let all_alive = Arc::clone(&all_alive);
                std::thread::spawn(move || {
                    // Each thread allocates while every other one holds its buffer, so
                    // glibc gives each its own arena until the limit (64 KiB: under
                    // glibc's mmap threshold, from an arena).
                    let buffer = std::hint::black_box(vec![i as u8 + 1; 64 << 10]);
                    all_alive.wait();
                    drop(buffer);
                })
            })
            .collect();
        for w in workers {
            w.join().expect("a worker thread");
        }
        // SAFETY: fdopen on this process's stdout, written and flushed here only.
        unsafe {
            let out = libc::fdopen(1, c"w".as_ptr());
            assert!(!out.is_null(), "fdopen(stdout)");
            assert_eq!(libc::malloc_info(0, out), 0, "malloc_info");
            libc::fflush(out);
        }
    }

    /// Runs one case in a child of this binary and returns glibc's arena count.
    fn arenas(case: &str) -> usize {
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
        let n = stdout.matches("<heap nr=").count();
        assert!(
            n > 0,
            "case {case}: no arena in malloc_info's report: {stdout}"
        );
        n
    }

    pub fn main() {
        match std::env::var(CASE).as_deref() {
            Ok("bounded") => return child(true),
            Ok("default") => return child(false),
            _ => {}
        }
        let limit = inferd::allocator::arena_limit(cores());
        // The daemon's setting: the main arena and the threads' share `limit`.
        let bounded = arenas("bounded");
        assert_eq!(
            bounded,
            limit,
            "arenas with bound_arenas ({} cores)",
            cores()
        );
        // Without it glibc gives up to eight per core, more than the limit on any
        // machine: the count above is the setting's doing.
        let default = arenas("default");
        assert!(
            default > limit,
            "arenas without bound_arenas: {default}, not above the limit {limit}"
        );
        println!(
            "allocator_arena: {bounded} arenas with bound_arenas, {default} without ({} cores): ok",
            cores()
        );
    }
}

fn main() {
    #[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
    glibc::main();
}
