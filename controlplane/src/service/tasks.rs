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
//! While a task is PENDING or PROCESSING its object *has a replication task*: `Remove`
//! (unless forced), `RemoveAll`, `RemoveByRegex`, `BatchReplicaClear` and `UpsertStart`
//! refuse it with `OBJECT_HAS_REPLICATION_TASK` (-708) or skip it, eviction skips it, and a
//! second task on it is refused with -708. A forced remove, an unmount or an expiry may still
//! take the object or a target away; the task then fails when its executor reports.
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

use super::object::check_key;
use super::segments::SegRef;
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

pub(crate) struct Task {
    pub id: Uuid,
    pub kind: TaskType,
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
}

#[derive(Default)]
pub(crate) struct Tasks {
    all: FastMap<Uuid, Task>,
    by_key: FastMap<String, Uuid>,
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
    /// Whether `key` has a PENDING or PROCESSING task.
    pub fn active(&self, key: &str) -> bool {
        self.by_key.contains_key(key)
    }

    /// The state of a task; times stay on the master's clock.
    pub fn get(&self, id: &Uuid) -> Option<&Task> {
        self.all.get(id)
    }
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
        // A target named twice is copied once (upstream accepts the list, and then makes two
        // replicas on one segment).
        let mut seen = HashSet::new();
        let targets: Vec<String> = targets
            .into_iter()
            .filter(|t| seen.insert(t.clone()))
            .collect();
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
        // As upstream: a segment that is not mounted, or a move source without a replica, is
        // INVALID_PARAMS; a target that already holds a replica is accepted (nothing is
        // copied there, and a move then only drops its source).
        let mut owner = None;
        for t in &targets {
            let seg = self.segs.by_name(t).ok_or(ErrorCode::InvalidParams)?;
            owner.get_or_insert(self.segs.get(seg).map(|s| s.client));
        }
        if let Some(s) = source {
            let seg = self.segs.by_name(s).ok_or(ErrorCode::InvalidParams)?;
            if !obj.replicas.iter().any(|r| r.seg == seg) {
                return Err(ErrorCode::InvalidParams);
            }
        }
        let t = &mut self.tasks;
        if t.pending >= self.cfg.tasks.max_pending as usize {
            return Err(ErrorCode::TaskPendingLimitExceeded);
        }
        let owner = owner.flatten().unwrap_or(Uuid::NIL);
        let clients = &self.clients;
        let assigned = if t.executors.contains_key(&owner) {
            owner
        } else {
            t.executors
                .keys()
                .copied()
                .filter(|c| clients.contains_key(c))
                .min()
                .unwrap_or(owner)
        };
        let id = loop {
            let id = Uuid::random();
            if id != Uuid::NIL && !t.all.contains_key(&id) {
                break id;
            }
        };
        t.all.insert(
            id,
            Task {
                id,
                kind: if source.is_some() {
                    TaskType::ReplicaMove
                } else {
                    TaskType::ReplicaCopy
                },
                status: TaskStatus::Pending,
                key: key.to_string(),
                source: source.map(str::to_string),
                targets,
                created_ms: now,
                updated_ms: now,
                assigned,
                message: String::new(),
                attempts: 0,
                version: obj.version,
                ranges: Vec::new(),
            },
        );
        t.by_key.insert(key.to_string(), id);
        t.queued.entry(assigned).or_default().push_back(id);
        t.pending += 1;
        Ok(id)
    }

    /// `FetchTasks`: the executor's pending tasks, now PROCESSING with their ranges allocated.
    /// A task whose object or target went away fails here; one that found no space on a
    /// target stays queued for the next fetch until its retries are spent.
    pub(crate) fn fetch_tasks(&mut self, now: u64, client: Uuid) -> Vec<TaskWork> {
        self.tasks.executors.insert(client, now);
        let mut work = Vec::new();
        let mut retry = Vec::new();
        while work.len() < TASKS_PER_FETCH_MAX
            && self.tasks.processing < self.cfg.tasks.max_processing as usize
        {
            let Some(id) = self
                .tasks
                .queued
                .get_mut(&client)
                .and_then(VecDeque::pop_front)
            else {
                break;
            };
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
        let obj = match self.objects.get(&task.key) {
            Some(o) if o.is_complete() && o.version == task.version => o,
            _ => return Err(Some("the object was removed or replaced".into())),
        };
        let mut ranges: Vec<(SegRef, Span)> = Vec::with_capacity(task.targets.len());
        let mut lack = None;
        for t in &task.targets {
            let Some(r) = self.segs.by_name(t) else {
                lack = Some(Some(format!("target segment {t} is not mounted")));
                break;
            };
            if obj.replicas.iter().any(|x| x.seg == r) {
                continue;
            }
            match self
                .segs
                .get_mut(r)
                .filter(|s| s.writable())
                .and_then(|s| s.allocate(obj.size))
            {
                Some(span) => ranges.push((r, span)),
                None => {
                    lack = Some(None);
                    break;
                }
            }
        }
        if let Some(why) = lack {
            for (r, span) in ranges {
                self.segs.free_span(r, span);
            }
            let max = self.cfg.tasks.max_retry_attempts;
            let task = self.tasks.all.get_mut(&id).ok_or(Some(String::new()))?;
            return Err(why.or_else(|| {
                task.attempts += 1;
                task.updated_ms = now;
                (task.attempts > max).then(|| {
                    format!(
                        "no space on a target after {} attempts (NO_AVAILABLE_HANDLE)",
                        task.attempts
                    )
                })
            }));
        }
        let sources = obj
            .replicas
            .iter()
            .filter_map(|r| {
                let seg = self.segs.get(r.seg)?;
                Some(ReplicaDescriptor {
                    status: r.status,
                    medium: protocol::ReplicaMedium::Memory,
                    segment_name: seg.name.clone(),
                    transport_endpoint: seg.te_endpoint.clone(),
                    buffer_address: r.span.addr,
                    size: obj.size,
                    version: obj.version,
                })
            })
            .collect();
        let targets = ranges
            .iter()
            .filter_map(|&(r, span)| {
                let seg = self.segs.get(r)?;
                Some(ReplicaDescriptor {
                    status: ReplicaStatus::Processing,
                    medium: protocol::ReplicaMedium::Memory,
                    segment_name: seg.name.clone(),
                    transport_endpoint: seg.te_endpoint.clone(),
                    buffer_address: span.addr,
                    size: obj.size,
                    version: obj.version,
                })
            })
            .collect();
        let w = TaskWork {
            task_id: id,
            key: task.key.clone(),
            sources,
            targets,
            with_hard_pin: obj.hard_pin,
            soft_pin_ttl_ms: obj.soft_pin_left_ms(now),
        };
        let t = &mut self.tasks;
        let task = t.all.get_mut(&id).ok_or(Some(String::new()))?;
        task.status = TaskStatus::Processing;
        task.updated_ms = now;
        task.ranges = ranges;
        t.pending -= 1;
        t.processing += 1;
        Ok(w)
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
        let task = self.tasks.all.get_mut(&id).ok_or("task lost")?;
        let obj = match self.objects.get_mut(&task.key) {
            Some(o) if o.version == task.version && o.is_complete() => o,
            _ => return Err("the object was removed or replaced meanwhile".into()),
        };
        if task.ranges.iter().any(|&(r, _)| self.segs.get(r).is_none()) {
            return Err("a target segment was unmounted meanwhile".into());
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
        let hold_until = obj.read_hold_until();
        let dropped = source.map(|at| obj.replicas.swap_remove(at));
        for (seg, span) in std::mem::take(&mut task.ranges) {
            obj.replicas.push(super::object::Replica {
                seg,
                span,
                status: ReplicaStatus::Complete,
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
        let t = &mut self.tasks;
        let Some(task) = t.all.get_mut(&id) else {
            return;
        };
        match task.status {
            TaskStatus::Pending => {
                t.pending -= 1;
                if let Some(q) = t.queued.get_mut(&task.assigned) {
                    q.retain(|x| *x != id);
                }
            }
            TaskStatus::Processing => t.processing -= 1,
            TaskStatus::Success | TaskStatus::Failed => return,
        }
        if status == TaskStatus::Failed {
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
        for (seg, span) in std::mem::take(&mut task.ranges) {
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
        t.by_key.remove(&task.key);
        t.finished.push_back(id);
        while t.finished.len() > self.cfg.tasks.max_finished as usize {
            if let Some(old) = t.finished.pop_front() {
                t.all.remove(&old);
            }
        }
    }

    /// Fails tasks past their pending or processing timeout; forgets executors that left.
    /// Called by `tick`, scans at most once a second.
    pub(crate) fn expire_tasks(&mut self, now: u64) {
        if now < self.tasks.next_scan_ms || (self.tasks.pending + self.tasks.processing) == 0 {
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
        let late: Vec<(Uuid, &str)> = self
            .tasks
            .by_key
            .values()
            .filter_map(|id| {
                let t = self.tasks.all.get(id)?;
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

    /// Hands the PENDING tasks of executors that expired to a live executor, if any.
    fn reassign_orphans(&mut self, now: u64) {
        let clients = &self.clients;
        let orphaned: Vec<Uuid> = self
            .tasks
            .queued
            .keys()
            .copied()
            .filter(|c| !clients.contains_key(c))
            .collect();
        let Some(heir) = self.tasks.executors.keys().copied().min() else {
            return;
        };
        for gone in orphaned {
            let Some(ids) = self.tasks.queued.remove(&gone) else {
                continue;
            };
            for id in &ids {
                if let Some(t) = self.tasks.all.get_mut(id) {
                    t.assigned = heir;
                    t.updated_ms = now;
                }
            }
            self.tasks.queued.entry(heir).or_default().extend(ids);
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
