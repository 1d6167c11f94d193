//! `transfer_engine_bench`: upstream's transfer-engine benchmark, same flags and same result
//! line, on our engine. It lives in the bench crate's library so that the binary and the
//! Python console script (`transfer_engine_bench` from `pip install`) run the same code, and
//! the data plane's library carries no benchmark. Run a target, then an
//! initiator against it:
//!
//! ```text
//! transfer_engine_bench --mode=target --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1:0
//! transfer_engine_bench --mode=initiator --metadata_server=P2PHANDSHAKE --segment_id=127.0.0.1:<rpc_port> \
//!     --operation=write --block_size=1048576 --batch_size=16 --threads=2 --duration=5
//! ```
//! The target prints `segment_id=<name>` once ready. The initiator prints upstream's
//! `Test completed: duration D, batch count N, throughput X <unit>/s` and p50/p99 batch
//! latency from an HDR histogram.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use dataplane::engine::TransferEngine;
use dataplane::transport::header::Opcode;

/// A latency histogram in microseconds, 1 µs to 60 s, 3 significant digits (shared with the
/// benchmarks in `bench/`).
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("valid histogram bounds")
}

/// Largest latency a histogram holds; longer ones are recorded as this.
const LATENCY_MAX_US: u64 = 60_000_000;

/// Records `d` in microseconds, clamped into the histogram's range.
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    let us = (d.as_micros() as u64).clamp(1, LATENCY_MAX_US);
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

/// Flags with upstream's names and defaults (those that make sense here).
fn defaults() -> HashMap<&'static str, &'static str> {
    HashMap::from([
        ("mode", "initiator"),
        ("operation", "read"),
        ("protocol", "tcp"),
        ("metadata_server", "P2PHANDSHAKE"),
        ("local_server_name", "127.0.0.1:0"),
        ("segment_id", ""),
        ("device_name", ""),
        ("nic_priority_matrix", ""),
        ("auto_discovery", "false"),
        ("buffer_size", "1073741824"),
        ("batch_size", "128"),
        ("block_size", "65536"),
        ("duration", "10"),
        ("threads", "12"),
        ("report_unit", "GB"),
        ("report_precision", "2"),
        ("backend", "classic"),
    ])
}

fn parse(argv: &[String]) -> Result<HashMap<String, String>, String> {
    let known = defaults();
    let mut out: HashMap<String, String> = known
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut i = 0;
    while i < argv.len() {
        let a = argv[i].trim_start_matches('-');
        let (k, v) = match a.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None if i + 1 < argv.len() && !argv[i + 1].starts_with("--") => {
                i += 1;
                (a.to_string(), argv[i].clone())
            }
            None => (a.to_string(), "true".to_string()),
        };
        if k == "help" {
            let mut names: Vec<_> = known.iter().collect();
            names.sort();
            let lines: Vec<String> = names
                .iter()
                .map(|(k, v)| format!("  --{k} (default {v:?})"))
                .collect();
            return Err(format!(
                "transfer_engine_bench flags:\n{}",
                lines.join("\n")
            ));
        }
        if !known.contains_key(k.as_str()) {
            return Err(format!("unknown flag --{k}"));
        }
        out.insert(k, v);
        i += 1;
    }
    Ok(out)
}

fn num(f: &HashMap<String, String>, k: &str) -> Result<u64, String> {
    f[k].parse()
        .map_err(|_| format!("--{k} wants a number, got {:?}", f[k]))
}

/// Bytes per `--report_unit` (decimal for GB/MB/KB, binary for GiB/MiB/KiB, bits for Gb/Mb/Kb).
fn unit_bytes(unit: &str) -> Option<f64> {
    Some(match unit {
        "GB" => 1e9,
        "GiB" => (1u64 << 30) as f64,
        "Gb" => 1e9 / 8.0,
        "MB" => 1e6,
        "MiB" => (1u64 << 20) as f64,
        "Mb" => 1e6 / 8.0,
        "KB" => 1e3,
        "KiB" => 1024.0,
        "Kb" => 1e3 / 8.0,
        _ => return None,
    })
}

/// Runs the benchmark with `argv` (without the program name); returns the exit code.
pub fn bench_main(argv: Vec<String>) -> i32 {
    let f = match parse(&argv) {
        Ok(f) => f,
        Err(msg) => {
            eprintln!("{msg}");
            return if msg.starts_with("transfer_engine_bench flags") {
                0
            } else {
                2
            };
        }
    };
    let result = match f["mode"].as_str() {
        "target" => target(&f),
        "initiator" => initiator(&f),
        other => Err(format!("--mode must be initiator or target, got {other:?}")),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("transfer_engine_bench: {e}");
            1
        }
    }
}

