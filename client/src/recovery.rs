//! The owner's side of index recovery (`docs/recovery.md`): keeping segment catalogs in step
//! with the master's frees, and re-reporting every catalogued object when the master asks for
//! a re-mount (it restarted, or expired us).
//!
//! Both the storage node (one catalog per shard) and a store client that contributes a
//! segment call [`ping`] once per ping interval.
//!
//! Invariants: a freed-range notice drops only catalog entries that existed when the ping was
//! sent (the catalog mark), so an object written into a reused range after that is never
//! forgotten; every catalog is fenced at the answering master's term before anything is
//! re-mounted to it (`Catalog::fence`), so a late record of an earlier term cannot replace
//! the entry of an object that master placed; a segment served over RDMA has new memory keys
//! before it is re-mounted to a master of a new term (`RdmaSide::rekey`), so an RDMA write of
//! an earlier term cannot land on a range that master hands out; a re-mount repeats every
//! segment in each of its calls, so the held objects of a chunk are never refused for an
//! unknown segment, and repeating a call is harmless (the master skips objects it already
//! has).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use dataplane::recovery::Catalog;
use parking_lot::Mutex;
use protocol::message::{GracefulUnmountSegment, Ping, ReMountDone, ReMountSegment};
use protocol::{ClientStatus, ErrorCode, HeldObject, Segment, Uuid};

use crate::limits::REMOUNT_HELD_BYTES_MAX;
use crate::master::MasterClient;
use crate::tier::OwnerDisk;

/// A segment this process serves, and its catalog.
#[derive(Clone, Copy)]
pub struct Served<'a> {
    pub desc: &'a Segment,
    pub catalog: &'a Catalog,
}

/// The drains of this process's segments (`docs/fleet.md`), as the master's ping answers
/// listed them: kept going on a restarted master or a new HA leader, and remembered once they
/// ended so that a re-mount never brings the segment back.
#[derive(Default)]
pub struct OwnerDrains {
    inner: Mutex<DrainBook>,
}

#[derive(Default)]
struct DrainBook {
    /// Draining segments, by id, with their deadlines.
    going: HashMap<Uuid, Instant>,
    /// Segments whose drain ended: the master unmounted them.
    ended: HashSet<Uuid>,
}

impl OwnerDrains {
    /// Whether segment `id`'s drain ended (it is not mounted, nor re-mounted, again).
    pub fn ended(&self, id: &Uuid) -> bool {
        self.inner.lock().ended.contains(id)
    }

    /// Books the drains a ping answer listed, each `(segment, ms left)`.
    fn learn(&self, draining: &[(Uuid, u64)]) {
        let now = Instant::now();
        let mut b = self.inner.lock();
        for &(id, left) in draining {
            if !b.ended.contains(&id) {
                b.going.insert(id, now + Duration::from_millis(left));
            }
        }
    }

    /// Repeats `GracefulUnmountSegment` for every drain going, with the time left (none
    /// past its deadline: the master unmounts it at once), so that a master that forgot a
    /// drain starts it again; a drain the master answers `SEGMENT_NOT_FOUND` for has ended.
    fn keep_going(&self, master: &MasterClient, client_id: Uuid) {
        let going: Vec<(Uuid, Instant)> = self
            .inner
            .lock()
            .going
            .iter()
            .map(|(&k, &v)| (k, v))
            .collect();
        let now = Instant::now();
        for (segment_id, deadline) in going {
            let grace_ms = u64::try_from(deadline.saturating_duration_since(now).as_millis())
                .unwrap_or(u64::MAX);
            let r = master.call(&GracefulUnmountSegment {
                client_id,
                segment_id,
                grace_ms,
            });
            if matches!(r, Ok(Err(ErrorCode::SegmentNotFound))) {
                tracing::info!(
                    "segment {}-{} drained: the master unmounted it; it will not be mounted again",
                    segment_id.hi,
                    segment_id.lo
                );
                let mut b = self.inner.lock();
                b.going.remove(&segment_id);
                b.ended.insert(segment_id);
            }
        }
    }
}

/// What one [`ping`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PingOutcome {
    pub status: ClientStatus,
    /// Catalog entries dropped for ranges the master freed.
    pub forgotten: usize,
    /// Objects re-reported in a re-mount (0 when none was asked for).
    pub reported: usize,
}

