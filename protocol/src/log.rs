//! The one logging set-up of every mooncake-rs process: `mooncake_master`, `mooncake_client`,
//! `mooncake_http_metadata_server` and the Python module (`mooncake._native`). Before it each
//! built its own `tracing` subscriber and they disagreed (the Python one ignored `RUST_LOG`,
//! the master always wrote colour codes, the metadata server printed targets).
//!
//! Why here, in `protocol` (behind the `logging` feature): it is the only crate that the master
//! (`controlplane`), the storage node (`client`) and the Python module all depend on
//! (`dataplane` is not below `controlplane`), and it already owns the reading of upstream's
//! level variables ([`crate::env::log_level`]). The feature keeps `tracing-subscriber` and the
//! writing to stdout/stderr out of the crate's default build, so `protocol` stays free of I/O
//! for a user of the wire formats alone.
//!
//! The filter, first match wins (for [`Level::Default`]):
//! 1. `RUST_LOG`, when set and a valid `tracing` filter (`info`, `client=debug,warn`, ...);
//! 2. `MC_YLT_LOG_LEVEL`, a level name (`critical` reads as `error`);
//! 3. `MC_LOG_LEVEL`: `0` info, `1` warn, `2`/`3` error, or a level name or filter;
//! 4. the caller's default (`info` for the programs, `warn` for the Python module).
//!
//! A malformed value falls back to the next one down instead of stopping the program, as
//! upstream treats its variables. [`Level::Fixed`] (a command-line flag) reads none of them.

use std::io::IsTerminal;

use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::EnvFilter;

/// Where the level comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level<'a> {
    /// The environment (see the module doc), else this filter.
    Default(&'a str),
    /// Exactly this filter, whatever the environment says: a level given on the command line.
    Fixed(&'a str),
}

/// The stream the log lines go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// Standard output (`mooncake_master`, as it always has).
    Stdout,
    /// Standard error, so stdout keeps a program's machine-readable lines or a Python
    /// program's own output.
    Stderr,
}

/// Whether the lines carry ANSI colour codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ansi {
    /// Only when the chosen stream is a terminal, so log files and captured output stay plain.
    IfTerminal,
    /// Never.
    Never,
}

/// The filter [`init_logging`] installs for `level`, as a string (for a program that reports
/// its level).
pub fn filter_for(level: Level<'_>) -> String {
    filter_from(level, |name| std::env::var(name).ok())
}

/// [`filter_for`] with the variables read through `var`: the environment is read once, at the
/// edge, so tests pass a map instead of changing the process's environment under other tests.
pub fn filter_from(level: Level<'_>, var: impl Fn(&str) -> Option<String>) -> String {
    let valid = |s: &str| EnvFilter::try_new(s).is_ok();
    match level {
        Level::Fixed(f) => f.to_string(),
        Level::Default(default) => {
            if let Some(rust_log) = var(EnvFilter::DEFAULT_ENV) {
                if !rust_log.trim().is_empty() && valid(&rust_log) {
                    return rust_log;
                }
            }
            let named = crate::env::log_level_from(default, var);
            if valid(&named) {
                named
            } else {
                default.to_string()
            }
        }
    }
}

/// Installs the process-wide `tracing` subscriber once; later calls (a second program run in
/// the same process, the Python module imported after a program started) change nothing and
/// return false. Lines have no target (module path), as upstream's logs have none.
pub fn init_logging(level: Level<'_>, writer: Writer, ansi: Ansi) -> bool {
    let filter = EnvFilter::try_new(filter_for(level)).unwrap_or_else(|_| EnvFilter::new("info"));
    let terminal = match writer {
        Writer::Stdout => std::io::stdout().is_terminal(),
        Writer::Stderr => std::io::stderr().is_terminal(),
    };
    let make_writer = match writer {
        Writer::Stdout => BoxMakeWriter::new(std::io::stdout),
        Writer::Stderr => BoxMakeWriter::new(std::io::stderr),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(make_writer)
        .with_ansi(ansi == Ansi::IfTerminal && terminal)
        .with_target(false)
        .try_init()
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The variables come from a map, not the process environment, so this test cannot race
    /// the other tests of the crate (running in parallel threads) over them.
    #[test]
    fn precedence() {
        let mut env = std::collections::HashMap::<&str, &str>::new();
        let filter = |env: &std::collections::HashMap<&str, &str>, level| {
            filter_from(level, |k| env.get(k).map(|v| v.to_string()))
        };
        assert_eq!(filter(&env, Level::Default("warn")), "warn");
        assert_eq!(filter(&env, Level::Fixed("debug")), "debug");
        env.insert("MC_LOG_LEVEL", "2");
        assert_eq!(filter(&env, Level::Default("warn")), "error");
        env.insert("MC_YLT_LOG_LEVEL", "critical");
        env.insert("MC_LOG_LEVEL", "0");
        assert_eq!(filter(&env, Level::Default("warn")), "error");
        env.insert("RUST_LOG", "client=debug,info");
        assert_eq!(filter(&env, Level::Default("warn")), "client=debug,info");
        assert_eq!(filter(&env, Level::Fixed("trace")), "trace");
        // A malformed value falls through to the next source.
        env.insert("RUST_LOG", "=[bad");
        assert_eq!(filter(&env, Level::Default("warn")), "error");
        env.clear();
        env.insert("MC_LOG_LEVEL", "=[bad");
        assert_eq!(filter(&env, Level::Default("warn")), "warn");
    }
}
