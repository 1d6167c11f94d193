//! The disk tier: `LOCAL_DISK` replicas, files of their owner's disk tier (`docs/tiering.md`).
//!
//! A disk replica is read where its files are: by this process's own tier directly when the
//! replica is on our disk segment; from the files themselves when their owner runs on this
//! host and shares its directory (`crate::disk::share`: the reader opens and checks the file
//! as the owner would, and anything but a whole, checked object sends it to the listener
//! instead); else from its owner's disk listener, which answers the data plane's READ frames
//! from files (so the read goes through the same pooled TCP client and lanes as a memory
//! replica's, one READ per object: [`read_remote`]). Every read checks the object's checksum;
//! a copy that fails it at its owner is an error here (the reader falls back to another
//! replica, or misses), and its owner drops it from the index.
//!
//! A disk replica is written only by its owner: the master hands the disk range to the owner
//! of the disk segment in an offload task, and the owner's executor writes the file from its
//! own memory. A write to another process's disk is refused.

use std::sync::atomic::Ordering;

use dataplane::mem::Src;
use dataplane::transport::client::TransferOp;
use protocol::{ErrorCode, ReplicaDescriptor, ReplicaMedium};

use super::call::{Reach, ReadCall, WriteCall};
use super::{picked, ReplicaPath};
use crate::store::peers::{group_for, Group, Peers, ReadItem};
use crate::store::StoreError;

pub(super) struct Disk;

impl ReplicaPath for Disk {
    fn medium(&self) -> ReplicaMedium {
        ReplicaMedium::LocalDisk
    }

    fn reaches(&self, _: &mut Reach<'_>, _: &ReplicaDescriptor, _: u64, _: u64) -> bool {
        true
    }

    fn write(&self, w: &mut WriteCall<'_, '_>, mine: Vec<usize>) -> Vec<usize> {
        let peers = w.peers();
        for i in mine {
            let it = &w.items[i];
            let r = it.replica;
            let Some(disk) = peers.own_disk(r) else {
                w.results[i] = Err(StoreError::new(
                    ErrorCode::TransferFail,
                    format!(
                        "the disk replica of {} on {} is written by its owner only",
                        it.key, r.segment_name
                    ),
                ));
                continue;
            };
            let (hard, soft_ttl_ms) = it.pins();
            let pins = crate::disk::Pins { hard, soft_ttl_ms };
            // The executor hands one buffer; a write of several parts is gathered once.
            let gathered: Vec<u8>;
            let src = match it.parts {
                [one] => *one,
                parts => {
                    gathered = parts.iter().flat_map(|p| p.to_vec()).collect();
                    Src::from(&gathered[..])
                }
            };
            w.results[i] = disk
                .tier
                .write(r.buffer_address, it.key, r.version, pins, src)
                .map_err(|e| {
                    StoreError::new(
                        ErrorCode::TransferFail,
                        format!("writing {} to disk: {e}", it.key),
                    )
                });
        }
        Vec::new()
    }

    fn read(&self, rc: &mut ReadCall<'_, '_>, mine: Vec<usize>) -> Vec<usize> {
        let peers = rc.peers();
        let mut remote = Vec::new();
        for (i, it) in picked(rc.items, &mine.clone()) {
            let Some(disk) = peers.own_disk(it.replica) else {
                if !read_same_host(peers, it) {
                    remote.push(i);
                }
                continue;
            };
            let at = it.replica.buffer_address + it.offset;
            rc.results[i] = disk.tier.read(at, it.dst.reborrow()).map_err(|e| {
                StoreError::new(
                    ErrorCode::TransferFail,
                    format!("reading {:#x} from our disk: {e}", at),
                )
            });
        }
        if !remote.is_empty() {
            read_remote(rc, remote);
        }
        let done = mine.iter().filter(|&&i| rc.results[i].is_ok()).count();
        let stats = &rc.peers().stats;
        stats.disk_reads.fetch_add(done as u64, Ordering::Relaxed);
        Vec::new()
    }
}

/// Reads `it` from the files of its owner if that runs on this host and shares its directory;
/// false when it did not (the listener reads it then).
fn read_same_host(peers: &Peers, it: &mut ReadItem<'_>) -> bool {
    let r = it.replica;
    let Some(dir) = peers.shared_dir(&r.transport_endpoint) else {
        return false;
    };
    match dir.read(
        r.buffer_address,
        r.version,
        r.size,
        it.offset,
        it.dst.reborrow(),
    ) {
        Ok(()) => {
            let stats = &peers.stats;
            stats.disk_same_host_reads.fetch_add(1, Ordering::Relaxed);
            true
        }
        Err(why) => {
            tracing::debug!(
                "{:#x} of {}: not read from its same-host files ({why}); through the listener",
                r.buffer_address,
                r.segment_name
            );
            false
        }
    }
}

/// Reads items `mine` from their owners' disk listeners, one READ per item: the listener
/// reads and checks a whole object for every READ, so the slices a memory read is cut into
/// (to spread it over lanes) would each cost a read of the whole file.
fn read_remote(rc: &mut ReadCall<'_, '_>, mine: Vec<usize>) {
    let mut groups: Vec<Group<'_, '_>> = Vec::new();
    for (i, it) in picked(rc.items, &mine) {
        let g = group_for(&mut groups, &it.replica.transport_endpoint, None);
        let n = it.dst.len();
        g.push(
            i,
            TransferOp::Read {
                remote_addr: it.replica.buffer_address + it.offset,
                dst: it.dst.reborrow(),
            },
            n,
        );
    }
    rc.reach.peers.run_groups(groups, &mut rc.results);
}
