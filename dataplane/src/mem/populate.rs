//! The background populator: a segment's pages faulted in by a low-priority thread after the
//! segment is already serving, so that a node is fast from its first put without waiting at
//! start-up for memory it may fill only later.
//!
//! A put into a page of a segment nobody has touched yet runs at the kernel's page-fault
//! rate: the fault allocates and zeroes the page, and every process mapping the segment (a
//! same-host client writes through its own mapping) traps once per 4 KiB page. Populating the
//! segment ahead moves that cost off the put; collapsing it into transparent hugepages
//! ([`Segment::populate`]) leaves one trap per 2 MiB. `--prefault` does it all before the node
//! reports ready, which costs the start-up about a second per GiB on a VM that backs guest
//! memory lazily; the populator does the same work after ready, in the gaps.
//!
//! How: the caller may populate a head of the segment before it reports ready, within a
//! time budget ([`Populator::start_with_head`]; the node allows 1 s per 16 GiB of segment),
//! so that the first puts, which come at once, find their pages ready even on a busy host.
//! The head is populated by as many threads as the start has cores ([`Head::threads`], at
//! most [`POPULATE_HEAD_THREADS_MAX`]): on this project's 2-core VM two threads populate
//! 9.4-10.3 GB/s where one does 4.4-6.6, so a 1 GiB node's 62.5 ms cover 370-670 MiB of head
//! instead of about 290. Then one thread per segment, at `SCHED_IDLE`, walks the rest from
//! the head upwards in 2 MiB chunks ([`POPULATE_CHUNK_BYTES`]) and publishes how far it got
//! ([`Populator::populated_bytes`]).
//!
//! `SCHED_IDLE` alone does not keep the walk out of other processes' way. Where a VM's host
//! backs guest memory on first touch, a chunk stalls its vCPU in the host for milliseconds,
//! where no guest priority reaches; and the scheduler counts a CPU running an idle-policy
//! thread as free, so it wakes other threads onto it, to wait there. Measured on a 2-core VM
//! (`bench/README.md`, "The populator out of the way"): while a fresh node's walk ran, a
//! same-host client's 4 KiB puts took 35-110 µs and gets 13-45 µs, against 10-13 and 8-9
//! once it ended. So the walk is [`Pace::Courteous`]: before each chunk it asks whether the
//! machine's threads want the CPUs ([`CpuGauge`]: whether any waited for one lately, from
//! the kernel's CPU pressure, and the running count of `/proc/loadavg`), and if so it waits
//! ([`POPULATE_YIELD`]) until [`POPULATE_QUIET_LOOKS`] looks in a row find them free.
//!
//! Big puts are what want the CPUs most, and they are also what the walk is for: puts that
//! reach the walk's position fault every page themselves (1,024 traps per 4 MiB, 15-18% of a
//! memcpy), while an idle-priority thread beside their copy threads gets no CPU at all. So
//! a second thread, the lead, at the ordinary priority, looks every [`POPULATE_LEAD_LOOK`]
//! (one `mincore` of a chunk) whether the puts have touched the chunk the walk takes next;
//! when they have, it takes the walk's chunks itself, passing the ones they touched and
//! populating the rest, until [`POPULATE_AHEAD_BYTES`] past the last one they touched (twice
//! as far each time they reach it again), unless its chunks come slower than the puts' own
//! faults (a VM's host backing the memory on first touch): then it leaves them alone for a
//! while ([`lead`]). Its work is work those puts would otherwise do in their own faults, about five times as
//! dearly (a client faulting its pages spends 3.6-4.6 ms of CPU per 4 MiB; populating
//! 4 MiB in chunks takes about 0.8).
//!
//! Neither thread populates a chunk puts touched first: collapsing it would copy their pages
//! and make every process that mapped them fault on them again, while they write beside it
//! (measured before this rule: a node whose walk fell behind its puts filled at 7-11% of a
//! memcpy, below the 15-17% of a node without a populator).
//!
//! The base upwards is the order the master's allocator fills a fresh segment in (best fit
//! from its one free extent takes the extent's lowest bytes, `controlplane::alloc::extent`),
//! so the populated range is the one the next puts land in; freed ranges are reused first
//! (best fit prefers the smallest hole), and they were populated by the puts that wrote them.
//! A put that outruns the populator is not refused or delayed: it takes the faults itself,
//! as without a populator.
//!
//! Invariants: the populator never changes a byte of the segment ([`Segment::populate`] only
//! faults pages in and collapses them, both content-preserving under concurrent writers), so
//! it may run while peers read and write; it touches nothing outside the segment, which
//! stays mapped while its threads run (they hold an `Arc`); the walk and the lead claim
//! chunks from one atomic position, so no chunk is taken twice; dropping the [`Populator`]
//! stops both after their current chunk and joins them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::limits::{
    POPULATE_AHEAD_BYTES, POPULATE_CHUNK_BYTES, POPULATE_HEAD_THREADS_MAX, POPULATE_LEAD_BACKOFF,
    POPULATE_LEAD_LOOK, POPULATE_LEAD_SLOW, POPULATE_QUIET_LOOKS, POPULATE_YIELD,
};
use crate::mem::Segment;

