//! The admin HTTP server's read-only view of the master. Nothing here grants a lease or
//! changes recency; copies are made under the lock and formatting happens after it.

use protocol::wire::Wire;
use protocol::{ErrorCode, ReplicaDescriptor};

use super::dispatch::encode_replicas;
use super::metrics::{BatchOp, Hist, Op};
use super::{MasterService, Metrics, State, TierGauges};
use crate::alloc::Fragmentation;
use crate::view::{
    AdminView, ClientStatus, ClusterStatus, Percentiles, QuotaAnswer, SegmentDetail, SegmentStatus,
};

impl AdminView for MasterService {
    /// The default tenant's keys only, as upstream's views (`tenant.rs`).
    fn query_key(&self, key: &str) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        if !protocol::tenant::valid_plain_key(key) {
            return Err(ErrorCode::ObjectNotFound);
        }
        let mut buf = Vec::new();
        {
            let mut st = self.state.lock();
            let (obj, segs) = st.read(0, key, false)?;
            encode_replicas(&mut buf, obj, segs, true);
        }
        // Decoding our own encoding cannot fail; map it to an internal error regardless.
        Vec::<ReplicaDescriptor>::from_bytes(&buf).map_err(|_| ErrorCode::InternalError)
    }

    fn all_keys(&self) -> Vec<String> {
        let st = self.state.lock();
        st.objects
            .iter()
            .map(|(k, _)| k)
            .filter(|k| protocol::tenant::valid_plain_key(k))
            .map(str::to_string)
            .collect()
    }

    fn all_segments(&self) -> Vec<String> {
        let st = self.state.lock();
        st.segs.iter().map(|s| s.name.clone()).collect()
    }

    fn segments_detail(&self) -> Vec<SegmentDetail> {
        let st = self.state.lock();
        st.segs
            .iter()
            .map(|s| SegmentDetail {
                segment_name: s.name.clone(),
                segment_id: s.id.to_string(),
                client_id: s.client.to_string(),
                base_address: s.base,
                size_bytes: s.size,
                te_endpoint: s.te_endpoint.clone(),
                protocol: s.protocol.clone(),
                status: if s.draining_until.is_some() {
                    "DRAINING".to_string()
                } else {
                    "OK".to_string()
                },
                allocator_used_bytes: s.alloc.used_bytes(),
                allocator_capacity_bytes: s.alloc.capacity(),
            })
            .collect()
    }

    fn render_metrics(&self) -> String {
        let g = self.gauges();
        let mut text = self.metrics.render(&g);
        // One pass under the lock: the fragmentation figures, and the (short) quota text.
        let mut quotas = String::new();
        let frag: Vec<(String, Fragmentation)> = {
            let st = self.state.lock();
            st.render_quota_metrics(&mut quotas);
            st.segs
                .iter()
                .map(|s| (s.name.clone(), s.alloc.fragmentation()))
                .collect()
        };
        render_fragmentation(&mut text, &frag);
        text.push_str(&quotas);
        self.kv_events_status().render_metrics(&mut text);
        text
    }

    fn kv_events(&self) -> crate::events::Status {
        self.kv_events_status()
    }

    fn tenant_quotas(&self, tenant: Option<&str>) -> QuotaAnswer {
        self.state.lock().tenant_quotas(tenant)
    }

    fn set_tenant_quota(&self, tenant: &str, bytes: u64) -> QuotaAnswer {
        self.state.lock().set_tenant_quota(tenant, bytes)
    }

    fn delete_tenant_quota(&self, tenant: &str) -> QuotaAnswer {
        self.state.lock().delete_tenant_quota(tenant)
    }

    fn drain_segment(&self, name: &str, deadline_ms: u64) -> Result<(), ErrorCode> {
        let now = self.clock.now_ms();
        self.state.lock().drain_by_name(now, name, deadline_ms)
    }
    fn status(&self) -> ClusterStatus {
        let g = self.gauges();
        let now = self.clock.now_ms();
        let (segments, clients) = {
            let st = self.state.lock();
            members(&st, now)
        };
        let m = &self.metrics;
        let counters = status_counters(m, &g.tier);
        ClusterStatus {
            keys: g.key_count,
            soft_pinned_keys: g.soft_pin_key_count,
            allocated_bytes: g.allocated_bytes,
            capacity_bytes: g.total_capacity_bytes,
            disk_allocated_bytes: g.tier.disk_used_bytes,
            disk_capacity_bytes: g.tier.disk_capacity_bytes,
            disk_objects: g.tier.disk_objects,
            disk_only_objects: g.tier.disk_only_objects,
            segments,
            clients,
            counters,
            put_ms: percentiles(&m.put_ms),
            lookup_us: percentiles(&m.lookup_us),
        }
    }
}

