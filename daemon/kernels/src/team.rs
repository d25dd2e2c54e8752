//! The compute threads of the CPU forward pass: a fixed team that spins between jobs.
//!
//! A decode step on the default model runs ~150 parallel loops of 10–100 µs each (one
//! per matrix multiplication and attention layer). Waking pool threads through the OS
//! for each costs a sizeable share of that, so, like ggml's CPU thread pool
//! (`ggml/src/ggml-cpu/ggml-cpu.c`), the helpers busy-wait for the next job while the
//! forward pass runs, and park only after `SPIN` without work (between steps of an
//! idle engine). Each thread takes the tasks of its own contiguous segment of the job
//! first and then the others' (`Segments`), so a thread slowed down by other load on
//! a shared machine simply takes fewer of them.
//!
//! The calling thread works too: a team of `n` threads is the caller plus `n − 1`
//! helpers. Calls from inside a task, or while another thread's job runs (tests running
//! in parallel), run serially on the calling thread. Every task is a function of its
//! index only, so results never depend on which thread ran it.
//!
//! One process may run several engines (`[[engines]]`), each with a team of its own
//! size: [`TeamRef::new`] starts one, and [`TeamRef::use_on_this_thread`] makes it the
//! team of the calling thread (an engine's model-runner thread). Other threads use the
//! process-wide team sized by [`set_threads`].

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::par::SendPtr;

/// How long an idle helper spins for the next job before parking.
const SPIN: Duration = Duration::from_micros(300);

/// Threads requested before the team starts (0: the machine's available parallelism).
static REQUESTED: AtomicUsize = AtomicUsize::new(0);
static TEAM: OnceLock<Team> = OnceLock::new();

thread_local! {
    /// Set while this thread runs a task (nested calls run serially).
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
    /// This thread's own team ([`TeamRef::use_on_this_thread`]); `None`: the
    /// process-wide one.
    static LOCAL: Cell<Option<&'static Team>> = const { Cell::new(None) };
}

/// A team of compute threads of its own size, for one engine of several. Teams live
/// as long as the process (an engine is never torn down before exit).
#[derive(Clone, Copy)]
pub struct TeamRef(&'static Team);

impl TeamRef {
    /// Starts a team of `n` threads (the caller included: `n − 1` helpers; `0` is 1).
    pub fn new(n: usize) -> Self {
        Self(Box::leak(Box::new(Team::start(n.max(1)))))
    }

    /// Threads of the team, the caller included.
    pub fn threads(&self) -> usize {
        self.0.helpers.len() + 1
    }

    /// Makes this the team of the calling thread: its kernels run on it from now on.
    pub fn use_on_this_thread(&self) {
        LOCAL.with(|l| l.set(Some(self.0)));
    }
}

/// Sets the team size (threads, the caller included). Only the first call before the
/// team's first use has an effect; returns the size the team has or will have.
pub fn set_threads(n: usize) -> usize {
    if TEAM.get().is_none() && n > 0 {
        REQUESTED.store(n, Ordering::SeqCst);
    }
    threads()
}

/// Threads of the calling thread's team (the caller included), at least 1.
pub fn threads() -> usize {
    if let Some(t) = LOCAL.with(Cell::get) {
        return t.helpers.len() + 1;
    }
    match TEAM.get() {
        Some(t) => t.helpers.len() + 1,
        None => match REQUESTED.load(Ordering::SeqCst) {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        },
    }
}

/// A job: `f(task)` for each task of the [`Segments`].
struct Job<'a> {
    f: &'a (dyn Fn(usize) + Sync),
}

struct Shared {
    /// Bumped once per job.
    epoch: AtomicU64,
    /// The current job (a `Job` on the caller's stack), null between jobs.
    job: AtomicPtr<Job<'static>>,
    /// Per team thread (the caller is 0, helper `i` is `i + 1`): its segment of the
    /// current job's tasks, `front << 32 | back` (`Segments`).
    segments: Segments,
    /// Helpers between noticing a job and being done with it.
    active: AtomicUsize,
    /// Per helper: parked (or about to park).
    sleeping: Vec<AtomicBool>,
    /// A task panicked on a helper during the current job.
    panicked: AtomicBool,
}

struct Team {
    shared: Arc<Shared>,
    helpers: Vec<Thread>,
    /// Held while a job runs.
    busy: AtomicBool,
}

/// The calling thread's team: its own, else the process-wide one (started on first use).
fn team() -> &'static Team {
    LOCAL
        .with(Cell::get)
        .unwrap_or_else(|| TEAM.get_or_init(|| Team::start(threads().max(1))))
}

