//! Object metadata and the object operations: put, upsert, read, probe, remove.
//!
//! An object is a key with one or more replicas, each a [`Span`] of one segment holding the
//! whole value. Lifecycle of the replicas (all replicas of an object share one state):
//!
//! ```text
//!   PutStart/UpsertStart ──▶ PROCESSING ──PutEnd──▶ COMPLETE ──Remove/evict/unmount──▶ gone
//!                              │    ▲                   │
//!                   PutRevoke, │    └──UpsertStart──────┘ (same size, no lease: in place)
//!          discard (stale) ──▶ gone (buffers freed, or parked until nobody can write them)
//! ```
//!
//! Invariants:
//! - an object in the index has at least one replica, and at most one per segment;
//! - every replica's span is allocated in its segment's allocator, or the segment is gone
//!   and the replica is being dropped with it (see `segments.rs`);
//! - buffers a writer or reader may still touch are never handed out again before their
//!   deadline: they are parked in `State::zombies` instead of freed.
//!
//! Leases. `read_lease_until` is granted by `GetReplicaList`: it blocks a non-forced remove
//! *and* eviction. `probe_lease_until` is granted by `ExistKey`: it blocks a non-forced
//! remove only (see `evict.rs` for why).
//!
//! Lease groups (upstream's `group_ids`). A key may belong to one group of its tenant, set
//! by its put (or an upsert that creates it). A lease granted on a grouped key is granted to
//! the group's members at that moment ([`GroupLease`], shared by them: it counts its grants,
//! and a member is covered by the grants after it joined), so it blocks a non-forced remove
//! (and, for a read lease, eviction) of each: a key that joins later is not covered by it,
//! as upstream refreshes the members it has when it grants. An upsert may not move a key to
//! another group, nor into one (`INVALID_PARAMS`, as upstream); an upsert without groups
//! keeps the key's. Groups are soft state: a master rebuilt from the owners' catalogs (HA)
//! forgets them, as it forgets leases.
//!
//! Read windows. A reader may use a replica list for the window the list carries in
//! `lease_ttl_ms`, counted by the client from before it asked; a read that ends later fails
//! with `LEASE_EXPIRED` (the client looks up again). Buffers a forced remove, an upsert or a
//! re-report takes from a leased object are parked until the last window handed out for it
//! ends (`read_window_until`), then reused. The window is the whole lease, as upstream's,
//! until parked buffers fill a sixteenth of the pool ([`State::read_window_ms`]): then lists
//! get a short window (half a second plus a millisecond per 64 KiB), so that a workload that
//! reads keys and force-removes them soon after does not park ten seconds of writes and run
//! out of space (`docs/eviction.md`, "Read windows").
//!
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use protocol::limits::KEY_MAX_BYTES;
use protocol::{ErrorCode, ReplicaStatus, ReplicateConfig, SoftPinAction, Uuid, Version};

use super::metrics::Metrics;
use super::removals::{Pick, Removal};
use super::segments::{SegRef, Segments};
use super::State;
use crate::alloc::Span;

pub(crate) struct Replica {
    pub seg: SegRef,
    pub span: Span,
    pub status: ReplicaStatus,
    /// On a disk segment (`docs/tiering.md`): not charged to its tenant's quota, which
    /// weighs memory.
    pub on_disk: bool,
}

/// Soft-pin state of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SoftPin {
    None,
    /// Requested; the clock starts when the object becomes readable.
    Pending {
        ttl_ms: u64,
    },
    /// Pinned until this time.
    Until(u64),
}

/// A short read window for an object of any size, milliseconds.
pub(crate) const SHORT_READ_WINDOW_BASE_MS: u64 = 500;
/// The slowest transfer a short read window allows for: 64 KiB per millisecond (about 67 MB/s).
pub(crate) const SHORT_READ_WINDOW_BYTES_PER_MS: u64 = 64 * 1024;
/// Cut from the window a list tells its reader, so that the reader's window ends before the
/// master's: the master dates the window by a clock read once per batch, in whole
/// milliseconds, and frees parked buffers on its next tick after `read_window_until`.
pub(crate) const READ_WINDOW_SLACK_MS: u64 = 5;

