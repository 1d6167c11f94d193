//! Benchmarks and load generators. Each binary in `src/bin` prints the command it ran, medians
//! and p99 from HDR histograms; `bench/README.md` records the figures. The histogram helpers
//! are the ones `transfer_engine_bench` ([`engine`]) uses, so every report has the same shape.

pub use engine::{latency_histogram, record, summary};

pub mod engine;
pub mod openloop;
pub mod procs;

/// Splits command-line flag `arg` into its name and value: `--flag=value`, or `--flag value`
/// with the value taken from `argv[*next]` (then `*next` moves past it). Panics, naming the
/// flag, when the value is missing.
pub fn flag_value(arg: &str, argv: &[String], next: &mut usize) -> (String, String) {
    match arg.split_once('=') {
        Some((f, v)) => (f.to_string(), v.to_string()),
        None => {
            let v = argv
                .get(*next)
                .cloned()
                .unwrap_or_else(|| panic!("{arg} wants a value"));
            *next += 1;
            (arg.to_string(), v)
        }
    }
}
