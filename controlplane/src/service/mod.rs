//! The master's state machine: objects, replicas, leases, pins, segments, clients, eviction.
//!
//! [`MasterService`] is the whole master minus its sockets. The RPC layer hands it decoded
//! requests and gets back encoded replies ([`MasterService::handle`], or a [`Batch`] to run
//! every frame of one socket read under one lock acquisition); a timer calls
//! [`MasterService::tick`]; the admin HTTP server reads it through [`crate::view::AdminView`].
//!
//! Shape: one `parking_lot::Mutex` over `State`; every operation is a short, I/O-free
//! critical section (hash lookups and allocator updates). Counters are atomics outside the
//! lock. Time comes from a [`Clock`], so tests drive leases, timeouts and expiry by hand.
//!
//! Files: `object.rs` (objects, puts, reads, removes), `clear.rs` (the owner-checked
//! `BatchReplicaClear`), `placement.rs` (which segments get
//! replicas), `segments.rs` (segments, clients, liveness), `freed.rs` (ranges freed in a
//! segment, told to its owner for its catalog, see `docs/recovery.md`), `evict.rs` (eviction and the
//! probe-lease rule), `dispatch.rs` (requests to reply bytes), `metrics.rs` (counters and
//! Prometheus text), `admin.rs` (the admin view), `tasks.rs` (replica copy and move tasks),
//! `offload.rs` (the disk tier: offload, promotion, disk eviction; `docs/tiering.md`).
//!
//! Invariants of `State` beyond those of each file:
//! - `zombies` holds spans owned by no object (buffers of discarded puts, or of replaced
//!   values a reader may still hold); each is freed at `release_at_ms` or with its segment;
//! - every span allocated in a segment belongs to exactly one replica or one zombie.

mod admin;
mod clear;
mod dispatch;
mod drain;
mod evict;
#[cfg(test)]
#[path = "tests/fence.rs"]
mod fence_tests;
#[cfg(test)]
#[path = "tests/fleet.rs"]
mod fleet_tests;
mod freed;
mod index;
pub mod metrics;
mod object;
mod objects;
mod offload;
#[cfg(test)]
#[path = "tests/offload.rs"]
mod offload_tests;
mod owners;
mod placement;
pub mod quota;
#[cfg(test)]
#[path = "tests/quota.rs"]
mod quota_tests;
mod record;
pub mod removals;
mod reserve;
#[cfg(test)]
#[path = "tests/reserve.rs"]
mod reserve_tests;
mod segments;
mod tasks;
#[cfg(test)]
#[path = "tests/tasks.rs"]
mod tasks_tests;
mod tenant;
#[cfg(test)]
mod tests;
mod tombstones;

use std::collections::{BTreeMap, HashMap};

/// The hash map of the index: foldhash, seeded per process.
pub type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use protocol::message::Request;
use protocol::{Uuid, Version};

use crate::alloc::Span;
use crate::clock::Clock;
pub use dispatch::VERSION;
pub use metrics::{BatchOp, Metrics, Op};
pub use offload::{OffloadConfig, TierGauges, TierStats};
use segments::{Client, SegRef, Segments};
pub use tasks::TaskConfig;

/// Allocation strategy (`--allocation_strategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllocationStrategy {
    #[default]
    Random,
    FreeRatioFirst,
}

