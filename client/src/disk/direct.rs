//! The direct path: an object's data moved straight between its file and the caller's
//! memory, with no copy through a worker's bounce buffers.
//!
//! A file is its header block, then the data from a block-aligned offset, padded to a whole
//! block (`format`). So when the caller's memory is block-aligned too (or the tier runs
//! without `O_DIRECT`), the data's whole blocks go to or from it in place, in pieces of
//! [`DISK_DIRECT_PIECE_BYTES`], up to [`DISK_DIRECT_WINDOW`] operations in flight at once;
//! only the header block and a partial last block pass through bounce buffers. Measured on
//! this project's VM (`bench/README.md`, "The disk tier"): the bounce path's rounds of four
//! 256 KiB reads, one round after the other, kept about 1 MiB in flight and copied every byte
//! once more; one window over the whole object keeps the device as busy as one large
//! `O_DIRECT` read does.
//!
//! Reads check the header first and the data's crc in file order as pieces complete (they
//! may complete in any order), publishing a streamed read's progress only up to the last
//! piece checked in order. The crc is taken in place (`super::crc`): the caller's bytes are
//! never formed into a Rust slice (`dataplane::sys::bytes`).
//!
//! Writes take the crc of the source first, then write header, data and tail as one
//! vectored write (`Mem::Gather`): as separate operations, each extending the new file, they
//! queued on ext4's inode lock in the kernel's io_uring workers (seen in `perf`).
//!
//! Which objects take it: a whole-object read into block-aligned memory (the disk listener's
//! buffers are; a store's own get into a user buffer usually is not and takes the bounce
//! path; a same-host reader, `super::share`, reads into a block-aligned buffer of its own when
//! the caller's is not), and a write from a block-aligned source (an object at a block-aligned
//! address of a segment).

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use dataplane::mem::{Dst, Src};
use protocol::Version;

use super::crc::crc_of;
use super::format::{self, FileHeader};
use super::io::{AlignedBuf, Dir, Io, Mem, Span};
use super::limits::CRC_SCRATCH_BYTES;
use super::limits::{DISK_BLOCK_BYTES, DISK_DIRECT_PIECE_BYTES, DISK_DIRECT_WINDOW};
use super::worker::{crc_matches, ReadFailure, Worker};

fn is_aligned(addr: u64) -> bool {
    addr.is_multiple_of(DISK_BLOCK_BYTES as u64)
}

/// The spans of an object's file: its header block through bounce buffer 0, its data's whole
/// blocks in place at `data`, its partial last block (if any) through bounce buffer 1.
fn spans_of(hdr_len: u64, size: u64, data: *mut u8) -> Vec<Span> {
    let whole = size / DISK_BLOCK_BYTES as u64 * DISK_BLOCK_BYTES as u64;
    let mut spans = vec![Span {
        mem: Mem::Bounce(0),
        offset: 0,
        len: hdr_len as usize,
    }];
    let mut at = 0u64;
    while at < whole {
        let n = (whole - at).min(DISK_DIRECT_PIECE_BYTES as u64);
        spans.push(Span {
            // The data's pointer plus an offset inside the caller's range.
            mem: Mem::Caller(data.wrapping_add(at as usize)),
            offset: hdr_len + at,
            len: n as usize,
        });
        at += n;
    }
    if whole < size {
        spans.push(Span {
            mem: Mem::Bounce(1),
            offset: hdr_len + whole,
            len: DISK_BLOCK_BYTES,
        });
    }
    spans
}

/// A direct read's state as pieces complete: each piece is checked in file order.
struct InOrder {
    results: Vec<Option<io::Result<usize>>>,
    next: usize,
    crc: crc32fast::Hasher,
    stored_crc: Option<u32>,
    failure: Option<ReadFailure>,
    filled: u64,
    scratch: Vec<u8>,
}

/// What a read checks an object file's header against.
#[derive(Clone, Copy, Debug)]
pub(super) enum Expect<'a> {
    /// The owner's index: the object's key (which sets the header's length) and size.
    Key(&'a str),
    /// A reader in another process (`super::share`), which has the replica's descriptor but
    /// not its key: the put's version and the size, with a one-block header (a key of up to
    /// `DISK_BLOCK_BYTES - FILE_HEADER_FIXED_BYTES` bytes; a longer one reads as a mismatch).
    Version(Version),
}

