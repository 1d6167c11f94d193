//! The stall detector: counts event-loop iterations whose work took longer than
//! [`LOOP_STALL_THRESHOLD`].
//!
//! An iteration is measured from the moment the wait in the kernel returns to the moment the
//! loop is ready to wait again, so time spent idle never counts. A stall means some
//! connection's completion sat in the queue that long: the number to watch when a
//! handler grows expensive. Counters are atomics in [`ServerStats`], written by the shard
//! only.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::limits::LOOP_STALL_THRESHOLD;
use crate::mem::served::ServerStats;

/// Per-shard state of the detector.
#[derive(Debug, Default)]
pub(crate) struct StallDetector {
    /// Longest iteration published so far, in microseconds.
    max_us: u64,
}

impl StallDetector {
    /// Records one iteration that did `busy` worth of work.
    pub(crate) fn record(&mut self, stats: &ServerStats, busy: Duration) {
        stats.loop_iterations.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(busy.as_micros()).unwrap_or(u64::MAX);
        if busy > LOOP_STALL_THRESHOLD {
            stats.loop_stalls.fetch_add(1, Ordering::Relaxed);
        }
        if us > self.max_us {
            self.max_us = us;
            stats.loop_stall_max_us.store(us, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_iterations_over_the_threshold() {
        let stats = ServerStats::default();
        let mut d = StallDetector::default();
        d.record(&stats, Duration::from_micros(10));
        d.record(&stats, LOOP_STALL_THRESHOLD);
        d.record(&stats, Duration::from_millis(3));
        d.record(&stats, Duration::from_micros(20));
        assert_eq!(stats.loop_iterations.load(Ordering::Relaxed), 4);
        assert_eq!(stats.loop_stalls.load(Ordering::Relaxed), 1);
        assert_eq!(stats.loop_stall_max_us.load(Ordering::Relaxed), 3000);
    }
}