/// Each mounted segment (with how many replicas it holds) and each client, for `status`.
fn members(st: &State, now: u64) -> (Vec<SegmentStatus>, Vec<ClientStatus>) {
    let mut objects = std::collections::HashMap::new();
    for obj in st.objects.values() {
        for r in &obj.replicas {
            *objects.entry(r.seg.idx).or_insert(0u64) += 1;
        }
    }
    let segments: Vec<SegmentStatus> = st
        .segs
        .iter_indexed()
        .map(|(r, s)| SegmentStatus {
            name: s.name.clone(),
            client_id: s.client.to_string(),
            te_endpoint: s.te_endpoint.clone(),
            capacity_bytes: s.alloc.capacity(),
            used_bytes: s.alloc.used_bytes(),
            objects: objects.get(&r).copied().unwrap_or(0),
            state: if s.quarantined {
                "quarantined"
            } else if s.draining_until.is_some() {
                "draining"
            } else if s.ramp.is_some() {
                "ramping"
            } else {
                "ok"
            },
            medium: if s.is_disk() { "disk" } else { "memory" },
        })
        .collect();
    let clients: Vec<ClientStatus> = st
        .clients
        .iter()
        .map(|(id, c)| ClientStatus {
            client_id: id.to_string(),
            last_ping_ms_ago: now.saturating_sub(c.last_seen_ms),
            segments: c.segments.len() as u64,
            quarantined: c.quarantined,
        })
        .collect();
    (segments, clients)
}

/// The counters `status` shows: requests per operation, items per batch operation,
/// evictions, and the disk tier's when a disk is mounted.
fn status_counters(m: &Metrics, tier: &TierGauges) -> Vec<(String, u64)> {
    let mut counters = Vec::new();
    for (name, op) in [
        ("put", Op::PutStart),
        ("upsert", Op::UpsertStart),
        ("get", Op::GetReplicaList),
        ("exist", Op::ExistKey),
        ("remove", Op::Remove),
        ("ping", Op::Ping),
    ] {
        counters.push((name.to_string(), m.op_counts(op).0));
    }
    for (name, op) in [
        ("batch_put_items", BatchOp::PutStart),
        ("batch_upsert_items", BatchOp::UpsertStart),
        ("batch_get_items", BatchOp::GetReplicaList),
        ("batch_exist_items", BatchOp::ExistKey),
        ("batch_remove_items", BatchOp::Remove),
    ] {
        counters.push((name.to_string(), m.batch_counts(op).2));
    }
    counters.push(("evicted_keys".into(), Metrics::get(&m.evicted_keys)));
    counters.push(("evicted_bytes".into(), Metrics::get(&m.evicted_bytes)));
    let t = &tier.stats;
    if tier.disk_segments > 0 {
        for (name, v) in [
            ("offload_queued", t.offloads_queued),
            ("offload_completed", t.offloads_completed),
            ("offload_failed", t.offloads_failed),
            ("offload_skipped", t.offloads_skipped),
            ("promotion_queued", t.promotions_queued),
            ("promotion_completed", t.promotions_completed),
            ("disk_only_read_hits", t.disk_only_hits),
            ("disk_evicted_replicas", t.disk_evicted_replicas),
        ] {
            counters.push((name.into(), v));
        }
    }
    counters
}

fn percentiles(h: &Hist) -> Percentiles {
    Percentiles {
        count: h.count(),
        p50: h.quantile(0.5),
        p90: h.quantile(0.9),
        p99: h.quantile(0.99),
    }
}

/// A gauge: metric name, help text, how to read it from a segment's fragmentation.
type Gauge = (&'static str, &'static str, fn(&Fragmentation) -> f64);

/// Per-segment allocator fragmentation, so operators can see when free space splinters.
fn render_fragmentation(out: &mut String, segs: &[(String, Fragmentation)]) {
    use std::fmt::Write;
    let gauges: [Gauge; 3] = [
        (
            "mooncake_segment_fragmentation_ratio",
            "1 - largest free extent / free extent bytes (0: one free extent)",
            |f| f.ratio(),
        ),
        (
            "mooncake_segment_largest_free_extent_bytes",
            "Largest object that surely fits outside the slabs",
            |f| f.largest_free_extent_bytes as f64,
        ),
        (
            "mooncake_segment_free_extents",
            "Number of free extents",
            |f| f.free_extents as f64,
        ),
    ];
    for (name, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (seg, f) in segs {
            let _ = writeln!(
                out,
                "{name}{{segment=\"{}\"}} {}",
                escape_label(seg),
                value(f)
            );
        }
    }
}

/// Escapes a Prometheus label value (backslash, quote, newline).
pub(crate) fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragmentation_gauges_are_labelled_per_segment() {
        let f = Fragmentation {
            free_bytes: 100,
            extent_free_bytes: 100,
            largest_free_extent_bytes: 25,
            free_extents: 3,
            slabs: 0,
            slab_bytes: 0,
            slab_used_bytes: 0,
        };
        let mut out = String::new();
        render_fragmentation(&mut out, &[("h:1\"x".to_string(), f)]);
        assert!(
            out.contains("mooncake_segment_fragmentation_ratio{segment=\"h:1\\\"x\"} 0.75"),
            "{out}"
        );
        assert!(
            out.contains("mooncake_segment_free_extents{segment=\"h:1\\\"x\"} 3"),
            "{out}"
        );
    }
}
