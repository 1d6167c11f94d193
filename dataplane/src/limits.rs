//! Named maxima and sizes of the data plane. Every pool, buffer and decoder bound lives here;
//! relationships between them are asserted at compile time.

use std::time::Duration;

/// Size of a 2 MiB huge page (`MAP_HUGETLB` default size on x86-64 and aarch64).
pub const HUGE_PAGE_BYTES: usize = 2 * 1024 * 1024;

/// Largest payload one data-plane request may carry. A header announcing more is malformed:
/// the server refuses it without reading further. Larger transfers are split by the caller.
pub const REQUEST_PAYLOAD_MAX_BYTES: u64 = 1 << 30;

/// Fixed part of a `CATALOG_PUT` record (object length, flags, reserved); the key follows.
pub const CATALOG_RECORD_HEADER_BYTES: usize = 16;
/// The version (term u64, seq u64) a record carries after its fixed part when its
/// `VERSIONED` flag is set.
pub const CATALOG_RECORD_VERSION_BYTES: usize = 16;
/// The soft pin's ttl (u64 milliseconds) a record carries after its version when its
/// `SOFT_PIN` flag is set.
pub const CATALOG_RECORD_SOFT_PIN_BYTES: usize = 8;
/// Largest `CATALOG_PUT` payload: the fixed part, a version, a soft pin's ttl, a commit's
/// provisional version and the longest key the master accepts. A header announcing more is
/// malformed.
pub const CATALOG_RECORD_MAX_BYTES: u64 = (CATALOG_RECORD_HEADER_BYTES
    + 2 * CATALOG_RECORD_VERSION_BYTES
    + CATALOG_RECORD_SOFT_PIN_BYTES
    + protocol::limits::KEY_MAX_BYTES) as u64;
/// Bytes of a same-host importer's announcement ring (`mem::shm::ring`): room for a few
/// hundred puts' intents and records between two reads by the owner, and for three of the
/// largest announcement (a record of the longest key) at once.
pub const SHM_RING_BYTES: usize = 256 << 10;
/// Bytes before a ring's data: its head and its tail, each on its own cache line.
pub const SHM_RING_HEADER_BYTES: usize = 128;
/// Bytes of a ring's memfd.
pub const SHM_RING_MEMFD_BYTES: usize = SHM_RING_HEADER_BYTES + SHM_RING_BYTES;
/// How long a writer sleeps between looks at a full ring (after waking its reader).
pub const SHM_RING_FULL_WAIT: Duration = Duration::from_micros(50);
/// Tombstones (removed keys with the version removed) one catalog keeps; beyond it the oldest
/// version is dropped (`docs/ha.md`, "windows").
pub const CATALOG_TOMBSTONES_MAX: usize = 1 << 16;

/// Largest range of a file one `mount_segment(path, size, offset)` maps
/// (`mem::Segment::map_file`): 1 TiB, above any host's memory today, so that a size from a
/// caller cannot ask for an absurd mapping of a sparse file.
pub const MAPPED_FILE_MAX_BYTES: u64 = 1 << 40;

/// Chunk used to drain and discard the payload of a rejected WRITE.
pub const DRAIN_CHUNK_BYTES: usize = 64 * 1024;

/// Connections one io_uring shard serves at once; further connections are closed on accept.
/// An idle connection costs the shard one pending header receive (a few hundred bytes), so it
/// can hold many: 10k idle peers must not lock a well-behaved client out.
pub const SERVER_CONNECTIONS_MAX: usize = 16 * 1024;
/// Connections the blocking fallback serves at once: it spends a thread per connection, so it
/// stays far below the shard's limit whatever `ServerConfig::max_connections` says.
pub const BLOCKING_CONNECTIONS_MAX: usize = 1024;

/// Largest number of lanes (connections) a client keeps per peer (upstream's
/// `MC_TCP_LANES_PER_PEER` maximum).
pub const CLIENT_LANES_MAX: usize = 16;
/// Default lanes per peer (upstream's `MC_TCP_LANES_PER_PEER` default).
pub const CLIENT_LANES_DEFAULT: usize = 4;

/// Requests one client lane keeps in flight (sent, response not yet received). Bounds the
/// responses a server queues for one connection and the `iovec`s of one `sendmsg` (two per
/// request).
pub const CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX: usize = 64;

/// Largest number of requests in one batch submission (upstream's per-peer queue limit).
pub const BATCH_REQUESTS_MAX: usize = 1024;

