//! Byte ranges the data plane moves without ever seeing them as Rust slices.
//!
//! The bytes a transfer reads from or writes into often belong to someone Rust cannot watch:
//! a Python buffer handed over as an integer, a buffer registered with the transfer engine, a
//! peer's shared segment. Another thread (or Python) may touch them while we copy. Were they
//! `&[u8]`/`&mut [u8]`, two overlapping destinations, or a source some thread writes, would
//! break Rust's aliasing rules even when the bytes come out right. So they travel as a
//! pointer and a length, [`Src`] (to read from) and [`Dst`] (to write into), down to the one
//! place that touches them: `copy_nonoverlapping`, `sendmsg`, `recv`, an RDMA work request.
//! The rule is the one `transport::rawio` states for the server's registered memory.
//!
//! What a `Src<'a>`/`Dst<'a>` promises is that its range is mapped (readable, and for a `Dst`
//! writable) for all of `'a`, and that no Rust reference the range could break is used over
//! it meanwhile. Making one from a slice is safe (the borrow is the promise); making one from
//! an address is `unsafe`, and the maker says why both hold. Who else reads or writes the bytes
//! through raw pointers, syscalls or another process meanwhile is the caller's protocol, not
//! Rust's concern: no reference over them is ever formed here.
//!
//! A `Src` is `Copy` (reads may share); a `Dst` is not, so safe code cannot make two out of
//! one: it is split, chunked or re-borrowed, never duplicated.

use std::marker::PhantomData;
use std::ptr::NonNull;

/// `len` bytes at `ptr`, readable for `'a`. Laid out as a `struct iovec`, so a slice of them
/// is a gather list for `sendmsg` as it stands.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct Src<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _borrow: PhantomData<&'a [u8]>,
}

/// `len` bytes at `ptr`, writable for `'a`.
#[derive(Debug)]
pub struct Dst<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: a `Src` is an address and a length; the memory it names stays readable for `'a`
// from any thread, and nothing here forms a reference over it.
unsafe impl Send for Src<'_> {}
// SAFETY: as for `Send`; through `&Src` the bytes are only read.
unsafe impl Sync for Src<'_> {}
// SAFETY: as for `Src`; a `Dst` is moved, not shared, so one thread writes through it.
unsafe impl Send for Dst<'_> {}
// SAFETY: through `&Dst` nothing is read or written (only `len` and `addr`).
unsafe impl Sync for Dst<'_> {}

