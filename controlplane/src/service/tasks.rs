//! Replica tasks (upstream's `CreateCopyTask` / `CreateMoveTask` / `QueryTask` /
//! `FetchTasks` / `MarkTaskToComplete`): copy an object onto named segments, or move its
//! replica from one segment to another, carried out by a client.
//!
//! Lifecycle of a task:
//!
//! ```text
//!   Create* ──▶ PENDING ──FetchTasks (ranges allocated)──▶ PROCESSING ──CompleteTask(ok)──▶ SUCCESS
//!                 │  ▲                                         │
//!                 │  └─ no space on a target (NO_AVAILABLE_HANDLE), retried at the next fetch,
//!                 │     at most --max_retry_attempts times
//!                 └──────── timeout, object gone, retries spent ──┴── CompleteTask(failed), timeout ──▶ FAILED
//! ```
//!
//! A task is assigned at creation to one client, its executor: the owner of the first target
//! when that client fetches tasks, else any live client that does, else still the target's
//! owner (the task then waits, and fails at `--pending_task_timeout_sec`). When an executor
//! expires, its PENDING tasks go to a live executor and its PROCESSING ones fail. The executor fetches
//! on its ping cadence (`client::store::tasks`); a fetch turns its pending tasks PROCESSING
//! and allocates one range of the object's size on each target, kept in the task (not in the
//! object: readers never see a replica before its bytes are there). On success the ranges
//! become COMPLETE replicas of the object at the version that was copied (the executor has
//! recorded them in the owners' catalogs, as a put does, so an HA re-report brings them
//! back), and a move drops its source replica as `BatchReplicaClear` drops one segment's
//! replica. Anything else fails the task and returns its ranges: at once when the executor
//! reported (it is done writing), parked until `--put_start_release_timeout_sec` when the
//! task timed out (it may still be writing).
//!
//! While a user's task is PENDING or PROCESSING its object *has a replication task*: `Remove`
//! (unless forced), `RemoveAll`, `RemoveByRegex`, `BatchReplicaClear` and `UpsertStart`
//! refuse it with `OBJECT_HAS_REPLICATION_TASK` (-708) or skip it, eviction skips it, and a
//! second task on it is refused with -708. A forced remove, an unmount or an expiry may still
//! take the object or a target away; the task then fails when its executor reports.
//!
//! **Internal tasks.** The disk tier (`offload.rs`) books its own copies here: an *offload*
//! (a copy, or a move for on-evict, from a memory replica onto its owner's disk segment) and
//! a *promotion* (a copy of a disk-only object onto a memory segment). They are executed
//! like user tasks (the same `FetchTasks`/`CompleteTask`, the same wire form: a client tells
//! them apart only by the targets' and sources' `medium`), but the master started them, so
//! they never stand in a user's way: they are kept out of `by_key`, so `Remove`,
//! `RemoveAll`, `RemoveByRegex`, `BatchReplicaClear`, `UpsertStart` and a user's own
//! `Create*Task` proceed as if they were not there. When their object leaves the index or is
//! rewritten the internal task fails at once (`fail_internal`), its ranges parked for the
//! put release timeout if its executor may be writing them, then freed into the owner's
//! freed outbox (the owner deletes the file). Eviction skips objects with one in flight.
//! They count in their own limits (`--offloading_queue_limit` per disk segment,
//! `--promotion_queue_limit` cluster-wide), not in `--max_total_*_tasks`, and are not
//! handed to another executor: only a disk's owner can read or write its files.
//!
//! Tasks are soft state: they live in `State` only, so a restarted master or a new HA leader
//! knows none of them (`QueryTask` answers `TASK_NOT_FOUND`, and an executor's late report is
//! refused); copies already reported complete are in the owners' catalogs and come back with
//! the re-reports.
//!
//! Invariants: `by_key` maps exactly the keys of the PENDING and PROCESSING tasks; every
//! PENDING task is in its executor's `queued` list once; `pending`/`processing` count the
//! tasks in those states; `finished` lists the SUCCESS and FAILED tasks, oldest first, at
//! most `--max_total_finished_tasks`; a PENDING task holds no range, a PROCESSING one holds
//! one per target, each allocated in its segment (or that segment is gone).

use std::collections::{HashSet, VecDeque};

use protocol::limits::{TASKS_PER_FETCH_MAX, TASK_TARGETS_MAX};
use protocol::{
    ErrorCode, ReplicaDescriptor, ReplicaStatus, TaskInfo, TaskStatus, TaskType, TaskWork, Uuid,
    Version,
};

use super::object::{check_key, Object};
use super::segments::{Client, SegRef};
use super::{FastMap, State, Zombie};
use crate::alloc::Span;

/// Interval between scans for timed-out tasks, milliseconds.
const TIMEOUT_SCAN_INTERVAL_MS: u64 = 1000;

