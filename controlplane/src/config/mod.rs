//! Flags and config files of `mooncake_master`, resolved into one typed [`MasterConfig`].
//!
//! This module owns the command-line syntax (see [`args`]), the flag table (see [`flags`]),
//! config files (see [`file`]) and every validation rule. Nothing else in the master reads
//! flags: it receives a `MasterConfig` whose values have all been checked.
//!
//! Precedence, lowest first: built-in defaults, then `--config_path` file values, then flags
//! given explicitly on the command line (including through `--flagfile`). Upstream flags this
//! reimplementation does not act on are accepted and type-checked, and produce a warning when
//! set away from their default (a compat flag at its default changes nothing, and upstream's
//! sample configs list many of them). An unknown flag is an error that names the closest
//! known flag.
//!
//! Usage from a binary (the program name is not part of the arguments):
//! ```no_run
//! use controlplane::config::{MasterConfig, ParsedArgs};
//! match MasterConfig::from_args(std::env::args().skip(1)) {
//!     Ok(ParsedArgs::Run(config, warnings)) => { /* log warnings, start */ }
//!     Ok(ParsedArgs::Help(text) | ParsedArgs::Version(text)) => println!("{text}"),
//!     Err(e) => { eprintln!("mooncake_master: {e}"); std::process::exit(2) }
//! }
//! ```

mod args;
mod error;
mod file;
pub mod flags;
pub mod value;

use std::collections::BTreeMap;
use std::path::PathBuf;

pub use error::ConfigError;
pub use file::MAX_CONFIG_FILE_BYTES;
pub use value::MAX_DURATION_MS;

use crate::service::{AllocationStrategy, ServiceConfig};
use flags::{FlagSpec, Support};

/// Upper bound of `--rpc_thread_num` and `--max_threads`.
pub const MAX_RPC_THREADS: u32 = 1024;
/// Upper bound of second-valued timeouts (`--client_ttl`, `--put_start_*_timeout_sec`).
pub const MAX_TIMEOUT_S: u64 = 365 * 24 * 3600;

/// Every honoured flag of `mooncake_master`, typed and validated.
#[derive(Clone, Debug, PartialEq)]
pub struct MasterConfig {
    /// `--config_path`, when given.
    pub config_path: Option<PathBuf>,
    /// `--port` (deprecated upstream in favour of `--rpc_port`). 0 = any free port.
    pub port: u16,
    /// `--rpc_port`; 0 = use `port`. See [`MasterConfig::rpc_listen_port`].
    pub rpc_port: u16,
    /// `--rpc_address`.
    pub rpc_address: String,
    /// `--rpc_thread_num`; 0 = derive from `max_threads`. See [`MasterConfig::rpc_threads`].
    pub rpc_thread_num: u32,
    /// `--max_threads`.
    pub max_threads: u32,
    /// `--metrics_port`: the admin/metrics HTTP server, bound even without metric reporting.
    pub metrics_port: u16,
    /// `--metrics_host`.
    pub metrics_host: String,
    /// `--enable_metric_reporting`: periodic metric summary in the log.
    pub enable_metric_reporting: bool,
    /// `--enable_http_metadata_server`.
    pub enable_http_metadata_server: bool,
    /// `--http_metadata_server_port`.
    pub http_metadata_server_port: u16,
    /// `--http_metadata_server_host`.
    pub http_metadata_server_host: String,
    /// `--auth_token_file`: the cluster secret's file (`None`: the environment decides, see
    /// `protocol::auth`).
    pub auth_token_file: Option<std::path::PathBuf>,
    /// `--enable_ha` (kept for the HA work; validated: needs a connection string).
    pub enable_ha: bool,
    /// `--etcd_endpoints`, semicolon-separated.
    pub etcd_endpoints: String,
    /// `--ha_backend_connstring`.
    pub ha_backend_connstring: String,
    /// `--ha_backend_type`.
    pub ha_backend_type: String,
    /// `--ha_lease_ttl_sec` (ours; upstream hard-codes 5 s): the leader's etcd lease.
    pub ha_lease_ttl_s: i64,
    /// The knobs of the object service, including `cluster_id`.
    pub service: ServiceConfig,
    /// `--enable_kv_events` and the `--kv_events_*` flags (`crate::events`).
    pub kv_events: crate::events::KvEventsConfig,
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            config_path: None,
            port: 50051,
            rpc_port: 0,
            rpc_address: "0.0.0.0".to_string(),
            rpc_thread_num: 0,
            max_threads: 16,
            metrics_port: 9003,
            metrics_host: "0.0.0.0".to_string(),
            enable_metric_reporting: true,
            enable_http_metadata_server: false,
            http_metadata_server_port: 8080,
            http_metadata_server_host: "0.0.0.0".to_string(),
            auth_token_file: None,
            enable_ha: false,
            etcd_endpoints: String::new(),
            ha_backend_connstring: String::new(),
            ha_backend_type: "etcd".to_string(),
            ha_lease_ttl_s: 2,
            service: ServiceConfig::default(),
            kv_events: Default::default(),
        }
    }
}

