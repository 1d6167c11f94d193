//! Receiving a remote peer's phase straight into the caller's buffer.
//!
//! A peer on another host pushes a phase's bytes as a WRITE into this rank's replica of its
//! segment ([`super::net`]); the op then copies them from the replica into the caller's
//! tensor. When the op knows beforehand where a phase's bytes of peer `p` go (all_gather,
//! all_to_all, broadcast, the second phase of all_reduce), it *registers* that destination
//! for the phase with the replica of `p`, and the receive thread reads the WRITE's payload
//! from the socket into the destination instead: one copy less per received byte.
//!
//! Which phase a WRITE belongs to: the owner pushes a phase's bytes after the STORE that
//! published the phase before it, so a WRITE into a collective slot belongs to phase
//! `posted + 1` of the replica. A registration names the phase, the slot offset and the exact
//! length; a WRITE that does not match it exactly goes to the replica as before.
//!
//! Races, all decided under one lock: the receive thread marks a phase *started* when its
//! first slot WRITE arrives; a registration for a phase the receive thread has started (its
//! bytes may already be in the replica) is refused, and the op copies as before. After the
//! phase wait, [`Redirect::delivered`] says whether the bytes went to the destination (the
//! STORE of `posted` that the wait saw came after them on the same connection).
//!
//! Lifetime: the destination is the caller's tensor, valid until the op completes. At the end
//! of every op the collective thread calls [`Redirect::clear`], which drops the unused
//! registrations and waits while the receive thread is still writing into a destination (a
//! peer that stopped mid-payload holds it until the receive thread gives the link up, at most
//! the liveness timeout), so no byte lands in a tensor after its op returned.

use std::sync::{Condvar, Mutex, MutexGuard};

use crate::limits::PG_NET_REDIRECTS_MAX;

#[derive(Clone, Copy)]
struct Entry {
    phase: u64,
    off: usize,
    len: usize,
    dst: usize,
    used: bool,
}

#[derive(Default)]
struct State {
    /// Highest phase whose slot WRITEs the receive thread has begun to apply.
    started: u64,
    /// Whether the receive thread is writing into a registered destination now.
    busy: bool,
    entries: Vec<Entry>,
}

/// The registrations of one replica (shared by its two mappings).
#[derive(Default)]
pub(crate) struct Redirect {
    state: Mutex<State>,
    idle: Condvar,
}

impl Redirect {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks that phase `phase`'s WRITE of exactly `len` bytes at slot offset `off` go to
    /// `dst`. False when it is too late (the receive thread began that phase) or the table
    /// is full: the op then copies from the replica.
    pub(crate) fn register(&self, phase: u64, off: usize, len: usize, dst: *mut u8) -> bool {
        let mut st = self.lock();
        if phase <= st.started || st.entries.len() >= PG_NET_REDIRECTS_MAX || len == 0 {
            return false;
        }
        let dst = dst as usize;
        st.entries.push(Entry {
            phase,
            off,
            len,
            dst,
            used: false,
        });
        true
    }

    /// Receive thread, before the payload of a WRITE of `len` bytes at slot offset `off`
    /// for phase `phase`: the registered destination, if any (then [`Redirect::done`] must
    /// follow the payload).
    pub(crate) fn take(&self, phase: u64, off: usize, len: usize) -> Option<*mut u8> {
        let mut st = self.lock();
        st.started = st.started.max(phase);
        let e = st
            .entries
            .iter_mut()
            .find(|e| e.phase == phase && e.off == off && e.len == len && !e.used)?;
        e.used = true;
        let dst = e.dst as *mut u8;
        st.busy = true;
        Some(dst)
    }

    /// Receive thread: the payload [`Redirect::take`] gave a destination for is written (or
    /// the link failed while writing it).
    pub(crate) fn done(&self) {
        self.lock().busy = false;
        self.idle.notify_all();
    }

    /// Whether phase `phase`'s bytes at slot offset `off` went to the registered
    /// destination (asked once, after the phase wait saw the phase published). The answer
    /// retires that registration and every one of an earlier phase: their WRITEs, if any,
    /// came before the STORE the wait saw, so the table holds only the phases ahead and a
    /// long op never fills it.
    pub(crate) fn delivered(&self, phase: u64, off: usize) -> bool {
        let mut st = self.lock();
        let hit = st
            .entries
            .iter()
            .any(|e| e.phase == phase && e.off == off && e.used);
        st.entries
            .retain(|e| e.phase > phase || (e.phase == phase && e.off != off));
        hit
    }

    /// Drops every registration, waiting until no destination is being written.
    pub(crate) fn clear(&self) {
        let mut st = self.lock();
        while st.busy {
            st = self.idle.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_take_deliver_and_refuse_late() {
        let r = Redirect::default();
        let mut buf = [0u8; 8];
        let p = buf.as_mut_ptr();
        assert!(r.register(5, 64, 8, p));
        assert_eq!(
            r.take(5, 64, 7),
            None,
            "a length that differs is not redirected"
        );
        assert_eq!(r.take(5, 64, 8), Some(p));
        r.done();
        assert!(!r.delivered(5, 0));
        assert!(r.delivered(5, 64));
        assert!(!r.register(5, 0, 8, p), "phase 5 has started: too late");
        assert!(!r.register(4, 0, 8, p));
        assert!(r.register(6, 0, 8, p));
        r.clear();
        assert_eq!(r.take(6, 0, 8), None, "cleared");
    }

    #[test]
    fn answered_phases_leave_the_table() {
        let r = Redirect::default();
        let mut buf = [0u8; 8];
        let p = buf.as_mut_ptr();
        // A long op: a phase is registered two ahead and asked about once it is published,
        // far more phases than the table holds.
        let phases = 4 * PG_NET_REDIRECTS_MAX as u64;
        assert!(r.register(1, 0, 8, p) && r.register(2, 0, 8, p));
        for s in 1..=phases {
            assert_eq!(r.take(s, 0, 8), Some(p), "phase {s} registered");
            r.done();
            assert!(r.delivered(s, 0));
            assert!(r.register(s + 2, 0, 8, p), "phase {} accepted", s + 2);
        }
        assert_eq!(r.lock().entries.len(), 2, "only the two phases ahead");
        assert!(!r.delivered(phases, 0), "an answer is given once");
    }

    #[test]
    fn clear_waits_for_a_delivery_in_progress() {
        let r = std::sync::Arc::new(Redirect::default());
        let mut buf = [0u8; 8];
        assert!(r.register(1, 0, 8, buf.as_mut_ptr()));
        assert!(r.take(1, 0, 8).is_some());
        let r2 = r.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            r2.done();
        });
        let start = std::time::Instant::now();
        r.clear();
        assert!(start.elapsed() >= std::time::Duration::from_millis(40));
        t.join().unwrap();
    }
}
