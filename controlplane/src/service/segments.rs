//! Segments and clients: mount, re-mount, unmount, graceful drain, ping and expiry.
//!
//! A segment is a range of some process's memory that the master hands out. Segments live
//! in slots addressed by [`SegRef`] (index + generation), so a reference to an unmounted
//! segment can never reach a later segment that reused its slot.
//!
//! Invariants:
//! - names and ids are unique among mounted segments (`by_name`, `by_id` index the slots);
//! - a mounted segment's owner is a registered client, listed in that client's `segments`;
//! - unmounting a segment drops, in the same call, every replica and parked buffer in it;
//!   objects left without a replica leave the index;
//! - a draining segment (graceful unmount) gets no new allocation and stays readable until
//!   its deadline, when `tick` unmounts it;
//! - a quarantined segment (its owner missed pings for `quarantine_grace_ms`) gets no new
//!   allocation but keeps its replicas, which stay listed; `tick` lifts the quarantine once
//!   the owner pings again, and `client_ttl` expiry still unmounts it. `Seg::quarantined`
//!   always equals its owner's `Client::quarantined`.

use std::collections::HashMap;

use protocol::{
    DiskPolicy, ErrorCode, HeldObject, ReplicaMedium, ReplicaStatus, Segment, Uuid, Version,
};

use super::freed::FreedOutbox;
use super::object::{check_key, Object, Replica, Replicas, SoftPin};
use super::State;
use crate::alloc::{SegmentAllocator, Span};

/// What a ping tells the owner about its segments.
#[derive(Default)]
pub(crate) struct PingNews {
    /// Ranges freed since its last ping.
    pub freed: Vec<(u64, u64)>,
    /// Its draining segments, with the ms left to their deadlines.
    pub draining: Vec<(Uuid, u64)>,
}

/// A segment slot and the generation it had when referenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegRef {
    pub idx: u32,
    pub gen: u32,
}

pub(crate) struct Seg {
    pub id: Uuid,
    pub name: String,
    pub client: Uuid,
    pub base: u64,
    pub size: u64,
    pub te_endpoint: String,
    pub protocol: String,
    pub host_id: String,
    /// Memory, or its owner's disk tier (`docs/tiering.md`): a disk segment takes no put's
    /// replica, only offload copies, and counts in the disk totals, never in memory's.
    pub medium: ReplicaMedium,
    /// A disk segment's watermarks and key limit (`evict.rs`, disk eviction).
    pub disk: DiskPolicy,
    pub alloc: SegmentAllocator,
    /// Set by a graceful unmount or a drain (`drain.rs`): no new allocation; its only
    /// copies are re-replicated elsewhere, and it is unmounted when that is done and its
    /// readers are gone, at this time at the latest.
    pub draining_until: Option<u64>,
    /// A fresh mount's admission ramp (`placement.rs`), until it ends.
    pub ramp: Option<Ramp>,
    /// The owner stopped pinging: no new allocation until it pings again.
    pub quarantined: bool,
    /// Ranges freed since the owner's last ping (see `freed.rs`).
    pub freed: FreedOutbox,
}

impl Seg {
    /// Whether placement may allocate here.
    pub fn writable(&self) -> bool {
        self.draining_until.is_none() && !self.quarantined
    }

    /// Whether this is a disk segment (its addresses name files of its owner's disk tier).
    pub fn is_disk(&self) -> bool {
        self.medium == ReplicaMedium::LocalDisk
    }

    /// Allocates `size` bytes, claiming the span from the freed-range outbox.
    pub fn allocate(&mut self, size: u64) -> Option<Span> {
        let span = self.alloc.allocate(size)?;
        self.freed.claim(span);
        Some(span)
    }
}

/// The admission ramp of a freshly mounted segment: since `from_ms` it has taken `taken` of
/// the `placed - placed_at_start` replicas placed in the cluster (`State::placed_replicas`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ramp {
    pub from_ms: u64,
    pub placed_at_start: u64,
    pub taken: u64,
}

struct Slot {
    gen: u32,
    seg: Option<Seg>,
}

