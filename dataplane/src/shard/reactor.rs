//! The shard's event loop.
//!
//! ```text
//! loop:
//!   submit queued entries, wait for >= 1 completion (at most SHARD_TICK)
//!   for each completion: find its Op by user_data, take it out of the slab, run its handler
//!     (handlers queue responses and push the next entries)
//!   every SHARD_TICK: close connections silent mid-frame for longer than the I/O timeout,
//!     retry a failed accept
//!   record the iteration's busy time in the stall detector
//! until stopping and no operation is in flight
//! ```
//!
//! Stop: the owner sets the stop flag and writes the eventfd; the `Wake` read completes,
//! the accept is cancelled and every connection shut down, which completes their operations.
//!
//! Invariants: an `Op` is removed from the slab only by its final completion (or abandoned
//! with the ring when stop times out, see [`Reactor::run`]); a connection slot is freed only
//! when its `ops` count is zero; every lease is released exactly once, by the handler of the
//! operation that held it or by [`Reactor::close`] for responses never submitted.

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use protocol::auth::ServerStep;

use crate::limits::{
    CONN_RESPONSES_QUEUED_MAX, DRAIN_CHUNK_BYTES, REQUEST_PAYLOAD_MAX_BYTES, SHARD_RING_ENTRIES,
    SHARD_STOP_DRAIN_TIMEOUT, SHARD_TICK,
};
use crate::mem::served::{ServedMemory, ServerConfig, ServerStats};
use crate::recovery::RecordKind;
use crate::shard::conn::{Conn, ConnPhase, HeaderBuf, RecvState};
use crate::shard::op::{Op, Slab, UNTRACKED};
use crate::shard::send::{Response, SendBatch, SendStage};
use crate::shard::stall::StallDetector;
use crate::shard::view::{MemoryLease, MemoryView};
use crate::sys::rawio;
use crate::transport::header::{Opcode, RequestHeader, REQUEST_HEADER_BYTES};
use crate::TeError;

/// What the owner of a shard and the shard share: counters, the stop flag and its doorbell.
pub(crate) struct ShardShared {
    pub(crate) stats: ServerStats,
    pub(crate) stop: AtomicBool,
    /// eventfd the owner writes to wake the loop for a stop.
    pub(crate) wake: OwnedFd,
    pub(crate) live_connections: AtomicUsize,
    /// READ payload bytes sent with `SENDMSG_ZC` (for the bench and the log).
    pub(crate) zero_copy_bytes: AtomicU64,
}

/// Settings a shard runs with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReactorConfig {
    pub(crate) server: ServerConfig,
    /// Batches with at least this many READ payload bytes use `SENDMSG_ZC`.
    pub(crate) send_zc_min_bytes: u64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Builds the shard's ring: single issuer with deferred task running where the kernel has
/// them (fewer interruptions of the loop), else a plain ring. `EXT_ARG` (a wait with a
/// timeout, kernel 5.11) is required.
pub(crate) fn build_ring() -> io::Result<IoUring> {
    let tuned = IoUring::builder()
        .setup_cqsize(SHARD_RING_ENTRIES * 2)
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(SHARD_RING_ENTRIES);
    let ring = match tuned {
        Ok(ring) => ring,
        Err(_) => IoUring::builder()
            .setup_cqsize(SHARD_RING_ENTRIES * 2)
            .build(SHARD_RING_ENTRIES)?,
    };
    if !ring.params().is_feature_ext_arg() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "kernel lacks IORING_FEAT_EXT_ARG (needs Linux 5.11)",
        ));
    }
    Ok(ring)
}

/// One shard's loop and everything it owns.
pub(crate) struct Reactor {
    ring: IoUring,
    listener: TcpListener,
    ops: Slab<Op>,
    conns: Slab<Conn>,
    view: MemoryView,
    shared: Arc<ShardShared>,
    config: ReactorConfig,
    stall: StallDetector,
    accept_ud: Option<u64>,
    accept_retry_at: Option<Instant>,
    stopping: Option<Instant>,
    next_tick: Instant,
    completions: Vec<(u64, i32, u32)>,
}

