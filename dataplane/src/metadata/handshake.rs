//! Upstream's handshake channel (`SocketHandShakePlugin`): a TCP server on the engine's
//! `rpc_port` answering descriptor requests (P2PHANDSHAKE), notifies and probes.
//!
//! ```text
//! Frame (both directions)
//!  0                         8        9
//!  +-------------------------+--------+----------------------------+
//!  | length (u64 LE)         | type   | JSON text (length-1 bytes) |
//!  +-------------------------+--------+----------------------------+
//!  length counts the type byte and the JSON, 1 ..= FRAME_MAX_BYTES
//!  type: 0 Connection (RDMA QP exchange), 1 Metadata, 2 Notify, 3 Probe
//! ```
//!
//! | type | request | reply |
//! |---|---|---|
//! | 1 Metadata | the requester's segment descriptor (ignored) | our segment descriptor |
//! | 1 Metadata | `{"segment_name":N}` ([`SegmentRequest`], ours) | the descriptor of segment N, or [`NO_SUCH_SEGMENT`] |
//! | 2 Notify | `{"name":..,"notify_msg":..}` | `{"name":"","notify_msg":"success"}` |
//! | 3 Probe | anything | `{"status":"success"}` |
//! | 0 Connection | `ConnectBody` (`rdma_desc`) | the handler's reply; refused (connection dropped) when the engine runs no RDMA transport |
//!
//! A reply uses the request's type. A connection may carry several requests; the server
//! drops it after [`RECV_TIMEOUT`] of silence, on a frame that does not decode (a legacy
//! frame whose first byte is above 3, a length of 0 or above the maximum, bad JSON for a
//! notify) or on an unsupported type.
//!
//! With a cluster secret (`protocol::auth`), every connection starts with the secret's
//! challenge-response (the same 32-byte frames as the data plane's, both sides proving it)
//! before its first frame: a peer that cannot prove it gets no descriptor, queue pair or
//! notify in, and the connection closes. Without a secret the port is open, as upstream's,
//! and the server says so at start when it listens beyond loopback.
//!
//! Decoding is pure ([`decode_frame`], [`decode_notify`]; [`read_frame`] uses the same checks)
//! and fuzzed (`fuzz/fuzz_targets/te_handshake.rs`).
//!
//! Invariants: the server never panics on network bytes; it serves at most
//! [`CONNECTIONS_MAX`] connections at once; the notify inbox holds at most [`INBOX_MAX`]
//! messages and [`INBOX_MAX_BYTES`] of them: past either, the oldest are dropped and
//! counted, so a flood costs the receiver a bounded amount of memory however long nobody
//! calls `get_notifies`.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use protocol::auth::{self, Token};
use serde::{Deserialize, Serialize};

use super::MetadataError;
use crate::sys::connect_first;

/// Largest frame length accepted (upstream's `MC_HANDSHAKE_MAX_LENGTH` default, 1 MiB).
pub const FRAME_MAX_BYTES: u64 = 1 << 20;
/// A silent connection is dropped after this long (upstream: 5 s).
pub const RECV_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on connecting to a peer's handshake port (upstream: 5 s).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more are closed on accept.
pub const CONNECTIONS_MAX: usize = 256;
/// Notifies kept until `get_notifies` drains them.
pub const INBOX_MAX: usize = 65536;
/// Bytes of notifies (names and messages) kept until `get_notifies` drains them.
pub const INBOX_MAX_BYTES: usize = 64 << 20;
/// The reply to a [`SegmentRequest`] naming a segment not served here (not a descriptor:
/// the requester reaches that segment over TCP).
pub const NO_SUCH_SEGMENT: &[u8] = br#"{"error":"no such segment"}"#;

/// Handshake request types (`HandShakeRequestType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    Connection = 0,
    Metadata = 1,
    Notify = 2,
    Probe = 3,
}

