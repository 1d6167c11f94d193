//! Ranks on other hosts: each rank keeps a *replica* of every remote rank's segment
//! ([`Segment::replica`]) and every rank *pushes* its own segment's changes to its remote
//! peers over TCP, so the collectives and point-to-point code read a remote peer exactly as a
//! mapped same-host one, and every rank only ever polls its own memory.
//!
//! Topology: one TCP connection per ordered pair of founding ranks on different hosts. The
//! writer connects to the reader's listener and only sends; the reader's receive thread
//! applies the frames to the replica in order.
//!
//! A process that joins the group later from another host (a replacement, `is_extension`:
//! [`Net::join`]) connects once to each member on another host and sends a *join hello*
//! with its pid; that one connection then carries both directions. The member's admission
//! thread (the listener stays open for the group's life) makes a replica of the joiner's
//! segment whose header names that pid, answers with a snapshot of its own segment (the
//! membership words and the current counters, ended by a HEARTBEAT, which the joiner waits
//! for before it reads any view), starts pushing to it like to any peer, and announces it
//! in its own mailbox for that slot (the low half `u32::MAX`: "a replica, ask the network
//! layer", [`Net::joiner`]); the member switches to that replica when it adopts the view
//! naming the pid. A member refuses a joiner while the group reads peers' memory directly
//! (a remote process cannot serve `process_vm_readv`), and keeps at most
//! [`PG_NET_JOINERS_MAX`] joiners admitted at once. Frames (little-endian, 24-byte header):
//!
//! ```text
//! hello (once, writer -> reader):  magic "MCPGNET1" u64 | ranks u32 | from u32 | to u32 | 0 u32
//! join hello (joiner -> member):   magic "MCPGJOIN" u64 | ranks u32 | slot u32 | to u32 | pid u32
//! frame:  0       4          8               16
//!         | kind u32 | 0 u32 | offset u64    | n u64 |  then n payload bytes for WRITE
//!         kind 1 WRITE:     copy the n bytes at `offset` of the replica
//!         kind 2 STORE:     store n (u64, Release) into the header counter at `offset`
//!         kind 3 HEARTBEAT: nothing (liveness only; offset and n are 0)
//! ```
//!
//! The receive thread decodes and checks each header with [`decode_frame`] (a pure function,
//! fuzzed) before it touches the replica: a reserved word not 0, an unknown kind, a WRITE
//! that does not lie inside the replica or a STORE that does not name a header counter ends
//! the link before its payload is read.
//!
//! Who may link ([`LinkAuth`]). With a cluster secret (`protocol::auth`), every connection
//! (a founder's link, a joiner's, an EP link, [`super::ep::net`]) starts with the cluster-secret
//! handshake, the connecting side as client, before its hello; the listener reads the hello
//! only after an ACCEPT, and gives the whole exchange [`PG_NET_HELLO_TIMEOUT_MS`]. The key is
//! not the cluster secret itself but one derived from it and the group, so a process with the
//! secret but of another group (or an EP link knocking on a pg listener) fails the same way
//! as a stranger:
//!
//! ```text
//!  connecting side                                  listener
//!    | auth HELLO      nonce_c                 32 B   |
//!    |----------------------------------------------->|
//!    |               auth CHALLENGE nonce_s    32 B   |
//!    |<-----------------------------------------------|
//!    | auth PROOF      mac_c                   32 B   |
//!    |----------------------------------------------->|  wrong: REFUSE, close, counted
//!    |               auth ACCEPT mac_s         32 B   |
//!    |<-----------------------------------------------|  the connecting side checks mac_s
//!    | hello (MCPGNET1 / MCPGJOIN / MCEPNET1)  24 B   |
//!    |----------------------------------------------->|  then frames as above
//!
//!  key   = HMAC-SHA256(cluster secret, "mooncake-rs auth v1 derive" || kind || 0 || group)
//!  mac_c = HMAC-SHA256(key, "mooncake-rs auth v1 client" || nonce_c || nonce_s)[..24]
//!  mac_s = HMAC-SHA256(key, "mooncake-rs auth v1 server" || nonce_c || nonce_s)[..24]
//!  kind  = "pg" or "ep"; group = the id every member agrees on (mooncake.pg: a random id
//!          rank 0 puts in the torch store; EP: every rank's host, endpoint, size and path)
//! ```
//!
//! A refused connection is closed before any byte of the group's data is sent to it, takes
//! no rank's place (the real rank can still connect), is logged and counted
//! ([`refused_links`]). Without a secret nothing of the handshake is sent (the hello comes
//! first, as always), and links that listen beyond loopback log a warning once. Because each
//! outgoing link now waits for its peer's listener to answer, a rank connects to its peers on
//! a thread of its own while it accepts theirs (`connect_while_accepting`).
//!
//! What is pushed ([`Link::sync`]), in this order on one connection, so that a STORE of a
//! counter always follows the bytes it publishes (the same Release/Acquire pairing as shared
//! memory, with the receive thread's store standing in for the owner's):
//! - per collective phase `s` not yet pushed: the slot bytes the reader will read (the
//!   extent the owner recorded, only the reader's piece for the pieces layouts, nothing when
//!   the reader never reads this rank's slot in that op; from the caller's tensor instead of
//!   the slot when the op set a source, [`super::push`]), the slot's descriptor, `posted = s`;
//! - `done`, `left`, and for the reader `q` only: every point-to-point chunk published on the
//!   channel to `q` (header and data) then `sent[q]`, and `acked[q]`.
//!
//! The membership words go as STOREs too ([`Link::sync_member`], called by the membership
//! thread through [`super::Shared::publish_member`]): only the changed ones, in the order
//! [`super::membership::member_changes`] gives, so a replica's reader sees a publishing word
//! (an ack, a request or answer id, `pending`) only after the words it publishes.
//!
//! A sync runs synchronously on the thread that stored a counter (the collective or the
//! point-to-point worker, through [`super::Shared::publish`]), under the link's lock. Why
//! pushes cannot overwrite bytes a reader still uses: the owner reuses slot `s % 2` only
//! after the reader's `done >= s - 2`, which the reader can only have stored after it saw
//! phase `s - 2`, i.e. after that push completed; a phase is never pushed twice.
//!
//! Liveness: a link's peer is dead when its incoming connection ends (EOF, reset, a
//! malformed frame), when nothing (data or heartbeat) arrived for the collective timeout, or
//! when a push to it fails or makes no progress for that long. Death clears the replica's
//! flag, which is what [`Segment::owner_alive`] reports: the collectives treat it like a lost
//! segment lock. A heartbeat thread sends a HEARTBEAT on every link idle for a quarter of the
//! collective timeout (clamped to [`PG_NET_HEARTBEAT_MIN_MS`, `PG_NET_HEARTBEAT_MAX_MS`]).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, OnceLock, RwLock, Weak};
use std::time::{Duration, Instant};

use protocol::auth::{client_handshake, server_handshake, ServerRefusal, Token};

use super::push::PushFrom;
use super::seg::{load, Desc, Segment, CHUNK_HEADER_BYTES, MEMBER_WORDS};
pub(crate) use super::send::send_all;
use super::{Shared, COLLECTIVE_TIMEOUT_US};
use crate::limits::{
    PG_COLL_SLOT_BYTES, PG_NET_CONNECT_TIMEOUT_MS, PG_NET_HEARTBEAT_MAX_MS,
    PG_NET_HEARTBEAT_MIN_MS, PG_NET_HELLO_TIMEOUT_MS, PG_NET_INLINE_BYTES, PG_NET_JOINERS_MAX,
    PG_NET_RX_BUFFER_BYTES, PG_P2P_SLOT_BYTES,
};

/// Hello of a founding rank's link.
pub const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"MCPGNET1");
/// How long a joining process tries to reach a member before taking it as dead.
const JOIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Hello of a process joining the group later (a replacement on another host).
pub const JOIN_MAGIC: u64 = u64::from_le_bytes(*b"MCPGJOIN");
const HELLO_TIMEOUT: Duration = Duration::from_millis(PG_NET_HELLO_TIMEOUT_MS);
/// Bytes of a hello and of a frame header.
pub const FRAME_BYTES: usize = 24;
const KIND_WRITE: u32 = 1;
const KIND_STORE: u32 = 2;
pub(crate) const KIND_HEARTBEAT: u32 = 3;
/// How often a blocked send or receive wakes to check liveness and the stop flag.
pub(crate) const POLL: Duration = Duration::from_millis(20);

/// The 24-byte header of a frame: `kind`, reserved zero, `offset`, `n` (module docs).
pub fn frame(kind: u32, offset: u64, n: u64) -> [u8; FRAME_BYTES] {
    let mut h = [0u8; FRAME_BYTES];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&offset.to_le_bytes());
    h[16..24].copy_from_slice(&n.to_le_bytes());
    h
}

