//! A blocking, pipelined client of the master's control RPC.
//!
//! One TCP connection per `MasterClient`. Callers from any thread encode their requests into
//! frames with fresh request ids and write them under a write lock. There is no reader thread:
//! a waiting caller that finds the socket's read side free becomes the *leader*, reads answers
//! itself and hands each to the caller waiting for its id; the others (*followers*) sleep until
//! their answers arrive or the leader, done with its own, wakes one of them to take over. A
//! lone caller therefore wakes up straight from the socket, one context switch fewer per call
//! than with a reader thread (measured: the switch was a third of `is_exist`'s cost). N threads,
//! or one thread with a batch of N requests ([`MasterClient::call_many`]), still keep N
//! requests in flight on one connection.
//!
//! Invariants: every request id is registered in `pending` before its frame is written, and
//! removed exactly once (by the leader on an answer, or by the caller on timeout or when the
//! connection dies). At most one thread reads the socket at a time (the `reader` lock). A
//! follower never sleeps longer than [`FOLLOWER_RECHECK`] without re-checking whether the read
//! side is free, so a lost hand-over costs at most that. A broken connection fails every
//! pending call with `Closed` and is replaced by a new one on the next call.
//!
//! Following an HA leader (`docs/ha.md`): with `etcd://h1:p1;h2:p2` as the address, the client
//! reads the leader's RPC address from etcd's key `mooncake-store/<cluster_id>/master_view`
//! (cluster from `MC_STORE_CLUSTER_ID`, default `mooncake_cluster`) through etcd's JSON
//! gateway each time it (re)connects, waiting up to the call timeout for a leader to appear.
//! A call whose connection dies is sent once more after looking the leader up again; the
//! second answer is final. A call waiting longer than [`LEADER_WATCH`] checks etcd every as
//! long: when the leader it was sent to no longer leads, its connection is taken for dead
//! (a dead host's address may drop packets rather than reset the connection). A call a master answers with `UNAVAILABLE_IN_CURRENT_STATUS` (a
//! standby, a leader that cannot prove its lease, or a new leader's recovery fence while the
//! owners re-report, `docs/ha.md`) was not executed: it is sent again, to the leader looked up
//! again, every [`UNAVAILABLE_RETRY`] until the call timeout, or until no leader can be
//! looked up (etcd down), when the last answer is returned. A put's commit or revoke is
//! settled instead ([`MasterClient::call_settling`]): retried for up to [`SETTLE_WINDOW`].
//! Leaving a connection that way never fails the calls other threads have in flight on it:
//! they get their own answers there, so that no request is sent again while its first copy
//! may still be executed (the master answers a put's start sent again by its writer with the
//! same allocation all the same).

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dataplane::metadata::etcd::{parse_endpoints, EtcdStore};
use dataplane::metadata::MetadataStore;
use dataplane::sys::connect_first;
use parking_lot::{Condvar, Mutex};
use protocol::frame::{self, Kind, HEADER_BYTES};
use protocol::message::Rpc;
use protocol::wire::{DecodeError, Wire};
use protocol::ErrorCode;

use crate::limits::{
    DEFAULT_CONNECT_TIMEOUT, DEFAULT_RPC_TIMEOUT, ETCD_DOWN_GIVE_UP, FOLLOWER_RECHECK,
    LEADER_CONNECT_TIMEOUT, LEADER_EPOCH_CHECK, LEADER_POLL, LEADER_WATCH, LEAD_READ_SLICE,
    READ_CHUNK_BYTES, SETTLE_RETRY, SETTLE_WINDOW, UNAVAILABLE_RETRY,
};
/// The cluster of a store when `MC_STORE_CLUSTER_ID` is unset (upstream's default).
pub use protocol::DEFAULT_CLUSTER_ID;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to master {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connection to master lost: {0}")]
    Closed(String),
    #[error("master did not answer within {0:?}")]
    Timeout(Duration),
    #[error("malformed answer from master: {0}")]
    Decode(#[from] DecodeError),
    #[error("request too large to send")]
    TooLarge,
}

impl ClientError {
    /// The store error code a Python caller sees for this failure.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Timeout(_) => ErrorCode::RpcTimeout,
            ClientError::TooLarge => ErrorCode::InvalidParams,
            _ => ErrorCode::RpcFail,
        }
    }
}

