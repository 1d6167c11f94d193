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
//! keep the connection open                              a read of 0 bytes = the exporter is gone:
//!                                                         drop the mapping
//!                                                       before each memcpy into the segment:
//!                                                         a slot of the write page, refused if
//!                                                         the exporter's fence refuses the term
//! read write intents, apply them to the catalog   ◀───    then an intent: "I am writing this
//!   (at once, before every catalog snapshot, and          range for the put of this key and
//!   when the importer's end closes)                       version"; the slot is let go after
//!                                                         the last byte
//!
//! Offer (24 bytes, little-endian)
//!  0               4               8                               16                              24
//!  | magic "MCSH"  | version       | base (u64): the exporter's address of the segment | len (u64) |
//!  version 3: the exporter reads write intents and sends a write page next; 2: intents, no
//!  write page (unfenced); 1: neither (the importer sends no intents)
//!
//! Write page message (8 bytes, little-endian), its memfd attached, right after a version 3 offer
//!  | magic "MCSP"  | page bytes (u32) = `inflight::WRITE_PAGE_BYTES` |
//!
//! Write intent (little-endian), importer -> exporter, any number back to back
//!  0               4                   8                       16
//!  | magic "MCSW"  | record_len (u32)  | addr (u64)            | record (record_len bytes) |
//!  record: a catalog record of kind INTENT (`recovery::catalog`): the object's length, the put's
//!  key and version; record_len 1 ..= CATALOG_RECORD_MAX_BYTES
//! ```
//!
//! Why intents: the owner does not see a memcpy, yet its catalog must not keep an entry that
//! names bytes written over since. A range the master freed can be handed out again before
//! the owner heard of the free, and a writer that dies between its memcpy and its record
//! would leave the old key's entry over its bytes, which the next master would list
//! (`docs/recovery.md`, "A range written over"; over TCP the same intent goes as a
//! CATALOG_PUT before the WRITE). The intent is in the owner's socket before the first byte
//! is copied, and the owner applies every intent before it takes a catalog snapshot and when
//! the importer's end closes ([`Catalog::overwrite`]: it drops only entries older than the
//! write's version and spares the key's own entry in place, so applying it late, after the
//! writer's own record, loses nothing).
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
//! first and hand out its own memfd, to serve forged objects and receive our puts. Both
//! memfds (segment and write page) must carry `F_SEAL_SHRINK | F_SEAL_GROW`: an exporter that
//! shrank one after the importer checked its size would crash the importer with `SIGBUS`.
//! A refused exporter is counted ([`exporters_refused`]) and logged, and the caller uses TCP.
//! `docs/security.md` has the threat model.
//!
//! Invariants: an importer touches only `[base, base + len)` of the exporter's address space,
//! translated into its own mapping ([`ShmMapping::translate`] checks every range); decoding an
//! offer never panics on any bytes (fuzzed by `fuzz/fuzz_targets/shm_offer.rs`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use protocol::Version;

use super::served::ServedMemory;
use super::Dst;
use crate::limits::CATALOG_RECORD_MAX_BYTES;
use crate::recovery::catalog::{Catalog, CatalogRecord, PendingWrites, RecordKind};
use crate::recovery::inflight::{Refused, WriteClaim, WritePage, WRITE_PAGE_BYTES};
use crate::sys::rawio;

/// Offer magic, the bytes `MCSH` on the wire.
pub const OFFER_MAGIC: u32 = u32::from_le_bytes(*b"MCSH");
/// The offer version of an exporter that reads write intents and sends a write page.
pub const OFFER_VERSION: u32 = 3;
/// The offer version of an exporter that reads write intents and sends no write page (still
/// understood).
pub const OFFER_VERSION_NO_PAGE: u32 = 2;
/// The offer version of an exporter that reads none (still understood).
pub const OFFER_VERSION_NO_INTENTS: u32 = 1;
/// Write page message magic, the bytes `MCSP` on the wire.
pub const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"MCSP");
/// Write intent magic, the bytes `MCSW` on the wire.
pub const INTENT_MAGIC: u32 = u32::from_le_bytes(*b"MCSW");
/// Encoded size of a write intent's fixed part (its record follows).
pub const INTENT_HEADER_BYTES: usize = 16;
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
        guards: Guards::IntentsAndPage,
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
}

impl Guards {
    /// The importer announces each copy with a write intent.
    pub fn intents(self) -> bool {
        self != Guards::None
    }

    /// A write page follows the offer.
    pub fn page(self) -> bool {
        self == Guards::IntentsAndPage
    }