/// A frame header's fields, `(kind, offset, n)`, from the first [`FRAME_BYTES`] of `b`;
/// `Err` when `b` is shorter or the reserved word is not 0 (every sender writes 0, so a
/// stream that lost its place fails here rather than later). Shared by the pg and EP links.
pub fn frame_fields(b: &[u8]) -> Result<(u32, u64, u64), String> {
    let h = b
        .first_chunk::<FRAME_BYTES>()
        .ok_or_else(|| format!("a frame header of {} bytes, want {FRAME_BYTES}", b.len()))?;
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let u64_at = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&h[i..i + 8]);
        u64::from_le_bytes(w)
    };
    let (kind, reserved) = (u32_at(0), u32_at(4));
    if reserved != 0 {
        return Err(format!(
            "frame kind {kind} with reserved word {reserved:#x}, want 0"
        ));
    }
    Ok((kind, u64_at(8), u64_at(16)))
}

/// A pg frame, decoded and checked against the receiving replica ([`decode_frame`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Liveness only.
    Heartbeat,
    /// Store `value` into the header counter at byte `offset` (8-aligned, inside the header).
    Store { offset: usize, value: u64 },
    /// The next `len` payload bytes go to `offset..offset + len` of the replica, a range
    /// that lies inside it.
    Write { offset: usize, len: usize },
}

impl Frame {
    /// The header bytes this frame was decoded from.
    pub fn encode(&self) -> [u8; FRAME_BYTES] {
        match *self {
            Frame::Heartbeat => frame(KIND_HEARTBEAT, 0, 0),
            Frame::Store { offset, value } => frame(KIND_STORE, offset as u64, value),
            Frame::Write { offset, len } => frame(KIND_WRITE, offset as u64, len as u64),
        }
    }
}

/// Decodes the frame header at the start of `b` and checks it against a replica of
/// `seg_len` bytes: a STORE must name a header counter ([`super::seg::counter_offset`]), a
/// WRITE must lie inside the replica, a HEARTBEAT carries zeros. `Err` (why) ends the link.
/// The receive thread calls this before it touches the replica; a pure function, so the
/// `pg_frame` fuzz target drives it.
pub fn decode_frame(b: &[u8], seg_len: usize) -> Result<Frame, String> {
    let (kind, off, n) = frame_fields(b)?;
    match kind {
        KIND_HEARTBEAT if off == 0 && n == 0 => Ok(Frame::Heartbeat),
        KIND_HEARTBEAT => Err(format!("HEARTBEAT with fields {off}, {n}, want 0, 0")),
        KIND_STORE => usize::try_from(off)
            .ok()
            .filter(|&o| super::seg::counter_offset(o) && o + 8 <= seg_len)
            .map(|offset| Frame::Store { offset, value: n })
            .ok_or_else(|| format!("STORE at offset {off}: not a header counter")),
        KIND_WRITE => match (usize::try_from(off), usize::try_from(n)) {
            (Ok(offset), Ok(len)) if offset.checked_add(len).is_some_and(|e| e <= seg_len) => {
                Ok(Frame::Write { offset, len })
            }
            _ => Err(format!(
                "WRITE of {n} bytes at {off}: the segment has {seg_len}"
            )),
        },
        k => Err(format!("unknown frame kind {k}")),
    }
}

/// Liveness timeout: the collective timeout (process-wide, read on every check), but at
/// least four shortest heartbeat periods, so a tiny timeout cannot outrun the heartbeats.
pub(crate) fn dead_after() -> Duration {
    let floor_us = 4 * PG_NET_HEARTBEAT_MIN_MS * 1000;
    Duration::from_micros(COLLECTIVE_TIMEOUT_US.load(Ordering::Relaxed).max(floor_us))
}

pub(crate) fn heartbeat_every() -> Duration {
    let ms = (dead_after().as_millis() as u64 / 4)
        .clamp(PG_NET_HEARTBEAT_MIN_MS, PG_NET_HEARTBEAT_MAX_MS);
    Duration::from_millis(ms)
}

/// Whether rank `reader` reads rank `writer`'s collective slot in a phase described by `d`.
fn reads_slot(d: &Desc, writer: usize, reader: usize) -> bool {
    let root = d.root as usize;
    match d.kind {
        2 | 8 => writer == root, // broadcast, scatter: everyone reads the root's slot only
        6 | 7 => reader == root, // reduce, gather: only the root reads
        _ => true,
    }
}

/// Who may link to this rank. With a cluster secret every link (a founder's, a joiner's, an
/// EP link) opens with the challenge-response of `protocol::auth`, run under a key derived
/// from the secret and the group (`Token::derive` of `kind || 0 || group`), before its hello
/// (module docs): a peer that does not know both is dropped before its hello is read, and
/// never gets a byte of the group's data. Without a secret there is no handshake.
#[derive(Clone, Debug, Default)]
pub struct LinkAuth {
    /// The group's key; `None`: no secret, no handshake.
    key: Option<Token>,
}

impl LinkAuth {
    /// Links of kind `kind` (`b"pg"`, `b"ep"`) bound to the group every member names `group`,
    /// under the cluster secret `token` (`None`: no secret, links open to anyone).
    pub fn new(token: Option<&Token>, kind: &[u8], group: &[u8]) -> LinkAuth {
        let key = token.map(|t| {
            let mut context = Vec::with_capacity(kind.len() + 1 + group.len());
            context.extend_from_slice(kind);
            context.push(0);
            context.extend_from_slice(group);
            t.derive(&context)
        });
        LinkAuth { key }
    }

    /// [`LinkAuth::new`] under this process's cluster secret
    /// (`protocol::auth::process_token_or_none`), what the Python bindings use.
    pub fn process(kind: &[u8], group: &[u8]) -> LinkAuth {
        LinkAuth::new(protocol::auth::process_token_or_none(), kind, group)
    }

    /// No secret: the links take any peer whose hello fits.
    pub fn open() -> LinkAuth {
        LinkAuth { key: None }
    }

    /// Proves the key on a fresh outgoing connection, and checks the peer's proof, by
    /// `until`. Errors: the peer refused us, or could not prove it knows the key.
    pub(crate) fn connect(&self, sock: &TcpStream, until: Instant) -> io::Result<()> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        client_handshake(&mut Timed { sock, until }, key).map_err(|e| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{e}; a link proves the cluster secret and its group's id"),
            )
        })
    }

    /// Checks an incoming connection's proof of the key by `until`, before its hello.
    /// `Err`: why the peer is refused (a REFUSE was sent if it got that far).
    pub(crate) fn accept(&self, sock: &TcpStream, until: Instant) -> Result<(), String> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        server_handshake(&mut Timed { sock, until }, key).map_err(|e| match e {
            ServerRefusal::NotHandshake(b) => format!(
                "it sent {:02x?}.. instead of a proof of the cluster secret (a peer without \
                 the secret?)",
                &b[..8]
            ),
            ServerRefusal::Failed(e) => e.to_string(),
        })
    }

    /// Warns once per process when links listen beyond loopback without a secret.
    pub(crate) fn warn_if_open(&self, listener: &TcpListener, who: &str) {
        static WARNED: Once = Once::new();
        let Ok(at) = listener.local_addr() else {
            return;
        };
        if self.key.is_none() && !at.ip().is_loopback() {
            WARNED.call_once(|| {
                tracing::warn!(
                    "{who}: links listen on {at} with no cluster secret: anyone who can reach \
                     it can join a group and read its pushes; set MC_AUTH_TOKEN or \
                     MC_AUTH_TOKEN_FILE on every rank (docs/security.md)"
                )
            });
        }
    }
}

/// A socket whose reads and writes give up at `until`: one deadline for a whole exchange
/// (the handshake, the hello), not per call, so a peer dribbling bytes cannot stretch it.
struct Timed<'a> {
    sock: &'a TcpStream,
    until: Instant,
}

impl Timed<'_> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
        }
        Ok(left)
    }
}

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.sock.set_read_timeout(Some(self.left()?))?;
        let mut s = self.sock;
        s.read(buf)
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sock.set_write_timeout(Some(self.left()?))?;
        let mut s = self.sock;
        s.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Connections this process's pg and EP listeners refused (no proof of the key, a hello
/// that does not fit, a joiner over the cap): [`refused_links`].
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// How many incoming pg and EP connections this process refused so far.
pub fn refused_links() -> u64 {
    REFUSED.load(Ordering::Relaxed)
}

fn refuse(who: &str, from: SocketAddr, why: &str) {
    REFUSED.fetch_add(1, Ordering::Relaxed);
    tracing::warn!("{who}: refused a connection from {from}: {why}");
}

/// The sending half of the connection to one remote rank, and what has been pushed to it.
struct Link {
    peer: usize,
    sock: TcpStream,
    alive: Arc<AtomicBool>,
    posted: u64,
    done: u64,
    left: u64,
    sent: u64,
    acked: u64,
    out: Vec<u8>,
    last_send: Instant,
    /// Membership words as last pushed (the replica's values).
    member: Vec<u64>,
    /// Scratch for [`super::membership::member_changes`].
    changes: Vec<(usize, u64)>,
}