// `Src` and `libc::iovec` agree in size, alignment and field offsets (`rawio::sendmsg`
// relies on it); checked when compiled.
const _: () = {
    assert!(std::mem::size_of::<Src<'_>>() == std::mem::size_of::<libc::iovec>());
    assert!(std::mem::align_of::<Src<'_>>() == std::mem::align_of::<libc::iovec>());
    assert!(std::mem::offset_of!(Src<'_>, ptr) == std::mem::offset_of!(libc::iovec, iov_base));
    assert!(std::mem::offset_of!(Src<'_>, len) == std::mem::offset_of!(libc::iovec, iov_len));
};

/// The pointer an empty range carries (never dereferenced).
fn pointer(ptr: *mut u8, len: usize) -> NonNull<u8> {
    if len == 0 {
        return NonNull::dangling();
    }
    NonNull::new(ptr).expect("a non-empty byte range at address 0")
}

impl<'a> Src<'a> {
    /// The range of no bytes.
    pub fn empty() -> Src<'static> {
        Src {
            ptr: NonNull::dangling(),
            len: 0,
            _borrow: PhantomData,
        }
    }

    /// `len` bytes at `ptr`. Panics on a null `ptr` with `len > 0`.
    ///
    /// # Safety
    /// `ptr..ptr + len` stays mapped and readable for all of `'a`, and no `&mut` reference to
    /// any of it is used meanwhile.
    pub unsafe fn from_raw(ptr: *const u8, len: usize) -> Src<'a> {
        Src {
            ptr: pointer(ptr.cast_mut(), len),
            len,
            _borrow: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte's address (dangling for an empty range).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Bytes `start..` of the range. Panics when `start > len`.
    pub fn tail(self, start: usize) -> Src<'a> {
        self.split_at(start).1
    }

    /// `..mid` and `mid..`. Panics when `mid > len`.
    pub fn split_at(self, mid: usize) -> (Src<'a>, Src<'a>) {
        assert!(
            mid <= self.len,
            "split at {mid} of a {}-byte range",
            self.len
        );
        // SAFETY: both halves lie inside `self`, readable for `'a`; `add` stays in bounds
        // (or adds 0 to a dangling pointer).
        unsafe {
            (
                Src::from_raw(self.ptr.as_ptr(), mid),
                Src::from_raw(self.ptr.as_ptr().add(mid), self.len - mid),
            )
        }
    }

    /// Consecutive pieces of at most `size` bytes (none for an empty range). Panics when
    /// `size == 0`.
    pub fn chunks(self, size: usize) -> impl Iterator<Item = Src<'a>> {
        assert!(size > 0, "chunks of zero bytes");
        let mut rest = self;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let (head, tail) = rest.split_at(size.min(rest.len));
            rest = tail;
            Some(head)
        })
    }

    /// Copies the range to `dst`, which must be at least as long. Panics otherwise.
    pub fn copy_to(self, dst: &mut Dst<'_>) {
        assert!(
            self.len <= dst.len,
            "{} bytes into a {}-byte range",
            self.len,
            dst.len
        );
        // SAFETY: `self` is readable and `dst` writable for at least `self.len` bytes; `copy`
        // allows the two to overlap, which raw ranges do not rule out.
        unsafe { std::ptr::copy(self.ptr.as_ptr(), dst.ptr.as_ptr(), self.len) };
    }

    /// The bytes, copied out (for tests and small records).
    pub fn to_vec(self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.copy_to(&mut Dst::from(&mut v[..]));
        v
    }
}

impl<'a> From<&'a [u8]> for Src<'a> {
    fn from(s: &'a [u8]) -> Src<'a> {
        // SAFETY: a shared borrow keeps the slice alive and readable for `'a`.
        unsafe { Src::from_raw(s.as_ptr(), s.len()) }
    }
}

impl<'a> From<&'a Vec<u8>> for Src<'a> {
    fn from(v: &'a Vec<u8>) -> Src<'a> {
        Src::from(v.as_slice())
    }
}

impl<'a> Dst<'a> {
    /// `len` bytes at `ptr`. Panics on a null `ptr` with `len > 0`.
    ///
    /// # Safety
    /// `ptr..ptr + len` stays mapped and writable for all of `'a`, and no Rust reference to
    /// any of it is used meanwhile. Other raw ranges over the same bytes may be: what they
    /// leave there is their callers' protocol.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Dst<'a> {
        Dst {
            ptr: pointer(ptr, len),
            len,
            _borrow: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte's address (dangling for an empty range).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// The pointer to write through; the range stays borrowed from `self` meanwhile.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The same range for a shorter borrow (as `&mut *slice`).
    pub fn reborrow(&mut self) -> Dst<'_> {
        // SAFETY: the range is writable for `'a`, which outlives the borrow, and `self` is
        // unusable while the new `Dst` lives.
        unsafe { Dst::from_raw(self.ptr.as_ptr(), self.len) }
    }

    /// Bytes `start..` of the range, for a shorter borrow. Panics when `start > len`.
    pub fn tail(&mut self, start: usize) -> Dst<'_> {
        self.reborrow().split_at(start).1
    }

    /// `..mid` and `mid..`. Panics when `mid > len`.
    pub fn split_at(self, mid: usize) -> (Dst<'a>, Dst<'a>) {
        assert!(
            mid <= self.len,
            "split at {mid} of a {}-byte range",
            self.len
        );
        // SAFETY: the halves are disjoint parts of `self`, which is consumed; `add` stays in
        // bounds (or adds 0 to a dangling pointer).
        unsafe {
            (
                Dst::from_raw(self.ptr.as_ptr(), mid),
                Dst::from_raw(self.ptr.as_ptr().add(mid), self.len - mid),
            )
        }
    }

    /// Consecutive disjoint pieces of at most `size` bytes (none for an empty range). Panics
    /// when `size == 0`.
    pub fn chunks(self, size: usize) -> impl Iterator<Item = Dst<'a>> {
        assert!(size > 0, "chunks of zero bytes");
        let mut rest = Some(self);
        std::iter::from_fn(move || {
            let r = rest.take()?;
            if r.is_empty() {
                return None;
            }
            let n = size.min(r.len);
            let (head, tail) = r.split_at(n);
            rest = Some(tail);
            Some(head)
        })
    }

    /// The range as one to read from, for a shorter borrow.
    pub fn as_src(&self) -> Src<'_> {
        // SAFETY: writable memory is readable, and `&self` keeps every writer through this
        // `Dst` away for the borrow.
        unsafe { Src::from_raw(self.ptr.as_ptr(), self.len) }
    }
}

impl<'a> From<&'a mut [u8]> for Dst<'a> {
    fn from(s: &'a mut [u8]) -> Dst<'a> {
        // SAFETY: an exclusive borrow keeps the slice alive, writable and ours for `'a`.
        unsafe { Dst::from_raw(s.as_mut_ptr(), s.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_range_in_order() {
        let data: Vec<u8> = (0..10).collect();
        let pieces: Vec<Vec<u8>> = Src::from(&data[..]).chunks(4).map(Src::to_vec).collect();
        assert_eq!(pieces, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);
        assert_eq!(Src::empty().chunks(4).count(), 0);

        let mut out = [0u8; 10];
        for (k, mut d) in Dst::from(&mut out[..]).chunks(3).enumerate() {
            let fill = vec![k as u8; d.len()];
            Src::from(&fill[..]).copy_to(&mut d);
        }
        assert_eq!(out, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]);
    }

    #[test]
    fn split_tail_and_copy() {
        let data = [1u8, 2, 3, 4, 5];
        let (a, b) = Src::from(&data[..]).split_at(2);
        assert_eq!((a.to_vec(), b.to_vec()), (vec![1, 2], vec![3, 4, 5]));
        assert_eq!(Src::from(&data[..]).tail(5).len(), 0);

        let mut out = [0u8; 5];
        let mut d = Dst::from(&mut out[..]);
        b.copy_to(&mut d.tail(2));
        assert_eq!(d.as_src().to_vec(), vec![0, 0, 3, 4, 5]);
    }

    #[test]
    #[should_panic(expected = "split at 6 of a 5-byte range")]
    fn split_past_the_end_panics() {
        let data = [0u8; 5];
        let _ = Src::from(&data[..]).split_at(6);
    }

    #[test]
    #[should_panic(expected = "4 bytes into a 3-byte range")]
    fn copy_into_a_shorter_range_panics() {
        let (src, mut out) = ([0u8; 4], [0u8; 3]);
        Src::from(&src[..]).copy_to(&mut Dst::from(&mut out[..]));
    }
}