/// Where one call's answers go.
struct Waiter {
    slots: Mutex<WaiterSlots>,
    ready: Condvar,
}

struct WaiterSlots {
    answers: Vec<Option<Vec<u8>>>,
    missing: usize,
    failed: Option<String>,
    /// Set by a leader stepping down: the read side is free, try to lead.
    lead: bool,
}

/// The read side of the connection, owned by the current leader.
struct ReadSide {
    sock: TcpStream,
    buf: Vec<u8>,
    chunk: Vec<u8>,
}

struct Conn {
    writer: Mutex<TcpStream>,
    reader: Mutex<ReadSide>,
    pending: Mutex<HashMap<u64, (Arc<Waiter>, usize)>>,
    dead: AtomicBool,
    /// The leader's address as etcd named it when this connection was opened (`None` for a
    /// fixed master).
    leader: Option<String>,
}

impl Conn {
    /// Wakes one caller other than `me` that still waits for answers, so that it takes over
    /// reading.
    fn hand_over(&self, me: &Arc<Waiter>) {
        let next = self
            .pending
            .lock()
            .values()
            .find(|(w, _)| !Arc::ptr_eq(w, me))
            .map(|(w, _)| w.clone());
        if let Some(w) = next {
            w.slots.lock().lead = true;
            w.ready.notify_all();
        }
    }

    fn fail_all(&self, why: &str) {
        self.dead.store(true, Ordering::SeqCst);
        let pending: Vec<_> = self.pending.lock().drain().map(|(_, v)| v).collect();
        for (w, _) in pending {
            let mut s = w.slots.lock();
            s.failed.get_or_insert_with(|| why.to_string());
            w.ready.notify_all();
        }
    }
}

/// Where the master is.
enum Target {
    /// A fixed address (`host:port`).
    Fixed(Vec<SocketAddr>),
    /// Whoever leads the cluster, as published in etcd under `key`.
    Leader { etcd: EtcdStore, key: String },
}

/// A thread-safe client of one master, or of the HA leader of a cluster.
pub struct MasterClient {
    target: Target,
    addr_text: String,
    conn: Mutex<Option<Arc<Conn>>>,
    /// Following a leader: bumped each time a connection goes to another leader than the
    /// last one ([`Self::leader_epoch`]).
    leader_epoch: AtomicU64,
    last_leader: Mutex<Option<String>>,
    next_id: AtomicU64,
    timeout: Duration,
    connect_timeout: Duration,
}

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(Duration::from_millis)
}

