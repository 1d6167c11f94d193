//! One rank's shared segment: a `/dev/shm` file every rank of the group maps.
//!
//! ```text
//! offset                      field (each counter alone on a 64-byte line)
//! 0                           magic "MCPGSEG1" (u64) | pid (u32) | ranks (u32) | rank (u32)
//! 24                          base (u64): the owner's address of this mapping (CMA probe)
//! 64                          posted (u64): last collective phase this rank wrote and published
//! 72                          waiters (u64): peers parked (futex) on this rank's posted / done
//! 128                         done   (u64): last collective phase this rank finished reading
//! 192, 256                    desc[2]: descriptor of the op in collective slot 0 / 1
//! 320                         left (u64): 1 once the owner has left the group gracefully
//! 384, 448                    extent[2]: stride (u64) | bytes (u64) the owner wrote in
//!                             collective slot 0 / 1 for its last phase there (stride 0: one
//!                             range at the start; else one range per rank r at r * stride)
//! 512 + 64*p                  sent[p]  (u64): chunks this rank published on its channel to p
//! 512 + 64*64 + 64*p          acked[p] (u64): chunks from p this rank has consumed
//! MEMBER_OFF                  membership words (layout in [`super::membership`])
//! PG_HEADER_BYTES             collective slot 0, then slot 1 (PG_COLL_SLOT_BYTES each)
//! then for each peer p        channel to p: 2 x (64-byte chunk header | PG_P2P_SLOT_BYTES)
//!                             chunk header: message length (u64) | chunk length (u64)
//! ```
//!
//! Only the owner writes its segment; peers only read it. One exception: a process joining
//! the group writes its own mailbox word in the membership area of every member
//! ([`super::membership`]).
//! A counter is stored with `Release` after the bytes it publishes and loaded with `Acquire`
//! before they are read, which is what orders the plain memcpy traffic between processes.
//!
//! Waiting: a peer that has waited a while for `posted` or `done` parks on it with a futex
//! (on the counter's low 32 bits, shared mapping), after counting itself in `waiters`; the
//! owner wakes the counter after a store when `waiters` is non-zero ([`Segment::store_counter`]).
//! Parking has a 1 ms timeout, so a missed wake-up, a peer that died while parked (its count
//! stays: the owner then pays one `futex` call per store, nothing worse) or an owner that died
//! costs at most that. A replica's counters are stored the same way by the network
//! thread that applies the remote owner's frames, so a reader parks on a replica too.
//!
//! Liveness: the owner holds an exclusive `flock` on its file for its whole life; the kernel
//! drops it when the process dies (before it becomes a zombie), so a peer that can take a
//! shared lock on its own descriptor of the file knows the owner is gone. No pid reuse, no
//! heartbeat thread.
//!
//! A *replica* ([`Segment::replica`]) stands for a rank on another host: a private memfd laid
//! out like that rank's segment, written only by the receive thread of [`super::net`] as the
//! owner's pushes arrive, and read by the collectives exactly like a mapped peer segment. Its
//! liveness is a flag the network layer clears (connection lost, heartbeat missed) instead of
//! the lock.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::redirect::Redirect;
use crate::limits::{PG_COLL_SLOT_BYTES, PG_HEADER_BYTES, PG_MAX_RANKS, PG_P2P_SLOT_BYTES};
use crate::shmfile;
use dataplane::mem::file::open_peer_segment;
use dataplane::sys::mmap::mmap_shared;

const MAGIC: u64 = u64::from_le_bytes(*b"MCPGSEG1");
const POSTED_OFF: usize = 64;
const WAITERS_OFF: usize = POSTED_OFF + 8;
const DONE_OFF: usize = 128;
const DESC_OFF: usize = 192;
const LEFT_OFF: usize = 320;
const EXTENT_OFF: usize = 384;
const SENT_OFF: usize = 512;
const ACKED_OFF: usize = SENT_OFF + 64 * PG_MAX_RANKS;
/// Bytes of a point-to-point chunk header.
pub const CHUNK_HEADER_BYTES: usize = 64;
const CHANNEL_SLOT_STRIDE: usize = CHUNK_HEADER_BYTES + PG_P2P_SLOT_BYTES;

