//! The owner's disk store: objects of the disk tier kept in files of a local directory, and
//! the small listener that serves them to readers (`docs/tiering.md`).
//!
//! The master treats an owner's disk as a segment (addresses from `DISK_ADDR_BASE` up) and
//! decides which object goes where; this module only keeps what it is told to keep:
//! [`DiskTier::write`] stores `size` bytes at a disk address, [`DiskTier::read`] gives any
//! range of a stored object back, [`DiskTier::forget`] and [`DiskTier::bury`] delete, and
//! [`DiskTier::held`] says what is stored, for the re-report to a new master.
//!
//! Why it is built this way:
//!
//! - **One file per object**, named by its address. The master already allocates disk
//!   ranges (so the logical limit is exact and objects never overlap); a file per address
//!   needs no allocator or compaction of its own, a delete is an `unlink` that gives the
//!   space back at once, and a lost or damaged file costs one object, not a bucket of them.
//!   The price is a few hundred bytes of filesystem metadata per object and one `open` per
//!   read, small against the megabyte-sized KV-cache objects this tier holds.
//! - **Temporary name, then rename.** A file is written whole under `<addr>.mco.tmp` and
//!   renamed over `<addr>.mco`, so a reader or a restart never sees half an object under its
//!   final name: what a crash leaves behind is a temporary file, which the scan at start
//!   deletes. Nothing is `fsync`ed (this is a cache; the memory replica or the writer has the
//!   bytes): a crash can still leave a renamed file whose blocks never reached the disk, and
//!   the checksum catches it.
//! - **The checksum on every read**, of the whole object even for a ranged read. A disk
//!   returns bad bytes silently (bit rot, a torn write after a power cut, a file someone
//!   truncated), and a KV cache served wrong gives a model wrong attention states without
//!   any error. The crc32 costs a pass over bytes the read has in hand anyway, so every
//!   read checks it; a mismatch is a miss (`DiskError::Corrupt`), the file is deleted and
//!   counted, and the reader falls back to another replica.
//!
//! How the I/O runs: `workers` threads ([`DiskConfig::workers`]), each with its own
//! io_uring ring, its own aligned bounce buffers registered with that ring, and its own
//! subdirectory `<dir>/<worker>/`; an object belongs to a worker by its address
//! (`worker_of`), so workers share nothing but the index (one exception: a write whose
//! range overlaps older objects deletes their files, wherever they are). A call sends its
//! request to the owning worker and blocks for the answer. Files are opened with `O_DIRECT`
//! (the page cache would only duplicate memory the tier exists to free) where the
//! filesystem allows it (tmpfs before Linux 6.6 does not: buffered I/O then, with a
//! warning). Where io_uring is refused or turned off, the same workers use
//! `pread`/`pwrite` ([`DiskTier::uring`] says which).
//!
//! A read copies each piece once, from the bounce buffer into the caller's range, and the
//! checksum runs over the bounce buffer. Reading straight into an aligned destination would
//! save that copy but would have to checksum the bytes in the caller's memory, which is a
//! raw range another thread may write (`dataplane::sys::bytes`): that needs a slice over it
//! (against the house rules) or trusting bytes after the check. Left for later, with a
//! benchmark to say whether the copy matters next to the disk.
//!
//! Limits: the key limit and the physical cap are checked before a write (the write is
//! refused, the memory copy stays); a write that hits `ENOSPC`, `EDQUOT` or `EIO` stops all
//! further writes ([`DiskStats::writes_stopped`], one log line) until [`DiskTier::resume`]
//! succeeds or, at most every `DISK_STOPPED_PROBE_INTERVAL`, a refused write finds room
//! for twice its file and a probe write works; reads go on meanwhile.
//!
//! Invariants: every operation on one address's file runs on its worker, in order; an index
//! entry exists only for a file that was written whole and renamed (or passed the scan); the
//! index's byte and object counts are the sums over its entries.

mod config;
mod crc;
mod direct;
pub mod format;
mod io;
pub mod limits;
mod listener;
mod priority;
mod scan;
pub mod share;
mod worker;

