//! The disk tier's bounds, in one place.

use std::time::Duration;

/// The block every file offset and length is a multiple of (`O_DIRECT` alignment; also the
/// alignment of the bounce buffers).
pub const DISK_BLOCK_BYTES: usize = 4096;
/// One bounce buffer: the largest piece of a file one I/O moves.
pub const DISK_BOUNCE_BYTES: usize = 1 << 20;
/// Bounce buffers per worker: the reads or writes of one object a worker keeps in flight.
pub const DISK_WORKER_BUFFERS: usize = 4;
/// The pieces a streamed read (the listener's) is read in: a quarter of a bounce buffer, so
/// the first pieces of an object go out on the network while the next are read from disk.
pub const DISK_STREAM_PIECE_BYTES: usize = DISK_BOUNCE_BYTES / 4;
/// The tail of a streamed READ held back until the whole object's checksum has passed: a
/// reader never receives all the bytes of an object that fails it.
pub const DISK_STREAM_HOLD_BYTES: u64 = DISK_BLOCK_BYTES as u64;
/// Entries of a worker's ring: room for every buffer's operation, and for the window of a
/// read or write straight to or from the caller's memory.
pub const DISK_RING_ENTRIES: u32 = 16;
/// The pieces an object is moved in straight to or from the caller's memory (no bounce
/// buffer), all in flight at once up to [`DISK_DIRECT_WINDOW`]: a 4 MiB object is eight
/// operations the device works on together, as one large `O_DIRECT` read is split by the
/// block layer.
pub const DISK_DIRECT_PIECE_BYTES: usize = 512 << 10;
/// Operations of one object in flight at once on the direct path (its header and tail
/// blocks included).
pub const DISK_DIRECT_WINDOW: usize = 12;
/// A ring whose `io_uring_enter` keeps failing this long, with operations on a caller's
/// memory in flight, aborts the process (that memory cannot be handed back while the kernel
/// may still write it). Never seen; a healthy ring fails only with EINTR/EBUSY, retried.
pub const DISK_RING_STUCK_AFTER: Duration = Duration::from_secs(30);
/// The nice value a worker runs offload writes at (`priority`): below the puts and reads a
/// user waits for, above nothing else.
pub const DISK_WRITE_NICE: i32 = 10;
/// Most I/O workers, whatever the configuration asks.
pub const DISK_WORKERS_MAX: usize = 64;
/// Default I/O workers: the available cores, at most this many.
pub const DISK_WORKERS_DEFAULT_MAX: usize = 4;
/// Requests queued to one worker before a caller waits to queue.
pub const DISK_WORKER_QUEUE_MAX: usize = 256;
/// After writes stopped (a full disk, an I/O error), a refused write probes whether the disk
/// recovered at most this often.
pub const DISK_STOPPED_PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// Connections the disk listener serves at once (one thread each); more are closed.
pub const DISK_LISTENER_CONNECTIONS_MAX: usize = 64;
/// A connection without progress for this long is closed (as the data-plane server's).
pub const DISK_LISTENER_IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of a refused WRITE's payload read per step while it is drained.
pub const DISK_DRAIN_CHUNK_BYTES: usize = 64 * 1024;
/// A connection keeps its READ buffer for the next request up to this size (a larger one
/// is freed after its answer).
pub const DISK_LISTENER_KEPT_BUFFER_BYTES: usize = 64 << 20;
/// How often an owner with a disk asks the master for offload tasks when its last fetch was
/// empty (an owner without one asks once per ping). Offload must keep pace with puts: an
/// object waiting for its disk copy holds its memory, so a second between fetches would hold
/// a second of puts in memory.
pub const DISK_OFFLOAD_FETCH_INTERVAL: Duration = Duration::from_millis(50);
/// Largest READ the listener answers (one object is read whole into a buffer first).
pub const DISK_LISTENER_READ_MAX_BYTES: u64 = dataplane::limits::REQUEST_PAYLOAD_MAX_BYTES;

const _: () = assert!(DISK_BOUNCE_BYTES.is_multiple_of(DISK_BLOCK_BYTES));
const _: () = assert!(DISK_STREAM_PIECE_BYTES.is_multiple_of(DISK_BLOCK_BYTES));
const _: () = assert!(DISK_RING_ENTRIES as usize >= DISK_WORKER_BUFFERS);
const _: () = assert!(DISK_DIRECT_WINDOW <= DISK_RING_ENTRIES as usize);
const _: () = assert!(DISK_DIRECT_PIECE_BYTES.is_multiple_of(DISK_BLOCK_BYTES));
const _: () = assert!(DISK_WORKERS_DEFAULT_MAX <= DISK_WORKERS_MAX);
// The largest header (64 bytes and the longest key, rounded up) fits in one bounce buffer,
// so the first buffer of a read always holds the whole header.
const _: () = assert!(64 + protocol::limits::KEY_MAX_BYTES + DISK_BLOCK_BYTES <= DISK_BOUNCE_BYTES);
// The same for the first piece of a streamed read.
const _: () =
    assert!(64 + protocol::limits::KEY_MAX_BYTES + DISK_BLOCK_BYTES <= DISK_STREAM_PIECE_BYTES);

/// Objects when `MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT` is unset.
pub const DEFAULT_KEYS_LIMIT: u64 = 10_000_000;

/// Logical bytes when `MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES` is unset: 2 TiB.
pub const DEFAULT_SIZE_LIMIT_BYTES: u64 = 2 << 40;

/// Bytes of the scratch copy the crc of caller memory is taken through: small enough to stay
/// in the core's cache.
pub const CRC_SCRATCH_BYTES: usize = 32 << 10;

/// Below this many bytes the crc of caller memory goes through the scratch copy rather than
/// the in-place fold (`crc`), whose setup is not worth it.
pub const CRC_FOLD_MIN_BYTES: usize = 256;
/// Same-host readers an owner shares its directory with at once (`super::share`); more are
/// refused and read through the listener.
pub const DISK_SHARE_READERS_MAX: usize = 256;
/// How long a same-host reader waits for the owner's directory offer.
pub const DISK_SHARE_OFFER_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the share's thread checks whether it should stop and which readers left.
pub const DISK_SHARE_POLL_MS: i32 = 200;
/// Largest object a same-host reader reads through its own aligned buffer (a read that is
/// not of a whole object into block-aligned memory); a larger one goes through the
/// listener. The buffer is kept for the next read.
pub const DISK_SHARE_SCRATCH_MAX_BYTES: u64 = 64 << 20;
/// Bytes of a directory offer (`super::share`, where its format is drawn): fixed.
pub const DIR_OFFER_BYTES: usize = 16;