impl Link {
    /// A link to rank `peer` over `sock`. For a process joining the group (`own` given), the
    /// link starts from this rank's current counters (queued as STOREs): the joiner reads no
    /// phase or chunk published before it joined, so none is pushed.
    fn new(peer: usize, sock: TcpStream, alive: Arc<AtomicBool>, own: Option<&Segment>) -> Link {
        let mut l = Link {
            peer,
            sock,
            alive,
            posted: 0,
            done: 0,
            left: 0,
            sent: 0,
            acked: 0,
            out: Vec::with_capacity(PG_NET_INLINE_BYTES + 4 * FRAME_BYTES),
            last_send: Instant::now(),
            member: vec![0; MEMBER_WORDS],
            changes: Vec::new(),
        };
        if let Some(own) = own {
            l.posted = load(own.posted());
            l.sent = load(own.sent(peer));
            l.store(own, own.posted(), l.posted);
            l.store(own, own.sent(peer), l.sent);
        }
        l
    }

    /// Marks the peer dead and ends the connection (its receive side sees it too).
    fn kill(&mut self) {
        self.alive.store(false, Ordering::Release);
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }

    fn flush(&mut self, big: Option<(*const u8, usize)>) -> io::Result<()> {
        let mut parts = vec![(self.out.as_ptr(), self.out.len())];
        parts.extend(big);
        let r = send_all(&self.sock, &parts, &self.alive);
        self.out.clear();
        self.last_send = Instant::now();
        r
    }

    /// Queues a WRITE of `len` bytes at `src` (inside `own`) to the same offset.
    fn write(&mut self, own: &Segment, src: *const u8, len: usize) -> io::Result<()> {
        self.write_at(own.offset_of(src), src, len)
    }

    /// Queues a WRITE of the `len` bytes at `src` (inside `own`, or a caller's buffer that
    /// [`PushFrom`] names) to offset `off` of the replica.
    fn write_at(&mut self, off: usize, src: *const u8, len: usize) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.out
            .extend_from_slice(&frame(KIND_WRITE, off as u64, len as u64));
        if len <= PG_NET_INLINE_BYTES {
            // SAFETY: `src..src+len` lies inside `own`, which the owner does not rewrite
            // before this push completes (module docs), or in a caller's buffer that the op
            // keeps alive and unchanged meanwhile (`push` module docs).
            self.out
                .extend_from_slice(unsafe { std::slice::from_raw_parts(src, len) });
            return Ok(());
        }
        self.flush(Some((src, len)))
    }

    fn store(&mut self, own: &Segment, counter: &std::sync::atomic::AtomicU64, v: u64) {
        let off = own.offset_of((counter as *const std::sync::atomic::AtomicU64).cast());
        self.out
            .extend_from_slice(&frame(KIND_STORE, off as u64, v));
    }

    /// Pushes the membership words of `own` that changed since the last push, as STOREs in
    /// the order [`super::membership::member_changes`] gives.
    fn sync_member(&mut self, own: &Segment) -> io::Result<()> {
        let mut changes = std::mem::take(&mut self.changes);
        changes.clear();
        super::membership::member_changes(own, &mut self.member, &mut changes);
        for &(i, v) in &changes {
            self.store(own, own.member_word(i), v);
        }
        self.changes = changes;
        if !self.out.is_empty() {
            self.flush(None)?;
        }
        Ok(())
    }

    /// Pushes every change of `own` (this rank `me`'s segment) the peer has not seen yet.
    fn sync(&mut self, own: &Segment, me: usize, from: &PushFrom) -> io::Result<()> {
        let q = self.peer;
        let posted = load(own.posted());
        if posted > self.posted + 2 {
            // A new view restarted the phases far above the old ones (`vid << 40`,
            // membership.rs); the phases in between never existed. Every store of `posted`
            // is followed by a sync, so only the newest one is unpushed.
            self.posted = posted - 1;
        }
        while self.posted < posted {
            let s = self.posted + 1;
            let slot = (s & 1) as usize;
            let desc = own.desc(slot);
            if reads_slot(&desc, me, q) {
                let base = own.coll_slot(slot);
                let (stride, bytes) = own.extent(slot);
                let (off, len) = if stride == 0 {
                    (0, bytes.min(PG_COLL_SLOT_BYTES))
                } else {
                    let off = (q * stride).min(PG_COLL_SLOT_BYTES);
                    (off, bytes.min(PG_COLL_SLOT_BYTES - off))
                };
                // SAFETY: `off + len` is at most the slot size.
                let at = unsafe { base.add(off) };
                let (src, n) = from.get(slot, q).unwrap_or((at, len));
                self.write_at(own.offset_of(at), src, n.min(len))?;
            }
            self.write(own, own.desc_ptr(slot), std::mem::size_of::<Desc>())?;
            self.store(own, own.posted(), s);
            self.posted = s;
        }
        let done = load(own.done());
        if done != self.done {
            self.store(own, own.done(), done);
            self.done = done;
        }
        let left = load(own.left_counter());
        if left != self.left {
            self.store(own, own.left_counter(), left);
            self.left = left;
        }
        let sent = load(own.sent(q));
        if sent < self.sent {
            // The channel to this slot restarted (a new process took it over): the counter
            // goes back, as a mapped segment's would.
            self.store(own, own.sent(q), sent);
            self.sent = sent;
        }
        while self.sent < sent {
            let k = self.sent + 1;
            let (hdr, data) = own.channel_slot(q, (k & 1) as usize);
            // SAFETY: the chunk header is two u64 inside the segment, written before `sent`.
            let len = unsafe { hdr.add(1).read_volatile() } as usize;
            debug_assert_eq!(data as usize - hdr as usize, CHUNK_HEADER_BYTES);
            let bytes = CHUNK_HEADER_BYTES + len.min(PG_P2P_SLOT_BYTES);
            self.write(own, hdr.cast_const().cast(), bytes)?;
            self.store(own, own.sent(q), k);
            self.sent = k;
        }
        let acked = load(own.acked(q));
        if acked != self.acked {
            self.store(own, own.acked(q), acked);
            self.acked = acked;
        }
        if !self.out.is_empty() {
            self.flush(None)?;
        }
        Ok(())
    }
}

/// What the threads of one rank's [`Net`] share.
struct Inner {
    me: usize,
    ranks: usize,
    /// Every link this rank pushes to: the ones built with the group, then one per process
    /// on another host that joined (a dead link stays, skipped, until the group ends).
    links: RwLock<Vec<Arc<Mutex<Link>>>>,
    /// Replicas of the processes on other hosts that asked to take a slot over:
    /// `(slot, pid, replica)`, newest last ([`Net::joiner`]).
    joiners: Mutex<Vec<(usize, u32, Arc<Segment>)>>,
    /// Read halves (clones), shut down on drop to end the receive threads.
    inbound: Mutex<Vec<TcpStream>>,
    stop: AtomicBool,
    /// The communicator, for admitting joiners ([`Net::attach`]).
    shared: OnceLock<Weak<Shared>>,
    /// Who may join.
    auth: LinkAuth,
}

/// This rank's links to the ranks on other hosts, and the listener through which a process
/// on another host joins the group later (a replacement process, `is_extension`).
pub struct Net {
    inner: Arc<Inner>,
}

