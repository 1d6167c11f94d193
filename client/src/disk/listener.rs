//! The disk listener: a small blocking server that answers the data plane's frames
//! (`dataplane::transport::header`) from the disk store, so any reader's existing TCP
//! data-plane client reads a disk replica exactly as it reads a memory one.
//!
//! | request | answer |
//! |---|---|
//! | (secret set) anything before the handshake | `ERR_REJECT_HANDSHAKE`, closed, as the data-plane server does (`dataplane::server::blocking::handshake`) |
//! | READ `addr, len` inside one stored object | OK and `len` bytes |
//! | READ elsewhere | `ERR_ADDRESS_NOT_REGISTERED` (-3) |
//! | READ of an object whose checksum fails | `ERR_MEMORY` (-302): the bytes are bad; the file is gone |
//! | READ that fails for another reason (I/O error) | `ERR_CONTEXT` (-202) |
//! | READ of `len` 0 | `ERR_INVALID_ARGUMENT` (-1) |
//! | FENCE | OK |
//! | CATALOG_PUT of a tombstone record | that object's file deleted; OK |
//! | CATALOG_PUT of another record | `ERR_NOT_IMPLEMENTED` (-303) (payload read) |
//! | WRITE | `ERR_NOT_IMPLEMENTED` (-303), its payload drained; the owner writes its own files |
//! | a header that does not decode | `ERR_INVALID_ARGUMENT`, closed |
//!
//! Bounds: at most `DISK_LISTENER_CONNECTIONS_MAX` connections (one thread each; more are
//! closed at once), and a connection without progress for `DISK_LISTENER_IO_TIMEOUT` is
//! closed; accepting is the data-plane server's (`dataplane::server::acceptor`). A READ
//! is read into a block-aligned buffer of its length (at most
//! `DISK_LISTENER_READ_MAX_BYTES`) and sent as the worker fills it, all but its last
//! `DISK_STREAM_HOLD_BYTES`, which wait for the whole object's checksum: a READ whose object
//! fails it after bytes went out ends with the connection closed short of its length, so the
//! reader's READ fails and no wrong bytes are ever returned. Reading and sending overlap,
//! which is what lets a disk read run near the device's rate.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dataplane::mem::Dst;

use dataplane::recovery::{CatalogRecord, RecordKind};
use dataplane::server::acceptor::{AcceptPolicy, Acceptor, Connections};
use dataplane::transport::header::{Opcode, RequestHeader, ResponseHeader, REQUEST_HEADER_BYTES};
use dataplane::TeError;
use protocol::auth::Token;

use super::io::AlignedBuf;
use super::limits::{
    DISK_DRAIN_CHUNK_BYTES, DISK_LISTENER_CONNECTIONS_MAX, DISK_LISTENER_IO_TIMEOUT,
    DISK_LISTENER_KEPT_BUFFER_BYTES, DISK_LISTENER_READ_MAX_BYTES, DISK_STREAM_HOLD_BYTES,
};
use super::{DiskError, DiskTier};

struct Shared {
    tier: Arc<DiskTier>,
    token: Option<&'static Token>,
    refused: AtomicU64,
    unauthenticated: AtomicU64,
}

impl Connections for Shared {
    fn serve(&self, stream: &TcpStream) {
        serve_connection(stream, self);
    }

    fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }
}

/// A running disk listener. Dropping it stops accepting, closes its connections and joins
/// its threads (`dataplane::server::acceptor`).
pub struct DiskListener {
    acceptor: Acceptor<Shared>,
}

impl DiskTier {
    /// Serves this store's objects on `bind` (port 0 picks one) with the data plane's READ
    /// frames; with `token`, every connection first proves the cluster secret.
    pub fn serve(
        self: &Arc<Self>,
        bind: SocketAddr,
        token: Option<&'static Token>,
    ) -> io::Result<DiskListener> {
        let listener = TcpListener::bind(bind)?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            tier: Arc::clone(self),
            token,
            refused: AtomicU64::new(0),
            unauthenticated: AtomicU64::new(0),
        });
        let policy = AcceptPolicy {
            name: "disk",
            max_connections: DISK_LISTENER_CONNECTIONS_MAX,
            io_timeout: DISK_LISTENER_IO_TIMEOUT,
        };
        let acceptor = Acceptor::spawn(listener, policy, shared)?;
        if token.is_none() && !bind.ip().is_loopback() {
            tracing::warn!(%local_addr, "disk listener without a cluster secret: anyone who \
                can reach the port can read the disk tier");
        }
        Ok(DiskListener { acceptor })
    }
}

