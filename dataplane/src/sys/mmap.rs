//! File descriptors and shared mappings: the `fstat`, `mmap`, `memfd_create` and seal calls
//! under segments (`mem::segment`), same-host offers (`mem::shm`), the write page
//! (`recovery::inflight`) and the collectives' segments (crate `mooncake-collective`).

use std::io;
use std::ptr::NonNull;

use crate::limits::HUGE_PAGE_BYTES;

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
///
/// From [`HUGE_PAGE_BYTES`] up the mapping is placed so that its address and `offset` agree
/// modulo 2 MiB ([`huge_aligned_hint`]): only then can the kernel map a 2 MiB page of the
/// file (a transparent hugepage a segment's populator collapsed, `mem::segment`) with one
/// page-table entry in every process mapping it, one fault per 2 MiB instead of 512. The
/// kernel does not align shared memory by itself unless `shmem_enabled` allows hugepages.
pub(crate) fn mmap_shared_at(
    fd: std::os::fd::BorrowedFd<'_>,
    len: usize,
    offset: libc::off_t,
) -> io::Result<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    let reserved = HugeReservation::new(len, offset);
    let (at, flags) = match &reserved {
        Some(r) => (r.at, libc::MAP_SHARED | libc::MAP_FIXED),
        None => (std::ptr::null_mut(), libc::MAP_SHARED),
    };
    // SAFETY: a fresh shared mapping of a descriptor we hold, at a kernel-chosen address, or
    // (`MAP_FIXED`) over part of an inaccessible reservation of our own that nothing else
    // uses; it aliases no Rust object.
    let p = unsafe {
        libc::mmap(
            at,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd.as_raw_fd(),
            offset,
        )
    };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        if let Some(r) = reserved {
            r.trim(0);
        }
        return Err(e);
    }
    if let Some(r) = reserved {
        r.trim(len);
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Address space reserved (`PROT_NONE`, `MAP_NORESERVE`: no memory) for a mapping of `len`
/// bytes at a file `offset`, 2 MiB longer than it, and the place `at` inside it whose address
/// agrees with `offset` modulo [`HUGE_PAGE_BYTES`]. The caller maps over `at` with
/// `MAP_FIXED`, then [`Self::trim`]s the rest of the reservation away.
struct HugeReservation {
    base: *mut libc::c_void,
    span: usize,
    at: *mut libc::c_void,
}

impl HugeReservation {
    /// `None` below 2 MiB (nothing to gain) or when the reservation cannot be made.
    fn new(len: usize, offset: libc::off_t) -> Option<HugeReservation> {
        if len < HUGE_PAGE_BYTES {
            return None;
        }
        let span = len.checked_add(2 * HUGE_PAGE_BYTES)?;
        // SAFETY: a fresh inaccessible private reservation at a kernel-chosen address.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let mask = HUGE_PAGE_BYTES - 1;
        let start = base as usize;
        let mut at = (start & !mask) + (offset as usize & mask);
        if at < start {
            at += HUGE_PAGE_BYTES;
        }
        Some(HugeReservation {
            base,
            span,
            at: at as *mut libc::c_void,
        })
    }

    /// Unmaps the reservation around `at..at + len` (which the caller mapped over; all of it
    /// for `len == 0`).
    fn trim(self, len: usize) {
        let page = base_page_bytes();
        let start = self.base as usize;
        let head = if len == 0 {
            self.span
        } else {
            self.at as usize - start
        };
        let end = (self.at as usize + len).next_multiple_of(page);
        // SAFETY: both ranges are parts of our own reservation outside the caller's mapping
        // (`at..end`), page aligned; nothing else uses them.
        unsafe {
            if head > 0 {
                libc::munmap(self.base, head);
            }
            if len > 0 && start + self.span > end {
                libc::munmap(end as *mut libc::c_void, start + self.span - end);
            }
        }
    }
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

/// Maps the first `len` bytes of `fd`, a memfd another process shares with us (`what` names
/// it in errors), read and write. Refused (`PermissionDenied`) unless it is sealed at its
/// size, so that the other process cannot shrink it under our mapping (a `SIGBUS` here), and
/// (`InvalidData`) if it is shorter than `len`.
pub(crate) fn map_sealed(
    fd: std::os::fd::BorrowedFd<'_>,
    len: usize,
    what: &str,
) -> io::Result<NonNull<u8>> {
    if !size_sealed(fd)? {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{what} memfd is not sealed against shrinking and growing"),
        ));
    }
    if (fstat(fd)?.st_size as u64) < len as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} is smaller than {len} bytes"),
        ));
    }
    mmap_shared(fd, len)
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
