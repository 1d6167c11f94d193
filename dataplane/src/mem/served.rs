//! The memory a storage process serves to remote READ and WRITE, and the settings and counters
//! of the servers that serve it. Both server backends (the blocking `server::blocking` and
//! the io_uring shards of `crate::shard`), the transfer engine, the store client and the
//! storage node share these types, so they live with the memory rather than in one backend.
//!
//! [`ServedMemory`] is a [`Registry`] whose every range is live, writable memory, plus the
//! [`Catalog`] of committed objects in it. Invariant: memory is touched only inside a range
//! that [`Registry::check`] accepted, and [`ServedMemory::unregister`] returns only once no
//! request is using the withdrawn buffer any more.
//!
//! Generations and gates: the blocking server holds the table's read lock from the check
//! until the payload I/O ends. io_uring shards do not take the lock per request: each keeps
//! its own copy of the [`Registry`] tagged with the table's *generation* (bumped by every
//! change) and refreshes it when the generation moves. For the same unregister guarantee a
//! shard publishes, in a [`MemoryGate`], the oldest generation any of its in-flight
//! operations was checked against; [`ServedMemory::unregister`] bumps the generation and
//! then waits until every gate shows no operation checked against an older one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, Weak};
use std::time::Duration;

use super::{Registry, Segment};
use crate::limits::{IO_TIMEOUT_DEFAULT, SERVER_CONNECTIONS_MAX};
use crate::recovery::{Catalog, CatalogRecord, RecordKind};
use crate::TeError;
use protocol::auth::{self, Token};

/// The memory a server exposes: a [`Registry`] whose every range is live, writable memory.
#[derive(Debug, Default)]
pub struct ServedMemory {
    inner: RwLock<Served>,
    /// Bumped (under the write lock) by every change of the table.
    generation: AtomicU64,
    /// Gates of the io_uring shards serving this table; see the module docs.
    gates: Mutex<Vec<Weak<MemoryGate>>>,
    /// Committed objects in this table's memory (see [`crate::recovery::catalog`]).
    catalog: Catalog,
}

/// What one io_uring shard publishes about the registration generations it still uses.
#[derive(Debug)]
pub(crate) struct MemoryGate {
    /// The oldest generation an in-flight memory operation of the shard was checked against,
    /// or `u64::MAX` when none is in flight.
    oldest_in_use: AtomicU64,
}

impl MemoryGate {
    /// Publishes the oldest generation in use (`u64::MAX`: none).
    pub(crate) fn publish(&self, oldest: u64) {
        self.oldest_in_use.store(oldest, Ordering::SeqCst);
    }
}

/// Pause between two looks at the gates while an unregister waits.
const GATE_POLL_INTERVAL: Duration = Duration::from_micros(200);

/// The table behind [`ServedMemory`]'s lock.
#[derive(Debug, Default)]
pub(crate) struct Served {
    pub(crate) registry: Registry,
    /// Segments registered through `register_segment`, kept mapped while registered.
    segments: HashMap<u64, Arc<Segment>>,
}

impl ServedMemory {
    /// An empty table, shareable between a server and its owner.
    pub fn new() -> Arc<ServedMemory> {
        Arc::new(ServedMemory::default())
    }