/// A successful task's message, as upstream's `QueryTask` shows it.
const SUCCESS_TEXT: &str = "Task completed successfully";

/// The task limits and timeouts, from the master's flags.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskConfig {
    /// `--max_total_finished_tasks`: SUCCESS and FAILED tasks kept for `QueryTask`; the oldest
    /// are forgotten beyond it.
    pub max_finished: u32,
    /// `--max_total_pending_tasks`: beyond it a new task is refused with
    /// `TASK_PENDING_LIMIT_EXCEEDED`.
    pub max_pending: u32,
    /// `--max_total_processing_tasks`: beyond it fetches hand out nothing.
    pub max_processing: u32,
    /// `--pending_task_timeout_sec` in milliseconds (0: none).
    pub pending_timeout_ms: u64,
    /// `--processing_task_timeout_sec` in milliseconds (0: none).
    pub processing_timeout_ms: u64,
    /// `--max_retry_attempts`: fetches that found no space on a target before the task fails.
    pub max_retry_attempts: u32,
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig {
            max_finished: 10_000,
            max_pending: 10_000,
            max_processing: 10_000,
            pending_timeout_ms: 300_000,
            processing_timeout_ms: 300_000,
            max_retry_attempts: 10,
        }
    }
}

/// What the master booked an internal task for (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Internal {
    /// A copy (eager) or move (on-evict) of a memory replica onto its owner's disk segment.
    Offload,
    /// A copy of a disk-only object onto a memory segment.
    Promotion,
    /// A move of an only copy off a draining segment (`drain.rs`).
    Drain,
}

pub(crate) struct Task {
    pub id: Uuid,
    pub kind: TaskType,
    /// `Some` for a task the master booked itself (module docs).
    pub internal: Option<Internal>,
    pub status: TaskStatus,
    pub key: String,
    /// A move's source segment.
    pub source: Option<String>,
    pub targets: Vec<String>,
    pub created_ms: u64,
    pub updated_ms: u64,
    pub assigned: Uuid,
    pub message: String,
    /// Fetches that found no space on a target.
    pub attempts: u32,
    /// While PROCESSING: the version being copied, and one range per target.
    pub version: Version,
    pub ranges: Vec<(SegRef, Span)>,
    /// An internal task, while PROCESSING: the source replicas handed to the executor. A
    /// user's call may take one away meanwhile (internal tasks refuse nothing), and then the
    /// executor may have copied bytes of a reused range: the task must not commit.
    pub sources: Vec<(SegRef, Span)>,
}

impl Task {
    /// A new PENDING task: a move when it has a `source`, else a copy.
    #[allow(clippy::too_many_arguments)]
    fn pending(
        id: Uuid,
        internal: Option<Internal>,
        key: &str,
        source: Option<String>,
        targets: Vec<String>,
        now: u64,
        assigned: Uuid,
        version: Version,
    ) -> Task {
        Task {
            id,
            kind: if source.is_some() {
                TaskType::ReplicaMove
            } else {
                TaskType::ReplicaCopy
            },
            internal,
            status: TaskStatus::Pending,
            key: key.to_string(),
            source,
            targets,
            created_ms: now,
            updated_ms: now,
            assigned,
            message: String::new(),
            attempts: 0,
            version,
            ranges: Vec::new(),
            sources: Vec::new(),
        }
    }
}

#[derive(Default)]
pub(crate) struct Tasks {
    all: FastMap<Uuid, Task>,
    /// Users' PENDING and PROCESSING tasks by key.
    by_key: FastMap<String, Uuid>,
    /// Internal PENDING and PROCESSING tasks by key (at most one per key).
    internal_by_key: FastMap<String, Uuid>,
    /// Offloads PENDING or PROCESSING per disk segment name (`--offloading_queue_limit`).
    pub offloads_by_disk: FastMap<String, usize>,
    /// Promotions PENDING or PROCESSING (`--promotion_queue_limit`).
    pub promotions: usize,
    /// Internal tasks PENDING and PROCESSING.
    internal_pending: usize,
    internal_processing: usize,
    /// PENDING tasks by executor, in creation order.
    queued: FastMap<Uuid, VecDeque<Uuid>>,
    /// Clients that fetch tasks (executors), by the time of their last fetch.
    executors: FastMap<Uuid, u64>,
    pending: usize,
    processing: usize,
    finished: VecDeque<Uuid>,
    next_scan_ms: u64,
}