/// What the command line asks the binary to do.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // built once at start-up; boxing would only add noise
pub enum ParsedArgs {
    /// Start the master with this configuration; print the warnings first.
    Run(MasterConfig, Vec<String>),
    /// `--help`: print this text and exit 0.
    Help(String),
    /// `--version`: print this text and exit 0.
    Version(String),
}

impl MasterConfig {
    /// Parses the arguments after the program name (`std::env::args().skip(1)`).
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<ParsedArgs, ConfigError> {
        let (command_line, warnings) = match args::scan(args.into_iter().collect())? {
            args::Scan::Help => return Ok(ParsedArgs::Help(flags::help_text())),
            args::Scan::Version => return Ok(ParsedArgs::Version(version_text())),
            args::Scan::Flags(flags, warnings) => (flags, warnings),
        };
        let mut values: BTreeMap<&'static str, (&'static FlagSpec, String)> = BTreeMap::new();
        for (spec, value) in command_line {
            values.insert(spec.name, (spec, value));
        }
        let config_path = match values.get(flags::CONFIG_PATH_FLAG) {
            Some((_, path)) if !path.is_empty() => Some(PathBuf::from(path)),
            _ => None,
        };
        let settings = match &config_path {
            Some(path) => Some(file::load(path)?),
            None => None,
        };
        let parsed = resolve_with_file(values, config_path, settings)?;
        Ok(match parsed {
            ParsedArgs::Run(config, later) => {
                ParsedArgs::Run(config, warnings.into_iter().chain(later).collect())
            }
            other => other,
        })
    }

    /// Resolves a config file's text alone, as `--config_path=<file_name>` with no other flag
    /// would, without touching the file system: `file_name` only picks JSON or YAML by its
    /// extension. For the `master_config` fuzz target and tests; never panics.
    pub fn from_config_text(file_name: &str, text: &str) -> Result<ParsedArgs, ConfigError> {
        let path = PathBuf::from(file_name);
        let settings = file::parse(&path, text)?;
        resolve_with_file(BTreeMap::new(), Some(path), Some(settings))
    }
}

/// Merges the config file's `settings` under the command-line `values`, checks compat flags
/// and resolves the result.
fn resolve_with_file(
    mut values: BTreeMap<&'static str, (&'static FlagSpec, String)>,
    config_path: Option<PathBuf>,
    settings: Option<file::FileSettings>,
) -> Result<ParsedArgs, ConfigError> {
    let mut warnings = Vec::new();
    // Flags whose value came from the config file, so their errors can name it.
    let mut from_file = Vec::new();
    if let Some(settings) = settings {
        warnings.extend(settings.warnings);
        for (spec, value) in settings.values {
            // A flag given on the command line overrides the file.
            if !values.contains_key(spec.name) {
                values.insert(spec.name, (spec, value));
                from_file.push(spec.name);
            }
        }
    }
    let in_file = |error: ConfigError| match (&error, &config_path) {
        (
            ConfigError::InvalidValue { flag, .. } | ConfigError::Unsupported { flag, .. },
            Some(path),
        ) if from_file.contains(&flag.as_str()) => ConfigError::File {
            path: path.clone(),
            message: error.to_string(),
        },
        _ => error,
    };
    for (spec, value) in values.values() {
        if spec.support == Support::Compat {
            value::check_kind(spec.kind, value)
                .map_err(|expected| in_file(ConfigError::invalid(spec.name, expected, value)))?;
            if !value::same_value(spec.kind, value, spec.default) {
                warnings.push(format!(
                    "flag --{} is accepted for compatibility but not supported",
                    spec.name
                ));
            }
        }
    }
    let mut config = resolve(&Values(values)).map_err(in_file)?;
    config.config_path = config_path;
    Ok(ParsedArgs::Run(config, warnings))
}

impl MasterConfig {
    /// The port the RPC server binds: `rpc_port`, or `port` when `rpc_port` is 0.
    pub fn rpc_listen_port(&self) -> u16 {
        if self.rpc_port > 0 {
            self.rpc_port
        } else {
            self.port
        }
    }

