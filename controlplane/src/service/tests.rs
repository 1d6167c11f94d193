//! State-machine tests through the public surface: requests in, reply bytes decoded with the
//! protocol types (so the hand-written encoders are held to the wire format), the clock moved
//! by hand.

use std::sync::Arc;

use protocol::message::*;
use protocol::wire::Wire;
use protocol::*;

use super::*;
use crate::clock::ManualClock;
use crate::model::{cfg, T};
use crate::view::AdminView;

pub(super) const MIB: u64 = 1 << 20;
pub(super) const C1: Uuid = Uuid { hi: 1, lo: 1 };
pub(super) const C2: Uuid = Uuid { hi: 2, lo: 2 };

fn liveness_cfg() -> ServiceConfig {
    ServiceConfig {
        client_ttl_s: 10,
        ..cfg()
    }
}

/// The calls the unit tests make beyond the model's (`crate::model::T`).
impl T {
    /// Mounts segment `name` of `client` on `host` (`n` picks its id and base address).
    pub(super) fn mount_on(&self, client: Uuid, n: u64, name: &str, size: u64, host: &str) -> Uuid {
        let id = Uuid::from_parts(100, n);
        let seg = Segment {
            id,
            name: name.into(),
            base: n << 40,
            size,
            te_endpoint: format!("{name}-te"),
            protocol: "tcp".into(),
            host_id: host.into(),
            ..Default::default()
        };
        let r = self.call(
            Request::MountSegment,
            MountSegment {
                client_id: client,
                segment: seg,
            },
        );
        assert_eq!(r, Ok(()));
        id
    }

    pub(super) fn mount(&self, n: u64, size: u64) -> Uuid {
        self.mount_on(C1, n, &format!("seg{n}"), size, &format!("host{n}"))
    }

    pub(super) fn start(&self, key: &str, size: u64) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
        self.start_with(C1, key, size, ReplicateConfig::default())
    }

    pub(super) fn put(&self, key: &str, size: u64) -> Vec<ReplicaDescriptor> {
        let d = self.start(key, size).expect("put start");
        self.end(C1, key).expect("put end");
        d
    }

    pub(super) fn put_cfg(&self, key: &str, size: u64, config: ReplicateConfig) {
        self.start_with(C1, key, size, config).expect("put start");
        self.end(C1, key).expect("put end");
    }

    pub(super) fn exist(&self, key: &str) -> bool {
        self.call(Request::ExistKey, ExistKey { key: key.into() })
            .unwrap()
    }

    pub(super) fn remove(&self, key: &str, force: bool) -> Result<(), ErrorCode> {
        self.call(
            Request::Remove,
            Remove {
                key: key.into(),
                force,
            },
        )
        .map(|_| ())
    }

    pub(super) fn used(&self) -> u64 {
        self.svc.gauges().allocated_bytes
    }
}

// ---- Readiness, ping, mount ------------------------------------------------------------

#[test]
fn service_ready_reports_version() {
    let t = T::new();
    let v = t.call(Request::ServiceReady, ServiceReady {}).unwrap();
    assert!(v.starts_with("mooncake-rs "), "{v}");
    assert_eq!(v, VERSION);
}

#[test]
fn ping_unknown_client_needs_remount_until_remounted() {
    let t = T::with(liveness_cfg());
    let ping = || {
        t.call(Request::Ping, Ping { client_id: C2 })
            .unwrap()
            .status
    };
    assert_eq!(ping(), ClientStatus::NeedRemount);
    // A pure reader re-mounts an empty list, which registers it.
    let r = t.call(
        Request::ReMountSegment,
        ReMountSegment {
            client_id: C2,
            segments: vec![],
            held: vec![],
        },
    );
    assert_eq!(r, Ok(()));
    assert_eq!(ping(), ClientStatus::Ok);
    // Pings keep it alive past the TTL...
    for _ in 0..15 {
        t.advance(1000);
        t.svc.tick();
        assert_eq!(ping(), ClientStatus::Ok);
    }
    // ...silence expires it.
    t.advance(10_000);
    t.svc.tick();
    assert_eq!(ping(), ClientStatus::NeedRemount);
    assert_eq!(Metrics::get(&t.svc.metrics().expired_clients), 1);
}

#[test]
fn mount_is_idempotent_and_names_are_unique() {
    let t = T::new();
    let id = t.mount(1, 64 * MIB);
    let seg = |id: Uuid, name: &str, size: u64| Segment {
        id,
        name: name.into(),
        base: 1 << 40,
        size,
        te_endpoint: "e".into(),
        protocol: "tcp".into(),
        host_id: String::new(),
        ..Default::default()
    };
    let mount = |client: Uuid, s: Segment| {
        t.call(
            Request::MountSegment,
            MountSegment {
                client_id: client,
                segment: s,
            },
        )
    };
    assert_eq!(mount(C1, seg(id, "seg1", 64 * MIB)), Ok(()));
    assert_eq!(
        mount(C1, seg(Uuid::from_parts(9, 9), "seg1", MIB)),
        Err(ErrorCode::SegmentAlreadyExists)
    );
    assert_eq!(
        mount(C1, seg(id, "other", MIB)),
        Err(ErrorCode::SegmentAlreadyExists)
    );
    assert_eq!(
        mount(C2, seg(id, "seg1", MIB)),
        Err(ErrorCode::SegmentAlreadyExists)
    );
    assert_eq!(
        mount(C1, seg(Uuid::from_parts(9, 9), "z", 0)),
        Err(ErrorCode::InvalidParams)
    );
    let mut overflow = seg(Uuid::from_parts(9, 8), "y", MIB);
    overflow.base = u64::MAX - 10;
    assert_eq!(mount(C1, overflow), Err(ErrorCode::InvalidParams));
    assert_eq!(t.svc.all_segments(), vec!["seg1".to_string()]);
    assert_eq!(t.svc.metrics().op_counts(Op::MountSegment), (7, 5));
}

// ---- Put lifecycle ---------------------------------------------------------------------

#[test]
fn put_start_validates_parameters() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let bad = |key: &str, size: u64, c: ReplicateConfig| {
        assert_eq!(
            t.start_with(C1, key, size, c),
            Err(ErrorCode::InvalidParams),
            "{key:?} {size}"
        );
    };
    let d = ReplicateConfig::default;
    bad("", 10, d());
    bad(&"k".repeat(limits::KEY_MAX_BYTES + 1), 10, d());
    bad("k", 0, d());
    bad(
        "k",
        10,
        ReplicateConfig {
            replica_num: 0,
            ..d()
        },
    );
    bad(
        "k",
        10,
        ReplicateConfig {
            prefer_alloc_in_same_node: true,
            ..d()
        },
    );
    for action in [SoftPinAction::Preserve, SoftPinAction::Disable] {
        bad(
            "k",
            10,
            ReplicateConfig {
                soft_pin_action: action,
                soft_pin_ttl_ms: Some(1000),
                ..d()
            },
        );
    }
    bad(
        "k",
        10,
        ReplicateConfig {
            soft_pin_action: SoftPinAction::Enable,
            soft_pin_ttl_ms: Some(cfg().max_kv_soft_pin_ttl_ms + 1),
            ..d()
        },
    );
    // The longest legal key is fine.
    assert!(t.start(&"k".repeat(limits::KEY_MAX_BYTES), 10).is_ok());
    assert_eq!(t.svc.metrics().op_counts(Op::PutStart), (9, 8));
}

#[test]
fn put_lifecycle_processing_then_complete() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let d = t.start("k", 5000).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].status, ReplicaStatus::Processing);
    assert_eq!(d[0].segment_name, "seg1");
    assert_eq!(d[0].transport_endpoint, "seg1-te");
    assert_eq!(d[0].size, 5000);
    assert!(d[0].buffer_address >= 1 << 40);
    assert_eq!(t.get("k"), Err(ErrorCode::ReplicaIsNotReady));
    assert!(!t.exist("k"));
    assert_eq!(t.svc.query_key("k"), Err(ErrorCode::ReplicaIsNotReady));
    t.end(C1, "k").unwrap();
    let l = t.get("k").unwrap();
    assert_eq!(
        l.lease_ttl_ms,
        500 - object::READ_WINDOW_SLACK_MS,
        "the reader's window"
    );
    assert_eq!(l.replicas.len(), 1);
    assert_eq!(l.replicas[0].status, ReplicaStatus::Complete);
    assert_eq!(l.replicas[0].buffer_address, d[0].buffer_address);
    assert!(t.exist("k"));
    assert_eq!(t.get("nope"), Err(ErrorCode::ObjectNotFound));
    assert!(!t.exist("nope"));
    assert_eq!(t.end(C1, "k"), Ok(()), "a repeated PutEnd is harmless");
}

#[test]
fn put_end_sets_no_lease() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.put("k", 100);
    assert_eq!(t.remove("k", false), Ok(()));
    assert_eq!(t.used(), 0);
}

#[test]
fn first_writer_wins_and_stale_puts_are_discarded() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let first = t
        .start_with(C1, "k", 8192, ReplicateConfig::default())
        .unwrap();
    assert_eq!(
        t.start_with(C2, "k", 8192, ReplicateConfig::default()),
        Err(ErrorCode::ObjectAlreadyExists)
    );
    t.advance(29_999);
    assert_eq!(
        t.start_with(C2, "k", 8192, ReplicateConfig::default()),
        Err(ErrorCode::ObjectAlreadyExists)
    );
    t.advance(1);
    // The first put is 30 s old: discarded, but its buffer is kept for the old writer.
    let second = t
        .start_with(C2, "k", 8192, ReplicateConfig::default())
        .unwrap();
    assert_ne!(first[0].buffer_address, second[0].buffer_address);
    assert_eq!(Metrics::get(&t.svc.metrics().put_start_discards), 1);
    assert_eq!(t.used(), 2 * 8192);
    assert_eq!(t.end(C1, "k"), Err(ErrorCode::IllegalClient));
    t.end(C2, "k").unwrap();
    assert_eq!(
        t.start_with(C1, "k", 8192, ReplicateConfig::default()),
        Err(ErrorCode::ObjectAlreadyExists)
    );
    // The discarded buffer goes back 600 s after its put started.
    t.advance(569_999);
    t.svc.tick();
    assert_eq!(t.used(), 2 * 8192);
    t.advance(1);
    t.svc.tick();
    assert_eq!(t.used(), 8192);
    assert_eq!(Metrics::get(&t.svc.metrics().put_start_releases), 1);
}

#[test]
fn tick_discards_abandoned_puts_and_later_frees_them() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.start("abandoned", 4096).unwrap();
    t.put("done", 4096);
    t.advance(29_000);
    t.svc.tick();
    assert!(t.svc.all_keys().contains(&"abandoned".to_string()));
    t.advance(2_000);
    t.svc.tick();
    assert_eq!(t.svc.all_keys(), vec!["done".to_string()]);
    assert_eq!(t.end(C1, "abandoned"), Err(ErrorCode::ObjectNotFound));
    assert_eq!(t.used(), 8192, "buffer parked, not freed");
    t.advance(600_000);
    t.svc.tick();
    assert_eq!(t.used(), 4096);
}

#[test]
fn put_end_and_revoke_errors() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    assert_eq!(t.end(C1, "k"), Err(ErrorCode::ObjectNotFound));
    assert_eq!(t.revoke(C1, "k"), Err(ErrorCode::ObjectNotFound));
    t.start("k", 100).unwrap();
    assert_eq!(t.end(C2, "k"), Err(ErrorCode::IllegalClient));
    assert_eq!(t.revoke(C2, "k"), Err(ErrorCode::IllegalClient));
    assert_eq!(t.revoke(C1, "k"), Ok(()));
    assert_eq!(t.used(), 0);
    assert_eq!(t.get("k"), Err(ErrorCode::ObjectNotFound));
    t.put("k", 100);
    assert_eq!(t.revoke(C1, "k"), Err(ErrorCode::InvalidWrite));
    assert!(t.exist("k"));
    assert_eq!(t.svc.metrics().op_counts(Op::PutRevoke), (4, 3));
}

// ---- Placement -------------------------------------------------------------------------

#[test]
fn replicas_on_distinct_segments_partial_allowed() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.mount(2, 64 * MIB);
    let three = ReplicateConfig {
        replica_num: 3,
        ..Default::default()
    };
    let d = t.start_with(C1, "k", 1000, three).unwrap();
    assert_eq!(d.len(), 2);
    assert_ne!(d[0].segment_name, d[1].segment_name);
    assert_eq!(
        Metrics::get(&t.svc.metrics().put_start_partial_allocations),
        1
    );
}

#[test]
fn replicas_prefer_distinct_hosts() {
    for seed in 0..20 {
        let clock = Arc::new(ManualClock::new(1000));
        let t = T {
            svc: MasterService::with_seed(cfg(), clock.clone(), seed),
            clock,
        };
        t.mount_on(C1, 1, "a1", 64 * MIB, "A");
        t.mount_on(C1, 2, "a2", 64 * MIB, "A");
        t.mount_on(C1, 3, "b1", 64 * MIB, "B");
        let two = ReplicateConfig {
            replica_num: 2,
            ..Default::default()
        };
        let d = t.start_with(C1, "k", 1000, two).unwrap();
        let names: Vec<&str> = d.iter().map(|r| r.segment_name.as_str()).collect();
        assert!(names.contains(&"b1"), "seed {seed}: {names:?}");
        // Three replicas need the second walk: all three segments.
        let three = ReplicateConfig {
            replica_num: 3,
            ..Default::default()
        };
        assert_eq!(t.start_with(C1, "k3", 1000, three).unwrap().len(), 3);
    }
}

