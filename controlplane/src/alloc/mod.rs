//! Per-segment allocation: which byte ranges of a mounted segment hold which replica.
//!
//! A [`SegmentAllocator`] owns `[base, base + size)` of one segment. Objects up to 1 MiB are
//! served from slab size classes ([`slab`]): O(1) for the uniform blocks a KV cache writes.
//! Larger objects, and small ones when no slab can be carved, come from a best-fit extent
//! allocator with coalescing ([`extent`]), which also hands out the slabs themselves.
//!
//! Invariants (property-tested against a list of live ranges below):
//! - every [`Span`] handed out lies inside the segment and overlaps no other live span;
//! - every span [`SegmentAllocator::allocate`] hands out outside slabs starts at a multiple
//!   of [`EXTENT_ALIGN_BYTES`] (segments start page-aligned), and so does every slab (whose
//!   chunks are multiples of 16 bytes), even when exact reservations of re-reported objects
//!   left free space starting anywhere;
//! - `used_bytes` is the sum of the lengths of live spans (a span's `len` is what the object
//!   really occupies: its size rounded up to the class or to [`EXTENT_ALIGN_BYTES`]);
//! - freeing every span leaves zero used bytes, no slab and one free extent (nothing leaks).
//!
//! The allocator trusts its caller (the master's state machine) to free only spans it got;
//! a free it can tell is bogus is refused with `false` and changes nothing.

pub mod extent;
pub mod slab;

use extent::ExtentAllocator;
use slab::{SlabFree, SlabSet};

/// Extent allocations are rounded up to this many bytes and start at a multiple of it.
pub const EXTENT_ALIGN_BYTES: u64 = 64;
/// A segment devotes at most `1 / SLAB_SHARE_DIVISOR` of its capacity to any one slab, so a
/// small segment is not eaten by half-empty slabs of many classes.
pub const SLAB_SHARE_DIVISOR: u64 = 64;

/// A range of a segment's address space: `[addr, addr + len)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    pub addr: u64,
    pub len: u64,
}

impl Span {
    pub fn end(&self) -> u64 {
        self.addr + self.len
    }
}

/// How fragmented a segment is (for `/get_segments_detail` and tuning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragmentation {
    /// Capacity minus used bytes.
    pub free_bytes: u64,
    /// Bytes in free extents (excludes free chunks inside slabs).
    pub extent_free_bytes: u64,
    /// The largest object that surely fits outside slabs.
    pub largest_free_extent_bytes: u64,
    pub free_extents: usize,
    pub slabs: usize,
    pub slab_bytes: u64,
    pub slab_used_bytes: u64,
}

impl Fragmentation {
    /// 0 when all extent free space is one extent, towards 1 as it splinters.
    pub fn ratio(&self) -> f64 {
        if self.extent_free_bytes == 0 {
            return 0.0;
        }
        1.0 - self.largest_free_extent_bytes as f64 / self.extent_free_bytes as f64
    }
}

pub struct SegmentAllocator {
    base: u64,
    size: u64,
    extents: ExtentAllocator,
    slabs: SlabSet,
    /// Bytes a slab may span in this segment.
    slab_target: u64,
    used: u64,
}

impl SegmentAllocator {
    /// An allocator over `[base, base + size)`, or `None` when that range overflows `u64`.
    pub fn new(base: u64, size: u64) -> Option<Self> {
        base.checked_add(size)?;
        Some(SegmentAllocator {
            base,
            size,
            extents: ExtentAllocator::new(base, size),
            slabs: SlabSet::new(),
            slab_target: slab::SLAB_TARGET_BYTES.min(size / SLAB_SHARE_DIVISOR),
            used: 0,
        })
    }

    /// A range of at least `size` bytes, or `None` when nothing fits.
    pub fn allocate(&mut self, size: u64) -> Option<Span> {
        if size == 0 || size > self.size - self.used {
            return None;
        }
        if let Some(c) = slab::class_of(size) {
            if let Some(span) = self.allocate_in_slab(c) {
                return Some(span);
            }
        }
        let len = size.checked_next_multiple_of(EXTENT_ALIGN_BYTES)?;
        let addr = self.extents.allocate(len, EXTENT_ALIGN_BYTES)?;
        self.used += len;
        Some(Span { addr, len })
    }

