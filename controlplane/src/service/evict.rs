//! Eviction: freeing memory by dropping the least recently read objects.
//!
//! **Trigger.** A pass runs from `tick` when `used / capacity > eviction_high_watermark_ratio`
//! or a put failed for lack of space (`need_eviction`), and synchronously inside a put whose
//! allocation failed (that put then retries once). `eviction_ratio == 0` disables eviction.
//!
//! **Amount.** `target = max(eviction_ratio, used_ratio - high_watermark + eviction_ratio)`;
//! a pass frees at least `target × capacity` bytes (and at least what the failed put needs),
//! or everything evictable if that is less. Upstream counts objects (`ceil(#evictable ×
//! target)`); counting bytes is the same for uniform objects and right for mixed sizes.
//!
//! **Candidates.** An object is evictable when it is not hard-pinned, every replica is
//! COMPLETE, its *read* lease has expired and it has no replica task (a user's, or an internal
//! one, `tasks.rs`: an object waiting for its eager offload stays until its disk copy is made,
//! unless `--offload_force_evict`, when it goes and its offload fails). Candidates go oldest `last_read_ms` first (approximate LRU; ties broken
//! arbitrarily). Soft-pinned objects (pin deadline in the future) come only after every other
//! candidate, and only with `allow_evict_soft_pinned_objects`.
//!
//! **Disk tier** (`offload.rs`). Only memory counts here: capacity, usage and the bytes an
//! object frees are its memory replicas'; an object on disk only is no candidate. Objects
//! with a COMPLETE disk replica go first (their memory replicas are dropped and the object
//! stays, readable from disk: nothing is lost). With `--offload_on_evict` an object without
//! a disk replica whose owner has a disk is not dropped but gets an offload move, at most
//! `offload_cap_ratio × offloading_queue_limit` per pass; the rest of what the pass picked
//! stays in memory, or is dropped with `--offload_force_evict`.
//!
//! **The probe rule (upstream issue #2187).** Only `GetReplicaList` (a real read) grants the
//! read lease that protects an object from eviction, and only it refreshes `last_read_ms`.
//! `ExistKey`/`BatchExistKey` grant a separate *probe lease*, which blocks a non-forced
//! `Remove` (answering `OBJECT_HAS_LEASE`, for compatibility with callers that expect it)
//! but neither protects the object from eviction nor makes it look recently used. Upstream
//! renewed the read lease on every probe, so a cache probed more often than the lease TTL
//! could never evict anything (`Success/Attempts=0/649` in the issue) while every put failed.
//!
//! **Futile passes.** A pass that finds nothing to evict remembers why: the earliest time a
//! lease or soft pin that blocked a candidate expires, and the index epoch (bumped whenever
//! an object becomes COMPLETE). Until one of them moves, further passes are skipped, so a
//! full, fully-leased store costs one scan, not one scan per failed put or per tick.

use super::metrics::Metrics;
use super::object::SoftPin;
use super::State;

/// The cutoff of each eviction class (see [`cutoff`]); `None` takes nothing from it.
struct Cutoffs {
    backed: Option<(u64, u64)>,
    plain: Option<(u64, u64)>,
    pinned: Option<(u64, u64)>,
}

impl Cutoffs {
    /// Whether an object last read at `last_read` is within its class's cutoff (see
    /// [`take`]); a soft-pinned one only when `allow_pinned`.
    fn take(
        &mut self,
        soft_pinned: bool,
        allow_pinned: bool,
        on_disk: bool,
        last_read: u64,
    ) -> bool {
        if soft_pinned {
            allow_pinned && take(&mut self.pinned, last_read)
        } else if on_disk {
            take(&mut self.backed, last_read)
        } else {
            take(&mut self.plain, last_read)
        }
    }
}