/// The knobs of the service, resolved from flags by `config`.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceConfig {
    /// `--default_kv_lease_ttl`, milliseconds.
    pub default_kv_lease_ttl_ms: u64,
    /// `--default_kv_soft_pin_ttl`, milliseconds.
    pub default_kv_soft_pin_ttl_ms: u64,
    /// `--max_kv_soft_pin_ttl`, milliseconds.
    pub max_kv_soft_pin_ttl_ms: u64,
    /// `--allow_evict_soft_pinned_objects`.
    pub allow_evict_soft_pinned_objects: bool,
    /// `--eviction_ratio`, in [0, 1].
    pub eviction_ratio: f64,
    /// `--eviction_high_watermark_ratio`, in [0, 1].
    pub eviction_high_watermark_ratio: f64,
    /// `--client_ttl`, seconds.
    pub client_ttl_s: u64,
    /// `--allocation_strategy`.
    pub allocation_strategy: AllocationStrategy,
    /// `--put_start_discard_timeout_sec`.
    pub put_start_discard_timeout_s: u64,
    /// `--put_start_release_timeout_sec`.
    pub put_start_release_timeout_s: u64,
    /// `--cluster_id`.
    pub cluster_id: String,
    /// `--quarantine_grace`: silence after which a client's segments are quarantined (no new
    /// allocation, replicas kept) until it pings again, milliseconds; see `segments.rs`. Clients ping every
    /// second, so the default is three missed pings. At or above `client_ttl` it never
    /// triggers before expiry.
    pub quarantine_grace_ms: u64,
    /// `--enable_multi_tenants`: each tenant its own key space (`tenant.rs`); off, every
    /// tenant is the default one, as upstream.
    pub multi_tenants: bool,
    /// The tenant quota policy (`--tenant_quota_connector_uri`, `quota.rs`), loaded at start;
    /// used with `multi_tenants` only.
    pub tenant_quota: Option<quota::QuotaPolicy>,
    /// The replica-task limits and timeouts (`--max_total_*_tasks`, `--*_task_timeout_sec`,
    /// `--max_retry_attempts`; `tasks.rs`).
    pub tasks: TaskConfig,
    /// The disk tier's switches (`--enable_offload` and its family; `offload.rs`).
    pub offload: OffloadConfig,
    /// `--admission_ramp_sec` in milliseconds: the window over which a freshly mounted
    /// segment's share of new replicas ramps up to its fair share (`placement.rs`); 0: off.
    pub admission_ramp_ms: u64,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            default_kv_lease_ttl_ms: 10_000,
            default_kv_soft_pin_ttl_ms: 30 * 60 * 1000,
            max_kv_soft_pin_ttl_ms: 24 * 3600 * 1000,
            allow_evict_soft_pinned_objects: true,
            eviction_ratio: 0.05,
            eviction_high_watermark_ratio: 0.90,
            client_ttl_s: 10,
            allocation_strategy: AllocationStrategy::Random,
            put_start_discard_timeout_s: 30,
            put_start_release_timeout_s: 600,
            cluster_id: protocol::DEFAULT_CLUSTER_ID.to_string(),
            quarantine_grace_ms: QUARANTINE_GRACE_DEFAULT_MS,
            multi_tenants: false,
            tenant_quota: None,
            tasks: TaskConfig::default(),
            offload: OffloadConfig::default(),
            admission_ramp_ms: ADMISSION_RAMP_DEFAULT_MS,
        }
    }
}

impl ServiceConfig {
    pub(crate) fn discard_timeout_ms(&self) -> u64 {
        self.put_start_discard_timeout_s.saturating_mul(1000)
    }

    pub(crate) fn release_timeout_ms(&self) -> u64 {
        self.put_start_release_timeout_s.saturating_mul(1000)
    }
}

/// Default of [`ServiceConfig::admission_ramp_ms`] (`--admission_ramp_sec=5`).
pub const ADMISSION_RAMP_DEFAULT_MS: u64 = 5000;

/// Default of [`ServiceConfig::quarantine_grace_ms`]: three ping intervals.
pub const QUARANTINE_GRACE_DEFAULT_MS: u64 = 3000;

/// A gap between two ticks longer than this means the master itself stalled: client silence
/// is then counted from the end of the stall (see `State::update_quarantine`).
const TICK_STALL_MS: u64 = 1000;