#[test]
fn preferred_segments_come_first() {
    let t = T::new();
    for n in 1..=4 {
        t.mount(n, 64 * MIB);
    }
    for i in 0..10 {
        let c = ReplicateConfig {
            preferred_segments: vec!["seg3".into()],
            ..Default::default()
        };
        let d = t.start_with(C1, &format!("k{i}"), 100, c).unwrap();
        assert_eq!(d[0].segment_name, "seg3");
        let c = ReplicateConfig {
            preferred_segment: "seg2".into(),
            preferred_segments: vec!["seg3".into()],
            ..Default::default()
        };
        let d = t.start_with(C1, &format!("j{i}"), 100, c).unwrap();
        assert_eq!(d[0].segment_name, "seg2");
    }
}

#[test]
fn free_ratio_first_picks_the_emptiest_segment() {
    let t = T::with(ServiceConfig {
        allocation_strategy: AllocationStrategy::FreeRatioFirst,
        ..cfg()
    });
    t.mount(1, 64 * MIB);
    t.mount(2, 64 * MIB);
    let d = t.start("a", 10 * MIB).unwrap();
    let other = if d[0].segment_name == "seg1" {
        "seg2"
    } else {
        "seg1"
    };
    for i in 0..5 {
        let d = t.start(&format!("b{i}"), MIB + 1).unwrap();
        assert_eq!(d[0].segment_name, other);
    }
}

#[test]
fn random_strategy_spreads_over_segments() {
    let t = T::new();
    for n in 1..=4 {
        t.mount(n, 64 * MIB);
    }
    let mut seen = std::collections::HashSet::new();
    for i in 0..64 {
        seen.insert(
            t.start(&format!("k{i}"), 100).unwrap()[0]
                .segment_name
                .clone(),
        );
    }
    assert_eq!(seen.len(), 4);
}

#[test]
fn no_segment_or_too_big_is_no_available_handle() {
    let t = T::new();
    assert_eq!(t.start("k", 100), Err(ErrorCode::NoAvailableHandle));
    t.mount(1, 16 * MIB);
    assert_eq!(t.start("k", 17 * MIB), Err(ErrorCode::NoAvailableHandle));
    // Too big for any segment: no futile eviction pass.
    assert_eq!(Metrics::get(&t.svc.metrics().eviction_attempts), 0);
    assert_eq!(Metrics::get(&t.svc.metrics().put_start_alloc_failures), 2);
}

// ---- Reads, leases, removal --------------------------------------------------------------

#[test]
fn remove_rules() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    assert_eq!(t.remove("k", false), Err(ErrorCode::ObjectNotFound));
    t.put("k", 100);
    t.get("k").unwrap();
    assert_eq!(t.remove("k", false), Err(ErrorCode::ObjectHasLease));
    t.advance(499);
    assert_eq!(t.remove("k", false), Err(ErrorCode::ObjectHasLease));
    t.advance(1);
    assert_eq!(t.remove("k", false), Ok(()));

    t.put("k", 100);
    t.get("k").unwrap();
    assert_eq!(t.remove("k", true), Ok(()), "force ignores the lease");

    // An ExistKey probe lease also blocks a non-forced remove.
    t.put("p", 100);
    assert!(t.exist("p"));
    assert_eq!(t.remove("p", false), Err(ErrorCode::ObjectHasLease));
    t.advance(500);
    assert_eq!(t.remove("p", false), Ok(()));

    t.start("w", 100).unwrap();
    assert_eq!(t.remove("w", false), Err(ErrorCode::ReplicaIsNotReady));
    assert_eq!(t.remove("w", true), Err(ErrorCode::ReplicaIsNotReady));
    assert_eq!(t.svc.all_keys(), vec!["w".to_string()]);
}

#[test]
fn read_lease_extends_but_never_shrinks() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.put("k", 100);
    t.get("k").unwrap();
    t.advance(400);
    t.get("k").unwrap();
    t.advance(400);
    assert_eq!(t.remove("k", false), Err(ErrorCode::ObjectHasLease));
    t.advance(100);
    assert_eq!(t.remove("k", false), Ok(()));
}

#[test]
fn remove_by_regex_and_remove_all() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    for k in ["abc", "xbz", "qqq", "leased", "in-flight-b"] {
        if k == "in-flight-b" {
            t.start(k, 100).unwrap();
        } else {
            t.put(k, 100);
        }
    }
    t.get("leased").unwrap();
    let by_regex = |p: &str, force: bool| {
        t.call(
            Request::RemoveByRegex,
            RemoveByRegex {
                pattern: p.into(),
                force,
            },
        )
    };
    assert_eq!(by_regex("(", false), Err(ErrorCode::InvalidParams));
    // Substring search: "b" matches anywhere; the in-flight key is skipped.
    assert_eq!(by_regex("b", false), Ok(2));
    assert_eq!(by_regex("^lea", false), Ok(0), "leased is skipped");
    assert_eq!(by_regex("^lea", true), Ok(1));
    let all = |force| t.call(Request::RemoveAll, RemoveAll { force });
    assert_eq!(all(false), Ok(1));
    assert_eq!(all(true), Ok(0));
    assert_eq!(t.svc.all_keys(), vec!["in-flight-b".to_string()]);
    // The forced remove of "leased" parked its buffers until the lease ends.
    assert_eq!(t.used(), 224);
    t.advance(500);
    t.svc.tick();
    assert_eq!(t.used(), 112);
    assert_eq!(t.svc.metrics().op_counts(Op::RemoveByRegex), (4, 1));
}

// ---- Batches -----------------------------------------------------------------------------

#[test]
fn batch_operations_answer_per_item() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.put("old", 100);
    let keys: Vec<String> = ["a", "old", "", "b"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let r = t
        .call(
            Request::BatchPutStart,
            BatchPutStart {
                client_id: C1,
                keys: keys.clone(),
                sizes: vec![10, 10, 10, 0],
                config: ReplicateConfig::default(),
            },
        )
        .unwrap();
    let codes: Vec<i32> = r
        .iter()
        .map(|x| x.as_ref().err().map_or(0, |e| e.code()))
        .collect();
    assert_eq!(codes, vec![0, -705, -600, -600]);
    assert_eq!(r[0].as_ref().unwrap()[0].size, 10);
    let r = t
        .call(
            Request::BatchPutEnd,
            BatchPutEnd {
                client_id: C1,
                keys: vec!["a".into(), "zzz".into()],
            },
        )
        .unwrap();
    assert_eq!(r, vec![Ok(()), Err(ErrorCode::ObjectNotFound)]);
    let r = t
        .call(
            Request::BatchExistKey,
            BatchExistKey {
                keys: vec!["a".into(), "zzz".into(), "old".into()],
            },
        )
        .unwrap();
    assert_eq!(r, vec![Ok(true), Ok(false), Ok(true)]);
    let r = t
        .call(
            Request::BatchGetReplicaList,
            BatchGetReplicaList {
                keys: vec!["a".into(), "zzz".into()],
            },
        )
        .unwrap();
    assert_eq!(r[0].as_ref().unwrap().replicas.len(), 1);
    assert_eq!(r[1], Err(ErrorCode::ObjectNotFound));
    let r = t
        .call(
            Request::BatchRemove,
            BatchRemove {
                keys: vec!["a".into(), "old".into(), "zzz".into()],
                force: false,
            },
        )
        .unwrap();
    assert_eq!(
        r,
        vec![
            Err(ErrorCode::ObjectHasLease),
            Err(ErrorCode::ObjectHasLease),
            Err(ErrorCode::ObjectNotFound)
        ]
    );
    let r = t
        .call(
            Request::BatchRemove,
            BatchRemove {
                keys: vec!["a".into(), "old".into()],
                force: true,
            },
        )
        .unwrap();
    // Each answer names the freed replica, for the remover to bury.
    assert_eq!(r.len(), 2);
    assert!(
        r.iter().all(|x| x.as_ref().is_ok_and(|v| v.len() == 1)),
        "{r:?}"
    );
    let m = t.svc.metrics();
    assert_eq!(m.batch_counts(BatchOp::PutStart), (1, 0, 4, 3));
    assert_eq!(m.batch_counts(BatchOp::ExistKey), (1, 0, 3, 0));
    assert_eq!(m.batch_counts(BatchOp::Remove), (2, 1, 5, 3));
}

#[test]
fn batch_put_start_length_mismatch_fails_every_item() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let r = t
        .call(
            Request::BatchPutStart,
            BatchPutStart {
                client_id: C1,
                keys: vec!["a".into(), "b".into()],
                sizes: vec![10],
                config: ReplicateConfig::default(),
            },
        )
        .unwrap();
    assert_eq!(r, vec![Err(ErrorCode::InvalidParams); 2]);
    assert_eq!(t.svc.all_keys().len(), 0);
    // prefer_alloc_in_same_node is allowed in batches with one replica only.
    let batch = |replica_num| {
        t.call(
            Request::BatchPutStart,
            BatchPutStart {
                client_id: C1,
                keys: vec![format!("x{replica_num}")],
                sizes: vec![10],
                config: ReplicateConfig {
                    replica_num,
                    prefer_alloc_in_same_node: true,
                    ..Default::default()
                },
            },
        )
        .unwrap()
    };
    assert!(batch(1)[0].is_ok());
    assert_eq!(batch(2), vec![Err(ErrorCode::InvalidParams)]);
}

#[test]
fn batch_upsert_and_revoke_forms() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let r = t
        .call(
            Request::BatchUpsertStart,
            BatchUpsertStart {
                client_id: C1,
                keys: vec!["a".into(), "b".into()],
                sizes: vec![10, 20],
                config: ReplicateConfig::default(),
            },
        )
        .unwrap();
    assert!(r.iter().all(|x| x.is_ok()));
    let r = t
        .call(
            Request::BatchUpsertEnd,
            BatchUpsertEnd {
                client_id: C1,
                keys: vec!["a".into()],
            },
        )
        .unwrap();
    assert_eq!(r, vec![Ok(())]);
    let r = t
        .call(
            Request::BatchUpsertRevoke,
            BatchUpsertRevoke {
                client_id: C1,
                keys: vec!["a".into(), "b".into()],
            },
        )
        .unwrap();
    assert_eq!(r, vec![Err(ErrorCode::InvalidWrite), Ok(())]);
    let r = t
        .call(
            Request::BatchPutRevoke,
            BatchPutRevoke {
                client_id: C1,
                keys: vec!["b".into()],
            },
        )
        .unwrap();
    assert_eq!(r, vec![Err(ErrorCode::ObjectNotFound)]);
}

// ---- Upsert ------------------------------------------------------------------------------

fn upsert(t: &T, client: Uuid, key: &str, size: u64) -> Result<Vec<ReplicaDescriptor>, ErrorCode> {
    upsert_cfg(t, client, key, size, ReplicateConfig::default()).map(|s| s.replicas)
}

fn upsert_cfg(
    t: &T,
    client: Uuid,
    key: &str,
    size: u64,
    config: ReplicateConfig,
) -> Result<UpsertStarted, ErrorCode> {
    t.call(
        Request::UpsertStart,
        UpsertStart {
            client_id: client,
            key: key.into(),
            size,
            config,
        },
    )
}

/// A start sent again by its own writer while its put is in flight (the answer was lost, or
/// the client sent the call again after giving up its connection with the request still in
/// it) gets the same buffers and version, whichever copy the master executes first. Executed
/// anew, the copy executed second moved an upsert to new buffers its writer never heard of,
/// and the writer's commit completed those unwritten buffers: the seed-1 reproduction of
/// violation 2 read a killed writer's bytes through them (`docs/reliability.md`).
#[test]
fn a_start_sent_again_by_its_writer_gets_the_same_allocation() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.mount(2, 64 * MIB);
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let addresses =
        |r: &[ReplicaDescriptor]| -> Vec<u64> { r.iter().map(|d| d.buffer_address).collect() };
    // An upsert of a key that exists, as in the reproduction: the answered copy, then the
    // late one.
    t.put_cfg("k", 4096, two.clone());
    let answered = upsert_cfg(&t, C1, "k", 4096, two.clone()).unwrap();
    let late = upsert_cfg(&t, C1, "k", 4096, two.clone()).unwrap();
    assert_eq!(late, answered, "the late copy moved the upsert");
    t.end(C1, "k").unwrap();
    let list = t.get("k").unwrap();
    assert_eq!(addresses(&list.replicas), addresses(&answered.replicas));
    assert_eq!(list.replicas[0].version, answered.replicas[0].version);

    // A put of a new key: the same (it was refused as if another writer held the key).
    let first = t.start_with(C1, "p", 8192, two.clone()).unwrap();
    assert_eq!(t.start_with(C1, "p", 8192, two.clone()), Ok(first));
    assert_eq!(Metrics::get(&t.svc.metrics().put_start_retries), 2);
    // Another writer, or another size, is another put, refused or placed as before.
    assert_eq!(
        t.start_with(C2, "p", 8192, two.clone()),
        Err(ErrorCode::ObjectAlreadyExists)
    );
    let resized = upsert_cfg(&t, C1, "p", 4096, two.clone()).unwrap();
    assert_eq!(resized.replicas[0].size, 4096);
    assert_eq!(Metrics::get(&t.svc.metrics().put_start_retries), 2);
    t.end(C1, "p").unwrap();
    assert_eq!(t.get("p").unwrap().replicas[0].size, 4096);

    // A key named twice in one batch is two starts, as before: the second upsert replaces
    // the first, in new buffers.
    let upserts = t
        .call(
            Request::BatchUpsertStart,
            BatchUpsertStart {
                client_id: C1,
                keys: vec!["b".into(), "b".into()],
                sizes: vec![4096, 4096],
                config: two.clone(),
            },
        )
        .unwrap();
    let (first, second) = (upserts[0].as_ref().unwrap(), upserts[1].as_ref().unwrap());
    assert_ne!(addresses(&first.replicas), addresses(&second.replicas));
    t.end(C1, "b").unwrap();
    assert_eq!(Metrics::get(&t.svc.metrics().put_start_retries), 2);
}