#[derive(Default)]
pub(crate) struct Segments {
    slots: Vec<Slot>,
    spare: Vec<u32>,
    by_name: HashMap<String, u32>,
    by_id: HashMap<Uuid, u32>,
    /// Mounted slot indices, for placement walks.
    pub live: Vec<u32>,
    /// How many of `live` are disk segments.
    disks: usize,
}

impl Segments {
    pub fn get(&self, r: SegRef) -> Option<&Seg> {
        let slot = self.slots.get(r.idx as usize)?;
        (slot.gen == r.gen).then_some(slot.seg.as_ref()).flatten()
    }

    pub fn get_mut(&mut self, r: SegRef) -> Option<&mut Seg> {
        let slot = self.slots.get_mut(r.idx as usize)?;
        if slot.gen != r.gen {
            return None;
        }
        slot.seg.as_mut()
    }

    /// The reference of a mounted slot index.
    pub fn at(&self, idx: u32) -> SegRef {
        SegRef {
            idx,
            gen: self.slots[idx as usize].gen,
        }
    }

    pub fn by_name(&self, name: &str) -> Option<SegRef> {
        self.by_name.get(name).map(|&i| self.at(i))
    }

    pub fn by_id(&self, id: &Uuid) -> Option<SegRef> {
        self.by_id.get(id).map(|&i| self.at(i))
    }

    /// Frees a span of a segment and queues it for the owner's catalog; a span of an
    /// unmounted segment is simply forgotten.
    pub fn free_span(&mut self, r: SegRef, span: Span) {
        if let Some(seg) = self.get_mut(r) {
            let ok = seg.alloc.free(span);
            debug_assert!(ok, "freeing a span not allocated: {span:?}");
            if ok {
                seg.freed.push(span);
            }
        }
    }

    fn insert(&mut self, seg: Seg) -> SegRef {
        let idx = match self.spare.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { gen: 0, seg: None });
                (self.slots.len() - 1) as u32
            }
        };
        self.by_name.insert(seg.name.clone(), idx);
        self.by_id.insert(seg.id, idx);
        self.disks += usize::from(seg.is_disk());
        self.slots[idx as usize].seg = Some(seg);
        self.live.push(idx);
        self.at(idx)
    }

    fn remove(&mut self, r: SegRef) -> Option<Seg> {
        let slot = self.slots.get_mut(r.idx as usize)?;
        if slot.gen != r.gen {
            return None;
        }
        let seg = slot.seg.take()?;
        slot.gen = slot.gen.wrapping_add(1);
        self.spare.push(r.idx);
        self.by_name.remove(&seg.name);
        self.by_id.remove(&seg.id);
        self.disks -= usize::from(seg.is_disk());
        self.live.retain(|&i| i != r.idx);
        Some(seg)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Seg> {
        self.live
            .iter()
            .filter_map(|&i| self.slots[i as usize].seg.as_ref())
    }

    /// Mounted segments with their slot index.
    pub fn iter_indexed(&self) -> impl Iterator<Item = (u32, &Seg)> {
        self.live
            .iter()
            .filter_map(|&i| Some((i, self.slots[i as usize].seg.as_ref()?)))
    }

    /// Mounted memory segments (writable or not), counted as they mount and unmount.
    pub fn memory_len(&self) -> usize {
        self.live.len() - self.disks
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }
}

pub(crate) struct Client {
    pub last_seen_ms: u64,
    pub segments: Vec<SegRef>,
    /// Silent for more than `quarantine_grace_ms`: its segments take no new allocation.
    pub quarantined: bool,
    /// Its segments the master unmounted at the end of a drain or by the admin call, not yet
    /// told to it (its next ping lists them as draining with 0 ms left, `drain.rs`).
    pub drained: Vec<Uuid>,
}

impl State {
    fn touch_client(&mut self, now: u64, client: Uuid) -> &mut Client {
        let c = self.clients.entry(client).or_insert(Client {
            last_seen_ms: now,
            segments: Vec::new(),
            quarantined: false,
            drained: Vec::new(),
        });
        c.last_seen_ms = now;
        c
    }

