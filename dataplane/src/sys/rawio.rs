//! Blocking socket I/O on raw pointers, and socket tuning.
//!
//! Registered memory is written by remote peers while other threads may read it, so the
//! server never forms `&[u8]`/`&mut [u8]` over it: payloads go between the socket and the
//! memory through `recv`/`send` on raw pointers. Every call retries `EINTR`; a receive
//! timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO`) surfaces as `io::ErrorKind::TimedOut`; end of stream
//! before the range is complete is `io::ErrorKind::UnexpectedEof`.
//!
//! The client's event loop uses the single-call primitives [`sendmsg`], [`recv`] and
//! [`poll`]: they retry `EINTR` only and return every other error unmapped, so that with
//! `MSG_DONTWAIT` a `WouldBlock` means "not ready" and without it "the socket timeout
//! expired".

use std::io::{self, Read};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use super::bytes::{Dst, Src};
use crate::limits::SOCKET_BUFFER_BYTES;

/// Connects to the first of `addrs` that answers within `timeout` each; the last error when
/// none does (`NotFound` when there is no address at all).
pub fn connect_first(
    addrs: impl IntoIterator<Item = std::net::SocketAddr>,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolved to nothing");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn map_timeout(e: io::Error) -> io::Error {
    match e.kind() {
        io::ErrorKind::WouldBlock => io::Error::new(io::ErrorKind::TimedOut, e),
        _ => e,
    }
}

/// Receives exactly `len` bytes into `ptr..ptr+len`.
///
/// # Safety
/// `ptr..ptr+len` must be valid for writes for the duration of the call, and no reference to
/// that memory may be live in Rust code (concurrent raw-pointer access is the caller's
/// protocol-level concern).
pub(crate) unsafe fn recv_exact_raw(fd: RawFd, ptr: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: ptr+done..ptr+len lies within the range the caller vouched for.
        let n = unsafe { libc::recv(fd, ptr.add(done).cast(), len - done, 0) };
        if n > 0 {
            done += n as usize;
        } else if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        } else {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(map_timeout(e));
            }
        }
    }
    Ok(())
}

/// Sends all of `ptr..ptr+len`. `more` sets `MSG_MORE`, so that a header and the payload that
/// follows it leave in one segment.
///
/// # Safety
/// `ptr..ptr+len` must be valid for reads for the duration of the call.
pub(crate) unsafe fn send_all_raw(
    fd: RawFd,
    ptr: *const u8,
    len: usize,
    more: bool,
) -> io::Result<()> {
    let flags = libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 };
    let mut done = 0usize;
    while done < len {
        // SAFETY: ptr+done..ptr+len lies within the range the caller vouched for.
        let n = unsafe { libc::send(fd, ptr.add(done).cast(), len - done, flags) };
        if n >= 0 {
            done += n as usize;
        } else {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(map_timeout(e));
            }
        }
    }
    Ok(())
}

/// Sends all of `buf` (a safe wrapper of [`send_all_raw`]).
pub(crate) fn send_all(fd: RawFd, buf: &[u8], more: bool) -> io::Result<()> {
    // SAFETY: `buf` is a live slice, readable for its whole length during the call.
    unsafe { send_all_raw(fd, buf.as_ptr(), buf.len(), more) }
}

/// Whether bytes the peer sent are waiting to be read on `fd` (`FIONREAD`); false on error.
/// A server holds a write intent's answer only while the request behind it is already
/// arriving (`docs/protocol.md`, CATALOG_PUT): a lone intent is answered at once.
pub(crate) fn has_pending(fd: RawFd) -> bool {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one c_int through the pointer, which is live for the call.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n as *mut libc::c_int) };
    rc == 0 && n > 0
}

/// Reads until `buf` is full or the peer closes; returns the number of bytes read (less than
/// `buf.len()` only at end of stream).
pub(crate) fn read_full(mut stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match stream.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(map_timeout(e)),
        }
    }
    Ok(done)
}

