//! In-flight operations of a shard and the slab that holds them.
//!
//! The index of an operation in the [`Slab`] is its `user_data`, so a completion finds the
//! operation that owns the buffers its entry pointed at. An operation leaves the slab only
//! when its (last) completion has arrived; until then nothing it owns is freed or moved
//! (every buffer is a `Box`, whose heap allocation does not move when the `Op` does).

use crate::shard::conn::RecvState;
use crate::shard::send::SendBatch;

/// `user_data` of entries whose completion is ignored (cancellations).
pub(crate) const UNTRACKED: u64 = u64::MAX;

/// One in-flight operation and everything its submission entry points at.
pub(crate) enum Op {
    /// `accept` on the listener; points at nothing.
    Accept,
    /// `read` of the shard's eventfd: a stop request. Owns the 8-byte target.
    Wake { buf: Box<u64> },
    /// A `recv` on connection `conn`; its state owns the target (or leases it).
    Recv { conn: usize, state: RecvState },
    /// A `sendmsg`/`sendmsg_zc` on connection `conn`; the batch owns `msghdr` and `iovec`s.
    Send { conn: usize, batch: Box<SendBatch> },
}

/// A vector of slots with a free list: O(1) insert and remove by index.
pub(crate) struct Slab<T> {
    slots: Vec<Option<T>>,
    free: Vec<usize>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value`; returns its index.
    pub(crate) fn insert(&mut self, value: T) -> usize {
        self.len += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(value);
                i
            }
            None => {
                self.slots.push(Some(value));
                self.slots.len() - 1
            }
        }
    }

    /// Takes the value at `index`, if any.
    pub(crate) fn remove(&mut self, index: usize) -> Option<T> {
        let value = self.slots.get_mut(index)?.take()?;
        self.free.push(index);
        self.len -= 1;
        Some(value)
    }

    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        self.slots.get(index)?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        self.slots.get_mut(index)?.as_mut()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Indices of occupied slots.
    pub(crate) fn indices(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|&i| self.slots[i].is_some())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_reuses_freed_slots() {
        let mut s = Slab::default();
        let a = s.insert('a');
        let b = s.insert('b');
        assert_eq!(s.remove(a), Some('a'));
        assert_eq!(s.remove(a), None);
        let c = s.insert('c');
        assert_eq!(c, a);
        assert_eq!(
            (s.len(), s.get(b), s.indices()),
            (2, Some(&'b'), vec![a, b])
        );
        assert_eq!(s.remove(99), None);
    }
}