impl MasterClient {
    /// A client of the master at `addr` (`host:port`), or of the HA leader found through
    /// etcd (`etcd://h1:p1;h2:p2`, cluster from `MC_STORE_CLUSTER_ID`). Connects lazily on
    /// the first call, and again after a connection is lost.
    pub fn new(addr: &str) -> Result<MasterClient, ClientError> {
        let cluster = std::env::var("MC_STORE_CLUSTER_ID")
            .ok()
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_string());
        Self::new_in_cluster(addr, &cluster)
    }

    /// Like [`Self::new`], following the leader of `cluster_id` for an `etcd://` address.
    pub fn new_in_cluster(addr: &str, cluster_id: &str) -> Result<MasterClient, ClientError> {
        let bad = |why: String| ClientError::Connect {
            addr: addr.to_string(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, why),
        };
        let target = if let Some(list) = addr.trim().strip_prefix("etcd://") {
            let endpoints = parse_endpoints(list).map_err(|e| bad(e.to_string()))?;
            Target::Leader {
                etcd: EtcdStore::new(endpoints),
                key: format!("mooncake-store/{cluster_id}/master_view"),
            }
        } else {
            let addrs: Vec<SocketAddr> = addr
                .to_socket_addrs()
                .map_err(|e| ClientError::Connect {
                    addr: addr.to_string(),
                    source: e,
                })?
                .collect();
            Target::Fixed(addrs)
        };
        Ok(MasterClient {
            target,
            addr_text: addr.to_string(),
            conn: Mutex::new(None),
            leader_epoch: AtomicU64::new(0),
            last_leader: Mutex::new(None),
            next_id: AtomicU64::new(1),
            timeout: env_ms("MC_RPC_TIMEOUT_MS").unwrap_or(DEFAULT_RPC_TIMEOUT),
            connect_timeout: env_ms("MC_RPC_CONNECT_TIMEOUT_MS").unwrap_or(DEFAULT_CONNECT_TIMEOUT),
        })
    }

    /// The address this client was made with (`host:port`, or `etcd://...` for a leader).
    pub fn addr(&self) -> &str {
        &self.addr_text
    }

    /// Connects now, so that a bad address is reported at set-up rather than on first use.
    pub fn connect(&self) -> Result<(), ClientError> {
        self.connection().map(|_| ())
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many times this client moved to another leader. An owner's pinger pings at once
    /// when it changes, so that a new leader hears of its segments (and re-mounts them) without
    /// waiting out the ping interval.
    pub fn leader_epoch(&self) -> u64 {
        self.leader_epoch.load(Ordering::Acquire)
    }

    /// Waits `interval`, or less: until this client's calls moved to another leader than at
    /// `epoch` ([`Self::leader_epoch`]), or `stop` is set. An owner's pinger waits here between
    /// pings, so that a new leader, which serves only once its owners re-mounted, hears of
    /// them at once.
    pub fn wait_unless_moved(&self, epoch: u64, interval: Duration, stop: &AtomicBool) {
        let until = Instant::now() + interval;
        while Instant::now() < until && self.leader_epoch() == epoch && !stop.load(Ordering::SeqCst)
        {
            std::thread::park_timeout(LEADER_EPOCH_CHECK);
        }
    }

    /// Whether this client follows an HA leader through etcd.
    pub fn follows_leader(&self) -> bool {
        matches!(self.target, Target::Leader { .. })
    }

    fn connection(&self) -> Result<Arc<Conn>, ClientError> {
        let mut guard = self.conn.lock();
        if let Some(c) = guard.as_ref() {
            if !c.dead.load(Ordering::SeqCst) {
                return Ok(c.clone());
            }
        }
        let addrs = match &self.target {
            Target::Fixed(addrs) => addrs,
            Target::Leader { etcd, key } => {
                let conn = self.connect_to_leader(etcd, key)?;
                *guard = Some(conn.clone());
                return Ok(conn);
            }
        };
        let conn = self
            .open(addrs.iter().copied(), self.connect_timeout)
            .map_err(|e| ClientError::Connect {
                addr: self.addr_text.clone(),
                source: e,
            })?;
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// Connects to the first of `addrs` that answers, proves the cluster secret (when one is
    /// set) and starts the connection's read side.
    fn open(
        &self,
        addrs: impl IntoIterator<Item = SocketAddr>,
        timeout: Duration,
    ) -> std::io::Result<Arc<Conn>> {
        let stream = connect_first(addrs, timeout)?;
        crate::auth::handshake(&stream, self.connect_timeout)?;
        open_conn(stream, None)
    }

    /// Looks the leader up in etcd and connects to it, polling until one answers or the call
    /// timeout passes.
    fn connect_to_leader(&self, etcd: &EtcdStore, key: &str) -> Result<Arc<Conn>, ClientError> {
        let deadline = Instant::now() + self.timeout;
        // etcd itself failing for this long ends the wait: no leader can be elected meanwhile.
        let mut etcd_failing_since: Option<Instant> = None;
        let mut why;
        loop {
            let looked_up = etcd.get(key);
            if let Err(e) = &looked_up {
                let since = *etcd_failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= ETCD_DOWN_GIVE_UP {
                    why = format!("etcd: {e}");
                    break;
                }
            } else {
                etcd_failing_since = None;
            }
            why = match looked_up {
                Ok(Some(value)) => {
                    let leader = String::from_utf8_lossy(&value).trim().to_string();
                    match leader.to_socket_addrs().map(|mut a| a.next()) {
                        Ok(Some(a)) => {
                            let timeout = self.connect_timeout.min(LEADER_CONNECT_TIMEOUT);
                            match connect_first([a], timeout) {
                                Ok(stream) => {
                                    return crate::auth::handshake(&stream, self.connect_timeout)
                                        .and_then(|()| open_conn(stream, Some(leader.clone())))
                                        .inspect(|_| self.note_leader(&leader))
                                        .map_err(|e| ClientError::Connect {
                                            addr: leader.clone(),
                                            source: e,
                                        });
                                }
                                Err(e) => format!("leader {leader} does not answer: {e}"),
                            }
                        }
                        _ => format!("etcd names an unusable leader address {leader:?}"),
                    }
                }
                Ok(None) => format!("no leader published at {key}"),
                Err(e) => format!("etcd: {e}"),
            };
            if Instant::now() + LEADER_POLL >= deadline {
                break;
            }
            std::thread::sleep(LEADER_POLL);
        }
        Err(ClientError::Connect {
            addr: self.addr_text.clone(),
            source: std::io::Error::new(std::io::ErrorKind::NotConnected, why),
        })
    }

    fn note_leader(&self, leader: &str) {
        let mut last = self.last_leader.lock();
        if last.as_deref() != Some(leader) {
            if last.is_some() {
                self.leader_epoch.fetch_add(1, Ordering::AcqRel);
            }
            *last = Some(leader.to_string());
        }
    }

    /// Why `conn` no longer reaches the leader, when etcd names another one or none (the
    /// lease `conn`'s master was elected under has ended, so it executes nothing sent now):
    /// a call waiting on it is then sent again to the new leader rather than left to its
    /// timeout, which a leader whose address went silent would otherwise cost (a dead host
    /// answers no packet, so no reset ends the connection). `None` while etcd cannot say.
    fn leader_moved(&self, conn: &Conn) -> Option<String> {
        let (Target::Leader { etcd, key }, Some(was)) = (&self.target, &conn.leader) else {
            return None;
        };
        match etcd.get(key) {
            Ok(Some(v)) if String::from_utf8_lossy(&v).trim() == was.as_str() => None,
            Ok(Some(v)) => Some(format!(
                "the leader moved from {was} to {}",
                String::from_utf8_lossy(&v).trim()
            )),
            Ok(None) => Some(format!("the leader at {was} lost its lease")),
            Err(_) => None,
        }
    }

    /// Stops using the current connection (if it is still `conn`), so the next call
    /// reconnects. Calls other threads have in flight on it are left to their answers, and the
    /// connection closes with the last of them: failing them would send each again on the new
    /// connection while the master may still execute the first copy, still in its socket, after
    /// the second. A start executed twice out of order moved a put to buffers its writer never
    /// heard of (violation 2, `docs/reliability.md`); a commit executed late could complete
    /// the next put of the key before its bytes.
    fn forget(&self, conn: &Arc<Conn>) {
        let mut guard = self.conn.lock();
        if guard.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *guard = None;
        }
    }

    /// One call: sends `req` and waits for its answer.
    pub fn call<R: Rpc>(&self, req: &R) -> Result<Result<R::Reply, ErrorCode>, ClientError> {
        let mut out = self.call_many(std::slice::from_ref(req))?;
        Ok(out.pop().expect("call_many returns one answer per request"))
    }

    /// [`Self::call`] for a request that settles a write whose bytes are already placed (the
    /// commit or revoke of a put or upsert). Until it is settled the object stays in flight at
    /// the master, unreadable, until `put_start_discard_timeout_sec` (30 s by default), so
    /// giving up at the first "not now" would turn an etcd outage of a few seconds into a key
    /// that cannot be read for half a minute. It is sent again, every [`SETTLE_RETRY`], for up
    /// to [`SETTLE_WINDOW`], while the answer says it was not executed: the master answered
    /// `UNAVAILABLE_IN_CURRENT_STATUS`, or no master could be reached to send it to. A lost
    /// connection (it may have been executed) or any other answer is final. Only a client
    /// following an HA leader waits; a fixed master that cannot be reached is gone with its
    /// in-flight puts.
    pub fn call_settling<R: Rpc>(
        &self,
        req: &R,
    ) -> Result<Result<R::Reply, ErrorCode>, ClientError> {
        let started = Instant::now();
        loop {
            let answer = self.call(req);
            if !self.follows_leader() {
                return answer;
            }
            let not_executed = matches!(
                &answer,
                Ok(Err(ErrorCode::UnavailableInCurrentStatus)) | Err(ClientError::Connect { .. })
            );
            if !not_executed || started.elapsed() + SETTLE_RETRY >= SETTLE_WINDOW {
                return answer;
            }
            std::thread::sleep(SETTLE_RETRY);
        }
    }

    /// Sends every request in one write and waits for all answers (pipelining). Following a
    /// leader, a call that lost its connection or reached a master that may not serve is sent
    /// once more to the leader looked up again.
    pub fn call_many<R: Rpc>(
        &self,
        reqs: &[R],
    ) -> Result<Vec<Result<R::Reply, ErrorCode>>, ClientError> {
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        let conn = self.connection()?;
        let first = self.call_many_on(&conn, reqs);
        if !self.follows_leader() {
            return first;
        }
        let again = match &first {
            Err(ClientError::Closed(_)) => true,
            Ok(answers) => unavailable(answers),
            Err(_) => false,
        };
        if !again {
            return first;
        }
        let started = Instant::now();
        let mut conn = conn;
        let mut last = first;
        loop {
            self.forget(&conn);
            conn = match self.connection() {
                Ok(c) => c,
                // No leader to be found (etcd down, or none elected in time): the last answer
                // (a retryable code, or the lost connection) says more than "cannot connect".
                Err(_) => return last,
            };
            let next = self.call_many_on(&conn, reqs);
            // A leader that answers "not now" (its recovery fence after an election, or a
            // lease it cannot prove) is asked again until the call timeout: the request was
            // not executed. A second lost connection is final.
            let retry = matches!(&next, Ok(a) if unavailable(a));
            if !retry || started.elapsed() + UNAVAILABLE_RETRY >= self.timeout {
                return next;
            }
            std::thread::sleep(UNAVAILABLE_RETRY);
            last = next;
        }
    }

    fn call_many_on<R: Rpc>(
        &self,
        conn: &Arc<Conn>,
        reqs: &[R],
    ) -> Result<Vec<Result<R::Reply, ErrorCode>>, ClientError> {
        let waiter = Waiter::new(reqs.len());
        let first_id = self.next_id.fetch_add(reqs.len() as u64, Ordering::Relaxed);
        let buf = encode_requests(reqs, first_id)?;
        {
            let mut p = conn.pending.lock();
            for i in 0..reqs.len() {
                p.insert(first_id + i as u64, (waiter.clone(), i));
            }
        }
        let write_result = conn.writer.lock().write_all(&buf);
        if let Err(e) = write_result {
            conn.fail_all(&format!("write failed: {e}"));
        }
        let deadline = Instant::now() + self.timeout;
        let mut watch = Instant::now() + LEADER_WATCH;
        let mut slots = waiter.slots.lock();
        while slots.missing > 0 && slots.failed.is_none() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            slots.lead = false;
            drop(slots);
            if now >= watch {
                watch = now + LEADER_WATCH;
                if let Some(why) = self.leader_moved(conn) {
                    conn.fail_all(&why);
                }
            }
            if let Some(mut side) = conn.reader.try_lock() {
                lead(conn, &mut side, &waiter, deadline.min(watch));
                drop(side);
                conn.hand_over(&waiter);
                slots = waiter.slots.lock();
                continue;
            }
            slots = waiter.slots.lock();
            if slots.missing == 0 || slots.failed.is_some() || slots.lead {
                continue;
            }
            let wake = deadline.min(Instant::now() + FOLLOWER_RECHECK);
            waiter.ready.wait_until(&mut slots, wake);
        }
        if slots.missing > 0 {
            // Unregister what is still pending so a late answer is dropped by the leader.
            let mut p = conn.pending.lock();
            for i in 0..reqs.len() {
                p.remove(&(first_id + i as u64));
            }
            if let Some(why) = slots.failed.take() {
                return Err(ClientError::Closed(why));
            }
            return Err(ClientError::Timeout(self.timeout));
        }
        let answers = std::mem::take(&mut slots.answers);
        drop(slots);
        answers
            .into_iter()
            .map(|a| {
                let body = a.expect("missing == 0 means every slot is filled");
                Result::<R::Reply, ErrorCode>::from_bytes(&body).map_err(ClientError::from)
            })
            .collect()
    }
}