/// Start of the membership area, `MEMBER_WORDS` u64 words ([`super::membership`]).
const MEMBER_OFF: usize = 16 * 1024;
/// Words in the membership area.
pub const MEMBER_WORDS: usize = 1024;

const _: () = assert!(ACKED_OFF + 64 * PG_MAX_RANKS <= MEMBER_OFF);
const _: () = assert!(MEMBER_OFF + 8 * MEMBER_WORDS <= PG_HEADER_BYTES);
const _: () = assert!(DESC_OFF + 2 * 64 <= LEFT_OFF);
const _: () = assert!(LEFT_OFF < EXTENT_OFF && EXTENT_OFF + 2 * 64 <= SENT_OFF);

/// What a rank says it is doing in a collective phase; peers compare it with their own on
/// the first phase of each op, so mismatched calls fail on every rank instead of hanging.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub struct Desc {
    /// Op kind (`CollKind` as u32).
    pub kind: u32,
    /// Datatype code.
    pub dtype: u32,
    /// Reduce op code, or 0.
    pub op: u32,
    /// Root rank, or 0.
    pub root: u32,
    /// Bytes per rank (per piece for the list forms).
    pub bytes: u64,
}

/// A mapped segment, own or a peer's.
pub struct Segment {
    base: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    ranks: usize,
    /// For a replica: whether the remote owner is alive (cleared by the network layer).
    remote: Option<Arc<AtomicBool>>,
    /// For a replica: destinations registered for the owner's phases ([`Redirect`]).
    redirect: Option<Arc<Redirect>>,
}

// SAFETY: the mapping is shared memory that lives as long as `Segment`; all cross-thread
// access goes through atomics or through the phase protocol described in the module docs.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

/// Bytes of the segment of a group of `ranks`.
pub fn segment_bytes(ranks: usize) -> usize {
    PG_HEADER_BYTES + 2 * PG_COLL_SLOT_BYTES + ranks * 2 * CHANNEL_SLOT_STRIDE
}

/// Whether byte `off` of a segment is a header counter: 8-aligned, inside the header (an
/// offset near `usize::MAX` is not: no sum here can wrap). What a remote STORE may name.
pub fn counter_offset(off: usize) -> bool {
    off.is_multiple_of(8) && off.checked_add(8).is_some_and(|end| end <= PG_HEADER_BYTES)
}