#[test]
fn upsert_reuses_same_size_and_reallocates_other_sizes() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    // Absent: like a put.
    let a = upsert(&t, C1, "k", 4096).unwrap();
    assert_eq!(
        t.call(
            Request::UpsertEnd,
            UpsertEnd {
                client_id: C1,
                key: "k".into()
            }
        ),
        Ok(())
    );
    // Same size: same buffer, back to PROCESSING, by the new writer.
    let b = upsert(&t, C2, "k", 4096).unwrap();
    assert_eq!(a[0].buffer_address, b[0].buffer_address);
    assert_eq!(b[0].status, ReplicaStatus::Processing);
    assert_eq!(t.get("k"), Err(ErrorCode::ReplicaIsNotReady));
    assert_eq!(t.end(C1, "k"), Err(ErrorCode::IllegalClient));
    t.end(C2, "k").unwrap();
    // Another size: old buffer freed, new one allocated.
    let c = upsert(&t, C1, "k", 3 * MIB).unwrap();
    assert_eq!(c[0].size, 3 * MIB);
    assert_eq!(t.used(), 3 * MIB);
    t.end(C1, "k").unwrap();
    assert_eq!(t.get("k").unwrap().replicas[0].size, 3 * MIB);
}

#[test]
fn upsert_preempts_an_in_flight_put_at_once() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.start_with(C2, "k", 8192, ReplicateConfig::default())
        .unwrap();
    // No 30 s wait, unlike PutStart.
    let d = upsert(&t, C1, "k", 100).unwrap();
    assert_eq!(d[0].size, 100);
    assert_eq!(t.end(C2, "k"), Err(ErrorCode::IllegalClient));
    t.end(C1, "k").unwrap();
    // The preempted writer's buffer stays parked until the release timeout.
    assert_eq!(t.used(), 8192 + 112);
    t.advance(600_000);
    t.svc.tick();
    assert_eq!(t.used(), 112);
}

/// Found by the concurrency soak (python/tests/test_soak.py): a same-size upsert used to
/// reuse the buffers of a put in flight; once the upsert completed, a remove freed them and
/// another key got them while the preempted writer was still writing there.
#[test]
fn same_size_upsert_of_an_in_flight_put_takes_new_buffers() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let first = t
        .start_with(C2, "k", 8192, ReplicateConfig::default())
        .unwrap();
    let d = upsert(&t, C1, "k", 8192).unwrap();
    assert_ne!(d[0].buffer_address, first[0].buffer_address);
    t.end(C1, "k").unwrap();
    assert_eq!(t.remove("k", false), Ok(()));
    // The preempted writer's buffer is still parked: a new key cannot get it.
    let other = t.put("other", 8192);
    assert_ne!(other[0].buffer_address, first[0].buffer_address);
    assert_eq!(t.end(C2, "k"), Err(ErrorCode::ObjectNotFound));
}

#[test]
fn same_size_upsert_of_a_leased_object_does_not_write_under_the_reader() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let old = t.put("k", 4096);
    t.get("k").unwrap();
    let d = upsert(&t, C1, "k", 4096).unwrap();
    assert_ne!(d[0].buffer_address, old[0].buffer_address);
    assert_eq!(t.used(), 2 * 4096);
    t.advance(500);
    t.svc.tick();
    assert_eq!(t.used(), 4096);
}

#[test]
fn upsert_of_a_leased_object_parks_old_buffers_until_the_lease_ends() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.put("k", 4096);
    t.get("k").unwrap();
    upsert(&t, C1, "k", 8192).unwrap();
    assert_eq!(t.used(), 4096 + 8192);
    t.advance(500);
    t.svc.tick();
    assert_eq!(t.used(), 8192);
}

/// Found by the randomized fault harness (seed 1, 600 s): a forced remove freed the buffers of
/// an object a reader had just located; another key's put took them and the reader returned
/// that put's bytes. The buffers now stay parked until the read lease ends.
#[test]
fn forced_remove_of_a_leased_object_parks_its_buffers_until_the_lease_ends() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let old = t.put("k", 4096);
    t.get("k").unwrap();
    assert_eq!(t.remove("k", true), Ok(()));
    // Still held for the reader: a new put of the same size gets other buffers.
    let new = t.put("other", 4096);
    assert_ne!(
        new[0], old[0],
        "a new put landed in buffers a reader may still read"
    );
    assert_eq!(t.used(), 2 * 4096);
    t.advance(500);
    t.svc.tick();
    assert_eq!(t.used(), 4096);
    // The same through remove_all (the pattern path).
    t.put("j", 4096);
    t.get("j").unwrap();
    let n = t
        .call(Request::RemoveAll, RemoveAll { force: true })
        .unwrap();
    assert_eq!(n, 2);
    // "other" freed, "j" parked for its reader.
    assert_eq!(t.used(), 4096, "leased buffers freed at once by remove_all");
    t.advance(500);
    t.svc.tick();
    assert_eq!(t.used(), 0);
}

/// With a long lease (the default 10 s) a replica list's read window is the whole lease, as
/// upstream's, until parked buffers fill a sixteenth of the pool; then lists get short windows
/// and buffers taken from a leased object are parked only that long. A client that reads keys
/// and force-removes them would otherwise park ten seconds of writes and run out of space
/// (`bench/README.md`, "8 clients, 2 storage nodes").
#[test]
fn under_parking_pressure_read_windows_shrink_and_parked_buffers_follow() {
    const TTL: u64 = 10_000;
    let t = T::with(ServiceConfig {
        default_kv_lease_ttl_ms: TTL,
        ..cfg()
    });
    t.mount(1, 64 * MIB);
    let (small, big) = (4096, 32 * MIB);
    let short = |size: u64| {
        object::SHORT_READ_WINDOW_BASE_MS + size / object::SHORT_READ_WINDOW_BYTES_PER_MS
    };
    // What a list tells its reader: its window less the master's slack.
    let told = |window: u64| window - object::READ_WINDOW_SLACK_MS;
    t.put("k", small);
    assert_eq!(
        t.get("k").unwrap().lease_ttl_ms,
        told(TTL),
        "no pressure: the lease"
    );
    // 8 MiB parked for its reader's full window (an eighth of the pool)...
    t.put("a", 8 * MIB);
    t.get("a").unwrap();
    assert_eq!(t.remove("a", true), Ok(()));
    t.svc.tick();
    // ...so lists now get short windows, longer for bigger objects.
    t.put("big", big);
    assert_eq!(t.get("big").unwrap().lease_ttl_ms, told(short(big)));
    t.advance(100);
    // A window never shrinks: "k" keeps its first list's (TTL - 100 ms left).
    assert_eq!(t.get("k").unwrap().lease_ttl_ms, told(TTL - 100));
    t.put("k2", small);
    assert_eq!(t.get("k2").unwrap().lease_ttl_ms, told(short(small)));
    assert!(short(small) < short(big) && short(big) < TTL);
    assert_eq!(t.remove("k2", true), Ok(()));
    assert_eq!(t.remove("big", true), Ok(()));
    let parked = 8 * MIB + big + small;
    assert_eq!(t.used(), parked + small, "parked while a reader may read");
    // Just before k2's window ends: still parked; at its end, free.
    t.advance(short(small) - 1);
    t.svc.tick();
    assert_eq!(t.used(), parked + small);
    t.advance(1);
    t.svc.tick();
    assert_eq!(t.used(), parked, "k2 freed");
    t.advance(short(big) - short(small));
    t.svc.tick();
    assert_eq!(
        t.used(),
        8 * MIB + small,
        "big freed long before the lease ends"
    );
    // "a" had a full window: parked until it ends; then no pressure, full windows again.
    t.advance(TTL);
    t.svc.tick();
    assert_eq!(t.used(), small);
    assert_eq!(t.get("k").unwrap().lease_ttl_ms, told(TTL));
}

// ---- Soft and hard pins, eviction ----------------------------------------------------------

fn evict_cfg() -> ServiceConfig {
    ServiceConfig {
        default_kv_lease_ttl_ms: 500,
        eviction_high_watermark_ratio: 0.9,
        eviction_ratio: 0.1,
        ..cfg()
    }
}

/// Puts `n` objects of 1 MiB into a 64 MiB segment.
fn fill(t: &T, prefix: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let k = format!("{prefix}{i}");
            t.put(&k, MIB);
            t.advance(1);
            k
        })
        .collect()
}

#[test]
fn watermark_eviction_frees_oldest_reads_first() {
    let t = T::with(evict_cfg());
    t.mount(1, 64 * MIB);
    let keys = fill(&t, "k", 57);
    t.svc.tick();
    assert_eq!(t.svc.all_keys().len(), 57, "57/64 is below the watermark");
    // Touch the ten oldest by reading them, let the leases lapse, then go over.
    for k in &keys[..10] {
        t.get(k).unwrap();
    }
    t.advance(1000);
    fill(&t, "over", 2);
    t.svc.tick();
    // 59/64 used: target = max(0.1, 0.921875 - 0.9 + 0.1) of 64 MiB = 7.8 MiB -> 8 objects.
    let left = t.svc.all_keys();
    assert_eq!(left.len(), 59 - 8);
    for k in &keys[..10] {
        assert!(left.contains(k), "{k} was read recently");
    }
    for k in &keys[10..18] {
        assert!(!left.contains(k), "{k} is among the least recently read");
    }
    assert!(left.contains(&keys[18]));
    let m = t.svc.metrics();
    assert_eq!(Metrics::get(&m.evicted_keys), 8);
    assert_eq!(Metrics::get(&m.evicted_bytes), 8 * MIB);
    assert_eq!(Metrics::get(&m.eviction_successes), 1);
    t.svc.tick();
    assert_eq!(
        Metrics::get(&m.eviction_attempts),
        1,
        "below the watermark again"
    );
}

/// Upstream issue #2187: probes must not starve eviction.
#[test]
fn exist_key_probes_do_not_block_eviction() {
    let t = T::with(evict_cfg());
    t.mount(1, 64 * MIB);
    let keys = fill(&t, "k", 62);
    for _second in 0..5 {
        for k in &keys {
            t.exist(k);
        }
        t.advance(1000);
        t.svc.tick();
    }
    let (used, cap) = (t.used(), 64 * MIB);
    assert!(
        (used as f64) <= 0.9 * cap as f64,
        "eviction must free space under probing: {used} of {cap}"
    );
    assert!(Metrics::get(&t.svc.metrics().evicted_keys) > 0);
}

/// The contrast: real reads (GetReplicaList) within the lease do protect objects.
#[test]
fn read_leases_block_eviction_and_futile_passes_are_not_repeated() {
    let t = T::with(evict_cfg());
    t.mount(1, 64 * MIB);
    let keys = fill(&t, "k", 62);
    for k in &keys {
        t.get(k).unwrap();
    }
    t.svc.tick();
    assert_eq!(t.svc.all_keys().len(), 62);
    let m = t.svc.metrics();
    assert_eq!(Metrics::get(&m.eviction_attempts), 1);
    for _ in 0..10 {
        t.advance(10);
        t.svc.tick();
    }
    assert_eq!(
        Metrics::get(&m.eviction_attempts),
        1,
        "nothing changed: no new scan"
    );
    t.advance(500);
    t.svc.tick();
    assert!(
        t.svc.all_keys().len() < 62,
        "leases lapsed: eviction proceeds"
    );
    assert_eq!(Metrics::get(&m.eviction_attempts), 2);
}

#[test]
fn failed_allocation_evicts_synchronously_and_retries() {
    let t = T::with(evict_cfg());
    t.mount(1, 64 * MIB);
    fill(&t, "k", 64);
    assert_eq!(t.used(), 64 * MIB);
    // No tick ran: the put itself evicts and succeeds.
    t.put("new", MIB);
    assert!(t.exist("new"));
    assert!(!t.exist("k0"));
    assert_eq!(Metrics::get(&t.svc.metrics().put_start_alloc_failures), 0);
}

