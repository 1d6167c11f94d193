//! The master's side of the disk tier (`docs/tiering.md`): which objects go to disk, which
//! come back to memory, and how each disk stays within its owner's limits.
//!
//! A disk is a segment (medium `LocalDisk`) mounted by an owner beside its memory segment;
//! a disk copy is one more replica. So this file only *decides*; the moving is done by
//! internal replica tasks (`tasks.rs`, "Internal tasks") that the disk's owner executes:
//!
//! - **eager offload** (`--enable_offload`, `--offload_on_evict=false`): when an object
//!   becomes COMPLETE and one of its memory replicas lives on a segment whose owner also
//!   mounted a disk segment, an offload copy onto that disk is queued
//!   ([`State::offload_eager`]);
//! - **offload on evict** (`--offload_on_evict=true`): memory eviction (`evict.rs`) queues an
//!   offload *move* instead of dropping an object it picked, at most
//!   `offload_cap_ratio × offloading_queue_limit` per pass ([`State::offload_on_evict`]);
//! - in both modes memory eviction of an object that already has a disk replica only drops
//!   its memory replicas (lossless, preferred by `evict.rs`);
//! - **promotion** (`--promotion_on_hit`): reads of an object whose only COMPLETE replicas are
//!   on disk are counted per object; at `--promotion_admission_threshold` a promotion copy
//!   onto a memory segment is queued ([`State::disk_only_hit`]);
//! - **disk eviction** (`tick`, at most once a second): a disk segment above its owner's high
//!   watermark (bytes, or keys against its key limit) loses disk replicas, least recently
//!   read first, down to the low watermark ([`State::maybe_evict_disks`]); an allocation on a
//!   full disk, or one that would take the whole cluster's disks past
//!   `--offload_total_bytes_limit`, evicts the same way first ([`State::allocate_target`]).
//!
//! Invariants: an object has at most one disk replica (an offload is queued only for objects
//! without one, and a task never adds a replica to a segment that holds one); at most one
//! internal task per key; the sum of bytes allocated on disk segments never exceeds
//! `offload_total_bytes_limit` when it is set (every disk allocation goes through
//! [`State::allocate_target`], and re-reports are the owner's own files, counted as they come).

use protocol::Uuid;

use super::segments::SegRef;
use super::tasks::Internal;
use super::State;
use crate::alloc::Span;

/// How often disk watermarks are checked, milliseconds: a disk fills at disk speed, and a
/// check may count every object on the segment.
const DISK_CHECK_INTERVAL_MS: u64 = 1000;

/// The disk tier's switches (the original's master flags, plus `--offload_total_bytes_limit`).
#[derive(Clone, Debug, PartialEq)]
pub struct OffloadConfig {
    /// `--enable_offload`: the master side of the tier (offload and promotion tasks).
    pub enabled: bool,
    /// `--offload_on_evict`: offload when eviction picks an object instead of at `PutEnd`.
    pub on_evict: bool,
    /// `--offload_force_evict`: objects picked beyond the per-pass cap are dropped instead of
    /// kept in memory, and an object still waiting for its eager offload does not hold its
    /// memory (`Tasks::internal_blocks_eviction`).
    pub force_evict: bool,
    /// `--offloading_queue_limit`: offloads PENDING or PROCESSING per disk segment.
    pub queue_limit: u64,
    /// `--offload_cap_ratio`: offload moves per eviction pass, as a share of `queue_limit`.
    pub cap_ratio: f64,
    /// `--promotion_on_hit`.
    pub promotion_on_hit: bool,
    /// `--promotion_admission_threshold`: disk-only reads before a promotion.
    pub promotion_threshold: u32,
    /// `--promotion_max_per_heartbeat`: promotions handed to one executor per fetch.
    pub promotion_max_per_heartbeat: u32,
    /// `--promotion_queue_limit`: promotions in flight, cluster-wide.
    pub promotion_queue_limit: u64,
    /// `--offload_total_bytes_limit`: bytes allocated on all disk segments together (0: none).
    pub total_bytes_limit: u64,
}

