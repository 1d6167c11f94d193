//! High availability: leader election in etcd under a lease (`docs/ha.md`).
//!
//! Every master of a cluster runs [`run`]. It grants itself an etcd lease of
//! `--ha_lease_ttl_sec` and tries to create the key `mooncake-store/<cluster_id>/master_view`
//! with its RPC address as the value, attached to that lease, in one transaction that succeeds
//! only if the key does not exist. The winner is the leader; its term (the `view_version`) is
//! the etcd revision of that transaction. The losers are standbys: they poll the key and
//! campaign again as soon as it disappears (the leader's lease lapsed or was revoked).
//!
//! The leader keeps its lease alive and serves only while it can *prove* the lease: after each
//! keep-alive answered with TTL `t`, it may serve until `sent + t - SAFETY_MARGIN`, where
//! `sent` is when the keep-alive left (etcd extended the lease no earlier than that, so the
//! lease outlives the serving window). A standby can only win after etcd expired or revoked the
//! lease, i.e. after the old leader's window closed: **no two masters serve at once**, whatever
//! the network does, as long as clocks advance at about the same rate.
//!
//! Serving is checked by the RPC layer on every socket read ([`HaState::may_serve`]); a master
//! that may not serve answers every request with `UNAVAILABLE_IN_CURRENT_STATUS` (-1010), the
//! "not leader" code clients follow. On winning, the leader forgets everything it knew
//! ([`MasterService::reset`]): its index is rebuilt from the owners' re-reports. A leader whose
//! lease proof lapsed (etcd unreachable) but whose lease survived resumes with its index when
//! etcd answers again; one whose lease expired campaigns from scratch.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp,
};
use parking_lot::Mutex;
use protocol::Uuid;
use tracing::{info, warn};

use crate::limits::{
    KEEPALIVE_EVERY, PROBE_REFUSALS_DEAD_ITEMS, PROBE_SILENCE_DEAD, PROBE_TIMEOUT, SERVE_WINDOW,
};
use crate::service::removals::{Removal, RECORD_BYTES_MAX, REMOVALS_KEPT};
use crate::service::MasterService;

/// Time cut from the end of each proven lease window, for clock-rate differences and for the
/// request a worker is executing when the window closes.
pub const SAFETY_MARGIN: Duration = Duration::from_millis(200);
/// How often a standby looks at the leader key, and probes the leader's RPC port
/// ([`PROBE_TIMEOUT`]).
pub const STANDBY_POLL: Duration = Duration::from_millis(100);
/// Bound of every single etcd call.
pub const ETCD_CALL_TIMEOUT: Duration = Duration::from_millis(1000);
/// Pause before retrying after etcd could not be reached.
pub const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// Whether a master with HA state `gate` (`None`: no HA) may answer requests and run its
/// periodic work now.
pub fn serving(gate: &Option<Arc<HaState>>) -> bool {
    gate.as_ref().is_none_or(|g| g.may_serve())
}

/// The etcd key naming the leader of `cluster_id` (upstream's layout).
pub fn master_view_key(cluster_id: &str) -> String {
    format!("mooncake-store/{cluster_id}/master_view")
}

/// The etcd key where the leader of `cluster_id` records its lease id (no lease attached, so
/// it outlives the leader key): a candidate that finds the leader key vacant reads it to tell
/// whether the last leader may still be serving (`wait_out_a_vacated_leader`).
pub fn leader_lease_key(cluster_id: &str) -> String {
    format!("mooncake-store/{cluster_id}/leader_lease")
}

/// etcd endpoints from a connection string: `etcd://h1:p1;h2:p2`, `h1:p1,h2:p2`, with or
/// without `http://` on each. Each comes back as `http://host:port` (port 2379 when omitted).
pub fn parse_endpoints(conn: &str) -> Result<Vec<String>, String> {
    let rest = conn.trim();
    let rest = rest.strip_prefix("etcd://").unwrap_or(rest);
    let mut out = Vec::new();
    for part in rest
        .split([';', ','])
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let hostport = part
            .strip_prefix("http://")
            .unwrap_or(part)
            .trim_end_matches('/');
        if hostport.is_empty() || hostport.contains('/') || hostport.starts_with("https:") {
            return Err(format!(
                "bad etcd endpoint {part:?} (expected host:port or http://host:port)"
            ));
        }
        let has_port = match hostport.rsplit_once(':') {
            Some((h, p)) => !h.is_empty() && p.parse::<u16>().is_ok() && !h.ends_with(':'),
            None => false,
        };
        if has_port {
            out.push(format!("http://{hostport}"));
        } else {
            out.push(format!("http://{hostport}:2379"));
        }
    }
    if out.is_empty() {
        return Err(format!("no etcd endpoint in {conn:?}"));
    }
    Ok(out)
}

