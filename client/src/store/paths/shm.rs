//! Same host: a replica in a segment another process on this host shares
//! (`dataplane::mem::shm`: storage nodes and store clients offer their segments' memfds) is
//! mapped once and copied with memcpy, unless `MC_STORE_SHM` is false.
//!
//! A write takes a slot of the owner's write page for its copy, marked with its term, which
//! is how the owner's fence refuses or waits for it, and sends its intent on the same-host
//! socket before the first byte (`mem::shm`). An owner that cannot take the intent gets the
//! write over TCP instead (the item goes back to the later paths), whose WRITE its fence sees.
//! Once the call's bytes are in, the catalog records go on the same socket, one `send` per
//! owner for the whole call, and are counted on the write page before the put is committed;
//! an owner that does not take records there (offer version 3), or a send that fails, gets
//! them over TCP.

use std::sync::Arc;

use dataplane::mem::shm::{Announcement, WriteRefused};
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
            let _claim = match m.begin_write(r.buffer_address, r.size, w.items[i].key, r.version) {
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

/// The catalog records of a call's copies, one batch per owner, sent once every byte is in.
#[derive(Default)]
struct Records {
    by_owner: Vec<(Arc<ShmMapping>, Vec<u8>, Vec<usize>)>,
}

impl Records {
    /// Adds item `i`'s `record` of the object at `addr` of `m`'s segment.
    fn add(&mut self, m: &Arc<ShmMapping>, i: usize, addr: u64, record: &[u8]) {
        let at = match self.by_owner.iter().position(|(o, ..)| Arc::ptr_eq(o, m)) {
            Some(at) => at,
            None => {
                self.by_owner.push((m.clone(), Vec::new(), Vec::new()));
                self.by_owner.len() - 1
            }
        };
        let (_, frames, items) = &mut self.by_owner[at];
        Announcement::frame(addr, record, frames);
        items.push(i);
    }

    /// Sends each owner's records; those an owner could not take go over TCP.
    fn send(self, w: &mut WriteCall<'_, '_>) {
        for (m, frames, items) in self.by_owner {
            if let Err(e) = m.send_records(&frames, items.len() as u64) {
                let endpoint = &w.items[items[0]].replica.transport_endpoint;
                tracing::warn!("{endpoint}: same-host records not sent ({e}); over TCP");
                w.peers().forget_shared(endpoint);
                for i in items {
                    w.record_after(i);
                }
            }
        }
    }
}
