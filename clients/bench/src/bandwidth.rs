//! The machine's streaming read bandwidth over a buffer the size of the weights a decode
//! step reads: the physical bound of single-stream decode.
//!
//! A `u64` buffer of that size is filled once (so its pages exist), then `threads`
//! threads each sum their contiguous share of it, started together behind a barrier; one
//! run is enough whole sweeps to read about 1 GB, timed from the first thread's start to
//! the last one's end. The best run counts.

use std::sync::Barrier;
use std::time::Instant;

use serde::Serialize;

/// Bytes read per run, at least (whole sweeps of the buffer); less in unit tests.
const BYTES_PER_RUN: u64 = if cfg!(test) { 1 << 24 } else { 1 << 30 };

/// What was measured.
#[derive(Debug, Clone, Serialize)]
pub struct Bandwidth {
    pub buffer_bytes: u64,
    pub threads: usize,
    /// Sweeps of the whole buffer per run.
    pub sweeps_per_run: u64,
    /// GB/s (10^9 bytes) of every run.
    pub runs_gb_s: Vec<f64>,
    /// The best run.
    pub best_gb_s: f64,
    pub method: String,
}

/// Sum with eight independent accumulators, so the loop is bound by loads, not by one
/// dependency chain (the compiler vectorizes it).
fn sum(words: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    let tail: u64 = chunks.remainder().iter().fold(0, |a, &w| a.wrapping_add(w));
    acc.iter().fold(tail, |a, &w| a.wrapping_add(w))
}

/// Measures `runs` runs over a buffer of `bytes` bytes with `threads` threads.
pub fn measure(bytes: u64, threads: usize, runs: usize) -> Bandwidth {
    let threads = threads.max(1);
    let words = (bytes / 8).max(threads as u64 * 8) as usize;
    let buffer: Vec<u64> = (0..words as u64).collect();
    let buffer_bytes = words as u64 * 8;
    let sweeps = BYTES_PER_RUN.div_ceil(buffer_bytes).max(1);
    let share = words.div_ceil(threads);
    let mut runs_gb_s = Vec::with_capacity(runs);
    let mut check = 0u64;
    for _ in 0..runs.max(1) {
        let barrier = Barrier::new(threads);
        let spans: Vec<(Instant, Instant, u64)> = std::thread::scope(|s| {
            let handles: Vec<_> = buffer
                .chunks(share)
                .map(|part| {
                    let barrier = &barrier;
                    s.spawn(move || {
                        barrier.wait();
                        let start = Instant::now();
                        let mut total = 0u64;
                        for _ in 0..sweeps {
                            total = total.wrapping_add(sum(std::hint::black_box(part)));
                        }
                        (start, Instant::now(), total)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("bandwidth thread panicked"))
                .collect()
        });
        let start = spans.iter().map(|s| s.0).min().expect("no threads");
        let end = spans.iter().map(|s| s.1).max().expect("no threads");
        check = spans.iter().fold(check, |a, s| a.wrapping_add(s.2));
        let secs = end.duration_since(start).as_secs_f64();
        runs_gb_s.push((buffer_bytes * sweeps) as f64 / secs / 1e9);
    }
    std::hint::black_box(check);
    let best_gb_s = runs_gb_s.iter().copied().fold(0.0, f64::max);
    Bandwidth {
        buffer_bytes,
        threads,
        sweeps_per_run: sweeps,
        runs_gb_s,
        best_gb_s,
        method: format!(
            "sum of a {buffer_bytes} B u64 buffer, {threads} threads on contiguous shares \
             started behind a barrier, {sweeps} sweep(s) per run, best of the runs"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_matches_naive() {
        let v: Vec<u64> = (0..1003).collect();
        assert_eq!(sum(&v), v.iter().sum::<u64>());
    }

    #[test]
    fn measure_small_buffer() {
        let b = measure(1 << 20, 2, 2);
        assert_eq!(b.runs_gb_s.len(), 2);
        assert!(b.best_gb_s > 0.0);
        assert_eq!(b.buffer_bytes, 1 << 20);
    }
}