/// Socket send and receive buffer size asked of the kernel (it may clamp to `wmem_max`).
pub const SOCKET_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// Default bound on one blocking socket operation (upstream's `MC_TCP_STATUS_TIMEOUT_SEC`).
pub const IO_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default bound on establishing one connection.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// An io_uring shard's event-loop iteration whose work (not its wait) takes longer than this
/// counts as a stall.
pub const LOOP_STALL_THRESHOLD: Duration = Duration::from_millis(1);
/// Longest an io_uring shard sleeps in the kernel before checking I/O timeouts.
pub const SHARD_TICK: Duration = Duration::from_millis(50);
/// Submission-queue entries of a shard's ring; the completion queue has twice as many.
/// Every operation has at most one entry queued, so this bounds nothing but batching.
pub const SHARD_RING_ENTRIES: u32 = 1024;
/// Responses a shard coalesces into one `sendmsg` (two iovecs each, below `UIO_MAXIOV`).
pub const SEND_BATCH_RESPONSES_MAX: usize = 64;
/// Bytes a shard puts into one `sendmsg` (the completion's result is an `i32`).
pub const SEND_BATCH_BYTES_MAX: u64 = REQUEST_PAYLOAD_MAX_BYTES + RESPONSE_HEADER_BYTES_U64;
/// Responses queued on one connection before the shard stops reading its requests until
/// the peer reads some (backpressure against a slow reader).
pub const CONN_RESPONSES_QUEUED_MAX: usize = 1024;
/// Largest single receive of WRITE payload: progress is seen (for the I/O timeout) at least
/// this often.
pub const PAYLOAD_RECV_CHUNK_BYTES: u64 = 4 * 1024 * 1024;
/// Longest a stopping shard waits for its in-flight operations to complete.
pub const SHARD_STOP_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// READ responses whose batch carries at least this many payload bytes go out with
/// `IORING_OP_SENDMSG_ZC` (`u64::MAX`: never). See `bench/README.md` for the measurement.
pub const SEND_ZC_MIN_BYTES_DEFAULT: u64 = u64::MAX;

const RESPONSE_HEADER_BYTES_U64: u64 = 24;

/// Bytes a segment's background populator (`mem::populate`) faults in (and collapses into a
/// transparent hugepage) at a time, publishing its progress after each: one huge page.
pub const POPULATE_CHUNK_BYTES: usize = HUGE_PAGE_BYTES;

/// How far past the last chunk puts touched the populator's lead populates the first time
/// they reach its walk (`mem::populate`; twice the last distance each time after): 32 chunks,
/// at this VM's 10 GB/s of same-host puts 6 ms of writing, three of the lead's looks.
pub const POPULATE_AHEAD_BYTES: usize = 32 * POPULATE_CHUNK_BYTES;

/// How long the background populator waits before it looks again when the CPUs are wanted
/// (`mem::populate`), and the shortest time over which it measures whether they are: the
/// kernel's CPU pressure moves in steps of a few milliseconds (looks 1 ms apart read 0 nine
/// times in ten while a thread waited 40% of the time).
pub const POPULATE_YIELD: std::time::Duration = std::time::Duration::from_millis(10);

/// How often the populator's lead looks whether puts reached the walk: one `mincore` of a
/// chunk, 5 µs on this VM when nothing is resident (0.25% of a CPU while the walk lasts).
pub const POPULATE_LEAD_LOOK: std::time::Duration = std::time::Duration::from_millis(2);

/// A chunk that takes the populator's lead more CPU than this was populated slower than puts
/// fault (2 GB/s): on this VM a chunk takes 0.2-0.4 ms where the host has backed the memory
/// and 3-6 ms where it backs it on first touch, and a same-host client's faulting puts write
/// 1.5-2 GB/s.
pub const POPULATE_LEAD_SLOW: std::time::Duration = std::time::Duration::from_millis(1);

/// How long the populator's lead leaves puts alone after a chunk slower than
/// [`POPULATE_LEAD_SLOW`].
pub const POPULATE_LEAD_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// Looks in a row, [`POPULATE_YIELD`] apart, that must find the CPUs free before the
/// background populator walks again after it found them wanted: a client calling the master
/// back to back is off the CPU for moments too (waiting for an answer).
pub const POPULATE_QUIET_LOOKS: u32 = 2;

/// Most threads that populate a segment's head before the node reports ready
/// ([`crate::mem::populate`]): on this project's 2-core VM two threads populate 9.4-10.3 GB/s
/// where one does 4.4-6.6, so a start's budget covers twice the head. A bound on what one
/// shard's start takes, not a measured optimum (larger machines were not measured).
pub const POPULATE_HEAD_THREADS_MAX: usize = 8;