/// What [`run`] needs.
#[derive(Clone, Debug)]
pub struct HaConfig {
    /// `http://host:port` of each etcd member.
    pub endpoints: Vec<String>,
    pub cluster_id: String,
    /// The address clients reach this master's RPC at (`host:port`), published when leader.
    pub advertise: String,
    pub lease_ttl_s: i64,
}

const STANDBY: u8 = 0;
const LEADER: u8 = 1;

/// This master's role, shared by the election task, the RPC layer and the admin server.
pub struct HaState {
    epoch: Instant,
    role: AtomicU8,
    /// Milliseconds since `epoch` until which the leader may serve; 0 when it may not.
    serve_until_ms: AtomicU64,
    view_version: AtomicI64,
    etcd_reachable: AtomicBool,
    leader: Mutex<Option<String>>,
    advertise: String,
    /// Times this master won an election (for logs, metrics and tests).
    terms_won: AtomicU64,
    /// Wall-clock milliseconds (Unix epoch) at which this master last won an election,
    /// stamped before it may serve; 0 before its first term.
    term_started_unix_ms: AtomicU64,
    /// The lease of the current term (0 when not leader).
    lease: AtomicI64,
    /// Where the current term stores removals and the owners' registry; `None` when not
    /// leader.
    term_store: Mutex<Option<TermStore>>,
}

/// The leader's handle for storing removal records and the owners' registry in etcd under
/// its lease.
#[derive(Clone)]
struct TermStore {
    client: Client,
    lease: i64,
    leader_key: String,
    prefix: String,
    /// Where the owners' registry lives (`service/owners.rs`).
    owners_prefix: String,
    /// When to prune old removal records, and whether a prune runs.
    prune: Arc<Prune>,
}

/// Every [`PRUNE_EVERY`]th record written in a term prunes the old ones, in the background,
/// one prune at a time.
#[derive(Default)]
struct Prune {
    /// Records written this term.
    written: AtomicU64,
    /// Whether a prune runs.
    running: AtomicBool,
}

impl TermStore {
    /// Runs `ops` in one etcd transaction that succeeds only while the leader key still
    /// carries this term's lease (a deposed leader writes nothing).
    async fn guarded(
        &self,
        client: &mut Client,
        what: &str,
        ops: Vec<TxnOp>,
    ) -> Result<(), String> {
        let txn = Txn::new()
            .when([Compare::lease(
                self.leader_key.clone(),
                CompareOp::Equal,
                self.lease,
            )])
            .and_then(ops);
        let answer = bounded(what, client.txn(txn)).await?;
        if !answer.succeeded() {
            return Err("the leader key no longer names this master's lease".into());
        }
        Ok(())
    }
}

/// The etcd prefix of a cluster's removal records (`service/removals.rs`).
pub fn removals_prefix(cluster_id: &str) -> String {
    format!("mooncake-store/{cluster_id}/removals/")
}

/// The etcd prefix of a cluster's owners' registry (`service/owners.rs`): one key per owner,
/// named by its client id, value empty.
pub fn owners_prefix(cluster_id: &str) -> String {
    format!("mooncake-store/{cluster_id}/owners/")
}

/// How often (in records written) a leader prunes records beyond `REMOVALS_KEPT`.
const PRUNE_EVERY: u64 = 16;

/// Operations per etcd transaction when registering or forgetting owners and pruning
/// removal records (etcd allows 128 in one).
const OPS_PER_TXN: usize = 64;

/// A snapshot of [`HaState`] for `/health`, `/role` and `/leader`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HaStatus {
    /// `leader` or `standby`.
    pub role: &'static str,
    /// Whether this master answers requests now (a leader that can prove its lease).
    pub serving: bool,
    /// The leader's RPC address as last read from etcd (this master's own when leader).
    pub leader_address: Option<String>,
    /// The leader's term (etcd revision of its election), 0 before any is known.
    pub view_version: i64,
    pub etcd_reachable: bool,
    pub terms_won: u64,
    /// When this master's last term began (Unix ms, this host's clock), 0 if it never won.
    /// Stamped before the term could serve, so no answer of that term is older: a test
    /// compares it with the last answer a cut-off predecessor gave.
    pub term_started_unix_ms: u64,
}