/// How the walk shares the machine with other work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// A chunk only while no thread waits for a CPU ([`CpuGauge`]), or when puts are about
    /// to outrun the walk (the module docs); what a serving node uses.
    Courteous,
    /// Chunk after chunk, whatever else runs.
    Eager,
}

/// What the populator did, once it finished (or stopped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PopulateReport {
    /// Bytes from the base of the segment the walk got through: each of their chunks is
    /// populated, or puts had touched it before the walk came to it.
    pub populated_bytes: usize,
    /// Chunks that became one hugepage each.
    pub huge_chunks: usize,
    /// Chunks populated with base pages (the kernel refused the collapse).
    pub base_chunks: usize,
    /// Time from start to the end of the walk.
    pub took: Duration,
    /// Of it, time spent waiting for a free CPU ([`Pace::Courteous`]).
    pub yielded: Duration,
    /// Chunks the lead populated ahead of puts that had reached the walk.
    pub lead_chunks: usize,
    /// Chunks left as they were because puts had touched them before the walk came to them.
    pub overtaken_chunks: usize,
    /// Times the lead stopped running ahead because a chunk was slower than faults.
    pub lead_backoffs: usize,
    /// Why it stopped before the end: asked to, or the kernel cannot populate.
    pub stopped: Option<&'static str>,
}

/// The part of a segment populated before [`Populator::start_with_head`] returns.
#[derive(Clone, Copy, Debug)]
pub struct Head {
    /// When the head ends: no chunk starts after it (every thread populates one at least).
    pub until: Instant,
    /// Threads that populate it, the caller's among them (1 up to
    /// [`POPULATE_HEAD_THREADS_MAX`]): a start has the cores to itself.
    pub threads: usize,
}

/// Populates `segment` from its base, [`POPULATE_CHUNK_BYTES`] at a time, in `head.threads`
/// threads (the caller's among them) that claim chunks in order, until `head.until` or the
/// end; returns how far from the base every chunk is populated (a multiple of the chunk, or
/// the end). A chunk the kernel refuses ends it there. A thread that cannot start leaves its
/// share to the others.
fn populate_head(segment: &Segment, head: Head) -> usize {
    let next = AtomicUsize::new(0);
    // The lowest chunk the kernel refused.
    let refused = AtomicUsize::new(usize::MAX);
    let work = || loop {
        let offset = next.fetch_add(POPULATE_CHUNK_BYTES, Ordering::AcqRel);
        // Chunks above a refused one are not worth it (the head ends there); below, they are.
        if offset >= segment.len() || offset > refused.load(Ordering::Acquire) {
            break;
        }
        let len = POPULATE_CHUNK_BYTES.min(segment.len() - offset);
        if segment.populate(offset, len).is_err() {
            refused.fetch_min(offset, Ordering::AcqRel);
            break;
        }
        if Instant::now() >= head.until {
            break;
        }
    };
    std::thread::scope(|s| {
        for _ in 1..head.threads.clamp(1, POPULATE_HEAD_THREADS_MAX) {
            let _ = std::thread::Builder::new()
                .name("populate-head".into())
                .spawn_scoped(s, work);
        }
        work();
    });
    // Every chunk claimed below `refused` was populated by its claimer before it stopped.
    next.into_inner()
        .min(segment.len())
        .min(refused.into_inner())
}

impl PopulateReport {
    /// Adds the lead's chunks to the walk's.
    fn add(&mut self, lead: &PopulateReport) {
        self.huge_chunks += lead.huge_chunks;
        self.base_chunks += lead.base_chunks;
        self.lead_chunks += lead.lead_chunks;
        self.overtaken_chunks += lead.overtaken_chunks;
        self.lead_backoffs += lead.lead_backoffs;
        self.stopped = lead.stopped.or(self.stopped);
    }
}

struct Shared {
    stop: AtomicBool,
    /// The next chunk to claim ([`claim`]); may pass the end.
    populated: AtomicUsize,
    /// [`POPULATE_LEAD_SLOW`], but in tests.
    lead_slow: Duration,
}

/// A running populator over one segment; see the module docs.
pub struct Populator {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<PopulateReport>>,
    len: usize,
}

impl Populator {
    /// Starts populating `segment` from its base in a thread named `name` at `SCHED_IDLE`,
    /// [`Pace::Courteous`].
    pub fn start(segment: Arc<Segment>, name: &str) -> std::io::Result<Populator> {
        Self::start_paced(segment, name, None, Pace::Courteous)
    }

