//! One call's state as its paths see it, and the recovery steps every path calls.
//!
//! [`WriteCall`] carries a batch of writes through the paths: their results, the same-host
//! mappings looked up for the call ([`Reach`]), the catalog payloads built once per item
//! ([`Ledger`]) and the items whose catalog record goes over TCP once every path has moved
//! its bytes. The steps that keep a write recoverable are its methods, the only place they
//! are spelled:
//!
//! - [`WriteCall::fence_own`] / [`WriteCall::record_own`]: a copy into our own segment holds
//!   a slot of our term fence's write page, and is recorded in our own catalog directly;
//! - [`WriteCall::ended`]: the error of a write whose term has ended (an owner's fence
//!   refused it);
//! - [`WriteCall::takes_intents`] / [`WriteCall::intent_op`]: the intent that goes ahead of a replica's bytes, when its
//!   owner takes intents (`docs/recovery.md`, invariant 8);
//! - [`WriteCall::record`] / [`WriteCall::record_op`] / [`WriteCall::record_after`]: the
//!   catalog record, on the lane behind the bytes, in the same-host ring (`paths::shm`) or,
//!   for other bytes the owner's CPU did not see, over TCP once they landed.

use std::sync::Arc;

use dataplane::mem::{ShmMapping, Src};
use dataplane::transport::client::TransferOp;
use protocol::{ErrorCode, ReplicaDescriptor};

use dataplane::recovery::inflight::WriteClaim;

use super::super::catalog::CatalogWriter;
use super::super::peers::{group_for, Group, Peers, ReadItem, WriteItem};
use super::super::StoreError;

/// What the paths' `reaches` consult: the peers, and the same-host mappings of the call's
/// endpoints, each looked up (and its exporter's liveness checked) once per call.
pub(in crate::store) struct Reach<'c> {
    pub peers: &'c Peers,
    shared: Vec<(String, Option<Arc<ShmMapping>>)>,
}

impl<'c> Reach<'c> {
    fn new(peers: &'c Peers) -> Self {
        Reach {
            peers,
            shared: Vec::new(),
        }
    }

    /// The same-host mapping of `endpoint`'s segment, if another live process here shares it.
    pub fn shared(&mut self, endpoint: &str) -> Option<Arc<ShmMapping>> {
        if let Some((_, m)) = self.shared.iter().find(|(e, _)| e == endpoint) {
            return m.clone();
        }
        let m = self.peers.shared_segment(endpoint);
        self.shared.push((endpoint.to_string(), m.clone()));
        m
    }
}

/// The catalog payloads of a batch of writes, built once per item before any path runs (the
/// requests that carry them borrow them).
pub(in crate::store) struct Ledger {
    records: Vec<Vec<u8>>,
    intents: Vec<Vec<u8>>,
}

impl Ledger {
    pub fn new(items: &[WriteItem<'_>]) -> Ledger {
        Ledger {
            records: items
                .iter()
                .map(|it| CatalogWriter::record(it.replica, it.key, it.pins(), it.provisional))
                .collect(),
            intents: items
                .iter()
                .map(|it| CatalogWriter::intent(it.replica, it.key))
                .collect(),
        }
    }
}

/// A batch of writes on its way through the paths.
pub(in crate::store) struct WriteCall<'c, 'a> {
    pub items: &'c [WriteItem<'a>],
    pub results: Vec<Result<(), StoreError>>,
    pub reach: Reach<'c>,
    ledger: &'c Ledger,
    /// Items whose catalog record goes over TCP once every path is done.
    late: Vec<usize>,
}

impl<'c, 'a> WriteCall<'c, 'a> {
    pub fn new(peers: &'c Peers, items: &'c [WriteItem<'a>], ledger: &'c Ledger) -> Self {
        WriteCall {
            items,
            results: vec![Ok(()); items.len()],
            reach: Reach::new(peers),
            ledger,
            late: Vec::new(),
        }
    }

    pub fn peers(&self) -> &'c Peers {
        self.reach.peers
    }

    /// The items whose parts add up to their replica's size; the others fail here.
    pub fn sized(&mut self) -> Vec<usize> {
        let mut ok = Vec::with_capacity(self.items.len());
        for (i, it) in self.items.iter().enumerate() {
            let r = it.replica;
            let total: u64 = it.parts.iter().map(|p| p.len() as u64).sum();
            if total == r.size {
                ok.push(i);
            } else {
                self.results[i] = Err(StoreError::invalid(format!(
                    "{total} bytes for a replica of {} bytes",
                    r.size
                )));
            }
        }
        ok
    }