impl Team {
    /// Starts `n − 1` helper threads (fewer when the system refuses one).
    fn start(n: usize) -> Self {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            segments: Segments((0..n).map(|_| AtomicU64::new(0)).collect()),
            active: AtomicUsize::new(0),
            sleeping: (1..n).map(|_| AtomicBool::new(false)).collect(),
            panicked: AtomicBool::new(false),
        });
        let mut helpers = Vec::with_capacity(n - 1);
        for i in 0..n - 1 {
            let s = shared.clone();
            match std::thread::Builder::new()
                .name(format!("inferd-compute-{}", i + 1))
                .spawn(move || helper(&s, i))
            {
                Ok(h) => helpers.push(h.thread().clone()),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a compute thread; using fewer");
                    break;
                }
            }
        }
        Team {
            shared,
            helpers,
            busy: AtomicBool::new(false),
        }
    }
}

fn helper(s: &Shared, me: usize) {
    let mut seen = 0u64;
    loop {
        let idle_since = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = s.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && idle_since.elapsed() > SPIN {
                s.sleeping[me].store(true, Ordering::SeqCst);
                if s.epoch.load(Ordering::SeqCst) == seen {
                    std::thread::park();
                }
                s.sleeping[me].store(false, Ordering::SeqCst);
            } else {
                std::hint::spin_loop();
            }
        }
        s.active.fetch_add(1, Ordering::SeqCst);
        let job = s.job.load(Ordering::SeqCst);
        if !job.is_null() {
            // SAFETY: the caller of `run` keeps the job alive until `active` is back to
            // 0 after it has cleared `job`; we counted ourselves in before loading it.
            let job = unsafe { &*job };
            IN_TASK.with(|f| f.set(true));
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                while let Some(t) = s.segments.claim(me + 1) {
                    (job.f)(t);
                }
            }));
            if result.is_err() {
                s.panicked.store(true, Ordering::SeqCst);
            }
            IN_TASK.with(|f| f.set(false));
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs `f(0) .. f(n_tasks − 1)` on the team and returns when all have finished. Tasks
/// may run in any order, on any team thread. A panicking task (a bug) makes `run` panic
/// on the caller once every thread is done with the job, as rayon does.
pub fn run(n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    if n_tasks == 0 {
        return;
    }
    let serial = n_tasks == 1 || IN_TASK.with(Cell::get) || threads() <= 1;
    let t = if serial { None } else { Some(team()) };
    let Some(t) = t.filter(|t| {
        !t.helpers.is_empty()
            && t.busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }) else {
        (0..n_tasks).for_each(f);
        return;
    };
    let s = &t.shared;
    let job = Job { f };
    s.segments.reset(n_tasks);
    // SAFETY (lifetime erasure): `job` outlives every use; see `Close` below.
    let ptr = (&job as *const Job<'_>).cast_mut().cast::<Job<'static>>();
    s.job.store(ptr, Ordering::SeqCst);
    s.epoch.fetch_add(1, Ordering::SeqCst);
    for (sleeping, h) in s.sleeping.iter().zip(&t.helpers) {
        if sleeping.load(Ordering::SeqCst) {
            h.unpark();
        }
    }
    /// Clears the job and waits for the helpers, also when a task panics.
    struct Close<'a>(&'a Team);
    impl Drop for Close<'_> {
        fn drop(&mut self) {
            let s = &self.0.shared;
            // Unclaimed tasks are no one's now; helpers arriving later see no job.
            s.job.store(std::ptr::null_mut(), Ordering::SeqCst);
            while s.active.load(Ordering::SeqCst) != 0 {
                std::hint::spin_loop();
            }
            IN_TASK.with(|c| c.set(false));
            self.0.busy.store(false, Ordering::Release);
        }
    }
    let close = Close(t);
    IN_TASK.with(|c| c.set(true));
    while let Some(i) = s.segments.claim(0) {
        f(i);
    }
    IN_TASK.with(|c| c.set(false));
    drop(close);
    if s.panicked.swap(false, Ordering::SeqCst) {
        panic!("a compute task panicked on a helper thread");
    }
}

/// A job's tasks split into one contiguous segment per team thread. Each thread takes
/// its own segment's tasks in order from the front, then takes the other segments'
/// from their backs. So a thread's tasks are consecutive (a decode step's weight rows
/// stream from memory in one run per thread, which the hardware prefetcher follows;
/// handing out tasks round-robin made each thread's reads jump: the default file's
/// decode step, first quartile, 5.0 -> 4.0 ms), and a thread slowed down by other load on the machine
/// still has its work taken by the others.
struct Segments(Vec<AtomicU64>);