#[test]
fn hard_pinned_objects_are_never_evicted() {
    let t = T::with(evict_cfg());
    t.mount(1, 64 * MIB);
    let pin = ReplicateConfig {
        with_hard_pin: true,
        ..Default::default()
    };
    for i in 0..64 {
        t.put_cfg(&format!("h{i}"), MIB, pin.clone());
    }
    t.svc.tick();
    assert_eq!(t.svc.all_keys().len(), 64);
    assert_eq!(t.start("new", MIB), Err(ErrorCode::NoAvailableHandle));
    assert_eq!(Metrics::get(&t.svc.metrics().put_start_alloc_failures), 1);
    // Hard pin does not stop removal.
    assert_eq!(t.remove("h0", false), Ok(()));
}

#[test]
fn soft_pinned_objects_go_last_and_only_if_allowed() {
    let soft = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(60_000),
        ..Default::default()
    };
    for allow in [true, false] {
        let t = T::with(ServiceConfig {
            allow_evict_soft_pinned_objects: allow,
            ..evict_cfg()
        });
        t.mount(1, 64 * MIB);
        // Soft-pinned objects are the oldest, yet plain ones go first.
        for i in 0..56 {
            t.put_cfg(&format!("s{i}"), MIB, soft.clone());
        }
        t.advance(10);
        fill(&t, "p", 6);
        assert_eq!(t.svc.gauges().soft_pin_key_count, 56);
        t.svc.tick();
        let left = t.svc.all_keys();
        // 62 MiB: target 0.16875 * 64 MiB = 10.8 MiB -> 6 plain + 5 pinned (if allowed).
        assert!(left.iter().all(|k| k.starts_with('s')), "{allow}");
        let pinned_left = left.len();
        assert_eq!(pinned_left, if allow { 56 - 5 } else { 56 });
        if !allow {
            // The pin lapses after 60 s: the objects become ordinary and evictable.
            t.advance(60_000);
            fill(&t, "t", 3);
            t.svc.tick();
            let left = t.svc.all_keys();
            assert_eq!(left.len(), 59 - 8);
            assert_eq!(left.iter().filter(|k| k.starts_with('s')).count(), 56 - 8);
            assert_eq!(t.svc.gauges().soft_pin_key_count, 0);
        }
    }
}

#[test]
fn soft_pin_ttl_zero_is_ordinary_and_default_ttl_applies() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let enable = |ttl| ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: ttl,
        ..Default::default()
    };
    t.put_cfg("zero", 100, enable(Some(0)));
    t.put_cfg("dflt", 100, enable(None));
    assert_eq!(t.svc.gauges().soft_pin_key_count, 1);
    t.advance(cfg().default_kv_soft_pin_ttl_ms);
    assert_eq!(t.svc.gauges().soft_pin_key_count, 0);
}

#[test]
fn eviction_ratio_zero_disables_eviction() {
    let t = T::with(ServiceConfig {
        eviction_ratio: 0.0,
        ..evict_cfg()
    });
    t.mount(1, 64 * MIB);
    fill(&t, "k", 64);
    t.svc.tick();
    assert_eq!(t.start("new", MIB), Err(ErrorCode::NoAvailableHandle));
    assert_eq!(t.svc.all_keys().len(), 64);
}

// ---- Segments and clients ------------------------------------------------------------------

#[test]
fn unmount_drops_replicas_and_orphaned_objects() {
    let t = T::new();
    let s1 = t.mount(1, 64 * MIB);
    t.mount(2, 64 * MIB);
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    t.put_cfg("both", 100, two);
    let only1 = ReplicateConfig {
        preferred_segments: vec!["seg1".into()],
        ..Default::default()
    };
    t.put_cfg("only1", 100, only1);
    let unmount = |client, id| {
        t.call(
            Request::UnmountSegment,
            UnmountSegment {
                client_id: client,
                segment_id: id,
            },
        )
    };
    assert_eq!(unmount(C2, s1), Err(ErrorCode::InvalidParams));
    assert_eq!(unmount(C1, s1), Ok(()));
    assert_eq!(unmount(C1, s1), Err(ErrorCode::SegmentNotFound));
    assert_eq!(t.get("only1"), Err(ErrorCode::ObjectNotFound));
    let l = t.get("both").unwrap();
    assert_eq!(l.replicas.len(), 1);
    assert_eq!(l.replicas[0].segment_name, "seg2");
    assert_eq!(t.svc.all_segments(), vec!["seg2".to_string()]);
    // The name is free again.
    t.mount(1, 64 * MIB);
}

#[test]
fn expired_client_loses_its_segments_and_objects() {
    let t = T::with(liveness_cfg());
    t.mount(1, 64 * MIB);
    t.mount_on(C2, 2, "other", 64 * MIB, "h2");
    let to_other = ReplicateConfig {
        preferred_segments: vec!["other".into()],
        ..Default::default()
    };
    t.put("mine", 100);
    t.put_cfg("theirs", 100, to_other);
    t.advance(9_000);
    t.call(Request::Ping, Ping { client_id: C1 }).unwrap();
    t.advance(1_000);
    t.svc.tick();
    assert_eq!(t.svc.all_segments(), vec!["seg1".to_string()]);
    assert!(t.exist("mine"));
    assert!(!t.exist("theirs"));
    assert_eq!(t.svc.gauges().active_clients, 1);
}

#[test]
fn remount_rebuilds_the_index_after_a_restart() {
    let t = T::new();
    let s1 = t.mount(1, 64 * MIB);
    let a = t.put("a", 5000);
    let b = t.put("b", 3 * MIB);
    // A new master knows nothing; the storage client re-mounts with what it holds.
    let t2 = T::new();
    let seg = Segment {
        id: s1,
        name: "seg1".into(),
        base: 1 << 40,
        size: 64 * MIB,
        te_endpoint: "seg1-te".into(),
        protocol: "tcp".into(),
        host_id: "host1".into(),
        ..Default::default()
    };
    let held = |key: &str, d: &ReplicaDescriptor, seg: &str| HeldObject {
        key: key.into(),
        size: d.size,
        segment_name: seg.into(),
        buffer_address: d.buffer_address,
        with_hard_pin: false,
        version: d.version,
        soft_pin_ttl_ms: None,
    };
    let r = t2.call(
        Request::ReMountSegment,
        ReMountSegment {
            client_id: C1,
            segments: vec![seg],
            held: vec![
                held("a", &a[0], "seg1"),
                held("b", &b[0], "seg1"),
                held("c", &a[0], "seg1"),    // overlaps a: skipped
                held("d", &a[0], "nowhere"), // unknown segment: skipped
            ],
        },
    );
    assert_eq!(r, Ok(()));
    let mut keys = t2.svc.all_keys();
    keys.sort();
    assert_eq!(keys, vec!["a".to_string(), "b".to_string()]);
    let l = t2.get("a").unwrap();
    assert_eq!(l.replicas[0].buffer_address, a[0].buffer_address);
    assert_eq!(l.replicas[0].status, ReplicaStatus::Complete);
    assert_eq!(
        t2.call(Request::Ping, Ping { client_id: C1 })
            .unwrap()
            .status,
        ClientStatus::Ok
    );
    // New puts avoid the re-inserted ranges.
    for i in 0..20 {
        let d = t2.start(&format!("n{i}"), 5000).unwrap();
        let (s, e) = (d[0].buffer_address, d[0].buffer_address + 5000);
        for old in [&a[0], &b[0]] {
            assert!(e <= old.buffer_address || old.buffer_address + old.size <= s);
        }
    }
    // A repeated re-mount is harmless.
    let r = t2.call(
        Request::ReMountSegment,
        ReMountSegment {
            client_id: C1,
            segments: vec![],
            held: vec![held("a", &a[0], "seg1")],
        },
    );
    assert_eq!(r, Ok(()));
    assert_eq!(t2.get("a").unwrap().replicas.len(), 1);
}

#[test]
fn remount_refuses_held_objects_that_do_not_fit() {
    let t = T::new();
    let s1 = t.mount_on(C1, 1, "seg1", 64 * MIB, "h1");
    let s2 = t.mount_on(C2, 2, "seg2", 64 * MIB, "h2");
    let seg = |id: Uuid, n: u64| Segment {
        id,
        name: format!("seg{n}"),
        base: n << 40,
        size: 64 * MIB,
        te_endpoint: format!("seg{n}-te"),
        protocol: "tcp".into(),
        host_id: format!("h{n}"),
        ..Default::default()
    };
    let held = |key: &str, size: u64, seg: &str, addr: u64| HeldObject {
        key: key.into(),
        size,
        segment_name: seg.into(),
        buffer_address: addr,
        with_hard_pin: false,
        version: protocol::Version::ZERO,
        soft_pin_ttl_ms: None,
    };
    let (b1, b2) = (1u64 << 40, 2u64 << 40);
    let t2 = T::new();
    let remount = |client: Uuid, segments: Vec<Segment>, held: Vec<HeldObject>| {
        t2.call(
            Request::ReMountSegment,
            ReMountSegment {
                client_id: client,
                segments,
                held,
            },
        )
    };
    let r = remount(
        C1,
        vec![seg(s1, 1)],
        vec![
            held("ok", 4096, "seg1", b1),
            held("before", 10, "seg1", b1 - 5), // starts before the segment
            held("past", 100, "seg1", b1 + 64 * MIB - 50), // runs past its end
            held("wrap", 100, "seg1", u64::MAX - 10), // wraps
            held("overlap", 10, "seg1", b1 + 4000), // overlaps "ok"
            held("theirs", 10, "seg2", b2),     // seg2 is C2's, not mounted yet
            held("", 10, "seg1", b1 + 8192),    // bad key
            held("empty", 0, "seg1", b1 + 16384), // bad size
            held("pinned", 10, "seg1", b1 + 20000),
        ],
    );
    assert_eq!(r, Ok(()));
    let mut keys = t2.svc.all_keys();
    keys.sort();
    assert_eq!(keys, vec!["ok".to_string(), "pinned".to_string()]);
    assert_eq!(t2.used(), 4096 + 10);
    // C2 re-mounts its own segment; a second replica of "ok" joins (same size), a clash of
    // size does not, and C1 cannot report objects in C2's segment.
    assert_eq!(
        remount(
            C2,
            vec![seg(s2, 2)],
            vec![
                held("ok", 4096, "seg2", b2),
                held("pinned", 11, "seg2", b2 + MIB)
            ]
        ),
        Ok(())
    );
    assert_eq!(
        remount(C1, vec![], vec![held("mine?", 10, "seg2", b2 + 2 * MIB)]),
        Ok(())
    );
    assert_eq!(t2.get("ok").unwrap().replicas.len(), 2);
    assert_eq!(t2.get("pinned").unwrap().replicas.len(), 1);
    assert_eq!(t2.get("mine?"), Err(ErrorCode::ObjectNotFound));
}

#[test]
fn pings_report_freed_ranges_once_and_never_a_reused_one() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let ping = || t.call(Request::Ping, Ping { client_id: C1 }).unwrap();
    assert_eq!(ping().freed, vec![]);
    let a = t.put("a", 3 * MIB);
    let b = t.put("b", 3 * MIB);
    assert_eq!(ping().freed, vec![], "nothing freed yet");
    t.remove("a", true).unwrap();
    let freed = ping().freed;
    assert_eq!(freed.len(), 1);
    let (addr, len) = freed[0];
    assert_eq!(addr, a[0].buffer_address);
    assert!(len >= 3 * MIB);
    assert_eq!(ping().freed, vec![], "reported once");
    // Freed, then reused before the owner pinged: the new object's range is not reported.
    t.remove("b", true).unwrap();
    let c = t.put("c", 3 * MIB);
    let (cs, ce) = (c[0].buffer_address, c[0].buffer_address + 3 * MIB);
    for (s, l) in ping().freed {
        assert!(
            s + l <= cs || ce <= s,
            "freed ({s:#x}, {l}) overlaps c {cs:#x}..{ce:#x}"
        );
    }
    let _ = b;
    // Another client's ping gets nothing of seg1's.
    t.remove("c", true).unwrap();
    let other = t.call(Request::Ping, Ping { client_id: C2 }).unwrap();
    assert_eq!(other.status, ClientStatus::NeedRemount);
    assert!(other.freed.is_empty());
    assert_eq!(ping().freed.len(), 1);
}

// ---- Admin view, metrics, batching -----------------------------------------------------------

#[test]
fn admin_view_reads_without_leasing() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.put("k", 100);
    let d = t.svc.query_key("k").unwrap();
    assert_eq!(d[0].segment_name, "seg1");
    assert_eq!(t.svc.query_key("zz"), Err(ErrorCode::ObjectNotFound));
    assert_eq!(t.remove("k", false), Ok(()), "query_key granted no lease");
    let detail = &t.svc.segments_detail()[0];
    assert_eq!(detail.segment_name, "seg1");
    assert_eq!(detail.client_id, "1-1");
    assert_eq!(detail.status, "OK");
    assert_eq!(detail.allocator_capacity_bytes, 64 * MIB);
    t.put("k", 100);
    let text = t.svc.render_metrics();
    for want in [
        "master_key_count 1",
        "master_allocated_bytes 112",
        "master_total_capacity_bytes 67108864",
        "master_active_clients 1",
        "master_put_start_requests_total 2",
        "master_remove_requests_total 1",
        "master_exist_key_failures_total 0",
        "# TYPE master_evicted_key_count counter",
    ] {
        assert!(text.lines().any(|l| l == want), "missing {want:?}");
    }
}

