//! Same-host shared segments: a process serving a shared [`Segment`] offers its memfd to other
//! processes on the host, which map the same pages and move object bytes with memcpy instead
//! of through loopback TCP.
//!
//! ```text
//! exporter (storage node shard, store client)          importer (store client on the same host)
//! listen on abstract unix socket                        connect("\0mooncake-shm/<te_endpoint>")
//!   "\0mooncake-shm/<te_endpoint>"                        (refused: not on this host / no export)
//! accept; check SO_PEERCRED: same uid, or root         check SO_PEERCRED: same uid, or root
//! send the offer, the memfd attached (SCM_RIGHTS) ───▶  check the memfd's seals (no shrink,
//!                                                         no grow); mmap(memfd, MAP_SHARED)
//!                                                         read+write
//! send this importer's write page (a memfd)       ───▶  check its seals; mmap it (`recovery::inflight`)
//! send its announcement ring (a memfd)            ───▶  check its seals; mmap it (`ring`)
//! keep the connection open                              a read of 0 bytes = the exporter is gone:
//!                                                         drop the mapping
//!                                                       before each memcpy into the segment:
//!                                                         a slot of the write page, refused if
//!                                                         the exporter's fence refuses the term
//! read the ring's announcements, apply them to    ◀───    then an intent in the ring: "I am
//!   the catalog (every few ms while they come,           writing this range for the put of
//!   at once when woken, before every snapshot and        this key and version"; the slot is
//!   fence raise, when the importer's end closes,         let go after the last byte;
//!   and before any record or tombstone that comes ◀───    then the object's record ("it is
//!   another way)                                         complete"), before the put's commit;
//!                                                       past half full a byte on the socket
//!                                                         wakes the exporter
//!
//! Offer (24 bytes, little-endian)
//!  0               4               8                               16                              24
//!  | magic "MCSH"  | version       | base (u64): the exporter's address of the segment | len (u64) |
//!  version 5: as 4, and the ring also takes provisional records and their commits (a put
//!  committed in one round trip, `recovery::catalog`);
//!  version 4: the exporter sends a write page and an announcement ring next and reads
//!  intents and records from the ring (the socket carries only wake-ups); 3: a write page
//!  next, intents on the socket, records over TCP; 2: intents on the socket, no write page
//!  (unfenced); 1: neither (the importer announces nothing)
//!
//! Write page message (8 bytes, little-endian), its memfd attached, right after a version 3,
//! 4 or 5 offer
//!  | magic "MCSP"  | page bytes (u32) = `inflight::WRITE_PAGE_BYTES` |
//!
//! Announcement ring message (8 bytes, little-endian), its memfd attached, right after a
//! version 4 or 5 offer's write page message
//!  | magic "MCSR"  | ring bytes (u32) = `limits::SHM_RING_MEMFD_BYTES` |
//!
//! Announcement (little-endian), importer -> exporter, any number back to back, in the ring
//! (version 4) or on the socket (versions 2 and 3)
//!  0               4                   8                       16
//!  | magic "MCSW"  | record_len (u32)  | addr (u64)            | record (record_len bytes) |
//!  record: a versioned catalog record (`recovery::catalog`) of kind INTENT (the object's
//!  length, the put's key and version) or, versions 4 and 5, an object record (its length,
//!  key, version and pins), or, version 5 only, a provisional record or a commit;
//!  record_len 1 ..= CATALOG_RECORD_MAX_BYTES
//! ```
//!
//! Why intents, and why records here too: `announce`, where the importers' announcements are
//! read and applied. Why a ring in shared memory rather than the socket: `ring`.
//!
//! Why a write page: the owner's term fence (`recovery::fence`) refuses the late WRITEs of a
//! master that ended, but a memcpy passes no server. With a slot held for each copy, an
//! owner raising its fence refuses copies of earlier terms before their first byte and
//! waits for those already copying before it re-mounts (`recovery::inflight`). One page per
//! importer, so that the exporter can tell a dead importer's slots (a pidfd) from a live one's.
//!
//! Why an abstract unix socket named after the data-plane endpoint: a client learns a replica's
//! `transport_endpoint` from the master and nothing else; connecting to the matching name
//! succeeds exactly when the exporting process shares this host's network namespace, so no
//! new field in any descriptor is needed and a remote endpoint costs one refused `connect`
//! (remembered for a while). Abstract names vanish with their socket: a killed exporter leaves
//! nothing behind, and the memfd is freed when the last mapping goes.
//!
//! Security: the memfd gives read and write access to the whole segment, so it goes only to a
//! peer whose uid is ours or root's (`SO_PEERCRED`), i.e. to a process that could read our
//! memory anyway. The same rule holds the other way (`trusted`, checked by the importer on
//! the listener's credentials before it reads the offer): abstract names belong to the
//! network namespace, not to a user, so another user's process could bind a node's name
//! first and hand out its own memfd, to serve forged objects and receive our puts. Every
//! memfd (segment, write page, ring) must carry `F_SEAL_SHRINK | F_SEAL_GROW`: a process that
//! shrank one after the other checked its size would crash the other with `SIGBUS`.
//! A refused exporter is counted ([`exporters_refused`]) and logged, and the caller uses TCP.
//! `docs/security.md` has the threat model.
//!
//! Invariants: an importer touches only `[base, base + len)` of the exporter's address space,
//! translated into its own mapping ([`ShmMapping::translate`] checks every range); decoding an
//! offer or an announcement never panics on any bytes (fuzzed by
//! `fuzz/fuzz_targets/shm_offer.rs`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::served::ServedMemory;
use crate::recovery::catalog::PendingWrites;
use crate::recovery::inflight::{Refused, WriteClaim, WritePage, WRITE_PAGE_BYTES};
use crate::sys::rawio;
use crate::sys::unix::{self, peer_alive, peer_cred, recv_with_fd, send_with_fd, trusted};