/// Sorts candidates `(last_read_ms, bytes)` oldest first and finds where `need` bytes are
/// covered: everything read before `.0`, plus `.1` of the objects read exactly at `.0`.
/// Returns the cut and the bytes still needed after taking the whole list if it falls short.
fn cutoff(cands: &mut [(u64, u64)], need: u64) -> (Option<(u64, u64)>, u64) {
    cands.sort_unstable_by_key(|c| c.0);
    let mut got = 0u64;
    let mut cut = None;
    let mut ties = 0;
    for &(t, bytes) in cands.iter() {
        if got >= need {
            break;
        }
        if cut.map(|(c, _)| c) == Some(t) {
            ties += 1;
        } else {
            ties = 1;
        }
        cut = Some((t, 0));
        got += bytes;
    }
    (cut.map(|(t, _)| (t, ties)), need.saturating_sub(got))
}

/// Whether `last_read` falls under a cut, consuming a tie slot when it sits on it.
fn take(cut: &mut Option<(u64, u64)>, last_read: u64) -> bool {
    match cut {
        Some((t, _)) if last_read < *t => true,
        Some((t, ties)) if last_read == *t && *ties > 0 => {
            *ties -= 1;
            true
        }
        _ => false,
    }
}

/// Whether eviction may take `obj` (held under `key`) now, soft pins aside: not hard-pinned,
/// every replica COMPLETE, no read lease, no replication task (`tasks.rs`).
pub(crate) fn evictable(
    obj: &super::object::Object,
    key: &str,
    now: u64,
    tasks: &super::tasks::Tasks,
) -> bool {
    !obj.hard_pin() && obj.is_complete() && obj.read_leased_until() <= now && !tasks.active(key)
}

impl State {
    /// Used and total bytes over mounted memory segments: what memory eviction and its
    /// watermark look at. Disk segments have their own totals ([`State::disk_usage`]).
    pub(crate) fn usage(&self) -> (u64, u64) {
        self.segs
            .iter()
            .filter(|s| !s.is_disk())
            .fold((0, 0), |(u, c), s| {
                (u + s.alloc.used_bytes(), c + s.alloc.capacity())
            })
    }

    /// Used and total bytes over mounted disk segments.
    pub(crate) fn disk_usage(&self) -> (u64, u64) {
        self.segs
            .iter()
            .filter(|s| s.is_disk())
            .fold((0, 0), |(u, c), s| {
                (u + s.alloc.used_bytes(), c + s.alloc.capacity())
            })
    }

    /// Runs a pass if the watermark is crossed or a put asked for one.
    pub(crate) fn maybe_evict(&mut self, m: &Metrics, now: u64) {
        let (used, cap) = self.usage();
        let over = cap > 0 && used as f64 > self.cfg.eviction_high_watermark_ratio * cap as f64;
        if over || self.need_eviction {
            self.evict(m, now, 0);
        }
    }

    /// One eviction pass freeing at least `min_bytes` (see module docs). Returns bytes freed.
    pub(crate) fn evict(&mut self, m: &Metrics, now: u64, min_bytes: u64) -> u64 {
        let ratio = self.cfg.eviction_ratio;
        if ratio <= 0.0 {
            self.need_eviction = false;
            return 0;
        }
        if let Some((epoch, retry_at)) = self.evict_blocked {
            if epoch == self.evict_epoch && now < retry_at {
                return 0;
            }
        }
        let (used, cap) = self.usage();
        if cap == 0 {
            return 0;
        }
        Metrics::inc(&m.eviction_attempts);
        let used_ratio = used as f64 / cap as f64;
        let target = ratio.max(used_ratio - self.cfg.eviction_high_watermark_ratio + ratio);
        let need = ((target * cap as f64).ceil() as u64).max(min_bytes).max(1);

        let (cuts, retry_at) = self.eviction_cutoffs(now, need);
        let (mut keys, mut freed, to_offload, dropped_with_task) = self.evict_picked(now, cuts);
        for k in dropped_with_task {
            // A copy not handed out yet: nothing was allocated for it, nobody reads for it.
            self.fail_internal(now, &k, "the object was evicted");
        }
        let (k2, f2, moved) = self.offload_picked(now, to_offload);
        keys += k2;
        freed += f2;

        self.record_eviction(m, keys, freed, moved, retry_at);
        freed
    }

