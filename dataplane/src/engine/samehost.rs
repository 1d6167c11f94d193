//! The same-host path: transfers between two engines of one host move bytes with one kernel
//! copy (`process_vm_readv` / `process_vm_writev`, cross-memory attach) instead of through
//! loopback TCP, checked against the peer's live registration table.
//!
//! Engine buffers are arbitrary user memory (numpy arrays, malloc), not shared memory, so the
//! peer's buffers are not mapped here: the kernel copies between the two address spaces. What
//! is shared is the *registration table*: every engine keeps its registered ranges in a small
//! sealed memfd ([`Table`]) and names it in its TCP descriptor
//! (`mooncake_rs_same_host`: boot id, pid, the memfd's descriptor number, the table's address
//! in the owner). A reader whose boot id matches opens `/proc/<pid>/fd/<n>` (allowed exactly
//! when it may ptrace the owner, which cross-memory attach needs too), maps the table, and
//! reads the table's nonce both from its mapping and, with `process_vm_readv`, from the
//! owner's address space: equal nonces prove the pid names the owner in this pid namespace
//! and that cross-memory attach is permitted. Any failure (another host, a container with
//! ptrace denied, another pid namespace, `MC_TE_SAME_HOST=0`) leaves the peer on TCP.
//!
//! ```text
//! Table (TABLE_BYTES, little-endian u64 words, accessed only with atomics)
//!  word 0      magic "MCTE" (u32) | version (u32)
//!  word 1      nonce (random, fixed for the table's life)
//!  word 2      seq: odd while the owner rewrites the entries (a seqlock)
//!  word 3      count of valid entries, or u64::MAX: more buffers than fit (readers use TCP)
//!  word 4      closed: 1 once the owner shut its engine down (readers treat it as gone)
//!  words 5..8  reserved (0)
//!  words 8..8+2*READER_SLOTS       reader slots: pid (0: free) | busy (copies in flight)
//!  words 8+2*READER_SLOTS..        entries: addr | length, count of them
//! ```
//!
//! The race between a reader's copy and the owner's unregister is settled as over TCP:
//! a reader raises its slot's `busy`, then checks the range against the entries, copies, and
//! lowers `busy`; the owner rewrites the entries without the buffer, then waits until every
//! slot whose process lives shows `busy == 0` (all `SeqCst`). So a copy either saw the
//! buffer gone (refused with `-3`, nothing touched) or finishes before `unregister_memory`
//! returns. A reader killed between raising and lowering `busy` is noticed by its pid being
//! gone; a live reader that holds `busy` past the transfer timeout is waited no longer (and
//! logged). A dead owner: `process_vm_*` fails (`ESRCH`), or its pidfd says so first; the
//! request fails with the code a lost connection gives (`-1`... see [`PEER_LOST`]) and the
//! segment is fetched again on next use, as over TCP.

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::mem::{Dst, Src};
use crate::metadata::desc::{BufferDesc, SameHostDesc};
use crate::sys::{cma, rawio};
use crate::TeError;

/// The switch: `MC_TE_SAME_HOST` (default on; a false word of [`protocol::env::FALSE_WORDS`],
/// e.g. `0`, makes same-host peers use TCP).
pub const ENV_SWITCH: &str = "MC_TE_SAME_HOST";
use crate::limits::{
    SAME_HOST_BUSY_POLL_INTERVAL as BUSY_POLL, SAME_HOST_READERS_MAX as READER_SLOTS,
    SAME_HOST_SEQ_WAIT as SEQ_WAIT, SAME_HOST_TABLE_BYTES as TABLE_BYTES,
    SAME_HOST_TABLE_ENTRIES_MAX as TABLE_CAPACITY,
};
const HEADER_WORDS: usize = 8;
const SLOTS_AT: usize = HEADER_WORDS;
const ENTRIES_AT: usize = SLOTS_AT + 2 * READER_SLOTS;
const WORDS: usize = TABLE_BYTES / 8;
const MAGIC: u64 = u32::from_le_bytes(*b"MCTE") as u64 | (1u64 << 32);
const OVERFLOW: u64 = u64::MAX;
/// The code of a request whose peer died or could not be reached: the code a lost TCP
/// connection gives (`TransferError::code`).
pub(crate) const PEER_LOST: i32 = TeError::Socket as i32;

