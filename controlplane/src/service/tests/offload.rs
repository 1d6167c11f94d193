//! The disk tier's master side (`service/offload.rs`, `docs/tiering.md`) through the public
//! surface: disk segments, offload and promotion tasks, disk eviction, the cluster byte cap,
//! re-mounts and owner clears, on a manual clock.

use protocol::message::*;
use protocol::*;

use super::*;
use crate::model::{cfg, T};

#[path = "kv_events.rs"]
mod kv_events;

const MIB: u64 = 1 << 20;
const C1: Uuid = Uuid { hi: 1, lo: 1 };
const C2: Uuid = Uuid { hi: 2, lo: 2 };
const C3: Uuid = Uuid { hi: 3, lo: 3 };

/// A memory segment `name` of `n`'s client.
fn memory(n: u64, name: &str, size: u64) -> Segment {
    Segment {
        id: Uuid::from_parts(100, n),
        name: name.into(),
        base: n << 40,
        size,
        te_endpoint: format!("{name}-te"),
        protocol: "tcp".into(),
        host_id: format!("host{n}"),
        ..Default::default()
    }
}

/// The disk segment beside `memory(n, name, ..)`: `name/disk`, at the disk address base.
pub(super) fn disk(n: u64, name: &str, size: u64, policy: DiskPolicy) -> Segment {
    Segment {
        id: Uuid::from_parts(200, n),
        name: format!("{name}/disk"),
        base: (1 << 60) + (n << 44),
        size,
        te_endpoint: format!("{name}-disk"),
        protocol: "tcp".into(),
        host_id: format!("host{n}"),
        medium: ReplicaMedium::LocalDisk,
        disk: policy,
    }
}

fn offload_cfg() -> ServiceConfig {
    ServiceConfig {
        offload: OffloadConfig {
            enabled: true,
            ..Default::default()
        },
        ..cfg()
    }
}

impl T {
    pub(super) fn mount_segment(&self, client: Uuid, seg: Segment) {
        let r = self.call(
            Request::MountSegment,
            MountSegment {
                client_id: client,
                segment: seg,
            },
        );
        assert_eq!(r, Ok(()));
    }

    /// `client` with memory segment `name` and its disk segment `name/disk`.
    fn owner(&self, client: Uuid, n: u64, name: &str, mem: u64, dsk: u64, policy: DiskPolicy) {
        self.mount_segment(client, memory(n, name, mem));
        self.mount_segment(client, disk(n, name, dsk, policy));
    }

    fn put_by(&self, client: Uuid, key: &str, size: u64, seg: &str) -> Vec<ReplicaDescriptor> {
        let config = ReplicateConfig {
            preferred_segment: seg.into(),
            ..Default::default()
        };
        let d = self
            .start_with(client, key, size, config)
            .expect("put start");
        self.end(client, key).expect("put end");
        d
    }

    pub(super) fn fetch_work(&self, client: Uuid) -> Vec<TaskWork> {
        self.call(Request::FetchTasks, FetchTasks { client_id: client })
            .expect("fetch")
    }

    pub(super) fn finish(&self, client: Uuid, id: Uuid, ok: bool) -> Result<(), ErrorCode> {
        self.call(
            Request::CompleteTask,
            CompleteTask {
                client_id: client,
                task_id: id,
                ok,
                message: String::new(),
            },
        )
    }

    /// Fetches and completes every task `client` is handed, until it is handed none.
    pub(super) fn run_tasks(&self, client: Uuid) -> usize {
        let mut n = 0;
        loop {
            let w = self.fetch_work(client);
            if w.is_empty() {
                return n;
            }
            for x in w {
                self.finish(client, x.task_id, true).expect("complete");
                n += 1;
            }
        }
    }

    /// `(segment, medium)` of `key`'s readable replicas, in the order a reader gets them.
    fn replicas(&self, key: &str) -> Vec<(String, ReplicaMedium)> {
        self.get(key)
            .expect("readable")
            .replicas
            .into_iter()
            .map(|r| (r.segment_name, r.medium))
            .collect()
    }

    fn exists(&self, key: &str) -> bool {
        self.call(Request::ExistKey, ExistKey { key: key.into() })
            .expect("exist")
    }

    fn keys(&self) -> u64 {
        self.svc.gauges().key_count
    }

    fn tier(&self) -> TierGauges {
        self.svc.gauges().tier
    }

    fn freed(&self, client: Uuid) -> Vec<(u64, u64)> {
        self.call(Request::Ping, Ping { client_id: client })
            .expect("ping")
            .freed
    }
}

fn mem(name: &str) -> (String, ReplicaMedium) {
    (name.into(), ReplicaMedium::Memory)
}

fn on_disk(name: &str) -> (String, ReplicaMedium) {
    (format!("{name}/disk"), ReplicaMedium::LocalDisk)
}

