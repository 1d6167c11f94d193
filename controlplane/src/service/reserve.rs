//! Ranges reserved ahead for a client's puts, so that a small put commits in one round trip.
//!
//! A put is two master round trips: `PutStart` (where to write) and `PutEnd` (the bytes are
//! in). A client that holds a range reserved for its next put of a size writes first and then
//! commits in one call, `CommitReservedPut`, whose answer carries its next reservation. The
//! master decides at the commit, not before: the key may have been written meanwhile (first
//! writer wins, and the reservation stays with the client for its next put), so the writer
//! records its bytes in the owner's catalog as *provisional* before the commit and confirms
//! them after it (`dataplane::recovery::catalog`, `docs/recovery.md`, "A put committed after
//! its bytes").
//!
//! Where: in a memory segment of the client's host (the writer commits in one round trip only
//! where it copies into the segment itself), chosen among that host's segments by the
//! allocation strategy, admission ramps included, evicting when they are full as a put does.
//!
//! A reservation is not an object: no key, invisible to reads, listings, events and quotas
//! (the commit admits the key), never evicted. It lives [`RESERVATION_TTL_MS`]; then, as a
//! discarded put's buffers, its range stays parked until `put_start_release_timeout` after it
//! was made, since its client may still be writing. Its client uses it only for
//! [`protocol::limits::RESERVATION_USE_MS`], well within. A segment that stops taking new
//! objects (draining, quarantined) refuses the commit of a reservation in it; an unmounted
//! segment takes its reservations with it; a new master (a restart, an election) has none, so
//! a commit to it fails and its writer puts the usual way (its bytes, of an ended term, were
//! refused by the owner's fence before their first byte).

use std::collections::VecDeque;

use protocol::limits::{RESERVATIONS_PER_CLIENT_MAX, RESERVED_PUT_MAX_BYTES};
use protocol::{ErrorCode, ReplicaDescriptor, ReplicaStatus, Uuid, Version};

use crate::alloc::Span;
use crate::limits::RESERVATION_TTL_MS;

use super::metrics::Metrics;
use super::object::check_key;
use super::record::{Object, Replica};
use super::segments::SegRef;
use super::{FastMap, State, Zombie};

/// Every client's reservations, and the ranges of expired ones, parked.
#[derive(Default)]
pub(crate) struct Reservations {
    by_client: FastMap<Uuid, Reserved>,
    parked: Vec<Zombie>,
}

/// A client's reservations, and its last commits, so that a commit sent again (its answer
/// lost with the connection, `client::master` sends it once more) is answered as the first
/// was rather than refused: its writer would then take the key for another's and leave its
/// bytes provisional, never re-reported.
#[derive(Default)]
pub(crate) struct Reserved {
    list: Vec<Reservation>,
    /// `(reserved version, committed version)`, newest last, at most
    /// [`RESERVATIONS_PER_CLIENT_MAX`].
    committed: VecDeque<(Version, Version)>,
    /// Time of its last reservation or commit.
    last_ms: u64,
}

/// One range reserved for a client's put of `size` bytes.
pub(crate) struct Reservation {
    seg: SegRef,
    span: Span,
    size: u64,
    /// The version the writer's intent and provisional record carry.
    version: Version,
    made_ms: u64,
}

impl State {
    /// `ReservePut`: reserves `size` bytes for `client`'s next put of that size, in a memory
    /// segment of host `host` (its own: the writer commits in one round trip only where it
    /// copies into the segment itself), chosen there by the allocation strategy, evicting as a
    /// put does when they are full. No room on the host even so is `NO_AVAILABLE_HANDLE`, as
    /// is a client holding [`RESERVATIONS_PER_CLIENT_MAX`] already: the writer puts the usual
    /// way, placed by the strategy over the whole pool. Refused
    /// (`INVALID_PARAMS`) with tenant quotas, which charge keys the reservation does not
    /// have, and for an empty host.
    pub(crate) fn reserve_put(
        &mut self,
        m: &Metrics,
        now: u64,
        client: Uuid,
        size: u64,
        host: &str,
    ) -> Result<ReplicaDescriptor, ErrorCode> {
        if size == 0 || size > RESERVED_PUT_MAX_BYTES || self.quotas.is_some() || host.is_empty() {
            return Err(ErrorCode::InvalidParams);
        }
        let held = self
            .reservations
            .by_client
            .get(&client)
            .map_or(0, |h| h.list.len());
        if held >= RESERVATIONS_PER_CLIENT_MAX {
            return Err(ErrorCode::NoAvailableHandle);
        }
        let placed = self.place_on_host(m, now, size, host)?;
        let r = Reservation {
            seg: placed.seg,
            span: placed.span,
            size,
            version: self.next_version(),
            made_ms: now,
        };
        let told = self.describe(&r).ok_or(ErrorCode::InternalError)?;
        let held = self.reservations.by_client.entry(client).or_default();
        held.list.push(r);
        held.last_ms = now;
        Metrics::inc(&m.reservations_made);
        Ok(told)
    }

