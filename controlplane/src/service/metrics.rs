//! Master metrics: relaxed atomic counters (updated without the state lock) and their
//! Prometheus text rendering (exposition format 0.0.4) under upstream's names.
//!
//! Every single operation has `master_<op>_requests_total` and `master_<op>_failures_total`
//! (a failure is any non-OK status). Every batch operation also has `_items_total`,
//! `_failed_items_total` and `_partial_successes_total`; a batch counts as a failure when
//! every item failed and as a partial success when some did.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Single operations, in `OP_NAMES` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    PutStart,
    PutEnd,
    PutRevoke,
    UpsertStart,
    UpsertEnd,
    UpsertRevoke,
    GetReplicaList,
    ExistKey,
    Remove,
    RemoveByRegex,
    RemoveAll,
    KeepRemoved,
    MountSegment,
    RemountSegment,
    UnmountSegment,
    GracefulUnmountSegment,
    Ping,
    ServiceReady,
    CreateCopyTask,
    CreateMoveTask,
    QueryTask,
    FetchTasks,
    CompleteTask,
    ReservePut,
    CommitReservedPut,
}

const OP_NAMES: [(&str, &str); 25] = [
    ("put_start", "PutStart"),
    ("put_end", "PutEnd"),
    ("put_revoke", "PutRevoke"),
    ("upsert_start", "UpsertStart"),
    ("upsert_end", "UpsertEnd"),
    ("upsert_revoke", "UpsertRevoke"),
    ("get_replica_list", "GetReplicaList"),
    ("exist_key", "ExistKey"),
    ("remove", "Remove"),
    ("remove_by_regex", "RemoveByRegex"),
    ("remove_all", "RemoveAll"),
    ("keep_removed", "KeepRemoved"),
    ("mount_segment", "MountSegment"),
    ("remount_segment", "RemountSegment"),
    ("unmount_segment", "UnmountSegment"),
    ("graceful_unmount_segment", "GracefulUnmountSegment"),
    ("ping", "Ping"),
    ("service_ready", "ServiceReady"),
    ("create_copy_task", "CreateCopyTask"),
    ("create_move_task", "CreateMoveTask"),
    ("query_task", "QueryTask"),
    ("fetch_tasks", "FetchTasks"),
    ("mark_task_to_complete", "MarkTaskToComplete"),
    ("reserve_put", "ReservePut"),
    ("commit_reserved_put", "CommitReservedPut"),
];

/// Batch operations, in `BATCH_NAMES` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchOp {
    PutStart,
    PutEnd,
    PutRevoke,
    UpsertStart,
    UpsertEnd,
    UpsertRevoke,
    GetReplicaList,
    ExistKey,
    Remove,
    ReplicaClear,
}

const BATCH_NAMES: [(&str, &str); 10] = [
    ("batch_put_start", "BatchPutStart"),
    ("batch_put_end", "BatchPutEnd"),
    ("batch_put_revoke", "BatchPutRevoke"),
    ("batch_upsert_start", "BatchUpsertStart"),
    ("batch_upsert_end", "BatchUpsertEnd"),
    ("batch_upsert_revoke", "BatchUpsertRevoke"),
    ("batch_get_replica_list", "BatchGetReplicaList"),
    ("batch_exist_key", "BatchExistKey"),
    ("batch_remove", "BatchRemove"),
    ("batch_replica_clear", "BatchReplicaClear"),
];

#[derive(Default)]
pub struct OpCounters {
    pub requests: AtomicU64,
    pub failures: AtomicU64,
}

#[derive(Default)]
pub struct BatchCounters {
    pub requests: AtomicU64,
    pub failures: AtomicU64,
    pub partial_successes: AtomicU64,
    pub items: AtomicU64,
    pub failed_items: AtomicU64,
}

/// Buckets of a [`Hist`]: 8 exact ones below 8, then 8 per power of two up to 2^64.
const HIST_BUCKETS: usize = 8 + 61 * 8;

