//! A small put in one master round trip.
//!
//! A put asks the master where to write (`PutStart`), writes, and commits (`PutEnd`): two
//! round trips to the master, where a get makes one. Here the client holds a range the master
//! reserved for its next put of a size (`ReservePut`), writes the bytes there, and commits them
//! as the key in one call (`CommitReservedPut`), whose answer carries the next reservation; so
//! a client that keeps putting one size (KV-cache pages are one size) pays one round trip a
//! put after its first (`controlplane::service::reserve`).
//!
//! The master decides at the commit, after the bytes are in: the key may have been written
//! meanwhile (first writer wins, the reservation stays ours for the next put). So the bytes
//! are recorded in the owner's catalog as *provisional* (never re-reported), and only once the
//! master answered does their commit make them the object there (`Catalog::commit`, which a
//! removal or a reuse of the range that got there first leaves with nothing to do). The put
//! returns after that commit record is published, so an acknowledged put is catalogued as
//! before (`docs/recovery.md`, "A put committed after its bytes").
//!
//! When: a `put` (not an upsert) of 1 byte to `RESERVED_PUT_MAX_BYTES`, of a size among the
//! last few puts' (a size that does not repeat would leave its next reservation unused), with
//! the default placement (one replica, no pins, no preferred segment or group), outside a
//! named tenant, into a segment this process writes by memcpy whose owner takes provisional
//! records (our own segment, or a same-host owner offering version 5). The master places the
//! reservation among the memory segments of this client's host (their `host_id`, its
//! address) by its allocation strategy, admission ramps included. Such puts so land on this
//! host's segments, as `prefer_alloc_in_same_node` places a batch (a full host makes room by
//! eviction, as for a put); a host with no room even so (or no segment yet: a node still
//! starting) sends the puts the usual way, over the whole pool, for 10 ms, then twice as long
//! each time it still has none, up to a second, or until a usual put is placed on this host.
//! Anything else, or any refusal but the key's existence, takes the usual path, with nothing
//! committed; a master that does not know the calls (an older one)
//! or refuses them (tenant quotas) is not asked again for a minute.
//! `MC_STORE_RESERVED_PUT=0` turns it off.
//!
//! A reservation is used at most `RESERVATION_USE_MS` after it was asked for (counted from
//! before the request went out); the master keeps it twice as long, then parks its range.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use dataplane::mem::ShmMapping;
use parking_lot::Mutex;
use protocol::limits::{RESERVATION_USE_MS, RESERVED_PUT_MAX_BYTES};
use protocol::message::{CommitReservedPut, ReservePut};
use protocol::{
    ErrorCode, ObjectDataType, ReplicaDescriptor, ReplicateConfig, ReservedCommit, SoftPinAction,
};

use super::peers::WriteItem;
use super::{Src, Store, StoreError};
use crate::limits::{
    RESERVED_PUT_FULL_PAUSE, RESERVED_PUT_FULL_PAUSE_FIRST, RESERVED_PUT_REFUSED_PAUSE,
};

/// Sizes of the last puts that may commit in one round trip: a put of a size among them
/// does, so that a client putting sizes that do not repeat reserves nothing it would not use.
const RECENT_SIZES: usize = 8;

/// See the module docs.
pub(super) struct Reservations {
    on: bool,
    held: Mutex<Vec<Held>>,
    /// The sizes of the last puts that fit, newest last ([`RECENT_SIZES`]).
    recent: Mutex<Vec<u64>>,
    /// Not asked before then: the master refused the calls, or had no room on this host.
    paused: Mutex<Option<Pause>>,
    /// The next pause after the master had no room on this host: doubles from
    /// [`RESERVED_PUT_FULL_PAUSE_FIRST`] to [`RESERVED_PUT_FULL_PAUSE`], back to the first
    /// once a reservation is given.
    full_pause: Mutex<Duration>,
}

/// A pause of the one-round-trip path: until when, and whether it is for "no room on this
/// host", which a usual put placed on this host ends.
#[derive(Clone, Copy)]
struct Pause {
    until: Instant,
    for_room: bool,
}

