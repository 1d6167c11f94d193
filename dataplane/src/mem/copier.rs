//! Large copies shared with helper threads: a put's or a get's bytes, copied by the calling
//! thread and, from [`WIDE_MIN`] bytes up, by idle helpers beside it.
//!
//! A store client's same-host put or get is one memcpy between the caller's buffer and a
//! segment (`client::store::peers`). One core copies 4 MiB in about 0.3 ms on this project's
//! machines while the other cores wait, and the call's fixed cost (the master and the node,
//! asleep on those other cores, each woken once) comes after it. Two cores copy it in about
//! a third of that when the source is cached (each core reads its half out of its own L2)
//! and in two thirds when it is not (`bench/README.md`, "Copies shared with a helper").
//!
//! How: a copy of [`WIDE_MIN`] bytes or more is cut into [`CHUNK`]-byte pieces (a smaller
//! one, or one whose source overlaps its destination, the caller copies alone, as before).
//! The caller publishes them as a job, wakes the helpers and copies pieces itself, claiming
//! each with one atomic increment; a helper that wakes in time claims pieces too. The caller then waits only for pieces a
//! helper claimed and is still copying (at most one chunk each). A helper that wakes late
//! finds every piece claimed and goes back to sleep, so a busy machine makes the copy no
//! slower than the caller alone, plus one futex wake.
//!
//! Lingering: after a job a helper stays awake for `MC_STORE_COPY_LINGER_US` (default 150 µs;
//! 0: back to sleep at once), yielding its core to anything runnable, and takes the next job
//! without a wake-up if one comes. What a put does right after its copy is wake the node (the
//! catalog record) and the master (`PutEnd`), whose threads often sleep on the helper's core;
//! on a VM, a halted vCPU takes tens of microseconds to wake and a running one a context
//! switch. Measured: warm 4 MiB puts 68-77% of the hot memcpy without lingering and 81-91%
//! with it, for about 0.03 ms more CPU per put (`bench/README.md`). A batch's next copy also
//! finds the helper awake.
//!
//! Helpers: `MC_STORE_COPY_THREADS` (default: one fewer than the CPUs this process may run
//! on, at most 3; 0 turns sharing off), started on the first wide copy, asleep on a condition
//! variable while there is no job. In a child forked after they started there are none:
//! the pool notices the pid changed and the caller copies alone, never touching the
//! parent's lock.
//!
//! Soundness: a job carries its ranges as bare addresses so that helper threads may hold it
//! past the call; the caller returns only once every piece is copied, and a piece is copied
//! only by whoever claimed it, so no range is touched after the call's borrows end. Each
//! piece's copy ends with its stores fenced ([`Src::stream_to`] fences, a memcpy's stores are
//! ordered by the release increment that reports it done), and the caller's acquire load
//! of the count orders every byte before whatever it does next.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{Dst, Src};

/// The smallest copy shared with helpers: below it a helper's wake-up (tens of microseconds
/// on a VM whose other vCPU is halted) is as long as the copy.
pub const WIDE_MIN: usize = 1 << 20;

/// The piece a thread claims at a time: 16 per 4 MiB, so a helper that wakes late still
/// finds work, and the caller waits at most one piece's copy for the last helper.
pub const CHUNK: usize = 256 << 10;

/// The most helpers `MC_STORE_COPY_THREADS` may ask for.
pub const HELPERS_MAX: usize = 16;

/// How each piece is copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// [`Src::copy_to`]: a memcpy, for bytes this process reads next or fresh pages.
    Plain,
    /// [`Src::stream_to`]: past the cache, into resident pages another process reads.
    Stream,
    /// [`Dst::map_ahead`] on the piece, then [`Src::stream_to`]: into a peer's resident
    /// pages this process has not mapped yet.
    MapAheadStream,
}

/// Copies each `(src, dst)` pair (`src` no longer than `dst`; panics otherwise, before any
/// byte moves) the given way, with the helpers when they add up to [`WIDE_MIN`] bytes or
/// more. Returns once every byte is copied.
pub fn copy_all(pairs: Vec<(Src<'_>, Dst<'_>)>, way: Way) {
    for (s, d) in &pairs {
        s.assert_fits(d);
    }
    let total: usize = pairs.iter().map(|(s, _)| s.len()).sum();
    // A source overlapping its own destination (raw ranges do not rule it out) is copied by
    // the caller alone, in order, as `copy_to` and `stream_to` copy it.
    let overlapping = pairs.iter().any(|(s, d)| s.overlaps(d));
    let pool = if total >= WIDE_MIN && !overlapping {
        pool()
    } else {
        None
    };
    let Some(pool) = pool else {
        for (s, mut d) in pairs {
            copy_one(s, &mut d, way);
        }
        return;
    };
    let pieces: Vec<Piece> = pairs
        .into_iter()
        .flat_map(|(s, mut d)| {
            let d = d.as_mut_ptr() as usize;
            let base = s.as_ptr() as usize;
            s.chunks(CHUNK).map(move |c| Piece {
                src: c.as_ptr() as usize,
                dst: d + (c.as_ptr() as usize - base),
                len: c.len(),
            })
        })
        .collect();
    let job = Arc::new(Job {
        pieces,
        way,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
    });
    pool.offer(&job);
    job.work();
    job.wait_done();
}

