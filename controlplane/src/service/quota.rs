//! Tenant quotas: how many bytes each tenant may hold, from a policy file
//! (`--enable_multi_tenants` with `--tenant_quota_connector_uri=<file>`, upstream's "file"
//! connector).
//!
//! **Policy file** (YAML, as upstream's):
//!
//! ```yaml
//! version: 1
//! tenants:
//!   - name: "team-a"
//!     quota: 64GB        # an integer, or one followed by B, KB, MB, GB or TB (binary)
//! ```
//!
//! Read at start (a bad file stops the master with the reason) and again when an HA master
//! wins an election (keeping the one in memory if the file cannot be read then); `PUT` and
//! `DELETE` on `/api/v1/tenant_quotas` (`http/admin.rs`) change it and write it back (a
//! temporary file, fsync, rename, fsync of the directory) before they answer, under the
//! master's lock (a rare admin call; the file is small). Each master reads its own file: in
//! HA, give the masters one shared path, or change the policy on each (upstream's etcd
//! connector, which keeps it in etcd, is not built).
//!
//! **Admission** (every put and upsert, `State::put_start`): a tenant without a policy entry
//! (the default tenant included) is refused with `TENANT_NOT_REGISTERED`. An object is
//! charged its size times its replica count (`objects.rs` keeps the ledger). A put that would
//! take its tenant past its *effective* quota first evicts that tenant's own evictable objects,
//! least recently read first, under the eviction rules of `evict.rs`; if that cannot make room,
//! or the object alone is larger than the quota, it is refused with `TENANT_QUOTA_EXCEEDED`.
//! An upsert's new value is weighed against the tenant's charge without the value it replaces.
//!
//! **Effective quota**: the requested one while the policies together ask for no more than the
//! mounted capacity; past that, each is scaled down in proportion (ours: upstream reports the
//! same figure, its scaling rule is not documented). 0 while nothing is mounted.
//!
//! Soft state, as the index: after a restart or failover the ledger is rebuilt from the
//! re-reported objects, each charged for the replicas that came back.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use protocol::tenant::valid_tenant;
use protocol::ErrorCode;
use serde_json::{json, Value};

use super::admin::escape_label;
use super::evict::evictable;
use super::metrics::Metrics;
use super::objects::tenant_of;
use super::State;
use crate::view::{QuotaAnswer, QuotaRefusal};

/// Largest quota (and charge) a tenant may have: `2^63 - 1` bytes.
pub const QUOTA_MAX_BYTES: u64 = i64::MAX as u64;

/// The tenants' quotas as the policy file states them, and where the file is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuotaPolicy {
    pub path: PathBuf,
    /// Requested bytes per tenant.
    pub tenants: BTreeMap<String, u64>,
}

impl QuotaPolicy {
    /// Reads and checks the policy file at `path`.
    pub fn load(path: &Path) -> Result<QuotaPolicy, String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "failed to open tenant quota policy file '{}': {e}",
                path.display()
            )
        })?;
        let tenants =
            parse_policy(&text).map_err(|e| format!("failed to load tenant quota policy: {e}"))?;
        Ok(QuotaPolicy {
            path: path.to_path_buf(),
            tenants,
        })
    }

    /// Writes the policy back to its file: a temporary file beside it, fsync, rename, fsync of
    /// the directory, so a crash leaves the old file or the new one.
    fn save(&self) -> Result<(), String> {
        let text = render_policy(&self.tenants);
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let tmp = self.path.with_extension("tmp-mooncake");
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            std::fs::File::open(&dir)?.sync_all()
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!(
                "failed to save tenant quota policy to '{}': {e}",
                self.path.display()
            )
        })
    }
}