impl Drop for MasterClient {
    fn drop(&mut self) {
        if let Some(c) = self.conn.lock().take() {
            let _ = c.writer.lock().shutdown(std::net::Shutdown::Both);
        }
    }
}

impl Waiter {
    fn new(n: usize) -> Arc<Waiter> {
        Arc::new(Waiter {
            slots: Mutex::new(WaiterSlots {
                answers: vec![None; n],
                missing: n,
                failed: None,
                lead: false,
            }),
            ready: Condvar::new(),
        })
    }
}

/// `reqs` framed back to back, with ids from `first_id` on.
fn encode_requests<R: Rpc>(reqs: &[R], first_id: u64) -> Result<Vec<u8>, ClientError> {
    let mut buf = Vec::with_capacity(reqs.len() * 64);
    for (i, r) in reqs.iter().enumerate() {
        frame::encode_with(&mut buf, Kind::Request, R::OP, first_id + i as u64, |b| {
            r.encode(b)
        })
        .map_err(|_| ClientError::TooLarge)?;
    }
    Ok(buf)
}

fn open_conn(stream: TcpStream, leader: Option<String>) -> std::io::Result<Arc<Conn>> {
    stream.set_nodelay(true)?;
    let reader = stream.try_clone()?;
    reader.set_read_timeout(Some(LEAD_READ_SLICE))?;
    Ok(Arc::new(Conn {
        writer: Mutex::new(stream),
        reader: Mutex::new(ReadSide {
            sock: reader,
            buf: Vec::with_capacity(READ_CHUNK_BYTES),
            chunk: vec![0u8; READ_CHUNK_BYTES],
        }),
        pending: Mutex::new(HashMap::new()),
        dead: AtomicBool::new(false),
        leader,
    }))
}

