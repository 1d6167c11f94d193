//! The registration table of local buffers.
//!
//! A buffer is a half-open range `[addr, addr + len)` of this process's address space. The
//! table is a plain data structure: it does not own or dereference the memory (the transport
//! that serves it states that contract). It is keyed by start address in a `BTreeMap`, so
//! registration, unregistration and the access check are O(log n).
//!
//! Invariants: every buffer has `len > 0` and `addr + len` does not overflow `u64`; no two
//! buffers overlap. [`Registry::check`] is true only for a non-empty range inside ONE buffer:
//! a range spanning two adjacent buffers is refused, because adjacent registrations may be
//! unrelated memory that happens to be contiguous.

use std::collections::BTreeMap;

use crate::TeError;

/// Table of registered buffers; see the module docs for the invariants.
#[derive(Debug, Default, Clone)]
pub struct Registry {
    /// start address -> length in bytes.
    buffers: BTreeMap<u64, u64>,
}

impl Registry {
    /// An empty table.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds `[addr, addr + len)`.
    ///
    /// Errors: [`TeError::InvalidArgument`] for `len == 0` or a range that wraps around the
    /// address space; [`TeError::AddressOverlapped`] when it overlaps a registered buffer.
    pub fn register(&mut self, addr: u64, len: u64) -> Result<(), TeError> {
        let end = end_of(addr, len).ok_or(TeError::InvalidArgument)?;
        // The buffer starting at or before `addr` must end at or before it ...
        if let Some((&s, &l)) = self.buffers.range(..=addr).next_back() {
            if s + l > addr {
                return Err(TeError::AddressOverlapped);
            }
        }
        // ... and no buffer may start inside (addr, end).
        if self.buffers.range(addr..end).next().is_some() {
            return Err(TeError::AddressOverlapped);
        }
        self.buffers.insert(addr, len);
        Ok(())
    }

    /// Removes the buffer that starts at `addr` and returns its length.
    ///
    /// Errors: [`TeError::AddressNotRegistered`] when no buffer starts at `addr`.
    pub fn unregister(&mut self, addr: u64) -> Result<u64, TeError> {
        self.buffers
            .remove(&addr)
            .ok_or(TeError::AddressNotRegistered)
    }

    /// True when `[addr, addr + len)` is non-empty, does not wrap, and lies inside one
    /// registered buffer.
    pub fn check(&self, addr: u64, len: u64) -> bool {
        let Some(end) = end_of(addr, len) else {
            return false;
        };
        match self.buffers.range(..=addr).next_back() {
            Some((&s, &l)) => end <= s + l,
            None => false,
        }
    }

    /// The registered buffer `(addr, len)` that contains `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<(u64, u64)> {
        let (&s, &l) = self.buffers.range(..=addr).next_back()?;
        (addr < s + l).then_some((s, l))
    }

    /// Registered buffers in address order.
    pub fn buffers(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.buffers.iter().map(|(&a, &l)| (a, l))
    }

    /// Number of registered buffers.
    pub fn len(&self) -> usize {
        self.buffers.len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.buffers.is_empty()
    }
}

/// `addr + len` for a non-empty range that does not wrap.
fn end_of(addr: u64, len: u64) -> Option<u64> {
    if len == 0 {
        return None;
    }
    addr.checked_add(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn register_rejects_overlap_and_bad_ranges() {
        let mut r = Registry::new();
        r.register(1000, 100).unwrap();
        assert_eq!(r.register(1000, 100), Err(TeError::AddressOverlapped));
        assert_eq!(r.register(950, 51), Err(TeError::AddressOverlapped));
        assert_eq!(r.register(1099, 1), Err(TeError::AddressOverlapped));
        assert_eq!(r.register(900, 500), Err(TeError::AddressOverlapped));
        assert_eq!(r.register(1050, 10), Err(TeError::AddressOverlapped));
        r.register(900, 100).unwrap(); // touches the start: fine
        r.register(1100, 1).unwrap(); // touches the end: fine
        assert_eq!(r.register(5, 0), Err(TeError::InvalidArgument));
        assert_eq!(r.register(u64::MAX, 2), Err(TeError::InvalidArgument));
        r.register(u64::MAX - 1, 1).unwrap();
        assert_eq!(r.len(), 4);
    }

    #[test]
    fn unregister_unknown_is_not_registered() {
        let mut r = Registry::new();
        r.register(1000, 100).unwrap();
        assert_eq!(r.unregister(1001), Err(TeError::AddressNotRegistered));
        assert_eq!(r.unregister(1000), Ok(100));
        assert_eq!(r.unregister(1000), Err(TeError::AddressNotRegistered));
        assert!(r.is_empty());
    }

    #[test]
    fn check_requires_one_buffer() {
        let mut r = Registry::new();
        r.register(1000, 100).unwrap();
        r.register(1100, 100).unwrap();
        assert!(r.check(1000, 100));
        assert!(r.check(1099, 1));
        assert!(r.check(1100, 100));
        assert!(!r.check(1099, 2), "spans two adjacent buffers");
        assert!(!r.check(999, 2));
        assert!(!r.check(1000, 0), "empty range");
        assert!(!r.check(1150, 51));
        assert!(!r.check(u64::MAX, 1));
        assert!(!r.check(1000, u64::MAX), "wraps");
        assert!(!r.check(0, 1));
        assert_eq!(r.find(1150), Some((1100, 100)));
        assert_eq!(r.find(1200), None);
    }

    /// Model: a list of ranges, checked by brute force.
    fn model_overlaps(model: &[(u64, u64)], a: u64, l: u64) -> bool {
        model.iter().any(|&(s, ml)| a < s + ml && s < a + l)
    }

    proptest! {
        #[test]
        fn matches_brute_force_model(ops in proptest::collection::vec((0u8..3, 0u64..64, 0u64..16), 1..200)) {
            let mut r = Registry::new();
            let mut model: Vec<(u64, u64)> = Vec::new();
            for (op, a, l) in ops {
                match op {
                    0 => {
                        let expected = if l == 0 {
                            Err(TeError::InvalidArgument)
                        } else if model_overlaps(&model, a, l) {
                            Err(TeError::AddressOverlapped)
                        } else {
                            model.push((a, l));
                            Ok(())
                        };
                        prop_assert_eq!(r.register(a, l), expected);
                    }
                    1 => {
                        let pos = model.iter().position(|&(s, _)| s == a);
                        let expected = match pos {
                            Some(i) => Ok(model.swap_remove(i).1),
                            None => Err(TeError::AddressNotRegistered),
                        };
                        prop_assert_eq!(r.unregister(a), expected);
                    }
                    _ => {
                        let inside = l > 0 && model.iter().any(|&(s, ml)| s <= a && a + l <= s + ml);
                        prop_assert_eq!(r.check(a, l), inside);
                    }
                }
            }
            prop_assert_eq!(r.len(), model.len());
        }
    }
}
