//! Recording each written replica in its segment's catalog, so that the segment's owner can
//! re-report it to a master that lost its index (`docs/recovery.md`).
//!
//! A replica in our own segment (memcpy path) goes straight into our own catalog. A remote
//! replica gets a `CATALOG_PUT` right after its WRITE: for a one-slice object in the same
//! batch, on the same lane (the data-plane client keeps them together), so it costs no extra
//! round trip; for an object cut into several slices, in a second batch once every slice has
//! landed (one extra round trip, small next to the transfer).
//!
//! A record carries the object's pins, so that a master that lost its index can pin it again
//! from the owner's re-report (`docs/ha.md`): the hard pin as the write asked for it, and the
//! soft pin the object will carry. An upsert records the soft pin the master answered
//! (`protocol::UpsertStarted`): with `SoftPinAction::Preserve` it keeps the master's current
//! pin, which only the master knows. A put records the pin of its `ReplicateConfig`
//! ([`soft_pin_of`]): a put makes a new object, with nothing to preserve.
//!
//! Invariants: a catalog entry is recorded only after every byte of its replica was written;
//! a peer that predates `CATALOG_PUT` (it answers `ERR_INVALID_ARGUMENT` to the unknown opcode)
//! is remembered and sent none again, logged once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dataplane::mem::served::ServedMemory;
use dataplane::mem::CatalogRecord;
use dataplane::transport::client::{TransferError, TransferOp, TransferResult};
use dataplane::TeError;
use parking_lot::Mutex;
use protocol::{ReplicaDescriptor, ReplicateConfig, SoftPinAction};

static LEGACY_LOGGED: AtomicBool = AtomicBool::new(false);

/// The soft pin a put (not an upsert, see the module docs) with `cfg` records: `Some(ttl_ms)`
/// (`Some(0)`: the master's default ttl) when it enables one, as the master resolves it
/// (`ENABLE` with a ttl of 0 pins nothing); `None` otherwise.
pub(super) fn soft_pin_of(cfg: &ReplicateConfig) -> Option<u64> {
    match (cfg.soft_pin_action, cfg.soft_pin_ttl_ms) {
        (SoftPinAction::Enable, None) => Some(0),
        (SoftPinAction::Enable, Some(0)) => None,
        (SoftPinAction::Enable, Some(ttl)) => Some(ttl),
        (SoftPinAction::Preserve | SoftPinAction::Disable, _) => None,
    }
}

/// See the module docs.
#[derive(Default)]
pub(super) struct CatalogWriter {
    /// The table serving our own segment (its catalog takes our memcpy'd replicas).
    own: Option<Arc<ServedMemory>>,
    /// Endpoints that refused `CATALOG_PUT` as an unknown request.
    legacy: Mutex<Vec<String>>,
}

impl CatalogWriter {
    pub fn new(own: Option<Arc<ServedMemory>>) -> CatalogWriter {
        CatalogWriter {
            own,
            legacy: Mutex::new(Vec::new()),
        }
    }

    /// The `CATALOG_PUT` payload of a replica of `key` (its version is the descriptor's).
    pub fn record(r: &ReplicaDescriptor, key: &str, pins: (bool, Option<u64>)) -> Vec<u8> {
        Self::object(r, key, pins).encode()
    }

