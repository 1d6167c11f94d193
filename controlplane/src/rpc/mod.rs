//! The control-RPC server: frames from `protocol::frame` over TCP, answered by the service.
//!
//! One tokio task per connection. Each read may bring many frames (clients pipeline); the
//! task decodes every complete frame in the buffer, runs them through the service in order
//! and writes all answers with one write. So a connection's answers come back in request order,
//! and the cost of a syscall is shared by every request that arrived with it.
//!
//! A frame with a bad header (length, version, kind) closes the connection: the byte stream
//! can no longer be trusted to be in step. So does a frame left half-sent past its deadline
//! ([`frame_timeout`]: at least `RPC_FRAME_TIMEOUT_MIN`, longer by the length its header
//! promises, counted from when the master first waits for its rest), so a peer cannot hold a
//! frame's buffer with a trickle. A connection silent between frames is never closed:
//! clients keep idle connections to the master. A well-framed request whose body does not decode
//! gets an `INVALID_PARAMS` answer and the connection stays open.
//!
//! In HA mode a master that may not serve (a standby, or a leader that cannot prove its etcd
//! lease, see [`crate::ha`]) answers every request with `UNAVAILABLE_IN_CURRENT_STATUS`
//! without looking at it; the check is one atomic load and a clock read per socket read.
//!
//! With a cluster secret ([`protocol::auth`]) a connection starts with the handshake: the
//! first 16 bytes are either the start of a HELLO (magic `MCAU`) or a frame header. A peer
//! that sends a request first gets one answer to it, `ILLEGAL_CLIENT`, and the connection is
//! closed; a peer that fails the handshake gets REFUSE and is closed; a peer silent for
//! [`HANDSHAKE_TIMEOUT`] is closed. Only after the handshake are frames read, so an
//! unauthenticated peer never reaches the service and holds at most 32 bytes of buffer.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::auth::{self, ServerHandshake, ServerStep, Token};
use protocol::frame::{self, Kind};
use protocol::limits::FRAME_PAYLOAD_MAX_BYTES;
use protocol::wire::Wire;
use protocol::{ErrorCode, Uuid};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use crate::ha::HaState;
use crate::limits::{RPC_FRAME_MIN_BYTES_PER_S, RPC_FRAME_TIMEOUT_MIN};
use crate::service::removals::Removal;
use crate::service::MasterService;

/// A connection's buffers start this small: most clients only ping and ask small questions,
/// and a master serves thousands of them. They grow while a frame needs more.
///
/// Why start small: each connection used to start with two 256 KiB buffers, and glibc,
/// having seen such blocks freed, serves later ones from its arenas instead of fresh
/// mappings; with 1,000 clients connecting and leaving in rounds the master's RSS grew by
/// 6-13 MiB a round and kept it (`bench/README.md`, "client_swarm").
const BUFFER_INITIAL_BYTES: usize = 4 * 1024;
/// Bytes asked of the socket per read once a connection is busy (a read filled all the room
/// it had): the whole pipeline of a busy client is answered in one pass.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// A buffer grown past this (a large re-mount) is given back once it is empty again.
const BUFFER_KEEP_BYTES: usize = 1024 * 1024;
/// Most connections served at once; more are accepted and closed at once.
pub const MAX_CONNECTIONS: usize = 16 * 1024;
/// Longest a new connection may take to complete the authentication handshake.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves connections from `listener` until `shutdown` completes, with this process's
/// cluster secret ([`auth::process_token`]) if one is configured. With `gate`, requests are
/// answered only while [`HaState::may_serve`].
pub async fn serve(
    listener: TcpListener,
    service: Arc<MasterService>,
    gate: Option<Arc<HaState>>,
    shutdown: impl Future<Output = ()>,
) {
    serve_with_auth(
        listener,
        service,
        gate,
        auth::process_token_or_none(),
        shutdown,
    )
    .await
}

/// [`serve`] with an explicit secret (`None`: no handshake).
pub async fn serve_with_auth(
    listener: TcpListener,
    service: Arc<MasterService>,
    gate: Option<Arc<HaState>>,
    token: Option<&'static Token>,
    shutdown: impl Future<Output = ()>,
) {
    let live = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => {
                let (sock, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        warn!("accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let Ok(permit) = live.clone().try_acquire_owned() else {
                    warn!("refusing {peer}: {MAX_CONNECTIONS} connections already open");
                    continue;
                };
                let svc = service.clone();
                let gate = gate.clone();
                tokio::spawn(async move {
                    if let Err(why) = serve_conn(sock, svc, gate, token).await {
                        debug!("connection from {peer} closed: {why}");
                    }
                    drop(permit);
                });
            }
        }
    }
}

