//! A slab allocator of offsets inside one region, for local buffers and staging space.
//!
//! The region (`capacity_bytes`, a whole number of [`SLAB_BYTES`] slabs; a trailing partial
//! slab is not used) is cut into slabs. A free slab is handed to one size class on demand;
//! size classes are powers of two from [`SLAB_CLASS_MIN_BYTES`] to [`SLAB_BYTES`]. A request
//! is served from a partially used slab of its class (LIFO free stack, then a bump cursor),
//! or from a fresh slab. A slab whose last block is freed goes back to the free-slab stack, so
//! memory moves between classes and nothing leaks.
//!
//! Every operation is O(1) (amortised for the `Vec` pushes): a class keeps its partial slabs
//! in an intrusive doubly linked list; a block's slab is `offset / SLAB_BYTES`.
//!
//! Invariants:
//! - a block is `class_bytes` long, aligned to `class_bytes`, inside one slab, and overlaps
//!   no other live block;
//! - a slab is in its class's partial list iff it has a class and `0 < live < per_slab`;
//! - a slab is on the free-slab stack iff it has no class (and then `live == 0`);
//! - `free` accepts only a live block (tracked in a per-slab bitmap): a double free or a
//!   forged block is an error, never a corruption.
//!
//! The allocator hands out offsets only; the owner adds its region's base address. It is
//! single-threaded by design: one allocator belongs to one shard.

use crate::limits::{SLAB_BYTES, SLAB_CLASS_COUNT, SLAB_CLASS_MIN_BYTES};

const NIL: u32 = u32::MAX;
const NO_CLASS: u8 = u8::MAX;

/// One allocation: `len()` bytes at `offset()` of the region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlabBlock {
    offset: usize,
    class: u8,
}

impl SlabBlock {
    /// Offset of the first byte from the start of the region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Usable length: the size class, at least the requested size.
    pub fn len(&self) -> usize {
        class_bytes(self.class)
    }

    /// Always false: classes are at least `SLAB_CLASS_MIN_BYTES`.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Why an allocation or a free failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlabError {
    /// A request for zero bytes.
    #[error("slab allocation of 0 bytes")]
    ZeroSize,
    /// A request larger than the largest class.
    #[error("slab allocation of {requested} bytes exceeds the largest class of {max} bytes")]
    TooLarge { requested: usize, max: usize },
    /// No partial slab of the class and no free slab left.
    #[error("slab region exhausted: no room for a {class_bytes}-byte block")]
    OutOfMemory { class_bytes: usize },
    /// `free` of a block that is not live (double free, or not from this allocator).
    #[error("block at offset {offset} is not a live allocation of this slab allocator")]
    NotAllocated { offset: usize },
}

#[derive(Debug)]
struct Slab {
    class: u8,
    live: u32,
    bump: u32,
    free: Vec<u32>,
    used: Vec<u64>,
    prev: u32,
    next: u32,
}

/// Size-class allocator of offsets; see the module docs.
#[derive(Debug)]
pub struct SlabAllocator {
    slabs: Vec<Slab>,
    free_slabs: Vec<u32>,
    partial: [u32; SLAB_CLASS_COUNT],
    live_blocks: usize,
    live_bytes: usize,
}

fn class_bytes(class: u8) -> usize {
    SLAB_CLASS_MIN_BYTES << class
}

fn per_slab(class: u8) -> u32 {
    (SLAB_BYTES / class_bytes(class)) as u32
}

/// The class serving `size` bytes (`0 < size <= SLAB_BYTES`).
fn class_of(size: usize) -> u8 {
    let rounded = size.max(SLAB_CLASS_MIN_BYTES).next_power_of_two();
    (rounded.trailing_zeros() - SLAB_CLASS_MIN_BYTES.trailing_zeros()) as u8
}

impl SlabAllocator {
    /// An allocator over `capacity_bytes / SLAB_BYTES` slabs, all free.
    pub fn new(capacity_bytes: usize) -> SlabAllocator {
        let count = capacity_bytes / SLAB_BYTES;
        assert!(
            count < NIL as usize,
            "slab region too large for u32 slab indices"
        );
        let slabs = (0..count)
            .map(|_| Slab {
                class: NO_CLASS,
                live: 0,
                bump: 0,
                free: Vec::new(),
                used: Vec::new(),
                prev: NIL,
                next: NIL,
            })
            .collect();
        // Reverse so that slab 0 is handed out first.
        let free_slabs = (0..count as u32).rev().collect();
        SlabAllocator {
            slabs,
            free_slabs,
            partial: [NIL; SLAB_CLASS_COUNT],
            live_blocks: 0,
            live_bytes: 0,
        }
    }