mod announce;
mod ring;
pub use announce::Announcement;
use announce::{Importer, Importers};
pub use ring::Ring;

/// Offer magic, the bytes `MCSH` on the wire.
pub const OFFER_MAGIC: u32 = u32::from_le_bytes(*b"MCSH");
/// The offer version of an exporter that sends a write page and an announcement ring and
/// reads intents, records, and provisional records and their commits from the ring.
pub const OFFER_VERSION: u32 = 5;
/// The offer version of an exporter that reads intents and records from the ring, but not
/// provisional records (still understood).
pub const OFFER_VERSION_NO_COMMITS: u32 = 4;
/// The offer version of an exporter that reads write intents (records go over TCP) and sends
/// a write page (still understood).
pub const OFFER_VERSION_NO_RECORDS: u32 = 3;
/// The offer version of an exporter that reads write intents and sends no write page (still
/// understood).
pub const OFFER_VERSION_NO_PAGE: u32 = 2;
/// The offer version of an exporter that reads none (still understood).
pub const OFFER_VERSION_NO_INTENTS: u32 = 1;
/// Write page message magic, the bytes `MCSP` on the wire.
pub const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"MCSP");
/// Announcement ring message magic, the bytes `MCSR` on the wire.
pub const RING_MAGIC: u32 = u32::from_le_bytes(*b"MCSR");
/// Announcement magic, the bytes `MCSW` on the wire.
pub const ANNOUNCEMENT_MAGIC: u32 = u32::from_le_bytes(*b"MCSW");
/// Encoded size of an announcement's fixed part (its record follows).
pub const ANNOUNCEMENT_HEADER_BYTES: usize = 16;
/// How long the export thread lets intents gather after reading some: at most one wake-up
/// per this, while an importer's socket holds a few hundred intents before its sends block.
const INTENT_GATHER: Duration = Duration::from_millis(5);
/// How long an importer may wait to hand an intent to a slow exporter before it gives up
/// the mapping and writes over TCP instead.
const INTENT_SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// Encoded size of an offer.
pub const OFFER_BYTES: usize = 24;
/// Importers an exporter keeps connected at once; more are refused (they use TCP).
pub const IMPORTERS_MAX: usize = 4096;
/// How long an importer waits for the offer.
const OFFER_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the exporter's thread checks whether it should stop.
const ACCEPT_POLL_MS: i32 = 200;