/// Reads exactly `buf.len()` bytes; end of stream first is `UnexpectedEof`.
pub(crate) fn read_exact(stream: &TcpStream, buf: &mut [u8]) -> io::Result<()> {
    if read_full(stream, buf)? < buf.len() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// One `sendmsg` of `bufs` (gathered, in order) with `flags | MSG_NOSIGNAL`; returns the
/// bytes sent, possibly fewer than asked. Retries `EINTR`; other errors unmapped.
pub(crate) fn sendmsg(fd: RawFd, bufs: &[Src<'_>], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: msghdr is a plain C struct for which all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    // `Src` is laid out as `iovec` (asserted in `sys::bytes`); the kernel only reads them.
    msg.msg_iov = bufs.as_ptr().cast_mut().cast::<libc::iovec>();
    msg.msg_iovlen = bufs.len() as _;
    loop {
        // SAFETY: `msg` points at `bufs.len()` iovecs, each a `Src` whose range is readable
        // for at least the call; sendmsg only reads them.
        let n = unsafe { libc::sendmsg(fd, &msg, flags | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One `recv` into `buf` with `flags`; `Ok(0)` for a non-empty `buf` is end of stream.
/// Retries `EINTR`; other errors unmapped.
pub(crate) fn recv(fd: RawFd, buf: &mut Dst<'_>, flags: libc::c_int) -> io::Result<usize> {
    loop {
        // SAFETY: `buf`'s range is writable for its whole length while it is borrowed.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// [`recv`] with `flags` (blocking), after polling with `MSG_DONTWAIT` for up to `budget`
/// (zero: no polling). A caller that expects its answer within microseconds skips the
/// wake-up of a sleeping `recv` (20-40 µs on these VMs); past the budget it sleeps, so a slow
/// peer costs no more than that much CPU. The one busy-poll of the transport client and of
/// the master client.
pub fn recv_spinning(
    fd: RawFd,
    buf: &mut Dst<'_>,
    flags: libc::c_int,
    budget: Duration,
) -> io::Result<usize> {
    if !budget.is_zero() {
        let until = std::time::Instant::now() + budget;
        loop {
            match recv(fd, buf, libc::MSG_DONTWAIT) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() >= until {
                        break;
                    }
                    std::hint::spin_loop();
                }
                other => return other,
            }
        }
    }
    recv(fd, buf, flags)
}

/// Whether process `pid` exists (`kill(pid, 0)`: it does when the call succeeds or is refused
/// for permission).
pub(crate) fn process_exists(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks for existence and permission; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// `poll(2)` on `fds` for at most `timeout` (rounded up to a millisecond, capped at
/// `i32::MAX` ms); returns the number of descriptors with events. `EINTR` returns `Ok(0)`:
/// callers loop and re-check their deadlines anyway.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `fds` is a live, exclusively borrowed slice of `fds.len()` pollfd structs.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if n >= 0 {
        return Ok(n as usize);
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::Interrupted {
        return Ok(0);
    }
    Err(e)
}

fn set_int_opt(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) {
    // SAFETY: `value` is a live c_int and the length passed is its size.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Asks for large send and receive buffers. Best effort: the kernel clamps to its maxima and
/// a refusal only costs throughput. On a listener the sizes are inherited by accepted sockets.
pub(crate) fn set_buffer_sizes(fd: RawFd) {
    let bytes = SOCKET_BUFFER_BYTES as libc::c_int;
    set_int_opt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, bytes);
    set_int_opt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, bytes);
}

/// Accept-queue depth of data-plane listeners.
const LISTEN_BACKLOG: libc::c_int = 4096;

/// Prepares a listener: large buffers (inherited by accepted sockets) and a deep accept queue,
/// so a burst of connects (every client after a restart) does not overflow it: an overflowed
/// SYN costs the connecting peer a 1 s retransmit. Best effort, like the buffer sizes.
pub(crate) fn tune_listener(fd: RawFd) {
    set_buffer_sizes(fd);
    // SAFETY: listen(2) on a socket we own that is already listening; calling it again only
    // changes the backlog (the kernel caps it at net.core.somaxconn).
    unsafe { libc::listen(fd, LISTEN_BACKLOG) };
}

/// `TCP_NODELAY`, large buffers and blocking-operation timeouts for a connected socket.
pub(crate) fn tune_stream(stream: &TcpStream, io_timeout: Duration) -> io::Result<()> {
    stream.set_nodelay(true)?;
    set_buffer_sizes(stream.as_raw_fd());
    stream.set_read_timeout(Some(io_timeout))?;
    stream.set_write_timeout(Some(io_timeout))?;
    Ok(())
}

/// Closes `stream` with a reset (`SO_LINGER` 0): the kernel drops whatever it has not sent
/// yet instead of delivering it after the caller gave up.
///
/// A plain close or `shutdown` keeps the unsent bytes queued and retransmits them. For a peer
/// cut off longer than the I/O timeout that means WRITE payloads the caller already reported
/// as failed land when the link comes back, into ranges the master may by then have given to
/// another object (the fault harness's partition fault found this: another key's bytes read
/// back after a partition).
pub(crate) fn abort(stream: TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt(2) on a socket we own, with a `linger` value of the size passed.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    drop(stream);
}