async fn serve_conn(
    mut sock: TcpStream,
    service: Arc<MasterService>,
    gate: Option<Arc<HaState>>,
    token: Option<&'static Token>,
) -> Result<(), String> {
    sock.set_nodelay(true).map_err(|e| e.to_string())?;
    if let Some(token) = token {
        tokio::time::timeout(HANDSHAKE_TIMEOUT, authenticate(&mut sock, token))
            .await
            .map_err(|_| format!("no authentication within {HANDSHAKE_TIMEOUT:?}"))??;
    }
    let mut inbuf: Vec<u8> = Vec::with_capacity(BUFFER_INITIAL_BYTES);
    let mut out: Vec<u8> = Vec::new();
    // Bytes to have room for before a read: small until the connection shows it is busy.
    let mut chunk = BUFFER_INITIAL_BYTES;
    // When the master began to wait for the rest of the frame at the start of `inbuf`.
    let mut partial_since: Option<Instant> = None;
    loop {
        if inbuf.capacity() - inbuf.len() < chunk / 4 {
            inbuf.reserve(chunk);
        }
        let room = inbuf.capacity() - inbuf.len();
        let deadline = partial_since.map(|t| t + frame_timeout(&inbuf));
        let n = read_more(&mut sock, &mut inbuf, deadline).await?;
        if n == 0 {
            return Ok(());
        }
        if n == room {
            chunk = READ_CHUNK_BYTES;
        }
        let used = if crate::ha::serving(&gate) {
            let (used, durable) = answer_frames(&inbuf, &service, &mut out)?;
            // Removals the answers acknowledge, and owners whose mounts they answer, must be
            // in etcd first (`service/removals.rs`, `service/owners.rs`). If they cannot be
            // stored, no answer goes out: the connection closes and the client sees the
            // removal unacknowledged, or mounts again.
            if let Some(ha) = gate.as_ref() {
                if !durable.removals.is_empty() {
                    if let Err(e) = ha.store_removals(&durable.removals).await {
                        warn!("could not store a removal in etcd ({e}); closing the connection unanswered");
                        return Err(e);
                    }
                }
                if !durable.owners.is_empty() {
                    if let Err(e) = ha.store_owners(&durable.owners).await {
                        service.owners_unstored(&durable.owners);
                        warn!("could not register an owner in etcd ({e}); closing the connection unanswered");
                        return Err(e);
                    }
                }
            }
            used
        } else {
            refuse_frames(&inbuf, &mut out)?
        };
        inbuf.drain(..used);
        if inbuf.is_empty() && inbuf.capacity() > BUFFER_KEEP_BYTES {
            inbuf = Vec::with_capacity(BUFFER_INITIAL_BYTES);
        }
        if !out.is_empty() {
            sock.write_all(&out).await.map_err(|e| e.to_string())?;
            out.clear();
            if out.capacity() > BUFFER_KEEP_BYTES {
                out = Vec::new();
            }
        }
        // A frame left half-read: its clock starts now that the master waits for its rest
        // (the answers above do not count against it), or keeps running when it is the one
        // that was half-read before this read. No clock between frames.
        partial_since = match (inbuf.is_empty(), used, partial_since) {
            (true, ..) => None,
            (false, 0, Some(t)) => Some(t),
            (false, ..) => Some(Instant::now()),
        };
    }
}

/// Time the frame whose first bytes are `partial` has to arrive whole (`limits.rs`,
/// [`RPC_FRAME_TIMEOUT_MIN`]): longer for a large frame once its whole header is in (a
/// length the header may not promise counts as the largest it may).
pub fn frame_timeout(partial: &[u8]) -> Duration {
    let largest = (frame::HEADER_BYTES + FRAME_PAYLOAD_MAX_BYTES) as u64;
    let promised = partial
        .first_chunk::<{ frame::HEADER_BYTES }>()
        .map_or(0, |h| {
            u64::from(u32::from_le_bytes([h[0], h[1], h[2], h[3]])) + 4
        });
    let secs = promised.min(largest) / RPC_FRAME_MIN_BYTES_PER_S;
    RPC_FRAME_TIMEOUT_MIN.max(Duration::from_secs(secs))
}

