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
use crate::view::AdminView;

const MIB: u64 = 1 << 20;
const C1: Uuid = Uuid { hi: 1, lo: 1 };
const C2: Uuid = Uuid { hi: 2, lo: 2 };

impl T {
    /// A reservation on the host of the segments mounted as `host` (see `mount_named`).
    fn reserve(&self, client: Uuid, size: u64, host: &str) -> Result<ReplicaDescriptor, ErrorCode> {
        self.call(
            Request::ReservePut,
            ReservePut {
                client_id: client,
                size,
                host_id: host.into(),
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
                next_host_id: next.into(),
            },
        )
    }

    fn replica_list(&self, key: &str) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        self.call(Request::GetReplicaList, GetReplicaList { key: key.into() })
            .map(|l| l.replicas)
    }

    /// Mounts segment `name` on host `name` (its own host, so that a reservation on host
    /// `name` lands in it), or, as `name@host`, on `host`.
    fn mount_named(&self, n: u64, name: &str, size: u64) {
        let (name, host) = name.split_once('@').unwrap_or((name, name));
        self.mount_on(C1, n, name, size, host);
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
    // A commit sent again (its answer lost) is answered as the first was; as another key,
    // or by another client, it commits nothing.
    let again = t.commit(C1, "k", &r, "b").unwrap();
    assert_eq!((again.version, again.next), (c.version, None));
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
    assert_eq!(t.reserve(C1, 4096, ""), Err(ErrorCode::InvalidParams));
    assert_eq!(
        t.reserve(C1, 4096, "nope"),
        Err(ErrorCode::NoAvailableHandle),
        "no segment on that host"
    );
    for _ in 0..RESERVATIONS_PER_CLIENT_MAX {
        t.reserve(C1, 4096, "a").unwrap();
    }
    assert_eq!(t.reserve(C1, 4096, "a"), Err(ErrorCode::NoAvailableHandle));
    assert!(t.reserve(C2, 4096, "a").is_ok(), "the bound is per client");
    // A full host, nothing on it evictable (hard-pinned): no room.
    t.mount_named(2, "small", 2 * RESERVED_PUT_MAX_BYTES);
    t.put_cfg(
        "filler",
        RESERVED_PUT_MAX_BYTES,
        ReplicateConfig {
            preferred_segment: "small".into(),
            with_hard_pin: true,
            ..Default::default()
        },
    );
    t.reserve(C2, RESERVED_PUT_MAX_BYTES, "small").unwrap();
    assert_eq!(
        t.reserve(C2, 4096, "small"),
        Err(ErrorCode::NoAvailableHandle)
    );
    assert!(t.exist("filler"));
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

#[test]
fn a_reservation_goes_to_the_clients_host_where_the_strategy_picks() {
    let t = T::with(ServiceConfig {
        allocation_strategy: AllocationStrategy::FreeRatioFirst,
        ..crate::model::cfg()
    });
    t.mount_named(1, "x1@h", 64 * MIB);
    t.mount_named(2, "x2@h", 64 * MIB);
    t.mount_named(3, "far@other", 64 * MIB);
    // The fullest of the host's two segments is avoided: the strategy decides among them.
    t.put_cfg(
        "filler",
        32 * MIB,
        ReplicateConfig {
            preferred_segment: "x1".into(),
            ..Default::default()
        },
    );
    let mut on = std::collections::BTreeMap::<String, usize>::new();
    let mut r = t.reserve(C1, 4096, "h").unwrap();
    for i in 0..20 {
        *on.entry(r.segment_name.clone()).or_default() += 1;
        r = t
            .commit(C1, &format!("k{i}"), &r, "h")
            .unwrap()
            .next
            .unwrap();
    }
    assert_eq!(on.get("x2"), Some(&20), "{on:?}");
    assert_eq!(on.get("far"), None, "never another host's segment");
}

#[test]
fn a_reservation_in_a_segment_that_began_draining_commits_nothing_there() {
    let t = T::new();
    t.mount_named(1, "a", 64 * MIB);
    let r = t.reserve(C1, 4096, "a").unwrap();
    let used = t.used();
    let drain = AdminView::drain_segment(&t.svc, "a", 60_000);
    assert!(drain.is_ok(), "{drain:?}");
    assert_eq!(t.commit(C1, "k", &r, "a"), Err(ErrorCode::ObjectNotFound));
    assert!(!t.exist("k"));
    assert_eq!(t.used(), used - 4096, "its range is freed at once");
    assert_eq!(t.gauge_reserved(), 0);
    assert_eq!(t.reserve(C1, 4096, "a"), Err(ErrorCode::NoAvailableHandle));
}

#[test]
fn an_expired_reservation_holds_no_drain_back() {
    let t = T::new();
    t.mount_named(1, "a", 64 * MIB);
    t.reserve(C1, 4096, "a").unwrap();
    t.advance(RESERVATION_TTL_MS);
    t.svc.tick();
    assert_eq!(t.used(), 4096, "parked");
    AdminView::drain_segment(&t.svc, "a", 60_000).unwrap();
    t.advance(1000);
    t.svc.tick();
    assert_eq!(Metrics::get(&t.svc.metrics().drains_completed), 1);
    assert!(t.svc.all_segments().is_empty());
}

#[test]
fn a_full_host_makes_room_for_a_reservation_as_for_a_put() {
    let t = T::new();
    t.mount_named(1, "a", MIB);
    for i in 0..4 {
        t.put(&format!("old{i}"), MIB / 4);
    }
    assert_eq!(t.used(), MIB);
    let r = t.reserve(C1, 4096, "a").expect("room made by eviction");
    assert!(
        (0..4).any(|i| !t.exist(&format!("old{i}"))),
        "an old object went"
    );
    t.commit(C1, "k", &r, "").unwrap();
    assert!(t.exist("k"));
}
