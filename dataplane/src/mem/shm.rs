//! Same-host shared segments: a process serving a shared [`Segment`] offers its memfd to other
//! processes on the host, which map the same pages and move object bytes with memcpy instead
//! of through loopback TCP.
//!
//! ```text
//! exporter (storage node shard, store client)          importer (store client on the same host)
//! listen on abstract unix socket                        connect("\0mooncake-shm/<te_endpoint>")
//!   "\0mooncake-shm/<te_endpoint>"                        (refused: not on this host / no export)
//! accept; check SO_PEERCRED: same uid, or root
//! send the offer, the memfd attached (SCM_RIGHTS) ───▶  mmap(memfd, MAP_SHARED) read+write
//! keep the connection open                              a read of 0 bytes = the exporter is gone:
//!                                                         drop the mapping
//!
//! Offer (24 bytes, little-endian)
//!  0               4               8                               16                              24
//!  | magic "MCSH"  | version = 1   | base (u64): the exporter's address of the segment | len (u64) |
//! ```
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
//! memory anyway. `docs/security.md` has the threat model.
//!
//! Invariants: an importer touches only `[base, base + len)` of the exporter's address space,
//! translated into its own mapping ([`ShmMapping::translate`] checks every range); decoding an
//! offer never panics on any bytes (fuzzed by `fuzz/fuzz_targets/shm_offer.rs`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Offer magic, the bytes `MCSH` on the wire.
pub const OFFER_MAGIC: u32 = u32::from_le_bytes(*b"MCSH");
/// The only offer version spoken.
pub const OFFER_VERSION: u32 = 1;
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

/// Offers `segment` to same-host importers under `endpoint`, if it is shared; `None` (with
/// the reason logged) when it is private or the name cannot be bound.
pub fn export_segment(endpoint: &str, segment: &crate::mem::Segment) -> Option<ShmExport> {
    let fd = segment.shared_fd()?;
    let offer = Offer {
        base: segment.addr() as u64,
        len: segment.len() as u64,
    };
    match ShmExport::start(endpoint, fd, offer) {
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

/// An offer: where the segment lives in the exporter's address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offer {
    pub base: u64,
    pub len: u64,
}

impl Offer {
    pub fn encode(&self) -> [u8; OFFER_BYTES] {
        let mut b = [0u8; OFFER_BYTES];
        b[0..4].copy_from_slice(&OFFER_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&OFFER_VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.base.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes an offer; errors say what was wrong. Never panics.
    pub fn decode(b: &[u8]) -> Result<Offer, &'static str> {
        if b.len() != OFFER_BYTES {
            return Err("offer is not 24 bytes");
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u32_at(0) != OFFER_MAGIC {
            return Err("bad offer magic");
        }
        if u32_at(4) != OFFER_VERSION {
            return Err("unknown offer version");
        }
        let offer = Offer {
            base: u64_at(8),
            len: u64_at(16),
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
    /// `offer.base` in this process, `offer.len` bytes). Fails if the name is taken.
    pub fn start(endpoint: &str, fd: BorrowedFd<'_>, offer: Offer) -> io::Result<ShmExport> {
        let addr = SocketAddr::from_abstract_name(socket_name(endpoint).as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        let fd = fd.try_clone_to_owned()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mc-shm-export".into())
            .spawn(move || export_loop(listener, fd, offer, flag))?;
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

fn export_loop(listener: UnixListener, fd: OwnedFd, offer: Offer, stop: Arc<AtomicBool>) {
    let mut importers: Vec<UnixStream> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) };
        if n <= 0 {
            continue;
        }
        let Ok((conn, _)) = listener.accept() else {
            continue;
        };
        importers.retain(|c| peer_alive(c.as_raw_fd()));
        if !peer_is_trusted(&conn) || importers.len() >= IMPORTERS_MAX {
            continue; // dropped: the importer sees EOF instead of an offer and uses TCP
        }
        if send_with_fd(&conn, &offer.encode(), fd.as_raw_fd()).is_ok() {
            importers.push(conn);
        }
    }
}

/// True when the process at the other end of `conn` runs as this process's user or as root:
/// the only peers a local socket that hands out memory may serve (`SO_PEERCRED`).
pub fn peer_is_trusted(conn: &UnixStream) -> bool {
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    peer_uid(conn).is_some_and(|uid| uid == me || uid == 0)
}

fn peer_uid(conn: &UnixStream) -> Option<u32> {
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
    (rc == 0).then_some(cred.uid)
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
            "offer carried too many fds",
        ));
    }
    let offer = Offer::decode(&bytes[..n as usize])
        .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
    let fd = fd.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "offer without an fd"))?;
    Ok((offer, fd))
}