impl Tasks {
    /// Whether `key` has a user's PENDING or PROCESSING task (internal ones do not count:
    /// they never refuse a user's call).
    pub fn active(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// Whether `key` has an internal (offload or promotion) task in flight.
    pub fn internal_active(&self, key: &str) -> bool {
        self.internal_by_key.contains_key(key)
    }

    /// Until when buffers taken from `key`'s object must stay parked because an executor may
    /// be reading them for an internal task (`release_ms` from now), or 0. The executor
    /// records its copy in the target's catalog under the object's version before it reports,
    /// so bytes it reads must not become another write's under it (module docs).
    pub fn executor_hold(&self, key: &str, now: u64, release_ms: u64) -> u64 {
        let reading = self
            .internal_by_key
            .get(key)
            .and_then(|id| self.all.get(id))
            .is_some_and(|t| t.status == TaskStatus::Processing);
        if reading {
            now.saturating_add(release_ms)
        } else {
            0
        }
    }

    /// Whether `key`'s internal task keeps memory eviction off it: a move (on-evict: the
    /// object waits in memory for it), a task its executor may be reading for, and an eager
    /// offload still PENDING unless `force` (`--offload_force_evict`). Keeping an object that
    /// waits for its disk copy is what makes the tier lossless: while offload lags behind a
    /// burst of puts, memory fills and puts answer `NO_AVAILABLE_HANDLE` (the caller retries)
    /// rather than dropping acknowledged objects that were on their way to disk. A disk that
    /// cannot take them fails their tasks, which releases the objects.
    pub fn internal_blocks_eviction(&self, key: &str, force: bool) -> bool {
        self.internal_by_key
            .get(key)
            .and_then(|id| self.all.get(id))
            .is_some_and(|t| t.source.is_some() || t.status != TaskStatus::Pending || !force)
    }

    /// Internal tasks (PENDING, PROCESSING).
    pub fn internal_counts(&self) -> (usize, usize) {
        (self.internal_pending, self.internal_processing)
    }

    /// The state of a task; times stay on the master's clock.
    pub fn get(&self, id: &Uuid) -> Option<&Task> {
        self.all.get(id)
    }

    /// Who executes a user's task: `owner` if it fetches tasks, else the smallest live
    /// executor, else `owner`.
    fn executor_for(&self, owner: Uuid, clients: &FastMap<Uuid, Client>) -> Uuid {
        if self.executors.contains_key(&owner) {
            owner
        } else {
            self.executors
                .keys()
                .copied()
                .filter(|c| clients.contains_key(c))
                .min()
                .unwrap_or(owner)
        }
    }

    /// Takes task `id` off its PENDING or PROCESSING count (and a PENDING one off its
    /// executor's queue); false when it is gone or already finished.
    fn leave_active(&mut self, id: Uuid) -> bool {
        let Some(task) = self.all.get(&id) else {
            return false;
        };
        let internal = task.internal.is_some();
        match task.status {
            TaskStatus::Pending => {
                if internal {
                    self.internal_pending -= 1;
                } else {
                    self.pending -= 1;
                }
                if let Some(q) = self.queued.get_mut(&task.assigned) {
                    q.retain(|x| *x != id);
                }
            }
            TaskStatus::Processing if internal => self.internal_processing -= 1,
            TaskStatus::Processing => self.processing -= 1,
            TaskStatus::Success | TaskStatus::Failed => return false,
        }
        true
    }

    /// Records `id` among the finished tasks, forgetting the oldest beyond `max`.
    fn remember_finished(&mut self, id: Uuid, max: usize) {
        self.finished.push_back(id);
        while self.finished.len() > max {
            if let Some(old) = self.finished.pop_front() {
                self.all.remove(&old);
            }
        }
    }

    /// A random task id, not nil and not in use.
    fn fresh_id(&self) -> Uuid {
        loop {
            let id = Uuid::random();
            if id != Uuid::NIL && !self.all.contains_key(&id) {
                break id;
            }
        }
    }
}

/// `targets` without repeats, in order.
fn unique_targets(targets: Vec<String>) -> Vec<String> {
    // A target named twice is copied once (upstream accepts the list, and then makes two
    // replicas on one segment).
    let mut seen = HashSet::new();
    targets
        .into_iter()
        .filter(|t| seen.insert(t.clone()))
        .collect()
}

impl State {
    /// `CreateCopyTask` (`source` is `None`) or `CreateMoveTask`: validates and queues a task.
    pub(crate) fn create_task(
        &mut self,
        now: u64,
        key: &str,
        source: Option<&str>,
        targets: Vec<String>,
    ) -> Result<Uuid, ErrorCode> {
        check_key(key)?;
        self.fenced(now)?;
        let targets = unique_targets(targets);
        if targets.is_empty()
            || targets.len() > TASK_TARGETS_MAX
            || source.is_some_and(|s| targets.iter().any(|t| t == s))
        {
            return Err(ErrorCode::InvalidParams);
        }
        let obj = self.objects.get(key).ok_or(ErrorCode::ObjectNotFound)?;
        if !obj.is_complete() {
            return Err(ErrorCode::ReplicaIsNotReady);
        }
        if self.tasks.active(key) {
            return Err(ErrorCode::ObjectHasReplicationTask);
        }
        let owner = self.task_owner(obj, source, &targets)?;
        let t = &mut self.tasks;
        if t.pending >= self.cfg.tasks.max_pending as usize {
            return Err(ErrorCode::TaskPendingLimitExceeded);
        }
        let assigned = t.executor_for(owner, &self.clients);
        let id = t.fresh_id();
        let task = Task::pending(
            id,
            None,
            key,
            source.map(str::to_string),
            targets,
            now,
            assigned,
            obj.version,
        );
        t.all.insert(id, task);
        t.by_key.insert(key.to_string(), id);
        t.queued.entry(assigned).or_default().push_back(id);
        t.pending += 1;
        Ok(id)
    }

