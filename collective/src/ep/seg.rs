//! One rank's EP buffer: a `/dev/shm` file every rank of the group maps and writes into.
//!
//! ```text
//! offset                       field (each counter alone on a 64-byte line)
//! 0                            magic "MCEPSEG1" (u64) | pid (u32) | ranks (u32) | rank (u32)
//! 24                           data_bytes (u64): bytes of the data area
//! 1024 + 64*s                  d_posted[s]  (u64): last dispatch rank s finished writing here
//! 1024 + 64*(64 + s)           c_posted[s]  (u64): last combine rank s finished writing here
//! 1024 + 64*(128 + r)          d_acked[r]   (u64): last dispatch rank r finished reading from
//!                                             the block this rank wrote into r's buffer
//! 1024 + 64*(192 + r)          c_acked[r]   (u64): the same for combine
//! 1024 + 64*(256 + 64*set + s) d_desc[set][s]: shape of the dispatch in data set `set` (EpDesc)
//! 1024 + 64*(384 + 64*set + s) c_desc[set][s]: shape of the combine in data set `set`
//! EP_HEADER_BYTES              data area (`data_bytes`), laid out per call by `layout::Layout`
//! ```
//!
//! Every field has exactly one writer: the `*_posted[s]` and `*_desc[..][s]` fields of any
//! buffer are written only by rank `s`, the `*_acked[r]` fields only by rank `r`, so no
//! counter needs a read-modify-write across processes. A rank *reads* only its own buffer:
//! everything it learns from a peer was written into its memory by that peer (one-sided
//! writes), which is what lets a remote writer replace the local one ([`super::EpPeer`]).
//! Counters are stored with `Release` after the bytes they publish and loaded with `Acquire`
//! before those bytes are read.
//!
//! Liveness, as in the `mooncake.pg` segments: the owner holds an exclusive `flock` on its
//! file for its whole life; a peer that can take a shared lock knows the owner is gone.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::limits::{EP_HEADER_BYTES, EP_MAX_RANKS};
use crate::shmfile;
use dataplane::sys::mmap::mmap_shared;

const MAGIC: u64 = u64::from_le_bytes(*b"MCEPSEG1");
const LINES_OFF: usize = 1024;
const LINE: usize = 64;

const _: () = assert!(LINES_OFF + LINE * (512 + EP_MAX_RANKS) <= EP_HEADER_BYTES);

/// Which of the two operations a counter or descriptor belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Tokens from their source rank to their experts' rank.
    Dispatch,
    /// Expert outputs back to the tokens' source rank.
    Combine,
}

impl Phase {
    fn posted_line(self, s: usize) -> usize {
        match self {
            Phase::Dispatch => s,
            Phase::Combine => 64 + s,
        }
    }

    fn acked_line(self, r: usize) -> usize {
        match self {
            Phase::Dispatch => 128 + r,
            Phase::Combine => 192 + r,
        }
    }

    fn desc_line(self, set: usize, s: usize) -> usize {
        let base = match self {
            Phase::Dispatch => 256,
            Phase::Combine => 384,
        };
        base + 64 * (set & 1) + s
    }
}

/// The shape of one call as its writer saw it; the reader compares it with its own before
/// reading the data, so mismatched calls fail with a message instead of reading garbage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub struct EpDesc {
    /// `num_max_dispatch_tokens_per_rank`.
    pub tokens_max: u32,
    /// Hidden size (elements per row).
    pub hidden: u32,
    /// Number of experts in the group.
    pub experts: u32,
    /// Bit 0: rows are fp8 with scales.
    pub flags: u32,
}

