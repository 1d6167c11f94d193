//! The TCP data-plane client: N lanes (connections) to one peer, batched one-sided READ and
//! WRITE with a status per request.
//!
//! A batch is spread round-robin over the lanes. On a lane every request is sent without
//! waiting (pipelining) by one thread while another receives the responses, matched by
//! request id, and lands READ payloads straight in the caller's buffers; sending and receiving
//! run concurrently so that neither side's socket buffers can fill up and deadlock the
//! exchange. A single request runs inline on the calling thread. Requests of one batch are
//! not ordered with respect to each other (they may run on different lanes), as upstream's.
//!
//! Invariants:
//! - the caller's buffers are touched only during the call (scoped threads join before it
//!   returns), so a timeout can never leave a late write into a freed buffer;
//! - a lane whose stream failed or went out of frame (I/O error, timeout, unexpected
//!   response) is closed and reconnected on next use; its unanswered requests fail;
//! - lanes are locked in ascending index order, so concurrent batches cannot deadlock;
//! - zero-length requests complete at once without I/O (upstream's behaviour).

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use super::header::{Opcode, RequestHeader, ResponseHeader, RESPONSE_HEADER_BYTES};
use super::rawio;
use crate::limits::{
    BATCH_REQUESTS_MAX, CLIENT_LANES_DEFAULT, CLIENT_LANES_MAX, CONNECT_TIMEOUT_DEFAULT,
    IO_TIMEOUT_DEFAULT, REQUEST_PAYLOAD_MAX_BYTES,
};
use crate::TeError;

/// Client settings.
#[derive(Clone, Copy, Debug)]
pub struct ClientConfig {
    /// Connections to the peer, 1 ..= `CLIENT_LANES_MAX`.
    pub lanes: usize,
    /// Bound on establishing one connection.
    pub connect_timeout: Duration,
    /// Bound on one blocking socket operation (one response, one send).
    pub io_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            lanes: CLIENT_LANES_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            io_timeout: IO_TIMEOUT_DEFAULT,
        }
    }
}

/// One request of a batch.
#[derive(Debug)]
pub enum TransferOp<'a> {
    /// Copy `dst.len()` bytes from the peer's `remote_addr` into `dst`.
    Read { remote_addr: u64, dst: &'a mut [u8] },
    /// Copy `src` to the peer's `remote_addr`.
    Write { remote_addr: u64, src: &'a [u8] },
}

impl TransferOp<'_> {
    fn len(&self) -> usize {
        match self {
            TransferOp::Read { dst, .. } => dst.len(),
            TransferOp::Write { src, .. } => src.len(),
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

/// A client of one peer's data-plane server.
#[derive(Debug)]
pub struct TcpClient {
    peer: SocketAddr,
    config: ClientConfig,
    lanes: Vec<Mutex<Option<TcpStream>>>,
    next_lane: AtomicUsize,
    next_id: AtomicU64,
}

/// A request as the sending half sees it.
struct SendItem<'a> {
    header: RequestHeader,
    src: Option<&'a [u8]>,
}

/// A request as the receiving half sees it.
struct RecvItem<'a> {
    index: usize,
    len: u64,
    dst: Option<&'a mut [u8]>,
}

#[derive(Default)]
struct LaneWork<'a> {
    sends: Vec<SendItem<'a>>,
    recvs: HashMap<u64, RecvItem<'a>>,
}

impl TcpClient {
    /// Connects every lane to `peer`.
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
        for lane in &client.lanes {
            let mut guard = lock(lane);
            client.ensure_connected(&mut guard)?;
        }
        Ok(client)
    }

    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Writes `src` at the peer's `remote_addr`.
    pub fn write(&self, remote_addr: u64, src: &[u8]) -> TransferResult {
        let mut ops = [TransferOp::Write { remote_addr, src }];
        self.submit(&mut ops).pop().unwrap_or(Ok(()))
    }

    /// Reads `dst.len()` bytes from the peer's `remote_addr` into `dst`.
    pub fn read(&self, remote_addr: u64, dst: &mut [u8]) -> TransferResult {
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
        let mut work: Vec<LaneWork<'_>> =
            (0..self.lanes.len()).map(|_| LaneWork::default()).collect();
        let mut lane = self.next_lane.fetch_add(1, Ordering::Relaxed);
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
            let request_id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let (opcode, remote_addr, src, dst) = match op {
                TransferOp::Read { remote_addr, dst } => {
                    (Opcode::Read, *remote_addr, None, Some(&mut **dst))
                }
                TransferOp::Write { remote_addr, src } => {
                    (Opcode::Write, *remote_addr, Some(*src), None)
                }
            };
            let header = RequestHeader {
                opcode,
                request_id,
                addr: remote_addr,
                len: len as u64,
            };
            let w = &mut work[lane % self.lanes.len()];
            w.sends.push(SendItem { header, src });
            w.recvs.insert(
                request_id,
                RecvItem {
                    index,
                    len: len as u64,
                    dst,
                },
            );
            // Overwritten by the lane's outcome; stays only if that outcome is lost.
            results[index] = Err(TransferError::Connection {
                kind: io::ErrorKind::Other,
                message: "request did not complete".into(),
            });
            lane += 1;
        }
        self.run(work, &mut results);
        results
    }

    fn run(&self, work: Vec<LaneWork<'_>>, results: &mut [TransferResult]) {
        // Lock the lanes that have work, in ascending order.
        let mut jobs = Vec::new();
        for (i, w) in work.into_iter().enumerate() {
            if w.sends.is_empty() {
                continue;
            }
            let mut guard = lock(&self.lanes[i]);
            if let Err(e) = self.ensure_connected(&mut guard) {
                for item in w.recvs.values() {
                    results[item.index] = Err(e.clone());
                }
                continue;
            }
            jobs.push((guard, w));
        }
        let single = jobs.len() == 1 && jobs[0].1.sends.len() == 1;
        let outcomes: Vec<(Vec<(usize, TransferResult)>, bool)> = if single {
            jobs.iter_mut()
                .map(|(guard, w)| {
                    let stream = guard.as_ref().expect("connected above");
                    run_lane_inline(stream, std::mem::take(w))
                })
                .collect()
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = jobs
                    .iter_mut()
                    .map(|(guard, w)| {
                        let stream: &TcpStream = guard.as_ref().expect("connected above");
                        let LaneWork { sends, recvs } = std::mem::take(w);
                        let sender = s.spawn(move || send_requests(stream, &sends));
                        let receiver = s.spawn(move || receive_responses(stream, recvs));
                        (sender, receiver)
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|(sender, receiver)| {
                        let sent_ok = sender.join().map(|r| r.is_ok()).unwrap_or(false);
                        let (res, healthy) = receiver.join().unwrap_or_default();
                        (res, healthy && sent_ok)
                    })
                    .collect()
            })
        };
        for ((guard, _), (res, healthy)) in jobs.iter_mut().zip(outcomes) {
            for (index, r) in res {
                results[index] = r;
            }
            if !healthy {
                if let Some(stream) = guard.take() {
                    let _ = stream.shutdown(Shutdown::Both);
                }
            }
        }
    }

    fn ensure_connected(&self, slot: &mut Option<TcpStream>) -> Result<(), TransferError> {
        if slot.is_some() {
            return Ok(());
        }
        let stream = TcpStream::connect_timeout(&self.peer, self.config.connect_timeout)
            .map_err(|e| TransferError::from_io(&e))?;
        rawio::tune_stream(&stream, self.config.io_timeout)
            .map_err(|e| TransferError::from_io(&e))?;
        *slot = Some(stream);
        Ok(())
    }
}