    /// `CommitReservedPut`: `key` becomes a COMPLETE object in `client`'s reservation
    /// `reserved` (named as `ReservePut` answered it), at a new version, which is returned
    /// with the next reservation on host `next_host` when it is not empty and there was room
    /// (`ReservePut`). The key
    /// existing (COMPLETE, or a put of it in flight) is `OBJECT_ALREADY_EXISTS` and leaves
    /// the reservation to the client; a reservation the master does not hold (expired, its
    /// segment gone, another master) is `OBJECT_NOT_FOUND`, unless this very commit was
    /// executed already (then its answer again, without a next reservation).
    pub(crate) fn commit_reserved_put(
        &mut self,
        m: &Metrics,
        now: u64,
        client: Uuid,
        key: String,
        reserved: &ReplicaDescriptor,
        next_host: &str,
    ) -> Result<(Version, Option<ReplicaDescriptor>), ErrorCode> {
        check_key(&key)?;
        let at = match self.find_reservation(client, reserved) {
            Ok(at) => at,
            Err(e) => {
                let version = self.committed_before(client, &key, reserved).ok_or(e)?;
                return Ok((version, None));
            }
        };
        if !self.reservation_writable(client, at) {
            // Its segment began draining or was quarantined since: no put lands there now.
            // Its writer is done with it (it commits after its bytes), so it goes at once.
            self.drop_reservation(client, at);
            return Err(ErrorCode::ObjectNotFound);
        }
        if let Some(obj) = self.objects.get(&key) {
            if obj.has_complete()
                || now
                    < obj
                        .put_start_ms()
                        .saturating_add(self.cfg.discard_timeout_ms())
            {
                Metrics::inc(&m.reservations_refused);
                return Err(ErrorCode::ObjectAlreadyExists);
            }
            self.discard_put(m, &key);
        }
        let size = reserved.size;
        self.admit(m, now, &key, size, 0)?;
        let version = self.next_version();
        self.complete_reserved(m, now, client, at, &key, version)?;
        let next = (!next_host.is_empty())
            .then(|| self.reserve_put(m, now, client, size, next_host).ok())
            .flatten();
        Ok((version, next))
    }

    /// Makes `client`'s reservation `at` the COMPLETE object `key` at `version`.
    fn complete_reserved(
        &mut self,
        m: &Metrics,
        now: u64,
        client: Uuid,
        at: usize,
        key: &str,
        version: Version,
    ) -> Result<(), ErrorCode> {
        let held = self
            .reservations
            .by_client
            .get_mut(&client)
            .ok_or(ErrorCode::InternalError)?;
        let r = held.list.swap_remove(at);
        if held.committed.len() == RESERVATIONS_PER_CLIENT_MAX {
            held.committed.pop_front();
        }
        held.committed.push_back((r.version, version));
        held.last_ms = now;
        let writer = self.objects.writer_id(client);
        let replica = Replica {
            seg: r.seg,
            span: r.span,
            status: ReplicaStatus::Complete,
            on_disk: false,
        };
        let mut obj = Object::new(r.size, version, writer, now, vec![replica].into());
        // No lease after a put (as `put_end`): a fresh object may be removed at once.
        obj.set_read_lease_until(now);
        obj.set_last_read_ms(now);
        self.objects.insert_get(key, obj);
        self.evict_epoch += 1;
        // Readable now: a KV-cache event says so, and eager offload copies it to disk.
        self.objects.completed(key);
        self.offload_eager(now, key);
        Metrics::inc(&m.reservations_committed);
        Ok(())
    }