/// One reservation, and when it was asked for.
struct Held {
    replica: ReplicaDescriptor,
    asked_at: Instant,
    /// The same-host mapping of its segment when it came (`None`: our own segment, or none
    /// yet): a process that took over the endpoint since is another owner, whose memory the
    /// reserved address may name for another object. Weak, so that a held reservation does
    /// not keep a dead owner's segment mapped.
    owner: Option<Weak<ShmMapping>>,
}

impl Default for Reservations {
    fn default() -> Self {
        Reservations {
            on: protocol::env::flag("MC_STORE_RESERVED_PUT", true),
            held: Mutex::new(Vec::new()),
            recent: Mutex::new(Vec::with_capacity(RECENT_SIZES)),
            paused: Mutex::new(None),
            full_pause: Mutex::new(RESERVED_PUT_FULL_PAUSE_FIRST),
        }
    }
}

impl Reservations {
    /// Whether a put of `size` bytes with `cfg` may commit in one round trip (module docs): a
    /// config the master would take as the default, checked here since no `PutStart` checks
    /// it (a ttl without `ENABLE` is the master's `INVALID_PARAMS`, so the usual path says so).
    fn fits(&self, size: u64, cfg: &ReplicateConfig) -> bool {
        self.on
            && (1..=RESERVED_PUT_MAX_BYTES).contains(&size)
            && cfg.replica_num == 1
            && cfg.soft_pin_action != SoftPinAction::Enable
            && cfg.soft_pin_ttl_ms.is_none()
            && !cfg.with_hard_pin
            && !cfg.prefer_alloc_in_same_node
            && cfg.preferred_segment.is_empty()
            && cfg.preferred_segments.is_empty()
            && cfg.group_ids.is_empty()
            && cfg.data_type == ObjectDataType::Unknown
            && self.paused.lock().is_none_or(|p| Instant::now() >= p.until)
    }

    /// Whether a put of `size` bytes came among the last few (and notes this one).
    fn repeats(&self, size: u64) -> bool {
        let mut recent = self.recent.lock();
        if let Some(at) = recent.iter().position(|&s| s == size) {
            recent.remove(at);
            recent.push(size);
            return true;
        }
        if recent.len() == RECENT_SIZES {
            recent.remove(0);
        }
        recent.push(size);
        false
    }

    /// A usable reservation of `size` bytes, taken (no other put uses it meanwhile).
    fn take(&self, size: u64) -> Option<Held> {
        let mut held = self.held.lock();
        let use_for = Duration::from_millis(RESERVATION_USE_MS);
        held.retain(|h| h.asked_at.elapsed() < use_for);
        let at = held.iter().position(|h| h.replica.size == size)?;
        Some(held.swap_remove(at))
    }

    fn give(&self, h: Held) {
        self.held.lock().push(h);
    }

    /// Not asked again for a while after the master had no room on this host: the first
    /// time since a reservation came briefly, then twice as long each time
    /// ([`Reservations::full_pause`]).
    fn pause_full(&self) {
        let pause = {
            let mut next = self.full_pause.lock();
            let now = *next;
            *next = (now * 2).min(RESERVED_PUT_FULL_PAUSE);
            now
        };
        self.pause_for(pause, true);
    }

    /// A reservation came: the next "no room" pauses briefly again.
    fn reserved(&self) {
        *self.full_pause.lock() = RESERVED_PUT_FULL_PAUSE_FIRST;
    }

    /// A usual put was placed where `on_this_host` says (asked only during a pause for
    /// "no room"): if on this host, there is room here now (the node that had not mounted yet
    /// has), and the pause ends.
    pub(super) fn room_seen(&self, on_this_host: impl FnOnce() -> bool) {
        let mut paused = self.paused.lock();
        if paused.is_some_and(|p| p.for_room) && on_this_host() {
            *paused = None;
            drop(paused);
            self.reserved();
        }
    }