impl HaState {
    pub fn new(advertise: String) -> Self {
        HaState {
            epoch: Instant::now(),
            role: AtomicU8::new(STANDBY),
            serve_until_ms: AtomicU64::new(0),
            view_version: AtomicI64::new(0),
            etcd_reachable: AtomicBool::new(false),
            leader: Mutex::new(None),
            advertise,
            terms_won: AtomicU64::new(0),
            term_started_unix_ms: AtomicU64::new(0),
            lease: AtomicI64::new(0),
            term_store: Mutex::new(None),
        }
    }

    fn ms_at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Whether this master may answer requests now: it is the leader and its lease is proven.
    #[inline]
    pub fn may_serve(&self) -> bool {
        self.is_leader() && self.ms_at(Instant::now()) < self.serve_until_ms.load(Ordering::Acquire)
    }

    /// Whether this master won the current term (it may still be unable to prove its lease).
    pub fn is_leader(&self) -> bool {
        self.role.load(Ordering::Acquire) == LEADER
    }

    pub fn status(&self) -> HaStatus {
        let leader = self.is_leader();
        HaStatus {
            role: if leader { "leader" } else { "standby" },
            serving: self.may_serve(),
            leader_address: self.leader.lock().clone(),
            view_version: self.view_version.load(Ordering::Acquire),
            etcd_reachable: self.etcd_reachable.load(Ordering::Acquire),
            terms_won: self.terms_won.load(Ordering::Acquire),
            term_started_unix_ms: self.term_started_unix_ms.load(Ordering::Acquire),
        }
    }

    /// Extends the serving window to `sent + min(ttl, SERVE_WINDOW) - SAFETY_MARGIN`; returns
    /// whether the window had closed before (serving resumes after a gap).
    pub(crate) fn prove(&self, sent: Instant, ttl: Duration) -> bool {
        let window = ttl.min(SERVE_WINDOW).saturating_sub(SAFETY_MARGIN);
        let until = self.ms_at(sent + window);
        let before = self.serve_until_ms.swap(until, Ordering::AcqRel);
        before <= self.ms_at(Instant::now())
    }

    pub(crate) fn become_leader(&self, view_version: i64) {
        self.term_started_unix_ms
            .store(crate::clock::wall_ms(), Ordering::Release);
        self.view_version.store(view_version, Ordering::Release);
        *self.leader.lock() = Some(self.advertise.clone());
        self.terms_won.fetch_add(1, Ordering::AcqRel);
        self.role.store(LEADER, Ordering::Release);
    }

    pub(crate) fn step_down(&self) {
        *self.term_store.lock() = None;
        self.serve_until_ms.store(0, Ordering::Release);
        self.role.store(STANDBY, Ordering::Release);
    }

    fn saw_leader(&self, leader: Option<String>, view_version: i64) {
        *self.leader.lock() = leader;
        if view_version > 0 {
            self.view_version.store(view_version, Ordering::Release);
        }
    }

    /// Stores `removals` in etcd under this term's lease; an answer that acknowledges them
    /// may go out only after this returned `Ok` (`service/removals.rs`). Fails when this
    /// master no longer leads or etcd does not answer in time.
    pub async fn store_removals(&self, removals: &[Removal]) -> Result<(), String> {
        let Some(s) = self.term_store.lock().clone() else {
            return Err("not the leader".into());
        };
        let mut client = s.client.clone();
        for r in removals {
            let bytes = r.encode();
            if bytes.len() > RECORD_BYTES_MAX {
                warn!(
                    "HA: a removal's record is {} bytes, over {RECORD_BYTES_MAX}: not stored; \
                     a failover before every owner pinged may bring some of its keys back",
                    bytes.len()
                );
                continue;
            }
            let put = TxnOp::put(r.etcd_key(&s.prefix), bytes, None);
            s.guarded(&mut client, "store removal", vec![put]).await?;
            // Pruning is housekeeping: the answer waiting for this record does not wait for
            // it. Inline, it cost a caller one etcd round trip per old record (up to 1.8 s for
            // the removes of 100 clients right after a failover, `failover_bench.py`).
            if s.prune.written.fetch_add(1, Ordering::AcqRel) % PRUNE_EVERY == PRUNE_EVERY - 1
                && !s.prune.running.swap(true, Ordering::AcqRel)
            {
                let (mut client, prefix, prune) =
                    (client.clone(), s.prefix.clone(), s.prune.clone());
                tokio::spawn(async move {
                    prune_removals(&mut client, &prefix).await;
                    prune.running.store(false, Ordering::Release);
                });
            }
        }
        Ok(())
    }