    /// The version of a commit sent again: `client` committed `reserved`, and `key` still
    /// holds that commit's version (`None` otherwise).
    fn committed_before(
        &self,
        client: Uuid,
        key: &str,
        reserved: &ReplicaDescriptor,
    ) -> Option<Version> {
        let held = self.reservations.by_client.get(&client)?;
        let &(_, version) = held
            .committed
            .iter()
            .find(|(r, _)| *r == reserved.version)?;
        let obj = self.objects.get(key)?;
        (obj.version == version).then_some(version)
    }

    /// Where `client`'s reservation `reserved` is in its list.
    fn find_reservation(
        &self,
        client: Uuid,
        reserved: &ReplicaDescriptor,
    ) -> Result<usize, ErrorCode> {
        let held = self
            .reservations
            .by_client
            .get(&client)
            .ok_or(ErrorCode::ObjectNotFound)?;
        held.list
            .iter()
            .position(|r| {
                r.span.addr == reserved.buffer_address
                    && r.size == reserved.size
                    && r.version == reserved.version
                    && self
                        .segs
                        .get(r.seg)
                        .is_some_and(|s| s.name == reserved.segment_name)
            })
            .ok_or(ErrorCode::ObjectNotFound)
    }

    /// Whether `client`'s reservation `at` is in a segment that takes new objects.
    fn reservation_writable(&self, client: Uuid, at: usize) -> bool {
        self.reservations
            .by_client
            .get(&client)
            .and_then(|held| held.list.get(at))
            .and_then(|r| self.segs.get(r.seg))
            .is_some_and(|s| s.writable())
    }

    /// Ends `client`'s reservation `at`, freeing its range now.
    fn drop_reservation(&mut self, client: Uuid, at: usize) {
        if let Some(held) = self.reservations.by_client.get_mut(&client) {
            if at < held.list.len() {
                let r = held.list.swap_remove(at);
                self.segs.free_span(r.seg, r.span);
            }
        }
    }

    /// The descriptor of a reservation, as its writer uses it (`None`: its segment is gone).
    fn describe(&self, r: &Reservation) -> Option<ReplicaDescriptor> {
        let seg = self.segs.get(r.seg)?;
        Some(ReplicaDescriptor {
            status: ReplicaStatus::Processing,
            medium: seg.medium,
            segment_name: seg.name.clone(),
            transport_endpoint: seg.te_endpoint.clone(),
            buffer_address: r.span.addr,
            size: r.size,
            version: r.version,
        })
    }

    /// Ends the reservations made [`RESERVATION_TTL_MS`] ago or earlier: their ranges are
    /// parked until `put_start_release_timeout` after they were made (their clients may still
    /// be writing), as a discarded put's, and freed then. A client quiet as long is forgotten.
    ///
    /// Parked apart from the other parked buffers: those may have readers, which a drain
    /// waits for, while nobody reads a reservation, and a late write into a segment that was
    /// drained and unmounted lands where nothing is placed any more.
    pub(crate) fn expire_reservations(&mut self, now: u64) {
        let release = self.cfg.release_timeout_ms();
        let State {
            reservations, segs, ..
        } = self;
        let Reservations { by_client, parked } = reservations;
        by_client.retain(|_, held| {
            held.list.retain(|r| {
                if r.made_ms.saturating_add(RESERVATION_TTL_MS) > now {
                    return true;
                }
                parked.push(Zombie {
                    seg: r.seg,
                    span: r.span,
                    release_at_ms: r.made_ms.saturating_add(release),
                });
                false
            });
            !held.list.is_empty() || held.last_ms.saturating_add(RESERVATION_TTL_MS) > now
        });
        parked.retain(|z| {
            if z.release_at_ms > now {
                return true;
            }
            segs.free_span(z.seg, z.span);
            false
        });
    }

    /// Drops the reservations in segment `r`, which is being unmounted (their ranges go with
    /// it).
    pub(crate) fn drop_reservations_in(&mut self, r: SegRef) {
        for held in self.reservations.by_client.values_mut() {
            held.list.retain(|x| x.seg != r);
        }
        self.reservations.parked.retain(|z| z.seg != r);
    }

    /// Bytes reserved now.
    pub(crate) fn reserved_bytes(&self) -> u64 {
        self.reservations
            .by_client
            .values()
            .flat_map(|held| &held.list)
            .map(|r| r.span.len)
            .sum()
    }
}
