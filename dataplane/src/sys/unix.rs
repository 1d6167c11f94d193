//! Same-host unix sockets: who the peer is (`SO_PEERCRED`), whether it still holds its end,
//! and one descriptor passed with a message (`SCM_RIGHTS`). The same-host segment exchange
//! (`mem::shm`) and the disk tier's directory share (the client crate) are built on these.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};

/// Connects to the abstract unix socket `name`; `None` when nobody on this host listens there.
pub fn connect_abstract(name: &str) -> io::Result<Option<UnixStream>> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
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

/// True when the process at the other end of `conn` runs as this process's user or as root:
/// the only peers a local socket that hands out memory may serve (`SO_PEERCRED`), and the
/// only exporters an importer maps.
pub fn peer_is_trusted(conn: &UnixStream) -> bool {
    peer_cred(conn).as_ref().is_some_and(trusted)
}

pub fn trusted(cred: &libc::ucred) -> bool {
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    cred.uid == me || cred.uid == 0
}

/// Whether the process listening on `conn`'s name (its credentials when it called `listen`)
/// runs as our user or as root, the rule [`trusted`] applies to peers the other way; `Err`
/// says who it is instead ("pid P runs as uid U: neither ours (M) nor root's"), or that its
/// credentials cannot be read. A connector checks it before it reads a byte the listener
/// sends.
pub fn check_listener(conn: &UnixStream) -> Result<(), String> {
    match peer_cred(conn) {
        Some(cred) if trusted(&cred) => Ok(()),
        Some(cred) => Err(format!(
            "pid {} runs as uid {}: neither ours ({}) nor root's",
            cred.pid,
            cred.uid,
            // SAFETY: getuid has no preconditions.
            unsafe { libc::getuid() }
        )),
        None => Err("credentials cannot be read".into()),
    }
}

pub fn peer_cred(conn: &UnixStream) -> Option<libc::ucred> {
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

/// False once the peer closed its end (a peek returns 0 bytes or an error other than "no
/// data yet").
pub fn peer_alive(fd: RawFd) -> bool {
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

pub fn send_with_fd(conn: &UnixStream, bytes: &[u8], fd: RawFd) -> io::Result<()> {
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

/// Receives one message into `bytes` and the one descriptor it must carry; returns the
/// message's length.
pub fn recv_with_fd(conn: &UnixStream, bytes: &mut [u8]) -> io::Result<(usize, OwnedFd)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_buffer_fits_one_descriptor() {
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
        assert_eq!(space, CMSG_SPACE_ONE_FD);
    }
}