/// The catalogued objects of `s`, as the master's `HeldObject`s, then its tombstones (size
/// 0: the key was removed at that version; `docs/ha.md`).
pub fn held_objects(s: &Served<'_>) -> Vec<HeldObject> {
    let objects = s
        .catalog
        .entries_in(s.desc.base, s.desc.size)
        .into_iter()
        .map(|e| HeldObject {
            key: e.key,
            size: e.len,
            segment_name: s.desc.name.clone(),
            buffer_address: e.addr,
            with_hard_pin: e.hard_pin,
            version: e.version,
            soft_pin_ttl_ms: e.soft_pin_ttl_ms,
        });
    let tombstones = s
        .catalog
        .tombstones()
        .into_iter()
        .map(|(key, version)| HeldObject {
            key,
            size: 0,
            segment_name: s.desc.name.clone(),
            buffer_address: 0,
            with_hard_pin: false,
            version,
            soft_pin_ttl_ms: None,
        });
    objects.chain(tombstones).collect()
}

/// Pings the master; drops catalog entries for the ranges it freed; on `NEED_REMOUNT`
/// re-mounts every segment with every catalogued object, but those whose drain ended
/// (`drains`), and keeps every drain going (`OwnerDrains`). `rdma`: the side serving these
/// segments over RDMA, whose memory keys change when the term does. `disk`: this process's
/// disk tier (`crate::tier`), whose files of freed ranges are deleted, whose lost copies are
/// reported, and which a re-mount reports with the memory segments. Errors are described for
/// the log.
pub fn ping(
    master: &MasterClient,
    client_id: Uuid,
    served: &[Served<'_>],
    disk: Option<&OwnerDisk>,
    rdma: Option<&crate::rdma::RdmaSide>,
    drains: &OwnerDrains,
) -> Result<PingOutcome, String> {
    let served: Vec<Served<'_>> = served
        .iter()
        .filter(|s| !drains.ended(&s.desc.id))
        .copied()
        .collect();
    let served = &served[..];
    let disk = disk.filter(|d| !drains.ended(&d.desc.id));
    let marks: Vec<u64> = served.iter().map(|s| s.catalog.mark()).collect();
    let disk_mark = disk.map(|d| d.tier.mark());
    let r = master
        .call(&Ping { client_id })
        .map_err(|e| e.to_string())?
        .map_err(|code| format!("ping refused: {code:?}"))?;
    // The fence goes up before the re-mount below, so no range of a re-mounted segment can
    // be handed out by this master while a record of an earlier term is still accepted.
    let term = u64::try_from(r.view_version).unwrap_or(0);
    let ended = raise_fences(served, term);
    if let Some(side) = rdma {
        rekey(side, ended, term);
    }
    let mut forgotten = 0;
    for (s, &mark) in served.iter().zip(&marks) {
        let end = s.desc.base.saturating_add(s.desc.size);
        for &(addr, len) in &r.freed {
            if addr >= s.desc.base && addr < end {
                forgotten += s.catalog.forget(addr, len, mark);
            }
        }
    }
    if let (Some(d), Some(mark)) = (disk, disk_mark) {
        forgotten += d.forget_freed(&r.freed, mark);
    }
    let mut reported = 0;
    drains.learn(&r.draining);
    if r.status == ClientStatus::NeedRemount {
        // With no segment left too: the re-mount makes this client known to the master.
        reported = remount(master, client_id, served)?;
        if let Some(d) = disk {
            reported += d.mount(master, client_id)?;
        }
        // Before the fence ends: the drains this master may not know of start again.
        drains.keep_going(master, client_id);
        // All of it is in: a new HA leader may end its recovery fence early. A master that
        // does not know the call (an older one) answers an error, which changes nothing.
        let _ = master.call(&ReMountDone { client_id });
    } else {
        drains.keep_going(master, client_id);
        if let Some(d) = disk {
            d.report_lost(master, client_id);
        }
    }
    Ok(PingOutcome {
        status: r.status,
        forgotten,
        reported,
    })
}

/// RDMA writes of earlier terms pass no server, and once their intent was answered nothing
/// stops them but their memory keys: when a term `ended`, new keys (the old ones
/// deregistered) before the re-mount, as for the memcpy slots of [`raise_fences`]; then the
/// keys not published yet are.
fn rekey(side: &crate::rdma::RdmaSide, ended: bool, term: u64) {
    if ended {
        match side.rekey() {
            Ok(n) => tracing::info!(
                "the master's term is {term}: {n} segment(s) served over RDMA have new memory \
                 keys; RDMA writes of earlier terms are refused"
            ),
            Err(e) => tracing::error!(
                "the master's term is {term}: changing RDMA memory keys: {e}; RDMA writes of \
                 earlier terms may still land on ranges the master hands out again, or new \
                 keys are not published yet (retried at each ping)"
            ),
        }
    }
    side.publish_pending();
}

/// Fences every catalog of `served` at `term` and waits (for one bound in all) for the memcpy
/// copies of earlier terms already under way; whether a term ended (not our first), so
/// writers of it may still hold our memory keys.
fn raise_fences(served: &[Served<'_>], term: u64) -> bool {
    let raised: Vec<&Served<'_>> = served
        .iter()
        .filter(|s| s.catalog.fence_term() != term)
        .collect();
    // A term ended (not our first): writers of it may still hold our memory keys.
    let ended = raised.iter().any(|s| s.catalog.fence_term() != 0);
    for s in &raised {
        let was = s.catalog.fence_term();
        let cut = s.catalog.fence(term);
        tracing::info!(
            segment = %s.desc.name,
            "the master's term is {term} (was {was}): catalog records, WRITEs and memcpy \
             writes of earlier terms are refused ({cut} connection(s) cut mid-WRITE)"
        );
    }
    // Copies by memcpy (ours, same-host importers') of earlier terms already under way may
    // still land: the re-mount waits for them (`recovery::inflight`), for one bound in all.
    let deadline = std::time::Instant::now() + dataplane::recovery::inflight::STALE_WRITES_WAIT;
    for s in &raised {
        let (stale, left) = s.catalog.fences().wait_for_writes(deadline);
        if left > 0 {
            tracing::error!(
                segment = %s.desc.name,
                "{left} memcpy write(s) of an earlier term still copying after {:?}: \
                 re-mounting anyway; their bytes may land on ranges the master hands out again",
                dataplane::recovery::inflight::STALE_WRITES_WAIT
            );
        } else if stale > 0 {
            tracing::info!(
                segment = %s.desc.name,
                "waited for {stale} memcpy write(s) of an earlier term to end before re-mounting"
            );
        }
    }
    ended
}

/// `ReMountSegment` with every segment and every catalogued object, in calls of at most
/// [`REMOUNT_HELD_BYTES_MAX`] key bytes. Returns the number of objects reported.
pub fn remount(
    master: &MasterClient,
    client_id: Uuid,
    served: &[Served<'_>],
) -> Result<usize, String> {
    let segments: Vec<Segment> = served.iter().map(|s| s.desc.clone()).collect();
    let held: Vec<HeldObject> = served.iter().flat_map(held_objects).collect();
    let total = held.len();
    let mut chunks: Vec<Vec<HeldObject>> = vec![Vec::new()];
    let mut bytes = 0usize;
    for h in held {
        let cost = h.key.len() + h.segment_name.len() + 64;
        if bytes + cost > REMOUNT_HELD_BYTES_MAX && !chunks[chunks.len() - 1].is_empty() {
            chunks.push(Vec::new());
            bytes = 0;
        }
        bytes += cost;
        let last = chunks.len() - 1;
        chunks[last].push(h);
    }
    // Every chunk is sent even if one is refused (the master re-inserts what it can of each;
    // a refusal names a segment it could not mount).
    let mut first_err = None;
    for held in chunks {
        let r = master.call(&ReMountSegment {
            client_id,
            segments: segments.clone(),
            held,
        });
        let err = match r {
            Ok(Ok(())) => continue,
            Ok(Err(code)) => format!("re-mount refused: {code:?}"),
            Err(e) => e.to_string(),
        };
        first_err.get_or_insert(err);
    }
    first_err.map_or(Ok(total), Err)
}
