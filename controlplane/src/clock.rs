//! Time enters the master through [`Clock`], so tests move it by hand instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Milliseconds on a monotonic clock (the origin is arbitrary).
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// Milliseconds since the Unix epoch on the wall clock (0 if it reads before the epoch): for
/// the few values that must mean a date, not for deadlines.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The real monotonic clock.
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        // Start at 1 s so that "0" never looks like a fresh deadline.
        1000 + self.origin.elapsed().as_millis() as u64
    }
}

/// A clock tests advance explicitly.
#[derive(Default)]
pub struct ManualClock {
    now: AtomicU64,
}

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        ManualClock {
            now: AtomicU64::new(start_ms),
        }
    }

    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}