/// Reads what the socket has into `inbuf` (trying [`poll_read`] first); with a `deadline`,
/// fails when nothing comes before it. Returns the bytes read (0: closed).
async fn read_more(
    sock: &mut TcpStream,
    inbuf: &mut Vec<u8>,
    deadline: Option<Instant>,
) -> Result<usize, String> {
    let allowed = frame_timeout(inbuf);
    let read = async {
        match poll_read(sock, inbuf).await {
            Some(n) => Ok(n),
            None => sock.read_buf(inbuf).await,
        }
    };
    let res = match deadline {
        None => read.await,
        Some(d) => tokio::time::timeout_at(d.into(), read)
            .await
            .map_err(|_| format!("a frame not sent whole within {allowed:?}"))?,
    };
    res.map_err(|e| e.to_string())
}

/// Answers every complete frame at the start of `buf` with `UNAVAILABLE_IN_CURRENT_STATUS`
/// (this master may not serve); returns the bytes consumed.
pub fn refuse_frames(buf: &[u8], out: &mut Vec<u8>) -> Result<usize, String> {
    let mut used = 0;
    while let Some((f, len)) = frame::split_frame(&buf[used..]).map_err(|e| e.to_string())? {
        if f.header.kind != Kind::Request {
            return Err("client sent a response frame".into());
        }
        frame::encode_with(
            out,
            Kind::Response,
            f.header.opcode,
            f.header.request_id,
            |o| ErrorCode::UnavailableInCurrentStatus.encode(o),
        )
        .map_err(|e| format!("answer too large: {e}"))?;
        used += len;
    }
    Ok(used)
}

/// Runs the server side of the handshake; `Err` when the peer must be dropped (after the
/// refusal it is owed has been sent).
async fn authenticate(sock: &mut TcpStream, token: &'static Token) -> Result<(), String> {
    let mut hs = ServerHandshake::new(token);
    loop {
        let mut b = [0u8; auth::FRAME_BYTES];
        let head = &mut b[..frame::HEADER_BYTES];
        sock.read_exact(head).await.map_err(|e| e.to_string())?;
        if !auth::is_handshake(head) {
            refuse_request(sock, head).await;
            return Err("request before authentication; refused".into());
        }
        sock.read_exact(&mut b[frame::HEADER_BYTES..])
            .await
            .map_err(|e| e.to_string())?;
        match hs.on_frame(&b) {
            ServerStep::Reply(r) => sock.write_all(&r).await.map_err(|e| e.to_string())?,
            ServerStep::Accept(r) => return sock.write_all(&r).await.map_err(|e| e.to_string()),
            ServerStep::Refuse(r, why) => {
                let _ = sock.write_all(&r).await;
                return Err(format!("authentication failed: {why}"));
            }
            // The magic was checked above; refuse rather than trust that.
            ServerStep::NotHandshake => return Err("not a handshake frame".into()),
        }
    }
}

/// Answers the request whose header is `head` with `ILLEGAL_CLIENT`, when it is a well-formed
/// request header; sends nothing otherwise.
async fn refuse_request(sock: &mut TcpStream, head: &[u8]) {
    let Some(h) = head.first_chunk::<{ frame::HEADER_BYTES }>() else {
        return;
    };
    let Ok(h) = frame::Header::parse(h) else {
        return;
    };
    if h.kind != Kind::Request {
        return;
    }
    let mut out = Vec::with_capacity(frame::HEADER_BYTES + 4);
    let encoded = frame::encode_with(&mut out, Kind::Response, h.opcode, h.request_id, |o| {
        ErrorCode::IllegalClient.encode(o)
    });
    if encoded.is_ok() && sock.write_all(&out).await.is_ok() {
        let _ = sock.shutdown().await;
        // Read (and drop) what the peer still sends for a moment, so closing with unread
        // bytes does not reset the connection before the peer has read its answer.
        let mut sink = [0u8; 4096];
        let mut left = REFUSAL_LINGER_BYTES;
        let linger = async {
            while left > 0 {
                match sock.read(&mut sink).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        };
        let _ = tokio::time::timeout(REFUSAL_LINGER, linger).await;
    }
}

/// How long, and for how many bytes, a refused peer is read after its answer.
const REFUSAL_LINGER: std::time::Duration = std::time::Duration::from_secs(1);
const REFUSAL_LINGER_BYTES: usize = 1 << 20;

/// How long a connection that just answered keeps trying to read before it parks in the
/// reactor (`MC_MASTER_BUSY_POLL_US`, default 20 µs; 0 turns it off). A client that issues
/// calls back to back sends the next one within that, and is then answered without the
/// worker's epoll wake-up (several µs on these VMs). Between tries the task yields, so other
/// connections on the same worker are not held up.
fn busy_poll() -> std::time::Duration {
    static BUDGET: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| protocol::env::micros("MC_MASTER_BUSY_POLL_US", 20))
}

