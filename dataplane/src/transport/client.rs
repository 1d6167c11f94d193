//! The TCP data-plane client: N lanes (persistent connections) to one peer, batched
//! one-sided READ and WRITE with a status per request.
//!
//! The calling thread drives the I/O itself; there are no helper threads and no handoffs.
//! [`TcpClient::submit`]:
//!
//! 1. locks the lanes it can get without waiting (as many as the batch can use), or, when
//!    every lane is busy, waits for one; a lane that is not connected is connected now;
//! 2. spreads the requests over those lanes, least loaded (in bytes) first;
//! 3. runs a small event loop over the lanes' sockets: each lane sends request headers and
//!    WRITE payloads with one gathering `sendmsg` per step, keeping at most
//!    [`CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX`] requests in flight, and receives response
//!    headers and READ payloads straight into the caller's buffers, matching responses by
//!    request id (an io_uring shard may answer out of order). Sockets stay in blocking mode
//!    with `SO_RCVTIMEO`/`SO_SNDTIMEO` = the I/O timeout; the loop passes `MSG_DONTWAIT` and
//!    waits in `poll(2)` when a lane has both directions pending or several lanes run.
//!
//! With one lane and nothing else in flight a call is: one blocking `sendmsg` (header and
//! WRITE payload), one or two blocking `recv`s (response header, READ payload), unlock.
//! Sending and receiving are interleaved whenever both are pending, so neither side's
//! socket buffers can fill up and deadlock the exchange.
//!
//! Requests of one batch are not ordered with respect to each other (they may run on
//! different lanes), as upstream's, with two exceptions: a [`TransferOp::CatalogPut`] goes on
//! the lane of the request just before it in the batch, right after it, so the server records
//! an object only once that request (the object's WRITE) has landed, and never if the lane
//! broke in between; and the request just after a [`TransferOp::CatalogIntent`] goes on its
//! lane, right after it, so the server applies the intent before that WRITE's bytes land.
//!
//! Invariants:
//! - the caller's buffers are touched only during the call, so a timeout can never leave a
//!   late write into a freed buffer;
//! - a lane whose stream failed or went out of frame (I/O error, no progress for the I/O
//!   timeout, unexpected response) is reset (`rawio::abort`: what the kernel has not sent yet
//!   is dropped, so a failed WRITE cannot land after the link comes back), its unanswered
//!   requests fail, and it is reconnected on its next use; other lanes of the batch carry on;
//! - a thread blocks on a lane's lock only while it holds no other lane, so concurrent
//!   batches cannot deadlock;
//! - zero-length requests complete at once without I/O (upstream's behaviour).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use super::header::{
    Opcode, RequestHeader, ResponseHeader, REQUEST_HEADER_BYTES, RESPONSE_HEADER_BYTES,
};
use crate::limits::{
    BATCH_REQUESTS_MAX, CLIENT_LANES_DEFAULT, CLIENT_LANES_MAX, CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX,
    CONNECT_TIMEOUT_DEFAULT, IO_TIMEOUT_DEFAULT, REQUEST_PAYLOAD_MAX_BYTES,
};
use crate::mem::{Dst, Src};
use crate::sys::rawio;
use crate::TeError;
use protocol::auth::{self, AuthError, Token};

/// Client settings.
#[derive(Clone, Copy, Debug)]
pub struct ClientConfig {
    /// The cluster secret each lane proves when it connects, and that the server must prove
    /// back (see `protocol::auth`); `None`: no handshake. Defaults to this process's secret.
    pub auth: Option<&'static Token>,
    /// Connections to the peer, 1 ..= `CLIENT_LANES_MAX`.
    pub lanes: usize,
    /// Bound on establishing one connection.
    pub connect_timeout: Duration,
    /// Bound on one blocking socket operation (one response, one send).
    pub io_timeout: Duration,
    /// The master's term the WRITEs of this client belong to, declared with a FENCE request
    /// on each lane as it connects (`recovery::fence`); a server fenced at a later term refuses
    /// them. 0: nothing declared (the raw transfer engine's writes have no term).
    pub term: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            auth: auth::process_token_or_none(),
            lanes: CLIENT_LANES_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            io_timeout: IO_TIMEOUT_DEFAULT,
            term: 0,
        }
    }
}