    /// Registers `owners` in etcd under this term's lease (`service/owners.rs`); the answers
    /// to their mounts may go out only after this returned `Ok`.
    pub async fn store_owners(&self, owners: &[Uuid]) -> Result<(), String> {
        self.change_owners("store owners", owners, |k| TxnOp::put(k, "", None))
            .await
    }

    /// Deletes `owners` from the registry (best effort: an entry left behind costs the next
    /// leader a wait of at most `client_ttl`, never a wrong answer).
    async fn forget_owners(&self, owners: &[Uuid]) -> Result<(), String> {
        self.change_owners("forget owners", owners, |k| TxnOp::delete(k, None))
            .await
    }

    async fn change_owners(
        &self,
        what: &str,
        owners: &[Uuid],
        op: impl Fn(String) -> TxnOp,
    ) -> Result<(), String> {
        let Some(s) = self.term_store.lock().clone() else {
            return Err("not the leader".into());
        };
        let mut client = s.client.clone();
        // etcd caps the operations of one transaction (128 by default).
        for chunk in owners.chunks(OPS_PER_TXN) {
            let ops = chunk
                .iter()
                .map(|c| op(format!("{}{c}", s.owners_prefix)))
                .collect();
            s.guarded(&mut client, what, ops).await?;
        }
        Ok(())
    }

    fn reachable(&self, yes: bool) {
        self.etcd_reachable.store(yes, Ordering::Release);
    }
}

async fn bounded<T>(
    what: &str,
    f: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    describe(what, tokio::time::timeout(ETCD_CALL_TIMEOUT, f).await)
}

/// The outcome of an etcd call bounded by [`ETCD_CALL_TIMEOUT`], its failure described for the
/// log (for a caller that must look at the error first, as [`bounded`] cannot).
fn describe<T>(
    what: &str,
    r: Result<Result<T, etcd_client::Error>, tokio::time::error::Elapsed>,
) -> Result<T, String> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("etcd {what}: {e}")),
        Err(_) => Err(format!(
            "etcd {what}: no answer within {ETCD_CALL_TIMEOUT:?}"
        )),
    }
}

/// How a term of leadership ended.
enum TermEnd {
    /// The lease expired or the key was taken: campaign again.
    Lost(String),
    /// Shutting down.
    Stopped,
}