/// Whether segments are shared with same-host processes and same-host replicas are moved
/// with memcpy: `MC_STORE_SHM` (default on; a false word of [`protocol::env::FALSE_WORDS`] turns it off). Also off
/// when `MC_STORE_MEMCPY` is off.
pub fn shm_enabled() -> bool {
    protocol::env::flag("MC_STORE_SHM", true) && protocol::env::flag("MC_STORE_MEMCPY", true)
}

/// Who serves a segment, which decides whether sharing it is worth its cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A storage node: every access to its segment comes from another process, so it is
    /// always shared (when [`shm_enabled`]).
    Node,
    /// A store client's own segment: it reads it itself with memcpy, fastest on hugepages. It
    /// is shared only when shared memory gets hugepages too (hugetlb pages wanted and free, or
    /// `shmem_enabled` allows transparent hugepages); otherwise it stays private anonymous
    /// memory with transparent hugepages, and same-host peers reach it over TCP.
    Client,
}

/// A segment for serving by `owner`: shared (memfd) or private; see [`Owner`].
pub fn serving_segment(
    len: usize,
    options: crate::mem::SegmentOptions,
    owner: Owner,
) -> io::Result<crate::mem::Segment> {
    use crate::mem::segment::{free_hugetlb_bytes, shmem_thp_enabled};
    let huge_shared = options.hugepages == crate::mem::HugepagePolicy::Prefer
        && free_hugetlb_bytes() >= len as u64;
    let share = shm_enabled()
        && match owner {
            Owner::Node => true,
            Owner::Client => huge_shared || shmem_thp_enabled(),
        };
    if share {
        crate::mem::Segment::new_shared(len, options)
    } else {
        crate::mem::Segment::new(len, options)
    }
}

/// Offers `segment` to same-host importers under `endpoint`, if it is shared, applying their
/// write intents to `memory`'s catalog; `None` (with the reason logged) when it is private or
/// the name cannot be bound.
pub fn export_segment(
    endpoint: &str,
    segment: &crate::mem::Segment,
    memory: &Arc<ServedMemory>,
) -> Option<ShmExport> {
    let fd = segment.shared_fd()?;
    let offer = Offer {
        base: segment.addr() as u64,
        len: segment.len() as u64,
        guards: Guards::Commits,
    };
    match ShmExport::start(endpoint, fd, offer, Some(memory.clone())) {
        Ok(e) => Some(e),
        Err(e) => {
            tracing::warn!("segment at {endpoint} not shared with same-host clients: {e}");
            None
        }
    }
}

/// The abstract socket name for a data-plane endpoint.
pub fn socket_name(endpoint: &str) -> String {
    format!("mooncake-shm/{endpoint}")
}

/// The little-endian integers at `i` of a message whose length was checked.
fn le_u32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// An offer: where the segment lives in the exporter's address space, and what the exporter
/// asks of its importers' copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub base: u64,
    pub len: u64,
    pub guards: Guards,
}

/// What an exporter asks of an importer's copies, one step per offer version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guards {
    /// Nothing (version 1): an exporter without a catalog, such as a dummy client's region.
    None,
    /// A write intent before each copy (version 2).
    Intents,
    /// Intents, and a write page sent after the offer that fences copies by term (version 3).
    IntentsAndPage,
    /// The write page and an announcement ring, which carries the intents and each object's
    /// record once its bytes are in (version 4).
    Records,
    /// As `Records`, and the ring also takes provisional records and their commits (a put
    /// committed in one round trip, `recovery::catalog`) (version 5).
    Commits,
}

impl Guards {
    /// The importer announces each copy with a write intent.
    pub fn intents(self) -> bool {
        self != Guards::None
    }

    /// A write page follows the offer.
    pub fn page(self) -> bool {
        matches!(
            self,
            Guards::IntentsAndPage | Guards::Records | Guards::Commits
        )
    }

    /// An announcement ring follows the write page, and carries the intents and each
    /// object's record (not over TCP).
    pub fn records(self) -> bool {
        matches!(self, Guards::Records | Guards::Commits)
    }

    /// The ring takes provisional records and their commits too.
    pub fn commits(self) -> bool {
        self == Guards::Commits
    }