    fn version(self) -> u32 {
        match self {
            Guards::None => OFFER_VERSION_NO_INTENTS,
            Guards::Intents => OFFER_VERSION_NO_PAGE,
            Guards::IntentsAndPage => OFFER_VERSION,
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
            OFFER_VERSION => Guards::IntentsAndPage,
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

/// A write intent: an importer is about to copy the bytes of the put of `key` at `version`
/// into `[addr, addr + len)` of the exporter's segment (its whole object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Intent {
    pub addr: u64,
    pub len: u64,
    pub key: String,
    pub version: Version,
}

impl Intent {
    pub fn encode(&self) -> Vec<u8> {
        let record = CatalogRecord::intent(self.len, &self.key, self.version).encode();
        let mut b = Vec::with_capacity(INTENT_HEADER_BYTES + record.len());
        b.extend_from_slice(&INTENT_MAGIC.to_le_bytes());
        b.extend_from_slice(&(record.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.addr.to_le_bytes());
        b.extend_from_slice(&record);
        b
    }

    /// The whole length of the intent whose fixed part is `header`; errors say what was
    /// wrong. Never panics.
    pub fn frame_len(header: &[u8]) -> Result<usize, &'static str> {
        if header.len() < INTENT_HEADER_BYTES {
            return Err("intent header is short");
        }
        if le_u32(header, 0) != INTENT_MAGIC {
            return Err("bad intent magic");
        }
        let record = le_u32(header, 4) as u64;
        if record == 0 || record > CATALOG_RECORD_MAX_BYTES {
            return Err("intent record length out of bounds");
        }
        Ok(INTENT_HEADER_BYTES + record as usize)
    }

    /// Decodes one whole intent; errors say what was wrong. Never panics.
    pub fn decode(b: &[u8]) -> Result<Intent, &'static str> {
        if Intent::frame_len(b)? != b.len() {
            return Err("intent length is not its header's");
        }
        let rec = CatalogRecord::decode(&b[INTENT_HEADER_BYTES..])
            .map_err(|_| "intent record does not decode")?;
        if rec.kind != RecordKind::Intent {
            return Err("record is not an intent");
        }
        let i = Intent {
            addr: le_u64(b, 8),
            len: rec.len,
            key: rec.key.to_string(),
            version: rec.version,
        };
        if i.addr.checked_add(i.len).is_none() {
            return Err("intent range wraps");
        }
        Ok(i)
    }
}

/// One connected importer, and the part of an intent read from it so far.
struct Importer {
    conn: UnixStream,
    partial: Vec<u8>,
    /// The whole length of the intent in `partial`, once its fixed part is in; 0 before.
    need: usize,
    /// Its end closed, or it sent bytes that are not intents: dropped by the export thread.
    closed: bool,
    /// Its write page, also watched by the fence (which forgets it once this is dropped and
    /// no copy is under way).
    _page: Option<Arc<WritePage>>,
}

impl Importer {
    fn new(conn: UnixStream, page: Option<Arc<WritePage>>) -> Importer {
        Importer {
            conn,
            partial: Vec::new(),
            need: 0,
            closed: false,
            _page: page,
        }
    }

    /// Reads whatever the importer sent so far (never blocks) and applies each whole intent
    /// to `catalog`. Marks the importer closed at its end of file, on an error, or on bytes
    /// that do not decode (its framing is lost; it sees the close and uses TCP).
    fn drain(&mut self, catalog: &Catalog) {
        let mut chunk = [0u8; 4096];
        while !self.closed {
            let fd = self.conn.as_raw_fd();
            let n = match rawio::recv(fd, &mut Dst::from(&mut chunk[..]), libc::MSG_DONTWAIT) {
                Ok(n) if n > 0 => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // End of file, or an error.
                _ => {
                    self.closed = true;
                    continue;
                }
            };
            let mut got = &chunk[..n];
            while !got.is_empty() && !self.closed {
                let want = if self.need == 0 {
                    INTENT_HEADER_BYTES
                } else {
                    self.need
                };
                let take = (want - self.partial.len()).min(got.len());
                self.partial.extend_from_slice(&got[..take]);
                got = &got[take..];
                if self.partial.len() < want {
                    continue;
                }
                let step = if self.need == 0 {
                    Intent::frame_len(&self.partial).map(|n| self.need = n)
                } else {
                    Intent::decode(&self.partial).map(|i| {
                        catalog.overwrite(i.addr, i.len, &i.key, i.version);
                        self.partial.clear();
                        self.need = 0;
                    })
                };
                if let Err(why) = step {
                    tracing::warn!("same-host importer dropped: {why}");
                    self.closed = true;
                }
            }
        }
    }
}

/// The importers of one export; their intents are applied by the export thread as they come
/// and by the catalog before every snapshot ([`PendingWrites`]).
#[derive(Default)]
struct Importers {
    list: Mutex<Vec<Importer>>,
}

impl Importers {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Importer>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl PendingWrites for Importers {
    fn apply_pending(&self, catalog: &Catalog) {
        for i in self.lock().iter_mut() {
            i.drain(catalog);
        }
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
    /// intents go to its catalog and their copies are fenced by its fence, each importer
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
            Some(_) => Guards::IntentsAndPage,
            None => Guards::None,
        };
        let importers = Arc::new(Importers::default());
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

/// Accepts importers and sends them the offer; with `memory`, also waits on every importer's
/// socket and applies the intents it reads to the catalog (the catalog drains them too, before
/// each snapshot). Only this thread adds or removes importers, so the descriptors it polls
/// stay open while it polls them.
fn export_loop(
    listener: UnixListener,
    fd: OwnedFd,
    offer: Offer,
    importers: Arc<Importers>,
    memory: Option<Arc<ServedMemory>>,
    stop: Arc<AtomicBool>,
) {
    let mut pfds: Vec<libc::pollfd> = Vec::new();
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
        // SAFETY: `pfds` holds `pfds.len()` valid pollfds for the duration of the call.
        let n = unsafe {
            libc::poll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
                ACCEPT_POLL_MS,
            )
        };
        if n <= 0 {
            continue;
        }
        if let Some(m) = &memory {
            if pfds[1..].iter().any(|p| p.revents != 0) {
                importers.apply_pending(m.catalog());
                importers.lock().retain(|i| !i.closed);
                // Intents may wait (they are applied before any snapshot anyway): gather
                // those of a busy stretch into one wake-up instead of one per put.
                std::thread::sleep(INTENT_GATHER);
            }
        }
        if pfds[0].revents == 0 {
            continue;
        }
        let Ok((conn, _)) = listener.accept() else {
            continue;
        };
        let mut list = importers.lock();
        if memory.is_none() {
            list.retain(|i| peer_alive(i.conn.as_raw_fd()));
        }
        let Some(cred) = peer_cred(&conn).filter(trusted) else {
            continue; // dropped: the importer sees EOF instead of an offer and uses TCP
        };
        if list.len() >= IMPORTERS_MAX {
            continue;
        }
        // The page is fenced (the current term on it) before the importer can map it.
        let page = match &memory {
            None => None,
            Some(m) => match WritePage::shared() {
                Ok((mut page, page_fd)) => {
                    page.watch_writer(cred.pid);
                    let page = Arc::new(page);
                    m.catalog().fences().watch(page.clone());
                    Some((page, page_fd))
                }
                Err(e) => {
                    tracing::warn!("no write page for a same-host importer ({e}): over TCP");
                    continue;
                }
            },
        };
        let sent = send_with_fd(&conn, &offer.encode(), fd.as_raw_fd()).is_ok()
            && page.as_ref().is_none_or(|(_, page_fd)| {
                send_with_fd(&conn, &page_message(), page_fd.as_raw_fd()).is_ok()
            });
        if sent {
            list.push(Importer::new(conn, page.map(|(p, _)| p)));
        }
    }
}

/// The message that carries an importer's write page.
fn page_message() -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&(WRITE_PAGE_BYTES as u32).to_le_bytes());
    b
}