impl Reactor {
    pub(crate) fn new(
        ring: IoUring,
        listener: TcpListener,
        memory: Arc<ServedMemory>,
        shared: Arc<ShardShared>,
        config: ReactorConfig,
    ) -> Reactor {
        Reactor {
            ring,
            listener,
            ops: Slab::default(),
            conns: Slab::default(),
            view: MemoryView::new(memory),
            shared,
            config,
            stall: StallDetector::default(),
            accept_ud: None,
            accept_retry_at: None,
            stopping: None,
            next_tick: Instant::now() + SHARD_TICK,
            completions: Vec::with_capacity(SHARD_RING_ENTRIES as usize * 2),
        }
    }

    /// Runs until stopped. If operations are still in flight [`SHARD_STOP_DRAIN_TIMEOUT`]
    /// after the stop, their buffers and the memory gate are leaked rather than freed: the
    /// kernel cancels them when the ring closes, and nothing they point at is reused.
    pub(crate) fn run(mut self) {
        self.arm_accept();
        self.arm_wake();
        loop {
            if let Some(since) = self.stopping {
                if self.ops.is_empty() {
                    let leases = self.view.leases_out();
                    if leases != 0 {
                        tracing::error!(leases, "shard stopped with leases outstanding");
                    }
                    break;
                }
                if since.elapsed() > SHARD_STOP_DRAIN_TIMEOUT {
                    tracing::error!(
                        in_flight = self.ops.len(),
                        "shard stop timed out; abandoning in-flight operations"
                    );
                    std::mem::forget(std::mem::take(&mut self.ops));
                    let Reactor { view, .. } = self;
                    view.abandon();
                    return;
                }
            }
            self.wait();
            let started = Instant::now();
            self.handle_completions();
            if started >= self.next_tick {
                self.next_tick = started + SHARD_TICK;
                self.tick(started);
            }
            self.stall.record(&self.shared.stats, started.elapsed());
        }
    }