impl Default for OffloadConfig {
    fn default() -> Self {
        OffloadConfig {
            enabled: false,
            on_evict: false,
            force_evict: false,
            queue_limit: 50_000,
            cap_ratio: 0.5,
            promotion_on_hit: false,
            promotion_threshold: 2,
            promotion_max_per_heartbeat: 1,
            promotion_queue_limit: 50_000,
            total_bytes_limit: 0,
        }
    }
}

/// Counters of the disk tier, kept under the state lock (they change where the lock is held
/// anyway) and read by the metrics page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    pub offloads_queued: u64,
    pub offloads_completed: u64,
    pub offloads_failed: u64,
    /// Offloads not queued because their disk's queue was full.
    pub offloads_skipped: u64,
    pub promotions_queued: u64,
    pub promotions_completed: u64,
    pub promotions_failed: u64,
    /// `GetReplicaList` answers whose only COMPLETE replicas were on disk.
    pub disk_only_hits: u64,
    /// Disk replicas dropped by disk eviction, and their bytes.
    pub disk_evicted_replicas: u64,
    pub disk_evicted_bytes: u64,
    /// Objects memory eviction left on disk only (their memory replicas dropped).
    pub memory_evictions_to_disk: u64,
}

/// The tier's gauges and counters for one rendering of the metrics page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierGauges {
    pub stats: TierStats,
    pub disk_used_bytes: u64,
    pub disk_capacity_bytes: u64,
    pub disk_segments: u64,
    /// Internal tasks PENDING and PROCESSING.
    pub internal_pending: u64,
    pub internal_processing: u64,
    /// Objects with a memory replica, with a disk replica, and with disk replicas only.
    pub memory_objects: u64,
    pub disk_objects: u64,
    pub disk_only_objects: u64,
}

impl State {
    pub(crate) fn tier_gauges(&self) -> TierGauges {
        let (used, cap) = self.disk_usage();
        let (p, x) = self.tasks.internal_counts();
        let disk_segments = self.segs.iter().filter(|s| s.is_disk()).count() as u64;
        // Counting per medium walks the index (as the soft-pin gauge does); without a disk
        // segment every object is in memory.
        let (mut memory_objects, mut disk_objects, mut disk_only_objects) =
            (self.objects.len() as u64, 0, 0);
        if disk_segments > 0 {
            memory_objects = 0;
            for obj in self.objects.values() {
                let (mut m, mut d) = (false, false);
                for r in &obj.replicas {
                    match self.segs.get(r.seg) {
                        Some(s) if s.is_disk() => d = true,
                        _ => m = true,
                    }
                }
                memory_objects += u64::from(m);
                disk_objects += u64::from(d);
                disk_only_objects += u64::from(d && !m);
            }
        }
        TierGauges {
            stats: self.tier,
            disk_used_bytes: used,
            disk_capacity_bytes: cap,
            disk_segments,
            internal_pending: p as u64,
            internal_processing: x as u64,
            memory_objects,
            disk_objects,
            disk_only_objects,
        }
    }

    /// [`super::tasks::Tasks::executor_hold`] with this master's release timeout.
    pub(crate) fn executor_hold(&self, now: u64, key: &str) -> u64 {
        let release_ms = self.cfg.release_timeout_ms();
        self.tasks.executor_hold(key, now, release_ms)
    }

    /// The disk segment `client` mounted, if it is open to new allocations.
    fn disk_of(&self, client: Uuid) -> Option<SegRef> {
        let c = self.clients.get(&client)?;
        c.segments.iter().copied().find(|&r| {
            self.segs
                .get(r)
                .is_some_and(|s| s.is_disk() && s.writable())
        })
    }

    /// Where `key` would be offloaded: `(its memory replica's segment, the disk segment of
    /// that segment's owner, the owner)`, for a COMPLETE object without a disk replica or an
    /// internal task.
    fn offload_route(&self, key: &str) -> Option<(String, String, Uuid)> {
        let obj = self.objects.get(key)?;
        if !obj.is_complete() || self.tasks.internal_active(key) {
            return None;
        }
        let on_disk = |r: SegRef| self.segs.get(r).is_some_and(|s| s.is_disk());
        if obj.replicas.iter().any(|x| on_disk(x.seg)) {
            return None;
        }
        obj.replicas.iter().find_map(|x| {
            let seg = self.segs.get(x.seg)?;
            let disk = self.segs.get(self.disk_of(seg.client)?)?;
            Some((seg.name.clone(), disk.name.clone(), seg.client))
        })
    }