    /// RPC worker threads: `rpc_thread_num`, or `min(max_threads, available cores)` when it is 0.
    pub fn rpc_threads(&self) -> usize {
        if self.rpc_thread_num > 0 {
            return self.rpc_thread_num as usize;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (self.max_threads as usize).min(cores).max(1)
    }

    /// The HA backend connection string: `ha_backend_connstring`, or for the etcd backend
    /// `etcd_endpoints`; `None` when neither is set.
    pub fn ha_connstring(&self) -> Option<&str> {
        if !self.ha_backend_connstring.is_empty() {
            Some(&self.ha_backend_connstring)
        } else if self.ha_backend_type == "etcd" && !self.etcd_endpoints.is_empty() {
            Some(&self.etcd_endpoints)
        } else {
            None
        }
    }

    /// `--cluster_id` (stored once, in the service config).
    pub fn cluster_id(&self) -> &str {
        &self.service.cluster_id
    }
}

/// The `--version` text.
pub fn version_text() -> String {
    format!(
        "mooncake_master (mooncake-rs) {}",
        env!("CARGO_PKG_VERSION")
    )
}

/// The merged flag values as text; absent flags read as their default.
struct Values(BTreeMap<&'static str, (&'static FlagSpec, String)>);

impl Values {
    fn raw(&self, name: &str) -> &str {
        match self.0.get(name) {
            Some((_, value)) => value,
            None => flags::lookup(name).map_or("", |spec| spec.default),
        }
    }

    fn get<T>(
        &self,
        name: &str,
        parse: impl Fn(&str) -> Result<T, &'static str>,
    ) -> Result<T, ConfigError> {
        let raw = self.raw(name);
        parse(raw).map_err(|expected| ConfigError::invalid(name, expected, raw))
    }

    fn string(&self, name: &str) -> String {
        self.raw(name).to_string()
    }

    fn host(&self, name: &str) -> Result<String, ConfigError> {
        let raw = self.raw(name).trim();
        if raw.is_empty() {
            return Err(ConfigError::invalid(
                name,
                "an address to bind (e.g. 0.0.0.0 or ::)",
                raw,
            ));
        }
        Ok(raw.to_string())
    }

    fn seconds(&self, name: &str) -> Result<u64, ConfigError> {
        self.get(name, |raw| {
            value::parse_in_range(
                raw,
                1,
                MAX_TIMEOUT_S as i64,
                "a number of seconds in 1..=31536000",
            )
        })
        .map(|v| v as u64)
    }

    fn threads(&self, name: &str, min: i64) -> Result<u32, ConfigError> {
        let expected = if min == 0 {
            "a thread count in 0..=1024"
        } else {
            "a thread count in 1..=1024"
        };
        self.get(name, |raw| {
            value::parse_in_range(raw, min, MAX_RPC_THREADS.into(), expected)
        })
        .map(|v| v as u32)
    }
}

fn resolve(values: &Values) -> Result<MasterConfig, ConfigError> {
    let service = resolve_service(values)?;
    let config = MasterConfig {
        config_path: None,
        port: values.get("port", value::parse_port)?,
        rpc_port: values.get("rpc_port", value::parse_port)?,
        rpc_address: values.host("rpc_address")?,
        rpc_thread_num: values.threads("rpc_thread_num", 0)?,
        max_threads: values.threads("max_threads", 1)?,
        metrics_port: values.get("metrics_port", value::parse_port)?,
        metrics_host: values.host("metrics_host")?,
        enable_metric_reporting: values.get("enable_metric_reporting", value::parse_bool)?,
        enable_http_metadata_server: values
            .get("enable_http_metadata_server", value::parse_bool)?,
        http_metadata_server_port: values.get("http_metadata_server_port", value::parse_port)?,
        http_metadata_server_host: values.host("http_metadata_server_host")?,
        auth_token_file: Some(values.string("auth_token_file"))
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from),
        enable_ha: values.get("enable_ha", value::parse_bool)?,
        etcd_endpoints: values.string("etcd_endpoints"),
        ha_backend_connstring: values.string("ha_backend_connstring"),
        ha_backend_type: values.string("ha_backend_type"),
        ha_lease_ttl_s: values.get("ha_lease_ttl_sec", |raw| {
            value::parse_in_range(raw, 2, 60, "an integer number of seconds in 2..=60")
        })?,
        service,
        kv_events: resolve_kv_events(values)?,
    };
    if config.enable_ha && config.ha_backend_type != "etcd" {
        return Err(ConfigError::Conflict(format!(
            "--ha_backend_type=\"{}\" is not supported: this build elects its leader in etcd",
            config.ha_backend_type
        )));
    }
    if config.enable_ha && config.ha_connstring().is_none() {
        return Err(ConfigError::Conflict(format!(
            "--enable_ha needs --ha_backend_connstring{} (ha_backend_type is \"{}\")",
            if config.ha_backend_type == "etcd" {
                " or --etcd_endpoints"
            } else {
                ""
            },
            config.ha_backend_type
        )));
    }
    Ok(config)
}

