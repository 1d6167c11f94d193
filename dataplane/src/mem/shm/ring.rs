//! A same-host importer's announcements in shared memory: a byte ring the importer appends
//! whole announcements to and the exporter reads, so that a put's intent and record cost the
//! writer no system call (each `send` on the socket cost about a microsecond here, a tenth
//! of a small put).
//!
//! ```text
//! memfd of SHM_RING_HEADER_BYTES + SHM_RING_BYTES, sealed at its size, both processes map it
//!  0               8                 64              72                128
//!  | head (u64)    | (unused)        | tail (u64)    | (unused)        | data (SHM_RING_BYTES) |
//!  head: bytes the importer has published, ever; tail: bytes the exporter has read, ever.
//!  Byte n of the stream is at data[n % SHM_RING_BYTES].
//! ```
//!
//! One writer and one reader: the importer's threads append under its sending lock, the
//! exporter reads under its importers' lock. The writer copies a frame in, then stores the
//! new head (release); the reader loads the head (acquire), copies the bytes out, then
//! stores the tail (release); the writer loads the tail (acquire) to know the room left. A
//! frame is published whole or not at all, so a writer that dies mid-append leaves nothing
//! half-read.
//!
//! The reader trusts nothing in the ring: it keeps its own count of bytes read (the shared
//! tail is for the writer's benefit only), refuses a head behind that count or more than the
//! ring ahead of it, and decodes the bytes it copied out (never the ring in place) with the
//! same decoder the socket used, fuzzed (`fuzz/fuzz_targets/shm_offer.rs`). A writer that
//! breaks the rules is dropped, as one that sent garbage on the socket was.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::limits::{SHM_RING_BYTES, SHM_RING_HEADER_BYTES, SHM_RING_MEMFD_BYTES};

/// Where the tail is in the header (the head is at 0).
const TAIL_AT: usize = 64;

/// See the module docs.
#[derive(Debug)]
pub struct Ring {
    base: NonNull<u8>,
    /// The reader's own count of bytes read (the reader's side only).
    read: u64,
}

// SAFETY: the mapping is owned by this value and reached only through atomics and raw
// copies; the ring's rules say which side writes what.
unsafe impl Send for Ring {}
// SAFETY: see `Send`; `&self` methods only load, or are serialised by the caller (`push`).
unsafe impl Sync for Ring {}

impl Ring {
    /// A new ring in a sealed memfd, for the exporter: the descriptor goes to the importer,
    /// who maps it with [`Ring::map`].
    pub fn shared() -> io::Result<(Ring, OwnedFd)> {
        let fd = crate::sys::mmap::sized_memfd(c"mooncake-announce", SHM_RING_MEMFD_BYTES, false)?;
        Ok((Ring::map(&fd)?, fd))
    }

    /// Maps the ring in `fd`. Refused (`PermissionDenied`) unless the memfd is sealed at its
    /// size, so that the other side cannot shrink it under our mapping, and (`InvalidData`)
    /// if it is smaller than a ring.
    pub fn map(fd: &OwnedFd) -> io::Result<Ring> {
        let what = "announcement ring";
        let base = crate::sys::mmap::map_sealed(fd.as_fd(), SHM_RING_MEMFD_BYTES, what)?;
        let mut ring = Ring { base, read: 0 };
        ring.read = ring.tail().load(Ordering::Acquire);
        Ok(ring)
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is 0 or TAIL_AT, both 8-aligned inside the mapped header (the mapping
        // is page-aligned), live as long as `self`; atomics are the only access to them.
        unsafe { &*self.base.as_ptr().add(at).cast::<AtomicU64>() }
    }

    fn head(&self) -> &AtomicU64 {
        self.word(0)
    }

    fn tail(&self) -> &AtomicU64 {
        self.word(TAIL_AT)
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the data follows the header inside the mapping.
        unsafe { self.base.as_ptr().add(SHM_RING_HEADER_BYTES) }
    }

    /// Bytes published and not read yet, as the writer sees them.
    pub fn used(&self) -> u64 {
        let head = self.head().load(Ordering::Relaxed);
        head.wrapping_sub(self.tail().load(Ordering::Acquire))
    }

    /// Appends `frame` whole if there is room (the writer's side; callers serialise their
    /// pushes). False when the ring lacks room for it now.
    pub fn push(&self, frame: &[u8]) -> bool {
        self.push_parts(&[frame])
    }

    /// Appends the frame made of `parts`, in order, whole if there is room: as [`Ring::push`]
    /// of their concatenation, without building it.
    pub fn push_parts(&self, parts: &[&[u8]]) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let head = self.head().load(Ordering::Relaxed);
        let room = (SHM_RING_BYTES as u64).saturating_sub(self.used());
        if len as u64 > room {
            return false;
        }
        let mut at = (head % SHM_RING_BYTES as u64) as usize;
        for part in parts {
            let first = part.len().min(SHM_RING_BYTES - at);
            // SAFETY: [at, at + first) and [0, part.len() - first) lie inside the data (the
            // whole frame fits the room); the reader reads only bytes below the head, which
            // these are not yet.
            unsafe {
                std::ptr::copy_nonoverlapping(part.as_ptr(), self.data().add(at), first);
                std::ptr::copy_nonoverlapping(
                    part.as_ptr().add(first),
                    self.data(),
                    part.len() - first,
                );
            }
            at = (at + part.len()) % SHM_RING_BYTES;
        }
        self.head().store(head + len as u64, Ordering::Release);
        true
    }

