//! Recording each written replica in its segment's catalog, so that the segment's owner can
//! re-report it to a master that lost its index (`docs/recovery.md`).
//!
//! A replica in our own segment (memcpy path) goes straight into our own catalog. A remote
//! replica gets a `CATALOG_PUT` right after its WRITE: for a one-slice object in the same
//! batch, on the same lane (the data-plane client keeps them together), so it costs no extra
//! round trip; for an object cut into several slices, in a second batch once every slice has
//! landed (one extra round trip, small next to the transfer).
//!
//! Before its bytes, each replica announces itself to its owner with an *intent* (key,
//! version, range: `Catalog::overwrite`), so that the owner drops the entries of other keys
//! the write goes over even if the writer dies before its record (`docs/recovery.md`, "A
//! range written over"): over TCP a `CATALOG_PUT` of kind INTENT just before each slice's
//! WRITE, on its lane (no extra round trip); for a same-host memcpy, on the shared-memory
//! socket (`mem::shm`); for our own segment, straight into our catalog; for an RDMA write,
//! over TCP to the owner's data port, answered before the first RDMA work request is posted
//! (one round trip per owner per batch: the owner's CPU sees none of the RDMA bytes, so it
//! must have the intent first). An owner refuses the intent of a term that has ended, which
//! stops an RDMA writer of that term before its bytes.
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
//! is remembered and sent none again, logged once; an intent fails a put only where its
//! bytes would fail too (lost with its connection, or refused as of an ended term, like the
//! WRITE right behind it on the same connection); a peer that predates intents refuses them
//! as unknown and is sent none again, logged once (one that predates `CATALOG_PUT` too closes
//! the connection on the first, so that put's WRITE fails; the next put sends neither intent
//! nor record there after its record is refused).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dataplane::mem::served::ServedMemory;
use dataplane::recovery::inflight::{Refused, WriteClaim};
use dataplane::recovery::{CatalogRecord, RecordKind};
use dataplane::transport::client::{TransferError, TransferOp, TransferResult};
use dataplane::TeError;
use parking_lot::Mutex;
use protocol::{ReplicaDescriptor, ReplicateConfig, SoftPinAction};

static LEGACY_LOGGED: AtomicBool = AtomicBool::new(false);
static NO_INTENTS_LOGGED: AtomicBool = AtomicBool::new(false);

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
    /// Endpoints that refused an intent as unknown (they predate intents).
    no_intents: Mutex<Vec<String>>,
}

impl CatalogWriter {
    pub fn new(own: Option<Arc<ServedMemory>>) -> CatalogWriter {
        CatalogWriter {
            own,
            legacy: Mutex::new(Vec::new()),
            no_intents: Mutex::new(Vec::new()),
        }
    }

    /// The `CATALOG_PUT` payload of a replica of `key` (its version is the descriptor's): an
    /// object record, or with `provisional` the record of bytes whose commit is to come (a
    /// put committed in one round trip, `reserve.rs`; no pins, its commit carries them).
    pub fn record(
        r: &ReplicaDescriptor,
        key: &str,
        pins: (bool, Option<u64>),
        provisional: bool,
    ) -> Vec<u8> {
        Self::object(r, key, pins, provisional).encode()
    }

