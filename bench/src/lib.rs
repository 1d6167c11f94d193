//! Benchmarks and load generators. Each binary in `src/bin` prints the command it ran, medians
//! and p99 from HDR histograms; `bench/README.md` records the figures. The histogram helpers
//! are the ones `transfer_engine_bench` ([`engine`]) uses, so every report has the same shape.

pub use engine::{latency_histogram, record, summary};

pub mod engine;
pub mod openloop;
pub mod procs;

/// Prints `usage` and exits 0 when the command line asks for help (`--help`, `-h`); every
/// benchmark binary calls it before it parses its flags.
pub fn help(usage: &str) {
    if std::env::args().skip(1).any(|a| a == "--help" || a == "-h") {
        println!("{}", usage.trim());
        std::process::exit(0);
    }
}

/// Ends the program on a bad command line: `why` and a pointer to `--help`, exit status 2
/// (no panic, no backtrace).
pub fn usage_error(why: impl std::fmt::Display) -> ! {
    eprintln!("{why} (--help for usage)");
    std::process::exit(2)
}

/// This program's command line as `(flag, value)` pairs, in order: `--flag=value` or
/// `--flag value` ([`flag_value`]); a flag named in `switches` stands alone, with an empty
/// value. A missing value ends the program with a usage error naming the flag.
pub fn flags(switches: &[&str]) -> Vec<(String, String)> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < argv.len() {
        let arg = &argv[i];
        i += 1;
        if switches.contains(&arg.as_str()) {
            out.push((arg.clone(), String::new()));
        } else {
            out.push(flag_value(arg, &argv, &mut i));
        }
    }
    out
}

/// `v`, the value of `flag`, as a number; otherwise a usage error naming both.
pub fn number<T: std::str::FromStr>(flag: &str, v: &str) -> T {
    v.parse()
        .unwrap_or_else(|_| usage_error(format_args!("{flag} wants a number, got {v:?}")))
}

/// Splits command-line flag `arg` into its name and value: `--flag=value`, or `--flag value`
/// with the value taken from `argv[*next]` (then `*next` moves past it). A missing value ends
/// the program with a usage error naming the flag.
fn flag_value(arg: &str, argv: &[String], next: &mut usize) -> (String, String) {
    match arg.split_once('=') {
        Some((f, v)) => (f.to_string(), v.to_string()),
        None => {
            let v = argv
                .get(*next)
                .cloned()
                .unwrap_or_else(|| usage_error(format_args!("{arg} wants a value")));
            *next += 1;
            (arg.to_string(), v)
        }
    }
}