    /// Allocates a block of at least `size` bytes.
    pub fn alloc(&mut self, size: usize) -> Result<SlabBlock, SlabError> {
        if size == 0 {
            return Err(SlabError::ZeroSize);
        }
        if size > SLAB_BYTES {
            return Err(SlabError::TooLarge {
                requested: size,
                max: SLAB_BYTES,
            });
        }
        let class = class_of(size);
        let mut idx = self.partial[class as usize];
        if idx == NIL {
            idx = self.free_slabs.pop().ok_or(SlabError::OutOfMemory {
                class_bytes: class_bytes(class),
            })?;
            let slab = &mut self.slabs[idx as usize];
            slab.class = class;
            slab.used.clear();
            slab.used.resize((per_slab(class) as usize).div_ceil(64), 0);
            self.push_partial(class, idx);
        }
        let slab = &mut self.slabs[idx as usize];
        let obj = match slab.free.pop() {
            Some(obj) => obj,
            None => {
                slab.bump += 1;
                slab.bump - 1
            }
        };
        debug_assert!(obj < per_slab(class));
        slab.used[obj as usize / 64] |= 1 << (obj % 64);
        slab.live += 1;
        if slab.live == per_slab(class) {
            self.unlink_partial(class, idx);
        }
        self.live_blocks += 1;
        self.live_bytes += class_bytes(class);
        Ok(SlabBlock {
            offset: idx as usize * SLAB_BYTES + obj as usize * class_bytes(class),
            class,
        })
    }

    /// Frees a live block. A block that is not live is refused and changes nothing.
    pub fn free(&mut self, block: SlabBlock) -> Result<(), SlabError> {
        let not_allocated = SlabError::NotAllocated {
            offset: block.offset,
        };
        let idx = block.offset / SLAB_BYTES;
        let Some(slab) = self.slabs.get_mut(idx) else {
            return Err(not_allocated);
        };
        let within = block.offset % SLAB_BYTES;
        if slab.class != block.class || !within.is_multiple_of(class_bytes(block.class)) {
            return Err(not_allocated);
        }
        let obj = (within / class_bytes(block.class)) as u32;
        let bit = 1u64 << (obj % 64);
        if slab.used[obj as usize / 64] & bit == 0 {
            return Err(not_allocated);
        }
        slab.used[obj as usize / 64] &= !bit;
        let was_full = slab.live == per_slab(block.class);
        slab.live -= 1;
        self.live_blocks -= 1;
        self.live_bytes -= class_bytes(block.class);
        let idx = idx as u32;
        if slab.live == 0 {
            if !was_full {
                self.unlink_partial(block.class, idx);
            }
            let slab = &mut self.slabs[idx as usize];
            slab.class = NO_CLASS;
            slab.bump = 0;
            slab.free.clear();
            self.free_slabs.push(idx);
        } else {
            slab.free.push(obj);
            if was_full {
                self.push_partial(block.class, idx);
            }
        }
        Ok(())
    }

    /// Bytes the allocator manages (whole slabs only).
    pub fn capacity_bytes(&self) -> usize {
        self.slabs.len() * SLAB_BYTES
    }

    /// Slabs not handed to any class.
    pub fn free_slab_count(&self) -> usize {
        self.free_slabs.len()
    }

    /// Number of live blocks.
    pub fn live_blocks(&self) -> usize {
        self.live_blocks
    }

    /// Sum of the lengths of live blocks.
    pub fn live_bytes(&self) -> usize {
        self.live_bytes
    }

    fn push_partial(&mut self, class: u8, idx: u32) {
        let head = self.partial[class as usize];
        let slab = &mut self.slabs[idx as usize];
        slab.prev = NIL;
        slab.next = head;
        if head != NIL {
            self.slabs[head as usize].prev = idx;
        }
        self.partial[class as usize] = idx;
    }

