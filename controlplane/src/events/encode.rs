//! The msgpack payload of one batch, as the original's master writes it
//! (`docs/kv-events.md`, "Wire format"):
//!
//! ```text
//! [timestamp_ms: uint, events: [event map, ...], dp_rank: uint]
//! ```
//!
//! Each event is a map with string keys: `event_id`, `timestamp`, `event_type`
//! (`"stored"`/`"removed"`), legacy `type` (`"BlockStored"`/`"BlockRemoved"`), `model_name`,
//! `block_size`, `additional_salt`, `lora_name`, `dp_rank` (all nil: the router's
//! registration supplies them), `tenant_id`, `backend_id`, `group_id` (string or nil),
//! `medium` (`"cpu"`/`"disk"`), `object_key`, `seq_hashes` (`[u64]` or `[]`), legacy
//! `block_hashes` (`[i64]` or `[]`); stored events add `base_block_idx` 0, `parent_hash` nil,
//! `token_ids` nil and legacy `parent_block_hash` nil; removed ones `base_block_idx` nil.
//!
//! Pure functions over bytes, so the unit tests decode what they write.

use protocol::tenant::{split_scoped, DEFAULT_TENANT};
use rmp::encode as w;

use super::{EventRef, Kind, KvEventsConfig};

/// What the flags say about every event of a batch.
#[derive(Clone, Debug)]
pub struct EncodeOptions {
    pub backend_id: String,
    /// The `tenant_id` of objects of the default tenant.
    pub default_tenant: String,
    pub dp_rank: u32,
    pub legacy: bool,
    pub object_key: bool,
}

impl EncodeOptions {
    pub fn from_config(cfg: &KvEventsConfig) -> EncodeOptions {
        EncodeOptions {
            backend_id: cfg.backend_id.clone(),
            default_tenant: cfg.tenant_id.clone(),
            dp_rank: cfg.dp_rank,
            legacy: cfg.emit_legacy_compat,
            object_key: cfg.emit_object_key,
        }
    }
}

/// The hash a key names: a decimal `u64`, or `0x`/`0X` and 1 to 16 hex digits.
pub fn parse_hash(key: &str) -> Option<u64> {
    if let Some(hex) = key.strip_prefix("0x").or_else(|| key.strip_prefix("0X")) {
        if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        return u64::from_str_radix(hex, 16).ok();
    }
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    key.parse().ok()
}

