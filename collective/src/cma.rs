//! Cross-memory attach: reading a peer process's memory with one `process_vm_readv`, the
//! single-copy path of the large byte-moving collectives (all_gather, all_to_all).
//!
//! The kernel allows it between processes of one user unless a security module forbids it
//! (Yama `ptrace_scope` >= 1 without `PR_SET_PTRACER`, seccomp); every rank probes every peer
//! when the group starts and the group uses this path only if all probes succeeded
//! everywhere (decided through the torch store by `mooncake.pg`). Otherwise the slots carry
//! the bytes (two copies).
//!
//! Invariant: a remote range is read only while its owner is inside the same op (between the
//! phase that published the address and the phase that says every reader is done), so the
//! tensor behind it is alive and unchanged.

use std::io;

use dataplane::sys::cma;

/// Reads `len` bytes at `remote` in process `pid` into `local` (`dataplane::sys::cma`).
///
/// # Safety
/// `local` must be valid for `len` bytes of writes.
pub unsafe fn read(pid: u32, remote: usize, local: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the caller's contract, passed on.
    unsafe { cma::read(pid as libc::pid_t, remote as u64, local, len) }
}

/// Whether 8 bytes at `remote` in `pid` can be read and equal `expect`.
pub fn probe(pid: u32, remote: usize, expect: u64) -> bool {
    cma::probe(pid as libc::pid_t, remote as u64, expect)
}
