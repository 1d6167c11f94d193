//! Puts committed in one round trip (`reserve.rs`) through the public surface, on a manual
//! clock: a reservation is a range nobody else gets, invisible until committed; the commit is
//! first-writer-wins and hands out the next reservation; reservations end with their ttl (their
//! range parked as a discarded put's), their segment or their master.

use protocol::limits::{RESERVATIONS_PER_CLIENT_MAX, RESERVED_PUT_MAX_BYTES};
use protocol::message::*;
use protocol::*;

use super::*;
use crate::limits::RESERVATION_TTL_MS;
use crate::model::T;

const MIB: u64 = 1 << 20;
const C1: Uuid = Uuid { hi: 1, lo: 1 };
const C2: Uuid = Uuid { hi: 2, lo: 2 };

impl T {
    fn reserve(&self, client: Uuid, size: u64, seg: &str) -> Result<ReplicaDescriptor, ErrorCode> {
        self.call(
            Request::ReservePut,
            ReservePut {
                client_id: client,
                size,
                segment_name: seg.into(),
            },
        )
    }

    fn commit(
        &self,
        client: Uuid,
        key: &str,
        reserved: &ReplicaDescriptor,
        next: &str,
    ) -> Result<ReservedCommit, ErrorCode> {
        self.call(
            Request::CommitReservedPut,
            CommitReservedPut {
                client_id: client,
                key: key.into(),
                reserved: reserved.clone(),
                next_segment: next.into(),
            },
        )
    }

    fn replica_list(&self, key: &str) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        self.call(Request::GetReplicaList, GetReplicaList { key: key.into() })
            .map(|l| l.replicas)
    }

    fn mount_named(&self, n: u64, name: &str, size: u64) {
        self.call(
            Request::MountSegment,
            MountSegment {
                client_id: C1,
                segment: Segment {
                    id: Uuid::from_parts(100, n),
                    name: name.into(),
                    base: n << 40,
                    size,
                    te_endpoint: format!("{name}-te"),
                    protocol: "tcp".into(),
                    host_id: format!("host{n}"),
                    ..Default::default()
                },
            },
        )
        .unwrap();
    }

    fn gauge_reserved(&self) -> u64 {
        self.svc.gauges().reserved_bytes
    }
}

#[test]
fn a_reserved_range_is_nobodys_until_committed_in_one_call() {
    let t = T::new();
    t.mount_named(1, "a", 64 * MIB);
    t.mount_named(2, "b", 64 * MIB);
    let r = t.reserve(C1, 4096, "b").unwrap();
    assert_eq!((r.segment_name.as_str(), r.size), ("b", 4096));
    assert_eq!(r.status, ReplicaStatus::Processing);
    assert_eq!(t.gauge_reserved(), 4096);
    assert_eq!(t.svc.gauges().key_count, 0, "a reservation is no object");
    // Nobody else is placed over it.
    for i in 0..50 {
        let d = t.start(&format!("other{i}"), 4096).unwrap();
        assert!(
            d[0].segment_name != "b" || d[0].buffer_address != r.buffer_address,
            "a put got the reserved range"
        );
    }
    let c = t.commit(C1, "k", &r, "b").unwrap();
    assert!(c.version > r.version, "the commit's version is newer");
    let got = t.replica_list("k").unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].buffer_address, got[0].version, got[0].status),
        (r.buffer_address, c.version, ReplicaStatus::Complete)
    );
    // The answer carries the next reservation, of the same size, in the segment asked for.
    let next = c.next.expect("a next reservation");
    assert_eq!((next.segment_name.as_str(), next.size), ("b", 4096));
    assert_ne!(next.buffer_address, r.buffer_address);
    assert_eq!(t.gauge_reserved(), 4096);
    // A reservation commits once; another client cannot commit it.
    assert_eq!(t.commit(C1, "k2", &r, ""), Err(ErrorCode::ObjectNotFound));
    assert_eq!(
        t.commit(C2, "k2", &next, ""),
        Err(ErrorCode::ObjectNotFound)
    );
    // Without a next segment, no next reservation.
    assert_eq!(t.commit(C1, "k2", &next, "").unwrap().next, None);
    assert_eq!(t.gauge_reserved(), 0);
    let m = t.svc.metrics();
    assert_eq!(Metrics::get(&m.reservations_made), 2);
    assert_eq!(Metrics::get(&m.reservations_committed), 2);
}