    /// Populates the head of `segment` before it returns, in the calling thread and
    /// `head.threads - 1` more, until `head.until` (at least one chunk each), then the rest in
    /// the background as [`Self::start`] does: the part a fresh node's first puts land in is
    /// ready before the node says it is, at a bounded cost to its start.
    pub fn start_with_head(
        segment: Arc<Segment>,
        name: &str,
        head: Head,
    ) -> std::io::Result<Populator> {
        Self::start_paced(segment, name, Some(head), Pace::Courteous)
    }

    /// [`Self::start`] (no `head`) or [`Self::start_with_head`], at `pace`.
    pub fn start_paced(
        segment: Arc<Segment>,
        name: &str,
        head: Option<Head>,
        pace: Pace,
    ) -> std::io::Result<Populator> {
        let from = head.map_or(0, |h| populate_head(&segment, h));
        Self::start_from(segment, name, from, pace, POPULATE_LEAD_SLOW)
    }

    /// The walk from byte `from` (a multiple of [`POPULATE_CHUNK_BYTES`], or the end): the
    /// bytes below it are populated already. `lead_slow`: [`POPULATE_LEAD_SLOW`] but in
    /// tests, which must not depend on how fast the machine's host backs memory.
    fn start_from(
        segment: Arc<Segment>,
        name: &str,
        from: usize,
        pace: Pace,
        lead_slow: Duration,
    ) -> std::io::Result<Populator> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            populated: AtomicUsize::new(from),
            lead_slow,
        });
        let len = segment.len();
        let inner = shared.clone();
        let lead_name = format!("{name}-lead");
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                // The lead is started before this thread lowers its priority, so that it
                // keeps the ordinary one (a thread inherits its creator's).
                let lead = (pace == Pace::Courteous)
                    .then(|| {
                        let (segment, shared) = (segment.clone(), inner.clone());
                        std::thread::Builder::new()
                            .name(lead_name)
                            .spawn(move || lead(&segment, &shared))
                            .inspect_err(|e| tracing::warn!("no populator lead: {e}"))
                            .ok()
                    })
                    .flatten();
                lower_priority();
                let mut report = walk(&segment, &inner, pace);
                if let Some(Ok(led)) = lead.map(JoinHandle::join) {
                    report.add(&led);
                }
                // Read once both threads are done: the lead may claim after the walk ends.
                report.populated_bytes = inner.populated.load(Ordering::Acquire).min(len);
                log_report(&segment, &report);
                report
            })?;
        Ok(Populator {
            shared,
            thread: Some(thread),
            len,
        })
    }

    /// How far from the segment's base the walk got: every chunk below is populated, being
    /// populated, or was touched by puts before the walk came to it.
    pub fn populated_bytes(&self) -> usize {
        self.shared.populated.load(Ordering::Acquire).min(self.len)
    }

    /// Whether the walk reached the segment's end (see [`Self::populated_bytes`]).
    pub fn done(&self) -> bool {
        self.populated_bytes() >= self.len
    }

    /// Waits for the walk to end and returns what it did.
    pub fn join(mut self) -> PopulateReport {
        self.finish(false)
    }

    /// Stops the walk after the current chunk and returns what it did.
    pub fn stop(mut self) -> PopulateReport {
        self.finish(true)
    }

    fn finish(&mut self, stop: bool) -> PopulateReport {
        if stop {
            self.shared.stop.store(true, Ordering::Release);
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(report)) => report,
            _ => PopulateReport {
                populated_bytes: self.populated_bytes(),
                stopped: Some("the populator thread panicked"),
                ..PopulateReport::default()
            },
        }
    }
}

impl Drop for Populator {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.finish(true);
        }
    }
}

/// The populator's walk: every chunk from the base up that the lead has not claimed first;
/// at [`Pace::Courteous`] a chunk waits for a free CPU (the module docs).
fn walk(segment: &Segment, shared: &Shared, pace: Pace) -> PopulateReport {
    let started = Instant::now();
    let mut report = PopulateReport::default();
    let mut gauge = (pace == Pace::Courteous).then(CpuGauge::new);
    // Looks in a row that found the CPUs free.
    let mut quiet = POPULATE_QUIET_LOOKS;
    loop {
        if shared.stop.load(Ordering::Acquire) {
            report.stopped.get_or_insert("stopped");
            break;
        }
        if shared.populated.load(Ordering::Acquire) >= segment.len() {
            break;
        }
        if let Some(gauge) = gauge.as_mut() {
            quiet = if gauge.cpus_wanted() { 0 } else { quiet + 1 };
            if quiet < POPULATE_QUIET_LOOKS {
                std::thread::sleep(POPULATE_YIELD);
                report.yielded += POPULATE_YIELD;
                continue;
            }
        }
        let Some(offset) = claim(segment, shared) else {
            break;
        };
        step(segment, shared, offset, &mut report);
    }
    report.took = started.elapsed();
    report
}