impl Net {
    /// Connects rank `me` of `ranks` to every remote rank `r` listed in `remotes` (its
    /// advertised `host:port`) and accepts their connections on `listener`. `replicas[r]` is
    /// the receive side of rank `r`'s replica ([`Segment::replica`]). The listener then
    /// keeps admitting processes on other hosts that join the group ([`Net::join`]). Every
    /// link, both ways, and every joiner passes `auth` first.
    pub fn establish(
        listener: TcpListener,
        me: usize,
        ranks: usize,
        remotes: &[(usize, String)],
        replicas: Vec<(usize, Segment)>,
        auth: &LinkAuth,
    ) -> io::Result<Net> {
        auth.warn_if_open(&listener, "mooncake.pg");
        let deadline = Instant::now() + Duration::from_millis(PG_NET_CONNECT_TIMEOUT_MS);
        let mut alive_of: HashMap<usize, Arc<AtomicBool>> = HashMap::new();
        for (r, seg) in &replicas {
            if let Some(a) = seg.remote_flag() {
                alive_of.insert(*r, a.clone());
            }
        }
        let connect = || {
            let mut links = Vec::new();
            for (r, addr) in remotes {
                let sock = connect_until(addr, deadline).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("connecting to rank {r} at {addr}: {e} (is pg.set_host_ip right?)"),
                    )
                })?;
                sock.set_nodelay(true)?;
                auth.connect(&sock, deadline)
                    .map_err(|e| io::Error::new(e.kind(), format!("rank {r} at {addr}: {e}")))?;
                (&sock).write_all(&hello(HELLO_MAGIC, ranks, me, *r, 0))?;
                sock.set_write_timeout(Some(POLL))?;
                let alive = alive_of.get(r).cloned().ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("no replica for rank {r}"),
                    )
                })?;
                links.push(Arc::new(Mutex::new(Link::new(*r, sock, alive, None))));
            }
            Ok(links)
        };
        let accept = |abort: &AtomicBool| {
            accept_all(
                HELLO_MAGIC,
                &listener,
                me,
                ranks,
                remotes,
                deadline,
                auth,
                abort,
            )
        };
        let (links, mut incoming) = connect_while_accepting(connect, accept)?;
        let inner = Inner::new(me, ranks, links, auth.clone());
        for (r, seg) in replicas {
            let sock = incoming.remove(&r).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("rank {r} is not remote"),
                )
            })?;
            inner
                .inbound
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(sock.try_clone()?);
            spawn_receive(&inner, Rx::new(sock), seg, r)?;
        }
        Net::start(inner, listener)
    }

    /// The links of a process joining an existing group as rank `me` (a replacement process,
    /// `is_extension`) to the members on other hosts: for each `(r, host:port)` of `members`
    /// it connects to member `r`'s listener and announces itself (with its pid); the member
    /// answers on the same connection with a snapshot of its segment, applied to `replicas[r]`
    /// before this returns, and from then on both sides push over it. `listener` then admits
    /// later joiners, as on every member. Every link passes `auth` first.
    pub fn join(
        listener: TcpListener,
        me: usize,
        ranks: usize,
        members: &[(usize, String)],
        replicas: Vec<(usize, Segment)>,
        auth: &LinkAuth,
    ) -> io::Result<Net> {
        auth.warn_if_open(&listener, "mooncake.pg");
        let deadline = Instant::now() + Duration::from_millis(PG_NET_CONNECT_TIMEOUT_MS);
        let inner = Inner::new(me, ranks, Vec::new(), auth.clone());
        let pid = std::process::id();
        for (r, seg) in replicas {
            let addr = members
                .iter()
                .find(|m| m.0 == r)
                .map(|m| m.1.as_str())
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("no address for rank {r}"),
                    )
                })?;
            // A member whose listener is gone is dead: its slot reads as dead, as a same-host
            // member's unmappable segment does.
            let reach = deadline.min(Instant::now() + JOIN_CONNECT_TIMEOUT);
            let sock = match connect_until(addr, reach) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(
                        "mooncake.pg: rank {r} at {addr} is unreachable ({e}): taken as dead"
                    );
                    seg.mark_dead();
                    continue;
                }
            };
            sock.set_nodelay(true)?;
            auth.connect(&sock, deadline).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("rank {r} at {addr} did not admit this process: {e}"),
                )
            })?;
            (&sock).write_all(&hello(JOIN_MAGIC, ranks, me, r, pid))?;
            sock.set_write_timeout(Some(POLL))?;
            let mut rx = Rx::new(sock.try_clone()?);
            rx.sock.set_read_timeout(Some(POLL))?;
            // The member's snapshot ends with a HEARTBEAT.
            loop {
                match rx.frame(&seg, &inner.stop) {
                    Ok(Frame::Heartbeat) => break,
                    Ok(_) if Instant::now() < deadline => {}
                    Ok(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("rank {r} at {addr}: no snapshot"),
                        ))
                    }
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!(
                            "rank {r} at {addr} did not admit this process ({e}); its log says why"
                        ),
                        ))
                    }
                }
            }
            let alive = seg.remote_flag().expect("a replica").clone();
            let link = Link::new(r, sock.try_clone()?, alive, None);
            inner
                .links
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .push(Arc::new(Mutex::new(link)));
            inner
                .inbound
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(sock);
            spawn_receive(&inner, rx, seg, r)?;
        }
        Net::start(inner, listener)
    }

    /// Starts the heartbeat and the admission threads.
    fn start(inner: Arc<Inner>, listener: TcpListener) -> io::Result<Net> {
        let i = inner.clone();
        std::thread::Builder::new()
            .name(format!("mc-pg-hb-{}", inner.me))
            .spawn(move || heartbeat(&i))?;
        let i = inner.clone();
        std::thread::Builder::new()
            .name(format!("mc-pg-admit-{}", inner.me))
            .spawn(move || admit_joiners(&i, listener))?;
        Ok(Net { inner })
    }

    /// Hands the running communicator to the admission thread (until then joiners wait).
    pub(crate) fn attach(&self, sh: Weak<Shared>) {
        let _ = self.inner.shared.set(sh);
    }

    /// Whether any rank on another host is linked (then the direct-read path stays off).
    pub(crate) fn has_links(&self) -> bool {
        !self
            .inner
            .links
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// The replica of process `pid` on another host that asked to take slot `r` over, if it
    /// is still alive.
    pub(crate) fn joiner(&self, r: usize, pid: u32) -> Option<Arc<Segment>> {
        let j = self.inner.joiners.lock().unwrap_or_else(|e| e.into_inner());
        j.iter()
            .rev()
            .find(|x| x.0 == r && x.1 == pid)
            .filter(|x| x.2.owner_alive())
            .map(|x| x.2.clone())
    }

    /// Pushes this rank's new segment state to every live remote peer; a failed push marks
    /// that peer dead.
    pub(crate) fn publish(&self, own: &Segment, from: &PushFrom) {
        self.each_link(|l| l.sync(own, self.inner.me, from));
    }

    /// Pushes this rank's changed membership words to every live remote peer.
    pub fn publish_member(&self, own: &Segment) {
        self.each_link(|l| l.sync_member(own));
    }

    fn each_link(&self, push: impl Fn(&mut Link) -> io::Result<()>) {
        let links = self.inner.links.read().unwrap_or_else(|e| e.into_inner());
        for l in links.iter() {
            let mut l = l.lock().unwrap_or_else(|e| e.into_inner());
            if !l.alive.load(Ordering::Acquire) {
                continue;
            }
            if let Err(e) = push(&mut l) {
                tracing::warn!(
                    "mooncake.pg: push to rank {} failed ({e}): marked dead",
                    l.peer
                );
                l.kill();
            }
        }
    }
}

