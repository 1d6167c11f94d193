//! Host checks and tuning for mooncake-rs.
//!
//! Modelled on Seastar's `perftune.py`: read what the host offers, say what a storage node or
//! master would want, and (without `--dry-run`) change what a root process may change. The
//! processes themselves call [`raise_nofile_limit`] at start-up so that many clients and
//! storage nodes can connect at once.
//!
//! Everything here reads `/proc` and `/sys` or calls `getrlimit`/`setrlimit`; nothing panics on
//! a host that lacks a file (a container, an old kernel): the check reports "unknown".

use std::path::Path;

/// File descriptors a server process asks for (the hard limit caps it).
pub const NOFILE_WANTED: u64 = 1 << 20;
/// Accept-queue depth the servers request (`listen(2)` backlog); `net.core.somaxconn` caps it.
pub const SOMAXCONN_WANTED: u64 = 4096;

/// Raises the soft `RLIMIT_NOFILE` towards [`NOFILE_WANTED`] (never above the hard limit).
/// Returns `(before, after)`. Best effort: a refusal leaves the limit as it was.
pub fn raise_nofile_limit() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the one struct passed and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return (0, 0);
    }
    let before = lim.rlim_cur;
    let want = NOFILE_WANTED.min(lim.rlim_max);
    if want > before {
        let new = libc::rlimit {
            rlim_cur: want,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the one struct passed and nothing else.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            return (before, want);
        }
    }
    (before, before)
}

/// One line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    /// What the host has now (`unknown` when it cannot be read).
    pub current: String,
    /// What we would like, in words.
    pub wanted: String,
    pub ok: bool,
    /// A `/proc/sys` or `/sys` file and the value to write there to fix it (root only).
    pub fix: Option<(String, String)>,
}

/// Free and total 2 MiB hugepages from `/proc/meminfo` text.
pub fn parse_hugepages(meminfo: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        meminfo
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    Some((field("HugePages_Free:")?, field("HugePages_Total:")?))
}

