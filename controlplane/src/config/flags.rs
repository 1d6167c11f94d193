//! The flag table: every flag `mooncake_master` accepts, its type, default and help text.
//!
//! Invariants: names are unique (checked by a test); every default parses as its kind; a flag is
//! either honoured (it has a typed field in [`super::MasterConfig`]) or accepted for
//! compatibility (type-checked, then ignored with a warning when set away from its default).

/// The type of a flag's value, as gflags declares it upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagKind {
    Bool,
    Int32,
    Int64,
    UInt32,
    UInt64,
    Double,
    Str,
    /// Milliseconds, raw or with an `ms|s|m|h` suffix.
    Duration,
}

impl FlagKind {
    pub fn name(self) -> &'static str {
        match self {
            FlagKind::Bool => "bool",
            FlagKind::Int32 => "int32",
            FlagKind::Int64 => "int64",
            FlagKind::UInt32 => "uint32",
            FlagKind::UInt64 => "uint64",
            FlagKind::Double => "double",
            FlagKind::Str => "string",
            FlagKind::Duration => "duration",
        }
    }
}

/// Whether the reimplementation acts on a flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// Resolved into a typed field of `MasterConfig`.
    Honoured,
    /// Parsed and type-checked for upstream compatibility, then ignored with a warning.
    Compat,
}

/// One accepted flag.
#[derive(Clone, Copy, Debug)]
pub struct FlagSpec {
    pub name: &'static str,
    pub kind: FlagKind,
    /// The default as gflags would print it.
    pub default: &'static str,
    pub help: &'static str,
    pub support: Support,
}

const fn honoured(
    name: &'static str,
    kind: FlagKind,
    default: &'static str,
    help: &'static str,
) -> FlagSpec {
    FlagSpec {
        name,
        kind,
        default,
        help,
        support: Support::Honoured,
    }
}

const fn compat(name: &'static str, kind: FlagKind, default: &'static str) -> FlagSpec {
    FlagSpec {
        name,
        kind,
        default,
        help: "",
        support: Support::Compat,
    }
}

use FlagKind::{Bool, Double, Duration, Int32, Int64, Str, UInt32, UInt64};

/// Flags that stop parsing and print something instead.
pub const HELP_FLAGS: &[&str] = &["help", "helpfull", "helpshort", "h"];
pub const VERSION_FLAG: &str = "version";
/// Names a JSON or YAML config file whose keys are flag names.
pub const CONFIG_PATH_FLAG: &str = "config_path";

/// Config-file keys that name a flag differently (key, flag).
pub const FILE_KEY_ALIASES: &[(&str, &str)] = &[
    ("client_live_ttl_sec", "client_ttl"),
    ("client_active_ttl_sec", "client_ttl"),
];