/// A lock-free latency histogram with 3 bits of mantissa per power of two: a percentile is
/// reported as the upper bound of its bucket, at most 12.5% above the true value.
pub struct Hist {
    buckets: [AtomicU64; HIST_BUCKETS],
    count: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Default for Hist {
    fn default() -> Self {
        Hist {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }
}

impl Hist {
    fn index(v: u64) -> usize {
        if v < 8 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros() as usize; // >= 3
        8 + (e - 3) * 8 + ((v >> (e - 3)) & 7) as usize
    }

    /// The largest value of bucket `i`.
    fn upper(i: usize) -> u64 {
        if i < 8 {
            return i as u64;
        }
        let (e, m) = ((i - 8) / 8 + 3, ((i - 8) % 8) as u64);
        ((8 + m + 1) << (e - 3))
            .wrapping_sub(1)
            .max((8 + m) << (e - 3))
    }

    #[inline]
    pub fn record(&self, v: u64) {
        self.buckets[Self::index(v)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(v, Ordering::Relaxed);
        self.max.fetch_max(v, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn sum(&self) -> u64 {
        self.sum.load(Ordering::Relaxed)
    }

    /// The value at quantile `q` (0..=1), never above the largest recorded; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= rank {
                return Self::upper(i).min(self.max.load(Ordering::Relaxed));
            }
        }
        self.max.load(Ordering::Relaxed)
    }
}

#[derive(Default)]
pub struct Metrics {
    pub ops: [OpCounters; OP_NAMES.len()],
    pub batches: [BatchCounters; BATCH_NAMES.len()],
    pub evicted_keys: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub eviction_attempts: AtomicU64,
    pub eviction_successes: AtomicU64,
    pub put_start_alloc_failures: AtomicU64,
    pub put_start_partial_allocations: AtomicU64,
    pub put_start_discards: AtomicU64,
    pub put_start_releases: AtomicU64,
    /// Starts its own writer sent again while the put was in flight: answered with the same
    /// allocation.
    pub put_start_retries: AtomicU64,
    /// Puts in one round trip (`reserve.rs`): ranges reserved, reservations committed as a
    /// key, and commits refused because the key existed (the reservation stays).
    pub reservations_made: AtomicU64,
    pub reservations_committed: AtomicU64,
    pub reservations_refused: AtomicU64,
    pub expired_clients: AtomicU64,
    pub quarantined_clients: AtomicU64,
    pub unquarantined_clients: AtomicU64,
    /// Drains (`drain.rs`) that ended with nothing left on their segment, and those that hit
    /// their deadline; objects the latter lost (their only copy was still there).
    pub drains_completed: AtomicU64,
    pub drains_timed_out: AtomicU64,
    pub drain_objects_lost: AtomicU64,
    /// Replicas dropped off draining segments because their object had a copy elsewhere.
    pub drain_replicas_detached: AtomicU64,
    /// PutStart to PutEnd of each put or upsert, as the master sees it (ms).
    pub put_ms: Hist,
    /// Time the master takes to answer a `GetReplicaList` (or a batch of them), in µs.
    pub lookup_us: Hist,
}

/// Values read under the state lock for one rendering.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gauges {
    pub key_count: u64,
    pub allocated_bytes: u64,
    pub total_capacity_bytes: u64,
    pub active_clients: u64,
    pub soft_pin_key_count: u64,
    pub segments: u64,
    pub quarantined_segments: u64,
    /// Segments draining (`drain.rs`) and fresh ones still in their admission ramp.
    pub draining_segments: u64,
    pub ramping_segments: u64,
    /// Bytes reserved for clients' next puts (`reserve.rs`).
    pub reserved_bytes: u64,
    /// Registered owners the current HA term still waits for (`owners.rs`).
    pub owners_awaited: u64,
    /// The disk tier (`offload.rs`).
    pub tier: super::TierGauges,
}

impl Metrics {
    #[inline]
    pub fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    #[inline]
    pub fn op(&self, op: Op, ok: bool) {
        let c = &self.ops[op as usize];
        Self::inc(&c.requests);
        if !ok {
            Self::inc(&c.failures);
        }
    }

