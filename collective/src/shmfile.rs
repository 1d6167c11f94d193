//! The file under a rank's shared memory: one helper for the `mooncake.pg` segment
//! ([`crate::seg`]) and the EP buffer ([`crate::ep::seg`]), which lay out different headers
//! over the same kind of file.
//!
//! An owner's file ([`create_locked`]) is a new `0600` file at a path of its choosing, sized,
//! locked and mapped shared. The exclusive `flock` is the owner's liveness: the kernel drops
//! it when the process dies, so a peer that can take a shared lock on its own descriptor knows
//! the owner is gone. A file that cannot be sized or locked is removed again, so a failed
//! create leaves nothing behind. A private file ([`memfd`]) is an anonymous memfd of a given
//! size that nobody locks (a replica of a remote rank, a tombstone).
//!
//! Peers open an owner's file through [`dataplane::mem::file::open_peer_segment`], which
//! checks that a path from outside names a regular file of ours; what the header must say is
//! each layout's own check.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use dataplane::sys::mmap::mmap_shared;

pub(crate) fn cpath(path: &str) -> io::Result<CString> {
    CString::new(path).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

/// Creates the file at `path` (which must not exist) with `len` bytes (sparse: pages cost
/// memory once written), takes the owner's exclusive lock on it and maps it shared.
pub(crate) fn create_locked(path: &str, len: usize) -> io::Result<(OwnedFd, NonNull<u8>)> {
    let c = cpath(path)?;
    // SAFETY: `c` is a valid C string; the flags create a new private file.
    let raw = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
            0o600,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor we just opened and own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscalls on our descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0
        // SAFETY: as above.
        || unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0
    {
        let e = io::Error::last_os_error();
        // SAFETY: `c` is valid; removing the file we created.
        unsafe { libc::unlink(c.as_ptr()) };
        return Err(e);
    }
    let base = mmap_shared(fd.as_fd(), len)?;
    Ok((fd, base))
}

/// A fresh anonymous memfd named `name`, `len` bytes long, not mapped and not locked.
pub(crate) fn memfd(name: &CStr, len: usize) -> io::Result<OwnedFd> {
    // SAFETY: a valid NUL-terminated name and flags; the result is checked.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ftruncate on our own descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Unmaps a mapping made by [`create_locked`] or `mmap_shared`.
///
/// # Safety
/// `base..base + len` is one whole mapping of ours, and no reference into it outlives the
/// call.
pub(crate) unsafe fn unmap(base: NonNull<u8>, len: usize) {
    // SAFETY: the caller's promise: our own whole mapping, no reference left.
    unsafe { libc::munmap(base.as_ptr().cast(), len) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_that_fails_leaves_no_file_and_the_owner_holds_the_lock() {
        let path = format!("/dev/shm/mooncake-shmfile-test-{}", std::process::id());
        let _ = std::fs::remove_file(&path);
        let (fd, base) = create_locked(&path, 4096).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4096);
        // A second create of the same path fails (O_EXCL) and must not remove the first's file.
        assert!(create_locked(&path, 4096).is_err());
        assert!(std::path::Path::new(&path).exists());
        // Another open file description cannot take a shared lock while the owner lives.
        let other = std::fs::File::open(&path).unwrap();
        // SAFETY: plain syscall on a descriptor we own.
        let r = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
        assert_ne!(r, 0, "the owner's exclusive lock must be held");
        // SAFETY: our own whole mapping; nothing refers into it.
        unsafe { unmap(base, 4096) };
        drop(fd);
        // SAFETY: as above; the owner is gone, so the shared lock is free.
        let r = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
        assert_eq!(r, 0, "the lock goes with the owner's descriptor");
        std::fs::remove_file(&path).unwrap();
        let fd = memfd(c"mooncake-shmfile-test", 8192).unwrap();
        // SAFETY: fstat on our descriptor into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
        assert_eq!(st.st_size, 8192);
    }
}
