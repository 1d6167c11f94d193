//! One connection of a shard: its socket, its receive state machine and its response queue.
//!
//! Receive states, one `recv` in flight at a time:
//!
//! ```text
//!   Header ──WRITE ok──▶ Payload (into the target range, under a lease) ──▶ Header
//!     │  ──WRITE refused, len > 0──▶ Drain (into a scratch buffer) ──────────▶ Header
//!     │  ──CATALOG_PUT, len > 0────▶ Record (into a small owned buffer) ─────▶ Header
//!     │  ──READ / refused / len 0──▶ (response queued) ──────────────────────▶ Header
//!     └──bad header──▶ (error queued, close after it is sent)
//! ```
//!
//! With a cluster secret, the first 32-byte frames of a connection are handshake frames
//! (`protocol::auth`, the same size as a request header): they are received into the same
//! header buffer and answered by the connection's [`ServerHandshake`] until it accepts;
//! a request header before that is answered `ERR_REJECT_HANDSHAKE` and the connection closes.
//!
//! The state travels inside the `Recv` operation while the kernel works on it and comes
//! back with the completion; the connection keeps only what is not in flight.

use std::collections::VecDeque;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Instant;

use io_uring::{opcode, squeue, types};
use protocol::auth::{ServerHandshake, Token};

use crate::limits::PAYLOAD_RECV_CHUNK_BYTES;
use crate::recovery::Declared;
use crate::shard::send::Response;
use crate::shard::view::MemoryLease;
use crate::transport::header::{RequestHeader, REQUEST_HEADER_BYTES};
use crate::TeError;

/// A request header being received.
pub(crate) type HeaderBuf = Box<[u8; REQUEST_HEADER_BYTES]>;

/// What the connection's receive is doing; see the module docs.
pub(crate) enum RecvState {
    /// `filled` bytes of the next header are in `buf`.
    Header { buf: HeaderBuf, filled: usize },
    /// A WRITE's payload: `done` of `req.len` bytes are in the target range.
    Payload {
        req: RequestHeader,
        done: u64,
        lease: MemoryLease,
        header: HeaderBuf,
    },
    /// A CATALOG_PUT's record: `done` of `req.len` bytes are in `buf` (`req.len` is at most
    /// `CATALOG_RECORD_MAX_BYTES`, checked when the header decoded).
    Record {
        req: RequestHeader,
        done: usize,
        buf: Box<[u8]>,
        header: HeaderBuf,
    },
    /// A refused WRITE's payload being discarded: `done` of `req.len` bytes read.
    Drain {
        req: RequestHeader,
        code: TeError,
        done: u64,
        scratch: Box<[u8]>,
        header: HeaderBuf,
    },
}

impl RecvState {
    /// The receive entry for this state. Pointers in it target the header buffer or scratch
    /// the state owns, or the leased range.
    pub(crate) fn entry(&mut self, fd: i32) -> squeue::Entry {
        let fd = types::Fd(fd);
        let (ptr, len): (*mut u8, u64) = match self {
            RecvState::Header { buf, filled } => {
                // `filled < REQUEST_HEADER_BYTES` whenever a header receive is submitted.
                let rest = &mut buf[*filled..];
                (rest.as_mut_ptr(), rest.len() as u64)
            }
            RecvState::Payload { req, done, .. } => {
                let left = (req.len - *done).min(PAYLOAD_RECV_CHUNK_BYTES);
                // `req.addr + done` lies inside the leased range (done < len), which
                // MemoryView::check found addressable.
                ((req.addr + *done) as usize as *mut u8, left)
            }
            RecvState::Record { done, buf, .. } => {
                // `done < buf.len()` whenever a record receive is submitted.
                let rest = &mut buf[*done..];
                (rest.as_mut_ptr(), rest.len() as u64)
            }
            RecvState::Drain {
                req, done, scratch, ..
            } => {
                let left = (req.len - *done).min(scratch.len() as u64);
                (scratch.as_mut_ptr(), left)
            }
        };
        // Every length above is at most PAYLOAD_RECV_CHUNK_BYTES or a buffer's length, both
        // asserted in limits.rs to fit u32.
        opcode::Recv::new(fd, ptr, len as u32)
            .flags(libc::MSG_WAITALL)
            .build()
    }

    /// True when the peer is in the middle of a frame (so silence counts as a stall).
    pub(crate) fn mid_frame(&self) -> bool {
        !matches!(self, RecvState::Header { filled: 0, .. })
    }

    /// The lease held by this state, if any.
    pub(crate) fn into_lease(self) -> Option<MemoryLease> {
        match self {
            RecvState::Payload { lease, .. } => Some(lease),
            _ => None,
        }
    }
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ConnPhase {
    /// Receiving requests and sending responses.
    Open,
    /// A bad header was answered; close once the queued responses are sent.
    CloseAfterSend,
    /// Shut down; the slot is freed when the last operation completes.
    Closing,
}

/// One accepted connection.
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    pub(crate) phase: ConnPhase,
    /// Operations in flight that name this connection.
    pub(crate) ops: u32,
    pub(crate) send_in_flight: bool,
    /// True while a receive is in flight mid-frame (see [`RecvState::mid_frame`]).
    pub(crate) recv_mid_frame: bool,
    /// A receive held back until the response queue drains (backpressure).
    pub(crate) parked: Option<RecvState>,
    pub(crate) queue: VecDeque<Response>,
    pub(crate) last_progress: Instant,
    /// Drain scratch kept between refused WRITEs.
    pub(crate) spare_scratch: Option<Box<[u8]>>,
    /// The handshake still to complete before requests are served (`None`: authenticated,
    /// or no secret configured).
    pub(crate) auth: Option<Box<ServerHandshake>>,
    /// The term this connection's WRITEs belong to (a FENCE request, `recovery::fence`); dropped
    /// with the connection.
    pub(crate) declared: Option<Declared>,
}

impl Conn {
    pub(crate) fn new(stream: TcpStream, auth: Option<&'static Token>) -> Conn {
        Conn {
            stream,
            phase: ConnPhase::Open,
            ops: 0,
            send_in_flight: false,
            recv_mid_frame: false,
            parked: None,
            queue: VecDeque::new(),
            last_progress: Instant::now(),
            spare_scratch: None,
            auth: auth.map(|t| Box::new(ServerHandshake::new(t))),
            declared: None,
        }
    }

    pub(crate) fn fd(&self) -> i32 {
        self.stream.as_raw_fd()
    }

    /// True when silence from the peer should count against the I/O timeout.
    /// A connection still authenticating is always busy: a silent stranger is timed out.
    pub(crate) fn busy(&self) -> bool {
        self.recv_mid_frame || self.send_in_flight || self.auth.is_some()
    }
}