    fn wait(&mut self) {
        let ts = types::Timespec::from(SHARD_TICK);
        let args = types::SubmitArgs::new().timespec(&ts);
        match self.ring.submitter().submit_with_args(1, &args) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(e) => {
                tracing::error!(error = %e, "io_uring_enter failed");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Queues `entry` for `op`; the op is owned by the slab until its completion.
    fn submit(&mut self, op: Op, entry: squeue::Entry) -> u64 {
        let ud = self.ops.insert(op) as u64;
        self.push(entry.user_data(ud));
        ud
    }

    fn push(&mut self, entry: squeue::Entry) {
        loop {
            // SAFETY: every pointer in `entry` targets a buffer owned by the Op stored under
            // its user_data (heap allocations that do not move and are not freed before the
            // Op's final completion), or registered memory covered by a lease held by that
            // Op, or nothing.
            if unsafe { self.ring.submission().push(&entry) }.is_ok() {
                return;
            }
            // Queue full: hand the queued entries to the kernel to make room.
            if let Err(e) = self.ring.submit() {
                if e.raw_os_error() != Some(libc::EBUSY) && e.raw_os_error() != Some(libc::EINTR) {
                    tracing::error!(error = %e, "io_uring submit failed");
                }
            }
        }
    }

    fn arm_accept(&mut self) {
        let entry = opcode::Accept::new(
            types::Fd(self.listener.as_raw_fd()),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .flags(libc::SOCK_CLOEXEC)
        .build();
        self.accept_ud = Some(self.submit(Op::Accept, entry));
    }

    fn arm_wake(&mut self) {
        let mut buf = Box::new(0u64);
        let entry = opcode::Read::new(
            types::Fd(self.shared.wake.as_raw_fd()),
            (&mut *buf as *mut u64).cast(),
            8,
        )
        .build();
        self.submit(Op::Wake { buf }, entry);
    }

    fn handle_completions(&mut self) {
        let mut batch = std::mem::take(&mut self.completions);
        batch.clear();
        batch.extend(
            self.ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags())),
        );
        for &(ud, res, flags) in &batch {
            self.complete(ud, res, flags);
        }
        self.completions = batch;
    }

    fn complete(&mut self, ud: u64, mut res: i32, flags: u32) {
        if ud == UNTRACKED {
            return;
        }
        let index = ud as usize;
        if let Some(Op::Send { batch, .. }) = self.ops.get_mut(index) {
            if cqueue::more(flags) {
                // SENDMSG_ZC: the result now, the buffers' release later.
                batch.stage = SendStage::AwaitingNotif { result: res };
                return;
            }
            if let SendStage::AwaitingNotif { result } = batch.stage {
                res = result;
            }
        }
        let Some(op) = self.ops.remove(index) else {
            tracing::debug!(ud, "completion for an unknown operation");
            return;
        };
        match op {
            Op::Accept => self.on_accept(res),
            Op::Wake { buf } => {
                drop(buf);
                if self.shared.stop.load(Ordering::SeqCst) {
                    self.begin_stop();
                } else if self.stopping.is_none() {
                    self.arm_wake();
                }
            }
            Op::Recv { conn, state } => self.on_recv(conn, state, res),
            Op::Send { conn, batch } => self.on_send(conn, batch, res),
        }
    }

    fn begin_stop(&mut self) {
        if self.stopping.is_some() {
            return;
        }
        self.stopping = Some(Instant::now());
        if let Some(ud) = self.accept_ud.take() {
            if self.ops.get(ud as usize).is_some() {
                self.push(opcode::AsyncCancel::new(ud).build().user_data(UNTRACKED));
            }
        }
        for id in self.conns.indices() {
            self.close(id, false);
        }
    }

    fn on_accept(&mut self, res: i32) {
        self.accept_ud = None;
        if self.stopping.is_some() {
            if res >= 0 {
                // SAFETY: `res` is a descriptor the kernel just created for us alone.
                drop(unsafe { OwnedFd::from_raw_fd(res) });
            }
            return;
        }
        if res < 0 {
            self.accept_retry_at = Some(Instant::now() + crate::limits::ACCEPT_ERROR_BACKOFF);
            return;
        }
        // SAFETY: `res` is a connected socket the kernel just created for us alone.
        let stream = unsafe { TcpStream::from_raw_fd(res) };
        self.arm_accept();
        let stats = &self.shared.stats;
        if self.conns.len() >= self.config.server.max_connections
            || stream.set_nodelay(true).is_err()
        {
            bump(&stats.connections_refused);
            return;
        }
        rawio::set_buffer_sizes(stream.as_raw_fd());
        bump(&stats.connections_accepted);
        let id = self
            .conns
            .insert(Conn::new(stream, self.config.server.auth));
        self.shared.live_connections.fetch_add(1, Ordering::Relaxed);
        let buf: HeaderBuf = Box::new([0u8; REQUEST_HEADER_BYTES]);
        self.submit_recv(id, RecvState::Header { buf, filled: 0 });
    }

    fn submit_recv(&mut self, id: usize, mut state: RecvState) {
        let Some(conn) = self.conns.get_mut(id) else {
            return;
        };
        let entry = state.entry(conn.fd());
        conn.ops += 1;
        conn.recv_mid_frame = state.mid_frame();
        self.submit(Op::Recv { conn: id, state }, entry);
    }

    /// Receives the next header, unless too many responses wait for the peer to read.
    fn next_header(&mut self, id: usize, buf: HeaderBuf) {
        let state = RecvState::Header { buf, filled: 0 };
        match self.conns.get_mut(id) {
            Some(c) if c.phase == ConnPhase::Open => {
                if c.queue.len() >= CONN_RESPONSES_QUEUED_MAX {
                    c.parked = Some(state);
                } else {
                    self.submit_recv(id, state);
                }
            }
            _ => {}
        }
    }

    /// Marks an operation of `id` complete; false (and the state released) when the
    /// connection is closing.
    fn op_done(&mut self, id: usize) -> bool {
        let stopping = self.stopping.is_some();
        let Some(c) = self.conns.get_mut(id) else {
            return false;
        };
        assert!(
            c.ops > 0,
            "an operation completed that was not counted in flight"
        );
        c.ops -= 1;
        c.last_progress = Instant::now();
        if c.phase == ConnPhase::Closing || stopping {
            self.reap(id);
            return false;
        }
        true
    }

    fn on_recv(&mut self, id: usize, state: RecvState, res: i32) {
        if let Some(c) = self.conns.get_mut(id) {
            c.recv_mid_frame = false;
        }
        if !self.op_done(id) {
            self.release_state(state);
            return;
        }
        if res <= 0 {
            let clean = res == 0 && !state.mid_frame();
            self.release_state(state);
            self.close(id, !clean);
            return;
        }
        let got = res as u64;
        match state {
            RecvState::Header { buf, filled } => {
                let filled = filled + res as usize;
                if filled < REQUEST_HEADER_BYTES {
                    self.submit_recv(id, RecvState::Header { buf, filled });
                } else {
                    self.on_header(id, buf);
                }
            }
            RecvState::Payload {
                req,
                done,
                lease,
                header,
            } => {
                let done = done + got;
                if done < req.len {
                    let state = RecvState::Payload {
                        req,
                        done,
                        lease,
                        header,
                    };
                    self.submit_recv(id, state);
                } else {
                    self.view.release(lease);
                    if let Some(d) = self.conns.get(id).and_then(|c| c.declared.as_ref()) {
                        d.end_write();
                    }
                    self.respond(id, Response::ok(req.request_id));
                    self.next_header(id, header);
                }
            }
            RecvState::Record {
                req,
                done,
                buf,
                header,
            } => {
                let done = done + res as usize;
                if done < buf.len() {
                    let state = RecvState::Record {
                        req,
                        done,
                        buf,
                        header,
                    };
                    self.submit_recv(id, state);
                } else {
                    // Not the byte path: one short critical section per put (see recovery::catalog).
                    match self.view.memory().catalog_put(req.addr, &buf) {
                        // An intent's answer waits for the next answer on its connection (its
                        // WRITE's, which the client sends right behind it), so the client
                        // wakes once for both; a lone intent (an RDMA writer's, nothing behind
                        // it yet) is answered at once.
                        Ok(RecordKind::Intent) if self.has_pending(id) => {
                            self.hold(id, Response::ok(req.request_id))
                        }
                        // Counted in `requests_ok` when the response is sent.
                        Ok(_) => self.respond(id, Response::ok(req.request_id)),
                        Err(code) => {
                            bump(&self.shared.stats.requests_rejected);
                            self.respond(id, Response::error(req.request_id, code));
                        }
                    }
                    self.next_header(id, header);
                }
            }
            RecvState::Drain {
                req,
                code,
                done,
                scratch,
                header,
            } => {
                let done = done + got;
                if done < req.len {
                    let state = RecvState::Drain {
                        req,
                        code,
                        done,
                        scratch,
                        header,
                    };
                    self.submit_recv(id, state);
                } else {
                    if let Some(c) = self.conns.get_mut(id) {
                        c.spare_scratch = Some(scratch);
                    }
                    self.respond(id, Response::error(req.request_id, code));
                    self.next_header(id, header);
                }
            }
        }
    }

    fn on_header(&mut self, id: usize, buf: HeaderBuf) {
        if let Some(hs) = self.conns.get_mut(id).and_then(|c| c.auth.as_mut()) {
            let step = hs.on_frame(&buf[..]);
            self.on_handshake_frame(id, buf, step);
            return;
        }
        let stats = &self.shared.stats;
        let req = match RequestHeader::decode(&buf[..]) {
            Ok(req) => req,
            Err(_) => {
                bump(&stats.frames_malformed);
                let rid = RequestHeader::salvage_request_id(&buf[..]).unwrap_or(u64::MAX);
                if let Some(c) = self.conns.get_mut(id) {
                    c.phase = ConnPhase::CloseAfterSend;
                }
                self.respond(id, Response::error(rid, TeError::InvalidArgument));
                return;
            }
        };
        if req.opcode == Opcode::Fence {
            self.on_fence(id, &req, buf);
            return;
        }
        if req.opcode == Opcode::CatalogPut {
            if req.len == 0 {
                bump(&self.shared.stats.requests_rejected);
                self.respond(
                    id,
                    Response::error(req.request_id, TeError::InvalidArgument),
                );
                self.next_header(id, buf);
                return;
            }
            // `req.len <= CATALOG_RECORD_MAX_BYTES` (checked by the header decoder).
            let record = vec![0u8; req.len as usize].into_boxed_slice();
            let state = RecvState::Record {
                req,
                done: 0,
                buf: record,
                header: buf,
            };
            self.submit_recv(id, state);
            return;
        }
        let mut checked = self.view.check(&req);
        if req.opcode == Opcode::Write && checked.is_ok() {
            // A WRITE of a declared term: marked as writing until its payload is in
            // (`recovery::fence`).
            let refused = self
                .conns
                .get(id)
                .and_then(|c| c.declared.as_ref())
                .is_some_and(|d| !d.begin_write());
            if refused {
                if let Ok(lease) = checked {
                    self.view.release(lease);
                }
                checked = Err(TeError::Metadata);
            }
        }
        match (req.opcode, checked) {
            (Opcode::Fence, Ok(lease)) => {
                // Served above; kept so the match stays total.
                self.view.release(lease);
                self.next_header(id, buf);
            }
            (Opcode::Write, Ok(lease)) => {
                let state = RecvState::Payload {
                    req,
                    done: 0,
                    lease,
                    header: buf,
                };
                self.submit_recv(id, state);
            }
            (Opcode::Read, Ok(lease)) => {
                self.respond(id, Response::read(req.request_id, req.addr, req.len, lease));
                self.next_header(id, buf);
            }
            (Opcode::CatalogPut, Ok(lease)) => {
                // Served above; kept so the match stays total.
                self.view.release(lease);
                self.respond(
                    id,
                    Response::error(req.request_id, TeError::InvalidArgument),
                );
                self.next_header(id, buf);
            }
            (Opcode::Write, Err(code)) if req.len > 0 => {
                bump(&self.shared.stats.requests_rejected);
                debug_assert!(req.len <= REQUEST_PAYLOAD_MAX_BYTES);
                let scratch = self
                    .conns
                    .get_mut(id)
                    .and_then(|c| c.spare_scratch.take())
                    .unwrap_or_else(|| vec![0u8; DRAIN_CHUNK_BYTES].into_boxed_slice());
                let state = RecvState::Drain {
                    req,
                    code,
                    done: 0,
                    scratch,
                    header: buf,
                };
                self.submit_recv(id, state);
            }
            (_, Err(code)) => {
                bump(&self.shared.stats.requests_rejected);
                self.respond(id, Response::error(req.request_id, code));
                self.next_header(id, buf);
            }
        }
    }

    /// FENCE: the connection's WRITEs are of term `req.addr` from now on (`recovery::fence`). A
    /// term the fence already refuses gets ERR_METADATA and the connection closes: it must not
    /// go on writing as if it had declared nothing.
    fn on_fence(&mut self, id: usize, req: &RequestHeader, buf: HeaderBuf) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        let fences = self.view.memory().catalog().fences();
        match fences.declare(c.fd(), req.addr) {
            Ok(d) => {
                c.declared = d;
                self.respond(id, Response::ok(req.request_id));
                self.next_header(id, buf);
            }
            Err(code) => {
                bump(&self.shared.stats.requests_rejected);
                c.phase = ConnPhase::CloseAfterSend;
                self.respond(id, Response::error(req.request_id, code));
            }
        }
    }

