//! `mooncake_tune`: check the host for mooncake-rs and, as root, fix what can be fixed.
//!
//! ```text
//! mooncake_tune [--dry-run] [--hugepages N]
//! ```
//! Prints one line per check (ok / WANT), then the RDMA topology (`info rdma ...`: devices,
//! NUMA nodes, port states, the per-node device preference; `docs/rdma.md`). Without `--dry-run` it writes the fixes it knows
//! (reserve N 2 MiB hugepages, THP to madvise, somaxconn to 4096); with it, it prints them.
//! Exit code 0 when every check passes (after fixes), 1 otherwise, 2 for bad arguments.

fn main() {
    let mut dry_run = false;
    let mut hugepages = 0u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dry-run" | "--dry_run" => dry_run = true,
            "--help" | "-h" => {
                println!("usage: mooncake_tune [--dry-run] [--hugepages N]");
                return;
            }
            _ => {
                let v = a
                    .strip_prefix("--hugepages=")
                    .map(str::to_string)
                    .or_else(|| (a == "--hugepages").then(|| args.next()).flatten());
                match v.as_deref().map(str::parse::<u64>) {
                    Some(Ok(n)) => hugepages = n,
                    _ => {
                        eprintln!("mooncake_tune: unexpected argument {a:?}");
                        std::process::exit(2);
                    }
                }
            }
        }
    }
    let checks = tuning::checks(hugepages);
    for c in &checks {
        let mark = if c.ok { "ok  " } else { "WANT" };
        println!(
            "{mark} {:<34} now: {:<28} want: {}",
            c.name, c.current, c.wanted
        );
    }
    for line in tuning::rdma_topology(std::path::Path::new(tuning::RDMA_SYSFS_ROOT)) {
        println!("info {line}");
    }
    let fixes: Vec<_> = checks.iter().filter_map(|c| c.fix.as_ref()).collect();
    if dry_run {
        for (path, value) in &fixes {
            println!("would write {value} to {path}");
        }
    } else {
        for line in tuning::apply(&checks) {
            println!("{line}");
        }
    }
    let all_ok = if dry_run || fixes.is_empty() {
        checks.iter().all(|c| c.ok)
    } else {
        tuning::checks(hugepages).iter().all(|c| c.ok)
    };
    std::process::exit(if all_ok { 0 } else { 1 });
}