/// The window a list tells its reader, `left` milliseconds before the master's ends: `0` (no
/// lease, nothing to check) only when the master's has already ended.
pub(crate) fn told_window_ms(left: u64) -> u64 {
    match left {
        0 => 0,
        l => l.saturating_sub(READ_WINDOW_SLACK_MS).max(1),
    }
}

/// The read window of a list of an object of `size` bytes: the lease `ttl_ms`, or when
/// `short`, half a second plus time for the bytes at a slow rate (never more than the lease).
pub(crate) fn read_window_ms(ttl_ms: u64, short: bool, size: u64) -> u64 {
    if !short {
        return ttl_ms;
    }
    ttl_ms.min(SHORT_READ_WINDOW_BASE_MS.saturating_add(size / SHORT_READ_WINDOW_BYTES_PER_MS))
}

/// The leases of one lease group, shared by its members (module docs). Leases all have the
/// same ttl, so the newest grant of a kind always ends last: a member that joined before it
/// is leased until `*_until`.
#[derive(Debug, Default)]
pub(crate) struct GroupLease {
    /// The group's scoped name (tenant and group, `protocol::tenant::scoped_key`).
    pub name: String,
    read_until: AtomicU64,
    /// Read leases granted so far.
    read_grants: AtomicU64,
    probe_until: AtomicU64,
    probe_grants: AtomicU64,
}

impl GroupLease {
    fn grant(until: &AtomicU64, grants: &AtomicU64, to: u64) {
        until.fetch_max(to, Ordering::Relaxed);
        grants.fetch_add(1, Ordering::Relaxed);
    }
}

/// An object's place in its lease group: the group, and how many grants of each kind it had
/// seen when the object joined (those do not cover it).
#[derive(Clone, Debug)]
pub(crate) struct GroupMember {
    pub lease: Arc<GroupLease>,
    read_seen: u64,
    probe_seen: u64,
}

impl GroupMember {
    fn join(lease: Arc<GroupLease>) -> GroupMember {
        let read_seen = lease.read_grants.load(Ordering::Relaxed);
        let probe_seen = lease.probe_grants.load(Ordering::Relaxed);
        GroupMember {
            lease,
            read_seen,
            probe_seen,
        }
    }

    /// Until when a read lease granted to the group since this member joined runs (0: none).
    fn read_until(&self) -> u64 {
        let l = &self.lease;
        if l.read_grants.load(Ordering::Relaxed) > self.read_seen {
            l.read_until.load(Ordering::Relaxed)
        } else {
            0
        }
    }

    /// As [`GroupMember::read_until`], for probe leases.
    fn probe_until(&self) -> u64 {
        let l = &self.lease;
        if l.probe_grants.load(Ordering::Relaxed) > self.probe_seen {
            l.probe_until.load(Ordering::Relaxed)
        } else {
            0
        }
    }
}

/// The group of `key`'s tenant named `group`, as kept in [`Object::group`].
pub(crate) fn group_name(key: &str, group: &str) -> String {
    protocol::tenant::scoped_key(protocol::tenant::split_scoped(key).0, group)
}

pub(crate) struct Object {
    pub size: u64,
    /// The version of the write these replicas hold (`tombstones.rs`).
    pub version: Version,
    /// The client whose put is in flight or completed last.
    pub writer: Uuid,
    pub put_start_ms: u64,
    pub replicas: Vec<Replica>,
    pub read_lease_until: u64,
    /// The end of the last read window handed out (see the module's "Read windows").
    pub read_window_until: u64,
    pub probe_lease_until: u64,
    /// Reads answered while its only COMPLETE replicas were on disk, since its last
    /// promotion (`offload.rs`, promotion on hit). Saturates; reset when promoted.
    pub disk_hits: u32,
    /// Last `GetReplicaList` (or completion): the recency eviction orders by.
    pub last_read_ms: u64,
    pub soft_pin: SoftPin,
    pub hard_pin: bool,
    /// Its lease group, if any (module docs).
    pub group: Option<GroupMember>,
    /// Bytes charged to its tenant (`objects.rs`; 0 without tenant quotas).
    pub charge: u64,
    /// The medium last announced in a KV-cache event (`objects.rs`; `None`: not announced).
    pub announced: crate::events::Medium,
}