    #[inline]
    pub fn batch(&self, op: BatchOp, items: u64, failed: u64) {
        let c = &self.batches[op as usize];
        Self::inc(&c.requests);
        Self::add(&c.items, items);
        Self::add(&c.failed_items, failed);
        if failed > 0 && failed == items {
            Self::inc(&c.failures);
        } else if failed > 0 {
            Self::inc(&c.partial_successes);
        }
    }

    /// `(requests, failures)` of a single operation.
    pub fn op_counts(&self, op: Op) -> (u64, u64) {
        let c = &self.ops[op as usize];
        (Self::get(&c.requests), Self::get(&c.failures))
    }

    /// `(requests, failures, items, failed_items)` of a batch operation.
    pub fn batch_counts(&self, op: BatchOp) -> (u64, u64, u64, u64) {
        let c = &self.batches[op as usize];
        (
            Self::get(&c.requests),
            Self::get(&c.failures),
            Self::get(&c.items),
            Self::get(&c.failed_items),
        )
    }

    /// The Prometheus text of every metric.
    pub fn render(&self, g: &Gauges) -> String {
        let mut s = String::with_capacity(16 * 1024);
        render_gauges(&mut s, g);
        render_tier(&mut s, &g.tier);
        self.render_counters(&mut s);
        self.render_reservation_counters(&mut s);
        self.render_drain_counters(&mut s);
        self.render_ops(&mut s);
        self.render_hists(&mut s);
        self.render_batches(&mut s);
        s
    }

    /// The counters of segment drains (`drain.rs`).
    fn render_drain_counters(&self, s: &mut String) {
        let counters: [(&str, &str, &AtomicU64); 4] = [
            (
                "master_drains_completed_total",
                "Segment drains that ended with nothing left on the segment",
                &self.drains_completed,
            ),
            (
                "master_drains_timed_out_total",
                "Segment drains unmounted at their deadline with objects still on the segment",
                &self.drains_timed_out,
            ),
            (
                "master_drain_objects_lost_total",
                "Objects whose only copy was on a segment whose drain hit its deadline",
                &self.drain_objects_lost,
            ),
            (
                "master_drain_replicas_detached_total",
                "Replicas dropped off draining segments because their object had a copy elsewhere",
                &self.drain_replicas_detached,
            ),
        ];
        for (name, help, v) in counters {
            metric(s, name, help, "counter", Self::get(v));
        }
    }

    /// The counters of puts committed in one round trip (`reserve.rs`).
    fn render_reservation_counters(&self, s: &mut String) {
        let counters: [(&str, &str, &AtomicU64); 3] = [
            (
                "master_put_reservations_total",
                "Ranges reserved for a client's next put of a size (puts committed in one round trip)",
                &self.reservations_made,
            ),
            (
                "master_put_reservations_committed_total",
                "Reserved ranges committed as a key (a put in one round trip)",
                &self.reservations_committed,
            ),
            (
                "master_put_reservations_refused_total",
                "Commits of a reserved range refused because the key existed (first writer wins)",
                &self.reservations_refused,
            ),
        ];
        for (name, help, v) in counters {
            metric(s, name, help, "counter", Self::get(v));
        }
    }

