//! Caller memory: a range of this process's address space that Python (or another caller of
//! the zero-copy calls) handed over as an integer.
//!
//! The boundary rule: an integer never becomes a Rust reference in safe code. A
//! [`CallerRange`] is made only by [`Store::caller_range`](super::Store::caller_range) and
//! [`Store::caller_range_mut`](super::Store::caller_range_mut), which check what can be
//! checked (the range lies in one registered buffer, or is mapped with the needed permissions
//! right now); a bad range is `INVALID_PARAMS`, never a crash. What cannot be checked (that
//! the memory stays mapped, and that nobody else reads or writes it while we use it) is the
//! caller's promise, so every way to see the range as a slice is an `unsafe fn` whose
//! `# Safety` section states that promise, and the code that calls it says at the call why
//! the promise holds.
//!
//! A `CallerRange` is neither `Clone` nor `Copy`: one checked range, one user.

use std::ptr::NonNull;

/// A checked range of caller memory: `len` bytes at `addr`, readable, and writable when made
/// by `caller_range_mut`.
#[derive(Debug)]
pub struct CallerRange {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

impl CallerRange {
    /// A range the store has checked (see `Store::caller_ok`). An empty range gets a dangling,
    /// aligned pointer, which is what an empty slice needs.
    pub(super) fn checked(addr: u64, len: u64, writable: bool) -> Option<CallerRange> {
        let len = usize::try_from(len).ok()?;
        let ptr = if len == 0 {
            NonNull::dangling()
        } else {
            NonNull::new(addr as *mut u8)?
        };
        Some(CallerRange { ptr, len, writable })
    }

    /// The first byte's address (dangling for an empty range).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the range was checked writable (`caller_range_mut`).
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The range as bytes, for as long as `self` is borrowed.
    ///
    /// # Safety
    /// For that whole borrow the memory stays mapped and nothing writes it: not another
    /// thread, not Python, not another `CallerRange` over the same bytes.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is non-null and, for `len > 0`, was checked to start `len` readable
        // bytes (for `len == 0` it is dangling and aligned, which an empty slice allows);
        // that they stay valid and unwritten for the borrow is this function's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The range as bytes for a lifetime the caller picks (for batches that hold many ranges'
    /// bytes at once and outlive the planning code that checked them).
    ///
    /// # Safety
    /// As [`Self::as_slice`], for all of `'a`.
    pub unsafe fn into_slice<'a>(self) -> &'a [u8] {
        // SAFETY: as `as_slice`; the caller's contract covers all of `'a`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The range as writable bytes for a lifetime the caller picks. Panics on a range checked
    /// only readable: that is a bug in the caller, not bad input.
    ///
    /// # Safety
    /// For all of `'a` the memory stays mapped and nothing else reads or writes it: not
    /// another thread, not Python, not another `CallerRange` over the same bytes.
    pub unsafe fn into_mut_slice<'a>(self) -> &'a mut [u8] {
        assert!(
            self.writable,
            "a read-only caller range used as a destination"
        );
        // SAFETY: `ptr` is non-null and, for `len > 0`, was checked to start `len` writable
        // bytes (for `len == 0` it is dangling and aligned); exclusive use for `'a` is this
        // function's contract, and `self` is consumed, so no other slice comes from it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: a `CallerRange` is an address and a length; which thread uses it changes nothing
// about the contract of its unsafe accessors, which every user must meet wherever it runs.
unsafe impl Send for CallerRange {}
// SAFETY: through `&CallerRange` only `as_slice` gives access, and its contract forbids
// writers for the borrow, so shared use from several threads is reads only.
unsafe impl Sync for CallerRange {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_null_ranges() {
        let e = CallerRange::checked(0, 0, true).expect("empty range");
        assert!(e.is_empty());
        // SAFETY: an empty range touches no memory.
        assert_eq!(unsafe { e.as_slice() }, &[] as &[u8]);
        assert!(CallerRange::checked(0, 8, false).is_none());
    }

    #[test]
    fn views_see_the_bytes() {
        let mut buf = [1u8, 2, 3, 4];
        let r = CallerRange::checked(buf.as_mut_ptr() as u64, 4, true).expect("range");
        assert_eq!((r.len(), r.writable()), (4, true));
        // SAFETY: `buf` is live and used by nothing else until the slice's last use.
        let s = unsafe { r.into_mut_slice() };
        s[0] = 9;
        assert_eq!(s, &[9, 2, 3, 4]);
    }

    #[test]
    #[should_panic(expected = "read-only caller range")]
    fn read_only_range_is_not_a_destination() {
        let buf = [0u8; 4];
        let r = CallerRange::checked(buf.as_ptr() as u64, 4, false).expect("range");
        // SAFETY: panics before any slice exists.
        let _ = unsafe { r.into_mut_slice() };
    }
}
