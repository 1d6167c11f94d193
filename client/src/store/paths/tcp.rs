//! TCP: any other replica is reached through the pooled data-plane client of its endpoint
//! (`store::peers`: one [`dataplane::transport::client::TcpClient`] per endpoint, with
//! back-off after failures).
//!
//! Requests larger than `TRANSFER_SLICE_BYTES` are cut into slices so that one object spreads
//! over the client's lanes; each endpoint's requests go as one batch. A write's intent rides
//! on the lane right ahead of each of its slices, so the owner drops the catalog entries the
//! object goes over before any of its bytes land there; its WRITEs are declared at its put's
//! term, which the owner's fence checks. Its record follows its one slice on the same lane,
//! or, for an object of several slices, goes once every slice has landed.

use dataplane::transport::client::TransferOp;
use protocol::ReplicaDescriptor;

use super::call::{Reach, ReadCall, WriteCall};
use super::{picked, ReplicaPath};
use crate::limits::TRANSFER_SLICE_BYTES;
use crate::store::peers::{group_for, Group, WriteItem};

pub(super) struct Tcp;

impl ReplicaPath for Tcp {
    fn reaches(&self, _: &mut Reach<'_>, _: &ReplicaDescriptor, _: u64, _: u64) -> bool {
        true
    }

    fn write(&self, w: &mut WriteCall<'_, '_>, mine: Vec<usize>) -> Vec<usize> {
        let mut groups: Vec<Group<'_, '_>> = Vec::new();
        for i in mine {
            let r = w.items[i].replica;
            let g = group_for(&mut groups, &r.transport_endpoint, Some(r.version.term));
            let slices = push_slices(w, g, i);
            match w.record_op(i) {
                Some((op, len)) if slices == 1 => g.push(i, op, len),
                Some(_) => w.record_after(i),
                None => {}
            }
        }
        w.peers().run_groups(groups, &mut w.results);
        Vec::new()
    }

    fn read(&self, rc: &mut ReadCall<'_, '_>, mine: Vec<usize>) -> Vec<usize> {
        read_items(rc, mine);
        Vec::new()
    }
}

/// Reads items `mine` through the pooled clients of their replicas' endpoints, each cut into
/// slices of `TRANSFER_SLICE_BYTES`.
fn read_items(rc: &mut ReadCall<'_, '_>, mine: Vec<usize>) {
    {
        let mut groups: Vec<Group<'_, '_>> = Vec::new();
        for (i, it) in picked(rc.items, &mine) {
            let g = group_for(&mut groups, &it.replica.transport_endpoint, None);
            let mut at = it.replica.buffer_address + it.offset;
            for d in it.dst.reborrow().chunks(TRANSFER_SLICE_BYTES) {
                let n = d.len();
                g.push(
                    i,
                    TransferOp::Read {
                        remote_addr: at,
                        dst: d,
                    },
                    n,
                );
                at += n as u64;
            }
        }
        rc.reach.peers.run_groups(groups, &mut rc.results);
    }
}

/// Queues item `i`'s WRITE slices in `g`, each behind its intent when the owner takes
/// intents; returns how many slices.
fn push_slices<'c>(w: &WriteCall<'c, '_>, g: &mut Group<'c, 'c>, i: usize) -> usize {
    let it: &'c WriteItem<'_> = &w.items[i];
    let announced = w.takes_intents(i);
    let mut slices = 0;
    let mut at = it.replica.buffer_address;
    for p in it.parts {
        for s in p.chunks(TRANSFER_SLICE_BYTES) {
            if announced {
                let (op, len) = w.intent_op(i);
                g.push(i, op, len);
            }
            slices += 1;
            g.push(
                i,
                TransferOp::Write {
                    remote_addr: at,
                    src: s,
                },
                s.len(),
            );
            at += s.len() as u64;
        }
    }
    slices
}
