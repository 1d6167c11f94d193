//! The term fence of a served table: which master's writes it still takes.
//!
//! Every write a store client makes belongs to a put that some master started, in that
//! master's term (`protocol::Version::term`). When the owner hears of a newer master (a ping's
//! answer), it raises the fence to that master's term *before* it re-mounts to it: from then
//! on, writes of earlier terms are refused, because the new master may hand their ranges to
//! puts of its own (`docs/ha.md`, "Late writes of an earlier term").
//!
//! Two kinds of write are fenced here:
//! - a catalog record (`CATALOG_PUT`), by its version's term ([`crate::recovery::Catalog`]);
//! - the bytes of a WRITE, by the term its connection declared with a `FENCE` request
//!   (`transport::header`). [`Fence::declare`] registers the connection; a server calls
//!   [`Declared::begin_write`] when a WRITE's header arrives (refused: ERR_METADATA, payload
//!   dropped) and [`Declared::end_write`] when its payload is in. [`Fence::raise`] shuts down
//!   the connections of earlier terms that are inside a WRITE's payload: a WRITE whose header
//!   was taken before the fence rose and whose payload is still arriving (its writer stalled
//!   mid-transfer) then ends at once, instead of landing after the new master reused its
//!   range. Connections of earlier terms between requests are left alone: their READs and
//!   catalog records go on, their next WRITE is refused on its header.
//!
//! A third kind, memcpy writes (our own store client's into our own segment, a same-host
//! importer's through `mem::shm`), passes no server: each holds a slot of a write page
//! (`recovery::inflight`) while it copies. [`Fence::raise`] publishes the new term on every page
//! (from then on a copy of an earlier term is refused before its first byte), and
//! [`Fence::wait_for_writes`] waits for the copies of earlier terms already under way, which
//! the owner calls before it re-mounts.
//!
//! A connection that declares nothing (term 0) is not fenced: the raw transfer engine's writes
//! have no term. The fence follows the master down as well as up (see [`Fence::raise`]).
//!
//! Invariants: after `raise(t)` returns, no WRITE of a term below `t` puts another byte into
//! memory: `begin_write` marks the connection busy *then* reads the term, and `raise` stores
//! the term *then* reads the marks (all sequentially consistent), so either the WRITE sees the
//! new term and is refused, or `raise` sees the mark and shuts the connection down. The
//! registry holds a duplicate of each socket's descriptor, so shutting it down never touches
//! a descriptor that was closed and reused.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::inflight::{self, WritePage};
use crate::TeError;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Fence {
    term: AtomicU64,
    conns: Mutex<Conns>,
    /// The write page of this process's own memcpy writes.
    local: WritePage,
}

#[derive(Debug, Default)]
struct Conns {
    next: u64,
    by_key: HashMap<u64, Conn>,
    /// The write pages of same-host writers ([`Fence::watch`]).
    pages: Vec<Arc<WritePage>>,
}

#[derive(Debug)]
struct Conn {
    term: u64,
    /// A duplicate of the connection's socket, for the shutdown.
    fd: OwnedFd,
    /// Inside a WRITE's payload.
    writing: Arc<AtomicBool>,
}

/// A connection's declaration; dropping it forgets the connection.
#[derive(Debug)]
pub struct Declared {
    fence: Arc<Fence>,
    key: u64,
    term: u64,
    writing: Arc<AtomicBool>,
}

impl Declared {
    /// The term the connection declared.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// A WRITE's header arrived: true if its payload may land (the connection is marked
    /// busy until [`Declared::end_write`]), false if the fence refuses this term.
    pub fn begin_write(&self) -> bool {
        self.writing.store(true, Ordering::SeqCst);
        if self.fence.refuses(self.term) {
            self.writing.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The WRITE's payload is in.
    pub fn end_write(&self) {
        self.writing.store(false, Ordering::SeqCst);
    }
}

impl Drop for Declared {
    fn drop(&mut self) {
        self.fence.lock().by_key.remove(&self.key);
    }
}

impl Fence {
    fn lock(&self) -> std::sync::MutexGuard<'_, Conns> {
        // Nothing panics under the lock with the map half-changed.
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current term (0: no fence).
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::SeqCst)
    }

    /// Whether a write of `term` is refused: a declared term (not 0) below the fence.
    pub fn refuses(&self, term: u64) -> bool {
        term != 0 && term < self.term()
    }

    /// Sets the fence to `term`, the term of the master just heard from, and shuts down every
    /// declared connection of an earlier term that is inside a WRITE's payload. Returns how
    /// many were shut down. A lower term than before is taken as it is (a cluster moved to
    /// new masters counts again from its own terms), and 0 turns the fence off.
    pub fn raise(&self, term: u64) -> usize {
        let mut conns = self.lock();
        self.term.store(term, Ordering::SeqCst);
        self.local.publish(term);
        for p in &conns.pages {
            p.publish(term);
        }
        if term == 0 {
            return 0;
        }
        let cut: Vec<u64> = conns
            .by_key
            .iter()
            .filter(|(_, c)| c.term < term && c.writing.load(Ordering::SeqCst))
            .map(|(&k, _)| k)
            .collect();
        for k in &cut {
            if let Some(c) = conns.by_key.remove(k) {
                // SAFETY: `c.fd` is our own duplicate, open until dropped below.
                unsafe { libc::shutdown(c.fd.as_raw_fd(), libc::SHUT_RDWR) };
            }
        }
        cut.len()
    }