/// Parses a policy file's text: tenant to requested bytes.
pub fn parse_policy(text: &str) -> Result<BTreeMap<String, u64>, String> {
    let doc: yaml_serde::Value =
        yaml_serde::from_str(text).map_err(|e| format!("invalid YAML: {e}"))?;
    let map = doc
        .as_mapping()
        .ok_or("tenant quota policy must be a YAML map")?;
    let version = map
        .get("version")
        .ok_or("tenant quota policy version is required")?;
    if version.as_u64() != Some(1) {
        return Err(format!(
            "unsupported tenant quota policy version: {}",
            scalar_text(version)
        ));
    }
    let mut tenants = BTreeMap::new();
    let entries = match map.get("tenants") {
        None | Some(yaml_serde::Value::Null) => return Ok(tenants),
        Some(v) => v.as_sequence().ok_or("tenants must be a YAML sequence")?,
    };
    for entry in entries {
        let entry = entry
            .as_mapping()
            .ok_or("tenant entry must be a YAML map")?;
        let name = entry.get("name").ok_or("tenant name is required")?;
        let name = name
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| scalar_text(name));
        if !valid_tenant(&name) {
            return Err(format!("invalid tenant name '{name}'"));
        }
        let quota = entry.get("quota").ok_or("tenant quota is required")?;
        let bytes = match quota {
            yaml_serde::Value::Number(n) => match n.as_u64() {
                Some(b) => check_quota(b),
                None if n.as_i64().is_some() => Err("quota must be positive".to_string()),
                None => parse_quota(&n.to_string()),
            },
            yaml_serde::Value::String(s) => parse_quota(s),
            _ => Err("quota must start with an integer".to_string()),
        }
        .map_err(|e| format!("invalid quota for tenant '{name}': {e}"))?;
        if tenants.insert(name.clone(), bytes).is_some() {
            return Err(format!("duplicate tenant name '{name}'"));
        }
    }
    Ok(tenants)
}

fn scalar_text(v: &yaml_serde::Value) -> String {
    yaml_serde::to_string(v)
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

/// `1048576`, `5B`, `64KB`, `3MB`, `2GB`, `1TB` (binary multiples; upstream's units).
pub fn parse_quota(s: &str) -> Result<u64, String> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err("quota must start with an integer".into());
    }
    let n: u64 = s[..digits]
        .parse()
        .map_err(|_| "quota integer overflows uint64".to_string())?;
    let shift = match &s[digits..] {
        "" | "B" => 0,
        "KB" => 10,
        "MB" => 20,
        "GB" => 30,
        "TB" => 40,
        unit => return Err(format!("unsupported quota unit '{unit}'")),
    };
    let bytes = n
        .checked_mul(1u64 << shift)
        .ok_or("quota byte value overflows uint64")?;
    check_quota(bytes)
}

fn check_quota(bytes: u64) -> Result<u64, String> {
    if bytes == 0 {
        return Err("quota must be positive".into());
    }
    if bytes > QUOTA_MAX_BYTES {
        return Err("quota exceeds maximum supported tenant charge".into());
    }
    Ok(bytes)
}

/// The policy file's text for `tenants`.
pub fn render_policy(tenants: &BTreeMap<String, u64>) -> String {
    let mut s = String::from("version: 1\n\n");
    if tenants.is_empty() {
        s.push_str("tenants: []\n");
        return s;
    }
    s.push_str("tenants:\n");
    for (name, bytes) in tenants {
        // A JSON string is a valid YAML double-quoted scalar.
        let quoted = serde_json::to_string(name).unwrap_or_default();
        let _ = write!(s, "  - name: {quoted}\n    quota: {bytes}\n");
    }
    s
}

/// The master's quota state (`State::quotas`).
#[derive(Debug, Default)]
pub(crate) struct Quotas {
    pub policy: QuotaPolicy,
    /// Bytes evicted to make room under a tenant's quota, per tenant.
    pub evicted: BTreeMap<String, u64>,
    /// Puts refused by quota admission (unregistered tenant or no room).
    pub rejects: u64,
}

fn unknown() -> QuotaRefusal {
    QuotaRefusal::new(
        404,
        ErrorCode::ObjectNotFound,
        ErrorCode::ObjectNotFound.name(),
    )
}

/// `requested × capacity / Σ requested` when the policies ask for more than `capacity`.
fn effective(requested: u64, sum: u64, capacity: u64) -> u64 {
    if sum <= capacity {
        return requested;
    }
    (u128::from(requested) * u128::from(capacity) / u128::from(sum)) as u64
}

impl State {
    fn quota_sum(&self) -> u64 {
        self.quotas.as_ref().map_or(0, |q| {
            q.policy
                .tenants
                .values()
                .fold(0u64, |a, &b| a.saturating_add(b))
        })
    }

    /// `tenant`'s effective quota, `None` when it has no policy.
    fn effective_quota(&self, tenant: &str) -> Option<u64> {
        let q = self.quotas.as_ref()?;
        let requested = *q.policy.tenants.get(tenant)?;
        Some(effective(requested, self.quota_sum(), self.usage().1))
    }

