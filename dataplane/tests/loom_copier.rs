//! loom model of the claim-and-count protocol of `dataplane::mem::copier` (`copy_all`,
//! `Job::work`, `Job::wait_done`). Run: `RUSTFLAGS="--cfg loom" cargo test -p
//! mooncake-dataplane --release --test loom_copier` (docs/HACKING.md).
//!
//! A model, not the real type: the real job holds raw addresses into caller memory, which loom
//! cannot watch. Here each piece's destination is a `loom::cell::UnsafeCell`; the steps,
//! atomics and orderings are the real ones, in the real order: a piece is claimed with a
//! relaxed `fetch_add` on `next`, written, and counted with a release `fetch_add` on `done`;
//! the caller claims pieces too, then waits with acquire loads until `done` counts them all,
//! and then the call returns and the memory is the caller's again (read, then written: a put's
//! caller reuses its buffer, the segment's range is freed and rewritten). loom fails the test
//! if some interleaving lets a helper's write race with those accesses, or a piece be written
//! twice, or the caller return before a piece is written. (With the count's release and
//! acquire weakened to relaxed it reports "Concurrent write accesses to `UnsafeCell`".)
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

const PIECES: usize = 3;

struct Job {
    next: AtomicUsize,
    done: AtomicUsize,
    dst: Vec<UnsafeCell<u64>>,
}

impl Job {
    /// `Job::work`: claims and writes pieces until none is left.
    fn work(&self, by: u64) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(cell) = self.dst.get(i) else {
                return;
            };
            // A piece is written once: it was never written before its claim.
            // SAFETY (model): loom checks that this access is ordered with every other.
            cell.with_mut(|p| unsafe {
                assert_eq!(*p, 0, "piece {i} written twice");
                *p = 100 + by;
            });
            self.done.fetch_add(1, Ordering::Release);
        }
    }

    /// `Job::wait_done`.
    fn wait_done(&self) {
        while self.done.load(Ordering::Acquire) < self.dst.len() {
            thread::yield_now();
        }
    }
}

#[test]
fn the_caller_returns_only_after_every_piece_and_no_helper_touches_memory_after() {
    loom::model(|| {
        let job = Arc::new(Job {
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            dst: (0..PIECES).map(|_| UnsafeCell::new(0)).collect(),
        });
        // A helper that holds the job (it was offered), perhaps past the call.
        let helper = {
            let job = Arc::clone(&job);
            thread::spawn(move || job.work(2))
        };
        job.work(1);
        job.wait_done();
        // The call returned: the caller's memory is its own again.
        for cell in &job.dst {
            // SAFETY (model): as above.
            cell.with_mut(|p| unsafe {
                assert!(*p == 101 || *p == 102, "a piece was not written");
                *p = 0;
            });
        }
        helper.join().unwrap();
    });
}