#[cfg(test)]
mod share_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use dataplane::mem::{Dst, Src};

use dataplane::recovery::CatalogEntry;
use parking_lot::Mutex;
use protocol::Version;

pub use config::{default_workers, DiskConfig, WritePriority};
pub use listener::DiskListener;

use limits::{DISK_BLOCK_BYTES, DISK_STOPPED_PROBE_INTERVAL, DISK_WORKER_QUEUE_MAX};
use worker::{Answer, Op, Request, Worker};

/// What the disk store refuses or fails with. Each says what was expected and what was found.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{var}={value:?}: {why}")]
    BadVariable {
        var: String,
        value: String,
        why: String,
    },
    #[error("disk tier configuration: {0}")]
    InvalidConfig(String),
    #[error("disk tier directory {path}: {why}")]
    Directory { path: PathBuf, why: String },
    #[error("disk tier: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("disk tier holds {limit} objects, its key limit (MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT)")]
    KeysLimit { limit: u64 },
    #[error(
        "disk tier: {needed} more bytes would take the files to {would} bytes, above the \
         physical cap of {cap} (MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES)"
    )]
    PhysicalCap { cap: u64, would: u64, needed: u64 },
    #[error(
        "disk tier writes are stopped after a write failed ({why}); memory copies keep \
         serving; resume() after making room"
    )]
    Stopped { why: String },
    #[error("disk tier: range {addr:#x}+{len} is not inside one stored object")]
    NotFound { addr: u64, len: u64 },
    #[error("disk tier: object at {addr:#x} is corrupt ({why}); its file was deleted")]
    Corrupt { addr: u64, why: String },
    #[error("disk tier: {0}")]
    InvalidArgument(String),
    #[error("disk tier: the I/O worker is gone")]
    WorkerGone,
}

/// The pins an object was put with (kept in its file, re-reported to a new master).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pins {
    pub hard: bool,
    /// The soft pin its put asked for: `Some(ttl_ms)`, `Some(0)` for the master's default.
    pub soft_ttl_ms: Option<u64>,
}

/// A snapshot of the store's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Objects on disk.
    pub objects: u64,
    /// Their data bytes (what the master's allocator counts).
    pub logical_bytes: u64,
    /// Their files' real usage (`st_blocks`, as `du` counts).
    pub physical_bytes: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Reads and writes that moved the data straight between the file and the caller's
    /// memory, no bounce buffer (`direct`).
    pub direct_reads: u64,
    pub direct_writes: u64,
    /// Reads that found bad bytes (`mooncake_disk_checksum_failures_total`).
    pub checksum_failures: u64,
    pub io_errors: u64,
    /// Writes refused: key limit, physical cap, stopped writes.
    pub write_refusals: u64,
    pub writes_stopped: bool,
    /// Object files the scan at start deleted (bad header, cut short, out of range).
    pub scan_dropped: u64,
    /// Temporary files the scan at start deleted.
    pub scan_temp_removed: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    direct_reads: AtomicU64,
    direct_writes: AtomicU64,
    checksum_failures: AtomicU64,
    io_errors: AtomicU64,
    write_refusals: AtomicU64,
    scan_dropped: AtomicU64,
    scan_temp_removed: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One stored object.
#[derive(Clone, Debug)]
struct Entry {
    key: String,
    size: u64,
    version: Version,
    hard_pin: bool,
    soft_pin_ttl_ms: Option<u64>,
    /// Its file's real bytes.
    physical: u64,
    /// Unix ms of its last successful read; 0: never read.
    last_read_ms: u64,
    /// When it was recorded, on the index's write clock ([`DiskTier::mark`]); 0 for what the
    /// scan at start found.
    seq: u64,
}

#[derive(Default)]
struct Index {
    by_addr: BTreeMap<u64, Entry>,
    logical: u64,
    physical: u64,
    /// Objects and bytes of writes in progress (checked against the limits with the rest).
    reserved_keys: u64,
    reserved_physical: u64,
    /// The write clock: the `seq` the next recorded object gets.
    next_seq: u64,
    /// Keys whose copy failed its checksum (and is deleted), for the owner to tell the
    /// master ([`DiskTier::take_lost`]).
    lost: Vec<String>,
}