    /// The counters of eviction, puts and clients.
    fn render_counters(&self, s: &mut String) {
        let counters: [(&str, &str, &AtomicU64); 12] = [
            (
                "master_evicted_key_count",
                "Total number of keys evicted",
                &self.evicted_keys,
            ),
            (
                "master_evicted_size_bytes",
                "Total bytes freed by eviction",
                &self.evicted_bytes,
            ),
            (
                "master_attempted_evictions_total",
                "Eviction passes run",
                &self.eviction_attempts,
            ),
            (
                "master_successful_evictions_total",
                "Eviction passes that evicted at least one object",
                &self.eviction_successes,
            ),
            (
                "master_put_start_alloc_failures_total",
                "Total number of PutStart failures caused by replica allocation failure",
                &self.put_start_alloc_failures,
            ),
            (
                "master_put_start_partial_allocations_total",
                "PutStarts that got fewer replicas than requested",
                &self.put_start_partial_allocations,
            ),
            (
                "master_put_start_discard_cnt",
                "In-flight puts discarded after put_start_discard_timeout",
                &self.put_start_discards,
            ),
            (
                "master_put_start_release_cnt",
                "Buffers of discarded puts released after put_start_release_timeout",
                &self.put_start_releases,
            ),
            (
                "master_put_start_retries_total",
                "PutStarts their writer sent again while the put was in flight, answered with the same allocation",
                &self.put_start_retries,
            ),
            (
                "master_expired_clients_total",
                "Clients expired for missing pings within client_ttl",
                &self.expired_clients,
            ),
            (
                "master_client_quarantines_total",
                "Times a client's segments were quarantined for missing pings",
                &self.quarantined_clients,
            ),
            (
                "master_client_unquarantines_total",
                "Times a quarantine was lifted because the client pinged again",
                &self.unquarantined_clients,
            ),
        ];
        for (name, help, v) in counters {
            metric(s, name, help, "counter", Self::get(v));
        }
    }

    /// The received and failed requests of each operation.
    fn render_ops(&self, s: &mut String) {
        for ((short, long), c) in OP_NAMES.iter().zip(&self.ops) {
            let parts = [
                ("requests", "received", &c.requests),
                ("failures", "failed", &c.failures),
            ];
            for (suffix, what, v) in parts {
                let name = format!("master_{short}_{suffix}_total");
                let help = format!("Total number of {what} {long} requests");
                metric(s, &name, &help, "counter", Self::get(v));
            }
        }
    }

    /// The latency summaries: quantiles, sum and count.
    fn render_hists(&self, s: &mut String) {
        let hists: [(&str, &str, &Hist); 2] = [
            (
                "master_put_duration_ms",
                "PutStart to PutEnd of puts and upserts as the master sees them, in ms",
                &self.put_ms,
            ),
            (
                "master_lookup_duration_us",
                "Time the master takes to answer a replica lookup (one request or batch), in us",
                &self.lookup_us,
            ),
        ];
        for (name, help, h) in hists {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} summary");
            for q in ["0.5", "0.9", "0.99"] {
                let v = h.quantile(q.parse().expect("a literal"));
                let _ = writeln!(s, "{name}{{quantile=\"{q}\"}} {v}");
            }
            let _ = writeln!(s, "{name}_sum {}\n{name}_count {}", h.sum(), h.count());
        }
    }

    /// The requests, failures and items of each batch operation.
    fn render_batches(&self, s: &mut String) {
        for ((short, long), c) in BATCH_NAMES.iter().zip(&self.batches) {
            let parts = [
                ("requests", "received requests", &c.requests),
                ("failures", "requests with every item failed", &c.failures),
                (
                    "partial_successes",
                    "requests with some items failed",
                    &c.partial_successes,
                ),
                ("items", "items processed", &c.items),
                ("failed_items", "failed items", &c.failed_items),
            ];
            for (suffix, what, v) in parts {
                let name = format!("master_{short}_{suffix}_total");
                let help = format!("{long}: total number of {what}");
                metric(s, &name, &help, "counter", Self::get(v));
            }
        }
    }
}

