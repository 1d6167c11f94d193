//! Byte ranges the data plane moves without ever seeing them as Rust slices.
//!
//! The bytes a transfer reads from or writes into often belong to someone Rust cannot watch:
//! a Python buffer handed over as an integer, a buffer registered with the transfer engine, a
//! peer's shared segment. Another thread (or Python) may touch them while we copy. Were they
//! `&[u8]`/`&mut [u8]`, two overlapping destinations, or a source some thread writes, would
//! break Rust's aliasing rules even when the bytes come out right. So they travel as a
//! pointer and a length, [`Src`] (to read from) and [`Dst`] (to write into), down to the one
//! place that touches them: `copy_nonoverlapping`, `sendmsg`, `recv`, an RDMA work request.
//! The rule is the one `sys::rawio` states for the server's registered memory.
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
        self.assert_fits(dst);
        // SAFETY: `self` is readable and `dst` writable for at least `self.len` bytes; `copy`
        // allows the two to overlap, which raw ranges do not rule out.
        unsafe { std::ptr::copy(self.ptr.as_ptr(), dst.ptr.as_ptr(), self.len) };
    }

    /// Copies the range to `dst`, which must be at least as long (panics otherwise), for a
    /// reader elsewhere: from [`STREAM_MIN`] bytes up, with non-temporal stores on x86-64.
    ///
    /// A put writes bytes that this core will not read again (another process, or a later
    /// get, reads them), into segment memory that is rarely in any cache. A plain memcpy
    /// first reads each destination line into the cache (read-for-ownership) and later
    /// evicts it: twice the memory traffic of the copy itself. Streaming stores write whole
    /// lines past the cache. On this project's machines it doubles the rate of a 64 KiB to
    /// 1 MiB copy into resident memory and takes a 4 MiB one from 9.3 to 14 GB/s
    /// (`bench/README.md`, "Same-host 4 MiB put"). Two trades: the bytes are not in this
    /// core's cache afterwards, which a copy for a local reader (a get) would want, so gets
    /// keep [`Src::copy_to`]; and into pages not yet allocated it is slower than a memcpy
    /// (the kernel zeroes each new page through the cache, and streaming over those cached
    /// lines costs more than it saves), so a caller that may write fresh memory checks
    /// [`Dst::resident`] first.
    ///
    /// The stores are fenced (`sfence`) before this returns, so whatever the caller does
    /// next (a syscall, a release store) is ordered after every byte, as after a memcpy.
    /// Overlapping ranges (never the case for a put) are copied as [`Src::copy_to`] does.
    pub fn stream_to(self, dst: &mut Dst<'_>) {
        self.assert_fits(dst);
        if self.len < STREAM_MIN || self.overlaps(dst) || !cfg!(target_arch = "x86_64") {
            self.copy_to(dst);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `self` is readable and `dst` writable for `self.len` bytes (checked above),
        // and the two do not overlap (checked above).
        unsafe {
            stream_x86_64(dst.ptr.as_ptr(), self.ptr.as_ptr(), self.len)
        };
    }

    /// Copies the range to `dst` for a reader other than this core, past the cache where that
    /// pays: [`Src::stream_to`] from [`STREAM_MIN`] bytes up when every page under `dst` is
    /// resident ([`Dst::resident`], one `mincore`), [`Src::copy_to`] otherwise. Panics as
    /// they do when `dst` is shorter.
    pub fn copy_uncached(self, dst: &mut Dst<'_>) {
        if dst.worth_streaming(self.len) {
            self.stream_to(dst);
        } else {
            self.copy_to(dst);
        }
    }

    /// Whether the range shares a byte with the first `self.len()` bytes of `dst` (the ones a
    /// copy writes).
    pub fn overlaps(&self, dst: &Dst<'_>) -> bool {
        let (s, d) = (self.ptr.as_ptr() as usize, dst.ptr.as_ptr() as usize);
        s < d + self.len && d < s + self.len
    }

    /// Panics unless `dst` is at least as long as `self`.
    pub(crate) fn assert_fits(&self, dst: &Dst<'_>) {
        assert!(
            self.len <= dst.len,
            "{} bytes into a {}-byte range",
            self.len,
            dst.len
        );
    }

    /// The bytes, copied out (for tests and small records).
    pub fn to_vec(self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.copy_to(&mut Dst::from(&mut v[..]));
        v
    }
}