    fn object<'a>(
        r: &ReplicaDescriptor,
        key: &'a str,
        (hard_pin, soft_pin_ttl_ms): (bool, Option<u64>),
        provisional: bool,
    ) -> CatalogRecord<'a> {
        if provisional {
            return CatalogRecord {
                kind: RecordKind::Provisional,
                ..CatalogRecord::intent(r.size, key, r.version)
            };
        }
        CatalogRecord {
            len: r.size,
            hard_pin,
            key,
            version: r.version,
            kind: RecordKind::Object,
            soft_pin_ttl_ms,
        }
    }

    /// The `CATALOG_PUT` payload of the commit, at `version`, of a replica of `key` recorded
    /// as provisional (at the descriptor's version): its owner makes that entry the object,
    /// if it is still there (`Catalog::commit`).
    pub fn commit(
        r: &ReplicaDescriptor,
        key: &str,
        (hard_pin, soft_pin_ttl_ms): (bool, Option<u64>),
        version: protocol::Version,
    ) -> Vec<u8> {
        CatalogRecord {
            len: r.size,
            hard_pin,
            key,
            version,
            kind: RecordKind::Commit(r.version),
            soft_pin_ttl_ms,
        }
        .encode()
    }

    /// Commits, at `version`, a provisional replica of `key` in our own segment; refused
    /// (`ERR_METADATA`) when `version` is of a term that has ended for our catalog.
    pub fn commit_local(
        &self,
        r: &ReplicaDescriptor,
        key: &str,
        pins: (bool, Option<u64>),
        version: protocol::Version,
    ) -> Result<(), TeError> {
        match &self.own {
            Some(m) => m
                .catalog()
                .commit(r.buffer_address, r.size, key, pins, r.version, version)
                .map(|_| ()),
            None => Ok(()),
        }
    }

    /// The `CATALOG_PUT` payload announcing a replica of `key` before its bytes (see the
    /// module docs).
    pub fn intent(r: &ReplicaDescriptor, key: &str) -> Vec<u8> {
        CatalogRecord::intent(r.size, key, r.version).encode()
    }

    /// Starts a copy of a replica into our own segment: takes a slot of our fence's write page
    /// (`recovery::inflight`; refused with the fence's term when the put's term has ended), then
    /// announces the write to our catalog. Copy only while the claim is held.
    pub fn begin_local(&self, r: &ReplicaDescriptor, key: &str) -> Result<WriteClaim<'_>, u64> {
        let Some(m) = &self.own else {
            return Ok(WriteClaim::unfenced());
        };
        let claim = loop {
            match m.catalog().fences().local_writes().begin(r.version.term) {
                Ok(c) => break c,
                Err(Refused::Fenced { fence }) => return Err(fence),
                // Every slot held by our own threads: one ends soon.
                Err(Refused::Full) => std::thread::yield_now(),
            }
        };
        m.catalog()
            .overwrite(r.buffer_address, r.size, key, r.version);
        Ok(claim)
    }

    /// The `CATALOG_PUT` payload burying a removed replica of `key` (`docs/ha.md`).
    pub fn tombstone(r: &ReplicaDescriptor, key: &str) -> Vec<u8> {
        CatalogRecord {
            len: r.size,
            hard_pin: false,
            key,
            version: r.version,
            kind: RecordKind::Tombstone,
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
        provisional: bool,
    ) -> Result<(), TeError> {
        match &self.own {
            Some(m) => m
                .catalog()
                .apply(r.buffer_address, &Self::object(r, key, pins, provisional)),
            None => Ok(()),
        }
    }

    /// Buries a removed replica that lies in our own segment; refused when the removal is of
    /// a term that has ended for our catalog (`Catalog::bury`).
    pub fn bury_local(&self, r: &ReplicaDescriptor, key: &str) -> Result<(), TeError> {
        match &self.own {
            Some(m) => m
                .catalog()
                .bury(r.buffer_address, r.size, key, r.version)
                .map(|_| ()),
            None => Ok(()),
        }
    }

    /// Whether `endpoint` takes `CATALOG_PUT`.
    pub fn enabled(&self, endpoint: &str) -> bool {
        !listed(&self.legacy, endpoint)
    }

    /// Whether `endpoint` takes intents.
    pub fn intents(&self, endpoint: &str) -> bool {
        self.enabled(endpoint) && !listed(&self.no_intents, endpoint)
    }

    /// The result of `op` as the put sees it: a `CATALOG_PUT` refused as unknown means the
    /// peer keeps no catalog (remembered, logged once), not a failed put; an intent refused
    /// as unknown is not sent to that peer again and fails nothing (see the module docs).
    pub fn settle(&self, endpoint: &str, op: &TransferOp<'_>, r: TransferResult) -> TransferResult {
        let unknown = Err(TransferError::Refused {
            status: TeError::InvalidArgument.code(),
        });
        match op {
            TransferOp::CatalogIntent { .. } if r == unknown => {
                if remember(&self.no_intents, endpoint, &NO_INTENTS_LOGGED) {
                    tracing::warn!(
                        endpoint,
                        "the data plane at {endpoint} refused a write intent: a writer dying \
                         between its bytes and its record there can leave an older key's \
                         entry over them"
                    );
                }
                Ok(())
            }
            TransferOp::CatalogPut { .. } if r == unknown => {
                if remember(&self.legacy, endpoint, &LEGACY_LOGGED) {
                    tracing::warn!(
                        endpoint,
                        "the data plane at {endpoint} refused CATALOG_PUT: its objects cannot \
                         be re-reported after a master restart"
                    );
                }
                Ok(())
            }
            _ => r,
        }
    }

    /// End of the submission that starts at `start` and takes at most `max` ops, never
    /// separating a `CATALOG_PUT` from the WRITE before it, nor an intent from the WRITE
    /// after it (a WRITE with both stays whole when `max` allows three).
    pub fn chunk_end(ops: &[TransferOp<'_>], start: usize, max: usize) -> usize {
        let mut end = (start + max).min(ops.len());
        if end - start > 1 && matches!(ops.get(end), Some(TransferOp::CatalogPut { .. })) {
            end -= 1;
        }
        if end - start > 1 && matches!(ops[end - 1], TransferOp::CatalogIntent { .. }) {
            end -= 1;
        }
        end
    }
}

/// Whether `endpoint` is in `list`.
fn listed(list: &Mutex<Vec<String>>, endpoint: &str) -> bool {
    list.lock().iter().any(|e| e == endpoint)
}

/// Adds `endpoint` to `list` (once); true the first time this process `logged` such a
/// refusal, so that it is logged once.
fn remember(list: &Mutex<Vec<String>>, endpoint: &str, logged: &AtomicBool) -> bool {
    let mut list = list.lock();
    if !list.iter().any(|e| e == endpoint) {
        list.push(endpoint.to_string());
    }
    !logged.swap(true, Ordering::Relaxed)
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
        // An intent stays with the WRITE after it, and that WRITE with its record.
        let i = || TransferOp::CatalogIntent {
            remote_addr: 0,
            record: Src::from(&rec[..]),
        };
        let ops = vec![i(), w(), c(), i(), w(), c(), i(), w()];
        assert_eq!(CatalogWriter::chunk_end(&ops, 0, 3), 3);
        assert_eq!(
            CatalogWriter::chunk_end(&ops, 0, 4),
            3,
            "i w c i | w: cut before i"
        );
        assert_eq!(CatalogWriter::chunk_end(&ops, 0, 5), 3, "i w c i w | c");
        assert_eq!(
            CatalogWriter::chunk_end(&ops, 3, 4),
            6,
            "i w c i | w: cut before i"
        );
        assert_eq!(CatalogWriter::chunk_end(&ops, 6, 4), 8);
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
        // An intent fails its put only as its WRITE would (lost, or refused as of an ended
        // term), and never marks its peer as keeping no catalog.
        let intent = TransferOp::CatalogIntent {
            remote_addr: 0,
            record: Src::from(&rec[..]),
        };
        assert_eq!(w.settle("b:1", &intent, other.clone()), other);
        let fenced = Err(TransferError::Refused {
            status: TeError::Metadata.code(),
        });
        assert_eq!(w.settle("b:1", &intent, fenced.clone()), fenced);
        assert!(w.intents("b:1"));
        assert_eq!(w.settle("b:1", &intent, refused.clone()), Ok(()));
        assert!(w.enabled("b:1"), "records still go");
        assert!(!w.intents("b:1"), "intents do not");
        assert!(w.intents("c:1"));
        assert!(
            !w.intents("a:1"),
            "a peer without a catalog takes no intent either"
        );
    }
}