/// The master's own gauges: keys, memory, clients, segments, owners awaited.
fn render_gauges(s: &mut String, g: &Gauges) {
    let gauges: [(&str, &str, u64); 11] = [
        (
            "master_key_count",
            "Total number of keys managed by the master",
            g.key_count,
        ),
        (
            "master_allocated_bytes",
            "Total memory bytes currently allocated across all segments",
            g.allocated_bytes,
        ),
        (
            "master_total_capacity_bytes",
            "Total memory capacity across all mounted segments",
            g.total_capacity_bytes,
        ),
        (
            "master_active_clients",
            "Total number of active clients",
            g.active_clients,
        ),
        (
            "master_soft_pin_key_count",
            "Total number of soft-pinned keys managed by the master",
            g.soft_pin_key_count,
        ),
        (
            "master_segment_count",
            "Number of mounted segments",
            g.segments,
        ),
        (
            "master_quarantined_segments",
            "Mounted segments taking no new allocation because their owner stopped pinging",
            g.quarantined_segments,
        ),
        (
            "master_draining_segments",
            "Mounted segments being drained: no new allocation, their only copies moving elsewhere",
            g.draining_segments,
        ),
        (
            "master_ramping_segments",
            "Freshly mounted segments whose share of new replicas is still ramping up",
            g.ramping_segments,
        ),
        (
            "master_put_reserved_bytes",
            "Bytes reserved for clients' next puts (puts committed in one round trip)",
            g.reserved_bytes,
        ),
        (
            "master_owners_awaited",
            "Owners registered by an earlier HA term that have not re-reported yet \
             (a key the master lacks is answered -1010 meanwhile)",
            g.owners_awaited,
        ),
    ];
    for (name, help, v) in gauges {
        metric(s, name, help, "gauge", v);
    }
}

/// The disk tier's gauges and counters (`offload.rs`, `docs/tiering.md`). Memory's own
/// figures above (`master_allocated_bytes`, `master_total_capacity_bytes`) leave disk out.
fn render_tier(s: &mut String, t: &super::TierGauges) {
    render_tier_gauges(s, t);
    render_tier_counters(s, &t.stats);
}

/// The disk tier's gauges: objects per tier, disk bytes and segments, tasks in flight.
fn render_tier_gauges(s: &mut String, t: &super::TierGauges) {
    let gauges: [(&str, &str, u64); 8] = [
        (
            "master_memory_object_count",
            "Objects with at least one memory replica",
            t.memory_objects,
        ),
        (
            "master_disk_object_count",
            "Objects with a disk replica",
            t.disk_objects,
        ),
        (
            "master_disk_only_object_count",
            "Objects whose only replicas are on disk",
            t.disk_only_objects,
        ),
        (
            "master_disk_allocated_bytes",
            "Bytes allocated on disk segments (disk replicas and offloads in flight)",
            t.disk_used_bytes,
        ),
        (
            "master_disk_capacity_bytes",
            "Total size of mounted disk segments",
            t.disk_capacity_bytes,
        ),
        (
            "master_disk_segment_count",
            "Mounted disk segments",
            t.disk_segments,
        ),
        (
            "master_tier_tasks_pending",
            "Offload and promotion tasks waiting for their executor",
            t.internal_pending,
        ),
        (
            "master_tier_tasks_processing",
            "Offload and promotion tasks handed to their executor",
            t.internal_processing,
        ),
    ];
    for (name, help, v) in gauges {
        metric(s, name, help, "gauge", v);
    }
}

