//! Where the bytes of a collective phase are pushed from, when not from the own slot.
//!
//! A phase's bytes normally go through the rank's collective slot: the op copies them there,
//! peers on this host read the slot, and [`super::net`] pushes the reader's part of it to
//! each peer on another host. When *every* live peer of an op is on another host, nobody
//! maps the slot, so that copy buys nothing: the op records here, per slot and reader, the
//! caller's buffer range that holds what the reader would read in the slot, and the push
//! sends it from there (a WRITE to the same offset of the replica, so the reader cannot
//! tell). One copy less per pushed byte.
//!
//! Lifetime: an op sets the sources before it stores `posted` and clears them after its
//! [`super::Shared::publish`] returned. Every push of a phase happens under the link's lock
//! in some `publish` call at or after that store, and the collective thread's own `publish`
//! returns only after every live link pushed it, so a source is read only while the op
//! (which keeps the caller's buffers alive and unchanged until its completion) runs the
//! phase. The `posted` store (Release) and the pushing thread's load of it (Acquire) order
//! the Relaxed stores here before their reads.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Per collective slot (two) and reader rank: `(address, bytes)` to push from, or `(0, 0)`.
pub(crate) struct PushFrom {
    at: [Vec<(AtomicUsize, AtomicUsize)>; 2],
}

impl PushFrom {
    /// No sources, for a group of `ranks` slots.
    pub(crate) fn new(ranks: usize) -> PushFrom {
        let row = || (0..ranks).map(|_| Default::default()).collect();
        PushFrom { at: [row(), row()] }
    }

    /// Reader `q`'s bytes of the coming phase in `slot` are the `len` bytes at `src`.
    pub(crate) fn set(&self, slot: usize, q: usize, src: *const u8, len: usize) {
        if let Some((a, l)) = self.at[slot & 1].get(q) {
            a.store(src as usize, Ordering::Relaxed);
            l.store(len, Ordering::Relaxed);
        }
    }

    /// Back to pushing `slot` from the slot itself.
    pub(crate) fn clear(&self, slot: usize) {
        for (a, l) in &self.at[slot & 1] {
            a.store(0, Ordering::Relaxed);
            l.store(0, Ordering::Relaxed);
        }
    }

    /// Reader `q`'s source for `slot`, if the op set one.
    pub(crate) fn get(&self, slot: usize, q: usize) -> Option<(*const u8, usize)> {
        let (a, l) = self.at[slot & 1].get(q)?;
        match a.load(Ordering::Relaxed) {
            0 => None,
            p => Some((p as *const u8, l.load(Ordering::Relaxed))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_clear() {
        let p = PushFrom::new(3);
        let buf = [0u8; 16];
        assert_eq!(p.get(1, 2), None);
        p.set(1, 2, buf.as_ptr(), 16);
        p.set(1, 7, buf.as_ptr(), 16); // out of range: ignored
        assert_eq!(p.get(1, 2), Some((buf.as_ptr(), 16)));
        assert_eq!(p.get(0, 2), None, "the other slot is untouched");
        p.clear(1);
        assert_eq!(p.get(1, 2), None);
    }
}
