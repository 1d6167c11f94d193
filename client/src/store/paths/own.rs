//! Our own segment: replicas in this process's own segment are copied with memcpy (after a
//! range check against the segment), unless `MC_STORE_MEMCPY` is false. A write holds a slot
//! of our term fence's write page around its copy and is recorded in our own catalog directly.

use dataplane::mem::{Dst, Src};
use protocol::{ErrorCode, ReplicaDescriptor};

use super::call::{Reach, ReadCall, WriteCall};
use super::copy::{read_into, write_parts, Mapping};
use super::{picked, ReplicaPath};
use crate::store::StoreError;

pub(super) struct Own;

impl ReplicaPath for Own {
    fn reaches(&self, c: &mut Reach<'_>, r: &ReplicaDescriptor, _addr: u64, _len: u64) -> bool {
        c.peers.is_local(r)
    }

    fn write(&self, w: &mut WriteCall<'_, '_>, mine: Vec<usize>) -> Vec<usize> {
        for i in mine {
            let Some(_claim) = w.fence_own(i) else {
                continue;
            };
            let items = w.items;
            w.results[i] = copy_in(w, items[i].replica, items[i].parts);
            if w.results[i].is_ok() {
                w.record_own(i);
            }
        }
        Vec::new()
    }

    fn read(&self, rc: &mut ReadCall<'_, '_>, mine: Vec<usize>) -> Vec<usize> {
        let peers = rc.peers();
        for (i, it) in picked(rc.items, &mine) {
            let src = it.replica.buffer_address + it.offset;
            rc.results[i] = copy_out(peers, src, it.dst.reborrow());
        }
        Vec::new()
    }
}

fn own_range(
    peers: &crate::store::peers::Peers,
    addr: u64,
    len: u64,
    code: ErrorCode,
) -> Result<(), StoreError> {
    let own = peers.own.ok_or(ErrorCode::TransferFail)?;
    if !own.contains(addr, len) {
        return Err(StoreError::new(
            code,
            format!("replica at {addr:#x} is outside our own segment"),
        ));
    }
    Ok(())
}

fn copy_in(
    w: &WriteCall<'_, '_>,
    r: &ReplicaDescriptor,
    parts: &[Src<'_>],
) -> Result<(), StoreError> {
    let peers = w.peers();
    own_range(peers, r.buffer_address, r.size, ErrorCode::InvalidWrite)?;
    // SAFETY: the whole object lies inside our own segment (checked above), mapped for as
    // long as the store; no reference is formed over it.
    let dst = unsafe { Dst::from_raw(r.buffer_address as *mut u8, r.size as usize) };
    // The parts add up to `size` (checked by the caller). Our own mapping's residency is
    // exact, hugetlb or not.
    write_parts(parts, dst, Mapping::Own);
    peers.stats.add_own(r.size);
    Ok(())
}

fn copy_out(peers: &crate::store::peers::Peers, src: u64, dst: Dst<'_>) -> Result<(), StoreError> {
    let len = dst.len();
    own_range(peers, src, len as u64, ErrorCode::InvalidRead)?;
    // SAFETY: [src, src + len) lies inside our own segment (checked above), mapped for as
    // long as the store; no reference is formed over it.
    let from = unsafe { Src::from_raw(src as *const u8, len) };
    read_into(from, dst);
    peers.stats.add_own(len as u64);
    Ok(())
}
