//! The store client: `MooncakeDistributedStore` in Rust.
//!
//! A [`Store`] is a master client, an optional segment of this process's memory that it
//! contributes to the pool (mounted at the master and served by a data-plane server), a pool
//! of data-plane clients to other segments, and a table of caller buffers registered for the
//! zero-copy calls. Every method is blocking and takes `&self`: many threads may use one store.
//!
//! A put asks the master where its replicas go (`PutStart`), writes the bytes to each replica
//! itself, then commits (`PutEnd`) or, if any write failed, revokes (`PutRevoke`). A get asks
//! for the replica list (granting a read lease), prefers a replica in its own segment (memcpy),
//! and falls back to the next replica when a transfer fails. `OBJECT_ALREADY_EXISTS` from the
//! master means another writer got there first: upstream reports that as success, and so do we.
//!
//! Transfers are batched (`peers`): all replicas of a put, and all keys of a batch call, go out
//! as one submission per endpoint, large objects cut into slices that spread over the data-plane
//! client's lanes; batches for different endpoints run in parallel. Each replica moves by the
//! first of the paths in `paths/` that reaches it (own segment, same-host mapping, RDMA, TCP:
//! one file each behind one trait, the recovery steps they share in `paths/call.rs`).
//!
//! Environment (read at set-up, upstream's names):
//! - `MC_STORE_MEMCPY` (default on): a replica in this process's own segment is read and
//!   written with memcpy. `0`/`false` sends those transfers through our own data-plane server
//!   over loopback instead (and turns `MC_STORE_SHM` off).
//! - `MC_STORE_SHM` (default on; ours): a replica in *another* process on this host that
//!   shares its segment is read and written with memcpy through a mapping of that segment
//!   (`dataplane::mem::shm`); `0`/`false` sends those over loopback TCP. Storage nodes always
//!   share their segments; a client shares its own only when shared memory gets hugepages
//!   (hugetlb, or `shmem_enabled` not `never`; `mooncake_tune` checks it), since it reads
//!   its own segment itself and 4 KiB pages would slow that down.
//! - `MC_STORE_RESERVED_PUT` (default on; ours): a small put of a size the client keeps
//!   putting, into a segment it copies into, commits in one master round trip (`reserve`).
//! - `MC_STORE_USE_HUGEPAGE`: back the own segment with 2 MiB hugetlb pages when the pool has
//!   enough, else transparent hugepages (`dataplane::mem::SegmentOptions`).
//! - `MC_TRANSFER_TIMEOUT` (seconds, default 30): bound on a data-plane transfer making no
//!   progress (each blocking send/receive of a lane); a stalled transfer fails with
//!   `TRANSFER_FAIL` and the put is revoked or the get tries the next replica.
//! - `MC_STORE_REQUIRE_REGISTERED` (default off; ours): the zero-copy calls accept only caller
//!   memory inside a buffer registered with `register_buffer` (or handed out by
//!   `alloc_from_mem_pool`), never any other mapped address (see [`Store::caller_range`]).
//! - `MC_STORE_CLUSTER_ID` (default `mooncake_cluster`): the HA cluster whose leader an
//!   `etcd://h1:p1;h2:p2` `master_server_addr` follows (etcd key
//!   `mooncake-store/<id>/master_view`, `docs/ha.md`); kept as `Store::cluster_id`.
//! - `protocol="rdma"`: replicas on segments whose owners serve RDMA are read and written
//!   with one-sided RDMA (`rdma`, `crate::rdma`, `docs/rdma.md`); no usable device runs TCP
//!   with a warning (`MC_REQUIRE_RDMA=1`: fails the setup). `RUST_LOG` / `MC_YLT_LOG_LEVEL` / `MC_LOG_LEVEL` set the log filter of
//!   the Python module and the programs (`protocol::log`). `MC_RPC_TIMEOUT_MS` / `MC_RPC_CONNECT_TIMEOUT_MS` bound
//!   master calls (`master`).
//!
//! Put and get *sessions* (`session`) reserve objects or cache replica lists across several
//! ranged calls (upstream's `batch_{put,get}_session_*`).
//!
//! [`api::StoreApi`] is what a Python store asks of its backend, this store or a dummy client
//! (`crate::dummy`), with the batch splitting both share (`api`).
//!
//! Invariants: caller addresses used by the zero-copy calls are checked before any byte moves:
//! inside one registered buffer, or outside every registered buffer and mapped with the needed
//! permissions (`mapped`), and handed on as a [`CallerRange`] that only `unsafe` code turns
//! into a raw range ([`Src`], [`Dst`]; `caller`), which is what every data call takes and what
//! reaches the memcpy and the sockets: no slice of caller memory is ever formed. A failed put
//! never leaves a half-written object readable.

pub mod api;
mod budget;
mod caller;
mod catalog;
mod error;
pub mod extra;
pub mod http;
mod keylock;
pub mod mapped;
mod paths;
mod peers;
pub mod ranges;
pub mod rdma;
mod reserve;
mod same_host;
mod session;
mod setup;
mod tasks;
mod tenant;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use dataplane::mem::Registry;
use parking_lot::{Mutex, RwLock};
use protocol::message::*;
use protocol::{ErrorCode, ReplicaDescriptor, ReplicaList, ReplicateConfig, UpsertStarted, Uuid};

pub use budget::{LocalBudget, Reservation};
pub use caller::CallerRange;
/// The raw byte ranges the store's data calls take (`dataplane::sys::bytes`).
pub use dataplane::mem::{Dst, Src};
pub use error::StoreError;
pub(crate) use peers::Peers;
pub use peers::{PathCounts, TransferSettings};
pub use setup::{cluster_id_from_env, StoreConfig};
pub(crate) use tasks::start_executor;

use peers::{ReadItem, WriteItem};

/// One object read of [`Store::read_many_from`]: `dst.len()` bytes at `offset` of the object
/// whose replicas are `list`.
pub struct ObjectRead<'a> {
    pub list: &'a Lookup,
    pub offset: u64,
    pub dst: Dst<'a>,
}

