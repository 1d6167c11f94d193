//! Nodes that join and leave gently (`docs/fleet.md`) through the public surface, on a manual
//! clock: the admission ramp of a fresh segment (`placement.rs`) and the drain of a segment
//! (`drain.rs`).

use protocol::message::*;
use protocol::*;

use super::*;
use crate::model::{cfg, T};
use crate::view::AdminView;

const MIB: u64 = 1 << 20;
const C1: Uuid = Uuid { hi: 1, lo: 1 };
const C2: Uuid = Uuid { hi: 2, lo: 2 };
const C3: Uuid = Uuid { hi: 3, lo: 3 };
const RAMP_MS: u64 = 4000;

fn ramp_cfg() -> ServiceConfig {
    ServiceConfig {
        admission_ramp_ms: RAMP_MS,
        allocation_strategy: AllocationStrategy::FreeRatioFirst,
        ..cfg()
    }
}

impl T {
    /// Puts `key` (one replica, placed by the strategy or on `preferred`); the segment it went to.
    fn put_one(&self, key: &str, size: u64, preferred: &str) -> String {
        let config = ReplicateConfig {
            preferred_segment: preferred.into(),
            ..Default::default()
        };
        let r = self.start_with(C1, key, size, config).expect("put start");
        self.end(C1, key).expect("put end");
        r[0].segment_name.clone()
    }

    fn segment(&self, n: u64, name: &str) -> Segment {
        Segment {
            id: Uuid::from_parts(100, n),
            name: name.into(),
            base: n << 40,
            size: 256 * MIB,
            te_endpoint: format!("{name}-te"),
            protocol: "tcp".into(),
            host_id: format!("host{n}"),
            ..Default::default()
        }
    }

    fn metric(&self, name: &str) -> u64 {
        let text = self.svc.render_metrics();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {name}"))
    }

    fn segment_names(&self) -> Vec<String> {
        self.svc.all_segments()
    }
}

#[test]
fn a_fresh_segment_takes_a_share_that_ramps_up_then_all_by_free_ratio() {
    let t = T::with(ramp_cfg());
    t.mount_on(C1, 1, "s1", 256 * MIB, "h1");
    t.mount_on(C2, 2, "s2", 256 * MIB, "h2");
    // The first two are fresh together: both capped, the strategy still places.
    assert!(!t.put_one("first", MIB, "").is_empty());
    t.advance(RAMP_MS);
    for i in 0..20 {
        t.put_one(&format!("old{i}"), MIB, "");
    }
    assert_eq!(t.metric("master_ramping_segments"), 0);
    t.mount_on(C3, 3, "s3", 256 * MIB, "h3");
    assert_eq!(t.metric("master_ramping_segments"), 1);
    // By free ratio the empty s3 would take every put; for the window its share since it
    // joined stays under (elapsed / window) x one third.
    let (mut placed, mut on_fresh) = (0u64, 0u64);
    for i in 0..400u64 {
        t.advance(RAMP_MS / 400);
        let seg = t.put_one(&format!("new{i}"), 64 << 10, "");
        placed += 1;
        on_fresh += u64::from(seg == "s3");
        let elapsed = (i + 1) * (RAMP_MS / 400);
        let cap = elapsed as f64 / RAMP_MS as f64 / 3.0 * placed as f64;
        assert!(
            on_fresh as f64 <= cap + 1e-9,
            "{on_fresh} of {placed} at {elapsed} ms"
        );
    }
    assert!(on_fresh > 400 / 12, "s3 took too few: {on_fresh}");
    // After the window, free ratio sends everything to the emptiest, s3.
    t.advance(1);
    assert_eq!(t.put_one("after", 64 << 10, ""), "s3");
    assert_eq!(t.metric("master_ramping_segments"), 0);
}

#[test]
fn a_ramp_never_refuses_and_preferred_segments_are_not_capped() {
    let t = T::with(ramp_cfg());
    t.mount_on(C1, 1, "s1", 256 * MIB, "h1");
    // Only a fresh segment: puts still land there.
    assert_eq!(t.put_one("a", MIB, ""), "s1");
    t.advance(RAMP_MS);
    t.put_one("b", MIB, "");
    t.mount_on(C2, 2, "s2", 256 * MIB, "h2");
    // Capped at first, but asked for by name.
    assert_eq!(t.put_one("c", MIB, ""), "s1");
    assert_eq!(t.put_one("d", MIB, "s2"), "s2");
}