    /// Admits a put of `need` bytes (size × replicas) for `key`, which replaces an object
    /// charged `replacing` (an upsert), evicting the tenant's own objects to make room.
    pub(crate) fn admit(
        &mut self,
        m: &Metrics,
        now: u64,
        key: &str,
        need: u64,
        replacing: u64,
    ) -> Result<(), ErrorCode> {
        if self.quotas.is_none() {
            return Ok(());
        }
        let tenant = tenant_of(key).to_string();
        let refuse = |st: &mut State, code: ErrorCode| {
            if let Some(q) = &mut st.quotas {
                q.rejects += 1;
            }
            Err(code)
        };
        let Some(quota) = self.effective_quota(&tenant) else {
            return refuse(self, ErrorCode::TenantNotRegistered);
        };
        if need > quota {
            return refuse(self, ErrorCode::TenantQuotaExceeded);
        }
        let charged = self.objects.charged(&tenant).saturating_sub(replacing);
        let over = (charged.saturating_add(need)).saturating_sub(quota);
        if over > 0 && self.evict_tenant(m, now, &tenant, key, over) < over {
            return refuse(self, ErrorCode::TenantQuotaExceeded);
        }
        Ok(())
    }

    /// Evicts `tenant`'s evictable objects (not `except`), least recently read first, until
    /// at least `need` bytes of charge are gone or none is left. Returns the charge freed.
    fn evict_tenant(
        &mut self,
        m: &Metrics,
        now: u64,
        tenant: &str,
        except: &str,
        need: u64,
    ) -> u64 {
        let allow_pinned = self.cfg.allow_evict_soft_pinned_objects;
        // (soft-pinned, last read, charge, key): plain objects first, then pinned ones.
        let mut cands: Vec<(bool, u64, u64, String)> = self
            .objects
            .iter()
            .filter(|(k, obj)| {
                // An object charged nothing (on disk only, `docs/tiering.md`) frees nothing.
                *k != except
                    && obj.charge() > 0
                    && tenant_of(k) == tenant
                    && evictable(obj, k, now, &self.tasks)
                    && (allow_pinned || !obj.soft_pinned(now))
            })
            .map(|(k, obj)| {
                (
                    obj.soft_pinned(now),
                    obj.last_read_ms(),
                    obj.charge(),
                    k.to_string(),
                )
            })
            .collect();
        cands.sort_unstable();
        let (mut freed, mut keys, mut bytes) = (0u64, 0u64, 0u64);
        for (_, _, _, key) in cands {
            if freed >= need {
                break;
            }
            // An offload may be reading it (`tasks.rs`, "Internal tasks"): its buffers are
            // parked until the executor is done, and the task fails.
            let hold_until = self.executor_hold(now, &key);
            let Some(obj) = self.objects.remove(&key) else {
                continue;
            };
            self.fail_internal(now, &key, "the object was evicted for its tenant's quota");
            freed += obj.charge();
            keys += 1;
            self.tombstones.add(&key, obj.version);
            for r in &obj.replicas {
                bytes += r.span.len;
                self.release(r.seg, r.span, hold_until, now);
            }
        }
        if keys > 0 {
            Metrics::add(&m.evicted_keys, keys);
            Metrics::add(&m.evicted_bytes, bytes);
            if let Some(q) = &mut self.quotas {
                *q.evicted.entry(tenant.to_string()).or_insert(0) += freed;
            }
        }
        freed
    }

    /// One tenant's row of the admin API.
    fn quota_entry(&self, tenant: &str) -> Value {
        let requested = self
            .quotas
            .as_ref()
            .and_then(|q| q.policy.tenants.get(tenant).copied());
        let effective = self.effective_quota(tenant).unwrap_or(0);
        let charged = self.objects.charged(tenant);
        json!({
            "tenant_id": tenant,
            "requested_quota_bytes": requested.unwrap_or(0),
            "effective_quota_bytes": effective,
            "charged_bytes": charged,
            "admission_closed": false,
            "over_quota": charged > effective,
            "has_explicit_policy": requested.is_some(),
        })
    }