/// The selected mode in a `/sys/kernel/mm/transparent_hugepage/enabled` line, e.g.
/// `always [madvise] never` -> `madvise`.
pub fn parse_thp_mode(text: &str) -> Option<String> {
    let start = text.find('[')? + 1;
    let end = start + text[start..].find(']')?;
    Some(text[start..end].to_string())
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Checks the host for a storage node that wants `hugepages` reserved 2 MiB pages.
pub fn checks(hugepages: u64) -> Vec<Check> {
    let mut out = Vec::new();
    let meminfo = read("/proc/meminfo").unwrap_or_default();
    let (free, total) = parse_hugepages(&meminfo).unwrap_or((0, 0));
    out.push(Check {
        name: "hugepages (2 MiB) reserved",
        current: format!("{total} total, {free} free"),
        wanted: format!("at least {hugepages} (MC_STORE_USE_HUGEPAGE=1 uses them)"),
        ok: total >= hugepages,
        fix: (total < hugepages).then(|| {
            (
                "/proc/sys/vm/nr_hugepages".to_string(),
                hugepages.to_string(),
            )
        }),
    });
    let thp = read("/sys/kernel/mm/transparent_hugepage/enabled").and_then(|t| parse_thp_mode(&t));
    out.push(Check {
        name: "transparent hugepages",
        current: thp.clone().unwrap_or_else(|| "unknown".into()),
        wanted: "madvise or always (segments ask with MADV_HUGEPAGE)".into(),
        ok: matches!(thp.as_deref(), Some("madvise") | Some("always")),
        fix: (thp.as_deref() == Some("never")).then(|| {
            (
                "/sys/kernel/mm/transparent_hugepage/enabled".to_string(),
                "madvise".to_string(),
            )
        }),
    });
    let shmem =
        read("/sys/kernel/mm/transparent_hugepage/shmem_enabled").and_then(|t| parse_thp_mode(&t));
    out.push(Check {
        name: "shared-memory transparent hugepages",
        current: shmem.clone().unwrap_or_else(|| "unknown".into()),
        wanted: "advise, always or within_size (same-host shared segments ask with \
                 MADV_HUGEPAGE; without it they use 4 KiB pages and a client keeps its own \
                 segment private)"
            .into(),
        ok: matches!(
            shmem.as_deref(),
            Some("advise") | Some("always") | Some("within_size")
        ),
        fix: matches!(shmem.as_deref(), Some("never")).then(|| {
            (
                "/sys/kernel/mm/transparent_hugepage/shmem_enabled".to_string(),
                "advise".to_string(),
            )
        }),
    });
    let somax = read("/proc/sys/net/core/somaxconn").and_then(|v| v.parse::<u64>().ok());
    out.push(Check {
        name: "net.core.somaxconn",
        current: somax.map_or("unknown".into(), |v| v.to_string()),
        wanted: format!("at least {SOMAXCONN_WANTED} (accept-queue depth of the servers)"),
        ok: somax.is_some_and(|v| v >= SOMAXCONN_WANTED),
        fix: somax.filter(|v| *v < SOMAXCONN_WANTED).map(|_| {
            (
                "/proc/sys/net/core/somaxconn".to_string(),
                SOMAXCONN_WANTED.to_string(),
            )
        }),
    });
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the one struct passed and nothing else.
    let have = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    out.push(Check {
        name: "open files (RLIMIT_NOFILE hard)",
        current: if have {
            lim.rlim_max.to_string()
        } else {
            "unknown".into()
        },
        wanted: "at least 65536 (servers raise their soft limit to it at start-up)".into(),
        ok: have && lim.rlim_max >= 65536,
        fix: None,
    });
    // SAFETY: getrlimit writes the one struct passed and nothing else.
    let have = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0;
    out.push(Check {
        name: "locked memory (RLIMIT_MEMLOCK)",
        current: if !have {
            "unknown".into()
        } else if lim.rlim_cur == libc::RLIM_INFINITY {
            "unlimited".into()
        } else {
            format!("{} bytes", lim.rlim_cur)
        },
        wanted: "unlimited for RDMA registration (not needed for TCP)".into(),
        ok: have && lim.rlim_cur == libc::RLIM_INFINITY,
        fix: None,
    });
    let uring = read("/proc/sys/kernel/io_uring_disabled");
    out.push(Check {
        name: "io_uring",
        current: match uring.as_deref() {
            None | Some("0") => "allowed".into(),
            Some(v) => format!("kernel.io_uring_disabled={v}"),
        },
        wanted: "allowed (else shards fall back to the blocking server)".into(),
        ok: matches!(uring.as_deref(), None | Some("0")),
        fix: None,
    });
    out
}

/// Default sysfs root of RDMA devices.
pub const RDMA_SYSFS_ROOT: &str = "/sys/class/infiniband";

/// The RDMA topology as `protocol="rdma"` would see it (`docs/rdma.md`): one line per device
/// (NUMA node, each port's state and link layer), then per NUMA node the devices the
/// descriptor's priority matrix prefers there. Read from `root` (normally
/// [`RDMA_SYSFS_ROOT`]); this crate sits below the data plane, so it reads sysfs itself
/// rather than calling `dataplane::transport::rdma::discovery`, whose rules it mirrors.
pub fn rdma_topology(root: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(root) else {
        return vec![format!(
            "rdma: no devices ({} missing: no RDMA hardware or driver; protocol=rdma needs \
             MC_FORCE_TCP=1 here)",
            root.display()
        )];
    };
    let mut names: Vec<String> = dir
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    if names.is_empty() {
        return vec![format!("rdma: no devices under {}", root.display())];
    }
    let rd = |p: std::path::PathBuf| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    let mut numa: Vec<(String, Option<i64>)> = Vec::new();
    for n in &names {
        let d = root.join(n);
        let node = rd(d.join("device/numa_node"))
            .parse::<i64>()
            .ok()
            .filter(|v| *v >= 0);
        let mut ports: Vec<String> = std::fs::read_dir(d.join("ports"))
            .map(|it| {
                it.flatten()
                    .map(|e| {
                        let p = e.path();
                        format!(
                            "port {}: {} {}",
                            e.file_name().to_string_lossy(),
                            rd(p.join("state")),
                            rd(p.join("link_layer"))
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        ports.sort();
        let node_text = node.map_or("unknown".to_string(), |v| v.to_string());
        out.push(format!(
            "rdma {n}: numa node {node_text}; {}",
            ports.join("; ")
        ));
        numa.push((n.clone(), node));
    }
    let mut nodes: Vec<i64> = numa.iter().filter_map(|(_, v)| *v).collect();
    nodes.sort_unstable();
    nodes.dedup();
    for node in nodes {
        let (pref, other): (Vec<_>, Vec<_>) =
            numa.iter().partition(|(_, v)| v.is_none_or(|x| x == node));
        let list = |v: Vec<&(String, Option<i64>)>| {
            v.iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        out.push(format!(
            "rdma priority cpu:{node}: prefer [{}] then [{}]",
            list(pref),
            list(other)
        ));
    }
    out
}

/// Writes each fix; returns one line per attempt.
pub fn apply(checks: &[Check]) -> Vec<String> {
    checks
        .iter()
        .filter_map(|c| c.fix.as_ref())
        .map(
            |(path, value)| match std::fs::write(Path::new(path), value) {
                Ok(()) => format!("wrote {value} to {path}"),
                Err(e) => format!("could not write {value} to {path}: {e}"),
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_meminfo_and_thp() {
        let m = "MemTotal: 1 kB\nHugePages_Total:      16\nHugePages_Free:        9\n";
        assert_eq!(parse_hugepages(m), Some((9, 16)));
        assert_eq!(parse_hugepages("MemTotal: 1 kB\n"), None);
        assert_eq!(
            parse_thp_mode("always [madvise] never").as_deref(),
            Some("madvise")
        );
        assert_eq!(parse_thp_mode("garbage"), None);
    }

    #[test]
    fn checks_run_on_this_host_and_fixes_name_real_files() {
        let c = checks(1 << 40);
        assert!(c.len() >= 5);
        let huge = &c[0];
        assert!(!huge.ok, "nobody reserves 2^40 hugepages");
        assert_eq!(
            huge.fix.as_ref().map(|f| f.0.as_str()),
            Some("/proc/sys/vm/nr_hugepages")
        );
    }

    #[test]
    fn rdma_topology_from_a_fake_sysfs() {
        let root = std::env::temp_dir().join(format!("mc-tune-ib-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (n, node, state) in [("mlx5_0", "0", "4: ACTIVE"), ("mlx5_1", "1", "1: DOWN")] {
            let d = root.join(n);
            std::fs::create_dir_all(d.join("device")).unwrap();
            std::fs::create_dir_all(d.join("ports/1")).unwrap();
            std::fs::write(d.join("device/numa_node"), node).unwrap();
            std::fs::write(d.join("ports/1/state"), state).unwrap();
            std::fs::write(d.join("ports/1/link_layer"), "InfiniBand").unwrap();
        }
        let lines = rdma_topology(&root);
        assert_eq!(
            lines,
            vec![
                "rdma mlx5_0: numa node 0; port 1: 4: ACTIVE InfiniBand",
                "rdma mlx5_1: numa node 1; port 1: 1: DOWN InfiniBand",
                "rdma priority cpu:0: prefer [mlx5_0] then [mlx5_1]",
                "rdma priority cpu:1: prefer [mlx5_1] then [mlx5_0]",
            ]
        );
        let none = rdma_topology(&root.join("missing"));
        assert!(none[0].contains("no devices"), "{none:?}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn nofile_limit_is_raised_or_left() {
        let (before, after) = raise_nofile_limit();
        assert!(after >= before);
    }
}