/// True when the process at the other end of `conn` runs as this process's user or as root:
/// the only peers a local socket that hands out memory may serve (`SO_PEERCRED`), and the
/// only exporters an importer maps.
pub fn peer_is_trusted(conn: &UnixStream) -> bool {
    peer_cred(conn).as_ref().is_some_and(trusted)
}

fn trusted(cred: &libc::ucred) -> bool {
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    cred.uid == me || cred.uid == 0
}

fn peer_cred(conn: &UnixStream) -> Option<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred)
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
    match peer_cred(conn) {
        Some(cred) if trusted(&cred) => Ok(()),
        Some(cred) => Err(refuse_exporter(
            endpoint,
            format!(
                "its exporter, pid {}, runs as uid {}: neither ours ({}) nor root's",
                cred.pid,
                cred.uid,
                // SAFETY: getuid has no preconditions.
                unsafe { libc::getuid() }
            ),
        )),
        None => Err(refuse_exporter(
            endpoint,
            "its exporter's credentials cannot be read".into(),
        )),
    }
}

/// False once the peer closed its end (a peek returns 0 bytes or an error other than "no
/// data yet").
fn peer_alive(fd: RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: one writable byte; MSG_PEEK|MSG_DONTWAIT never blocks nor consumes.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if n > 0 {
        return true;
    }
    n < 0
        && matches!(
            io::Error::last_os_error().kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        )
}

const CMSG_SPACE_ONE_FD: usize = 24; // CMSG_SPACE(sizeof(int)) on 64-bit Linux

#[repr(C)]
union CmsgBuf {
    _align: libc::cmsghdr,
    bytes: [u8; CMSG_SPACE_ONE_FD],
}

impl Default for CmsgBuf {
    fn default() -> Self {
        CmsgBuf {
            bytes: [0u8; CMSG_SPACE_ONE_FD],
        }
    }
}

/// A message header over one buffer (`iov`) with room for one descriptor (`cbuf`); both must
/// outlive every use of the header.
fn one_fd_msghdr(iov: &mut libc::iovec, cbuf: &mut CmsgBuf) -> libc::msghdr {
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    // SAFETY: taking the address of a union field of our own buffer.
    msg.msg_control = unsafe { cbuf.bytes.as_mut_ptr() }.cast();
    msg.msg_controllen = CMSG_SPACE_ONE_FD as _;
    msg
}

fn send_with_fd(conn: &UnixStream, bytes: &[u8], fd: RawFd) -> io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut cbuf = CmsgBuf::default();
    let msg = one_fd_msghdr(&mut iov, &mut cbuf);
    // SAFETY: msg_control points at a buffer of msg_controllen bytes, so the first header
    // and its data (one int) lie inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
    }
    // SAFETY: msg is fully initialised above.
    let n = unsafe { libc::sendmsg(conn.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n as usize != bytes.len() {
        return Err(io::Error::last_os_error());
    }
    Ok(())
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
    let addr = SocketAddr::from_abstract_name(socket_name(endpoint).as_bytes())?;
    match UnixStream::connect_addr(&addr) {
        Ok(c) => Ok(Some(c)),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
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

/// Receives the write page that follows a version 3 offer, and maps it.
fn recv_page(conn: &UnixStream) -> io::Result<WritePage> {
    let mut bytes = [0u8; 8];
    let (n, fd) = recv_with_fd(conn, &mut bytes)?;
    if n != 8 || bytes != page_message() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad write page message",
        ));
    }
    WritePage::map(&fd)
}

/// Receives one message into `bytes` and the one descriptor it must carry; returns the
/// message's length.
fn recv_with_fd(conn: &UnixStream, bytes: &mut [u8]) -> io::Result<(usize, OwnedFd)> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_mut_ptr().cast(),
        iov_len: bytes.len(),
    };
    let mut cbuf = CmsgBuf::default();
    let mut msg = one_fd_msghdr(&mut iov, &mut cbuf);
    let n = loop {
        // SAFETY: msg describes buffers we own; MSG_CMSG_CLOEXEC marks a received fd
        // close-on-exec.
        let n = unsafe { libc::recvmsg(conn.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // Take ownership of any descriptor first, so that an error below still closes it.
    let mut fd = None;
    // SAFETY: the kernel filled msg_control/msg_controllen; CMSG_FIRSTHDR/NXTHDR stay inside.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                if raw >= 0 && fd.is_none() {
                    fd = Some(OwnedFd::from_raw_fd(raw));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message carried too many fds",
        ));
    }
    let fd =
        fd.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "message without an fd"))?;
    Ok((n as usize, fd))
}

