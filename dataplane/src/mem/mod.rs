//! Local memory of the data plane.
//!
//! - [`Segment`]: one anonymous mapping (2 MiB `MAP_HUGETLB` pages, transparent hugepages, or
//!   plain pages), sized to a whole number of its pages and unmapped on drop.
//!   [`Segment::new_shared`] backs one with a memfd instead, which [`shm`] offers to other
//!   processes on the same host so that they read and write it with memcpy.
//! - [`populate`]: [`Populator`], a low-priority thread that faults a serving segment's pages
//!   in (as transparent hugepages where the kernel collapses them) from its base upwards, so
//!   that the first puts into a fresh node do not run at the page-fault rate.
//! - [`file`]: the checks a path from outside passes before its file is mapped shared (a
//!   regular file of ours in `/dev/shm` or a directory of `MC_MOUNT_FILE_DIRS`, no link).
//! - [`Registry`]: the table of registered buffers. A remote access is served only when its
//!   whole range lies inside one registered buffer.
//! - [`Catalog`]: which committed object (key, length, pin) starts at which address of a
//!   served table, kept for re-reporting to a restarted master (`docs/recovery.md`).
//! - [`Fence`]: the term of the master a served table's writes must belong to; writes of
//!   earlier terms (catalog records, and the WRITEs of connections that declared one) are
//!   refused (`docs/ha.md`, "Late writes of an earlier term").
//! - [`inflight`]: the write pages on which memcpy writes (our own, a same-host importer's)
//!   hold a slot while they copy, so that raising the fence refuses those of earlier terms
//!   and waits for the ones already under way.
//! - [`served`]: [`served::ServedMemory`], the registered memory a process serves (with its
//!   catalog and the gates of the io_uring shards), and the settings and counters of the
//!   servers serving it.
//! - [`bytes`]: [`Src`] and [`Dst`], byte ranges a transfer reads or writes as a pointer and
//!   a length, never as a Rust slice (caller memory others may touch meanwhile).
//! - [`copier`]: large copies shared with helper threads (a same-host put's or get's bytes).
//! - [`SlabAllocator`]: O(1) size-class allocation of offsets inside a region, for local
//!   buffers and staging space.

pub mod copier;
pub mod file;
pub mod populate;
pub mod registry;
pub mod segment;
pub mod served;
pub mod shm;
pub mod slab;

pub use crate::sys::bytes::{Dst, Src};
pub use populate::{Head, Pace, PopulateReport, Populator};
pub use registry::Registry;
pub use segment::{HugepagePolicy, Segment, SegmentKind, SegmentOptions};
pub use shm::{ShmExport, ShmMapping};
pub use slab::{SlabAllocator, SlabBlock, SlabError};
