//! Managed buffers: memory the engine allocates, registers and hands out by address
//! (`allocate_managed_buffer` / `free_managed_buffer`).
//!
//! Requests up to [`SLAB_BYTES`] come from pools: a pool is one registered [`Segment`] of
//! [`MANAGED_POOL_BYTES`] cut by a [`SlabAllocator`]; a new pool is made when the existing
//! ones are full (at most [`MANAGED_POOLS_MAX`]). Larger requests get a dedicated segment,
//! registered on its own and unregistered when freed. (Upstream: a buddy allocator over
//! 2 GiB registered chunks, with dedicated allocations above 256 MiB.)
//!
//! This module is bookkeeping only; the engine registers and unregisters the segments.
//! Invariants: every live address maps to exactly one block or dedicated segment; a pool
//! stays registered and mapped for the engine's life, so a freed block's memory is still
//! valid (peers may still write it, as with upstream).

use std::collections::HashMap;
use std::sync::Arc;

use super::config::{MANAGED_POOLS_MAX, MANAGED_POOL_BYTES};
use crate::limits::SLAB_BYTES;
use crate::mem::{Segment, SlabAllocator, SlabBlock};

struct Pool {
    segment: Arc<Segment>,
    slab: SlabAllocator,
}

/// Live managed buffers of one engine.
#[derive(Default)]
pub(crate) struct Managed {
    pools: Vec<Pool>,
    blocks: HashMap<u64, (usize, SlabBlock)>,
    dedicated: HashMap<u64, Arc<Segment>>,
}

/// What freeing an address requires of the engine.
pub(crate) enum Freed {
    /// A pool block went back to its pool; nothing to unregister.
    Block,
    /// A dedicated segment: unregister it (then drop it to unmap).
    Dedicated(Arc<Segment>),
}

impl Managed {
    /// True when `len` is served from pools (else by a dedicated segment).
    pub(crate) fn is_small(len: usize) -> bool {
        len <= SLAB_BYTES
    }

    /// A block from an existing pool.
    pub(crate) fn alloc_small(&mut self, len: usize) -> Option<u64> {
        for (i, p) in self.pools.iter_mut().enumerate() {
            if let Ok(b) = p.slab.alloc(len) {
                let addr = p.segment.addr() as u64 + b.offset() as u64;
                self.blocks.insert(addr, (i, b));
                return Some(addr);
            }
        }
        None
    }

    /// Whether another pool may be made.
    pub(crate) fn can_grow(&self) -> bool {
        self.pools.len() < MANAGED_POOLS_MAX
    }

    /// Adopts a new (already registered) pool segment.
    pub(crate) fn add_pool(&mut self, segment: Arc<Segment>) {
        debug_assert!(segment.len() >= MANAGED_POOL_BYTES);
        let slab = SlabAllocator::new(segment.len());
        self.pools.push(Pool { segment, slab });
    }

    /// Adopts a dedicated (already registered) segment.
    pub(crate) fn add_dedicated(&mut self, segment: Arc<Segment>) -> u64 {
        let addr = segment.addr() as u64;
        self.dedicated.insert(addr, segment);
        addr
    }

    /// Frees the buffer at `addr`; `None` when `addr` is not a live managed buffer.
    pub(crate) fn free(&mut self, addr: u64) -> Option<Freed> {
        if let Some((pool, block)) = self.blocks.remove(&addr) {
            // The block came from this pool's allocator and was live, so free succeeds.
            let freed = self.pools[pool].slab.free(block);
            debug_assert!(freed.is_ok());
            return Some(Freed::Block);
        }
        self.dedicated.remove(&addr).map(Freed::Dedicated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{HugepagePolicy, SegmentOptions};

    #[test]
    fn pools_and_dedicated() {
        let mut m = Managed::default();
        assert!(Managed::is_small(4096) && !Managed::is_small(SLAB_BYTES + 1));
        assert_eq!(m.alloc_small(4096), None);
        let opts = SegmentOptions {
            hugepages: HugepagePolicy::Never,
            prefault: false,
        };
        let seg = Arc::new(Segment::new(MANAGED_POOL_BYTES, opts).unwrap());
        let base = seg.addr() as u64;
        m.add_pool(seg);
        let a = m.alloc_small(4096).unwrap();
        let b = m.alloc_small(4096).unwrap();
        assert!(a >= base && b >= base && a != b);
        assert!(matches!(m.free(a), Some(Freed::Block)));
        assert!(m.free(a).is_none(), "double free is refused");
        let big = Arc::new(Segment::new(SLAB_BYTES * 2, opts).unwrap());
        let addr = m.add_dedicated(big);
        assert!(matches!(m.free(addr), Some(Freed::Dedicated(_))));
        assert!(m.free(12345).is_none());
    }
}