impl FrameType {
    fn from_u8(b: u8) -> Option<FrameType> {
        match b {
            0 => Some(FrameType::Connection),
            1 => Some(FrameType::Metadata),
            2 => Some(FrameType::Notify),
            3 => Some(FrameType::Probe),
            _ => None,
        }
    }
}

/// The body of a Notify request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotifyMsg {
    pub name: String,
    pub notify_msg: String,
}

/// Bytes of the length field before a frame's type byte.
pub const LEN_BYTES: usize = 8;

/// One frame's bytes: length, type, JSON.
pub fn encode_frame(ty: FrameType, json: &[u8]) -> Vec<u8> {
    let len = json.len() as u64 + 1;
    let mut buf = Vec::with_capacity(LEN_BYTES + 1 + json.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.push(ty as u8);
    buf.extend_from_slice(json);
    buf
}

/// Writes one frame.
pub fn write_frame(stream: &mut TcpStream, ty: FrameType, json: &[u8]) -> io::Result<()> {
    stream.write_all(&encode_frame(ty, json))
}

/// Why a frame could not be read.
#[derive(Debug)]
pub enum FrameError {
    /// The stream ended cleanly before a frame began.
    Closed,
    Io(io::Error),
    /// The bytes are not a frame we accept; the text says what arrived.
    Malformed(String),
}

/// Reads one frame: its type byte and JSON text.
pub fn read_frame(stream: &mut TcpStream) -> Result<(u8, Vec<u8>), FrameError> {
    let mut len_raw = [0u8; LEN_BYTES];
    let mut got = 0;
    while got < LEN_BYTES {
        match stream.read(&mut len_raw[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let mut body = vec![0u8; frame_len(len_raw)?];
    stream.read_exact(&mut body).map_err(FrameError::Io)?;
    let ty = frame_type(&body)?;
    body.remove(0);
    Ok((ty, body))
}

/// A frame decoded from bytes: its type, its JSON, and the bytes it took.
pub type Decoded<'a> = (u8, &'a [u8], usize);

/// Decodes the frame at the start of `buf` as [`read_frame`] reads it from a stream, or
/// `None` while it is incomplete.
pub fn decode_frame(buf: &[u8]) -> Result<Option<Decoded<'_>>, FrameError> {
    let Some(len_raw) = buf.first_chunk::<LEN_BYTES>() else {
        return Ok(None);
    };
    let end = LEN_BYTES + frame_len(*len_raw)?;
    let Some(body) = buf.get(LEN_BYTES..end) else {
        return Ok(None);
    };
    Ok(Some((frame_type(body)?, &body[1..], end)))
}

/// The body length (type byte and JSON) a length field announces, when it is one we accept.
fn frame_len(len_raw: [u8; LEN_BYTES]) -> Result<usize, FrameError> {
    let len = u64::from_le_bytes(len_raw);
    if len == 0 || len > FRAME_MAX_BYTES {
        return Err(FrameError::Malformed(format!(
            "frame length {len}, expected 1..={FRAME_MAX_BYTES}"
        )));
    }
    Ok(len as usize)
}

/// The type byte of a (non-empty) frame body, when it is one of ours.
fn frame_type(body: &[u8]) -> Result<u8, FrameError> {
    match body.first() {
        Some(&ty) if ty <= FrameType::Probe as u8 => Ok(ty),
        ty => Err(FrameError::Malformed(format!(
            "frame type {ty:?}: legacy untyped frames are not supported, expected 0..=3"
        ))),
    }
}

/// The body of a Notify frame, when it is the JSON of a [`NotifyMsg`].
pub fn decode_notify(json: &[u8]) -> Option<NotifyMsg> {
    serde_json::from_slice(json).ok()
}

/// The body of a Metadata request that asks for one named segment's descriptor (a store
/// process serving several segments over RDMA in P2PHANDSHAKE mode, `client::rdma`).
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentRequest {
    pub segment_name: String,
}

/// The segment a Metadata request body names, when it is a [`SegmentRequest`]. Upstream's
/// requests carry the requester's own descriptor, which has no `segment_name` member: `None`.
pub fn decode_segment_request(json: &[u8]) -> Option<String> {
    serde_json::from_slice::<SegmentRequest>(json)
        .ok()
        .map(|r| r.segment_name)
}

/// The Metadata request body asking for `segment`'s descriptor.
pub fn segment_request(segment: &str) -> Vec<u8> {
    serde_json::to_vec(&SegmentRequest {
        segment_name: segment.to_string(),
    })
    .unwrap_or_default()
}

/// What the handshake server answers with, shared with the engine that owns it.
#[derive(Debug, Default)]
pub struct HandshakeState {
    /// Our segment descriptor JSON, re-set on every registration change.
    descriptor: Mutex<Vec<u8>>,
    /// Descriptors by segment name, for [`SegmentRequest`]s.
    segments: Mutex<std::collections::HashMap<String, Vec<u8>>>,
    inbox: Mutex<Inbox>,
    notifies_dropped: AtomicU64,
    unauthenticated: AtomicU64,
    connection: Mutex<Option<ConnectionHandler>>,
}

/// Answers a `Connection` frame's body with the reply body (the RDMA transport's QP
/// exchange).
#[derive(Clone)]
pub struct ConnectionHandler(pub Arc<ConnectFn>);

/// The function behind a [`ConnectionHandler`]: request body in, reply body out.
pub type ConnectFn = dyn Fn(&[u8]) -> Vec<u8> + Send + Sync;

impl std::fmt::Debug for ConnectionHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectionHandler")
    }
}