/// One request of a batch. Its local bytes are raw ranges ([`crate::sys::bytes`]): the
/// client reads and writes them with `sendmsg`/`recv` only.
#[derive(Debug)]
pub enum TransferOp<'a> {
    /// Copy `dst.len()` bytes from the peer's `remote_addr` into `dst`.
    Read { remote_addr: u64, dst: Dst<'a> },
    /// Copy `src` to the peer's `remote_addr`.
    Write { remote_addr: u64, src: Src<'a> },
    /// Record the object at `remote_addr` in the peer's catalog; `record` is an encoded
    /// [`CatalogRecord`](crate::recovery::CatalogRecord). Sent on the lane of the previous op.
    CatalogPut { remote_addr: u64, record: Src<'a> },
    /// A `CATALOG_PUT` whose record is an intent (`recovery::catalog`): the next op (the WRITE it
    /// announces) is sent on its lane, right after it.
    CatalogIntent { remote_addr: u64, record: Src<'a> },
}

impl TransferOp<'_> {
    fn len(&self) -> usize {
        match self {
            TransferOp::Read { dst, .. } => dst.len(),
            TransferOp::Write { src, .. } => src.len(),
            TransferOp::CatalogPut { record, .. } | TransferOp::CatalogIntent { record, .. } => {
                record.len()
            }
        }
    }
}

/// Why one request failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// The peer answered with this non-zero status (a TE error code, e.g. -3).
    #[error("peer refused the request with status {status}")]
    Refused { status: i32 },
    /// The request is larger than one frame may carry.
    #[error("request of {len} bytes exceeds the maximum {max}")]
    TooLong { len: usize, max: u64 },
    /// The batch has more requests than allowed.
    #[error("batch of {got} requests exceeds the maximum {max}")]
    TooManyRequests { got: usize, max: usize },
    /// No response within the I/O timeout.
    #[error("no progress within the I/O timeout")]
    Timeout,
    /// Connecting, sending or receiving failed.
    #[error("connection to the peer failed: {kind:?}: {message}")]
    Connection {
        kind: io::ErrorKind,
        message: String,
    },
    /// The peer sent something the protocol does not allow.
    #[error("malformed response: {0}")]
    Protocol(String),
}

impl TransferError {
    /// The TE error code for this failure, for the engine's per-request status.
    pub fn code(&self) -> i32 {
        match self {
            TransferError::Refused { status } => *status,
            TransferError::TooLong { .. } => TeError::InvalidArgument.code(),
            TransferError::TooManyRequests { .. } => TeError::TooManyRequests.code(),
            TransferError::Timeout
            | TransferError::Connection { .. }
            | TransferError::Protocol(_) => TeError::Socket.code(),
        }
    }

    fn from_io(e: &io::Error) -> TransferError {
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => TransferError::Timeout,
            kind => TransferError::Connection {
                kind,
                message: e.to_string(),
            },
        }
    }
}

/// Result of one request.
pub type TransferResult = Result<(), TransferError>;

/// One lane: a persistent connection, `None` until (re)connected.
type LaneSlot = Option<TcpStream>;

/// A client of one peer's data-plane server. Shareable between threads: each lane is behind
/// its own lock, and a batch uses the lanes it could lock.
#[derive(Debug)]
pub struct TcpClient {
    peer: SocketAddr,
    config: ClientConfig,
    lanes: Vec<Mutex<LaneSlot>>,
    next_lane: AtomicUsize,
    next_id: AtomicU64,
}

