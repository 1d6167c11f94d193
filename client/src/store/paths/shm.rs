//! Same host: a replica in a segment another process on this host shares
//! (`dataplane::mem::shm`: storage nodes and store clients offer their segments' memfds) is
//! mapped once and copied with memcpy, unless `MC_STORE_SHM` is false.
//!
//! A write takes a slot of the owner's write page for its copy, marked with its term, which
//! is how the owner's fence refuses or waits for it, and publishes its intent in the ring the
//! owner shares with it (or sends it on the same-host socket) before the first byte
//! (`mem::shm`). An owner that cannot take the intent gets the
//! write over TCP instead (the item goes back to the later paths), whose WRITE its fence sees.
//! Once the call's bytes are in, the catalog records go into the same ring as the intents,
//! before the put is committed; an owner that does not take records there (offer version 3),
//! or one that does not make room in time, gets them over TCP.

use std::sync::Arc;

use dataplane::mem::shm::WriteRefused;
use dataplane::mem::{Dst, ShmMapping, Src};
use protocol::ReplicaDescriptor;

use super::call::{Reach, ReadCall, WriteCall};
use super::copy::{read_into, write_parts, Mapping};
use super::{picked, ReplicaPath};

pub(super) struct Shm;

impl ReplicaPath for Shm {
    fn reaches(&self, c: &mut Reach<'_>, r: &ReplicaDescriptor, addr: u64, len: u64) -> bool {
        c.shared(&r.transport_endpoint)
            .is_some_and(|m| m.translate(addr, len).is_some())
    }

    fn write(&self, w: &mut WriteCall<'_, '_>, mine: Vec<usize>) -> Vec<usize> {
        let mut back = Vec::new();
        let mut records = Records::default();
        for i in mine {
            let r = w.items[i].replica;
            let Some(m) = w.reach.shared(&r.transport_endpoint) else {
                back.push(i);
                continue;
            };
            let Some(p) = m.translate(r.buffer_address, r.size) else {
                back.push(i);
                continue;
            };
            let _claim = match m.begin_write(r.buffer_address, r.version.term, w.intent(i)) {
                Ok(claim) => claim,
                Err(WriteRefused::Fenced { fence }) => {
                    w.ended(i, fence);
                    continue;
                }
                Err(WriteRefused::Unavailable(e)) => {
                    tracing::warn!(
                        "{}: same-host write not announced ({e}); over TCP",
                        r.transport_endpoint
                    );
                    w.peers().forget_shared(&r.transport_endpoint);
                    back.push(i);
                    continue;
                }
            };
            // SAFETY: the whole object [buffer_address, + size) lies in the mapping (checked),
            // which the call keeps mapped (`Reach`); no reference is formed over the owner's
            // segment.
            let dst = unsafe { Dst::from_raw(p, r.size as usize) };
            // The parts add up to `size` (checked before any path ran).
            let hugetlb = m.hugetlb();
            write_parts(w.items[i].parts, dst, Mapping::Peer { hugetlb });
            w.peers().stats.add_shm(r.size);
            match w.record(i) {
                Some(record) if m.takes_records() => records.add(&m, i, r.buffer_address, record),
                _ => w.record_after(i),
            }
        }
        records.send(w);
        back
    }

    fn read(&self, rc: &mut ReadCall<'_, '_>, mine: Vec<usize>) -> Vec<usize> {
        let mut back = Vec::new();
        for (i, it) in picked(rc.items, &mine) {
            let src = it.replica.buffer_address + it.offset;
            let len = it.dst.len();
            let Some(m) = rc.reach.shared(&it.replica.transport_endpoint) else {
                back.push(i);
                continue;
            };
            let Some(p) = m.translate(src, len as u64) else {
                back.push(i);
                continue;
            };
            // SAFETY: `translate` checked [src, src + len) lies in the mapping of the owner's
            // segment, which the call keeps mapped (`Reach`); no reference is formed over it.
            // Concurrent writers of other objects touch other ranges.
            let from = unsafe { Src::from_raw(p, len) };
            read_into(from, it.dst.reborrow());
            rc.reach.peers.stats.add_shm(len as u64);
        }
        back
    }
}

/// The catalog records of a call's copies, one batch per owner, published once every byte
/// is in.
#[derive(Default)]
struct Records<'c> {
    by_owner: Vec<OwnerRecords<'c>>,
}

/// One owner's records: `(addr, encoded record)`, and the items they belong to.
struct OwnerRecords<'c> {
    owner: Arc<ShmMapping>,
    records: Vec<(u64, &'c [u8])>,
    items: Vec<usize>,
}

impl<'c> Records<'c> {
    /// Adds item `i`'s `record` of the object at `addr` of `m`'s segment.
    fn add(&mut self, m: &Arc<ShmMapping>, i: usize, addr: u64, record: &'c [u8]) {
        let at = match self.by_owner.iter().position(|o| Arc::ptr_eq(&o.owner, m)) {
            Some(at) => at,
            None => {
                self.by_owner.push(OwnerRecords {
                    owner: m.clone(),
                    records: Vec::new(),
                    items: Vec::new(),
                });
                self.by_owner.len() - 1
            }
        };
        let o = &mut self.by_owner[at];
        o.records.push((addr, record));
        o.items.push(i);
    }

    /// Publishes each owner's records; those an owner could not take go over TCP.
    fn send(self, w: &mut WriteCall<'_, '_>) {
        for o in self.by_owner {
            if let Err((sent, e)) = o.owner.send_records(&o.records) {
                let endpoint = &w.items[o.items[0]].replica.transport_endpoint;
                tracing::warn!("{endpoint}: same-host records not published ({e}); over TCP");
                w.peers().forget_shared(endpoint);
                for &i in &o.items[sent..] {
                    w.record_after(i);
                }
            }
        }
    }
}
