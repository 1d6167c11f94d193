//! What the admin HTTP server may ask of the master: read-only views and the metrics text.
//! The HTTP layer depends on this trait, not on the service, so each can be tested alone.

use protocol::{ErrorCode, ReplicaDescriptor};
use serde::Serialize;

/// One row of `/get_segments_detail`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentDetail {
    pub segment_name: String,
    pub segment_id: String,
    pub client_id: String,
    pub base_address: u64,
    pub size_bytes: u64,
    pub te_endpoint: String,
    pub protocol: String,
    /// `OK`, `DRAINING` (graceful unmount in progress).
    pub status: String,
    pub allocator_used_bytes: u64,
    pub allocator_capacity_bytes: u64,
}

/// The cluster at a glance, for the status page (`/status.json`, `docs/master.md`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClusterStatus {
    pub keys: u64,
    pub soft_pinned_keys: u64,
    pub allocated_bytes: u64,
    pub capacity_bytes: u64,
    /// Disk segments' figures (`docs/tiering.md`); the two above are memory's.
    pub disk_allocated_bytes: u64,
    pub disk_capacity_bytes: u64,
    /// Objects with a disk replica, and those with disk replicas only.
    pub disk_objects: u64,
    pub disk_only_objects: u64,
    pub segments: Vec<SegmentStatus>,
    pub clients: Vec<ClientStatus>,
    /// Running totals (requests per operation, evictions): the page turns them into rates.
    pub counters: Vec<(String, u64)>,
    /// PutStart to PutEnd of puts and upserts, as the master sees them (ms).
    pub put_ms: Percentiles,
    /// Time the master takes to answer a replica lookup (µs).
    pub lookup_us: Percentiles,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SegmentStatus {
    pub name: String,
    pub client_id: String,
    pub te_endpoint: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// Replicas placed in this segment.
    pub objects: u64,
    /// `ok`, `draining` (graceful unmount) or `quarantined` (its owner stopped pinging).
    pub state: &'static str,
    /// `memory`, or `disk` for an owner's disk segment (`docs/tiering.md`).
    pub medium: &'static str,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClientStatus {
    pub client_id: String,
    pub last_ping_ms_ago: u64,
    pub segments: u64,
    pub quarantined: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
}

/// A refused tenant quota request of the admin API: HTTP status, code, message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaRefusal {
    pub status: u16,
    pub code: ErrorCode,
    pub message: String,
}

impl QuotaRefusal {
    pub fn new(status: u16, code: ErrorCode, message: impl Into<String>) -> QuotaRefusal {
        QuotaRefusal {
            status,
            code,
            message: message.into(),
        }
    }

    /// Tenant quotas are off (no `--enable_multi_tenants`, or no policy file).
    pub fn off() -> QuotaRefusal {
        let code = ErrorCode::UnavailableInCurrentMode;
        QuotaRefusal::new(409, code, code.name())
    }
}

/// What the tenant quota API answers: the `data` of a success, or a refusal.
pub type QuotaAnswer = Result<serde_json::Value, QuotaRefusal>;

pub trait AdminView: Send + Sync + 'static {
    /// Readable replicas of a key, without granting a lease.
    fn query_key(&self, key: &str) -> Result<Vec<ReplicaDescriptor>, ErrorCode>;
    fn all_keys(&self) -> Vec<String>;
    fn all_segments(&self) -> Vec<String>;
    fn segments_detail(&self) -> Vec<SegmentDetail>;
    /// Prometheus text exposition (version 0.0.4) of every master metric.
    fn render_metrics(&self) -> String;
    /// The cluster at a glance (one pass over the index under the lock).
    fn status(&self) -> ClusterStatus;
    /// `GET /kv_events/status`: the KV-cache event publisher (`crate::events`).
    fn kv_events(&self) -> crate::events::Status {
        crate::events::Status::disabled()
    }
    /// `GET /api/v1/tenant_quotas`: every tenant's row, or `tenant`'s (`service/quota.rs`).
    fn tenant_quotas(&self, tenant: Option<&str>) -> QuotaAnswer {
        let _ = tenant;
        Err(QuotaRefusal::off())
    }
    /// `PUT /api/v1/tenant_quotas`: sets `tenant`'s requested quota (and writes the file).
    fn set_tenant_quota(&self, tenant: &str, bytes: u64) -> QuotaAnswer {
        let _ = (tenant, bytes);
        Err(QuotaRefusal::off())
    }
    /// `POST /api/v1/drain`: drains segment `name` with a deadline `deadline_ms` from now
    /// (`service/drain.rs`).
    fn drain_segment(&self, name: &str, deadline_ms: u64) -> Result<(), ErrorCode> {
        let _ = (name, deadline_ms);
        Err(ErrorCode::SegmentNotFound)
    }
    /// `DELETE /api/v1/tenant_quotas`: drops `tenant`'s policy when it holds nothing.
    fn delete_tenant_quota(&self, tenant: &str) -> QuotaAnswer {
        let _ = tenant;
        Err(QuotaRefusal::off())
    }
}