impl Object {
    pub fn is_complete(&self) -> bool {
        self.replicas
            .iter()
            .all(|r| r.status == ReplicaStatus::Complete)
    }

    pub fn has_complete(&self) -> bool {
        self.replicas
            .iter()
            .any(|r| r.status == ReplicaStatus::Complete)
    }

    pub fn all_processing(&self) -> bool {
        self.replicas
            .iter()
            .all(|r| r.status == ReplicaStatus::Processing)
    }

    /// Any lease that blocks a non-forced remove (its own or its group's).
    pub fn remove_blocked(&self, now: u64) -> bool {
        self.read_leased_until() > now
            || self.probe_lease_until > now
            || self.group.as_ref().is_some_and(|g| g.probe_until() > now)
    }

    /// Until when a read lease (its own or its group's) blocks eviction and remove.
    pub fn read_leased_until(&self) -> u64 {
        let g = self.group.as_ref().map_or(0, GroupMember::read_until);
        self.read_lease_until.max(g)
    }

    fn group_is(&self, name: Option<&str>) -> bool {
        self.group.as_ref().map(|g| g.lease.name.as_str()) == name
    }

    /// Until when a reader may still be reading the replicas.
    pub fn read_hold_until(&self) -> u64 {
        self.read_window_until
    }

    /// The soft pin as the writer of the current put or upsert records it in the owners'
    /// catalogs (`protocol::UpsertStarted`): the full ttl of a pin that starts when the object
    /// becomes readable, what is left of a running one, `None` for none or a lapsed one.
    /// Never `Some(0)`, which a catalog reads as "the master's default ttl".
    pub fn soft_pin_left_ms(&self, now: u64) -> Option<u64> {
        match self.soft_pin {
            SoftPin::None => None,
            SoftPin::Pending { ttl_ms } => (ttl_ms > 0).then_some(ttl_ms),
            SoftPin::Until(t) => (t > now).then(|| t - now),
        }
    }

    pub fn soft_pinned(&self, now: u64) -> bool {
        match self.soft_pin {
            SoftPin::None => false,
            SoftPin::Pending { .. } => true,
            SoftPin::Until(t) => t > now,
        }
    }
}

/// An object with the segment table, to encode its replicas.
pub(crate) type Found<'a> = (&'a Object, &'a Segments);

/// Why a key is refused before anything is looked up.
pub(crate) fn check_key(key: &str) -> Result<(), ErrorCode> {
    if key.is_empty() || key.len() > KEY_MAX_BYTES {
        return Err(ErrorCode::InvalidParams);
    }
    Ok(())
}

/// The soft-pin a put asks for, given the object's current one (`ResolveSoftPinRequest`).
pub(crate) fn resolve_soft_pin(
    cfg: &ReplicateConfig,
    current: SoftPin,
    default_ttl_ms: u64,
    max_ttl_ms: u64,
) -> Result<SoftPin, ErrorCode> {
    match (cfg.soft_pin_action, cfg.soft_pin_ttl_ms) {
        (SoftPinAction::Preserve, None) => Ok(current),
        (SoftPinAction::Disable, None) => Ok(SoftPin::None),
        (SoftPinAction::Preserve | SoftPinAction::Disable, Some(_)) => {
            Err(ErrorCode::InvalidParams)
        }
        (SoftPinAction::Enable, ttl) => {
            let ttl_ms = ttl.unwrap_or(default_ttl_ms);
            if ttl_ms > max_ttl_ms {
                Err(ErrorCode::InvalidParams)
            } else if ttl_ms == 0 {
                Ok(SoftPin::None)
            } else {
                Ok(SoftPin::Pending { ttl_ms })
            }
        }
    }
}