    /// Records that the connection on socket `fd` writes for `term` (0: undeclared, nothing
    /// is registered). Refused with `ERR_METADATA` when the fence already refuses `term`, and
    /// with `ERR_SOCKET` when the descriptor cannot be duplicated.
    pub fn declare(self: &Arc<Self>, fd: RawFd, term: u64) -> Result<Option<Declared>, TeError> {
        if term == 0 {
            return Ok(None);
        }
        let mut conns = self.lock();
        if self.refuses(term) {
            return Err(TeError::Metadata);
        }
        // SAFETY: the caller's socket is open for the duration of this call.
        let dup = unsafe { BorrowedFd::borrow_raw(fd) }
            .try_clone_to_owned()
            .map_err(|_| TeError::Socket)?;
        conns.next += 1;
        let key = conns.next;
        let writing = Arc::new(AtomicBool::new(false));
        conns.by_key.insert(
            key,
            Conn {
                term,
                fd: dup,
                writing: Arc::clone(&writing),
            },
        );
        Ok(Some(Declared {
            fence: Arc::clone(self),
            key,
            term,
            writing,
        }))
    }

    /// Waits until no memcpy write of a term below the fence is still copying, until `deadline`
    /// at the latest (one deadline for all of a node's segments, usually
    /// [`inflight::STALE_WRITES_WAIT`] from the raise); call it after [`Fence::raise`] and
    /// before re-mounting. Returns how many there were, and how many were left when it gave up.
    pub fn wait_for_writes(&self, deadline: Instant) -> (usize, usize) {
        let pages: Vec<Arc<WritePage>> = self.lock().pages.clone();
        let mut all: Vec<&WritePage> = pages.iter().map(|p| &**p).collect();
        all.push(&self.local);
        let limit = deadline.saturating_duration_since(Instant::now());
        inflight::wait_for_stale(&all, self.term(), limit)
    }

    /// Fences the memcpy writes of a same-host writer through `page` from now on (the current
    /// term is published on it at once). The page is forgotten once its writer let go of it
    /// and holds no copy under way.
    pub fn watch(&self, page: Arc<WritePage>) {
        let mut conns = self.lock();
        page.publish(self.term());
        conns.pages.retain(|p| Arc::strong_count(p) > 1 || p.busy());
        conns.pages.push(page);
    }

    /// The write page of this process's own memcpy writes.
    pub fn local_writes(&self) -> &WritePage {
        &self.local
    }

    /// Same-host write pages watched now.
    pub fn watched(&self) -> usize {
        self.lock().pages.len()
    }

    /// Declared connections now.
    pub fn declared(&self) -> usize {
        self.lock().by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn raising_the_fence_cuts_writes_of_earlier_terms_only() {
        let f = Arc::new(Fence::default());
        assert!(!f.refuses(5), "no fence yet");
        let (mut c_old, s_old) = pair();
        let (mut c_new, s_new) = pair();
        let old = f.declare(s_old.as_raw_fd(), 5).unwrap().unwrap();
        let new = f.declare(s_new.as_raw_fd(), 6).unwrap().unwrap();
        assert!(f.declare(s_new.as_raw_fd(), 0).unwrap().is_none());
        assert_eq!((old.term(), new.term(), f.declared()), (5, 6, 2));
        // Between requests an old connection is left alone; inside a WRITE it is cut.
        assert_eq!(f.raise(6), 0);
        assert!(
            !old.begin_write(),
            "its next WRITE is refused on its header"
        );
        f.raise(5);
        assert!(old.begin_write() && new.begin_write());
        assert_eq!(f.raise(6), 1);
        new.end_write();
        assert!(f.refuses(5) && !f.refuses(6) && !f.refuses(7) && !f.refuses(0));
        assert_eq!(
            f.declare(s_old.as_raw_fd(), 5).unwrap_err(),
            TeError::Metadata
        );
        // The old term's server side reads end of stream; the new one still carries bytes.
        let mut b = [0u8; 1];
        assert_eq!((&s_old).read(&mut b).unwrap(), 0);
        assert_eq!(c_old.read(&mut b).unwrap(), 0, "the writer sees the close");
        c_new.write_all(b"x").unwrap();
        assert_eq!((&s_new).read(&mut b).unwrap(), 1);
        drop(old);
        drop(new);
        assert_eq!(f.declared(), 0);
        // Down follows the master; 0 turns it off.
        f.raise(2);
        assert!(!f.refuses(5));
        f.raise(0);
        assert!(!f.refuses(1));
    }

    fn soon() -> Instant {
        Instant::now() + inflight::STALE_WRITES_WAIT
    }

    #[test]
    fn raising_the_fence_refuses_copies_of_earlier_terms_and_waits_for_those_under_way() {
        use crate::recovery::inflight::Refused;

        let f = Fence::default();
        f.raise(5);
        let (page, fd) = WritePage::shared().unwrap();
        let importer = WritePage::map(&fd).unwrap();
        f.watch(Arc::new(page));
        assert_eq!(
            importer.fence(),
            5,
            "a page watched later gets the term now"
        );
        let ours = f.local_writes().begin(5).unwrap();
        let theirs = importer.begin(5).unwrap();
        assert_eq!(
            f.wait_for_writes(soon()),
            (0, 0),
            "nothing of an earlier term"
        );
        f.raise(6);
        assert_eq!(
            f.local_writes().begin(5).unwrap_err(),
            Refused::Fenced { fence: 6 }
        );
        assert_eq!(importer.begin(5).unwrap_err(), Refused::Fenced { fence: 6 });
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(30));
                drop(ours);
                drop(theirs);
            });
            assert_eq!(f.wait_for_writes(soon()), (2, 0));
        });
        // A page only the fence holds (its importer gone) with no copy under way is forgotten
        // at the next watch.
        assert_eq!(f.watched(), 1);
        let (next, _fd) = WritePage::shared().unwrap();
        f.watch(Arc::new(next));
        assert_eq!(f.watched(), 1);
    }
}