    /// Whether `key` could be offloaded at all (its owner has a disk, it has no disk copy).
    pub(crate) fn offload_route_exists(&self, key: &str) -> bool {
        self.offload_route(key).is_some()
    }

    /// Whether `disk`'s offload queue is full (`--offloading_queue_limit`).
    fn offload_queue_full(&self, disk: &str) -> bool {
        let n = self.tasks.offloads_by_disk.get(disk).copied().unwrap_or(0);
        n as u64 >= self.cfg.offload.queue_limit
    }

    /// Eager offload at `PutEnd`/`UpsertEnd` (module docs).
    pub(crate) fn offload_eager(&mut self, now: u64, key: &str) {
        let o = &self.cfg.offload;
        if !o.enabled || o.on_evict {
            return;
        }
        let Some((_, disk, owner)) = self.offload_route(key) else {
            return;
        };
        if self.offload_queue_full(&disk) {
            self.tier.offloads_skipped += 1;
            return;
        }
        if self
            .create_internal(now, key, Internal::Offload, None, disk, owner)
            .is_some()
        {
            self.tier.offloads_queued += 1;
        }
    }

    /// Offload on evict: queues a move of `key`'s memory replica onto its owner's disk.
    /// `None` when the object has no route to a disk (it may then be dropped as before);
    /// `Some(false)` when it has one but the queue is full (kept, or dropped with
    /// `--offload_force_evict`); `Some(true)` when queued.
    pub(crate) fn offload_on_evict(&mut self, now: u64, key: &str) -> Option<bool> {
        let (source, disk, owner) = self.offload_route(key)?;
        if self.offload_queue_full(&disk) {
            self.tier.offloads_skipped += 1;
            return Some(false);
        }
        let queued = self
            .create_internal(now, key, Internal::Offload, Some(source), disk, owner)
            .is_some();
        if queued {
            self.tier.offloads_queued += 1;
        }
        Some(queued)
    }

    /// A leased read of `key`: counts it when the object's only COMPLETE replicas are on
    /// disk, and with `--promotion_on_hit` queues a promotion at the admission threshold.
    /// The count is per object (exact, a `u32`; cheaper than a sketch when the object is at
    /// hand anyway) and starts again after a promotion is queued.
    pub(crate) fn disk_only_hit(&mut self, now: u64, key: &str) {
        let segs = &self.segs;
        let Some(obj) = self.objects.get_mut(key) else {
            return;
        };
        let in_memory = obj.replicas.iter().any(|r| {
            r.status == protocol::ReplicaStatus::Complete
                && segs.get(r.seg).is_some_and(|s| !s.is_disk())
        });
        if in_memory {
            return;
        }
        self.tier.disk_only_hits += 1;
        let o = &self.cfg.offload;
        if !o.enabled || !o.promotion_on_hit {
            return;
        }
        obj.set_disk_hits(obj.disk_hits().saturating_add(1));
        if obj.disk_hits() < o.promotion_threshold
            || self.tasks.promotions as u64 >= o.promotion_queue_limit
            || self.tasks.internal_active(key)
        {
            return;
        }
        // The disk's owner executes it: onto its own memory segment when it has a writable
        // one, else the memory segment with the most free bytes.
        let Some((owner, size)) = obj
            .replicas
            .iter()
            .find_map(|r| segs.get(r.seg).filter(|s| s.is_disk()).map(|s| s.client))
            .map(|c| (c, obj.size()))
        else {
            return;
        };
        let memory = |s: &&super::segments::Seg| {
            !s.is_disk() && s.writable() && s.size - s.alloc.used_bytes() >= size
        };
        let own = self.clients.get(&owner).and_then(|c| {
            c.segments
                .iter()
                .filter_map(|&r| self.segs.get(r))
                .find(memory)
                .map(|s| s.name.clone())
        });
        let target = own.or_else(|| {
            self.segs
                .iter()
                .filter(memory)
                .max_by_key(|s| s.size - s.alloc.used_bytes())
                .map(|s| s.name.clone())
        });
        let Some(target) = target else {
            return;
        };
        if self
            .create_internal(now, key, Internal::Promotion, None, target, owner)
            .is_some()
        {
            if let Some(obj) = self.objects.get_mut(key) {
                obj.set_disk_hits(0);
            }
            self.tier.promotions_queued += 1;
        }
    }