    /// The client owning the first target segment (nil if none), checking every target is
    /// mounted and a move's `source` is mounted and holds a replica of `obj`.
    fn task_owner(
        &self,
        obj: &Object,
        source: Option<&str>,
        targets: &[String],
    ) -> Result<Uuid, ErrorCode> {
        // As upstream: a segment that is not mounted, or a move source without a replica, is
        // INVALID_PARAMS; a target that already holds a replica is accepted (nothing is
        // copied there, and a move then only drops its source).
        let mut owner = None;
        for t in targets {
            let seg = self.segs.by_name(t).ok_or(ErrorCode::InvalidParams)?;
            owner.get_or_insert(self.segs.get(seg).map(|s| s.client));
        }
        if let Some(s) = source {
            let seg = self.segs.by_name(s).ok_or(ErrorCode::InvalidParams)?;
            if !obj.replicas.iter().any(|r| r.seg == seg) {
                return Err(ErrorCode::InvalidParams);
            }
        }
        Ok(owner.flatten().unwrap_or(Uuid::NIL))
    }

    /// Books an internal task (module docs): a copy onto `target`, or a move from `source`,
    /// executed by `executor` (the disk's owner). The caller checked the object and limits.
    pub(crate) fn create_internal(
        &mut self,
        now: u64,
        key: &str,
        internal: Internal,
        source: Option<String>,
        target: String,
        executor: Uuid,
    ) -> Option<Uuid> {
        let version = self.objects.get(key)?.version;
        let t = &mut self.tasks;
        if t.internal_by_key.contains_key(key) {
            return None;
        }
        let id = loop {
            let id = Uuid::random();
            if id != Uuid::NIL && !t.all.contains_key(&id) {
                break id;
            }
        };
        match internal {
            Internal::Offload => *t.offloads_by_disk.entry(target.clone()).or_insert(0) += 1,
            Internal::Promotion => t.promotions += 1,
            Internal::Drain => {}
        }
        let task = Task::pending(
            id,
            Some(internal),
            key,
            source,
            vec![target],
            now,
            executor,
            version,
        );
        t.all.insert(id, task);
        t.internal_by_key.insert(key.to_string(), id);
        t.queued.entry(executor).or_default().push_back(id);
        t.internal_pending += 1;
        Some(id)
    }

    /// Fails `key`'s internal task, if any, because its object left the index or is being
    /// rewritten. Its ranges are parked: the executor may be writing them right now.
    pub(crate) fn fail_internal(&mut self, now: u64, key: &str, why: &str) {
        if let Some(&id) = self.tasks.internal_by_key.get(key) {
            let may_write = self
                .tasks
                .all
                .get(&id)
                .is_some_and(|t| t.status == TaskStatus::Processing);
            self.finish_task(now, id, TaskStatus::Failed, why.to_string(), may_write);
        }
    }

