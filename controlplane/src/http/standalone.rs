//! `mooncake_http_metadata_server` as a library function: the transfer-engine HTTP metadata
//! store on its own, for deployments that keep metadata apart from the master (upstream ships
//! it as a Python console script with the same flags). The binary and the Python console script
//! (`mooncake_http_metadata_server` from `pip install`) both call [`metadata_main`].
//!
//! Usage: `mooncake_http_metadata_server [--port 8080] [--host 0.0.0.0] [--log-level INFO]`
//! (`--flag=value` works too). Prints the address it listens on, serves until SIGINT or
//! SIGTERM, then exits 0 after in-flight requests finish (at most [`DRAIN_TIMEOUT`]).

use std::sync::Arc;
use std::time::Duration;

use super::metadata::{serve_metadata, MetadataStore};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long shutdown waits for in-flight requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

const USAGE: &str =
    "Usage: mooncake_http_metadata_server [--port PORT] [--host HOST] [--log-level LEVEL]

Serves the Mooncake transfer-engine metadata protocol:
  GET|PUT|DELETE /metadata?key=KEY, GET /health
With MC_AUTH_TOKEN or MC_AUTH_TOKEN_FILE set, every /metadata request needs the
cluster's bearer (see docs/security.md).

Options:
  --port PORT         port to listen on (default 8080; 0 = any free port)
  --host HOST         address to bind (default 0.0.0.0; \"::\" for IPv6)
  --log-level LEVEL   TRACE, DEBUG, INFO, WARNING, ERROR or CRITICAL (default: RUST_LOG,
                      MC_YLT_LOG_LEVEL or MC_LOG_LEVEL, else INFO)
  --help, --version";

#[derive(Debug, PartialEq)]
struct Options {
    port: u16,
    host: String,
    /// `--log-level`; without it the environment picks ([`protocol::log`], default info).
    log_level: Option<tracing::Level>,
}

#[derive(Debug, PartialEq)]
enum Command {
    Serve(Options),
    Help,
    Version,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut options = Options {
        port: 8080,
        host: "0.0.0.0".to_string(),
        log_level: None,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) => (name.to_string(), Some(value.to_string())),
            None => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--version" => return Ok(Command::Version),
            "--port" | "-port" => {
                let raw = value()?;
                options.port = raw
                    .parse()
                    .map_err(|_| format!("invalid --port: expected 0..=65535, got \"{raw}\""))?;
            }
            "--host" | "-host" => options.host = value()?,
            "--log-level" | "--log_level" => options.log_level = Some(parse_level(&value()?)?),
            _ => return Err(format!("unknown argument \"{arg}\" (see --help)")),
        }
    }
    Ok(Command::Serve(options))
}

fn parse_level(raw: &str) -> Result<tracing::Level, String> {
    match raw.to_ascii_uppercase().as_str() {
        "TRACE" => Ok(tracing::Level::TRACE),
        "DEBUG" => Ok(tracing::Level::DEBUG),
        "INFO" => Ok(tracing::Level::INFO),
        "WARNING" | "WARN" => Ok(tracing::Level::WARN),
        "ERROR" | "CRITICAL" | "FATAL" => Ok(tracing::Level::ERROR),
        _ => Err(format!(
            "invalid --log-level: expected TRACE, DEBUG, INFO, WARNING, ERROR or CRITICAL, \
             got \"{raw}\""
        )),
    }
}

async fn run(options: Options) -> Result<(), String> {
    let signals = crate::signals::Signals::install()
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let listener = TcpListener::bind((options.host.as_str(), options.port))
        .await
        .map_err(|e| format!("cannot listen on {}:{}: {e}", options.host, options.port))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("mooncake_http_metadata_server listening on http://{addr}");
    tracing::info!(%addr, "HTTP metadata server started");

    let (stop, mut stopped) = watch::channel(false);
    let server = tokio::spawn(serve_metadata(
        listener,
        Arc::new(MetadataStore::new()),
        async move {
            let _ = stopped.wait_for(|&s| s).await;
        },
    ));
    signals.wait().await;
    tracing::info!("signal received, shutting down");
    let _ = stop.send(true);
    match tokio::time::timeout(DRAIN_TIMEOUT, server).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(format!("server failed: {e}")),
        Ok(Err(e)) => Err(format!("server task failed: {e}")),
        Err(_) => {
            tracing::warn!("in-flight requests still open after {DRAIN_TIMEOUT:?}; exiting");
            Ok(())
        }
    }
}

/// Runs the server with `args` (without the program name); returns the process exit code.
pub fn metadata_main(args: Vec<String>) -> i32 {
    let options = match parse_args(args) {
        Ok(Command::Serve(options)) => options,
        Ok(Command::Help) => {
            println!("{USAGE}");
            return 0;
        }
        Ok(Command::Version) => {
            println!(
                "mooncake_http_metadata_server (mooncake-rs) {}",
                env!("CARGO_PKG_VERSION")
            );
            return 0;
        }
        Err(message) => {
            eprintln!("mooncake_http_metadata_server: {message}");
            return 2;
        }
    };
    // The cluster secret (MC_AUTH_TOKEN / MC_AUTH_TOKEN_FILE) guards PUT and DELETE: a broken
    // setting must stop the start, not leave the writes open.
    if let Err(e) = protocol::auth::process_token() {
        eprintln!("mooncake_http_metadata_server: {e}");
        return 2;
    }
    {
        use protocol::log::{Ansi, Level, Writer};
        // A level on the command line beats the environment's.
        let flag = options.log_level.map(|l| l.as_str().to_ascii_lowercase());
        let level = match &flag {
            Some(flag) => Level::Fixed(flag),
            None => Level::Default("info"),
        };
        protocol::log::init_logging(level, Writer::Stderr, Ansi::IfTerminal);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("mooncake_http_metadata_server: cannot start the runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(run(options)) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("mooncake_http_metadata_server: {message}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Command, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn arguments() {
        let serve = |port, host: &str, log_level| {
            Ok(Command::Serve(Options {
                port,
                host: host.to_string(),
                log_level,
            }))
        };
        let info = None;
        let cases: &[(&[&str], Result<Command, String>)] = &[
            (&[], serve(8080, "0.0.0.0", info)),
            (
                &["--port", "9000", "--host", "127.0.0.1"],
                serve(9000, "127.0.0.1", info),
            ),
            (&["--port=0", "--host=::"], serve(0, "::", info)),
            (
                &["--log-level", "debug"],
                serve(8080, "0.0.0.0", Some(tracing::Level::DEBUG)),
            ),
            (
                &["--log-level=WARNING"],
                serve(8080, "0.0.0.0", Some(tracing::Level::WARN)),
            ),
            (&["--help"], Ok(Command::Help)),
            (&["--version"], Ok(Command::Version)),
        ];
        for (args, want) in cases {
            assert_eq!(&parse(args), want, "{args:?}");
        }
        let errors: &[(&[&str], &str)] = &[
            (&["--port"], "--port needs a value"),
            (&["--port", "70000"], "got \"70000\""),
            (&["--log-level", "LOUD"], "got \"LOUD\""),
            (&["--bogus"], "unknown argument \"--bogus\""),
        ];
        for (args, needle) in errors {
            let message = parse(args).unwrap_err();
            assert!(message.contains(needle), "{args:?}: {message}");
        }
    }
}
