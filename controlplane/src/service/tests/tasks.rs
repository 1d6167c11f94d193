//! Replica tasks (`service/tasks.rs`) through the public surface: create, fetch, complete,
//! query, and what a running task refuses, on a manual clock.

use protocol::message::*;
use protocol::*;

use super::*;
use crate::model::{cfg, T};

const MIB: u64 = 1 << 20;
const C1: Uuid = Uuid { hi: 1, lo: 1 };
const C2: Uuid = Uuid { hi: 2, lo: 2 };
const C3: Uuid = Uuid { hi: 3, lo: 3 };

impl T {
    /// Mounts segment `name` of `client` on host `host<n>` (`n` picks its base address).
    fn mount_seg(&self, client: Uuid, n: u64, name: &str, size: u64) {
        self.mount_on(client, n, name, size, &format!("host{n}"));
    }

    /// Three clients with a segment each: s1 (C1), s2 (C2), s3 (C3).
    fn three(cfg: ServiceConfig) -> T {
        let t = T::with(cfg);
        t.mount_seg(C1, 1, "s1", 64 * MIB);
        t.mount_seg(C2, 2, "s2", 64 * MIB);
        t.mount_seg(C3, 3, "s3", 64 * MIB);
        t
    }

    /// Puts `key` with one replica, on segment `seg`.
    fn put_on(&self, key: &str, size: u64, seg: &str) {
        let config = ReplicateConfig {
            preferred_segment: seg.into(),
            ..Default::default()
        };
        let r = self.start_with(C1, key, size, config).expect("put start");
        assert_eq!(r[0].segment_name, seg);
        self.end(C1, key).expect("put end");
    }

    fn copy(&self, key: &str, targets: &[&str]) -> Result<Uuid, ErrorCode> {
        self.call(
            Request::CreateCopyTask,
            CreateCopyTask {
                key: key.into(),
                targets: targets.iter().map(|s| s.to_string()).collect(),
            },
        )
    }

    fn mv(&self, key: &str, source: &str, target: &str) -> Result<Uuid, ErrorCode> {
        self.call(
            Request::CreateMoveTask,
            CreateMoveTask {
                key: key.into(),
                source: source.into(),
                target: target.into(),
            },
        )
    }

    fn query(&self, id: Uuid) -> Result<TaskInfo, ErrorCode> {
        self.call(Request::QueryTask, QueryTask { task_id: id })
    }

    fn status(&self, id: Uuid) -> TaskStatus {
        self.query(id).expect("task known").status
    }

    fn fetch(&self, client: Uuid) -> Vec<TaskWork> {
        self.call(Request::FetchTasks, FetchTasks { client_id: client })
            .expect("fetch")
    }

    fn complete(&self, client: Uuid, id: Uuid, ok: bool, msg: &str) -> Result<(), ErrorCode> {
        self.call(
            Request::CompleteTask,
            CompleteTask {
                client_id: client,
                task_id: id,
                ok,
                message: msg.into(),
            },
        )
    }

    /// The segments holding the readable replicas of `key`, sorted.
    fn holders(&self, key: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .get(key)
            .expect("readable")
            .replicas
            .into_iter()
            .map(|r| r.segment_name)
            .collect();
        v.sort();
        v
    }

    fn used_bytes(&self) -> u64 {
        self.svc.gauges().allocated_bytes
    }
}