    /// Known client: refresh, move up to `PING_FREED_RANGES_MAX` ranges freed in its
    /// segments into `freed`, and answer `true`; unknown: `false` (it must re-mount).
    pub(crate) fn ping(&mut self, now: u64, client: Uuid, out: &mut PingNews) -> bool {
        let Some(c) = self.clients.get_mut(&client) else {
            return false;
        };
        c.last_seen_ms = now;
        for &r in &c.segments {
            if let Some(seg) = self.segs.get_mut(r) {
                seg.freed
                    .drain(protocol::limits::PING_FREED_RANGES_MAX, &mut out.freed);
                if let Some(until) = seg.draining_until {
                    out.draining.push((seg.id, until.saturating_sub(now)));
                }
            }
        }
        out.draining.extend(c.drained.drain(..).map(|id| (id, 0)));
        true
    }

    /// `MountSegment`: a fresh segment, which ramps up its share of new replicas (see
    /// `placement.rs`) unless `--admission_ramp_sec` is 0.
    pub(crate) fn mount(
        &mut self,
        now: u64,
        client: Uuid,
        s: Segment,
    ) -> Result<SegRef, ErrorCode> {
        self.mount_as(now, client, s, true)
    }

    /// Mounts `s`; `fresh` says whether it ramps. A re-mount (`ReMountSegment`: a master
    /// restart, an HA election or an expiry the owner survived) never ramps: the segment was
    /// in the pool before and holds what it re-reports.
    fn mount_as(
        &mut self,
        now: u64,
        client: Uuid,
        s: Segment,
        fresh: bool,
    ) -> Result<SegRef, ErrorCode> {
        if s.size == 0 || s.name.is_empty() {
            return Err(ErrorCode::InvalidParams);
        }
        if let Some(r) = self.segs.by_id(&s.id) {
            let seg = self.segs.get(r).ok_or(ErrorCode::InternalError)?;
            if seg.name != s.name || seg.client != client {
                return Err(ErrorCode::SegmentAlreadyExists);
            }
            self.touch_client(now, client);
            self.owner_mounted(client);
            return Ok(r);
        }
        if self.segs.by_name(&s.name).is_some() {
            return Err(ErrorCode::SegmentAlreadyExists);
        }
        let alloc = SegmentAllocator::new(s.base, s.size).ok_or(ErrorCode::InvalidParams)?;
        let ramps = fresh && self.cfg.admission_ramp_ms > 0 && s.medium != ReplicaMedium::LocalDisk;
        if ramps {
            self.ramps_until_ms = self
                .ramps_until_ms
                .max(now.saturating_add(self.cfg.admission_ramp_ms));
        }
        let r = self.segs.insert(Seg {
            id: s.id,
            name: s.name,
            client,
            base: s.base,
            size: s.size,
            te_endpoint: s.te_endpoint,
            protocol: s.protocol,
            host_id: s.host_id,
            medium: s.medium,
            disk: s.disk,
            alloc,
            draining_until: None,
            ramp: ramps.then_some(Ramp {
                from_ms: now,
                placed_at_start: self.placed_replicas,
                taken: 0,
            }),
            quarantined: false,
            freed: FreedOutbox::default(),
        });
        let c = self.touch_client(now, client);
        c.segments.push(r);
        if c.quarantined {
            // Keep the invariant; the next tick lifts the quarantine of the whole client.
            if let Some(seg) = self.segs.get_mut(r) {
                seg.quarantined = true;
            }
        }
        self.owner_mounted(client);
        Ok(r)
    }

