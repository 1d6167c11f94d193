//! Fuzzes the master's configuration input: `--config_path` files (JSON and YAML, through
//! `MasterConfig::from_config_text`, which runs the same merge and validation as a real
//! `--config_path`), the tenant quota policy file (`--tenant_quota_connector_uri`,
//! `service::quota`), and the single-value parsers of `controlplane::config::value` that every
//! flag goes through (booleans, integers, ratios, ports, durations) and of quota sizes.
//!
//! Nothing may panic. A config that resolves obeys the cross-flag rules the resolver promises;
//! a value that parses is in its documented range and its canonical spelling parses back to it.
#![no_main]

use controlplane::config::flags::FlagKind;
use controlplane::config::value;
use controlplane::config::{
    MasterConfig, ParsedArgs, MAX_DURATION_MS, MAX_RPC_THREADS, MAX_TIMEOUT_S,
};
use controlplane::service::quota::{parse_policy, parse_quota, render_policy, QUOTA_MAX_BYTES};
use libfuzzer_sys::fuzz_target;

const FILE_NAMES: [&str; 4] = ["master.json", "master.yaml", "master.yml", "master.conf"];
const KINDS: [FlagKind; 8] = [
    FlagKind::Bool,
    FlagKind::Int32,
    FlagKind::Int64,
    FlagKind::UInt32,
    FlagKind::UInt64,
    FlagKind::Double,
    FlagKind::Str,
    FlagKind::Duration,
];

fn check_file(name: &str, text: &str) {
    let Ok(ParsedArgs::Run(config, _warnings)) = MasterConfig::from_config_text(name, text) else {
        return;
    };
    let s = &config.service;
    assert!(
        s.default_kv_soft_pin_ttl_ms <= s.max_kv_soft_pin_ttl_ms,
        "{s:?}"
    );
    assert!(s.default_kv_soft_pin_ttl_ms > 0, "{s:?}");
    assert!(
        s.put_start_release_timeout_s >= s.put_start_discard_timeout_s,
        "{s:?}"
    );
    for seconds in [
        s.client_ttl_s,
        s.put_start_discard_timeout_s,
        s.put_start_release_timeout_s,
    ] {
        assert!((1..=MAX_TIMEOUT_S).contains(&seconds), "{s:?}");
    }
    for ms in [s.default_kv_lease_ttl_ms, s.max_kv_soft_pin_ttl_ms] {
        assert!(ms <= MAX_DURATION_MS, "{s:?}");
    }
    for ratio in [s.eviction_ratio, s.eviction_high_watermark_ratio] {
        assert!((0.0..=1.0).contains(&ratio), "{s:?}");
    }
    assert!(config.max_threads >= 1 && config.max_threads <= MAX_RPC_THREADS);
    assert!(config.rpc_thread_num <= MAX_RPC_THREADS);
    assert!(!config.rpc_address.trim().is_empty());
    assert!(!config.enable_ha || config.ha_connstring().is_some());
}

/// A policy that parses holds valid names and quotas in range, and survives a write-back.
fn check_policy(text: &str) {
    let Ok(tenants) = parse_policy(text) else {
        return;
    };
    for (name, &bytes) in &tenants {
        assert!(protocol::tenant::valid_tenant(name), "{name:?}");
        assert!((1..=QUOTA_MAX_BYTES).contains(&bytes), "{name:?}: {bytes}");
    }
    assert_eq!(parse_policy(&render_policy(&tenants)).as_ref(), Ok(&tenants));
}

fn check_value(raw: &str) {
    if let Ok(q) = parse_quota(raw) {
        assert!((1..=QUOTA_MAX_BYTES).contains(&q), "{raw:?} -> {q}");
        assert_eq!(parse_quota(&q.to_string()), Ok(q));
    }
    if let Ok(b) = value::parse_bool(raw) {
        assert_eq!(value::parse_bool(&b.to_string()), Ok(b));
        assert!(value::is_bool_literal(raw));
    }
    if let Ok(ms) = value::parse_duration_ms(raw) {
        assert!(ms <= MAX_DURATION_MS, "{raw:?} -> {ms}");
        assert_eq!(value::parse_duration_ms(&ms.to_string()), Ok(ms));
        assert_eq!(value::parse_duration_ms(&format!("{ms}ms")), Ok(ms));
    }
    if let Ok(r) = value::parse_ratio(raw) {
        assert!((0.0..=1.0).contains(&r), "{raw:?} -> {r}");
    }
    if let Ok(v) = value::parse_f64(raw) {
        assert!(v.is_finite());
        assert_eq!(value::parse_f64(&v.to_string()), Ok(v));
    }
    if let Ok(p) = value::parse_port(raw) {
        assert_eq!(value::parse_port(&p.to_string()), Ok(p));
    }
    if let Ok(v) = value::parse_in_range(raw, -7, 1024, "x") {
        assert!((-7..=1024).contains(&v));
    }
    if let Ok(v) = value::parse_u64(raw) {
        assert_eq!(value::parse_u64(&v.to_string()), Ok(v));
    }
    if let Ok(v) = value::parse_i64(raw) {
        assert_eq!(value::parse_i64(&v.to_string()), Ok(v));
    }
    for kind in KINDS {
        let ok = value::check_kind(kind, raw).is_ok();
        // A value is always the same as itself when it is valid for its kind.
        if ok {
            assert!(value::same_value(kind, raw, raw), "{kind:?} {raw:?}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    check_file(FILE_NAMES[usize::from(selector) % FILE_NAMES.len()], &text);
    check_policy(&text);
    // Each line as one flag value, the way `--flag=value` would hand it over.
    for line in text.lines().take(64) {
        check_value(line);
    }
    if text.len() <= 256 {
        check_value(&text);
    }
});