#[test]
fn handle_many_answers_in_order_under_one_lock() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let reqs = vec![
        Request::PutStart(PutStart {
            client_id: C1,
            key: "k".into(),
            size: 10,
            config: ReplicateConfig::default(),
        }),
        Request::PutEnd(PutEnd {
            client_id: C1,
            key: "k".into(),
        }),
        Request::ExistKey(ExistKey { key: "k".into() }),
        Request::ExistKey(ExistKey { key: "no".into() }),
    ];
    let mut out = Vec::new();
    let mut bounds = Vec::new();
    t.svc
        .handle_many(reqs, &mut out, |o, start| bounds.push((start, o.len())));
    assert_eq!(bounds.len(), 4);
    let body = |i: usize| &out[bounds[i].0..bounds[i].1];
    assert!(
        Result::<Vec<ReplicaDescriptor>, ErrorCode>::from_bytes(body(0))
            .unwrap()
            .is_ok()
    );
    assert_eq!(
        Result::<(), ErrorCode>::from_bytes(body(1)).unwrap(),
        Ok(())
    );
    assert_eq!(
        Result::<bool, ErrorCode>::from_bytes(body(2)).unwrap(),
        Ok(true)
    );
    assert_eq!(
        Result::<bool, ErrorCode>::from_bytes(body(3)).unwrap(),
        Ok(false)
    );
    // Every reply validates against the protocol's own table.
    let ops = [10u16, 11, 17, 17];
    for (i, op) in ops.iter().enumerate() {
        validate_response(*op, body(i)).unwrap();
    }
}

#[test]
fn random_requests_never_panic_and_always_decode() {
    use rand::{Rng, SeedableRng};
    let t = T::with(evict_cfg());
    t.mount(1, 16 * MIB);
    t.mount(2, 16 * MIB);
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let keys: Vec<String> = (0..40).map(|i| format!("key{i}")).collect();
    let key = |rng: &mut rand::rngs::StdRng| keys[rng.gen_range(0..keys.len())].clone();
    for step in 0..20_000 {
        let client = if rng.gen_bool(0.8) { C1 } else { C2 };
        let size = [1u64, 100, 5000, MIB, 3 * MIB][rng.gen_range(0..5)];
        let config = ReplicateConfig {
            replica_num: rng.gen_range(0..3),
            with_hard_pin: rng.gen_bool(0.05),
            ..Default::default()
        };
        let req = match rng.gen_range(0..12) {
            0 => Request::PutStart(PutStart {
                client_id: client,
                key: key(&mut rng),
                size,
                config,
            }),
            1 | 2 => Request::PutEnd(PutEnd {
                client_id: client,
                key: key(&mut rng),
            }),
            3 => Request::PutRevoke(PutRevoke {
                client_id: client,
                key: key(&mut rng),
            }),
            4 => Request::UpsertStart(UpsertStart {
                client_id: client,
                key: key(&mut rng),
                size,
                config,
            }),
            5 => Request::GetReplicaList(GetReplicaList { key: key(&mut rng) }),
            6 => Request::ExistKey(ExistKey { key: key(&mut rng) }),
            7 => Request::Remove(Remove {
                key: key(&mut rng),
                force: rng.gen_bool(0.5),
            }),
            8 => Request::BatchPutStart(BatchPutStart {
                client_id: client,
                keys: vec![key(&mut rng), key(&mut rng)],
                sizes: vec![size, size],
                config,
            }),
            9 => Request::RemoveByRegex(RemoveByRegex {
                pattern: "key1.*".into(),
                force: false,
            }),
            10 => Request::BatchExistKey(BatchExistKey {
                keys: vec![key(&mut rng), key(&mut rng)],
            }),
            _ => Request::Ping(Ping { client_id: client }),
        };
        let op = req.opcode();
        let mut out = Vec::new();
        t.svc.handle(req, &mut out);
        validate_response(op, &out).unwrap_or_else(|e| panic!("step {step} op {op}: {e}"));
        t.advance(rng.gen_range(0..200));
        if step % 10 == 0 {
            t.svc.tick();
        }
        if step % 1000 == 0 {
            t.call(
                Request::ReMountSegment,
                ReMountSegment {
                    client_id: C1,
                    segments: vec![],
                    held: vec![],
                },
            )
            .unwrap();
        }
    }
    // Whatever happened, accounting holds: used bytes are exactly what objects and parked
    // buffers own.
    let st = t.svc.state.lock();
    let owned: u64 = st
        .objects
        .values()
        .flat_map(|o| o.replicas.iter().map(|r| r.span.len))
        .sum::<u64>()
        + st.zombies.iter().map(|z| z.span.len).sum::<u64>();
    assert_eq!(st.usage().0, owned);
    for o in st.objects.values() {
        assert!(!o.replicas.is_empty());
        let mut segs: Vec<u32> = o.replicas.iter().map(|r| r.seg.idx).collect();
        segs.sort();
        segs.dedup();
        assert_eq!(segs.len(), o.replicas.len(), "one replica per segment");
    }
    // The in-flight index may overcount, never undercount.
    let mut actual = std::collections::BTreeMap::new();
    for o in st.objects.values().filter(|o| o.all_processing()) {
        *actual.entry(o.put_start_ms() / 1000).or_insert(0u64) += 1;
    }
    for (b, n) in actual {
        assert!(st.inflight.get(&b).copied().unwrap_or(0) >= n, "bucket {b}");
    }
}

#[test]
fn in_flight_index_tracks_puts() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.start("a", 100).unwrap();
    t.start("b", 100).unwrap();
    assert_eq!(t.svc.state.lock().inflight.values().sum::<u64>(), 2);
    t.end(C1, "a").unwrap();
    t.revoke(C1, "b").unwrap();
    assert!(t.svc.state.lock().inflight.is_empty());
    upsert(&t, C1, "a", 100).unwrap();
    upsert(&t, C2, "a", 100).unwrap();
    assert_eq!(t.svc.state.lock().inflight.values().sum::<u64>(), 1);
}

/// Throughput smoke check of the hot paths (not a benchmark; see `bench/`):
/// `cargo test --release -p mooncake-controlplane --lib perf_smoke -- --ignored --nocapture`.
#[test]
#[ignore]
fn perf_smoke() {
    let t = T::new();
    for n in 1..=4 {
        t.mount(n, 1 << 34);
    }
    let keys: Vec<String> = (0..100_000).map(|i| format!("kv-block-{i:012}")).collect();
    let mut out = Vec::with_capacity(1 << 20);
    let start = std::time::Instant::now();
    for k in &keys {
        out.clear();
        t.svc.handle(
            Request::PutStart(PutStart {
                client_id: C1,
                key: k.clone(),
                size: 256 * 1024,
                config: ReplicateConfig::default(),
            }),
            &mut out,
        );
        out.clear();
        t.svc.handle(
            Request::PutEnd(PutEnd {
                client_id: C1,
                key: k.clone(),
            }),
            &mut out,
        );
    }
    let dt = start.elapsed();
    println!(
        "put start+end: {:.0} ops/s",
        2.0 * keys.len() as f64 / dt.as_secs_f64()
    );
    let start = std::time::Instant::now();
    let mut b = t.svc.batch();
    for k in &keys {
        out.clear();
        b.handle(
            Request::GetReplicaList(GetReplicaList { key: k.clone() }),
            &mut out,
        );
    }
    drop(b);
    let dt = start.elapsed();
    println!(
        "get_replica_list: {:.0} ops/s",
        keys.len() as f64 / dt.as_secs_f64()
    );
    let batch: Vec<String> = keys[..1000].to_vec();
    let start = std::time::Instant::now();
    let rounds = 1000;
    for _ in 0..rounds {
        out.clear();
        t.svc.handle(
            Request::BatchExistKey(BatchExistKey {
                keys: batch.clone(),
            }),
            &mut out,
        );
    }
    let dt = start.elapsed();
    println!(
        "batch exist (incl. cloning the keys): {:.0} items/s",
        (rounds * batch.len()) as f64 / dt.as_secs_f64()
    );
    t.advance(1000);
    let start = std::time::Instant::now();
    t.svc.tick();
    println!("tick over {} objects: {:?}", keys.len(), start.elapsed());
}

/// The allocation-free paths for existence probes answer byte for byte what decoding the
/// request and dispatching it answers, for well-formed and malformed bodies alike.
#[test]
fn borrowed_exist_paths_match_the_decoding_path() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.put("a", 100);
    t.put("bb", 100);
    t.start("pending", 100).unwrap();
    let keys: Vec<String> = ["a", "bb", "pending", "missing", ""]
        .map(String::from)
        .to_vec();
    let mut bodies = vec![
        BatchExistKey { keys: keys.clone() }.to_bytes(),
        BatchExistKey { keys: Vec::new() }.to_bytes(),
    ];
    let good = bodies[0].clone();
    bodies.push(good[..good.len() - 1].to_vec()); // truncated
    let mut trailing = good.clone();
    trailing.push(0); // a trailing byte
    bodies.push(trailing);
    bodies.push(vec![0xff, 0xff, 0xff, 0xff]); // a huge count
    bodies.push(vec![1, 0, 0, 0, 2, 0, 0, 0, 0xff, 0xfe]); // invalid UTF-8
    for body in &bodies {
        let mut fast = Vec::new();
        let fast_res = t
            .svc
            .batch()
            .handle_frame(BatchExistKey::OP, body, &mut fast);
        let mut slow = Vec::new();
        let slow_res = Request::decode(BatchExistKey::OP, body).map(|r| t.svc.handle(r, &mut slow));
        assert_eq!(fast_res.is_ok(), slow_res.is_ok(), "{body:?}");
        assert_eq!(fast, slow, "{body:?}");
    }
    for k in &keys {
        let body = ExistKey { key: k.clone() }.to_bytes();
        let (mut fast, mut slow) = (Vec::new(), Vec::new());
        t.svc
            .batch()
            .handle_frame(ExistKey::OP, &body, &mut fast)
            .unwrap();
        t.svc
            .handle(Request::decode(ExistKey::OP, &body).unwrap(), &mut slow);
        assert_eq!(fast, slow, "{k}");
    }
    assert!(t
        .svc
        .batch()
        .handle_frame(ExistKey::OP, &[1, 0], &mut Vec::new())
        .is_err());
}

/// Every list a request carries is capped at `BATCH_MAX_ITEMS`: one item more and the body does
/// not decode (the RPC answers `INVALID_PARAMS` without running it); at the cap it runs.
#[test]
fn every_batch_over_the_cap_is_refused_and_one_at_it_is_served() {
    use protocol::frame::{self, Kind};
    use protocol::limits::BATCH_MAX_ITEMS;
    let t = T::new();
    t.mount(1, 64 * MIB);
    for (op, what, body) in list_bodies(BATCH_MAX_ITEMS + 1) {
        let res = t.svc.batch().handle_frame(op, &body, &mut Vec::new());
        assert!(res.is_err(), "{op} {what}: over the cap, yet it ran");
        let mut req = Vec::new();
        frame::encode_with(&mut req, Kind::Request, op, 7, |o| {
            o.extend_from_slice(&body)
        })
        .unwrap();
        let mut out = Vec::new();
        let (used, _) = crate::rpc::answer_frames(&req, &t.svc, &mut out).unwrap();
        assert_eq!(used, req.len());
        let (answer, _) = frame::split_frame(&out).unwrap().unwrap();
        let status = ErrorCode::decode(&mut protocol::wire::Reader::new(answer.body));
        assert_eq!(status, Ok(ErrorCode::InvalidParams), "{op} {what}");
    }
    for (op, what, body) in list_bodies(BATCH_MAX_ITEMS) {
        let res = t.svc.batch().handle_frame(op, &body, &mut Vec::new());
        assert!(res.is_ok(), "{op} {what}: at the cap, refused: {res:?}");
    }
}

// ---- Quarantine of silent clients --------------------------------------------------------

impl T {
    fn ping(&self, client: Uuid) -> ClientStatus {
        self.call(Request::Ping, Ping { client_id: client })
            .unwrap()
            .status
    }

    /// Advances `ms` in ticks of 100 ms, pinging as `pinging` each second.
    fn run_pinging(&self, ms: u64, pinging: &[Uuid]) {
        for step in 1..=ms / 100 {
            self.advance(100);
            if step % 10 == 0 {
                for &c in pinging {
                    assert_eq!(self.ping(c), ClientStatus::Ok);
                }
            }
            self.svc.tick();
        }
    }

    fn quarantined(&self) -> u64 {
        self.svc.gauges().quarantined_segments
    }
}

fn on(seg: &str) -> ReplicateConfig {
    ReplicateConfig {
        preferred_segment: seg.into(),
        ..ReplicateConfig::default()
    }
}