impl Segment {
    /// Creates this rank's segment at `path` (which must not exist), locks it and writes the
    /// header.
    pub fn create(path: &str, ranks: usize, rank: usize) -> io::Result<Segment> {
        if ranks == 0 || ranks > PG_MAX_RANKS || rank >= ranks {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("rank {rank} of {ranks}: need 0 <= rank < ranks <= {PG_MAX_RANKS}"),
            ));
        }
        let len = segment_bytes(ranks);
        let (fd, base) = shmfile::create_locked(path, len)?;
        let seg = Segment {
            base,
            len,
            fd,
            ranks,
            remote: None,
            redirect: None,
        };
        // SAFETY: the header is inside the fresh mapping and nobody else has it yet.
        unsafe {
            let h = seg.base.as_ptr();
            h.cast::<u64>().write(MAGIC);
            h.add(8).cast::<u32>().write(std::process::id());
            h.add(12).cast::<u32>().write(ranks as u32);
            h.add(16).cast::<u32>().write(rank as u32);
            h.add(24).cast::<u64>().write(h as u64);
        }
        Ok(seg)
    }

    /// Maps a peer's segment and checks that it belongs to a group of `ranks` as rank `rank`.
    /// The path comes from the peer, so it is opened as every path from outside is
    /// ([`dataplane::mem::file::open_peer_segment`]: a regular file of ours, in `/dev/shm` or
    /// named by its owner's `/proc/<pid>/fd/<n>`, an open that cannot block).
    pub fn open(path: &str, ranks: usize, rank: usize) -> io::Result<Segment> {
        let (file, meta) = open_peer_segment(std::path::Path::new(path))?;
        let fd = OwnedFd::from(file);
        let len = segment_bytes(ranks);
        if meta.len() != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{path}: {} bytes, a group of {ranks} needs {len}",
                    meta.len()
                ),
            ));
        }
        let seg = Segment {
            base: mmap_shared(fd.as_fd(), len)?,
            len,
            fd,
            ranks,
            remote: None,
            redirect: None,
        };
        // SAFETY: the header lies inside the mapping.
        let (magic, n, r) = unsafe {
            let h = seg.base.as_ptr();
            (
                h.cast::<u64>().read_volatile(),
                h.add(12).cast::<u32>().read_volatile(),
                h.add(16).cast::<u32>().read_volatile(),
            )
        };
        if magic != MAGIC || n as usize != ranks || r as usize != rank {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path}: not rank {rank} of a {ranks}-rank group (rank {r} of {n})"),
            ));
        }
        Ok(seg)
    }

    /// A replica of remote rank `rank`'s segment: two mappings of one fresh memfd (the first
    /// for the collectives, the second for the receive thread that applies the owner's
    /// pushes) sharing one liveness flag. The header says pid 0 and base 0, so a direct-read
    /// probe of it fails.
    pub fn replica(ranks: usize, rank: usize) -> io::Result<(Segment, Segment)> {
        if ranks == 0 || ranks > PG_MAX_RANKS || rank >= ranks {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("rank {rank} of {ranks}: need 0 <= rank < ranks <= {PG_MAX_RANKS}"),
            ));
        }
        let len = segment_bytes(ranks);
        let fd = shmfile::memfd(c"mooncake-pg-replica", len)?;
        let alive = Arc::new(AtomicBool::new(true));
        let redirect = Arc::new(Redirect::default());
        let fd2 = fd.try_clone()?;
        let a = Segment {
            base: mmap_shared(fd.as_fd(), len)?,
            len,
            fd,
            ranks,
            remote: Some(alive.clone()),
            redirect: Some(redirect.clone()),
        };
        let b = Segment {
            base: mmap_shared(fd2.as_fd(), len)?,
            len,
            fd: fd2,
            ranks,
            remote: Some(alive),
            redirect: Some(redirect),
        };
        // SAFETY: the header is inside the fresh mapping; nobody reads it yet.
        unsafe {
            let h = a.base.as_ptr();
            h.cast::<u64>().write(MAGIC);
            h.add(12).cast::<u32>().write(ranks as u32);
            h.add(16).cast::<u32>().write(rank as u32);
        }
        Ok((a, b))
    }

    /// Sets the pid a replica's header names (a joining process's, which the views name).
    pub(crate) fn set_owner_pid(&self, pid: u32) {
        debug_assert!(
            self.remote.is_some(),
            "only a replica's header is ours to write"
        );
        // SAFETY: inside the header of a private mapping; a plain u32 written before the
        // replica is shared with any reader (it is published through a lock afterwards).
        unsafe { self.base.as_ptr().add(8).cast::<u32>().write_volatile(pid) };
    }

    /// A replica's registered destinations ([`Redirect`]); `None` for a mapped segment.
    pub(crate) fn redirect(&self) -> Option<&Redirect> {
        self.redirect.as_deref()
    }

    /// Receive side of a replica: where the payload of a WRITE of `len` bytes at `offset`
    /// goes, and whether that is a destination registered for it ([`Redirect::take`]: the
    /// caller then calls [`Redirect::done`] after the payload), else the replica itself.
    /// `offset + len` must lie inside the replica.
    pub(crate) fn write_target(&self, offset: usize, len: usize) -> (*mut u8, bool) {
        // The owner pushes a phase's slot bytes after it published the phase before.
        let phase = load(self.posted()) + 1;
        let slot = PG_HEADER_BYTES + (phase & 1) as usize * PG_COLL_SLOT_BYTES;
        let in_slot = offset >= slot && offset + len <= slot + PG_COLL_SLOT_BYTES;
        if let Some(r) = self.redirect.as_deref().filter(|_| in_slot) {
            if let Some(dst) = r.take(phase, offset - slot, len) {
                return (dst, true);
            }
        }
        // SAFETY: `offset + len` is inside the mapping (the caller's precondition).
        (unsafe { self.base.as_ptr().add(offset) }, false)
    }

    /// Whether this is a replica of a rank on another host.
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Marks a replica's owner dead (no-op for a mapped segment).
    pub(crate) fn mark_dead(&self) {
        if let Some(a) = &self.remote {
            a.store(false, Ordering::Release);
        }
    }

    /// A replica's liveness flag.
    pub(crate) fn remote_flag(&self) -> Option<&Arc<AtomicBool>> {
        self.remote.as_ref()
    }

    /// The `left` counter (0 or 1).
    pub(crate) fn left_counter(&self) -> &AtomicU64 {
        self.atomic(LEFT_OFF)
    }

    /// Bytes of the mapping.
    pub(crate) fn len_bytes(&self) -> usize {
        self.len
    }

    /// Offset of `p` (a pointer into this mapping) from its start.
    pub(crate) fn offset_of(&self, p: *const u8) -> usize {
        let off = (p as usize).wrapping_sub(self.base.as_ptr() as usize);
        debug_assert!(off <= self.len);
        off
    }

    /// The counter at header offset `off`, if `off` is an aligned header offset.
    pub(crate) fn counter_at(&self, off: usize) -> Option<&AtomicU64> {
        counter_offset(off).then(|| self.atomic(off))
    }

    /// A stand-in for a rank whose segment cannot be mapped (its process is gone): an
    /// anonymous mapping with a valid header that nobody locks, so it reads as dead.
    pub fn tombstone(ranks: usize, rank: usize) -> io::Result<Segment> {
        let len = segment_bytes(ranks);
        let fd = shmfile::memfd(c"mooncake-pg-tombstone", len)?;
        let seg = Segment {
            base: mmap_shared(fd.as_fd(), len)?,
            len,
            fd,
            ranks,
            remote: None,
            redirect: None,
        };
        // SAFETY: the header is inside the fresh, private mapping.
        unsafe {
            let h = seg.base.as_ptr();
            h.cast::<u64>().write(MAGIC);
            h.add(12).cast::<u32>().write(ranks as u32);
            h.add(16).cast::<u32>().write(rank as u32);
        }
        Ok(seg)
    }

    /// The descriptor number of this mapping's file in this process (`/proc/<pid>/fd/<n>`
    /// reopens it after the name is gone).
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Membership word `i` ([`super::membership`] owns the layout).
    pub fn member_word(&self, i: usize) -> &AtomicU64 {
        assert!(i < MEMBER_WORDS, "membership word {i} of {MEMBER_WORDS}");
        self.atomic(MEMBER_OFF + 8 * i)
    }

    /// The pid written by the owner.
    pub fn owner_pid(&self) -> u32 {
        // SAFETY: inside the header.
        unsafe { self.base.as_ptr().add(8).cast::<u32>().read_volatile() }
    }

    /// The owner's address of the segment (where the magic lives in its address space).
    pub fn owner_base(&self) -> u64 {
        // SAFETY: inside the header.
        unsafe { self.base.as_ptr().add(24).cast::<u64>().read_volatile() }
    }

    /// Magic every segment starts with.
    pub fn magic() -> u64 {
        MAGIC
    }

    /// Whether the owner still holds its lock, i.e. its process is alive. Only for peers'
    /// segments: on the owner's own descriptor the probe would convert its exclusive lock.
    pub fn owner_alive(&self) -> bool {
        if let Some(a) = &self.remote {
            return a.load(Ordering::Acquire);
        }
        // SAFETY: plain flock on our descriptor.
        let r = unsafe { libc::flock(self.fd.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
        if r == 0 {
            // The owner is gone; drop the lock this probe just took.
            // SAFETY: as above.
            unsafe { libc::flock(self.fd.as_raw_fd(), libc::LOCK_UN) };
            return false;
        }
        true
    }

    fn atomic(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= PG_HEADER_BYTES && off.is_multiple_of(8));
        // SAFETY: `off` is an aligned offset inside the header, which lives as long as self;
        // every access to it is atomic.
        unsafe { &*self.base.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// Last collective phase published.
    pub fn posted(&self) -> &AtomicU64 {
        self.atomic(POSTED_OFF)
    }

    /// Last collective phase fully read.
    pub fn done(&self) -> &AtomicU64 {
        self.atomic(DONE_OFF)
    }

    /// Stores `v` into `counter` (this segment's own `posted` or `done`) with `Release`, then
    /// wakes the peers parked on it ([`Segment::park`]), if any are.
    pub fn store_counter(&self, counter: &AtomicU64, v: u64) {
        counter.store(v, PUBLISH);
        // Pairs with the waiter's SeqCst increment of `waiters` before its last look at the
        // counter: either it sees `v`, or this load sees it counted and wakes it.
        fence(Ordering::SeqCst);
        if self.atomic(WAITERS_OFF).load(Ordering::Relaxed) != 0 {
            // SAFETY: futex on the counter's low half, inside this live mapping; FUTEX_WAKE
            // only reads the address.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    futex_word(counter),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    std::ptr::null::<libc::timespec>(),
                    std::ptr::null::<u32>(),
                    0,
                )
            };
        }
    }

    /// Sleeps until `counter` (a `posted` or `done` of this peer segment) no longer holds
    /// `seen`, the owner wakes it, or `timeout` passes (also on a spurious wake-up: callers
    /// re-check). On a replica the receive thread of [`super::net`] stores the counters
    /// with [`Segment::store_counter`], so it wakes a parked reader as the owner would.
    pub fn park(&self, counter: &AtomicU64, seen: u64, timeout: Duration) {
        let waiters = self.atomic(WAITERS_OFF);
        waiters.fetch_add(1, Ordering::SeqCst);
        if counter.load(Ordering::SeqCst) == seen {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs() as libc::time_t,
                tv_nsec: timeout.subsec_nanos() as libc::c_long,
            };
            // SAFETY: futex on the counter's low half, inside this live shared mapping; the
            // kernel sleeps only while that word still equals `seen`'s low half.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    futex_word(counter),
                    libc::FUTEX_WAIT,
                    seen as u32,
                    &ts as *const libc::timespec,
                    std::ptr::null::<u32>(),
                    0,
                )
            };
        }
        waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether the owner has left the group (`deactivate_ranks([self])`).
    pub fn has_left(&self) -> bool {
        load(self.atomic(LEFT_OFF)) != 0
    }

    /// Marks the owner as gone from the group; peers stop waiting for it.
    pub fn set_left(&self) {
        store(self.atomic(LEFT_OFF), 1)
    }

    /// Chunks published to peer `p`.
    pub fn sent(&self, p: usize) -> &AtomicU64 {
        self.atomic(SENT_OFF + 64 * p)
    }

    /// Chunks consumed from peer `p`.
    pub fn acked(&self, p: usize) -> &AtomicU64 {
        self.atomic(ACKED_OFF + 64 * p)
    }

    /// Writes the descriptor of collective slot `slot` (before publishing the phase).
    pub fn set_desc(&self, slot: usize, d: Desc) {
        // SAFETY: inside the header; only the owner writes it, readers read it after the
        // Release store of `posted` that follows.
        unsafe {
            self.base
                .as_ptr()
                .add(DESC_OFF + 64 * (slot & 1))
                .cast::<Desc>()
                .write_volatile(d)
        }
    }

    /// Reads the descriptor of collective slot `slot`.
    pub fn desc(&self, slot: usize) -> Desc {
        // SAFETY: inside the header.
        unsafe {
            self.base
                .as_ptr()
                .add(DESC_OFF + 64 * (slot & 1))
                .cast::<Desc>()
                .read_volatile()
        }
    }

    /// Records what the owner wrote in collective slot `slot` for the coming phase (read by
    /// [`super::net`] to push only those bytes): `stride` 0 means `bytes` at the start, else
    /// `bytes` at `r * stride` for every rank `r`.
    pub fn set_extent(&self, slot: usize, stride: usize, bytes: usize) {
        let off = EXTENT_OFF + 64 * (slot & 1);
        self.atomic(off).store(stride as u64, Ordering::Relaxed);
        self.atomic(off + 8).store(bytes as u64, Ordering::Relaxed);
    }

    /// The extent of collective slot `slot` (see [`Segment::set_extent`]).
    pub fn extent(&self, slot: usize) -> (usize, usize) {
        let off = EXTENT_OFF + 64 * (slot & 1);
        (
            self.atomic(off).load(Ordering::Relaxed) as usize,
            self.atomic(off + 8).load(Ordering::Relaxed) as usize,
        )
    }

    /// Where the descriptor of collective slot `slot` lives.
    pub(crate) fn desc_ptr(&self, slot: usize) -> *const u8 {
        // SAFETY: inside the header.
        unsafe { self.base.as_ptr().add(DESC_OFF + 64 * (slot & 1)) }
    }

    /// Start of collective slot `slot` (0 or 1), `PG_COLL_SLOT_BYTES` long.
    pub fn coll_slot(&self, slot: usize) -> *mut u8 {
        // SAFETY: the offset is inside the mapping (see `segment_bytes`).
        unsafe {
            self.base
                .as_ptr()
                .add(PG_HEADER_BYTES + (slot & 1) * PG_COLL_SLOT_BYTES)
        }
    }

    /// Chunk header and data of slot `slot` of the channel to peer `p`.
    pub fn channel_slot(&self, p: usize, slot: usize) -> (*mut u64, *mut u8) {
        assert!(p < self.ranks, "channel to rank {p} of {}", self.ranks);
        let off =
            PG_HEADER_BYTES + 2 * PG_COLL_SLOT_BYTES + (p * 2 + (slot & 1)) * CHANNEL_SLOT_STRIDE;
        debug_assert!(off + CHANNEL_SLOT_STRIDE <= self.len);
        // SAFETY: inside the mapping (asserted above).
        unsafe {
            let h = self.base.as_ptr().add(off);
            (h.cast::<u64>(), h.add(CHUNK_HEADER_BYTES))
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; no reference into it outlives self.
        unsafe { shmfile::unmap(self.base, self.len) };
    }
}