    fn unlink_partial(&mut self, class: u8, idx: u32) {
        let (prev, next) = {
            let slab = &mut self.slabs[idx as usize];
            let links = (slab.prev, slab.next);
            slab.prev = NIL;
            slab.next = NIL;
            links
        };
        if prev == NIL {
            debug_assert_eq!(self.partial[class as usize], idx);
            self.partial[class as usize] = next;
        } else {
            self.slabs[prev as usize].next = next;
        }
        if next != NIL {
            self.slabs[next as usize].prev = prev;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classes_and_limits() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(SLAB_CLASS_MIN_BYTES), 0);
        assert_eq!(class_of(SLAB_CLASS_MIN_BYTES + 1), 1);
        assert_eq!(class_of(SLAB_BYTES) as usize, SLAB_CLASS_COUNT - 1);
        let mut a = SlabAllocator::new(SLAB_BYTES);
        assert_eq!(a.alloc(0), Err(SlabError::ZeroSize));
        assert!(matches!(
            a.alloc(SLAB_BYTES + 1),
            Err(SlabError::TooLarge { .. })
        ));
        let whole = a.alloc(SLAB_BYTES).unwrap();
        assert_eq!((whole.offset(), whole.len()), (0, SLAB_BYTES));
        assert!(matches!(a.alloc(1), Err(SlabError::OutOfMemory { .. })));
        a.free(whole).unwrap();
        assert_eq!(a.free(whole), Err(SlabError::NotAllocated { offset: 0 }));
        assert_eq!(a.free_slab_count(), 1);
    }

    #[test]
    fn forged_blocks_are_refused() {
        let mut a = SlabAllocator::new(2 * SLAB_BYTES);
        let b = a.alloc(1000).unwrap();
        assert_eq!(b.len(), 1024);
        let forged = SlabBlock {
            offset: b.offset() + 1,
            class: b.class,
        };
        assert!(a.free(forged).is_err());
        let other_class = SlabBlock {
            offset: b.offset(),
            class: b.class + 1,
        };
        assert!(a.free(other_class).is_err());
        let past_end = SlabBlock {
            offset: 5 * SLAB_BYTES,
            class: 0,
        };
        assert!(a.free(past_end).is_err());
        assert_eq!(a.live_blocks(), 1);
        a.free(b).unwrap();
        assert_eq!((a.live_blocks(), a.free_slab_count()), (0, 2));
    }

    #[test]
    fn fills_a_slab_then_takes_the_next() {
        let mut a = SlabAllocator::new(2 * SLAB_BYTES);
        let n = SLAB_BYTES / SLAB_CLASS_MIN_BYTES;
        let blocks: Vec<_> = (0..n + 1).map(|_| a.alloc(1).unwrap()).collect();
        assert_eq!(a.free_slab_count(), 0);
        assert_eq!(blocks[n].offset(), SLAB_BYTES);
        for b in blocks {
            a.free(b).unwrap();
        }
        assert_eq!(a.free_slab_count(), 2);
        assert_eq!(a.live_bytes(), 0);
    }

    fn size() -> impl Strategy<Value = usize> {
        prop_oneof![1usize..=4096, 4097usize..=SLAB_BYTES]
    }

    proptest! {
        /// Model: the list of live `(offset, len)` ranges. Checks alignment, bounds,
        /// no overlap, refusal of double frees, OOM only with no free slab, and no leak.
        #[test]
        fn matches_model(ops in proptest::collection::vec((any::<bool>(), size(), any::<usize>()), 1..400)) {
            let mut a = SlabAllocator::new(4 * SLAB_BYTES);
            let mut live: Vec<SlabBlock> = Vec::new();
            let mut freed: Vec<SlabBlock> = Vec::new();
            for (is_alloc, size, pick) in ops {
                if is_alloc || live.is_empty() {
                    match a.alloc(size) {
                        Ok(b) => {
                            prop_assert!(b.len() >= size && b.len().is_power_of_two());
                            prop_assert_eq!(b.offset() % b.len(), 0);
                            prop_assert!(b.offset() + b.len() <= a.capacity_bytes());
                            for o in &live {
                                prop_assert!(b.offset() + b.len() <= o.offset() || o.offset() + o.len() <= b.offset(),
                                    "{:?} overlaps {:?}", b, o);
                            }
                            freed.retain(|f| *f != b);
                            live.push(b);
                        }
                        Err(SlabError::OutOfMemory { .. }) => prop_assert_eq!(a.free_slab_count(), 0),
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                } else {
                    let b = live.swap_remove(pick % live.len());
                    prop_assert_eq!(a.free(b), Ok(()));
                    freed.push(b);
                    if let Some(f) = freed.first() {
                        if !live.contains(f) {
                            prop_assert!(a.free(*f).is_err(), "double free accepted");
                        }
                    }
                }
                prop_assert_eq!(a.live_blocks(), live.len());
                prop_assert_eq!(a.live_bytes(), live.iter().map(|b| b.len()).sum::<usize>());
            }
            for b in live.drain(..) {
                prop_assert_eq!(a.free(b), Ok(()));
            }
            prop_assert_eq!(a.free_slab_count(), 4);
            prop_assert_eq!(a.live_bytes(), 0);
        }
    }
}
