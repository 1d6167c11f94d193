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

/// Reads `len` bytes at `remote` in process `pid` into `local`.
///
/// # Safety
/// `local` must be valid for `len` bytes of writes.
pub unsafe fn read(pid: u32, remote: usize, local: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        let l = libc::iovec {
            // SAFETY: inside `local`'s `len` bytes (caller's contract).
            iov_base: unsafe { local.add(done) }.cast(),
            iov_len: len - done,
        };
        let r = libc::iovec {
            iov_base: (remote + done) as *mut libc::c_void,
            iov_len: len - done,
        };
        // SAFETY: one local and one remote iovec describing the ranges above; the kernel
        // checks the remote range against the peer's mappings.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &l, 1, &r, 1, 0) };
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
                "process_vm_readv read 0",
            ));
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether 8 bytes at `remote` in `pid` can be read and equal `expect`.
pub fn probe(pid: u32, remote: usize, expect: u64) -> bool {
    let mut v = 0u64;
    // SAFETY: `v` is 8 writable bytes.
    unsafe { read(pid, remote, (&mut v as *mut u64).cast(), 8) }.is_ok() && v == expect
}