/// The replica-task flags (`service::TaskConfig`). Timeouts of 0 mean none, as upstream.
fn resolve_tasks(values: &Values) -> Result<crate::service::TaskConfig, ConfigError> {
    let count = |name: &str| {
        values
            .get(name, |raw| {
                value::parse_in_range(raw, 0, u32::MAX as i64, "a count in 0..=4294967295")
            })
            .map(|v| v as u32)
    };
    let timeout_ms = |name: &str| {
        values
            .get(name, |raw| {
                value::parse_in_range(
                    raw,
                    0,
                    MAX_TIMEOUT_S as i64,
                    "a number of seconds in 0..=31536000 (0: no timeout)",
                )
            })
            .map(|v| v as u64 * 1000)
    };
    Ok(crate::service::TaskConfig {
        max_finished: count("max_total_finished_tasks")?,
        max_pending: count("max_total_pending_tasks")?,
        max_processing: count("max_total_processing_tasks")?,
        pending_timeout_ms: timeout_ms("pending_task_timeout_sec")?,
        processing_timeout_ms: timeout_ms("processing_task_timeout_sec")?,
        max_retry_attempts: count("max_retry_attempts")?,
    })
}

/// The KV-cache event flags (`events::KvEventsConfig`).
fn resolve_kv_events(values: &Values) -> Result<crate::events::KvEventsConfig, ConfigError> {
    let u32_flag = |name: &str, lo: i64, hi: i64, expected: &'static str| {
        values
            .get(name, |raw| value::parse_in_range(raw, lo, hi, expected))
            .map(|v| v as u32)
    };
    Ok(crate::events::KvEventsConfig {
        enabled: values.get("enable_kv_events", value::parse_bool)?,
        endpoint: values.string("kv_events_bind_endpoint").trim().to_string(),
        backend_id: values.string("kv_events_backend_id"),
        model_name: values.string("kv_events_model_name"),
        tenant_id: values.string("kv_events_tenant_id"),
        additional_salt: values.string("kv_events_additional_salt"),
        lora_name: values.string("kv_events_lora_name"),
        block_size: u32_flag(
            "kv_events_block_size",
            0,
            u32::MAX as i64,
            "a count in 0..=4294967295",
        )?,
        dp_rank: u32_flag(
            "kv_events_dp_rank",
            0,
            u32::MAX as i64,
            "a count in 0..=4294967295",
        )?,
        emit_legacy_compat: values.get("kv_events_emit_legacy_compat", value::parse_bool)?,
        emit_object_key: values.get("kv_events_emit_object_key", value::parse_bool)?,
        queue_capacity: u32_flag(
            "kv_events_queue_capacity",
            1,
            crate::limits::KV_EVENT_QUEUE_EVENTS_MAX.into(),
            "a count of events in 1..=16777216",
        )?,
    })
}

/// The disk tier's flags (`service::OffloadConfig`).
fn resolve_offload(values: &Values) -> Result<crate::service::OffloadConfig, ConfigError> {
    let ranged = |name: &str, lo: i64, hi: i64, expected: &'static str| {
        values.get(name, |raw| value::parse_in_range(raw, lo, hi, expected))
    };
    Ok(crate::service::OffloadConfig {
        enabled: values.get("enable_offload", value::parse_bool)?,
        on_evict: values.get("offload_on_evict", value::parse_bool)?,
        force_evict: values.get("offload_force_evict", value::parse_bool)?,
        queue_limit: ranged(
            "offloading_queue_limit",
            1,
            100_000_000,
            "a count in 1..=100000000",
        )? as u64,
        cap_ratio: values.get("offload_cap_ratio", value::parse_ratio)?,
        promotion_on_hit: values.get("promotion_on_hit", value::parse_bool)?,
        promotion_threshold: ranged(
            "promotion_admission_threshold",
            1,
            u32::MAX as i64,
            "a count in 1..=4294967295",
        )? as u32,
        promotion_max_per_heartbeat: ranged(
            "promotion_max_per_heartbeat",
            1,
            u32::MAX as i64,
            "a count in 1..=4294967295",
        )? as u32,
        promotion_queue_limit: ranged(
            "promotion_queue_limit",
            0,
            u32::MAX as i64,
            "a count in 0..=4294967295",
        )? as u64,
        total_bytes_limit: values.get("offload_total_bytes_limit", value::parse_u64)?,
    })
}

