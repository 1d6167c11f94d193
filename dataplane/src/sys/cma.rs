//! Cross-memory attach: moving bytes between this process and another one's memory with one
//! kernel copy (`process_vm_readv` / `process_vm_writev`), no shared mapping needed.
//!
//! The kernel allows it where it would allow `ptrace` (same user, no security module saying
//! otherwise: Yama `ptrace_scope` >= 1 without `PR_SET_PTRACER`, seccomp); callers probe
//! first and keep another path for when it is refused. The kernel checks the remote range
//! against the peer's mappings: a bad one is an error (`EFAULT`), never a fault here.
//!
//! Users: the transfer engine's same-host path (`engine::samehost`) and the collectives'
//! single-copy reads (`mooncake-collective`).

use std::io;

/// Reads `len` bytes at `remote` in process `pid` into `local`.
///
/// # Safety
/// `local` must be valid for `len` bytes of writes.
pub unsafe fn read(pid: libc::pid_t, remote: u64, local: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller's contract, passed on.
    unsafe { copy(pid, remote, local, len, false) }
}

/// Writes `len` bytes of `local` at `remote` in process `pid`.
///
/// # Safety
/// `local` must be valid for `len` bytes of reads.
pub unsafe fn write(pid: libc::pid_t, remote: u64, local: *const u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller's contract, passed on; a write only reads `local`.
    unsafe { copy(pid, remote, local.cast_mut(), len, true) }
}

/// Whether 8 bytes at `remote` in `pid` can be read and equal `expect`.
pub fn probe(pid: libc::pid_t, remote: u64, expect: u64) -> bool {
    let mut v = 0u64;
    // SAFETY: `v` is 8 writable bytes.
    unsafe { read(pid, remote, (&mut v as *mut u64).cast(), 8) }.is_ok() && v == expect
}

/// One `process_vm_readv` (or `_writev` with `write`) of what is left, repeated until all
/// moved.
///
/// # Safety
/// `local` must be valid for `len` bytes (writes for a read, reads for a write).
unsafe fn copy(
    pid: libc::pid_t,
    remote: u64,
    local: *mut u8,
    len: usize,
    write: bool,
) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            // SAFETY: inside `local`'s `len` bytes (caller's contract).
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: one local iovec inside the caller's range and one remote iovec, which the
        // kernel checks against the peer's mappings.
        let n = unsafe {
            if write {
                libc::process_vm_writev(pid, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid, &l, 1, &r, 1, 0)
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "cross-memory copy moved 0 bytes",
            ));
        }
        done += n as usize;
    }
    Ok(())
}