/// A mapped EP buffer, this rank's own or a peer's.
pub struct EpSegment {
    base: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is shared memory that lives as long as the value; cross-thread and
// cross-process access goes through atomics or the posted/acked protocol of the module docs.
unsafe impl Send for EpSegment {}
// SAFETY: as above.
unsafe impl Sync for EpSegment {}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl EpSegment {
    /// Creates this rank's buffer at `path` (which must not exist) with a data area of
    /// `data_bytes`, locks it and writes the header. The file is sparse: pages cost memory
    /// only once written.
    pub fn create(path: &str, ranks: usize, rank: usize, data_bytes: usize) -> io::Result<Self> {
        if ranks == 0 || ranks > EP_MAX_RANKS || rank >= ranks {
            return Err(invalid(format!(
                "rank {rank} of {ranks}: need 0 <= rank < ranks <= {EP_MAX_RANKS}"
            )));
        }
        let len = EP_HEADER_BYTES
            .checked_add(data_bytes)
            .filter(|l| *l <= isize::MAX as usize)
            .ok_or_else(|| invalid(format!("EP buffer of {data_bytes} bytes is too large")))?;
        let (fd, base) = shmfile::create_locked(path, len)?;
        let seg = EpSegment { base, len, fd };
        // SAFETY: the header is inside the fresh mapping and nobody else has it yet.
        unsafe {
            let h = seg.base.as_ptr();
            h.add(8).cast::<u32>().write(std::process::id());
            h.add(12).cast::<u32>().write(ranks as u32);
            h.add(16).cast::<u32>().write(rank as u32);
            h.add(24).cast::<u64>().write(data_bytes as u64);
            h.cast::<u64>().write(MAGIC);
        }
        Ok(seg)
    }