#[test]
fn copy_walks_pending_processing_success_and_adds_the_replica() {
    let t = T::three(cfg());
    t.put_on("k", MIB, "s1");
    let id = t.copy("k", &["s2"]).unwrap();
    let q = t.query(id).unwrap();
    assert_eq!(
        (q.id, q.task_type, q.status, q.assigned_client),
        (id, TaskType::ReplicaCopy, TaskStatus::Pending, C2)
    );
    assert!(q.created_at_ms_epoch > 1_600_000_000_000, "wall-clock time");
    // Another client's fetch does not take C2's task.
    assert!(t.fetch(C3).is_empty());
    let w = t.fetch(C2);
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].task_id, w[0].key.as_str()), (id, "k"));
    assert_eq!(w[0].sources.len(), 1);
    assert_eq!(w[0].sources[0].segment_name, "s1");
    assert_eq!(w[0].targets.len(), 1);
    assert_eq!(w[0].targets[0].segment_name, "s2");
    assert_eq!(w[0].targets[0].size, MIB);
    assert_eq!(w[0].targets[0].version, w[0].sources[0].version);
    assert_eq!(t.status(id), TaskStatus::Processing);
    // Readers do not see the copy before it is complete; its range is taken.
    assert_eq!(t.holders("k"), ["s1"]);
    assert_eq!(t.used_bytes(), 2 * MIB);
    assert!(t.fetch(C2).is_empty(), "handed out once");
    // Only the executor reports.
    assert_eq!(t.complete(C1, id, true, ""), Err(ErrorCode::IllegalClient));
    t.complete(C2, id, true, "").unwrap();
    let q = t.query(id).unwrap();
    assert_eq!(
        (q.status, q.message.as_str()),
        (TaskStatus::Success, "Task completed successfully")
    );
    assert!(q.last_updated_at_ms_epoch >= q.created_at_ms_epoch);
    assert_eq!(t.holders("k"), ["s1", "s2"]);
    // A second report of a finished task is refused.
    assert_eq!(
        t.complete(C2, id, true, ""),
        Err(ErrorCode::ObjectNoReplicationTask)
    );
    // The task is over: the object is removable again (once the read lease has passed).
    t.advance(1_000);
    t.remove_key("k").unwrap();
    assert_eq!(t.used_bytes(), 0);
}

#[test]
fn copy_to_several_targets_and_move_leaves_only_the_target() {
    let t = T::three(cfg());
    t.put_on("c", MIB, "s1");
    let id = t.copy("c", &["s2", "s3"]).unwrap();
    let w = t.fetch(C2);
    assert_eq!(w[0].targets.len(), 2);
    t.complete(C2, id, true, "").unwrap();
    assert_eq!(t.holders("c"), ["s1", "s2", "s3"]);

    t.put_on("m", MIB, "s1");
    // C3 fetches from now on, so the move goes to it, the target's owner.
    assert!(t.fetch(C3).is_empty());
    let id = t.mv("m", "s1", "s3").unwrap();
    assert_eq!(t.query(id).unwrap().assigned_client, C3);
    assert_eq!(t.query(id).unwrap().task_type, TaskType::ReplicaMove);
    assert_eq!(t.fetch(C3).len(), 1);
    t.complete(C3, id, true, "").unwrap();
    assert_eq!(t.status(id), TaskStatus::Success);
    assert_eq!(t.holders("m"), ["s3"]);
    // 3 replicas of c, 1 of m: the source range went back.
    assert_eq!(t.used_bytes(), 4 * MIB);
}

#[test]
fn bad_inputs_are_refused_with_upstreams_codes() {
    let t = T::three(cfg());
    t.put_on("k", MIB, "s1");
    assert_eq!(t.copy("nope", &["s2"]), Err(ErrorCode::ObjectNotFound));
    // Codes observed on upstream's wheel (0.3.13.post1) for the same calls.
    assert_eq!(t.copy("k", &["nowhere"]), Err(ErrorCode::InvalidParams));
    assert_eq!(t.copy("k", &[]), Err(ErrorCode::InvalidParams));
    assert_eq!(t.copy("", &["s2"]), Err(ErrorCode::InvalidParams));
    assert_eq!(t.mv("k", "s2", "s3"), Err(ErrorCode::InvalidParams));
    assert_eq!(t.mv("k", "nowhere", "s3"), Err(ErrorCode::InvalidParams));
    assert_eq!(t.mv("k", "s1", "nowhere"), Err(ErrorCode::InvalidParams));
    assert_eq!(t.mv("k", "s1", "s1"), Err(ErrorCode::InvalidParams));
    assert_eq!(t.query(Uuid::NIL), Err(ErrorCode::TaskNotFound));
    assert_eq!(
        t.complete(C2, Uuid::from_parts(9, 9), true, ""),
        Err(ErrorCode::TaskNotFound)
    );
    // A put in flight is not copied.
    t.start_with(C1, "busy", MIB, ReplicateConfig::default())
        .unwrap();
    assert_eq!(t.copy("busy", &["s2"]), Err(ErrorCode::ReplicaIsNotReady));
}

