//! One worker's file I/O: its aligned bounce buffers, and the ring (or the blocking calls)
//! that move them to and from a file.
//!
//! A worker moves an object in rounds of up to [`DISK_WORKER_BUFFERS`] pieces of at most
//! [`DISK_BOUNCE_BYTES`] each, one per bounce buffer. With io_uring a round is one
//! submission of that many `READ_FIXED`/`WRITE_FIXED` operations (the buffers are registered
//! with the ring once, so the kernel does not map them per operation) and one wait for all
//! of them; without it, the same pieces go through `pread`/`pwrite` one after the other.
//!
//! Invariant: a buffer handed to the kernel is not touched by us until its completion has
//! been reaped; [`Io::run`] returns only when every operation of its round completed. If the
//! ring itself fails mid-round (an `io_uring_enter` error other than an interruption), the
//! ring and its buffers are leaked, never freed or reused, since the kernel may still hold
//! them, and the worker goes on with fresh buffers on the blocking path.

use std::alloc::Layout;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;

use io_uring::{opcode, types, IoUring};

use super::limits::{
    DISK_BLOCK_BYTES, DISK_BOUNCE_BYTES, DISK_RING_ENTRIES, DISK_RING_STUCK_AFTER,
    DISK_WORKER_BUFFERS,
};

/// A zeroed heap buffer aligned to [`DISK_BLOCK_BYTES`], as `O_DIRECT` needs.
pub(super) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain heap memory owned by this value; nothing else points to it
// except the kernel during an operation, which `Io::run` waits out before returning.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    fn layout(len: usize) -> Layout {
        // DISK_BLOCK_BYTES is a power of two and len a small multiple of it: always valid.
        Layout::from_size_align(len, DISK_BLOCK_BYTES).unwrap_or_else(|_| Layout::new::<u8>())
    }

    pub(super) fn new(len: usize) -> AlignedBuf {
        assert!(len > 0 && len.is_multiple_of(DISK_BLOCK_BYTES));
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (asserted above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is a live allocation of `len` initialised (zeroed) bytes owned by
        // `self`; the shared borrow of `self` keeps it from being written meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and the exclusive borrow of `self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn iovec(&mut self) -> libc::iovec {
        libc::iovec {
            iov_base: self.ptr.as_ptr().cast(),
            iov_len: self.len,
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout and not freed before.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) };
    }
}

/// One piece of a round: `len` bytes between bounce buffer `buf` and file offset `offset`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Piece {
    pub buf: usize,
    pub offset: u64,
    pub len: usize,
}

enum Engine {
    // Boxed: the ring is large and the blocking variant empty.
    Uring { ring: Box<IoUring>, fixed: bool },
    Blocking,
}

/// A worker's buffers and the way it moves them.
pub(super) struct Io {
    engine: Engine,
    bufs: Vec<AlignedBuf>,
}

/// Direction of a round.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Dir {
    Read,
    Write,
}

impl Io {
    /// A worker's I/O: a ring of its own when `uring` and the kernel allow it; otherwise the
    /// blocking path and the reason, for the log.
    pub(super) fn new(uring: bool) -> (Io, Option<String>) {
        let mut bufs: Vec<AlignedBuf> = (0..DISK_WORKER_BUFFERS)
            .map(|_| AlignedBuf::new(DISK_BOUNCE_BYTES))
            .collect();
        if !uring {
            return (
                Io {
                    engine: Engine::Blocking,
                    bufs,
                },
                Some("io_uring off by configuration (MOONCAKE_OFFLOAD_USE_URING)".into()),
            );
        }
        let ring = match IoUring::new(DISK_RING_ENTRIES) {
            Ok(r) => r,
            Err(e) => {
                return (
                    Io {
                        engine: Engine::Blocking,
                        bufs,
                    },
                    Some(format!("the kernel refused io_uring ({e})")),
                )
            }
        };
        let iovecs: Vec<libc::iovec> = bufs.iter_mut().map(AlignedBuf::iovec).collect();
        // SAFETY: the buffers stay allocated as long as the ring: both live in this `Io`, and
        // `Io::poison` leaks them together; `Drop` drops the ring (field order: `engine`
        // first) before the buffers.
        let registered = unsafe { ring.submitter().register_buffers(&iovecs) };
        if let Err(e) = &registered {
            // Old kernels count registered buffers against RLIMIT_MEMLOCK.
            tracing::info!(error = %e, "disk tier: bounce buffers not registered with the \
                ring; plain READ/WRITE operations instead of the fixed-buffer ones");
        }
        let fixed = registered.is_ok();
        (
            Io {
                engine: Engine::Uring {
                    ring: Box::new(ring),
                    fixed,
                },
                bufs,
            },
            None,
        )
    }