impl Inner {
    fn new(me: usize, ranks: usize, links: Vec<Arc<Mutex<Link>>>, auth: LinkAuth) -> Arc<Inner> {
        Arc::new(Inner {
            me,
            ranks,
            links: RwLock::new(links),
            joiners: Mutex::new(Vec::new()),
            inbound: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            shared: OnceLock::new(),
            auth,
        })
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let inner = &self.inner;
        inner.stop.store(true, Ordering::Release);
        for s in inner
            .inbound
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for l in inner.links.read().unwrap_or_else(|e| e.into_inner()).iter() {
            let l = l.lock().unwrap_or_else(|e| e.into_inner());
            let _ = l.sock.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// The 24-byte hello that opens every pg and EP link (after the handshake, with a secret):
/// `magic`, group size, sender, receiver, and `extra` (a joiner's pid, else 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub magic: u64,
    pub ranks: u32,
    pub from: u32,
    pub to: u32,
    pub extra: u32,
}

impl Hello {
    /// The wire bytes.
    pub fn encode(&self) -> [u8; FRAME_BYTES] {
        let mut h = [0u8; FRAME_BYTES];
        h[0..8].copy_from_slice(&self.magic.to_le_bytes());
        h[8..12].copy_from_slice(&self.ranks.to_le_bytes());
        h[12..16].copy_from_slice(&self.from.to_le_bytes());
        h[16..20].copy_from_slice(&self.to.to_le_bytes());
        h[20..24].copy_from_slice(&self.extra.to_le_bytes());
        h
    }

    /// Decodes the first [`FRAME_BYTES`] of `b`; `None` when it is shorter. Never panics.
    pub fn decode(b: &[u8]) -> Option<Hello> {
        let h = b.first_chunk::<FRAME_BYTES>()?;
        let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&h[0..8]);
        Some(Hello {
            magic: u64::from_le_bytes(magic),
            ranks: u32_at(8),
            from: u32_at(12),
            to: u32_at(16),
            extra: u32_at(20),
        })
    }

    /// The sending rank, if this is a founder's hello (`magic`) for rank `me` of `ranks`
    /// from another rank of the group.
    pub fn founder(&self, magic: u64, me: usize, ranks: usize) -> Result<usize, String> {
        let (n, r, to) = (self.ranks as usize, self.from as usize, self.to as usize);
        if self.magic != magic || n != ranks || to != me || r >= n || r == me {
            return Err(format!(
                "hello for rank {to} of {n} from rank {r}, this is rank {me} of {ranks}"
            ));
        }
        Ok(r)
    }

    /// `(slot, pid)`, if this is a join hello for rank `me` of `ranks` from a process with
    /// a pid that asks for another slot of the group.
    pub fn joiner(&self, me: usize, ranks: usize) -> Result<(usize, u32), String> {
        let (n, r, to, pid) = (
            self.ranks as usize,
            self.from as usize,
            self.to as usize,
            self.extra,
        );
        if self.magic != JOIN_MAGIC || n != ranks || to != me || r >= n || r == me || pid == 0 {
            return Err(format!(
                "hello for rank {to} of {n} from slot {r} (pid {pid}); this is rank {me} of \
                 {ranks}"
            ));
        }
        Ok((r, pid))
    }
}

/// A 24-byte hello: `magic`, group size, sender, receiver, and `extra` (a joiner's pid).
fn hello(magic: u64, ranks: usize, from: usize, to: usize, extra: u32) -> [u8; FRAME_BYTES] {
    Hello {
        magic,
        ranks: ranks as u32,
        from: from as u32,
        to: to as u32,
        extra,
    }
    .encode()
}

/// Admits processes on other hosts joining the group, until the communicator stops.
fn admit_joiners(inner: &Arc<Inner>, listener: TcpListener) {
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::warn!(
            "mooncake.pg: the join listener is unusable ({e}): no process on another host can join"
        );
        return;
    }
    while !inner.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((sock, from)) => {
                if let Err(e) = admit(inner, sock) {
                    refuse(
                        "mooncake.pg",
                        from,
                        &format!("not admitted as a joiner: {e}"),
                    );
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => {
                tracing::warn!("mooncake.pg: accepting a joining process: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Admits one joining process: checks its hello, makes a replica of its segment (carrying
/// its pid, which the views name), sends it a snapshot of this rank's segment, links to it
/// on the same connection and announces it in this rank's mailbox for its slot
/// ([`super::membership`]); it becomes a member when a view activates it.
fn admit(inner: &Arc<Inner>, sock: TcpStream) -> io::Result<()> {
    let bad = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
    sock.set_nonblocking(false)?;
    let until = Instant::now() + HELLO_TIMEOUT;
    inner
        .auth
        .accept(&sock, until)
        .map_err(|why| io::Error::new(io::ErrorKind::PermissionDenied, why))?;
    let mut h = [0u8; FRAME_BYTES];
    Timed { sock: &sock, until }.read_exact(&mut h)?;
    let n = inner.ranks;
    let (r, pid) = Hello::decode(&h)
        .expect("a full hello")
        .joiner(inner.me, n)
        .map_err(bad)?;
    {
        let mut j = inner.joiners.lock().unwrap_or_else(|e| e.into_inner());
        j.retain(|x| x.2.owner_alive());
        if j.len() >= PG_NET_JOINERS_MAX {
            return Err(bad(format!(
                "{} processes on other hosts are admitted already, the most at once",
                j.len()
            )));
        }
    }
    let sh = inner
        .shared
        .get()
        .and_then(Weak::upgrade)
        .ok_or_else(|| bad("the communicator is not running".into()))?;
    if sh.cma() {
        return Err(bad(format!(
            "slot {r}: this group reads its peers' memory directly (process_vm_readv), which a \
             process on another host cannot serve; run the group with MC_PG_CMA=0 to let one join"
        )));
    }
    let (mine, rx) = Segment::replica(n, r)?;
    mine.set_owner_pid(pid);
    sock.set_nodelay(true)?;
    sock.set_write_timeout(Some(POLL))?;
    let alive = mine.remote_flag().expect("a replica").clone();
    let mut link = Link::new(r, sock.try_clone()?, alive, Some(&sh.own));
    link.sync(&sh.own, inner.me, &sh.push_from)?;
    link.sync_member(&sh.own)?;
    link.out.extend_from_slice(&frame(KIND_HEARTBEAT, 0, 0));
    link.flush(None)?;
    {
        let mut j = inner.joiners.lock().unwrap_or_else(|e| e.into_inner());
        j.retain(|x| x.2.owner_alive());
        j.push((r, pid, Arc::new(mine)));
    }
    super::membership::announce_remote(&sh, r, pid);
    inner
        .links
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .push(Arc::new(Mutex::new(link)));
    inner
        .inbound
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(sock.try_clone()?);
    sock.set_read_timeout(None)?;
    spawn_receive(inner, Rx::new(sock), rx, r)?;
    tracing::info!("mooncake.pg: a process on another host (pid {pid}) asks to take rank {r} over");
    Ok(())
}

fn spawn_receive(inner: &Arc<Inner>, rx: Rx, seg: Segment, r: usize) -> io::Result<()> {
    let i = inner.clone();
    std::thread::Builder::new()
        .name(format!("mc-pg-rx-{}-{r}", inner.me))
        .spawn(move || receive(rx, seg, r, &i.stop))?;
    Ok(())
}

pub(crate) fn connect_until(addr: &str, deadline: Instant) -> io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr.to_socket_addrs()?.collect();
    loop {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        if Instant::now() >= deadline {
            return Err(last);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `connect` (a group's outgoing links) on a thread of its own while `accept` (its
/// incoming ones) runs on this one, and returns both. With a secret, every outgoing link
/// waits for the peer's accepting side to answer its handshake, so a rank that connected
/// to every peer before it accepted would wait for peers doing the same. `accept` is told
/// to give up (its `abort`) when `connect` fails; `connect`'s error comes first.
pub(crate) fn connect_while_accepting<A: Send, B>(
    connect: impl FnOnce() -> io::Result<A> + Send,
    accept: impl FnOnce(&AtomicBool) -> io::Result<B>,
) -> io::Result<(A, B)> {
    let abort = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let c = std::thread::Builder::new()
            .name("mc-pg-connect".into())
            .spawn_scoped(sc, || {
                let r = connect();
                if r.is_err() {
                    abort.store(true, Ordering::Release);
                }
                r
            })?;
        let b = accept(&abort);
        let a = c
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the connecting thread panicked")));
        Ok((a?, b?))
    })
}

/// Accepts one connection from every remote rank: each proves the key (`auth`, with a
/// secret) and sends a hello that fits; any other connection is refused (closed, counted)
/// and takes no rank's place. Gives up at `deadline` or when `abort` is set.
#[allow(clippy::too_many_arguments)]
pub(crate) fn accept_all(
    magic: u64,
    listener: &TcpListener,
    me: usize,
    ranks: usize,
    remotes: &[(usize, String)],
    deadline: Instant,
    auth: &LinkAuth,
    abort: &AtomicBool,
) -> io::Result<HashMap<usize, TcpStream>> {
    let who = if magic == HELLO_MAGIC {
        "mooncake.pg"
    } else {
        "Mooncake EP"
    };
    listener.set_nonblocking(true)?;
    let mut got: HashMap<usize, TcpStream> = HashMap::new();
    while got.len() < remotes.len() {
        let (sock, from) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if abort.load(Ordering::Acquire) {
                    return Err(io::Error::other("gave up: the outgoing links failed"));
                }
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = remotes
                        .iter()
                        .map(|x| x.0)
                        .filter(|r| !got.contains_key(r))
                        .collect();
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("ranks {missing:?} never connected"),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(e),
        };
        sock.set_nonblocking(false)?;
        let until = Instant::now() + HELLO_TIMEOUT;
        if let Err(why) = auth.accept(&sock, until) {
            refuse(who, from, &why);
            continue;
        }
        let mut h = [0u8; FRAME_BYTES];
        if let Err(e) = (Timed { sock: &sock, until }).read_exact(&mut h) {
            refuse(who, from, &format!("no hello ({e})"));
            continue;
        }
        let r = Hello::decode(&h)
            .expect("a full hello")
            .founder(magic, me, ranks)
            .and_then(|r| {
                let expected = remotes.iter().any(|x| x.0 == r) && !got.contains_key(&r);
                if expected {
                    Ok(r)
                } else {
                    Err(format!("rank {r} is not a remote rank still to connect"))
                }
            });
        match r {
            Ok(r) => {
                got.insert(r, sock);
            }
            Err(why) => refuse(who, from, &why),
        }
    }
    Ok(got)
}

/// Receive side of one link: applies rank `peer`'s frames to its replica until the
/// connection ends, a frame is malformed, nothing arrives for the liveness timeout, or the
/// communicator stops; then marks the peer dead.
fn receive(mut rx: Rx, seg: Segment, peer: usize, stop: &AtomicBool) {
    let why = rx.sock.set_read_timeout(Some(POLL)).and_then(|_| loop {
        if let Err(e) = rx.frame(&seg, stop) {
            break Err::<(), io::Error>(e);
        }
    });
    seg.mark_dead();
    if !stop.load(Ordering::Acquire) {
        match why {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                tracing::info!("mooncake.pg: rank {peer} closed its link: marked dead")
            }
            Err(e) => tracing::warn!("mooncake.pg: link from rank {peer}: {e}: marked dead"),
            Ok(()) => {}
        }
    }
}

pub(crate) struct Rx {
    pub(crate) sock: TcpStream,
    pub(crate) buf: Vec<u8>,
    pub(crate) lo: usize,
    pub(crate) hi: usize,
    pub(crate) last_rx: Instant,
}

impl Rx {
    /// A reader of `sock` with an empty receive buffer, last heard from now.
    pub(crate) fn new(sock: TcpStream) -> Rx {
        Rx {
            sock,
            buf: vec![0u8; PG_NET_RX_BUFFER_BYTES],
            lo: 0,
            hi: 0,
            last_rx: Instant::now(),
        }
    }

    /// Reads at most `cap` bytes into `dst`; errors on EOF, the liveness timeout or stop.
    pub(crate) fn read_some(
        &mut self,
        dst: *mut u8,
        cap: usize,
        stop: &AtomicBool,
    ) -> io::Result<usize> {
        loop {
            if stop.load(Ordering::Acquire) {
                return Err(io::Error::other("stopped"));
            }
            // SAFETY: `dst` is valid for `cap` bytes of writes (callers: the receive buffer,
            // or a replica range checked against the mapping).
            let n = unsafe { libc::recv(self.sock.as_raw_fd(), dst.cast(), cap, 0) };
            if n > 0 {
                self.last_rx = Instant::now();
                return Ok(n as usize);
            }
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => {}
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    if self.last_rx.elapsed() > dead_after() {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("nothing received for {} ms", dead_after().as_millis()),
                        ));
                    }
                }
                _ => return Err(e),
            }
        }
    }