impl HandshakeState {
    pub fn new() -> Arc<HandshakeState> {
        Arc::new(HandshakeState::default())
    }

    /// Installs (or with `None` removes) the handler of `Connection` frames.
    pub fn set_connection_handler(&self, h: Option<ConnectionHandler>) {
        *self.connection.lock().unwrap_or_else(|e| e.into_inner()) = h;
    }

    /// Replaces the descriptor served to Metadata requests.
    pub fn set_descriptor(&self, json: Vec<u8>) {
        *self.descriptor.lock().unwrap_or_else(|e| e.into_inner()) = json;
    }

    /// Serves `json` to requests naming `segment` (replacing what it served before).
    pub fn set_segment_descriptor(&self, segment: &str, json: Vec<u8>) {
        let mut m = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        m.insert(segment.to_string(), json);
    }

    /// Stops serving `segment`: requests naming it get [`NO_SUCH_SEGMENT`].
    pub fn remove_segment_descriptor(&self, segment: &str) {
        let mut m = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        m.remove(segment);
    }

    /// The reply to a Metadata request with `body`: the named segment's descriptor for a
    /// [`SegmentRequest`] ([`NO_SUCH_SEGMENT`] when it is not served here), else ours.
    pub fn descriptor_for(&self, body: &[u8]) -> Vec<u8> {
        let Some(name) = decode_segment_request(body) else {
            return self.descriptor();
        };
        let m = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&name)
            .cloned()
            .unwrap_or_else(|| NO_SUCH_SEGMENT.to_vec())
    }

    /// The descriptor served now.
    pub fn descriptor(&self) -> Vec<u8> {
        self.descriptor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Adds a notify to the inbox; when that takes it past [`INBOX_MAX`] messages or
    /// [`INBOX_MAX_BYTES`], the oldest go (counted in [`Self::notifies_dropped`]).
    pub fn push_notify(&self, msg: NotifyMsg) {
        let dropped = self
            .inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(msg);
        if dropped > 0 {
            self.notifies_dropped.fetch_add(dropped, Ordering::Relaxed);
        }
    }

    /// Drains the inbox, oldest first.
    pub fn drain_notifies(&self) -> Vec<NotifyMsg> {
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        inbox.bytes = 0;
        inbox.messages.drain(..).collect()
    }

    /// Notifies dropped because the inbox was full.
    pub fn notifies_dropped(&self) -> u64 {
        self.notifies_dropped.load(Ordering::Relaxed)
    }

    /// Connections closed because the peer did not prove the cluster secret.
    pub fn unauthenticated(&self) -> u64 {
        self.unauthenticated.load(Ordering::Relaxed)
    }
}

