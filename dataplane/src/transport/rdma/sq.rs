//! Send-queue accounting with selective signalling (pure logic, no verbs calls).
//!
//! QPs are created with `sq_sig_all = 0`: a successful work request makes a completion only
//! if it was posted with `IBV_SEND_SIGNALED`. Its send-queue slot is freed when a *later or
//! equal* signalled completion is polled, because an RC send queue completes in order: a
//! completion for WR `k` means every WR posted before `k` on that QP has completed too, and
//! successfully (an error always makes a completion, and it would have come first).
//!
//! [`SendQueue`] keeps the outstanding WR ids in posting order and chooses which to signal:
//! every [`SendQueue::signal_every`]-th WR, and always the last WR of a post, so the queue
//! can never fill up with WRs that nothing will retire. After an error completion the QP is
//! in the error state and the rest are flushed: [`SendQueue::drain`] returns them.
//!
//! Invariant: `outstanding() <= depth`; [`SendQueue::plan`] never admits more than
//! [`SendQueue::free`] WRs.

use std::collections::VecDeque;

/// In-order accounting of one QP's send queue; see the module docs.
#[derive(Debug)]
pub struct SendQueue {
    depth: usize,
    signal_every: usize,
    posted: VecDeque<u64>,
    since_signal: usize,
}

/// What a completion did to the queue.
#[derive(Debug, PartialEq, Eq)]
pub struct Retired {
    /// WR ids retired, oldest first; the last one is the completed WR itself.
    pub ids: Vec<u64>,
}

impl SendQueue {
    /// A queue of `depth` slots (> 0) signalling at least every `signal_every` WRs (> 0).
    pub fn new(depth: usize, signal_every: usize) -> SendQueue {
        let depth = depth.max(1);
        SendQueue {
            depth,
            signal_every: signal_every.clamp(1, depth),
            posted: VecDeque::with_capacity(depth),
            since_signal: 0,
        }
    }

    /// WRs posted and not yet retired.
    pub fn outstanding(&self) -> usize {
        self.posted.len()
    }

    /// Slots free for new WRs.
    pub fn free(&self) -> usize {
        self.depth - self.posted.len()
    }

    /// The signalling interval.
    pub fn signal_every(&self) -> usize {
        self.signal_every
    }

    /// Admits the first `min(ids.len(), free())` of `ids` (in order) and returns the
    /// signalled flag of each admitted WR; the last admitted one is always signalled.
    pub fn plan(&mut self, ids: &[u64]) -> Vec<bool> {
        let n = ids.len().min(self.free());
        let mut flags = Vec::with_capacity(n);
        for (i, &id) in ids[..n].iter().enumerate() {
            self.since_signal += 1;
            let signal = i + 1 == n || self.since_signal >= self.signal_every;
            if signal {
                self.since_signal = 0;
            }
            self.posted.push_back(id);
            flags.push(signal);
        }
        flags
    }

    /// Forgets the last `n` admitted WRs (the library refused them at post time).
    pub fn unpost(&mut self, n: usize) {
        for _ in 0..n.min(self.posted.len()) {
            self.posted.pop_back();
        }
    }

    /// A completion for `wr_id` arrived: retires it and every WR posted before it. `None`
    /// if `wr_id` is not outstanding (a stale or foreign completion).
    pub fn retire(&mut self, wr_id: u64) -> Option<Retired> {
        let pos = self.posted.iter().position(|&id| id == wr_id)?;
        Some(Retired {
            ids: self.posted.drain(..=pos).collect(),
        })
    }

    /// Every outstanding WR, oldest first, emptying the queue (QP error or teardown).
    pub fn drain(&mut self) -> Vec<u64> {
        self.since_signal = 0;
        self.posted.drain(..).collect()
    }
}

/// Splits `len` bytes at `addr` into slices of at most `slice` bytes: `(offset, len)`.
pub fn slices(len: u64, slice: u64) -> impl Iterator<Item = (u64, u32)> {
    let slice = slice.clamp(1, u64::from(u32::MAX));
    let n = len.div_ceil(slice);
    (0..n).map(move |i| {
        let off = i * slice;
        (off, (len - off).min(slice) as u32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn last_of_a_post_and_every_kth_are_signalled() {
        let mut q = SendQueue::new(8, 3);
        let flags = q.plan(&[1, 2, 3, 4, 5]);
        assert_eq!(flags, vec![false, false, true, false, true]);
        assert_eq!(q.outstanding(), 5);
        assert_eq!(q.free(), 3);
        // Only three fit.
        assert_eq!(q.plan(&[6, 7, 8, 9]), vec![false, false, true]);
        assert_eq!(q.free(), 0);
        assert!(q.plan(&[10]).is_empty());
        // Completion of 3 retires 1..=3.
        assert_eq!(q.retire(3).unwrap().ids, vec![1, 2, 3]);
        assert!(q.retire(2).is_none(), "already retired");
        assert_eq!(q.retire(8).unwrap().ids, vec![4, 5, 6, 7, 8]);
        assert_eq!(q.outstanding(), 0);
    }

    #[test]
    fn drain_and_unpost() {
        let mut q = SendQueue::new(4, 4);
        q.plan(&[1, 2, 3]);
        q.unpost(1);
        assert_eq!(q.drain(), vec![1, 2]);
        assert_eq!(q.free(), 4);
    }

    #[test]
    fn slicing_covers_the_range() {
        let v: Vec<_> = slices(10, 4).collect();
        assert_eq!(v, vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!(slices(0, 4).count(), 0);
        assert_eq!(slices(3, 0).count(), 3);
    }

    proptest! {
        /// Whatever the posting pattern, a queue never holds more than its depth, and each
        /// post's last admitted WR is signalled, and no run of unsignalled WRs is longer than
        /// the interval.
        #[test]
        fn never_overfills_and_always_retirable(
            depth in 1usize..64, every in 1usize..64,
            posts in proptest::collection::vec(0usize..40, 1..30),
        ) {
            let mut q = SendQueue::new(depth, every);
            let mut next = 0u64;
            let mut run = 0usize;
            for n in posts {
                let ids: Vec<u64> = (next..next + n as u64).collect();
                let flags = q.plan(&ids);
                prop_assert!(q.outstanding() <= depth);
                if let Some(last) = flags.last() { prop_assert!(*last); }
                for (k, f) in flags.iter().enumerate() {
                    if *f {
                        run = 0;
                        // retiring at a signalled id frees everything before it
                        if k + 1 == flags.len() {
                            let r = q.retire(next + k as u64).unwrap();
                            prop_assert_eq!(*r.ids.last().unwrap(), next + k as u64);
                        }
                    } else {
                        run += 1;
                        prop_assert!(run < q.signal_every());
                    }
                }
                prop_assert_eq!(q.outstanding(), 0);
                next += flags.len() as u64;
            }
        }
    }
}