    /// Makes at least `n` bytes (n <= buffer size) available at `buf[lo..]`.
    pub(crate) fn need(&mut self, n: usize, stop: &AtomicBool) -> io::Result<()> {
        if self.hi - self.lo >= n {
            return Ok(());
        }
        if self.lo > 0 {
            self.buf.copy_within(self.lo..self.hi, 0);
            self.hi -= self.lo;
            self.lo = 0;
        }
        while self.hi < n {
            let cap = self.buf.len() - self.hi;
            // SAFETY: `hi < len`, so `buf[hi..]` is `cap` writable bytes.
            let p = unsafe { self.buf.as_mut_ptr().add(self.hi) };
            self.hi += self.read_some(p, cap, stop)?;
        }
        Ok(())
    }

    /// Reads the next `l` payload bytes (first the buffered ones) into `dst`.
    ///
    /// # Safety
    /// `dst` is valid for `l` bytes of writes that nobody else accesses meanwhile.
    pub(crate) unsafe fn read_into(
        &mut self,
        dst: *mut u8,
        l: usize,
        stop: &AtomicBool,
    ) -> io::Result<()> {
        let have = (self.hi - self.lo).min(l);
        // SAFETY: `have` bytes are buffered at `lo`; `dst` holds `l >= have` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.buf.as_ptr().add(self.lo), dst, have) };
        self.lo += have;
        let mut done = have;
        while done < l {
            // SAFETY: `dst + done .. dst + l` is inside the caller's range.
            done += self.read_some(unsafe { dst.add(done) }, l - done, stop)?;
        }
        Ok(())
    }

    /// Applies one frame to `seg` ([`decode_frame`] checks it first).
    fn frame(&mut self, seg: &Segment, stop: &AtomicBool) -> io::Result<Frame> {
        self.need(FRAME_BYTES, stop)?;
        let f = decode_frame(&self.buf[self.lo..self.hi], seg.len_bytes())
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
        self.lo += FRAME_BYTES;
        match f {
            Frame::Heartbeat => {}
            // `store_counter`: a Release store that also wakes a collective thread parked
            // on this counter of the replica (as the owner's store does on a mapped one).
            Frame::Store { offset, value } => seg.store_counter(
                seg.counter_at(offset)
                    .expect("decode_frame checked the counter"),
                value,
            ),
            Frame::Write { offset, len } => {
                // `offset + len <= len_bytes()` (decode_frame): inside the replica.
                let (dst, redirected) = seg.write_target(offset, len);
                // SAFETY: `dst` is valid for `len` bytes of writes: inside the replica, or a
                // destination its op registered for exactly these bytes and keeps alive
                // until `Redirect::clear`, which waits for the `done` below.
                let r = unsafe { self.read_into(dst, len, stop) };
                if redirected {
                    seg.redirect().expect("a replica").done();
                }
                r?;
            }
        }
        Ok(f)
    }
}

