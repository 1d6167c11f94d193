//! Benchmarks and load generators. Each binary in `src/bin` prints the command it ran, medians
//! and p99 from HDR histograms; `bench/README.md` records the figures.

use std::time::Duration;

use hdrhistogram::Histogram;

/// A latency histogram in microseconds, 1 µs to 60 s, 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = (d.as_micros() as u64).clamp(1, 60_000_000);
    h.record(us).expect("value within bounds");
}

/// `p50=.. p99=.. max=..` in microseconds.
pub fn summary(h: &Histogram<u64>) -> String {
    format!(
        "p50={}us p99={}us max={}us n={}",
        h.value_at_quantile(0.50),
        h.value_at_quantile(0.99),
        h.max(),
        h.len()
    )
}