impl Expect<'_> {
    /// Where the data starts.
    pub(super) fn header_len(self) -> u64 {
        match self {
            Expect::Key(key) => format::header_len(key.len()),
            Expect::Version(_) => DISK_BLOCK_BYTES as u64,
        }
    }

    /// Decodes the header at the start of `b` and checks it is the one expected for `size`
    /// data bytes; returns its data crc.
    pub(super) fn check(self, b: &[u8], size: u64) -> Result<u32, ReadFailure> {
        let h =
            FileHeader::decode(b).map_err(|e| ReadFailure::Corrupt(format!("bad header: {e}")))?;
        let fits = match self {
            Expect::Key(key) => h.key == key,
            Expect::Version(v) => h.version == v && h.header_len() == self.header_len(),
        };
        if !fits || h.size != size {
            return Err(ReadFailure::Corrupt(format!(
                "header names {:?} v{} of {} bytes, the reader expected {self:?} of {size}",
                h.key, h.version, h.size
            )));
        }
        Ok(h.data_crc)
    }
}

/// Whether a read of `dst.len()` bytes from `offset` of an object of `size` bytes can go
/// straight into `dst` (`direct`: the file is opened with `O_DIRECT`).
pub(super) fn can_read_direct(direct: bool, size: u64, offset: u64, dst: &Dst<'_>) -> bool {
    offset == 0 && dst.len() as u64 == size && (!direct || is_aligned(dst.addr()))
}

/// Reads the whole object of `size` bytes from `file` into `dst` in place and checks its
/// header (`expect`) and crc; tells `checked` how much of `dst` (bytes from its start) is
/// checked as pieces complete, so the caller can use them while the rest is read. `dst` must
/// be `size` bytes, block-aligned when `file` is `O_DIRECT` ([`can_read_direct`]).
pub(super) fn read_direct(
    io: &mut Io,
    file: &File,
    expect: Expect<'_>,
    size: u64,
    dst: &mut Dst<'_>,
    mut checked: impl FnMut(u64),
) -> Result<(), ReadFailure> {
    let hdr_len = expect.header_len();
    let base = dst.as_mut_ptr();
    let spans = spans_of(hdr_len, size, base);
    let mut st = InOrder {
        results: (0..spans.len()).map(|_| None).collect(),
        next: 0,
        crc: crc32fast::Hasher::new(),
        stored_crc: None,
        failure: None,
        filled: 0,
        scratch: vec![0u8; CRC_SCRATCH_BYTES],
    };
    let on_done = |bufs: &[AlignedBuf], i: usize, r: io::Result<usize>| {
        st.results[i] = Some(r);
        while let Some(r) = st.results.get_mut(st.next).and_then(Option::take) {
            let s = spans[st.next];
            st.next += 1;
            if st.failure.is_none() {
                check_piece(&mut st, s, r, (expect, size, hdr_len), base, bufs);
            }
        }
        if st.failure.is_none() {
            checked(st.filled);
        }
    };
    // SAFETY: every caller span lies inside `dst` (`spans_of` cuts `[0, size)` of it, and
    // `dst.len() == size`), which is writable and ours until this returns; its bytes are
    // read (for the crc) only after their piece completed.
    unsafe { io.run_window(file, Dir::Read, &spans, DISK_DIRECT_WINDOW, on_done) };
    if let Some(f) = st.failure {
        return Err(f);
    }
    crc_matches(st.stored_crc, st.crc.finalize())
}

impl Worker {
    /// Whether a read of `dst.len()` bytes from `offset` of an object of `size` bytes can go
    /// straight into `dst`.
    pub(super) fn can_read_direct(&self, size: u64, offset: u64, dst: &Dst<'_>) -> bool {
        can_read_direct(self.shared.direct, size, offset, dst)
    }

    /// Whether `src` can be written to a file straight from its memory.
    pub(super) fn can_write_direct(&self, src: &Src<'_>) -> bool {
        !self.shared.direct || is_aligned(src.addr())
    }