/// How an object of `size` bytes scatters over the caller's buffers `ptrs[j]` of `lens[j]`
/// bytes, in order (`batch_get_into_multi_buffers`): `(offset in the object, buffer, bytes)`
/// per buffer used; buffers past the object's end are left alone. Lists of different lengths,
/// or buffers too small in total, are `INVALID_PARAMS` with the reason.
pub fn scatter(size: u64, ptrs: &[u64], lens: &[u64]) -> Result<Vec<(u64, u64, u64)>, StoreError> {
    if ptrs.len() != lens.len() {
        return Err(StoreError::invalid(
            "buffer and size lists differ in length",
        ));
    }
    let room = lens.iter().fold(0u64, |a, &l| a.saturating_add(l));
    if room < size {
        return Err(StoreError::invalid(format!(
            "the object's {size} bytes do not fit in {room}"
        )));
    }
    let mut pieces = Vec::new();
    let mut at = 0u64;
    for (&p, &l) in ptrs.iter().zip(lens) {
        if at >= size {
            break;
        }
        let take = l.min(size - at);
        pieces.push((at, p, take));
        at += take;
    }
    Ok(pieces)
}

/// A replica list with the time by which a read of it must have ended.
///
/// The master answers each lookup with the reader's *window* (`lease_ttl_ms`, counted from
/// its own handling of the request): after it, the object's buffers may go to another put
/// (a forced remove or an upsert parks them only that long). The window here counts from
/// before the request was sent, so it ends no later than the master's; a read that ends after
/// it may hold another key's bytes and fails with `LEASE_EXPIRED` instead.
#[derive(Clone, Debug)]
pub struct Lookup {
    pub list: ReplicaList,
    /// `None`: the master grants no lease (`--default_kv_lease_ttl=0`), nothing to check.
    read_by: Option<Instant>,
}

impl Lookup {
    fn new(list: ReplicaList, asked_at: Instant) -> Lookup {
        let read_by = (list.lease_ttl_ms > 0)
            .then(|| asked_at + std::time::Duration::from_millis(list.lease_ttl_ms));
        Lookup { list, read_by }
    }

    /// Whether a read ending now is still inside the window.
    pub fn readable(&self) -> bool {
        self.read_by.is_none_or(|t| Instant::now() <= t)
    }

    /// The object's size (every replica holds all of it); `INVALID_REPLICA` for a list
    /// without replicas.
    pub fn object_size(&self) -> Result<u64, ErrorCode> {
        self.list
            .replicas
            .first()
            .map(|r| r.size)
            .ok_or(ErrorCode::InvalidReplica)
    }

    /// `LEASE_EXPIRED` once the window has passed (see the type).
    fn check(&self) -> Result<(), ErrorCode> {
        if self.readable() {
            Ok(())
        } else {
            Err(ErrorCode::LeaseExpired)
        }
    }
}

impl std::ops::Deref for Lookup {
    type Target = ReplicaList;
    fn deref(&self) -> &ReplicaList {
        &self.list
    }
}

/// A ready store client. Dropping it is [`Store::close`].
pub struct Store {
    name: String,
    client_id: Uuid,
    /// The master, in this store's tenant (`tenant.rs`).
    master: tenant::TenantMaster,
    /// Shared with the replica-task executor (`tasks.rs`).
    peers: std::sync::Arc<Peers>,
    budget: LocalBudget,
    buffers: RwLock<Registry>,
    own: Option<setup::OwnSegmentState>,
    /// The disk tier under the own segment (`setup(..., enable_ssd_offload=True)`).
    disk: Option<std::sync::Arc<crate::tier::OwnerDisk>>,
    /// The client's address (extra segments are served on it).
    ip: std::net::IpAddr,
    /// Segments mounted after setup (`extra.rs`).
    extra: Mutex<Vec<extra::ExtraSegment>>,
    /// Every segment mounted now, for the pinger's re-mount.
    mounted: extra::Mounted,
    pinger: Mutex<Option<setup::Pinger>>,
    closed: AtomicBool,
    /// `MC_STORE_CLUSTER_ID` (see [`setup::cluster_id_from_env`]).
    cluster_id: String,
    /// Keys being written by some thread of this store (see `keylock.rs`).
    writing: keylock::KeyLocks,
    /// Open put and get sessions (`session.rs`).
    sessions: session::Sessions,
    /// Ranges reserved for puts committed in one round trip (`reserve.rs`).
    reservations: reserve::Reservations,
    /// `MC_STORE_REQUIRE_REGISTERED`: caller memory must lie in a registered buffer (see
    /// [`Store::caller_range`]).
    require_registered: bool,
}

/// A master call's outcome as a store error: the master's answer as it came (the caller adds
/// what it asked for), or a failed call with its reason (connection lost, timeout; `Store::ask`
/// adds the master's address). `?` turns it into a bare [`ErrorCode`] on paths not yet
/// converted.
fn rpc<T>(r: Result<Result<T, ErrorCode>, crate::ClientError>) -> Result<T, StoreError> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(code)) => Err(StoreError::from(code)),
        Err(e) => Err(StoreError::new(e.code(), e.to_string())),
    }
}

/// The cause of a failed start of a put of `ask` (see [`put_ask`]): the master's refusal, or
/// the failed call itself.
fn not_placed(e: StoreError, op: &str, key: &str, ask: &str) -> StoreError {
    if e.cause.is_empty() {
        e.context(format_args!("{op} {key}: the master placed no {ask}"))
    } else {
        e.context(format_args!("{op} {key}: asking the master to place {ask}"))
    }
}

/// What a put asked the master for, for the cause of a failed start: the size, the replica
/// count and the preferred segments, the three things that decide whether it finds room.
fn put_ask(size: u64, cfg: &ReplicateConfig) -> String {
    let mut ask = format!("{} x {} replica(s)", error::bytes(size), cfg.replica_num);
    let mut preferred: Vec<&str> = cfg.preferred_segments.iter().map(String::as_str).collect();
    if !cfg.preferred_segment.is_empty() {
        preferred.push(&cfg.preferred_segment);
    }
    if !preferred.is_empty() {
        ask.push_str(&format!(" preferring segment(s) {}", preferred.join(", ")));
    }
    ask
}

impl Store {
    /// The `host:port` this client is known by (its segment's name).
    pub fn hostname(&self) -> &str {
        &self.name
    }

    pub fn client_id(&self) -> Uuid {
        self.client_id
    }