fn lock(m: &Mutex<Option<TcpStream>>) -> MutexGuard<'_, Option<TcpStream>> {
    // A panic while a lane was held leaves at worst a stream out of frame; drop it.
    m.lock().unwrap_or_else(|e| {
        let mut g = e.into_inner();
        *g = None;
        g
    })
}

fn run_lane_inline(stream: &TcpStream, work: LaneWork<'_>) -> (Vec<(usize, TransferResult)>, bool) {
    if let Err(e) = send_requests(stream, &work.sends) {
        let err = TransferError::from_io(&e);
        return (
            work.recvs
                .values()
                .map(|r| (r.index, Err(err.clone())))
                .collect(),
            false,
        );
    }
    receive_responses(stream, work.recvs)
}

/// Sends every request of a lane. On failure shuts the stream down so the receiving half
/// stops waiting for responses that will never come.
fn send_requests(stream: &TcpStream, sends: &[SendItem<'_>]) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    let result = sends.iter().try_for_each(|item| {
        rawio::send_all(fd, &item.header.encode(), item.src.is_some())?;
        match item.src {
            Some(src) => rawio::send_all(fd, src, false),
            None => Ok(()),
        }
    });
    if result.is_err() {
        let _ = stream.shutdown(Shutdown::Both);
    }
    result
}

/// Receives the responses of a lane, matched by request id. Returns each request's result
/// and whether the stream is still in frame.
fn receive_responses(
    stream: &TcpStream,
    mut recvs: HashMap<u64, RecvItem<'_>>,
) -> (Vec<(usize, TransferResult)>, bool) {
    let mut done = Vec::with_capacity(recvs.len());
    let mut failure = None;
    while !recvs.is_empty() {
        match receive_one(stream, &mut recvs) {
            Ok((index, result)) => done.push((index, result)),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let healthy = failure.is_none();
    if let Some(err) = failure {
        let _ = stream.shutdown(Shutdown::Both);
        done.extend(recvs.values().map(|r| (r.index, Err(err.clone()))));
    }
    (done, healthy)
}

fn receive_one(
    stream: &TcpStream,
    recvs: &mut HashMap<u64, RecvItem<'_>>,
) -> Result<(usize, TransferResult), TransferError> {
    let mut raw = [0u8; RESPONSE_HEADER_BYTES];
    rawio::read_exact(stream, &mut raw).map_err(|e| TransferError::from_io(&e))?;
    let resp = ResponseHeader::decode(&raw).map_err(|e| TransferError::Protocol(e.to_string()))?;
    let Some(item) = recvs.remove(&resp.request_id) else {
        return Err(TransferError::Protocol(format!(
            "response for unknown request id {}",
            resp.request_id
        )));
    };
    if resp.status != 0 {
        if resp.len != 0 {
            return Err(TransferError::Protocol(format!(
                "error response {} carries {} payload bytes, expected 0",
                resp.status, resp.len
            )));
        }
        return Ok((
            item.index,
            Err(TransferError::Refused {
                status: resp.status,
            }),
        ));
    }
    let expected = if item.dst.is_some() { item.len } else { 0 };
    if resp.len != expected {
        return Err(TransferError::Protocol(format!(
            "response to request {} carries {} payload bytes, expected {expected}",
            resp.request_id, resp.len
        )));
    }
    if let Some(dst) = item.dst {
        rawio::read_exact(stream, dst).map_err(|e| TransferError::from_io(&e))?;
    }
    Ok((item.index, Ok(())))
}