    /// The table under its read lock: ranges checked against it stay registered while the
    /// guard lives (the blocking server holds it across a request's payload I/O).
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Served> {
        // A panic while holding the lock cannot leave a BTreeMap half-updated in a way that
        // breaks its invariants for us, so a poisoned lock is still usable.
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Served> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Exposes `[addr, addr + len)` to remote READ and WRITE.
    ///
    /// # Safety
    /// Until [`ServedMemory::unregister`] of `addr` returns, the range must stay mapped,
    /// readable and writable, and the caller must accept that remote peers read and write it
    /// at any time (no Rust reference to it may assume exclusive or stable contents).
    pub unsafe fn register(&self, addr: u64, len: u64) -> Result<(), TeError> {
        let mut served = self.write();
        served.registry.register(addr, len)?;
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Exposes a whole segment, keeping it mapped until it is unregistered.
    pub fn register_segment(&self, segment: Arc<Segment>) -> Result<(), TeError> {
        let addr = segment.addr() as u64;
        let mut served = self.write();
        served.registry.register(addr, segment.len() as u64)?;
        served.segments.insert(addr, segment);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Withdraws the buffer starting at `addr`; returns its length. Waits until no request
    /// is using any registered memory (see the module invariants).
    pub fn unregister(&self, addr: u64) -> Result<u64, TeError> {
        let (len, segment, generation) = {
            let mut served = self.write();
            let len = served.registry.unregister(addr)?;
            let segment = served.segments.remove(&addr);
            // Under the write lock: no CATALOG_PUT checked against the old table can land
            // after this.
            self.catalog.forget(addr, len, u64::MAX);
            (
                len,
                segment,
                self.generation.fetch_add(1, Ordering::SeqCst) + 1,
            )
        };
        // Outside the lock: a shard may need the read lock to refresh its copy before its
        // older operations can finish.
        self.wait_for_gates(generation);
        drop(segment);
        Ok(len)
    }

    /// Waits until no shard has an operation in flight that was checked against a
    /// generation older than `generation`.
    fn wait_for_gates(&self, generation: u64) {
        loop {
            let busy = {
                let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
                gates.retain(|g| g.strong_count() > 0);
                gates
                    .iter()
                    .filter_map(Weak::upgrade)
                    .any(|g| g.oldest_in_use.load(Ordering::SeqCst) < generation)
            };
            if !busy {
                return;
            }
            std::thread::sleep(GATE_POLL_INTERVAL);
        }
    }

    /// The current generation of the table (bumped by every change).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// A copy of the table and the generation it belongs to, taken atomically.
    pub(crate) fn snapshot_with_generation(&self) -> (u64, Registry) {
        let served = self.read();
        (self.generation(), served.registry.clone())
    }

    /// A new gate for one shard, consulted by every later unregister.
    pub(crate) fn attach_gate(&self) -> Arc<MemoryGate> {
        let gate = Arc::new(MemoryGate {
            oldest_in_use: AtomicU64::new(u64::MAX),
        });
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&gate));
        gate
    }

    /// True when `[addr, addr + len)` lies inside one registered buffer.
    pub fn check(&self, addr: u64, len: u64) -> bool {
        self.read().registry.check(addr, len)
    }

    /// A copy of the table, e.g. to describe the segment's buffers in metadata.
    pub fn snapshot(&self) -> Registry {
        self.read().registry.clone()
    }

    /// The catalog of committed objects in this table's memory.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Serves a CATALOG_PUT: decodes the record, checks `[addr, addr + object length)` as a
    /// WRITE's range is checked, and records the object (replacing what overlaps it).
    /// Errors: a bad record is `InvalidArgument`; a range outside one registered buffer is
    /// `AddressNotRegistered`; an object of a term older than the catalog's fence is
    /// `Metadata` ([`Catalog::fence`]). Both server backends call this, so they agree exactly.
    /// Returns the record's kind: a server may hold an intent's answer until the next one on
    /// its connection (the WRITE the client sends right behind it).
    ///
    /// It comes after every record a same-host writer announced before it ([`Catalog::settle`],
    /// called before the table's lock, which the announcements take).
    pub fn catalog_put(&self, addr: u64, record: &[u8]) -> Result<RecordKind, TeError> {
        let rec = CatalogRecord::decode(record)?;
        self.catalog.settle();
        self.apply_unsettled(addr, &rec).map(|()| rec.kind)
    }

    /// Applies a decoded record, its range checked as [`ServedMemory::catalog_put`] checks it
    /// (same errors), without applying same-host announcements first: for their source (the
    /// same-host socket's reader, `mem::shm`), which calls this as it reads them.
    pub fn apply_unsettled(&self, addr: u64, rec: &CatalogRecord<'_>) -> Result<(), TeError> {
        let served = self.read();
        let addressable = usize::try_from(addr)
            .ok()
            .and_then(|a| a.checked_add(usize::try_from(rec.len).ok()?))
            .is_some();
        if !addressable || !served.registry.check(addr, rec.len) {
            return Err(TeError::AddressNotRegistered);
        }
        // Inserted under the read lock, so an unregister of this buffer (write lock) either
        // comes first and refuses the range, or comes after and drops the entry.
        self.catalog.apply_now(addr, rec)
    }
}

/// Server settings.
#[derive(Clone, Copy, Debug)]
pub struct ServerConfig {
    /// The cluster secret every connection must prove before its first request (see
    /// `protocol::auth`); `None`: no handshake. Defaults to this process's secret.
    pub auth: Option<&'static Token>,
    /// Bound on one blocking socket operation; a peer silent for longer is dropped.
    pub io_timeout: Duration,
    /// Connections served at once; more are closed on accept. The blocking server caps this at
    /// `BLOCKING_CONNECTIONS_MAX` (one thread per connection).
    pub max_connections: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            auth: auth::process_token_or_none(),
            io_timeout: IO_TIMEOUT_DEFAULT,
            max_connections: SERVER_CONNECTIONS_MAX,
        }
    }
}

/// Counters of one server, readable while it runs.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connections_accepted: AtomicU64,
    pub connections_refused: AtomicU64,
    pub requests_ok: AtomicU64,
    pub requests_rejected: AtomicU64,
    pub frames_malformed: AtomicU64,
    pub connections_aborted: AtomicU64,
    /// Connections closed because the peer did not prove the cluster secret (wrong proof,
    /// or a request before the handshake).
    pub connections_unauthenticated: AtomicU64,
    /// Event-loop iterations (io_uring shards only; 0 on the blocking path).
    pub loop_iterations: AtomicU64,
    /// Event-loop iterations whose work took longer than `limits::LOOP_STALL_THRESHOLD`.
    pub loop_stalls: AtomicU64,
    /// Longest event-loop iteration seen, in microseconds.
    pub loop_stall_max_us: AtomicU64,
}
