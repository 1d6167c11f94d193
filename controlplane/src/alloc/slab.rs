//! Slab size classes for small objects: O(1) allocate and free of fixed-size chunks.
//!
//! Classes run from 64 B to 1 MiB with four steps per power of two (64, 80, 96, 112, 128,
//! 160, ...), so a request wastes at most 20 % to rounding. A slab is one extent taken from
//! the segment's extent allocator and cut into equal chunks of one class.
//!
//! Invariants:
//! - a slab's `used` equals the number of set bits in its `in_use` bitmap;
//! - a slab is in its class's `partial` list iff it has a free chunk;
//! - a slab with no chunk in use is handed back by [`SlabSet::free`] at once, so slabs never
//!   hoard empty space (and freeing everything leaves no slab).

use std::collections::BTreeMap;

/// Smallest class, bytes.
pub const CLASS_MIN_BYTES: u64 = 64;
/// Largest class, bytes: bigger objects go straight to the extent allocator.
pub const CLASS_MAX_BYTES: u64 = 1 << 20;
/// Number of classes: 14 octaves of 4 steps from 64 B, plus 1 MiB itself.
pub const CLASS_COUNT: usize = 57;
/// A slab should span about this many bytes...
pub const SLAB_TARGET_BYTES: u64 = 4 << 20;
/// ...and hold at least this many chunks, else slabs are not worth it for that class.
pub const SLAB_MIN_CHUNKS: u64 = 8;

const _: () = assert!(CLASS_MIN_BYTES.is_power_of_two() && CLASS_MAX_BYTES.is_power_of_two());

/// Size of class `c` (< [`CLASS_COUNT`]).
pub const fn class_size(c: usize) -> u64 {
    if c == 0 {
        return CLASS_MIN_BYTES;
    }
    let octave = (c - 1) / 4;
    let step = ((c - 1) % 4) as u64;
    (5 + step) << (octave + 4)
}

const _: () = assert!(class_size(CLASS_COUNT - 1) == CLASS_MAX_BYTES);

/// The smallest class holding `len` bytes, or `None` above [`CLASS_MAX_BYTES`].
pub fn class_of(len: u64) -> Option<usize> {
    if len > CLASS_MAX_BYTES {
        return None;
    }
    if len <= CLASS_MIN_BYTES {
        return Some(0);
    }
    let n = len - 1;
    let log2 = 63 - n.leading_zeros() as usize; // >= 6 since n >= 64
    let step = ((n >> (log2 - 2)) & 3) as usize;
    Some((log2 - 6) * 4 + step + 1)
}

struct Slab {
    addr: u64,
    class: usize,
    chunks: u32,
    used: u32,
    /// Chunks `next_fresh..chunks` were never handed out.
    next_fresh: u32,
    /// Chunks freed since, reused first.
    free: Vec<u32>,
    in_use: Vec<u64>,
}

impl Slab {
    fn chunk_size(&self) -> u64 {
        class_size(self.class)
    }

    fn len(&self) -> u64 {
        self.chunk_size() * self.chunks as u64
    }

    fn take(&mut self) -> Option<u64> {
        let i = match self.free.pop() {
            Some(i) => i,
            None if self.next_fresh < self.chunks => {
                self.next_fresh += 1;
                self.next_fresh - 1
            }
            None => return None,
        };
        self.in_use[i as usize / 64] |= 1 << (i % 64);
        self.used += 1;
        Some(self.addr + i as u64 * self.chunk_size())
    }
}

/// What [`SlabSet::free`] did with an address.
#[derive(Debug, PartialEq, Eq)]
pub enum SlabFree {
    /// The address is not inside any slab: it belongs to the extent allocator.
    NotSlab,
    /// Freed a chunk of `chunk` bytes.
    Freed { chunk: u64 },
    /// Freed a chunk and the slab is now empty: its extent `[addr, addr + len)` goes back.
    SlabEmptied { chunk: u64, addr: u64, len: u64 },
    /// Inside a slab but not the start of a chunk in use (a bug of the caller).
    Invalid,
}

#[derive(Default)]
pub struct SlabSet {
    slabs: Vec<Option<Slab>>,
    spare_ids: Vec<u32>,
    by_addr: BTreeMap<u64, u32>,
    partial: Vec<Vec<u32>>,
    slab_bytes: u64,
    used_bytes: u64,
}

impl SlabSet {
    pub fn new() -> Self {
        SlabSet {
            partial: (0..CLASS_COUNT).map(|_| Vec::new()).collect(),
            ..Default::default()
        }
    }

    /// How long a slab of class `c` is when slabs may span `target` bytes, or `None` when
    /// the class is too large for slabs that size.
    pub fn slab_len(c: usize, target: u64) -> Option<u64> {
        let size = class_size(c);
        let chunks = (target / size).min(u32::MAX as u64);
        (chunks >= SLAB_MIN_CHUNKS).then_some(chunks * size)
    }

    /// A chunk of class `c` from a slab that has one.
    pub fn take(&mut self, c: usize) -> Option<u64> {
        let &id = self.partial[c].last()?;
        // Invariant: every id in `partial` names a live slab with a free chunk.
        let slab = self.slabs[id as usize].as_mut()?;
        let addr = slab.take()?;
        if slab.used == slab.chunks {
            self.partial[c].pop();
        }
        self.used_bytes += class_size(c);
        Some(addr)
    }