    fn allocate_in_slab(&mut self, c: usize) -> Option<Span> {
        let len = slab::class_size(c);
        let addr = match self.slabs.take(c) {
            Some(a) => a,
            None => {
                let slab_len = SlabSet::slab_len(c, self.slab_target)?;
                let at = self.extents.allocate(slab_len, EXTENT_ALIGN_BYTES)?;
                self.slabs.add_slab_and_take(c, at, slab_len)
            }
        };
        self.used += len;
        Some(Span { addr, len })
    }

    /// Returns a span got from [`Self::allocate`] or [`Self::reserve`].
    pub fn free(&mut self, span: Span) -> bool {
        match self.slabs.free(span.addr) {
            SlabFree::NotSlab => {
                if !self.extents.free(span.addr, span.len) {
                    return false;
                }
                self.used -= span.len;
                true
            }
            SlabFree::Freed { chunk } => {
                self.used -= chunk;
                true
            }
            SlabFree::SlabEmptied { chunk, addr, len } => {
                self.used -= chunk;
                // The slab's extent was taken from `extents` and is disjoint from its free
                // space, so handing it back cannot fail.
                let back = self.extents.free(addr, len);
                debug_assert!(back);
                true
            }
            SlabFree::Invalid => false,
        }
    }

    /// Takes exactly `[addr, addr + size)` (to re-insert an object a storage node reports
    /// after a master restart). `None` if any byte of it is not free extent space.
    pub fn reserve(&mut self, addr: u64, size: u64) -> Option<Span> {
        if !self.extents.reserve(addr, size) {
            return None;
        }
        self.used += size;
        Some(Span { addr, len: size })
    }

    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    pub fn capacity(&self) -> u64 {
        self.size
    }

    pub fn base(&self) -> u64 {
        self.base
    }