/// After winning an HA term, how long the new leader answers reads (`GetReplicaList`,
/// `ExistKey`) and removes with `UNAVAILABLE_IN_CURRENT_STATUS` while the owners re-report:
/// two ping intervals, so that every live owner has re-mounted and the newest version of each
/// key (or its tombstone) is in the index before anyone reads or removes (`docs/ha.md`).
pub const RECOVERY_FENCE_MS: u64 = 2000;

/// Interval between scans for in-flight puts whose writer went quiet, milliseconds.
const STALE_PUT_SCAN_INTERVAL_MS: u64 = 1000;

/// A span owned by no object, freed at `release_at_ms`.
pub(crate) struct Zombie {
    pub seg: SegRef,
    pub span: Span,
    pub release_at_ms: u64,
}

/// Everything behind the service lock.
pub(crate) struct State {
    pub cfg: ServiceConfig,
    pub objects: objects::Objects,
    /// Lease groups by name (`object.rs`, "Lease groups").
    pub groups: object::Groups,
    pub segs: Segments,
    pub clients: FastMap<Uuid, Client>,
    pub zombies: Vec<Zombie>,
    /// Parked buffers fill a sixteenth of the pool: replica lists get short read windows
    /// until they drop below a thirty-second (`object.rs`, "Read windows"). Set by `tick`.
    pub short_read_windows: bool,
    /// A put failed for lack of space: the next tick evicts even below the watermark.
    pub need_eviction: bool,
    /// Bumped whenever an object becomes evictable by completing (see `evict.rs`).
    pub evict_epoch: u64,
    /// After a pass that found nothing: skip passes while the epoch is this and the clock
    /// is before this.
    pub evict_blocked: Option<(u64, u64)>,
    /// In-flight puts by start second (`put_start_ms / 1000`), so `tick` scans for stale
    /// puts only when one may be stale. Exact after each scan; between scans a count may be
    /// too high (an in-flight object dropped with its segment), which costs one extra scan,
    /// never too low.
    pub inflight: BTreeMap<u64, u64>,
    pub next_stale_scan_ms: u64,
    pub rng: u64,
    /// Answered in `Ping` (the HA view; 0 without HA).
    pub view_version: i64,
    /// The term of the versions this master hands out (see `tombstones.rs`) and the last
    /// sequence number handed out in it.
    pub term: u64,
    pub seq: u64,
    /// Keys that left the index, with the version they left at.
    pub tombstones: tombstones::Tombstones,
    /// Pattern removals (`removals.rs`): loaded at the election, plus this term's own.
    pub removals: removals::Removals,
    /// Removals to store in etcd before their answers go out (`removals.rs`); collected only
    /// when `durable_on` (an HA leader), drained by the RPC layer after each batch.
    pub durable: Vec<removals::Removal>,
    pub durable_on: bool,
    /// Reads and removes answer `UNAVAILABLE_IN_CURRENT_STATUS` before this time (the
    /// owners' re-reports after an HA election, [`RECOVERY_FENCE_MS`]); 0 without HA.
    pub fence_until_ms: u64,
    /// The owners registered in etcd, and those a new term still waits for (`owners.rs`);
    /// kept only when `durable_on`.
    pub owners: owners::Owners,
    /// Time of the previous tick, and the end of the last stall of the master (a tick gap
    /// over `TICK_STALL_MS`): client silence counts from there at the earliest.
    pub last_tick_ms: u64,
    pub liveness_from_ms: u64,
    /// Replica copy and move tasks (`tasks.rs`): soft state, lost with the master.
    pub tasks: tasks::Tasks,
    /// Tenant quotas (`quota.rs`): with `--enable_multi_tenants` and a policy file.
    pub quotas: Option<quota::Quotas>,
    /// The disk tier's counters (`offload.rs`), read by the metrics page under the lock.
    pub tier: TierStats,
    /// When the next disk-watermark check runs (`offload.rs`, at most once a second).
    pub next_disk_check_ms: u64,
    /// A synchronous disk eviction that found nothing: at this time, on this disk
    /// (`offload.rs`, `allocate_target`).
    pub disk_futile: Option<(u64, SegRef)>,
    /// Replicas placed since the start (`placement.rs`): the admission ramp of a fresh
    /// segment counts its share against it.
    pub placed_replicas: u64,
    /// When the last admission ramp begun ends (0: none running), so that a put pays for
    /// the ramps only while one may run (`placement.rs`).
    pub ramps_until_ms: u64,
    /// When the next scan of draining segments may run (`drain.rs`).
    pub next_drain_scan_ms: u64,
    /// The first tick of this state (a master's start, an HA term's): until `client_ttl`
    /// after it, owners of the previous state may still be re-mounting (`drain.rs`).
    pub first_tick_ms: u64,
    /// Ranges reserved for clients' next puts, by client (`reserve.rs`).
    pub reservations: reserve::Reservations,
    /// Whether an owner re-mounted segments to this state (`ReMountSegment`) with something
    /// from before (a memory segment, or objects; not an empty disk): without HA, the sign
    /// that this master restarted and others may follow.
    pub remounted: bool,
}