/// The lead, at the ordinary priority beside the idle walk: every [`POPULATE_LEAD_LOOK`] it
/// looks whether puts have touched the chunk the walk takes next; if so they are at or
/// past the walk, and the lead takes the walk's chunks itself, passing the ones they touched
/// and populating the rest, until a distance past the last one they touched:
/// [`POPULATE_AHEAD_BYTES`] the first time, twice the last distance each time the puts reach
/// the walk again (a fill that keeps coming gets a walk that keeps going).
///
/// Only where it is faster than the puts' own faults: two chunks in a row that each took
/// more than [`POPULATE_LEAD_SLOW`] (`shared.lead_slow`) of the lead's CPU mean the host
/// backs this memory slower than the guest faults it (a VM's first touch), and racing the
/// puts then makes them wait on the chunk being collapsed (measured: 7% of a memcpy against 15% without a populator);
/// the lead starts over after [`POPULATE_LEAD_BACKOFF`]. (One slow chunk alone is usually
/// one the kernel would not collapse, populated page by page.) Until the walk ends or is
/// stopped; returns what it did.
fn lead(segment: &Segment, shared: &Shared) -> PopulateReport {
    let mut report = PopulateReport::default();
    let mut until = 0;
    let mut distance = POPULATE_AHEAD_BYTES;
    let mut slow_in_a_row = 0;
    while !shared.stop.load(Ordering::Acquire) && report.stopped.is_none() {
        let at = shared.populated.load(Ordering::Acquire);
        if at >= segment.len() {
            break;
        }
        if at >= until && !touched(segment, at) {
            std::thread::sleep(POPULATE_LEAD_LOOK);
            continue;
        }
        let Some(offset) = claim(segment, shared) else {
            break;
        };
        let overtaken = report.overtaken_chunks;
        let cpu = thread_cpu_time();
        step(segment, shared, offset, &mut report);
        if report.overtaken_chunks == overtaken {
            report.lead_chunks += 1;
            let slow = thread_cpu_time().saturating_sub(cpu) > shared.lead_slow;
            slow_in_a_row = if slow { slow_in_a_row + 1 } else { 0 };
            if slow_in_a_row == 2 {
                report.lead_backoffs += 1;
                (until, distance, slow_in_a_row) = (0, POPULATE_AHEAD_BYTES, 0);
                std::thread::sleep(POPULATE_LEAD_BACKOFF);
            }
        } else if offset >= until {
            // The puts reached the walk again: past the end of the last distance.
            until = offset.saturating_add(POPULATE_CHUNK_BYTES + distance);
            distance = distance.saturating_mul(2);
        } else {
            until = until.max(offset.saturating_add(POPULATE_CHUNK_BYTES + distance / 2));
        }
    }
    report
}

/// CPU time the calling thread used so far.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Takes the next chunk of the walk for the caller: its offset, or `None` at the end.
fn claim(segment: &Segment, shared: &Shared) -> Option<usize> {
    let offset = shared
        .populated
        .fetch_add(POPULATE_CHUNK_BYTES, Ordering::AcqRel);
    (offset < segment.len()).then_some(offset)
}

/// Whether a page of the chunk at `offset` is resident: puts (or a reader) touched it.
fn touched(segment: &Segment, offset: usize) -> bool {
    let len = POPULATE_CHUNK_BYTES.min(segment.len() - offset);
    segment.any_resident(offset, len).unwrap_or(false)
}

/// One claimed chunk: populated, or left as it is when puts touched it first (collapsing it
/// would copy their pages and make every process that mapped them fault on them again,
/// while they write beside it). A chunk the kernel cannot populate stops the walk there.
fn step(segment: &Segment, shared: &Shared, offset: usize, report: &mut PopulateReport) {
    if touched(segment, offset) {
        report.overtaken_chunks += 1;
        return;
    }
    let len = POPULATE_CHUNK_BYTES.min(segment.len() - offset);
    match segment.populate(offset, len) {
        Ok(true) => report.huge_chunks += 1,
        Ok(false) => report.base_chunks += 1,
        Err(e) => {
            tracing::warn!("segment populator stopped at byte {offset}: {e}");
            report.stopped = Some("the kernel cannot populate (MADV_POPULATE_WRITE)");
            shared.populated.fetch_min(offset, Ordering::AcqRel);
            shared.stop.store(true, Ordering::Release);
        }
    }
}