    pub fn fragmentation(&self) -> Fragmentation {
        Fragmentation {
            free_bytes: self.size - self.used,
            extent_free_bytes: self.extents.free_bytes(),
            largest_free_extent_bytes: self.extents.largest_free(),
            free_extents: self.extents.free_extents(),
            slabs: self.slabs.slab_count(),
            slab_bytes: self.slabs.slab_bytes(),
            slab_used_bytes: self.slabs.used_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn small_objects_use_slabs_large_ones_extents() {
        let mut a = SegmentAllocator::new(0x1000_0000, 512 * MIB).unwrap();
        let s = a.allocate(4000).unwrap();
        assert_eq!(s.len, 4096);
        let f = a.fragmentation();
        assert_eq!(f.slabs, 1);
        assert_eq!(f.slab_bytes, 4 * MIB);
        let big = a.allocate(3 * MIB + 1).unwrap();
        assert_eq!(big.len, 3 * MIB + 64);
        assert_eq!(a.used_bytes(), 4096 + 3 * MIB + 64);
        assert!(a.free(s));
        assert!(!a.free(s), "double free refused");
        assert!(a.free(big));
        assert_eq!(a.used_bytes(), 0);
        let f = a.fragmentation();
        assert_eq!((f.slabs, f.free_extents), (0, 1));
        assert_eq!(f.largest_free_extent_bytes, 512 * MIB);
    }

    /// The order a storage node's background populator relies on
    /// (`dataplane::mem::populate`): a fresh segment is filled from its base upwards, so the
    /// populated low range is where new objects land, and a freed range is reused before
    /// untouched space further up, so a put after a remove finds pages already written.
    #[test]
    fn a_fresh_segment_fills_from_its_base_and_reuses_freed_ranges_first() {
        let base = 0x4000_0000;
        let mut a = SegmentAllocator::new(base, 1024 * MIB).unwrap();
        let spans: Vec<Span> = (0..48).map(|_| a.allocate(4 * MIB).unwrap()).collect();
        for (i, s) in spans.iter().enumerate() {
            assert_eq!(
                s.addr,
                base + i as u64 * 4 * MIB,
                "object {i} not next from the base"
            );
        }
        let batch: Vec<Span> = (0..8).map(|_| a.allocate(4 * MIB).unwrap()).collect();
        assert_eq!(batch[0].addr, spans[47].end(), "a batch continues upwards");
        assert!(a.free(spans[10]) && a.free(spans[11]));
        let again = a.allocate(4 * MIB).unwrap();
        assert_eq!(
            again.addr, spans[10].addr,
            "the freed range before untouched space"
        );
        let next = a.allocate(4 * MIB).unwrap();
        assert_eq!(next.addr, spans[11].addr);
        let fresh = a.allocate(4 * MIB).unwrap();
        assert_eq!(fresh.addr, batch[7].end(), "then upwards again");
    }

    #[test]
    fn small_segments_skip_slabs() {
        let mut a = SegmentAllocator::new(0, 16 * MIB).unwrap();
        let s = a.allocate(100 * 1024).unwrap();
        assert_eq!(s.len, 100 * 1024);
        assert_eq!(a.fragmentation().slabs, 0);
        // Tiny classes still get (small) slabs.
        let t = a.allocate(100).unwrap();
        assert_eq!(t.len, 112);
        assert_eq!(a.fragmentation().slabs, 1);
    }

    #[test]
    fn overflow_and_oversize_are_refused() {
        assert!(SegmentAllocator::new(u64::MAX - 10, 100).is_none());
        // The last bytes of the address space, from an aligned start.
        let mut a = SegmentAllocator::new(u64::MAX - 4159, 4159).unwrap();
        assert_eq!(a.allocate(u64::MAX), None);
        assert_eq!(a.allocate(4160), None);
        assert_eq!(a.allocate(0), None);
        let all = a.allocate(4096).unwrap();
        assert_eq!(all.addr, u64::MAX - 4159);
        assert!(a.allocate(64).is_none(), "63 bytes left");
        assert!(a.free(all));
    }

    #[test]
    fn reserve_then_allocate_around() {
        let mut a = SegmentAllocator::new(0, 64 * MIB).unwrap();
        let r = a.reserve(10 * MIB + 3, 5000).unwrap();
        let before = Span {
            addr: 10 * MIB - 7,
            len: 10,
        };
        assert_eq!(a.reserve(before.addr, before.len), Some(before));
        assert!(a.reserve(10 * MIB + 4, 1).is_none());
        assert_eq!(a.used_bytes(), 5010);
        assert!(a.free(r));
        assert!(a.free(before));
        assert_eq!(a.fragmentation().free_extents, 1);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Alloc(u64),
        Free(usize),
        Reserve(u64, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u64..2048).prop_map(Op::Alloc),
            3 => (1u64..(1 << 20) + 10).prop_map(Op::Alloc),
            1 => (1u64..(6 << 20)).prop_map(Op::Alloc),
            5 => any::<usize>().prop_map(Op::Free),
            1 => (0u64..(64 << 20), 1u64..100_000).prop_map(|(a, l)| Op::Reserve(a, l)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn matches_a_model_of_live_ranges(
            base_pages in 0u64..1000,
            size_mib in prop_oneof![Just(8u64), Just(64), Just(300)],
            ops in prop::collection::vec(op(), 1..400),
        ) {
            let base = base_pages * 4096;
            let size = size_mib * MIB;
            let mut a = SegmentAllocator::new(base, size).unwrap();
            let mut live: Vec<Span> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(n) => {
                        if let Some(s) = a.allocate(n) {
                            prop_assert!(s.len >= n);
                            // Even after odd-sized reservations (the base is page-aligned):
                            // extents at a multiple of 64, slab chunks of 16.
                            let align = if slab::class_of(n).is_some() { 16 } else { 64 };
                            prop_assert_eq!(s.addr % align, 0, "{:?}", s);
                            prop_assert!(s.addr >= base && s.end() <= base + size);
                            for o in &live {
                                prop_assert!(s.end() <= o.addr || o.end() <= s.addr,
                                    "{:?} overlaps {:?}", s, o);
                            }
                            live.push(s);
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let s = live.swap_remove(i % live.len());
                        prop_assert!(a.free(s));
                    }
                    Op::Free(_) => {}
                    Op::Reserve(off, n) => {
                        let addr = base + off;
                        let clash = live.iter().any(|o| addr < o.end() && o.addr < addr + n);
                        let inside = addr + n <= base + size;
                        // Free slab chunks are not extent space, so a reserve may fail
                        // without a clash; it must never succeed with one.
                        if let Some(s) = a.reserve(addr, n) {
                            prop_assert!(!clash && inside);
                            live.push(s);
                        }
                    }
                }
                a.extents.check();
                prop_assert_eq!(a.used_bytes(), live.iter().map(|s| s.len).sum::<u64>());
            }
            for s in live.drain(..) {
                prop_assert!(a.free(s));
            }
            prop_assert_eq!(a.used_bytes(), 0);
            let f = a.fragmentation();
            prop_assert_eq!(f.slabs, 0);
            prop_assert_eq!(f.free_extents, 1);
            prop_assert_eq!(f.largest_free_extent_bytes, size);
        }
    }
}