#[test]
fn staggered_ramps_end_each_at_its_own_window() {
    let t = T::with(ramp_cfg());
    t.mount_on(C1, 1, "s1", 256 * MIB, "h1");
    t.advance(RAMP_MS / 2);
    t.mount_on(C2, 2, "s2", 256 * MIB, "h2");
    assert_eq!(t.metric("master_ramping_segments"), 2);
    t.advance(RAMP_MS / 2);
    // s1's window is over, s2's is not: s1 is no longer capped, before any tick ends its
    // ramp, while s2 (nothing placed since it joined) is at its cap.
    assert_eq!(t.put_one("a", MIB, ""), "s1");
    t.svc.tick();
    assert_eq!(t.metric("master_ramping_segments"), 1);
    t.advance(RAMP_MS / 2);
    t.svc.tick();
    assert_eq!(t.metric("master_ramping_segments"), 0);
    // By free ratio the emptier s2 takes the next put.
    assert_eq!(t.put_one("b", MIB, ""), "s2");
}

#[test]
fn a_remount_does_not_ramp() {
    let t = T::with(ramp_cfg());
    t.mount_on(C1, 1, "s1", 256 * MIB, "h1");
    t.advance(RAMP_MS);
    t.put_one("x", MIB, "");
    // The owner of s2 re-mounts (a restarted master, a new HA leader): no ramp, and by free
    // ratio the emptier s2 takes the next put at once.
    let r = t.call(
        Request::ReMountSegment,
        ReMountSegment {
            client_id: C2,
            segments: vec![t.segment(2, "s2")],
            held: vec![],
        },
    );
    assert_eq!(r, Ok(()));
    assert_eq!(t.metric("master_ramping_segments"), 0);
    assert_eq!(t.put_one("y", MIB, ""), "s2");
}

#[test]
fn a_drain_moves_only_copies_detaches_the_rest_and_unmounts() {
    let t = T::with(cfg());
    t.mount_on(C1, 1, "s1", 256 * MIB, "h1");
    t.mount_on(C2, 2, "s2", 256 * MIB, "h2");
    t.put_one("only", MIB, "s1");
    let both = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    t.start_with(C1, "both", MIB, both).expect("put start");
    t.end(C1, "both").expect("put end");
    assert_eq!(
        t.svc.drain_segment("nope", 1000),
        Err(ErrorCode::SegmentNotFound)
    );
    t.svc.drain_segment("s1", 10_000).unwrap();
    // Its owner hears of it at its next ping, with the time left (it keeps the drain going
    // on a restarted master); the other owner hears nothing.
    t.advance(1000);
    let ping = |c| t.call(Request::Ping, Ping { client_id: c }).unwrap();
    assert_eq!(ping(C1).draining, [(Uuid::from_parts(100, 1), 9000)]);
    assert!(ping(C2).draining.is_empty());
    // No new allocation on s1 at once.
    for i in 0..5 {
        assert_eq!(t.put_one(&format!("n{i}"), MIB, "s1"), "s2");
    }
    assert_eq!(t.metric("master_draining_segments"), 1);
    t.svc.tick();
    // "both" lost its s1 replica; "only" is being moved by s2's owner.
    assert_eq!(t.metric("master_drain_replicas_detached_total"), 1);
    let w = t
        .call(Request::FetchTasks, FetchTasks { client_id: C2 })
        .unwrap();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].key, "only");
    assert_eq!(w[0].sources[0].segment_name, "s1");
    assert_eq!(w[0].targets[0].segment_name, "s2");
    let done = CompleteTask {
        client_id: C2,
        task_id: w[0].task_id,
        ok: true,
        message: String::new(),
    };
    assert_eq!(t.call(Request::CompleteTask, done), Ok(()));
    let list = t.get("only").unwrap();
    assert_eq!(list.replicas.len(), 1);
    assert_eq!(list.replicas[0].segment_name, "s2");
    // s1 stays while a reader's window on its ranges is open, then goes.
    t.advance(200);
    t.svc.tick();
    let lease = cfg().default_kv_lease_ttl_ms;
    t.advance(lease + 1);
    t.svc.tick();
    t.advance(200);
    t.svc.tick();
    assert_eq!(t.segment_names(), ["s2"]);
    assert_eq!(t.metric("master_drains_completed_total"), 1);
    assert_eq!(t.metric("master_drain_objects_lost_total"), 0);
    for key in ["only", "both"] {
        assert_eq!(t.get(key).unwrap().replicas[0].segment_name, "s2");
    }
}

