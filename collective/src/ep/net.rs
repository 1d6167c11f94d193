//! EP peers on other hosts: [`RemotePeer`] implements [`EpPeer`] over one TCP connection per
//! ordered pair of ranks, so dispatch and combine (and their polling of the own buffer) run
//! unchanged whether a peer's buffer is mapped here or lives on another machine.
//!
//! The writer connects to the reader's listener and only sends; the reader's receive thread
//! applies the frames, in order, to its *own* EP buffer, exactly where a same-host writer
//! would have stored them. Frames reuse `mooncake.pg`'s 24-byte header
//! ([`crate::net`]), little-endian:
//!
//! ```text
//! hello (once, writer -> reader):  magic "MCEPNET1" u64 | ranks u32 | from u32 | to u32 | 0 u32
//! frame:  0          4       8               16
//!         | kind u32 | 0 u32 | a u64         | n u64 |  then the payload
//!         kind 1 WRITE:     n payload bytes to offset a of the reader's data area
//!         kind 3 HEARTBEAT: nothing (liveness only)
//!         kind 4 DESC:      a = phase | set << 8, n = 16, payload EpDesc
//!                           (tokens_max, hidden, experts, flags: u32 each)
//!         kind 5 POST:      posted[phase a][writer] = n   (Release, after everything before it)
//!         kind 6 ACK:       acked[phase a][writer] = n
//! phase: 0 dispatch, 1 combine; kind 3 carries a = n = 0; the reserved word is 0
//! ```
//!
//! With a cluster secret, every connection first runs `mooncake.pg`'s handshake under a key
//! derived from the secret and the group (kind `"ep"`; the group is named by every rank's
//! host, endpoint, size and path, which all ranks pass alike), before its hello: see "Who may
//! link" in [`crate::net`]. A peer that fails is closed before its hello is read
//! and takes no rank's place.
//!
//! The writer of a frame is the rank at the other end of the connection (fixed by the
//! hello), so a frame can only touch the fields that rank owns. Every frame is checked
//! ([`decode_frame`], a pure function, fuzzed) before its payload is read: a
//! WRITE must lie inside the data area, a DESC must name a phase, a set 0/1 and carry 16
//! bytes, a POST/ACK must name a phase; anything else ends the link and marks the peer dead,
//! never a write outside the buffer nor a panic. Since one connection carries a writer's
//! frames in order and the receive thread stores `posted` with Release after copying the
//! bytes before it, the reader's Acquire load sees the data, as with shared memory.
//!
//! Small frames are gathered and sent at the next POST or ACK (the points where the reader
//! may look); a WRITE larger than the inline limit is sent straight from the caller's memory.
//!
//! Liveness (the rules of `mooncake.pg`'s TCP path, and its timeout): a remote peer is dead
//! when its connection to us ends (EOF, reset, a malformed frame: the kernel closes a killed
//! process's sockets), when nothing (data or heartbeat) arrived from it for the liveness
//! timeout, or when a send to it fails or stalls that long. A heartbeat thread sends a
//! HEARTBEAT on every link idle for the heartbeat period.

use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::seg::{EpDesc, EpSegment, Phase};
use super::EpPeer;
use crate::limits::{PG_NET_CONNECT_TIMEOUT_MS, PG_NET_INLINE_BYTES};
use crate::net::{
    accept_all, connect_until, connect_while_accepting, frame, heartbeat_every, send_all, Hello,
    LinkAuth, Rx, FRAME_BYTES, KIND_HEARTBEAT, POLL,
};

/// Hello of an EP link.
pub const HELLO_MAGIC: u64 = u64::from_le_bytes(*b"MCEPNET1");
const KIND_WRITE: u32 = 1;
const KIND_DESC: u32 = 4;
const KIND_POST: u32 = 5;
const KIND_ACK: u32 = 6;
const _: () = assert!(std::mem::size_of::<EpDesc>() == DESC_BYTES);

