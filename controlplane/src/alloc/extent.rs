//! Best-fit extent allocator with coalescing, over one address range.
//!
//! Free space is a set of disjoint, non-adjacent extents kept twice: by address (to coalesce
//! on free and to find the extent containing an address) and by `(len, addr)` (to find the
//! smallest extent that fits in O(log n)).
//!
//! Invariants, checked by `ExtentAllocator::check` in tests:
//! - the two indexes describe the same extents;
//! - free extents are disjoint, never adjacent (adjacent ones are merged on free) and lie in
//!   `[base, end)`;
//! - `free_bytes` is the sum of their lengths.
//!
//! The allocator does not remember what it handed out: the caller frees exactly what it got.
//! A free that overlaps free space or leaves the range is refused (returns `false`), which
//! catches double frees without extra memory.

use std::collections::{BTreeMap, BTreeSet};

pub struct ExtentAllocator {
    base: u64,
    end: u64,
    /// Free extents: start address -> length.
    by_addr: BTreeMap<u64, u64>,
    /// Free extents as `(length, start address)`, for best fit.
    by_size: BTreeSet<(u64, u64)>,
    free_bytes: u64,
}

impl ExtentAllocator {
    /// All of `[base, base + size)` free. The caller guarantees `base + size` does not overflow.
    pub fn new(base: u64, size: u64) -> Self {
        let mut a = ExtentAllocator {
            base,
            end: base + size,
            by_addr: BTreeMap::new(),
            by_size: BTreeSet::new(),
            free_bytes: 0,
        };
        if size > 0 {
            a.insert(base, size);
        }
        a
    }

    fn insert(&mut self, addr: u64, len: u64) {
        self.by_addr.insert(addr, len);
        self.by_size.insert((len, addr));
        self.free_bytes += len;
    }

    fn remove(&mut self, addr: u64, len: u64) {
        self.by_addr.remove(&addr);
        self.by_size.remove(&(len, addr));
        self.free_bytes -= len;
    }

    /// Takes `len` bytes (> 0) starting at a multiple of `align` (a power of two) from the
    /// smallest free extent that holds them so aligned. Free extents start unaligned after
    /// exact reservations (objects re-reported after a master restart); the bytes skipped
    /// before the aligned start stay free.
    pub fn allocate(&mut self, len: u64, align: u64) -> Option<u64> {
        debug_assert!(align.is_power_of_two());
        if len == 0 {
            return None;
        }
        // The first extents by size that are long enough unaligned; one that starts
        // unaligned needs at most `align - 1` bytes more, so the scan stops past that.
        let (ext_len, ext, at) = self
            .by_size
            .range((len, 0)..)
            .take_while(|&&(l, _)| l < len.saturating_add(align))
            .chain(self.by_size.range((len.saturating_add(align), 0)..).take(1))
            .find_map(|&(l, a)| {
                let at = a.checked_next_multiple_of(align)?;
                (at - a + len <= l).then_some((l, a, at))
            })?;
        self.remove(ext, ext_len);
        if at > ext {
            self.insert(ext, at - ext);
        }
        let end = at + len;
        if ext + ext_len > end {
            self.insert(end, ext + ext_len - end);
        }
        Some(at)
    }

    /// Returns `[addr, addr + len)` to free space, merging with its neighbours. Refuses (and
    /// changes nothing) when the range is empty, leaves the allocator's range or overlaps free
    /// space.
    pub fn free(&mut self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        if len == 0 || addr < self.base || end > self.end {
            return false;
        }
        let prev = self
            .by_addr
            .range(..addr)
            .next_back()
            .map(|(&a, &l)| (a, l));
        let next = self.by_addr.range(addr..).next().map(|(&a, &l)| (a, l));
        if prev.is_some_and(|(a, l)| a + l > addr) || next.is_some_and(|(a, _)| a < end) {
            return false;
        }
        let (mut start, mut stop) = (addr, end);
        if let Some((a, l)) = prev.filter(|&(a, l)| a + l == addr) {
            self.remove(a, l);
            start = a;
        }
        if let Some((a, l)) = next.filter(|&(a, _)| a == end) {
            self.remove(a, l);
            stop = a + l;
        }
        self.insert(start, stop - start);
        true
    }

