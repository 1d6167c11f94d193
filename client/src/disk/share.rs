//! Same-host readers of an owner's disk: the owner hands its tier's directory to readers on
//! its host, which then read an object's file themselves instead of asking the listener.
//!
//! Why: a reader in another process that goes through the listener gets the bytes twice
//! moved, once from the disk into the listener's buffer and once more through loopback TCP
//! (about 1 ms per 4 MiB on this project's VM, beside 3 ms for the disk itself), and with the
//! whole object in flight little of the send overlaps the read (`bench/README.md`, "The disk
//! tier"). A reader with the directory reads the file into its own memory at the rate the
//! owner reads its own disk.
//!
//! How: as same-host segments are shared (`dataplane::mem::shm`), the owner listens on the
//! abstract unix socket `mooncake-disk/<the disk segment's endpoint>` (a name only processes
//! of its network namespace, so of its host, reach), and sends each reader that runs as its
//! user or as root (`SO_PEERCRED`) one message with the directory's descriptor attached
//! (`SCM_RIGHTS`), then keeps the connection open while it lives, which tells the reader it
//! is alive (the kernel closes it when the owner exits). The reader refuses an owner of
//! another user the same way. A directory descriptor gives the reader nothing its user could
//! not open by path; it only finds the files where the owner's mount is not the reader's.
//!
//! ```text
//!  offer (16 bytes, little-endian), the directory's descriptor attached
//!  | magic "MCSD" | version (u32) = 1 | workers (u32) 1..=DISK_WORKERS_MAX | flags (u32) |
//!  flags: bit 0 = the owner's files are read with O_DIRECT; other bits zero
//! ```
//!
//! The reader names the file from the replica's address alone (`<worker>/<address>.mco`
//! under the directory, the owner's layout), opens it relative to the descriptor
//! (`O_NOFOLLOW`), and checks what it read as the owner would, but against the replica
//! descriptor it holds (no key): the header's version and size, and the whole data's crc.
//! Anything else (no such file: the object moved or was deleted; a mismatch: the address was
//! reused; a long key's two-block header; an I/O error) is not an answer: the caller reads
//! through the listener, which finds the object or not, and counts and drops a corrupted copy.
//! So a same-host read returns exactly the bytes a listener read would, or falls back to it.
//!
//! Invariants: the owner never writes a file under its final name (a file is renamed whole
//! over it, `super`), so a reader sees a whole old file or a whole new one; a reader's open
//! file keeps its bytes even when the owner deletes it meanwhile.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use dataplane::mem::{Dst, Src};
use dataplane::sys::unix::{
    check_listener, connect_abstract, peer_alive, peer_is_trusted, recv_with_fd, send_with_fd,
};
use parking_lot::Mutex;
use protocol::Version;

use super::direct::{can_read_direct, read_direct, Expect};
use super::io::{AlignedBuf, Io};
pub use super::limits::DIR_OFFER_BYTES;
use super::limits::{
    DISK_SHARE_OFFER_TIMEOUT, DISK_SHARE_POLL_MS, DISK_SHARE_READERS_MAX,
    DISK_SHARE_SCRATCH_MAX_BYTES, DISK_WORKERS_MAX,
};
use super::worker::ReadFailure;
use super::{format, worker_of};

const DIR_OFFER_MAGIC: [u8; 4] = *b"MCSD";
const DIR_OFFER_VERSION: u32 = 1;
const FLAG_DIRECT: u32 = 1;

/// The abstract socket name of the disk segment served at `endpoint`.
pub fn socket_name(endpoint: &str) -> String {
    format!("mooncake-disk/{endpoint}")
}

/// What a reader needs besides the descriptor to find and open the owner's files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirOffer {
    /// The owner's worker count: its files are in one subdirectory per worker.
    pub workers: u32,
    /// The owner's files are read with `O_DIRECT` (its filesystem takes it).
    pub direct: bool,
}