/// The notifies not yet drained and the bytes they hold.
#[derive(Debug, Default)]
struct Inbox {
    messages: VecDeque<NotifyMsg>,
    bytes: usize,
}

impl Inbox {
    fn cost(m: &NotifyMsg) -> usize {
        m.name.len() + m.notify_msg.len()
    }

    /// Appends `msg`, dropping the oldest until both bounds hold; how many went.
    fn push(&mut self, msg: NotifyMsg) -> u64 {
        self.bytes += Inbox::cost(&msg);
        self.messages.push_back(msg);
        let mut dropped = 0;
        while self.messages.len() > INBOX_MAX || self.bytes > INBOX_MAX_BYTES {
            let Some(old) = self.messages.pop_front() else {
                break;
            };
            self.bytes -= Inbox::cost(&old);
            dropped += 1;
        }
        dropped
    }
}

struct Shared {
    state: Arc<HandshakeState>,
    auth: Option<&'static Token>,
    stop: AtomicBool,
    live: AtomicUsize,
}

/// A running handshake server; dropping it stops accepting (connections in service end
/// within [`RECV_TIMEOUT`]).
pub struct HandshakeServer {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl HandshakeServer {
    /// Serves `state` on `listener`, with this process's cluster secret
    /// (`protocol::auth::process_token`) when one is set.
    pub fn start(listener: TcpListener, state: Arc<HandshakeState>) -> io::Result<Self> {
        Self::start_with_auth(listener, state, auth::process_token_or_none())
    }

