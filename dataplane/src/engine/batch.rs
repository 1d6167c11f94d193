//! Batches: the requests of one `submit` family and the status of each.
//!
//! A batch is allocated with a capacity, filled by one or more submissions, polled per request
//! or as a whole, and freed. Each request moves `Waiting -> Pending -> Completed | Failed`;
//! a request still waiting or pending past its deadline reports `Timeout` (the I/O itself is
//! bounded separately by the transport's timeout and then settles).
//!
//! Invariants: a batch id is never 0 (0 is the Python layer's "submission failed"); a batch
//! with a job still running cannot be freed (`ERR_BATCH_BUSY` while a request has no outcome;
//! once every request has one, free waits the moment it takes the job to return), so no job
//! ever reports into a freed batch or outlives the memory checks made for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use super::config::{BATCHES_MAX, BATCH_CAPACITY_MAX};
use super::error::EngineError;
use super::SegmentHandle;
use crate::transport::header::Opcode;
use crate::TeError;

/// Status of one request or a batch, numbered as upstream's `TransferStatusEnum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum TransferStatus {
    Waiting = 0,
    Pending = 1,
    Completed = 4,
    Timeout = 5,
    Failed = 6,
}

/// One request: move `length` bytes between local `source` and `target_offset` (an absolute
/// address) in segment `target`. READ copies remote to local, WRITE local to remote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferRequest {
    pub opcode: Opcode,
    pub source: u64,
    pub target: SegmentHandle,
    pub target_offset: u64,
    pub length: u64,
}

/// The detailed state of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskReport {
    pub status: TransferStatus,
    /// Bytes moved: the length once completed, else 0.
    pub transferred_bytes: u64,
    /// The negative code of a failed request.
    pub error_code: Option<i32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    Pending,
    Completed,
    Failed(i32),
}

#[derive(Debug)]
struct Task {
    len: u64,
    deadline: Instant,
    state: State,
}

/// A batch; see the module docs.
#[derive(Debug)]
pub(crate) struct Batch {
    capacity: usize,
    tasks: Mutex<Vec<Task>>,
    /// Jobs submitted and not yet finished.
    running: AtomicUsize,
}

impl Batch {
    fn tasks(&self) -> MutexGuard<'_, Vec<Task>> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `lens.len()` waiting tasks; returns the index of the first.
    pub(crate) fn append(
        &self,
        items: impl ExactSizeIterator<Item = (u64, Instant)>,
    ) -> Result<usize, EngineError> {
        let mut tasks = self.tasks();
        if tasks.len() + items.len() > self.capacity {
            return Err(EngineError::new(
                TeError::TooManyRequests,
                format!(
                    "batch of capacity {} holds {} requests, {} more submitted",
                    self.capacity,
                    tasks.len(),
                    items.len()
                ),
            ));
        }
        let first = tasks.len();
        tasks.extend(items.map(|(len, deadline)| Task {
            len,
            deadline,
            state: State::Waiting,
        }));
        Ok(first)
    }