#[test]
fn a_drain_that_cannot_move_says_how_many_it_lost_at_its_deadline() {
    let t = T::with(cfg());
    t.mount_on(C1, 1, "s1", 256 * MIB, "h1");
    // s2 takes new replicas but has no room for these.
    t.mount_on(C2, 2, "s2", 4 * MIB, "h2");
    t.put_one("fill", 4 * MIB, "s2");
    t.put_one("a", 2 * MIB, "s1");
    t.put_one("b", 2 * MIB, "s1");
    let r = t.call(
        Request::GracefulUnmountSegment,
        GracefulUnmountSegment {
            client_id: C1,
            segment_id: Uuid::from_parts(100, 1),
            grace_ms: 3000,
        },
    );
    assert_eq!(r, Ok(()));
    t.advance(2999);
    t.svc.tick();
    assert_eq!(t.segment_names().len(), 2);
    assert!(t.get("a").is_ok(), "readable while draining");
    t.advance(1);
    t.svc.tick();
    assert_eq!(t.segment_names(), ["s2"]);
    assert_eq!(t.metric("master_drains_timed_out_total"), 1);
    assert_eq!(t.metric("master_drain_objects_lost_total"), 2);
}

#[test]
fn a_drain_with_no_other_segment_gives_up_at_once() {
    let t = T::with(cfg());
    t.mount_on(C1, 1, "s1", 256 * MIB, "h1");
    t.put_one("a", MIB, "");
    t.svc.drain_segment("s1", 60_000).unwrap();
    t.svc.tick();
    assert!(t.segment_names().is_empty());
    assert_eq!(t.metric("master_drain_objects_lost_total"), 1);
    // Its owner hears at its next ping that the segment is gone, once.
    let ping = || t.call(Request::Ping, Ping { client_id: C1 }).unwrap();
    assert_eq!(ping().draining, [(Uuid::from_parts(100, 1), 0)]);
    assert!(ping().draining.is_empty());
}

#[test]
fn a_restarted_master_waits_for_the_owners_to_re_mount_before_giving_a_drain_up() {
    let cfg = ServiceConfig {
        client_ttl_s: 10,
        ..cfg()
    };
    let ttl = cfg.client_ttl_s * 1000;
    let t = T::with(cfg);
    t.svc.tick();
    // The first owner back after the restart re-mounts with what it holds.
    let held = HeldObject {
        key: "a".into(),
        size: MIB,
        segment_name: "s1".into(),
        buffer_address: 1 << 40,
        with_hard_pin: false,
        version: Version { term: 1, seq: 1 },
        soft_pin_ttl_ms: None,
    };
    let r = t.call(
        Request::ReMountSegment,
        ReMountSegment {
            client_id: C1,
            segments: vec![t.segment(1, "s1")],
            held: vec![held],
        },
    );
    assert_eq!(r, Ok(()));
    t.svc.drain_segment("s1", 60_000).unwrap();
    // The other owners of the pool may still be re-mounting, and would take the objects.
    t.advance(ttl - 1);
    let ping = || t.call(Request::Ping, Ping { client_id: C1 }).unwrap();
    ping();
    t.svc.tick();
    assert_eq!(t.segment_names(), ["s1"]);
    // Past the window (and the next drain scan): nobody came.
    t.advance(200);
    ping();
    t.svc.tick();
    assert!(t.segment_names().is_empty());
    assert_eq!(t.metric("master_drain_objects_lost_total"), 1);
}

#[test]
fn a_starting_owners_empty_disk_is_not_a_restart_and_a_drain_gives_up_at_once() {
    let cfg = ServiceConfig {
        client_ttl_s: 10,
        offload: OffloadConfig {
            enabled: true,
            ..Default::default()
        },
        ..cfg()
    };
    let t = T::with(cfg);
    t.svc.tick();
    t.mount_on(C1, 1, "s1", 256 * MIB, "h1");
    // A node's disk tier mounts with `ReMountSegment` on every start; a fresh one holds nothing.
    let disk = super::offload_tests::disk(1, "s1", 64 * MIB, DiskPolicy::default());
    let remount = |segments: Vec<Segment>, held: Vec<HeldObject>| {
        t.call(
            Request::ReMountSegment,
            ReMountSegment {
                client_id: C1,
                segments,
                held,
            },
        )
    };
    assert_eq!(remount(vec![disk], vec![]), Ok(()));
    t.put_one("a", MIB, "s1");
    t.svc.drain_segment("s1", 60_000).unwrap();
    t.svc.tick();
    assert_eq!(
        t.segment_names(),
        ["s1/disk"],
        "no window: nothing came back from before"
    );
    // A memory segment re-mounted is a sign of a restart: the next drain waits the window.
    assert_eq!(remount(vec![t.segment(2, "s2")], vec![]), Ok(()));
    t.put_one("b", MIB, "s2");
    t.svc.drain_segment("s2", 60_000).unwrap();
    t.advance(200);
    t.svc.tick();
    assert!(t.segment_names().contains(&"s2".to_string()));
}