impl Index {
    fn insert(&mut self, addr: u64, mut e: Entry) {
        self.next_seq += 1;
        e.seq = self.next_seq;
        self.logical += e.size;
        self.physical += e.physical;
        if let Some(old) = self.by_addr.insert(addr, e) {
            self.logical -= old.size;
            self.physical -= old.physical;
        }
    }

    fn remove(&mut self, addr: u64) -> Option<Entry> {
        let old = self.by_addr.remove(&addr)?;
        self.logical -= old.size;
        self.physical -= old.physical;
        Some(old)
    }

    /// Addresses of the entries overlapping `[addr, addr + len)`.
    fn overlapping(&self, addr: u64, len: u64) -> Vec<u64> {
        let end = addr.saturating_add(len);
        let mut hit = Vec::new();
        if let Some((&a, e)) = self.by_addr.range(..addr).next_back() {
            if a.saturating_add(e.size) > addr {
                hit.push(a);
            }
        }
        hit.extend(self.by_addr.range(addr..end).map(|(&a, _)| a));
        hit
    }
}

/// Writes stopped after a failure, and when the next write may probe whether the disk
/// recovered.
struct Stop {
    why: String,
    next_probe: Instant,
}

/// What the workers share: the settings, the index and the counters.
struct Shared {
    cfg: DiskConfig,
    base: u64,
    /// Logical bytes: the segment's size after the filesystem cap.
    size_limit: u64,
    direct: bool,
    workers: usize,
    index: Mutex<Index>,
    stats: Counters,
    /// Why writes are stopped; `None` while they are accepted.
    stopped: Mutex<Option<Stop>>,
    stopped_flag: AtomicBool,
}

impl Shared {
    fn worker_dir(&self, w: usize) -> PathBuf {
        self.cfg.dir.join(w.to_string())
    }

    fn path_of(&self, addr: u64) -> PathBuf {
        self.worker_dir(worker_of(addr, self.workers))
            .join(format::object_name(addr))
    }

    /// Reserves room for a write of a `file_len`-byte file at `addr`, or refuses it.
    fn reserve(&self, addr: u64, file_len: u64) -> Result<(), DiskError> {
        {
            let mut s = self.stopped.lock();
            if let Some(stop) = s.as_mut() {
                let now = Instant::now();
                if now >= stop.next_probe && self.has_room_for(file_len) {
                    tracing::info!(dir = %self.cfg.dir.display(),
                        "disk tier: a probe write succeeded; writes resumed");
                    *s = None;
                    self.stopped_flag.store(false, Ordering::SeqCst);
                } else {
                    stop.next_probe = stop.next_probe.max(now + DISK_STOPPED_PROBE_INTERVAL);
                    bump(&self.stats.write_refusals);
                    return Err(DiskError::Stopped {
                        why: stop.why.clone(),
                    });
                }
            }
        }
        let mut ix = self.index.lock();
        let replaced = ix.by_addr.get(&addr).map(|e| e.physical);
        let limit = self.cfg.keys_limit;
        if replaced.is_none() && limit > 0 && ix.by_addr.len() as u64 + ix.reserved_keys >= limit {
            bump(&self.stats.write_refusals);
            return Err(DiskError::KeysLimit { limit });
        }
        if let Some(cap) = self.cfg.max_physical_bytes {
            let would = (ix.physical + ix.reserved_physical + file_len)
                .saturating_sub(replaced.unwrap_or(0));
            if would > cap {
                bump(&self.stats.write_refusals);
                return Err(DiskError::PhysicalCap {
                    cap,
                    would,
                    needed: file_len,
                });
            }
        }
        ix.reserved_keys += 1;
        ix.reserved_physical += file_len;
        Ok(())
    }

    fn release(&self, file_len: u64) {
        let mut ix = self.index.lock();
        ix.reserved_keys -= 1;
        ix.reserved_physical -= file_len;
    }

