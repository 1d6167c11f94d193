//! Memcpy writes in flight, published so that the term fence can wait for them.
//!
//! A write by memcpy into a segment (our own store client's into our own segment, or a
//! same-host importer's through `mem::shm`) passes no server: the term fence (`recovery::fence`)
//! can neither refuse its bytes on a header nor cut its connection. So each such write holds
//! a slot of a *write page* for as long as it copies, marked with its put's term, and checks
//! the page's fence word once the slot is held:
//!
//! ```text
//! writer                                        owner raising its fence to t
//!   slot := term   (compare-exchange from 0)      fence word := t
//!   if fence word > term: slot := 0, refused      wait until no slot holds a term in (0, t)
//!   memcpy                                        (a dead writer's slots excepted, at most
//!   slot := 0                                      STALE_WRITES_WAIT), then re-mount
//! ```
//!
//! Both sides store, then load, all sequentially consistent: either the writer sees the new
//! fence and copies nothing, or the owner sees its slot and waits for the copy to end before
//! it re-mounts, so the new master, which hands out no range of a segment before its re-mount,
//! never gives a range to a put of its own while an earlier term's bytes may still land on it
//! (`docs/ha.md`, "Late writes of an earlier term").
//!
//! Page layout (`WRITE_PAGE_BYTES`, little-endian u64 words, one page per importer, in a memfd
//! both processes map, sealed at its size so that neither can shrink it under the other's
//! mapping): word 0 the fence term, words 1.. the slots (0: free, else the term of
//! the write in progress). A write of term 0 (the raw transfer engine's, undeclared) takes no
//! slot: nothing fences it. A process holds [`WRITE_SLOTS`] writes at once per page; more are
//! refused ([`Refused::Full`]) and go another way.
//!
//! Invariants: a slot is freed by the claim that took it (also when its thread unwinds); a
//! writer process that dies with slots held is not waited for (the owner watches it with a
//! pidfd, or `kill(pid, 0)` where pidfds are missing); the owner never waits longer than
//! [`STALE_WRITES_WAIT`] per raise, and says so when it gives up (a writer stopped for that
//! long inside one copy).

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes of a write page.
pub const WRITE_PAGE_BYTES: usize = 4096;
const WORDS: usize = WRITE_PAGE_BYTES / 8;
/// Writes one page holds at once.
pub const WRITE_SLOTS: usize = WORDS - 1;
/// How long raising the fence waits for writes of earlier terms to finish their copies.
pub const STALE_WRITES_WAIT: Duration = Duration::from_secs(5);

/// Why a write may not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The owner's fence refuses the write's term: its put belongs to a master that ended.
    Fenced { fence: u64 },
    /// Every slot is held.
    Full,
}

/// See the module docs.
#[derive(Debug)]
pub struct WritePage {
    words: NonNull<AtomicU64>,
    backing: Backing,
    /// The writer process, when it is another one: its slots count only while it lives.
    writer: Option<Writer>,
}

/// How the owner knows the writer process lives.
#[derive(Debug)]
enum Writer {
    /// A pidfd: readable once the process exited.
    Pidfd(OwnedFd),
    /// A kernel without pidfds: `kill(pid, 0)` (a pid reused meanwhile reads as alive).
    Pid(i32),
}

#[derive(Debug)]
enum Backing {
    Local(#[allow(dead_code)] Box<[AtomicU64]>),
    Mapped,
}

// SAFETY: the page is only reached through atomics; the pointer is owned by this value.
unsafe impl Send for WritePage {}
// SAFETY: see `Send`.
unsafe impl Sync for WritePage {}

impl Default for WritePage {
    fn default() -> Self {
        WritePage::local()
    }
}

impl WritePage {
    /// A page for the writers of this process.
    pub fn local() -> WritePage {
        let mut b: Box<[AtomicU64]> = (0..WORDS).map(|_| AtomicU64::new(0)).collect();
        let words = NonNull::new(b.as_mut_ptr()).expect("a boxed slice is not null");
        WritePage {
            words,
            backing: Backing::Local(b),
            writer: None,
        }
    }