#[test]
fn a_drain_with_no_memory_room_moves_only_copies_to_another_owners_disk() {
    let t = T::with(ServiceConfig {
        offload: OffloadConfig {
            enabled: true,
            ..Default::default()
        },
        ..cfg()
    });
    t.mount_on(C1, 1, "s1", 256 * MIB, "h1");
    t.mount_on(C2, 2, "s2", 4 * MIB, "h2");
    // The draining owner's own disk is the roomiest: it must not be chosen, nor count as a
    // copy elsewhere, since the owner may be leaving with it.
    let policy = DiskPolicy::default();
    t.mount_segment(C1, super::offload_tests::disk(1, "s1", 1024 * MIB, policy));
    t.mount_segment(C2, super::offload_tests::disk(2, "s2", 64 * MIB, policy));
    t.put_one("fill", 4 * MIB, "s2");
    t.put_one("a", 2 * MIB, "s1");
    t.put_one("b", 2 * MIB, "s1");
    // Eager offload copied each object to its owner's disk: let both owners finish theirs.
    t.run_tasks(C1);
    t.run_tasks(C2);
    let on_s1_disk = |key: &str| {
        t.get(key)
            .unwrap()
            .replicas
            .iter()
            .any(|r| r.segment_name == "s1/disk")
    };
    assert!(on_s1_disk("a") && on_s1_disk("b"));
    let r = t.call(
        Request::GracefulUnmountSegment,
        GracefulUnmountSegment {
            client_id: C1,
            segment_id: Uuid::from_parts(100, 1),
            grace_ms: 30_000,
        },
    );
    assert_eq!(r, Ok(()));
    t.svc.tick();
    assert_eq!(t.metric("master_drain_replicas_detached_total"), 0);
    let w = t.fetch_work(C2);
    let mut moved: Vec<&str> = w.iter().map(|w| w.key.as_str()).collect();
    moved.sort_unstable();
    assert_eq!(moved, ["a", "b"]);
    for task in &w {
        assert_eq!(task.targets[0].segment_name, "s2/disk");
        assert_eq!(task.targets[0].medium, ReplicaMedium::LocalDisk);
        assert_eq!(t.finish(C2, task.task_id, true), Ok(()));
    }
    for key in ["a", "b"] {
        let names: Vec<String> = t
            .get(key)
            .unwrap()
            .replicas
            .iter()
            .map(|r| r.segment_name.clone())
            .collect();
        assert!(names.contains(&"s2/disk".to_string()), "{key}: {names:?}");
        assert!(!names.contains(&"s1".to_string()), "{key}: {names:?}");
    }
    let lease = cfg().default_kv_lease_ttl_ms;
    t.advance(lease + 201);
    t.svc.tick();
    t.advance(200);
    t.svc.tick();
    assert!(!t.segment_names().contains(&"s1".to_string()));
    assert_eq!(t.metric("master_drains_completed_total"), 1);
    assert_eq!(t.metric("master_drain_objects_lost_total"), 0);
}

#[test]
fn graceful_unmount_stops_allocation_then_unmounts() {
    let t = T::new();
    let s1 = t.mount(1, 64 * MIB);
    t.put("k", 100);
    let r = t.call(
        Request::GracefulUnmountSegment,
        GracefulUnmountSegment {
            client_id: C1,
            segment_id: s1,
            grace_ms: 5000,
        },
    );
    assert_eq!(r, Ok(()));
    assert_eq!(t.start("new", 100), Err(ErrorCode::NoAvailableHandle));
    assert!(t.get("k").is_ok(), "readable while draining");
    let d = t.svc.segments_detail();
    assert_eq!(d[0].status, "DRAINING");
    // Nowhere to move its only copy: the drain gives up at the next tick (`drain.rs`).
    t.svc.tick();
    assert_eq!(t.get("k"), Err(ErrorCode::ObjectNotFound));
    assert!(t.svc.all_segments().is_empty());
}