#[test]
fn placement_never_picks_a_disk_segment() {
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 4 * MIB, 64 * MIB, DiskPolicy::default());
    // Even when named as preferred, the disk segment gets no put's replica.
    let d = t.put_by(C1, "a", MIB, "n1/disk");
    assert_eq!(d.len(), 1);
    assert_eq!(
        (d[0].segment_name.as_str(), d[0].medium),
        ("n1", ReplicaMedium::Memory)
    );
    let config = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    let d = t.start_with(C1, "b", MIB, config).expect("partial");
    assert_eq!(d.len(), 1, "one memory segment, one replica");
    assert_eq!(d[0].segment_name, "n1");
    // More than memory holds fails, though the disk has room.
    assert_eq!(
        t.start_with(C1, "big", 8 * MIB, ReplicateConfig::default()),
        Err(ErrorCode::NoAvailableHandle)
    );
    // Memory's gauges leave the disk out; the disk's own count it.
    let g = t.svc.gauges();
    assert_eq!(g.total_capacity_bytes, 4 * MIB);
    assert_eq!(g.tier.disk_capacity_bytes, 64 * MIB);
    assert_eq!(g.tier.disk_segments, 1);
}

#[test]
fn eager_offload_is_queued_at_put_end_and_completes_into_a_local_disk_replica() {
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, DiskPolicy::default());
    // A client without a disk: its objects are not offloaded.
    t.mount_segment(C2, memory(2, "m2", 64 * MIB));
    t.put_by(C2, "plain", MIB, "m2");
    assert_eq!(t.tier().stats.offloads_queued, 0);
    let v = t.put_by(C1, "k", MIB, "n1")[0].version;
    assert_eq!(t.tier().stats.offloads_queued, 1);
    assert!(
        t.fetch_work(C2).is_empty(),
        "only the disk's owner executes it"
    );
    let w = t.fetch_work(C1);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].key, "k");
    assert_eq!(w[0].sources[0].segment_name, "n1");
    assert_eq!(w[0].sources[0].medium, ReplicaMedium::Memory);
    assert_eq!(w[0].targets.len(), 1);
    let target = &w[0].targets[0];
    assert_eq!(target.segment_name, "n1/disk");
    assert_eq!(target.medium, ReplicaMedium::LocalDisk);
    assert!(target.buffer_address >= 1 << 60);
    assert_eq!((target.size, target.version), (MIB, v));
    // Readers do not see it before it is complete.
    assert_eq!(t.replicas("k"), [mem("n1")]);
    assert_eq!(t.tier().internal_processing, 1);
    t.finish(C1, w[0].task_id, true).unwrap();
    assert_eq!(t.replicas("k"), [mem("n1"), on_disk("n1")]);
    let g = t.tier();
    assert_eq!((g.stats.offloads_completed, g.disk_used_bytes), (1, MIB));
    assert_eq!((g.internal_pending, g.internal_processing), (0, 0));
    // An object with a disk replica is not offloaded again (an upsert makes a new value,
    // which is).
    assert!(t.fetch_work(C1).is_empty());
}

#[test]
fn a_fetch_hands_out_full_batches_back_to_back() {
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 256 * MIB, 256 * MIB, DiskPolicy::default());
    for i in 0..40 {
        t.put_by(C1, &format!("k{i}"), MIB, "n1");
    }
    // Nothing in the master holds an executor to one batch a second: it re-fetches at once
    // while its fetches come back full.
    let sizes: Vec<usize> = (0..4).map(|_| t.fetch_work(C1).len()).collect();
    assert_eq!(sizes, [16, 16, 8, 0]);
}

#[test]
fn offloads_beyond_the_queue_limit_are_skipped_and_counted() {
    let mut c = offload_cfg();
    c.offload.queue_limit = 2;
    let t = T::with(c);
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, DiskPolicy::default());
    for i in 0..5 {
        t.put_by(C1, &format!("k{i}"), MIB, "n1");
    }
    let s = t.tier().stats;
    assert_eq!((s.offloads_queued, s.offloads_skipped), (2, 3));
    assert_eq!(t.run_tasks(C1), 2);
    t.put_by(C1, "later", MIB, "n1");
    assert_eq!(
        t.tier().stats.offloads_queued,
        3,
        "room again once they finished"
    );
}

#[test]
fn memory_eviction_of_an_object_with_a_disk_replica_keeps_it_readable_from_disk() {
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 16 * MIB, 64 * MIB, DiskPolicy::default());
    t.put_by(C1, "k", 2 * MIB, "n1");
    assert_eq!(t.run_tasks(C1), 1);
    t.advance(10);
    // Fill memory; the fillers' offloads are handed out and not reported, so only `k` has a
    // disk copy, and objects whose copy is being made are not evicted.
    for i in 0..7 {
        t.put_by(C1, &format!("f{i}"), 2 * MIB, "n1");
    }
    assert_eq!(t.fetch_work(C1).len(), 7);
    t.advance(10);
    t.svc.tick();
    assert_eq!(t.keys(), 8, "nothing lost");
    assert_eq!(
        t.replicas("k"),
        [on_disk("n1")],
        "only the memory replica went"
    );
    assert!(t.exists("k"), "an object on disk only exists");
    let g = t.svc.gauges();
    assert_eq!(g.allocated_bytes, 14 * MIB);
    assert_eq!(g.tier.stats.memory_evictions_to_disk, 1);
    assert_eq!(
        (
            g.tier.memory_objects,
            g.tier.disk_objects,
            g.tier.disk_only_objects
        ),
        (7, 1, 1)
    );
    assert_eq!(g.tier.stats.disk_only_hits, 1, "the read above");
    assert!(t
        .metrics_text()
        .contains("master_disk_only_read_hits_total 1"));
}