    fn object<'a>(
        r: &ReplicaDescriptor,
        key: &'a str,
        (hard_pin, soft_pin_ttl_ms): (bool, Option<u64>),
    ) -> CatalogRecord<'a> {
        CatalogRecord {
            len: r.size,
            hard_pin,
            key,
            version: r.version,
            tombstone: false,
            soft_pin_ttl_ms,
        }
    }

    /// The `CATALOG_PUT` payload burying a removed replica of `key` (`docs/ha.md`).
    pub fn tombstone(r: &ReplicaDescriptor, key: &str) -> Vec<u8> {
        CatalogRecord {
            len: r.size,
            hard_pin: false,
            key,
            version: r.version,
            tombstone: true,
            soft_pin_ttl_ms: None,
        }
        .encode()
    }

    /// Records a replica written with memcpy into our own segment. Refused (`ERR_METADATA`)
    /// when the write's term is older than the master's our catalog last heard from
    /// (`Catalog::fence`): the put is then of a term that has ended, and fails.
    pub fn record_local(
        &self,
        r: &ReplicaDescriptor,
        key: &str,
        pins: (bool, Option<u64>),
    ) -> Result<(), TeError> {
        match &self.own {
            Some(m) => m
                .catalog()
                .apply(r.buffer_address, &Self::object(r, key, pins)),
            None => Ok(()),
        }
    }

    /// Buries a removed replica that lies in our own segment.
    pub fn bury_local(&self, r: &ReplicaDescriptor, key: &str) {
        if let Some(m) = &self.own {
            m.catalog().bury(r.buffer_address, r.size, key, r.version);
        }
    }

    /// Whether `endpoint` takes `CATALOG_PUT`.
    pub fn enabled(&self, endpoint: &str) -> bool {
        !self.legacy.lock().iter().any(|e| e == endpoint)
    }

    /// The result of `op` as the put sees it: a `CATALOG_PUT` refused as unknown means the
    /// peer keeps no catalog (remembered, logged once), not a failed put.
    pub fn settle(&self, endpoint: &str, op: &TransferOp<'_>, r: TransferResult) -> TransferResult {
        let unknown = Err(TransferError::Refused {
            status: TeError::InvalidArgument.code(),
        });
        if !matches!(op, TransferOp::CatalogPut { .. }) || r != unknown {
            return r;
        }
        let mut legacy = self.legacy.lock();
        if !legacy.iter().any(|e| e == endpoint) {
            legacy.push(endpoint.to_string());
        }
        if !LEGACY_LOGGED.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                endpoint,
                "the data plane at {endpoint} refused CATALOG_PUT: its objects cannot be \
                 re-reported after a master restart"
            );
        }
        Ok(())
    }

    /// End of the submission that starts at `start` and takes at most `max` ops, never
    /// separating a `CATALOG_PUT` from the WRITE before it.
    pub fn chunk_end(ops: &[TransferOp<'_>], start: usize, max: usize) -> usize {
        let end = (start + max).min(ops.len());
        match ops.get(end) {
            Some(TransferOp::CatalogPut { .. }) if end - start > 1 => end - 1,
            _ => end,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataplane::mem::Src;

    #[test]
    fn only_an_enabled_soft_pin_is_recorded() {
        let cfg = |soft_pin_action, soft_pin_ttl_ms| ReplicateConfig {
            soft_pin_action,
            soft_pin_ttl_ms,
            ..Default::default()
        };
        assert_eq!(soft_pin_of(&cfg(SoftPinAction::Enable, Some(5))), Some(5));
        assert_eq!(
            soft_pin_of(&cfg(SoftPinAction::Enable, None)),
            Some(0),
            "master's default"
        );
        assert_eq!(soft_pin_of(&cfg(SoftPinAction::Enable, Some(0))), None);
        assert_eq!(soft_pin_of(&cfg(SoftPinAction::Preserve, None)), None);
        assert_eq!(soft_pin_of(&cfg(SoftPinAction::Disable, None)), None);
    }

    #[test]
    fn chunks_keep_pairs_together() {
        let data = [1u8; 4];
        let rec = [0u8; 17];
        let w = || TransferOp::Write {
            remote_addr: 0,
            src: Src::from(&data[..]),
        };
        let c = || TransferOp::CatalogPut {
            remote_addr: 0,
            record: Src::from(&rec[..]),
        };
        let ops = vec![w(), c(), w(), c(), w()];
        assert_eq!(CatalogWriter::chunk_end(&ops, 0, 2), 2);
        assert_eq!(
            CatalogWriter::chunk_end(&ops, 0, 3),
            2,
            "w c w | c: cut before w"
        );
        assert_eq!(CatalogWriter::chunk_end(&ops, 2, 10), 5);
        assert_eq!(CatalogWriter::chunk_end(&ops, 1, 1), 2);
    }

    #[test]
    fn unknown_opcode_answers_mean_no_catalog() {
        let w = CatalogWriter::new(None);
        let rec = [0u8; 17];
        let op = TransferOp::CatalogPut {
            remote_addr: 0,
            record: Src::from(&rec[..]),
        };
        let refused = Err(TransferError::Refused {
            status: TeError::InvalidArgument.code(),
        });
        assert!(w.enabled("a:1"));
        assert_eq!(w.settle("a:1", &op, refused.clone()), Ok(()));
        assert!(!w.enabled("a:1"));
        assert!(w.enabled("b:1"));
        let other = Err(TransferError::Timeout);
        assert_eq!(w.settle("b:1", &op, other.clone()), other);
        let data = [0u8; 1];
        let write = TransferOp::Write {
            remote_addr: 0,
            src: Src::from(&data[..]),
        };
        assert_eq!(w.settle("b:1", &write, refused.clone()), refused);
    }
}