/// Campaigns, leads and follows until `stop` completes. On stop, a leader revokes its lease so
/// that a standby takes over at once rather than after the TTL.
pub async fn run(
    cfg: HaConfig,
    state: Arc<HaState>,
    service: Arc<MasterService>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let key = master_view_key(&cfg.cluster_id);
    let ttl = Duration::from_secs(cfg.lease_ttl_s as u64);
    let mut logged_unreachable = false;
    loop {
        let options = ConnectOptions::new()
            .with_connect_timeout(ETCD_CALL_TIMEOUT)
            .with_timeout(ETCD_CALL_TIMEOUT);
        let connected = tokio::select! {
            _ = &mut stop => return,
            c = tokio::time::timeout(
                ETCD_CALL_TIMEOUT * 2,
                Client::connect(cfg.endpoints.clone(), Some(options)),
            ) => c,
        };
        let mut client = match connected {
            Ok(Ok(c)) => c,
            other => {
                state.reachable(false);
                if !logged_unreachable {
                    let why = match other {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".to_string(),
                    };
                    warn!(
                        "HA: cannot reach etcd at {:?}: {why}; retrying",
                        cfg.endpoints
                    );
                    logged_unreachable = true;
                }
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tokio::time::sleep(RETRY_PAUSE) => continue,
                }
            }
        };
        logged_unreachable = false;
        let end = tokio::select! {
            _ = &mut stop => TermEnd::Stopped,
            e = campaign_and_lead(&cfg, &key, ttl, &mut client, &state, &service) => e,
        };
        match end {
            TermEnd::Stopped => {
                if state.is_leader() {
                    state.step_down();
                    // Revoking the lease removes the key with it, and tells the standbys the
                    // old window is over (they find no live lease).
                    let lease = state.lease.swap(0, Ordering::AcqRel);
                    let _ = bounded("lease revoke", client.lease_revoke(lease)).await;
                    info!("HA: stepped down (shutting down); leader lease revoked");
                }
                return;
            }
            TermEnd::Lost(why) => {
                if state.is_leader() {
                    warn!("HA: leadership lost: {why}");
                }
                state.step_down();
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// One round: campaign; if elected, lead until the term ends; if not, wait for the key to
/// disappear. Returns why the round ended (never `Stopped`).
async fn campaign_and_lead(
    cfg: &HaConfig,
    key: &str,
    ttl: Duration,
    client: &mut Client,
    state: &HaState,
    service: &MasterService,
) -> TermEnd {
    let record_key = leader_lease_key(&cfg.cluster_id);
    loop {
        let record_rev = match wait_out_a_vacated_leader(client, key, &record_key, ttl).await {
            Ok(Some(r)) => r,
            // A leader holds the key: campaigning now could win the instant an operator
            // deletes it, beside that leader; wait as a standby and check again once it goes.
            Ok(None) => match standby_until_vacant(client, key, state).await {
                Ok(()) => continue,
                Err(e) => return TermEnd::Lost(e),
            },
            Err(e) => {
                state.reachable(false);
                return TermEnd::Lost(e);
            }
        };
        // Taken before the grant: etcd starts the lease's TTL after this instant.
        let sent = Instant::now();
        let lease = match bounded("lease grant", client.lease_grant(cfg.lease_ttl_s, None)).await {
            Ok(l) => l.id(),
            Err(e) => {
                state.reachable(false);
                return TermEnd::Lost(e);
            }
        };
        state.reachable(true);
        // Wins only if the key is vacant and no leader was elected since the check above (the
        // record is unchanged); records this leader's lease for the next candidates.
        let txn = Txn::new()
            .when([
                Compare::create_revision(key, CompareOp::Equal, 0),
                Compare::mod_revision(record_key.as_str(), CompareOp::Equal, record_rev),
            ])
            .and_then([
                TxnOp::put(
                    key,
                    cfg.advertise.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                ),
                TxnOp::put(record_key.as_str(), lease.to_string(), None),
            ])
            .or_else([TxnOp::get(key, None)]);
        let answer = match bounded("campaign", client.txn(txn)).await {
            Ok(a) => a,
            Err(e) => {
                let _ = bounded("lease revoke", client.lease_revoke(lease)).await;
                return TermEnd::Lost(e);
            }
        };
        // The predecessor's lease ended before this answer, its last proof soon after.
        let won_at = Instant::now();
        if answer.succeeded() {
            let term = answer.header().map_or(0, |h| h.revision());
            // Removals earlier leaders acknowledged: the owners' re-reports must not undo them.
            // And the owners they registered, whose late re-reports reads must wait for.
            let prefix = removals_prefix(&cfg.cluster_id);
            let owners_prefix = owners_prefix(&cfg.cluster_id);
            let (removals, owners) = match load_term(client, &prefix, &owners_prefix).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = bounded("lease revoke", client.lease_revoke(lease)).await;
                    return TermEnd::Lost(e);
                }
            };
            // Serve once a predecessor revoked alive (`standby_until_vacant`) has stopped.
            tokio::time::sleep_until((won_at + SERVE_WINDOW).into()).await;
            service.reset(term, &removals);
            service.await_owners(&owners);
            *state.term_store.lock() = Some(TermStore {
                client: client.clone(),
                lease,
                leader_key: key.to_string(),
                prefix,
                owners_prefix,
                prune: Arc::default(),
            });
            state.lease.store(lease, Ordering::Release);
            state.become_leader(term);
            state.prove(sent, ttl);
            info!(
                "HA: elected leader of cluster {} at {} (view_version {term}, {} removal \
                 records, {} registered owners to re-report)",
                cfg.cluster_id,
                cfg.advertise,
                removals.len(),
                owners.len()
            );
            return lead(client, key, lease, ttl, state, service).await;
        }
        // Lost the race: note who leads, give the lease back, wait for the key to go.
        let _ = bounded("lease revoke", client.lease_revoke(lease)).await;
        if let Some(etcd_client::TxnOpResponse::Get(g)) = answer.op_responses().into_iter().next() {
            if let Some(kv) = g.kvs().first() {
                let leader = kv.value_str().ok().map(str::to_string);
                state.saw_leader(leader, kv.create_revision());
            }
        }
        if let Err(e) = standby_until_vacant(client, key, state).await {
            return TermEnd::Lost(e);
        }
        // The key is gone: campaign (the loop's first step checks how it went).
    }
}

/// As a standby, polls the leader key (noting who leads) until it is vacant, and probes the
/// leader's RPC port at each poll. A leader whose port refuses [`PROBE_REFUSALS_DEAD_ITEMS`] probes
/// in a row (its process is gone) or answers none for [`PROBE_SILENCE_DEAD`] (its address
/// drops packets, as a deleted pod's does) is taken for dead: its lease is revoked, which
/// vacates the key, rather than waited out for the lease TTL. Taking a live leader for dead
/// (a partition between it and this standby) costs a needless election, never two leaders:
/// the revoked leader's keep-alives fail and its proofs last [`SERVE_WINDOW`] at most, which
/// every new leader waits out before serving (`campaign_and_lead`). Only a leader this
/// standby has reached before is probed to death, so a standby cut off from the leader alone
/// costs at most one such election, not one after another.
async fn standby_until_vacant(
    client: &mut Client,
    key: &str,
    state: &HaState,
) -> Result<(), String> {
    let mut probe = LeaderProbe::default();
    loop {
        tokio::time::sleep(STANDBY_POLL).await;
        let g = match bounded("get", client.get(key, None)).await {
            Ok(g) => g,
            Err(e) => {
                state.reachable(false);
                return Err(e);
            }
        };
        state.reachable(true);
        let Some(kv) = g.kvs().first() else {
            state.saw_leader(None, 0);
            return Ok(());
        };
        let leader = kv.value_str().ok().map(str::to_string);
        state.saw_leader(leader.clone(), kv.create_revision());
        let (Some(addr), lease) = (leader, kv.lease()) else {
            continue;
        };
        if let Some(why) = probe.dead(&addr, lease).await {
            warn!("HA: the leader at {addr} {why}; revoking its lease {lease:#x}");
            let _ = bounded("lease revoke", client.lease_revoke(lease)).await;
        }
    }
}

/// A standby's view of the leader's RPC port, one lease (term) at a time.
#[derive(Default)]
struct LeaderProbe {
    lease: i64,
    /// Whether a probe of this leader was ever answered. Only a leader this standby could
    /// reach is taken for dead when it stops answering: a standby that never reached it (a
    /// partition between the two, a firewall) would otherwise revoke every leader it is cut
    /// off from, one election after another.
    reached: bool,
    refusals: u32,
    /// Since when no probe was answered (`None`: the last one was).
    silent_since: Option<Instant>,
}

impl LeaderProbe {
    /// Probes `addr` (the leader of `lease`) once; why it is taken for dead, if it is.
    async fn dead(&mut self, addr: &str, lease: i64) -> Option<String> {
        if lease != self.lease {
            *self = LeaderProbe {
                lease,
                ..LeaderProbe::default()
            };
        }
        let started = Instant::now();
        let tried = tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await;
        match tried {
            Ok(Ok(_)) => {
                self.reached = true;
                self.refusals = 0;
                self.silent_since = None;
                return None;
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                self.refusals += 1;
            }
            _ => self.refusals = 0,
        }
        let silent = self.silent_since.get_or_insert(started).elapsed();
        if !self.reached {
            None
        } else if self.refusals >= PROBE_REFUSALS_DEAD_ITEMS {
            Some(format!("refused {} connections in a row", self.refusals))
        } else if silent >= PROBE_SILENCE_DEAD {
            Some(format!(
                "answered no connection for {} ms",
                silent.as_millis()
            ))
        } else {
            None
        }
    }
}

/// Before a campaign: when the leader key is vacant but the last leader's lease (its record at
/// `record_key`) still lives, the key was deleted by hand and that leader may still be serving
/// (it learns of the deletion only at its next check): end its lease and wait out a full
/// window. Normally the lease expired (the leader died or lost etcd) or was revoked (it shut
/// down), and its window has closed: no wait. Returns the record's revision (0: none), which
/// the campaign requires unchanged, or `None` while a leader holds the key: then the caller
/// must not campaign (the deletion could land between this check and its campaign, which
/// would then win beside that leader without waiting; `ha_failover.rs`,
/// `a_leader_whose_key_is_deleted_steps_down` failed that way in CI). Checked by every
/// candidate, not only by a standby that saw the key go: a master whose first campaign comes
/// just after the deletion would otherwise win at once and serve beside the old leader.
async fn wait_out_a_vacated_leader(
    client: &mut Client,
    key: &str,
    record_key: &str,
    ttl: Duration,
) -> Result<Option<i64>, String> {
    // The record first, then the key: a leader elected between the two reads holds the key
    // by the second, so the lease examined below is never a newer leader's.
    let record = bounded("get", client.get(record_key, None)).await?;
    let (rev, lease) = record.kvs().first().map_or((0, 0), |kv| {
        let lease: i64 = kv
            .value_str()
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        (kv.mod_revision(), lease)
    });
    let held = bounded("get", client.get(key, None)).await?;
    if !held.kvs().is_empty() {
        return Ok(None);
    }
    if lease == 0 {
        return Ok(Some(rev));
    }
    let left = bounded("lease ttl", client.lease_time_to_live(lease, None)).await;
    if left.is_ok_and(|t| t.ttl() > 0) {
        warn!(
            "HA: the leader key vanished while its lease lives; revoking the lease and waiting \
             {ttl:?} before campaigning"
        );
        let _ = bounded("lease revoke", client.lease_revoke(lease)).await;
        tokio::time::sleep(ttl).await;
    }
    Ok(Some(rev))
}

/// What a new term starts from: the removal records and the owners' registry.
async fn load_term(
    client: &mut Client,
    removals: &str,
    owners: &str,
) -> Result<(Vec<Removal>, Vec<Uuid>), String> {
    let r = load_removals(client, removals).await?;
    Ok((r, load_owners(client, owners).await?))
}

/// Reads the cluster's removal records, oldest first, pruning those beyond
/// `REMOVALS_KEPT`. A record that does not decode is logged and skipped.
async fn load_removals(client: &mut Client, prefix: &str) -> Result<Vec<Removal>, String> {
    let answer = bounded(
        "load removals",
        client.get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Key, SortOrder::Ascend),
            ),
        ),
    )
    .await?;
    let mut out = Vec::new();
    for kv in answer.kvs() {
        match Removal::decode(kv.value()) {
            Ok(r) => out.push(r),
            Err(e) => warn!(
                "HA: skipping the removal record {:?}: {e}",
                String::from_utf8_lossy(kv.key())
            ),
        }
    }
    if answer.kvs().len() > REMOVALS_KEPT {
        prune_removals(client, prefix).await;
    }
    let skip = out.len().saturating_sub(REMOVALS_KEPT);
    out.drain(..skip);
    Ok(out)
}

