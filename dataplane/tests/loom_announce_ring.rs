//! loom model of a same-host importer's announcement ring (`src/mem/shm/ring.rs`): the
//! writer (`Ring::push`) and the reader (`Ring::read_into`) in another process, sharing the
//! head, the tail and the data. Run: `RUSTFLAGS="--cfg loom" cargo test -p mooncake-dataplane
//! --release --test loom_announce_ring` (docs/HACKING.md).
//!
//! A model of the protocol, not the real type: the real ring lives in a memfd two processes
//! map, which loom cannot see. The steps, atomics and orderings are the real ones, in the real
//! order, on a ring of 3 bytes (the real one is 256 KiB): the writer loads the tail (acquire)
//! for the room left, copies its frame in, stores the new head (release); the reader loads the
//! head (acquire), copies the bytes out, stores the tail (release). Each data byte is a
//! `loom::cell::UnsafeCell`: loom fails the test if a byte's write by the writer and its read
//! by the reader are not ordered by happens-before in some interleaving, i.e. if the reader
//! could see a frame before it was whole, or the writer could reuse room the reader was still
//! copying out of. The content check catches a frame read out of order or torn.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;

const CAP: u64 = 3;

struct Ring {
    head: AtomicU64,
    tail: AtomicU64,
    data: [UnsafeCell<u8>; CAP as usize],
}

impl Ring {
    /// `Ring::push`: false when the frame does not fit beside the unread bytes.
    fn push(&self, frame: &[u8], acquire_tail: bool) -> bool {
        let head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(if acquire_tail {
            Ordering::Acquire
        } else {
            Ordering::Relaxed
        });
        if frame.len() as u64 > CAP - (head - tail) {
            return false;
        }
        for (k, &b) in frame.iter().enumerate() {
            let at = ((head + k as u64) % CAP) as usize;
            // SAFETY: what the model checks: nobody reads this byte until the head covers it.
            self.data[at].with_mut(|p| unsafe { *p = b });
        }
        self.head
            .store(head + frame.len() as u64, Ordering::Release);
        true
    }

    /// `Ring::read_into`, with the reader's own count `read`.
    fn read_into(&self, read: &mut u64, out: &mut Vec<u8>) {
        let head = self.head.load(Ordering::Acquire);
        assert!(head >= *read && head - *read <= CAP, "head out of bounds");
        for n in *read..head {
            // SAFETY: what the model checks: the writer published this byte and does not
            // reuse it until the tail passes it.
            out.push(self.data[(n % CAP) as usize].with(|p| unsafe { *p }));
        }
        *read = head;
        self.tail.store(head, Ordering::Release);
    }
}

/// Two frames of 2 bytes through a ring of 3, so the second wraps onto the first's room.
fn model(acquire_tail: bool) {
    let mut builder = loom::model::Builder::new();
    // Two spinning threads: bounding preemptions keeps the search to seconds, and a bug of
    // these orderings needs one or two.
    builder.preemption_bound = Some(3);
    builder.check(move || {
        let ring = Arc::new(Ring {
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            data: std::array::from_fn(|_| UnsafeCell::new(0)),
        });
        let frames: [[u8; 2]; 2] = [[1, 2], [3, 4]];
        let writer = {
            let ring = ring.clone();
            thread::spawn(move || {
                for f in &frames {
                    while !ring.push(f, acquire_tail) {
                        thread::yield_now(); // the real writer wakes the reader and sleeps
                    }
                }
            })
        };
        let mut read = 0;
        let mut got = Vec::new();
        while got.len() < 4 {
            ring.read_into(&mut read, &mut got);
            thread::yield_now(); // the real reader polls every few ms
        }
        writer.join().unwrap();
        assert_eq!(got, [1, 2, 3, 4]);
    });
}

#[test]
fn loom_announce_ring_frames_arrive_whole_and_room_is_reused_only_once_read() {
    model(true);
}

/// With the tail loaded relaxed, the writer may reuse room before the reader's copy out of it
/// happened-before its write: loom must find that interleaving.
#[test]
#[should_panic]
fn loom_announce_ring_without_acquiring_the_tail_is_caught() {
    model(false);
}