impl DiskListener {
    /// The address actually bound (the disk segment's `te_endpoint`).
    pub fn local_addr(&self) -> SocketAddr {
        self.acceptor.local_addr()
    }

    /// Connections closed at accept because the listener was full.
    pub fn connections_refused(&self) -> u64 {
        self.acceptor.handler().refused.load(Ordering::Relaxed)
    }

    /// Connections closed because the peer did not prove the cluster secret.
    pub fn connections_unauthenticated(&self) -> u64 {
        self.acceptor
            .handler()
            .unauthenticated
            .load(Ordering::Relaxed)
    }
}

fn respond(mut stream: &TcpStream, id: u64, status: i32, payload: &[u8]) -> io::Result<()> {
    let header = ResponseHeader {
        status,
        request_id: id,
        len: payload.len() as u64,
    }
    .encode();
    stream.write_all(&header)?;
    stream.write_all(payload)
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean close before the first byte.
fn read_header(mut stream: &TcpStream, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match stream.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn serve_connection(stream: &TcpStream, shared: &Shared) {
    if let Some(token) = shared.token {
        if !dataplane::server::blocking::handshake(stream, token, &shared.unauthenticated) {
            return;
        }
    }
    let mut raw = [0u8; REQUEST_HEADER_BYTES];
    let mut buf: Option<AlignedBuf> = None;
    loop {
        match read_header(stream, &mut raw) {
            Ok(true) => {}
            Ok(false) | Err(_) => return,
        }
        let req = match RequestHeader::decode(&raw) {
            Ok(r) => r,
            Err(_) => {
                let id = RequestHeader::salvage_request_id(&raw).unwrap_or(u64::MAX);
                let _ = respond(stream, id, TeError::InvalidArgument.code(), &[]);
                return;
            }
        };
        if serve_request(stream, shared, &req, &mut buf).is_err() {
            return;
        }
    }
}

fn serve_request(
    stream: &TcpStream,
    shared: &Shared,
    req: &RequestHeader,
    buf: &mut Option<AlignedBuf>,
) -> io::Result<()> {
    let id = req.request_id;
    match req.opcode {
        Opcode::Fence => respond(stream, id, 0, &[]),
        Opcode::Write => {
            drain(stream, req.len)?;
            respond(stream, id, TeError::NotImplemented.code(), &[])
        }
        Opcode::CatalogPut => {
            // Decoding bounded the length to CATALOG_RECORD_MAX_BYTES.
            let mut record = vec![0u8; req.len as usize];
            let mut s = stream;
            s.read_exact(&mut record)?;
            let status = match CatalogRecord::decode(&record) {
                Ok(r) if r.kind == RecordKind::Tombstone => {
                    shared.tier.bury(req.addr, r.len, r.key, r.version);
                    0
                }
                Ok(_) => TeError::NotImplemented.code(),
                Err(code) => code.code(),
            };
            respond(stream, id, status, &[])
        }
        Opcode::Read => {
            if req.len == 0 || req.len > DISK_LISTENER_READ_MAX_BYTES {
                return respond(stream, id, TeError::InvalidArgument.code(), &[]);
            }
            // Nothing is allocated for a range that names no object: a peer cannot make the
            // listener hold `len` bytes per connection for nothing.
            if shared.tier.object_of(req.addr, req.len).is_none() {
                return respond(stream, id, TeError::AddressNotRegistered.code(), &[]);
            }
            // Block-aligned, so the worker reads the object straight into it (the direct
            // path, `super::direct`), and kept (up to a size) for the next READ: a fresh
            // buffer's pages would fault in on every request.
            let need = super::format::round_up(req.len).unwrap_or(u64::MAX) as usize;
            let b = match buf.take() {
                Some(b) if b.len() >= need => b,
                _ => AlignedBuf::new(need),
            };
            let b = buf.insert(b);
            let sent = stream_read(
                stream,
                shared,
                req,
                &mut b.as_mut_slice()[..req.len as usize],
            );
            if b.len() > DISK_LISTENER_KEPT_BUFFER_BYTES {
                // Not kept for the next request.
                *buf = None;
            }
            sent
        }
    }
}

/// Answers a READ while the object is read: the bytes go out as the worker fills `buf`,
/// all but the last `DISK_STREAM_HOLD_BYTES`, which wait for the whole object's checksum.
/// A read that fails before its first byte is answered with its error; one that fails
/// after (a bad checksum found at the end) closes the connection, so the reader's READ
/// fails short of its length and never returns the bytes.
fn stream_read(
    stream: &TcpStream,
    shared: &Shared,
    req: &RequestHeader,
    buf: &mut [u8],
) -> io::Result<()> {
    let len = req.len;
    let progress = super::worker::Progress {
        filled: Arc::new(AtomicU64::new(0)),
        wake: std::thread::current(),
    };
    let filled = progress.filled.clone();
    let base = buf.as_mut_ptr();
    // SAFETY: `buf` is ours and `len` bytes long; no reference to it is formed until the
    // worker is done with it (below, after the answer).
    let dst = unsafe { Dst::from_raw(base, buf.len()) };
    // SAFETY: `buf` outlives the worker's use of it: the loop below returns only once it has
    // received the answer, and until then reads only the filled part.
    let rx = match unsafe { shared.tier.read_streamed(req.addr, dst, progress) } {
        Ok(rx) => rx,
        Err(e) => return answer_read(stream, req.request_id, Err(e), &[]),
    };
    let mut sent = 0u64;
    let mut answer = None;
    let mut io_result = Ok(());
    while answer.is_none() {
        answer = match rx.try_recv() {
            Ok(a) => Some(a),
            Err(std::sync::mpsc::TryRecvError::Empty) => None,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                Some(super::worker::Answer::Done(Err(DiskError::WorkerGone)))
            }
        };
        let ready = filled
            .load(Ordering::Acquire)
            .min(len.saturating_sub(DISK_STREAM_HOLD_BYTES));
        if ready > sent && io_result.is_ok() {
            if sent == 0 {
                io_result = respond_head(stream, req.request_id, 0, len);
            }
            // SAFETY: `[sent, ready)` lies in the filled part of `buf`, which the worker no
            // longer writes (it published the count after copying, `Release`/`Acquire`).
            let part = unsafe {
                std::slice::from_raw_parts(base.add(sent as usize), (ready - sent) as usize)
            };
            io_result = io_result.and_then(|()| write_all(stream, part));
            sent = ready;
        } else if answer.is_none() {
            std::thread::park_timeout(Duration::from_millis(5));
        }
    }
    io_result?;
    let read = match answer {
        Some(super::worker::Answer::Done(r)) => r,
        _ => Err(DiskError::WorkerGone),
    };
    match read {
        Ok(()) if sent == 0 => answer_read(stream, req.request_id, Ok(()), buf),
        Ok(()) => write_all(stream, &buf[sent as usize..]),
        Err(e) if sent == 0 => answer_read(stream, req.request_id, Err(e), &[]),
        Err(e) => {
            tracing::debug!(error = %e, "disk listener: READ failed after {sent} bytes; closing");
            let _ = stream.shutdown(Shutdown::Both);
            Err(io::Error::other(e.to_string()))
        }
    }
}

/// The response header alone (its payload follows in pieces).
fn respond_head(mut stream: &TcpStream, id: u64, status: i32, len: u64) -> io::Result<()> {
    let header = ResponseHeader {
        status,
        request_id: id,
        len,
    }
    .encode();
    stream.write_all(&header)
}

fn write_all(mut stream: &TcpStream, bytes: &[u8]) -> io::Result<()> {
    stream.write_all(bytes)
}

fn answer_read(
    stream: &TcpStream,
    id: u64,
    read: Result<(), DiskError>,
    buf: &[u8],
) -> io::Result<()> {
    match read {
        Ok(()) => respond(stream, id, 0, buf),
        Err(e) => {
            let code = match e {
                DiskError::NotFound { .. } => TeError::AddressNotRegistered,
                DiskError::Corrupt { .. } => TeError::Memory,
                _ => TeError::Context,
            };
            tracing::debug!(error = %e, "disk listener: READ refused");
            respond(stream, id, code.code(), &[])
        }
    }
}

/// Reads and discards `len` payload bytes of a refused WRITE.
fn drain(mut stream: &TcpStream, len: u64) -> io::Result<()> {
    let mut scratch = [0u8; DISK_DRAIN_CHUNK_BYTES];
    let mut left = len;
    while left > 0 {
        let chunk = left.min(DISK_DRAIN_CHUNK_BYTES as u64) as usize;
        stream.read_exact(&mut scratch[..chunk])?;
        left -= chunk as u64;
    }
    Ok(())
}
