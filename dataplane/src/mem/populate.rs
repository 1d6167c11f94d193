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
//! How: the caller may populate a head of the segment itself before it reports ready, within
//! a time budget ([`Populator::start_with_head`]; the node allows 1 s per 16 GiB of segment),
//! so that the first puts, which come at once, find their pages ready even on a busy host.
//! Then one thread per segment, at `SCHED_IDLE` (it runs only when a core has nothing else to
//! do, so a put never waits for it), walks the segment from its base upwards in 2 MiB chunks
//! ([`POPULATE_CHUNK_BYTES`]) and publishes how far it got ([`Populator::populated_bytes`]).
//! The base upwards is the order the master's allocator fills a fresh segment in (best fit
//! from its one free extent takes the extent's lowest bytes, `controlplane::alloc::extent`),
//! so the populated range is the one the next puts land in; freed ranges are reused first
//! (best fit prefers the smallest hole), and they were populated by the puts that wrote them.
//! A put that outruns the populator is not refused or delayed: it takes the faults itself,
//! as without a populator, and the populator later finds those pages present.
//!
//! Invariants: the populator never changes a byte of the segment ([`Segment::populate`] only
//! faults pages in and collapses them, both content-preserving under concurrent writers), so
//! it may run while peers read and write; it touches nothing outside the segment, which
//! stays mapped while the thread runs (it holds an `Arc`); dropping the [`Populator`] stops
//! the thread after its current chunk and joins it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::limits::POPULATE_CHUNK_BYTES;
use crate::mem::Segment;

/// What the populator did, once it finished (or stopped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PopulateReport {
    /// Bytes from the base of the segment that are populated.
    pub populated_bytes: usize,
    /// Chunks that became one hugepage each.
    pub huge_chunks: usize,
    /// Chunks populated with base pages (the kernel refused the collapse).
    pub base_chunks: usize,
    /// Time from start to the end of the walk.
    pub took: Duration,
    /// Why it stopped before the end: asked to, or the kernel cannot populate.
    pub stopped: Option<&'static str>,
}

struct Shared {
    stop: AtomicBool,
    populated: AtomicUsize,
}

/// A running populator over one segment; see the module docs.
pub struct Populator {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<PopulateReport>>,
    len: usize,
}

impl Populator {
    /// Starts populating `segment` from its base in a thread named `name` at `SCHED_IDLE`.
    pub fn start(segment: Arc<Segment>, name: &str) -> std::io::Result<Populator> {
        Self::start_from(segment, name, 0)
    }

    /// Populates the head of `segment` in the calling thread until `deadline` (at least one
    /// chunk), then the rest in the background as [`Self::start`] does: the part a fresh
    /// node's first puts land in is ready before the node says it is, at a bounded cost to
    /// its start.
    pub fn start_with_head(
        segment: Arc<Segment>,
        name: &str,
        deadline: Instant,
    ) -> std::io::Result<Populator> {
        let mut offset = 0;
        while offset < segment.len() {
            let len = POPULATE_CHUNK_BYTES.min(segment.len() - offset);
            if segment.populate(offset, len).is_err() {
                break;
            }
            offset += len;
            if Instant::now() >= deadline {
                break;
            }
        }
        Self::start_from(segment, name, offset)
    }

    /// [`Self::start`] from byte `from` (a multiple of [`POPULATE_CHUNK_BYTES`], or the end):
    /// the bytes below it are populated already.
    fn start_from(segment: Arc<Segment>, name: &str, from: usize) -> std::io::Result<Populator> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            populated: AtomicUsize::new(from),
        });
        let len = segment.len();
        let inner = shared.clone();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                lower_priority();
                let report = walk(&segment, &inner);
                tracing::info!(
                    "segment at {:#x}: {} of {} bytes populated in {:?} ({} hugepages, {} \
                     chunks of base pages){}",
                    segment.addr(),
                    report.populated_bytes,
                    segment.len(),
                    report.took,
                    report.huge_chunks,
                    report.base_chunks,
                    report
                        .stopped
                        .map(|why| format!(", stopped: {why}"))
                        .unwrap_or_default()
                );
                report
            })?;
        Ok(Populator {
            shared,
            thread: Some(thread),
            len,
        })
    }

    /// Bytes from the segment's base populated so far (a chunk counts once done).
    pub fn populated_bytes(&self) -> usize {
        self.shared.populated.load(Ordering::Acquire)
    }

    /// Whether the whole segment is populated.
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

/// The populator's walk: every chunk from the base up, publishing progress after each.
fn walk(segment: &Segment, shared: &Shared) -> PopulateReport {
    let started = Instant::now();
    let mut report = PopulateReport::default();
    let mut offset = shared.populated.load(Ordering::Acquire);
    while offset < segment.len() {
        if shared.stop.load(Ordering::Acquire) {
            report.stopped = Some("stopped");
            break;
        }
        let len = POPULATE_CHUNK_BYTES.min(segment.len() - offset);
        match segment.populate(offset, len) {
            Ok(true) => report.huge_chunks += 1,
            Ok(false) => report.base_chunks += 1,
            Err(e) => {
                tracing::warn!("segment populator stopped at byte {offset}: {e}");
                report.stopped = Some("the kernel cannot populate (MADV_POPULATE_WRITE)");
                break;
            }
        }
        offset += len;
        shared.populated.store(offset, Ordering::Release);
    }
    report.populated_bytes = offset;
    report.took = started.elapsed();
    report
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
        let p = Populator::start(seg.clone(), "populate-test").unwrap();
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

    #[test]
    fn a_head_is_populated_before_start_returns_and_the_rest_after() {
        let seg = shared_segment(32 * HUGE_PAGE_BYTES);
        // A deadline already passed still populates one chunk.
        let p = Populator::start_with_head(seg.clone(), "populate-test", Instant::now()).unwrap();
        let head = p.populated_bytes();
        assert!(head >= HUGE_PAGE_BYTES, "{head}");
        let report = p.join();
        assert_eq!(report.populated_bytes, seg.len());
        assert_eq!(
            report.huge_chunks + report.base_chunks,
            (seg.len() - head) / HUGE_PAGE_BYTES
        );
        assert_eq!(resident_pages(&seg), seg.len() / 4096);
        let all = shared_segment(4 * HUGE_PAGE_BYTES);
        let later = Instant::now() + Duration::from_secs(600);
        let p = Populator::start_with_head(all.clone(), "populate-test", later).unwrap();
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
        let p = Populator::start(seg.clone(), "populate-test").unwrap();
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