    /// Sorts the eligible objects that hold memory into the three classes and picks, in
    /// each, the cutoff that frees `need` bytes (the next class covers what one lacks).
    /// Also returns when a skipped object (read-leased, soft-pinned) may become evictable.
    fn eviction_cutoffs(&self, now: u64, need: u64) -> (Cutoffs, u64) {
        let allow_pinned = self.cfg.allow_evict_soft_pinned_objects;
        let force_evict = self.cfg.offload.force_evict;
        // Three classes, taken in this order: objects with a disk replica (dropping their
        // memory replicas loses nothing, `offload.rs`), then the others, then soft-pinned
        // ones. Objects with no memory replica free nothing here and are not candidates.
        let mut backed: Vec<(u64, u64)> = Vec::new();
        let mut plain: Vec<(u64, u64)> = Vec::new();
        let mut pinned: Vec<(u64, u64)> = Vec::new();
        let mut retry_at = u64::MAX;
        for (k, obj) in &self.objects {
            // An object with a replication task stays until the task ends (`tasks.rs`).
            if obj.hard_pin()
                || !obj.is_complete()
                || self.tasks.active(k)
                || self.tasks.internal_blocks_eviction(k, force_evict)
            {
                continue;
            }
            if obj.read_leased_until() > now {
                retry_at = retry_at.min(obj.read_leased_until());
                continue;
            }
            let (bytes, on_disk) = memory_bytes(obj, &self.segs);
            if bytes == 0 {
                continue;
            }
            if obj.soft_pinned(now) {
                if allow_pinned {
                    pinned.push((obj.last_read_ms(), bytes));
                } else if let SoftPin::Until(t) = obj.soft_pin() {
                    retry_at = retry_at.min(t);
                }
                continue;
            }
            if on_disk {
                backed.push((obj.last_read_ms(), bytes));
            } else {
                plain.push((obj.last_read_ms(), bytes));
            }
        }
        let (cut_backed, short) = cutoff(&mut backed, need);
        let (cut_plain, short) = if short > 0 {
            cutoff(&mut plain, short)
        } else {
            (None, 0)
        };
        let mut cut_pinned = None;
        if short > 0 && allow_pinned {
            cut_pinned = cutoff(&mut pinned, short).0;
        }
        let cuts = Cutoffs {
            backed: cut_backed,
            plain: cut_plain,
            pinned: cut_pinned,
        };
        (cuts, retry_at)
    }

    /// Drops the memory replicas of the objects within the cutoffs: a disk-backed object
    /// keeps its disk replica, an object for offload on evict is only picked, any other is
    /// removed. Returns (keys removed, bytes freed, objects picked for offload, removed keys
    /// that had an internal task).
    fn evict_picked(
        &mut self,
        now: u64,
        mut cuts: Cutoffs,
    ) -> (u64, u64, Vec<(u64, String)>, Vec<String>) {
        let allow_pinned = self.cfg.allow_evict_soft_pinned_objects;
        let force_evict = self.cfg.offload.force_evict;
        let on_evict = self.cfg.offload.enabled && self.cfg.offload.on_evict;
        let State {
            objects,
            segs,
            tombstones,
            tasks,
            tier,
            ..
        } = self;
        let (mut keys, mut freed) = (0u64, 0u64);
        // Picked objects left for an offload decision (on-evict mode), oldest read first.
        let mut to_offload: Vec<(u64, String)> = Vec::new();
        let mut dropped_with_task: Vec<String> = Vec::new();
        objects.retain(|k, obj| {
            // The same eligibility as `eviction_cutoffs` (nothing changed in between).
            if !evictable(obj, k, now, tasks) || tasks.internal_blocks_eviction(k, force_evict) {
                return true;
            }
            let (bytes, on_disk) = memory_bytes(obj, segs);
            if bytes == 0 {
                return true;
            }
            let evict = cuts.take(
                obj.soft_pinned(now),
                allow_pinned,
                on_disk,
                obj.last_read_ms(),
            );
            if !evict {
                return true;
            }
            if on_disk {
                drop_memory_replicas(obj, segs);
                freed += bytes;
                tier.memory_evictions_to_disk += 1;
                return true;
            }
            if on_evict {
                to_offload.push((obj.last_read_ms(), k.to_string()));
                return true;
            }
            for r in &obj.replicas {
                freed += r.span.len;
                segs.free_span(r.seg, r.span);
            }
            tombstones.add(k, obj.version);
            if tasks.internal_active(k) {
                dropped_with_task.push(k.to_string());
            }
            keys += 1;
            false
        });
        (keys, freed, to_offload, dropped_with_task)
    }