impl DirOffer {
    pub fn encode(&self) -> [u8; DIR_OFFER_BYTES] {
        let mut b = [0u8; DIR_OFFER_BYTES];
        b[0..4].copy_from_slice(&DIR_OFFER_MAGIC);
        b[4..8].copy_from_slice(&DIR_OFFER_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&self.workers.to_le_bytes());
        let flags = if self.direct { FLAG_DIRECT } else { 0 };
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<DirOffer, &'static str> {
        if b.len() != DIR_OFFER_BYTES {
            return Err("a directory offer is 16 bytes");
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if b[0..4] != DIR_OFFER_MAGIC {
            return Err("not a directory offer");
        }
        if u32_at(4) != DIR_OFFER_VERSION {
            return Err("unknown directory offer version");
        }
        let workers = u32_at(8);
        if workers == 0 || workers as usize > DISK_WORKERS_MAX {
            return Err("worker count out of range");
        }
        let flags = u32_at(12);
        if flags & !FLAG_DIRECT != 0 {
            return Err("unknown flags");
        }
        Ok(DirOffer {
            workers,
            direct: flags & FLAG_DIRECT != 0,
        })
    }
}

/// The owner's half: shares its directory with same-host readers until dropped.
pub struct DirShare {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    refused: Arc<AtomicU64>,
}

impl DirShare {
    /// Shares `dir` (the tier's directory) under the disk segment's `endpoint`. Fails if the
    /// directory cannot be opened or the name is taken.
    pub fn start(endpoint: &str, dir: &Path, offer: DirOffer) -> io::Result<DirShare> {
        let dir = OwnedFd::from(File::open(dir)?);
        let addr = SocketAddr::from_abstract_name(socket_name(endpoint).as_bytes())?;
        let listener = UnixListener::bind_addr(&addr)?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicU64::new(0));
        let (flag, count) = (stop.clone(), refused.clone());
        let thread = std::thread::Builder::new()
            .name("mc-disk-share".into())
            .spawn(move || share_loop(listener, dir, offer, flag, count))?;
        Ok(DirShare {
            stop,
            thread: Some(thread),
            refused,
        })
    }

    /// Readers refused so far (another user's process).
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for DirShare {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Accepts readers and sends each the offer with the directory; keeps their connections
/// (closed by the kernel when this process exits, which tells them) and lets go of those
/// whose reader left.
fn share_loop(
    listener: UnixListener,
    dir: OwnedFd,
    offer: DirOffer,
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
) {
    let mut readers: Vec<UnixStream> = Vec::new();
    let message = offer.encode();
    while !stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, DISK_SHARE_POLL_MS) };
        readers.retain(|c| peer_alive(c.as_raw_fd()));
        while let Ok((conn, _)) = listener.accept() {
            if !peer_is_trusted(&conn) {
                refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "disk directory not shared with a same-host process of another user"
                );
                continue;
            }
            if readers.len() >= DISK_SHARE_READERS_MAX {
                tracing::warn!(
                    "disk directory already shared with {DISK_SHARE_READERS_MAX} readers; \
                     another reads through the listener"
                );
                continue;
            }
            let sent = conn
                .set_write_timeout(Some(DISK_SHARE_OFFER_TIMEOUT))
                .and_then(|()| send_with_fd(&conn, &message, dir.as_raw_fd()));
            match sent {
                Ok(()) => readers.push(conn),
                Err(e) => tracing::debug!("disk directory offer not sent: {e}"),
            }
        }
    }
}

/// The reader's half: an owner's directory, and the buffers this process reads its files
/// with.
pub struct SharedDir {
    dir: OwnedFd,
    offer: DirOffer,
    /// Open while the owner lives.
    conn: UnixStream,
    /// Idle readers; a read takes one (or makes one) and gives it back.
    idle: Mutex<Vec<Reader>>,
}

/// One read's means: a ring (or blocking I/O) with its bounce buffers, and an aligned buffer
/// for reads that cannot land in place.
struct Reader {
    io: Io,
    scratch: Option<AlignedBuf>,
}

