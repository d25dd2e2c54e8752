//! `allocator::keep_freed_buffers`, alone in its process (it changes the allocator's
//! parameters for the whole process, and the figures read are this thread's page faults).

/// Minor page faults of the calling thread so far (getrusage(2), `RUSAGE_THREAD`).
#[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
fn thread_minor_faults() -> i64 {
    // SAFETY: getrusage writes the struct it is given, zeroed here.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to a rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    assert_eq!(rc, 0, "getrusage");
    u.ru_minflt
}

/// A 48 MiB buffer (a 512-row micro-batch's fused gate/up output is 36 MiB on the 1.5B
/// model) freed and allocated again: with the setting the second one reuses the heap's
/// pages (no fresh faults); glibc's defaults would unmap it and fault all 12,288 pages
/// in again.
#[cfg(all(not(feature = "jemalloc"), target_os = "linux", target_env = "gnu"))]
#[test]
fn freed_large_buffers_are_reused_without_page_faults() {
    assert!(
        inferd::allocator::keep_freed_buffers(),
        "glibc refused the settings"
    );
    const LEN: usize = 48 << 20;
    let touch = |v: &mut Vec<u8>| {
        for i in (0..LEN).step_by(4096) {
            v[i] = i as u8;
        }
    };
    let mut first = Vec::with_capacity(LEN);
    first.resize(LEN, 1u8);
    touch(&mut first);
    drop(std::hint::black_box(first));
    let before = thread_minor_faults();
    let mut second: Vec<std::mem::MaybeUninit<u8>> = Vec::with_capacity(LEN);
    // SAFETY: `MaybeUninit` needs no initialisation.
    unsafe { second.set_len(LEN) };
    // Escaped before the writes, so that they stay between the two fault readings.
    let mut second = std::hint::black_box(second);
    for i in (0..LEN).step_by(4096) {
        second[i] = std::mem::MaybeUninit::new(i as u8);
    }
    let faults = thread_minor_faults() - before;
    std::hint::black_box(&second);
    assert!(
        faults < 1000,
        "{faults} page faults for {} pages",
        LEN / 4096
    );
}
