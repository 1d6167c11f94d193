//! Draining a segment: its owner leaves gently, without losing what only it holds.
//!
//! A drain starts with `GracefulUnmountSegment` from the segment's owner (`mooncake_client`
//! sends it for each shard on SIGTERM) or with the admin call `POST /admin/drain` for a named
//! segment (`docs/fleet.md`). From then on, until it ends:
//!
//! 1. the segment takes no new allocation (`Seg::writable` is false), at once;
//! 2. every scan (`tick`, at most every [`DRAIN_SCAN_INTERVAL_MS`]) walks the index for
//!    objects with a replica on it:
//!    - an object with another COMPLETE replica on a segment that is not draining (nor a
//!      disk of an owner that drains any segment) loses its replica here as `BatchReplicaClear` drops one (its span parked while a read window
//!      is open, so a reader that holds it keeps reading the right bytes);
//!    - an object whose only complete copies are here gets an internal *move* task
//!      (`tasks.rs`, "Internal tasks") onto the writable memory segment with the most free
//!      bytes or, when no memory segment has room, onto the disk segment (`docs/tiering.md`)
//!      with the most, of an owner draining nothing; executed by that target's owner, it
//!      reads the bytes from the draining segment and writes its own. The move's commit
//!      drops the replica here, parked the same way. A failed move is booked again at a
//!      later scan;
//!    - an object with a put in flight is waited for (nothing new can be placed here);
//! 3. when no object holds a replica here and no parked span of it is left (its readers'
//!    windows ended), the segment is unmounted: the drain is done;
//! 4. at the deadline the segment is unmounted anyway, and at once when no other segment
//!    is left that could take its objects (a last node stopping, or every node draining
//!    together) once the owners of the pool had their chance to re-mount after this
//!    master's start or election (`State::owners_settled`); the objects whose only copy it still
//!    held leave the index, and how many is logged and counted
//!    (`master_drain_objects_lost_total`, with `master_drains_timed_out_total`).
//!
//! The drain state is the segment's `draining_until`; it is soft state, like tasks, kept by
//! the owner: every ping answer lists the pinging owner's draining segments with the time left
//! to their deadlines, and the segments the master unmounted at the end of a drain (or at
//! once, by the admin call) with none left. The owner (`client/src/recovery.rs`) repeats
//! `GracefulUnmountSegment` for each with the time left, at every ping and so right after a
//! re-mount: a new HA leader or a restarted master, which learns the segment from that
//! re-mount as a plain one, starts the drain again with its deadline. Once the master answers
//! `SEGMENT_NOT_FOUND`, the owner never re-mounts the segment.

use protocol::ErrorCode;

use super::metrics::Metrics;
use super::segments::{Seg, SegRef};
use super::tasks::Internal;
use super::State;
use crate::limits::{DRAIN_MOVES_PER_SCAN_MAX, DRAIN_SCAN_INTERVAL_MS};

/// What one scan of a draining segment found.
#[derive(Default)]
struct Scan {
    /// Objects with a replica on the segment after the scan.
    holding: usize,
    /// Of those, objects whose only complete copies are on it.
    only_copies: usize,
    /// Replicas dropped because the object has a copy elsewhere.
    detached: u64,
}

impl State {
    /// Starts (or shortens) the drain of segment `r`, with a deadline `deadline_ms` from now.
    pub(crate) fn start_drain(&mut self, now: u64, r: SegRef, deadline_ms: u64) {
        let Some(seg) = self.segs.get_mut(r) else {
            return;
        };
        let deadline = now.saturating_add(deadline_ms);
        if seg.draining_until.is_none() {
            tracing::info!(
                "draining segment {}: no new allocations, moving its only copies, deadline in \
                 {deadline_ms} ms",
                seg.name
            );
        }
        seg.draining_until = Some(seg.draining_until.map_or(deadline, |d| d.min(deadline)));
        seg.ramp = None;
        self.next_drain_scan_ms = now;
    }

    /// The admin call: drains the segment named `name`.
    pub(crate) fn drain_by_name(
        &mut self,
        now: u64,
        name: &str,
        deadline_ms: u64,
    ) -> Result<(), ErrorCode> {
        let r = self.segs.by_name(name).ok_or(ErrorCode::SegmentNotFound)?;
        if deadline_ms == 0 {
            self.unmount_drained(r);
        } else {
            self.start_drain(now, r, deadline_ms);
        }
        Ok(())
    }

    /// Unmounts segment `r` at the end of its drain (or by the admin call), and tells its
    /// owner at its next ping, so that the owner never re-mounts it (module docs).
    fn unmount_drained(&mut self, r: SegRef) {
        if let Some(seg) = self.segs.get(r) {
            let (id, owner) = (seg.id, seg.client);
            if let Some(c) = self.clients.get_mut(&owner) {
                c.drained.push(id);
            }
        }
        self.unmount_ref(r);
    }

    /// Mounted segments that are draining.
    pub(crate) fn draining_segments(&self) -> usize {
        self.segs
            .iter()
            .filter(|s| s.draining_until.is_some())
            .count()
    }