    pub(super) fn is_uring(&self) -> bool {
        matches!(self.engine, Engine::Uring { .. })
    }

    pub(super) fn buf(&self, i: usize) -> &[u8] {
        self.bufs[i].as_slice()
    }

    pub(super) fn buf_mut(&mut self, i: usize) -> &mut [u8] {
        self.bufs[i].as_mut_slice()
    }

    /// Moves every piece; one result per piece (bytes moved: a read may come up short at the
    /// end of the file, a write never does without an error).
    pub(super) fn run(
        &mut self,
        file: &File,
        dir: Dir,
        pieces: &[Piece],
    ) -> Vec<io::Result<usize>> {
        debug_assert!(pieces.len() <= self.bufs.len());
        if let Engine::Uring { ring, fixed } = &mut self.engine {
            match run_uring(ring, *fixed, &mut self.bufs, file, dir, pieces) {
                Ok(mut results) => {
                    // A short read is finished with pread: a ring may end a read early (a
                    // partly cached range); only pread's 0 means the file ended.
                    for (r, p) in results.iter_mut().zip(pieces) {
                        if let (Dir::Read, Ok(n)) = (dir, &r) {
                            let n = *n;
                            if n < p.len {
                                let buf = &mut self.bufs[p.buf].as_mut_slice()[n..p.len];
                                *r = read_full_at(file, buf, p.offset + n as u64).map(|m| n + m);
                            }
                        }
                    }
                    return results;
                }
                Err(e) => {
                    tracing::error!(
                        error = %e,
                        "disk tier: a worker's io_uring failed; leaking its buffers and \
                         going on with pread/pwrite"
                    );
                    self.poison();
                }
            }
        }
        pieces
            .iter()
            .map(|p| {
                let buf = &mut self.bufs[p.buf].as_mut_slice()[..p.len];
                match dir {
                    Dir::Read => read_full_at(file, buf, p.offset),
                    Dir::Write => file.write_all_at(buf, p.offset).map(|()| p.len),
                }
            })
            .collect()
    }

    /// Leaks the ring and its buffers (the kernel may still use them) and starts over on the
    /// blocking path.
    fn poison(&mut self) {
        let fresh: Vec<AlignedBuf> = (0..DISK_WORKER_BUFFERS)
            .map(|_| AlignedBuf::new(DISK_BOUNCE_BYTES))
            .collect();
        let old = std::mem::replace(&mut self.bufs, fresh);
        let engine = std::mem::replace(&mut self.engine, Engine::Blocking);
        std::mem::forget(old);
        std::mem::forget(engine);
    }
}

/// Where a [`Span`]'s bytes are: one of the worker's bounce buffers, or memory of the
/// caller's that the kernel reads or fills in place (no copy through a bounce buffer).
#[derive(Clone, Copy, Debug)]
pub(super) enum Mem {
    Bounce(usize),
    Caller(*mut u8),
    /// Writes only: `count` iovecs at the pointer, written back to back as one vectored
    /// operation (one submission, one inode lock: the pieces of a file being written would
    /// otherwise queue on the filesystem's lock for a write that extends the file).
    Gather(*const libc::iovec, usize),
}