    /// Allocates a task's range of `size` bytes on segment `r`. On a disk segment the
    /// cluster-wide byte cap is kept, and a full disk (or cap) first evicts disk replicas of
    /// that segment, least recently read first, as a put evicts memory: at least
    /// `eviction_ratio` of the disk at a time, so that the next offloads of the same fetch
    /// find room without another walk of the index, and not again in the same millisecond
    /// on a disk where a walk found nothing.
    pub(crate) fn allocate_target(&mut self, now: u64, r: SegRef, size: u64) -> Option<Span> {
        let seg = self.segs.get(r).filter(|s| s.writable())?;
        if !seg.is_disk() {
            return self.segs.get_mut(r)?.allocate(size);
        }
        let batch = (seg.size as f64 * self.cfg.eviction_ratio).ceil() as u64;
        if let Some(span) = self.try_disk(r, size) {
            return Some(span);
        }
        if self.disk_futile == Some((now, r)) {
            return None;
        }
        let freed = self.make_disk_room(now, r, size, batch);
        let span = self.try_disk(r, size);
        if span.is_none() && freed == 0 {
            self.disk_futile = Some((now, r));
        }
        span
    }

    /// A range on disk segment `r` if both the segment and the cluster cap have room.
    fn try_disk(&mut self, r: SegRef, size: u64) -> Option<Span> {
        let limit = self.cfg.offload.total_bytes_limit;
        if limit > 0 && self.disk_usage().0 + size > limit {
            return None;
        }
        self.segs.get_mut(r)?.allocate(size)
    }

    /// Evicts disk replicas so that `size` bytes fit on `r` (at least `batch` from it) and
    /// under the cluster cap (at least `eviction_ratio` of the cap). Returns bytes freed.
    fn make_disk_room(&mut self, now: u64, r: SegRef, size: u64, batch: u64) -> u64 {
        let mut freed = 0;
        let limit = self.cfg.offload.total_bytes_limit;
        let cap_blocked = limit > 0 && self.disk_usage().0 + size > limit;
        if cap_blocked {
            // The cap is the cluster's: make room on this disk first, then on the fullest
            // others, as a put makes room in memory.
            let mut disks: Vec<(u64, SegRef)> = self
                .segs
                .iter_indexed()
                .filter(|(_, s)| s.is_disk())
                .map(|(i, s)| (s.alloc.used_bytes(), self.segs.at(i)))
                .filter(|&(_, d)| d != r)
                .collect();
            disks.sort_unstable_by_key(|d| std::cmp::Reverse(d.0));
            for d in std::iter::once(r).chain(disks.into_iter().map(|(_, d)| d)) {
                let over = (self.disk_usage().0 + size).saturating_sub(limit);
                if over == 0 {
                    break;
                }
                // The cap's own share, not the disk's: the cap may be far below a disk.
                let cap_batch = (limit as f64 * self.cfg.eviction_ratio).ceil() as u64;
                freed += self.evict_disk(now, d, over.max(cap_batch), 0);
            }
        }
        // Under the cap now, the disk itself may have had room all along; otherwise it was
        // the disk that was full.
        let free = self
            .segs
            .get(r)
            .map_or(0, |s| s.alloc.capacity() - s.alloc.used_bytes());
        if !cap_blocked || free < size {
            freed += self.evict_disk(now, r, size.max(batch), 0);
        }
        freed
    }

