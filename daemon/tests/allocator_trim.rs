//! The allocator's trim, alone in its process: the lib suite's other tests allocate and
//! free in parallel threads, which moved the figures this test reads (a clean-clone CI
//! run saw malloc_trim release nothing there, another the allocated bytes grow).

#[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
#[test]
fn release_returns_freed_arena_memory() {
    use inferd::allocator::{release_free_memory, stats};
    // Many small blocks, most of them freed: the arenas keep the pages until a trim.
    let mut blocks: Vec<Vec<u8>> = (0..20_000).map(|i| vec![i as u8; 2000]).collect();
    let keep: Vec<Vec<u8>> = blocks.iter().step_by(100).cloned().collect();
    blocks.clear();
    let before = stats().expect("glibc stats");
    let released = release_free_memory();
    let after = stats().expect("glibc stats");
    assert!(released, "malloc_trim released nothing: {before:?}");
    assert_eq!(keep.len(), 200);
    assert!(after.allocated <= before.allocated, "{before:?} {after:?}");
}