impl Segments {
    fn pack(front: usize, back: usize) -> u64 {
        ((front as u64) << 32) | back as u64
    }

    fn unpack(v: u64) -> (usize, usize) {
        ((v >> 32) as usize, (v & u64::from(u32::MAX)) as usize)
    }

    /// Splits tasks `0..n_tasks` evenly, in order, over the segments.
    ///
    /// # Panics
    /// If `n_tasks` does not fit in 32 bits (a caller bug: jobs have thousands).
    fn reset(&self, n_tasks: usize) {
        assert!(u32::try_from(n_tasks).is_ok(), "{n_tasks} tasks in one job");
        let n = self.0.len();
        for (i, seg) in self.0.iter().enumerate() {
            seg.store(
                Self::pack(i * n_tasks / n, (i + 1) * n_tasks / n),
                Ordering::SeqCst,
            );
        }
    }

    /// The next task for team thread `me`: its own segment's front, else another
    /// segment's back; `None` when every task is taken.
    fn claim(&self, me: usize) -> Option<usize> {
        let n = self.0.len();
        let own = &self.0[me % n];
        let taken = own.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            let (f, b) = Self::unpack(v);
            (f < b).then(|| Self::pack(f + 1, b))
        });
        if let Ok(v) = taken {
            return Some(Self::unpack(v).0);
        }
        for d in 1..n {
            let seg = &self.0[(me + d) % n];
            let taken = seg.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                let (f, b) = Self::unpack(v);
                (f < b).then(|| Self::pack(f, b - 1))
            });
            if let Ok(v) = taken {
                return Some(Self::unpack(v).1 - 1);
            }
        }
        None
    }
}

/// Calls `f(i, chunk)` for every `chunk_len`-element chunk of `data` (the last may be
/// shorter) on the team.
pub fn for_each_chunk_mut<T: Send>(
    data: &mut [T],
    chunk_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let len = data.len();
    let chunk_len = chunk_len.max(1);
    let base = SendPtr(data.as_mut_ptr());
    run(len.div_ceil(chunk_len), &|i| {
        let start = i * chunk_len;
        let end = (start + chunk_len).min(len);
        // Capture the whole `SendPtr` (a closure would otherwise capture its raw field).
        #[allow(clippy::redundant_locals)]
        let base = base;
        // SAFETY: chunk `i` is `start..end` of `data`, disjoint from every other task's,
        // and `data` is exclusively borrowed for the duration of `run`.
        let chunk = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), end - start) };
        f(i, chunk);
    });
}

/// The columns `cols` of a row-major `(rows, n)` matrix, one task's to write
/// ([`for_each_column_block`]).
pub struct ColumnBlock<'a, T> {
    base: SendPtr<T>,
    n: usize,
    rows: usize,
    cols: std::ops::Range<usize>,
    _data: std::marker::PhantomData<&'a mut [T]>,
}

impl<T> ColumnBlock<'_, T> {
    /// Element `(0, cols.start)`, the row length `n`, the rows and the columns.
    pub(crate) fn raw_parts(&mut self) -> (*mut T, usize, usize, std::ops::Range<usize>) {
        // SAFETY: `cols.start < n` (a non-empty block) or the pointer is not read.
        let base = self.base.0.wrapping_add(self.cols.start);
        (base, self.n, self.rows, self.cols.clone())
    }

    /// Row `j`'s elements in this block's columns.
    ///
    /// # Panics
    /// If `j` is not below the matrix's row count.
    pub fn row_mut(&mut self, j: usize) -> &mut [T] {
        assert!(j < self.rows, "row {j} of {}", self.rows);
        // SAFETY: `j · n + cols` lies inside the matrix (checked by the caller of
        // `for_each_column_block`), and no other block has these columns.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.base.0.add(j * self.n + self.cols.start),
                self.cols.len(),
            )
        }
    }
}