    /// Registers the client, mounts its segments and re-inserts the objects it holds, so an
    /// index lost with a master restart is rebuilt. Held objects that clash with the index
    /// (another size, an in-flight put, a range already in use) are skipped. Returns the
    /// first mount error after trying everything.
    pub(crate) fn remount(
        &mut self,
        now: u64,
        client: Uuid,
        segments: Vec<Segment>,
        held: Vec<HeldObject>,
    ) -> Result<(), ErrorCode> {
        self.touch_client(now, client);
        // A sign of a restart is something from before it: a memory segment (its owner was
        // serving), or objects. A disk tier mounts this way on every start, and an empty one
        // brings nothing back, so it alone does not make every drain wait a client TTL.
        self.remounted |= !held.is_empty()
            || segments
                .iter()
                .any(|s| s.medium != ReplicaMedium::LocalDisk);
        let mut first_err = None;
        for s in segments {
            if let Err(e) = self.mount_as(now, client, s, false) {
                first_err.get_or_insert(e);
            }
        }
        for h in held {
            self.reinsert(now, client, h);
        }
        self.evict_epoch += 1;
        first_err.map_or(Ok(()), Err)
    }

    /// Re-inserts one held object (or learns one tombstone, `size == 0`). The newest version
    /// of a key wins (`docs/ha.md`, "versions and tombstones"): a held object older than the
    /// key's object or tombstone is refused and its range told to the owner as freed, so its
    /// catalog entry goes; a newer one replaces the key's object, whose buffers are parked
    /// until its read lease ends (a late re-report can come after reads resumed).
    fn reinsert(&mut self, now: u64, client: Uuid, mut h: HeldObject) -> bool {
        h.key = super::tenant::held_key(self.cfg.multi_tenants, h.key);
        if check_key(&h.key).is_err() || h.size > crate::limits::OBJECT_SIZE_MAX_BYTES {
            return false;
        }
        let Some(r) = self.held_segment(client, &h) else {
            return false;
        };
        if h.size == 0 {
            self.learn_tombstone(now, &h.key, h.version);
            return true;
        }
        if !self.held_is_newest(now, r, &h) {
            return false;
        }
        // Conservative restart: a reader may hold a lease granted by the previous master (or
        // leader); the re-reported object keeps the longest such lease could have run.
        let lease_until = now.saturating_add(self.cfg.default_kv_lease_ttl_ms);
        let soft_pin = self.restored_soft_pin(now, h.soft_pin_ttl_ms);
        let State { objects, segs, .. } = self;
        let Some(seg) = segs.get_mut(r) else {
            return false;
        };
        if let Some(obj) = objects.get(&h.key) {
            let fits = obj.size() == h.size
                && obj.is_complete()
                && obj.replicas.iter().all(|x| x.seg != r);
            if !fits {
                return false;
            }
        }
        let Some(span) = seg.alloc.reserve(h.buffer_address, h.size) else {
            return false;
        };
        seg.freed.claim(span);
        let replica = Replica {
            seg: r,
            span,
            status: ReplicaStatus::Complete,
            on_disk: seg.is_disk(),
        };
        match objects.get_mut(&h.key) {
            Some(obj) => {
                obj.set_hard_pin(obj.hard_pin() | h.with_hard_pin);
                obj.set_soft_pin(later_soft_pin(obj.soft_pin(), soft_pin));
                obj.replicas.push(replica);
                objects.settle(&h.key);
            }
            None => {
                let writer = objects.writer_id(client);
                let obj = held_object(&h, writer, now, replica, lease_until, soft_pin);
                objects.insert(&h.key, obj);
            }
        }
        true
    }

    /// The segment a held object names, if mounted and owned by `client`.
    fn held_segment(&self, client: Uuid, h: &HeldObject) -> Option<SegRef> {
        let r = self.segs.by_name(&h.segment_name)?;
        if self.segs.get(r).is_none_or(|seg| seg.client != client) {
            return None;
        }
        Some(r)
    }

    /// Whether held object `h` (in segment `r`) may be re-inserted as its key's newest
    /// version. One older than the key's tombstone or object has its range released; one
    /// newer than the key's settled object retires that object.
    fn held_is_newest(&mut self, now: u64, r: SegRef, h: &HeldObject) -> bool {
        if self.tombstones.get(&h.key).is_some_and(|v| v >= h.version)
            || self.removals.covers(&h.key, h.version)
        {
            self.release_stale(r, h.buffer_address, h.size);
            return false;
        }
        if let Some(obj) = self.objects.get(&h.key) {
            if obj.version > h.version {
                self.release_stale(r, h.buffer_address, h.size);
                return false;
            }
            if obj.version < h.version {
                if obj.all_processing() {
                    // A put of this term is in flight; it will settle the key.
                    return false;
                }
                self.retire(now, &h.key);
            }
        }
        true
    }