/// Whether an upsert may reuse `obj`'s buffers in place: only when nobody may touch them.
/// Not while a put is in flight (its writer may still be writing when this upsert has
/// completed, and then a remove or eviction could hand the buffers to another key under that
/// late write), nor while a reader holds a lease (it would read a mix of both values), nor in
/// a segment closed to new allocations (draining, or quarantined: the write would most likely
/// fail), nor on a disk segment (a writer cannot write another process's files).
fn reusable_in_place(
    obj: &Object,
    key: &str,
    now: u64,
    segs: &Segments,
    tasks: &super::tasks::Tasks,
) -> bool {
    // Nor while the disk tier copies it (`tasks.rs`, "Internal tasks"): the executor
    // records its copy under the old version, so the bytes it reads must stay that
    // version's; `drop_object` fails the task and parks them.
    !tasks.internal_active(key)
        && obj.is_complete()
        && obj.read_hold_until() <= now
        && obj.replicas.iter().all(|r| {
            segs.get(r.seg)
                .is_some_and(|s| s.writable() && !s.is_disk())
        })
}

/// Checks of a put's parameters that do not depend on the index.
pub(crate) fn check_put(cfg: &ReplicateConfig, size: u64) -> Result<(), ErrorCode> {
    if size == 0 || cfg.replica_num == 0 {
        return Err(ErrorCode::InvalidParams);
    }
    Ok(())
}