#[test]
fn a_running_task_blocks_remove_upsert_clear_and_a_second_task() {
    let t = T::three(cfg());
    t.put_on("k", MIB, "s1");
    let id = t.copy("k", &["s2"]).unwrap();
    assert_eq!(
        t.copy("k", &["s3"]),
        Err(ErrorCode::ObjectHasReplicationTask)
    );
    assert_eq!(
        t.mv("k", "s1", "s3"),
        Err(ErrorCode::ObjectHasReplicationTask)
    );
    assert_eq!(t.remove_key("k"), Err(ErrorCode::ObjectHasReplicationTask));
    let up = t.call(
        Request::UpsertStart,
        UpsertStart {
            client_id: C1,
            key: "k".into(),
            size: MIB,
            config: ReplicateConfig::default(),
        },
    );
    assert_eq!(up, Err(ErrorCode::ObjectHasReplicationTask));
    let clear = t
        .call(
            Request::BatchReplicaClear,
            BatchReplicaClear {
                client_id: C1,
                keys: vec!["k".into()],
                segment_name: String::new(),
            },
        )
        .unwrap();
    assert_eq!(clear, vec![Err(ErrorCode::ObjectHasReplicationTask)]);
    let all = t.call(Request::RemoveAll, RemoveAll { force: true });
    assert_eq!(all, Ok(0));
    // Still there, still PENDING; the executor takes it and it completes.
    assert_eq!(t.fetch(C2).len(), 1);
    t.complete(C2, id, true, "").unwrap();
    assert_eq!(t.holders("k"), ["s1", "s2"]);
}

#[test]
fn a_forced_remove_under_a_task_fails_the_task_and_returns_its_range() {
    let t = T::three(cfg());
    t.put_on("k", MIB, "s1");
    let id = t.copy("k", &["s2"]).unwrap();
    assert_eq!(t.fetch(C2).len(), 1);
    let r = t.call(
        Request::Remove,
        Remove {
            key: "k".into(),
            force: true,
        },
    );
    assert!(r.is_ok(), "{r:?}");
    t.complete(C2, id, true, "").unwrap();
    let q = t.query(id).unwrap();
    assert_eq!(q.status, TaskStatus::Failed);
    assert!(q.message.contains("removed"), "{}", q.message);
    assert_eq!(t.used_bytes(), 0);
}

#[test]
fn a_failed_copy_frees_its_range_and_keeps_the_message() {
    let t = T::three(cfg());
    t.put_on("k", MIB, "s1");
    let id = t.copy("k", &["s3"]).unwrap();
    assert_eq!(t.fetch(C3).len(), 1);
    assert_eq!(t.used_bytes(), 2 * MIB);
    t.complete(C3, id, false, "transfer failed: -800").unwrap();
    let q = t.query(id).unwrap();
    assert_eq!(
        (q.status, q.message.as_str()),
        (TaskStatus::Failed, "transfer failed: -800")
    );
    assert_eq!(t.used_bytes(), MIB);
    assert_eq!(t.holders("k"), ["s1"]);
    // The object is free for another task.
    assert!(t.copy("k", &["s3"]).is_ok());
}