    /// The soft pin of a re-reported object whose put asked for `ttl_ms` (`Some(0)`: the
    /// default ttl). Conservative restart, as for read leases: the previous leader's deadline
    /// is unknown, so the pin runs a full ttl from the re-report, which is never earlier than
    /// the original deadline (the put completed before the re-report); a pin that had lapsed
    /// holds once more. The ttl is capped at `max_kv_soft_pin_ttl` like a put's (a re-report
    /// is input). `docs/ha.md`, "Soft pins after a failover".
    fn restored_soft_pin(&self, now: u64, ttl_ms: Option<u64>) -> SoftPin {
        let Some(ttl_ms) = ttl_ms else {
            return SoftPin::None;
        };
        let ttl_ms = match ttl_ms {
            0 => self.cfg.default_kv_soft_pin_ttl_ms,
            t => t,
        }
        .min(self.cfg.max_kv_soft_pin_ttl_ms);
        if ttl_ms == 0 {
            return SoftPin::None;
        }
        SoftPin::Until(now.saturating_add(ttl_ms))
    }

    /// A re-reported tombstone: the key was removed at `version`. An object of that version
    /// or older leaves the index (its spans are freed, or parked while a reader's lease
    /// lasts, and told to their owners).
    fn learn_tombstone(&mut self, now: u64, key: &str, version: Version) {
        if let Some(obj) = self.objects.get(key) {
            if obj.version <= version && !obj.all_processing() {
                self.retire(now, key);
            }
        }
        self.tombstones.add(key, version);
    }

    /// Tells the owner of segment `r` that `[addr, addr + len)` holds nothing live (a stale
    /// version it re-reported), through the freed outbox, when no live allocation overlaps
    /// the range; otherwise its entry lingers until the range is reused.
    fn release_stale(&mut self, r: SegRef, addr: u64, len: u64) {
        let Some(seg) = self.segs.get_mut(r) else {
            return;
        };
        if let Some(span) = seg.alloc.reserve(addr, len) {
            seg.freed.claim(span);
            if seg.alloc.free(span) {
                seg.freed.push(span);
            }
        }
    }

    /// Unmount requested by the segment's owner.
    pub(crate) fn unmount(&mut self, client: Uuid, segment_id: Uuid) -> Result<(), ErrorCode> {
        let r = self
            .segs
            .by_id(&segment_id)
            .ok_or(ErrorCode::SegmentNotFound)?;
        let seg = self.segs.get(r).ok_or(ErrorCode::InternalError)?;
        if seg.client != client {
            return Err(ErrorCode::InvalidParams);
        }
        self.unmount_ref(r);
        Ok(())
    }

    /// `GracefulUnmountSegment` from the segment's owner: a drain (`drain.rs`) with a
    /// deadline `grace_ms` from now; at once when `grace_ms` is 0. A drain already running
    /// keeps the earlier deadline.
    pub(crate) fn graceful_unmount(
        &mut self,
        now: u64,
        client: Uuid,
        segment_id: Uuid,
        grace_ms: u64,
    ) -> Result<(), ErrorCode> {
        let r = self
            .segs
            .by_id(&segment_id)
            .ok_or(ErrorCode::SegmentNotFound)?;
        let seg = self.segs.get(r).ok_or(ErrorCode::InternalError)?;
        if seg.client != client {
            return Err(ErrorCode::InvalidParams);
        }
        if grace_ms == 0 {
            self.unmount_ref(r);
            return Ok(());
        }
        self.start_drain(now, r, grace_ms);
        Ok(())
    }

