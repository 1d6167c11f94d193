//! Where a new object's replicas go: up to `replica_num` buffers on distinct segments.
//!
//! Order of candidates: the put's preferred segments first (in the order given), then the
//! strategy's order — `Random` walks the mounted segments from a random start, and
//! `FreeRatioFirst` goes from the emptiest segment (by free ratio) to the fullest. Replicas go
//! to distinct hosts when enough hosts have room: a first walk skips segments whose
//! `host_id` already holds a replica, a second walk (only if the first skipped any) fills up.
//! Draining and quarantined segments (see `segments.rs`) are never chosen, not even when
//! preferred: a quarantined segment's owner stopped pinging, so a put there would most likely
//! fail in the transfer; when nothing else has room the put gets `NO_AVAILABLE_HANDLE`.
//!
//! Disk segments (`docs/tiering.md`) are never chosen either: a writer cannot write a file on
//! another process's disk; objects reach a disk only through offload tasks (`offload.rs`).
//!
//! Fewer replicas than asked is a success (as upstream, with a partial-allocation metric);
//! none is `NO_AVAILABLE_HANDLE`, after one synchronous eviction pass and retry, except in the
//! first seconds of an HA term (the recovery fence, or while registered owners have not
//! re-mounted): then `UNAVAILABLE_IN_CURRENT_STATUS`, "ask again", since the room may not be
//! re-mounted yet (`docs/ha.md`).

use protocol::{ErrorCode, ReplicaStatus, ReplicateConfig};

use super::metrics::Metrics;
use super::object::Replica;
use super::segments::SegRef;
use super::{AllocationStrategy, State};

impl State {
    pub(crate) fn place(
        &mut self,
        m: &Metrics,
        now: u64,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> Result<Vec<Replica>, ErrorCode> {
        let want = cfg.replica_num as usize;
        let mut got = self.try_place(size, want, cfg);
        if got.is_empty() && self.some_segment_could_hold(size) {
            let need = size.saturating_mul(want as u64);
            if self.evict(m, now, need) > 0 {
                got = self.try_place(size, want, cfg);
            }
            if got.is_empty() {
                self.need_eviction = true;
            }
        }
        if got.is_empty() {
            // Just after an HA election the pool is still being re-mounted by its owners: the
            // writer asks again (a client following the leader does so on its own) rather than
            // hear that there is no room.
            if self.owners_awaited(now).is_err() || self.fenced(now).is_err() {
                return Err(ErrorCode::UnavailableInCurrentStatus);
            }
            Metrics::inc(&m.put_start_alloc_failures);
            return Err(ErrorCode::NoAvailableHandle);
        }
        if got.len() < want {
            Metrics::inc(&m.put_start_partial_allocations);
        }
        Ok(got)
    }

    /// Whether evicting could ever make room: some writable segment is big enough.
    fn some_segment_could_hold(&self, size: u64) -> bool {
        self.segs
            .iter()
            .any(|s| s.writable() && !s.is_disk() && s.size >= size)
    }

    fn try_place(&mut self, size: u64, want: usize, cfg: &ReplicateConfig) -> Vec<Replica> {
        let n = self.segs.live.len();
        let mut got: Vec<Replica> = Vec::with_capacity(want.min(n));
        if n == 0 {
            return got;
        }
        if !cfg.preferred_segment.is_empty() || !cfg.preferred_segments.is_empty() {
            for name in cfg.preferred() {
                if got.len() == want {
                    return got;
                }
                if let Some(r) = self.segs.by_name(name) {
                    self.try_segment(r, size, &mut got, false);
                }
            }
        }
        if got.len() == want {
            return got;
        }
        // Random walks `live` from a random start without allocating; FreeRatioFirst sorts.
        let (start, sorted) = match self.cfg.allocation_strategy {
            AllocationStrategy::Random => (self.next_random() as usize % n, Vec::new()),
            AllocationStrategy::FreeRatioFirst => {
                let mut v: Vec<(f64, u32)> = self
                    .segs
                    .iter_indexed()
                    .filter(|(_, s)| !s.is_disk())
                    .map(|(i, s)| {
                        let free = s.size - s.alloc.used_bytes();
                        (free as f64 / s.size as f64, i)
                    })
                    .collect();
                v.sort_by(|a, b| b.0.total_cmp(&a.0));
                (0, v.into_iter().map(|(_, i)| i).collect())
            }
        };
        let nth = |segs: &super::segments::Segments, k: usize| match sorted.get(k) {
            Some(&i) => segs.at(i),
            None => segs.at(segs.live[(start + k) % n]),
        };
        let mut skipped_for_host = false;
        for k in 0..n {
            if got.len() == want {
                return got;
            }
            let r = nth(&self.segs, k);
            skipped_for_host |= !self.try_segment(r, size, &mut got, true);
        }
        if skipped_for_host {
            for k in 0..n {
                if got.len() == want {
                    break;
                }
                let r = nth(&self.segs, k);
                self.try_segment(r, size, &mut got, false);
            }
        }
        got
    }

    /// Tries one buffer in `r` unless it is draining, quarantined or already used. With `distinct_hosts`,
    /// a segment on a host that already has a replica is skipped: returns `false` then.
    fn try_segment(
        &mut self,
        r: SegRef,
        size: u64,
        got: &mut Vec<Replica>,
        distinct_hosts: bool,
    ) -> bool {
        if got.iter().any(|x| x.seg == r) {
            return true;
        }
        let segs = &mut self.segs;
        if distinct_hosts {
            let Some(seg) = segs.get(r) else {
                return true;
            };
            if !seg.host_id.is_empty()
                && got
                    .iter()
                    .any(|x| segs.get(x.seg).is_some_and(|o| o.host_id == seg.host_id))
            {
                return false;
            }
        }
        let Some(seg) = segs.get_mut(r) else {
            return true;
        };
        if !seg.writable() || seg.is_disk() {
            return true;
        }
        if let Some(span) = seg.allocate(size) {
            got.push(Replica {
                seg: r,
                span,
                status: ReplicaStatus::Processing,
                on_disk: false,
            });
        }
        true
    }

    /// xorshift64*: placement needs spread, not secrecy.
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}