    /// Answers a frame received before the connection authenticated.
    fn on_handshake_frame(&mut self, id: usize, buf: HeaderBuf, step: ServerStep) {
        let refusal = match step {
            ServerStep::Reply(frame) => {
                self.respond(id, Response::handshake(frame));
                self.next_header(id, buf);
                return;
            }
            ServerStep::Accept(frame) => {
                if let Some(c) = self.conns.get_mut(id) {
                    c.auth = None;
                }
                self.respond(id, Response::handshake(frame));
                self.next_header(id, buf);
                return;
            }
            ServerStep::Refuse(frame, why) => {
                tracing::debug!(error = %why, "data-plane peer failed authentication");
                Response::handshake(frame)
            }
            ServerStep::NotHandshake => {
                let rid = RequestHeader::salvage_request_id(&buf[..]).unwrap_or(u64::MAX);
                Response::error(rid, TeError::RejectHandshake)
            }
        };
        bump(&self.shared.stats.connections_unauthenticated);
        if let Some(c) = self.conns.get_mut(id) {
            c.phase = ConnPhase::CloseAfterSend;
        }
        self.respond(id, refusal);
    }

    /// Whether the next request of `id` is already arriving (`rawio::has_pending`).
    fn has_pending(&self, id: usize) -> bool {
        self.conns
            .get(id)
            .is_some_and(|c| rawio::has_pending(c.fd()))
    }