impl T {
    fn metrics_text(&self) -> String {
        self.svc.metrics().render(&self.svc.gauges())
    }
}

/// Memory of 16 MiB filled with eight 2 MiB objects of C1 (which has a disk), an eviction
/// pass asked to free 60% of it (five objects), a queue limit of 4 and a cap ratio of 0.5:
/// two offload moves per pass.
fn on_evict_pass(force: bool) -> T {
    let mut c = offload_cfg();
    c.eviction_ratio = 0.5;
    c.offload.on_evict = true;
    c.offload.force_evict = force;
    c.offload.queue_limit = 4;
    c.offload.cap_ratio = 0.5;
    let t = T::with(c);
    t.owner(C1, 1, "n1", 16 * MIB, 64 * MIB, DiskPolicy::default());
    for i in 0..8 {
        t.put_by(C1, &format!("k{i}"), 2 * MIB, "n1");
        t.advance(1);
    }
    assert_eq!(
        t.tier().stats.offloads_queued,
        0,
        "on-evict: nothing at put end"
    );
    t.svc.tick();
    t
}

#[test]
fn offload_on_evict_queues_moves_capped_by_the_ratio_and_keeps_the_rest() {
    let t = on_evict_pass(false);
    assert_eq!(t.tier().stats.offloads_queued, 2);
    assert_eq!(t.keys(), 8, "picked beyond the cap: kept in memory");
    let w = t.fetch_work(C1);
    assert_eq!(w.len(), 2);
    // The oldest reads go first.
    let mut keys: Vec<&str> = w.iter().map(|x| x.key.as_str()).collect();
    keys.sort();
    assert_eq!(keys, ["k0", "k1"]);
    assert_eq!(w[0].targets[0].medium, ReplicaMedium::LocalDisk);
    for x in &w {
        t.finish(C1, x.task_id, true).unwrap();
    }
    // A move: the memory replica went with it.
    assert_eq!(t.replicas("k0"), [on_disk("n1")]);
    let g = t.svc.gauges();
    assert_eq!(
        (g.allocated_bytes, g.tier.disk_used_bytes),
        (12 * MIB, 4 * MIB)
    );
}

#[test]
fn offload_force_evict_drops_what_is_picked_beyond_the_cap() {
    let t = on_evict_pass(true);
    assert_eq!(t.tier().stats.offloads_queued, 2);
    assert_eq!(t.keys(), 5, "three of the five picked dropped");
    assert_eq!(t.run_tasks(C1), 2);
    assert_eq!(t.keys(), 5);
    assert_eq!(t.replicas("k0"), [on_disk("n1")]);
}