impl State {
    fn new(cfg: ServiceConfig, seed: u64) -> Self {
        let quotas = match (&cfg.tenant_quota, cfg.multi_tenants) {
            (Some(policy), true) => Some(quota::Quotas {
                policy: policy.clone(),
                ..Default::default()
            }),
            _ => None,
        };
        State {
            cfg,
            objects: objects::Objects::new(quotas.is_some()),
            groups: Default::default(),
            segs: Segments::default(),
            clients: FastMap::default(),
            zombies: Vec::new(),
            short_read_windows: false,
            need_eviction: false,
            evict_epoch: 0,
            evict_blocked: None,
            inflight: BTreeMap::new(),
            next_stale_scan_ms: 0,
            rng: seed | 1,
            view_version: 0,
            term: start_term(),
            seq: 0,
            tombstones: tombstones::Tombstones::default(),
            removals: removals::Removals::default(),
            durable: Vec::new(),
            durable_on: false,
            fence_until_ms: 0,
            owners: owners::Owners::default(),
            last_tick_ms: 0,
            liveness_from_ms: 0,
            tasks: tasks::Tasks::default(),
            quotas,
            tier: TierStats::default(),
            next_disk_check_ms: 0,
            disk_futile: None,
            placed_replicas: 0,
            ramps_until_ms: 0,
            next_drain_scan_ms: 0,
            first_tick_ms: 0,
            reservations: Default::default(),
            remounted: false,
        }
    }

    /// Whether the owners of the pool before this master's start (or this HA term) had
    /// their chance to re-mount: under HA, once the recovery fence is down (every registered
    /// owner re-reported, or the fence's time ran out); without, at once on a master no owner
    /// re-mounted to (a fresh cluster: nobody comes back), else once `client_ttl` passed since
    /// the first tick, the time after which a silent owner counts as gone. Until then a newer
    /// version of any key may still be re-reported.
    pub(crate) fn owners_settled(&self, now: u64) -> bool {
        if self.durable_on {
            return self.fenced(now).is_ok();
        }
        !self.remounted
            || now
                >= self
                    .first_tick_ms
                    .saturating_add(self.cfg.client_ttl_s.saturating_mul(1000))
    }

    /// The version of a write starting now.
    pub(crate) fn next_version(&mut self) -> Version {
        self.seq += 1;
        Version {
            term: self.term,
            seq: self.seq,
        }
    }

    /// Whether reads and removes must wait for the owners' re-reports.
    pub(crate) fn fenced(&self, now: u64) -> Result<(), protocol::ErrorCode> {
        // Ends early once every owner the term waits for has re-reported in full.
        if now < self.fence_until_ms && !self.owners.all_reported() {
            return Err(protocol::ErrorCode::UnavailableInCurrentStatus);
        }
        Ok(())
    }