/// The populator's log line, once its walk ended.
fn log_report(segment: &Segment, report: &PopulateReport) {
    tracing::info!(
        "segment at {:#x}: {} of {} bytes populated in {:?} ({} hugepages, {} chunks of base \
         pages; {:?} waiting for a free CPU, {} chunks populated by the lead ahead of puts, {} \
         overtaken by them, {} lead back-offs){}",
        segment.addr(),
        report.populated_bytes,
        segment.len(),
        report.took,
        report.huge_chunks,
        report.base_chunks,
        report.yielded,
        report.lead_chunks,
        report.overtaken_chunks,
        report.lead_backoffs,
        report
            .stopped
            .map(|why| format!(", stopped: {why}"))
            .unwrap_or_default()
    );
}

/// The share of the time some thread waited for a CPU (the kernel's CPU pressure) from which
/// [`CpuGauge`] counts the CPUs as wanted: a client and the master calling each other
/// measured 36-61% on a 2-core VM, a lone busy process 0-2%.
const STALL_SHARE: f64 = 0.10;

/// Whether the machine's threads want the CPUs now, read before each chunk (a few µs).
///
/// Where the kernel reports CPU pressure (`/proc/pressure/cpu`, PSI): wanted when, over the
/// last window of at least [`POPULATE_YIELD`], some thread was ready to run and waited for a
/// CPU [`STALL_SHARE`] of the time or more (the walk's own chunk may be what it
/// waited behind), or when the running count of `/proc/loadavg` leaves no CPU free for the
/// walk. That tells a client and the master calling each other back to back (on this 2-core
/// VM a thread waits 36-61% of the time, with the CPUs otherwise free) from one busy thread
/// (a process starting: 0-2%, a few moments at 10-24%), beside which a chunk takes the other
/// CPU and delays nobody; the running count catches the calls' first window.
///
/// Elsewhere (no PSI; and until a first window has passed): the running count alone, and
/// the CPUs count as wanted unless one besides the walk's own is free. Where neither file
/// can be read, no CPU counts as wanted and the walk runs as [`Pace::Eager`].
pub struct CpuGauge {
    file: Option<std::fs::File>,
    psi: Option<std::fs::File>,
    /// When the window being measured began, and the stall total then (µs).
    since: Option<(Instant, u64)>,
    /// The share of the last window of at least [`POPULATE_YIELD`].
    share: Option<f64>,
    cpus: usize,
}

impl CpuGauge {
    /// Opens `/proc/loadavg` and `/proc/pressure/cpu` once; the CPUs online from `sysconf`.
    pub fn new() -> CpuGauge {
        // SAFETY: sysconf reads a system value; no memory is passed.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        CpuGauge {
            file: std::fs::File::open("/proc/loadavg").ok(),
            psi: std::fs::File::open("/proc/pressure/cpu").ok(),
            since: None,
            share: None,
            cpus: usize::try_from(online).unwrap_or(1).max(1),
        }
    }

    /// Threads running or runnable on the machine now besides the caller; `None` when the
    /// file cannot be read or parsed.
    pub fn others_running(&mut self) -> Option<usize> {
        let mut buf = [0u8; 128];
        let text = read_small(self.file.as_ref()?, &mut buf)?;
        // "0.52 0.58 0.59 3/467 12345": the fourth field is running/total.
        let running = text.split_whitespace().nth(3)?.split('/').next()?;
        let running: usize = running.parse().ok()?;
        Some(running.saturating_sub(1))
    }

    /// The share of the last window of at least [`POPULATE_YIELD`] during which some thread
    /// waited for a CPU (PSI's `some` total): a call within a window answers the last whole
    /// window's share. `None` without PSI, or before a whole window passed.
    pub fn stalled_share(&mut self) -> Option<f64> {
        let mut buf = [0u8; 256];
        // "some avg10=0.00 avg60=0.00 avg300=0.00 total=12345\nfull ...".
        let text = read_small(self.psi.as_ref()?, &mut buf)?;
        let total: u64 = text
            .lines()
            .next()?
            .rsplit("total=")
            .next()?
            .trim()
            .parse()
            .ok()?;
        let now = Instant::now();
        match self.since {
            Some((at, was)) if now.duration_since(at) >= POPULATE_YIELD => {
                let us = now.duration_since(at).as_micros() as f64;
                self.share = Some(total.saturating_sub(was) as f64 / us);
                self.since = Some((now, total));
            }
            Some(_) => {}
            None => self.since = Some((now, total)),
        }
        self.share
    }

    /// Whether the CPUs a chunk needs are wanted (the type's docs).
    pub fn cpus_wanted(&mut self) -> bool {
        // The running count is read only when the pressure does not decide alone.
        let (stalled, wanted_from) = match self.stalled_share() {
            Some(share) => (share >= STALL_SHARE, self.cpus),
            None => (false, self.cpus.saturating_sub(1).max(1)),
        };
        stalled || self.others_running().is_some_and(|n| n >= wanted_from)
    }
}

