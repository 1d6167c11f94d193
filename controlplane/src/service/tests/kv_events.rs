//! KV-cache events from the index's choke points (`objects.rs`, `docs/kv-events.md`): what
//! each path announces, on a manual clock, read straight from the queue.

use super::*;
use crate::events::{Kind, Medium, TestDrain};

fn subscribe(t: &T) -> TestDrain {
    let (sink, rx) = crate::events::test_channel(4096);
    t.svc.state.lock().objects.set_events(Some(sink));
    rx
}

fn drain(rx: &TestDrain) -> Vec<(Kind, Medium, String)> {
    rx.try_iter().map(|e| (e.kind, e.medium, e.key)).collect()
}

fn stored(m: Medium, key: &str) -> (Kind, Medium, String) {
    (Kind::Stored, m, key.to_string())
}

fn removed(m: Medium, key: &str) -> (Kind, Medium, String) {
    (Kind::Removed, m, key.to_string())
}

#[test]
fn puts_removes_and_pattern_removes_announce_stored_then_removed() {
    let t = T::with(offload_cfg());
    t.mount_segment(C2, memory(2, "m2", 64 * MIB));
    let rx = subscribe(&t);
    let config = ReplicateConfig::default();
    t.start_with(C2, "7", MIB, config.clone()).unwrap();
    assert_eq!(drain(&rx), [], "a put in flight is not readable");
    t.end(C2, "7").unwrap();
    assert_eq!(drain(&rx), [stored(Medium::Cpu, "7")]);
    // A revoked put was never announced: nothing to take back.
    t.start_with(C2, "r", MIB, config.clone()).unwrap();
    t.revoke(C2, "r").unwrap();
    assert_eq!(drain(&rx), []);
    let remove = |key: &str| {
        t.call(
            Request::Remove,
            Remove {
                key: key.into(),
                force: false,
            },
        )
        .map(|_| ())
    };
    assert_eq!(remove("7"), Ok(()));
    assert_eq!(drain(&rx), [removed(Medium::Cpu, "7")]);
    for k in ["a1", "a2", "b1"] {
        t.put_by(C2, k, MIB, "m2");
    }
    assert_eq!(drain(&rx).len(), 3);
    let n = t.call(
        Request::RemoveByRegex,
        RemoveByRegex {
            pattern: "^a".into(),
            force: false,
        },
    );
    assert_eq!(n, Ok(2));
    let mut got = drain(&rx);
    got.sort_by(|a, b| a.2.cmp(&b.2));
    assert_eq!(
        got,
        [removed(Medium::Cpu, "a1"), removed(Medium::Cpu, "a2")]
    );
    assert_eq!(
        t.call(Request::RemoveAll, RemoveAll { force: false }),
        Ok(1)
    );
    assert_eq!(drain(&rx), [removed(Medium::Cpu, "b1")]);
}

#[test]
fn the_last_memory_replica_going_announces_disk_and_a_promotion_cpu() {
    let mut c = offload_cfg();
    c.offload.promotion_on_hit = true;
    c.offload.promotion_threshold = 1;
    let t = T::with(c);
    t.owner(C1, 1, "n1", 16 * MIB, 64 * MIB, DiskPolicy::default());
    let rx = subscribe(&t);
    t.put_by(C1, "k", 2 * MIB, "n1");
    assert_eq!(t.run_tasks(C1), 1, "k's offload");
    assert_eq!(
        drain(&rx),
        [stored(Medium::Cpu, "k")],
        "a disk copy beside memory: no news"
    );
    t.advance(10);
    for i in 0..7 {
        t.put_by(C1, &format!("f{i}"), 2 * MIB, "n1");
    }
    assert_eq!(drain(&rx).len(), 7);
    assert_eq!(
        t.fetch_work(C1).len(),
        7,
        "the fillers' offloads, never reported"
    );
    t.advance(10);
    t.svc.tick();
    assert_eq!(t.replicas("k"), [on_disk("n1")]);
    assert_eq!(drain(&rx), [stored(Medium::Disk, "k")]);
    // The read above was disk-only: with a threshold of 1 it queued a promotion.
    let w = t.fetch_work(C1);
    assert_eq!(w.len(), 1);
    t.finish(C1, w[0].task_id, true).unwrap();
    assert_eq!(t.replicas("k"), [mem("n1"), on_disk("n1")]);
    assert_eq!(drain(&rx), [stored(Medium::Cpu, "k")]);
}

#[test]
fn remounted_objects_are_announced_and_an_unmount_takes_them_back() {
    let t = T::with(offload_cfg());
    let rx = subscribe(&t);
    remount(&t, C1, 1, &[("0x10", MIB, 0, 1)]);
    assert_eq!(drain(&rx), [stored(Medium::Disk, "0x10")]);
    let r = t.call(
        Request::UnmountSegment,
        UnmountSegment {
            client_id: C1,
            segment_id: Uuid::from_parts(200, 1),
        },
    );
    assert_eq!(r, Ok(()));
    assert_eq!(drain(&rx), [removed(Medium::Disk, "0x10")]);
}

#[test]
fn a_full_queue_drops_and_counts_without_blocking() {
    let t = T::with(offload_cfg());
    t.mount_segment(C2, memory(2, "m2", 64 * MIB));
    let (sink, rx) = crate::events::test_channel(2);
    t.svc.state.lock().objects.set_events(Some(sink.clone()));
    for i in 0..5 {
        t.put_by(C2, &format!("k{i}"), MIB, "m2");
    }
    assert_eq!(drain(&rx).len(), 2);
    assert_eq!(sink.dropped(), 3);
}