#[test]
fn tasks_time_out_pending_and_processing() {
    let mut c = cfg();
    c.tasks.pending_timeout_ms = 5_000;
    c.tasks.processing_timeout_ms = 3_000;
    c.put_start_release_timeout_s = 60;
    let t = T::three(c);
    t.put_on("a", MIB, "s1");
    t.put_on("b", MIB, "s1");
    let pending = t.copy("a", &["s2"]).unwrap();
    let processing = t.copy("b", &["s3"]).unwrap();
    assert_eq!(t.fetch(C3).len(), 1);
    t.advance(2_999);
    t.svc.tick();
    assert_eq!(t.status(processing), TaskStatus::Processing);
    // Timeouts are scanned once a second: found at most a second late.
    t.advance(1_001);
    t.svc.tick();
    let q = t.query(processing).unwrap();
    assert_eq!(q.status, TaskStatus::Failed);
    assert!(q.message.contains("timed out"), "{}", q.message);
    // The executor may still be writing: the range stays taken until the release timeout.
    assert_eq!(t.used_bytes(), 3 * MIB);
    assert_eq!(
        t.complete(C3, processing, true, ""),
        Err(ErrorCode::ObjectNoReplicationTask)
    );
    assert_eq!(t.holders("b"), ["s1"]);
    assert_eq!(t.status(pending), TaskStatus::Pending);
    t.advance(2_000);
    t.svc.tick();
    assert_eq!(t.status(pending), TaskStatus::Failed);
    t.advance(60_000);
    t.svc.tick();
    assert_eq!(t.used_bytes(), 2 * MIB);
    // Both objects are removable again.
    t.remove_key("a").unwrap();
    t.remove_key("b").unwrap();
}

#[test]
fn no_space_is_retried_until_the_attempts_are_spent() {
    let mut c = cfg();
    c.tasks.max_retry_attempts = 2;
    let t = T::with(c);
    t.mount_seg(C1, 1, "s1", 64 * MIB);
    t.mount_seg(C2, 2, "small", MIB);
    t.put_on("big", 2 * MIB, "s1");
    let id = t.copy("big", &["small"]).unwrap();
    for _ in 0..2 {
        assert!(t.fetch(C2).is_empty());
        assert_eq!(t.status(id), TaskStatus::Pending);
    }
    assert!(t.fetch(C2).is_empty());
    let q = t.query(id).unwrap();
    assert_eq!(q.status, TaskStatus::Failed);
    assert!(q.message.contains("NO_AVAILABLE_HANDLE"), "{}", q.message);
    assert_eq!(t.used_bytes(), 2 * MIB);
}

#[test]
fn limits_bound_pending_and_finished_tasks() {
    let mut c = cfg();
    c.tasks.max_pending = 1;
    c.tasks.max_finished = 1;
    let t = T::three(c);
    t.put_on("a", MIB, "s1");
    t.put_on("b", MIB, "s1");
    let a = t.copy("a", &["s2"]).unwrap();
    assert_eq!(
        t.copy("b", &["s2"]),
        Err(ErrorCode::TaskPendingLimitExceeded)
    );
    assert_eq!(t.fetch(C2).len(), 1);
    // PROCESSING does not count as pending.
    let b = t.copy("b", &["s2"]).unwrap();
    t.complete(C2, a, true, "").unwrap();
    assert_eq!(t.fetch(C2).len(), 1);
    t.complete(C2, b, true, "").unwrap();
    // Only the last finished task is remembered.
    assert_eq!(t.query(a), Err(ErrorCode::TaskNotFound));
    assert_eq!(t.status(b), TaskStatus::Success);
}

#[test]
fn a_task_goes_to_a_client_that_fetches_when_the_target_owner_does_not() {
    let t = T::three(cfg());
    t.put_on("k", MIB, "s1");
    // C1 fetches (an executor); C2, the target's owner, never has.
    assert!(t.fetch(C1).is_empty());
    let id = t.copy("k", &["s2"]).unwrap();
    assert_eq!(t.query(id).unwrap().assigned_client, C1);
    assert_eq!(t.fetch(C1).len(), 1);
    t.complete(C1, id, true, "").unwrap();
    assert_eq!(t.holders("k"), ["s1", "s2"]);
}