/// The text of a small `/proc` file, read again from its start.
fn read_small<'b>(file: &std::fs::File, buf: &'b mut [u8]) -> Option<&'b str> {
    use std::os::unix::fs::FileExt;
    let n = file.read_at(buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()
}

impl Default for CpuGauge {
    fn default() -> Self {
        Self::new()
    }
}

/// Moves the calling thread to `SCHED_IDLE` (below nice 19: it runs only on an otherwise idle
/// core), or to nice 19 where that is refused.
fn lower_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc != 0 {
        // SAFETY: setpriority on the calling thread (who 0 with PRIO_PROCESS is the caller's
        // thread id on Linux); no memory is passed.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::HUGE_PAGE_BYTES;
    use crate::mem::{HugepagePolicy, SegmentOptions};

    fn shared_segment(len: usize) -> Arc<Segment> {
        let opts = SegmentOptions {
            hugepages: HugepagePolicy::Never,
            prefault: false,
        };
        Arc::new(Segment::new_shared(len, opts).unwrap())
    }

    /// A courteous populator whose lead counts a chunk as slow after `lead_slow` of CPU.
    fn courteous(segment: &Arc<Segment>, lead_slow: Duration) -> Populator {
        let name = "populate-test";
        Populator::start_from(segment.clone(), name, 0, Pace::Courteous, lead_slow).unwrap()
    }

    /// Spinning threads at the walk's priority, one per CPU, until the returned flag is set;
    /// returns once the gauge sees every CPU wanted.
    fn spin_every_cpu() -> (Arc<AtomicBool>, Vec<JoinHandle<()>>) {
        let mut gauge = CpuGauge::new();
        let done = Arc::new(AtomicBool::new(false));
        let spinners: Vec<_> = (0..gauge.cpus)
            .map(|_| {
                let done = done.clone();
                std::thread::spawn(move || {
                    // At the walk's own priority: counted as running, yet sharing the CPU
                    // with it (and starving no other test).
                    lower_priority();
                    while !done.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !gauge.cpus_wanted() {
            assert!(
                Instant::now() < deadline,
                "the spinners never showed as running"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        (done, spinners)
    }

    /// Stops `p`, then the spinners of [`spin_every_cpu`]; what `p` did.
    fn stop_beside_spinners(
        p: Populator,
        done: &AtomicBool,
        spinners: Vec<JoinHandle<()>>,
    ) -> PopulateReport {
        let report = p.stop();
        done.store(true, Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        report
    }

    /// A populator that does not wait for free CPUs, so that what other tests run meanwhile
    /// does not slow the walk these tests check.
    fn eager(segment: &Arc<Segment>, head: Option<Head>) -> Populator {
        Populator::start_paced(segment.clone(), "populate-test", head, Pace::Eager).unwrap()
    }

    #[test]
    fn the_gauge_reads_the_running_threads() {
        let mut g = CpuGauge::new();
        assert!(g.cpus >= 1);
        assert!(
            g.others_running().is_some(),
            "/proc/loadavg is readable and parsed"
        );
        // Where the kernel reports CPU pressure, a share comes once a window has passed.
        if std::fs::read_to_string("/proc/pressure/cpu").is_ok() {
            assert_eq!(g.stalled_share(), None, "no window yet");
            std::thread::sleep(POPULATE_YIELD + Duration::from_millis(1));
            let share = g.stalled_share().expect("/proc/pressure/cpu parsed");
            assert!((0.0..=1.5).contains(&share), "{share}");
        }
    }

    /// With a spinning thread on every CPU, a courteous walk populates nothing; a page
    /// written where it would go next makes its lead leave that chunk to the put and populate
    /// [`POPULATE_AHEAD_BYTES`] past it, and no further while the CPUs stay wanted; a second
    /// one there, twice as far.
    #[test]
    fn a_courteous_walk_waits_for_a_free_cpu_and_its_lead_runs_ahead_of_puts() {
        let (done, spinners) = spin_every_cpu();
        let deadline = Instant::now() + Duration::from_secs(30);
        let seg = shared_segment(4 * POPULATE_AHEAD_BYTES);
        let p = courteous(&seg, Duration::MAX);
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            p.populated_bytes() <= 2 * POPULATE_CHUNK_BYTES,
            "walked {} bytes while every CPU was wanted",
            p.populated_bytes()
        );
        // A put's page in the chunk the walk takes next, and then, once the lead stopped
        // ahead of it, another.
        let mut written = Vec::new();
        for distance in [POPULATE_AHEAD_BYTES, 2 * POPULATE_AHEAD_BYTES] {
            std::thread::sleep(Duration::from_millis(300));
            let at = p.populated_bytes();
            // SAFETY: inside the live mapping; nobody else writes it.
            unsafe { seg.as_ptr().add(at + 4096).write_volatile(7) };
            written.push(at + 4096);
            while p.populated_bytes() < at + POPULATE_CHUNK_BYTES + distance {
                assert!(
                    Instant::now() < deadline,
                    "the lead never ran {distance} bytes ahead of the put at {at}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let report = stop_beside_spinners(p, &done, spinners);
        assert_eq!(report.overtaken_chunks, 2, "{report:?}");
        assert!(
            report.lead_chunks >= 3 * POPULATE_AHEAD_BYTES / POPULATE_CHUNK_BYTES,
            "{report:?}"
        );
        assert!(report.yielded > Duration::ZERO, "{report:?}");
        assert!(
            report.populated_bytes < seg.len(),
            "walked on past the lead while every CPU was wanted: {report:?}"
        );
        for &w in &written {
            // SAFETY: inside the live mapping; the populator is gone.
            assert_eq!(unsafe { seg.as_ptr().add(w).read() }, 7);
        }
        let end = report.populated_bytes.min(seg.len());
        let puts_chunk = |off: usize| {
            written
                .iter()
                .any(|&w| off / POPULATE_CHUNK_BYTES == w / POPULATE_CHUNK_BYTES)
        };
        let ahead_resident = (written[0] - 4096..end)
            .step_by(4096)
            .filter(|&off| !puts_chunk(off))
            .all(|off| seg.any_resident(off, 4096).unwrap());
        assert!(
            ahead_resident,
            "the lead populated every chunk it passed but the puts'"
        );
    }

    /// Where every chunk counts as slow, the lead populates two after the put and backs off,
    /// leaving the rest to the puts (and to the walk, once the CPUs are free).
    #[test]
    fn a_lead_slower_than_faults_leaves_the_puts_alone() {
        let (done, spinners) = spin_every_cpu();
        let seg = shared_segment(2 * POPULATE_AHEAD_BYTES);
        let p = courteous(&seg, Duration::ZERO);
        std::thread::sleep(Duration::from_millis(100));
        let at = p.populated_bytes();
        // SAFETY: inside the live mapping; nobody else writes it.
        unsafe { seg.as_ptr().add(at + 4096).write_volatile(7) };
        std::thread::sleep(Duration::from_millis(300));
        let report = stop_beside_spinners(p, &done, spinners);
        assert_eq!(report.overtaken_chunks, 1, "{report:?}");
        assert!(report.lead_backoffs >= 1, "{report:?}");
        assert!(
            report.lead_chunks < POPULATE_AHEAD_BYTES / POPULATE_CHUNK_BYTES,
            "ran ahead anyway: {report:?}"
        );
    }

    /// Pages of `segment` resident in the page cache (`mincore` over the whole mapping).
    fn resident_pages(segment: &Segment) -> usize {
        let page = crate::mem::segment::base_page_bytes();
        let mut vec = vec![0u8; segment.len() / page];
        // SAFETY: mincore reads no byte; the range is our live mapping and `vec` holds one
        // byte per page of it.
        let rc = unsafe { libc::mincore(segment.as_ptr().cast(), segment.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn populates_the_whole_segment_from_its_base_and_reports_it() {
        let len = 16 * HUGE_PAGE_BYTES + 3 * 4096;
        let seg = shared_segment(len);
        assert_eq!(resident_pages(&seg), 0, "a fresh memfd has no pages");
        let p = eager(&seg, None);
        let report = p.join();
        assert_eq!(report.populated_bytes, seg.len());
        assert_eq!(report.stopped, None);
        assert_eq!(report.huge_chunks + report.base_chunks, 17);
        assert_eq!(
            resident_pages(&seg),
            seg.len() / 4096,
            "every page populated"
        );
        println!("{report:?}");
        // SAFETY: inside the live mapping; no reference to it exists.
        unsafe {
            for off in (0..seg.len()).step_by(4096) {
                assert_eq!(seg.as_ptr().add(off).read(), 0, "populating wrote at {off}");
            }
        }
    }

    /// A chunk puts touched before the walk came to it is theirs: not populated, not
    /// collapsed (its other pages stay absent), and counted as overtaken.
    #[test]
    fn the_walk_leaves_a_chunk_puts_touched_first() {
        let seg = shared_segment(8 * HUGE_PAGE_BYTES);
        let put = 3 * HUGE_PAGE_BYTES + 8192;
        // SAFETY: inside the live mapping; nobody else writes it.
        unsafe { seg.as_ptr().add(put).write_volatile(9) };
        let report = eager(&seg, None).join();
        assert_eq!(report.overtaken_chunks, 1, "{report:?}");
        assert_eq!(report.huge_chunks + report.base_chunks, 7, "{report:?}");
        assert_eq!(report.populated_bytes, seg.len());
        assert_eq!(resident_pages(&seg), 7 * HUGE_PAGE_BYTES / 4096 + 1);
        // SAFETY: inside the live mapping; the populator is gone.
        assert_eq!(unsafe { seg.as_ptr().add(put).read() }, 9);
    }

    #[test]
    fn a_head_is_populated_before_start_returns_and_the_rest_after() {
        let seg = shared_segment(32 * HUGE_PAGE_BYTES);
        // A deadline already passed still populates one chunk in each thread, and what
        // start reports as the head is populated.
        let passed = Head {
            until: Instant::now(),
            threads: 3,
        };
        let p = eager(&seg, Some(passed));
        let head = p.populated_bytes();
        assert!(head >= HUGE_PAGE_BYTES, "{head}");
        assert!(resident_pages(&seg) >= head / 4096);
        let report = p.join();
        assert_eq!(report.populated_bytes, seg.len());
        assert_eq!(
            report.huge_chunks + report.base_chunks,
            (seg.len() - head) / HUGE_PAGE_BYTES
        );
        assert_eq!(resident_pages(&seg), seg.len() / 4096);
        let all = shared_segment(4 * HUGE_PAGE_BYTES);
        let later = Head {
            until: Instant::now() + Duration::from_secs(600),
            threads: 3,
        };
        let p = eager(&all, Some(later));
        assert!(p.done(), "the whole segment fits the budget");
        assert_eq!(p.join().populated_bytes, all.len());
    }

    #[test]
    fn a_stopped_populator_stops_between_chunks_and_drop_joins() {
        let seg = shared_segment(512 * HUGE_PAGE_BYTES);
        let p = Populator::start(seg.clone(), "populate-test").unwrap();
        let report = p.stop();
        assert!(report.populated_bytes.is_multiple_of(HUGE_PAGE_BYTES));
        assert!(report.populated_bytes < seg.len() || report.stopped.is_none());
        let dropped = Populator::start(seg.clone(), "populate-test").unwrap();
        drop(dropped);
        assert_eq!(
            Arc::strong_count(&seg),
            1,
            "the thread let go of the segment"
        );
    }

    /// Writers fill their own ranges with a new pattern on each pass, through a second
    /// mapping of the same memfd as a same-host client would, while the populator walks (and
    /// collapses) under them, and check after each pass through the segment's own mapping
    /// that every byte of the pass is there; the ranges nobody writes stay zero.
    #[test]
    fn nothing_written_is_lost_when_writes_race_the_populator() {
        const BLOCK: usize = 65536;
        let len = 64 * HUGE_PAGE_BYTES;
        let seg = shared_segment(len);
        let peer = crate::sys::mmap::mmap_shared(seg.shared_fd().unwrap(), len).unwrap();
        let peer_addr = peer.as_ptr() as usize;
        let p = eager(&seg, None);
        let writers: Vec<_> = (0..2usize)
            .map(|w| {
                let seg = seg.clone();
                std::thread::spawn(move || {
                    for pass in 0..8usize {
                        // Every fourth 64 KiB block from `w`: blocks 0 and 1 mod 4 are written.
                        let blocks = (w..len / BLOCK).step_by(4);
                        for i in blocks.clone() {
                            let byte = ((i + pass) % 251) as u8 + 1;
                            // SAFETY: inside the peer mapping; each writer owns its blocks.
                            unsafe {
                                std::ptr::write_bytes(
                                    (peer_addr + i * BLOCK) as *mut u8,
                                    byte,
                                    BLOCK,
                                )
                            };
                        }
                        for i in blocks {
                            let want = ((i + pass) % 251) as u8 + 1;
                            for off in [0, 4095, 4096, BLOCK - 1] {
                                // SAFETY: inside the segment's live mapping.
                                let got = unsafe { seg.as_ptr().add(i * BLOCK + off).read() };
                                assert_eq!(got, want, "pass {pass}, byte {off} of block {i}");
                            }
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        let report = p.join();
        assert_eq!(report.populated_bytes, len);
        for i in (0..len / BLOCK).filter(|i| i % 4 >= 2) {
            // SAFETY: inside the live mapping; the writers are done.
            let got = unsafe { seg.as_ptr().add(i * BLOCK).read() };
            assert_eq!(got, 0, "block {i}");
        }
        // SAFETY: the mapping made above, unmapped once.
        unsafe { libc::munmap(peer.as_ptr().cast(), len) };
        println!("{report:?}");
    }

    #[test]
    fn populate_refuses_ranges_outside_the_segment() {
        let seg = shared_segment(2 * HUGE_PAGE_BYTES);
        for (off, len) in [(0, 3 * HUGE_PAGE_BYTES), (1, 4096), (usize::MAX, 2)] {
            let e = seg.populate(off, len).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        }
        assert!(seg.populate(HUGE_PAGE_BYTES, 4096).is_ok());
    }
}