const _: () = assert!(TABLE_CAPACITY >= 1024);
const _: () = assert!(ENTRIES_AT + 2 * TABLE_CAPACITY <= WORDS);
const _: () = assert!(TABLE_BYTES.is_multiple_of(4096));

/// Whether the same-host path may be used ([`ENV_SWITCH`]); read once per engine, by
/// `EngineOptions::from_env`.
pub fn enabled() -> bool {
    protocol::env::flag(ENV_SWITCH, true)
}

/// This kernel's boot id (`/proc/sys/kernel/random/boot_id`): equal on two processes exactly
/// when they run on one booted host. Empty when it cannot be read (then no peer matches).
pub fn boot_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    })
}

/// A mapping of a table, as atomics.
struct Words {
    base: NonNull<AtomicU64>,
}

// SAFETY: the mapping is only accessed through atomics and unmapped once, on drop.
unsafe impl Send for Words {}
// SAFETY: as above: every access is atomic.
unsafe impl Sync for Words {}

impl Words {
    fn map(fd: &OwnedFd) -> io::Result<Words> {
        let p = crate::sys::mmap::mmap_shared(fd.as_fd(), TABLE_BYTES)?;
        Ok(Words { base: p.cast() })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < WORDS);
        // SAFETY: `base` maps WORDS page-aligned u64 words for as long as `self` lives, and
        // every process touches them only with atomics.
        unsafe { &*self.base.as_ptr().add(i) }
    }

    fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        // SAFETY: the mapping of TABLE_BYTES made in `map`; no reference to it outlives self.
        unsafe { libc::munmap(self.base.as_ptr().cast(), TABLE_BYTES) };
    }
}

fn pid_alive(pid: u64) -> bool {
    libc::pid_t::try_from(pid).is_ok_and(rawio::process_exists)
}

/// The owner's side: the table of its registered buffers, shared with same-host readers.
pub(crate) struct Table {
    words: Words,
    fd: OwnedFd,
}

impl Table {
    /// The table of an engine: `None` for an RDMA engine (its peers use RDMA), or when the
    /// memfd cannot be made (logged; same-host peers then use TCP).
    pub(crate) fn for_engine(rdma: bool) -> Option<Table> {
        if rdma {
            return None;
        }
        Table::new()
            .inspect_err(|e| tracing::warn!("no same-host registration table: {e}"))
            .ok()
    }

    /// A fresh, empty table with a random nonce.
    pub(crate) fn new() -> io::Result<Table> {
        let fd = crate::sys::mmap::sized_memfd(c"mooncake-te-table", TABLE_BYTES, false)?;
        let words = Words::map(&fd)?;
        words
            .word(1)
            .store(protocol::Uuid::random().lo | 1, Ordering::SeqCst);
        words.word(0).store(MAGIC, Ordering::SeqCst);
        Ok(Table { words, fd })
    }

    /// What the descriptor says about this table.
    pub(crate) fn desc(&self) -> SameHostDesc {
        SameHostDesc {
            boot_id: boot_id().to_string(),
            pid: std::process::id(),
            table_addr: self.words.addr(),
            table_fd: self.fd.as_raw_fd(),
        }
    }

    /// Rewrites the entries to `bufs` (call with the engine's buffer list lock held, so
    /// rewrites do not interleave).
    pub(crate) fn publish(&self, bufs: &[BufferDesc]) {
        let w = &self.words;
        let seq = w.word(2).load(Ordering::SeqCst);
        w.word(2).store(seq | 1, Ordering::SeqCst);
        if bufs.len() > TABLE_CAPACITY {
            w.word(3).store(OVERFLOW, Ordering::SeqCst);
        } else {
            for (i, b) in bufs.iter().enumerate() {
                w.word(ENTRIES_AT + 2 * i).store(b.addr, Ordering::SeqCst);
                w.word(ENTRIES_AT + 2 * i + 1)
                    .store(b.length, Ordering::SeqCst);
            }
            w.word(3).store(bufs.len() as u64, Ordering::SeqCst);
        }
        w.word(2).store((seq | 1) + 1, Ordering::SeqCst);
    }