    /// [`Self::fenced`] for a request about one `key` (`GetReplicaList`, `ExistKey`, `Remove`):
    /// a key whose newest write was made in this term, and completed, is answered at once.
    /// Every re-report carries an older version: it cannot replace that write, and a remove
    /// of it leaves a tombstone at its version that refuses them all. Only keys that may have a
    /// newer version still to be re-reported wait for the fence (`docs/ha.md`, "A recovery
    /// fence").
    pub(crate) fn fenced_key(&self, now: u64, key: &str) -> Result<(), protocol::ErrorCode> {
        if self.fenced(now).is_ok() {
            return Ok(());
        }
        match self.objects.get(key) {
            Some(o) if o.version.term == self.term && o.has_complete() => Ok(()),
            _ => Err(protocol::ErrorCode::UnavailableInCurrentStatus),
        }
    }

    /// "Ask again" while a registered owner has not re-reported since the election: a key the
    /// index does not hold may be one of its (`owners.rs`).
    pub(crate) fn owners_awaited(&self, now: u64) -> Result<(), protocol::ErrorCode> {
        if self.owners.missing_any(now) {
            return Err(protocol::ErrorCode::UnavailableInCurrentStatus);
        }
        Ok(())
    }

    /// The answer for a key the index does not hold: `OBJECT_NOT_FOUND`, or "ask again" while
    /// [`Self::owners_awaited`] says so.
    pub(crate) fn missing(&self, now: u64) -> protocol::ErrorCode {
        self.owners_awaited(now)
            .err()
            .unwrap_or(protocol::ErrorCode::ObjectNotFound)
    }

    /// [`Self::fenced`] for a request over every key (pattern removes): it also waits for the
    /// registered owners that have not re-reported yet.
    pub(crate) fn fenced_all(&self, now: u64) -> Result<(), protocol::ErrorCode> {
        self.fenced(now)?;
        self.owners_awaited(now)
    }

    /// `client` mounted a segment: an HA leader registers it (`owners.rs`).
    pub(crate) fn owner_mounted(&mut self, client: Uuid) {
        if self.durable_on {
            self.owners.mounted(client);
        }
    }

    /// `client`'s re-report to this term is complete (`ReMountDone`).
    pub(crate) fn owner_reported(&mut self, client: Uuid, now: u64) {
        if !self.durable_on || self.owners.all_reported() {
            return;
        }
        self.owners.reported(client);
        if self.owners.all_reported() && now < self.fence_until_ms {
            let elected = self.fence_until_ms.saturating_sub(RECOVERY_FENCE_MS);
            tracing::info!(
                "HA: every registered owner re-reported {} ms after the election: the recovery \
                 fence ends",
                now.saturating_sub(elected)
            );
        }
    }

    /// `client` holds no segment any more: an HA leader forgets it (`owners.rs`).
    pub(crate) fn owner_gone(&mut self, client: Uuid) {
        if self.durable_on {
            self.owners.gone(client);
        }
    }

    pub(crate) fn note_inflight(&mut self, put_start_ms: u64) {
        *self.inflight.entry(put_start_ms / 1000).or_insert(0) += 1;
    }

    pub(crate) fn done_inflight(&mut self, put_start_ms: u64) {
        let b = put_start_ms / 1000;
        if let Some(n) = self.inflight.get_mut(&b) {
            *n -= 1;
            if *n == 0 {
                self.inflight.remove(&b);
            }
        }
    }

    /// Whether the oldest in-flight put may have passed the discard timeout.
    fn maybe_stale_put(&self, now: u64) -> bool {
        let timeout_ms = self.cfg.discard_timeout_ms();
        self.inflight
            .first_key_value()
            .is_some_and(|(&b, _)| (b * 1000).saturating_add(timeout_ms) <= now)
    }