/// A same-host segment mapped into this process.
#[derive(Debug)]
pub struct ShmMapping {
    ptr: NonNull<u8>,
    offer: Offer,
    /// Backed by hugetlb pages (the memfd's block size is larger than a page).
    hugetlb: bool,
    /// Open while the exporter lives.
    conn: UnixStream,
}

// SAFETY: the mapping is owned by this value and reached only through raw pointers handed out
// by `translate`; sharing or sending the value creates no reference into it.
unsafe impl Send for ShmMapping {}
// SAFETY: see `Send`.
unsafe impl Sync for ShmMapping {}

impl ShmMapping {
    /// Maps the segment exported for `endpoint` on this host: `Ok(None)` when nothing there
    /// exports it (a remote endpoint, or an exporter that refused us).
    pub fn import(endpoint: &str) -> io::Result<Option<ShmMapping>> {
        let addr = SocketAddr::from_abstract_name(socket_name(endpoint).as_bytes())?;
        let conn = match UnixStream::connect_addr(&addr) {
            Ok(c) => c,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        conn.set_read_timeout(Some(OFFER_TIMEOUT))?;
        let (offer, fd) = match recv_offer(&conn) {
            Ok(x) => x,
            // Refused (EOF, no fd): not ours to map.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(None),
            Err(e) => return Err(e),
        };
        let len = usize::try_from(offer.len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "offer too large"))?;
        // SAFETY: fstat into a zeroed stat buffer of our own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is an open descriptor we own and `st` is a live stat buffer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        if (st.st_size as u64) < offer.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "offered memfd is smaller than the segment",
            ));
        }
        let hugetlb = st.st_blksize as u64 > crate::mem::segment::base_page_bytes() as u64;
        let ptr = crate::mem::segment::mmap_shared(fd.as_fd(), len)?;
        drop(fd); // the mapping keeps the memory
        Ok(Some(ShmMapping {
            ptr,
            offer,
            hugetlb,
            conn,
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
        };
        let fd = seg.shared_fd().expect("memfd-backed");
        let export = ShmExport::start(endpoint, fd, offer).unwrap();
        let m = ShmMapping::import(endpoint).unwrap().expect("same host");
        assert_eq!(m.offer(), offer);
        (export, m, offer)
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
        };
        assert_eq!(Offer::decode(&o.encode()), Ok(o));
        let mut bad = o.encode();
        bad[0] ^= 1;
        assert!(Offer::decode(&bad).is_err());
        let mut bad = o.encode();
        bad[4] = 2;
        assert!(Offer::decode(&bad).is_err());
        assert!(Offer::decode(&o.encode()[..23]).is_err());
        let wraps = Offer {
            base: u64::MAX - 1,
            len: 4,
        };
        assert!(Offer::decode(&wraps.encode()).is_err());
        let empty = Offer { base: 1, len: 0 };
        assert!(Offer::decode(&empty.encode()).is_err());
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
        // memfd's page cache); one nobody wrote is not (`peers::write_parts` relies on both).
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
        let w = crate::mem::bytes::FAULT_AROUND_BYTES as u64;
        let start = d.addr();
        let windows = ((start + LEN as u64 - 1) / w - start / w + 1) as i64;
        assert!(
            ahead <= windows,
            "{ahead} faults mapping {windows} windows ahead"
        );
        // Writing every page now takes (almost) no fault: the pages were mapped writable.
        // Unmapped, each of the 1 024 pages would take a write fault (write faults on a shared
        // mapping get no fault-around). A few stray ones come when the machine is busy (seen
        // 16 under a loaded CI run, and about one run in ten under CPU and memory load), so the bound
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
}