    /// Marks the table closed (the engine shut down): readers fail as if the owner had died,
    /// and no copy checked before is still running when this returns.
    pub(crate) fn close(&self, timeout: Duration) {
        self.words.word(4).store(1, Ordering::SeqCst);
        self.publish(&[]);
        self.wait_readers(timeout);
    }

    /// After a [`Table::publish`] that dropped a buffer: waits until no live reader has a
    /// copy in flight that could have been checked against the older entries. False when a
    /// live reader was still busy at `timeout` (it is then waited no longer).
    pub(crate) fn wait_readers(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        for s in 0..READER_SLOTS {
            let (pid, busy) = (
                self.words.word(SLOTS_AT + 2 * s),
                self.words.word(SLOTS_AT + 2 * s + 1),
            );
            while busy.load(Ordering::SeqCst) != 0 {
                let p = pid.load(Ordering::SeqCst);
                if p == 0 || !pid_alive(p) {
                    break;
                }
                if Instant::now() >= deadline {
                    tracing::warn!("same-host reader pid {p} still copying after {timeout:?}");
                    return false;
                }
                std::thread::sleep(BUSY_POLL);
            }
        }
        true
    }
}

/// The reader's side: a same-host peer's table, mapped, and the right to copy its memory.
pub(crate) struct Peer {
    words: Words,
    pid: libc::pid_t,
    pidfd: Option<OwnedFd>,
    slot: usize,
    me: u64,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Peer(pid {}, slot {})", self.pid, self.slot)
    }
}

/// A copy in flight: the reader's slot shows it until this drops.
pub(crate) struct Busy<'a>(&'a AtomicU64);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn open_table(d: &SameHostDesc) -> Result<(Words, libc::pid_t), String> {
    if d.boot_id.is_empty() || d.boot_id != boot_id() {
        return Err("another host (boot id differs)".into());
    }
    let pid = libc::pid_t::try_from(d.pid).map_err(|_| format!("bad pid {}", d.pid))?;
    let path = format!("/proc/{}/fd/{}", d.pid, d.table_fd);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot open {path}: {e}"))?;
    let fd = OwnedFd::from(file);
    if !crate::sys::mmap::size_sealed(fd.as_fd()).unwrap_or(false) {
        return Err(format!("{path} is not a size-sealed memfd"));
    }
    let st = crate::sys::mmap::fstat(fd.as_fd()).map_err(|e| e.to_string())?;
    if usize::try_from(st.st_size).ok() != Some(TABLE_BYTES) {
        return Err(format!(
            "{path} has {} bytes, not {TABLE_BYTES}",
            st.st_size
        ));
    }
    let words = Words::map(&fd).map_err(|e| format!("cannot map {path}: {e}"))?;
    if words.word(0).load(Ordering::SeqCst) != MAGIC {
        return Err(format!("{path} is not a registration table"));
    }
    Ok((words, pid))
}