    /// Frees parked buffers whose time has come, and turns short read windows on or off by
    /// how much stays parked.
    fn release_zombies(&mut self, m: &Metrics, now: u64) {
        let State { zombies, segs, .. } = self;
        let mut parked = 0u64;
        zombies.retain(|z| {
            if z.release_at_ms > now {
                // Parked disk ranges do not crowd memory: only memory counts here.
                if segs.get(z.seg).is_some_and(|s| !s.is_disk()) {
                    parked += z.span.len;
                }
                return true;
            }
            segs.free_span(z.seg, z.span);
            Metrics::inc(&m.put_start_releases);
            false
        });
        let (_, cap) = self.usage();
        self.short_read_windows = if self.short_read_windows {
            parked.saturating_mul(32) >= cap && parked > 0
        } else {
            parked.saturating_mul(16) >= cap && parked > 0
        };
    }
}

/// The term of a master without HA: its start time in ms since the epoch, so that a
/// restarted master's versions are above those of the one before it (as long as the wall
/// clock did not go back by more than the restart took).
fn start_term() -> u64 {
    crate::clock::wall_ms().max(1)
}

/// The master service. `Send + Sync`; share it behind an `Arc`.
pub struct MasterService {
    state: Mutex<State>,
    metrics: Metrics,
    clock: Arc<dyn Clock>,
    /// The KV-cache event publisher (`crate::events`), with `--enable_kv_events`.
    kv_events: std::sync::OnceLock<Arc<crate::events::Publisher>>,
}

/// The service locked for a run of requests (see [`MasterService::batch`]).
pub struct Batch<'a> {
    state: MutexGuard<'a, State>,
    metrics: &'a Metrics,
    now: u64,
}

impl Batch<'_> {
    /// Executes one request and appends its encoded `Result<Reply, ErrorCode>` to `out`.
    #[inline]
    pub fn handle(&mut self, req: Request, out: &mut Vec<u8>) {
        dispatch::dispatch(&mut self.state, self.metrics, self.now, req, out);
    }

    /// Executes the request in a frame body: like decoding it and calling [`Batch::handle`],
    /// but existence probes (the hottest calls) look their keys up without allocating them.
    /// A body that does not decode is an error and nothing is appended.
    pub fn handle_frame(
        &mut self,
        opcode: u16,
        body: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), protocol::wire::DecodeError> {
        use protocol::message::{BatchExistKey, ExistKey, Rpc};
        match opcode {
            BatchExistKey::OP => {
                dispatch::batch_exist_borrowed(&mut self.state, self.metrics, self.now, body, out)
            }
            ExistKey::OP => {
                dispatch::exist_borrowed(&mut self.state, self.metrics, self.now, body, out)
            }
            _ => {
                self.handle(Request::decode(opcode, body)?, out);
                Ok(())
            }
        }
    }

    /// The removals made in this batch that must be stored in etcd before the batch's
    /// answers go out (`removals.rs`); empty without HA.
    pub fn take_durable(&mut self) -> Vec<removals::Removal> {
        std::mem::take(&mut self.state.durable)
    }

    /// The owners this batch registered, to store in etcd before its answers go out
    /// (`owners.rs`); empty without HA.
    pub fn take_new_owners(&mut self) -> Vec<Uuid> {
        self.state.owners.take_to_store()
    }
}

impl MasterService {
    pub fn new(cfg: ServiceConfig, clock: Arc<dyn Clock>) -> Self {
        Self::with_seed(cfg, clock, rand::random())
    }

    /// Like [`Self::new`] with a fixed seed for the placement walk (deterministic tests).
    pub fn with_seed(cfg: ServiceConfig, clock: Arc<dyn Clock>, seed: u64) -> Self {
        MasterService {
            state: Mutex::new(State::new(cfg, seed)),
            metrics: Metrics::default(),
            clock,
            kv_events: std::sync::OnceLock::new(),
        }
    }