/// Copies `src` into `dst` the given way.
fn copy_one(src: Src<'_>, dst: &mut Dst<'_>, way: Way) {
    match way {
        Way::Plain => src.copy_to(dst),
        Way::Stream => src.stream_to(dst),
        Way::MapAheadStream => {
            dst.map_ahead();
            src.stream_to(dst);
        }
    }
}

/// Pieces helper threads copied in this process so far.
pub fn pieces_helped() -> u64 {
    HELPED.load(Ordering::Relaxed)
}

static HELPED: AtomicU64 = AtomicU64::new(0);

/// One piece of a job, its ranges as bare addresses (module docs, "Soundness").
#[derive(Clone, Copy)]
struct Piece {
    src: usize,
    dst: usize,
    len: usize,
}

struct Job {
    pieces: Vec<Piece>,
    way: Way,
    /// The next piece to claim; at or past `pieces.len()` once all are claimed.
    next: AtomicUsize,
    /// Pieces copied.
    done: AtomicUsize,
}

impl Job {
    /// Claims and copies pieces until none is left; returns how many it copied.
    fn work(&self) -> u64 {
        let mut copied = 0;
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(p) = self.pieces.get(i) else {
                return copied;
            };
            // SAFETY: the piece lies inside a pair `copy_all` was given: its source readable
            // and its destination writable until `copy_all` returns, which it does only once
            // `done` counts this piece; no one else copies it (the claim above is unique),
            // and a piece's source does not overlap its destination (`copy_all` copies such
            // pairs itself).
            let (src, mut dst) = unsafe {
                (
                    Src::from_raw(p.src as *const u8, p.len),
                    Dst::from_raw(p.dst as *mut u8, p.len),
                )
            };
            copy_one(src, &mut dst, self.way);
            self.done.fetch_add(1, Ordering::Release);
            copied += 1;
        }
    }

    fn exhausted(&self) -> bool {
        self.next.load(Ordering::Relaxed) >= self.pieces.len()
    }

    /// Waits for the pieces helpers claimed and are still copying: spins (each is at most
    /// one [`CHUNK`], some microseconds), yielding the core after 50 µs in case the helper
    /// was preempted.
    fn wait_done(&self) {
        let since = Instant::now();
        while self.done.load(Ordering::Acquire) < self.pieces.len() {
            if since.elapsed() < Duration::from_micros(50) {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// The helper threads and the jobs offered to them.
struct Pool {
    /// The process that started the helpers (a forked child has none).
    pid: u32,
    jobs: Mutex<Vec<Arc<Job>>>,
    wake: Condvar,
    /// Jobs offered so far: a lingering helper watches it for the next.
    offered: AtomicU64,
}

/// How long a helper stays awake after a job (`MC_STORE_COPY_LINGER_US`, default
/// [`LINGER_DEFAULT_US`]; 0: straight back to sleep). Module docs, "Lingering".
fn linger() -> Duration {
    static L: OnceLock<Duration> = OnceLock::new();
    *L.get_or_init(|| protocol::env::micros("MC_STORE_COPY_LINGER_US", LINGER_DEFAULT_US))
}

/// The default of `MC_STORE_COPY_LINGER_US`: about the rest of a put after its copy.
pub const LINGER_DEFAULT_US: u64 = 150;

impl Pool {
    fn offer(&self, job: &Arc<Job>) {
        if self.pid != std::process::id() {
            return;
        }
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.retain(|j| !j.exhausted());
        jobs.push(Arc::clone(job));
        drop(jobs);
        self.offered.fetch_add(1, Ordering::Release);
        self.wake.notify_all();
    }

    fn help(&self) {
        loop {
            let job = {
                let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    jobs.retain(|j| !j.exhausted());
                    if let Some(j) = jobs.first() {
                        break Arc::clone(j);
                    }
                    jobs = self.wake.wait(jobs).unwrap_or_else(|p| p.into_inner());
                }
            };
            HELPED.fetch_add(job.work(), Ordering::Relaxed);
            // Linger: stay awake, giving the core to anything runnable, until the next job
            // or the time is up (module docs).
            let seen = self.offered.load(Ordering::Acquire);
            let until = Instant::now() + linger();
            while Instant::now() < until && self.offered.load(Ordering::Acquire) == seen {
                std::thread::yield_now();
            }
        }
    }
}

/// The helpers `MC_STORE_COPY_THREADS` asks for (module docs), at most [`HELPERS_MAX`].
pub fn helpers_wanted() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let default = cpus.saturating_sub(1).min(3);
    match std::env::var("MC_STORE_COPY_THREADS") {
        Ok(raw) => match raw.trim().parse::<usize>() {
            Ok(n) => n.min(HELPERS_MAX),
            Err(_) => {
                tracing::warn!("MC_STORE_COPY_THREADS={raw:?} is not a count; using {default}");
                default
            }
        },
        Err(_) => default,
    }
}

/// The pool, its helpers started on first use; `None` when no helper is wanted.
fn pool() -> Option<&'static Pool> {
    static POOL: OnceLock<Option<&'static Pool>> = OnceLock::new();
    *POOL.get_or_init(|| {
        let n = helpers_wanted();
        if n == 0 {
            return None;
        }
        let pool: &'static Pool = Box::leak(Box::new(Pool {
            pid: std::process::id(),
            jobs: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            offered: AtomicU64::new(0),
        }));
        let mut started = 0;
        for i in 0..n {
            let spawned = std::thread::Builder::new()
                .name(format!("mc-copy-{i}"))
                .spawn(move || pool.help());
            match spawned {
                Ok(_) => started += 1,
                Err(e) => tracing::warn!("copy helper {i} did not start: {e}"),
            }
        }
        (started > 0).then_some(pool)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn every_way_copies_every_byte_of_every_pair_and_nothing_else() {
        // Two sources whose sum is past `WIDE_MIN` (shared with helpers), one of them not a
        // whole number of chunks, written into one destination with slack on both sides.
        let a = pattern(WIDE_MIN + 12_345, 1);
        let b = pattern(3 * CHUNK + 7, 2);
        for way in [Way::Plain, Way::Stream, Way::MapAheadStream] {
            let mut out = vec![0xEEu8; 64 + a.len() + b.len() + 64];
            let (_, rest) = Dst::from(&mut out[..]).split_at(64);
            let (da, rest) = rest.split_at(a.len());
            let (db, _) = rest.split_at(b.len());
            copy_all(vec![(Src::from(&a[..]), da), (Src::from(&b[..]), db)], way);
            assert!(out[..64].iter().all(|&x| x == 0xEE), "{way:?}");
            assert_eq!(&out[64..64 + a.len()], &a[..], "{way:?}");
            assert_eq!(
                &out[64 + a.len()..64 + a.len() + b.len()],
                &b[..],
                "{way:?}"
            );
            assert!(
                out[64 + a.len() + b.len()..].iter().all(|&x| x == 0xEE),
                "{way:?}"
            );
        }
    }

    #[test]
    fn helpers_take_pieces_of_wide_copies() {
        if helpers_wanted() == 0 {
            return; // one CPU, or MC_STORE_COPY_THREADS=0: nothing to share with
        }
        let src = pattern(4 * WIDE_MIN, 7);
        let mut out = vec![0u8; src.len()];
        let before = pieces_helped();
        let deadline = Instant::now() + Duration::from_secs(10);
        while pieces_helped() == before {
            assert!(Instant::now() < deadline, "no helper took a piece in 10 s");
            copy_all(
                vec![(Src::from(&src[..]), Dst::from(&mut out[..]))],
                Way::Plain,
            );
            assert!(out == src);
        }
    }

    #[test]
    fn small_copies_and_empty_pairs_stay_with_the_caller() {
        let a = pattern(1000, 3);
        let mut out = vec![0u8; 1000];
        copy_all(
            vec![
                (Src::empty(), Dst::from(&mut [][..])),
                (Src::from(&a[..]), Dst::from(&mut out[..])),
            ],
            Way::Plain,
        );
        assert_eq!(out, a);
        copy_all(Vec::new(), Way::Stream);
    }

    #[test]
    fn many_callers_at_once_each_get_their_own_bytes() {
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                std::thread::spawn(move || {
                    let src = pattern(2 * WIDE_MIN + 99, t);
                    for _ in 0..20 {
                        let mut out = vec![0u8; src.len()];
                        copy_all(
                            vec![(Src::from(&src[..]), Dst::from(&mut out[..]))],
                            Way::Stream,
                        );
                        assert!(out == src, "caller {t} got other bytes");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn a_source_overlapping_its_destination_is_moved_as_memmove_does() {
        let n = WIDE_MIN + 4096;
        let mut buf = pattern(n + 100, 5);
        let want: Vec<u8> = buf[..n].to_vec();
        let p = buf.as_mut_ptr();
        // SAFETY: both ranges lie inside `buf`, which nothing else touches meanwhile.
        let (src, dst) = unsafe { (Src::from_raw(p, n), Dst::from_raw(p.add(100), n)) };
        copy_all(vec![(src, dst)], Way::Stream);
        assert!(buf[100..] == want[..]);
    }

    #[test]
    #[should_panic(expected = "bytes into a")]
    fn a_short_destination_panics_before_copying() {
        let a = pattern(100, 0);
        let mut out = [0u8; 99];
        copy_all(
            vec![(Src::from(&a[..]), Dst::from(&mut out[..]))],
            Way::Plain,
        );
    }
}