    /// Drops a segment with every replica and parked buffer in it.
    pub(crate) fn unmount_ref(&mut self, r: SegRef) {
        let Some(seg) = self.segs.remove(r) else {
            return;
        };
        if let Some(c) = self.clients.get_mut(&seg.client) {
            c.segments.retain(|&x| x != r);
            if c.segments.is_empty() {
                self.owner_gone(seg.client);
            }
        }
        self.zombies.retain(|z| z.seg != r);
        self.drop_reservations_in(r);
        if seg.alloc.used_bytes() == 0 {
            return;
        }
        self.objects.retain(|_, obj| {
            obj.replicas.retain(|x| x.seg != r);
            !obj.replicas.is_empty()
        });
    }

    /// Expires clients silent for `client_ttl`, unmounting their segments.
    pub(crate) fn expire_clients(&mut self, now: u64) -> usize {
        let ttl_ms = self.cfg.client_ttl_s.saturating_mul(1000);
        let dead: Vec<Uuid> = self
            .clients
            .iter()
            .filter(|(_, c)| c.last_seen_ms.saturating_add(ttl_ms) <= now)
            .map(|(&id, _)| id)
            .collect();
        for id in &dead {
            if let Some(c) = self.clients.remove(id) {
                for r in c.segments {
                    self.unmount_ref(r);
                }
            }
            self.owner_gone(*id);
        }
        dead.len()
    }

    /// Quarantines the segments of clients silent for more than `quarantine_grace_ms` and
    /// lifts the quarantine of those heard from since. Before a quarantine, silence is counted
    /// from the later of the last ping and `liveness_from_ms` (the end of a stall of the master
    /// itself, so that a master that was not running does not blame every client). A
    /// quarantine is lifted only by a ping: a stall of the master says nothing about a client
    /// already found silent, and lifting it would send new replicas to a node that is still
    /// unreachable. Returns (clients quarantined, clients lifted) by this call.
    pub(crate) fn update_quarantine(&mut self, now: u64) -> (usize, usize) {
        let grace = self.cfg.quarantine_grace_ms;
        let from = self.liveness_from_ms;
        let (mut entered, mut lifted) = (0, 0);
        let State { clients, segs, .. } = self;
        for c in clients.values_mut() {
            let heard_from = if c.quarantined {
                c.last_seen_ms
            } else {
                c.last_seen_ms.max(from)
            };
            let silent = now.saturating_sub(heard_from) > grace;
            if silent == c.quarantined || (c.segments.is_empty() && !c.quarantined) {
                continue;
            }
            c.quarantined = silent;
            if silent {
                entered += 1;
            } else {
                lifted += 1;
            }
            for &r in &c.segments {
                if let Some(seg) = segs.get_mut(r) {
                    seg.quarantined = silent;
                }
            }
        }
        (entered, lifted)
    }

    /// Mounted segments in quarantine.
    pub(crate) fn quarantined_segments(&self) -> usize {
        self.segs.iter().filter(|s| s.quarantined).count()
    }
}

/// The longer of two soft pins of one object (replicas re-reported by several owners).
fn later_soft_pin(a: SoftPin, b: SoftPin) -> SoftPin {
    match (a, b) {
        (SoftPin::Pending { .. }, _) | (_, SoftPin::None) => a,
        (_, SoftPin::Pending { .. }) | (SoftPin::None, _) => b,
        (SoftPin::Until(x), SoftPin::Until(y)) => SoftPin::Until(x.max(y)),
    }
}

/// The object a re-reported `h` becomes when the master has none for its key: one COMPLETE
/// `replica`, read-leased until `lease_until`.
fn held_object(
    h: &HeldObject,
    writer: u32,
    now: u64,
    replica: Replica,
    lease_until: u64,
    soft_pin: SoftPin,
) -> Object {
    let mut obj = Object::new(h.size, h.version, writer, now, Replicas::One(replica));
    obj.set_read_lease_until(lease_until);
    obj.set_read_window_until(lease_until);
    obj.set_soft_pin(soft_pin);
    obj.set_hard_pin(h.with_hard_pin);
    obj
}