    /// Maps a peer's buffer and checks it belongs to a group of `ranks` as rank `rank`. The
    /// path comes from the peer, so it is opened as every path from outside is
    /// ([`dataplane::mem::file::open_peer_segment`]: a regular file of ours, in `/dev/shm` or
    /// named by its owner's `/proc/<pid>/fd/<n>`, an open that cannot block).
    pub fn open(path: &str, ranks: usize, rank: usize) -> io::Result<Self> {
        let (file, meta) = dataplane::mem::file::open_peer_segment(std::path::Path::new(path))?;
        let fd = OwnedFd::from(file);
        let len = usize::try_from(meta.len())
            .map_err(|_| invalid(format!("{path}: {} bytes", meta.len())))?;
        if len < EP_HEADER_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path}: {len} bytes, shorter than the EP header"),
            ));
        }
        let seg = EpSegment {
            base: mmap_shared(fd.as_fd(), len)?,
            len,
            fd,
        };
        // SAFETY: the header lies inside the mapping.
        let (magic, n, r, data) = unsafe {
            let h = seg.base.as_ptr();
            (
                h.cast::<u64>().read_volatile(),
                h.add(12).cast::<u32>().read_volatile(),
                h.add(16).cast::<u32>().read_volatile(),
                h.add(24).cast::<u64>().read_volatile(),
            )
        };
        if magic != MAGIC || n as usize != ranks || r as usize != rank {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path}: not rank {rank} of a {ranks}-rank EP group (rank {r} of {n})"),
            ));
        }
        if EP_HEADER_BYTES as u64 + data != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{path}: header says {data} data bytes, the file has {len} bytes"),
            ));
        }
        Ok(seg)
    }

    /// Bytes of the data area.
    pub fn data_bytes(&self) -> usize {
        self.len - EP_HEADER_BYTES
    }

    /// Start of the data area.
    pub fn data(&self) -> *mut u8 {
        // SAFETY: EP_HEADER_BYTES <= len (checked at create/open).
        unsafe { self.base.as_ptr().add(EP_HEADER_BYTES) }
    }

    /// Whether the owner still holds its lock. Only for peers' buffers: on the owner's own
    /// descriptor the probe would convert its exclusive lock.
    pub fn owner_alive(&self) -> bool {
        // SAFETY: plain flock on our descriptor.
        let r = unsafe { libc::flock(self.fd.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
        if r == 0 {
            // SAFETY: as above; drop the lock the probe just took.
            unsafe { libc::flock(self.fd.as_raw_fd(), libc::LOCK_UN) };
            return false;
        }
        true
    }

    fn line(&self, line: usize) -> *mut u8 {
        debug_assert!(LINES_OFF + LINE * (line + 1) <= EP_HEADER_BYTES);
        // SAFETY: every line index used by `Phase` is below 512 + EP_MAX_RANKS, inside the
        // header (const-asserted above).
        unsafe { self.base.as_ptr().add(LINES_OFF + LINE * line) }
    }

    fn counter(&self, line: usize) -> &AtomicU64 {
        // SAFETY: an aligned u64 inside the header, which lives as long as self; every access
        // to it is atomic.
        unsafe { &*self.line(line).cast::<AtomicU64>() }
    }

    /// Last call of `phase` rank `s` finished writing into this buffer.
    pub fn posted(&self, phase: Phase, s: usize) -> u64 {
        self.counter(phase.posted_line(s)).load(Ordering::Acquire)
    }

    /// Publishes that rank `s` (the caller) finished writing call `seq` of `phase` here.
    pub fn set_posted(&self, phase: Phase, s: usize, seq: u64) {
        self.counter(phase.posted_line(s))
            .store(seq, Ordering::Release)
    }

    /// Last call of `phase` rank `r` finished reading what this rank wrote into r's buffer.
    pub fn acked(&self, phase: Phase, r: usize) -> u64 {
        self.counter(phase.acked_line(r)).load(Ordering::Acquire)
    }

    /// Publishes that rank `r` (the caller) finished reading call `seq` of `phase`.
    pub fn set_acked(&self, phase: Phase, r: usize, seq: u64) {
        self.counter(phase.acked_line(r))
            .store(seq, Ordering::Release)
    }

    /// The descriptor rank `s` wrote for data set `set` of `phase`.
    pub fn desc(&self, phase: Phase, set: usize, s: usize) -> EpDesc {
        // SAFETY: inside the header; read after the Acquire load of the matching `posted`.
        unsafe {
            self.line(phase.desc_line(set, s))
                .cast::<EpDesc>()
                .read_volatile()
        }
    }

    /// Writes rank `s`'s descriptor of data set `set` (before publishing `posted`).
    pub fn set_desc(&self, phase: Phase, set: usize, s: usize, d: EpDesc) {
        // SAFETY: inside the header; only rank `s` writes this line.
        unsafe {
            self.line(phase.desc_line(set, s))
                .cast::<EpDesc>()
                .write_volatile(d)
        }
    }
}

impl Drop for EpSegment {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; no reference into it outlives self.
        unsafe { shmfile::unmap(self.base, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer names the path of its buffer: a link to a real buffer and a FIFO are refused
    /// (the FIFO without blocking), the real path opens.
    #[test]
    fn a_peer_path_opens_only_a_buffer_file_of_ours() {
        let path = format!("/dev/shm/mc-ep-seg-test-paths-{}", std::process::id());
        let (link, fifo) = (format!("{path}-link"), format!("{path}-fifo"));
        let _own = EpSegment::create(&path, 2, 1, 4096).expect("buffer");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let c = crate::shmfile::cpath(&fifo).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let kind = |p: &str| {
            let (tx, rx) = std::sync::mpsc::channel();
            let p = p.to_string();
            std::thread::spawn(move || tx.send(EpSegment::open(&p, 2, 1).err().map(|e| e.kind())));
            rx.recv_timeout(std::time::Duration::from_secs(10))
                .expect("the open blocked")
        };
        assert_eq!(kind(&link), Some(io::ErrorKind::PermissionDenied));
        assert_eq!(kind(&fifo), Some(io::ErrorKind::InvalidInput));
        assert_eq!(kind(&path), None, "the buffer itself opens");
        for p in [&path, &link, &fifo] {
            std::fs::remove_file(p).unwrap();
        }
    }
}