#[test]
fn remove_during_an_in_flight_offload_succeeds_and_parks_the_disk_range() {
    let mut c = offload_cfg();
    c.put_start_release_timeout_s = 60;
    let t = T::with(c);
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, DiskPolicy::default());
    t.put_by(C1, "k", MIB, "n1");
    let w = t.fetch_work(C1);
    let (id, addr) = (w[0].task_id, w[0].targets[0].buffer_address);
    t.freed(C1);
    // An internal task is no user's task: the remove is not refused with -708.
    let r = t.call(
        Request::Remove,
        Remove {
            key: "k".into(),
            force: false,
        },
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        t.tier().stats.offloads_failed,
        1,
        "the offload failed at once"
    );
    // The executor may still be writing: the range stays allocated until the window ends.
    assert_eq!(
        t.finish(C1, id, true),
        Err(ErrorCode::ObjectNoReplicationTask)
    );
    assert_eq!(t.tier().disk_used_bytes, MIB);
    t.svc.tick();
    assert!(!t.freed(C1).contains(&(addr, MIB)));
    t.advance(60_000);
    t.svc.tick();
    assert_eq!(t.tier().disk_used_bytes, 0, "not leaked");
    assert!(
        t.freed(C1).contains(&(addr, MIB)),
        "told to the owner, which deletes the file"
    );

    // RemoveAll, RemoveByRegex, UpsertStart and a user's clear go ahead too, pending or not.
    t.put_by(C1, "a", MIB, "n1");
    t.put_by(C1, "b", MIB, "n1");
    t.put_by(C1, "c", MIB, "n1");
    let n = t.call(
        Request::RemoveByRegex,
        RemoveByRegex {
            pattern: "^a$".into(),
            force: false,
        },
    );
    assert_eq!(n, Ok(1));
    let up = t.call(
        Request::UpsertStart,
        UpsertStart {
            client_id: C1,
            key: "b".into(),
            size: MIB,
            config: ReplicateConfig::default(),
        },
    );
    assert!(up.is_ok(), "{up:?}");
    t.end(C1, "b").unwrap();
    let cleared = t.call(
        Request::BatchReplicaClear,
        BatchReplicaClear {
            client_id: C1,
            keys: vec!["c".into()],
            segment_name: String::new(),
        },
    );
    assert!(cleared.unwrap()[0].is_ok());
    // b's new value has its own offload; the three old ones failed.
    let w = t.fetch_work(C1);
    assert_eq!(w.iter().map(|x| x.key.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(t.tier().stats.offloads_failed, 4);
}

#[test]
fn disk_watermark_eviction_goes_by_last_read_and_spares_leased_objects() {
    let policy = DiskPolicy {
        high_watermark_permille: 800,
        low_watermark_permille: 600,
        keys_limit: 0,
    };
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 64 * MIB, 10 * MIB, policy);
    for k in ["a", "b", "c", "d", "e"] {
        t.put_by(C1, k, 2 * MIB, "n1");
    }
    assert_eq!(t.run_tasks(C1), 5);
    assert_eq!(t.tier().disk_used_bytes, 10 * MIB);
    for k in ["e", "d", "c"] {
        t.advance(1);
        t.get(k).unwrap();
    }
    t.advance(1_000);
    // a and b are the most recently read, and leased: they stay; of the others the least
    // recently read (e, then d) go until the disk is at 60%.
    t.get("a").unwrap();
    t.get("b").unwrap();
    t.svc.tick();
    let g = t.tier();
    assert_eq!(g.disk_used_bytes, 6 * MIB);
    assert_eq!(g.stats.disk_evicted_replicas, 2);
    assert_eq!(t.replicas("e"), [mem("n1")], "only the disk replica went");
    assert_eq!(t.replicas("d"), [mem("n1")]);
    assert_eq!(t.replicas("c"), [mem("n1"), on_disk("n1")]);
}

#[test]
fn disk_eviction_skips_hard_pins_and_a_last_replica_takes_its_object() {
    let policy = DiskPolicy {
        high_watermark_permille: 500,
        low_watermark_permille: 300,
        keys_limit: 0,
    };
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 64 * MIB, 10 * MIB, policy);
    // Two disk-only objects (files re-reported by the owner), one hard-pinned.
    remount(
        &t,
        C1,
        1,
        &[("pinned", 2 * MIB, 0, 1), ("solo", 2 * MIB, 4 * MIB, 2)],
    );
    t.put_by(C1, "x", 2 * MIB, "n1");
    assert_eq!(t.run_tasks(C1), 1);
    for k in ["pinned", "solo", "x"] {
        t.advance(1);
        t.get(k).unwrap();
    }
    t.advance(1_000);
    t.svc.tick();
    // 6 MiB used, down to 3: "pinned" is the least recently read but hard-pinned; "solo"
    // goes with its object (its last replica), x keeps its memory replica.
    assert_eq!(t.tier().disk_used_bytes, 2 * MIB);
    assert_eq!(t.replicas("pinned"), [on_disk("n1")]);
    assert_eq!(t.get("solo").map(|_| ()), Err(ErrorCode::ObjectNotFound));
    assert_eq!(t.replicas("x"), [mem("n1")]);
    assert_eq!(t.keys(), 2);
}

#[test]
fn disk_eviction_keeps_a_disk_within_its_keys_limit() {
    let policy = DiskPolicy {
        high_watermark_permille: 900,
        low_watermark_permille: 500,
        keys_limit: 4,
    };
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, policy);
    for k in ["a", "b", "c", "d"] {
        t.put_by(C1, k, MIB, "n1");
        t.advance(1);
    }
    assert_eq!(t.run_tasks(C1), 4);
    t.advance(1_000);
    t.svc.tick();
    // 4 keys > 90% of 4: down to 50%, the two least recently read first.
    assert_eq!(t.tier().stats.disk_evicted_replicas, 2);
    assert_eq!(t.replicas("a"), [mem("n1")]);
    assert_eq!(t.replicas("d"), [mem("n1"), on_disk("n1")]);
}

/// Re-mounts `client`'s memory and disk segments (index `n`, named `n{n}`) holding `held`:
/// `(key, size, offset in the disk segment, seq)`, all on disk; a key named "pinned" is
/// hard-pinned.
fn remount(t: &T, client: Uuid, n: u64, held: &[(&str, u64, u64, u64)]) {
    let name = format!("n{n}");
    let d = disk(n, &name, 10 * MIB, DiskPolicy::default());
    let held = held
        .iter()
        .map(|&(k, size, off, seq)| HeldObject {
            key: k.into(),
            segment_name: d.name.clone(),
            size,
            buffer_address: d.base + off,
            with_hard_pin: k == "pinned",
            version: Version { term: 1, seq },
            soft_pin_ttl_ms: None,
        })
        .collect();
    let r = t.call(
        Request::ReMountSegment,
        ReMountSegment {
            client_id: client,
            segments: vec![memory(n, &name, 64 * MIB), d],
            held,
        },
    );
    assert_eq!(r, Ok(()));
}