#[test]
fn a_silent_client_is_quarantined_then_lifted_when_it_pings() {
    let t = T::with(liveness_cfg());
    t.mount_on(C1, 1, "seg1", 64 * MIB, "host1");
    t.mount_on(C2, 2, "seg2", 64 * MIB, "host2");
    t.put_cfg("before", 4096, on("seg1"));
    let m = t.svc.metrics();

    // Three missed pings of C1 are tolerated...
    t.run_pinging(3000, &[C2]);
    assert_eq!(t.quarantined(), 0);
    // ...the next tick after that quarantines seg1.
    t.run_pinging(200, &[C2]);
    assert_eq!(t.quarantined(), 1);
    assert_eq!(Metrics::get(&m.quarantined_clients), 1);
    assert!(t
        .svc
        .render_metrics()
        .lines()
        .any(|l| l == "master_quarantined_segments 1"));

    // No new replica goes there, not even when asked for...
    for i in 0..20 {
        let d = t
            .start_with(C2, &format!("k{i}"), 4096, on("seg1"))
            .unwrap();
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].segment_name, "seg2");
        t.end(C2, &format!("k{i}")).unwrap();
    }
    // ...but what it holds stays listed.
    assert_eq!(t.get("before").unwrap().replicas[0].segment_name, "seg1");

    // C1 pings again: the next tick lifts the quarantine.
    assert_eq!(t.ping(C1), ClientStatus::Ok);
    t.run_pinging(100, &[]);
    assert_eq!(t.quarantined(), 0);
    assert_eq!(Metrics::get(&m.unquarantined_clients), 1);
    let d = t.start_with(C2, "after", 4096, on("seg1")).unwrap();
    assert_eq!(d[0].segment_name, "seg1");
}

#[test]
fn quarantine_leaves_no_room_then_expiry_unmounts() {
    let t = T::with(liveness_cfg());
    t.mount_on(C1, 1, "seg1", 64 * MIB, "host1");
    t.put("held", 4096);
    t.run_pinging(3500, &[]);
    assert_eq!(t.quarantined(), 1);
    assert_eq!(t.start("k", 4096), Err(ErrorCode::NoAvailableHandle));
    assert!(t.get("held").is_ok());
    // client_ttl (10 s) still expires it, with its segment and replicas.
    t.run_pinging(7000, &[]);
    assert_eq!(t.svc.gauges().segments, 0);
    assert_eq!(t.quarantined(), 0);
    assert_eq!(t.get("held"), Err(ErrorCode::ObjectNotFound));
    assert_eq!(Metrics::get(&t.svc.metrics().expired_clients), 1);
}

#[test]
fn a_stalled_master_does_not_quarantine_everyone() {
    let t = T::with(liveness_cfg());
    t.mount_on(C1, 1, "seg1", 64 * MIB, "host1");
    t.svc.tick();
    // The master did not run for 5 s (no tick, no ping handled): nobody is blamed.
    t.advance(5000);
    t.svc.tick();
    assert_eq!(t.quarantined(), 0);
    t.run_pinging(3000, &[]);
    assert_eq!(t.quarantined(), 0);
    // Silence after the stall still counts.
    t.run_pinging(200, &[]);
    assert_eq!(t.quarantined(), 1);
}

#[test]
fn a_stall_of_the_master_does_not_lift_a_quarantine() {
    let t = T::with(liveness_cfg());
    t.mount_on(C1, 1, "seg1", 64 * MIB, "host1");
    t.mount_on(C2, 2, "seg2", 64 * MIB, "host2");
    t.run_pinging(3200, &[C2]);
    assert_eq!(t.quarantined(), 1);
    // The master's ticks stop for 1.5 s (a loaded machine); C2's pings wait, C1 stays silent.
    t.advance(1500);
    assert_eq!(t.ping(C2), ClientStatus::Ok);
    t.svc.tick();
    assert_eq!(
        t.quarantined(),
        1,
        "the stall lifted a silent client's quarantine"
    );
    assert_eq!(Metrics::get(&t.svc.metrics().unquarantined_clients), 0);
    let d = t.start_with(C2, "during", 4096, on("seg1")).unwrap();
    assert_eq!(d[0].segment_name, "seg2");
    // Only a ping lifts it.
    assert_eq!(t.ping(C1), ClientStatus::Ok);
    t.svc.tick();
    assert_eq!(t.quarantined(), 0);
}

#[test]
fn readers_get_quarantined_replicas_last_and_upserts_move_off_them() {
    let t = T::with(liveness_cfg());
    t.mount_on(C1, 1, "seg1", 64 * MIB, "host1");
    t.mount_on(C2, 2, "seg2", 64 * MIB, "host2");
    let two = ReplicateConfig {
        replica_num: 2,
        preferred_segments: vec!["seg1".into(), "seg2".into()],
        ..ReplicateConfig::default()
    };
    t.put_cfg("k", 4096, two);
    t.put_cfg("u", 4096, on("seg1"));
    let names = |key: &str| -> Vec<String> {
        t.get(key)
            .unwrap()
            .replicas
            .into_iter()
            .map(|r| r.segment_name)
            .collect()
    };
    assert_eq!(names("k"), ["seg1", "seg2"]);
    t.run_pinging(3500, &[C2]);
    assert_eq!(t.quarantined(), 1);
    assert_eq!(names("k"), ["seg2", "seg1"]);
    // An upsert of the same size does not rewrite in place on the quarantined segment.
    t.advance(600);
    let d = upsert(&t, C2, "u", 4096).unwrap();
    assert_eq!(d[0].segment_name, "seg2");
}

#[test]
fn a_client_remounting_while_quarantined_keeps_the_invariant() {
    let t = T::with(liveness_cfg());
    t.mount_on(C1, 1, "seg1", 64 * MIB, "host1");
    t.run_pinging(3500, &[]);
    assert_eq!(t.quarantined(), 1);
    // A new segment of the quarantined client joins its quarantine until the next tick...
    t.mount_on(C1, 2, "seg2", 64 * MIB, "host2");
    assert_eq!(t.quarantined(), 2);
    // ...which lifts it: the mount was heard from the client.
    t.svc.tick();
    assert_eq!(t.quarantined(), 0);
    t.put("k", 4096);
}

/// Two owners' segments for the version tests: seg1 (C1) and seg2 (C2), 64 MiB each.
pub(super) fn version_segments() -> (Segment, Segment) {
    let seg = |n: u64, name: &str| Segment {
        id: Uuid::from_parts(100, n),
        name: name.into(),
        base: n << 40,
        size: 64 * MIB,
        te_endpoint: format!("{name}-te"),
        protocol: "tcp".into(),
        host_id: format!("h{n}"),
        ..Default::default()
    };
    (seg(1, "seg1"), seg(2, "seg2"))
}

pub(super) fn held_at(
    key: &str,
    size: u64,
    seg: &Segment,
    off: u64,
    version: Version,
) -> HeldObject {
    HeldObject {
        key: key.into(),
        size,
        segment_name: seg.name.clone(),
        buffer_address: seg.base + off,
        with_hard_pin: false,
        version,
        soft_pin_ttl_ms: None,
    }
}

pub(super) fn remount_held(t: &T, client: Uuid, seg: &Segment, held: Vec<HeldObject>) {
    let r = t.call(
        Request::ReMountSegment,
        ReMountSegment {
            client_id: client,
            segments: vec![seg.clone()],
            held,
        },
    );
    assert_eq!(r, Ok(()));
}

fn freed_of(t: &T, client: Uuid) -> Vec<(u64, u64)> {
    t.call(Request::Ping, Ping { client_id: client })
        .unwrap()
        .freed
}

#[test]
fn writes_get_growing_versions_and_removes_name_them() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let a = t.put("a", 4096);
    let b = t.put("b", 4096);
    assert!(a[0].version.term > 0);
    assert!(b[0].version > a[0].version);
    // An upsert, in place or not, is a newer write.
    let up = t
        .call(
            Request::UpsertStart,
            UpsertStart {
                client_id: C1,
                key: "a".into(),
                size: 4096,
                config: ReplicateConfig::default(),
            },
        )
        .unwrap()
        .replicas;
    assert!(up[0].version > b[0].version);
    t.end(C1, "a").unwrap();
    let gone = t
        .call(
            Request::Remove,
            Remove {
                key: "a".into(),
                force: false,
            },
        )
        .unwrap();
    let named = |d: &[ReplicaDescriptor]| -> Vec<(u64, Version)> {
        d.iter().map(|r| (r.buffer_address, r.version)).collect()
    };
    assert_eq!(
        named(&gone),
        named(&up),
        "the remove names the replicas and version it freed"
    );
}

#[test]
fn remount_keeps_the_newest_version_of_each_key() {
    let (s1, s2) = version_segments();
    let v = |seq| Version { term: 5, seq };
    for old_first in [true, false] {
        let t = T::new();
        let old = (C1, &s1, vec![held_at("k", 4096, &s1, 0, v(1))]);
        let new = (C2, &s2, vec![held_at("k", 8192, &s2, 0, v(2))]);
        let order = if old_first { [old, new] } else { [new, old] };
        for (client, seg, held) in order {
            remount_held(&t, client, seg, held);
        }
        let l = t.get("k").unwrap();
        assert_eq!(l.replicas.len(), 1, "old first: {old_first}");
        assert_eq!(l.replicas[0].segment_name, "seg2");
        assert_eq!(l.replicas[0].version, v(2));
        // The stale range is told to its owner, which drops its catalog entry; when k@1 was
        // in the index first, once the read lease a re-report starts with has ended.
        t.advance(cfg().default_kv_lease_ttl_ms);
        t.svc.tick();
        assert_eq!(freed_of(&t, C1), vec![(s1.base, 4096)]);
        assert_eq!(t.used(), 8192);
    }
    // The same version from two owners: two replicas of one object.
    let t = T::new();
    remount_held(&t, C1, &s1, vec![held_at("k", 4096, &s1, 0, v(3))]);
    remount_held(&t, C2, &s2, vec![held_at("k", 4096, &s2, 0, v(3))]);
    assert_eq!(t.get("k").unwrap().replicas.len(), 2);
}

/// A soft pin survives a failover (`docs/ha.md`, "Soft pins after a failover"). The owners
/// re-report the pin their puts asked for; the new leader pins the object for a full ttl from
/// the re-report (never less than the original deadline, at most one ttl more), and eviction
/// passes it over.
#[test]
fn re_reported_soft_pins_are_restored_and_block_eviction() {
    let (s1, s2) = version_segments();
    let t = T::with(ServiceConfig {
        allow_evict_soft_pinned_objects: false,
        ..evict_cfg()
    });
    let v = |seq| Version { term: 5, seq };
    let pinned = |i: u64, ttl| HeldObject {
        soft_pin_ttl_ms: Some(ttl),
        ..held_at(&format!("s{i}"), MIB, &s1, i * MIB, v(i + 1))
    };
    let mut held: Vec<HeldObject> = (0..55).map(|i| pinned(i, 60_000)).collect();
    held.push(pinned(55, 0)); // the master's default ttl
    remount_held(&t, C1, &s1, held);
    assert_eq!(t.svc.gauges().soft_pin_key_count, 56);
    // The restarted read leases (500 ms) lapse; plain objects fill the segment past the
    // watermark. The pinned ones are the oldest, yet only the plain ones may go.
    t.advance(1000);
    fill(&t, "p", 6);
    t.svc.tick();
    let left = t.svc.all_keys();
    assert!(Metrics::get(&t.svc.metrics().evicted_keys) > 0);
    assert!(left.iter().all(|k| k.starts_with('s')), "{left:?}");
    assert_eq!(left.len(), 56);
    // Pinned for a full ttl from the re-report: 1006 ms have passed.
    t.advance(60_000 - 1006 - 1);
    assert_eq!(t.svc.gauges().soft_pin_key_count, 56);
    t.advance(1);
    assert_eq!(
        t.svc.gauges().soft_pin_key_count,
        1,
        "the default ttl runs on"
    );

    // A replica re-reported by a second owner: the object keeps the later deadline; a ttl
    // above the maximum is capped like a put's.
    let t = T::new();
    let max = cfg().max_kv_soft_pin_ttl_ms;
    remount_held(&t, C1, &s1, vec![held_at("k", MIB, &s1, 0, v(9))]);
    assert_eq!(t.svc.gauges().soft_pin_key_count, 0, "re-reported unpinned");
    let pinned2 = HeldObject {
        soft_pin_ttl_ms: Some(u64::MAX),
        ..held_at("k", MIB, &s2, 0, v(9))
    };
    remount_held(&t, C2, &s2, vec![pinned2]);
    assert_eq!(t.get("k").unwrap().replicas.len(), 2);
    assert_eq!(t.svc.gauges().soft_pin_key_count, 1);
    t.advance(max - 1);
    assert_eq!(t.svc.gauges().soft_pin_key_count, 1);
    t.advance(1);
    assert_eq!(
        t.svc.gauges().soft_pin_key_count,
        0,
        "capped at the maximum ttl"
    );
}

