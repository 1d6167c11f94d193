//! The TCP data-plane server: blocking, one thread per connection.
//!
//! This is the portable path, used when io_uring is refused (EPERM/ENOSYS) or disabled with
//! `MC_DISABLE_IO_URING=1`. It serves the frames of [`crate::transport::header`] against a
//! [`ServedMemory`] table:
//!
//! - WRITE: the range is checked; the payload is received straight into the target range
//!   (no staging copy); then an OK response. A refused WRITE's payload is read into a small
//!   scratch buffer and discarded, memory untouched, and the connection goes on.
//! - READ: the range is checked; an OK response header then the bytes straight from memory;
//!   or an error response with no payload.
//! - CATALOG_PUT: the record (at most `CATALOG_RECORD_MAX_BYTES`) is read into a small
//!   buffer, then [`ServedMemory::catalog_put`] checks the object's range exactly as a WRITE
//!   would and records it in the table's [`Catalog`]; OK or the refusal code, and the
//!   connection goes on.
//! - A header that does not decode (bad magic, version, opcode, flags, oversized length)
//!   gets an `ERR_INVALID_ARGUMENT` response and the connection is closed: its framing can no
//!   longer be trusted. A truncated header or payload, a timeout or a reset closes only that
//!   connection.
//!
//! Requests on a connection are served in order and responses carry the request id, so a
//! client may keep many requests in flight per connection (pipelining) and must match
//! responses by id (the io_uring shard will complete out of order).
//!
//! Invariants: memory is touched only inside a range that [`Registry::check`] accepted, and
//! the table's read lock is held from that check until the payload I/O ends, so
//! [`ServedMemory::unregister`] returns only once no request is using the buffer any more.
//! The cost: an unregister waits for in-flight payloads (each bounded by the I/O timeout).
//!
//! io_uring shards check ranges against their own copy of the table instead
//! (`crate::mem::served`, "generations and gates").

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::acceptor::{AcceptPolicy, Acceptor, Connections};
use crate::limits::{BLOCKING_CONNECTIONS_MAX, DRAIN_CHUNK_BYTES};
use crate::mem::served::{ServedMemory, ServerConfig, ServerStats};
use crate::mem::Registry;
use crate::recovery::{Declared, RecordKind};
use crate::sys::rawio;
use crate::transport::header::{
    Opcode, RequestHeader, ResponseHeader, REQUEST_HEADER_BYTES, RESPONSE_HEADER_BYTES,
};
use crate::TeError;
use protocol::auth::{self, ServerRefusal, Token};

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

struct Shared {
    memory: Arc<ServedMemory>,
    config: ServerConfig,
    stats: ServerStats,
    /// Set when the server stops: a connection cut then is not counted as aborted.
    stop: AtomicBool,
}

impl Connections for Shared {
    fn serve(&self, stream: &TcpStream) {
        serve_connection(stream, self);
    }

    fn accepted(&self) {
        bump(&self.stats.connections_accepted);
    }

    fn refused(&self) {
        bump(&self.stats.connections_refused);
    }
}

/// A running server. Dropping it stops accepting, closes every connection and joins its
/// threads.
pub struct TcpServer {
    acceptor: Acceptor<Shared>,
}

impl TcpServer {
    /// Binds `addr` (port 0 picks a free port) and starts serving `memory`.
    pub fn bind(
        addr: SocketAddr,
        memory: Arc<ServedMemory>,
        config: ServerConfig,
    ) -> io::Result<TcpServer> {
        if config.io_timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "io_timeout must be > 0",
            ));
        }
        let listener = TcpListener::bind(addr)?;
        rawio::tune_listener(listener.as_raw_fd());
        let policy = AcceptPolicy {
            name: "dp",
            max_connections: config.max_connections.min(BLOCKING_CONNECTIONS_MAX),
            io_timeout: config.io_timeout,
        };
        let shared = Arc::new(Shared {
            memory,
            config,
            stats: ServerStats::default(),
            stop: AtomicBool::new(false),
        });
        Ok(TcpServer {
            acceptor: Acceptor::spawn(listener, policy, shared)?,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.acceptor.local_addr()
    }

    /// The server's counters.
    pub fn stats(&self) -> &ServerStats {
        &self.acceptor.handler().stats
    }

    /// Number of connections being served now.
    pub fn connection_count(&self) -> usize {
        self.acceptor.connection_count()
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        // Before the acceptor (a field, dropped after this) cuts the connections.
        self.acceptor.handler().stop.store(true, Ordering::SeqCst);
    }
}

/// How serving one request ended.
enum Served1 {
    /// The connection can carry the next request.
    Continue,
    /// The connection must close (bad framing, I/O error, peer gone).
    Close,
}