/// Reads and delivers answers until `me` has all of its answers, the deadline passes, or the
/// connection fails (then every pending call fails).
fn lead(conn: &Conn, side: &mut ReadSide, me: &Waiter, deadline: Instant) {
    loop {
        {
            let s = me.slots.lock();
            if s.missing == 0 || s.failed.is_some() {
                return;
            }
        }
        if conn.dead.load(Ordering::SeqCst) {
            return;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        // The socket's read timeout is `LEAD_READ_SLICE` (set once at connect, saving a
        // syscall per call): a blocked leader re-checks its deadline at least that often.
        let n = match read_spinning(&mut side.sock, &mut side.chunk) {
            Ok(0) => return conn.fail_all("master closed the connection"),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return conn.fail_all(&format!("read failed: {e}")),
        };
        let ReadSide { buf, chunk, .. } = side;
        buf.extend_from_slice(&chunk[..n]);
        if let Err(why) = deliver_frames(conn, buf) {
            return conn.fail_all(&why);
        }
    }
}

/// How long a caller waiting for the master polls the socket before sleeping in `read`
/// (`MC_RPC_BUSY_POLL_US`, default 50 µs; 0 turns it off). The master usually answers within
/// that, and a sleeping caller pays a wake-up per call (20-40 µs on these VMs).
fn busy_poll() -> Duration {
    static BUDGET: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| protocol::env::micros("MC_RPC_BUSY_POLL_US", 50))
}