#[test]
fn promotion_is_queued_after_the_admission_threshold() {
    let mut c = offload_cfg();
    c.offload.promotion_on_hit = true;
    c.offload.promotion_threshold = 2;
    c.client_ttl_s = 10;
    let t = T::with(c);
    t.svc.tick();
    remount(&t, C1, 1, &[("a", MIB, 0, 1), ("b", MIB, 4 * MIB, 2)]);
    assert_eq!(t.replicas("a"), [on_disk("n1")]);
    assert!(t.fetch_work(C1).is_empty(), "one hit is not enough");
    t.get("a").unwrap();
    t.get("b").unwrap();
    t.get("b").unwrap();
    assert_eq!(t.tier().stats.promotions_queued, 2);
    // The objects were put under an earlier term: their copies wait until the owners of the
    // pool had a client_ttl to re-report (a newer version may still come), then carry a
    // version of this term, which the owners' fences take.
    assert!(
        t.fetch_work(C1).is_empty(),
        "copied before the owners settled"
    );
    t.advance(10_000);
    let term = t.get("a").unwrap().replicas[0].version.term;
    assert!(term <= 2, "re-reported under the earlier term");
    // One promotion per fetch (`--promotion_max_per_heartbeat`).
    let w = t.fetch_work(C1);
    assert_eq!(w.len(), 1);
    assert!(w[0].targets[0].version.term > 2, "the copy is of this term");
    let key = w[0].key.clone();
    assert_eq!(
        t.get(&key).unwrap().replicas[0].version,
        w[0].targets[0].version
    );
    assert_eq!(w[0].sources[0].medium, ReplicaMedium::LocalDisk);
    assert_eq!(w[0].targets[0].medium, ReplicaMedium::Memory);
    assert_eq!(
        w[0].targets[0].segment_name, "n1",
        "the disk owner's own memory"
    );
    t.finish(C1, w[0].task_id, true).unwrap();
    let w2 = t.fetch_work(C1);
    assert_eq!(w2.len(), 1);
    t.finish(C1, w2[0].task_id, true).unwrap();
    for k in ["a", "b"] {
        assert_eq!(t.replicas(k), [mem("n1"), on_disk("n1")]);
    }
    let s = t.tier().stats;
    // Six disk-only reads: the three that queued the promotions, the three checks above.
    assert_eq!((s.promotions_completed, s.disk_only_hits), (2, 6));
    // Now in memory: reads are not disk-only and queue nothing.
    t.get("a").unwrap();
    t.get("a").unwrap();
    assert_eq!(t.tier().stats.promotions_queued, 2);
}

/// A promotion of an object of an earlier term that finds no room in memory waits in its
/// queue and leaves the object at the version its owner's catalog holds: re-stamped with no
/// copy made, the object would be listed at a version no owner holds it at. Found by the
/// `master_model` fuzz target (a read of the disk replica at a version never written).
#[test]
fn a_promotion_waiting_for_room_leaves_an_earlier_terms_object_as_it_was() {
    let mut c = offload_cfg();
    c.offload.promotion_on_hit = true;
    c.offload.promotion_threshold = 1;
    c.client_ttl_s = 10;
    let t = T::with(c);
    t.svc.tick();
    remount(&t, C1, 1, &[("a", MIB, 0, 1)]);
    let before = t.get("a").unwrap().replicas[0].version;
    assert_eq!(t.tier().stats.promotions_queued, 1);
    t.advance(10_000);
    // The disk owner's memory, the promotion's target, full meanwhile.
    t.put_by(C1, "fill", 64 * MIB, "n1");
    let w = t.fetch_work(C1);
    assert!(w.iter().all(|w| w.key != "a"), "no room, no copy: {w:?}");
    assert_eq!(
        t.get("a").unwrap().replicas[0].version,
        before,
        "re-stamped though nothing was copied"
    );
    for w in w {
        t.finish(C1, w.task_id, true).unwrap();
    }
    // Room again: the copy goes out, and only now at a version of this term.
    t.call(
        Request::Remove,
        Remove {
            key: "fill".into(),
            force: true,
        },
    )
    .unwrap();
    let w = t.fetch_work(C1);
    let a = w.iter().find(|w| w.key == "a").expect("the promotion");
    assert!(a.targets[0].version.term > before.term, "{a:?}");
    assert_eq!(
        t.get("a").unwrap().replicas[0].version,
        a.targets[0].version
    );
}