fn serve_connection(stream: &TcpStream, shared: &Shared) {
    if let Some(token) = shared.config.auth {
        if !authenticate(stream, shared, token) {
            return;
        }
    }
    let mut raw = [0u8; REQUEST_HEADER_BYTES];
    // The term this connection's WRITEs belong to (FENCE); dropped when the connection ends.
    let mut declared: Option<Declared> = None;
    loop {
        match rawio::read_full(stream, &mut raw) {
            Ok(0) => return, // clean close between requests
            Ok(n) if n == REQUEST_HEADER_BYTES => {}
            Ok(_) | Err(_) => {
                bump(&shared.stats.connections_aborted);
                return;
            }
        }
        let outcome = match RequestHeader::decode(&raw) {
            Ok(req) => serve_request(stream, shared, &req, &mut declared),
            Err(_) => {
                bump(&shared.stats.frames_malformed);
                let id = RequestHeader::salvage_request_id(&raw).unwrap_or(u64::MAX);
                let _ = respond(stream, id, TeError::InvalidArgument.code(), 0, false);
                Served1::Close
            }
        };
        if let Served1::Close = outcome {
            if !shared.stop.load(Ordering::Relaxed) {
                bump(&shared.stats.connections_aborted);
            }
            return;
        }
    }
}

/// The handshake on a new connection; false when the connection must close (a peer that
/// sent a request first has had its `ERR_REJECT_HANDSHAKE` answer).
fn authenticate(stream: &TcpStream, shared: &Shared, token: &'static Token) -> bool {
    handshake(stream, token, &shared.stats.connections_unauthenticated)
}

/// The server's side of the cluster-secret handshake on an accepted connection, exactly as
/// this server runs it: true when the peer proved the secret; false when the connection must
/// close (a peer that sent a request first has had its `ERR_REJECT_HANDSHAKE` answer and a
/// short linger). `refused` counts a failure before anything is answered, so a peer that
/// saw its refusal finds it counted. Exported for the other blocking listeners that speak
/// these frames (the disk tier's, `client::disk`), so every data-plane port refuses
/// strangers the same way.
pub fn handshake(stream: &TcpStream, token: &Token, refused: &AtomicU64) -> bool {
    let mut s = stream;
    match auth::server_handshake(&mut s, token) {
        Ok(()) => true,
        Err(ServerRefusal::NotHandshake(raw)) => {
            bump(refused);
            let id = RequestHeader::salvage_request_id(&raw).unwrap_or(u64::MAX);
            if respond(stream, id, TeError::RejectHandshake.code(), 0, false).is_ok() {
                linger(stream);
            }
            false
        }
        Err(ServerRefusal::Failed(why)) => {
            tracing::debug!(error = %why, "data-plane peer failed authentication");
            bump(refused);
            false
        }
    }
}