fn phase_code(p: Phase) -> u64 {
    match p {
        Phase::Dispatch => 0,
        Phase::Combine => 1,
    }
}

fn phase_of(code: u64) -> Option<Phase> {
    match code {
        0 => Some(Phase::Dispatch),
        1 => Some(Phase::Combine),
        _ => None,
    }
}

struct Tx {
    sock: TcpStream,
    out: Vec<u8>,
    last_send: Instant,
}

/// The sending half of the connection to one remote rank, and whether that rank is alive.
struct Link {
    peer: usize,
    data_bytes: usize,
    tx: Mutex<Tx>,
    alive: Arc<AtomicBool>,
}

impl Link {
    fn tx(&self) -> std::sync::MutexGuard<'_, Tx> {
        self.tx.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn kill(&self, tx: &Tx, why: &io::Error) {
        if self.alive.swap(false, Ordering::AcqRel) {
            tracing::warn!(
                "Mooncake EP: send to rank {} failed ({why}): marked dead",
                self.peer
            );
        }
        let _ = tx.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Sends the queued frames, then `big` if given; a failure marks the peer dead.
    fn flush(&self, tx: &mut Tx, big: Option<&[u8]>) {
        let mut parts = vec![(tx.out.as_ptr(), tx.out.len())];
        parts.extend(big.map(|b| (b.as_ptr(), b.len())));
        let r = send_all(&tx.sock, &parts, &self.alive);
        tx.out.clear();
        tx.last_send = Instant::now();
        if let Err(e) = r {
            self.kill(tx, &e);
        }
    }

    /// Queues one frame (and its small payload); flushes when `flush` is set.
    fn send(&self, kind: u32, a: u64, n: u64, payload: &[u8], flush: bool) {
        if !self.alive.load(Ordering::Acquire) {
            return;
        }
        let mut tx = self.tx();
        tx.out.extend_from_slice(&frame(kind, a, n));
        if payload.len() > PG_NET_INLINE_BYTES {
            self.flush(&mut tx, Some(payload));
            return;
        }
        tx.out.extend_from_slice(payload);
        if flush {
            self.flush(&mut tx, None);
        }
    }
}

/// A peer on another host, reached over its TCP link.
pub struct RemotePeer(Arc<Link>);

impl EpPeer for RemotePeer {
    fn data_bytes(&self) -> usize {
        self.0.data_bytes
    }

    fn write(&self, off: usize, src: &[u8]) {
        assert!(
            off.checked_add(src.len())
                .is_some_and(|end| end <= self.0.data_bytes),
            "EP write of {} bytes at {off} outside a data area of {}",
            src.len(),
            self.0.data_bytes
        );
        if !src.is_empty() {
            self.0
                .send(KIND_WRITE, off as u64, src.len() as u64, src, false);
        }
    }

    fn set_desc(&self, phase: Phase, set: usize, _from: usize, d: EpDesc) {
        let a = phase_code(phase) | ((set as u64 & 1) << 8);
        self.0
            .send(KIND_DESC, a, DESC_BYTES as u64, &desc_encode(&d), false);
    }

    fn post(&self, phase: Phase, _from: usize, seq: u64) {
        self.0.send(KIND_POST, phase_code(phase), seq, &[], true);
    }

    fn ack(&self, phase: Phase, _from: usize, seq: u64) {
        self.0.send(KIND_ACK, phase_code(phase), seq, &[], true);
    }

