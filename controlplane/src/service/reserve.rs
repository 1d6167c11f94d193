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
//! A reservation is not an object: no key, invisible to reads, listings, events and quotas
//! (the commit admits the key), never evicted. It lives [`RESERVATION_TTL_MS`]; then, as a
//! discarded put's buffers, its range stays parked until `put_start_release_timeout` after it
//! was made, since its client may still be writing. Its client uses it only for
//! [`protocol::limits::RESERVATION_USE_MS`], well within. An unmounted segment takes its
//! reservations with it; a new master (a restart, an election) has none, so a commit to it
//! fails and its writer puts the usual way (its bytes, of an ended term, were refused by the
//! owner's fence before their first byte).

use protocol::limits::{RESERVATIONS_PER_CLIENT_MAX, RESERVED_PUT_MAX_BYTES};
use protocol::{ErrorCode, ReplicaDescriptor, ReplicaStatus, Uuid, Version};

use crate::alloc::Span;
use crate::limits::RESERVATION_TTL_MS;

use super::metrics::Metrics;
use super::object::check_key;
use super::record::{Object, Replica};
use super::segments::SegRef;
use super::{State, Zombie};

/// One range reserved for a client's put of `size` bytes.
pub(crate) struct Reservation {
    pub seg: SegRef,
    pub span: Span,
    pub size: u64,
    /// The version the writer's intent and provisional record carry.
    pub version: Version,
    pub made_ms: u64,
}

impl State {
    /// `ReservePut`: reserves `size` bytes in the segment named for `client`'s next put of
    /// that size. Only there: the writer commits in one round trip only where it copies into
    /// the segment itself (a segment of its host), and asks for the segment it means. Room is
    /// made by eviction as for a put; none is `NO_AVAILABLE_HANDLE`, as is a client holding
    /// [`RESERVATIONS_PER_CLIENT_MAX`] already. Refused (`INVALID_PARAMS`) with tenant quotas,
    /// which charge keys the reservation does not have.
    pub(crate) fn reserve_put(
        &mut self,
        m: &Metrics,
        now: u64,
        client: Uuid,
        size: u64,
        segment: &str,
    ) -> Result<ReplicaDescriptor, ErrorCode> {
        if size == 0 || size > RESERVED_PUT_MAX_BYTES || self.quotas.is_some() {
            return Err(ErrorCode::InvalidParams);
        }
        let held = self.reservations.get(&client).map_or(0, Vec::len);
        if held >= RESERVATIONS_PER_CLIENT_MAX {
            return Err(ErrorCode::NoAvailableHandle);
        }
        let seg = self
            .segs
            .by_name(segment)
            .ok_or(ErrorCode::SegmentNotFound)?;
        let placed = self.place_in(m, now, seg, size)?;
        let r = Reservation {
            seg: placed.seg,
            span: placed.span,
            size,
            version: self.next_version(),
            made_ms: now,
        };
        let told = self.describe(&r).ok_or(ErrorCode::InternalError)?;
        self.reservations.entry(client).or_default().push(r);
        Metrics::inc(&m.reservations_made);
        Ok(told)
    }

    /// `CommitReservedPut`: `key` becomes a COMPLETE object in `client`'s reservation
    /// `reserved` (named as `ReservePut` answered it), at a new version, which is returned
    /// with the next reservation when `next_segment` names one and it could be made. The key
    /// existing (COMPLETE, or a put of it in flight) is `OBJECT_ALREADY_EXISTS` and leaves
    /// the reservation to the client; a reservation the master does not hold (expired, its
    /// segment gone, another master) is `OBJECT_NOT_FOUND`.
    pub(crate) fn commit_reserved_put(
        &mut self,
        m: &Metrics,
        now: u64,
        client: Uuid,
        key: String,
        reserved: &ReplicaDescriptor,
        next_segment: &str,
    ) -> Result<(Version, Option<ReplicaDescriptor>), ErrorCode> {
        check_key(&key)?;
        let at = self.find_reservation(client, reserved)?;
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
        let list = self
            .reservations
            .get_mut(&client)
            .ok_or(ErrorCode::InternalError)?;
        let r = list.swap_remove(at);
        if list.is_empty() {
            self.reservations.remove(&client);
        }
        let version = self.next_version();
        let writer = self.objects.writer_id(client);
        let replica = Replica {
            seg: r.seg,
            span: r.span,
            status: ReplicaStatus::Complete,
            on_disk: false,
        };
        let mut obj = Object::new(size, version, writer, now, vec![replica].into());
        // No lease after a put (as `put_end`): a fresh object may be removed at once.
        obj.set_read_lease_until(now);
        obj.set_last_read_ms(now);
        self.objects.insert_get(&key, obj);
        self.evict_epoch += 1;
        // Readable now: a KV-cache event says so, and eager offload copies it to disk.
        self.objects.completed(&key);
        self.offload_eager(now, &key);
        Metrics::inc(&m.reservations_committed);
        let next = (!next_segment.is_empty())
            .then(|| self.reserve_put(m, now, client, size, next_segment).ok())
            .flatten();
        Ok((version, next))
    }

    /// Where `client`'s reservation `reserved` is in its list.
    fn find_reservation(
        &self,
        client: Uuid,
        reserved: &ReplicaDescriptor,
    ) -> Result<usize, ErrorCode> {
        let list = self
            .reservations
            .get(&client)
            .ok_or(ErrorCode::ObjectNotFound)?;
        list.iter()
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
    /// be writing), as a discarded put's.
    pub(crate) fn expire_reservations(&mut self, now: u64) {
        let release = self.cfg.release_timeout_ms();
        let State {
            reservations,
            zombies,
            ..
        } = self;
        reservations.retain(|_, list| {
            list.retain(|r| {
                if r.made_ms.saturating_add(RESERVATION_TTL_MS) > now {
                    return true;
                }
                zombies.push(Zombie {
                    seg: r.seg,
                    span: r.span,
                    release_at_ms: r.made_ms.saturating_add(release),
                });
                false
            });
            !list.is_empty()
        });
    }

    /// Drops the reservations in segment `r`, which is being unmounted (their ranges go with
    /// it).
    pub(crate) fn drop_reservations_in(&mut self, r: SegRef) {
        self.reservations.retain(|_, list| {
            list.retain(|x| x.seg != r);
            !list.is_empty()
        });
    }

    /// Bytes reserved now.
    pub(crate) fn reserved_bytes(&self) -> u64 {
        self.reservations
            .values()
            .flatten()
            .map(|r| r.span.len)
            .sum()
    }
}