/// An upsert answers the soft pin its object will carry (`docs/ha.md`, "Soft pins after a
/// failover"), which the writer records in the owners' catalogs for a new leader to restore.
/// For `PRESERVE` that is the master's own pin, which the writer cannot know otherwise: what
/// is left of a running one (so that a pin restored for that long from a later re-report ends
/// no earlier than this one), the full ttl of one that starts when the object becomes
/// readable, none for a lapsed one.
#[test]
fn upserts_answer_the_soft_pin_the_object_will_carry() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let with = |soft_pin_action, soft_pin_ttl_ms| ReplicateConfig {
        soft_pin_action,
        soft_pin_ttl_ms,
        ..Default::default()
    };
    let preserve = || with(SoftPinAction::Preserve, None);
    let enable = |ttl| with(SoftPinAction::Enable, ttl);
    // The answer, the upsert then completed.
    let pin = |key: &str, size, config| {
        let started = upsert_cfg(&t, C1, key, size, config).expect("upsert start");
        t.end(C1, key).expect("upsert end");
        started.soft_pin_ttl_ms
    };
    assert_eq!(
        pin("k", 4096, preserve()),
        None,
        "a new key: nothing to keep"
    );
    assert_eq!(pin("k", 4096, enable(Some(60_000))), Some(60_000));
    t.advance(10_000);
    assert_eq!(pin("k", 4096, preserve()), Some(50_000), "kept in place");
    t.advance(1000);
    assert_eq!(
        pin("k", 8192, preserve()),
        Some(49_000),
        "kept in new buffers"
    );
    // The kept pin ends when the first one does.
    t.advance(49_000 - 1);
    assert_eq!(t.svc.gauges().soft_pin_key_count, 1);
    t.advance(1);
    assert_eq!(t.svc.gauges().soft_pin_key_count, 0);
    assert_eq!(pin("k", 8192, preserve()), None, "a lapsed pin");
    assert_eq!(
        pin("k", 8192, enable(None)),
        Some(cfg().default_kv_soft_pin_ttl_ms)
    );
    assert_eq!(pin("k", 8192, enable(Some(0))), None);
    assert_eq!(pin("k", 8192, with(SoftPinAction::Disable, None)), None);
    // Over a put in flight: the pin that put asked for, from the upsert's completion.
    t.start_with(C2, "f", 4096, enable(Some(30_000))).unwrap();
    assert_eq!(pin("f", 4096, preserve()), Some(30_000));
    // The batch form answers per key.
    let keys: Vec<String> = ["f", "k", "new"].map(String::from).to_vec();
    let started = t
        .call(
            Request::BatchUpsertStart,
            BatchUpsertStart {
                client_id: C1,
                keys: keys.clone(),
                sizes: vec![4096; 3],
                config: preserve(),
            },
        )
        .unwrap();
    let pins: Vec<_> = started
        .into_iter()
        .map(|s| s.map(|s| s.soft_pin_ttl_ms))
        .collect();
    assert_eq!(pins, vec![Ok(Some(30_000)), Ok(None), Ok(None)]);
}

/// A put over a stale put in flight makes a new object: with `PRESERVE` it keeps no pin of
/// the write it replaces, which never became readable. Its writer records the pin of its own
/// config in the catalogs, so a kept pin would come back unpinned after a failover.
#[test]
fn a_put_over_a_discarded_put_keeps_none_of_its_soft_pin() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let enable = ReplicateConfig {
        soft_pin_action: SoftPinAction::Enable,
        soft_pin_ttl_ms: Some(cfg().discard_timeout_ms() * 10),
        ..Default::default()
    };
    t.start_with(C2, "k", 4096, enable).unwrap();
    assert_eq!(t.svc.gauges().soft_pin_key_count, 1);
    t.advance(cfg().discard_timeout_ms());
    t.start_with(C1, "k", 4096, ReplicateConfig::default())
        .unwrap();
    t.end(C1, "k").unwrap();
    assert_eq!(t.svc.gauges().soft_pin_key_count, 0);
}

#[test]
fn re_reported_tombstones_keep_removed_keys_removed() {
    let (s1, s2) = version_segments();
    let v = |seq| Version { term: 5, seq };
    let tomb = |key: &str, seg: &Segment, version| HeldObject {
        size: 0,
        buffer_address: 0,
        ..held_at(key, 1, seg, 0, version)
    };
    let t = T::new();
    // seg1 still holds k@1 (its owner never heard of the free); seg2's owner buried k@2.
    remount_held(&t, C1, &s1, vec![held_at("k", 4096, &s1, 0, v(1))]);
    remount_held(&t, C2, &s2, vec![tomb("k", &s2, v(2))]);
    assert_eq!(t.get("k").map(|_| ()), Err(ErrorCode::ObjectNotFound));
    // Freed once the read lease the re-report started with has ended.
    assert!(freed_of(&t, C1).is_empty());
    t.advance(cfg().default_kv_lease_ttl_ms);
    t.svc.tick();
    assert_eq!(freed_of(&t, C1), vec![(s1.base, 4096)]);
    assert_eq!(t.used(), 0);
    // An older version reported after the tombstone is refused too; a newer one is a new
    // write and stays.
    remount_held(&t, C1, &s1, vec![held_at("k", 4096, &s1, 0, v(1))]);
    assert_eq!(t.get("k").map(|_| ()), Err(ErrorCode::ObjectNotFound));
    assert_eq!(freed_of(&t, C1), vec![(s1.base, 4096)]);
    remount_held(&t, C1, &s1, vec![held_at("k", 4096, &s1, 0, v(3))]);
    assert_eq!(t.get("k").unwrap().replicas[0].version, v(3));
    // A key removed in this term: a late re-report of it does not bring it back.
    remount_held(&t, C2, &s2, vec![held_at("r", 4096, &s2, 0, v(4))]);
    t.remove("r", true).unwrap();
    freed_of(&t, C2);
    remount_held(&t, C2, &s2, vec![held_at("r", 4096, &s2, 0, v(4))]);
    assert_eq!(t.get("r").map(|_| ()), Err(ErrorCode::ObjectNotFound));
}

#[test]
fn removals_the_owners_did_not_hear_of_reach_the_next_term() {
    let (s1, _) = version_segments();
    let old = |seq| Version { term: 4, seq };
    let held = || {
        vec![
            held_at("a-1", 4096, &s1, 0, old(1)),
            held_at("a-2", 4096, &s1, 4096, old(2)),
            held_at("b-1", 4096, &s1, 8192, old(3)),
            held_at("k", 4096, &s1, 12288, old(4)),
        ]
    };
    let t = T::new();
    t.svc.reset(5, &[]);
    t.advance(RECOVERY_FENCE_MS);
    remount_held(&t, C1, &s1, held());
    t.remove("k", true).unwrap();
    // The remover could not bury k in its owner's catalog and hands it to the master; a
    // pattern removal takes the a-* keys. Both are for etcd (an HA leader collects them).
    let mut out = Vec::new();
    let records = {
        let mut b = t.svc.batch();
        b.handle(
            Request::RemoveByRegex(RemoveByRegex {
                pattern: "^a-".into(),
                force: true,
            }),
            &mut out,
        );
        b.handle(
            Request::KeepRemoved(KeepRemoved {
                keys: vec!["k".into()],
                versions: vec![old(4)],
            }),
            &mut out,
        );
        b.take_durable()
    };
    assert_eq!(records.len(), 2, "{records:?}");
    let mut bad = Vec::new();
    let mut b = t.svc.batch();
    b.handle(
        Request::KeepRemoved(KeepRemoved {
            keys: vec!["k".into()],
            versions: vec![],
        }),
        &mut bad,
    );
    assert!(
        b.take_durable().is_empty(),
        "a refused request stores nothing"
    );
    drop(b);
    assert_eq!(
        <Result<(), ErrorCode>>::from_bytes(&bad).unwrap(),
        Err(ErrorCode::InvalidParams)
    );

    // The next leader knows only the records; the owner re-reports everything it holds.
    t.svc.reset(9, &records);
    t.advance(RECOVERY_FENCE_MS);
    remount_held(&t, C1, &s1, held());
    for gone in ["a-1", "a-2", "k"] {
        assert_eq!(
            t.get(gone).map(|_| ()),
            Err(ErrorCode::ObjectNotFound),
            "{gone}"
        );
    }
    assert_eq!(t.get("b-1").unwrap().replicas[0].version, old(3));
    let mut freed = freed_of(&t, C1);
    freed.sort_unstable();
    assert_eq!(
        freed,
        vec![
            (s1.base, 4096),
            (s1.base + 4096, 4096),
            (s1.base + 12288, 4096)
        ]
    );
    // A write after the removal with a matching name is newer than it, and stays.
    remount_held(
        &t,
        C1,
        &s1,
        vec![held_at(
            "a-9",
            4096,
            &s1,
            16384,
            Version { term: 5, seq: 99 },
        )],
    );
    assert!(t.exist("a-9"));
}

/// An owner slower than the recovery fence (`owners.rs`): until every owner of the registry
/// the new leader loaded has re-reported, a key the index lacks may be one of the missing
/// owner's, so it is "ask again", not "not found"; the wait ends at `client_ttl`.
#[test]
fn a_missing_registered_owner_makes_misses_wait_not_answer_not_found() {
    let (s1, s2) = version_segments();
    let old = |seq| Version { term: 5, seq };
    let wait = Err(ErrorCode::UnavailableInCurrentStatus);
    let t = T::new();
    t.svc.reset(9, &[]);
    t.svc.await_owners(&[C1, C2]);
    remount_held(&t, C1, &s1, vec![held_at("k1", 4096, &s1, 0, old(1))]);
    t.advance(RECOVERY_FENCE_MS);
    // C2 (holding k2) is still silent: k1 reads, k2 and absent keys wait.
    assert_eq!(t.svc.gauges().owners_awaited, 1);
    assert!(t.exist("k1"));
    assert_eq!(t.get("k2").map(|_| ()), wait);
    assert_eq!(
        t.call(Request::ExistKey, ExistKey { key: "k2".into() }),
        wait.map(|()| false)
    );
    assert_eq!(t.remove("k2", true), wait);
    assert_eq!(
        t.call(
            Request::BatchExistKey,
            BatchExistKey {
                keys: vec!["k1".into(), "k2".into()],
            },
        )
        .unwrap(),
        vec![Ok(true), Err(ErrorCode::UnavailableInCurrentStatus)]
    );
    // A pattern remove would miss C2's keys, which would then come back: it waits too.
    assert_eq!(
        t.call(
            Request::RemoveByRegex,
            RemoveByRegex {
                pattern: "^k".into(),
                force: true,
            },
        ),
        wait.map(|()| 0)
    );
    // C2 re-reports: k2 is there, and a key nobody holds is not found again.
    remount_held(&t, C2, &s2, vec![held_at("k2", 4096, &s2, 0, old(2))]);
    assert_eq!(t.svc.gauges().owners_awaited, 0);
    assert!(t.exist("k2"));
    assert_eq!(t.get("absent").map(|_| ()), Err(ErrorCode::ObjectNotFound));
    assert!(!t.exist("absent"));

    // An owner that never comes back is waited for `client_ttl` after the election, then
    // forgotten (and deleted from the registry).
    let t = T::new();
    t.svc.reset(9, &[]);
    t.svc.await_owners(&[C1, C2]);
    remount_held(&t, C1, &s1, vec![]);
    t.advance(cfg().client_ttl_s * 1000 - 1);
    assert_eq!(t.get("k2").map(|_| ()), wait);
    freed_of(&t, C1); // C1 pings, so only C2 is silent
    t.advance(1);
    assert_eq!(t.get("k2").map(|_| ()), Err(ErrorCode::ObjectNotFound));
    t.svc.tick();
    assert_eq!(t.svc.take_gone_owners(), vec![C2]);
}

/// An HA leader registers each owner at its first mount, for etcd before the answer, and
/// forgets it when its last segment goes; a master without HA keeps no registry.
#[test]
fn owners_are_registered_at_their_first_mount_and_forgotten_with_their_last_segment() {
    let (s1, s2) = version_segments();
    let mount = |t: &T, client: Uuid, seg: &Segment| {
        let mut out = Vec::new();
        let mut b = t.svc.batch();
        b.handle(
            Request::MountSegment(MountSegment {
                client_id: client,
                segment: seg.clone(),
            }),
            &mut out,
        );
        b.take_new_owners()
    };
    let t = T::new();
    assert!(mount(&t, C1, &s1).is_empty(), "no HA, no registry");
    let t = T::new();
    t.svc.reset(9, &[]);
    assert_eq!(mount(&t, C1, &s1), vec![C1]);
    assert!(mount(&t, C1, &s1).is_empty(), "registered once");
    assert_eq!(mount(&t, C2, &s2), vec![C2]);
    assert_eq!(
        t.call(
            Request::UnmountSegment,
            UnmountSegment {
                client_id: C1,
                segment_id: s1.id,
            },
        ),
        Ok(())
    );
    assert_eq!(t.svc.take_gone_owners(), vec![C1]);
    // Expired: forgotten too.
    t.advance(cfg().client_ttl_s * 1000);
    t.svc.tick();
    assert_eq!(t.svc.take_gone_owners(), vec![C2]);
}