impl TcpClient {
    /// Connects to `peer`: its first lane now (so that an unreachable peer or a refused term
    /// fails here), the others when a batch can use more than the lanes already connected or
    /// a concurrent caller finds them all busy. A client that only ever sends small requests
    /// one at a time (catalog records, 4 KiB objects) holds one connection, not
    /// [`ClientConfig::lanes`]: with many clients and many nodes, the difference is a node's
    /// file descriptors, and the connects every client redials when a new master's term
    /// begins.
    pub fn connect(peer: SocketAddr, config: ClientConfig) -> Result<TcpClient, TransferError> {
        if config.lanes == 0 || config.lanes > CLIENT_LANES_MAX || config.io_timeout.is_zero() {
            return Err(TransferError::Connection {
                kind: io::ErrorKind::InvalidInput,
                message: format!(
                    "lanes must be 1..={CLIENT_LANES_MAX} (got {}) and io_timeout > 0",
                    config.lanes
                ),
            });
        }
        let client = TcpClient {
            peer,
            config,
            lanes: (0..config.lanes).map(|_| Mutex::new(None)).collect(),
            next_lane: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
        };
        client.ensure_connected(&mut lock(&client.lanes[0]))?;
        Ok(client)
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Writes `src` at the peer's `remote_addr`.
    pub fn write(&self, remote_addr: u64, src: &[u8]) -> TransferResult {
        let src = Src::from(src);
        let mut ops = [TransferOp::Write { remote_addr, src }];
        self.submit(&mut ops).pop().unwrap_or(Ok(()))
    }

    /// Reads `dst.len()` bytes from the peer's `remote_addr` into `dst`.
    pub fn read(&self, remote_addr: u64, dst: &mut [u8]) -> TransferResult {
        let dst = Dst::from(dst);
        let mut ops = [TransferOp::Read { remote_addr, dst }];
        self.submit(&mut ops).pop().unwrap_or(Ok(()))
    }

    /// Runs a batch; returns one result per op, in order. Blocks until every op completed or
    /// failed.
    pub fn submit(&self, ops: &mut [TransferOp<'_>]) -> Vec<TransferResult> {
        let mut results: Vec<TransferResult> = vec![Ok(()); ops.len()];
        if ops.len() > BATCH_REQUESTS_MAX {
            let e = TransferError::TooManyRequests {
                got: ops.len(),
                max: BATCH_REQUESTS_MAX,
            };
            results.iter_mut().for_each(|r| *r = Err(e.clone()));
            return results;
        }
        let mut reqs = self.prepare(ops, &mut results);
        if reqs.is_empty() {
            return results;
        }
        // A request that must follow the one before it on its lane adds no lane to use.
        let independent = reqs.iter().filter(|r| !r.follows_previous).count();
        let mut lanes = match self.acquire(independent.max(1)) {
            Ok(lanes) => lanes,
            Err(e) => {
                for req in &reqs {
                    results[req.index] = Err(e.clone());
                }
                return results;
            }
        };
        assign(&mut lanes, &mut reqs);
        let mut batch = Batch {
            reqs,
            results: &mut results,
            io_timeout: self.config.io_timeout,
        };
        batch.run(&mut lanes);
        results
    }

    /// Turns the ops that need the wire into requests with consecutive ids; settles the
    /// others (zero length: done; too long: refused) in `results`.
    fn prepare<'a>(
        &self,
        ops: &'a mut [TransferOp<'_>],
        results: &mut [TransferResult],
    ) -> Vec<Req<'a>> {
        let wire = ops
            .iter()
            .filter(|op| op.len() != 0 && op.len() as u64 <= REQUEST_PAYLOAD_MAX_BYTES)
            .count();
        let base_id = self.next_id.fetch_add(wire as u64, Ordering::Relaxed);
        let mut reqs = Vec::with_capacity(wire);
        let mut after_intent = false;
        for (index, op) in ops.iter_mut().enumerate() {
            let len = op.len();
            if len == 0 {
                continue;
            }
            if len as u64 > REQUEST_PAYLOAD_MAX_BYTES {
                results[index] = Err(TransferError::TooLong {
                    len,
                    max: REQUEST_PAYLOAD_MAX_BYTES,
                });
                continue;
            }
            let follows_previous = after_intent || matches!(op, TransferOp::CatalogPut { .. });
            after_intent = matches!(op, TransferOp::CatalogIntent { .. });
            let (opcode, addr, src, dst) = match op {
                TransferOp::Read { remote_addr, dst } => (
                    Opcode::Read,
                    *remote_addr,
                    Src::empty(),
                    Some(dst.reborrow()),
                ),
                TransferOp::Write { remote_addr, src } => (Opcode::Write, *remote_addr, *src, None),
                TransferOp::CatalogPut {
                    remote_addr,
                    record,
                }
                | TransferOp::CatalogIntent {
                    remote_addr,
                    record,
                } => (Opcode::CatalogPut, *remote_addr, *record, None),
            };

            let header = RequestHeader {
                opcode,
                request_id: base_id + reqs.len() as u64,
                addr,
                len: len as u64,
            }
            .encode();
            reqs.push(Req {
                index,
                id: base_id + reqs.len() as u64,
                header,
                src,
                dst,
                lane: 0,
                follows_previous,
                state: ReqState::Queued,
            });
        }
        reqs
    }

    /// Locks up to `want` lanes without waiting, starting at a rotating index: connected
    /// lanes first, then lanes not connected yet (dialed now), so a client uses as many
    /// connections as its traffic needs; if every lane is busy, waits for one. Lanes that fail
    /// to connect are released, and if none is left the last connect error is returned.
    fn acquire(&self, want: usize) -> Result<Vec<Lane<'_>>, TransferError> {
        let n = self.lanes.len();
        let start = self.next_lane.fetch_add(1, Ordering::Relaxed) % n;
        let mut guards = Vec::with_capacity(want.min(n));
        // First the connected lanes; then, if the batch can use more, any lane free now (one
        // not connected yet is dialed below). A lane this thread holds already answers
        // `WouldBlock` to the second pass.
        for connected_only in [true, false] {
            for k in 0..n {
                if guards.len() == want {
                    break;
                }
                let slot = (start + k) % n;
                let guard = match self.lanes[slot].try_lock() {
                    Ok(g) => g,
                    Err(TryLockError::Poisoned(e)) => unpoison(e.into_inner()),
                    Err(TryLockError::WouldBlock) => continue,
                };
                if guard.is_some() || !connected_only {
                    guards.push(guard);
                }
            }
        }
        if guards.is_empty() {
            // Holding no lane, so waiting here cannot deadlock with another batch.
            guards.push(lock(&self.lanes[start]));
        }
        let mut lanes = Vec::with_capacity(guards.len());
        let mut last_error = None;
        for mut guard in guards {
            match self.ensure_connected(&mut guard) {
                Ok(()) => lanes.push(Lane::new(guard)),
                Err(e) => last_error = Some(e),
            }
        }
        match (lanes.is_empty(), last_error) {
            (true, Some(e)) => Err(e),
            _ => Ok(lanes),
        }
    }

    fn ensure_connected(&self, slot: &mut LaneSlot) -> Result<(), TransferError> {
        if slot.is_some() {
            return Ok(());
        }
        let stream = TcpStream::connect_timeout(&self.peer, self.config.connect_timeout)
            .map_err(|e| TransferError::from_io(&e))?;
        rawio::tune_stream(&stream, self.config.io_timeout)
            .map_err(|e| TransferError::from_io(&e))?;
        if let Some(token) = self.config.auth {
            // Once per connection, bounded by the socket timeouts just set.
            let mut s = &stream;
            auth::client_handshake(&mut s, token).map_err(|e| TransferError::Connection {
                kind: match &e {
                    AuthError::Io { kind, .. } => *kind,
                    _ => io::ErrorKind::PermissionDenied,
                },
                message: format!("{e} (peer {})", self.peer),
            })?;
        }
        if self.config.term != 0 {
            self.declare_term(&stream)?;
        }
        *slot = Some(stream);
        Ok(())
    }

    /// Sends FENCE with this client's term on a new lane and waits for its answer (before any
    /// other request, bounded by the socket timeouts). A refusal (ERR_METADATA: the peer
    /// serves a later term) fails the connection.
    fn declare_term(&self, stream: &TcpStream) -> Result<(), TransferError> {
        let header = RequestHeader {
            opcode: Opcode::Fence,
            request_id: 0,
            addr: self.config.term,
            len: 0,
        }
        .encode();
        let io = |e: io::Error| TransferError::from_io(&e);
        let mut s = stream;
        io::Write::write_all(&mut s, &header).map_err(io)?;
        let mut raw = [0u8; RESPONSE_HEADER_BYTES];
        io::Read::read_exact(&mut s, &mut raw).map_err(io)?;
        let resp = ResponseHeader::decode(&raw).map_err(|e| TransferError::Connection {
            kind: io::ErrorKind::InvalidData,
            message: format!("FENCE answer from {}: {e}", self.peer),
        })?;
        if resp.request_id != 0 || resp.len != 0 {
            return Err(TransferError::Connection {
                kind: io::ErrorKind::InvalidData,
                message: format!("FENCE answer from {} out of step", self.peer),
            });
        }
        if resp.status != 0 {
            return Err(TransferError::Refused {
                status: resp.status,
            });
        }
        Ok(())
    }
}