    /// One step of every drain (module docs), from `tick`.
    pub(crate) fn advance_drains(&mut self, m: &Metrics, now: u64) {
        let draining: Vec<(SegRef, u64)> = self
            .segs
            .iter_indexed()
            .filter_map(|(i, s)| Some((i, s.draining_until?)))
            .map(|(i, d)| (self.segs.at(i), d))
            .collect();
        // A deadline is kept to the tick; the walks of the index are spaced out.
        let deadline_due = draining.iter().any(|&(_, d)| d <= now);
        if draining.is_empty() || (now < self.next_drain_scan_ms && !deadline_due) {
            return;
        }
        self.next_drain_scan_ms = now.saturating_add(DRAIN_SCAN_INTERVAL_MS);
        for (r, deadline) in draining {
            let scan = self.drain_scan(now, r);
            Metrics::add(&m.drain_replicas_detached, scan.detached);
            let readers = self.zombies.iter().any(|z| z.seg == r);
            let name = self.segs.get(r).map(|s| s.name.clone()).unwrap_or_default();
            // No other segment that could ever take its objects (a quarantined one may come
            // back, and so may the owners of a master restarted or newly elected, until they
            // settled): waiting, even for puts in flight or readers, saves nothing.
            let stuck = self.owners_settled(now) && !self.segs.iter().any(|s| self.safe_home(s));
            if scan.holding == 0 && !readers {
                tracing::info!("segment {name} drained: unmounted with nothing left on it");
                Metrics::inc(&m.drains_completed);
                self.unmount_drained(r);
            } else if now >= deadline || stuck {
                let why = if stuck {
                    "cannot finish (no other segment left to take its objects)"
                } else {
                    "did not finish by its deadline"
                };
                tracing::warn!(
                    "drain of segment {name} {why}: unmounted with {} \
                     object(s) whose only copy it held (lost), {} other(s) still on it",
                    scan.only_copies,
                    scan.holding - scan.only_copies
                );
                Metrics::inc(&m.drains_timed_out);
                Metrics::add(&m.drain_objects_lost, scan.only_copies as u64);
                self.unmount_drained(r);
            }
        }
    }

    /// Walks the index for objects on draining segment `r`: drops replicas that have a copy
    /// elsewhere and books moves for only copies.
    fn drain_scan(&mut self, now: u64, r: SegRef) -> Scan {
        let mut scan = Scan::default();
        let mut detach: Vec<String> = Vec::new();
        let mut moves: Vec<(String, u64, Vec<SegRef>)> = Vec::new();
        for (key, obj) in &self.objects {
            if !obj.replicas.iter().any(|x| x.seg == r) {
                continue;
            }
            scan.holding += 1;
            if !obj.is_complete() {
                continue;
            }
            let elsewhere = obj
                .replicas
                .iter()
                .any(|x| x.seg != r && self.segs.get(x.seg).is_some_and(|s| self.safe_home(s)));
            let busy = self.tasks.active(key) || self.tasks.internal_active(key);
            if !elsewhere {
                scan.only_copies += 1;
                if !busy && moves.len() < DRAIN_MOVES_PER_SCAN_MAX {
                    let held = obj.replicas.iter().map(|x| x.seg).collect();
                    moves.push((key.to_string(), obj.size(), held));
                }
            } else if !busy {
                detach.push(key.to_string());
            }
        }
        for key in detach {
            if self.drop_replica_on(now, &key, r) {
                scan.holding -= 1;
                scan.detached += 1;
            }
        }
        let source = self.segs.get(r).map(|s| s.name.clone()).unwrap_or_default();
        for (key, size, held) in moves {
            let Some(target) = self.drain_target(size, &held) else {
                break;
            };
            let Some((name, owner)) = self.segs.get(target).map(|s| (s.name.clone(), s.client))
            else {
                break;
            };
            let source = Some(source.clone());
            self.create_internal(now, &key, Internal::Drain, source, name, owner);
        }
        scan
    }

    /// Drops `key`'s replica on segment `r`, parked while a read window is open.
    fn drop_replica_on(&mut self, now: u64, key: &str, r: SegRef) -> bool {
        let Some(obj) = self.objects.get_mut(key) else {
            return false;
        };
        let Some(at) = obj.replicas.iter().position(|x| x.seg == r) else {
            return false;
        };
        let hold_until = obj.read_hold_until();
        let replica = obj.replicas.swap_remove(at);
        self.objects.settle(key);
        self.release(replica.seg, replica.span, hold_until, now);
        true
    }

    /// Where a drained only copy of `size` bytes goes: the writable memory segment, not
    /// holding one of its replicas (`held`), with the most free bytes, if one has room;
    /// else, the same among disk segments ([`State::safe_home`]).
    fn drain_target(&self, size: u64, held: &[SegRef]) -> Option<SegRef> {
        let roomiest = |disk: bool| {
            self.segs
                .iter_indexed()
                .map(|(i, s)| (self.segs.at(i), s))
                .filter(|(r, s)| s.writable() && s.is_disk() == disk && !held.contains(r))
                .filter(|(_, s)| self.safe_home(s))
                .map(|(r, s)| (r, s.size - s.alloc.used_bytes()))
                .filter(|&(_, free)| free >= size)
                .max_by_key(|&(_, free)| free)
                .map(|(r, _)| r)
        };
        roomiest(false).or_else(|| roomiest(true))
    }

    /// Whether a copy on segment `s` outlives the drains under way: `s` is not draining,
    /// and, on a disk, its owner drains none of its segments (an owner draining may be
    /// leaving, and its disk with it).
    fn safe_home(&self, s: &Seg) -> bool {
        s.draining_until.is_none()
            && (!s.is_disk()
                || !self.clients.get(&s.client).is_some_and(|c| {
                    c.segments
                        .iter()
                        .any(|&r| self.segs.get(r).is_some_and(|o| o.draining_until.is_some()))
                }))
    }
}