    /// `FetchTasks`: the executor's pending tasks, now PROCESSING with their ranges allocated.
    /// A task whose object or target went away fails here; one that found no space on a
    /// target stays queued for the next fetch until its retries are spent.
    pub(crate) fn fetch_tasks(&mut self, now: u64, client: Uuid) -> Vec<TaskWork> {
        self.tasks.executors.insert(client, now);
        let mut work = Vec::new();
        let mut retry = Vec::new();
        let mut promotions = 0u32;
        // Tasks looked at in one fetch: those that cannot start now (no space, over a limit)
        // go back to the queue, and must not make a fetch walk a queue of 50 000 offloads.
        let mut budget = 4 * TASKS_PER_FETCH_MAX;
        while work.len() < TASKS_PER_FETCH_MAX && budget > 0 {
            budget -= 1;
            let Some(id) = self
                .tasks
                .queued
                .get_mut(&client)
                .and_then(VecDeque::pop_front)
            else {
                break;
            };
            // User tasks are held by `--max_total_processing_tasks`, promotions by
            // `--promotion_max_per_heartbeat` per fetch; offloads by their queue limit only.
            let internal = self.tasks.all.get(&id).and_then(|t| t.internal);
            let held = match internal {
                None => self.tasks.processing >= self.cfg.tasks.max_processing as usize,
                Some(Internal::Promotion) => {
                    promotions >= self.cfg.offload.promotion_max_per_heartbeat
                }
                Some(Internal::Offload | Internal::Drain) => false,
            };
            if held {
                retry.push(id);
                continue;
            }
            if internal == Some(Internal::Promotion) {
                promotions += 1;
            }
            match self.start_task(now, id) {
                // Every target already holds a replica: nothing to copy, done here (a move
                // drops its source).
                Ok(w) if w.targets.is_empty() => match self.commit_task(now, id) {
                    Ok(()) => {
                        self.finish_task(now, id, TaskStatus::Success, SUCCESS_TEXT.into(), false)
                    }
                    Err(why) => self.finish_task(now, id, TaskStatus::Failed, why, false),
                },
                Ok(w) => work.push(w),
                Err(Some(e)) => self.finish_task(now, id, TaskStatus::Failed, e, false),
                Err(None) => retry.push(id),
            }
        }
        if let Some(q) = self.tasks.queued.get_mut(&client) {
            for id in retry.into_iter().rev() {
                q.push_front(id);
            }
            if q.is_empty() {
                self.tasks.queued.remove(&client);
            }
        }
        work
    }

    /// Allocates a PENDING task's ranges and makes it PROCESSING. `Err(Some(why))`: it fails;
    /// `Err(None)`: no space now, retry later.
    fn start_task(&mut self, now: u64, id: Uuid) -> Result<TaskWork, Option<String>> {
        let Some(task) = self.tasks.all.get(&id) else {
            return Err(Some("task lost".into()));
        };
        let (key, targets, version) = (task.key.clone(), task.targets.clone(), task.version);
        let stale = version.term < self.term;
        if stale && !self.owners_settled(now) {
            return Err(None);
        }
        let (size, held) = match self.objects.get(&key) {
            Some(o) if o.is_complete() && o.version == version => (
                o.size(),
                o.replicas.iter().map(|x| x.seg).collect::<Vec<_>>(),
            ),
            _ => return Err(Some("the object was removed or replaced".into())),
        };
        let (ranges, lack) = self.allocate_targets(now, &targets, &held, size);
        if self.objects.get(&key).is_none_or(|o| o.version != version) {
            self.free_spans(ranges);
            return Err(Some("the object was removed meanwhile".into()));
        }
        if let Some(why) = lack {
            self.free_spans(ranges);
            return Err(self.not_started(now, id, why));
        }
        // Re-stamped only now that the copy goes out: a task that waits for room leaves the
        // object at the version its owners' catalogs hold (nothing is copied, so nothing
        // needs a version of this term), and one with every target held copies nothing.
        let version = if stale && !ranges.is_empty() {
            match self.restamp(now, id, &key, version) {
                Ok(v) => v,
                Err(e) => {
                    self.free_spans(ranges);
                    return Err(e);
                }
            }
        } else {
            version
        };
        let (Some(task), Some(obj)) = (
            self.tasks.all.get(&id),
            self.objects.get(&key).filter(|o| o.version == version),
        ) else {
            self.free_spans(ranges);
            return Err(Some("task lost".into()));
        };
        let w = self.task_work(now, id, task, obj, &ranges);
        let handed: Vec<(SegRef, Span)> = obj.replicas.iter().map(|r| (r.seg, r.span)).collect();
        let t = &mut self.tasks;
        let task = t.all.get_mut(&id).ok_or(Some(String::new()))?;
        if task.internal.is_some() {
            task.sources = handed;
        }
        task.status = TaskStatus::Processing;
        task.updated_ms = now;
        task.ranges = ranges;
        if task.internal.is_some() {
            t.internal_pending -= 1;
            t.internal_processing += 1;
        } else {
            t.pending -= 1;
            t.processing += 1;
        }
        Ok(w)
    }

    /// A task on an object put under an earlier term (a master restarted or was elected
    /// since): the owners fence writes of ended terms, so a copy made with the object's
    /// version would be refused. Once the owners settled (`State::owners_settled`: no newer
    /// version of the key can still be re-reported), the object takes a version of this term,
    /// which the copy carries; until then the task waits in its queue (`Err(None)`). The
    /// object's other replicas keep the old version in their owners' catalogs: after a later
    /// restart or election the newest copy is re-reported and the older ones released as
    /// stale, as for any key re-reported at two versions (the bytes are the same: nothing is
    /// lost, a replica may be).
    fn restamp(
        &mut self,
        now: u64,
        id: Uuid,
        key: &str,
        version: Version,
    ) -> Result<Version, Option<String>> {
        if !self.owners_settled(now) {
            return Err(None);
        }
        match self.objects.get(key) {
            Some(o) if o.is_complete() && o.version == version => {}
            _ => return Err(Some("the object was removed or replaced".into())),
        }
        let v = self.next_version();
        if let Some(o) = self.objects.get_mut(key) {
            o.version = v;
        }
        self.objects.settle(key);
        if let Some(t) = self.tasks.all.get_mut(&id) {
            t.version = v;
        }
        Ok(v)
    }