    fn alive(&self) -> bool {
        self.0.alive.load(Ordering::Acquire)
    }
}

/// A rank's TCP links to its remote peers: the receive threads and the heartbeat thread stop
/// and the sockets close when it is dropped (the peers then see this rank as dead).
pub struct EpNet {
    stop: Arc<AtomicBool>,
    inbound: Vec<TcpStream>,
    links: Arc<Vec<Arc<Link>>>,
}

/// One remote rank: its rank, its listener's address, and the size of its data area.
pub struct Remote {
    pub rank: usize,
    pub endpoint: String,
    pub data_bytes: usize,
}

impl EpNet {
    /// Connects to every remote rank's listener and accepts one connection from each (60 s
    /// limit), starting a receive thread per remote that applies its frames to `own`.
    /// Every link, both ways, passes `auth` first (`mooncake.pg`'s rule,
    /// [`crate::net`]). Returns the links and a [`RemotePeer`] per remote rank.
    pub fn establish(
        listener: TcpListener,
        own: Arc<EpSegment>,
        me: usize,
        ranks: usize,
        remotes: &[Remote],
        auth: &LinkAuth,
    ) -> io::Result<(EpNet, Vec<(usize, RemotePeer)>)> {
        auth.warn_if_open(&listener, "Mooncake EP");
        let deadline = Instant::now() + Duration::from_millis(PG_NET_CONNECT_TIMEOUT_MS);
        let connect = || {
            let mut links = Vec::new();
            for r in remotes {
                let sock = connect_until(&r.endpoint, deadline).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "connecting to rank {} at {}: {e} (is pg.set_host_ip right?)",
                            r.rank, r.endpoint
                        ),
                    )
                })?;
                sock.set_nodelay(true)?;
                auth.connect(&sock, deadline).map_err(|e| {
                    io::Error::new(e.kind(), format!("rank {} at {}: {e}", r.rank, r.endpoint))
                })?;
                let hello = Hello {
                    magic: HELLO_MAGIC,
                    ranks: ranks as u32,
                    from: me as u32,
                    to: r.rank as u32,
                    extra: 0,
                };
                (&sock).write_all(&hello.encode())?;
                sock.set_write_timeout(Some(POLL))?;
                links.push(Arc::new(Link {
                    peer: r.rank,
                    data_bytes: r.data_bytes,
                    tx: Mutex::new(Tx {
                        sock,
                        out: Vec::with_capacity(PG_NET_INLINE_BYTES + 4 * FRAME_BYTES),
                        last_send: Instant::now(),
                    }),
                    alive: Arc::new(AtomicBool::new(true)),
                }));
            }
            Ok(links)
        };
        let named: Vec<(usize, String)> = remotes
            .iter()
            .map(|r| (r.rank, r.endpoint.clone()))
            .collect();
        let accept = |abort: &AtomicBool| {
            accept_all(
                HELLO_MAGIC,
                &listener,
                me,
                ranks,
                &named,
                deadline,
                auth,
                abort,
            )
        };
        let (links, mut incoming) = connect_while_accepting(connect, accept)?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut inbound = Vec::new();
        for l in &links {
            let sock = incoming
                .remove(&l.peer)
                .ok_or_else(|| io::Error::other(format!("rank {} did not connect", l.peer)))?;
            inbound.push(sock.try_clone()?);
            let (own, alive, stop, peer) = (own.clone(), l.alive.clone(), stop.clone(), l.peer);
            std::thread::Builder::new()
                .name(format!("mc-ep-rx-{me}-{peer}"))
                .spawn(move || receive(sock, &own, peer, &alive, &stop))?;
        }
        let peers = links
            .iter()
            .map(|l| (l.peer, RemotePeer(l.clone())))
            .collect();
        let links = Arc::new(links);
        let (l, s) = (links.clone(), stop.clone());
        std::thread::Builder::new()
            .name(format!("mc-ep-hb-{me}"))
            .spawn(move || heartbeat(&l, &s))?;
        Ok((
            EpNet {
                stop,
                inbound,
                links,
            },
            peers,
        ))
    }
}