/// Every flag, honoured ones first (that is also the `--help` order).
pub const FLAGS: &[FlagSpec] = &[
    honoured(
        CONFIG_PATH_FLAG,
        Str,
        "",
        "master service config file path (JSON or YAML)",
    ),
    honoured(
        "port",
        Int32,
        "50051",
        "Port for master service to listen on (deprecated, use rpc_port); 0 = any free port",
    ),
    honoured(
        "rpc_port",
        Int32,
        "0",
        "Port for RPC server to listen on (0 = use port, preferred over port)",
    ),
    honoured(
        "rpc_address",
        Str,
        "0.0.0.0",
        "Address for RPC server to bind to, required in HA mode",
    ),
    honoured(
        "rpc_thread_num",
        Int32,
        "0",
        "Number of threads for RPC server (0 = use max_threads, preferred over max_threads)",
    ),
    honoured(
        "max_threads",
        Int32,
        "16",
        "Maximum number of threads to use (deprecated, use rpc_thread_num)",
    ),
    honoured(
        "metrics_port",
        Int32,
        "9003",
        "Port for HTTP metrics/admin server to listen on",
    ),
    honoured(
        "metrics_host",
        Str,
        "0.0.0.0",
        "Address for the HTTP metrics/admin server to listen on (\"::\" for IPv6)",
    ),
    honoured(
        "enable_metric_reporting",
        Bool,
        "true",
        "Enable periodic metric reporting",
    ),
    honoured(
        "enable_http_metadata_server",
        Bool,
        "false",
        "Enable HTTP metadata server instead of etcd",
    ),
    honoured(
        "http_metadata_server_port",
        Int32,
        "8080",
        "Port for HTTP metadata server to listen on",
    ),
    honoured(
        "http_metadata_server_host",
        Str,
        "0.0.0.0",
        "Host for HTTP metadata server to bind to",
    ),
    honoured(
        "auth_token_file",
        Str,
        "",
        "File holding the cluster secret; when set, RPC peers and metadata writers must prove it (env MC_AUTH_TOKEN / MC_AUTH_TOKEN_FILE otherwise)",
    ),
    honoured(
        "cluster_id",
        Str,
        protocol::DEFAULT_CLUSTER_ID,
        "Cluster ID for the master service",
    ),
    honoured(
        "default_kv_lease_ttl",
        Duration,
        "10000",
        "Default lease time for kv objects (raw milliseconds or ms|s|m|h suffix)",
    ),
    honoured(
        "default_kv_soft_pin_ttl",
        Duration,
        "1800000",
        "Default soft pin TTL for kv objects (raw milliseconds or ms|s|m|h suffix)",
    ),
    honoured(
        "max_kv_soft_pin_ttl",
        Duration,
        "86400000",
        "Maximum request-level soft pin TTL for kv objects (raw milliseconds or ms|s|m|h suffix)",
    ),
    honoured(
        "allow_evict_soft_pinned_objects",
        Bool,
        "true",
        "Whether to allow eviction of soft pinned objects during eviction",
    ),
    honoured(
        "eviction_ratio",
        Double,
        "0.05",
        "Ratio of objects to evict when memory space is full, in [0, 1]",
    ),
    honoured(
        "eviction_high_watermark_ratio",
        Double,
        "0.90",
        "Usage ratio that triggers eviction, in [0, 1]",
    ),
    honoured(
        "client_ttl",
        Int64,
        "10",
        "Seconds a client stays alive after its last heartbeat (config key: client_live_ttl_sec)",
    ),
    honoured(
        "admission_ramp_sec",
        Int64,
        "5",
        "Seconds over which a freshly mounted segment's share of new replicas ramps up to its \
         fair share instead of taking all of them; 0 turns the ramp off (not an upstream flag)",
    ),
    honoured(
        "quarantine_grace",
        Duration,
        "3000",
        "Silence after which a client's segments take no new allocation until it pings again; \
         its replicas are kept (raw milliseconds or ms|s|m|h suffix; not an upstream flag)",
    ),
    honoured(
        "enable_multi_tenants",
        Bool,
        "false",
        "Give each tenant_id its own key space (off: every tenant shares the default one, as \
         upstream), with quotas from --tenant_quota_connector_uri",
    ),
    honoured(
        "tenant_quota_connector_type",
        Str,
        "file",
        "Tenant quota policy connector type (file)",
    ),
    honoured(
        "tenant_quota_connector_uri",
        Str,
        "",
        "Tenant quota policy file (YAML: version: 1, tenants: [{name, quota}]); empty: no \
         quotas",
    ),
    honoured(
        "allocation_strategy",
        Str,
        "random",
        "Allocation strategy for segments: random / free_ratio_first",
    ),
    honoured(
        "put_start_discard_timeout_sec",
        UInt64,
        "30",
        "Timeout for discarding uncompleted PutStart operations",
    ),
    honoured(
        "put_start_release_timeout_sec",
        UInt64,
        "600",
        "Timeout for releasing space allocated in uncompleted PutStart operations",
    ),
    honoured(
        "max_total_finished_tasks",
        UInt32,
        "10000",
        "Maximum number of finished tasks to keep in memory",
    ),
    honoured(
        "max_total_pending_tasks",
        UInt32,
        "10000",
        "Maximum number of pending tasks to keep in memory",
    ),
    honoured(
        "max_total_processing_tasks",
        UInt32,
        "10000",
        "Maximum number of processing tasks to keep in memory",
    ),
    honoured(
        "pending_task_timeout_sec",
        UInt64,
        "300",
        "Timeout in seconds for pending tasks (0 = no timeout)",
    ),
    honoured(
        "processing_task_timeout_sec",
        UInt64,
        "300",
        "Timeout in seconds for processing tasks (0 = no timeout)",
    ),
    honoured(
        "max_retry_attempts",
        UInt32,
        "10",
        "Maximum number of retry attempts for failed tasks (only NO_AVAILABLE_HANDLE is retried)",
    ),
    honoured(
        "enable_offload",
        Bool,
        "false",
        "Enable the disk tier's master side: offload objects to their owners' disk segments \
         and promote them back (docs/tiering.md)",
    ),
    honoured(
        "offload_on_evict",
        Bool,
        "false",
        "Offload an object when memory eviction picks it (false: right after its put completes)",
    ),
    honoured(
        "offload_force_evict",
        Bool,
        "false",
        "With offload_on_evict: drop objects picked beyond the per-pass offload cap instead of \
         keeping them in memory",
    ),
    honoured(
        "offloading_queue_limit",
        UInt64,
        "50000",
        "Offload tasks pending or in progress per disk segment, in 1..=100000000; more are skipped",
    ),
    honoured(
        "offload_cap_ratio",
        Double,
        "0.5",
        "Offload moves per eviction pass, as a share of offloading_queue_limit, in [0, 1]",
    ),
    honoured(
        "offload_total_bytes_limit",
        UInt64,
        "0",
        "Most bytes allocated on all disk segments together; an offload past it evicts disk \
         replicas first or waits (0: no limit; not an upstream flag)",
    ),
    honoured(
        "promotion_on_hit",
        Bool,
        "false",
        "Copy a disk-only object back into memory after promotion_admission_threshold reads",
    ),
    honoured(
        "promotion_admission_threshold",
        UInt32,
        "2",
        "Reads of a disk-only object before it is promoted (1 = on its first read), >= 1",
    ),
    honoured(
        "promotion_max_per_heartbeat",
        UInt32,
        "1",
        "Promotion tasks handed to one owner per task fetch (about one per second), >= 1",
    ),
    honoured(
        "promotion_queue_limit",
        UInt32,
        "50000",
        "Promotion tasks pending or in progress, cluster-wide",
    ),
    honoured(
        "enable_ha",
        Bool,
        "false",
        "Enable high availability using the configured HA backend",
    ),
    honoured(
        "etcd_endpoints",
        Str,
        "",
        "Endpoints of etcd, separated by semicolon, required in HA mode",
    ),
    honoured(
        "ha_backend_connstring",
        Str,
        "",
        "HA backend connection string (for etcd, falls back to etcd_endpoints)",
    ),
    honoured("ha_backend_type", Str, "etcd", "HA backend type"),
    honoured(
        "ha_lease_ttl_sec",
        Int64,
        "2",
        "TTL of the leader's etcd lease, seconds (2..=60): bounds failover time after a crash",
    ),
    honoured(
        "enable_kv_events",
        Bool,
        "false",
        "Publish KV-cache events (objects stored and removed) on a ZeroMQ PUB socket for \
         cache-aware routers (docs/kv-events.md)",
    ),
    honoured(
        "kv_events_bind_endpoint",
        Str,
        "",
        "ZeroMQ endpoint the KV event publisher binds (empty: tcp://0.0.0.0:5557)",
    ),
    honoured(
        "kv_events_model_name",
        Str,
        "",
        "Model name of the pool (events carry nil; the router's registration supplies it)",
    ),
    honoured(
        "kv_events_backend_id",
        Str,
        "",
        "backend_id of every KV event",
    ),
    honoured(
        "kv_events_tenant_id",
        Str,
        "default",
        "tenant_id of KV events for objects of the default tenant",
    ),
    honoured(
        "kv_events_additional_salt",
        Str,
        "",
        "Additional salt of the pool (events carry nil)",
    ),
    honoured(
        "kv_events_lora_name",
        Str,
        "",
        "LoRA name of the pool (events carry nil)",
    ),
    honoured(
        "kv_events_block_size",
        UInt32,
        "0",
        "Block size of the pool in tokens (events carry nil)",
    ),
    honoured(
        "kv_events_dp_rank",
        UInt32,
        "0",
        "dp_rank of every KV event batch",
    ),
    honoured(
        "kv_events_emit_legacy_compat",
        Bool,
        "true",
        "Also emit the legacy fields (type, block_hashes, parent_block_hash)",
    ),
    honoured(
        "kv_events_emit_object_key",
        Bool,
        "true",
        "Emit each event's object_key",
    ),
    honoured(
        "kv_events_queue_capacity",
        UInt32,
        "65536",
        "KV events queued for the publisher thread; past it events are dropped and counted",
    ),
    // Upstream master flags this reimplementation does not act on.
    compat("nof_eviction_ratio", Double, "0.05"),
    compat("nof_eviction_high_watermark_ratio", Double, "0.90"),
    compat("rpc_interface", Str, ""),
    compat("rpc_conn_timeout_seconds", Int32, "0"),
    compat("rpc_enable_tcp_no_delay", Bool, "true"),
    compat("dynamic_replication_mode", Str, "off"),
    compat("dynamic_replication_heat_window_seconds", UInt32, "10"),
    compat("dynamic_replication_admission_qps_threshold", Double, "0.8"),
    compat("dynamic_replication_max_memory_replicas", UInt64, "2"),
    compat("nof_heartbeat_interval_sec", Int64, "10"),
    compat("nof_heartbeat_probe_timeout_ms", UInt32, "1000"),
    compat("nof_heartbeat_failures_threshold", UInt32, "3"),
    compat("root_fs_dir", Str, ""),
    compat("global_file_segment_size", Int64, "9223372036854775807"),
    compat("enable_oplog", Bool, "false"),
    compat("oplog_poll_interval_ms", Int32, "1000"),
    compat("oplog_batch_max_entries", UInt32, "1024"),
    compat("batch_oplog_retry_timeout_sec", UInt32, "180"),
    compat("memory_allocator", Str, "offset"),
    compat("enable_metadata_cleanup_on_timeout", Bool, "false"),
    compat("pod_name", Str, ""),
    compat("pod_namespace", Str, ""),
    compat("enable_disk_eviction", Bool, "true"),
    compat("quota_bytes", UInt64, "0"),
    compat("snapshot_backup_dir", Str, ""),
    compat("enable_snapshot_restore", Bool, "false"),
    compat("enable_snapshot", Bool, "false"),
    compat("snapshot_interval_seconds", UInt64, "600"),
    compat("snapshot_child_timeout_seconds", UInt64, "300"),
    compat("snapshot_retention_count", UInt32, "2"),
    compat("snapshot_object_store_type", Str, ""),
    compat("snapshot_payload_store_type", Str, ""),
    compat("snapshot_payload_backend_type", Str, ""),
    compat("snapshot_catalog_store_type", Str, ""),
    compat("snapshot_catalog_backend_type", Str, ""),
    compat("snapshot_catalog_store_connstring", Str, ""),
    compat("snapshot_catalog_backend_connstring", Str, ""),
    compat("cxl_path", Str, "/dev/dax0.0"),
    compat("cxl_size", UInt64, "8589934592"),
    compat("enable_cxl", Bool, "false"),
    // Upstream's mmap arena for its buffers (0.3.13); ours allocates segments its own way.
    compat("use_mmap_arena_allocator", Bool, "false"),
    compat("mmap_arena_pool_size", UInt64, "8589934592"),
    // glog's flags (logging goes through `tracing` and MC_LOG_LEVEL instead).
    compat("log_dir", Str, ""),
    compat("v", Int32, "0"),
    compat("vmodule", Str, ""),
    compat("logtostderr", Bool, "false"),
    compat("alsologtostderr", Bool, "false"),
    compat("colorlogtostderr", Bool, "false"),
    compat("minloglevel", Int32, "0"),
    compat("stderrthreshold", Int32, "2"),
    compat("log_prefix", Bool, "true"),
    compat("log_link", Str, ""),
    compat("logfile_mode", Int32, "436"),
    compat("max_log_size", UInt32, "1800"),
    compat("stop_logging_if_full_disk", Bool, "false"),
    compat("logbuflevel", Int32, "0"),
    compat("logbufsecs", Int32, "30"),
    compat("log_backtrace_at", Str, ""),
    compat("symbolize_stacktrace", Bool, "true"),
    compat("drop_log_memory", Bool, "true"),
    compat("alsologtoemail", Str, ""),
    compat("logemaillevel", Int32, "999"),
    compat("logmailer", Str, "/bin/mail"),
];