/// A late re-report (an owner slower than the recovery fence) replaces or buries an object a
/// reader is reading: its buffers are parked until the reader's lease ends, not handed to the
/// next put at once (`docs/reliability.md`, randomized faults, violation 2).
#[test]
fn a_late_re_report_parks_the_buffers_of_the_object_it_replaces() {
    let (s1, s2) = version_segments();
    let v = |seq| Version { term: 5, seq };
    const SIZE: u64 = 2 * MIB; // extent-sized, so that the next put of this size reuses it
    for tombstone in [false, true] {
        let t = T::new();
        t.svc.reset(9, &[]);
        remount_held(&t, C1, &s1, vec![held_at("k", SIZE, &s1, 0, v(1))]);
        t.advance(RECOVERY_FENCE_MS);
        // After the fence a reader gets k@1 on seg1, with a lease...
        let l = t.get("k").unwrap();
        assert_eq!(l.replicas[0].buffer_address, s1.base);
        // ...then seg2's owner re-mounts late, with k@2 or with k's tombstone at 2.
        let late = if tombstone {
            HeldObject {
                size: 0,
                buffer_address: 0,
                ..held_at("k", 1, &s2, 0, v(2))
            }
        } else {
            held_at("k", SIZE, &s2, 0, v(2))
        };
        remount_held(&t, C2, &s2, vec![late]);
        // Another key's put must not get the range the reader is reading.
        let d = t.start_with(C1, "other", SIZE, on("seg1")).unwrap();
        assert_ne!(
            d[0].buffer_address, s1.base,
            "tombstone {tombstone}: k@1's buffer went to another key under its reader"
        );
        assert!(freed_of(&t, C1).is_empty(), "not freed while leased");
        // Once the lease ended the range is free, and told to its owner.
        t.advance(cfg().default_kv_lease_ttl_ms);
        t.svc.tick();
        assert_eq!(freed_of(&t, C1), vec![(s1.base, SIZE)]);
        let d = t.start_with(C1, "third", SIZE, on("seg1")).unwrap();
        assert_eq!(d[0].buffer_address, s1.base);
    }
}

/// Interleavings of a new term's writes with re-reports that could make two keys share bytes
/// (`docs/reliability.md`, violation 2): each ends with one owner per byte.
#[test]
fn re_reports_never_double_book_a_range_a_new_term_write_holds() {
    let (s1, _) = version_segments();
    let old = |seq| Version { term: 5, seq };
    const SIZE: u64 = 2 * MIB; // extent-sized: placement takes the lowest free range
    let t = T::new();
    t.svc.reset(9, &[]);
    // A re-mount cut in two calls (its held objects over REMOUNT_HELD_BYTES_MAX): the first
    // mounts seg1 with `a`; a put placed before the second takes the range after `a`...
    remount_held(&t, C1, &s1, vec![held_at("a", SIZE, &s1, 0, old(1))]);
    let p = t.start_with(C2, "p", SIZE, on("seg1")).unwrap();
    assert_eq!(p[0].buffer_address, s1.base + SIZE);
    t.end(C2, "p").unwrap();
    // ...which the second call reports `b` in, and an older `p`: both refused, and the range
    // is not told freed (that would drop p's catalog entry).
    remount_held(
        &t,
        C1,
        &s1,
        vec![
            held_at("b", SIZE, &s1, SIZE, old(2)),
            held_at("p", SIZE, &s1, SIZE, old(3)),
        ],
    );
    t.advance(RECOVERY_FENCE_MS);
    assert_eq!(t.get("b").map(|_| ()), Err(ErrorCode::ObjectNotFound));
    let l = t.get("p").unwrap();
    assert_eq!(l.replicas.len(), 1);
    assert_eq!(l.replicas[0].buffer_address, s1.base + SIZE);
    assert!(l.replicas[0].version.term == 9);
    assert!(freed_of(&t, C1).is_empty());
    // A stale version of `a` inside p's range, reported again later in the term: refused,
    // nothing freed, and the next put does not get p's range.
    remount_held(
        &t,
        C1,
        &s1,
        vec![held_at("a", 4096, &s1, SIZE + 4096, old(0))],
    );
    assert!(freed_of(&t, C1).is_empty());
    let q = t.start_with(C2, "q", SIZE, on("seg1")).unwrap();
    let (qa, pa) = (q[0].buffer_address, s1.base + SIZE);
    assert!(
        qa + SIZE <= pa || qa >= pa + SIZE,
        "q at {qa:#x} overlaps p"
    );
}

// ---- Owner-checked replica clear ---------------------------------------------------------

impl T {
    fn clear(
        &self,
        client: Uuid,
        keys: &[&str],
        segment_name: &str,
    ) -> Vec<Result<Vec<ReplicaDescriptor>, ErrorCode>> {
        self.call(
            Request::BatchReplicaClear,
            BatchReplicaClear {
                client_id: client,
                keys: keys.iter().map(|k| k.to_string()).collect(),
                segment_name: segment_name.into(),
            },
        )
        .unwrap()
    }

    fn tombstone(&self, key: &str) -> Option<Version> {
        self.svc.state.lock().tombstones.get(key)
    }
}

#[test]
fn replica_clear_takes_only_the_callers_idle_complete_objects() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let a = t.put("a", 4096);
    t.start_with(C2, "theirs", 4096, ReplicateConfig::default())
        .unwrap();
    t.end(C2, "theirs").unwrap();
    t.start("inflight", 4096).unwrap();
    t.put("read", 4096);
    t.get("read").unwrap();
    t.put("probed", 4096);
    assert!(t.exist("probed"));
    assert_eq!(t.clear(C1, &[], ""), vec![]);
    let r = t.clear(
        C1,
        &["a", "theirs", "inflight", "read", "probed", "nope", ""],
        "",
    );
    assert_eq!(
        r[1..],
        [
            Err(ErrorCode::IllegalClient),
            Err(ErrorCode::ReplicaIsNotReady),
            Err(ErrorCode::ObjectHasLease),
            Err(ErrorCode::ObjectHasLease),
            Err(ErrorCode::ObjectNotFound),
            Err(ErrorCode::InvalidParams),
        ]
    );
    // The answer names the freed replica with its version, for the caller to bury.
    let freed = r[0].as_ref().unwrap();
    assert_eq!(freed.len(), 1);
    assert_eq!(freed[0].buffer_address, a[0].buffer_address);
    assert_eq!(freed[0].version, a[0].version);
    // As a remove: gone, tombstoned at the version removed.
    assert!(!t.exist("a"));
    assert_eq!(t.tombstone("a"), Some(a[0].version));
    assert!(t.exist("theirs"));
    // The leases run out: now they go. The other client's object stays its own.
    t.advance(500);
    let r = t.clear(C1, &["read", "probed", "theirs"], "");
    assert!(r[0].is_ok() && r[1].is_ok(), "{r:?}");
    assert_eq!(r[2], Err(ErrorCode::IllegalClient));
    assert_eq!(
        t.clear(C2, &["theirs"], "")[0].as_ref().map(|v| v.len()),
        Ok(1)
    );
    // Only the put in flight holds space now.
    assert_eq!(t.used(), 4096);
    let m = t.svc.metrics();
    assert_eq!(m.batch_counts(BatchOp::ReplicaClear), (4, 0, 11, 7));
}

#[test]
fn replica_clear_of_one_segment_keeps_the_other_replicas_and_leaves_no_tombstone() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.mount(2, 64 * MIB);
    t.mount(3, 64 * MIB);
    let two = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let d = t.start_with(C1, "k", 4096, two).unwrap();
    t.end(C1, "k").unwrap();
    let on: Vec<&str> = d.iter().map(|r| r.segment_name.as_str()).collect();
    let idle = ["seg1", "seg2", "seg3"]
        .into_iter()
        .find(|s| !on.contains(s))
        .unwrap();
    // No replica there, or no such segment: skipped.
    assert_eq!(
        t.clear(C1, &["k"], idle),
        vec![Err(ErrorCode::ReplicaNotFound)]
    );
    assert_eq!(
        t.clear(C1, &["k"], "nosuchseg"),
        vec![Err(ErrorCode::SegmentNotFound)]
    );
    t.ping(C1);
    // One replica goes: nothing to bury, no tombstone, the other stays readable as it was.
    assert_eq!(t.clear(C1, &["k"], on[0]), vec![Ok(vec![])]);
    assert_eq!(t.tombstone("k"), None);
    assert_eq!(t.used(), 4096);
    let left = t.get("k").unwrap();
    assert_eq!(left.replicas.len(), 1);
    assert_eq!(left.replicas[0].segment_name, on[1]);
    assert_eq!(left.replicas[0].version, d[0].version);
    // Its owner hears of the freed range at its next ping (its catalog drops the entry).
    let gone = d.iter().find(|r| r.segment_name == on[0]).unwrap();
    let freed = t.call(Request::Ping, Ping { client_id: C1 }).unwrap().freed;
    assert_eq!(freed, vec![(gone.buffer_address, 4096)]);
    // The last replica takes the object with it, as a remove (after the read's lease).
    assert_eq!(
        t.clear(C1, &["k"], on[1]),
        vec![Err(ErrorCode::ObjectHasLease)]
    );
    t.advance(500);
    let r = t.clear(C1, &["k"], on[1]);
    assert_eq!(r[0].as_ref().map(|v| v.len()), Ok(1));
    assert_eq!(t.tombstone("k"), Some(d[0].version));
    assert_eq!(t.get("k"), Err(ErrorCode::ObjectNotFound));
    assert_eq!(t.used(), 0);
}

// ---- Lease groups (`group_ids`) ------------------------------------------------------------

fn grouped(g: &str) -> ReplicateConfig {
    ReplicateConfig {
        group_ids: vec![g.into()],
        ..Default::default()
    }
}

/// A lease on a grouped key covers every key of its group at that moment (read and probe
/// leases), not a key that joins later; other groups, ungrouped keys and `""` are not
/// covered.
/// Behaviour observed on upstream's 0.3.13 wheel (`python/tests/test_dropin_groups.py`).
#[test]
fn a_lease_on_a_grouped_key_covers_its_group() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    t.put_cfg("a", 100, grouped("g"));
    t.put_cfg("b", 100, grouped("g"));
    t.put_cfg("c", 100, grouped("h"));
    t.put("d", 100);
    t.get("a").unwrap();
    assert_eq!(
        t.remove("b", false),
        Err(ErrorCode::ObjectHasLease),
        "same group"
    );
    assert_eq!(t.remove("c", false), Ok(()), "another group");
    assert_eq!(t.remove("d", false), Ok(()), "no group");
    t.put_cfg("e", 100, grouped("g"));
    assert_eq!(
        t.remove("e", false),
        Ok(()),
        "a key that joined after the read"
    );
    t.put_cfg("e", 100, grouped("g"));
    t.get("b").unwrap();
    assert_eq!(
        t.remove("e", false),
        Err(ErrorCode::ObjectHasLease),
        "the next read covers it"
    );
    t.advance(500);
    assert_eq!(t.remove("b", false), Ok(()), "the lease ended");
    t.put_cfg("f", 100, grouped("g"));
    assert!(t.exist("a"));
    assert_eq!(
        t.remove("f", false),
        Err(ErrorCode::ObjectHasLease),
        "a probe lease"
    );
    assert_eq!(t.remove("f", true), Ok(()), "force ignores it");
    t.put_cfg("x", 100, grouped(""));
    t.put_cfg("y", 100, grouped(""));
    t.advance(500);
    t.get("x").unwrap();
    assert_eq!(t.remove("y", false), Ok(()), "\"\" is no group");
}

/// `group_ids` names one group per key (one for a single put), else `INVALID_PARAMS`; an
/// upsert may not move a key into, out of or across groups, and one without groups keeps
/// the key's (also when it reallocates).
#[test]
fn group_ids_fit_the_keys_and_upserts_keep_a_keys_group() {
    let t = T::new();
    t.mount(1, 64 * MIB);
    let two = ReplicateConfig {
        group_ids: vec!["g".into(), "h".into()],
        ..Default::default()
    };
    assert_eq!(
        t.start_with(C1, "k", 10, two.clone()).err(),
        Some(ErrorCode::InvalidParams)
    );
    let batch = |keys: &[&str], config: ReplicateConfig| {
        t.call(
            Request::BatchPutStart,
            BatchPutStart {
                client_id: C1,
                keys: keys.iter().map(|k| k.to_string()).collect(),
                sizes: vec![10; keys.len()],
                config,
            },
        )
        .unwrap()
    };
    assert_eq!(
        batch(&["p", "q"], grouped("g")),
        vec![Err(ErrorCode::InvalidParams); 2]
    );
    assert!(batch(&["p", "q"], two).iter().all(Result::is_ok));
    t.end(C1, "p").unwrap();
    t.end(C1, "q").unwrap();
    t.get("q").unwrap();
    assert_eq!(
        t.remove("p", false),
        Ok(()),
        "p and q are in different groups"
    );

    t.put_cfg("a", 100, grouped("g"));
    t.put_cfg("b", 100, grouped("g"));
    t.put("u", 100);
    let up = |key: &str, size: u64, config: ReplicateConfig| {
        let r = upsert_cfg(&t, C1, key, size, config).map(|_| ());
        if r.is_ok() {
            t.end(C1, key).unwrap();
        }
        r
    };
    assert_eq!(up("a", 100, grouped("h")), Err(ErrorCode::InvalidParams));
    assert_eq!(up("u", 100, grouped("g")), Err(ErrorCode::InvalidParams));
    assert_eq!(up("a", 100, grouped("g")), Ok(()), "same group");
    assert_eq!(up("a", 200, ReplicateConfig::default()), Ok(()), "keeps g");
    t.get("b").unwrap();
    assert_eq!(
        t.remove("a", false),
        Err(ErrorCode::ObjectHasLease),
        "a is still in g after a reallocating upsert without groups"
    );
}