/// The smallest copy [`Src::stream_to`] makes with non-temporal stores: below it, the fence
/// and the unaligned head and tail cost more than the stores save (measured: 4 KiB is 15%
/// slower streamed, 16 KiB already 1.7x faster; 64 KiB leaves a margin for destinations
/// that happen to be cached).
pub const STREAM_MIN: usize = 64 << 10;

/// The window a read fault of a shared file mapping maps around itself (Linux's default
/// `fault_around_bytes`, 16 pages), which [`Dst::map_ahead`] steps by.
pub const FAULT_AROUND_BYTES: usize = 64 << 10;

/// Copies `len` bytes from `src` to `dst` with SSE2 non-temporal stores (SSE2 is part of
/// x86-64, so no feature check), then fences them.
///
/// # Safety
///
/// `src` is readable and `dst` writable for `len` bytes, and the two ranges do not overlap.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_x86_64(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    const LINE: usize = 64;
    // Plain copies up to the first 16-byte aligned destination byte and after the last whole
    // line; streaming stores need an aligned destination.
    let head = dst.align_offset(16).min(len);
    let body = (len - head) / LINE * LINE;
    // SAFETY: every offset below stays inside `[0, len)` of both ranges, which the caller
    // promises readable (`src`) and writable (`dst`) and disjoint; `dst + head` is 16-byte
    // aligned, as `_mm_stream_si128` requires, and each line's four stores keep it so.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let (s, d) = (src.add(head), dst.add(head));
        let mut at = 0;
        while at < body {
            let from = s.add(at) as *const __m128i;
            let to = d.add(at) as *mut __m128i;
            let a = _mm_loadu_si128(from);
            let b = _mm_loadu_si128(from.add(1));
            let c = _mm_loadu_si128(from.add(2));
            let e = _mm_loadu_si128(from.add(3));
            _mm_stream_si128(to, a);
            _mm_stream_si128(to.add(1), b);
            _mm_stream_si128(to.add(2), c);
            _mm_stream_si128(to.add(3), e);
            at += LINE;
        }
        std::ptr::copy_nonoverlapping(s.add(body), d.add(body), len - head - body);
        _mm_sfence();
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

    /// Whether every page under the range is resident (`mincore`): present in this process's
    /// page tables or, for a shared file mapping, in the file's page cache. A page that is
    /// not will fault on its first write, and a shared memory page never touched by anyone is
    /// allocated and zeroed then (a hugetlb page mapped by another process reads as not
    /// resident until this process touches it, though its owner may have). An empty range is
    /// resident; a range the kernel finds unmapped is not.
    pub fn resident(&self) -> bool {
        const CHUNK_PAGES: usize = 4096;
        if self.len == 0 {
            return true;
        }
        let page = super::mmap::base_page_bytes();
        let start = self.ptr.as_ptr() as usize & !(page - 1);
        let end = (self.ptr.as_ptr() as usize + self.len).next_multiple_of(page);
        let mut vec = [0u8; CHUNK_PAGES];
        let mut at = start;
        while at < end {
            let len = (end - at).min(CHUNK_PAGES * page);
            // SAFETY: mincore reads no byte of the range (an unmapped one fails with ENOMEM)
            // and writes one byte per page of `len`, at most `CHUNK_PAGES` into `vec`.
            let rc = unsafe { libc::mincore(at as *mut libc::c_void, len, vec.as_mut_ptr()) };
            if rc != 0 || vec[..len / page].iter().any(|&v| v & 1 == 0) {
                return false;
            }
            at += len;
        }
        true
    }

    /// Whether a copy of `len` bytes into this range pays for streaming stores: from
    /// [`STREAM_MIN`] bytes up, into pages that are all [`Dst::resident`] (see
    /// [`Src::stream_to`] for why not into fresh ones).
    pub fn worth_streaming(&self, len: usize) -> bool {
        len >= STREAM_MIN && self.resident()
    }

    /// Maps the range's pages into this process ahead of a write, 16 at a time: reads one
    /// byte per [`FAULT_AROUND_BYTES`] window. For a shared file mapping (a peer's segment)
    /// whose pages are in the page cache, a read fault maps the whole window of cached pages
    /// around it (the kernel's fault-around), writable, where a write fault maps one page:
    /// 64 traps per 4 MiB instead of 1024. Call it only on a [`Dst::resident`] range: a read
    /// fault on a page nobody has written allocates it, as the write would, but one page at
    /// a time. Costs a few loads when the pages are mapped already.
    pub fn map_ahead(&self) {
        let start = self.ptr.as_ptr() as usize;
        let mut at = start;
        while at < start + self.len {
            // SAFETY: `at` lies inside the range, which is mapped (and a mapped writable page
            // is readable); a volatile read through a raw pointer forms no reference.
            unsafe { std::ptr::read_volatile(at as *const u8) };
            at = (at / FAULT_AROUND_BYTES + 1) * FAULT_AROUND_BYTES;
        }
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
    fn streamed_copies_match_plain_ones_at_every_alignment_and_length() {
        // Lengths around the streaming threshold and a line, at every destination and source
        // alignment within a line: head, whole lines and tail each land where they belong,
        // and nothing around the destination range is touched.
        let src: Vec<u8> = (0..STREAM_MIN * 2 + 256)
            .map(|i| (i * 7 + 3) as u8)
            .collect();
        for len in [
            0,
            1,
            63,
            64,
            STREAM_MIN - 1,
            STREAM_MIN,
            STREAM_MIN + 1,
            STREAM_MIN + 77,
        ] {
            for s_off in [0, 1, 15, 16, 33] {
                for d_off in [0, 1, 8, 15, 16, 17, 63] {
                    let mut out = vec![0xEEu8; len + 128];
                    let from = Src::from(&src[s_off..s_off + len]);
                    from.stream_to(&mut Dst::from(&mut out[d_off..d_off + len]));
                    assert_eq!(
                        &out[d_off..d_off + len],
                        &src[s_off..s_off + len],
                        "{len} {s_off} {d_off}"
                    );
                    assert!(out[..d_off]
                        .iter()
                        .chain(&out[d_off + len..])
                        .all(|&b| b == 0xEE));
                }
            }
        }
    }

    #[test]
    fn residency_follows_the_first_touch_of_every_page() {
        const LEN: usize = 64 << 20;
        // SAFETY: a fresh private anonymous mapping of our own, unmapped below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let p = p as *mut u8;
        // SAFETY: the mapping is ours, `LEN` bytes, and no reference is formed over it.
        let mut whole = unsafe { Dst::from_raw(p, LEN) };
        assert!(!whole.resident());
        {
            // Touch every page of the first half, and one byte of the second.
            let (mut half, mut rest) = whole.reborrow().split_at(LEN / 2);
            Src::from(&vec![1u8; LEN / 2][..]).copy_to(&mut half);
            Src::from(&[1u8][..]).copy_to(&mut rest.tail(4096 * 3 + 5));
            assert!(half.resident(), "every page of the half written");
            assert!(!rest.resident(), "one page of the rest written");
            assert!(rest.tail(4096 * 3).split_at(4096).0.resident(), "that page");
            // Either way (streamed into the resident half, copied into the rest), the bytes
            // arrive.
            let data: Vec<u8> = (0..STREAM_MIN * 3).map(|i| (i % 251) as u8).collect();
            for d in [&mut half, &mut rest] {
                Src::from(&data[..]).copy_uncached(&mut d.tail(7));
                assert_eq!(d.tail(7).split_at(data.len()).0.as_src().to_vec(), data);
            }
        }
        assert!(!whole.resident());
        // An unaligned range inside written pages, and an empty one anywhere.
        assert!(whole.tail(100).split_at(LEN / 2 - 200).0.resident());
        assert!(whole.tail(LEN - 1).split_at(0).0.resident());
        // SAFETY: our own mapping; every `Dst` over it is gone.
        assert_eq!(unsafe { libc::munmap(p as *mut libc::c_void, LEN) }, 0);
    }

    #[test]
    fn an_overlapping_streamed_copy_moves_like_memmove() {
        let mut buf: Vec<u8> = (0..STREAM_MIN * 2).map(|i| i as u8).collect();
        let want: Vec<u8> = buf[..STREAM_MIN + 100].to_vec();
        let p = buf.as_mut_ptr();
        // SAFETY: both ranges lie inside `buf`, which outlives them; no reference to `buf` is
        // used while they exist.
        let (from, mut to) = unsafe {
            (
                Src::from_raw(p, STREAM_MIN + 100),
                Dst::from_raw(p.add(64), STREAM_MIN + 100),
            )
        };
        from.stream_to(&mut to);
        assert_eq!(&buf[64..64 + STREAM_MIN + 100], &want[..]);
    }

    #[test]
    #[should_panic(expected = "65537 bytes into a 65536-byte range")]
    fn a_streamed_copy_into_a_shorter_range_panics() {
        let (src, mut out) = (vec![0u8; STREAM_MIN + 1], vec![0u8; STREAM_MIN]);
        Src::from(&src[..]).stream_to(&mut Dst::from(&mut out[..]));
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