fn lock(m: &Mutex<LaneSlot>) -> MutexGuard<'_, LaneSlot> {
    m.lock().unwrap_or_else(|e| unpoison(e.into_inner()))
}

/// A panic while a lane was held leaves at worst a stream out of frame; drop it.
fn unpoison(mut guard: MutexGuard<'_, LaneSlot>) -> MutexGuard<'_, LaneSlot> {
    *guard = None;
    guard
}

/// Spreads the requests over the lanes, each to the lane with the fewest bytes so far, except
/// that a request that follows the previous one goes on the previous one's lane.
fn assign(lanes: &mut [Lane<'_>], reqs: &mut [Req<'_>]) {
    let mut load = vec![0usize; lanes.len()];
    let mut previous: Option<usize> = None;
    for (r, req) in reqs.iter_mut().enumerate() {
        let least = (0..lanes.len()).min_by_key(|&l| load[l]).unwrap_or(0);
        let lane = match previous {
            Some(p) if req.follows_previous => p,
            _ => least,
        };
        previous = Some(lane);
        load[lane] += req.wire_len();
        req.lane = lane;
        lanes[lane].queue.push(r);
    }
}

/// Where a request is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReqState {
    /// Its header is not fully sent yet.
    Queued,
    /// Its header is out; its response is not complete.
    Awaiting,
    /// Its result is in the batch's results.
    Done,
}