    /// Records a written object; drops (and deletes the files of) older objects its range
    /// overlaps, whose ranges the master has evidently reused.
    fn commit(&self, addr: u64, e: Entry, file_len: u64, path_of: impl Fn(u64) -> PathBuf) {
        let size = e.size;
        let mut ix = self.index.lock();
        ix.reserved_keys -= 1;
        ix.reserved_physical -= file_len;
        for a in ix.overlapping(addr, size) {
            if a != addr {
                ix.remove(a);
                let _ = std::fs::remove_file(path_of(a));
            }
        }
        ix.insert(addr, e);
    }

    /// Turns a failed write into its error; stops writes on a full disk or an I/O error.
    fn write_failed(&self, addr: u64, e: std::io::Error) -> DiskError {
        let stop = matches!(
            e.raw_os_error(),
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EIO) | Some(libc::EROFS)
        );
        if stop {
            let mut s = self.stopped.lock();
            if s.is_none() {
                tracing::error!(
                    error = %e,
                    dir = %self.cfg.dir.display(),
                    "disk tier: a write failed; offload to this disk stops (memory copies \
                     keep serving) until it is resumed"
                );
                *s = Some(Stop {
                    why: e.to_string(),
                    next_probe: Instant::now() + DISK_STOPPED_PROBE_INTERVAL,
                });
                self.stopped_flag.store(true, Ordering::SeqCst);
            }
        }
        DiskError::Io {
            op: "write",
            path: self.path_of(addr),
            source: e,
        }
    }

    /// Whether the filesystem has room for twice a `file_len`-byte file and takes a probe
    /// write (the automatic way out of stopped writes).
    fn has_room_for(&self, file_len: u64) -> bool {
        scan::free_bytes(&self.cfg.dir).is_some_and(|free| free >= file_len.saturating_mul(2))
            && probe_direct(&self.cfg.dir).is_ok()
    }

    fn lookup(&self, start: u64) -> Option<(String, u64)> {
        self.index
            .lock()
            .by_addr
            .get(&start)
            .map(|e| (e.key.clone(), e.size))
    }

    fn touch(&self, start: u64, ms: u64) {
        if let Some(e) = self.index.lock().by_addr.get_mut(&start) {
            e.last_read_ms = ms;
        }
    }

    fn remove(&self, addr: u64) {
        self.index.lock().remove(addr);
    }

    /// Drops a copy that failed its checksum, and remembers its key for the master.
    fn lose(&self, addr: u64) {
        let mut ix = self.index.lock();
        if let Some(e) = ix.remove(addr) {
            ix.lost.push(e.key);
        }
    }

    /// Whether the object at `addr` exists (and, for a tombstone, is its key at or below its
    /// version).
    fn matches(&self, addr: u64, tomb: Option<&(String, Version)>) -> bool {
        let ix = self.index.lock();
        match (ix.by_addr.get(&addr), tomb) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(e), Some((key, version))) => e.key == *key && e.version <= *version,
        }
    }
}

