//! Benchmarks and load generators. Each binary in `src/bin` prints the command it ran, medians
//! and p99 from HDR histograms; `bench/README.md` records the figures. The histogram helpers
//! are the ones `transfer_engine_bench` (in `dataplane::engine::bench`) uses, so every report
//! has the same shape.

pub use dataplane::engine::bench::{latency_histogram, record, summary};

pub mod openloop;
pub mod procs;
