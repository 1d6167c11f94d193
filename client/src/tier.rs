//! An owner's disk tier as the rest of the cluster sees it (`docs/tiering.md`): the
//! [`DiskTier`] under one process's memory, the disk segment it is mounted as, the listener
//! readers on other processes read it through, and the few steps that tie them to the master.
//!
//! Both kinds of owner use it the same way: the storage node (`mooncake_client
//! --enable_offload=true`) and a store client whose own segment has a tier
//! (`setup(..., enable_ssd_offload=True)`). Each:
//!
//! 1. [`OwnerDisk::start`]: opens the directory (scanning what an earlier run left there),
//!    binds the listener, shares the directory with same-host readers
//!    ([`crate::disk::share`]), and names the disk segment after its memory segment
//!    (`<name>/disk`);
//! 2. [`OwnerDisk::mount`]: mounts the disk segment with everything its files hold, as a
//!    re-mount does, so a node killed and started again on its directory serves its disk;
//! 3. on every ping ([`crate::recovery::ping`]): deletes the files of the ranges the master
//!    freed, reports copies whose checksum failed ([`OwnerDisk::report_lost`]), and re-reports
//!    the disk with the memory segments when the master asks for a re-mount;
//! 4. the replica-task executor writes the files (the master's offload tasks) and reads them
//!    (promotions) through the store's `disk` replica path, which holds this struct.
//!
//! Invariants: the disk segment's range never overlaps memory (it starts at
//! [`DISK_ADDR_BASE`], far above any user-space address), so a disk address reaching a memory
//! path is refused by its range checks, and the reverse; a file is deleted only for a range
//! the master freed before the ping that told us was sent (the tier's mark), so a file
//! written into a reused range after that is kept.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use protocol::message::{BatchReplicaClear, ReMountSegment};
use protocol::{HeldObject, ReplicaMedium, Segment, Uuid};

use crate::disk::share::DirShare;
use crate::disk::{DiskConfig, DiskListener, DiskTier};
use crate::master::MasterClient;

/// First address of every disk segment: addresses there name files, not memory.
pub const DISK_ADDR_BASE: u64 = 1 << 60;

/// The suffix that names an owner's disk segment after its memory segment.
pub const DISK_SEGMENT_SUFFIX: &str = "/disk";

/// One owner's disk tier, mounted (or to be mounted) as a disk segment.
pub struct OwnerDisk {
    pub desc: Segment,
    pub tier: Arc<DiskTier>,
    _listener: DiskListener,
    /// The directory shared with same-host readers (`crate::disk::share`), unless same-host
    /// sharing is off (`MC_STORE_SHM`) or the name could not be bound.
    share: Option<DirShare>,
}

impl OwnerDisk {
    /// Opens the tier in `cfg`'s directory and starts its listener on `bind_ip` (an ephemeral
    /// port), advertised as `advertise_ip`; the disk segment is named after `memory_name`.
    /// A directory that is missing and cannot be made, not a directory, or not writable is an
    /// error that names it.
    pub fn start(
        cfg: DiskConfig,
        memory_name: &str,
        bind_ip: IpAddr,
        advertise_ip: IpAddr,
        host_id: &str,
    ) -> Result<OwnerDisk, String> {
        let dir = cfg.dir.display().to_string();
        let policy = cfg.policy();
        let tier =
            DiskTier::open(cfg, DISK_ADDR_BASE).map_err(|e| format!("disk tier in {dir}: {e}"))?;
        // The limit after the filesystem's cap (`DiskTier::open` lowers it to what fits).
        let size = tier.size_limit();
        let token = protocol::auth::process_token().map_err(|e| e.to_string())?;
        let listener = tier
            .serve(SocketAddr::new(bind_ip, 0), token)
            .map_err(|e| format!("disk tier listener on {bind_ip}: {e}"))?;
        let port = listener.local_addr().port();
        let desc = Segment {
            id: Uuid::random(),
            name: format!("{memory_name}{DISK_SEGMENT_SUFFIX}"),
            base: DISK_ADDR_BASE,
            size,
            te_endpoint: SocketAddr::new(advertise_ip, port).to_string(),
            protocol: "tcp".into(),
            host_id: host_id.to_string(),
            medium: ReplicaMedium::LocalDisk,
            disk: policy,
        };
        tracing::info!(
            segment = %desc.name,
            "disk tier in {dir}: {} objects ({} bytes) found, logical limit {size} bytes, {} \
             I/O{}, readers served on {}",
            tier.held().len(),
            tier.stats().logical_bytes,
            if tier.uring() { "io_uring" } else { "blocking" },
            if tier.direct_io() { " with O_DIRECT" } else { " through the page cache (the directory's filesystem refuses O_DIRECT)" },
            desc.te_endpoint
        );
        let share = dataplane::mem::shm::shm_enabled()
            .then(|| DirShare::start(&desc.te_endpoint, tier.dir(), tier.share_offer()))
            .and_then(|r| {
                r.map_err(|e| {
                    tracing::warn!(segment = %desc.name, "disk tier directory not shared with \
                        same-host readers ({e}); they read through the listener")
                })
                .ok()
            });
        Ok(OwnerDisk {
            desc,
            tier,
            _listener: listener,
            share,
        })
    }