impl Drop for EpNet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for s in &self.inbound {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        for l in self.links.iter() {
            let _ = l.tx().sock.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Receive side of the link from rank `peer`: applies its frames to `own` until the
/// connection ends, a frame is malformed, nothing arrives for the liveness timeout, or the
/// net stops; then marks the peer dead.
fn receive(sock: TcpStream, own: &EpSegment, peer: usize, alive: &AtomicBool, stop: &AtomicBool) {
    let mut rx = Rx::new(sock);
    let why = rx.sock.set_read_timeout(Some(POLL)).and_then(|_| loop {
        if let Err(e) = apply(&mut rx, own, peer, stop) {
            break Err::<(), io::Error>(e);
        }
    });
    alive.store(false, Ordering::Release);
    if !stop.load(Ordering::Acquire) {
        match why {
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                tracing::info!("Mooncake EP: rank {peer} closed its link: marked dead")
            }
            Err(e) => tracing::warn!("Mooncake EP: link from rank {peer}: {e}: marked dead"),
            Ok(()) => {}
        }
    }
}

/// An EP frame, decoded and checked against the receiver's data area ([`decode_frame`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frame {
    /// Liveness only.
    Heartbeat,
    /// The next `len` payload bytes go to `offset..offset + len` of the data area, a range
    /// that lies inside it.
    Write { offset: usize, len: usize },
    /// The next [`DESC_BYTES`] payload bytes are the writer's descriptor of `phase`, set
    /// `set` (0 or 1) ([`desc_decode`]).
    Desc { phase: Phase, set: usize },
    /// `posted[phase][writer] = value`.
    Post { phase: Phase, value: u64 },
    /// `acked[phase][writer] = value`.
    Ack { phase: Phase, value: u64 },
}

impl Frame {
    /// The header bytes this frame was decoded from.
    pub fn encode(&self) -> [u8; FRAME_BYTES] {
        match *self {
            Frame::Heartbeat => frame(KIND_HEARTBEAT, 0, 0),
            Frame::Write { offset, len } => frame(KIND_WRITE, offset as u64, len as u64),
            Frame::Desc { phase, set } => frame(
                KIND_DESC,
                phase_code(phase) | ((set as u64 & 1) << 8),
                DESC_BYTES as u64,
            ),
            Frame::Post { phase, value } => frame(KIND_POST, phase_code(phase), value),
            Frame::Ack { phase, value } => frame(KIND_ACK, phase_code(phase), value),
        }
    }
}

/// Bytes of a DESC frame's payload.
pub const DESC_BYTES: usize = 16;