/// The spec of a flag by exact name.
pub fn lookup(name: &str) -> Option<&'static FlagSpec> {
    FLAGS.iter().find(|f| f.name == name)
}

/// Every name a user may type, for "did you mean" suggestions.
fn all_names() -> impl Iterator<Item = &'static str> {
    FLAGS
        .iter()
        .map(|f| f.name)
        .chain(HELP_FLAGS.iter().copied())
        .chain([VERSION_FLAG])
        .chain(protocol::gflags::META_FLAGS)
}

/// The known flag closest to `name` by edit distance (dashes read as underscores), if it is
/// close enough to be a plausible typo.
pub fn closest(name: &str) -> Option<&'static str> {
    let wanted = name.replace('-', "_");
    let (best, distance) = all_names()
        .map(|known| (known, edit_distance(&wanted, known)))
        .min_by_key(|&(_, d)| d)?;
    let limit = wanted.chars().count().max(best.len()) / 3 + 1;
    (distance <= limit).then_some(best)
}

/// Levenshtein distance over chars.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = previous[j] + usize::from(ca != cb);
            current[j + 1] = substitute.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// The `--help` text.
pub fn help_text() -> String {
    let mut out = String::from(
        "mooncake_master (mooncake-rs): the Mooncake store master.\n\n\
         Usage: mooncake_master [--flag=value | --flag value | --flag | --noflag]...\n\n\
         Flags:\n",
    );
    for flag in FLAGS.iter().filter(|f| f.support == Support::Honoured) {
        out.push_str(&format!(
            "  --{} ({}; default: \"{}\")\n      {}\n",
            flag.name,
            flag.kind.name(),
            flag.default,
            flag.help
        ));
    }
    out.push_str(
        "  --flagfile (string)\n      Read more flags from these files (comma-separated), one per line\n\
         \x20 --fromenv, --tryfromenv (string)\n      Read these flags (comma-separated) from FLAGS_<name> \
         variables\n\
         \x20 --undefok (string)\n      Unknown flags (comma-separated) to ignore; they must use \
         --flag=value\n\
         \x20 --help, --version\n\n\
         Accepted for compatibility with upstream and glog, but not supported (a warning is\n\
         printed when one is set away from its default):\n",
    );
    for flag in FLAGS.iter().filter(|f| f.support == Support::Compat) {
        out.push_str(&format!(
            "  --{} ({}; default: \"{}\")\n",
            flag.name,
            flag.kind.name(),
            flag.default
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::value::check_kind;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_defaults_parse() {
        let mut seen = HashSet::new();
        for flag in FLAGS {
            assert!(seen.insert(flag.name), "duplicate flag {}", flag.name);
            assert!(
                check_kind(flag.kind, flag.default).is_ok(),
                "bad default for {}",
                flag.name
            );
        }
        let meta = protocol::gflags::META_FLAGS;
        for name in HELP_FLAGS.iter().chain(&[VERSION_FLAG]).chain(&meta) {
            assert!(
                lookup(name).is_none(),
                "{name} is special and must not be in FLAGS"
            );
        }
    }

    #[test]
    fn edit_distance_cases() {
        let cases = [
            ("", "", 0),
            ("abc", "", 3),
            ("", "abc", 3),
            ("port", "port", 0),
            ("prot", "port", 2),
            ("portt", "port", 1),
            ("kitten", "sitting", 3),
        ];
        for (a, b, want) in cases {
            assert_eq!(edit_distance(a, b), want, "{a} vs {b}");
        }
    }

    #[test]
    fn closest_suggestions() {
        let cases = [
            ("eviction_ration", Some("eviction_ratio")),
            ("portt", Some("port")),
            ("rpc-port", Some("rpc_port")),
            ("metric_port", Some("metrics_port")),
            ("default_kv_lease_tll", Some("default_kv_lease_ttl")),
            ("enable_http_metadata", Some("enable_http_metadata_server")),
            ("completely_unrelated_thing_xyz", None),
        ];
        for (typed, want) in cases {
            assert_eq!(closest(typed), want, "{typed}");
        }
    }

    #[test]
    fn help_lists_every_flag_with_defaults() {
        let help = help_text();
        for flag in FLAGS {
            assert!(
                help.contains(&format!("--{} (", flag.name)),
                "{} missing",
                flag.name
            );
        }
        assert!(help.contains("--port (int32; default: \"50051\")"));
        assert!(help.contains("Default lease time for kv objects"));
    }
}