    /// Not asked again for `pause`, and the reservations held let go (the master parks them).
    fn pause(&self, pause: Duration) {
        self.pause_for(pause, false);
    }

    /// [`Self::pause`], `for_room` saying whether it is for "no room on this host".
    fn pause_for(&self, pause: Duration, for_room: bool) {
        *self.paused.lock() = Some(Pause {
            until: Instant::now() + pause,
            for_room,
        });
        self.held.lock().clear();
    }
}

impl Store {
    /// Whether replica `r` is in a segment of this client's host (its endpoint's address is
    /// ours, as the master's `host_id` of a node on this host is), where reservations go.
    pub(super) fn on_this_host(&self, r: &ReplicaDescriptor) -> bool {
        r.transport_endpoint
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.ip() == self.ip)
    }

    /// Whether this process writes `h`'s range by memcpy into a segment whose owner takes
    /// provisional records and their commits, and is the owner it was reserved from.
    fn writes_in_place(&self, h: &Held) -> bool {
        let r = &h.replica;
        if self.peers.is_local(r) {
            return true;
        }
        self.peers
            .shared_segment(&r.transport_endpoint)
            .is_some_and(|m| {
                h.owner
                    .as_ref()
                    .is_some_and(|o| Weak::ptr_eq(o, &Arc::downgrade(&m)))
                    && m.takes_commits()
                    && m.translate(r.buffer_address, r.size).is_some()
            })
    }

    /// A reservation that came now, with its segment's owner as this process sees it.
    fn held(&self, replica: ReplicaDescriptor, asked_at: Instant) -> Held {
        let owner = self
            .peers
            .known_shared_segment(&replica.transport_endpoint)
            .map(|m| Arc::downgrade(&m));
        Held {
            replica,
            asked_at,
            owner,
        }
    }

    /// Puts `key` in one round trip (module docs). `None`: the usual path is to run, nothing
    /// was committed.
    pub(super) fn put_reserved(
        &self,
        key: &str,
        parts: &[Src<'_>],
        size: u64,
        cfg: &ReplicateConfig,
    ) -> Option<Result<(), StoreError>> {
        let res = &self.reservations;
        if !res.fits(size, cfg)
            || self.master.tenanted()
            || !self.peers.copies_in_place()
            || !res.repeats(size)
        {
            return None;
        }
        let host = self.ip.to_string();
        let held = match res.take(size) {
            Some(h) => h,
            None => self.reserve(size, &host)?,
        };
        if !self.writes_in_place(&held) {
            // A segment of this host we cannot copy into (its owner predates provisional
            // records, does not share its memory, or is not the process it was reserved
            // from): not asked again for a while.
            tracing::debug!(
                "put {key}: reserved on {}, which this process does not copy into; the usual way",
                held.replica.segment_name
            );
            res.pause(RESERVED_PUT_REFUSED_PAUSE);
            return None;
        }
        let item = WriteItem {
            replica: &held.replica,
            parts,
            key,
            hard_pin: false,
            soft_pin_ttl_ms: None,
            provisional: true,
        };
        if let Some(Err(e)) = self.peers.write_many(&[item]).pop() {
            tracing::debug!("put {key}: the reserved range took no bytes ({e}); the usual way");
            return None;
        }
        let asked_at = Instant::now();
        let answer = self.master.call(&CommitReservedPut {
            client_id: self.client_id,
            key: key.to_string(),
            reserved: held.replica.clone(),
            next_host_id: host,
        });
        self.committed(key, held, asked_at, answer)
    }

    /// The put of `key` in reservation `held` after the master's answer to its commit (asked
    /// at `asked_at`): done once the commit record is published, done if the key was there
    /// first, `None` (the usual path) if nothing was committed.
    fn committed(
        &self,
        key: &str,
        held: Held,
        asked_at: Instant,
        answer: Result<Result<ReservedCommit, ErrorCode>, crate::ClientError>,
    ) -> Option<Result<(), StoreError>> {
        let res = &self.reservations;
        match answer {
            Ok(Ok(c)) => {
                if let Some(next) = c.next {
                    res.give(self.held(next, asked_at));
                }
                let confirmed = self.peers.confirm(&held.replica, key, c.version);
                Some(confirmed.map_err(|e| e.context(format_args!("put {key}"))))
            }
            // First writer wins: the key is there, and the range is still ours.
            Ok(Err(ErrorCode::ObjectAlreadyExists)) => {
                res.give(held);
                Some(Ok(()))
            }
            Ok(Err(ErrorCode::InvalidParams)) => {
                res.pause(RESERVED_PUT_REFUSED_PAUSE);
                None
            }
            // Not committed (the reservation ended, its segment went, a new master).
            Ok(Err(_)) => None,
            // Maybe committed, its record not published: not acknowledged.
            Err(e) => Some(Err(StoreError::new(e.code(), e.to_string()).context(
                format_args!("put {key}: commit at master {}", self.master.addr()),
            ))),
        }
    }

    /// A new reservation of `size` bytes on this client's host `host`; `None` when the master
    /// has none to give (no room there, too many held) or refuses the call (then it is not
    /// asked for a while).
    fn reserve(&self, size: u64, host: &str) -> Option<Held> {
        let asked_at = Instant::now();
        let answer = self.master.call(&ReservePut {
            client_id: self.client_id,
            size,
            host_id: host.to_string(),
        });
        match answer {
            Ok(Ok(replica)) => {
                self.reservations.reserved();
                Some(self.held(replica, asked_at))
            }
            Ok(Err(ErrorCode::InvalidParams)) => {
                tracing::debug!("the master refuses reserved puts; not asked for a minute");
                self.reservations.pause(RESERVED_PUT_REFUSED_PAUSE);
                None
            }
            // No room on this host (or no segment yet): the usual puts place (and evict)
            // over the whole pool for a while, rather than each paying a refused call first.
            Ok(Err(ErrorCode::NoAvailableHandle)) => {
                self.reservations.pause_full();
                None
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// "No room on this host" pauses the one-round-trip path for 10 ms first, then twice as
    /// long each time, at most a second; a reservation given starts over.
    #[test]
    fn no_room_pauses_briefly_first_then_doubling_to_a_second() {
        let r = Reservations::default();
        let cfg = ReplicateConfig::default();
        assert!(r.fits(4096, &cfg));
        r.pause_full();
        assert!(!r.fits(4096, &cfg), "paused");
        std::thread::sleep(RESERVED_PUT_FULL_PAUSE_FIRST + Duration::from_millis(5));
        assert!(r.fits(4096, &cfg), "the first pause is short");
        let mut want = RESERVED_PUT_FULL_PAUSE_FIRST * 2;
        for _ in 0..10 {
            assert_eq!(*r.full_pause.lock(), want);
            r.pause_full();
            want = (want * 2).min(RESERVED_PUT_FULL_PAUSE);
        }
        assert_eq!(*r.full_pause.lock(), RESERVED_PUT_FULL_PAUSE, "capped");
        let until = r.paused.lock().unwrap().until;
        assert!(until > Instant::now() + RESERVED_PUT_FULL_PAUSE / 2);
        r.reserved();
        assert_eq!(*r.full_pause.lock(), RESERVED_PUT_FULL_PAUSE_FIRST);
        // A put placed on this host ends a pause for room, not one for a refusal.
        r.pause_full();
        r.pause_full();
        assert!(!r.fits(4096, &cfg));
        r.room_seen(|| false);
        assert!(
            !r.fits(4096, &cfg),
            "a put placed elsewhere shows no room here"
        );
        r.room_seen(|| true);
        assert!(r.fits(4096, &cfg), "room seen");
        assert_eq!(*r.full_pause.lock(), RESERVED_PUT_FULL_PAUSE_FIRST);
        r.pause(RESERVED_PUT_REFUSED_PAUSE);
        r.room_seen(|| true);
        assert!(!r.fits(4096, &cfg), "a refusal's pause stays");
    }
}
