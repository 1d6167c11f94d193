//! The paths a replica is written and read by, one file each, behind one trait.
//!
//! A path is a way bytes move between the caller's memory and a replica: [`own`] (memcpy into
//! this process's own segment), [`shm`] (memcpy through a same-host peer's shared mapping),
//! [`rdma`] (one-sided RDMA) and [`tcp`] (the pooled data-plane client). [`Peers`] offers each
//! item of a call to the paths in [`PATHS`]' order (the preference order: cheapest first);
//! a path [`ReplicaPath::reaches`] the items it can serve, moves their bytes as one group
//! ([`ReplicaPath::write`], [`ReplicaPath::read`]), and hands back the ones it found it cannot
//! serve after all (a same-host owner that cannot take an intent), which the later paths are
//! offered in turn. TCP reaches every memory replica, so nothing is left over.
//!
//! What keeps a write recoverable (its intent ahead of its bytes, the owner's term fence, the
//! catalog record once the bytes landed: `docs/recovery.md`, `docs/ha.md`) is not in the path
//! files: they call the small API of [`call`] ([`WriteCall`]: `fence_own`, `record_own`,
//! `ended`, `announce`, `intent_op`, `record_op`, `record_after`), so a path file holds only how its bytes
//! move.
//!
//! **A new medium is a new file.** The disk tier's path ([`disk`]: a `LOCAL_DISK` replica,
//! read from its owner's files and written by its owner only) is a unit struct implementing
//! [`ReplicaPath`] whose [`ReplicaPath::medium`] is [`ReplicaMedium::LocalDisk`], in
//! [`PATHS`]. Items are only offered to the paths of their replica's medium, so the memory
//! paths never see a disk replica, nor the disk path a memory one.

mod call;
mod copy;
mod disk;
mod own;
mod rdma;
mod shm;
mod tcp;

pub(super) use call::{own_catalog_refused, ReadCall, WriteCall};

use protocol::{ErrorCode, ReplicaDescriptor, ReplicaMedium};

use super::peers::Peers;
use super::StoreError;

/// One way of moving a replica's bytes.
pub(super) trait ReplicaPath: Sync {
    /// What holds the replicas this path moves.
    fn medium(&self) -> ReplicaMedium {
        ReplicaMedium::Memory
    }

    /// Whether this path serves `[addr, addr + len)` of `r` (the whole replica for a write, the
    /// range read for a read) in this call.
    fn reaches(&self, c: &mut call::Reach<'_>, r: &ReplicaDescriptor, addr: u64, len: u64) -> bool;

    /// Writes items `mine` (indices of `w.items`, ascending) and sets their results; returns
    /// the ones the later paths are to take instead.
    fn write(&self, w: &mut WriteCall<'_, '_>, mine: Vec<usize>) -> Vec<usize>;

    /// Reads items `mine` (ascending) and sets their results; returns the ones the later paths
    /// are to take instead.
    fn read(&self, r: &mut ReadCall<'_, '_>, mine: Vec<usize>) -> Vec<usize>;
}

/// The paths in preference order.
pub(super) const PATHS: [&dyn ReplicaPath; 5] =
    [&own::Own, &shm::Shm, &rdma::Rdma, &tcp::Tcp, &disk::Disk];

impl Peers {
    /// Runs every write by the first path that reaches it; one result per item, in order.
    pub(super) fn write_by_path(
        &self,
        items: &[super::peers::WriteItem<'_>],
    ) -> Vec<Result<(), StoreError>> {
        let ledger = call::Ledger::new(items);
        let mut w = WriteCall::new(self, items, &ledger);
        let mut left = w.sized();
        for path in PATHS {
            let mine = take_reached(&mut left, path, &mut w.reach, |i| {
                let r = items[i].replica;
                (r, r.buffer_address, r.size)
            });
            if !mine.is_empty() {
                merge(&mut left, path.write(&mut w, mine));
            }
        }
        unreached(&left, &mut w.results, |i| items[i].replica);
        w.finish()
    }

    /// Runs every read by the first path that reaches it; one result per item, in order.
    pub(super) fn read_by_path(
        &self,
        items: &mut [super::peers::ReadItem<'_>],
    ) -> Vec<Result<(), StoreError>> {
        let mut rc = ReadCall::new(self, items);
        let mut left = rc.in_range();
        for path in PATHS {
            let mine = take_reached(&mut left, path, &mut rc.reach, |i| {
                let it = &rc.items[i];
                (
                    it.replica,
                    it.replica.buffer_address + it.offset,
                    it.dst.len() as u64,
                )
            });
            if !mine.is_empty() {
                merge(&mut left, path.read(&mut rc, mine));
            }
        }
        let items = &*rc.items;
        unreached(&left, &mut rc.results, |i| items[i].replica);
        rc.results
    }
}

/// Takes out of `left` the items `path` reaches (those of its medium only).
fn take_reached<'r>(
    left: &mut Vec<usize>,
    path: &dyn ReplicaPath,
    reach: &mut call::Reach<'_>,
    mut at: impl FnMut(usize) -> (&'r ReplicaDescriptor, u64, u64),
) -> Vec<usize> {
    let (mine, rest): (Vec<usize>, Vec<usize>) = left.iter().partition(|&&i| {
        let (r, addr, len) = at(i);
        r.medium == path.medium() && path.reaches(reach, r, addr, len)
    });
    *left = rest;
    mine
}

/// Puts the items a path handed back among those left, in order.
fn merge(left: &mut Vec<usize>, back: Vec<usize>) {
    if !back.is_empty() {
        left.extend(back);
        left.sort_unstable();
    }
}

/// Fails the items no path reached (a medium no path moves yet).
fn unreached<'r>(
    left: &[usize],
    results: &mut [Result<(), StoreError>],
    replica: impl Fn(usize) -> &'r ReplicaDescriptor,
) {
    for &i in left {
        let r = replica(i);
        results[i] = Err(StoreError::new(
            ErrorCode::TransferFail,
            format!(
                "no path reaches the {:?} replica at {:#x} of {}",
                r.medium, r.buffer_address, r.segment_name
            ),
        ));
    }
}

/// The items of `items` whose indices are in `mine` (ascending), each once, mutably.
pub(super) fn picked<'x, T>(
    items: &'x mut [T],
    mine: &'x [usize],
) -> impl Iterator<Item = (usize, &'x mut T)> {
    let mut next = mine.iter().copied().peekable();
    items
        .iter_mut()
        .enumerate()
        .filter(move |(i, _)| next.next_if_eq(i).is_some())
}