    /// Writes the file for `src` straight from its memory: the crc first (it goes in the
    /// header), then header, data and tail together. Returns the file's physical bytes.
    pub(super) fn write_direct(
        &mut self,
        path: &PathBuf,
        header: &mut FileHeader,
        src: Src<'_>,
    ) -> io::Result<u64> {
        super::bump(&self.shared.stats.direct_writes);
        let file = self.open(path, true)?;
        let mut crc = crc32fast::Hasher::new();
        crc_of(&mut crc, src, &mut vec![0u8; CRC_SCRATCH_BYTES]);
        header.data_crc = crc.finalize();
        let block = header.encode();
        let hdr_len = block.len() as u64;
        let size = src.len() as u64;
        self.io.buf_mut(0)[..block.len()].copy_from_slice(&block);
        let whole = size / DISK_BLOCK_BYTES as u64 * DISK_BLOCK_BYTES as u64;
        if whole < size {
            let tail = &mut self.io.buf_mut(1)[..DISK_BLOCK_BYTES];
            let n = (size - whole) as usize;
            src.tail(whole as usize)
                .copy_to(&mut Dst::from(&mut tail[..n]));
            tail[n..].fill(0);
        }
        // One vectored write of header, data and tail: the file's pieces written as
        // separate operations queue on the filesystem's inode lock (each extends the file).
        let mut parts = vec![libc::iovec {
            iov_base: self.io.buf_mut(0).as_mut_ptr().cast(),
            iov_len: hdr_len as usize,
        }];
        if whole > 0 {
            parts.push(libc::iovec {
                iov_base: src.as_ptr().cast_mut().cast(),
                iov_len: whole as usize,
            });
        }
        if whole < size {
            parts.push(libc::iovec {
                iov_base: self.io.buf_mut(1).as_mut_ptr().cast(),
                iov_len: DISK_BLOCK_BYTES,
            });
        }
        let total = parts.iter().map(|p| p.iov_len).sum();
        let span = Span {
            mem: Mem::Gather(parts.as_ptr(), parts.len()),
            offset: 0,
            len: total,
        };
        let mut first_error: Option<io::Error> = None;
        // SAFETY: the iovecs (alive in `parts` until after this call) name the header and
        // tail bounce buffers and `[0, whole)` of `src`, all readable for this call; the
        // kernel only reads them.
        unsafe {
            self.io
                .run_window(&file, Dir::Write, &[span], 1, |_, _, r| {
                    if let Err(e) = r {
                        first_error = Some(e);
                    }
                })
        };
        if let Some(e) = first_error {
            return Err(e);
        }
        Ok(file.metadata()?.blocks() * 512)
    }
}

/// Checks piece `s` of a direct read (the next in file order) and takes its data into the
/// crc (and a partial last block into `dst`).
fn check_piece(
    st: &mut InOrder,
    s: Span,
    r: io::Result<usize>,
    (expect, size, hdr_len): (Expect<'_>, u64, u64),
    base: *mut u8,
    bufs: &[AlignedBuf],
) {
    let n = match r {
        Ok(n) => n,
        Err(e) => return st.failure = Some(ReadFailure::Io(e)),
    };
    if n < s.len {
        st.failure = Some(ReadFailure::Corrupt(format!(
            "file cut short: {} bytes, its header needs {}",
            s.offset + n as u64,
            hdr_len + format::round_up(size).unwrap_or(u64::MAX)
        )));
        return;
    }
    match s.mem {
        Mem::Bounce(0) => match expect.check(&bufs[0].as_slice()[..s.len], size) {
            Ok(c) => st.stored_crc = Some(c),
            Err(f) => st.failure = Some(f),
        },
        Mem::Bounce(_) => {
            let at = s.offset - hdr_len;
            let bytes = &bufs[1].as_slice()[..(size - at) as usize];
            st.crc.update(bytes);
            // SAFETY: `[at, size)` lies inside the destination (`read_direct`'s promise).
            let mut d = unsafe { Dst::from_raw(base.wrapping_add(at as usize), bytes.len()) };
            Src::from(bytes).copy_to(&mut d);
            st.filled = size;
        }
        Mem::Gather(..) => st.failure = Some(ReadFailure::Corrupt("a gathered read".into())),
        Mem::Caller(p) => {
            // SAFETY: the piece completed; its `s.len` bytes at `p` lie inside the
            // destination and nobody writes them now.
            let src = unsafe { Src::from_raw(p, s.len) };
            crc_of(&mut st.crc, src, &mut st.scratch);
            st.filled = s.offset - hdr_len + s.len as u64;
        }
    }
}
