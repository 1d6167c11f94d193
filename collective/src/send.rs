//! Sending a batch of byte ranges completely over a pg or EP link ([`send_all`]).

use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::net::dead_after;

/// Sends `parts` completely (`sendmsg`, no SIGPIPE), giving up when `alive` goes false or no
/// byte moved for the liveness timeout.
pub(crate) fn send_all(
    sock: &TcpStream,
    parts: &[(*const u8, usize)],
    alive: &AtomicBool,
) -> io::Result<()> {
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .filter(|p| p.1 > 0)
        .map(|&(p, l)| libc::iovec {
            iov_base: p as *mut libc::c_void,
            iov_len: l,
        })
        .collect();
    let mut first = 0;
    let mut last_progress = Instant::now();
    while first < iov.len() {
        // SAFETY: plain data, zeroed is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov[first..].as_mut_ptr();
        msg.msg_iovlen = (iov.len() - first).min(1024) as _;
        // SAFETY: the iovecs describe memory the caller keeps valid for the call (own
        // segment ranges and local buffers); the socket is ours.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    if !alive.load(Ordering::Acquire) {
                        return Err(io::Error::new(io::ErrorKind::BrokenPipe, "peer is dead"));
                    }
                    if last_progress.elapsed() > dead_after() {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "send stalled"));
                    }
                    continue;
                }
                _ => return Err(e),
            }
        }
        last_progress = Instant::now();
        let mut n = n as usize;
        while first < iov.len() && n >= iov[first].iov_len {
            n -= iov[first].iov_len;
            first += 1;
        }
        if n > 0 {
            let v = &mut iov[first];
            // SAFETY: `n` is less than this iovec's length, so the result stays inside it.
            v.iov_base = unsafe { v.iov_base.cast::<u8>().add(n) }.cast();
            v.iov_len -= n;
        }
    }
    Ok(())
}