#[test]
fn the_cluster_wide_disk_byte_cap_evicts_disk_first() {
    let mut c = offload_cfg();
    c.offload.total_bytes_limit = 4 * MIB;
    let t = T::with(c);
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, DiskPolicy::default());
    t.owner(C2, 2, "n2", 64 * MIB, 64 * MIB, DiskPolicy::default());
    t.put_by(C1, "a", 2 * MIB, "n1");
    t.advance(1);
    t.put_by(C1, "b", 2 * MIB, "n1");
    assert_eq!(t.run_tasks(C1), 2);
    assert_eq!(t.tier().disk_used_bytes, 4 * MIB);
    t.advance(1);
    t.put_by(C2, "c", 2 * MIB, "n2");
    // C2's disk is empty: the cap takes the least recently read replica of another disk.
    let w = t.fetch_work(C2);
    assert_eq!(w.len(), 1);
    assert_eq!(t.tier().disk_used_bytes, 4 * MIB, "never above the cap");
    assert_eq!(t.replicas("a"), [mem("n1")]);
    t.finish(C2, w[0].task_id, true).unwrap();
    assert_eq!(t.replicas("c"), [mem("n2"), on_disk("n2")]);
    // Nothing evictable (every disk replica leased): the offload waits.
    t.get("b").unwrap();
    t.get("c").unwrap();
    t.put_by(C2, "d", 2 * MIB, "n2");
    assert!(t.fetch_work(C2).is_empty());
    assert_eq!(t.tier().disk_used_bytes, 4 * MIB);
    assert_eq!(t.tier().internal_pending, 1);
}

#[test]
fn remount_adds_a_disk_replica_to_an_object_held_at_the_same_version() {
    let t = T::with(cfg());
    t.mount_segment(C1, memory(1, "n1", 64 * MIB));
    let d = t.put_by(C1, "k", MIB, "n1");
    let v = d[0].version;
    // The owner restarted its disk tier (or the master lost it): it re-reports the file.
    let dk = disk(1, "n1", 10 * MIB, DiskPolicy::default());
    let r = t.call(
        Request::ReMountSegment,
        ReMountSegment {
            client_id: C1,
            segments: vec![memory(1, "n1", 64 * MIB), dk.clone()],
            held: vec![HeldObject {
                key: "k".into(),
                segment_name: dk.name.clone(),
                size: MIB,
                buffer_address: dk.base,
                with_hard_pin: false,
                version: v,
                soft_pin_ttl_ms: None,
            }],
        },
    );
    assert_eq!(r, Ok(()));
    assert_eq!(t.replicas("k"), [mem("n1"), on_disk("n1")]);
    // A fresh master learns both from the re-report.
    let t2 = T::with(cfg());
    let r = t2.call(
        Request::ReMountSegment,
        ReMountSegment {
            client_id: C1,
            segments: vec![memory(1, "n1", 64 * MIB), dk.clone()],
            held: vec![
                HeldObject {
                    key: "k".into(),
                    segment_name: dk.name.clone(),
                    size: MIB,
                    buffer_address: dk.base,
                    with_hard_pin: false,
                    version: v,
                    soft_pin_ttl_ms: None,
                },
                HeldObject {
                    key: "k".into(),
                    segment_name: "n1".into(),
                    size: MIB,
                    buffer_address: d[0].buffer_address,
                    with_hard_pin: false,
                    version: v,
                    soft_pin_ttl_ms: None,
                },
            ],
        },
    );
    assert_eq!(r, Ok(()));
    assert_eq!(t2.replicas("k"), [mem("n1"), on_disk("n1")]);
    assert_eq!(t2.tier().disk_used_bytes, MIB);
}

#[test]
fn a_disk_owner_clears_its_disk_replica_even_when_another_client_wrote_it() {
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, DiskPolicy::default());
    t.mount_segment(C3, memory(3, "m3", 64 * MIB));
    // C2 writes onto C1's memory; C1 offloads it.
    t.put_by(C2, "k", MIB, "n1");
    assert_eq!(t.run_tasks(C1), 1);
    t.get("k").unwrap(); // a reader's lease does not stop the owner
    let clear = |client, seg: &str| {
        t.call(
            Request::BatchReplicaClear,
            BatchReplicaClear {
                client_id: client,
                keys: vec!["k".into()],
                segment_name: seg.into(),
            },
        )
        .unwrap()
        .remove(0)
        .map(|_| ())
    };
    assert_eq!(clear(C3, "n1/disk"), Err(ErrorCode::IllegalClient));
    assert_eq!(
        clear(C1, "n1"),
        Err(ErrorCode::IllegalClient),
        "memory: the writer's"
    );
    assert_eq!(clear(C1, "n1/disk"), Ok(()));
    assert_eq!(t.replicas("k"), [mem("n1")]);
}

#[test]
fn without_enable_offload_a_disk_segment_takes_nothing() {
    // Without --enable_offload a mounted disk segment takes nothing.
    let t = T::with(cfg());
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, DiskPolicy::default());
    t.put_by(C1, "k", MIB, "n1");
    assert!(t.fetch_work(C1).is_empty());
    assert_eq!(t.replicas("k"), [mem("n1")]);
}