/// One request of the running batch.
struct Req<'a> {
    /// Position in the caller's ops (and results).
    index: usize,
    id: u64,
    header: [u8; REQUEST_HEADER_BYTES],
    /// WRITE payload; empty for a READ.
    src: Src<'a>,
    /// READ target; `None` for a WRITE.
    dst: Option<Dst<'a>>,
    /// Index of its lane in the batch's lanes.
    lane: usize,
    /// Must go on the lane of the request before it (a CATALOG_PUT, or the WRITE after an
    /// intent).
    follows_previous: bool,
    state: ReqState,
}

impl Req<'_> {
    /// Bytes of its request frame.
    fn frame_len(&self) -> usize {
        REQUEST_HEADER_BYTES + self.src.len()
    }

    /// Bytes it moves over the wire in both directions (for load balancing).
    fn wire_len(&self) -> usize {
        self.frame_len() + RESPONSE_HEADER_BYTES + self.dst.as_ref().map_or(0, |d| d.len())
    }
}

/// What a lane's receive side is doing.
#[derive(Clone, Copy, Debug)]
enum RecvPhase {
    /// `filled` bytes of the next response header are in `Lane::header`.
    Header { filled: usize },
    /// `done` bytes of request `req`'s READ payload are in its `dst`.
    Payload { req: usize, done: usize },
}

/// A locked lane taking part in a batch.
struct Lane<'c> {
    guard: MutexGuard<'c, LaneSlot>,
    fd: RawFd,
    /// The requests assigned to it, in sending order (indices into the batch's requests).
    queue: Vec<usize>,
    /// `queue[..sent]` are fully sent; `offset` bytes of `queue[sent]`'s frame are.
    sent: usize,
    offset: usize,
    /// Requests whose header is out and whose response is not complete.
    awaiting: usize,
    /// Responses completed.
    answered: usize,
    recv: RecvPhase,
    header: [u8; RESPONSE_HEADER_BYTES],
    /// Set by a send that could not take everything: wait for `POLLOUT` before the next.
    send_blocked: bool,
    last_progress: Instant,
    failed: bool,
}

