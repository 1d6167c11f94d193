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
//! **Admission ramp** (`--admission_ramp_sec`, `docs/fleet.md`): a segment mounted fresh
//! (`MountSegment`, not a re-mount) is empty, and by free ratio it would draw every new
//! replica at once. For the ramp's window its share is capped instead: of the replicas placed
//! in the cluster since it was mounted, it may have taken at most `ramp × fair`, where `ramp`
//! grows linearly from 0 to 1 over the window and `fair` is one over the mounted memory
//! segments. The strategy's walk skips it while it is at its cap, tested when the walk reaches
//! it ([`RampCaps`]), so a put costs the same however many segments ramp; the put's preferred
//! segments are never capped; and when the walk found fewer buffers than asked, a last walk
//! fills up on capped segments, so a ramp limits a share and never refuses a put that has no
//! other room (a cluster whose segments are all fresh accepts puts as before). A re-mount
//! (`ReMountSegment`: a master restart, an HA election) never ramps: those segments were in
//! the pool already, and the new leader's index is rebuilt from their re-mounts.
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
use super::segments::{Seg, SegRef};
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
        let mut got = self.try_place(now, size, want, cfg);
        if got.is_empty() && self.some_segment_could_hold(size, None) {
            let need = size.saturating_mul(want as u64);
            if self.evict(m, now, need) > 0 {
                got = self.try_place(now, size, want, cfg);
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
        self.count_placed(&got);
        Ok(got)
    }

    /// One replica of `size` bytes in a memory segment of host `host` (a reservation,
    /// `reserve.rs`), chosen by the strategy among them as [`State::place`] chooses among all,
    /// admission ramps included, and evicting as it does when none has room (a full pool is a
    /// cache's steady state; its puts make room this way).
    pub(crate) fn place_on_host(
        &mut self,
        m: &Metrics,
        now: u64,
        size: u64,
        host: &str,
    ) -> Result<Replica, ErrorCode> {
        if self.segs.live.is_empty() {
            return Err(ErrorCode::NoAvailableHandle);
        }
        let mut got = Vec::with_capacity(1);
        self.walk_capped(now, size, 1, Some(host), &mut got);
        if got.is_empty() && self.some_segment_could_hold(size, Some(host)) {
            if self.evict(m, now, size) > 0 {
                self.walk_capped(now, size, 1, Some(host), &mut got);
            }
            if got.is_empty() {
                self.need_eviction = true;
            }
        }
        let placed = got.pop().ok_or(ErrorCode::NoAvailableHandle)?;
        self.count_placed(std::slice::from_ref(&placed));
        Ok(placed)
    }

    /// [`State::walk`] under the admission ramps' caps, then, short of `want`, without them:
    /// a ramp limits a share, it never refuses (segments already chosen are skipped).
    fn walk_capped(
        &mut self,
        now: u64,
        size: u64,
        want: usize,
        host: Option<&str>,
        got: &mut Vec<Replica>,
    ) {
        let caps = self.ramp_caps(now);
        self.walk(size, want, &caps, host, got);
        if got.len() < want && caps.any() {
            self.walk(size, want, &RampCaps::default(), host, got);
        }
    }

    /// Counts placed replicas for the admission ramps.
    fn count_placed(&mut self, got: &[Replica]) {
        self.placed_replicas += got.len() as u64;
        for x in got {
            if let Some(ramp) = self.segs.get_mut(x.seg).and_then(|s| s.ramp.as_mut()) {
                ramp.taken += 1;
            }
        }
    }

    /// The admission ramps' caps for a placement now (module docs). Costs nothing per
    /// segment: a put used to test every segment's ramp up front (first against a list of the
    /// capped, quadratic in fresh segments: p50 927 µs at 20,000 of them; then into a bitmap,
    /// still a pass over every segment: 381 µs), `docs/scale.md`. A ramp whose own window is
    /// over caps nothing; [`State::end_ramps`] clears it at the next tick.
    fn ramp_caps(&mut self, now: u64) -> RampCaps {
        if self.ramps_until_ms == 0 || now >= self.ramps_until_ms {
            self.end_ramps(now);
            return RampCaps::default();
        }
        RampCaps {
            now,
            window: self.cfg.admission_ramp_ms,
            placed: self.placed_replicas,
            fair_of: self.segs.memory_len().max(1),
        }
    }

    /// Ends the admission ramps whose window is over (a pass over the segments, at a tick,
    /// while any ramp runs), so that the status page and the gauge show only running ones.
    pub(crate) fn end_ramps(&mut self, now: u64) {
        if self.ramps_until_ms == 0 {
            return;
        }
        let all_over = now >= self.ramps_until_ms;
        if all_over {
            self.ramps_until_ms = 0;
        }
        let window = self.cfg.admission_ramp_ms;
        for k in 0..self.segs.live.len() {
            let r = self.segs.at(self.segs.live[k]);
            if let Some(seg) = self.segs.get_mut(r) {
                let over = seg
                    .ramp
                    .is_some_and(|ramp| now.saturating_sub(ramp.from_ms) >= window);
                if all_over || over {
                    seg.ramp = None;
                }
            }
        }
    }

    /// Whether evicting could ever make room: some writable memory segment (of host `host`
    /// when given) is big enough.
    fn some_segment_could_hold(&self, size: u64, host: Option<&str>) -> bool {
        self.segs.iter().any(|s| {
            s.writable() && !s.is_disk() && s.size >= size && host.is_none_or(|h| s.host_id == h)
        })
    }

    fn try_place(
        &mut self,
        now: u64,
        size: u64,
        want: usize,
        cfg: &ReplicateConfig,
    ) -> Vec<Replica> {
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
        self.walk_capped(now, size, want, None, &mut got);
        got
    }

    /// The strategy's walk over the mounted segments (only those of host `host` when given)
    /// but those `caps` caps, adding to `got` up to `want` replicas.
    fn walk(
        &mut self,
        size: u64,
        want: usize,
        caps: &RampCaps,
        host: Option<&str>,
        got: &mut Vec<Replica>,
    ) {
        let skip = |s: &Seg| caps.caps(s) || host.is_some_and(|h| s.host_id != h);
        let n = self.segs.live.len();
        // Random walks `live` from a random start without allocating; FreeRatioFirst sorts.
        let (start, sorted) = match self.cfg.allocation_strategy {
            AllocationStrategy::Random => (self.next_random() as usize % n, Vec::new()),
            AllocationStrategy::FreeRatioFirst => {
                let mut v: Vec<(f64, u32)> = self
                    .segs
                    .iter_indexed()
                    .filter(|(_, s)| !s.is_disk() && !skip(s))
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
                return;
            }
            let r = nth(&self.segs, k);
            if self.segs.get(r).is_some_and(|s| !skip(s)) {
                skipped_for_host |= !self.try_segment(r, size, got, true);
            }
        }
        if skipped_for_host {
            for k in 0..n {
                if got.len() == want {
                    break;
                }
                let r = nth(&self.segs, k);
                if self.segs.get(r).is_some_and(|s| !skip(s)) {
                    self.try_segment(r, size, got, false);
                }
            }
        }
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

/// The admission ramps' caps as of one placement: whether a segment is at its cap is
/// computed from its own ramp when the walk reaches it, in constant time. The default caps
/// nothing.
#[derive(Clone, Copy, Default)]
struct RampCaps {
    now: u64,
    /// `--admission_ramp_sec` in ms; 0 in the default: nothing is capped.
    window: u64,
    /// `State::placed_replicas` now.
    placed: u64,
    /// The fair share is one over this many segments.
    fair_of: usize,
}

impl RampCaps {
    /// Whether a ramp may cap anything.
    fn any(&self) -> bool {
        self.window > 0
    }

    /// Whether `seg` is at its ramp's cap (module docs).
    fn caps(&self, seg: &Seg) -> bool {
        let Some(ramp) = seg.ramp.filter(|_| self.any()) else {
            return false;
        };
        let age = self.now.saturating_sub(ramp.from_ms);
        if age >= self.window {
            return false;
        }
        let share = age as f64 / self.window as f64 / self.fair_of as f64;
        let since = self.placed.saturating_sub(ramp.placed_at_start) + 1;
        (ramp.taken + 1) as f64 > share * since as f64
    }
}
