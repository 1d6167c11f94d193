//! `alloc_from_mem_pool`: memory handed to Python by address, bounded by the client's
//! `local_buffer_size` (upstream allocates it from the client local buffer) and freed when the
//! store is closed, as upstream frees its local buffer then.

use std::alloc::{alloc_zeroed, dealloc, Layout};

use parking_lot::Mutex;

/// Alignment of every allocation (upstream's local buffer allocator aligns to 64 bytes).
const ALIGN_BYTES: usize = 64;

#[derive(Default)]
pub struct MemPool {
    inner: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    capacity: u64,
    used: u64,
    blocks: Vec<(usize, Layout)>,
}

impl MemPool {
    /// Frees every block and sets a new capacity.
    pub fn reset(&self, capacity: u64) {
        let mut st = self.inner.lock();
        for (addr, layout) in st.blocks.drain(..) {
            // SAFETY: each block was allocated by `alloc` below with exactly this layout and is
            // freed once (drained from the list).
            unsafe { dealloc(addr as *mut u8, layout) };
        }
        st.used = 0;
        st.capacity = capacity;
    }

    /// The address of `size` zeroed bytes, or 0 when the pool is exhausted or `size` is 0.
    pub fn alloc(&self, size: u64) -> u64 {
        let mut st = self.inner.lock();
        let Some(used) = st.used.checked_add(size).filter(|u| *u <= st.capacity) else {
            return 0;
        };
        let Ok(n) = usize::try_from(size) else {
            return 0;
        };
        if n == 0 {
            return 0;
        }
        let Ok(layout) = Layout::from_size_align(n, ALIGN_BYTES) else {
            return 0;
        };
        // SAFETY: `layout` has a non-zero size.
        let p = unsafe { alloc_zeroed(layout) };
        if p.is_null() {
            return 0;
        }
        st.used = used;
        st.blocks.push((p as usize, layout));
        p as u64
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        self.reset(0);
    }
}
