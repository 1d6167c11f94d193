//! RDMA: with `protocol="rdma"`, a replica whose owner published an RDMA descriptor is read
//! and written with one-sided RDMA (`store::rdma`).
//!
//! The owner's CPU sees none of the RDMA bytes, so a write's intent goes over TCP first and
//! the RDMA WRITE is posted once the owner answered it (an intent refused, its term having
//! ended, stops the write before its bytes); its catalog record goes over TCP once the bytes
//! landed. A write whose owner refused our memory keys (it changed them at a new term) is
//! announced again and written with the keys it publishes now, once: if its own term is the
//! one that ended, the owner refuses that intent and no byte goes.

use std::sync::Arc;

use protocol::ReplicaDescriptor;

use super::call::{Reach, ReadCall, WriteCall};
use super::{picked, ReplicaPath};
use crate::store::peers::Group;
use crate::store::rdma::{RdmaFail, RdmaPeer, RdmaPeers};
use crate::store::StoreError;

pub(super) struct Rdma;

impl ReplicaPath for Rdma {
    fn reaches(&self, c: &mut Reach<'_>, r: &ReplicaDescriptor, _addr: u64, _len: u64) -> bool {
        c.peers.rdma_peer(r).is_some()
    }

    fn write(&self, w: &mut WriteCall<'_, '_>, mine: Vec<usize>) -> Vec<usize> {
        let mut announce: Vec<Group<'_, '_>> = Vec::new();
        let mut pending = Vec::new();
        for i in mine {
            queue(w, &mut announce, &mut pending, i);
        }
        for round in 0..2 {
            if !announce.is_empty() {
                let groups = std::mem::take(&mut announce);
                w.peers().run_groups(groups, &mut w.results);
            }
            for (i, rd, peer) in std::mem::take(&mut pending) {
                // An intent lost or refused (its term has ended) stops the write before its
                // bytes.
                if w.results[i].is_err() {
                    continue;
                }
                let it = &w.items[i];
                match rd.write(&peer, it.replica.buffer_address, it.parts) {
                    Err(RdmaFail::StaleKeys(e)) if round == 0 => {
                        if !queue(w, &mut announce, &mut pending, i) {
                            w.results[i] = Err(e);
                        }
                    }
                    done => {
                        w.results[i] = done.map_err(StoreError::from);
                        if w.results[i].is_ok() {
                            w.record_after(i);
                        }
                    }
                }
            }
        }
        Vec::new()
    }

    fn read(&self, rc: &mut ReadCall<'_, '_>, mine: Vec<usize>) -> Vec<usize> {
        let peers = rc.peers();
        let mut back = Vec::new();
        for (i, it) in picked(rc.items, &mine) {
            let Some((rd, peer)) = peers.rdma_peer(it.replica) else {
                back.push(i);
                continue;
            };
            let src = it.replica.buffer_address + it.offset;
            rc.results[i] = rd.read(&peer, src, it.dst.reborrow());
        }
        back
    }
}

/// Queues item `i`'s intent and its RDMA write to the owner's current descriptor; false when
/// its owner no longer publishes one.
fn queue<'c>(
    w: &WriteCall<'c, '_>,
    announce: &mut Vec<Group<'c, 'c>>,
    pending: &mut Vec<(usize, &'c RdmaPeers, Arc<RdmaPeer>)>,
    i: usize,
) -> bool {
    match w.peers().rdma_peer(w.items[i].replica) {
        Some((rd, peer)) => {
            w.announce(announce, i);
            pending.push((i, rd, peer));
            true
        }
        None => false,
    }
}
