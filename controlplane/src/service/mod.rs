//! The master's state machine: objects, replicas, leases, pins, segments, clients, eviction.
//!
//! (Skeleton: the helper implementing issue 2's service replaces this body; see
//! `ServiceConfig` for the knobs it must honour.)

/// Allocation strategy (`--allocation_strategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllocationStrategy {
    #[default]
    Random,
    FreeRatioFirst,
}

/// The knobs of the service, resolved from flags by `config`.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceConfig {
    /// `--default_kv_lease_ttl`, milliseconds.
    pub default_kv_lease_ttl_ms: u64,
    /// `--default_kv_soft_pin_ttl`, milliseconds.
    pub default_kv_soft_pin_ttl_ms: u64,
    /// `--max_kv_soft_pin_ttl`, milliseconds.
    pub max_kv_soft_pin_ttl_ms: u64,
    /// `--allow_evict_soft_pinned_objects`.
    pub allow_evict_soft_pinned_objects: bool,
    /// `--eviction_ratio`, in [0, 1].
    pub eviction_ratio: f64,
    /// `--eviction_high_watermark_ratio`, in [0, 1].
    pub eviction_high_watermark_ratio: f64,
    /// `--client_ttl`, seconds.
    pub client_ttl_s: u64,
    /// `--allocation_strategy`.
    pub allocation_strategy: AllocationStrategy,
    /// `--put_start_discard_timeout_sec`.
    pub put_start_discard_timeout_s: u64,
    /// `--put_start_release_timeout_sec`.
    pub put_start_release_timeout_s: u64,
    /// `--cluster_id`.
    pub cluster_id: String,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            default_kv_lease_ttl_ms: 10_000,
            default_kv_soft_pin_ttl_ms: 30 * 60 * 1000,
            max_kv_soft_pin_ttl_ms: 24 * 3600 * 1000,
            allow_evict_soft_pinned_objects: true,
            eviction_ratio: 0.05,
            eviction_high_watermark_ratio: 0.90,
            client_ttl_s: 10,
            allocation_strategy: AllocationStrategy::Random,
            put_start_discard_timeout_s: 30,
            put_start_release_timeout_s: 600,
            cluster_id: "mooncake_cluster".to_string(),
        }
    }
}