#[test]
fn internal_tasks_stand_apart_from_users_tasks() {
    let mut c = offload_cfg();
    c.tasks.max_processing = 0;
    let t = T::with(c);
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, DiskPolicy::default());
    t.mount_segment(C2, memory(2, "m2", 64 * MIB));
    t.put_by(C1, "k", MIB, "n1");
    // A user's copy of an object with an offload in flight is accepted: the two are
    // independent (each checks the object's version when it commits).
    let id = t.call(
        Request::CreateCopyTask,
        CreateCopyTask {
            key: "k".into(),
            targets: vec!["m2".into()],
        },
    );
    assert!(id.is_ok(), "{id:?}");
    // --max_total_processing_tasks (0 here) holds the user's task, not the offload.
    let w = t.fetch_work(C1);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].targets[0].medium, ReplicaMedium::LocalDisk);
    assert!(t.fetch_work(C2).is_empty());
    t.finish(C1, w[0].task_id, true).unwrap();
    assert_eq!(t.replicas("k"), [mem("n1"), on_disk("n1")]);
}

#[test]
fn an_expired_disk_owner_takes_its_internal_tasks_with_it() {
    let c = ServiceConfig {
        client_ttl_s: 10,
        ..offload_cfg()
    };
    let t = T::with(c);
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, DiskPolicy::default());
    t.mount_segment(C2, memory(2, "m2", 64 * MIB));
    t.put_by(C1, "a", MIB, "n1");
    t.put_by(C1, "b", MIB, "n1");
    let w = t.fetch_work(C1);
    assert_eq!(w.len(), 2);
    t.put_by(C1, "c", MIB, "n1");
    for _ in 0..11 {
        t.advance(1_000);
        t.freed(C2);
        t.svc.tick();
    }
    // Its segments, objects and tasks are gone; none went to another executor.
    assert!(t.fetch_work(C2).is_empty());
    let g = t.tier();
    assert_eq!((g.internal_pending, g.internal_processing), (0, 0));
    assert_eq!(g.stats.offloads_failed, 3);
    assert_eq!(g.disk_segments, 0);
}

#[test]
fn metrics_and_status_show_each_medium() {
    use crate::view::AdminView;
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 64 * MIB, 32 * MIB, DiskPolicy::default());
    t.put_by(C1, "k", MIB, "n1");
    assert_eq!(t.run_tasks(C1), 1);
    let text = t.metrics_text();
    for want in [
        "master_total_capacity_bytes 67108864",
        "master_allocated_bytes 1048576",
        "master_disk_capacity_bytes 33554432",
        "master_disk_allocated_bytes 1048576",
        "master_disk_segment_count 1",
        "master_memory_object_count 1",
        "master_disk_object_count 1",
        "master_disk_only_object_count 0",
        "master_offload_queued_total 1",
        "master_offload_completed_total 1",
        "master_offload_skipped_total 0",
        "master_promotion_queued_total 0",
        "master_disk_evicted_replicas_total 0",
    ] {
        assert!(text.lines().any(|l| l == want), "missing {want}");
    }
    let s = t.svc.status();
    assert_eq!(
        (s.capacity_bytes, s.disk_capacity_bytes),
        (64 * MIB, 32 * MIB)
    );
    assert_eq!(s.disk_allocated_bytes, MIB);
    assert_eq!((s.disk_objects, s.disk_only_objects), (1, 0));
    let mut rows: Vec<(&str, &str, u64)> = s
        .segments
        .iter()
        .map(|g| (g.name.as_str(), g.medium, g.objects))
        .collect();
    rows.sort();
    assert_eq!(rows, [("n1", "memory", 1), ("n1/disk", "disk", 1)]);
    assert!(s
        .counters
        .iter()
        .any(|(n, v)| n == "offload_completed" && *v == 1));
}

#[test]
fn an_offload_whose_source_was_cleared_meanwhile_does_not_commit() {
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, DiskPolicy::default());
    t.mount_segment(C2, memory(2, "m2", 64 * MIB));
    let config = ReplicateConfig {
        replica_num: 2,
        ..Default::default()
    };
    t.start_with(C1, "k", MIB, config).unwrap();
    t.end(C1, "k").unwrap();
    let w = t.fetch_work(C1);
    assert_eq!(
        w[0].sources[0].segment_name, "n1",
        "the executor's own replica first"
    );
    // The writer clears the replica the executor is reading (an internal task refuses
    // nothing); its range may be reused under the copy, so the copy must not count.
    let r = t.call(
        Request::BatchReplicaClear,
        BatchReplicaClear {
            client_id: C1,
            keys: vec!["k".into()],
            segment_name: "n1".into(),
        },
    );
    assert!(r.unwrap()[0].is_ok());
    t.finish(C1, w[0].task_id, true).unwrap();
    assert_eq!(t.replicas("k"), [mem("m2")]);
    let g = t.tier();
    assert_eq!((g.stats.offloads_failed, g.disk_used_bytes), (1, 0));
}