/// The 32-bit futex word of a 64-bit counter: its low half (each store moves a counter by far
/// less than 2^32, so the half changes whenever the counter does).
fn futex_word(a: &AtomicU64) -> *const u32 {
    let p = (a as *const AtomicU64).cast::<u32>();
    if cfg!(target_endian = "big") {
        p.wrapping_add(1)
    } else {
        p
    }
}

/// The ordering of every counter store that publishes bytes written before it (a phase's
/// slot and descriptor before `posted`, a phase's reads before `done`): `Release`. The
/// phase model (`collective/tests/model_phases.rs`) reads it, so weakening it fails there.
pub const PUBLISH: Ordering = Ordering::Release;
/// The ordering of every counter load after which the bytes it publishes are read:
/// `Acquire` (read by the phase model as [`PUBLISH`] is).
pub const OBSERVE: Ordering = Ordering::Acquire;

/// Loads with [`OBSERVE`] (`Acquire`).
pub fn load(a: &AtomicU64) -> u64 {
    a.load(OBSERVE)
}

/// Stores with [`PUBLISH`] (`Release`).
pub fn store(a: &AtomicU64, v: u64) {
    a.store(v, PUBLISH)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A segment and a second mapping of it, as a peer process would have.
    fn pair(tag: &str) -> (Segment, Segment) {
        let path = format!("/dev/shm/mc-pg-seg-test-{tag}-{}", std::process::id());
        let own = Segment::create(&path, 2, 0).expect("segment");
        let peer = Segment::open(&path, 2, 0).expect("open");
        std::fs::remove_file(&path).expect("unlink");
        (own, peer)
    }

    /// A peer names the path of its segment: a link to a real segment, a FIFO and a file
    /// outside `/dev/shm` are refused (the FIFO without blocking), the real path opens.
    #[test]
    fn a_peer_path_opens_only_a_segment_file_of_ours_in_dev_shm() {
        let path = format!("/dev/shm/mc-pg-seg-test-paths-{}", std::process::id());
        let (link, fifo) = (format!("{path}-link"), format!("{path}-fifo"));
        let outside = std::env::temp_dir().join(format!("mc-pg-seg-test-{}", std::process::id()));
        let _own = Segment::create(&path, 2, 0).expect("segment");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let c = crate::shmfile::cpath(&fifo).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        std::fs::copy(&path, &outside).unwrap();
        let kind = |p: &str| {
            let (tx, rx) = std::sync::mpsc::channel();
            let p = p.to_string();
            std::thread::spawn(move || tx.send(Segment::open(&p, 2, 0).err().map(|e| e.kind())));
            rx.recv_timeout(Duration::from_secs(10))
                .expect("the open blocked")
        };
        assert_eq!(kind(&link), Some(io::ErrorKind::PermissionDenied));
        assert_eq!(kind(&fifo), Some(io::ErrorKind::InvalidInput));
        assert_eq!(
            kind(outside.to_str().unwrap()),
            Some(io::ErrorKind::PermissionDenied)
        );
        assert_eq!(kind(&path), None, "the segment itself opens");
        for p in [&path, &link, &fifo] {
            std::fs::remove_file(p).unwrap();
        }
        std::fs::remove_file(&outside).unwrap();
    }

    #[test]
    fn store_counter_wakes_a_parked_peer_at_once() {
        let (own, peer) = pair("wake");
        wakes_a_parked_reader(own, peer);
    }

    /// A replica's receive thread stores through its own mapping; the collective thread
    /// parks on the other one and is woken as by a mapped owner.
    #[test]
    fn store_counter_on_a_replica_wakes_a_parked_reader() {
        let (reader, rx) = Segment::replica(2, 1).expect("replica");
        wakes_a_parked_reader(rx, reader);
    }

    fn wakes_a_parked_reader(own: Segment, peer: Segment) {
        let peer = Arc::new(peer);
        let p = peer.clone();
        let waiter = std::thread::spawn(move || {
            let t = Instant::now();
            while load(p.posted()) < 7 {
                p.park(p.posted(), load(p.posted()), Duration::from_secs(20));
            }
            t.elapsed()
        });
        // Let the waiter park (it counts itself in `waiters` first).
        let t = Instant::now();
        while load(peer.atomic(WAITERS_OFF)) == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the waiter never parked"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        own.store_counter(own.posted(), 7);
        let took = waiter.join().expect("waiter");
        assert!(
            took < Duration::from_secs(10),
            "woken only by its timeout: {took:?}"
        );
        assert_eq!(
            load(own.atomic(WAITERS_OFF)),
            0,
            "the waiter uncounted itself"
        );
    }

    #[test]
    fn park_returns_at_once_when_the_counter_moved_and_after_its_timeout() {
        let (own, peer) = pair("stale");
        own.store_counter(own.done(), 3);
        let t = Instant::now();
        peer.park(peer.done(), 2, Duration::from_secs(20));
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "parked on a moved counter"
        );
        let t = Instant::now();
        peer.park(peer.done(), 3, Duration::from_millis(30));
        assert!(
            t.elapsed() >= Duration::from_millis(25),
            "returned before its timeout"
        );
        assert_eq!(load(own.atomic(WAITERS_OFF)), 0);
    }
}