/// The owners' registry (`service/owners.rs`); a key that does not name a client id is
/// skipped with a warning.
async fn load_owners(client: &mut Client, prefix: &str) -> Result<Vec<Uuid>, String> {
    let answer = bounded(
        "load owners",
        client.get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ),
    )
    .await?;
    let mut out = Vec::new();
    for kv in answer.kvs() {
        let key = String::from_utf8_lossy(kv.key());
        match key.strip_prefix(prefix).map(str::parse::<Uuid>) {
            Some(Ok(id)) => out.push(id),
            _ => warn!("HA: skipping the owner record {key:?}: not a client id"),
        }
    }
    Ok(out)
}

/// Deletes the removal records beyond the newest `REMOVALS_KEPT` (best effort: a failure
/// leaves them for the next prune).
async fn prune_removals(client: &mut Client, prefix: &str) {
    let keys = bounded(
        "list removals",
        client.get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_sort(SortTarget::Key, SortOrder::Ascend),
            ),
        ),
    )
    .await;
    let Ok(keys) = keys else { return };
    let old = keys.kvs().len().saturating_sub(REMOVALS_KEPT);
    for chunk in keys.kvs()[..old].chunks(OPS_PER_TXN) {
        let deletes: Vec<TxnOp> = chunk
            .iter()
            .map(|kv| TxnOp::delete(kv.key(), None))
            .collect();
        let _ = bounded("prune removals", client.txn(Txn::new().and_then(deletes))).await;
    }
}