    /// Why task `id` did not start: `why` if it fails (a target not mounted), else (no room
    /// now) `None` to retry it later, until its attempts run out.
    fn not_started(&mut self, now: u64, id: Uuid, why: Option<String>) -> Option<String> {
        let max = self.cfg.tasks.max_retry_attempts;
        let Some(task) = self.tasks.all.get_mut(&id) else {
            return Some(String::new());
        };
        why.or_else(|| {
            task.attempts += 1;
            task.updated_ms = now;
            (task.attempts > max).then(|| {
                format!(
                    "no space on a target after {} attempts (NO_AVAILABLE_HANDLE)",
                    task.attempts
                )
            })
        })
    }

    /// Gives back ranges allocated for a task that does not start.
    fn free_spans(&mut self, ranges: Vec<(SegRef, Span)>) {
        for (r, span) in ranges {
            self.segs.free_span(r, span);
        }
    }

    /// Allocates a range for `size` bytes on each target that does not hold a replica
    /// (`held`). Stops at the first that fails: the second value is then `Some(Some(why))`
    /// (the task fails) or `Some(None)` (no space now).
    fn allocate_targets(
        &mut self,
        now: u64,
        targets: &[String],
        held: &[SegRef],
        size: u64,
    ) -> (Vec<(SegRef, Span)>, Option<Option<String>>) {
        let mut ranges: Vec<(SegRef, Span)> = Vec::with_capacity(targets.len());
        let mut lack = None;
        for t in targets {
            let Some(r) = self.segs.by_name(t) else {
                lack = Some(Some(format!("target segment {t} is not mounted")));
                break;
            };
            if held.contains(&r) {
                continue;
            }
            // A disk target may evict disk replicas to make room (`offload.rs`); the
            // object itself is never among them while it has this task in flight.
            match self.allocate_target(now, r, size) {
                Some(span) => ranges.push((r, span)),
                None => {
                    lack = Some(None);
                    break;
                }
            }
        }
        (ranges, lack)
    }

    /// What the executor of task `id` gets: the object's replicas as sources (its own
    /// first) and the allocated `ranges` as PROCESSING targets.
    fn task_work(
        &self,
        now: u64,
        id: Uuid,
        task: &Task,
        obj: &Object,
        ranges: &[(SegRef, Span)],
    ) -> TaskWork {
        // The executor's own replicas first: an offload reads its owner's memory replica,
        // a promotion its owner's disk file, without a network hop.
        let mut sources: Vec<(bool, ReplicaDescriptor)> = obj
            .replicas
            .iter()
            .filter_map(|r| {
                let seg = self.segs.get(r.seg)?;
                Some((
                    seg.client != task.assigned,
                    ReplicaDescriptor {
                        status: r.status,
                        medium: seg.medium,
                        segment_name: seg.name.clone(),
                        transport_endpoint: seg.te_endpoint.clone(),
                        buffer_address: r.span.addr,
                        size: obj.size(),
                        version: obj.version,
                    },
                ))
            })
            .collect();
        sources.sort_by_key(|s| s.0);
        let sources = sources.into_iter().map(|s| s.1).collect();
        let targets = ranges
            .iter()
            .filter_map(|&(r, span)| {
                let seg = self.segs.get(r)?;
                Some(ReplicaDescriptor {
                    status: ReplicaStatus::Processing,
                    medium: seg.medium,
                    segment_name: seg.name.clone(),
                    transport_endpoint: seg.te_endpoint.clone(),
                    buffer_address: span.addr,
                    size: obj.size(),
                    version: obj.version,
                })
            })
            .collect();
        TaskWork {
            task_id: id,
            key: task.key.clone(),
            sources,
            targets,
            with_hard_pin: obj.hard_pin(),
            soft_pin_ttl_ms: obj.soft_pin_left_ms(now),
        }
    }

    /// `CompleteTask` from the task's executor: `ok` commits the copied ranges as COMPLETE
    /// replicas (and drops a move's source replica), otherwise the task fails with `message`.
    pub(crate) fn complete_task(
        &mut self,
        now: u64,
        client: Uuid,
        id: Uuid,
        ok: bool,
        message: String,
    ) -> Result<(), ErrorCode> {
        let task = self.tasks.all.get(&id).ok_or(ErrorCode::TaskNotFound)?;
        if task.assigned != client {
            return Err(ErrorCode::IllegalClient);
        }
        if task.status != TaskStatus::Processing {
            // Timed out (or failed) before this report came.
            return Err(ErrorCode::ObjectNoReplicationTask);
        }
        if !ok {
            let why = if message.is_empty() {
                "the executor failed".to_string()
            } else {
                message
            };
            self.finish_task(now, id, TaskStatus::Failed, why, false);
            return Ok(());
        }
        match self.commit_task(now, id) {
            Ok(()) => self.finish_task(now, id, TaskStatus::Success, SUCCESS_TEXT.into(), false),
            Err(why) => self.finish_task(now, id, TaskStatus::Failed, why, false),
        }
        Ok(())
    }