    /// Claims item `i`'s range under our own term fence and announces it to our own catalog;
    /// `None` (the item failed) when its term has ended. Copy only while the claim is held.
    pub fn fence_own(&mut self, i: usize) -> Option<WriteClaim<'c>> {
        let it = &self.items[i];
        match self.peers().catalog.begin_local(it.replica, it.key) {
            Ok(claim) => Some(claim),
            Err(fence) => {
                self.ended(i, fence);
                None
            }
        }
    }

    /// Records item `i`, copied into our own segment, in our own catalog.
    pub fn record_own(&mut self, i: usize) {
        let it = &self.items[i];
        let recorded =
            self.peers()
                .catalog
                .record_local(it.replica, it.key, it.pins(), it.provisional);
        if let Err(e) = recorded {
            self.results[i] = Err(own_catalog_refused("record", it.key, it.replica, e));
        }
    }

    /// Fails item `i`: its put's term has ended (its owner fences writes below `fence`).
    pub fn ended(&mut self, i: usize, fence: u64) {
        let it = &self.items[i];
        self.results[i] = Err(ended_term(it.key, it.replica, fence));
    }

    /// Whether item `i`'s owner takes intents ahead of its bytes.
    pub fn takes_intents(&self, i: usize) -> bool {
        let r = self.items[i].replica;
        self.peers().catalog.intents(&r.transport_endpoint)
    }

    /// Item `i`'s encoded intent record, sent ahead of its bytes.
    pub fn intent(&self, i: usize) -> &'c [u8] {
        &self.ledger.intents[i]
    }

    /// The intent to send ahead of item `i`'s bytes, and its length.
    pub fn intent_op(&self, i: usize) -> (TransferOp<'c>, usize) {
        let intent = self.intent(i);
        let op = TransferOp::CatalogIntent {
            remote_addr: self.items[i].replica.buffer_address,
            record: Src::from(intent),
        };
        (op, intent.len())
    }

    /// Queues item `i`'s intent in `groups` (by endpoint, at its put's term), if its owner
    /// takes intents.
    pub fn announce(&self, groups: &mut Vec<Group<'c, 'c>>, i: usize) {
        if self.takes_intents(i) {
            let r: &'c ReplicaDescriptor = self.items[i].replica;
            let (op, len) = self.intent_op(i);
            group_for(groups, &r.transport_endpoint, Some(r.version.term)).push(i, op, len);
        }
    }

    /// Item `i`'s encoded catalog record, if its owner keeps a catalog.
    pub fn record(&self, i: usize) -> Option<&'c [u8]> {
        let r = self.items[i].replica;
        let record: &'c [u8] = &self.ledger.records[i];
        self.peers()
            .catalog
            .enabled(&r.transport_endpoint)
            .then_some(record)
    }

    /// Item `i`'s catalog record as a request, if its owner keeps a catalog.
    pub fn record_op(&self, i: usize) -> Option<(TransferOp<'c>, usize)> {
        let r = self.items[i].replica;
        self.record(i).map(|record| {
            let op = TransferOp::CatalogPut {
                remote_addr: r.buffer_address,
                record: Src::from(record),
            };
            (op, record.len())
        })
    }

    /// Records item `i` in its owner's catalog over TCP once every path is done (for bytes
    /// that did not travel on a lane the record could follow).
    pub fn record_after(&mut self, i: usize) {
        let r = self.items[i].replica;
        if self.peers().catalog.enabled(&r.transport_endpoint) {
            self.late.push(i);
        }
    }

    /// Sends the records queued by [`WriteCall::record_after`] of the items that succeeded,
    /// and returns the results.
    pub fn finish(mut self) -> Vec<Result<(), StoreError>> {
        let mut groups: Vec<Group<'c, 'c>> = Vec::new();
        for &i in self.late.iter().filter(|&&i| self.results[i].is_ok()) {
            if let Some((op, len)) = self.record_op(i) {
                let ep: &'c str = &self.items[i].replica.transport_endpoint;
                group_for(&mut groups, ep, None).push(i, op, len);
            }
        }
        if !groups.is_empty() {
            self.peers().run_groups(groups, &mut self.results);
        }
        self.results
    }
}

/// A batch of reads on its way through the paths.
pub(in crate::store) struct ReadCall<'c, 'a> {
    pub items: &'c mut [ReadItem<'a>],
    pub results: Vec<Result<(), StoreError>>,
    pub reach: Reach<'c>,
}

impl<'c, 'a> ReadCall<'c, 'a> {
    pub fn new(peers: &'c Peers, items: &'c mut [ReadItem<'a>]) -> Self {
        ReadCall {
            results: vec![Ok(()); items.len()],
            items,
            reach: Reach::new(peers),
        }
    }

    pub fn peers(&self) -> &'c Peers {
        self.reach.peers
    }

    /// The items with bytes to read inside their replica; those outside fail here, empty ones
    /// are done.
    pub fn in_range(&mut self) -> Vec<usize> {
        let mut ok = Vec::with_capacity(self.items.len());
        for (i, it) in self.items.iter().enumerate() {
            let len = it.dst.len() as u64;
            if it
                .offset
                .checked_add(len)
                .is_none_or(|end| end > it.replica.size)
            {
                self.results[i] = Err(StoreError::invalid(format!(
                    "a read of {len} bytes at {} of a {}-byte replica",
                    it.offset, it.replica.size
                )));
            } else if len > 0 {
                ok.push(i);
            }
        }
        ok
    }
}

/// Our own catalog refused `what` (a record or a tombstone) of `key`: its term has ended.
pub(in crate::store) fn own_catalog_refused(
    what: &str,
    key: &str,
    r: &ReplicaDescriptor,
    e: dataplane::TeError,
) -> StoreError {
    StoreError::new(
        ErrorCode::TransferFail,
        format!(
            "our own catalog refused the {what} of {key} (version {}): {e}; its term has ended",
            r.version
        ),
    )
}

/// The error of a write refused because its put's term has ended: the owner heard of a newer
/// master (its fence is at `fence`), which may hand the range to a put of its own.
fn ended_term(key: &str, r: &ReplicaDescriptor, fence: u64) -> StoreError {
    StoreError::new(
        ErrorCode::TransferFail,
        format!(
            "the put of {key} (version {}) is of a term that has ended: the owner of {:#x} \
             fences writes below term {fence}",
            r.version, r.buffer_address
        ),
    )
}