/// A DESC payload: `tokens_max`, `hidden`, `experts`, `flags`, u32 little-endian each.
pub fn desc_encode(d: &EpDesc) -> [u8; DESC_BYTES] {
    let mut p = [0u8; DESC_BYTES];
    for (i, v) in [d.tokens_max, d.hidden, d.experts, d.flags]
        .iter()
        .enumerate()
    {
        p[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    p
}

/// The descriptor in a DESC payload (every 16 bytes are one: the reader compares it with
/// its own shape before it reads data).
pub fn desc_decode(b: &[u8; DESC_BYTES]) -> EpDesc {
    let u = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    EpDesc {
        tokens_max: u(0),
        hidden: u(1),
        experts: u(2),
        flags: u(3),
    }
}

/// Decodes the frame header at the start of `b` and checks it against a data area of
/// `data_bytes`: a WRITE must lie inside it, a DESC must name a phase, a set 0/1 and carry
/// 16 bytes, a POST/ACK must name a phase, a HEARTBEAT carries zeros. `Err` (why) ends the
/// link. The receive thread calls this before it touches its buffer; a pure function, so
/// the `ep_frame` fuzz target drives it.
pub fn decode_frame(b: &[u8], data_bytes: usize) -> Result<Frame, String> {
    let (kind, a, n) = crate::net::frame_fields(b)?;
    let phase = || phase_of(a).ok_or_else(|| format!("kind {kind}: phase {a} is not 0 or 1"));
    match kind {
        KIND_HEARTBEAT if a == 0 && n == 0 => Ok(Frame::Heartbeat),
        KIND_HEARTBEAT => Err(format!("HEARTBEAT with fields {a}, {n}, want 0, 0")),
        KIND_WRITE => match (usize::try_from(a), usize::try_from(n)) {
            (Ok(offset), Ok(len)) if offset.checked_add(len).is_some_and(|e| e <= data_bytes) => {
                Ok(Frame::Write { offset, len })
            }
            _ => Err(format!(
                "WRITE of {n} bytes at {a}: the data area has {data_bytes}"
            )),
        },
        KIND_DESC => match (phase_of(a & 0xff), a >> 8) {
            (Some(phase), set @ 0..=1) if n == DESC_BYTES as u64 => Ok(Frame::Desc {
                phase,
                set: set as usize,
            }),
            _ => Err(format!(
                "DESC with selector {a:#x} and {n} bytes: want phase 0/1, set 0/1, 16 bytes"
            )),
        },
        KIND_POST => Ok(Frame::Post {
            phase: phase()?,
            value: n,
        }),
        KIND_ACK => Ok(Frame::Ack {
            phase: phase()?,
            value: n,
        }),
        k => Err(format!("unknown frame kind {k}")),
    }
}

/// Applies one frame from rank `peer` to `own` ([`decode_frame`] checks it first).
fn apply(rx: &mut Rx, own: &EpSegment, peer: usize, stop: &AtomicBool) -> io::Result<()> {
    rx.need(FRAME_BYTES, stop)?;
    let f = decode_frame(&rx.buf[rx.lo..rx.hi], own.data_bytes())
        .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
    rx.lo += FRAME_BYTES;
    match f {
        Frame::Heartbeat => Ok(()),
        Frame::Write { offset, len } => {
            // SAFETY: `offset + len <= data_bytes` (decode_frame): inside this rank's data
            // area, which the protocol gives to this writer until it posts (module docs).
            unsafe { rx.read_into(own.data().add(offset), len, stop) }
        }
        Frame::Desc { phase, set } => {
            rx.need(DESC_BYTES, stop)?;
            let b = rx.buf[rx.lo..]
                .first_chunk::<DESC_BYTES>()
                .expect("need() buffered the payload");
            let d = desc_decode(b);
            rx.lo += DESC_BYTES;
            own.set_desc(phase, set, peer, d);
            Ok(())
        }
        Frame::Post { phase, value } => {
            own.set_posted(phase, peer, value);
            Ok(())
        }
        Frame::Ack { phase, value } => {
            own.set_acked(phase, peer, value);
            Ok(())
        }
    }
}

/// Sends a HEARTBEAT on every live link idle for the heartbeat period, until `stop`.
fn heartbeat(links: &[Arc<Link>], stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let every = heartbeat_every();
        std::thread::sleep(every.min(Duration::from_millis(50)));
        for l in links {
            // A link busy with a send is not idle.
            let Ok(mut tx) = l.tx.try_lock() else {
                continue;
            };
            if !l.alive.load(Ordering::Acquire) || tx.last_send.elapsed() < every {
                continue;
            }
            tx.out.extend_from_slice(&frame(KIND_HEARTBEAT, 0, 0));
            l.flush(&mut tx, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_segment(tag: &str, data_bytes: usize) -> Arc<EpSegment> {
        let path = format!("/dev/shm/mc-ep-net-test-{}-{tag}", std::process::id());
        let s = EpSegment::create(&path, 2, 0, data_bytes).expect("segment");
        std::fs::remove_file(&path).expect("unlink");
        Arc::new(s)
    }

    /// A malformed frame ends the link and marks the peer dead; it never writes outside the
    /// buffer nor panics. Well-formed frames before it are applied.
    #[test]
    fn bad_frames_end_the_link() {
        let len = 4096u64;
        let bad: [(u32, u64, u64); 7] = [
            (KIND_WRITE, len - 4, 8),  // runs past the end
            (KIND_WRITE, u64::MAX, 1), // offset overflow
            (KIND_DESC, 0x200, 16),    // set 2
            (KIND_DESC, 0x3, 16),      // phase 3
            (KIND_DESC, 0x100, 15),    // wrong size
            (KIND_POST, 2, 1),         // phase 2
            (9, 0, 0),                 // unknown kind
        ];
        for (i, (kind, a, n)) in bad.into_iter().enumerate() {
            let own = own_segment(&format!("bad{i}"), len as usize);
            let l = TcpListener::bind("127.0.0.1:0").expect("bind");
            let mut w = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
            let (sock, _) = l.accept().expect("accept");
            let (alive, stop) = (
                Arc::new(AtomicBool::new(true)),
                Arc::new(AtomicBool::new(false)),
            );
            let (o, al, st) = (own.clone(), alive.clone(), stop.clone());
            let t = std::thread::spawn(move || receive(sock, &o, 1, &al, &st));
            // good frames first: 4 bytes at the end of the data area, then posted = 7
            w.write_all(&frame(KIND_WRITE, len - 4, 4)).expect("send");
            w.write_all(&[1, 2, 3, 4]).expect("send");
            w.write_all(&frame(KIND_POST, 1, 7)).expect("send");
            w.write_all(&frame(kind, a, n)).expect("send");
            let _ = w.write_all(&[0u8; 32]);
            t.join().expect("receiver returns");
            assert!(
                !alive.load(Ordering::Acquire),
                "kind {kind} a {a} n {n}: peer marked dead"
            );
            assert_eq!(
                own.posted(Phase::Combine, 1),
                7,
                "the good POST was applied"
            );
            // SAFETY: the last 4 bytes of a data area of `len` bytes.
            let tail = unsafe { std::slice::from_raw_parts(own.data().add(len as usize - 4), 4) };
            assert_eq!(tail, [1, 2, 3, 4], "the good WRITE was applied");
        }
    }

    /// With a secret, no EP link takes a peer that cannot prove it and the group: three
    /// impostors claim rank 1 on rank 0's listener before the real rank 1 does (one without
    /// the secret, sending its hello and a POST as a writer would; one with the secret and
    /// the group's id for `mooncake.pg` links instead of EP; one with another EP group's
    /// id). Each is closed without a byte; then the real pair links and a POST lands.
    #[test]
    fn a_link_must_prove_the_secret_and_the_group() {
        let secret = protocol::auth::Token::new(b"ep-test-cluster-secret").expect("token");
        let auth = |kind: &[u8], group: &[u8]| LinkAuth::new(Some(&secret), kind, group);
        let (s0, s1) = (own_segment("auth0", 4096), own_segment("auth1", 4096));
        let (l0, l1) = (
            TcpListener::bind("127.0.0.1:0").expect("bind"),
            TcpListener::bind("127.0.0.1:0").expect("bind"),
        );
        let at0 = l0.local_addr().expect("addr");
        let hello = Hello {
            magic: HELLO_MAGIC,
            ranks: 2,
            from: 1,
            to: 0,
            extra: 0,
        }
        .encode();
        let bare = TcpStream::connect(at0).expect("connect");
        (&bare).write_all(&hello).expect("hello");
        (&bare).write_all(&frame(KIND_POST, 0, 99)).expect("frame");
        let impostors: Vec<_> = [auth(b"pg", b"group-a"), auth(b"ep", b"group-b")]
            .into_iter()
            .map(|a| {
                let s = TcpStream::connect(at0).expect("connect");
                std::thread::spawn(move || {
                    let proof = a.connect(&s, Instant::now() + Duration::from_secs(30));
                    let _ = (&s).write_all(&hello);
                    (proof, closed_without_a_byte(&s))
                })
            })
            .collect();
        let remote = |l: &TcpListener, rank| Remote {
            rank,
            endpoint: l.local_addr().expect("addr").to_string(),
            data_bytes: 4096,
        };
        let (to0, to1) = ([remote(&l0, 0)], [remote(&l1, 1)]);
        let (s1c, a1) = (s1.clone(), auth(b"ep", b"group-a"));
        let t = std::thread::spawn(move || EpNet::establish(l1, s1c, 1, 2, &to0, &a1));
        let a0 = auth(b"ep", b"group-a");
        let (_n0, _p0) = EpNet::establish(l0, s0.clone(), 0, 2, &to1, &a0).expect("net 0");
        let (_n1, mut p1) = t.join().expect("thread").expect("net 1");
        closed_without_a_byte(&bare).expect("the impostor without the secret");
        for (i, t) in impostors.into_iter().enumerate() {
            let (proof, closed) = t.join().expect("impostor");
            assert!(proof.is_err(), "impostor {i} passed the handshake");
            closed.unwrap_or_else(|e| panic!("impostor {i}: {e}"));
        }
        assert_eq!(s0.posted(Phase::Dispatch, 1), 0, "the impostor's POST");
        p1.remove(0).1.post(Phase::Dispatch, 1, 3);
        let t0 = Instant::now();
        while s0.posted(Phase::Dispatch, 1) != 3 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "rank 1's POST lands"
            );
            std::thread::yield_now();
        }
    }

    /// Whether the peer closes `s` without sending a byte (within 10 s).
    fn closed_without_a_byte(s: &TcpStream) -> Result<(), String> {
        use std::io::Read;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut b = [0u8; 64];
        match (&*s).read(&mut b) {
            Ok(0) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => Ok(()),
            r => Err(format!("not closed without a byte: {r:?}")),
        }
    }

    /// Two ranks in this process, linked over TCP: data, descriptor, post and ack arrive in
    /// the receiver's own buffer; closing one side marks it dead on the other.
    #[test]
    fn frames_land_in_the_readers_buffer_and_close_marks_dead() {
        let (s0, s1) = (own_segment("pair0", 1 << 20), own_segment("pair1", 1 << 20));
        let (l0, l1) = (
            TcpListener::bind("127.0.0.1:0").expect("bind"),
            TcpListener::bind("127.0.0.1:0").expect("bind"),
        );
        let remote = |l: &TcpListener, rank| Remote {
            rank,
            endpoint: l.local_addr().expect("addr").to_string(),
            data_bytes: 1 << 20,
        };
        let (to0, to1) = ([remote(&l0, 0)], [remote(&l1, 1)]);
        let s1c = s1.clone();
        let t =
            std::thread::spawn(move || EpNet::establish(l1, s1c, 1, 2, &to0, &LinkAuth::open()));
        let (n0, mut p0) =
            EpNet::establish(l0, s0.clone(), 0, 2, &to1, &LinkAuth::open()).expect("net 0");
        let (n1, mut p1) = t.join().expect("thread").expect("net 1");
        let (to_1, to_0) = (p0.remove(0).1, p1.remove(0).1);
        let big: Vec<u8> = (0..300_000).map(|i| (i % 251) as u8).collect();
        to_1.write(1000, &big);
        to_1.write(10, &[9, 8, 7]);
        let d = EpDesc {
            tokens_max: 4,
            hidden: 128,
            experts: 8,
            flags: 1,
        };
        to_1.set_desc(Phase::Dispatch, 1, 0, d);
        to_1.post(Phase::Dispatch, 0, 3);
        to_0.ack(Phase::Combine, 1, 5);
        let t0 = Instant::now();
        while s1.posted(Phase::Dispatch, 0) < 3 || s0.acked(Phase::Combine, 1) < 5 {
            assert!(t0.elapsed() < Duration::from_secs(10), "frames arrive");
            std::thread::yield_now();
        }
        assert_eq!(s1.desc(Phase::Dispatch, 1, 0), d);
        // SAFETY: inside the 1 MiB data area; written before the post observed above.
        let got = unsafe { std::slice::from_raw_parts(s1.data().add(1000), big.len()) };
        assert!(got == &big[..]);
        assert_eq!(
            // SAFETY: as above.
            unsafe { std::slice::from_raw_parts(s1.data().add(10), 3) },
            [9, 8, 7]
        );
        assert!(to_1.alive() && to_0.alive());
        drop(n1);
        let t0 = Instant::now();
        while to_1.alive() {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "closed link marks dead"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(n0);
    }
}