    /// Adds a PROCESSING task's ranges to its object as COMPLETE replicas, then drops a move's
    /// source replica. On error nothing changed.
    fn commit_task(&mut self, now: u64, id: Uuid) -> Result<(), String> {
        // A user's move may drop the very replica an offload is reading; an internal task's
        // own executor is done reading when it reports.
        let executor_hold = match self.tasks.all.get(&id) {
            Some(t) if t.internal.is_none() => {
                let release_ms = self.cfg.release_timeout_ms();
                self.tasks.executor_hold(&t.key, now, release_ms)
            }
            _ => 0,
        };
        let task = self.tasks.all.get_mut(&id).ok_or("task lost")?;
        let obj = match self.objects.get_mut(&task.key) {
            Some(o) if o.version == task.version && o.is_complete() => o,
            _ => return Err("the object was removed or replaced meanwhile".into()),
        };
        if task.ranges.iter().any(|&(r, _)| self.segs.get(r).is_none()) {
            return Err("a target segment was unmounted meanwhile".into());
        }
        let kept = |&(seg, span): &(SegRef, Span)| {
            obj.replicas.iter().any(|r| r.seg == seg && r.span == span)
        };
        if !task.sources.iter().all(kept) {
            return Err("a source replica was cleared while it was being copied".into());
        }
        let source = match &task.source {
            None => None,
            Some(name) => {
                let at = self
                    .segs
                    .by_name(name)
                    .and_then(|s| obj.replicas.iter().position(|r| r.seg == s))
                    .ok_or_else(|| format!("the source replica on {name} is gone"))?;
                Some(at)
            }
        };
        let hold_until = obj.read_hold_until().max(executor_hold);
        let dropped = source.map(|at| obj.replicas.swap_remove(at));
        for (seg, span) in std::mem::take(&mut task.ranges) {
            obj.replicas.push(super::object::Replica {
                seg,
                span,
                status: ReplicaStatus::Complete,
                on_disk: self.segs.get(seg).is_some_and(|s| s.is_disk()),
            });
        }
        let key = task.key.clone();
        self.objects.settle(&key);
        if let Some(r) = dropped {
            self.release(r.seg, r.span, hold_until, now);
        }
        Ok(())
    }

    /// Moves an active task to SUCCESS or FAILED. Ranges it still holds are freed, or parked
    /// until the put release timeout when `executor_may_write` (a timeout).
    fn finish_task(
        &mut self,
        now: u64,
        id: Uuid,
        status: TaskStatus,
        message: String,
        executor_may_write: bool,
    ) {
        let release_at = now.saturating_add(self.cfg.release_timeout_ms());
        // A task that ends may leave its object evictable (a disk copy now, or nothing it
        // waits for): a pass that found nothing to evict looks again.
        self.evict_epoch += 1;
        let t = &mut self.tasks;
        if !t.leave_active(id) {
            return;
        }
        let Some(task) = t.all.get_mut(&id) else {
            return;
        };
        let internal = task.internal.is_some();
        match task.internal {
            None => {}
            Some(Internal::Offload) => {
                if let Some(target) = task.targets.first() {
                    if let Some(n) = t.offloads_by_disk.get_mut(target) {
                        *n -= 1;
                        if *n == 0 {
                            t.offloads_by_disk.remove(target);
                        }
                    }
                }
                if status == TaskStatus::Success {
                    self.tier.offloads_completed += 1;
                } else {
                    self.tier.offloads_failed += 1;
                }
            }
            // A failed drain move is booked again by the next drain scan.
            Some(Internal::Drain) => {}
            Some(Internal::Promotion) => {
                t.promotions -= 1;
                if status == TaskStatus::Success {
                    self.tier.promotions_completed += 1;
                } else {
                    self.tier.promotions_failed += 1;
                }
            }
        }
        if status == TaskStatus::Failed && !internal {
            tracing::info!(
                "replica task {}-{} on {:?} failed: {message}",
                id.hi,
                id.lo,
                task.key
            );
        }
        task.status = status;
        task.updated_ms = now;
        task.message = message;
        let ranges = std::mem::take(&mut task.ranges);
        if internal {
            t.internal_by_key.remove(&task.key);
        } else {
            t.by_key.remove(&task.key);
        }
        t.remember_finished(id, self.cfg.tasks.max_finished as usize);
        self.release_task_ranges(ranges, executor_may_write, release_at);
    }