fn engine(f: &HashMap<String, String>) -> Result<TransferEngine, String> {
    let e = TransferEngine::new();
    e.initialize(
        &f["local_server_name"],
        &f["metadata_server"],
        &f["protocol"],
        &f["device_name"],
    )
    .map_err(|e| format!("initialize: {e}"))?;
    Ok(e)
}

fn target(f: &HashMap<String, String>) -> Result<(), String> {
    // Block the signals before any thread starts, so every thread inherits the mask and the
    // main thread alone receives them in `sigwait`.
    let signals = block_signals();
    let e = engine(f)?;
    let size = num(f, "buffer_size")? as usize;
    let addr = e
        .allocate_managed_buffer(size)
        .map_err(|e| format!("allocate {size} bytes: {e}"))?;
    println!(
        "segment_id={} buffer={addr:#x} size={size}",
        e.local_segment_name().unwrap_or_default()
    );
    let mut sig = 0;
    // SAFETY: `signals` is an initialised set; sigwait only writes the signal number.
    unsafe { libc::sigwait(&signals, &mut sig) };
    e.shutdown();
    Ok(())
}

/// Blocks SIGINT and SIGTERM in the calling thread (and every thread it starts later).
fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc signal-set manipulation on a zeroed sigset_t we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn initiator(f: &HashMap<String, String>) -> Result<(), String> {
    let segment = f["segment_id"].clone();
    if segment.is_empty() {
        return Err("--segment_id (the target's segment name) is required".into());
    }
    let op = match f["operation"].as_str() {
        "read" => Opcode::Read,
        "write" => Opcode::Write,
        o => return Err(format!("--operation must be read or write, got {o:?}")),
    };
    let unit = f["report_unit"].clone();
    let unit_div = unit_bytes(&unit).ok_or_else(|| format!("unknown --report_unit {unit:?}"))?;
    let (buffer, batch, block, secs, threads) = (
        num(f, "buffer_size")?,
        num(f, "batch_size")?.max(1),
        num(f, "block_size")?.max(1),
        num(f, "duration")?,
        num(f, "threads")?.max(1),
    );
    if batch * block * threads > buffer {
        return Err(format!(
            "batch_size x block_size x threads = {} exceeds --buffer_size {buffer}",
            batch * block * threads
        ));
    }
    let e = Arc::new(engine(f)?);
    let local = e
        .allocate_managed_buffer(buffer as usize)
        .map_err(|e| format!("allocate: {e}"))?;
    e.open_segment(&segment)
        .map_err(|e| format!("open segment {segment}: {e}"))?;
    let remote = e
        .get_first_buffer_address(&segment)
        .map_err(|e| format!("remote buffer: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let batches = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (e, stop, batches, segment) =
                (e.clone(), stop.clone(), batches.clone(), segment.clone());
            std::thread::spawn(move || -> Result<Histogram<u64>, String> {
                let base = t * batch * block;
                let items: Vec<(u64, u64, u64)> = (0..batch)
                    .map(|i| (local + base + i * block, remote + base + i * block, block))
                    .collect();
                let mut h = latency_histogram();
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    e.transfer_sync_batch(&segment, &items, op)
                        .map_err(|e| format!("transfer: {e}"))?;
                    record(&mut h, t0.elapsed());
                    batches.fetch_add(1, Ordering::Relaxed);
                }
                Ok(h)
            })
        })
        .collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::SeqCst);
    let mut all = latency_histogram();
    for w in workers {
        let h = w.join().map_err(|_| "worker panicked".to_string())??;
        all.add(&h).map_err(|e| e.to_string())?;
    }
    let dur = t0.elapsed().as_secs_f64();
    let n = batches.load(Ordering::SeqCst);
    let prec: usize = f["report_precision"].parse().unwrap_or(2);
    let tput = n as f64 * batch as f64 * block as f64 / dur / unit_div;
    println!(
        "Test completed: duration {dur:.2}, batch count {n}, throughput {tput:.prec$} {unit}/s"
    );
    println!("batch latency: {}", summary(&all));
    e.shutdown();
    Ok(())
}