/// Appends the payload of a batch to `out`; event ids run from `first_id`. Returns how many
/// of the events' keys were not hashes.
pub fn encode_batch(
    opts: &EncodeOptions,
    timestamp_ms: u64,
    first_id: u64,
    events: &[EventRef<'_>],
    out: &mut Vec<u8>,
) -> u64 {
    let parts = Parts::new(opts, timestamp_ms);
    // Writing to a Vec cannot fail: the results are dropped.
    let _ = w::write_array_len(out, 3);
    let _ = w::write_uint(out, timestamp_ms);
    let _ = w::write_array_len(out, events.len() as u32);
    let mut non_hash = 0;
    for (i, e) in events.iter().enumerate() {
        if !encode_event(opts, &parts, first_id + i as u64, *e, out) {
            non_hash += 1;
        }
    }
    let _ = w::write_uint(out, u64::from(opts.dp_rank));
    non_hash
}

fn str_field(out: &mut Vec<u8>, name: &str, value: &str) {
    let _ = w::write_str(out, name);
    let _ = w::write_str(out, value);
}

fn nil_field(out: &mut Vec<u8>, name: &str) {
    let _ = w::write_str(out, name);
    let _ = w::write_nil(out);
}

/// The runs of fields that are the same for every event of a batch, encoded once per batch
/// and copied into each event (encoding every field of every event cost about 330 ns an
/// event, most of the publisher's time).
struct Parts {
    /// `timestamp`, then the five nil fields after the type.
    timestamp: Vec<u8>,
    nils: Vec<u8>,
    /// The event type and legacy type, per kind.
    stored_type: Vec<u8>,
    removed_type: Vec<u8>,
    /// The tenant of the default tenant's objects, then `backend_id`.
    default_tenant: Vec<u8>,
    backend: Vec<u8>,
    /// What follows the hashes, per kind.
    stored_tail: Vec<u8>,
    removed_tail: Vec<u8>,
}

impl Parts {
    fn new(opts: &EncodeOptions, ts: u64) -> Parts {
        let mut timestamp = Vec::new();
        let _ = w::write_str(&mut timestamp, "timestamp");
        let _ = w::write_uint(&mut timestamp, ts);
        let mut nils = Vec::new();
        for name in [
            "model_name",
            "block_size",
            "additional_salt",
            "lora_name",
            "dp_rank",
        ] {
            nil_field(&mut nils, name);
        }
        let kind_type = |event_type: &str, legacy_name: &str| {
            let mut b = Vec::new();
            str_field(&mut b, "event_type", event_type);
            if opts.legacy {
                str_field(&mut b, "type", legacy_name);
            }
            b
        };
        let mut default_tenant = Vec::new();
        str_field(&mut default_tenant, "tenant_id", &opts.default_tenant);
        let mut backend = Vec::new();
        str_field(&mut backend, "backend_id", &opts.backend_id);
        let mut stored_tail = Vec::new();
        let _ = w::write_str(&mut stored_tail, "base_block_idx");
        let _ = w::write_uint(&mut stored_tail, 0);
        nil_field(&mut stored_tail, "parent_hash");
        nil_field(&mut stored_tail, "token_ids");
        if opts.legacy {
            nil_field(&mut stored_tail, "parent_block_hash");
        }
        let mut removed_tail = Vec::new();
        nil_field(&mut removed_tail, "base_block_idx");
        Parts {
            timestamp,
            nils,
            stored_type: kind_type("stored", "BlockStored"),
            removed_type: kind_type("removed", "BlockRemoved"),
            default_tenant,
            backend,
            stored_tail,
            removed_tail,
        }
    }
}

/// One event's map; returns whether its key was a hash.
fn encode_event(
    opts: &EncodeOptions,
    parts: &Parts,
    id: u64,
    e: EventRef<'_>,
    out: &mut Vec<u8>,
) -> bool {
    let stored = e.kind == Kind::Stored;
    let (tenant, key) = split_scoped(e.key);
    let hash = parse_hash(key);
    let legacy = usize::from(opts.legacy);
    // 13 common fields, the optional ones, then the kind's own.
    let len = 13 + legacy * 2 + usize::from(opts.object_key) + if stored { 3 + legacy } else { 1 };
    let _ = w::write_map_len(out, len as u32);
    let _ = w::write_str(out, "event_id");
    let _ = w::write_uint(out, id);
    out.extend_from_slice(&parts.timestamp);
    out.extend_from_slice(if stored {
        &parts.stored_type
    } else {
        &parts.removed_type
    });
    out.extend_from_slice(&parts.nils);
    if tenant == DEFAULT_TENANT {
        out.extend_from_slice(&parts.default_tenant);
    } else {
        str_field(out, "tenant_id", tenant);
    }
    out.extend_from_slice(&parts.backend);
    match e.group {
        Some(g) => str_field(out, "group_id", split_scoped(g).1),
        None => nil_field(out, "group_id"),
    }
    match e.medium.name() {
        Some(m) => str_field(out, "medium", m),
        None => nil_field(out, "medium"),
    }
    if opts.object_key {
        str_field(out, "object_key", key);
    }
    hashes(out, hash, opts.legacy);
    out.extend_from_slice(if stored {
        &parts.stored_tail
    } else {
        &parts.removed_tail
    });
    hash.is_some()
}

/// `seq_hashes`, and legacy `block_hashes`: the key's hash, or empty lists.
fn hashes(out: &mut Vec<u8>, hash: Option<u64>, legacy: bool) {
    let _ = w::write_str(out, "seq_hashes");
    let _ = w::write_array_len(out, u32::from(hash.is_some()));
    if let Some(h) = hash {
        let _ = w::write_uint(out, h);
    }
    if legacy {
        let _ = w::write_str(out, "block_hashes");
        let _ = w::write_array_len(out, u32::from(hash.is_some()));
        if let Some(h) = hash {
            // The legacy field carries the same 64 bits as a signed integer.
            let _ = w::write_sint(out, h as i64);
        }
    }
}

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;