#[test]
fn an_offload_onto_a_full_disk_evicts_the_least_recently_read_first() {
    let t = T::with(offload_cfg());
    // No watermarks: only the synchronous eviction of a full disk makes room.
    t.owner(C1, 1, "n1", 64 * MIB, 8 * MIB, DiskPolicy::default());
    for k in ["a", "b", "c", "d"] {
        t.put_by(C1, k, 2 * MIB, "n1");
        t.advance(1);
    }
    assert_eq!(t.run_tasks(C1), 4);
    for k in ["a", "c", "d"] {
        t.advance(1);
        t.get(k).unwrap();
    }
    t.advance(1_000);
    t.svc.tick();
    assert_eq!(
        t.tier().stats.disk_evicted_replicas,
        0,
        "no policy, no eviction ahead"
    );
    t.put_by(C1, "e", 2 * MIB, "n1");
    assert_eq!(t.run_tasks(C1), 1);
    // b was read least recently (at its put): its disk replica made room.
    assert_eq!(t.replicas("b"), [mem("n1")]);
    assert_eq!(t.replicas("e"), [mem("n1"), on_disk("n1")]);
    assert_eq!(t.tier().disk_used_bytes, 8 * MIB);
    // Every disk replica leased: the next offload waits for a later fetch.
    for k in ["a", "c", "d", "e"] {
        t.get(k).unwrap();
    }
    t.put_by(C1, "f", 2 * MIB, "n1");
    assert!(t.fetch_work(C1).is_empty());
    assert_eq!(t.tier().internal_pending, 1);
    t.advance(1_000);
    assert_eq!(t.fetch_work(C1).len(), 1, "room once the leases ended");
}

#[test]
fn an_object_waiting_for_its_offload_stays_in_memory_until_its_copy_is_made() {
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 16 * MIB, 64 * MIB, DiskPolicy::default());
    for i in 0..8 {
        t.put_by(C1, &format!("f{i}"), 2 * MIB, "n1");
        t.advance(1);
    }
    // Nobody fetched the offloads yet: memory pressure does not drop what is on its way to
    // disk (a put meanwhile is told there is no space now).
    t.svc.tick();
    assert_eq!(t.keys(), 8, "nothing lost");
    assert_eq!(t.tier().stats.offloads_failed, 0);
    // Once the copies are made, eviction drops memory replicas only, and everything stays.
    assert_eq!(t.run_tasks(C1), 8);
    t.advance(10);
    t.svc.tick();
    assert_eq!(
        t.keys(),
        8,
        "still nothing lost: the evicted ones are on disk"
    );
    assert!(t.tier().disk_only_objects > 0, "some now live on disk only");
}

#[test]
fn with_force_evict_an_object_still_waiting_for_its_offload_is_evicted_as_without_a_disk() {
    let mut c = offload_cfg();
    c.offload.force_evict = true;
    let t = T::with(c);
    t.owner(C1, 1, "n1", 16 * MIB, 64 * MIB, DiskPolicy::default());
    for i in 0..8 {
        t.put_by(C1, &format!("f{i}"), 2 * MIB, "n1");
        t.advance(1);
    }
    t.svc.tick();
    assert_eq!(t.keys(), 6, "the two least recently read went");
    let g = t.tier();
    assert_eq!(g.stats.offloads_failed, 2, "their offloads with them");
    assert_eq!(g.internal_pending, 6);
    assert_eq!(t.fetch_work(C1).len(), 6);
}

#[test]
fn promotions_in_flight_are_capped_cluster_wide() {
    let mut c = offload_cfg();
    c.offload.promotion_on_hit = true;
    c.offload.promotion_threshold = 1;
    c.offload.promotion_queue_limit = 1;
    c.client_ttl_s = 10;
    let t = T::with(c);
    t.svc.tick();
    remount(&t, C1, 1, &[("a", MIB, 0, 1), ("b", MIB, 4 * MIB, 2)]);
    t.get("a").unwrap();
    t.get("b").unwrap();
    assert_eq!(
        t.tier().stats.promotions_queued,
        1,
        "b waits for a's to finish"
    );
    // Objects of an earlier term: copied once the owners settled (see the test above).
    t.advance(10_000);
    assert_eq!(t.run_tasks(C1), 1);
    t.get("b").unwrap();
    assert_eq!(t.tier().stats.promotions_queued, 2);
}

#[test]
fn a_remove_frees_the_disk_replica_into_the_owners_outbox() {
    let t = T::with(offload_cfg());
    t.owner(C1, 1, "n1", 64 * MIB, 64 * MIB, DiskPolicy::default());
    t.put_by(C1, "k", MIB, "n1");
    let w = t.fetch_work(C1);
    let addr = w[0].targets[0].buffer_address;
    t.finish(C1, w[0].task_id, true).unwrap();
    t.freed(C1);
    let gone = t
        .call(
            Request::Remove,
            Remove {
                key: "k".into(),
                force: false,
            },
        )
        .unwrap();
    // The remover is told both replicas (to bury them in both catalogs); the owner hears of
    // the disk range at its ping and deletes the file.
    let media: Vec<ReplicaMedium> = gone.iter().map(|r| r.medium).collect();
    assert_eq!(media, [ReplicaMedium::Memory, ReplicaMedium::LocalDisk]);
    assert!(t.freed(C1).contains(&(addr, MIB)));
    assert_eq!(t.tier().disk_used_bytes, 0);
}