impl Peer {
    /// Attaches to the peer `d` describes; `Err` says why the peer stays on TCP.
    pub(crate) fn attach(d: &SameHostDesc) -> Result<Peer, String> {
        let (words, pid) = open_table(d)?;
        let nonce = words.word(1).load(Ordering::SeqCst);
        let mut seen = [0u8; 8];
        // SAFETY: `seen` is 8 writable bytes.
        unsafe { cma::read(pid, d.table_addr + 8, seen.as_mut_ptr(), 8) }
            .map_err(|e| format!("cross-memory attach to pid {pid} refused: {e}"))?;
        if u64::from_ne_bytes(seen) != nonce {
            return Err(format!(
                "pid {pid} is not the table's owner here (nonce differs)"
            ));
        }
        let me = u64::from(std::process::id());
        let slot = (0..READER_SLOTS)
            .find(|&s| claim_slot(&words, s, me))
            .ok_or_else(|| format!("all {READER_SLOTS} reader slots of pid {pid} are taken"))?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        // SAFETY: a descriptor just returned to us, owned by nothing else.
        let pidfd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw as i32) });
        Ok(Peer {
            words,
            pid,
            pidfd,
            slot,
            me,
        })
    }

    /// Marks a copy in flight; hold it from the range check to the copy's end.
    pub(crate) fn begin(&self) -> Busy<'_> {
        let busy = self.words.word(SLOTS_AT + 2 * self.slot + 1);
        busy.fetch_add(1, Ordering::SeqCst);
        Busy(busy)
    }

    /// Whether the owner still runs (its pidfd is not readable yet).
    pub(crate) fn alive(&self) -> bool {
        match &self.pidfd {
            Some(fd) => {
                let mut p = [libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                matches!(rawio::poll(&mut p, Duration::ZERO), Ok(0))
            }
            None => pid_alive(self.pid as u64),
        }
    }

    /// Whether `[addr, addr + len)` lies inside one buffer of the owner's table:
    /// `Ok(None)` when the table overflowed (use TCP), `Err` when the owner closed it (its
    /// engine shut down) or left it half-written for longer than [`SEQ_WAIT`] (it died
    /// mid-rewrite).
    pub(crate) fn check(&self, addr: u64, len: u64) -> Result<Option<bool>, ()> {
        let w = &self.words;
        let start = Instant::now();
        loop {
            if w.word(4).load(Ordering::SeqCst) != 0 {
                return Err(());
            }
            let s1 = w.word(2).load(Ordering::SeqCst);
            if s1 & 1 == 0 {
                let n = w.word(3).load(Ordering::SeqCst);
                if n == OVERFLOW {
                    return Ok(None);
                }
                let n = (n as usize).min(TABLE_CAPACITY);
                // A range that wraps the address space lies in no buffer (and the caller's
                // numbers must not overflow here).
                let found = addr.checked_add(len).is_some_and(|last| {
                    (0..n).any(|i| {
                        let a = w.word(ENTRIES_AT + 2 * i).load(Ordering::SeqCst);
                        let l = w.word(ENTRIES_AT + 2 * i + 1).load(Ordering::SeqCst);
                        addr >= a && a.checked_add(l).is_some_and(|end| last <= end)
                    })
                });
                if w.word(2).load(Ordering::SeqCst) == s1 {
                    return Ok(Some(found));
                }
            }
            if start.elapsed() > SEQ_WAIT {
                return Err(());
            }
            std::hint::spin_loop();
        }
    }

    /// Copies `dst.len()` bytes at `remote` of the owner into `dst`.
    ///
    /// # Safety
    /// `dst` must be writable for its length for the call.
    pub(crate) unsafe fn read(&self, remote: u64, mut dst: Dst<'_>) -> io::Result<()> {
        let n = dst.len();
        // SAFETY: forwarded from this function's contract.
        unsafe { cma::read(self.pid, remote, dst.as_mut_ptr(), n) }
    }

    /// Copies `src` to `remote` of the owner.
    ///
    /// # Safety
    /// `src` must be readable for its length for the call.
    pub(crate) unsafe fn write(&self, remote: u64, src: Src<'_>) -> io::Result<()> {
        // SAFETY: forwarded from this function's contract; the bytes are only read.
        unsafe { cma::write(self.pid, remote, src.as_ptr(), src.len()) }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let pid = self.words.word(SLOTS_AT + 2 * self.slot);
        let _ = pid.compare_exchange(self.me, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// Takes slot `s` for reader `me`: a free one, or one whose reader died.
fn claim_slot(w: &Words, s: usize, me: u64) -> bool {
    let pid = w.word(SLOTS_AT + 2 * s);
    let cur = pid.load(Ordering::SeqCst);
    if cur != 0 && pid_alive(cur) {
        return false;
    }
    if pid
        .compare_exchange(cur, me, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return false;
    }
    // A dead reader's count is its own; ours starts at zero.
    w.word(SLOTS_AT + 2 * s + 1).store(0, Ordering::SeqCst);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn buf(addr: u64, length: u64) -> BufferDesc {
        BufferDesc {
            addr,
            length,
            name: String::new(),
        }
    }

    #[test]
    fn a_reader_checks_the_live_table_and_copies() {
        let table = Table::new().unwrap();
        let mut mem = vec![7u8; 4096];
        let base = mem.as_mut_ptr() as u64;
        table.publish(&[buf(base, 4096)]);
        let peer = Peer::attach(&table.desc()).expect("this process may attach to itself");
        assert!(peer.alive());
        assert_eq!(peer.check(base, 4096), Ok(Some(true)));
        assert_eq!(peer.check(base + 1, 4096), Ok(Some(false)));
        assert_eq!(peer.check(base - 1, 2), Ok(Some(false)));
        assert_eq!(
            peer.check(u64::MAX - 8, 4096),
            Ok(Some(false)),
            "a range past the end of the address space is refused, not an overflow"
        );
        let mut got = [0u8; 16];
        // SAFETY: `got` is 16 writable bytes; `mem` lives across the call.
        unsafe { peer.read(base + 8, Dst::from(&mut got[..])) }.unwrap();
        assert_eq!(got, [7u8; 16]);
        // SAFETY: a readable array; the destination is `mem`, alive and unborrowed here.
        unsafe { peer.write(base, Src::from(&[1u8, 2, 3][..])) }.unwrap();
        assert_eq!(&mem[..4], &[1, 2, 3, 7]);
        table.publish(&[]);
        assert_eq!(
            peer.check(base, 1),
            Ok(Some(false)),
            "unregistered is refused"
        );
        let many: Vec<BufferDesc> = (0..=TABLE_CAPACITY as u64)
            .map(|i| buf(i << 20, 1))
            .collect();
        table.publish(&many);
        assert_eq!(
            peer.check(0, 1),
            Ok(None),
            "an overflowed table sends readers to TCP"
        );
    }

    #[test]
    fn a_wrong_host_or_owner_is_refused() {
        let table = Table::new().unwrap();
        let mut d = table.desc();
        d.boot_id = "another-host".into();
        assert!(Peer::attach(&d).unwrap_err().contains("boot id"));
        let mut d = table.desc();
        d.table_addr += 64; // not where the nonce is
        assert!(Peer::attach(&d).unwrap_err().contains("nonce"));
        let mut d = table.desc();
        d.table_fd = 0; // stdin: not a sealed memfd
        assert!(Peer::attach(&d).is_err());
    }

    #[test]
    fn unregister_waits_for_a_copy_in_flight() {
        let table = Arc::new(Table::new().unwrap());
        table.publish(&[buf(4096, 4096)]);
        let peer = Arc::new(Peer::attach(&table.desc()).unwrap());
        let released = Arc::new(AtomicBool::new(false));
        let busy_taken = Arc::new(AtomicBool::new(false));
        let reader = {
            let (peer, released, busy_taken) = (peer.clone(), released.clone(), busy_taken.clone());
            std::thread::spawn(move || {
                let busy = peer.begin();
                busy_taken.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(200));
                released.store(true, Ordering::SeqCst);
                drop(busy);
            })
        };
        while !busy_taken.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
        table.publish(&[]);
        assert!(table.wait_readers(Duration::from_secs(10)));
        assert!(
            released.load(Ordering::SeqCst),
            "returned while a copy was in flight"
        );
        reader.join().unwrap();
        let _held = peer.begin();
        assert!(
            !table.wait_readers(Duration::from_millis(50)),
            "a stuck live reader times out"
        );
    }
}
