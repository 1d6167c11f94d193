//! Named maxima of the control protocol. Every pool, buffer and decoder bound lives here.

/// Largest control frame (header excluded) a peer may send. Bounds the memory one frame costs.
pub const FRAME_PAYLOAD_MAX_BYTES: usize = 64 * 1024 * 1024;
/// Largest key accepted by the master. Upstream has no explicit bound; 1 MiB keys must be
/// refused cleanly rather than crash anything.
pub const KEY_MAX_BYTES: usize = 64 * 1024;
/// Longest tenant name (`tenant_id`).
pub const TENANT_MAX_BYTES: usize = 4096;
/// Largest number of items in one batch request.
pub const BATCH_MAX_ITEMS: usize = 1 << 20;
/// Largest decoded string (segment names, endpoints, patterns).
pub const STRING_MAX_BYTES: usize = 1024 * 1024;
/// Most freed ranges one `PingResponse` carries (16 bytes each); the rest wait for the next
/// ping.
pub const PING_FREED_RANGES_MAX: usize = 64 * 1024;
/// Freed ranges the master keeps per segment for its owner's next pings. Beyond it the
/// oldest are dropped: their catalog entries stay until the range is reused (see
/// `docs/recovery.md`, "windows").
pub const FREED_OUTBOX_MAX: usize = 1 << 20;
/// Most tasks one `FetchTasks` hands out; the rest wait for the executor's next fetch.
pub const TASKS_PER_FETCH_MAX: usize = 16;
/// Most targets of one copy task (upstream's copy names a handful of segments).
pub const TASK_TARGETS_MAX: usize = 64;

/// Largest put committed in one round trip (`ReservePut`): small puts are the ones whose
/// time is the master's round trips (a larger one's is its copy, and takes the two-call
/// path); with [`RESERVATIONS_PER_CLIENT_MAX`] it bounds what one client holds reserved at
/// 16 MiB.
pub const RESERVED_PUT_MAX_BYTES: u64 = 256 << 10;
/// Most reservations one client holds at once (one per size it puts, and one per put of that
/// size in flight at the same time).
pub const RESERVATIONS_PER_CLIENT_MAX: usize = 64;
/// How long after asking for a reservation its client may still write into it; the master
/// keeps it twice as long, then parks its range until `put_start_release_timeout` after it
/// was made. Long enough that a client putting a size every few seconds keeps reusing its
/// ranges rather than leaving one parked per put.
pub const RESERVATION_USE_MS: u64 = 30_000;

const _: () = assert!(KEY_MAX_BYTES <= STRING_MAX_BYTES);
const _: () = assert!(PING_FREED_RANGES_MAX * 16 < FRAME_PAYLOAD_MAX_BYTES);
const _: () = assert!(PING_FREED_RANGES_MAX <= FREED_OUTBOX_MAX);
const _: () = assert!(STRING_MAX_BYTES <= FRAME_PAYLOAD_MAX_BYTES);

/// How deep `--flagfile` may nest (a file naming a file ...) before it is taken for a loop.
pub const FLAGFILE_LEVELS_MAX: usize = 8;