/// Bytes of one slab: the unit the slab allocator hands to a size class. One huge page, so a
/// slab never straddles two huge pages of a segment.
pub const SLAB_BYTES: usize = HUGE_PAGE_BYTES;
/// Smallest slab size class.
pub const SLAB_CLASS_MIN_BYTES: usize = 256;
/// Number of size classes: powers of two from `SLAB_CLASS_MIN_BYTES` to `SLAB_BYTES`.
pub const SLAB_CLASS_COUNT: usize =
    (SLAB_BYTES.trailing_zeros() - SLAB_CLASS_MIN_BYTES.trailing_zeros() + 1) as usize;

/// Pause after a failed `accept` (EMFILE, ENFILE, ENOBUFS persist for a while) before trying
/// again: both servers, blocking (`server::acceptor`) and io_uring (`shard::reactor`).
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// Bytes of a transfer engine's same-host registration table (`engine::samehost`), a memfd.
pub const SAME_HOST_TABLE_BYTES: usize = 64 << 10;
/// Reader engines one same-host registration table serves at once; later ones use TCP.
pub const SAME_HOST_READERS_MAX: usize = 64;
/// Registered buffers a same-host registration table holds: what is left of its words after
/// the 8-word header and two words per reader slot, two words per buffer. An engine with
/// more is reached over TCP.
pub const SAME_HOST_TABLE_ENTRIES_MAX: usize =
    (SAME_HOST_TABLE_BYTES / 8 - 8 - 2 * SAME_HOST_READERS_MAX) / 2;
/// How long a same-host reader retries a table its owner is rewriting before it gives the
/// peer up (the owner died mid-rewrite).
pub const SAME_HOST_SEQ_WAIT: Duration = Duration::from_secs(1);
/// Pause between two looks at the reader slots while an unregister waits for same-host copies.
pub const SAME_HOST_BUSY_POLL_INTERVAL: Duration = Duration::from_micros(20);

const _: () = assert!(HUGE_PAGE_BYTES.is_power_of_two());
const _: () = assert!(MAPPED_FILE_MAX_BYTES.is_multiple_of(HUGE_PAGE_BYTES as u64));
const _: () = assert!(MAPPED_FILE_MAX_BYTES <= isize::MAX as u64);
const _: () = assert!(CATALOG_RECORD_MAX_BYTES <= REQUEST_PAYLOAD_MAX_BYTES);
const _: () = assert!(CATALOG_RECORD_MAX_BYTES <= u32::MAX as u64);
const _: () = assert!(SLAB_BYTES.is_power_of_two() && SLAB_CLASS_MIN_BYTES.is_power_of_two());
const _: () = assert!(SLAB_BYTES.is_multiple_of(HUGE_PAGE_BYTES));
const _: () = assert!(POPULATE_CHUNK_BYTES == HUGE_PAGE_BYTES);
const _: () = assert!(SLAB_CLASS_MIN_BYTES <= SLAB_BYTES);
const _: () = assert!(SLAB_CLASS_COUNT <= u8::MAX as usize);
const _: () = assert!(CLIENT_LANES_DEFAULT <= CLIENT_LANES_MAX);
const _: () = assert!(CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX >= 1);
const _: () = assert!(CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX * 2 <= 1024); // UIO_MAXIOV
const _: () = assert!(CLIENT_LANE_REQUESTS_IN_FLIGHT_MAX <= CONN_RESPONSES_QUEUED_MAX);
const _: () = assert!(REQUEST_PAYLOAD_MAX_BYTES <= isize::MAX as u64);
const _: () = assert!(DRAIN_CHUNK_BYTES as u64 <= REQUEST_PAYLOAD_MAX_BYTES);
const _: () = assert!(SEND_BATCH_RESPONSES_MAX * 2 <= 1024); // UIO_MAXIOV
const _: () = assert!(SEND_BATCH_BYTES_MAX <= i32::MAX as u64);
const _: () = assert!(PAYLOAD_RECV_CHUNK_BYTES <= u32::MAX as u64);
const _: () = assert!(DRAIN_CHUNK_BYTES as u64 <= u32::MAX as u64);
const _: () = assert!(SHARD_RING_ENTRIES.is_power_of_two());
const _: () = assert!(SHM_RING_BYTES as u64 >= 3 * (16 + CATALOG_RECORD_MAX_BYTES));
const _: () = assert!(CONN_RESPONSES_QUEUED_MAX >= SEND_BATCH_RESPONSES_MAX);