impl State {
    /// PutStart (or UpsertStart when `upsert`). On success the object holds PROCESSING
    /// replicas the caller encodes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn put_start(
        &mut self,
        m: &Metrics,
        now: u64,
        client: Uuid,
        key: String,
        size: u64,
        cfg: &ReplicateConfig,
        group: Option<&str>,
        upsert: bool,
        start: Start,
    ) -> Result<Found<'_>, ErrorCode> {
        check_key(&key)?;
        check_put(cfg, size)?;
        let group = group.filter(|g| !g.is_empty()).map(|g| group_name(&key, g));
        // Taken first (a refused put leaves a gap, which is harmless: versions only need to
        // grow), so that both the in-place and the new-buffer path use it.
        if upsert && self.tasks.active(&key) {
            return Err(ErrorCode::ObjectHasReplicationTask);
        }
        if self.is_retried_start(start, &key, client, size) {
            Metrics::inc(&m.put_start_retries);
            let obj = self.objects.get(&key).ok_or(ErrorCode::InternalError)?;
            return Ok((obj, &self.segs));
        }
        let version = self.next_version();
        let mut pin_now = SoftPin::None;
        let mut group_now = None;
        // What the new value is charged to its tenant (`quota.rs`).
        let need = size.saturating_mul(u64::from(cfg.replica_num));
        let mut admitted = false;
        if let Some(obj) = self.objects.get_mut(&key) {
            pin_now = obj.soft_pin;
            if upsert {
                // A key stays in its group (or out of any): an upsert naming another is
                // refused; one naming none keeps the key's.
                if group.is_some() && !obj.group_is(group.as_deref()) {
                    return Err(ErrorCode::InvalidParams);
                }
                group_now = obj.group.clone();
                // Otherwise the old buffers are parked (`drop_object`) and new ones
                // allocated, as for a new size.
                let idle = reusable_in_place(obj, &key, now, &self.segs, &self.tasks);
                if obj.size == size && idle {
                    obj.soft_pin = resolve_soft_pin(
                        cfg,
                        obj.soft_pin,
                        self.cfg.default_kv_soft_pin_ttl_ms,
                        self.cfg.max_kv_soft_pin_ttl_ms,
                    )?;
                    obj.writer = client;
                    obj.put_start_ms = now;
                    obj.hard_pin = cfg.with_hard_pin;
                    obj.version = version;
                    for r in &mut obj.replicas {
                        r.status = ReplicaStatus::Processing;
                    }
                    self.note_inflight(now);
                    let obj = self.objects.get(&key).ok_or(ErrorCode::InternalError)?;
                    return Ok((obj, &self.segs));
                }
                // Validate before dropping anything.
                resolve_soft_pin(cfg, pin_now, 0, self.cfg.max_kv_soft_pin_ttl_ms)?;
                let replacing = obj.charge;
                self.admit(m, now, &key, need, replacing)?;
                admitted = true;
                // Different size, or busy buffers: the old buffers go, new ones come.
                self.drop_object(m, now, &key);
            } else if obj.has_complete()
                || now
                    < obj
                        .put_start_ms
                        .saturating_add(self.cfg.discard_timeout_ms())
            {
                return Err(ErrorCode::ObjectAlreadyExists);
            } else {
                // A put makes a new object: the stale put it replaces was never readable, so
                // `PRESERVE` has no pin to keep, as its writer assumes when it records the
                // pin in the owners' catalogs (`client::store::catalog`, `docs/ha.md`).
                pin_now = SoftPin::None;
                self.discard_put(m, &key);
            }
        }
        let soft_pin = resolve_soft_pin(
            cfg,
            pin_now,
            self.cfg.default_kv_soft_pin_ttl_ms,
            self.cfg.max_kv_soft_pin_ttl_ms,
        )?;
        if !admitted {
            self.admit(m, now, &key, need, 0)?;
        }
        let replicas = self.place(m, now, size, cfg)?;
        self.note_inflight(now);
        let group =
            group_now.or_else(|| group.map(|name| GroupMember::join(self.groups.join(name))));
        let obj = Object {
            size,
            version,
            writer: client,
            put_start_ms: now,
            replicas,
            read_lease_until: 0,
            read_window_until: 0,
            probe_lease_until: 0,
            disk_hits: 0,
            last_read_ms: now,
            soft_pin,
            hard_pin: cfg.with_hard_pin,
            group,
            charge: 0,
            announced: Default::default(),
        };
        let obj = self.objects.insert_get(key, obj);
        Ok((obj, &self.segs))
    }

    /// Whether this start is the same start again, from the client still writing this key:
    /// its answer was lost, or the client sent the call again after giving up its connection
    /// with the request still in it (`client::master`), and the two copies may arrive in
    /// either order. It gets the same buffers and version. Executed anew, a copy arriving
    /// after the one answered would move the object to buffers its writer never hears of,
    /// and the writer's commit would then complete buffers nobody wrote (violation 2,
    /// `docs/reliability.md`). A store client starts one put of a key at a time, so an
    /// in-flight put of this key by this client is this put (but for a key named twice in
    /// one batch, `Start::Repeat`, whose second start replaces the first as before).
    fn is_retried_start(&self, start: Start, key: &str, client: Uuid, size: u64) -> bool {
        start == Start::Call
            && self
                .objects
                .get(key)
                .is_some_and(|obj| obj.writer == client && obj.size == size && obj.all_processing())
    }

    /// Forgets an in-flight put whose writer went quiet; its buffers stay parked until
    /// `put_start_release_timeout` after its start, since the writer may still be writing.
    pub(crate) fn discard_put(&mut self, m: &Metrics, key: &str) {
        let Some(obj) = self.objects.remove(key) else {
            return;
        };
        self.tombstones.add(key, obj.version);
        self.done_inflight(obj.put_start_ms);
        let release_at = obj
            .put_start_ms
            .saturating_add(self.cfg.release_timeout_ms());
        for r in obj.replicas {
            self.zombies.push(super::Zombie {
                seg: r.seg,
                span: r.span,
                release_at_ms: release_at,
            });
        }
        Metrics::inc(&m.put_start_discards);
    }

    /// Removes an object whatever its state (upsert of another size, forced paths): buffers
    /// a reader or writer may still touch are parked, the rest freed.
    fn drop_object(&mut self, m: &Metrics, now: u64, key: &str) {
        let Some(obj) = self.objects.get(key) else {
            return;
        };
        if obj.all_processing() {
            // Another writer may be mid-transfer into these buffers.
            self.discard_put(m, key);
            return;
        }
        let hold_until = obj.read_hold_until().max(self.executor_hold(now, key));
        let Some(obj) = self.objects.remove(key) else {
            return;
        };
        self.fail_internal(now, key, "the object was replaced");
        self.tombstones.add(key, obj.version);
        for r in obj.replicas {
            self.release(r.seg, r.span, hold_until, now);
        }
    }

    /// Removes an object, leaving a tombstone, and returns it; its buffers are parked until the
    /// last read window handed out for it ends, since a reader may still be reading them (a new put writing there
    /// would hand it another key's bytes). Used for a forced remove, and for an object that a
    /// re-report replaced (a newer version) or buried (a tombstone): an owner slower than the
    /// recovery fence re-reports after reads resumed.
    pub(crate) fn retire(&mut self, now: u64, key: &str) -> Option<Object> {
        let executor_hold = self.executor_hold(now, key);
        let obj = self.objects.remove(key)?;
        self.fail_internal(now, key, "the object was removed");
        self.tombstones.add(key, obj.version);
        let hold_until = obj.read_hold_until().max(executor_hold);
        for r in &obj.replicas {
            self.release(r.seg, r.span, hold_until, now);
        }
        Some(obj)
    }

    /// Erases an object and frees its buffers at once, leaving a tombstone (a revoked put:
    /// nobody reads a put in flight).
    pub(crate) fn erase(&mut self, key: &str) -> Option<Object> {
        let obj = self.objects.remove(key)?;
        self.tombstones.add(key, obj.version);
        for r in &obj.replicas {
            self.segs.free_span(r.seg, r.span);
        }
        Some(obj)
    }

    pub(crate) fn put_end(
        &mut self,
        m: &Metrics,
        now: u64,
        client: Uuid,
        key: &str,
    ) -> Result<(), ErrorCode> {
        let obj = self.objects.get_mut(key).ok_or(ErrorCode::ObjectNotFound)?;
        if obj.writer != client {
            return Err(ErrorCode::IllegalClient);
        }
        let mut changed = false;
        for r in &mut obj.replicas {
            if r.status == ReplicaStatus::Processing {
                r.status = ReplicaStatus::Complete;
                changed = true;
            }
        }
        if changed {
            let started = obj.put_start_ms;
            m.put_ms.record(now.saturating_sub(started));
            // No lease after a put: a fresh object may be removed at once.
            obj.read_lease_until = now;
            obj.last_read_ms = now;
            if let SoftPin::Pending { ttl_ms } = obj.soft_pin {
                obj.soft_pin = SoftPin::Until(now.saturating_add(ttl_ms));
            }
            self.evict_epoch += 1;
            self.done_inflight(started);
            // Readable now: a KV-cache event says so (`objects.rs`).
            self.objects.completed(key);
            // Eager offload: a complete object gets a copy on its owner's disk (`offload.rs`).
            self.offload_eager(now, key);
        }
        Ok(())
    }

    pub(crate) fn put_revoke(&mut self, client: Uuid, key: &str) -> Result<(), ErrorCode> {
        let obj = self.objects.get(key).ok_or(ErrorCode::ObjectNotFound)?;
        if obj.writer != client {
            return Err(ErrorCode::IllegalClient);
        }
        if !obj.all_processing() {
            return Err(ErrorCode::InvalidWrite);
        }
        let started = obj.put_start_ms;
        self.erase(key);
        self.done_inflight(started);
        Ok(())
    }

    /// GetReplicaList (and the admin's lease-free query when `lease` is false): the object
    /// if it has a COMPLETE replica. A leased read extends the read lease and refreshes
    /// recency.
    pub(crate) fn read(
        &mut self,
        now: u64,
        key: &str,
        lease: bool,
    ) -> Result<Found<'_>, ErrorCode> {
        self.fenced_key(now, key)?;
        let ttl = self.cfg.default_kv_lease_ttl_ms;
        let short = self.short_read_windows;
        let missing = self.missing(now);
        let obj = self.objects.get_mut(key).ok_or(missing)?;
        if !obj.has_complete() {
            return Err(ErrorCode::ReplicaIsNotReady);
        }
        if lease {
            // Counts a read answered from disk only, maybe queueing a promotion (`offload.rs`).
            self.disk_only_hit(now, key);
        }
        let obj = self.objects.get_mut(key).ok_or(ErrorCode::InternalError)?;
        if lease {
            obj.read_lease_until = obj.read_lease_until.max(now.saturating_add(ttl));
            if let Some(g) = &obj.group {
                let l = &g.lease;
                GroupLease::grant(&l.read_until, &l.read_grants, now.saturating_add(ttl));
            }
            let window = read_window_ms(ttl, short, obj.size);
            obj.read_window_until = obj.read_window_until.max(now.saturating_add(window));
            obj.last_read_ms = now;
        }
        Ok((obj, &self.segs))
    }

    /// ExistKey: true iff readable; grants a probe lease (blocks remove, not eviction) and
    /// leaves recency alone.
    pub(crate) fn exist(&mut self, now: u64, key: &str) -> Result<bool, ErrorCode> {
        self.fenced_key(now, key)?;
        let ttl = self.cfg.default_kv_lease_ttl_ms;
        match self.objects.get_mut(key) {
            Some(obj) if obj.has_complete() => {
                obj.probe_lease_until = obj.probe_lease_until.max(now.saturating_add(ttl));
                if let Some(g) = &obj.group {
                    let l = &g.lease;
                    GroupLease::grant(&l.probe_until, &l.probe_grants, now.saturating_add(ttl));
                }
                Ok(true)
            }
            Some(_) => Ok(false),
            None => self.owners_awaited(now).map(|()| false),
        }
    }

    fn removable(obj: &Object, now: u64, force: bool) -> Result<(), ErrorCode> {
        if !force && obj.remove_blocked(now) {
            return Err(ErrorCode::ObjectHasLease);
        }
        if !obj.is_complete() {
            return Err(ErrorCode::ReplicaIsNotReady);
        }
        Ok(())
    }

    /// Removes an object; returns it (its replicas' spans are freed, their segments still
    /// mounted) so that the caller can tell the remover what to bury (`docs/ha.md`).
    pub(crate) fn remove(&mut self, now: u64, key: &str, force: bool) -> Result<Object, ErrorCode> {
        self.fenced_key(now, key)?;
        let obj = self.objects.get(key).ok_or_else(|| self.missing(now))?;
        Self::removable(obj, now, force)?;
        // As upstream, a forced remove skips the task check too; the task then fails when
        // its executor reports (`tasks.rs`).
        if !force && self.tasks.active(key) {
            return Err(ErrorCode::ObjectHasReplicationTask);
        }
        // A forced remove ignores a read lease, but the reader may still be reading: `retire`
        // parks the buffers until the lease ends, so that no other key's put lands in them
        // under the reader (the fault harness read another write's bytes otherwise).
        self.retire(now, key).ok_or(ErrorCode::InternalError)
    }

    /// [`State::release_span`] on this state's segments and parked buffers.
    pub(super) fn release(&mut self, seg: SegRef, span: Span, hold_until: u64, now: u64) {
        Self::release_span(
            &mut self.segs,
            &mut self.zombies,
            seg,
            span,
            hold_until,
            now,
        );
    }

    /// Frees a span at once, or parks it until `hold_until` when a reader may still read it
    /// (the associated form, for a caller that holds other fields of the state borrowed).
    pub(super) fn release_span(
        segs: &mut Segments,
        zombies: &mut Vec<super::Zombie>,
        seg: SegRef,
        span: Span,
        hold_until: u64,
        now: u64,
    ) {
        if hold_until > now {
            zombies.push(super::Zombie {
                seg,
                span,
                release_at_ms: hold_until,
            });
        } else {
            segs.free_span(seg, span);
        }
    }

    /// Removes every removable object whose key the predicate accepts; returns the count
    /// and the matching keys it had to keep (a read lease, a put in flight). Under HA the
    /// removal is queued for etcd as a pattern record (`removals.rs`) described by `pick`.
    pub(crate) fn remove_where(
        &mut self,
        now: u64,
        force: bool,
        mut pick: impl FnMut(&str) -> bool,
        record: impl FnOnce(Vec<String>) -> Pick,
    ) -> Result<u64, ErrorCode> {
        self.fenced_all(now)?;
        let release_ms = self.cfg.release_timeout_ms();
        let State {
            objects,
            segs,
            tombstones,
            zombies,
            tasks,
            ..
        } = self;
        let mut n = 0;
        let mut kept = Vec::new();
        let mut with_internal = Vec::new();
        objects.retain(|k, obj| {
            if !pick(k) {
                return true;
            }
            // An object with a replication task is kept even when forced (as upstream's
            // `RemoveAll`; `tasks.rs`).
            if Self::removable(obj, now, force).is_err() || tasks.active(k) {
                kept.push(k.clone());
                return true;
            }
            tombstones.add(k, obj.version);
            let hold_until = obj
                .read_hold_until()
                .max(tasks.executor_hold(k, now, release_ms));
            for r in &obj.replicas {
                Self::release_span(segs, zombies, r.seg, r.span, hold_until, now);
            }
            if tasks.internal_active(k) {
                with_internal.push(k.clone());
            }
            n += 1;
            false
        });
        for k in with_internal {
            self.fail_internal(now, &k, "the object was removed");
        }
        let at = self.next_version();
        let removal = Removal {
            term: at.term,
            seq: at.seq,
            pick: record(kept),
        };
        let State {
            removals,
            tombstones,
            ..
        } = self;
        removals.learn(&removal, tombstones);
        if self.durable_on {
            self.durable.push(removal);
        }
        Ok(n)
    }

    /// Discards in-flight puts older than the discard timeout (a writer that died mid-put)
    /// and recounts the rest into `inflight`.
    pub(crate) fn discard_stale_puts(&mut self, m: &Metrics, now: u64) {
        let timeout_ms = self.cfg.discard_timeout_ms();
        let release_ms = self.cfg.release_timeout_ms();
        let State {
            objects,
            zombies,
            inflight,
            tombstones,
            ..
        } = self;
        inflight.clear();
        objects.retain(|k, obj| {
            if !obj.all_processing() {
                return true;
            }
            if now < obj.put_start_ms.saturating_add(timeout_ms) {
                *inflight.entry(obj.put_start_ms / 1000).or_insert(0) += 1;
                return true;
            }
            for r in &obj.replicas {
                zombies.push(super::Zombie {
                    seg: r.seg,
                    span: r.span,
                    release_at_ms: obj.put_start_ms.saturating_add(release_ms),
                });
            }
            tombstones.add(k, obj.version);
            Metrics::inc(&m.put_start_discards);
            false
        });
    }
}

/// The live lease groups by scoped name. Members hold the [`GroupLease`]; the registry only
/// finds it for a new member, and forgets names whose members are all gone.
#[derive(Default)]
pub(crate) struct Groups {
    by_name: std::collections::HashMap<String, Weak<GroupLease>>,
    /// Size after the last sweep; the next sweep runs at twice it.
    swept_at: usize,
}

impl Groups {
    /// The group `name`, made if no live member holds it.
    pub fn join(&mut self, name: String) -> Arc<GroupLease> {
        if let Some(g) = self.by_name.get(&name).and_then(Weak::upgrade) {
            return g;
        }
        let g = Arc::new(GroupLease {
            name: name.clone(),
            ..GroupLease::default()
        });
        self.by_name.insert(name, Arc::downgrade(&g));
        if self.by_name.len() > 2 * self.swept_at + 64 {
            self.by_name.retain(|_, w| w.strong_count() > 0);
            self.swept_at = self.by_name.len();
        }
        g
    }
}

/// How a start reached `put_start`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// A call, or a key's first start in a batch: maybe this put's start sent again.
    Call,
    /// A key named again in the same batch: a new start that replaces the one before it.
    Repeat,
}