/// The disk tier's counters: offloads, promotions, disk-only hits, disk evictions.
fn render_tier_counters(s: &mut String, st: &super::TierStats) {
    let counters: [(&str, &str, u64); 11] = [
        (
            "master_offload_queued_total",
            "Offload tasks queued",
            st.offloads_queued,
        ),
        (
            "master_offload_completed_total",
            "Offload tasks completed into a disk replica",
            st.offloads_completed,
        ),
        (
            "master_offload_failed_total",
            "Offload tasks failed (executor error, timeout, object removed meanwhile)",
            st.offloads_failed,
        ),
        (
            "master_offload_skipped_total",
            "Offloads not queued because the disk's queue was at offloading_queue_limit",
            st.offloads_skipped,
        ),
        (
            "master_promotion_queued_total",
            "Promotion tasks queued",
            st.promotions_queued,
        ),
        (
            "master_promotion_completed_total",
            "Promotion tasks completed into a memory replica",
            st.promotions_completed,
        ),
        (
            "master_promotion_failed_total",
            "Promotion tasks failed",
            st.promotions_failed,
        ),
        (
            "master_disk_only_read_hits_total",
            "Replica lookups answered with disk replicas only",
            st.disk_only_hits,
        ),
        (
            "master_disk_evicted_replicas_total",
            "Disk replicas dropped by disk eviction",
            st.disk_evicted_replicas,
        ),
        (
            "master_disk_evicted_bytes_total",
            "Bytes of disk replicas dropped by disk eviction",
            st.disk_evicted_bytes,
        ),
        (
            "master_memory_evictions_to_disk_total",
            "Objects whose memory replicas eviction dropped, leaving them on disk",
            st.memory_evictions_to_disk,
        ),
    ];
    for (name, help, v) in counters {
        metric(s, name, help, "counter", v);
    }
}

fn metric(s: &mut String, name: &str, help: &str, kind: &str, v: u64) {
    // Writing to a String cannot fail.
    let _ = write!(
        s,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_within_an_eighth() {
        let h = Hist::default();
        assert_eq!(h.quantile(0.5), 0);
        for v in 1..=1000u64 {
            h.record(v);
        }
        for (q, exact) in [(0.5, 500u64), (0.9, 900), (0.99, 990), (1.0, 1000)] {
            let got = h.quantile(q);
            assert!(
                got >= exact && got <= exact + exact / 8,
                "q{q}: {got} vs {exact}"
            );
        }
        assert_eq!((h.count(), h.sum()), (1000, 500_500));
        for v in [0u64, 7, 8, 9, 15, 16, 1 << 40, u64::MAX] {
            let i = Hist::index(v);
            assert!(i < HIST_BUCKETS && Hist::upper(i) >= v, "{v}");
            assert!(i == 0 || Hist::upper(i - 1) < v, "{v}");
        }
    }

    #[test]
    fn names_follow_enum_order() {
        assert_eq!(OP_NAMES[Op::ServiceReady as usize].1, "ServiceReady");
        assert_eq!(OP_NAMES[Op::ExistKey as usize].0, "exist_key");
        assert_eq!(BATCH_NAMES[BatchOp::Remove as usize].1, "BatchRemove");
        assert_eq!(BATCH_NAMES[BatchOp::ExistKey as usize].0, "batch_exist_key");
    }

    #[test]
    fn render_is_valid_exposition_text() {
        let m = Metrics::default();
        m.op(Op::PutStart, false);
        m.batch(BatchOp::ExistKey, 10, 0);
        m.batch(BatchOp::PutEnd, 2, 1);
        let text = m.render(&Gauges {
            key_count: 3,
            ..Default::default()
        });
        let re = regex::Regex::new(r#"^[a-z_]+(\{quantile="0\.\d+"\})? \d+$"#).unwrap();
        let mut names = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(kind == "gauge" || kind == "counter" || kind == "summary");
                assert!(names.insert(name.to_string()), "duplicate {name}");
            } else if !line.starts_with("# HELP ") {
                assert!(re.is_match(line), "bad sample line {line:?}");
            }
        }
        for want in [
            "master_key_count 3",
            "master_put_start_requests_total 1",
            "master_put_start_failures_total 1",
            "master_batch_exist_key_items_total 10",
            "master_batch_put_end_partial_successes_total 1",
            "master_ping_requests_total 0",
            "master_remove_all_failures_total 0",
        ] {
            assert!(text.lines().any(|l| l == want), "missing {want}");
        }
    }
}
