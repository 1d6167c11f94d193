//! The master's numeric limits that bound what a peer can make it hold, in one place
//! (docs/STYLE.md: limits live in `limits.rs`, units in their names).

use std::time::Duration;

/// Connections the admin and metadata HTTP servers hold open at once, each server on its own.
/// A connection past the cap is closed at once (the RPC port, which shares the process's file
/// descriptors, keeps its own budget). Prometheus, a browser and a few tools need a handful.
pub const HTTP_MAX_CONNECTIONS: usize = 1024;

/// Time a client has to send a request's head, counted from the connection's start or from the
/// end of the previous response (hyper's header read timeout, so an idle keep-alive connection
/// is also closed after it). A half-sent request cannot hold a connection past it.
pub const HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a request has from its head to its answer, body included: a trickled body ends in
/// 408 and the connection closes.
pub const HTTP_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Time a control-RPC frame has to arrive whole once the master waits for its rest: at least
/// this, and longer for a frame its header says is large ([`RPC_FRAME_MIN_BYTES_PER_S`]). A
/// connection that leaves a frame half-sent past it is closed, so a stranger cannot hold a
/// 64 MiB buffer with a trickle. Between frames a connection may stay silent as long as it
/// likes: clients keep idle connections to the master.
pub const RPC_FRAME_TIMEOUT_MIN: Duration = Duration::from_secs(5);

/// The slowest rate a frame may arrive at, once past [`RPC_FRAME_TIMEOUT_MIN`]: a frame of
/// `n` bytes has `max(RPC_FRAME_TIMEOUT_MIN, n / RPC_FRAME_MIN_BYTES_PER_S)` (64 s for the
/// largest, 64 MiB).
pub const RPC_FRAME_MIN_BYTES_PER_S: u64 = 1024 * 1024;

const _: () = assert!(RPC_FRAME_MIN_BYTES_PER_S > 0);

/// Events the KV-cache event publisher encodes into one message (`events/`): a burst larger
/// than this goes out as several batches.
pub const KV_EVENT_BATCH_EVENTS_MAX: usize = 1024;

/// The most events `--kv_events_queue_capacity` may ask the queue to hold (about 100 bytes
/// and a key each): past it a stalled publisher could hold gigabytes of the master's memory.
pub const KV_EVENT_QUEUE_EVENTS_MAX: u32 = 1 << 24;

/// Messages (batches) the PUB socket queues for one slow subscriber before it drops for that
/// subscriber (ZeroMQ's send high-water mark): at most the queue's worth of events.
pub const KV_EVENT_SOCKET_BATCHES_MAX: i32 = 1 << 16;

/// How long closing the PUB socket waits for queued messages to leave (ZeroMQ's linger).
pub const KV_EVENT_SOCKET_LINGER: Duration = Duration::from_millis(100);

/// How often the KV-cache event publisher looks at its queue when it found it empty: the
/// most an event waits before it is sent, and the wake-ups of an idle master's publisher.
/// Measured with `master_bench --kv_events_ab` on 2 cores: 1 ms cost the saturated put path
/// 7 points more than 5 ms (a wake-up per millisecond taking a core from the service); 10
/// and 20 ms were no better than 5.
pub const KV_EVENT_POLL_INTERVAL: Duration = Duration::from_millis(5);

// High availability (`ha/mod.rs`, `docs/ha.md`).

/// The longest a leader serves on one proof (`ha::HaState::prove`): a keep-alive answered at
/// `sent` lets it serve until `sent + SERVE_WINDOW - ha::SAFETY_MARGIN`, however long etcd
/// extended the lease. A new leader serves only `SERVE_WINDOW` after its election, so a
/// predecessor whose lease a standby revoked (it took it for dead) has stopped by then, dead
/// or not.
pub const SERVE_WINDOW: Duration = Duration::from_millis(600);

/// How often the leader keeps its lease alive (more often for a lease TTL under 600 ms × 4).
pub const KEEPALIVE_EVERY: Duration = Duration::from_millis(150);

/// Bound of one probe of the leader's RPC port by a standby (a TCP connect, answered by the
/// leader's kernel).
pub const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// Refused probes in a row after which a standby takes the leader for dead.
pub const PROBE_REFUSALS_DEAD_ITEMS: u32 = 2;

/// Time without a probe answered after which a standby takes a silent leader for dead.
pub const PROBE_SILENCE_DEAD: Duration = Duration::from_millis(400);

/// The object index (`service/index.rs`) compacts its key array only when freed key bytes
/// outweigh the live ones and reach this (less in tests, so that they exercise it).
pub const KEY_GARBAGE_MIN_BYTES: u64 = if cfg!(test) { 1 << 10 } else { 1 << 20 };

/// The largest object size an index record holds (48 bits, `service/record.rs`): 256 TiB,
/// more than any segment.
pub const OBJECT_SIZE_MAX_BYTES: u64 = (1 << 48) - 1;

/// Writers the index's writer table holds before its first sweep (`service/objects.rs`); a
/// sweep runs when the table has doubled since the last one and exceeds this.
pub const SWEEP_WRITERS_MIN: usize = 1024;

/// Least time between two scans of the index for draining segments (`service/drain.rs`): a
/// scan walks every object, so a drain costs the master one walk per interval at most.
pub const DRAIN_SCAN_INTERVAL_MS: u64 = 200;

/// Move tasks one scan of a draining segment books at most (`service/drain.rs`); the rest
/// wait for the next scan, so a drain of millions of objects does not queue them all at once.
pub const DRAIN_MOVES_PER_SCAN_MAX: usize = 4096;

/// The deadline of an admin drain (`POST /api/v1/drain`) that names none.
pub const DRAIN_DEADLINE_MS_DEFAULT: u64 = 60_000;

/// How long the master keeps a range reserved for a client's next put that the client has not
/// committed (`service/reserve.rs`): twice as long as the client may still write into it
/// (`protocol::limits::RESERVATION_USE_MS`). Its range then stays parked until
/// `put_start_release_timeout` after it was made.
pub const RESERVATION_TTL_MS: u64 = 2 * protocol::limits::RESERVATION_USE_MS;
