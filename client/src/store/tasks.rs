//! Replica tasks on the client side (`docs/master.md`, "Replica tasks"): any store creates and
//! queries them; a store that contributes a segment, and a storage node (`crate::node`,
//! unless `--replica_tasks=false`), also carries out the ones the master assigns to it (its
//! *executor*, a thread fetching on the ping cadence, or every 50 ms on an owner with a disk
//! tier, whose offloads must keep pace with puts).
//!
//! Executing a task: the master's `FetchTasks` answer names, per task, the object's replicas
//! (`sources`) and one freshly allocated range per target. The executor reads the object from
//! the first source that answers into a buffer of its size, writes it whole into every target
//! through [`Peers::write_many`] (which records each target in its owner's catalog under the
//! scoped key with the object's pins, as a put does, so a master rebuilding its index keeps
//! the copy), then reports the outcome with `CompleteTask`; a failure carries the reason,
//! which `query_task` shows.
//!
//! Invariants: every fetched task is reported exactly once (a report that cannot reach the
//! master is left to the master's processing timeout); the executor holds at most one object
//! in memory at a time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use protocol::message::{CompleteTask, CreateCopyTask, CreateMoveTask, FetchTasks, QueryTask};
use protocol::{ErrorCode, TaskInfo, TaskWork, Uuid};

use super::peers::{Peers, WriteItem};
use super::{Store, StoreError};
use crate::limits::PING_INTERVAL;
use crate::master::MasterClient;
use dataplane::mem::{Dst, Src};

impl Store {
    /// `CreateCopyTask`: copies `key` onto each segment of `targets`; the task's id.
    pub fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<Uuid, StoreError> {
        self.ask_open(
            format_args!("create_copy_task {key} to {targets:?}"),
            || {
                self.master.call(&CreateCopyTask {
                    key: key.to_string(),
                    targets: targets.to_vec(),
                })
            },
        )
    }

    /// `CreateMoveTask`: moves `key`'s replica on segment `source` to segment `target`.
    pub fn create_move_task(
        &self,
        key: &str,
        source: &str,
        target: &str,
    ) -> Result<Uuid, StoreError> {
        let what = format_args!("create_move_task {key} from {source} to {target}");
        self.ask_open(what, || {
            self.master.call(&CreateMoveTask {
                key: key.to_string(),
                source: source.to_string(),
                target: target.to_string(),
            })
        })
    }

    /// `QueryTask`: the state of a task (`TASK_NOT_FOUND` for one this master does not know).
    pub fn query_task(&self, id: Uuid) -> Result<TaskInfo, StoreError> {
        self.ask_open(format_args!("query_task {id}"), || {
            self.master.call(&QueryTask { task_id: id })
        })
    }
}

/// Starts the executor thread: every ping interval, fetch this client's tasks and run them.
pub(crate) fn start_executor(
    master: Arc<MasterClient>,
    peers: Arc<Peers>,
    client_id: Uuid,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    let interval = if peers.has_disk() {
        crate::disk::limits::DISK_OFFLOAD_FETCH_INTERVAL
    } else {
        PING_INTERVAL
    };
    std::thread::Builder::new()
        .name("mc-store-tasks".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match run_fetched(&master, &peers, client_id) {
                    Ok(0) => {}
                    Ok(n) => {
                        // A fetch hands out a bounded number: ask again at once until the
                        // queue is empty, rather than one batch per interval.
                        tracing::debug!("ran {n} replica task(s)");
                        continue;
                    }
                    Err(e) => tracing::debug!("fetching replica tasks failed: {e}"),
                }
                std::thread::park_timeout(interval);
            }
        })
        .expect("spawn task executor thread")
}