/// After a refusal: stop sending, then read and drop what the peer still sends for a moment
/// (bounded), so that closing with unread bytes does not reset the connection before the
/// peer has read its answer.
fn linger(stream: &TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(REFUSAL_LINGER));
    let mut sink = [0u8; DRAIN_CHUNK_BYTES];
    let mut left = REFUSAL_LINGER_BYTES;
    let mut s = stream;
    while left > 0 {
        match std::io::Read::read(&mut s, &mut sink) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// How long, and for how many bytes, a refused peer is read after its answer.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);
const REFUSAL_LINGER_BYTES: usize = 1 << 20;

fn respond(stream: &TcpStream, id: u64, status: i32, len: u64, more: bool) -> io::Result<()> {
    let header = ResponseHeader {
        status,
        request_id: id,
        len,
    }
    .encode();
    debug_assert_eq!(header.len(), RESPONSE_HEADER_BYTES);
    rawio::send_all(stream.as_raw_fd(), &header, more)
}

/// The status a request's range earns: OK only for a non-empty range in one buffer.
fn range_status(registry: &Registry, req: &RequestHeader) -> Result<(), TeError> {
    if req.len == 0 {
        return Err(TeError::InvalidArgument);
    }
    if !registry.check(req.addr, req.len) || usize::try_from(req.addr).is_err() {
        return Err(TeError::AddressNotRegistered);
    }
    Ok(())
}

fn serve_request(
    stream: &TcpStream,
    shared: &Shared,
    req: &RequestHeader,
    declared: &mut Option<Declared>,
) -> Served1 {
    let fd = stream.as_raw_fd();
    if req.opcode == Opcode::Fence {
        return serve_fence(stream, shared, req, declared);
    }
    let served = shared.memory.read();
    // A WRITE of a declared term: marked as writing until its payload is in (`recovery::fence`).
    let writer = declared.as_ref().filter(|_| req.opcode == Opcode::Write);
    let verdict = range_status(&served.registry, req).and_then(|()| match writer {
        Some(d) if !d.begin_write() => Err(TeError::Metadata),
        _ => Ok(()),
    });
    let io_result = match (req.opcode, verdict) {
        (Opcode::CatalogPut, _) => {
            // Its range is the record's, not the header's: checked by `catalog_put`.
            drop(served);
            return serve_catalog_put(stream, shared, req);
        }
        (Opcode::Fence, _) => {
            // Served above; kept so the match stays total.
            drop(served);
            respond(
                stream,
                req.request_id,
                TeError::InvalidArgument.code(),
                0,
                false,
            )
        }
        (Opcode::Write, Ok(())) => {
            // SAFETY: the range lies inside one registered buffer (checked above, and the read
            // guard `served` keeps it registered until this I/O ends); registration's contract
            // makes it live, writable memory that no Rust reference claims exclusively.
            let r = unsafe { rawio::recv_exact_raw(fd, req.addr as *mut u8, req.len as usize) };
            if let Some(d) = writer {
                d.end_write();
            }
            drop(served);
            r.and_then(|()| respond(stream, req.request_id, 0, 0, false))
        }
        (Opcode::Read, Ok(())) => {
            let r = respond(stream, req.request_id, 0, req.len, true).and_then(|()| {
                // SAFETY: as for WRITE; the range is live and readable while `served` lives.
                unsafe { rawio::send_all_raw(fd, req.addr as *const u8, req.len as usize, false) }
            });
            drop(served);
            r
        }
        (opcode, Err(code)) => {
            drop(served);
            bump(&shared.stats.requests_rejected);
            let drained = match opcode {
                Opcode::Write | Opcode::CatalogPut => drain(stream, req.len),
                Opcode::Read | Opcode::Fence => Ok(()),
            };
            drained.and_then(|()| respond(stream, req.request_id, code.code(), 0, false))
        }
    };
    match io_result {
        Ok(()) => {
            if verdict.is_ok() {
                bump(&shared.stats.requests_ok);
            }
            Served1::Continue
        }
        Err(_) => Served1::Close,
    }
}

/// FENCE: the connection's WRITEs are of term `addr` from now on (`recovery::fence`). A term the
/// fence already refuses gets ERR_METADATA and the connection closes: it must not go on
/// writing as if it had declared nothing.
fn serve_fence(
    stream: &TcpStream,
    shared: &Shared,
    req: &RequestHeader,
    declared: &mut Option<Declared>,
) -> Served1 {
    let (status, next) = match shared
        .memory
        .catalog()
        .fences()
        .declare(stream.as_raw_fd(), req.addr)
    {
        Ok(d) => {
            *declared = d;
            bump(&shared.stats.requests_ok);
            (0, Served1::Continue)
        }
        Err(code) => {
            bump(&shared.stats.requests_rejected);
            (code.code(), Served1::Close)
        }
    };
    match respond(stream, req.request_id, status, 0, false) {
        Ok(()) => next,
        Err(_) => Served1::Close,
    }
}

/// CATALOG_PUT: the record (bounded by the header decoder) into a small buffer, then
/// [`ServedMemory::catalog_put`].
fn serve_catalog_put(stream: &TcpStream, shared: &Shared, req: &RequestHeader) -> Served1 {
    // `len <= CATALOG_RECORD_MAX_BYTES` (checked when the header decoded): a small buffer.
    let mut record = vec![0u8; req.len as usize];
    if rawio::read_exact(stream, &mut record).is_err() {
        return Served1::Close;
    }
    let (status, more) = match shared.memory.catalog_put(req.addr, &record) {
        Ok(kind) => {
            bump(&shared.stats.requests_ok);
            // An intent's answer goes out with its WRITE's (MSG_MORE) when that is already
            // arriving: one wake-up for the client, not two. A lone intent (an RDMA writer's,
            // its bytes go by RDMA once it is answered) is answered at once.
            let held = kind == RecordKind::Intent && rawio::has_pending(stream.as_raw_fd());
            (0, held)
        }
        Err(code) => {
            bump(&shared.stats.requests_rejected);
            (code.code(), false)
        }
    };
    match respond(stream, req.request_id, status, 0, more) {
        Ok(()) => Served1::Continue,
        Err(_) => Served1::Close,
    }
}

/// Reads and discards `len` payload bytes of a refused WRITE.
fn drain(stream: &TcpStream, len: u64) -> io::Result<()> {
    let mut scratch = [0u8; DRAIN_CHUNK_BYTES];
    let mut left = len;
    while left > 0 {
        let chunk = left.min(DRAIN_CHUNK_BYTES as u64) as usize;
        rawio::read_exact(stream, &mut scratch[..chunk])?;
        left -= chunk as u64;
    }
    Ok(())
}