impl SharedDir {
    /// Receives the directory of the owner serving the disk segment at `endpoint`; `None`
    /// when no process of this host shares it. An owner of another user is an error.
    pub fn import(endpoint: &str) -> io::Result<Option<SharedDir>> {
        let Some(conn) = connect_abstract(&socket_name(endpoint))? else {
            return Ok(None);
        };
        check_listener(&conn).map_err(|why| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("the owner sharing {endpoint}'s directory: {why}"),
            )
        })?;
        conn.set_read_timeout(Some(DISK_SHARE_OFFER_TIMEOUT))?;
        let mut bytes = [0u8; DIR_OFFER_BYTES];
        let (n, dir) = match recv_with_fd(&conn, &mut bytes) {
            Ok(x) => x,
            // Closed without an offer (it shares with enough readers already).
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(None),
            Err(e) => return Err(e),
        };
        let offer = DirOffer::decode(&bytes[..n])
            .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
        Ok(Some(SharedDir {
            dir,
            offer,
            conn,
            idle: Mutex::new(Vec::new()),
        }))
    }

    /// Whether the owner still holds its end (one non-blocking syscall).
    pub fn owner_alive(&self) -> bool {
        peer_alive(self.conn.as_raw_fd())
    }

    /// Reads `dst.len()` bytes at `offset` of the object of `size` bytes written at `version`
    /// whose file starts at disk address `start`. An error means "read it through the
    /// listener" (the module's documentation); `dst` may hold part of the file's bytes then,
    /// which that read overwrites.
    pub fn read(
        &self,
        start: u64,
        version: Version,
        size: u64,
        offset: u64,
        mut dst: Dst<'_>,
    ) -> Result<(), String> {
        let in_place = can_read_direct(self.offer.direct, size, offset, &dst);
        if !in_place && size > DISK_SHARE_SCRATCH_MAX_BYTES {
            return Err(format!(
                "{size} bytes is more than a same-host read buffers"
            ));
        }
        let file = self
            .open(start)
            .map_err(|e| format!("opening its file: {e}"))?;
        let mut r = match self.idle.lock().pop() {
            Some(r) => r,
            None => Reader {
                io: Io::new(protocol::env::flag("MOONCAKE_OFFLOAD_USE_URING", true)).0,
                scratch: None,
            },
        };
        let expect = Expect::Version(version);
        let done = if in_place {
            read_direct(&mut r.io, &file, expect, size, &mut dst, |_| {})
        } else {
            let want = format::round_up(size).unwrap_or(u64::MAX) as usize;
            if r.scratch.as_ref().is_none_or(|b| b.len() < want) {
                r.scratch = Some(AlignedBuf::new(want));
            }
            let whole = r
                .scratch
                .as_mut()
                .expect("made above")
                .as_mut_slice()
                .as_mut_ptr();
            // SAFETY: the scratch buffer is ours, at least `size` bytes, and only this read
            // uses it: the reader writes it, and the copies below read the parts it checked.
            let mut into = unsafe { Dst::from_raw(whole, size as usize) };
            // Each part of `[offset, offset + dst.len())` goes to `dst` as soon as it is
            // checked, while the rest of the file is still being read.
            let (lo, hi) = (offset, offset + dst.len() as u64);
            let mut copied = lo;
            let copy_up_to = |filled: u64| {
                let to = filled.min(hi);
                if to > copied {
                    // SAFETY: `[copied, to)` lies in the scratch buffer and is checked; nobody
                    // writes it any more.
                    let from = unsafe {
                        Src::from_raw(whole.add(copied as usize), (to - copied) as usize)
                    };
                    from.copy_to(&mut dst.tail((copied - lo) as usize));
                    copied = to;
                }
            };
            read_direct(&mut r.io, &file, expect, size, &mut into, copy_up_to)
        };
        self.idle.lock().push(r);
        done.map_err(|f| match f {
            ReadFailure::Io(e) => format!("reading its file: {e}"),
            ReadFailure::Corrupt(why) => why,
        })
    }

    /// Opens the file of the object at `start` for reading, relative to the directory.
    fn open(&self, start: u64) -> io::Result<File> {
        let w = worker_of(start, self.offer.workers as usize);
        let rel = CString::new(format!("{w}/{}", format::object_name(start)))
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a file name"))?;
        let mut flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW;
        if self.offer.direct {
            flags |= libc::O_DIRECT;
        }
        // SAFETY: `rel` is a NUL-terminated path and the directory descriptor is open.
        let fd = unsafe { libc::openat(self.dir.as_raw_fd(), rel.as_ptr(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}