    /// Tenants with a policy or a charge, sorted.
    fn quota_tenants(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .quotas
            .iter()
            .flat_map(|q| q.policy.tenants.keys().cloned())
            .chain(self.objects.ledger().map(|(t, _)| t.clone()))
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// `GET /api/v1/tenant_quotas[?tenant_id=T]`.
    pub(crate) fn tenant_quotas(&self, tenant: Option<&str>) -> QuotaAnswer {
        if self.quotas.is_none() {
            return Err(QuotaRefusal::off());
        }
        match tenant {
            None => Ok(Value::Array(
                self.quota_tenants()
                    .iter()
                    .map(|t| self.quota_entry(t))
                    .collect(),
            )),
            Some(t) if self.quota_tenants().iter().any(|x| x == t) => Ok(self.quota_entry(t)),
            Some(_) => Err(unknown()),
        }
    }

    /// `PUT /api/v1/tenant_quotas?tenant_id=T` with `{"requested_quota_bytes": N}`.
    pub(crate) fn set_tenant_quota(&mut self, tenant: &str, bytes: u64) -> QuotaAnswer {
        let Some(q) = &self.quotas else {
            return Err(QuotaRefusal::off());
        };
        if check_quota(bytes).is_err() {
            return Err(QuotaRefusal::new(
                400,
                ErrorCode::InvalidParams,
                "Tenant quota must be in [1, 2^63 - 1] bytes",
            ));
        }
        let mut next = q.policy.clone();
        next.tenants.insert(tenant.to_string(), bytes);
        self.install_policy(next)?;
        Ok(self.quota_entry(tenant))
    }

    /// `DELETE /api/v1/tenant_quotas?tenant_id=T`: only for a tenant that holds nothing.
    pub(crate) fn delete_tenant_quota(&mut self, tenant: &str) -> QuotaAnswer {
        let Some(q) = &self.quotas else {
            return Err(QuotaRefusal::off());
        };
        if !q.policy.tenants.contains_key(tenant) {
            return Err(unknown());
        }
        if self.objects.charged(tenant) > 0 {
            return Err(QuotaRefusal::new(
                409,
                ErrorCode::TenantNotEmpty,
                ErrorCode::TenantNotEmpty.name(),
            ));
        }
        let mut next = q.policy.clone();
        next.tenants.remove(tenant);
        self.install_policy(next)?;
        Ok(Value::Null)
    }

    /// Writes `next` to the policy file, then makes it the policy.
    fn install_policy(&mut self, next: QuotaPolicy) -> Result<(), QuotaRefusal> {
        next.save().map_err(|e| {
            tracing::error!("{e}");
            QuotaRefusal::new(500, ErrorCode::InternalError, e)
        })?;
        self.cfg.tenant_quota = Some(next.clone());
        if let Some(q) = &mut self.quotas {
            q.policy = next;
        }
        Ok(())
    }

    /// The tenant quota metric families (upstream's names), appended to `/metrics`.
    pub(crate) fn render_quota_metrics(&self, out: &mut String) {
        let Some(q) = &self.quotas else {
            return;
        };
        let tenants = self.quota_tenants();
        let per_tenant: [Family<'_>; 7] = [
            (
                "mooncake_tenant_quota_requested_bytes",
                "Requested tenant quota policy in bytes",
                "gauge",
                &|t| q.policy.tenants.get(t).copied().unwrap_or(0),
            ),
            (
                "mooncake_tenant_quota_effective_bytes",
                "Effective tenant quota in bytes",
                "gauge",
                &|t| self.effective_quota(t).unwrap_or(0),
            ),
            (
                "mooncake_tenant_quota_charged_bytes",
                "Tenant quota charge in bytes",
                "gauge",
                &|t| self.objects.charged(t),
            ),
            (
                "mooncake_tenant_quota_admission_closed",
                "Tenant quota admission-closed flag",
                "gauge",
                &|_| 0,
            ),
            (
                "mooncake_tenant_quota_over_quota",
                "Tenant over-quota flag",
                "gauge",
                &|t| u64::from(self.objects.charged(t) > self.effective_quota(t).unwrap_or(0)),
            ),
            (
                "mooncake_tenant_quota_explicit_policy",
                "Tenant explicit policy flag",
                "gauge",
                &|t| u64::from(q.policy.tenants.contains_key(t)),
            ),
            (
                "mooncake_tenant_evict_bytes_total",
                "Total bytes evicted by tenant-scoped quota eviction",
                "counter",
                &|t| q.evicted.get(t).copied().unwrap_or(0),
            ),
        ];
        for (name, help, kind, value) in per_tenant {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for t in &tenants {
                let _ = writeln!(
                    out,
                    "{name}{{tenant_id=\"{}\"}} {}",
                    escape_label(t),
                    value(t)
                );
            }
        }
        let sum = self.quota_sum();
        let cap = self.usage().1;
        let effective_sum = q
            .policy
            .tenants
            .values()
            .fold(0u64, |a, &r| a.saturating_add(effective(r, sum, cap)));
        for (name, help, kind, v) in [
            (
                "mooncake_tenant_quota_allocatable_capacity_bytes",
                "Global tenant quota allocatable capacity in bytes",
                "gauge",
                cap,
            ),
            (
                "mooncake_tenant_quota_requested_bytes_sum",
                "Global requested tenant quota sum in bytes",
                "gauge",
                sum,
            ),
            (
                "mooncake_tenant_quota_effective_bytes_sum",
                "Global effective tenant quota sum in bytes",
                "gauge",
                effective_sum,
            ),
            (
                "mooncake_tenant_quota_reject_total",
                "Total number of tenant quota admission rejects",
                "counter",
                q.rejects,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    }
}

/// A per-tenant metric family: name, help, type, and the value for a tenant.
type Family<'a> = (
    &'static str,
    &'static str,
    &'static str,
    &'a dyn Fn(&str) -> u64,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_parse_as_upstreams() {
        assert_eq!(parse_quota("7"), Ok(7));
        assert_eq!(parse_quota("5B"), Ok(5));
        assert_eq!(parse_quota("10KB"), Ok(10 << 10));
        assert_eq!(parse_quota("1024KB"), Ok(1 << 20));
        assert_eq!(parse_quota("1MB"), Ok(1 << 20));
        assert_eq!(parse_quota("2GB"), Ok(2 << 30));
        assert_eq!(parse_quota("1TB"), Ok(1 << 40));
        for (bad, why) in [
            ("", "quota must start with an integer"),
            ("GB", "quota must start with an integer"),
            ("0", "quota must be positive"),
            ("1 MB", "unsupported quota unit ' MB'"),
            ("3mb", "unsupported quota unit 'mb'"),
            ("1Mb", "unsupported quota unit 'Mb'"),
            ("10KiB", "unsupported quota unit 'KiB'"),
            ("1PB", "unsupported quota unit 'PB'"),
            ("1.5GB", "unsupported quota unit '.5GB'"),
            ("99999999999999999999", "quota integer overflows uint64"),
            ("99999999999TB", "quota byte value overflows uint64"),
            (
                "9223372036854775808",
                "quota exceeds maximum supported tenant charge",
            ),
        ] {
            assert_eq!(parse_quota(bad), Err(why.to_string()), "{bad:?}");
        }
    }

    #[test]
    fn policy_files_parse_and_render() {
        let text =
            "version: 1\ntenants:\n  - name: t1\n    quota: 1MB\n  - name: \"a b\"\n    quota: 7\n";
        let p = parse_policy(text).unwrap();
        assert_eq!(
            p,
            BTreeMap::from([("t1".into(), 1 << 20), ("a b".into(), 7)])
        );
        assert_eq!(parse_policy(&render_policy(&p)), Ok(p));
        assert_eq!(
            parse_policy("version: 1\ntenants: []\n"),
            Ok(BTreeMap::new())
        );
        assert_eq!(
            parse_policy(&render_policy(&BTreeMap::new())),
            Ok(BTreeMap::new())
        );
        for (bad, why) in [
            ("- 1", "tenant quota policy must be a YAML map"),
            ("tenants: []", "tenant quota policy version is required"),
            ("version: 2", "unsupported tenant quota policy version: 2"),
            ("version: 1\ntenants: 3", "tenants must be a YAML sequence"),
            (
                "version: 1\ntenants: [3]",
                "tenant entry must be a YAML map",
            ),
            (
                "version: 1\ntenants: [{quota: 1}]",
                "tenant name is required",
            ),
            (
                "version: 1\ntenants: [{name: x}]",
                "tenant quota is required",
            ),
            (
                "version: 1\ntenants: [{name: '', quota: 1}]",
                "invalid tenant name ''",
            ),
            (
                "version: 1\ntenants: [{name: x, quota: -1}]",
                "invalid quota for tenant 'x': quota must be positive",
            ),
            (
                "version: 1\ntenants: [{name: x, quota: 2 GB}]",
                "invalid quota for tenant 'x': unsupported quota unit ' GB'",
            ),
            (
                "version: 1\ntenants: [{name: x, quota: 1}, {name: x, quota: 2}]",
                "duplicate tenant name 'x'",
            ),
        ] {
            assert_eq!(parse_policy(bad), Err(why.to_string()), "{bad:?}");
        }
        assert!(parse_policy("version: [")
            .unwrap_err()
            .starts_with("invalid YAML"));
    }

    #[test]
    fn effective_quotas_scale_down_past_the_capacity() {
        assert_eq!(effective(100, 300, 1000), 100);
        assert_eq!(effective(100, 400, 200), 50);
        assert_eq!(effective(u64::MAX / 2, u64::MAX, 10), 4);
        assert_eq!(effective(5, 10, 0), 0);
    }
}