    /// Whether the writer published bytes this reader has not read (the reader's side).
    pub fn pending(&self) -> bool {
        self.head().load(Ordering::Acquire) != self.read
    }

    /// Appends every byte published since the last read to `out` and lets the writer reuse
    /// their room (the reader's side). Errors when the head is behind what was read or more
    /// than the ring ahead of it: the writer broke the rules.
    pub fn read_into(&mut self, out: &mut Vec<u8>) -> Result<(), &'static str> {
        let head = self.head().load(Ordering::Acquire);
        let n = head
            .checked_sub(self.read)
            .filter(|&n| n <= SHM_RING_BYTES as u64)
            .ok_or("announcement ring's head out of bounds")? as usize;
        let at = (self.read % SHM_RING_BYTES as u64) as usize;
        let first = n.min(SHM_RING_BYTES - at);
        out.reserve(n);
        // SAFETY: both pieces lie inside the data; the bytes below the head were published
        // (a writer that breaks the rules changes only what we decode, which checks it all).
        unsafe {
            let dst = out.as_mut_ptr().add(out.len());
            std::ptr::copy_nonoverlapping(self.data().add(at), dst, first);
            std::ptr::copy_nonoverlapping(self.data(), dst.add(first), n - first);
            out.set_len(out.len() + n);
        }
        self.read = head;
        self.tail().store(head, Ordering::Release);
        Ok(())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map`, unmapped only here.
        unsafe { libc::munmap(self.base.as_ptr().cast(), SHM_RING_MEMFD_BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Ring, Ring) {
        let (reader, fd) = Ring::shared().unwrap();
        (reader, Ring::map(&fd).unwrap())
    }

    #[test]
    fn frames_come_out_whole_and_in_order_across_the_wrap() {
        let (mut reader, writer) = pair();
        let mut got = Vec::new();
        let mut sent = Vec::new();
        // Frames of odd lengths, read every few pushes, around the ring several times.
        for i in 0..5000u32 {
            let frame: Vec<u8> = (0..(i % 97 + 1)).map(|b| (b ^ i) as u8).collect();
            assert!(writer.push(&frame));
            sent.extend_from_slice(&frame);
            if i % 7 == 0 {
                reader.read_into(&mut got).unwrap();
            }
        }
        reader.read_into(&mut got).unwrap();
        assert_eq!(got, sent);
        assert!(!reader.pending());
        assert_eq!(writer.used(), 0);
    }

    #[test]
    fn a_full_ring_refuses_until_read_and_a_broken_head_is_refused() {
        let (mut reader, writer) = pair();
        let big = vec![7u8; SHM_RING_BYTES / 2];
        assert!(writer.push(&big));
        assert!(writer.push(&big));
        assert!(!writer.push(&[1]), "full");
        assert!(reader.pending());
        let mut got = Vec::new();
        reader.read_into(&mut got).unwrap();
        assert_eq!(got.len(), SHM_RING_BYTES);
        assert!(writer.push(&[1]));
        // A writer that moves the head back, or more than the ring ahead.
        let head = writer.head().load(Ordering::Relaxed);
        writer.head().store(head - 2, Ordering::Release);
        assert!(reader.read_into(&mut got).is_err());
        writer
            .head()
            .store(head + SHM_RING_BYTES as u64 + 1, Ordering::Release);
        assert!(reader.read_into(&mut got).is_err());
    }

    #[test]
    fn an_unsealed_or_short_memfd_is_refused() {
        let fd = crate::sys::mmap::sized_memfd(c"short", 4096, false).unwrap();
        assert!(Ring::map(&fd).is_err());
    }
}