    /// The cluster id this client was set up with (`MC_STORE_CLUSTER_ID`).
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// 0 healthy, 1 closed, 2 master unreachable (upstream's `HealthCheckStatus`).
    pub fn health(&self) -> i32 {
        if self.closed.load(Ordering::SeqCst) {
            return 1;
        }
        match self.master.call(&ServiceReady {}) {
            Ok(Ok(_)) => 0,
            _ => 2,
        }
    }

    /// Unmounts this client's segment (objects held only there are gone) and stops serving it.
    /// Idempotent.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if let Some(p) = self.pinger.lock().take() {
            p.stop();
        }
        self.unmount_all_extra();
        if let Some(d) = &self.disk {
            // The files stay: a store set up again on the directory reports them.
            let _ = self.master.call(&UnmountSegment {
                client_id: self.client_id,
                segment_id: d.desc.id,
            });
        }
        if let Some(own) = &self.own {
            let _ = self.master.call(&UnmountSegment {
                client_id: self.client_id,
                segment_id: own.segment_id,
            });
            own.stop_serving();
        }
        if let Some(r) = self.peers.rdma() {
            r.side().withdraw();
        }
    }

    /// [`rpc`], with the master's address in the cause when the call itself failed (only
    /// then has `rpc` given a cause).
    fn ask<T>(&self, r: Result<Result<T, ErrorCode>, crate::ClientError>) -> Result<T, StoreError> {
        rpc(r).map_err(|e| {
            if e.cause.is_empty() {
                e
            } else {
                e.context(format_args!("master {}", self.master.addr()))
            }
        })
    }

    /// One call to the master from an open store: its answer, or why not with `what` in
    /// front (a closed store, the master's refusal, or the failed call naming the master).
    fn ask_open<T>(
        &self,
        what: impl std::fmt::Display,
        call: impl FnOnce() -> Result<Result<T, ErrorCode>, crate::ClientError>,
    ) -> Result<T, StoreError> {
        self.check_open()
            .and_then(|()| self.ask(call()))
            .map_err(|e| e.context(what))
    }

    fn check_open(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::invalid("the store is closed"));
        }
        Ok(())
    }

    // ---- puts ---------------------------------------------------------------------------

    /// Puts the concatenation of `parts` under `key` (first writer wins; an existing key is
    /// success and stays unchanged). With `upsert`, overwrites instead.
    pub fn put_parts(
        &self,
        key: &str,
        parts: &[Src<'_>],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<(), StoreError> {
        let op = if upsert { "upsert" } else { "put" };
        self.check_open()
            .map_err(|e| e.context(format_args!("{op} {key}")))?;
        if cfg.prefer_alloc_in_same_node {
            return Err(StoreError::invalid(format!(
                "{op} {key}: prefer_alloc_in_same_node is for batch puts only"
            )));
        }
        let size: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let _writing = self.writing.lock([key]);
        if !upsert {
            if let Some(done) = self.put_reserved(key, parts, size, cfg) {
                return done;
            }
        }
        self.put_started(key, parts, size, cfg, upsert)
    }

    /// [`Self::put_parts`] the usual way, the key locked: the master places the replicas, the
    /// bytes go, the put is committed (or revoked).
    fn put_started(
        &self,
        key: &str,
        parts: &[Src<'_>],
        size: u64,
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<(), StoreError> {
        let op = if upsert { "upsert" } else { "put" };
        let started_cause = |e: StoreError| not_placed(e, op, key, &put_ask(size, cfg));
        let key = key.to_string();
        let id = self.client_id;
        let (replicas, soft_pin_ttl_ms) = if upsert {
            let started = self
                .ask(self.master.call(&UpsertStart {
                    client_id: id,
                    key: key.clone(),
                    size,
                    config: cfg.clone(),
                }))
                .map_err(started_cause)?;
            (started.replicas, started.soft_pin_ttl_ms)
        } else {
            let started = self.master.call(&PutStart {
                client_id: id,
                key: key.clone(),
                size,
                config: cfg.clone(),
            });
            match self.ask(started) {
                Err(e) if e.code == ErrorCode::ObjectAlreadyExists => return Ok(()),
                other => (other.map_err(started_cause)?, catalog::soft_pin_of(cfg)),
            }
        };
        if !upsert {
            self.reservations
                .room_seen(|| replicas.iter().any(|r| self.on_this_host(r)));
        }
        let catalog_key = self.master.catalog_key(&key);
        let items: Vec<WriteItem<'_>> = replicas
            .iter()
            .map(|replica| WriteItem {
                replica,
                parts,
                key: &catalog_key,
                hard_pin: cfg.with_hard_pin,
                soft_pin_ttl_ms,
                provisional: false,
            })
            .collect();
        let written = self
            .peers
            .write_many(&items)
            .into_iter()
            .find(Result::is_err)
            .unwrap_or(Ok(()))
            .map_err(|e| e.context(format_args!("{op} {key}")));
        self.finish_put(key, upsert, written)
    }

    fn finish_put(
        &self,
        key: String,
        upsert: bool,
        written: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let id = self.client_id;
        let ended = |e: StoreError, key: &str| e.context(format_args!("commit of {key}"));
        match written {
            Ok(()) if upsert => self
                .ask(self.master.call_settling(&UpsertEnd {
                    client_id: id,
                    key: key.clone(),
                }))
                .map_err(|e| ended(e, &key)),
            Ok(()) => self
                .ask(self.master.call_settling(&PutEnd {
                    client_id: id,
                    key: key.clone(),
                }))
                .map_err(|e| ended(e, &key)),
            Err(e) => {
                let _ = if upsert {
                    self.master
                        .call_settling(&UpsertRevoke { client_id: id, key })
                        .map(|_| ())
                } else {
                    self.master
                        .call_settling(&PutRevoke { client_id: id, key })
                        .map(|_| ())
                };
                Err(e)
            }
        }
    }

    /// `put` / `upsert` of one byte string, bounded by the local buffer.
    pub fn put(
        &self,
        key: &str,
        value: &[u8],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<(), StoreError> {
        self.put_copied(key, &[Src::from(value)], cfg, upsert)
    }

    /// [`Self::put_parts`] of bytes upstream would stage through its local buffer (a Python
    /// object, not registered memory): their size is reserved from the local buffer for the
    /// put, and a put that does not fit fails with `INVALID_PARAMS` (`budget` module docs).
    pub fn put_copied(
        &self,
        key: &str,
        parts: &[Src<'_>],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Result<(), StoreError> {
        let size = parts.iter().map(|p| p.len() as u64).sum();
        let op = if upsert { "upsert" } else { "put" };
        let _r = self.budget.reserve_for(format_args!("{op} {key}"), size)?;
        self.put_parts(key, parts, cfg, upsert)
    }

    /// [`Self::put_many`] bounded by the local buffer as [`Self::put_copied`]: the whole
    /// batch's bytes are reserved for the call, or every key fails with the reason.
    pub fn put_many_copied(
        &self,
        keys: &[String],
        values: &[Vec<Src<'_>>],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<Result<(), StoreError>> {
        let total = values.iter().flatten().map(|p| p.len() as u64).sum();
        let what = format_args!("batch put of {} keys", keys.len());
        match self.budget.reserve_for(what, total) {
            Ok(_r) => self.put_many(keys, values, cfg, upsert),
            Err(e) => vec![Err(e); keys.len().max(values.len())],
        }
    }

    /// Batch put of many objects, each the concatenation of its parts: one master round trip
    /// to start, transfers, one to commit and one to revoke failures.
    pub fn put_many(
        &self,
        keys: &[String],
        values: &[Vec<Src<'_>>],
        cfg: &ReplicateConfig,
        upsert: bool,
    ) -> Vec<Result<(), StoreError>> {
        let op = if upsert { "batch upsert" } else { "batch put" };
        let n = keys.len().max(values.len());
        if keys.len() != values.len() {
            let cause = format!("{op}: {} keys but {} values", keys.len(), values.len());
            return vec![Err(StoreError::invalid(cause)); n];
        }
        if let Err(e) = self.check_open() {
            return vec![Err(e.context(op)); n];
        }
        if keys.is_empty() {
            return Vec::new();
        }
        let _writing = self.writing.lock(keys.iter().map(String::as_str));
        let id = self.client_id;
        let sizes: Vec<u64> = values
            .iter()
            .map(|v| v.iter().map(|p| p.len() as u64).sum())
            .collect();
        // Per key: the replicas and the soft pin their catalog records carry, an upsert's as
        // the master answered (it alone knows the pin a `PRESERVE` keeps), a put's from its
        // config (`catalog` module docs).
        let started = if upsert {
            self.ask(self.master.call(&BatchUpsertStart {
                client_id: id,
                keys: keys.to_vec(),
                sizes,
                config: cfg.clone(),
            }))
        } else {
            let soft_pin_ttl_ms = catalog::soft_pin_of(cfg);
            let as_started = |replicas| UpsertStarted {
                replicas,
                soft_pin_ttl_ms,
            };
            self.ask(self.master.call(&BatchPutStart {
                client_id: id,
                keys: keys.to_vec(),
                sizes,
                config: cfg.clone(),
            }))
            .map(|per| per.into_iter().map(|s| s.map(as_started)).collect())
        };
        let started = match started {
            Ok(s) if s.len() == keys.len() => s,
            Ok(s) => {
                let cause = format!(
                    "{op}: the master answered {} results for {} keys",
                    s.len(),
                    keys.len()
                );
                return vec![Err(StoreError::new(ErrorCode::RpcFail, cause)); keys.len()];
            }
            Err(e) => {
                return vec![
                    Err(e.context(format_args!("{op} of {} keys", keys.len())));
                    keys.len()
                ]
            }
        };
        // Every replica of every started key goes out in one batched transfer.
        let mut results: Vec<Result<(), StoreError>> = Vec::with_capacity(keys.len());
        let mut items: Vec<WriteItem<'_>> = Vec::new();
        let mut owners: Vec<usize> = Vec::new();
        let mut writing: Vec<usize> = Vec::new();
        let catalog_keys: Vec<_> = keys.iter().map(|k| self.master.catalog_key(k)).collect();
        for (i, s) in started.iter().enumerate() {
            match s {
                Err(ErrorCode::ObjectAlreadyExists) if !upsert => results.push(Ok(())),
                Err(e) => results.push(Err(not_placed(
                    StoreError::from(*e),
                    op,
                    &keys[i],
                    &put_ask(values[i].iter().map(|p| p.len() as u64).sum(), cfg),
                ))),
                Ok(UpsertStarted {
                    replicas,
                    soft_pin_ttl_ms,
                }) => {
                    results.push(Ok(()));
                    writing.push(i);
                    for replica in replicas {
                        items.push(WriteItem {
                            replica,
                            parts: &values[i],
                            key: catalog_keys[i].as_ref(),
                            hard_pin: cfg.with_hard_pin,
                            soft_pin_ttl_ms: *soft_pin_ttl_ms,
                            provisional: false,
                        });
                        owners.push(i);
                    }
                }
            }
        }
        for (&i, r) in owners.iter().zip(self.peers.write_many(&items)) {
            if results[i].is_ok() {
                results[i] = r.map_err(|e| e.context(format_args!("{op}: {}", keys[i])));
            }
        }
        let (commit, revoke): (Vec<usize>, Vec<usize>) =
            writing.into_iter().partition(|&i| results[i].is_ok());
        let pick = |idx: &[usize]| idx.iter().map(|&i| keys[i].clone()).collect::<Vec<_>>();
        if !commit.is_empty() {
            let ended = if upsert {
                self.master.call_settling(&BatchUpsertEnd {
                    client_id: id,
                    keys: pick(&commit),
                })
            } else {
                self.master.call_settling(&BatchPutEnd {
                    client_id: id,
                    keys: pick(&commit),
                })
            };
            let commit_cause = |i: usize| format!("{op}: commit of {}", keys[i]);
            match self.ask(ended) {
                Ok(per) => {
                    for (&i, r) in commit.iter().zip(per) {
                        results[i] = r.map_err(|e| StoreError::new(e, commit_cause(i)));
                    }
                }
                Err(e) => commit
                    .iter()
                    .for_each(|&i| results[i] = Err(e.clone().context(commit_cause(i)))),
            }
        }
        if !revoke.is_empty() {
            let _ = if upsert {
                self.master
                    .call_settling(&BatchUpsertRevoke {
                        client_id: id,
                        keys: pick(&revoke),
                    })
                    .map(|_| ())
            } else {
                self.master
                    .call_settling(&BatchPutRevoke {
                        client_id: id,
                        keys: pick(&revoke),
                    })
                    .map(|_| ())
            };
        }
        results
    }

    /// One batch call to the master with a result per key: every key `INVALID_PARAMS` when the
    /// store is closed, `[]` for no keys, and every key the call's error (`RPC_FAIL` for an
    /// answer of the wrong length) when the call itself fails.
    fn per_key<R, T>(
        &self,
        op: &str,
        n: usize,
        req: impl FnOnce() -> R,
    ) -> Vec<Result<T, StoreError>>
    where
        R: protocol::message::Rpc<Reply = Vec<Result<T, ErrorCode>>>,
        T: Clone,
    {
        if let Err(e) = self.check_open() {
            return vec![Err(e.context(op)); n];
        }
        if n == 0 {
            return Vec::new();
        }
        match self.ask(self.master.call(&req())) {
            Ok(v) if v.len() == n => v.into_iter().map(|r| r.map_err(StoreError::from)).collect(),
            Ok(v) => {
                let cause = format!("{op}: the master answered {} of {n} keys", v.len());
                vec![Err(StoreError::new(ErrorCode::RpcFail, cause)); n]
            }
            Err(e) => vec![Err(e.context(format_args!("{op} of {n} keys"))); n],
        }
    }

    // ---- gets ---------------------------------------------------------------------------

    /// The replica list of `key` (grants a read lease) and the window to read it in.
    pub fn replicas(&self, key: &str) -> Result<Lookup, StoreError> {
        // Taken before the call: the lease window counts from no later than the master's answer.
        let asked_at = Instant::now();
        let list = self.ask_open(format_args!("lookup of {key}"), || {
            self.master.call(&GetReplicaList {
                key: key.to_string(),
            })
        })?;
        Ok(Lookup::new(list, asked_at))
    }

    pub fn batch_replicas(&self, keys: &[String]) -> Vec<Result<Lookup, StoreError>> {
        let asked_at = Instant::now();
        self.per_key("batch lookup", keys.len(), || BatchGetReplicaList {
            keys: keys.to_vec(),
        })
        .into_iter()
        .map(|r| r.map(|list| Lookup::new(list, asked_at)))
        .collect()
    }

    /// Reads `dst.len()` bytes at `offset` of the object described by `list`, trying the local
    /// replica first and then the others; fails with `LEASE_EXPIRED` if the read did not end
    /// inside the list's window ([`Lookup`]).
    pub fn read_from(
        &self,
        list: &Lookup,
        offset: u64,
        mut dst: Dst<'_>,
    ) -> Result<(), StoreError> {
        let late = |e: ErrorCode| {
            StoreError::new(e, "the read did not end inside the lookup's lease window")
        };
        list.check().map_err(late)?;
        let mut order: Vec<&ReplicaDescriptor> = list.replicas.iter().collect();
        order.sort_by_key(|r| !self.own_endpoint_is(&r.transport_endpoint));
        let mut last = StoreError::new(ErrorCode::InvalidReplica, "the object has no replica");
        for r in order {
            match self.peers.read(r, offset, dst.reborrow()) {
                Ok(()) => return list.check().map_err(late),
                Err(e) if e.code == ErrorCode::InvalidParams => return Err(e),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Many [`Self::read_from`]s as one batched transfer: each read goes to its preferred
    /// replica (our own first); a read that fails there falls back to the others on its own.
    pub fn read_many_from(&self, reads: Vec<ObjectRead<'_>>) -> Vec<Result<(), StoreError>> {
        let mut results: Vec<Result<(), StoreError>> = Vec::with_capacity(reads.len());
        let mut items: Vec<ReadItem<'_>> = Vec::with_capacity(reads.len());
        let mut lists: Vec<(usize, &Lookup)> = Vec::with_capacity(reads.len());
        for (i, rd) in reads.into_iter().enumerate() {
            if !rd.list.readable() {
                results.push(Err(StoreError::new(
                    ErrorCode::LeaseExpired,
                    "the lookup's lease window passed before the read started",
                )));
                continue;
            }
            let best = rd
                .list
                .replicas
                .iter()
                .find(|r| self.own_endpoint_is(&r.transport_endpoint))
                .or(rd.list.replicas.first());
            match best {
                None => results.push(Err(StoreError::new(
                    ErrorCode::InvalidReplica,
                    "the object has no replica",
                ))),
                Some(replica) => {
                    results.push(Ok(()));
                    lists.push((i, rd.list));
                    items.push(ReadItem {
                        replica,
                        offset: rd.offset,
                        dst: rd.dst,
                    });
                }
            }
        }
        let outcomes = self.peers.read_many(&mut items);
        for (((i, list), item), r) in lists.into_iter().zip(items).zip(outcomes) {
            results[i] = match r {
                Ok(()) => list.check().map_err(|e| {
                    StoreError::new(e, "the read did not end inside the lookup's lease window")
                }),
                Err(e) if e.code == ErrorCode::InvalidParams => Err(e),
                Err(_) if list.replicas.len() > 1 => self.read_from(list, item.offset, item.dst),
                Err(e) => Err(e),
            };
        }
        results
    }

    fn own_endpoint_is(&self, ep: &str) -> bool {
        // Preferring our own replica is right even when memcpy is off (`MC_STORE_MEMCPY=0`):
        // then it is read through our own data-plane server over loopback.
        self.own.as_ref().is_some_and(|o| o.endpoint == ep)
    }

    /// The object's bytes (bounded by the local buffer).
    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.with_lookup(key, |list| {
            let size = list.object_size()?;
            let _r = self.budget.reserve_for("the copy", size)?;
            let mut out = vec![0u8; size as usize];
            self.read_from(list, 0, Dst::from(&mut out[..]))?;
            Ok(out)
        })
        .map_err(|e| e.context(format_args!("get {key}")))
    }

    /// A lookup of `key` for copying the whole object out (into a new Python object): its
    /// size is reserved from the local buffer until the answer is dropped, as upstream stages
    /// such a get (`budget` module docs).
    pub fn locate_copy(&self, key: &str) -> Result<(Lookup, Reservation<'_>), StoreError> {
        let list = self.replicas(key)?;
        let size = list
            .object_size()
            .map_err(|e| StoreError::new(e, format!("lookup of {key}: no replica")))?;
        let r = self.budget.reserve_for(format_args!("get {key}"), size)?;
        Ok((list, r))
    }

    /// [`Self::read_many_from`] of copies, bounded by the local buffer as
    /// [`Self::locate_copy`]: the reads' bytes are reserved for the call, or every read fails
    /// with the reason.
    pub fn read_many_copied(&self, reads: Vec<ObjectRead<'_>>) -> Vec<Result<(), StoreError>> {
        let total = reads.iter().map(|r| r.dst.len() as u64).sum();
        let what = format_args!("batch get of {} objects", reads.len());
        match self.budget.reserve_for(what, total) {
            Ok(_r) => self.read_many_from(reads),
            Err(e) => vec![Err(e); reads.len()],
        }
    }

    /// Runs `read` on a fresh lookup of `key`, and once more on another if the first one's
    /// window passed before the read ended (a slow transfer, a replica that timed out first).
    pub fn with_lookup<T>(
        &self,
        key: &str,
        mut read: impl FnMut(&Lookup) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let list = self.replicas(key)?;
        match read(&list) {
            Err(e) if e.code == ErrorCode::LeaseExpired => read(&self.replicas(key)?),
            r => r,
        }
    }

    pub fn get_size(&self, key: &str) -> Result<u64, StoreError> {
        Ok(self.replicas(key)?.object_size()?)
    }

    // ---- metadata -------------------------------------------------------------------------

    pub fn is_exist(&self, key: &str) -> Result<bool, StoreError> {
        self.ask_open(format_args!("is_exist {key}"), || {
            self.master.call(&ExistKey {
                key: key.to_string(),
            })
        })
    }

    pub fn batch_is_exist(&self, keys: &[String]) -> Vec<Result<bool, StoreError>> {
        self.per_key("batch_is_exist", keys.len(), || BatchExistKey {
            keys: keys.to_vec(),
        })
    }

    /// Removes `key`. The master answers with the replicas it freed; each is buried in its
    /// owner's catalog (a tombstone with the removed version) before this returns, so that a
    /// later leader rebuilding its index from the owners does not bring the key back
    /// (`docs/ha.md`, "versions and tombstones").
    pub fn remove(&self, key: &str, force: bool) -> Result<(), StoreError> {
        self.check_open()
            .map_err(|e| e.context(format_args!("remove {key}")))?;
        let freed = self
            .ask(self.master.call(&Remove {
                key: key.to_string(),
                force,
            }))
            .map_err(|e| e.context(format_args!("remove {key}")))?;
        let items: Vec<(&ReplicaDescriptor, &str)> = freed.iter().map(|r| (r, key)).collect();
        self.bury(&items).map_err(|(_, e)| {
            e.context(format_args!(
                "remove {key}: neither the owner nor the master could make the removal durable"
            ))
        })
    }

    /// Buries removed replicas (see [`Store::remove`]). What an owner could not take (its
    /// data plane did not answer) is handed to the master instead, which keeps it as a
    /// tombstone and, under HA, stores it in etcd before answering (`docs/ha.md`, "removals
    /// the owners have not heard of"). Only if that fails too is the removal not durable: the
    /// error names the keys concerned, and the caller reports them unacknowledged.
    fn bury(&self, items: &[(&ReplicaDescriptor, &str)]) -> Result<(), (Vec<String>, StoreError)> {
        if items.is_empty() {
            return Ok(());
        }
        let mut keys = Vec::new();
        let mut versions = Vec::new();
        let catalog_keys: Vec<_> = items
            .iter()
            .map(|(_, k)| self.master.catalog_key(k))
            .collect();
        let in_catalog: Vec<(&ReplicaDescriptor, &str)> = items
            .iter()
            .zip(&catalog_keys)
            .map(|((r, _), k)| (*r, k.as_ref()))
            .collect();
        for (r, (replica, key)) in self.peers.bury_many(&in_catalog).iter().zip(items) {
            if let Err(e) = r {
                tracing::info!(
                    key,
                    segment = %replica.segment_name,
                    "removed {key} but could not bury it in {}'s catalog ({e:?}); asking the \
                     master to keep it removed",
                    replica.segment_name
                );
                keys.push(key.to_string());
                versions.push(replica.version);
            }
        }
        if keys.is_empty() {
            return Ok(());
        }
        let kept = self.ask(self.master.call(&KeepRemoved {
            keys: keys.clone(),
            versions,
        }));
        kept.map_err(|e| {
            tracing::warn!(
                "removed {} key(s) ({:?}...) that neither their owner nor the master could \
                 make durable ({e:?}): reported as failed; a leader failover may bring them back",
                keys.len(),
                &keys[0]
            );
            (keys, e)
        })
    }

    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64, StoreError> {
        self.ask_open(format_args!("remove_by_regex {pattern:?}"), || {
            self.master.call(&RemoveByRegex {
                pattern: pattern.to_string(),
                force,
            })
        })
    }

    pub fn remove_all(&self, force: bool) -> Result<u64, StoreError> {
        self.ask_open("remove_all", || self.master.call(&RemoveAll { force }))
    }

    /// Removes every key, burying what each frees as [`Store::remove`] does.
    pub fn batch_remove(&self, keys: &[String], force: bool) -> Vec<Result<(), StoreError>> {
        let answers = self.per_key("batch_remove", keys.len(), || BatchRemove {
            keys: keys.to_vec(),
            force,
        });
        let items: Vec<(&ReplicaDescriptor, &str)> = answers
            .iter()
            .zip(keys)
            .filter_map(|(a, k)| Some(a.as_ref().ok()?.iter().map(move |r| (r, k.as_str()))))
            .flatten()
            .collect();
        let not_durable = match self.bury(&items) {
            Ok(()) => None,
            Err((keys, e)) => Some((
                keys.into_iter().collect::<std::collections::HashSet<_>>(),
                e,
            )),
        };
        answers
            .into_iter()
            .zip(keys)
            .map(|(a, k)| match &not_durable {
                Some((bad, e)) if a.is_ok() && bad.contains(k) => Err(e
                    .clone()
                    .context(format_args!("batch_remove {k}: the removal is not durable"))),
                _ => a.map(|_| ()),
            })
            .collect()
    }

    /// Clears the keys this client wrote (upstream's `batch_replica_clear`): the whole object
    /// when `segment_name` is empty, else only its replica on that segment. Returns the keys
    /// cleared; a key that is missing, written by another client, leased, in flight or without
    /// a replica on the segment is skipped. A whole object cleared is buried in its owners'
    /// catalogs as [`Store::remove`] buries it; a key whose burial could not be made durable
    /// is not reported cleared (a failover may bring it back), as `batch_remove` fails it.
    pub fn batch_replica_clear(
        &self,
        keys: &[String],
        segment_name: &str,
    ) -> Result<Vec<String>, ErrorCode> {
        self.check_open()?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let answers = self.ask(self.master.call(&BatchReplicaClear {
            client_id: self.client_id,
            keys: keys.to_vec(),
            segment_name: segment_name.to_string(),
        }))?;
        if answers.len() != keys.len() {
            return Err(ErrorCode::RpcFail);
        }
        let items: Vec<(&ReplicaDescriptor, &str)> = answers
            .iter()
            .zip(keys)
            .filter_map(|(a, k)| Some(a.as_ref().ok()?.iter().map(move |r| (r, k.as_str()))))
            .flatten()
            .collect();
        let not_durable: std::collections::HashSet<String> = match self.bury(&items) {
            Ok(()) => Default::default(),
            Err((keys, _)) => keys.into_iter().collect(),
        };
        Ok(answers
            .iter()
            .zip(keys)
            .filter(|(a, k)| a.is_ok() && !not_durable.contains(k.as_str()))
            .map(|(_, k)| k.clone())
            .collect())
    }

    // ---- zero copy --------------------------------------------------------------------------

    /// Registers `[addr, addr + len)` of caller memory for the zero-copy calls. Registering the
    /// same buffer again is a no-op; overlapping another buffer is `INVALID_PARAMS`.
    ///
    /// A registered range is trusted by [`Self::caller_range`] without a mapping check (that
    /// is what registering buys), so registering is where the promise is made.
    ///
    /// # Safety
    /// `[addr, addr + len)` is mapped readable and writable, and stays so until it is
    /// unregistered (or the store is dropped).
    pub unsafe fn register_buffer(&self, addr: u64, len: u64) -> Result<(), StoreError> {
        let mut b = self.buffers.write();
        if b.find(addr) == Some((addr, len)) {
            return Ok(());
        }
        b.register(addr, len).map_err(|e| {
            let cause = format!("register_buffer: {len} bytes at {addr:#x}: {e}");
            StoreError::invalid(cause)
        })?;
        if let Some(r) = self.peers.rdma() {
            // Transfers from and into this buffer then skip the staging copy. A failure only
            // costs that copy.
            // SAFETY: this function's contract keeps the buffer mapped until
            // `unregister_buffer`; its keys are not published.
            if let Err(e) = unsafe { r.side().register(addr, len) } {
                tracing::warn!("register_buffer: RDMA registration failed, staging instead: {e}");
            }
        }
        Ok(())
    }

    pub fn unregister_buffer(&self, addr: u64) -> Result<(), StoreError> {
        self.buffers
            .write()
            .unregister(addr)
            .map(|_| ())
            .map_err(|e| {
                let cause = format!("unregister_buffer {addr:#x}: {e}");
                StoreError::invalid(cause)
            })?;
        if let Some(r) = self.peers.rdma() {
            r.side().unregister(addr);
        }
        Ok(())
    }

    /// Whether `[addr, addr + len)` lies inside one registered buffer (or our own segment).
    pub fn is_registered(&self, addr: u64, len: u64) -> bool {
        if len == 0 {
            return true;
        }
        self.buffers.read().check(addr, len)
    }

    /// The registered buffer `(addr, len)` containing `addr`, if any (bounds for calls such as
    /// `get_into_ranges` that take a buffer's start address and offsets into it).
    pub fn registered_buffer(&self, addr: u64) -> Option<(u64, u64)> {
        self.buffers.read().find(addr)
    }

    /// Whether caller memory `[addr, addr + len)` may be used: it lies inside one registered
    /// buffer, or (as upstream over TCP, which copies from any address) it starts outside
    /// every registered buffer and is mapped (readable, and writable with `write`) right now.
    /// A range that starts in a registered buffer and runs past its end is refused: the
    /// registration stated the buffer's bounds. With `MC_STORE_REQUIRE_REGISTERED` set, only
    /// registered memory is accepted.
    fn caller_ok(&self, addr: u64, len: u64, write: bool) -> bool {
        if len == 0 {
            return true;
        }
        {
            let b = self.buffers.read();
            if b.check(addr, len) {
                return true;
            }
            if b.find(addr).is_some() || self.require_registered {
                return false;
            }
        }
        mapped::is_mapped(addr, len, write)
    }

    /// Caller memory `[addr, addr + len)` to read from (see `caller_ok`); `INVALID_PARAMS`
    /// for anything else, so an unmapped address is an error code instead of a segfault.
    /// Seeing the bytes is `unsafe` ([`CallerRange`]): the checks cannot see who else uses
    /// the memory.
    pub fn caller_range(&self, addr: u64, len: u64) -> Result<CallerRange, ErrorCode> {
        self.checked_range(addr, len, false)
    }

    /// [`Self::caller_range`] for memory to write into (checked writable).
    pub fn caller_range_mut(&self, addr: u64, len: u64) -> Result<CallerRange, ErrorCode> {
        self.checked_range(addr, len, true)
    }

    fn checked_range(&self, addr: u64, len: u64, write: bool) -> Result<CallerRange, ErrorCode> {
        if !self.caller_ok(addr, len, write) {
            return Err(ErrorCode::InvalidParams);
        }
        CallerRange::checked(addr, len, write).ok_or(ErrorCode::InvalidParams)
    }

    /// `get_into`: reads the whole object into caller memory at `addr` (registered, or mapped
    /// writable; `INVALID_PARAMS` otherwise, or when the object is larger than `len`); returns
    /// its size.
    ///
    /// # Safety
    /// Until this returns, `[addr, addr + len)` stays mapped and nothing else reads or writes
    /// it (another thread, Python, another call over the same bytes).
    pub unsafe fn get_into(&self, key: &str, addr: u64, len: u64) -> Result<u64, StoreError> {
        self.with_lookup(key, |list| {
            let size = list.object_size()?;
            if size > len {
                return Err(StoreError::invalid(format!(
                    "the object's {size} bytes do not fit in the {len}-byte buffer"
                )));
            }
            let dst = self.caller_range_mut(addr, size).map_err(|e| {
                StoreError::new(
                    e,
                    format!("{size} bytes at {addr:#x} are not caller memory"),
                )
            })?;
            // SAFETY: `dst` is inside `[addr, addr + len)`, which our caller keeps mapped and
            // away from Rust references until we return; the range dies with this read.
            self.read_from(list, 0, unsafe { dst.into_dst() })?;
            Ok(size)
        })
        .map_err(|e| e.context(format_args!("get_into {key}")))
    }

    /// `batch_get_into`: reads object `keys[i]` into caller memory `[addrs[i], + lens[i])`;
    /// the size read or why not, per key (see [`Self::get_into_scattered`]).
    ///
    /// # Safety
    /// Until this returns, every `[addrs[i], + lens[i])` stays mapped and nothing else reads
    /// or writes it (another thread, Python, another buffer of this call).
    pub unsafe fn get_into_many(
        &self,
        keys: &[String],
        addrs: &[u64],
        lens: &[u64],
    ) -> Vec<Result<u64, StoreError>> {
        const OP: &str = "batch_get_into";
        let n = keys.len();
        if addrs.len() != n || lens.len() != n {
            let cause = format!(
                "{OP}: {n} keys but {} buffers and {} sizes",
                addrs.len(),
                lens.len()
            );
            return vec![Err(StoreError::invalid(cause)); n];
        }
        let one = |i: usize| {
            (
                std::slice::from_ref(&addrs[i]),
                std::slice::from_ref(&lens[i]),
            )
        };
        // SAFETY: our caller's contract is the one `get_into_scattered` asks for.
        unsafe { self.get_into_scattered(OP, keys, one) }
    }

    /// `batch_get_into_multi_buffers`: scatters object `keys[i]` over the caller's buffers
    /// `ptrs[i][j]` of `lens[i][j]` bytes, in order ([`scatter`]); the size read or why not,
    /// per key.
    ///
    /// # Safety
    /// As [`Self::get_into_many`], for every buffer.
    pub unsafe fn get_into_multi_buffers(
        &self,
        keys: &[String],
        ptrs: &[Vec<u64>],
        lens: &[Vec<u64>],
    ) -> Vec<Result<u64, StoreError>> {
        const OP: &str = "batch_get_into_multi_buffers";
        let n = keys.len();
        if ptrs.len() != n || lens.len() != n {
            let cause = format!(
                "{OP}: {n} keys but {} buffer and {} size lists",
                ptrs.len(),
                lens.len()
            );
            return vec![Err(StoreError::invalid(cause)); n];
        }
        // SAFETY: our caller's contract is the one `get_into_scattered` asks for.
        unsafe { self.get_into_scattered(OP, keys, |i| (&ptrs[i][..], &lens[i][..])) }
    }

    /// Reads each object `keys[i]` into the caller buffers `buffers(i)` (addresses, lengths),
    /// in order. Every key is looked up and checked first (a miss, an object larger than its
    /// buffers, memory that is not the caller's fail that key only); then all the bytes move
    /// in one batched transfer.
    ///
    /// # Safety
    /// Until this returns, every buffer stays mapped and nothing else reads or writes it
    /// (another thread, Python, another buffer of this call).
    unsafe fn get_into_scattered<'b>(
        &self,
        op: &str,
        keys: &[String],
        buffers: impl Fn(usize) -> (&'b [u64], &'b [u64]),
    ) -> Vec<Result<u64, StoreError>> {
        let n = keys.len();
        if n == 0 {
            return Vec::new();
        }
        let lists = self.batch_replicas(keys);
        let mut out: Vec<Result<u64, StoreError>> = Vec::with_capacity(n);
        let mut reads: Vec<ObjectRead<'_>> = Vec::with_capacity(n);
        let mut owners: Vec<usize> = Vec::with_capacity(n);
        for (i, l) in lists.iter().enumerate() {
            let planned = l.as_ref().map_err(Clone::clone).and_then(|list| {
                let size = list.object_size()?;
                let (ptrs, lens) = buffers(i);
                let mut pieces = Vec::new();
                for (offset, p, take) in scatter(size, ptrs, lens)? {
                    let dst = self.caller_range_mut(p, take).map_err(|e| {
                        StoreError::new(e, format!("{take} bytes at {p:#x} are not caller memory"))
                    })?;
                    // SAFETY: our caller keeps each buffer mapped and away from Rust
                    // references until we return; `reads` dies before that.
                    let dst = unsafe { dst.into_dst() };
                    pieces.push(ObjectRead { list, offset, dst });
                }
                Ok((size, pieces))
            });
            match planned {
                Ok((size, pieces)) => {
                    out.push(Ok(size));
                    owners.extend(std::iter::repeat_n(i, pieces.len()));
                    reads.extend(pieces);
                }
                Err(e) => out.push(Err(e)),
            }
        }
        for (i, r) in owners.into_iter().zip(self.read_many_from(reads)) {
            if let Err(e) = r {
                out[i] = Err(e);
            }
        }
        out.into_iter()
            .zip(keys)
            .map(|(r, k)| r.map_err(|e| e.context(format_args!("{op} {k}"))))
            .collect()
    }

    /// The local-buffer budget, for callers that stage (tensors, `get_buffer`).
    pub fn budget(&self) -> &LocalBudget {
        &self.budget
    }

    /// Bytes this client moved so far with memcpy in its own segment, with memcpy in a
    /// same-host segment, and over TCP.
    pub fn path_counts(&self) -> PathCounts {
        self.peers.path_counts()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.close();
    }
}
