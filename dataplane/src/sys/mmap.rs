//! File descriptors and shared mappings: the `fstat`, `mmap`, `memfd_create` and seal calls
//! under segments (`mem::segment`), same-host offers (`mem::shm`), the write page
//! (`recovery::inflight`) and the collectives' segments (crate `mooncake-collective`).

use std::io;
use std::ptr::NonNull;

/// The base page size (`sysconf(_SC_PAGESIZE)`, 4 KiB if it cannot be read).
pub fn base_page_bytes() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 && (v as usize).is_power_of_two() {
        v as usize
    } else {
        4096
    }
}

/// `fstat(2)` of `fd` (its size, its block size: hugetlb or not).
pub fn fstat(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<libc::stat> {
    use std::os::fd::AsRawFd;
    // SAFETY: stat is plain data; all-zero is a valid value for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open for the call and `st` is a live stat buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Maps the first `len` bytes of `fd` shared, readable and writable, at a kernel-chosen
/// address (used for our own memfd, for one received from a same-host exporter, for the write
/// page, and for the segments and EP buffers of the `mooncake-collective` crate).
pub fn mmap_shared(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> io::Result<NonNull<u8>> {
    mmap_shared_at(fd, len, 0)
}

/// [`mmap_shared`] of the `len` bytes at `offset` (a multiple of the page size) of `fd`.
pub(crate) fn mmap_shared_at(
    fd: std::os::fd::BorrowedFd<'_>,
    len: usize,
    offset: libc::off_t,
) -> io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of a descriptor we hold, at a kernel-chosen address; it
    // aliases no Rust object.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// The seals every memfd handed to another process carries ([`sized_memfd`]), and which an
/// importer checks ([`size_sealed`]): nobody, the exporter included, can shrink the file
/// under a mapping (a page past its end faults with `SIGBUS` in every process mapping it) or
/// grow it.
pub(crate) const SIZE_SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// A new memfd named `name` of `len` bytes, sealed with [`SIZE_SEALS`] and `F_SEAL_SEAL` (so
/// that no holder adds a seal later, such as a write seal that would stop the next importer
/// from mapping it writable); hugetlb pages with `huge`. Linux supports seals on hugetlb
/// memfds since 4.16; where it does not, `memfd_create` refuses the pair of flags and the
/// caller falls back to ordinary pages: a memfd that leaves this process is always sealed.
pub(crate) fn sized_memfd(
    name: &std::ffi::CStr,
    len: usize,
    huge: bool,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let flags =
        libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | if huge { libc::MFD_HUGETLB } else { 0 };
    // SAFETY: a valid NUL-terminated name and flags; the result is checked.
    let raw = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "memfd size overflows"))?;
    // SAFETY: ftruncate on our own descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl on our own descriptor; the seals are constants.
    if unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            SIZE_SEALS | libc::F_SEAL_SEAL,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Whether `fd` carries both [`SIZE_SEALS`], so that its size cannot change while it is
/// mapped. False for a file that takes no seals (`EINVAL`: not a memfd or tmpfs file).
pub(crate) fn size_sealed(fd: std::os::fd::BorrowedFd<'_>) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor the caller holds open; F_GET_SEALS reads only.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EINVAL) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(seals & SIZE_SEALS == SIZE_SEALS)
}