    fn version(self) -> u32 {
        match self {
            Guards::None => OFFER_VERSION_NO_INTENTS,
            Guards::Intents => OFFER_VERSION_NO_PAGE,
            Guards::IntentsAndPage => OFFER_VERSION_NO_RECORDS,
            Guards::Records => OFFER_VERSION_NO_COMMITS,
            Guards::Commits => OFFER_VERSION,
        }
    }
}

impl Offer {
    pub fn encode(&self) -> [u8; OFFER_BYTES] {
        let mut b = [0u8; OFFER_BYTES];
        b[0..4].copy_from_slice(&OFFER_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.guards.version().to_le_bytes());
        b[8..16].copy_from_slice(&self.base.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes an offer; errors say what was wrong. Never panics.
    pub fn decode(b: &[u8]) -> Result<Offer, &'static str> {
        if b.len() != OFFER_BYTES {
            return Err("offer is not 24 bytes");
        }
        let (u32_at, u64_at) = (|i| le_u32(b, i), |i| le_u64(b, i));
        if u32_at(0) != OFFER_MAGIC {
            return Err("bad offer magic");
        }
        let guards = match u32_at(4) {
            OFFER_VERSION => Guards::Commits,
            OFFER_VERSION_NO_COMMITS => Guards::Records,
            OFFER_VERSION_NO_RECORDS => Guards::IntentsAndPage,
            OFFER_VERSION_NO_PAGE => Guards::Intents,
            OFFER_VERSION_NO_INTENTS => Guards::None,
            _ => return Err("unknown offer version"),
        };
        let offer = Offer {
            base: u64_at(8),
            len: u64_at(16),
            guards,
        };
        if offer.len == 0 || offer.base.checked_add(offer.len).is_none() {
            return Err("offer range is empty or wraps");
        }
        Ok(offer)
    }
}

/// Offers one shared segment's memfd to same-host importers until dropped.
pub struct ShmExport {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ShmExport {
    /// Listens on the abstract socket of `endpoint` and offers `fd` (the memfd of a segment at
    /// `offer.base` in this process, `offer.len` bytes). With `memory`, the importers' write
    /// intents and records go to its catalog and their copies are fenced by its fence, each importer
    /// getting a write page (and the offer says so, whatever `offer.guards` was); without,
    /// the offer asks for neither. Fails if the name is taken, and (`InvalidInput`) if `fd`
    /// is not sealed at its size: every importer would refuse it.
    pub fn start(
        endpoint: &str,
        fd: BorrowedFd<'_>,
        mut offer: Offer,
        memory: Option<Arc<ServedMemory>>,
    ) -> io::Result<ShmExport> {
        if !crate::sys::mmap::size_sealed(fd)? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the descriptor is not a memfd sealed at its size, which importers require",
            ));
        }
        let addr = SocketAddr::from_abstract_name(socket_name(endpoint).as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        let fd = fd.try_clone_to_owned()?;
        offer.guards = match memory {
            Some(_) => Guards::Commits,
            None => Guards::None,
        };
        let importers = Arc::new(Importers {
            list: Mutex::new(Vec::new()),
            memory: memory.as_ref().map_or_else(Weak::new, Arc::downgrade),
        });
        if let Some(m) = &memory {
            let source: Arc<dyn PendingWrites> = importers.clone();
            m.catalog().watch(Arc::downgrade(&source));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mc-shm-export".into())
            .spawn(move || export_loop(listener, fd, offer, importers, memory, flag))?;
        Ok(ShmExport {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ShmExport {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Accepts importers and sends them the offer; with `memory`, also reads every importer's
/// announcements and applies them to the catalog (which reads them too, before anything that
/// must come after them): at once when an importer wakes it or leaves, every
/// [`INTENT_GATHER`] while announcements keep coming, every [`ACCEPT_POLL_MS`] otherwise. Only
/// this thread adds or removes importers, so the descriptors it polls stay open while it
/// polls them.
fn export_loop(
    listener: UnixListener,
    fd: OwnedFd,
    offer: Offer,
    importers: Arc<Importers>,
    memory: Option<Arc<ServedMemory>>,
    stop: Arc<AtomicBool>,
) {
    let mut pfds: Vec<libc::pollfd> = Vec::new();
    let mut readable: Vec<bool> = Vec::new();
    let mut busy = false;
    while !stop.load(Ordering::Acquire) {
        pfds.clear();
        pfds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        if memory.is_some() {
            pfds.extend(importers.lock().iter().map(|i| libc::pollfd {
                fd: i.conn.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }));
        }
        let wait = if busy {
            INTENT_GATHER.as_millis() as i32
        } else {
            ACCEPT_POLL_MS
        };
        // SAFETY: `pfds` holds `pfds.len()` valid pollfds for the duration of the call.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, wait) };
        if n < 0 {
            continue;
        }
        if memory.is_some() {
            // Only this thread adds or removes importers, so the list is still in the order
            // `pfds` was built in.
            readable.clear();
            readable.extend(pfds[1..].iter().map(|p| p.revents != 0));
            busy = importers.drain_polled(&readable);
            importers.lock().retain(|i| !i.closed);
        }
        if pfds[0].revents != 0 {
            if let Ok((conn, _)) = listener.accept() {
                admit(conn, &fd, offer, &importers, memory.as_deref());
            }
        }
    }
}

/// Sends a new importer the offer (and, with `memory`, its write page and announcement ring)
/// and keeps it, unless it is not trusted or there are too many.
fn admit(
    conn: UnixStream,
    fd: &OwnedFd,
    offer: Offer,
    importers: &Importers,
    memory: Option<&ServedMemory>,
) {
    let mut list = importers.lock();
    if memory.is_none() {
        list.retain(|i| peer_alive(i.conn.as_raw_fd()));
    }
    let Some(cred) = peer_cred(&conn).filter(trusted) else {
        return; // dropped: the importer sees EOF instead of an offer and uses TCP
    };
    if list.len() >= IMPORTERS_MAX {
        return;
    }
    // The page is fenced (the current term on it) before the importer can map it.
    let guards = match memory {
        None => None,
        Some(m) => match WritePage::shared().and_then(|p| Ok((p, Ring::shared()?))) {
            Ok(((mut page, page_fd), ring)) => {
                page.watch_writer(cred.pid);
                let page = Arc::new(page);
                m.catalog().fences().watch(page.clone());
                Some((page, page_fd, ring))
            }
            Err(e) => {
                tracing::warn!("no write page or ring for a same-host importer ({e}): over TCP");
                return;
            }
        },
    };
    let sent = send_with_fd(&conn, &offer.encode(), fd.as_raw_fd()).is_ok()
        && guards.as_ref().is_none_or(|(_, page_fd, (_, ring_fd))| {
            send_with_fd(&conn, &page_message(), page_fd.as_raw_fd()).is_ok()
                && send_with_fd(&conn, &ring_message(), ring_fd.as_raw_fd()).is_ok()
        });
    if sent {
        let (page, ring) = match guards {
            Some((page, _, (ring, _))) => (Some(page), Some(ring)),
            None => (None, None),
        };
        list.push(Importer::new(conn, page, ring));
    }
}

/// The message that carries an importer's announcement ring.
fn ring_message() -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&RING_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&(crate::limits::SHM_RING_MEMFD_BYTES as u32).to_le_bytes());
    b
}

/// The message that carries an importer's write page.
fn page_message() -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&(WRITE_PAGE_BYTES as u32).to_le_bytes());
    b
}

/// Exporters this process refused to map so far: one running as another user than ours or
/// root's (it could have bound a node's name first, to hand out forged objects and receive
/// our puts), or one whose memfd is not sealed against shrinking (a shrink would crash us
/// with `SIGBUS`).
pub fn exporters_refused() -> u64 {
    EXPORTERS_REFUSED.load(Ordering::Relaxed)
}

static EXPORTERS_REFUSED: AtomicU64 = AtomicU64::new(0);

/// Counts and logs a refused exporter of `endpoint`; the error says why.
fn refuse_exporter(endpoint: &str, why: String) -> io::Error {
    EXPORTERS_REFUSED.fetch_add(1, Ordering::Relaxed);
    tracing::warn!("same-host segment of {endpoint} not mapped ({why}): reached over TCP");
    io::Error::new(io::ErrorKind::PermissionDenied, why)
}

/// The importer's half of [`trusted`]: the process listening on `conn`'s name (its
/// credentials when it called `listen`) runs as our user or as root. Checked before a byte of
/// the offer is read.
fn check_exporter(conn: &UnixStream, endpoint: &str) -> io::Result<()> {
    unix::check_listener(conn)
        .map_err(|why| refuse_exporter(endpoint, format!("its exporter {why}")))
}

/// Receives the offer and its descriptor.
fn recv_offer(conn: &UnixStream) -> io::Result<(Offer, OwnedFd)> {
    let mut bytes = [0u8; OFFER_BYTES];
    let (n, fd) = recv_with_fd(conn, &mut bytes)?;
    let offer = Offer::decode(&bytes[..n])
        .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
    Ok((offer, fd))
}

/// Connects to the exporter of `endpoint`; `None` when nobody on this host exports it.
fn connect(endpoint: &str) -> io::Result<Option<UnixStream>> {
    unix::connect_abstract(&socket_name(endpoint))
}

/// An offered memfd must be sealed against shrinking and growing (`PermissionDenied`
/// otherwise): its size, checked once before it is mapped, must hold for the mapping's life.
fn check_sealed(fd: BorrowedFd<'_>) -> io::Result<()> {
    if crate::sys::mmap::size_sealed(fd)? {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        "its memfd is not sealed against shrinking and growing",
    ))
}

/// Receives the write page that follows a version 3, 4 or 5 offer, and maps it.
fn recv_page(conn: &UnixStream) -> io::Result<WritePage> {
    WritePage::map(&recv_guard(conn, page_message(), "write page")?)
}

/// Receives the announcement ring that follows a version 4 or 5 offer's write page, and maps
/// it.
fn recv_ring(conn: &UnixStream) -> io::Result<Ring> {
    Ring::map(&recv_guard(conn, ring_message(), "announcement ring")?)
}

/// Receives the message `expected` (`what`) and the memfd it carries.
fn recv_guard(conn: &UnixStream, expected: [u8; 8], what: &str) -> io::Result<OwnedFd> {
    let mut bytes = [0u8; 8];
    let (n, fd) = recv_with_fd(conn, &mut bytes)?;
    if n != 8 || bytes != expected {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad {what} message"),
        ));
    }
    Ok(fd)
}