    /// Makes `[addr, addr + len)` a slab of class `c` (len from [`Self::slab_len`]) and
    /// takes its first chunk.
    pub fn add_slab_and_take(&mut self, c: usize, addr: u64, len: u64) -> u64 {
        let chunks = (len / class_size(c)) as u32;
        let slab = Slab {
            addr,
            class: c,
            chunks,
            used: 0,
            next_fresh: 0,
            free: Vec::new(),
            in_use: vec![0; (chunks as usize).div_ceil(64)],
        };
        let id = match self.spare_ids.pop() {
            Some(id) => {
                self.slabs[id as usize] = Some(slab);
                id
            }
            None => {
                self.slabs.push(Some(slab));
                (self.slabs.len() - 1) as u32
            }
        };
        self.by_addr.insert(addr, id);
        self.partial[c].push(id);
        self.slab_bytes += len;
        // A fresh slab has SLAB_MIN_CHUNKS >= 1 free chunks.
        self.take(c).unwrap_or(addr)
    }

    pub fn free(&mut self, addr: u64) -> SlabFree {
        let Some((_, &id)) = self.by_addr.range(..=addr).next_back() else {
            return SlabFree::NotSlab;
        };
        let Some(slab) = self.slabs[id as usize].as_mut() else {
            return SlabFree::Invalid;
        };
        if addr >= slab.addr + slab.len() {
            return SlabFree::NotSlab;
        }
        let chunk = slab.chunk_size();
        let off = addr - slab.addr;
        let i = (off / chunk) as u32;
        if i as u64 * chunk != off {
            return SlabFree::Invalid;
        }
        let (word, bit) = (i as usize / 64, 1u64 << (i % 64));
        if slab.in_use[word] & bit == 0 {
            return SlabFree::Invalid;
        }
        slab.in_use[word] &= !bit;
        let was_full = slab.used == slab.chunks;
        slab.used -= 1;
        self.used_bytes -= chunk;
        let class = slab.class;
        if slab.used == 0 {
            let (saddr, slen) = (slab.addr, slab.len());
            self.slabs[id as usize] = None;
            self.spare_ids.push(id);
            self.by_addr.remove(&saddr);
            // A slab with one used chunk and more than one chunk sits in `partial`; a
            // single-chunk slab cannot exist (SLAB_MIN_CHUNKS >= 8).
            if let Some(pos) = self.partial[class].iter().position(|&s| s == id) {
                self.partial[class].swap_remove(pos);
            }
            self.slab_bytes -= slen;
            return SlabFree::SlabEmptied {
                chunk,
                addr: saddr,
                len: slen,
            };
        }
        slab.free.push(i);
        if was_full {
            self.partial[class].push(id);
        }
        SlabFree::Freed { chunk }
    }

    /// Bytes held by slabs (used or not).
    pub fn slab_bytes(&self) -> u64 {
        self.slab_bytes
    }

    /// Bytes of chunks handed out.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    pub fn slab_count(&self) -> usize {
        self.by_addr.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_increasing_and_lookup_is_tight() {
        for c in 1..CLASS_COUNT {
            assert!(class_size(c) > class_size(c - 1));
            assert_eq!(class_of(class_size(c)), Some(c));
            assert_eq!(class_of(class_size(c - 1) + 1), Some(c));
            // At most 25 % rounding waste (20 % of the rounded size).
            assert!(class_size(c) * 4 <= class_size(c - 1) * 5 + 64);
        }
        assert_eq!(class_of(1), Some(0));
        assert_eq!(class_of(64), Some(0));
        assert_eq!(class_of(65), Some(1));
        assert_eq!(class_size(1), 80);
        assert_eq!(class_size(4), 128);
        assert_eq!(class_size(5), 160);
        assert_eq!(class_of(CLASS_MAX_BYTES), Some(CLASS_COUNT - 1));
        assert_eq!(class_of(CLASS_MAX_BYTES + 1), None);
    }

    #[test]
    fn chunks_recycle_and_empty_slabs_return() {
        let mut s = SlabSet::new();
        let c = class_of(4096).unwrap();
        assert_eq!(s.take(c), None);
        let len = SlabSet::slab_len(c, 64 * 1024).unwrap();
        assert_eq!(len, 64 * 1024);
        let a = s.add_slab_and_take(c, 1 << 20, len);
        assert_eq!(a, 1 << 20);
        let b = s.take(c).unwrap();
        assert_eq!(b, a + 4096);
        assert_eq!(s.free(a + 1), SlabFree::Invalid);
        assert_eq!(s.free(a), SlabFree::Freed { chunk: 4096 });
        assert_eq!(s.free(a), SlabFree::Invalid, "double free");
        assert_eq!(s.take(c), Some(a), "freed chunk reused first");
        assert_eq!(s.free(0), SlabFree::NotSlab);
        assert_eq!(s.free((1 << 20) + len), SlabFree::NotSlab);
        assert_eq!(s.free(a), SlabFree::Freed { chunk: 4096 });
        assert_eq!(
            s.free(b),
            SlabFree::SlabEmptied {
                chunk: 4096,
                addr: 1 << 20,
                len
            }
        );
        assert_eq!((s.slab_bytes(), s.used_bytes(), s.slab_count()), (0, 0, 0));
        assert!(SlabSet::slab_len(CLASS_COUNT - 1, 4 << 20).is_none());
    }

    #[test]
    fn full_slab_leaves_and_rejoins_partial() {
        let mut s = SlabSet::new();
        let c = 0;
        let len = SlabSet::slab_len(c, 8 * 64).unwrap();
        let first = s.add_slab_and_take(c, 0, len);
        let rest: Vec<u64> = (1..8).map(|_| s.take(c).unwrap()).collect();
        assert_eq!(s.take(c), None, "slab full");
        assert_eq!(s.free(rest[3]), SlabFree::Freed { chunk: 64 });
        assert_eq!(s.take(c), Some(rest[3]));
        assert_eq!(s.free(first), SlabFree::Freed { chunk: 64 });
        assert_eq!(s.used_bytes(), 7 * 64);
    }
}