/// One operation of a windowed run ([`Io::run_window`]): `len` bytes between `mem` and file
/// offset `offset`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub mem: Mem,
    pub offset: u64,
    pub len: usize,
}

impl Io {
    /// Moves every span, keeping up to `window` of them in flight (at most the ring's
    /// entries), and calls `done(bufs, i, result)` as span `i` completes, in completion order.
    /// Returns only once every span submitted has completed: on the ring, a failure to enter
    /// it is retried until every operation in flight is reaped (the kernel may be writing
    /// caller memory), and a ring that keeps failing for [`DISK_RING_STUCK_AFTER`] aborts the
    /// process rather than hand that memory back while the kernel may still use it.
    ///
    /// # Safety
    ///
    /// Every [`Mem::Caller`] span's `len` bytes must stay valid (readable for a write,
    /// writable for a read, and not read by anyone for a read until its `done`) until this
    /// returns.
    pub(super) unsafe fn run_window(
        &mut self,
        file: &File,
        dir: Dir,
        spans: &[Span],
        window: usize,
        mut done: impl FnMut(&[AlignedBuf], usize, io::Result<usize>),
    ) {
        let Engine::Uring { ring, fixed } = &mut self.engine else {
            for (i, s) in spans.iter().enumerate() {
                // SAFETY: the caller's promise for caller spans; bounce spans are ours.
                let r = unsafe { blocking_span(&mut self.bufs, file, dir, s) };
                done(&self.bufs, i, r);
            }
            return;
        };
        let window = window.clamp(1, DISK_RING_ENTRIES as usize);
        let fd = types::Fd(file.as_raw_fd());
        let (mut next, mut inflight) = (0usize, 0usize);
        let mut stuck_since: Option<std::time::Instant> = None;
        let mut reaped: Vec<(usize, i32)> = Vec::with_capacity(window);
        while next < spans.len() || inflight > 0 {
            while next < spans.len() && inflight < window {
                let entry =
                    span_entry(fd, *fixed, &self.bufs, dir, &spans[next]).user_data(next as u64);
                // SAFETY: the span's memory stays valid until its completion is reaped (the
                // caller's promise, or our bounce buffer); the queue has room: at most
                // `window <= DISK_RING_ENTRIES` operations are ever queued or in flight.
                if unsafe { ring.submission().push(&entry) }.is_err() {
                    break;
                }
                next += 1;
                inflight += 1;
            }
            match ring.submit_and_wait(1) {
                Ok(_) => stuck_since = None,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => {}
                Err(e) => {
                    let since = *stuck_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() > DISK_RING_STUCK_AFTER {
                        tracing::error!(error = %e, "disk tier: a worker's io_uring has failed \
                            for too long with operations on caller memory in flight; aborting");
                        std::process::abort();
                    }
                    tracing::warn!(error = %e, "disk tier: io_uring enter failed; retrying");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            reaped.clear();
            reaped.extend(
                ring.completion()
                    .map(|c| (c.user_data() as usize, c.result())),
            );
            for &(i, res) in &reaped {
                let Some(s) = spans.get(i) else { continue };
                inflight -= 1;
                let r = if res < 0 {
                    Err(io::Error::from_raw_os_error(-res))
                } else {
                    // SAFETY: as above: the span's memory is valid until `done`.
                    unsafe { finish_short(&mut self.bufs, file, dir, s, res as usize) }
                };
                done(&self.bufs, i, r);
            }
        }
    }
}

/// The ring operation for `s`.
fn span_entry(
    fd: types::Fd,
    fixed: bool,
    bufs: &[AlignedBuf],
    dir: Dir,
    s: &Span,
) -> io_uring::squeue::Entry {
    let len = s.len as u32;
    match s.mem {
        Mem::Bounce(b) => {
            let ptr = bufs[b].ptr.as_ptr();
            match (dir, fixed) {
                (Dir::Read, true) => opcode::ReadFixed::new(fd, ptr, len, b as u16)
                    .offset(s.offset)
                    .build(),
                (Dir::Read, false) => opcode::Read::new(fd, ptr, len).offset(s.offset).build(),
                (Dir::Write, true) => opcode::WriteFixed::new(fd, ptr, len, b as u16)
                    .offset(s.offset)
                    .build(),
                (Dir::Write, false) => opcode::Write::new(fd, ptr, len).offset(s.offset).build(),
            }
        }
        Mem::Caller(ptr) => match dir {
            Dir::Read => opcode::Read::new(fd, ptr, len).offset(s.offset).build(),
            Dir::Write => opcode::Write::new(fd, ptr, len).offset(s.offset).build(),
        },
        Mem::Gather(iov, count) => opcode::Writev::new(fd, iov, count as u32)
            .offset(s.offset)
            .build(),
    }
}

/// The span's memory as a pointer.
fn span_ptr(bufs: &mut [AlignedBuf], s: &Span) -> Option<*mut u8> {
    match s.mem {
        Mem::Bounce(b) => Some(bufs[b].ptr.as_ptr()),
        Mem::Caller(p) => Some(p),
        Mem::Gather(..) => None,
    }
}

/// A completed ring operation that moved `n` bytes: a short read is finished with `pread`
/// (a ring may end a read early; only `pread`'s 0 means the file ended), a short write is
/// a full disk.
///
/// # Safety
///
/// The span's memory is valid for `s.len` bytes.
unsafe fn finish_short(
    bufs: &mut [AlignedBuf],
    file: &File,
    dir: Dir,
    s: &Span,
    n: usize,
) -> io::Result<usize> {
    if n >= s.len {
        return Ok(n);
    }
    match dir {
        Dir::Write => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
        Dir::Read => {
            let Some(ptr) = span_ptr(bufs, s) else {
                return Err(io::Error::other("a gathered span is written, never read"));
            };
            // SAFETY: `[n, len)` of the span's memory (the caller's promise).
            unsafe { pread_full_raw(file, ptr.add(n), s.len - n, s.offset + n as u64) }
                .map(|m| n + m)
        }
    }
}

/// One span through `pread`/`pwrite`.
///
/// # Safety
///
/// The span's memory is valid for `s.len` bytes.
unsafe fn blocking_span(
    bufs: &mut [AlignedBuf],
    file: &File,
    dir: Dir,
    s: &Span,
) -> io::Result<usize> {
    let ptr = match (span_ptr(bufs, s), s.mem, dir) {
        (Some(p), _, _) => p,
        (None, Mem::Gather(iov, count), Dir::Write) => {
            // The parts one after the other: the same bytes at the same offsets.
            let mut at = s.offset;
            for i in 0..count {
                // SAFETY: `count` iovecs at `iov`, each readable (the caller's promise).
                let part = unsafe { *iov.add(i) };
                let one = Span {
                    mem: Mem::Caller(part.iov_base.cast()),
                    offset: at,
                    len: part.iov_len,
                };
                // SAFETY: as above.
                unsafe { blocking_span(bufs, file, dir, &one) }?;
                at += part.iov_len as u64;
            }
            return Ok(s.len);
        }
        (None, ..) => return Err(io::Error::other("a gathered span is written, never read")),
    };
    // SAFETY: the caller's promise.
    unsafe { full_raw(file, dir, ptr, s.len, s.offset) }
}

/// `pread` into raw memory until `len` bytes are read or the file ends.
///
/// # Safety
///
/// `ptr` is valid for writes of `len` bytes.
unsafe fn pread_full_raw(file: &File, ptr: *mut u8, len: usize, offset: u64) -> io::Result<usize> {
    // SAFETY: the caller's promise.
    unsafe { full_raw(file, Dir::Read, ptr, len, offset) }
}

/// `pread`s or `pwrite`s `len` bytes at `ptr` from file offset `offset` until done, retrying
/// interruptions. A read stops early where the file ends (the count says how far); a write
/// that moves nothing is a full disk.
///
/// # Safety
///
/// `ptr` is valid for `len` bytes: writable for a read, readable for a write.
unsafe fn full_raw(
    file: &File,
    dir: Dir,
    ptr: *mut u8,
    len: usize,
    offset: u64,
) -> io::Result<usize> {
    let fd = file.as_raw_fd();
    let mut done = 0usize;
    while done < len {
        let at = (offset + done as u64) as libc::off_t;
        // SAFETY: `[done, len)` of the caller's memory, as the call needs it.
        let r = unsafe {
            match dir {
                Dir::Read => libc::pread(fd, ptr.add(done).cast(), len - done, at),
                Dir::Write => libc::pwrite(fd, ptr.add(done).cast(), len - done, at),
            }
        };
        match (r, dir) {
            (0, Dir::Read) => break,
            (0, Dir::Write) => return Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            (r, _) if r > 0 => done += r as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(done)
}

/// `pread` until `buf` is full or the file ends.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// One round on the ring. `Err` only when the ring itself failed (operations may be in
/// flight: the caller must not reuse the buffers).
fn run_uring(
    ring: &mut IoUring,
    fixed: bool,
    bufs: &mut [AlignedBuf],
    file: &File,
    dir: Dir,
    pieces: &[Piece],
) -> io::Result<Vec<io::Result<usize>>> {
    let fd = types::Fd(file.as_raw_fd());
    for (i, p) in pieces.iter().enumerate() {
        let ptr = bufs[p.buf].ptr.as_ptr();
        let len = p.len as u32;
        let entry = match (dir, fixed) {
            (Dir::Read, true) => opcode::ReadFixed::new(fd, ptr, len, p.buf as u16)
                .offset(p.offset)
                .build(),
            (Dir::Read, false) => opcode::Read::new(fd, ptr, len).offset(p.offset).build(),
            (Dir::Write, true) => opcode::WriteFixed::new(fd, ptr, len, p.buf as u16)
                .offset(p.offset)
                .build(),
            (Dir::Write, false) => opcode::Write::new(fd, ptr, len).offset(p.offset).build(),
        }
        .user_data(i as u64);
        // SAFETY: the buffer (`p.len <= DISK_BOUNCE_BYTES` bytes of an allocation owned by
        // this worker) and the file stay alive and untouched until the completion is reaped
        // below; this function does not return `Ok` before every completion is in, and on
        // `Err` the caller leaks the buffers (`Io::poison`). The queue has room: a round has
        // at most DISK_WORKER_BUFFERS <= DISK_RING_ENTRIES pieces and the ring is empty
        // between rounds.
        if unsafe { ring.submission().push(&entry) }.is_err() {
            return Err(io::Error::other("io_uring submission queue full"));
        }
    }
    let mut results: Vec<Option<io::Result<usize>>> = (0..pieces.len()).map(|_| None).collect();
    let mut left = pieces.len();
    while left > 0 {
        match ring.submit_and_wait(left) {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => {}
            Err(e) => return Err(e),
        }
        for cqe in ring.completion() {
            let Some(slot) = results.get_mut(cqe.user_data() as usize) else {
                continue;
            };
            let r = cqe.result();
            *slot = Some(if r < 0 {
                Err(io::Error::from_raw_os_error(-r))
            } else {
                Ok(r as usize)
            });
            left -= 1;
        }
    }
    // A short read of a regular file ends at end of file; a short write means no room.
    Ok(results
        .into_iter()
        .zip(pieces)
        .map(|(r, p)| match (r, dir) {
            (Some(Ok(n)), Dir::Write) if n < p.len => {
                Err(io::Error::from_raw_os_error(libc::ENOSPC))
            }
            (Some(r), _) => r,
            (None, _) => Err(io::Error::other("io_uring completion missing")),
        })
        .collect())
}

impl Drop for Io {
    fn drop(&mut self) {
        // The ring goes first (it unregisters the buffers); then the buffers.
        self.engine = Engine::Blocking;
    }
}