impl<'c> Lane<'c> {
    /// A lane over a connected slot.
    fn new(guard: MutexGuard<'c, LaneSlot>) -> Lane<'c> {
        // Callers connect the slot first; a missing stream gets fd -1, whose every call fails
        // with EBADF and so fails the lane's requests cleanly.
        let fd = guard.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        Lane {
            guard,
            fd,
            queue: Vec::new(),
            sent: 0,
            offset: 0,
            awaiting: 0,
            answered: 0,
            recv: RecvPhase::Header { filled: 0 },
            header: [0; RESPONSE_HEADER_BYTES],
            send_blocked: false,
            last_progress: Instant::now(),
            failed: false,
        }
    }

    fn finished(&self) -> bool {
        self.failed || self.answered == self.queue.len()
    }

    /// End of the in-flight window in `queue`.
    fn window_end(&self) -> usize {
        (self.answered + CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX).min(self.queue.len())
    }

    fn can_send(&self) -> bool {
        !self.failed && self.sent < self.window_end()
    }

    /// True when a blocking send cannot deadlock: nothing is in flight and exactly one frame
    /// is left, so the peer has nothing to send us until that frame is complete.
    fn may_block_on_send(&self) -> bool {
        self.awaiting == 0 && self.offset == 0 && self.sent + 1 == self.window_end()
    }

    /// One `sendmsg` of the unsent part of the window. Returns whether bytes moved.
    fn send(&mut self, reqs: &mut [Req<'_>], blocking: bool) -> Result<bool, TransferError> {
        let end = self.window_end();
        let mut iov: Vec<Src<'_>> = Vec::with_capacity(2 * (end - self.sent));
        let mut skip = self.offset;
        for &r in &self.queue[self.sent..end] {
            for part in [Src::from(&reqs[r].header[..]), reqs[r].src] {
                if skip >= part.len() {
                    skip -= part.len();
                } else {
                    iov.push(part.tail(skip));
                    skip = 0;
                }
            }
        }
        let wanted: usize = iov.iter().map(|v| v.len()).sum();
        let flags = if blocking { 0 } else { libc::MSG_DONTWAIT };
        let n = match rawio::sendmsg(self.fd, &iov, flags) {
            Ok(n) => n,
            Err(e) if !blocking && e.kind() == io::ErrorKind::WouldBlock => {
                self.send_blocked = true;
                return Ok(false);
            }
            Err(e) => return Err(TransferError::from_io(&e)),
        };
        self.send_blocked = n < wanted;
        self.advance(reqs, n);
        Ok(n > 0)
    }

    /// Accounts `n` bytes sent.
    fn advance(&mut self, reqs: &mut [Req<'_>], mut n: usize) {
        if n > 0 {
            self.last_progress = Instant::now();
        }
        while n > 0 && self.sent < self.queue.len() {
            let req = &mut reqs[self.queue[self.sent]];
            let before = self.offset;
            let step = (req.frame_len() - before).min(n);
            self.offset += step;
            n -= step;
            if before < REQUEST_HEADER_BYTES && self.offset >= REQUEST_HEADER_BYTES {
                req.state = ReqState::Awaiting;
                self.awaiting += 1;
            }
            if self.offset == req.frame_len() {
                self.sent += 1;
                self.offset = 0;
            }
        }
    }

    /// Receives responses. Nonblocking: until the socket has nothing more or nothing is
    /// awaited. Blocking: until nothing is awaited, or a response completed and the window
    /// lets more requests out. Returns whether bytes moved.
    fn receive(
        &mut self,
        lane: usize,
        reqs: &mut [Req<'_>],
        results: &mut [TransferResult],
        blocking: bool,
    ) -> Result<bool, TransferError> {
        let flags = if blocking {
            libc::MSG_WAITALL
        } else {
            libc::MSG_DONTWAIT
        };
        let mut progress = false;
        while self.awaiting > 0 {
            if blocking && progress && self.can_send() {
                break;
            }
            let mut buf: Dst<'_> = match self.recv {
                RecvPhase::Header { filled } => Dst::from(&mut self.header[filled..]),
                RecvPhase::Payload { req, done } => match reqs[req].dst.as_mut() {
                    Some(dst) => dst.tail(done),
                    None => Dst::from(&mut [][..]),
                },
            };
            let spin = blocking && matches!(self.recv, RecvPhase::Header { filled: 0 });
            let got = if spin {
                rawio::recv_spinning(self.fd, &mut buf, flags, busy_poll())
            } else {
                rawio::recv(self.fd, &mut buf, flags)
            };
            let n = match got {
                Ok(0) => {
                    return Err(TransferError::Connection {
                        kind: io::ErrorKind::UnexpectedEof,
                        message: "the peer closed the connection with requests in flight".into(),
                    })
                }
                Ok(n) => n,
                Err(e) if !blocking && e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(TransferError::from_io(&e)),
            };
            progress = true;
            self.last_progress = Instant::now();
            match self.recv {
                RecvPhase::Header { filled } if filled + n < RESPONSE_HEADER_BYTES => {
                    self.recv = RecvPhase::Header { filled: filled + n };
                }
                RecvPhase::Header { .. } => {
                    self.recv = RecvPhase::Header { filled: 0 };
                    self.on_header(lane, reqs, results)?;
                }
                RecvPhase::Payload { req, done } => {
                    let done = done + n;
                    if done == reqs[req].dst.as_ref().map_or(0, |d| d.len()) {
                        self.recv = RecvPhase::Header { filled: 0 };
                        self.complete(&mut reqs[req], results, Ok(()));
                    } else {
                        self.recv = RecvPhase::Payload { req, done };
                    }
                }
            }
        }
        Ok(progress)
    }

    /// A complete response header: match it to an awaiting request of this lane.
    fn on_header(
        &mut self,
        lane: usize,
        reqs: &mut [Req<'_>],
        results: &mut [TransferResult],
    ) -> Result<(), TransferError> {
        let resp = ResponseHeader::decode(&self.header)
            .map_err(|e| TransferError::Protocol(e.to_string()))?;
        let r = resp
            .request_id
            .checked_sub(reqs.first().map_or(0, |q| q.id))
            .and_then(|k| usize::try_from(k).ok())
            .filter(|&k| k < reqs.len() && reqs[k].lane == lane)
            .filter(|&k| reqs[k].state == ReqState::Awaiting)
            .ok_or_else(|| {
                TransferError::Protocol(format!(
                    "response for request id {}, which is not awaiting an answer here",
                    resp.request_id
                ))
            })?;
        let req = &mut reqs[r];
        if resp.status != 0 {
            if resp.len != 0 {
                return Err(TransferError::Protocol(format!(
                    "error response {} carries {} payload bytes, expected 0",
                    resp.status, resp.len
                )));
            }
            let refused = Err(TransferError::Refused {
                status: resp.status,
            });
            self.complete(req, results, refused);
            return Ok(());
        }
        let expected = req.dst.as_ref().map_or(0, |d| d.len() as u64);
        if resp.len != expected {
            return Err(TransferError::Protocol(format!(
                "response to request {} carries {} payload bytes, expected {expected}",
                resp.request_id, resp.len
            )));
        }
        if expected == 0 {
            self.complete(req, results, Ok(()));
        } else {
            self.recv = RecvPhase::Payload { req: r, done: 0 };
        }
        Ok(())
    }

    fn complete(&mut self, req: &mut Req<'_>, results: &mut [TransferResult], r: TransferResult) {
        assert!(req.state != ReqState::Done, "a request is answered once");
        assert!(
            self.awaiting > 0,
            "an answer arrived with no request awaiting it"
        );
        req.state = ReqState::Done;
        results[req.index] = r;
        self.awaiting -= 1;
        self.answered += 1;
    }

    /// Fails every unanswered request of the lane with `e` and shuts the connection down;
    /// the slot reconnects on its next use.
    fn fail(&mut self, reqs: &mut [Req<'_>], results: &mut [TransferResult], e: &TransferError) {
        for &r in &self.queue {
            let req = &mut reqs[r];
            if req.state != ReqState::Done {
                req.state = ReqState::Done;
                results[req.index] = Err(e.clone());
            }
        }
        self.failed = true;
        if let Some(stream) = self.guard.take() {
            // A reset, not a shutdown: unsent WRITE payloads must never land later.
            rawio::abort(stream);
        }
    }

    /// The `poll` events this lane waits for.
    fn poll_events(&self) -> libc::c_short {
        let mut events = 0;
        if self.awaiting > 0 {
            events |= libc::POLLIN;
        }
        if self.can_send() && self.send_blocked {
            events |= libc::POLLOUT;
        }
        events
    }
}

/// A batch running on its locked lanes.
struct Batch<'a, 'r> {
    reqs: Vec<Req<'a>>,
    results: &'r mut [TransferResult],
    io_timeout: Duration,
}

impl Batch<'_, '_> {
    /// Drives every lane until each has all its requests answered or has failed.
    fn run(&mut self, lanes: &mut [Lane<'_>]) {
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(lanes.len());
        let mut polled: Vec<usize> = Vec::with_capacity(lanes.len());
        loop {
            let live = lanes.iter().filter(|l| !l.finished()).count();
            if live == 0 {
                return;
            }
            for i in 0..lanes.len() {
                if lanes[i].can_send() && !lanes[i].send_blocked {
                    let blocking = live == 1 && lanes[i].may_block_on_send();
                    let r = lanes[i].send(&mut self.reqs, blocking);
                    self.settle(lanes, i, r);
                }
            }
            if live == 1 {
                // One lane: with nothing to send, wait for responses in the kernel.
                if let Some(i) = lanes.iter().position(|l| !l.finished() && !l.can_send()) {
                    let r = lanes[i].receive(i, &mut self.reqs, self.results, true);
                    self.settle(lanes, i, r);
                    continue;
                }
            }
            fds.clear();
            polled.clear();
            let mut wait = self.io_timeout;
            let now = Instant::now();
            for (i, lane) in lanes.iter().enumerate() {
                let events = lane.poll_events();
                if lane.finished() || events == 0 {
                    continue;
                }
                let idle = now.saturating_duration_since(lane.last_progress);
                wait = wait.min(self.io_timeout.saturating_sub(idle));
                fds.push(libc::pollfd {
                    fd: lane.fd,
                    events,
                    revents: 0,
                });
                polled.push(i);
            }
            if fds.is_empty() {
                continue;
            }
            if let Err(e) = rawio::poll(&mut fds, wait) {
                let e = TransferError::from_io(&e);
                for &i in &polled {
                    lanes[i].fail(&mut self.reqs, self.results, &e);
                }
                return;
            }
            for (k, &i) in polled.iter().enumerate() {
                let revents = fds[k].revents;
                if revents & (libc::POLLOUT | libc::POLLERR | libc::POLLHUP) != 0 {
                    lanes[i].send_blocked = false;
                }
                if revents & libc::POLLNVAL != 0 {
                    let e = TransferError::Connection {
                        kind: io::ErrorKind::Other,
                        message: "the lane's socket is not open".into(),
                    };
                    lanes[i].fail(&mut self.reqs, self.results, &e);
                } else if revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0 {
                    let r = lanes[i].receive(i, &mut self.reqs, self.results, false);
                    self.settle(lanes, i, r);
                }
            }
            self.expire(lanes);
        }
    }

    /// Fails lane `i` if `r` is an error.
    fn settle(&mut self, lanes: &mut [Lane<'_>], i: usize, r: Result<bool, TransferError>) {
        if let Err(e) = r {
            lanes[i].fail(&mut self.reqs, self.results, &e);
        }
    }

    /// Fails the lanes that made no progress for the I/O timeout.
    fn expire(&mut self, lanes: &mut [Lane<'_>]) {
        let now = Instant::now();
        for lane in lanes.iter_mut() {
            if !lane.finished()
                && now.saturating_duration_since(lane.last_progress) >= self.io_timeout
            {
                lane.fail(&mut self.reqs, self.results, &TransferError::Timeout);
            }
        }
    }
}

/// How long a caller waiting for a response polls the socket before sleeping in `recv`
/// (`MC_TCP_BUSY_POLL_US`, default 50 µs; 0 turns it off). A loopback or LAN answer usually
/// arrives within that, and a sleeping caller pays a wake-up (20-40 µs on these VMs) per
/// request; past it the caller sleeps, so a slow peer costs no more than this much CPU.
fn busy_poll() -> std::time::Duration {
    static BUDGET: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| protocol::env::micros("MC_TCP_BUSY_POLL_US", BUSY_POLL_DEFAULT_US))
}

/// Default of [`busy_poll`].
const BUSY_POLL_DEFAULT_US: u64 = 50;