#[test]
fn an_expired_executor_hands_on_its_pending_tasks_and_fails_its_processing_ones() {
    let mut c = cfg();
    c.client_ttl_s = 10;
    let t = T::three(c);
    t.mount_seg(C3, 4, "s4", 64 * MIB);
    t.put_on("p", MIB, "s3");
    t.put_on("q", MIB, "s3");
    // C1 and C2 execute; C3 does not (yet).
    assert!(t.fetch(C1).is_empty());
    assert!(t.fetch(C2).is_empty());
    let running = t.copy("q", &["s2"]).unwrap();
    assert_eq!(t.fetch(C2).len(), 1);
    // s4's owner does not execute: the lowest executor id gets the task.
    let waiting = t.copy("p", &["s4"]).unwrap();
    assert_eq!(t.query(waiting).unwrap().assigned_client, C1);
    // C1 and C2 go silent and expire while C3 pings: C2's running task fails; C1's waiting
    // one has no live executor to go to and stays queued.
    for _ in 0..11 {
        t.advance(1_000);
        t.call(Request::Ping, Ping { client_id: C3 }).unwrap();
        t.svc.tick();
    }
    let q = t.query(running).unwrap();
    assert_eq!(q.status, TaskStatus::Failed);
    assert!(q.message.contains("expired"), "{}", q.message);
    assert_eq!(t.status(waiting), TaskStatus::Pending);
    // C3 starts fetching: the orphaned task is handed to it at the next scan.
    assert!(t.fetch(C3).is_empty());
    t.advance(1_000);
    t.call(Request::Ping, Ping { client_id: C3 }).unwrap();
    t.svc.tick();
    assert_eq!(t.query(waiting).unwrap().assigned_client, C3);
    assert_eq!(t.fetch(C3).len(), 1);
    t.complete(C3, waiting, true, "").unwrap();
    assert_eq!(t.holders("p"), ["s3", "s4"]);
}

#[test]
fn tasks_are_forgotten_with_the_term() {
    let t = T::three(cfg());
    t.put_on("k", MIB, "s1");
    let id = t.copy("k", &["s2"]).unwrap();
    t.svc.reset(7, &[]);
    assert_eq!(t.query(id), Err(ErrorCode::TaskNotFound));
}

impl T {
    fn remove_key(&self, key: &str) -> Result<(), ErrorCode> {
        self.call(
            Request::Remove,
            Remove {
                key: key.into(),
                force: false,
            },
        )
        .map(|_| ())
    }
}

#[test]
fn targets_already_holding_or_named_twice_are_accepted_as_upstream() {
    let t = T::three(cfg());
    t.put_on("k", MIB, "s1");
    assert!(t.fetch(C1).is_empty());
    // A copy onto the holder: accepted, done at the fetch with nothing to copy.
    let id = t.copy("k", &["s1"]).unwrap();
    assert!(t.fetch(C1).is_empty(), "no work for the executor");
    assert_eq!(t.status(id), TaskStatus::Success);
    assert_eq!(t.query(id).unwrap().message, "Task completed successfully");
    assert_eq!(t.holders("k"), ["s1"]);
    // A target named twice is copied once (by its owner, which fetches from now on).
    assert!(t.fetch(C2).is_empty());
    let id = t.copy("k", &["s2", "s2"]).unwrap();
    let w = t.fetch(C2);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].targets.len(), 1);
    t.complete(C2, id, true, "").unwrap();
    assert_eq!(t.holders("k"), ["s1", "s2"]);
    // A move onto a holder only drops the source.
    let id = t.mv("k", "s1", "s2").unwrap();
    assert!(t.fetch(C2).is_empty());
    assert_eq!(t.status(id), TaskStatus::Success);
    assert_eq!(t.holders("k"), ["s2"]);
}
