//! What the admin HTTP server may ask of the master: read-only views and the metrics text.
//! The HTTP layer depends on this trait, not on the service, so each can be tested alone.

use protocol::{ErrorCode, ReplicaDescriptor};

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

pub trait AdminView: Send + Sync + 'static {
    /// Readable replicas of a key, without granting a lease.
    fn query_key(&self, key: &str) -> Result<Vec<ReplicaDescriptor>, ErrorCode>;
    fn all_keys(&self) -> Vec<String>;
    fn all_segments(&self) -> Vec<String>;
    fn segments_detail(&self) -> Vec<SegmentDetail>;
    /// Prometheus text exposition (version 0.0.4) of every master metric.
    fn render_metrics(&self) -> String;
}