    /// Frees a finished task's ranges, or parks them until `release_at` when its executor
    /// may still write them.
    fn release_task_ranges(
        &mut self,
        ranges: Vec<(SegRef, Span)>,
        executor_may_write: bool,
        release_at: u64,
    ) {
        for (seg, span) in ranges {
            if executor_may_write {
                self.zombies.push(Zombie {
                    seg,
                    span,
                    release_at_ms: release_at,
                });
            } else {
                self.segs.free_span(seg, span);
            }
        }
    }

    /// Fails tasks past their pending or processing timeout; forgets executors that left.
    /// Called by `tick`, scans at most once a second.
    pub(crate) fn expire_tasks(&mut self, now: u64) {
        let t = &self.tasks;
        let active = t.pending + t.processing + t.internal_pending + t.internal_processing;
        if now < self.tasks.next_scan_ms || active == 0 {
            return;
        }
        self.tasks.next_scan_ms = now + TIMEOUT_SCAN_INTERVAL_MS;
        let clients = &self.clients;
        self.tasks.executors.retain(|c, _| clients.contains_key(c));
        self.reassign_orphans(now);
        let (pt, xt) = (
            self.cfg.tasks.pending_timeout_ms,
            self.cfg.tasks.processing_timeout_ms,
        );
        let objects = &self.objects;
        let late: Vec<(Uuid, &str)> = self
            .tasks
            .by_key
            .values()
            .chain(self.tasks.internal_by_key.values())
            .filter_map(|id| {
                let t = self.tasks.all.get(id)?;
                // An internal task whose object went another way (an unmount, an expiry)
                // fails now rather than at its timeout (module docs).
                if t.internal.is_some()
                    && objects.get(&t.key).is_none_or(|o| o.version != t.version)
                {
                    return Some((*id, "its object was removed or replaced"));
                }
                let over = |timeout: u64, since: u64| timeout > 0 && now >= since + timeout;
                match t.status {
                    TaskStatus::Pending if over(pt, t.created_ms) => {
                        Some((*id, "timed out waiting for its executor"))
                    }
                    TaskStatus::Processing if over(xt, t.updated_ms) => {
                        Some((*id, "timed out while processing"))
                    }
                    TaskStatus::Processing if !self.clients.contains_key(&t.assigned) => {
                        Some((*id, "its executor expired while processing"))
                    }
                    _ => None,
                }
            })
            .collect();
        for (id, why) in late {
            // A PROCESSING task's executor may still be writing (a timeout, or a client cut
            // off from the master but not from the target): its ranges are parked.
            let may_write = self
                .tasks
                .all
                .get(&id)
                .is_some_and(|t| t.status == TaskStatus::Processing);
            self.finish_task(now, id, TaskStatus::Failed, why.to_string(), may_write);
        }
    }

    /// Hands the PENDING tasks of executors that expired to a live executor, if any. Internal
    /// tasks fail instead: only a disk's owner can read or write its files.
    fn reassign_orphans(&mut self, now: u64) {
        let clients = &self.clients;
        let orphaned: Vec<Uuid> = self
            .tasks
            .queued
            .keys()
            .copied()
            .filter(|c| !clients.contains_key(c))
            .collect();
        let heir = self.tasks.executors.keys().copied().min();
        for gone in orphaned {
            let Some(ids) = self.tasks.queued.remove(&gone) else {
                continue;
            };
            let (internal, user): (Vec<Uuid>, Vec<Uuid>) = ids
                .into_iter()
                .partition(|id| self.tasks.all.get(id).is_some_and(|t| t.internal.is_some()));
            for id in internal {
                let why = "the disk's owner expired".to_string();
                self.finish_task(now, id, TaskStatus::Failed, why, false);
            }
            let Some(heir) = heir else {
                if !user.is_empty() {
                    self.tasks.queued.insert(gone, user.into());
                }
                continue;
            };
            for id in &user {
                if let Some(t) = self.tasks.all.get_mut(id) {
                    t.assigned = heir;
                    t.updated_ms = now;
                }
            }
            self.tasks.queued.entry(heir).or_default().extend(user);
        }
    }

    /// `QueryTask`, with times on the master's clock (the caller converts them).
    pub(crate) fn query_task(&self, id: &Uuid) -> Result<TaskInfo, ErrorCode> {
        let t = self.tasks.get(id).ok_or(ErrorCode::TaskNotFound)?;
        Ok(TaskInfo {
            id: t.id,
            task_type: t.kind,
            status: t.status,
            created_at_ms_epoch: t.created_ms,
            last_updated_at_ms_epoch: t.updated_ms,
            assigned_client: t.assigned,
            message: t.message.clone(),
        })
    }
}
