//! Open-loop (fixed-rate) load: the schedule, and the two latencies every request gets.
//!
//! A closed-loop generator issues its next request when the previous one returns, so a stall
//! of the server slows the generator down too and the requests that *would* have been sent
//! during the stall are never measured ("coordinated omission"). Here every request has an
//! *intended* start time fixed before the run: request `k` of worker `w` of `n`, at an
//! aggregate rate `r` ops/s, is due at `(k * n + w) / r` seconds after the start. A worker
//! that falls behind sends its late requests at once, back to back, until it has caught up
//! with the schedule; it never skips one.
//!
//! Each request records two durations:
//! - *latency* = completion - intended start: what a caller arriving on schedule waits,
//!   queueing included. A stall of `d` counts for every request due during it.
//! - *service time* = completion - actual start: the operation alone.
//!
//! The difference between the two is time spent waiting behind earlier requests (or behind
//! the generator's own sleep overshoot). Time comes from a [`Clock`], so the arithmetic is
//! tested with a fake clock whose operations take exactly as long as the test says.
//!
//! Invariants: a worker issues every request due before the end of the run, whatever the
//! operations cost (a slow run ends late rather than short); every issued request is
//! recorded once in each histogram.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::{latency_histogram, record};

/// Where time comes from: the real clock in the benchmark, a fake one in tests.
pub trait Clock {
    /// Time since the run started.
    fn now(&self) -> Duration;
    /// Returns at `t` since the start, or at once when `t` has passed.
    fn sleep_until(&self, t: Duration);
}

/// The wall clock, started at construction.
pub struct RealClock {
    start: Instant,
}

/// Shorter waits than this are spun rather than slept: `nanosleep` on this VM overshoots by
/// 50-100 µs, which would show as latency.
const SPIN_BELOW: Duration = Duration::from_micros(100);

impl RealClock {
    pub fn starting_at(start: Instant) -> RealClock {
        RealClock { start }
    }
}