/// The tenant quota policy file (`service/quota.rs`), read now so that a bad one stops the
/// master with the reason. Only with `--enable_multi_tenants`; without a URI there are no
/// quotas (upstream refuses to start then).
fn resolve_tenant_quota(
    values: &Values,
) -> Result<Option<crate::service::quota::QuotaPolicy>, ConfigError> {
    let uri = values.string("tenant_quota_connector_uri");
    if !values.get("enable_multi_tenants", value::parse_bool)? || uri.is_empty() {
        return Ok(None);
    }
    let kind = values.string("tenant_quota_connector_type");
    if kind != "file" {
        return Err(ConfigError::Unsupported {
            flag: "tenant_quota_connector_type".into(),
            given: kind,
            detail: "this build reads the policy from a file only (\"file\")".into(),
        });
    }
    crate::service::quota::QuotaPolicy::load(std::path::Path::new(&uri))
        .map(Some)
        .map_err(|e| ConfigError::InvalidValue {
            flag: "tenant_quota_connector_uri".into(),
            expected: "a readable tenant quota policy file".into(),
            given: format!("{uri}: {e}"),
        })
}

fn resolve_service(values: &Values) -> Result<ServiceConfig, ConfigError> {
    let positive_duration = |name: &str| {
        values.get(name, |raw| match value::parse_duration_ms(raw) {
            Ok(0) => Err("a duration greater than 0 (raw milliseconds or ms|s|m|h suffix)"),
            other => other,
        })
    };
    let service = ServiceConfig {
        default_kv_lease_ttl_ms: values.get("default_kv_lease_ttl", value::parse_duration_ms)?,
        default_kv_soft_pin_ttl_ms: positive_duration("default_kv_soft_pin_ttl")?,
        max_kv_soft_pin_ttl_ms: positive_duration("max_kv_soft_pin_ttl")?,
        allow_evict_soft_pinned_objects: values
            .get("allow_evict_soft_pinned_objects", value::parse_bool)?,
        eviction_ratio: values.get("eviction_ratio", value::parse_ratio)?,
        eviction_high_watermark_ratio: values
            .get("eviction_high_watermark_ratio", value::parse_ratio)?,
        client_ttl_s: values.seconds("client_ttl")?,
        allocation_strategy: allocation_strategy(values.raw("allocation_strategy"))?,
        put_start_discard_timeout_s: values.seconds("put_start_discard_timeout_sec")?,
        put_start_release_timeout_s: values.seconds("put_start_release_timeout_sec")?,
        cluster_id: values.string("cluster_id"),
        quarantine_grace_ms: positive_duration("quarantine_grace")?,
        multi_tenants: values.get("enable_multi_tenants", value::parse_bool)?,
        tenant_quota: resolve_tenant_quota(values)?,
        tasks: resolve_tasks(values)?,
        offload: resolve_offload(values)?,
        admission_ramp_ms: values.get("admission_ramp_sec", |raw| {
            value::parse_in_range(raw, 0, 3600, "a number of seconds in 0..=3600")
        })? as u64
            * 1000,
    };
    if service.default_kv_soft_pin_ttl_ms > service.max_kv_soft_pin_ttl_ms {
        return Err(ConfigError::Conflict(format!(
            "--default_kv_soft_pin_ttl ({} ms) must not exceed --max_kv_soft_pin_ttl ({} ms)",
            service.default_kv_soft_pin_ttl_ms, service.max_kv_soft_pin_ttl_ms
        )));
    }
    if service.put_start_release_timeout_s < service.put_start_discard_timeout_s {
        return Err(ConfigError::Conflict(format!(
            "--put_start_release_timeout_sec ({} s) must be at least \
             --put_start_discard_timeout_sec ({} s)",
            service.put_start_release_timeout_s, service.put_start_discard_timeout_s
        )));
    }
    Ok(service)
}

fn allocation_strategy(raw: &str) -> Result<AllocationStrategy, ConfigError> {
    match raw.trim() {
        "random" => Ok(AllocationStrategy::Random),
        "free_ratio_first" => Ok(AllocationStrategy::FreeRatioFirst),
        other @ ("cxl" | "ssd_free_ratio_first" | "local_first") => Err(ConfigError::Unsupported {
            flag: "allocation_strategy".to_string(),
            given: other.to_string(),
            detail: "mooncake-rs supports only random and free_ratio_first".to_string(),
        }),
        other => Err(ConfigError::invalid(
            "allocation_strategy",
            "random or free_ratio_first",
            other,
        )),
    }
}

#[cfg(test)]
mod tests;