/// Calls `f(cols, block)` on the team for the column ranges `cols` of `chunk` columns
/// (the last may be narrower) of the row-major `(data.len() / n, n)` matrix `data`.
///
/// # Panics
/// If `data.len()` is not a multiple of `n`.
pub fn for_each_column_block<T: Send>(
    data: &mut [T],
    n: usize,
    chunk: usize,
    f: impl Fn(std::ops::Range<usize>, &mut ColumnBlock<'_, T>) + Sync,
) {
    if n == 0 {
        return;
    }
    assert!(
        data.len().is_multiple_of(n),
        "{} values in rows of {n}",
        data.len()
    );
    let rows = data.len() / n;
    let chunk = chunk.max(1);
    let base = SendPtr(data.as_mut_ptr());
    run(n.div_ceil(chunk), &|i| {
        let cols = i * chunk..((i + 1) * chunk).min(n);
        #[allow(clippy::redundant_locals)]
        let base = base;
        let mut block = ColumnBlock {
            base,
            n,
            rows,
            cols: cols.clone(),
            _data: std::marker::PhantomData,
        };
        f(cols, &mut block);
    });
}

/// `[f(0), .., f(n − 1)]` computed on the team.
pub fn map<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
    for_each_chunk_mut(&mut out, 1, |i, slot| slot[0] = Some(f(i)));
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once_and_chunks_are_disjoint() {
        for n in [0usize, 1, 2, 7, 1000] {
            let mut v = vec![0u32; n];
            for_each_chunk_mut(&mut v, 3, |i, c| {
                for (j, x) in c.iter_mut().enumerate() {
                    *x += (i * 3 + j) as u32 + 1;
                }
            });
            assert!(
                v.iter().enumerate().all(|(i, &x)| x == i as u32 + 1),
                "n={n}"
            );
            let m = map(n, |i| i * i);
            assert_eq!(m, (0..n).map(|i| i * i).collect::<Vec<_>>());
        }
    }

    /// Segments hand out every task exactly once under concurrent claims, each thread's
    /// own tasks in ascending order from its segment's start, stolen ones from the
    /// others' ends.
    #[test]
    fn segments_claim_each_task_once_own_first() {
        for (threads, n_tasks) in [(1usize, 5usize), (2, 16), (3, 7), (4, 1000), (2, 1)] {
            let seg = Segments((0..threads).map(|_| AtomicU64::new(0)).collect());
            seg.reset(n_tasks);
            let claims: Vec<Vec<usize>> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..threads)
                    .map(|me| {
                        let seg = &seg;
                        sc.spawn(move || std::iter::from_fn(|| seg.claim(me)).collect())
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_default())
                    .collect()
            });
            let mut all: Vec<usize> = claims.concat();
            all.sort_unstable();
            assert_eq!(
                all,
                (0..n_tasks).collect::<Vec<_>>(),
                "{threads} x {n_tasks}"
            );
            for (me, c) in claims.iter().enumerate() {
                let start = me * n_tasks / threads;
                let own: Vec<usize> = c
                    .iter()
                    .copied()
                    .take_while(|&t| t >= start && t < (me + 1) * n_tasks / threads)
                    .collect();
                assert!(own.windows(2).all(|w| w[1] == w[0] + 1), "{own:?}");
                assert!(own.first().is_none_or(|&t| t == start), "{me}: {c:?}");
            }
            assert_eq!(seg.claim(0), None);
        }
        // One thread alone takes its own segment in order, then the others' from the back.
        let seg = Segments((0..2).map(|_| AtomicU64::new(0)).collect());
        seg.reset(6);
        let order: Vec<usize> = std::iter::from_fn(|| seg.claim(0)).collect();
        assert_eq!(order, [0, 1, 2, 5, 4, 3]);
    }

    #[test]
    fn nested_and_concurrent_calls_run() {
        let outer = map(8, |i| map(4, |j| i * 10 + j).iter().sum::<usize>());
        assert_eq!(outer[3], 30 * 4 + 6);
        let handles: Vec<_> = (0..4)
            .map(|k| std::thread::spawn(move || map(500, |i| i + k).iter().sum::<usize>()))
            .collect();
        for (k, h) in handles.into_iter().enumerate() {
            assert_eq!(h.join().ok(), Some(500 * 499 / 2 + 500 * k));
        }
    }

    /// A thread's own team sets its size and runs its jobs; other threads keep the
    /// process-wide team.
    #[test]
    fn a_thread_of_its_own_team_uses_it() {
        let (one, three) = (TeamRef::new(1), TeamRef::new(3));
        assert_eq!((one.threads(), three.threads()), (1, 3));
        let outside = threads();
        let sizes: Vec<(usize, u64)> = std::thread::scope(|sc| {
            [one, three]
                .map(|t| {
                    sc.spawn(move || {
                        t.use_on_this_thread();
                        let sum = map(1000, |i| i as u64).iter().sum::<u64>();
                        (threads(), sum)
                    })
                })
                .into_iter()
                .map(|h| h.join().unwrap_or_default())
                .collect()
        });
        assert_eq!(sizes, [(1, 499_500), (3, 499_500)]);
        assert_eq!(threads(), outside);
    }
}