    /// A new page in a memfd, for the owner: the descriptor goes to the writer, who maps it
    /// with [`WritePage::map`].
    pub fn shared() -> io::Result<(WritePage, OwnedFd)> {
        let fd = crate::sys::mmap::sized_memfd(c"mooncake-writes", WRITE_PAGE_BYTES, false)?;
        Ok((WritePage::map(&fd)?, fd))
    }

    /// Maps the page in `fd` (the writer's side). Refused (`PermissionDenied`) unless the
    /// memfd is sealed at its size, so that the owner cannot shrink it under our mapping, and
    /// (`InvalidData`) if it is smaller than a page.
    pub fn map(fd: &OwnedFd) -> io::Result<WritePage> {
        let p = crate::sys::mmap::map_sealed(fd.as_fd(), WRITE_PAGE_BYTES, "write page")?;
        Ok(WritePage {
            words: p.cast(),
            backing: Backing::Mapped,
            writer: None,
        })
    }

    /// Counts this page's slots only while process `pid` lives (the owner's side; `pid` from
    /// `SO_PEERCRED`).
    pub fn watch_writer(&mut self, pid: i32) {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        self.writer = Some(if raw >= 0 {
            // SAFETY: a descriptor just returned to us.
            Writer::Pidfd(unsafe { OwnedFd::from_raw_fd(raw as i32) })
        } else {
            Writer::Pid(pid)
        });
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < WORDS);
        // SAFETY: `words` points at WORDS aligned u64 words, live as long as `self`; atomics
        // are the only access to them.
        unsafe { &*self.words.as_ptr().add(i) }
    }

    /// The fence the owner last published.
    pub fn fence(&self) -> u64 {
        self.word(0).load(Ordering::SeqCst)
    }

    /// Publishes the owner's fence (before it waits with [`WritePage::stale`]).
    pub fn publish(&self, term: u64) {
        self.word(0).store(term, Ordering::SeqCst);
    }

    /// Takes a slot for a write of the put of `term`, unless the fence refuses that term or
    /// every slot is held. Hold the claim until the last byte is copied.
    pub fn begin(&self, term: u64) -> Result<WriteClaim<'_>, Refused> {
        if term == 0 {
            return Ok(WriteClaim::unfenced());
        }
        // Threads start at different slots, so that they rarely meet on one.
        let start = thread_hint() % WRITE_SLOTS;
        let slot = (0..WRITE_SLOTS)
            .map(|k| self.word(1 + (start + k) % WRITE_SLOTS))
            .find(|w| {
                w.compare_exchange(0, term, Ordering::SeqCst, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or(Refused::Full)?;
        let fence = self.fence();
        if term < fence {
            slot.store(0, Ordering::SeqCst);
            return Err(Refused::Fenced { fence });
        }
        Ok(WriteClaim { slot: Some(slot) })
    }

    /// Writes of a term below `term` still copying (0 once the writer process is gone).
    pub fn stale(&self, term: u64) -> usize {
        if self.writer_gone() {
            return 0;
        }
        (1..WORDS)
            .map(|i| self.word(i).load(Ordering::SeqCst))
            .filter(|&t| t != 0 && t < term)
            .count()
    }

    /// Whether any slot is held by a live writer.
    pub fn busy(&self) -> bool {
        self.stale(u64::MAX) > 0
    }

    /// Whether the watched writer process has exited.
    pub fn writer_gone(&self) -> bool {
        let fd = match &self.writer {
            None => return false,
            Some(Writer::Pid(pid)) => return !crate::sys::rawio::process_exists(*pid),
            Some(Writer::Pidfd(fd)) => fd,
        };
        let mut p = [libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        crate::sys::rawio::poll(&mut p, Duration::ZERO).is_ok_and(|n| n > 0)
            && p[0].revents & libc::POLLIN != 0
    }
}

impl Drop for WritePage {
    fn drop(&mut self) {
        if let Backing::Mapped = self.backing {
            // SAFETY: exactly the mapping made in `map`, unmapped only here.
            unsafe { libc::munmap(self.words.as_ptr().cast(), WRITE_PAGE_BYTES) };
        }
    }
}

/// A held slot: the write may copy until this is dropped.
#[derive(Debug)]
pub struct WriteClaim<'a> {
    slot: Option<&'a AtomicU64>,
}

impl WriteClaim<'_> {
    /// A claim of a write nothing fences (its owner keeps no write page).
    pub fn unfenced() -> WriteClaim<'static> {
        WriteClaim { slot: None }
    }
}