/// One fetch: runs and reports every task the master handed out; returns how many.
pub(crate) fn run_fetched(
    master: &MasterClient,
    peers: &Peers,
    client_id: Uuid,
) -> Result<usize, String> {
    let work = master
        .call(&FetchTasks { client_id })
        .map_err(|e| e.to_string())?
        .map_err(|code| format!("fetch refused: {code}"))?;
    for w in &work {
        let (ok, message) = match copy(peers, w) {
            Ok(()) => (true, String::new()),
            Err(e) => (false, format!("copy by {client_id:?} failed: {e}")),
        };
        if !ok {
            tracing::warn!("replica task on {:?}: {message}", w.key);
        }
        let report = master.call_settling(&CompleteTask {
            client_id,
            task_id: w.task_id,
            ok,
            message,
        });
        let taken = matches!(report, Ok(Ok(())));
        match report {
            Ok(Ok(())) => {}
            // The task ended without us (a remove or an upsert took its object, or it timed
            // out): expected for an offload whose object changed first.
            Ok(Err(ErrorCode::ObjectNoReplicationTask)) => {
                tracing::debug!("replica task on {:?} ended before its report", w.key)
            }
            Ok(Err(code)) => tracing::warn!("replica task report refused: {code}"),
            Err(e) => tracing::warn!("replica task report failed: {e}"),
        }
        if !ok || !taken {
            drop_own_disk_targets(peers, w);
        }
    }
    Ok(work.len())
}

/// Deletes the files a failed or refused task left on our own disk: the master does not
/// count them as replicas (the task failed, or a remove took the object meanwhile), and no
/// later write can have reused their ranges yet, since this executor writes our disk alone
/// and one task at a time.
fn drop_own_disk_targets(peers: &Peers, w: &TaskWork) {
    for t in &w.targets {
        if let Some(d) = peers.own_disk(t) {
            d.tier.forget(t.buffer_address, t.size, u64::MAX);
        }
    }
}

/// Reads the object from a source and writes it into every target.
fn copy(peers: &Peers, w: &TaskWork) -> Result<(), String> {
    let size = w.targets.first().map_or(0, |t| t.size);
    if size == 0 || w.targets.iter().any(|t| t.size != size) {
        return Err(format!("{}: bad targets", ErrorCode::InvalidParams));
    }
    if let Some(r) = offload_in_place(peers, w, size) {
        return r;
    }
    let mut buf = vec![0u8; size as usize];
    let mut read: Result<(), StoreError> = Err(ErrorCode::InvalidReplica.into());
    for s in w.sources.iter().filter(|s| s.size == size) {
        read = peers.read(s, 0, Dst::from(&mut buf[..]));
        if read.is_ok() {
            break;
        }
    }
    read.map_err(|e| format!("reading a source replica: {e}"))?;
    write_targets(peers, w, Src::from(&buf[..]))
}

/// An offload onto our own disk from a memory replica mapped in this process (our own
/// segment, or a node's own shards through their shared mapping): the file is written
/// straight from the mapping, without reading the object into a buffer first. `None` when
/// the task is not such an offload. The master keeps an offload's source bytes still until
/// its executor reports (`docs/tiering.md`, "Internal tasks"), and the file's checksum is
/// computed from the bytes as they are written.
fn offload_in_place(peers: &Peers, w: &TaskWork, size: u64) -> Option<Result<(), String>> {
    if !w.targets.iter().all(|t| peers.own_disk(t).is_some()) {
        return None;
    }
    for s in w.sources.iter().filter(|s| s.size == size) {
        if s.medium != protocol::ReplicaMedium::Memory {
            continue;
        }
        let own = peers
            .own
            .filter(|o| peers.is_local(s) && o.contains(s.buffer_address, size))
            .map(|_| s.buffer_address as *mut u8);
        let mapping = peers.shared_segment(&s.transport_endpoint);
        let shared = mapping
            .as_ref()
            .and_then(|m| m.translate(s.buffer_address, size));
        if let Some(p) = own.or(shared) {
            // SAFETY: the range lies inside our own segment (checked by `contains`) or inside
            // a shared mapping (checked by `translate`) that `mapping` keeps mapped until the
            // write returns; no reference is formed over it.
            let src = unsafe { Src::from_raw(p, size as usize) };
            return Some(write_targets(peers, w, src));
        }
    }
    None
}

/// Writes `src` (the whole object) into every target of `w`.
fn write_targets(peers: &Peers, w: &TaskWork, src: Src<'_>) -> Result<(), String> {
    let parts = [src];
    let items: Vec<WriteItem<'_>> = w
        .targets
        .iter()
        .map(|replica| WriteItem {
            replica,
            parts: &parts,
            key: &w.key,
            hard_pin: w.with_hard_pin,
            soft_pin_ttl_ms: w.soft_pin_ttl_ms,
            provisional: false,
        })
        .collect();
    for (r, t) in peers.write_many(&items).into_iter().zip(&w.targets) {
        r.map_err(|e| format!("writing to {}: {e}", t.segment_name))?;
    }
    Ok(())
}