/// The worker an address belongs to: a multiplicative hash, so that the allocator's aligned
/// addresses spread evenly.
fn worker_of(addr: u64, workers: usize) -> usize {
    let mixed = (addr >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((mixed >> 32) % workers as u64) as usize
}

/// The workers [`DiskTier::start_workers`] started: their queues, their threads, and
/// whether every one drives an io_uring ring.
struct Workers {
    senders: Vec<Queue>,
    threads: Vec<JoinHandle<()>>,
    uring: bool,
}

/// A worker's queue, and the way to raise its priority for what waits in it.
struct Queue {
    tx: SyncSender<Request>,
    urgent: Arc<priority::Urgent>,
}

/// An owner's disk store. Cheap to share (`Arc`); every method may be called from any thread.
pub struct DiskTier {
    shared: Arc<Shared>,
    senders: Vec<Queue>,
    threads: Vec<JoinHandle<()>>,
    uring: bool,
}

impl DiskTier {
    /// Opens (or creates) the directory, scans what it holds and starts the workers. `base`
    /// is the disk segment's first address; objects lie in `[base, base + size_limit())`.
    pub fn open(cfg: DiskConfig, base: u64) -> Result<Arc<DiskTier>, DiskError> {
        cfg.validate()?;
        prepare_dir(&cfg.dir)?;
        let direct = probe_direct(&cfg.dir)? && cfg.direct_io;
        if !direct && cfg.direct_io {
            tracing::warn!(
                dir = %cfg.dir.display(),
                "disk tier: the filesystem refuses O_DIRECT (tmpfs?); using buffered I/O, \
                 so file data also sits in the page cache"
            );
        }
        let workers = cfg.workers;
        for w in 0..workers {
            let d = cfg.dir.join(w.to_string());
            std::fs::create_dir_all(&d).map_err(|e| DiskError::Directory {
                path: d.clone(),
                why: format!("cannot create the worker directory: {e}"),
            })?;
        }
        let counters = Counters::default();
        let mut index = scan::scan(&cfg, base, workers, &counters)?;
        let size_limit = scan::cap_to_filesystem(&cfg, &index);
        scan::drop_beyond(&cfg, base, size_limit, workers, &mut index, &counters);
        let shared = Arc::new(Shared {
            cfg,
            base,
            size_limit,
            direct,
            workers,
            index: Mutex::new(index),
            stats: counters,
            stopped: Mutex::new(None),
            stopped_flag: AtomicBool::new(false),
        });
        let Workers {
            senders,
            threads,
            uring,
        } = Self::start_workers(&shared)?;
        let tier = DiskTier {
            shared,
            senders,
            threads,
            uring,
        };
        let s = tier.stats();
        tracing::info!(
            dir = %tier.shared.cfg.dir.display(),
            objects = s.objects,
            logical_bytes = s.logical_bytes,
            size_limit = tier.shared.size_limit,
            direct_io = direct,
            "disk tier open"
        );
        Ok(Arc::new(tier))
    }

    /// Starts one I/O thread per worker, each with its own queue and I/O backend (io_uring
    /// when asked for and allowed); returns the queues, the threads, and whether every
    /// worker got a ring.
    fn start_workers(shared: &Arc<Shared>) -> Result<Workers, DiskError> {
        let workers = shared.workers;
        let mut senders = Vec::with_capacity(workers);
        let mut threads = Vec::with_capacity(workers);
        let mut refused: Option<String> = None;
        let mut uring = true;
        for id in 0..workers {
            let (io, why) = io::Io::new(shared.cfg.use_uring);
            uring &= io.is_uring();
            if refused.is_none() {
                refused = why;
            }
            let (tx, rx) = sync_channel(DISK_WORKER_QUEUE_MAX);
            let urgent = Arc::new(priority::Urgent::default());
            let w = Worker {
                dir: shared.worker_dir(id),
                shared: Arc::clone(shared),
                io,
                urgent: Arc::clone(&urgent),
            };
            let t = std::thread::Builder::new()
                .name(format!("disk-io-{id}"))
                .spawn(move || w.run(rx))
                .map_err(|e| DiskError::Io {
                    op: "spawn worker",
                    path: shared.cfg.dir.clone(),
                    source: e,
                })?;
            senders.push(Queue { tx, urgent });
            threads.push(t);
        }
        match &refused {
            Some(why) if !shared.cfg.use_uring => {
                tracing::info!("disk tier: {why}; {workers} workers use pread/pwrite")
            }
            Some(why) => tracing::warn!("disk tier: {why}; {workers} workers use pread/pwrite"),
            None => tracing::info!("disk tier: {workers} workers, one io_uring ring each"),
        }
        Ok(Workers {
            senders,
            threads,
            uring,
        })
    }

    /// What a same-host reader needs besides the directory to read the files (`share`).
    pub fn share_offer(&self) -> share::DirOffer {
        share::DirOffer {
            workers: self.shared.workers as u32,
            direct: self.shared.direct,
        }
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        &self.shared.cfg.dir
    }

    /// Whether the files are opened with `O_DIRECT` (false: the filesystem refused it).
    pub fn direct_io(&self) -> bool {
        self.shared.direct
    }

    /// Whether every worker drives an io_uring ring (false: `pread`/`pwrite`).
    pub fn uring(&self) -> bool {
        self.uring
    }

    /// The disk segment's first address.
    pub fn base(&self) -> u64 {
        self.shared.base
    }

    /// Logical bytes the segment may hold: the configured limit, lowered to what the
    /// filesystem can hold at open. The disk segment is mounted with this size.
    pub fn size_limit(&self) -> u64 {
        self.shared.size_limit
    }

    /// The settings it runs with.
    pub fn config(&self) -> &DiskConfig {
        &self.shared.cfg
    }

    /// Queues `op` to the worker of `addr`; its answer comes on the receiver.
    fn submit(&self, addr: u64, op: Op) -> Result<Receiver<Answer>, DiskError> {
        let (tx, rx) = sync_channel(1);
        let q = &self.senders[worker_of(addr, self.shared.workers)];
        // Anything but a write has a caller waiting: the worker must not run it, nor a
        // write queued before it, at background priority.
        let urgent = !matches!(op, Op::Write { .. });
        if urgent {
            q.urgent.arrive();
        }
        if q.tx.send(Request { op, reply: tx }).is_err() {
            if urgent {
                q.urgent.taken();
            }
            return Err(DiskError::WorkerGone);
        }
        Ok(rx)
    }

    /// Runs `op` on the worker of `addr` and waits for its answer.
    fn call(&self, addr: u64, op: Op) -> Result<Answer, DiskError> {
        self.submit(addr, op)?
            .recv()
            .map_err(|_| DiskError::WorkerGone)
    }

    /// The read of `[addr, addr + dst.len())` (inside one stored object), for the worker of
    /// the object's start.
    fn read_op(
        &self,
        addr: u64,
        dst: Dst<'static>,
        progress: Option<worker::Progress>,
    ) -> Result<(u64, Op), DiskError> {
        let len = dst.len() as u64;
        let Some(start) = self.object_of(addr, len) else {
            return Err(DiskError::NotFound { addr, len });
        };
        let op = Op::Read {
            start,
            offset: addr - start,
            dst,
            progress,
        };
        Ok((start, op))
    }

    /// Stores `src` as the object `key` at `addr` (replacing what was stored there). Refused
    /// when the key limit or the physical cap would be exceeded, or while writes are stopped.
    pub fn write(
        &self,
        addr: u64,
        key: &str,
        version: Version,
        pins: Pins,
        src: Src<'_>,
    ) -> Result<(), DiskError> {
        let size = src.len() as u64;
        let end = self.shared.base.saturating_add(self.shared.size_limit);
        if size == 0 || size > format::SIZE_MAX {
            return Err(DiskError::InvalidArgument(format!(
                "object size {size} is not in 1..={}",
                format::SIZE_MAX
            )));
        }
        if key.is_empty() || key.len() > protocol::limits::KEY_MAX_BYTES {
            return Err(DiskError::InvalidArgument(format!(
                "key of {} bytes is not in 1..={}",
                key.len(),
                protocol::limits::KEY_MAX_BYTES
            )));
        }
        if addr < self.shared.base || addr.checked_add(size).is_none_or(|e| e > end) {
            return Err(DiskError::InvalidArgument(format!(
                "range {addr:#x}+{size} is outside the disk segment {:#x}+{}",
                self.shared.base, self.shared.size_limit
            )));
        }
        // SAFETY: the worker uses this range only while it serves the request, and this call
        // blocks until its answer (or until the worker is gone, which ends every use), so the
        // range stays readable for as long as the `'static` stand-in is used.
        let src = unsafe { Src::from_raw(src.as_ptr(), src.len()) };
        let op = Op::Write {
            addr,
            key: key.to_string(),
            version,
            pins,
            src,
        };
        match self.call(addr, op)? {
            Answer::Done(r) => r,
            Answer::Deleted(_) => Err(DiskError::WorkerGone),
        }
    }

    /// Reads `[addr, addr + dst.len())`, which must lie inside one stored object, into
    /// `dst`. The whole object's checksum is checked; a mismatch is [`DiskError::Corrupt`]
    /// and the object is gone afterwards.
    pub fn read(&self, addr: u64, mut dst: Dst<'_>) -> Result<(), DiskError> {
        // SAFETY: as in `write`: the worker writes this range only while serving the request,
        // and this call blocks until its answer.
        let dst = unsafe { Dst::from_raw(dst.as_mut_ptr(), dst.len()) };
        let (start, op) = self.read_op(addr, dst, None)?;
        match self.call(start, op)? {
            Answer::Done(r) => r,
            Answer::Deleted(_) => Err(DiskError::WorkerGone),
        }
    }

    /// Starts a streamed read of `[addr, addr + dst.len())` (inside one stored object) into
    /// `dst` and returns at once: `progress` tells how much of `dst` is filled as the object
    /// is read, the answer comes on the receiver once the whole object's checksum is checked.
    ///
    /// # Safety
    ///
    /// `dst` must stay valid for writes, and its filled part is the only part the caller may
    /// read, until the caller has received the answer (or the receiver reports the worker
    /// gone): the worker writes into it until it sends the answer.
    unsafe fn read_streamed(
        &self,
        addr: u64,
        mut dst: Dst<'_>,
        progress: worker::Progress,
    ) -> Result<Receiver<Answer>, DiskError> {
        // SAFETY: the caller keeps the range valid until it has the answer (this function's
        // contract), which the worker sends after its last use of it.
        let dst = unsafe { Dst::from_raw(dst.as_mut_ptr(), dst.len()) };
        let (start, op) = self.read_op(addr, dst, Some(progress))?;
        self.submit(start, op)
    }

    /// The start of the stored object that `[addr, addr + len)` lies inside, if any.
    pub(super) fn object_of(&self, addr: u64, len: u64) -> Option<u64> {
        let ix = self.shared.index.lock();
        ix.by_addr
            .range(..=addr)
            .next_back()
            .filter(|(&a, e)| len > 0 && addr.checked_add(len).is_some_and(|end| end <= a + e.size))
            .map(|(&a, _)| a)
    }

    fn delete(&self, addr: u64, tomb: Option<(String, Version)>) -> bool {
        matches!(
            self.call(addr, Op::Delete { addr, tomb }),
            Ok(Answer::Deleted(true))
        )
    }

    /// The write clock now: objects recorded from here on are newer than this mark. A ping
    /// takes one before it is sent, so that [`DiskTier::forget`] of the ranges its answer
    /// names spares a file written into a reused range meanwhile.
    pub fn mark(&self) -> u64 {
        self.shared.index.lock().next_seq
    }

    /// Deletes the objects that start in `[addr, addr + len)` (the master freed them) and were
    /// recorded at or before `mark` ([`DiskTier::mark`]; `u64::MAX`: whatever is there).
    /// Returns how many.
    pub fn forget(&self, addr: u64, len: u64, mark: u64) -> usize {
        let end = addr.saturating_add(len);
        let doomed: Vec<u64> = {
            let ix = self.shared.index.lock();
            ix.by_addr
                .range(addr..end)
                .filter(|(_, e)| e.seq <= mark)
                .map(|(&a, _)| a)
                .collect()
        };
        doomed.into_iter().filter(|&a| self.delete(a, None)).count()
    }

    /// The keys whose copies failed their checksum since the last call (their files are
    /// gone); the owner tells the master, which drops those replicas.
    pub fn take_lost(&self) -> Vec<String> {
        std::mem::take(&mut self.shared.index.lock().lost)
    }

    /// Puts back keys [`DiskTier::take_lost`] gave that the master could not be told of.
    pub fn return_lost(&self, keys: Vec<String>) {
        self.shared.index.lock().lost.extend(keys);
    }

    /// A tombstone (`key` removed at `version`, a `CATALOG_PUT` tombstone record): deletes
    /// the objects of that key overlapping `[addr, addr + len)` stored at or below that
    /// version. Returns how many.
    pub fn bury(&self, addr: u64, len: u64, key: &str, version: Version) -> usize {
        let doomed = self.shared.index.lock().overlapping(addr, len);
        doomed
            .into_iter()
            .filter(|&a| self.delete(a, Some((key.to_string(), version))))
            .count()
    }

    /// Every stored object, as the catalog reports objects to a new master.
    pub fn held(&self) -> Vec<CatalogEntry> {
        self.shared
            .index
            .lock()
            .by_addr
            .iter()
            .map(|(&addr, e)| CatalogEntry {
                addr,
                len: e.size,
                key: e.key.clone(),
                hard_pin: e.hard_pin,
                soft_pin_ttl_ms: e.soft_pin_ttl_ms,
                version: e.version,
            })
            .collect()
    }

    /// When the object at `addr` was last read (`None`: not stored, or never read since
    /// this process opened the tier).
    pub fn last_read(&self, addr: u64) -> Option<SystemTime> {
        let ms = self.shared.index.lock().by_addr.get(&addr)?.last_read_ms;
        (ms > 0).then(|| UNIX_EPOCH + std::time::Duration::from_millis(ms))
    }

    /// Whether writes are stopped (after `ENOSPC`, `EDQUOT` or `EIO`).
    pub fn writes_stopped(&self) -> bool {
        self.shared.stopped_flag.load(Ordering::SeqCst)
    }

    /// Accepts writes again if a probe write to the directory succeeds (an operator's or the
    /// node's way out of stopped writes without waiting for the automatic probe).
    pub fn resume(&self) -> Result<(), DiskError> {
        probe_direct(&self.shared.cfg.dir)?;
        let mut s = self.shared.stopped.lock();
        if s.take().is_some() {
            tracing::info!(dir = %self.shared.cfg.dir.display(), "disk tier: writes resumed");
        }
        self.shared.stopped_flag.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// The counters now.
    pub fn stats(&self) -> DiskStats {
        let c = &self.shared.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let ix = self.shared.index.lock();
        DiskStats {
            objects: ix.by_addr.len() as u64,
            logical_bytes: ix.logical,
            physical_bytes: ix.physical,
            reads: get(&c.reads),
            writes: get(&c.writes),
            bytes_read: get(&c.bytes_read),
            bytes_written: get(&c.bytes_written),
            direct_reads: get(&c.direct_reads),
            direct_writes: get(&c.direct_writes),
            checksum_failures: get(&c.checksum_failures),
            io_errors: get(&c.io_errors),
            write_refusals: get(&c.write_refusals),
            writes_stopped: self.writes_stopped(),
            scan_dropped: get(&c.scan_dropped),
            scan_temp_removed: get(&c.scan_temp_removed),
        }
    }
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        self.senders.clear();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Creates the directory if missing; checks that it is a directory.
fn prepare_dir(dir: &Path) -> Result<(), DiskError> {
    let err = |why: String| DiskError::Directory {
        path: dir.to_path_buf(),
        why,
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(err("exists and is not a directory".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir_all(dir)
            .map_err(|e| err(format!("does not exist and cannot be created: {e}"))),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => Err(err(
            "cannot be created: a component of the path is a file, not a directory".into(),
        )),
        Err(e) => Err(err(format!("cannot be inspected: {e}"))),
    }
}

/// Writes one aligned block with `O_DIRECT` in `dir` (and deletes it): true when that works,
/// false when the filesystem refuses `O_DIRECT` (then checks a buffered write does);
/// an error when the directory is not writable.
fn probe_direct(dir: &Path) -> Result<bool, DiskError> {
    let path = dir.join(".probe.tmp");
    let not_writable = |e: std::io::Error| DiskError::Directory {
        path: dir.to_path_buf(),
        why: format!("is not writable by this process: {e}"),
    };
    let attempt = |direct: bool| -> std::io::Result<()> {
        let mut o = OpenOptions::new();
        o.write(true).create(true).truncate(true).mode(0o600);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        let f = o.open(&path)?;
        let mut buf = io::AlignedBuf::new(DISK_BLOCK_BYTES);
        std::os::unix::fs::FileExt::write_all_at(&f, buf.as_mut_slice(), 0)
    };
    let direct = match attempt(true) {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            attempt(false).map_err(not_writable)?;
            false
        }
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return Err(not_writable(e));
        }
    };
    let _ = std::fs::remove_file(&path);
    Ok(direct)
}