/// `read`, after polling the socket with `MSG_DONTWAIT` for up to [`busy_poll`].
fn read_spinning(sock: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let mut dst = dataplane::mem::Dst::from(buf);
    dataplane::sys::recv_spinning(sock.as_raw_fd(), &mut dst, 0, busy_poll())
}

/// Delivers every complete frame at the start of `buf` and drops it from `buf`.
fn deliver_frames(conn: &Conn, buf: &mut Vec<u8>) -> Result<(), String> {
    let mut used = 0;
    loop {
        match frame::split_frame(&buf[used..]) {
            Ok(Some((f, len))) => {
                if f.header.kind != Kind::Response {
                    return Err("master sent a request frame".into());
                }
                deliver(conn, f.header.request_id, f.body);
                used += len;
            }
            Ok(None) => break,
            Err(e) => return Err(format!("bad frame from master: {e}")),
        }
    }
    buf.drain(..used);
    if buf.capacity() > 4 * READ_CHUNK_BYTES && buf.len() < HEADER_BYTES {
        buf.shrink_to(READ_CHUNK_BYTES);
    }
    Ok(())
}

fn deliver(conn: &Conn, id: u64, body: &[u8]) {
    let Some((w, i)) = conn.pending.lock().remove(&id) else {
        return; // the caller gave up (timeout); drop the late answer
    };
    let mut s = w.slots.lock();
    if s.answers[i].is_none() {
        s.answers[i] = Some(body.to_vec());
        s.missing -= 1;
        if s.missing == 0 {
            w.ready.notify_all();
        }
    }
}

/// Whether a master answered "not now" (`UNAVAILABLE_IN_CURRENT_STATUS`) to any request.
fn unavailable<T>(answers: &[Result<T, ErrorCode>]) -> bool {
    answers
        .iter()
        .any(|a| matches!(a, Err(ErrorCode::UnavailableInCurrentStatus)))
}