/// Keeps the lease alive every TTL/4 and extends the serving window with each answer. Ends
/// when etcd says the lease is gone: a keep-alive answered with TTL 0, or a new keep-alive
/// stream refused because the lease is not found (what a master cut off from etcd for longer
/// than its TTL hears once the link is back).
async fn lead(
    client: &mut Client,
    key: &str,
    lease: i64,
    ttl: Duration,
    state: &HaState,
    service: &MasterService,
) -> TermEnd {
    let every = (ttl / 4).min(KEEPALIVE_EVERY);
    let mut stream = None;
    // One warning per outage, not one per retry.
    let mut warned = false;
    loop {
        if stream.is_none() {
            let opened =
                tokio::time::timeout(ETCD_CALL_TIMEOUT, client.lease_keep_alive(lease)).await;
            // etcd-client refuses to open the stream for a lease etcd answers with TTL 0.
            if let Ok(Err(etcd_client::Error::LeaseKeepAliveError(why))) = &opened {
                if why == "lease not found" {
                    return TermEnd::Lost("etcd says the lease expired".into());
                }
            }
            match describe("lease keep-alive", opened) {
                Ok(s) => stream = Some(s),
                Err(e) => {
                    state.reachable(false);
                    if !warned {
                        warn!("HA: {e}; serving only while the last proof lasts, then not until etcd answers");
                        warned = true;
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                    continue;
                }
            }
        }
        let (keeper, answers) = stream.as_mut().expect("set above");
        let sent = Instant::now();
        let exchange = async {
            keeper.keep_alive().await?;
            answers.message().await
        };
        match tokio::time::timeout(ETCD_CALL_TIMEOUT, exchange).await {
            Ok(Ok(Some(a))) if a.ttl() > 0 => {
                state.reachable(true);
                warned = false;
                let granted = Duration::from_secs(a.ttl() as u64);
                // The key must still be ours: someone deleting it by hand would let a standby
                // win while our lease lives. Checked every round, so that window is at most
                // one round plus a standby poll.
                match bounded("get", client.get(key, None)).await {
                    Ok(g) if g.kvs().first().is_some_and(|kv| kv.lease() == lease) => {}
                    Ok(_) => {
                        state.step_down();
                        let _ = bounded("lease revoke", client.lease_revoke(lease)).await;
                        return TermEnd::Lost("the leader key no longer names this master".into());
                    }
                    Err(_) => {
                        tokio::time::sleep(RETRY_PAUSE).await;
                        continue; // unproven: the window closes on its own
                    }
                }
                let gone = service.take_gone_owners();
                if !gone.is_empty() {
                    if let Err(e) = state.forget_owners(&gone).await {
                        warn!(
                            "HA: could not delete {} owner(s) from the registry: {e}",
                            gone.len()
                        );
                    }
                }
                if state.prove(sent, granted) {
                    // Pings were refused while the proof had lapsed: do not expire their
                    // senders for that.
                    service.touch_all_clients();
                    info!("HA: lease proven; serving");
                }
            }
            Ok(Ok(Some(_))) => return TermEnd::Lost("etcd says the lease expired".into()),
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                state.reachable(false);
                stream = None; // rebuild the keep-alive stream on the next round
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_take_upstream_forms() {
        assert_eq!(
            parse_endpoints("etcd://127.0.0.1:2379;10.0.0.2:2381").unwrap(),
            ["http://127.0.0.1:2379", "http://10.0.0.2:2381"]
        );
        assert_eq!(
            parse_endpoints("http://a:1, b").unwrap(),
            ["http://a:1", "http://b:2379"]
        );
        assert!(parse_endpoints("etcd://").is_err());
        assert!(parse_endpoints("https://a:1").is_err());
        assert!(parse_endpoints("a:1/x").is_err());
    }

    #[test]
    fn serving_needs_leadership_and_a_proven_lease() {
        let s = HaState::new("h:1".into());
        assert!(!s.may_serve());
        s.become_leader(7);
        assert!(!s.may_serve(), "elected but no lease proven yet");
        assert!(s.prove(Instant::now(), Duration::from_secs(2)));
        assert!(s.may_serve());
        assert!(!s.prove(Instant::now(), Duration::from_secs(2)), "no gap");
        // A proof older than its TTL proves nothing.
        s.prove(
            Instant::now() - Duration::from_secs(5),
            Duration::from_secs(2),
        );
        assert!(!s.may_serve());
        s.prove(Instant::now(), Duration::from_secs(2));
        s.step_down();
        assert!(!s.may_serve());
        let st = s.status();
        assert_eq!((st.role, st.view_version, st.terms_won), ("standby", 7, 1));
    }

    #[test]
    fn key_layout_is_upstreams() {
        assert_eq!(
            master_view_key("mooncake_cluster"),
            "mooncake-store/mooncake_cluster/master_view"
        );
    }
}