    /// Publishes KV-cache events through `publisher` from now on (`objects.rs` says when);
    /// a second call is ignored.
    pub fn set_kv_events(&self, publisher: Arc<crate::events::Publisher>) {
        let sink = publisher.sink();
        if self.kv_events.set(publisher).is_ok() {
            self.state.lock().objects.set_events(Some(sink));
        }
    }

    /// What `GET /kv_events/status` reports.
    pub fn kv_events_status(&self) -> crate::events::Status {
        self.kv_events
            .get()
            .map_or_else(crate::events::Status::disabled, |p| p.status())
    }

    /// Executes one request and appends the encoded `Result<R::Reply, ErrorCode>` (an `i32`
    /// status, then the reply when it is 0) to `out`. Never panics on client input.
    /// In-process callers have no etcd to store removals in (`removals.rs`): an HA leader
    /// is served through the RPC layer, which does.
    pub fn handle(&self, req: Request, out: &mut Vec<u8>) {
        let mut b = self.batch();
        b.handle(req, out);
        b.take_durable();
        b.take_new_owners();
    }

    /// Locks the service once for many requests, e.g. every frame of one socket read:
    ///
    /// ```ignore
    /// let mut b = service.batch();
    /// for (req, id) in frames { write_header(out, id); b.handle(req, out); patch_len(out); }
    /// drop(b); // before any I/O
    /// ```
    ///
    /// Requests see the clock as read once when the batch was taken. Do no I/O and nothing
    /// slow while a `Batch` lives: every other connection waits on the lock.
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            now: self.clock.now_ms(),
            state: self.state.lock(),
            metrics: &self.metrics,
        }
    }

    /// Runs `reqs` under one lock acquisition; after each reply is appended to `out`,
    /// `done(out, reply_start)` is called (the reply is `out[reply_start..]`), so the caller
    /// can frame it or record its end.
    pub fn handle_many(
        &self,
        reqs: impl IntoIterator<Item = Request>,
        out: &mut Vec<u8>,
        mut done: impl FnMut(&mut Vec<u8>, usize),
    ) {
        let mut b = self.batch();
        for req in reqs {
            let start = out.len();
            b.handle(req, out);
            done(out, start);
        }
        b.take_durable();
        b.take_new_owners();
    }

    /// Periodic work; call every 10-100 ms. Expires silent clients, quarantines the segments
    /// of clients silent for `quarantine_grace_ms` (and lifts it when they ping), unmounts drained
    /// segments, discards stale in-flight puts, frees parked buffers whose time has come and
    /// evicts when over the high watermark or after a put failed for space.
    pub fn tick(&self) {
        let now = self.clock.now_ms();
        let m = &self.metrics;
        let mut st = self.state.lock();
        if st.last_tick_ms != 0 && now.saturating_sub(st.last_tick_ms) > TICK_STALL_MS {
            st.liveness_from_ms = now;
        }
        st.last_tick_ms = now;
        if st.first_tick_ms == 0 {
            st.first_tick_ms = now;
        }
        let expired = st.expire_clients(now);
        Metrics::add(&m.expired_clients, expired as u64);
        let (entered, lifted) = st.update_quarantine(now);
        Metrics::add(&m.quarantined_clients, entered as u64);
        Metrics::add(&m.unquarantined_clients, lifted as u64);
        st.advance_drains(m, now);
        st.end_ramps(now);
        let late = st.owners.stop_waiting(now);
        if !late.is_empty() {
            tracing::warn!(
                "HA: {} registered owner(s) did not re-report within client_ttl of the \
                 election and are forgotten (their keys read as missing): {late:?}",
                late.len()
            );
        }
        if now >= st.next_stale_scan_ms && st.maybe_stale_put(now) {
            st.discard_stale_puts(m, now);
            st.next_stale_scan_ms = now + STALE_PUT_SCAN_INTERVAL_MS;
        }
        st.expire_tasks(now);
        st.expire_reservations(now);
        st.release_zombies(m, now);
        st.objects.sweep_writers();
        st.maybe_evict(m, now);
        st.maybe_evict_disks(now);
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The gauges of the metrics page, read under the lock.
    pub fn gauges(&self) -> metrics::Gauges {
        let st = self.state.lock();
        let now = self.clock.now_ms();
        let (used, cap) = st.usage();
        metrics::Gauges {
            key_count: st.objects.len() as u64,
            allocated_bytes: used,
            total_capacity_bytes: cap,
            active_clients: st.clients.len() as u64,
            soft_pin_key_count: st.objects.values().filter(|o| o.soft_pinned(now)).count() as u64,
            segments: st.segs.len() as u64,
            quarantined_segments: st.quarantined_segments() as u64,
            draining_segments: st.draining_segments() as u64,
            ramping_segments: st.segs.iter().filter(|s| s.ramp.is_some()).count() as u64,
            reserved_bytes: st.reserved_bytes(),
            owners_awaited: st.owners.awaited(now) as u64,
            tier: st.tier_gauges(),
        }
    }

    /// Sets the view version answered in `Ping` (HA leadership term).
    pub fn set_view_version(&self, v: i64) {
        self.state.lock().view_version = v;
    }

    /// Forgets every object, segment and client, keeping the configuration and the metric
    /// counters, and starts term `view_version`. Called when this master becomes the HA leader:
    /// whatever it knew from an earlier term may be stale, and the owners re-report what they
    /// hold (`docs/ha.md`).
    ///
    /// The term's versions take the term itself (an etcd revision, above every earlier
    /// term's), and reads and removes wait [`RECOVERY_FENCE_MS`] for the re-reports.
    pub fn reset(&self, view_version: i64, removals: &[removals::Removal]) {
        let now = self.clock.now_ms();
        let mut st = self.state.lock();
        let mut cfg = st.cfg.clone();
        // The policy file as it is now: another master may have changed it (`quota.rs`).
        if let Some(p) = &cfg.tenant_quota {
            match quota::QuotaPolicy::load(&p.path) {
                Ok(now) => cfg.tenant_quota = Some(now),
                Err(e) => tracing::warn!("{e}; keeping the tenant quota policy in memory"),
            }
        }
        // The event queue stays: a new term announces what the owners re-report.
        let events = st.objects.events();
        *st = State::new(cfg, rand::random());
        st.objects.set_events(events);
        st.view_version = view_version;
        st.term = view_version.max(1) as u64;
        st.fence_until_ms = now.saturating_add(RECOVERY_FENCE_MS);
        st.durable_on = true;
        let State {
            removals: known,
            tombstones,
            ..
        } = &mut *st;
        for r in removals {
            known.learn(r, tombstones);
        }
    }

    /// The owners registered in etcd by earlier terms (`owners.rs`): reads of keys the index
    /// does not hold, and pattern removes, wait for each until it re-reports, for at most
    /// `client_ttl`. Called right after [`Self::reset`].
    pub fn await_owners(&self, owners: &[Uuid]) {
        let now = self.clock.now_ms();
        let mut st = self.state.lock();
        let until = now.saturating_add(st.cfg.client_ttl_s.saturating_mul(1000));
        st.owners = owners::Owners::awaiting(owners, until);
    }

    /// Owners that could not be stored in etcd: their next mount stores them again.
    pub fn owners_unstored(&self, owners: &[Uuid]) {
        self.state.lock().owners.unstored(owners);
    }

    /// Owners that hold no segment any more, to delete from etcd.
    pub fn take_gone_owners(&self) -> Vec<Uuid> {
        self.state.lock().owners.take_to_forget()
    }

    /// Marks every known client as seen now. Called when a leader that could not prove its
    /// lease for a while (its clients' pings were refused meanwhile) proves it again, so that
    /// the refusal does not expire them.
    pub fn touch_all_clients(&self) {
        let now = self.clock.now_ms();
        for c in self.state.lock().clients.values_mut() {
            c.last_seen_ms = now;
        }
    }
}