    /// The objects the files hold, as a re-mount reports them.
    pub fn held(&self) -> Vec<HeldObject> {
        self.tier
            .held()
            .into_iter()
            .map(|e| HeldObject {
                key: e.key,
                size: e.len,
                segment_name: self.desc.name.clone(),
                buffer_address: e.addr,
                with_hard_pin: e.hard_pin,
                version: e.version,
                soft_pin_ttl_ms: e.soft_pin_ttl_ms,
            })
            .collect()
    }

    /// Mounts the disk segment with every object its files hold (`ReMountSegment`: the master
    /// keeps the newest version of each key, and adds a disk copy to an object it already has
    /// at the same version). Returns how many objects were reported.
    pub fn mount(&self, master: &MasterClient, client_id: Uuid) -> Result<usize, String> {
        let held = self.held();
        let n = held.len();
        let mut chunk = Vec::new();
        let mut bytes = 0usize;
        let send = |held: Vec<HeldObject>| -> Result<(), String> {
            master
                .call(&ReMountSegment {
                    client_id,
                    segments: vec![self.desc.clone()],
                    held,
                })
                .map_err(|e| e.to_string())?
                .map_err(|code| format!("mounting disk segment {}: {code:?}", self.desc.name))
        };
        for h in held {
            bytes += h.key.len() + 64;
            chunk.push(h);
            if bytes > crate::limits::REMOUNT_HELD_BYTES_MAX {
                send(std::mem::take(&mut chunk))?;
                bytes = 0;
            }
        }
        send(chunk)?;
        Ok(n)
    }

    /// Deletes the files of the ranges in `freed` (a ping answer's) that lie on the disk
    /// segment and were written before `mark`; returns how many.
    pub fn forget_freed(&self, freed: &[(u64, u64)], mark: u64) -> usize {
        let end = self.desc.base.saturating_add(self.desc.size);
        freed
            .iter()
            .filter(|(a, _)| *a >= self.desc.base && *a < end)
            .map(|&(addr, len)| self.tier.forget(addr, len, mark))
            .sum()
    }

    /// Tells the master which disk copies failed their checksum (the tier already deleted
    /// them), so their replicas leave the index: a later read is a miss, or goes to another
    /// replica. Best effort: what cannot be told now is told at the next ping.
    pub fn report_lost(&self, master: &MasterClient, client_id: Uuid) {
        let lost = self.tier.take_lost();
        if lost.is_empty() {
            return;
        }
        let r = master.call(&BatchReplicaClear {
            client_id,
            keys: lost.clone(),
            segment_name: self.desc.name.clone(),
        });
        match r {
            Ok(Ok(_)) => tracing::info!(
                segment = %self.desc.name,
                "{} disk cop(ies) that failed their checksum dropped from the index",
                lost.len()
            ),
            other => {
                tracing::warn!(
                    segment = %self.desc.name,
                    "dropping {} corrupt disk cop(ies) from the index: {other:?}; retried",
                    lost.len()
                );
                self.tier.return_lost(lost);
            }
        }
    }
}

impl OwnerDisk {
    /// The tier's counters as Prometheus text (appended to the node's `/metrics`), each
    /// named `mooncake_disk_<name>`.
    pub fn render_metrics(&self) -> String {
        let s = self.tier.stats();
        let gauges = [
            ("objects", "objects in the disk tier", s.objects),
            ("bytes", "object bytes in the disk tier", s.logical_bytes),
            (
                "physical_bytes",
                "disk usage of its files",
                s.physical_bytes,
            ),
            ("capacity_bytes", "the disk segment's size", self.desc.size),
            (
                "writes_stopped",
                "1 while offload to it is stopped",
                s.writes_stopped.into(),
            ),
            (
                "io_uring",
                "1 when its I/O runs on io_uring",
                self.tier.uring().into(),
            ),
        ];
        let counters = [
            ("reads_total", "objects read from disk", s.reads),
            ("writes_total", "objects written to disk", s.writes),
            ("read_bytes_total", "bytes read from disk", s.bytes_read),
            (
                "written_bytes_total",
                "bytes written to disk",
                s.bytes_written,
            ),
            (
                "direct_reads_total",
                "reads straight into the reader's memory (no bounce buffer)",
                s.direct_reads,
            ),
            (
                "direct_writes_total",
                "writes straight from the object's memory (no bounce buffer)",
                s.direct_writes,
            ),
            (
                "checksum_failures_total",
                "copies that failed their checksum",
                s.checksum_failures,
            ),
            (
                "io_errors_total",
                "disk reads and writes that failed",
                s.io_errors,
            ),
            (
                "write_refusals_total",
                "writes refused (limits, stopped)",
                s.write_refusals,
            ),
            (
                "share_refusals_total",
                "same-host processes of another user refused the directory",
                self.share.as_ref().map_or(0, DirShare::refused),
            ),
        ];
        let mut out = prometheus_rows("gauge", &self.desc.name, &gauges);
        out.push_str(&prometheus_rows("counter", &self.desc.name, &counters));
        out
    }
}

/// Prometheus text of `rows` (name, help, value), each labelled with the disk segment.
fn prometheus_rows(kind: &str, segment: &str, rows: &[(&str, &str, u64)]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for (name, help, v) in rows {
        let name = format!("mooncake_disk_{name}");
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        let _ = writeln!(out, "{name}{{segment=\"{segment}\"}} {v}");
    }
    out
}
