//! A slab allocator owned by one shard, freeable from any thread.
//!
//! [`SlabAllocator`] is single-threaded by design. A block allocated by a shard may be
//! released by another thread (a buffer handed to a client thread, a completion on another
//! core); that thread must not touch the owner's free lists. Instead it sends the block back
//! through a [`RemoteFree`] handle, and the owner applies every returned block the next time
//! it allocates (or when it calls [`OwnedSlab::drain`]). No lock is taken on either side: the
//! hand-back is a channel, and only the owner mutates the allocator.
//!
//! Invariant: a block is freed into the allocator exactly once, by its owner; a block returned
//! twice (or forged) is refused by the allocator's bitmap and counted in
//! [`OwnedSlab::rejected_remote_frees`], never applied.

use std::sync::mpsc::{channel, Receiver, Sender};

use super::slab::{SlabAllocator, SlabBlock, SlabError};

/// The owner's side.
pub struct OwnedSlab {
    slab: SlabAllocator,
    returned: Receiver<SlabBlock>,
    handle: Sender<SlabBlock>,
    rejected: u64,
}

/// Any thread's way to give a block back to its owner.
#[derive(Clone)]
pub struct RemoteFree {
    to_owner: Sender<SlabBlock>,
}

impl RemoteFree {
    /// Queues `block` for its owner. Returns false if the owner is gone (the region with it).
    pub fn free(&self, block: SlabBlock) -> bool {
        self.to_owner.send(block).is_ok()
    }
}

impl OwnedSlab {
    pub fn new(capacity_bytes: usize) -> OwnedSlab {
        let (handle, returned) = channel();
        OwnedSlab {
            slab: SlabAllocator::new(capacity_bytes),
            returned,
            handle,
            rejected: 0,
        }
    }

    /// A handle other threads use to free blocks of this allocator.
    pub fn remote_free(&self) -> RemoteFree {
        RemoteFree {
            to_owner: self.handle.clone(),
        }
    }

    /// Applies every block other threads returned; returns how many were applied.
    pub fn drain(&mut self) -> usize {
        let mut applied = 0;
        while let Ok(block) = self.returned.try_recv() {
            match self.slab.free(block) {
                Ok(()) => applied += 1,
                Err(_) => self.rejected += 1,
            }
        }
        applied
    }

    /// Allocates `size` bytes, first taking back what other threads freed.
    pub fn alloc(&mut self, size: usize) -> Result<SlabBlock, SlabError> {
        self.drain();
        self.slab.alloc(size)
    }

    /// Frees a block on the owner's own thread.
    pub fn free(&mut self, block: SlabBlock) -> Result<(), SlabError> {
        self.slab.free(block)
    }

    /// Remote frees refused as double or forged frees.
    pub fn rejected_remote_frees(&self) -> u64 {
        self.rejected
    }

    pub fn live_blocks(&self) -> usize {
        self.slab.live_blocks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::SLAB_BYTES;

    #[test]
    fn blocks_freed_on_other_threads_come_back_to_the_owner() {
        let mut owner = OwnedSlab::new(4 * SLAB_BYTES);
        let blocks: Vec<SlabBlock> = (0..64).map(|_| owner.alloc(4096).unwrap()).collect();
        assert_eq!(owner.live_blocks(), 64);
        let handle = owner.remote_free();
        let freer = std::thread::spawn(move || {
            for b in blocks {
                assert!(handle.free(b));
            }
        });
        freer.join().unwrap();
        // Nothing is applied until the owner looks.
        assert_eq!(owner.live_blocks(), 64);
        assert_eq!(owner.drain(), 64);
        assert_eq!(owner.live_blocks(), 0);
        assert_eq!(owner.rejected_remote_frees(), 0);
    }

    #[test]
    fn a_block_returned_twice_is_refused_not_applied() {
        let mut owner = OwnedSlab::new(SLAB_BYTES);
        let b = owner.alloc(1000).unwrap();
        let keep = owner.alloc(1000).unwrap();
        let h = owner.remote_free();
        assert!(h.free(b));
        assert!(h.free(b));
        // alloc drains: one free applied, the duplicate refused; `keep` is untouched.
        let again = owner.alloc(1000).unwrap();
        assert_eq!(owner.rejected_remote_frees(), 1);
        assert_eq!(owner.live_blocks(), 2);
        assert_ne!(again.offset(), keep.offset());
        owner.free(keep).unwrap();
        owner.free(again).unwrap();
        assert_eq!(owner.live_blocks(), 0);
    }
}
