//! Caller memory: a range of this process's address space that Python (or another caller of
//! the zero-copy calls) handed over as an integer.
//!
//! The boundary rule: an integer never becomes a Rust reference in safe code. A
//! [`CallerRange`] is made only by [`Store::caller_range`](super::Store::caller_range) and
//! [`Store::caller_range_mut`](super::Store::caller_range_mut), and a dummy client's
//! `StoreApi::api_caller_range` (`super::api`), which check what can be checked (the range
//! lies in one registered buffer or the dummy's shared region, or is mapped with the needed
//! permissions right now); a bad range is `INVALID_PARAMS`, never a crash. What cannot be checked (that
//! the memory stays mapped, and that nobody else reads or writes it while we use it) is the
//! caller's promise, so every way to use the range is an `unsafe fn` whose `# Safety` section
//! states that promise, and the code that calls it says at the call why the promise holds.
//! What those give is a raw range (`dataplane::mem::{Src, Dst}`), not a slice: the bytes are
//! touched only by the memcpy, socket call or RDMA request at the bottom of the data path, so
//! another thread (or Python) using the same buffer meanwhile garbles bytes, never Rust's
//! aliasing rules.
//!
//! A `CallerRange` is neither `Clone` nor `Copy`: one checked range, one user.

use std::ptr::NonNull;

use dataplane::mem::{Dst, Src};

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

    /// The range to read from, for as long as `self` is borrowed.
    ///
    /// # Safety
    /// For that whole borrow the memory stays mapped, and no Rust reference writes it.
    pub unsafe fn src(&self) -> Src<'_> {
        // SAFETY: `ptr` was checked to start `len` readable bytes (or is dangling for an empty
        // range); that they stay mapped for the borrow is this function's contract.
        unsafe { Src::from_raw(self.ptr.as_ptr(), self.len) }
    }

    /// The range to read from for a lifetime the caller picks (for batches that hold many
    /// ranges at once and outlive the planning code that checked them).
    ///
    /// # Safety
    /// As [`Self::src`], for all of `'a`.
    pub unsafe fn into_src<'a>(self) -> Src<'a> {
        // SAFETY: as `src`; the caller's contract covers all of `'a`.
        unsafe { Src::from_raw(self.ptr.as_ptr(), self.len) }
    }

    /// The range to write into for a lifetime the caller picks. Panics on a range checked
    /// only readable: that is a bug in the caller, not bad input.
    ///
    /// # Safety
    /// For all of `'a` the memory stays mapped and writable, and no Rust reference reads or
    /// writes it.
    pub unsafe fn into_dst<'a>(self) -> Dst<'a> {
        assert!(
            self.writable,
            "a read-only caller range used as a destination"
        );
        // SAFETY: `ptr` was checked to start `len` writable bytes (or is dangling for an
        // empty range); that they stay so for `'a` is this function's contract, and `self`
        // is consumed, so no second `Dst` comes from it.
        unsafe { Dst::from_raw(self.ptr.as_ptr(), self.len) }
    }
}

// SAFETY: a `CallerRange` is an address and a length; which thread uses it changes nothing
// about the contract of its unsafe accessors, which every user must meet wherever it runs.
unsafe impl Send for CallerRange {}
// SAFETY: through `&CallerRange` only `src` gives access, and only to read; a `Dst` needs
// the range by value.
unsafe impl Sync for CallerRange {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_null_ranges() {
        let e = CallerRange::checked(0, 0, true).expect("empty range");
        assert!(e.is_empty());
        // SAFETY: an empty range touches no memory.
        assert!(unsafe { e.src() }.to_vec().is_empty());
        assert!(CallerRange::checked(0, 8, false).is_none());
    }

    #[test]
    fn views_see_the_bytes() {
        let mut buf = [1u8, 2, 3, 4];
        let r = CallerRange::checked(buf.as_mut_ptr() as u64, 4, true).expect("range");
        assert_eq!((r.len(), r.writable()), (4, true));
        // SAFETY: `buf` is live and untouched by Rust references until the range's last use.
        let mut d = unsafe { r.into_dst() };
        Src::from(&[9u8][..]).copy_to(&mut d);
        assert_eq!(d.as_src().to_vec(), vec![9, 2, 3, 4]);
    }

    #[test]
    #[should_panic(expected = "read-only caller range")]
    fn read_only_range_is_not_a_destination() {
        let buf = [0u8; 4];
        let r = CallerRange::checked(buf.as_ptr() as u64, 4, false).expect("range");
        // SAFETY: panics before any range exists.
        let _ = unsafe { r.into_dst() };
    }
}