    /// Queues `response` without sending it: it goes out with the connection's next one.
    fn hold(&mut self, id: usize, response: Response) {
        match self.conns.get_mut(id) {
            Some(c) if c.phase != ConnPhase::Closing => c.queue.push_back(response),
            _ => {
                if let Some(lease) = response.into_lease() {
                    self.view.release(lease);
                }
            }
        }
    }

    /// Queues a response and starts a send if none is in flight.
    fn respond(&mut self, id: usize, response: Response) {
        self.hold(id, response);
        self.flush(id);
    }

    fn flush(&mut self, id: usize) {
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if c.send_in_flight || c.queue.is_empty() || c.phase == ConnPhase::Closing {
            return;
        }
        let mut batch = SendBatch::new(&mut c.queue);
        batch.zero_copy = batch.payload_bytes >= self.config.send_zc_min_bytes;
        self.submit_send(id, batch);
    }

    fn submit_send(&mut self, id: usize, mut batch: Box<SendBatch>) {
        let Some(c) = self.conns.get_mut(id) else {
            self.release_batch(&mut batch);
            return;
        };
        let fd = types::Fd(c.fd());
        c.ops += 1;
        c.send_in_flight = true;
        batch.stage = SendStage::Submitted;
        // MSG_WAITALL: io_uring retries a short send itself instead of completing it partially.
        let flags = (libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32;
        let entry = if batch.zero_copy {
            opcode::SendMsgZc::new(fd, batch.msg_ptr())
                .flags(flags)
                .build()
        } else {
            opcode::SendMsg::new(fd, batch.msg_ptr())
                .flags(flags)
                .build()
        };
        self.submit(Op::Send { conn: id, batch }, entry);
    }

    fn on_send(&mut self, id: usize, mut batch: Box<SendBatch>, res: i32) {
        if let Some(c) = self.conns.get_mut(id) {
            c.send_in_flight = false;
        }
        if !self.op_done(id) {
            self.release_batch(&mut batch);
            return;
        }
        if res <= 0 {
            self.release_batch(&mut batch);
            self.close(id, true);
            return;
        }
        if batch.zero_copy {
            self.shared
                .zero_copy_bytes
                .fetch_add(res as u64, Ordering::Relaxed);
        }
        if !batch.advance(res as u64) {
            self.submit_send(id, batch);
            return;
        }
        self.shared
            .stats
            .requests_ok
            .fetch_add(batch.ok_count, Ordering::Relaxed);
        self.release_batch(&mut batch);
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if c.queue.is_empty() && c.phase == ConnPhase::CloseAfterSend {
            self.close(id, true);
            return;
        }
        let resume = if c.queue.len() < CONN_RESPONSES_QUEUED_MAX {
            c.parked.take()
        } else {
            None
        };
        self.flush(id);
        if let Some(state) = resume {
            self.submit_recv(id, state);
        }
    }

    fn release_state(&mut self, state: RecvState) {
        if let Some(lease) = state.into_lease() {
            self.view.release(lease);
        }
    }

    fn release_batch(&mut self, batch: &mut SendBatch) {
        for lease in batch.take_leases() {
            self.view.release(lease);
        }
    }

    /// Shuts connection `id` down (completing its operations) and frees it once none is
    /// in flight. `aborted`: counts as an aborted connection unless the shard is stopping.
    fn close(&mut self, id: usize, aborted: bool) {
        let stopping = self.stopping.is_some();
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if c.phase != ConnPhase::Closing {
            // Counted before the shutdown, so the peer never sees the close first.
            if aborted && !stopping {
                bump(&self.shared.stats.connections_aborted);
            }
            c.phase = ConnPhase::Closing;
            let _ = c.stream.shutdown(Shutdown::Both);
            let leases: Vec<MemoryLease> = c
                .queue
                .drain(..)
                .filter_map(Response::into_lease)
                .chain(c.parked.take().and_then(RecvState::into_lease))
                .collect();
            for lease in leases {
                self.view.release(lease);
            }
        }
        self.reap(id);
    }

    /// Frees a closing connection with no operation in flight.
    fn reap(&mut self, id: usize) {
        let stopping = self.stopping.is_some();
        let Some(c) = self.conns.get_mut(id) else {
            return;
        };
        if stopping && c.phase != ConnPhase::Closing {
            // Stop raced with this completion: close() does the bookkeeping.
            self.close(id, false);
            return;
        }
        if c.phase == ConnPhase::Closing && c.ops == 0 {
            self.conns.remove(id);
            self.shared.live_connections.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Periodic work: I/O timeouts and accept retries.
    fn tick(&mut self, now: Instant) {
        if self.stopping.is_some() {
            return;
        }
        let timeout = self.config.server.io_timeout;
        for id in self.conns.indices() {
            let stalled = self.conns.get(id).is_some_and(|c| {
                c.phase != ConnPhase::Closing
                    && c.busy()
                    && now.saturating_duration_since(c.last_progress) > timeout
            });
            if stalled {
                self.close(id, true);
            }
        }
        if self.accept_retry_at.is_some_and(|at| now >= at) {
            self.accept_retry_at = None;
            self.arm_accept();
        }
    }
}