    /// Takes exactly `[addr, addr + len)` if it lies inside one free extent.
    pub fn reserve(&mut self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        if len == 0 {
            return false;
        }
        let Some((&a, &l)) = self.by_addr.range(..=addr).next_back() else {
            return false;
        };
        if a + l < end {
            return false;
        }
        self.remove(a, l);
        if addr > a {
            self.insert(a, addr - a);
        }
        if a + l > end {
            self.insert(end, a + l - end);
        }
        true
    }

    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    pub fn largest_free(&self) -> u64 {
        self.by_size.last().map_or(0, |&(l, _)| l)
    }

    pub fn free_extents(&self) -> usize {
        self.by_addr.len()
    }

    /// Checks every invariant of the module docs; for tests.
    #[cfg(test)]
    pub fn check(&self) {
        assert_eq!(self.by_addr.len(), self.by_size.len());
        let mut sum = 0;
        let mut last_end: Option<u64> = None;
        for (&a, &l) in &self.by_addr {
            assert!(l > 0);
            assert!(self.by_size.contains(&(l, a)));
            assert!(a >= self.base && a + l <= self.end);
            if let Some(e) = last_end {
                assert!(a > e, "free extents overlap or touch at {a}");
            }
            last_end = Some(a + l);
            sum += l;
        }
        assert_eq!(sum, self.free_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_fit_and_coalescing() {
        let mut a = ExtentAllocator::new(1000, 100);
        let x = a.allocate(10, 1).unwrap();
        let y = a.allocate(20, 1).unwrap();
        let z = a.allocate(30, 1).unwrap();
        assert_eq!((x, y, z), (1000, 1010, 1030));
        assert!(a.free(y, 20));
        // A 15-byte request fits the 20-byte hole better than the 40-byte tail.
        assert_eq!(a.allocate(15, 1), Some(1010));
        assert!(a.free(1010, 15));
        assert!(!a.free(1010, 15), "double free is refused");
        assert!(!a.free(1005, 10), "overlapping free is refused");
        assert!(a.free(x, 10));
        assert!(a.free(z, 30));
        a.check();
        assert_eq!(a.free_extents(), 1);
        assert_eq!(a.largest_free(), 100);
        assert!(!a.free(990, 5), "outside the range");
        assert_eq!(a.allocate(101, 1), None);
        assert_eq!(a.allocate(0, 1), None);
    }

    #[test]
    fn allocations_start_aligned_after_exact_reservations() {
        let mut a = ExtentAllocator::new(0, 1024);
        // An object re-reported at an odd length leaves the free space after it unaligned.
        assert!(a.reserve(0, 100));
        assert_eq!(a.allocate(64, 64), Some(128), "the next aligned start");
        a.check();
        // The skipped head (100..128) stays free, and a hole that fits only unaligned is
        // passed over for one that fits aligned.
        assert_eq!(a.free_bytes(), 1024 - 100 - 64);
        assert!(a.reserve(192, 70));
        assert!(a.reserve(300, 10));
        // Free now: [100,128) [262,300) [310,1024): 38 bytes at 262 hold 30 bytes only
        // unaligned (the next multiple of 64, 320, is past it).
        assert_eq!(a.allocate(30, 64), Some(320));
        assert_eq!(a.allocate(30, 1), Some(262), "best fit without alignment");
        a.check();
        assert_eq!(a.allocate(2048, 64), None);
        assert_eq!(a.allocate(u64::MAX, 64), None);
    }

    #[test]
    fn reserve_splits_one_extent() {
        let mut a = ExtentAllocator::new(0, 100);
        assert!(a.reserve(40, 10));
        assert!(!a.reserve(45, 10), "already taken");
        assert!(!a.reserve(95, 10), "past the end");
        assert_eq!(a.free_bytes(), 90);
        assert_eq!(a.free_extents(), 2);
        a.check();
        assert!(a.free(40, 10));
        assert_eq!(a.free_extents(), 1);
        a.check();
    }
}