/// How many connections may busy-poll at once: one per core, so that the spinning uses cores
/// nobody else wants. Without a bound, 10,000 clients calling one at a time each spun after
/// every answer, on a 2-core VM: connecting them all took 96 s instead of 3.5 s, and pings
/// went unanswered long enough to expire clients (`docs/scale.md`).
fn busy_pollers_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Connections busy-polling now (see [`busy_pollers_max`]).
static BUSY_POLLERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A busy poll's place among [`BUSY_POLLERS`], given back when dropped.
struct BusyPoller;

impl BusyPoller {
    fn enter() -> Option<BusyPoller> {
        use std::sync::atomic::Ordering;
        let was = BUSY_POLLERS.fetch_add(1, Ordering::AcqRel);
        if was >= busy_pollers_max() {
            BUSY_POLLERS.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(BusyPoller)
    }
}

impl Drop for BusyPoller {
    fn drop(&mut self) {
        BUSY_POLLERS.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Tries non-blocking reads for up to [`busy_poll`]; `Some(n)` when one returned (0: closed),
/// `None` when nothing came (or it failed: the blocking read reports it), or when as many
/// connections as there are cores are polling already.
async fn poll_read(sock: &TcpStream, inbuf: &mut Vec<u8>) -> Option<usize> {
    let budget = busy_poll();
    if budget.is_zero() {
        return None;
    }
    let _place = BusyPoller::enter()?;
    let until = std::time::Instant::now() + budget;
    loop {
        match sock.try_read_buf(inbuf) {
            Ok(n) => return Some(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return None,
        }
        if std::time::Instant::now() >= until {
            return None;
        }
        tokio::task::yield_now().await;
    }
}

/// What an HA leader must store in etcd before a batch's answers may be sent.
#[derive(Default)]
pub struct Durable {
    /// Removals the answers acknowledge (`service/removals.rs`).
    pub removals: Vec<Removal>,
    /// Owners whose first mount the answers acknowledge (`service/owners.rs`).
    pub owners: Vec<Uuid>,
}

/// Answers every complete frame at the start of `buf` into `out`; returns the bytes consumed
/// and what to store in etcd before `out` may be sent. The service is locked once for all of
/// them (no I/O happens here).
pub fn answer_frames(
    buf: &[u8],
    service: &MasterService,
    out: &mut Vec<u8>,
) -> Result<(usize, Durable), String> {
    let mut used = 0;
    let mut batch = None;
    while let Some((f, len)) = frame::split_frame(&buf[used..]).map_err(|e| e.to_string())? {
        if f.header.kind != Kind::Request {
            return Err("client sent a response frame".into());
        }
        let opcode = f.header.opcode;
        let b = batch.get_or_insert_with(|| service.batch());
        frame::encode_with(out, Kind::Response, opcode, f.header.request_id, |o| {
            if let Err(e) = b.handle_frame(opcode, f.body, o) {
                debug!("undecodable request (opcode {opcode}): {e}");
                ErrorCode::InvalidParams.encode(o);
            }
        })
        .map_err(|e| format!("answer too large: {e}"))?;
        used += len;
    }
    let durable = batch
        .map(|mut b| Durable {
            removals: b.take_durable(),
            owners: b.take_new_owners(),
        })
        .unwrap_or_default();
    Ok((used, durable))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_has_the_minimum_until_its_header_is_in_then_time_by_its_length() {
        let header = |len: u32| {
            let mut h = len.to_le_bytes().to_vec();
            h.resize(frame::HEADER_BYTES, 0);
            h
        };
        let min = RPC_FRAME_TIMEOUT_MIN;
        assert_eq!(frame_timeout(&[]), min);
        assert_eq!(frame_timeout(&u32::MAX.to_le_bytes()), min);
        assert_eq!(frame_timeout(&header(1 << 20)), min);
        assert_eq!(frame_timeout(&header(64 << 20)), Duration::from_secs(64));
        // A length no header may promise counts as the largest frame.
        assert_eq!(frame_timeout(&header(u32::MAX)), Duration::from_secs(64));
    }
}