/// A same-host segment mapped into this process.
#[derive(Debug)]
pub struct ShmMapping {
    ptr: NonNull<u8>,
    offer: Offer,
    /// Backed by hugetlb pages (the memfd's block size is larger than a page).
    hugetlb: bool,
    /// Open while the exporter lives; carries our write intents.
    conn: UnixStream,
    /// Keeps each intent whole on `conn` when several threads write through this mapping.
    sending: Mutex<()>,
    /// The exporter's write page for our copies (an exporter of offer version 3).
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
            check_sealed(fd.as_fd())?;
            Ok((offer, fd, writes))
        });
        let (offer, fd, writes) = match received {
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

    /// Starts a copy of the put of `key` at `version` into `[addr, addr + len)` of the
    /// exporter's segment: takes a slot of the exporter's write page (refused if the
    /// exporter's fence refuses the put's term: that master has ended), then sends the intent
    /// ([`ShmMapping::announce_write`]). Copy only while the returned claim is held. An
    /// exporter without a write page (offer version 2 or 1) fences nothing.
    pub fn begin_write(
        &self,
        addr: u64,
        len: u64,
        key: &str,
        version: Version,
    ) -> Result<WriteClaim<'_>, WriteRefused> {
        let claim = match &self.writes {
            Some(page) => page.begin(version.term).map_err(|r| match r {
                Refused::Fenced { fence } => WriteRefused::Fenced { fence },
                Refused::Full => {
                    WriteRefused::Unavailable(io::Error::other("every write slot is held"))
                }
            })?,
            None => WriteClaim::unfenced(),
        };
        self.announce_write(addr, len, key, version)
            .map_err(WriteRefused::Unavailable)?;
        Ok(claim)
    }

    /// Tells the exporter, before the first byte is copied, that the put of `key` at `version`
    /// is about to write its object, `[addr, addr + len)` (see the module docs); once this
    /// returns Ok the intent is in the exporter's socket. Nothing to do for an exporter that
    /// reads none. An error (the exporter gone, or not reading for [`INTENT_SEND_TIMEOUT`])
    /// means: do not memcpy.
    pub fn announce_write(
        &self,
        addr: u64,
        len: u64,
        key: &str,
        version: Version,
    ) -> io::Result<()> {
        if !self.offer.guards.intents() {
            return Ok(());
        }
        let bytes = Intent {
            addr,
            len,
            key: key.to_string(),
            version,
        }
        .encode();
        let _whole = self.sending.lock().unwrap_or_else(|e| e.into_inner());
        rawio::send_all(self.conn.as_raw_fd(), &bytes, false).inspect_err(|_| {
            // Maybe half an intent went: no later intent may follow it on this socket. The
            // exporter sees the close, and so does `exporter_alive`.
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
mod tests {
    use super::*;
    use crate::mem::{HugepagePolicy, Segment, SegmentKind, SegmentOptions};

    /// Offers `seg` as `endpoint` and maps it back: the export (held for the test), the
    /// importer's mapping and the offer.
    fn export_and_import(seg: &Segment, endpoint: &str) -> (ShmExport, ShmMapping, Offer) {
        let offer = Offer {
            base: seg.addr() as u64,
            len: seg.len() as u64,
            guards: Guards::None,
        };
        let fd = seg.shared_fd().expect("memfd-backed");
        let export = ShmExport::start(endpoint, fd, offer, None).unwrap();
        let m = ShmMapping::import(endpoint).unwrap().expect("same host");
        assert_eq!(m.offer(), offer);
        (export, m, offer)
    }

    /// A 1 MiB shared segment served with a catalog and exported as `test-<tag>-<pid>:1`: the
    /// segment, its memory, the endpoint and the export (held for the test).
    fn served_export(tag: &str) -> (Segment, Arc<ServedMemory>, String, ShmExport) {
        let opts = SegmentOptions {
            hugepages: HugepagePolicy::Never,
            prefault: false,
        };
        let seg = Segment::new_shared(1 << 20, opts).unwrap();
        let memory = ServedMemory::new();
        let endpoint = format!("test-{tag}-{}:1", std::process::id());
        let export = export_segment(&endpoint, &seg, &memory).expect("exported");
        (seg, memory, endpoint, export)
    }

    #[test]
    fn the_control_buffer_fits_one_descriptor() {
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        assert_eq!(space, CMSG_SPACE_ONE_FD);
    }

    #[test]
    fn offers_round_trip_and_bad_ones_are_refused() {
        let o = Offer {
            base: 0x7f00_0000_0000,
            len: 1 << 30,
            guards: Guards::IntentsAndPage,
        };
        assert_eq!(&o.encode()[4..8], &3u32.to_le_bytes());
        assert_eq!(Offer::decode(&o.encode()), Ok(o));
        let v2 = Offer {
            guards: Guards::Intents,
            ..o
        };
        assert_eq!(&v2.encode()[4..8], &2u32.to_le_bytes());
        assert_eq!(Offer::decode(&v2.encode()), Ok(v2));
        let v1 = Offer {
            guards: Guards::None,
            ..o
        };
        assert_eq!(&v1.encode()[4..8], &1u32.to_le_bytes());
        assert_eq!(Offer::decode(&v1.encode()), Ok(v1));
        let mut bad = o.encode();
        bad[0] ^= 1;
        assert!(Offer::decode(&bad).is_err());
        let mut bad = o.encode();
        bad[4] = 4;
        assert!(Offer::decode(&bad).is_err());
        assert!(Offer::decode(&o.encode()[..23]).is_err());
        let wraps = Offer {
            base: u64::MAX - 1,
            len: 4,
            guards: Guards::IntentsAndPage,
        };
        assert!(Offer::decode(&wraps.encode()).is_err());
        let empty = Offer {
            base: 1,
            len: 0,
            guards: Guards::IntentsAndPage,
        };
        assert!(Offer::decode(&empty.encode()).is_err());
    }

    #[test]
    fn intents_round_trip_and_bad_ones_are_refused() {
        let i = Intent {
            addr: 0x7f00_0000_1000,
            len: 4096,
            key: "k/1".into(),
            version: Version { term: 7, seq: 9 },
        };
        let b = i.encode();
        assert_eq!(b.len(), 16 + 16 + 16 + 3);
        assert_eq!(Intent::frame_len(&b[..16]), Ok(b.len()));
        assert_eq!(Intent::decode(&b), Ok(i.clone()));
        // Magic, record length, the record's flags (an object record is not an intent).
        for at in [0, 4, 24] {
            let mut bad = b.clone();
            bad[at] ^= 1;
            assert!(Intent::decode(&bad).is_err(), "byte {at}");
        }
        assert!(Intent::decode(&b[..b.len() - 1]).is_err());
        assert!(Intent::frame_len(&b[..15]).is_err());
        let mut huge = b.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Intent::frame_len(&huge).is_err());
        let empty = Intent {
            len: 0,
            ..i.clone()
        };
        assert!(Intent::decode(&empty.encode()).is_err());
        let wraps = Intent {
            addr: u64::MAX,
            len: 2,
            ..i
        };
        assert!(Intent::decode(&wraps.encode()).is_err());
    }

    /// An exporter serving a catalog reads its importers' intents: a snapshot right after an
    /// announcement no longer lists the older entry of another key the write goes over, but
    /// keeps the writer's own record (same version), its key's older entry in place (an
    /// upsert) and entries elsewhere; an importer that announces and dies has its intent
    /// applied too; bytes that are not intents close the importer.
    #[test]
    fn an_exporter_applies_its_importers_intents_before_a_snapshot() {
        let (seg, memory, endpoint, export) = served_export("intents");
        let base = seg.addr() as u64;
        let catalog = memory.catalog();
        let v = |term, seq| Version { term, seq };
        catalog.insert(base, 4096, "old", false, v(5, 1)).unwrap();
        catalog
            .insert(base + 8192, 4096, "far", false, v(5, 2))
            .unwrap();
        let keys = || -> Vec<String> { catalog.entries().into_iter().map(|e| e.key).collect() };

        let m = ShmMapping::import(&endpoint).unwrap().expect("same host");
        assert!(m.offer().guards.intents());
        m.announce_write(base, 4096, "new", v(6, 1)).unwrap();
        assert_eq!(keys(), ["far"], "the snapshot applied the intent first");
        // The writer's own record, whenever the intent is applied, stays; so does an
        // upsert's old value in place.
        catalog.insert(base, 4096, "new", false, v(6, 1)).unwrap();
        m.announce_write(base, 4096, "new", v(6, 1)).unwrap();
        m.announce_write(base, 4096, "new", v(6, 3)).unwrap();
        assert_eq!(keys(), ["new", "far"]);

        // Announced, then the writer is gone: applied by the export thread at its close.
        let dying = ShmMapping::import(&endpoint).unwrap().expect("same host");
        let long_key = "k".repeat(3000); // intents longer than a gathering read's chunk
        dying
            .announce_write(base + 8192, 100, &long_key, v(6, 2))
            .unwrap();
        drop(dying);
        let t0 = std::time::Instant::now();
        while catalog.len() != 1 {
            assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", keys());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(keys(), ["new"]);

        // Garbage: the exporter closes that importer, which then sees it gone.
        let rogue = ShmMapping::import(&endpoint).unwrap().expect("same host");
        // Bytes that are not an intent: the exporter must refuse to decode them.
        let junk = [0xffu8; INTENT_HEADER_BYTES];
        // SAFETY: `junk` is readable for its length.
        let sent =
            unsafe { libc::send(rogue.conn.as_raw_fd(), junk.as_ptr().cast(), junk.len(), 0) };
        assert_eq!(sent, INTENT_HEADER_BYTES as isize);
        let t0 = std::time::Instant::now();
        while rogue.exporter_alive() {
            assert!(t0.elapsed() < Duration::from_secs(5), "rogue importer kept");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(m.exporter_alive(), "the others stay");
        assert_eq!(keys(), ["new"]);
        drop(export);
    }

    #[test]
    fn an_importers_copies_are_fenced_by_the_exporters_term() {
        let (seg, memory, endpoint, export) = served_export("fenced");
        let base = seg.addr() as u64;
        let catalog = memory.catalog();
        let fence = catalog.fences();
        let v = |term, seq| Version { term, seq };
        catalog.fence(5);

        let m = ShmMapping::import(&endpoint).unwrap().expect("same host");
        assert!(m.offer().guards.page());
        assert_eq!(fence.watched(), 1);
        assert!(
            matches!(
                m.begin_write(base, 4096, "late", v(4, 1)),
                Err(WriteRefused::Fenced { fence: 5 })
            ),
            "the term fenced before the importer came is on its page"
        );
        assert_eq!(catalog.len(), 0, "a refused copy sends no intent");
        let under_way = m.begin_write(base, 4096, "slow", v(5, 1)).unwrap();

        // A new master (term 6): the fence refuses new copies of term 5 at once, and the
        // owner's wait before its re-mount lasts until the copy under way lets go.
        catalog.fence(6);
        assert!(matches!(
            m.begin_write(base + 4096, 4096, "slow2", v(5, 2)),
            Err(WriteRefused::Fenced { fence: 6 })
        ));
        let t0 = std::time::Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                drop(under_way);
            });
            assert_eq!(
                fence.wait_for_writes(
                    std::time::Instant::now() + crate::recovery::inflight::STALE_WRITES_WAIT
                ),
                (1, 0)
            );
        });
        assert!(
            t0.elapsed() >= Duration::from_millis(90),
            "it waited for the copy"
        );
        assert!(m.begin_write(base, 4096, "now", v(6, 1)).is_ok());

        // An importer gone, its copy ended: the fence forgets its page.
        drop(m);
        let t0 = std::time::Instant::now();
        loop {
            let next = ShmMapping::import(&endpoint).unwrap().expect("same host");
            if fence.watched() == 1 {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "{}", fence.watched());
            drop(next);
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(export);
    }

    #[test]
    fn an_importer_sees_the_exporters_bytes_and_its_departure() {
        let opts = SegmentOptions {
            hugepages: HugepagePolicy::Never,
            prefault: false,
        };
        let seg = Segment::new_shared(1 << 20, opts).unwrap();
        let endpoint = format!("test-{}:1", std::process::id());
        // SAFETY: inside our own segment; nobody else writes it in this test.
        unsafe { seg.as_ptr().add(4096).write_bytes(0xab, 100) };
        let (export, m, offer) = export_and_import(&seg, &endpoint);
        assert!(!m.hugetlb());
        // The page the exporter wrote is resident in our mapping before we touch it (the
        // memfd's page cache); one nobody wrote is not (`paths::copy::write_parts` relies on
        // both).
        let page = |at: u64| {
            // SAFETY: inside the mapping (translate checks), no reference formed over it.
            unsafe { crate::mem::Dst::from_raw(m.translate(offer.base + at, 4096).unwrap(), 4096) }
        };
        assert!(page(4096).resident());
        assert!(!page(16 * 4096).resident());
        let p = m.translate(offer.base + 4096, 100).unwrap();
        // SAFETY: translate checked the range lies in our mapping.
        let got = unsafe { std::slice::from_raw_parts(p, 100) };
        assert!(got.iter().all(|&b| b == 0xab));
        assert!(m.translate(offer.base + offer.len - 1, 2).is_none());
        assert!(m.translate(offer.base - 1, 1).is_none());
        assert!(m.exporter_alive());
        drop(export);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!m.exporter_alive(), "the importer sees the exporter go");
        assert!(
            ShmMapping::import(&endpoint).unwrap().is_none(),
            "nothing exported any more"
        );
        assert!(ShmMapping::import("no-such-endpoint:9").unwrap().is_none());
    }

    #[test]
    fn mapping_ahead_maps_an_exporters_pages_sixteen_at_a_time() {
        fn minor_faults() -> i64 {
            // SAFETY: getrusage into a zeroed struct of our own.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: as above; RUSAGE_THREAD counts this thread only.
            assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
            u.ru_minflt
        }
        const LEN: usize = 4 << 20;
        let opts = SegmentOptions {
            hugepages: HugepagePolicy::Never,
            prefault: true,
        };
        let seg = Segment::new_shared(LEN, opts).unwrap();
        let endpoint = format!("test-ahead-{}:1", std::process::id());
        let (_export, m, offer) = export_and_import(&seg, &endpoint);
        // SAFETY: inside the mapping (translate checks), no reference formed over it.
        let mut d =
            unsafe { crate::mem::Dst::from_raw(m.translate(offer.base, LEN as u64).unwrap(), LEN) };
        assert!(d.resident(), "the exporter prefaulted every page");
        let data = vec![5u8; LEN]; // faulted in here, not counted below
        let f0 = minor_faults();
        d.map_ahead();
        let f1 = minor_faults();
        let ahead = f1 - f0;
        // The windows the range touches: one more than LEN / 64 KiB when the mapping does not
        // start on a window boundary (mmap aligns it to a page only).
        let w = crate::sys::bytes::FAULT_AROUND_BYTES as u64;
        let start = d.addr();
        let windows = ((start + LEN as u64 - 1) / w - start / w + 1) as i64;
        assert!(
            ahead <= windows,
            "{ahead} faults mapping {windows} windows ahead"
        );
        // Writing every page now takes (almost) no fault: the pages were mapped writable.
        // Unmapped, each of the 1 024 pages would take a write fault (write faults on a shared
        // mapping get no fault-around). A few stray ones come when the machine is busy (seen
        // 16 under a loaded CI run, on the code before and after intents alike), so the bound
        // is an eighth of the pages: far from what the pages would take unmapped.
        crate::mem::Src::from(&data[..]).stream_to(&mut d);
        let after = minor_faults() - f1;
        let pages = (LEN / crate::mem::segment::base_page_bytes()) as i64;
        assert!(
            after < pages / 8,
            "{after} faults writing the {pages} pages mapped ahead"
        );
        // SAFETY: inside our own segment; the importer's writes above are complete.
        let seen = unsafe { std::slice::from_raw_parts(seg.as_ptr(), LEN) };
        assert!(seen.iter().all(|&b| b == 5));
    }

    #[test]
    fn an_importer_knows_a_hugetlb_segment() {
        let opts = SegmentOptions {
            hugepages: HugepagePolicy::Prefer,
            prefault: true,
        };
        let seg = Segment::new_shared(4 << 20, opts).unwrap();
        if seg.kind() != SegmentKind::HugeTlb {
            eprintln!("no free hugetlb pages (vm.nr_hugepages): only the plain case checked");
            return;
        }
        let endpoint = format!("test-huge-{}:1", std::process::id());
        let (_export, m, offer) = export_and_import(&seg, &endpoint);
        assert!(m.hugetlb());
        // Prefaulted by the exporter, yet not resident here until we touch it.
        // SAFETY: inside the mapping (translate checks), no reference formed over it.
        let d = unsafe { crate::mem::Dst::from_raw(m.translate(offer.base, 4096).unwrap(), 4096) };
        assert!(!d.resident());
    }

    /// A memfd of `len` bytes, sealed at its size as a segment's is, or not sealed at all.
    fn memfd(len: usize, sealed: bool) -> OwnedFd {
        if sealed {
            return crate::sys::mmap::sized_memfd(c"mc-test", len, false).unwrap();
        }
        // SAFETY: a valid NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(c"mc-test-unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0, "{}", io::Error::last_os_error());
        // SAFETY: a descriptor just returned to us.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: our own descriptor.
        let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
        assert_eq!(rc, 0);
        fd
    }

    /// Binds `endpoint`'s name and serves one importer as an exporter would, but with the
    /// descriptors given: `offer` with `segment` attached, then (with `page`) the write page
    /// message with `page` attached; then holds the connection until the importer closes it.
    fn raw_exporter(
        endpoint: &str,
        offer: Offer,
        segment: OwnedFd,
        page: Option<OwnedFd>,
    ) -> JoinHandle<()> {
        let addr = SocketAddr::from_abstract_name(socket_name(endpoint).as_bytes()).unwrap();
        let listener = UnixListener::bind_addr(&addr).unwrap();
        std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            // Errors are the importer's to see: it may close before the page goes.
            let _ = send_with_fd(&conn, &offer.encode(), segment.as_raw_fd());
            if let Some(page) = page {
                let _ = send_with_fd(&conn, &page_message(), page.as_raw_fd());
            }
            let mut byte = [0u8; 1];
            let _ = rawio::recv(conn.as_raw_fd(), &mut Dst::from(&mut byte[..]), 0);
        })
    }

    /// An exporter will not offer a memfd its holders could shrink, and an importer maps
    /// neither a segment memfd nor a write page that lacks the seals; with both sealed the
    /// same exporter is mapped.
    #[test]
    fn memfds_without_size_seals_are_neither_offered_nor_mapped() {
        let endpoint = format!("test-unsealed-{}:1", std::process::id());
        let offer = Offer {
            base: 1 << 30,
            len: 1 << 20,
            guards: Guards::None,
        };
        let unsealed = memfd(1 << 20, false);
        let e = ShmExport::start(&endpoint, unsealed.as_fd(), offer, None)
            .err()
            .expect("an unsealed memfd was offered");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");

        let refused = exporters_refused();
        let t = raw_exporter(&endpoint, offer, unsealed, None);
        let e = ShmMapping::import(&endpoint).expect_err("an unsealed segment was mapped");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("not sealed"), "{e}");
        t.join().unwrap();

        let paged = Offer {
            guards: Guards::IntentsAndPage,
            ..offer
        };
        let page = memfd(WRITE_PAGE_BYTES, false);
        let t = raw_exporter(&endpoint, paged, memfd(1 << 20, true), Some(page));
        let e = ShmMapping::import(&endpoint).expect_err("an unsealed write page was mapped");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("write page"), "{e}");
        t.join().unwrap();
        assert!(exporters_refused() >= refused + 2);

        let page = memfd(WRITE_PAGE_BYTES, true);
        let t = raw_exporter(&endpoint, paged, memfd(1 << 20, true), Some(page));
        let m = ShmMapping::import(&endpoint)
            .unwrap()
            .expect("sealed: mapped");
        assert_eq!(m.offer(), paged);
        drop(m);
        t.join().unwrap();
    }

    /// Nobody holding an exported segment's memfd or a write page, its exporter included,
    /// can shrink or grow it, nor add a seal.
    #[test]
    fn an_exported_memfd_cannot_be_resized() {
        let (seg, _memory, endpoint, _export) = served_export("sealed");
        let m = ShmMapping::import(&endpoint).unwrap().expect("same host");
        let (_page, page_fd) = WritePage::shared().unwrap();
        let fds = [seg.shared_fd().expect("memfd-backed"), page_fd.as_fd()];
        for fd in fds {
            let len = crate::sys::mmap::fstat(fd).unwrap().st_size;
            for size in [0, len / 2, len + 1, 2 * len] {
                // SAFETY: ftruncate on a descriptor we hold; refused, as asserted.
                let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), size) };
                let e = io::Error::last_os_error();
                assert_eq!((rc, e.raw_os_error()), (-1, Some(libc::EPERM)), "to {size}");
            }
            // A future-write seal would stop the next importer from mapping it writable (a
            // write seal fails anyway while a writable mapping exists).
            // SAFETY: fcntl on a descriptor we hold; refused, as asserted.
            let rc = unsafe {
                libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_FUTURE_WRITE)
            };
            let e = io::Error::last_os_error();
            assert_eq!(
                (rc, e.raw_os_error()),
                (-1, Some(libc::EPERM)),
                "a seal added"
            );
        }
        assert!(m.exporter_alive());
    }

    /// A process of another user (uid and gid 65534) listening on an endpoint's name, as a
    /// local user who bound a node's name first would, offering a sealed memfd named
    /// `mc-stranger` to the importer that connects. Killed and reaped on drop.
    struct Stranger(libc::pid_t);

    const NOBODY: libc::uid_t = 65534;

    impl Stranger {
        /// Forks the stranger and waits until it listens.
        fn start(endpoint: &str) -> Stranger {
            let name = socket_name(endpoint);
            // SAFETY: sockaddr_un is plain data; all-zero is valid.
            let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            assert!(name.len() < addr.sun_path.len());
            for (d, b) in addr.sun_path[1..].iter_mut().zip(name.bytes()) {
                *d = b as libc::c_char;
            }
            let addr_len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
            let offer = Offer {
                base: 1 << 30,
                len: 1 << 20,
                guards: Guards::None,
            }
            .encode();
            let mut ready = [-1 as RawFd; 2];
            // SAFETY: `ready` has room for the two descriptors.
            let rc = unsafe { libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) };
            assert_eq!(rc, 0);
            // SAFETY: the child runs `stranger_child` only, which makes system calls only.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
            if pid == 0 {
                // SAFETY: we are the child just forked; the arguments were made before.
                unsafe { stranger_child(ready[1], &addr, addr_len as libc::socklen_t, &offer) }
            }
            let stranger = Stranger(pid); // reaped even if the checks below fail
            let mut byte = 0u8;
            // SAFETY: our pipe's ends; one writable byte.
            let n = unsafe {
                libc::close(ready[1]);
                let n = libc::read(ready[0], (&mut byte as *mut u8).cast(), 1);
                libc::close(ready[0]);
                n
            };
            assert_eq!(n, 1, "the stranger did not get to listen");
            stranger
        }
    }

    impl Drop for Stranger {
        fn drop(&mut self) {
            let mut status = 0;
            // SAFETY: our own child; reaping it.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
                libc::waitpid(self.0, &mut status, 0);
            }
        }
    }

    /// The stranger's life: become `NOBODY`, listen on `addr`, say so on `ready`, offer a
    /// sealed memfd to the first importer and wait for it to close. Exits with a status
    /// naming the step that failed; killed after 10 s at the latest.
    ///
    /// # Safety
    ///
    /// Only in a child just forked from this (multi-threaded) test process: it makes system
    /// calls only, no allocation and no lock, since the fork copied the other threads' locks
    /// in whatever state they were.
    unsafe fn stranger_child(
        ready: RawFd,
        addr: &libc::sockaddr_un,
        addr_len: libc::socklen_t,
        offer: &[u8; OFFER_BYTES],
    ) -> ! {
        // SAFETY: system calls on our own descriptors and buffers (see the function's doc).
        unsafe {
            libc::alarm(10);
            // Keep only stdio and `ready` (as 3): the other tests' descriptors stay theirs.
            if libc::dup2(ready, 3) != 3 {
                libc::_exit(2);
            }
            libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setgid, NOBODY) != 0
                || libc::syscall(libc::SYS_setuid, NOBODY) != 0
            {
                libc::_exit(3);
            }
            let sock = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let sa = (addr as *const libc::sockaddr_un).cast::<libc::sockaddr>();
            if sock < 0 || libc::bind(sock, sa, addr_len) != 0 || libc::listen(sock, 4) != 0 {
                libc::_exit(4);
            }
            let memfd = libc::memfd_create(c"mc-stranger".as_ptr(), libc::MFD_ALLOW_SEALING);
            if memfd < 0
                || libc::ftruncate(memfd, 1 << 20) != 0
                || libc::fcntl(memfd, libc::F_ADD_SEALS, crate::sys::mmap::SIZE_SEALS) != 0
            {
                libc::_exit(5);
            }
            if libc::write(3, b"r".as_ptr().cast(), 1) != 1 {
                libc::_exit(6);
            }
            let conn = libc::accept(sock, std::ptr::null_mut(), std::ptr::null_mut());
            if conn < 0 {
                libc::_exit(7);
            }
            let conn = UnixStream::from_raw_fd(conn);
            let _ = send_with_fd(&conn, offer, memfd);
            let mut byte = 0u8;
            libc::read(conn.as_raw_fd(), (&mut byte as *mut u8).cast(), 1);
            libc::_exit(0)
        }
    }

    /// Another user's process that took a node's name first is refused before a byte of its
    /// offer is read: the import fails naming its uid, is counted, and its memfd is never
    /// mapped. (The seals are in order: only the uid is wrong.)
    #[test]
    fn an_exporter_of_another_user_is_refused() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: no process of another user to start; not checked");
            return;
        }
        let endpoint = format!("test-stranger-{}:1", std::process::id());
        let stranger = Stranger::start(&endpoint);
        let refused = exporters_refused();
        let e = ShmMapping::import(&endpoint).expect_err("another user's memfd was mapped");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("uid 65534"), "{e}");
        assert!(exporters_refused() > refused);
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        assert!(
            !maps.contains("mc-stranger"),
            "the stranger's memfd is mapped"
        );
        drop(stranger);
    }
}