/// A same-host segment mapped into this process.
#[derive(Debug)]
pub struct ShmMapping {
    ptr: NonNull<u8>,
    offer: Offer,
    /// Backed by hugetlb pages (the memfd's block size is larger than a page).
    hugetlb: bool,
    /// Open while the exporter lives; carries our announcements.
    conn: UnixStream,
    /// Keeps each announcement whole on `conn` when several threads write through this
    /// mapping.
    sending: Mutex<()>,
    /// The ring our announcements go in (an exporter of offer version 4).
    ring: Option<Ring>,
    /// The exporter's write page for our copies (an exporter of offer version 3, 4 or 5).
    writes: Option<WritePage>,
}

// SAFETY: the mapping is owned by this value and reached only through raw pointers handed out
// by `translate`; sharing or sending the value creates no reference into it.
unsafe impl Send for ShmMapping {}
// SAFETY: see `Send`.
unsafe impl Sync for ShmMapping {}

impl ShmMapping {
    /// Maps the segment exported for `endpoint` on this host: `Ok(None)` when nothing there
    /// exports it (a remote endpoint, or an exporter that refused us); `PermissionDenied`
    /// when we refuse the exporter ([`exporters_refused`]: another user's process answers on
    /// that name). Either way the caller reaches the segment over TCP.
    pub fn import(endpoint: &str) -> io::Result<Option<ShmMapping>> {
        let Some(conn) = connect(endpoint)? else {
            return Ok(None);
        };
        check_exporter(&conn, endpoint)?;
        conn.set_read_timeout(Some(OFFER_TIMEOUT))?;
        conn.set_write_timeout(Some(INTENT_SEND_TIMEOUT))?;
        let received = recv_offer(&conn).and_then(|(offer, fd)| {
            let writes = offer.guards.page().then(|| recv_page(&conn)).transpose()?;
            let ring = offer
                .guards
                .records()
                .then(|| recv_ring(&conn))
                .transpose()?;
            check_sealed(fd.as_fd())?;
            Ok((offer, fd, writes, ring))
        });
        let (offer, fd, writes, ring) = match received {
            Ok(x) => x,
            // Refused (EOF, no fd): not ours to map.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                return Err(refuse_exporter(endpoint, e.to_string()))
            }
            Err(e) => return Err(e),
        };
        let len = usize::try_from(offer.len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "offer too large"))?;
        let st = crate::sys::mmap::fstat(fd.as_fd())?;
        if (st.st_size as u64) < offer.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "offered memfd is smaller than the segment",
            ));
        }
        let hugetlb = st.st_blksize as u64 > crate::mem::segment::base_page_bytes() as u64;
        let ptr = crate::sys::mmap::mmap_shared(fd.as_fd(), len)?;
        drop(fd); // the mapping keeps the memory
        Ok(Some(ShmMapping {
            ptr,
            offer,
            hugetlb,
            conn,
            sending: Mutex::new(()),
            writes,
            ring,
        }))
    }

    /// Where `[addr, addr + len)` of the exporter's address space is in ours, if it lies
    /// inside the segment.
    pub fn translate(&self, addr: u64, len: u64) -> Option<*mut u8> {
        let off = addr.checked_sub(self.offer.base)?;
        let end = off.checked_add(len)?;
        if end > self.offer.len {
            return None;
        }
        // SAFETY: off + len <= offer.len, the length of our mapping.
        Some(unsafe { self.ptr.as_ptr().add(off as usize) })
    }

    /// Whether the segment is on hugetlb pages. Their residency in this mapping
    /// ([`crate::mem::Dst::resident`]) says only whether this process touched them yet: the
    /// exporter allocates them from the pool, and may have prefaulted them.
    pub fn hugetlb(&self) -> bool {
        self.hugetlb
    }

    /// The exporter's view of the segment.
    pub fn offer(&self) -> Offer {
        self.offer
    }

    /// Whether the exporter still holds its end (one non-blocking syscall).
    pub fn exporter_alive(&self) -> bool {
        peer_alive(self.conn.as_raw_fd())
    }

    /// Starts a copy of a put of term `term` into the exporter's segment at `addr`: takes a
    /// slot of the exporter's write page (refused if the exporter's fence refuses the term:
    /// that master has ended), then sends `intent`, the put's encoded intent record
    /// (`CatalogRecord::intent(len, key, version)`, at that term; see
    /// [`ShmMapping::announce_write`]). Copy only while the returned claim is held. An
    /// exporter without a write page (offer version 2 or 1) fences nothing.
    pub fn begin_write(
        &self,
        addr: u64,
        term: u64,
        intent: &[u8],
    ) -> Result<WriteClaim<'_>, WriteRefused> {
        let claim = match &self.writes {
            Some(page) => page.begin(term).map_err(|r| match r {
                Refused::Fenced { fence } => WriteRefused::Fenced { fence },
                Refused::Full => {
                    WriteRefused::Unavailable(io::Error::other("every write slot is held"))
                }
            })?,
            None => WriteClaim::unfenced(),
        };
        self.announce_write(addr, intent)
            .map_err(WriteRefused::Unavailable)?;
        Ok(claim)
    }

    /// Tells the exporter, before the first byte is copied, that a put is about to write its
    /// object at `addr`: `intent` is its encoded intent record (`CatalogRecord::intent(len,
    /// key, version)`: the range, the key and the version; see `announce`). Once this returns
    /// Ok the intent is in the exporter's ring (or, offer versions 2 and 3, its socket).
    /// Nothing to do for an exporter that reads none. An error (the exporter gone, or not
    /// reading for [`INTENT_SEND_TIMEOUT`]) means: do not memcpy.
    pub fn announce_write(&self, addr: u64, intent: &[u8]) -> io::Result<()> {
        if !self.offer.guards.intents() {
            return Ok(());
        }
        let header = Announcement::header(addr, intent.len());
        let _whole = self.sending.lock().unwrap_or_else(|e| e.into_inner());
        match &self.ring {
            Some(ring) => self.publish(ring, &[&header, intent]),
            None => self.send_whole(&[&header[..], intent].concat()),
        }
    }

    /// Whether the exporter takes object records in our ring (offer version 4).
    pub fn takes_records(&self) -> bool {
        self.ring.is_some()
    }

    /// Whether the exporter also takes provisional records and their commits in our ring
    /// (offer version 5; [`ShmMapping::send_records`] sends them as any record).
    pub fn takes_commits(&self) -> bool {
        self.takes_records() && self.offer().guards.commits()
    }

    /// Publishes the records of objects whose bytes are all in, each `(addr, encoded
    /// record)`, in order; once this returns Ok they are in the exporter's ring, which it
    /// reads before any record or tombstone it gets later (see `announce`). Call it before
    /// committing their puts. An error says how many went first: the exporter takes no
    /// records here, or is gone, or did not read for [`INTENT_SEND_TIMEOUT`]; record the rest
    /// another way.
    pub fn send_records(&self, records: &[(u64, &[u8])]) -> Result<(), (usize, io::Error)> {
        let Some(ring) = &self.ring else {
            return Err((0, io::Error::other("the exporter takes no records here")));
        };
        let _whole = self.sending.lock().unwrap_or_else(|e| e.into_inner());
        for (sent, &(addr, record)) in records.iter().enumerate() {
            let header = Announcement::header(addr, record.len());
            self.publish(ring, &[&header, record])
                .map_err(|e| (sent, e))?;
        }
        Ok(())
    }

    /// Appends the frame made of `parts` to `ring` (call with `sending` held). The exporter
    /// reads the ring every few milliseconds while it fills; past half full, and while it is
    /// full, a byte on the socket wakes it. Fails when the exporter is gone, or has not made
    /// room within [`INTENT_SEND_TIMEOUT`].
    fn publish(&self, ring: &Ring, parts: &[&[u8]]) -> io::Result<()> {
        let half = (crate::limits::SHM_RING_BYTES / 2) as u64;
        let mut since = None;
        loop {
            let before = ring.used();
            if ring.push_parts(parts) {
                if before <= half && ring.used() > half {
                    self.wake()?;
                }
                return Ok(());
            }
            self.wake()?;
            let t0 = *since.get_or_insert_with(std::time::Instant::now);
            if t0.elapsed() > INTENT_SEND_TIMEOUT {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the exporter did not read its announcement ring",
                ));
            }
            std::thread::sleep(crate::limits::SHM_RING_FULL_WAIT);
        }
    }

    /// One byte on the socket, which wakes the exporter's reader (a full socket means it has
    /// wake-ups enough); fails when the exporter is gone.
    fn wake(&self) -> io::Result<()> {
        // SAFETY: one readable byte; MSG_DONTWAIT never blocks.
        let n = unsafe {
            libc::send(
                self.conn.as_raw_fd(),
                [0u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(()),
            _ => Err(e),
        }
    }

    /// Sends `bytes` whole, or shuts the socket down: maybe part of an announcement went, and
    /// no later one may follow it. The exporter sees the close, and so does
    /// [`ShmMapping::exporter_alive`]. Call with `sending` held.
    fn send_whole(&self, bytes: &[u8]) -> io::Result<()> {
        rawio::send_all(self.conn.as_raw_fd(), bytes, false).inspect_err(|_| {
            let _ = self.conn.shutdown(std::net::Shutdown::Both);
        })
    }
}

/// Why [`ShmMapping::begin_write`] may not copy.
#[derive(Debug)]
pub enum WriteRefused {
    /// The owner's fence refuses the put's term: the put fails (over TCP it would too).
    Fenced { fence: u64 },
    /// The intent could not be sent, or no slot was free: write over TCP instead.
    Unavailable(io::Error),
}

impl Drop for ShmMapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the mapping made in `import`, unmapped only here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.offer.len as usize) };
    }
}

#[cfg(test)]
mod tests;