    /// Disk eviction from `tick`: every disk segment above its high watermark, in bytes or
    /// keys, is brought down to its low watermark (module docs).
    pub(crate) fn maybe_evict_disks(&mut self, now: u64) {
        if now < self.next_disk_check_ms {
            return;
        }
        self.next_disk_check_ms = now + DISK_CHECK_INTERVAL_MS;
        let disks: Vec<(SegRef, u64, u64, u64, u64)> = self
            .segs
            .iter_indexed()
            .filter(|(_, s)| s.is_disk() && s.disk.high_watermark_permille > 0)
            .map(|(i, s)| {
                let p = s.disk;
                let (hi, lo) = (
                    p.high_watermark_permille,
                    p.low_watermark_permille.min(p.high_watermark_permille),
                );
                let high = permille(s.size, hi);
                let low = permille(s.size, lo);
                let keys_high = permille(p.keys_limit, hi);
                let keys_low = permille(p.keys_limit, lo);
                (self.segs.at(i), high, low, keys_high, keys_low)
            })
            .collect();
        for (r, high, low, keys_high, keys_low) in disks {
            let used = self.segs.get(r).map_or(0, |s| s.alloc.used_bytes());
            let keys = if keys_high > 0 { self.disk_keys(r) } else { 0 };
            let bytes_over = used > high;
            let keys_over = keys_high > 0 && keys > keys_high;
            if !bytes_over && !keys_over {
                continue;
            }
            let bytes_need = if bytes_over { used - low } else { 0 };
            let keys_need = if keys_over { keys - keys_low } else { 0 };
            self.evict_disk(now, r, bytes_need, keys_need);
        }
    }

    /// Objects with a replica on disk segment `r`.
    fn disk_keys(&self, r: SegRef) -> u64 {
        self.objects
            .values()
            .filter(|o| o.replicas.iter().any(|x| x.seg == r))
            .count() as u64
    }

    /// Drops disk replicas on segment `r`, least recently read first, until `bytes` bytes
    /// and `keys` replicas are gone, or nothing evictable is
    /// left. Skips objects that are read-leased, hard-pinned, unfinished or with a task;
    /// soft-pinned ones go last, and only with `allow_evict_soft_pinned_objects`. The last
    /// replica of an object takes the object (tombstoned, as eviction does). Returns bytes
    /// freed.
    pub(crate) fn evict_disk(&mut self, now: u64, r: SegRef, bytes: u64, keys: u64) -> u64 {
        let allow_pinned = self.cfg.allow_evict_soft_pinned_objects;
        let mut cands: Vec<(bool, u64, String)> = Vec::new();
        for (k, obj) in &self.objects {
            if !obj.replicas.iter().any(|x| x.seg == r)
                || !super::evict::evictable(obj, k, now, &self.tasks)
                || self.tasks.internal_active(k)
            {
                continue;
            }
            let pinned = obj.soft_pinned(now);
            if pinned && !allow_pinned {
                continue;
            }
            cands.push((pinned, obj.last_read_ms(), k.to_string()));
        }
        cands.sort_unstable_by_key(|c| (c.0, c.1));
        let (mut freed, mut dropped) = (0u64, 0u64);
        for (_, _, k) in cands {
            if freed >= bytes && dropped >= keys {
                break;
            }
            let Some(obj) = self.objects.get_mut(&k) else {
                continue;
            };
            let Some(at) = obj.replicas.iter().position(|x| x.seg == r) else {
                continue;
            };
            let len = obj.replicas[at].span.len;
            if obj.replicas.len() == 1 {
                if let Some(obj) = self.objects.remove(&k) {
                    self.tombstones.add(&k, obj.version);
                    for x in &obj.replicas {
                        self.segs.free_span(x.seg, x.span);
                    }
                }
            } else {
                let x = obj.replicas.swap_remove(at);
                self.objects.settle(&k);
                self.segs.free_span(x.seg, x.span);
            }
            freed += len;
            dropped += 1;
        }
        self.tier.disk_evicted_replicas += dropped;
        self.tier.disk_evicted_bytes += freed;
        freed
    }
}

/// `n × p / 1000`, exactly (no overflow, no rounding before the multiplication).
fn permille(n: u64, p: u16) -> u64 {
    (u128::from(n) * u128::from(p) / 1000) as u64
}