impl Clock for RealClock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn sleep_until(&self, t: Duration) {
        loop {
            let now = self.now();
            if now >= t {
                return;
            }
            let left = t - now;
            if left > SPIN_BELOW {
                std::thread::sleep(left - SPIN_BELOW);
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// One worker's share of a fixed aggregate rate.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// Aggregate requests per second over all workers.
    pub rate: f64,
    pub workers: usize,
    pub worker: usize,
    /// Requests due at or after this are not issued.
    pub duration: Duration,
}

impl Schedule {
    /// When this worker's request `k` is due.
    pub fn intended(&self, k: u64) -> Duration {
        let slot = k as f64 * self.workers as f64 + self.worker as f64;
        Duration::from_nanos((slot * 1e9 / self.rate).round() as u64)
    }
}

/// What one worker measured.
pub struct WorkerResult {
    pub latency: Histogram<u64>,
    pub service: Histogram<u64>,
    pub issued: u64,
    pub errors: u64,
    /// When the last request completed (since the start).
    pub finished: Duration,
}

/// Runs the schedule: waits for each request's intended start, runs `op(k)` and records both
/// durations. `op` returns whether the request succeeded; failures are timed like successes
/// and counted.
pub fn run_worker<C: Clock>(
    clock: &C,
    schedule: Schedule,
    mut op: impl FnMut(u64) -> bool,
) -> WorkerResult {
    let mut latency = latency_histogram();
    let mut service = latency_histogram();
    let mut errors = 0;
    let mut k = 0u64;
    loop {
        let due = schedule.intended(k);
        if due >= schedule.duration {
            break;
        }
        clock.sleep_until(due);
        let started = clock.now();
        if !op(k) {
            errors += 1;
        }
        let done = clock.now();
        record(&mut latency, done.saturating_sub(due));
        record(&mut service, done.saturating_sub(started));
        k += 1;
    }
    WorkerResult {
        latency,
        service,
        issued: k,
        errors,
        finished: clock.now(),
    }
}

/// The percentiles every report prints, as (label, quantile).
pub const REPORTED: [(&str, f64); 5] = [
    ("p50", 0.50),
    ("p90", 0.90),
    ("p99", 0.99),
    ("p99.9", 0.999),
    ("p99.99", 0.9999),
];

/// `p50=.. p90=.. p99=.. p99.9=.. p99.99=.. max=..` in microseconds.
pub fn percentiles(h: &Histogram<u64>) -> String {
    let mut s = String::new();
    for (label, q) in REPORTED {
        s.push_str(&format!("{label}={} ", h.value_at_quantile(q)));
    }
    s.push_str(&format!("max={} (us)", h.max()));
    s
}

/// Quantiles for a percentile-spectrum plot: from 0 to 1 - 10^-5 in steps of 0.05 on the
/// log10(1 / (1 - q)) axis, as HdrHistogram's plotter draws them.
pub fn spectrum_quantiles() -> Vec<f64> {
    (0..=100)
        .map(|i| 1.0 - 10f64.powf(-(i as f64) * 0.05))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Time moves only when the test says: sleeping jumps to the wake-up time, an operation
    /// advances the clock by its cost.
    struct FakeClock(Cell<Duration>);

    impl FakeClock {
        fn advance(&self, d: Duration) {
            self.0.set(self.0.get() + d);
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Duration {
            self.0.get()
        }
        fn sleep_until(&self, t: Duration) {
            if t > self.0.get() {
                self.0.set(t);
            }
        }
    }

    const MS: Duration = Duration::from_millis(1);
    const OP: Duration = Duration::from_micros(100);

    /// 1,000 requests at 1,000/s; every operation takes 100 µs, request `stall_at` (if any)
    /// takes `stall` instead.
    fn run(stall_at: Option<u64>, stall: Duration) -> WorkerResult {
        let clock = FakeClock(Cell::new(Duration::ZERO));
        let schedule = Schedule {
            rate: 1000.0,
            workers: 1,
            worker: 0,
            duration: Duration::from_secs(1),
        };
        run_worker(&clock, schedule, |k| {
            clock.advance(if Some(k) == stall_at { stall } else { OP });
            true
        })
    }

    #[test]
    fn without_stalls_latency_is_the_service_time() {
        let r = run(None, OP);
        assert_eq!(r.issued, 1000);
        assert_eq!(r.latency.len(), 1000);
        assert_eq!(r.latency.value_at_quantile(0.9999), 100);
        assert_eq!(r.service.value_at_quantile(0.9999), 100);
    }

    #[test]
    fn a_stall_counts_for_every_request_due_during_it() {
        // Request 100 takes 200 ms. The 199 requests due during the stall start late, then
        // run back to back (100 µs each) until the schedule is caught up, about 222 requests
        // after the stall: more than 20% of the run waited.
        let r = run(Some(100), 200 * MS);
        assert_eq!(r.issued, 1000, "the schedule does not skip requests");
        // Service time: one slow request in a thousand does not reach p99.
        assert_eq!(r.service.value_at_quantile(0.99), 100);
        assert!(r.service.max() >= 199_000);
        // Latency: the stall reaches p80 (request 100+j waits ~200 - 0.9j ms).
        let p80 = r.latency.value_at_quantile(0.80);
        assert!(p80 >= 10_000, "p80 {p80} us should show the queue");
        let p90 = r.latency.value_at_quantile(0.90);
        assert!(
            (100_000..=125_000).contains(&p90),
            "p90 {p90} us: the 100th-worst wait, ~110 ms"
        );
        assert!(r.latency.value_at_quantile(0.99) >= 180_000);
        // The request due right after the stall began waited for almost all of it.
        assert!(r.latency.max() >= 199_000);
        // Once caught up, waits are back to the service time.
        assert_eq!(r.latency.value_at_quantile(0.50), 100);
    }

    #[test]
    fn workers_share_the_rate_without_overlapping_slots() {
        let s = |worker| Schedule {
            rate: 1000.0,
            workers: 4,
            worker,
            duration: Duration::from_secs(1),
        };
        let mut due: Vec<Duration> = (0..4)
            .flat_map(|w| (0..250).map(move |k| s(w).intended(k)))
            .collect();
        due.sort();
        for (i, d) in due.iter().enumerate() {
            assert_eq!(d.as_micros(), i as u128 * 1000, "slot {i}");
        }
        // And a worker stops at the end of the run: slot 250 of worker 3 is past it.
        let clock = FakeClock(Cell::new(Duration::ZERO));
        let r = run_worker(&clock, s(3), |_| true);
        assert_eq!(r.issued, 250);
    }

    #[test]
    fn failures_are_timed_and_counted() {
        let clock = FakeClock(Cell::new(Duration::ZERO));
        let schedule = Schedule {
            rate: 100.0,
            workers: 1,
            worker: 0,
            duration: Duration::from_millis(100),
        };
        let r = run_worker(&clock, schedule, |k| {
            clock.advance(OP);
            k % 2 == 0
        });
        assert_eq!((r.issued, r.errors, r.latency.len()), (10, 5, 10));
    }

    #[test]
    fn spectrum_runs_from_zero_to_five_nines() {
        let q = spectrum_quantiles();
        assert_eq!(q[0], 0.0);
        assert!((q[20] - 0.9).abs() < 1e-12);
        assert!((q[100] - 0.99999).abs() < 1e-12);
        assert!(q.windows(2).all(|w| w[0] < w[1]));
    }
}