    pub(crate) fn job_started(&self) {
        self.running.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn job_finished(&self) {
        self.running.fetch_sub(1, Ordering::SeqCst);
    }

    pub(crate) fn set_pending(&self, index: usize) {
        if let Some(t) = self.tasks().get_mut(index) {
            t.state = State::Pending;
        }
    }

    /// Records the outcome of task `index`: `Ok` or a negative code.
    pub(crate) fn finish(&self, index: usize, result: Result<(), i32>) {
        if let Some(t) = self.tasks().get_mut(index) {
            t.state = match result {
                Ok(()) => State::Completed,
                Err(code) => State::Failed(code),
            };
        }
    }

    fn report_of(t: &Task, now: Instant) -> TaskReport {
        let (status, error_code) = match t.state {
            State::Completed => (TransferStatus::Completed, None),
            State::Failed(c) => (TransferStatus::Failed, Some(c)),
            _ if now > t.deadline => (TransferStatus::Timeout, None),
            State::Waiting => (TransferStatus::Waiting, None),
            State::Pending => (TransferStatus::Pending, None),
        };
        TaskReport {
            status,
            transferred_bytes: if status == TransferStatus::Completed {
                t.len
            } else {
                0
            },
            error_code,
        }
    }

    pub(crate) fn report(&self, index: usize) -> Result<TaskReport, EngineError> {
        let tasks = self.tasks();
        let t = tasks.get(index).ok_or_else(|| {
            EngineError::new(
                TeError::InvalidArgument,
                format!("task {index} of a batch holding {}", tasks.len()),
            )
        })?;
        Ok(Self::report_of(t, Instant::now()))
    }

    /// The batch as a whole: Failed if any failed, else Timeout if any timed out, else
    /// Completed if all completed (an empty batch is completed), else Pending/Waiting.
    pub(crate) fn overall(&self) -> TaskReport {
        let now = Instant::now();
        let tasks = self.tasks();
        let mut out = TaskReport {
            status: TransferStatus::Completed,
            transferred_bytes: 0,
            error_code: None,
        };
        let mut all_waiting = !tasks.is_empty();
        let mut timeout = false;
        let mut pending = false;
        for t in tasks.iter() {
            let r = Self::report_of(t, now);
            out.transferred_bytes += r.transferred_bytes;
            match r.status {
                TransferStatus::Failed => {
                    out.error_code = out.error_code.or(r.error_code);
                }
                TransferStatus::Timeout => timeout = true,
                TransferStatus::Waiting => pending = true,
                TransferStatus::Pending => {
                    pending = true;
                    all_waiting = false;
                }
                TransferStatus::Completed => all_waiting = false,
            }
        }
        out.status = if out.error_code.is_some() {
            TransferStatus::Failed
        } else if timeout {
            TransferStatus::Timeout
        } else if pending && all_waiting {
            TransferStatus::Waiting
        } else if pending {
            TransferStatus::Pending
        } else {
            TransferStatus::Completed
        };
        out
    }

    pub(crate) fn busy(&self) -> bool {
        self.running.load(Ordering::SeqCst) > 0
    }

    /// Whether every task has its outcome (none waiting or pending). A job still counted as
    /// running then is past its last `finish` and about to return.
    fn settled(&self) -> bool {
        self.tasks()
            .iter()
            .all(|t| matches!(t.state, State::Completed | State::Failed(_)))
    }
}

/// The live batches of an engine, by id.
#[derive(Debug)]
pub(crate) struct BatchTable {
    batches: Mutex<HashMap<u64, Arc<Batch>>>,
    next_id: AtomicU64,
}

impl BatchTable {
    pub(crate) fn new() -> BatchTable {
        BatchTable {
            batches: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<u64, Arc<Batch>>> {
        self.batches.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn allocate(&self, capacity: usize) -> Result<u64, EngineError> {
        if capacity == 0 || capacity > BATCH_CAPACITY_MAX {
            return Err(EngineError::new(
                TeError::InvalidArgument,
                format!("batch capacity {capacity}, expected 1..={BATCH_CAPACITY_MAX}"),
            ));
        }
        let mut map = self.map();
        if map.len() >= BATCHES_MAX {
            return Err(EngineError::new(
                TeError::TooManyRequests,
                format!("{BATCHES_MAX} batches are alive; free some first"),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        map.insert(
            id,
            Arc::new(Batch {
                capacity,
                tasks: Mutex::new(Vec::with_capacity(capacity.min(1024))),
                running: AtomicUsize::new(0),
            }),
        );
        Ok(id)
    }

    pub(crate) fn get(&self, id: u64) -> Result<Arc<Batch>, EngineError> {
        self.map()
            .get(&id)
            .cloned()
            .ok_or_else(|| EngineError::new(TeError::InvalidArgument, format!("no batch {id}")))
    }

    pub(crate) fn free(&self, id: u64) -> Result<(), EngineError> {
        let mut map = self.map();
        let batch = map
            .get(&id)
            .ok_or_else(|| EngineError::new(TeError::InvalidArgument, format!("no batch {id}")))?;
        if batch.busy() {
            if !batch.settled() {
                return Err(EngineError::new(
                    TeError::BatchBusy,
                    format!("batch {id} still has requests in flight"),
                ));
            }
            // Every request has its outcome, so the caller saw the batch done; the job that
            // reported the last one has not returned yet. It has nothing left but to return:
            // wait for that instead of refusing a free the caller had every reason to expect
            // to work.
            while batch.busy() {
                std::thread::yield_now();
            }
        }
        map.remove(&id);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A batch whose requests all have their outcome can be freed even while the job that
    /// reported the last one is still returning (it waits for that job, it does not refuse).
    #[test]
    fn a_settled_batch_frees_while_its_job_returns() {
        let t = Arc::new(BatchTable::new());
        let id = t.allocate(1).unwrap();
        let b = t.get(id).unwrap();
        let far = Instant::now() + Duration::from_secs(60);
        b.append([(8, far)].into_iter()).unwrap();
        b.job_started();
        assert_eq!(t.free(id).unwrap_err().code(), TeError::BatchBusy);
        b.finish(0, Err(-800));
        assert_eq!(b.overall().status, TransferStatus::Failed);
        let job = std::thread::spawn({
            let b = b.clone();
            move || {
                std::thread::sleep(Duration::from_millis(50));
                b.job_finished();
            }
        });
        t.free(id).expect("a settled batch frees");
        assert!(!b.busy(), "free returned before the job did");
        job.join().unwrap();
        assert!(t.get(id).is_err());
    }

    #[test]
    fn lifecycle_and_aggregate() {
        let t = BatchTable::new();
        assert!(t.allocate(0).is_err());
        let id = t.allocate(3).unwrap();
        assert_ne!(id, 0);
        let b = t.get(id).unwrap();
        let far = Instant::now() + Duration::from_secs(60);
        assert_eq!(b.append([(1, far), (2, far)].into_iter()).unwrap(), 0);
        assert_eq!(
            b.append([(1, far), (1, far)].into_iter())
                .unwrap_err()
                .code(),
            TeError::TooManyRequests
        );
        assert_eq!(b.overall().status, TransferStatus::Waiting);
        b.job_started();
        b.set_pending(0);
        assert_eq!(b.overall().status, TransferStatus::Pending);
        assert_eq!(t.free(id).unwrap_err().code(), TeError::BatchBusy);
        b.finish(0, Ok(()));
        b.finish(1, Err(-3));
        b.job_finished();
        assert_eq!(b.report(0).unwrap().status, TransferStatus::Completed);
        assert_eq!(b.report(0).unwrap().transferred_bytes, 1);
        assert_eq!(b.report(1).unwrap().error_code, Some(-3));
        assert!(b.report(2).is_err());
        let all = b.overall();
        assert_eq!(
            (all.status, all.error_code),
            (TransferStatus::Failed, Some(-3))
        );
        t.free(id).unwrap();
        assert!(t.get(id).is_err());
    }

    #[test]
    fn past_deadline_is_timeout() {
        let t = BatchTable::new();
        let b = t.get(t.allocate(1).unwrap()).unwrap();
        b.append([(1, Instant::now() - Duration::from_millis(1))].into_iter())
            .unwrap();
        assert_eq!(b.report(0).unwrap().status, TransferStatus::Timeout);
        assert_eq!(b.overall().status, TransferStatus::Timeout);
        b.finish(0, Ok(()));
        assert_eq!(b.report(0).unwrap().status, TransferStatus::Completed);
    }
}