impl Drop for WriteClaim<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.slot {
            s.store(0, Ordering::SeqCst);
        }
    }
}

/// This thread's id, asked of the kernel once per thread (a system call per put otherwise).
fn thread_hint() -> usize {
    thread_local! {
        static HINT: usize = {
            // SAFETY: gettid has no preconditions.
            unsafe { libc::gettid() as usize }
        };
    }
    HINT.with(|h| *h)
}

/// Waits until no page in `pages` holds a write of a term below `term`, for at most `limit`.
/// Returns how many such writes there were at first, and how many were left when it gave up.
pub fn wait_for_stale(pages: &[&WritePage], term: u64, limit: Duration) -> (usize, usize) {
    let count = || pages.iter().map(|p| p.stale(term)).sum::<usize>();
    let first = count();
    let deadline = Instant::now() + limit;
    let mut left = first;
    while left > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
        left = count();
    }
    (first, left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_of_an_ended_term_is_refused_and_one_under_way_is_seen() {
        let (owner, fd) = WritePage::shared().unwrap();
        let writer = WritePage::map(&fd).unwrap();
        owner.publish(5);
        assert_eq!(writer.fence(), 5, "both map the same page");
        assert_eq!(
            writer.begin(4).unwrap_err(),
            Refused::Fenced { fence: 5 },
            "a put of an ended term copies nothing"
        );
        assert!(!owner.busy(), "the refused claim let go of its slot");
        let under_way = writer.begin(5).unwrap();
        let undeclared = writer.begin(0).unwrap();
        assert_eq!((owner.stale(5), owner.stale(6)), (0, 1));
        // The owner moves on to term 6: the copy of term 5 still under way holds it back.
        owner.publish(6);
        assert_eq!(writer.begin(5).unwrap_err(), Refused::Fenced { fence: 6 });
        assert_eq!(owner.stale(6), 1);
        drop(under_way);
        drop(undeclared);
        assert_eq!(owner.stale(6), 0);
        assert!(!owner.busy());
    }

    #[test]
    fn a_full_page_refuses_and_frees_as_claims_end() {
        let p = WritePage::local();
        let held: Vec<_> = (0..WRITE_SLOTS).map(|_| p.begin(3).unwrap()).collect();
        assert_eq!(p.begin(3).unwrap_err(), Refused::Full);
        drop(held);
        assert!(p.begin(3).is_ok());
    }

    #[test]
    fn the_wait_ends_with_the_copy_or_at_its_limit() {
        let p = WritePage::local();
        let claim = p.begin(1).unwrap();
        p.publish(2);
        let (first, left) = wait_for_stale(&[&p], 2, Duration::from_millis(20));
        assert_eq!(
            (first, left),
            (1, 1),
            "a copy that does not end is given up on"
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                drop(claim);
            });
            let t = Instant::now();
            assert_eq!(wait_for_stale(&[&p], 2, Duration::from_secs(10)), (1, 0));
            assert!(
                t.elapsed() >= Duration::from_millis(40),
                "it waited for the copy"
            );
        });
    }

    #[test]
    fn a_dead_writers_slots_are_not_waited_for() {
        let (mut owner, fd) = WritePage::shared().unwrap();
        let writer = WritePage::map(&fd).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        owner.watch_writer(child.id() as i32);
        let claim = writer.begin(1).unwrap();
        assert_eq!(owner.stale(2), 1, "the writer lives");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(owner.writer_gone());
        assert_eq!(owner.stale(2), 0, "its slots died with it");
        drop(claim);
        // Where pidfds are missing, the pid itself.
        let mut by_pid = WritePage::local();
        by_pid.writer = Some(Writer::Pid(std::process::id() as i32));
        assert!(!by_pid.writer_gone());
        by_pid.writer = Some(Writer::Pid(child.id() as i32));
        assert!(by_pid.writer_gone(), "the child was reaped");
    }
}
