//! What other processes of this host share with us, by endpoint: a storage node's segment
//! (`dataplane::mem::shm`, mapped and copied with memcpy) and an owner's disk directory
//! (`crate::disk::share`, whose files we read ourselves). Each is imported once and kept
//! while its owner lives; an endpoint nobody here shares is looked up again only after
//! [`SHM_ABSENT_RECHECK`], so a remote endpoint costs one failed `connect` per interval.
//!
//! Liveness is checked on every lookup (one non-blocking syscall): a dead owner's end of the
//! socket is closed by the kernel as it exits, before any process can serve the same endpoint
//! again, so a share is never used for its successor.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Instant;

use dataplane::mem::ShmMapping;
use parking_lot::Mutex;

use crate::disk::share::SharedDir;
use crate::limits::SHM_ABSENT_RECHECK;

/// Something a same-host process shares under an endpoint.
pub(super) trait Share: Sized {
    /// Imports what the owner of `endpoint` shares; `None` when no process here does.
    fn import(endpoint: &str) -> io::Result<Option<Self>>;
    /// Whether its owner still holds its end.
    fn owner_alive(&self) -> bool;
}

impl Share for ShmMapping {
    fn import(endpoint: &str) -> io::Result<Option<Self>> {
        ShmMapping::import(endpoint)
    }

    fn owner_alive(&self) -> bool {
        self.exporter_alive()
    }
}

impl Share for SharedDir {
    fn import(endpoint: &str) -> io::Result<Option<Self>> {
        SharedDir::import(endpoint)
    }

    fn owner_alive(&self) -> bool {
        SharedDir::owner_alive(self)
    }
}

enum State<T> {
    Imported(Arc<T>),
    /// Not shared on this host, as found at that instant.
    Absent(Instant),
}

/// The shares of one kind, by endpoint.
pub(super) struct Shares<T> {
    map: Mutex<HashMap<String, State<T>>>,
}

impl<T> Default for Shares<T> {
    fn default() -> Self {
        Shares {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<T: Share> Shares<T> {
    /// The share of `endpoint` imported already, without looking at its owner's liveness (a
    /// call that looked this call, or will, need not look twice); else [`Self::get`].
    pub(super) fn known(&self, endpoint: &str) -> Option<Arc<T>> {
        if let Some(State::Imported(s)) = self.map.lock().get(endpoint) {
            return Some(s.clone());
        }
        self.get(endpoint)
    }

    /// The share of `endpoint`, if a process here shares it and is alive.
    pub(super) fn get(&self, endpoint: &str) -> Option<Arc<T>> {
        let now = Instant::now();
        {
            let mut map = self.map.lock();
            match map.get(endpoint) {
                Some(State::Imported(s)) => {
                    if s.owner_alive() {
                        return Some(s.clone());
                    }
                    // The owner is gone: let the share go, and look again below.
                    map.remove(endpoint);
                }
                Some(State::Absent(since)) if now.duration_since(*since) < SHM_ABSENT_RECHECK => {
                    return None
                }
                _ => {}
            }
        }
        let (state, share) = match T::import(endpoint) {
            Ok(Some(s)) => {
                let s = Arc::new(s);
                (State::Imported(s.clone()), Some(s))
            }
            Ok(None) | Err(_) => (State::Absent(now), None),
        };
        self.map.lock().insert(endpoint.to_string(), state);
        share
    }

    /// Forgets `endpoint`'s share: the next lookup imports it again.
    pub(super) fn forget(&self, endpoint: &str) {
        self.map.lock().remove(endpoint);
    }
}