#[test]
fn the_first_writer_wins_and_the_loser_keeps_its_reservation() {
    let t = T::new();
    t.mount_named(1, "a", 64 * MIB);
    let r = t.reserve(C1, 4096, "a").unwrap();
    // Written the usual way meanwhile.
    t.put("k", 4096);
    let before = t.replica_list("k").unwrap();
    assert_eq!(
        t.commit(C1, "k", &r, "a"),
        Err(ErrorCode::ObjectAlreadyExists)
    );
    assert_eq!(
        t.replica_list("k").unwrap(),
        before,
        "the first write stays"
    );
    // A put of the key in flight wins too.
    t.start("j", 4096).unwrap();
    assert_eq!(
        t.commit(C1, "j", &r, "a"),
        Err(ErrorCode::ObjectAlreadyExists)
    );
    assert_eq!(Metrics::get(&t.svc.metrics().reservations_refused), 2);
    // The reservation is still the loser's, for its next key.
    let c = t.commit(C1, "fresh", &r, "").unwrap();
    assert_eq!(t.replica_list("fresh").unwrap()[0].version, c.version);
    // And a reserved put's key refuses a later put.
    assert_eq!(t.start("fresh", 4096), Err(ErrorCode::ObjectAlreadyExists));
}

#[test]
fn bad_reservations_are_refused() {
    let t = T::new();
    t.mount_named(1, "a", 64 * MIB);
    assert_eq!(t.reserve(C1, 0, "a"), Err(ErrorCode::InvalidParams));
    assert_eq!(
        t.reserve(C1, RESERVED_PUT_MAX_BYTES + 1, "a"),
        Err(ErrorCode::InvalidParams)
    );
    assert_eq!(t.reserve(C1, 4096, "nope"), Err(ErrorCode::SegmentNotFound));
    for _ in 0..RESERVATIONS_PER_CLIENT_MAX {
        t.reserve(C1, 4096, "a").unwrap();
    }
    assert_eq!(t.reserve(C1, 4096, "a"), Err(ErrorCode::NoAvailableHandle));
    assert!(t.reserve(C2, 4096, "a").is_ok(), "the bound is per client");
    // A full segment: no room (and nothing to evict).
    t.mount_named(2, "small", MIB);
    t.reserve(C2, MIB, "small").unwrap();
    assert_eq!(
        t.reserve(C2, 4096, "small"),
        Err(ErrorCode::NoAvailableHandle)
    );
    // A forged reservation (wrong address, size or version) commits nothing.
    let r = t.reserve(C2, 4096, "a").unwrap();
    for forged in [
        ReplicaDescriptor {
            buffer_address: r.buffer_address + 4096,
            ..r.clone()
        },
        ReplicaDescriptor {
            size: 8192,
            ..r.clone()
        },
        ReplicaDescriptor {
            version: Version::ZERO,
            ..r.clone()
        },
        ReplicaDescriptor {
            segment_name: "small".into(),
            ..r.clone()
        },
    ] {
        assert_eq!(
            t.commit(C2, "k", &forged, ""),
            Err(ErrorCode::ObjectNotFound)
        );
    }
    assert_eq!(t.commit(C2, "", &r, ""), Err(ErrorCode::InvalidParams));
    assert!(!t.exist("k"));
}

#[test]
fn an_unused_reservation_ends_and_its_range_is_parked_like_a_discarded_puts() {
    let t = T::new();
    t.mount_named(1, "a", 64 * MIB);
    let r = t.reserve(C1, 4096, "a").unwrap();
    t.advance(RESERVATION_TTL_MS - 1);
    t.svc.tick();
    assert_eq!(t.gauge_reserved(), 4096);
    t.advance(1);
    t.svc.tick();
    assert_eq!(t.gauge_reserved(), 0);
    assert_eq!(t.commit(C1, "k", &r, ""), Err(ErrorCode::ObjectNotFound));
    // Parked until the release timeout after it was made (its writer may still be copying).
    assert_eq!(t.used(), 4096);
    t.advance(600_000 - RESERVATION_TTL_MS - 1);
    t.svc.tick();
    assert_eq!(t.used(), 4096);
    t.advance(1);
    t.svc.tick();
    assert_eq!(t.used(), 0);
}

#[test]
fn reservations_go_with_their_segment_and_their_master() {
    let t = T::new();
    t.mount_named(1, "a", 64 * MIB);
    let r = t.reserve(C1, 4096, "a").unwrap();
    t.call(
        Request::UnmountSegment,
        UnmountSegment {
            client_id: C1,
            segment_id: Uuid::from_parts(100, 1),
        },
    )
    .unwrap();
    assert_eq!(t.gauge_reserved(), 0);
    t.mount_named(1, "a", 64 * MIB);
    assert_eq!(t.commit(C1, "k", &r, ""), Err(ErrorCode::ObjectNotFound));
    // A new term (an election) knows none.
    let r = t.reserve(C1, 4096, "a").unwrap();
    t.svc.reset(7, &[]);
    t.mount_named(1, "a", 64 * MIB);
    assert_eq!(t.commit(C1, "k", &r, ""), Err(ErrorCode::ObjectNotFound));
    assert_eq!(t.gauge_reserved(), 0);
}