/// Sends a HEARTBEAT on every live link idle for the heartbeat period, until `stop`.
fn heartbeat(inner: &Inner) {
    while !inner.stop.load(Ordering::Acquire) {
        let every = heartbeat_every();
        std::thread::sleep(every.min(Duration::from_millis(50)));
        let links = inner
            .links
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for l in links.iter() {
            // A link busy with a push is not idle.
            let Ok(mut l) = l.try_lock() else { continue };
            if !l.alive.load(Ordering::Acquire) || l.last_send.elapsed() < every {
                continue;
            }
            l.out.extend_from_slice(&frame(KIND_HEARTBEAT, 0, 0));
            if l.flush(None).is_err() {
                tracing::warn!(
                    "mooncake.pg: heartbeat to rank {} failed: marked dead",
                    l.peer
                );
                l.kill();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CollOp, Comm, DType, ReduceOp};

    /// A fresh own segment for rank `r` of 2 (its file name already gone).
    fn seg(r: usize) -> Segment {
        let path = format!(
            "/dev/shm/mc-pg-net-test-{}-{r}-{:?}",
            std::process::id(),
            Instant::now()
        );
        let s = Segment::create(&path, 2, r).expect("segment");
        std::fs::remove_file(&path).expect("unlink");
        s
    }

    /// Two communicators in this process that see each other as on other hosts.
    fn pair() -> (Comm, Comm) {
        let (c0, c1, _) = pair_at();
        (c0, c1)
    }

    /// As [`pair`], with the address rank 0 listens on.
    fn pair_at() -> (Comm, Comm, String) {
        pair_with(&LinkAuth::open())
    }

    /// As [`pair_at`], every link passing `auth`.
    fn pair_with(auth: &LinkAuth) -> (Comm, Comm, String) {
        pair_on(listeners(), auth)
    }

    fn listeners() -> (TcpListener, TcpListener) {
        (
            TcpListener::bind("127.0.0.1:0").expect("bind"),
            TcpListener::bind("127.0.0.1:0").expect("bind"),
        )
    }

    /// Two communicators linked through the listeners `(l0, l1)`, every link passing `auth`.
    fn pair_on((l0, l1): (TcpListener, TcpListener), auth: &LinkAuth) -> (Comm, Comm, String) {
        let (e0, e1) = (
            l0.local_addr().expect("addr").to_string(),
            l1.local_addr().expect("addr").to_string(),
        );
        let (of1, rx1) = Segment::replica(2, 1).expect("replica");
        let (of0, rx0) = Segment::replica(2, 0).expect("replica");
        let at0 = e0.clone();
        let a1 = auth.clone();
        let t =
            std::thread::spawn(move || Net::establish(l1, 1, 2, &[(0, e0)], vec![(0, rx0)], &a1));
        let n0 = Net::establish(l0, 0, 2, &[(1, e1)], vec![(1, rx1)], auth).expect("net 0");
        let n1 = t.join().expect("thread").expect("net 1");
        let c0 =
            Comm::start_with_net(seg(0), 0, vec![None, Some(of1)], Some(n0), true).expect("c0");
        let c1 =
            Comm::start_with_net(seg(1), 1, vec![Some(of0), None], Some(n1), true).expect("c1");
        (c0, c1, at0)
    }

    /// Both ranks' all_reduce of `n` elements (1s on rank 0, 2s on the other); checks 3s.
    fn all_reduce_both(a: &Comm, b: &Comm, n: usize) {
        let mut v = vec![1.0f32; n];
        let mut w = vec![2.0f32; n];
        let (o, o1) = std::thread::scope(|sc| {
            let t = sc.spawn(|| all_reduce(b, &mut w));
            let o = all_reduce(a, &mut v);
            (o, t.join().expect("rank 1"))
        });
        assert!(
            o.error.is_none() && o1.error.is_none(),
            "{:?} {:?}",
            o.error,
            o1.error
        );
        assert!(o.failed == 0 && o1.failed == 0);
        assert!(v.iter().chain(&w).all(|x| *x == 3.0), "n={n}: both ranks");
    }

    /// A replacement process on another host: rank 1 dies; a new process for slot 1 links
    /// to rank 0's listener (`Net::join`), gets its snapshot, waits in `join`; rank 0
    /// activates it and maps its replica; collectives and point-to-point run over the new
    /// link.
    #[test]
    fn a_process_on_another_host_takes_over_a_dead_ranks_slot() {
        use crate::membership::{self, join, propose, KIND_ACTIVATE};
        let (c0, c1, at0) = pair_at();
        all_reduce_both(&c0, &c1, 8);
        drop(c1);
        let mut v = vec![1.0f32; 4];
        assert_eq!(
            all_reduce(&c0, &mut v).failed,
            0b10,
            "rank 1's death is seen"
        );
        assert_eq!(c0.shared().active(), 0b01);

        let (of0, rx0) = Segment::replica(2, 0).expect("replica");
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let net =
            Net::join(l, 1, 2, &[(0, at0)], vec![(0, rx0)], &LinkAuth::open()).expect("admitted");
        // No view was committed yet (bootstrap's is implicit), as the Python binding expects.
        let view = membership::newest_view(&[&of0]).unwrap_or(membership::View::initial(0b11));
        // Membership word 0 counts rank 0's ops (two so far): its snapshot arrived.
        assert_eq!(load(of0.member_word(0)), 2, "rank 0's snapshot");
        let j = Comm::start_with(
            seg(1),
            1,
            vec![Some(of0), None],
            Some(net),
            true,
            0b10,
            Some(view),
        )
        .expect("joiner");
        membership::announce(j.shared());
        assert_eq!(j.shared().active(), 0b10, "isolated until activated");
        std::thread::scope(|sc| {
            let w = sc.spawn(|| join(j.shared(), Duration::from_secs(30)));
            let until = Instant::now() + Duration::from_secs(30);
            let a = loop {
                let a = propose(c0.shared(), KIND_ACTIVATE, 0b10, Duration::from_secs(30));
                if a.status != 0 || Instant::now() > until {
                    break a;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            assert_eq!(a.status, 1, "activation applied: {}", a.reason);
            assert_eq!(w.join().expect("joiner"), Ok(()));
        });
        for n in [3usize, 1_300_001] {
            all_reduce_both(&c0, &j, n);
        }
        assert_eq!((c0.shared().active(), j.shared().active()), (0b11, 0b11));
        send_3mb((&j, 1), (&c0, 0));
    }

    /// A 3 MB point-to-point message from `from` (rank `.1`) to `to`: several chunks, the
    /// acks come back over TCP; checks it arrives whole.
    fn send_3mb(from: (&Comm, usize), to: (&Comm, usize)) {
        let src: Vec<u8> = (0..3_000_000).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        // SAFETY: both buffers outlive the waits.
        let (s, r) = unsafe {
            (
                from.0.p2p(true, to.1, src.as_ptr() as usize, src.len()),
                to.0.p2p(false, from.1, dst.as_mut_ptr() as usize, dst.len()),
            )
        };
        assert!(s.wait(None).expect("send").error.is_none());
        assert!(r.wait(None).expect("recv").error.is_none());
        assert!(src == dst, "rank {} -> rank {}", from.1, to.1);
    }

    fn all_reduce(c: &Comm, v: &mut [f32]) -> crate::Outcome {
        let op = CollOp::AllReduce {
            buf: v.as_mut_ptr() as usize,
            bytes: v.len() * 4,
            dtype: DType::Float32,
            op: ReduceOp::Sum,
        };
        // SAFETY: `v` outlives the wait below.
        unsafe { c.submit(op) }.wait(None).expect("no timeout")
    }

    #[test]
    fn collectives_and_p2p_over_tcp_then_death() {
        let (c0, c1) = pair();
        assert!(
            !c0.shared().cma_probe(),
            "no direct reads with a remote peer"
        );
        for n in [1usize, 1000, 1_300_001] {
            let (o, v, o1, v1) = std::thread::scope(|sc| {
                let t = sc.spawn(|| {
                    let mut v: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
                    (all_reduce(&c1, &mut v), v)
                });
                let mut v: Vec<f32> = (0..n).map(|i| (i % 5) as f32 * 2.0).collect();
                let o = all_reduce(&c0, &mut v);
                let (o1, v1) = t.join().expect("rank 1");
                (o, v, o1, v1)
            });
            assert!(o.error.is_none() && o1.error.is_none() && o.failed == 0);
            for (i, (a, b)) in v.iter().zip(&v1).enumerate() {
                let want = (i % 7) as f32 + (i % 5) as f32 * 2.0;
                assert!(*a == want && *b == want, "n={n} i={i}: {a} {b} want {want}");
            }
        }
        send_3mb((&c0, 0), (&c1, 1));
        // rank 1 goes away: rank 0's next collective completes and names it
        drop(c1);
        let mut v = vec![1.0f32; 10];
        let o = all_reduce(&c0, &mut v);
        assert_eq!(o.failed, 0b10);
        assert_eq!(v, vec![1.0f32; 10]);
        assert_eq!(c0.shared().active(), 0b01);
    }

    /// Membership across hosts: the decider (rank 0) deactivates rank 1, which learns it
    /// through its replica without a call; rank 1 rejoins in place and is activated; the
    /// phases restart at the new view's base and the collectives run over both again.
    #[test]
    fn membership_over_tcp() {
        use crate::membership::{join, propose, KIND_ACTIVATE, KIND_DEACTIVATE};
        let (c0, c1) = pair();
        let mut v = vec![1.0f32; 8];
        let mut w = vec![2.0f32; 8];
        std::thread::scope(|sc| {
            let t = sc.spawn(|| all_reduce(&c1, &mut w));
            all_reduce(&c0, &mut v);
            t.join().expect("rank 1");
        });
        assert_eq!(v, vec![3.0f32; 8]);
        let a = propose(c0.shared(), KIND_DEACTIVATE, 0b10, Duration::from_secs(20));
        assert_eq!(
            (a.status, a.vid),
            (1, 1),
            "deactivation applied: {}",
            a.reason
        );
        let until = Instant::now() + Duration::from_secs(10);
        while c1.shared().active() != 0b01 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            c1.shared().active(),
            0b01,
            "rank 1 adopted the view it was pushed"
        );
        let o = all_reduce(&c0, &mut v);
        assert!(o.error.is_none() && o.failed == 0);
        assert_eq!(v, vec![3.0f32; 8], "rank 0 alone");
        std::thread::scope(|sc| {
            let j = sc.spawn(|| join(c1.shared(), Duration::from_secs(20)));
            let a = loop {
                let a = propose(c0.shared(), KIND_ACTIVATE, 0b10, Duration::from_secs(30));
                if a.status != 0 || Instant::now() > until + Duration::from_secs(20) {
                    break a;
                }
            };
            assert_eq!(
                (a.status, a.vid),
                (1, 2),
                "activation applied: {}",
                a.reason
            );
            assert_eq!(j.join().expect("joiner"), Ok(()));
        });
        for n in [3usize, 1_300_001] {
            all_reduce_both(&c0, &c1, n);
        }
    }

    /// A join hello that does not fit the group (wrong magic, size, slot, addressee, no
    /// pid, cut short) is refused: the connection is closed, no joiner is recorded, and the
    /// group carries on.
    #[test]
    fn bad_join_hellos_are_refused() {
        let (c0, c1, at0) = pair_at();
        let bad = [
            hello(HELLO_MAGIC, 2, 1, 0, 7), // a founder's hello after the group started
            hello(JOIN_MAGIC, 3, 1, 0, 7),  // another group size
            hello(JOIN_MAGIC, 2, 0, 0, 7),  // the member's own slot
            hello(JOIN_MAGIC, 2, 5, 0, 7),  // no such slot
            hello(JOIN_MAGIC, 2, 1, 1, 7),  // addressed to another rank
            hello(JOIN_MAGIC, 2, 1, 0, 0),  // no pid
        ];
        let short = &hello(JOIN_MAGIC, 2, 1, 0, 7)[..10];
        for h in bad.iter().map(|h| &h[..]).chain([short]) {
            let mut s = TcpStream::connect(&at0).expect("connect");
            s.write_all(h).expect("send");
            s.shutdown(std::net::Shutdown::Write).expect("shutdown");
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            let mut b = [0u8; 64];
            // Closed by the member (not a read timeout: nobody looking is no refusal).
            let r = s.read(&mut b);
            assert!(
                matches!(&r, Ok(0))
                    || matches!(&r, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
                "hello {h:?}: closed without a snapshot, got {r:?}"
            );
        }
        assert!(
            c0.shared().remote_joiner(1, 7).is_none(),
            "no joiner recorded"
        );
        all_reduce_both(&c0, &c1, 8);
    }

    fn secret() -> Token {
        Token::new(b"pg-test-cluster-secret").expect("token")
    }

    /// The links of group `group` under [`secret`].
    fn group(kind: &[u8], group: &[u8]) -> LinkAuth {
        LinkAuth::new(Some(&secret()), kind, group)
    }

    /// Whether the peer closes `s` without sending a byte (within 10 s; a read timeout is
    /// not a close: a listener that keeps a stranger's connection open has taken it).
    fn closed_without_a_byte(s: &TcpStream) -> Result<(), String> {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut b = [0u8; 64];
        match (&*s).read(&mut b) {
            Ok(0) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(()),
            r => Err(format!("not closed without a byte: {r:?} {:?}", &b[..8])),
        }
    }

    /// With a secret, a process that cannot prove it and the group's id is not admitted:
    /// a bare join hello (what every joiner sent before), and join hellos after a
    /// handshake under a wrong secret, under the right secret with another group's id, and
    /// with the right group's id for EP links instead of pg. Each is closed without a byte
    /// of the member's segment, is recorded nowhere, and is counted; a real joiner of
    /// another group gets an error from `Net::join`; then the real replacement process
    /// (secret and group) is admitted and gets its snapshot.
    #[test]
    fn a_joiner_must_prove_the_secret_and_the_group() {
        let auth = group(b"pg", b"group-a");
        let (c0, c1, at0) = pair_with(&auth);
        all_reduce_both(&c0, &c1, 8);
        let refused = refused_links();
        let wrong = Token::new(b"not-the-secret").expect("token");
        let strangers = [
            None,
            Some(LinkAuth::new(Some(&wrong), b"pg", b"group-a")),
            Some(group(b"pg", b"group-b")),
            Some(group(b"ep", b"group-a")),
        ];
        for (i, stranger) in strangers.iter().enumerate() {
            let pid = 7 + i as u32;
            let s = TcpStream::connect(&at0).expect("connect");
            if let Some(a) = stranger {
                let until = Instant::now() + Duration::from_secs(10);
                let r = a.connect(&s, until);
                assert!(r.is_err(), "stranger {i} passed the handshake");
            }
            let _ = (&s).write_all(&hello(JOIN_MAGIC, 2, 1, 0, pid));
            let _ = s.shutdown(std::net::Shutdown::Write);
            closed_without_a_byte(&s).unwrap_or_else(|e| panic!("stranger {i}: {e}"));
            assert!(c0.shared().remote_joiner(1, pid).is_none(), "stranger {i}");
        }
        // Counted once the admission thread is back from each (it closes first).
        let until = Instant::now() + Duration::from_secs(10);
        while refused_links() < refused + strangers.len() as u64 {
            assert!(Instant::now() < until, "every stranger is counted");
            std::thread::sleep(Duration::from_millis(5));
        }

        let (_, rx0) = Segment::replica(2, 0).expect("replica");
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let other = group(b"pg", b"group-b");
        let e = Net::join(l, 1, 2, &[(0, at0.clone())], vec![(0, rx0)], &other)
            .err()
            .expect("a member of another group is refused");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");

        drop(c1);
        let (of0, rx0) = Segment::replica(2, 0).expect("replica");
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let _net = Net::join(l, 1, 2, &[(0, at0)], vec![(0, rx0)], &auth).expect("admitted");
        assert_eq!(load(of0.member_word(0)), 1, "rank 0's snapshot");
        // Recorded right after the snapshot is sent.
        let until = Instant::now() + Duration::from_secs(10);
        while c0.shared().remote_joiner(1, std::process::id()).is_none() {
            assert!(Instant::now() < until, "the real joiner is recorded");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// With a secret, a connection that claims a founder's rank before the real one cannot
    /// take its place: an impostor without the secret (its hello and a frame, as a rank
    /// pushing data sends them) and one with the secret but another group's id are both
    /// closed without a byte; the real rank 1 then links, and collectives run over both.
    #[test]
    fn an_impostor_cannot_take_a_founders_place() {
        let auth = group(b"pg", b"group-a");
        let (l0, l1) = listeners();
        let at0 = l0.local_addr().expect("addr");
        // Both connect before the group forms, so rank 0 meets them before rank 1.
        let bare = TcpStream::connect(at0).expect("connect");
        (&bare)
            .write_all(&hello(HELLO_MAGIC, 2, 1, 0, 0))
            .expect("hello");
        (&bare)
            .write_all(&frame(KIND_HEARTBEAT, 0, 0))
            .expect("frame");
        let other = TcpStream::connect(at0).expect("connect");
        let t = std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(30);
            let proof = group(b"pg", b"group-b").connect(&other, until);
            let _ = (&other).write_all(&hello(HELLO_MAGIC, 2, 1, 0, 0));
            (proof, closed_without_a_byte(&other))
        });
        let (c0, c1, _) = pair_on((l0, l1), &auth);
        closed_without_a_byte(&bare).expect("the impostor without the secret");
        let (proof, closed) = t.join().expect("impostor");
        assert!(
            proof.is_err(),
            "another group's member passed the handshake"
        );
        closed.expect("the impostor of another group");
        all_reduce_both(&c0, &c1, 1000);
    }

    /// No more than `PG_NET_JOINERS_MAX` processes on other hosts are admitted at once: the
    /// next join hello is closed without a snapshot (without a secret, as here, the hello
    /// alone is what a joiner sends); once one leaves, a newcomer is admitted again.
    #[test]
    fn joiners_admitted_at_once_are_capped() {
        let (c0, _c1, at0) = pair_at();
        let join = |pid: u32| {
            let s = TcpStream::connect(&at0).expect("connect");
            (&s).write_all(&hello(JOIN_MAGIC, 2, 1, 0, pid))
                .expect("hello");
            s
        };
        let snapshot = |s: &TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            matches!((&*s).read(&mut [0u8; 1]), Ok(1))
        };
        let mut admitted = Vec::new();
        for pid in 1..=PG_NET_JOINERS_MAX as u32 {
            let s = join(pid);
            assert!(snapshot(&s), "joiner {pid} is admitted");
            admitted.push(s);
        }
        let s = join(999);
        closed_without_a_byte(&s).expect("the joiner over the cap");
        assert!(c0.shared().remote_joiner(1, 999).is_none());
        // One leaves: once its member sees its link end, its place is free again.
        drop(admitted.pop());
        let until = Instant::now() + Duration::from_secs(20);
        while !snapshot(&join(1000)) {
            assert!(Instant::now() < until, "a freed place is given again");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The hello codec: canonical, and the checks of both kinds.
    #[test]
    fn hellos_decode_and_check() {
        let h = hello(JOIN_MAGIC, 4, 2, 1, 9);
        let d = Hello::decode(&h).expect("24 bytes");
        assert_eq!(d.encode(), h);
        assert_eq!(d.joiner(1, 4), Ok((2, 9)));
        assert!(d.joiner(1, 3).is_err() && d.joiner(2, 4).is_err());
        assert!(
            d.founder(HELLO_MAGIC, 1, 4).is_err(),
            "a join hello is no founder's"
        );
        let f = Hello::decode(&hello(HELLO_MAGIC, 4, 3, 0, 0)).expect("24 bytes");
        assert_eq!(f.founder(HELLO_MAGIC, 0, 4), Ok(3));
        assert!(f.joiner(0, 4).is_err(), "a founder's hello is no joiner's");
        assert!(Hello::decode(&h[..23]).is_none());
    }

    /// The frame codec: canonical, and the checks against the replica's size.
    #[test]
    fn frames_decode_and_check() {
        let len = crate::seg::segment_bytes(2);
        let ok = [
            Frame::Heartbeat,
            Frame::Store {
                offset: 64,
                value: 7,
            },
            Frame::Write { offset: 0, len },
            Frame::Write {
                offset: len,
                len: 0,
            },
        ];
        for f in ok {
            assert_eq!(decode_frame(&f.encode(), len), Ok(f));
        }
        let mut reserved = frame(KIND_HEARTBEAT, 0, 0);
        reserved[4] = 1;
        let bad = [
            reserved,
            frame(KIND_HEARTBEAT, 1, 0),
            frame(KIND_WRITE, len as u64, 1),
            frame(KIND_WRITE, 1, u64::MAX),
            frame(KIND_STORE, u64::MAX - 7, 1),
            frame(KIND_STORE, crate::limits::PG_HEADER_BYTES as u64, 1),
        ];
        for h in bad {
            assert!(decode_frame(&h, len).is_err(), "{h:?}");
        }
        assert!(decode_frame(&frame(KIND_HEARTBEAT, 0, 0)[..23], len).is_err());
    }

    /// A malformed frame ends the link and marks the peer dead; it never writes outside the
    /// replica nor panics. Well-formed frames before it are applied.
    #[test]
    fn bad_frames_end_the_link() {
        let len = crate::seg::segment_bytes(2) as u64;
        let bad: [(u32, u64, u64); 6] = [
            (KIND_WRITE, len - 4, 8),      // runs past the end
            (KIND_WRITE, u64::MAX, 1),     // offset overflow
            (KIND_STORE, 68, 1),           // unaligned counter
            (KIND_STORE, len, 1),          // outside the header
            (KIND_STORE, u64::MAX - 7, 1), // aligned, and `+ 8` wraps to 0
            (9, 0, 0),                     // unknown kind
        ];
        for (kind, off, n) in bad {
            let (mine, rx) = Segment::replica(2, 1).expect("replica");
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let mut w = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
            let (sock, _) = l.accept().expect("accept");
            let stop = Arc::new(AtomicBool::new(false));
            let st = stop.clone();
            let t = std::thread::spawn(move || receive(Rx::new(sock), rx, 1, &st));
            // a good STORE of `posted` (offset 64) first, then the bad frame
            w.write_all(&frame(KIND_STORE, 64, 7)).expect("send");
            w.write_all(&frame(kind, off, n)).expect("send");
            let _ = w.write_all(&[0u8; 8]);
            t.join().expect("receiver returns");
            assert!(
                !mine.owner_alive(),
                "kind {kind} off {off} n {n}: peer marked dead"
            );
            assert_eq!(
                load(mine.posted()),
                7,
                "the good frame before it was applied"
            );
        }
    }
}