    /// Ends a pass: a pass that did nothing blocks the next until the state changes or
    /// `retry_at`; one that did counts its success, keys and bytes.
    fn record_eviction(&mut self, m: &Metrics, keys: u64, freed: u64, moved: u64, retry_at: u64) {
        self.need_eviction = false;
        if keys == 0 && freed == 0 && moved == 0 {
            self.evict_blocked = Some((self.evict_epoch, retry_at));
        } else {
            self.evict_blocked = None;
            Metrics::inc(&m.eviction_successes);
            Metrics::add(&m.evicted_keys, keys);
            Metrics::add(&m.evicted_bytes, freed);
        }
    }

    /// Offload on evict (`offload.rs`): the objects this pass picked, oldest read first, get
    /// an offload move while the per-pass cap (`offload_cap_ratio × offloading_queue_limit`)
    /// lasts. An object whose owner has no disk is dropped as eviction always did; one past
    /// the cap (or whose disk's queue is full) stays in memory, or is dropped with
    /// `--offload_force_evict`. Returns (keys dropped, bytes freed, moves queued).
    fn offload_picked(&mut self, now: u64, mut picked: Vec<(u64, String)>) -> (u64, u64, u64) {
        if picked.is_empty() {
            return (0, 0, 0);
        }
        picked.sort_unstable();
        let o = &self.cfg.offload;
        let mut cap = (o.cap_ratio * o.queue_limit as f64).floor() as u64;
        let force = o.force_evict;
        let (mut keys, mut freed, mut moved) = (0u64, 0u64, 0u64);
        for (_, k) in picked {
            let queued = if cap > 0 {
                self.offload_on_evict(now, &k)
            } else {
                self.offload_route_exists(&k).then_some(false)
            };
            let drop = match queued {
                Some(true) => {
                    cap -= 1;
                    moved += 1;
                    false
                }
                Some(false) => force,
                None => true,
            };
            if drop {
                if let Some(obj) = self.objects.remove(&k) {
                    for r in &obj.replicas {
                        freed += r.span.len;
                        self.segs.free_span(r.seg, r.span);
                    }
                    self.tombstones.add(&k, obj.version);
                    keys += 1;
                }
            }
        }
        (keys, freed, moved)
    }
}

/// Frees `obj`'s memory replicas and keeps its disk ones. Lossless: the memory replicas go,
/// the object stays readable from disk.
fn drop_memory_replicas(obj: &mut super::object::Object, segs: &mut super::segments::Segments) {
    obj.replicas.retain(|r| {
        let disk = segs.get(r.seg).is_some_and(|s| s.is_disk());
        if !disk {
            segs.free_span(r.seg, r.span);
        }
        disk
    });
}

/// The bytes of `obj`'s memory replicas, and whether it has a disk replica.
fn memory_bytes(obj: &super::object::Object, segs: &super::segments::Segments) -> (u64, bool) {
    let mut bytes = 0;
    let mut on_disk = false;
    for r in &obj.replicas {
        match segs.get(r.seg) {
            Some(s) if s.is_disk() => on_disk = true,
            _ => bytes += r.span.len,
        }
    }
    (bytes, on_disk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoff_covers_need_with_ties() {
        let mut c = vec![(5, 10), (1, 10), (5, 10), (3, 10), (5, 10)];
        assert_eq!(cutoff(&mut c, 25), (Some((5, 1)), 0));
        assert_eq!(cutoff(&mut c, 35), (Some((5, 2)), 0));
        assert_eq!(cutoff(&mut c, 100), (Some((5, 3)), 50));
        assert_eq!(cutoff(&mut [], 1), (None, 1));
        let mut cut = Some((5, 1));
        assert!(take(&mut cut, 1));
        assert!(take(&mut cut, 5));
        assert!(!take(&mut cut, 5), "only one tie slot");
        assert!(!take(&mut cut, 6));
    }
}