    /// [`Self::start`] with an explicit secret (`None`: the port is open).
    pub fn start_with_auth(
        listener: TcpListener,
        state: Arc<HandshakeState>,
        auth: Option<&'static Token>,
    ) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        if auth.is_none() && !local_addr.ip().is_loopback() {
            tracing::warn!(
                "transfer-engine handshake port {local_addr} accepts anyone: no cluster secret \
                 is set (MC_AUTH_TOKEN / MC_AUTH_TOKEN_FILE), so any host that reaches it can \
                 read this engine's segment descriptor and send it notifies (docs/security.md)"
            );
        }
        let shared = Arc::new(Shared {
            state,
            auth,
            stop: AtomicBool::new(false),
            live: AtomicUsize::new(0),
        });
        let s = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name(format!("te-handshake-{}", local_addr.port()))
            .spawn(move || accept_loop(listener, s))?;
        Ok(HandshakeServer {
            local_addr,
            shared,
            accept: Some(accept),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for HandshakeServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let mut wake = self.local_addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        // Wakes the blocking accept; failure means the listener is gone already.
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok((stream, _)) = accepted else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if shared.live.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
            shared.live.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        let s = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("te-handshake-conn".into())
            .spawn(move || {
                serve(stream, &s);
                s.live.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            shared.live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn serve(mut stream: TcpStream, shared: &Shared) {
    if stream.set_read_timeout(Some(RECV_TIMEOUT)).is_err()
        || stream.set_write_timeout(Some(RECV_TIMEOUT)).is_err()
    {
        return;
    }
    let _ = stream.set_nodelay(true);
    if let Some(token) = shared.auth {
        if let Err(why) = auth::server_handshake(&mut stream, token) {
            shared.state.unauthenticated.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("handshake port: a peer did not prove the cluster secret: {why:?}");
            return;
        }
    }
    while !shared.stop.load(Ordering::Relaxed) {
        let Ok((ty, body)) = read_frame(&mut stream) else {
            return;
        };
        let reply = match FrameType::from_u8(ty) {
            Some(FrameType::Metadata) => shared.state.descriptor_for(&body),
            Some(FrameType::Notify) => match decode_notify(&body) {
                Some(msg) => {
                    shared.state.push_notify(msg);
                    br#"{"name":"","notify_msg":"success"}"#.to_vec()
                }
                None => return,
            },
            Some(FrameType::Probe) => br#"{"status":"success"}"#.to_vec(),
            Some(FrameType::Connection) => {
                let h = shared
                    .state
                    .connection
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                match h {
                    Some(h) => (h.0)(&body),
                    None => return,
                }
            }
            None => return,
        };
        let ty = FrameType::from_u8(ty).unwrap_or(FrameType::Probe);
        if write_frame(&mut stream, ty, &reply).is_err() {
            return;
        }
    }
}

/// Sends one request to the handshake server at `host:port` and returns the reply's JSON,
/// proving this process's cluster secret first when one is set.
pub fn call(peer: &str, ty: FrameType, body: &[u8]) -> Result<Vec<u8>, MetadataError> {
    call_with_auth(peer, ty, body, auth::process_token_or_none())
}

/// [`call`] with an explicit secret (`None`: no proof sent).
pub fn call_with_auth(
    peer: &str,
    ty: FrameType,
    body: &[u8],
    token: Option<&Token>,
) -> Result<Vec<u8>, MetadataError> {
    let io = |source| MetadataError::Io {
        peer: peer.to_string(),
        source,
    };
    let malformed = |why: String| MetadataError::Malformed {
        peer: peer.to_string(),
        why,
    };
    let addrs = peer.to_socket_addrs().map_err(io)?;
    let mut stream = connect_first(addrs, CONNECT_TIMEOUT).map_err(io)?;
    stream.set_read_timeout(Some(RECV_TIMEOUT)).map_err(io)?;
    stream.set_write_timeout(Some(RECV_TIMEOUT)).map_err(io)?;
    let _ = stream.set_nodelay(true);
    if let Some(token) = token {
        auth::client_handshake(&mut stream, token).map_err(|e| MetadataError::Rejected {
            peer: peer.to_string(),
            why: format!("cluster secret: {e}"),
        })?;
    }
    write_frame(&mut stream, ty, body).map_err(io)?;
    match read_frame(&mut stream) {
        Ok((t, reply)) if t == ty as u8 => Ok(reply),
        Ok((t, _)) => Err(malformed(format!(
            "reply of type {t} to a request of type {}",
            ty as u8
        ))),
        Err(FrameError::Closed) => Err(MetadataError::Rejected {
            peer: peer.to_string(),
            why: "closed the connection without a reply".into(),
        }),
        Err(FrameError::Io(e)) => Err(io(e)),
        Err(FrameError::Malformed(why)) => Err(malformed(why)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> (HandshakeServer, Arc<HandshakeState>, String) {
        let state = HandshakeState::new();
        state.set_descriptor(br#"{"name":"me"}"#.to_vec());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = HandshakeServer::start(l, state.clone()).unwrap();
        let addr = s.local_addr().to_string();
        (s, state, addr)
    }

    #[test]
    fn metadata_notify_probe() {
        let (_s, state, addr) = server();
        assert_eq!(
            call(&addr, FrameType::Metadata, b"{}").unwrap(),
            br#"{"name":"me"}"#
        );
        let n = serde_json::to_vec(&NotifyMsg {
            name: "a".into(),
            notify_msg: "b".into(),
        })
        .unwrap();
        let reply = call(&addr, FrameType::Notify, &n).unwrap();
        assert_eq!(reply, br#"{"name":"","notify_msg":"success"}"#);
        assert_eq!(
            state.drain_notifies(),
            vec![NotifyMsg {
                name: "a".into(),
                notify_msg: "b".into()
            }]
        );
        assert!(state.drain_notifies().is_empty());
        assert_eq!(
            call(&addr, FrameType::Probe, b"").unwrap(),
            br#"{"status":"success"}"#
        );
    }

    /// A request naming a segment gets that segment's descriptor (or a refusal once it is
    /// withdrawn); upstream's request (the requester's descriptor) still gets ours.
    #[test]
    fn metadata_requests_may_name_a_segment() {
        let (_s, state, addr) = server();
        state.set_segment_descriptor("h:1#1", br#"{"name":"h:1#1"}"#.to_vec());
        let ask = |name: &str| call(&addr, FrameType::Metadata, &segment_request(name)).unwrap();
        assert_eq!(ask("h:1#1"), br#"{"name":"h:1#1"}"#);
        assert_eq!(ask("h:1#2"), NO_SUCH_SEGMENT);
        let upstream = br#"{"name":"peer","protocol":"rdma","devices":[]}"#;
        assert_eq!(
            call(&addr, FrameType::Metadata, upstream).unwrap(),
            br#"{"name":"me"}"#
        );
        state.remove_segment_descriptor("h:1#1");
        assert_eq!(ask("h:1#1"), NO_SUCH_SEGMENT);
        assert_eq!(decode_segment_request(b"{\"segment_name\":7}"), None);
    }

    #[test]
    fn bad_frames_close_only_their_connection() {
        let (_s, _state, addr) = server();
        // Bad notify JSON, the Connection type, an oversized and a legacy frame.
        assert!(call(&addr, FrameType::Notify, b"{").is_err());
        assert!(call(&addr, FrameType::Connection, b"{}").is_err());
        for raw in [
            (FRAME_MAX_BYTES + 1).to_le_bytes().to_vec(),
            [&5u64.to_le_bytes()[..], b"{\"a\"}"].concat(),
            0u64.to_le_bytes().to_vec(),
        ] {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(&raw).unwrap();
            let mut b = [0u8; 1];
            assert_eq!(s.read(&mut b).unwrap_or(0), 0, "closed without reply");
        }
        // A truncated frame then silence: the server keeps serving others meanwhile.
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(&100u64.to_le_bytes()).unwrap();
        assert!(call(&addr, FrameType::Probe, b"").is_ok());
    }

    #[test]
    fn frames_decode_from_bytes_as_from_a_stream() {
        let f = encode_frame(FrameType::Notify, b"{}");
        assert_eq!(decode_frame(&f).unwrap(), Some((2, &b"{}"[..], f.len())));
        assert!(matches!(decode_frame(&f[..f.len() - 1]), Ok(None)));
        assert!(matches!(decode_frame(&f[..7]), Ok(None)));
        for bad in [
            0u64.to_le_bytes().to_vec(),
            (FRAME_MAX_BYTES + 1).to_le_bytes().to_vec(),
            [&1u64.to_le_bytes()[..], &[4]].concat(),
        ] {
            assert!(matches!(decode_frame(&bad), Err(FrameError::Malformed(_))));
        }
        assert_eq!(
            decode_notify(br#"{"name":"a","notify_msg":"b"}"#),
            Some(NotifyMsg {
                name: "a".into(),
                notify_msg: "b".into()
            })
        );
        assert_eq!(decode_notify(b"{"), None);
    }

    #[test]
    fn inbox_is_bounded() {
        let st = HandshakeState::default();
        for i in 0..INBOX_MAX + 3 {
            st.push_notify(NotifyMsg {
                name: i.to_string(),
                notify_msg: String::new(),
            });
        }
        assert_eq!(st.notifies_dropped(), 3);
        let all = st.drain_notifies();
        assert_eq!(all.len(), INBOX_MAX);
        assert_eq!(all[0].name, "3", "the oldest went, the newest stayed");
    }

    /// A flood of large notifies nobody drains: the inbox holds at most its byte budget,
    /// keeps the newest, and is empty (and counting from zero) after a drain.
    #[test]
    fn inbox_bytes_are_bounded_and_the_oldest_go() {
        let st = HandshakeState::default();
        let big = "x".repeat(512 << 10);
        let flood = 2 * INBOX_MAX_BYTES / big.len();
        for i in 0..flood {
            st.push_notify(NotifyMsg {
                name: i.to_string(),
                notify_msg: big.clone(),
            });
            assert!(st.inbox.lock().unwrap().bytes <= INBOX_MAX_BYTES);
        }
        let kept = st.drain_notifies();
        assert!(kept.len() < flood / 2 + 1, "{} of {flood} kept", kept.len());
        assert_eq!(kept.last().unwrap().name, (flood - 1).to_string());
        assert_eq!(st.notifies_dropped() as usize, flood - kept.len());
        assert_eq!(st.inbox.lock().unwrap().bytes, 0);
    }

    /// The same flood over the socket, as a stranger would send it to a receiver that never
    /// calls `get_notifies`: 160 notifies of 512 KiB (80 MiB) leave at most 64 MiB held.
    #[test]
    fn a_notify_flood_over_the_socket_holds_at_most_the_budget() {
        let (_s, state, addr) = server();
        let body = serde_json::to_vec(&NotifyMsg {
            name: "flood".into(),
            notify_msg: "x".repeat(512 << 10),
        })
        .unwrap();
        for _ in 0..160 {
            call(&addr, FrameType::Notify, &body).unwrap();
        }
        assert!(state.inbox.lock().unwrap().bytes <= INBOX_MAX_BYTES);
        assert!(state.notifies_dropped() >= 160 - (INBOX_MAX_BYTES / (512 << 10)) as u64);
    }

    fn leak(secret: &str) -> &'static Token {
        Box::leak(Box::new(Token::new(secret.as_bytes()).unwrap()))
    }

    /// With a secret, a peer that does not prove it gets no descriptor and puts no notify
    /// in; one that does is served.
    #[test]
    fn with_a_secret_only_proven_peers_are_served() {
        let state = HandshakeState::new();
        state.set_descriptor(br#"{"name":"me"}"#.to_vec());
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let right = leak("handshake-port-secret");
        let s = HandshakeServer::start_with_auth(l, state.clone(), Some(right)).unwrap();
        let addr = s.local_addr().to_string();
        let n = serde_json::to_vec(&NotifyMsg {
            name: "stranger".into(),
            notify_msg: "hi".into(),
        })
        .unwrap();
        for token in [None, Some(leak("a-guess"))] {
            assert!(call_with_auth(&addr, FrameType::Metadata, b"{}", token).is_err());
            assert!(call_with_auth(&addr, FrameType::Notify, &n, token).is_err());
        }
        // Raw frames with no handshake at all: closed without a reply.
        let mut raw = TcpStream::connect(&addr).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write_frame(&mut raw, FrameType::Notify, &n).unwrap();
        let mut b = Vec::new();
        let _ = raw.read_to_end(&mut b);
        assert!(!b.windows(7).any(|w| w == b"success"), "{b:?}");
        assert!(
            state.drain_notifies().is_empty(),
            "a stranger's notify got in"
        );
        // The server counts a refusal when it gives up, which may come just after the client
        // did (both wait out the same 5 s for a short frame).
        let deadline = std::time::Instant::now() + RECV_TIMEOUT * 2;
        while state.unauthenticated() < 5 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(state.unauthenticated() >= 5, "{}", state.unauthenticated());
        let got = call_with_auth(&addr, FrameType::Metadata, b"{}", Some(right)).unwrap();
        assert_eq!(got, br#"{"name":"me"}"#);
        call_with_auth(&addr, FrameType::Notify, &n, Some(right)).unwrap();
        assert_eq!(state.drain_notifies().len(), 1);
    }
}
