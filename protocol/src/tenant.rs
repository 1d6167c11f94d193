//! Tenants: separate key spaces in one cluster (upstream's `tenant_id`).
//!
//! On the wire a tenant travels with each object request, as an [`crate::message::InTenant`]
//! envelope around it; a request without one belongs to [`DEFAULT_TENANT`]. Inside the master
//! and in the owners' catalogs (which outlive a master, `docs/recovery.md`) an object of
//! another tenant is held under its *scoped key*: `0x00 tenant 0x00 key`. A key of the
//! default tenant is its plain self, so a cluster that never names a tenant looks exactly as
//! before. The scoped form never leaves the master: listings, patterns and replies use the
//! plain key, and a plain key that starts with `0x00` is refused (it could alias a scoped
//! one).
//!
//! Invariant: `split_scoped(&scoped_key(t, k)) == (t, k)` for every valid tenant `t` (no NUL,
//! not empty) and every key `k` that does not start with NUL.

use crate::limits::TENANT_MAX_BYTES;

/// The tenant of a request that names none (upstream's default `tenant_id`).
pub const DEFAULT_TENANT: &str = "default";

/// First byte of a scoped key, and the separator after its tenant.
const MARK: char = '\0';

/// Whether `t` may name a tenant: 1 to [`TENANT_MAX_BYTES`] bytes, no NUL.
pub fn valid_tenant(t: &str) -> bool {
    !t.is_empty() && t.len() <= TENANT_MAX_BYTES && !t.contains(MARK)
}

/// Whether a plain key may be stored: it must not look like a scoped one.
pub fn valid_plain_key(k: &str) -> bool {
    !k.starts_with(MARK)
}

/// The key under which `key` of `tenant` is held.
pub fn scoped_key(tenant: &str, key: &str) -> String {
    if tenant == DEFAULT_TENANT {
        return key.to_string();
    }
    let mut s = String::with_capacity(tenant.len() + key.len() + 2);
    s.push(MARK);
    s.push_str(tenant);
    s.push(MARK);
    s.push_str(key);
    s
}

/// The tenant and plain key of a held key (the default tenant for a plain key).
pub fn split_scoped(s: &str) -> (&str, &str) {
    if let Some(rest) = s.strip_prefix(MARK) {
        if let Some((t, k)) = rest.split_once(MARK) {
            return (t, k);
        }
    }
    (DEFAULT_TENANT, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_keys_split_back() {
        assert_eq!(scoped_key("default", "k"), "k");
        assert_eq!(split_scoped("k"), ("default", "k"));
        let s = scoped_key("ta", "k\0x");
        assert_eq!(s, "\0ta\0k\0x");
        assert_eq!(split_scoped(&s), ("ta", "k\0x"));
        assert!(valid_tenant("ta") && !valid_tenant("") && !valid_tenant("a\0b"));
        assert!(!valid_tenant(&"t".repeat(TENANT_MAX_BYTES + 1)));
        assert!(valid_plain_key("k") && !valid_plain_key("\0ta\0k"));
    }
}
