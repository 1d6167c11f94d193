//! The client crate's bounds, in one place: timeouts, retry pauses, sizes and counts that
//! the store, the storage node, the dummy client and their servers hold to. The disk tier
//! keeps its own (`disk/limits.rs`). Each says what it bounds and, where it was measured or
//! chosen for a reason, why.

use std::time::Duration;

// The dummy client and the standalone client that serves it (`dummy/`).

/// How long a call waits for the standalone client's answer before the connection is given up.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(300);

/// How often the standalone client's accept loop checks for shutdown (`poll(2)`'s timeout).
pub const ACCEPT_POLL_MS: i32 = 100;

/// Most dummy clients served at once.
pub const DUMMIES_MAX: usize = 1024;

/// Largest frame payload either side accepts.
pub const FRAME_MAX_BYTES: usize = protocol::limits::FRAME_PAYLOAD_MAX_BYTES;

/// How often the HTTP endpoint's accept loop checks for shutdown.
pub const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// The HTTP endpoint's (`http_endpoint.rs`, metrics and status): time from a connection's
/// accept to its answer sent; a client still sending its head
/// then is dropped.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(2);

/// Bytes of request head read at most.
pub const REQUEST_HEAD_MAX_BYTES: usize = 8 * 1024;

// The master client (`master.rs`): calls, leader lookup in etcd, settling.

/// Default time to establish the connection (`MC_RPC_CONNECT_TIMEOUT_MS` overrides it).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Default time a call waits for its answer (`MC_RPC_TIMEOUT_MS` overrides it).
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// How long etcd may fail to answer before a client stops waiting for a leader.
pub const ETCD_DOWN_GIVE_UP: Duration = Duration::from_millis(1000);

/// Longest a follower sleeps before checking again whether it can lead.
pub const FOLLOWER_RECHECK: Duration = Duration::from_millis(5);

/// How long a call to an HA leader waits for its answer before checking, in etcd, that the
/// leader it was sent to still leads (and then again every as long).
pub const LEADER_WATCH: Duration = Duration::from_millis(250);

/// Longest a connect to a published leader may take before the leader is looked up again.
pub const LEADER_CONNECT_TIMEOUT: Duration = Duration::from_millis(300);

/// How often a client without a reachable leader looks at etcd again.
pub const LEADER_POLL: Duration = Duration::from_millis(50);

/// Longest a leader blocks in one `read` before re-checking its deadline.
pub const LEAD_READ_SLICE: Duration = Duration::from_millis(50);

/// Bytes the leader asks the socket for at once.
pub const READ_CHUNK_BYTES: usize = 256 * 1024;

/// Pause between two tries of a commit or revoke.
pub const SETTLE_RETRY: Duration = Duration::from_millis(200);

/// How long a put's commit or revoke is retried while no master may execute it
/// (`MasterClient::call_settling`): longer than an etcd restart or an election, well under
/// the master's default 30 s discard timeout for puts left in flight.
pub const SETTLE_WINDOW: Duration = Duration::from_secs(10);

/// Pause between two tries of a call a master answered `UNAVAILABLE_IN_CURRENT_STATUS`.
pub const UNAVAILABLE_RETRY: Duration = Duration::from_millis(100);

// The storage node (`node/`) and the owner's recovery (`recovery.rs`).

/// How long start-up keeps trying to reach the master.
pub const MASTER_CONNECT_PATIENCE: Duration = Duration::from_secs(10);

/// How often a storage node and a store ping the master.
pub const PING_INTERVAL: Duration = Duration::from_secs(1);

/// How often a draining node asks the master whether its segments are unmounted yet
/// (`node::Node::drain`).
pub const DRAIN_POLL: Duration = Duration::from_millis(200);

/// How long past its deadline a draining node still waits for the master to unmount its
/// segments (the master unmounts at its next drain scan after the deadline) before it
/// unmounts them itself.
pub const DRAIN_OVERRUN: Duration = Duration::from_secs(2);

/// How often an owner's pinger looks whether its calls moved to a new HA leader.
pub const LEADER_EPOCH_CHECK: Duration = Duration::from_millis(50);

/// Most shards one node runs.
pub const SHARDS_MAX: usize = 256;

/// How long a storage node's start may spend populating its segments' heads (where the
/// first puts land) before it reports ready, per 16 GiB of `--global_segment_size`; the rest
/// is populated in the background (`dataplane::mem::populate`).
pub const POPULATE_AT_START_PER_16_GIB: Duration = Duration::from_secs(1);

/// Key bytes of held objects sent in one `ReMountSegment` (the frame limit is 64 MiB).
pub const REMOUNT_HELD_BYTES_MAX: usize = 4 << 20;

// The store (`store/`).

/// Most extra segments one client mounts.
pub const EXTRA_SEGMENTS_MAX: usize = 64;

/// Below this many bytes in total, batches for several endpoints run one after another on the
/// calling thread (a thread spawn costs more than the transfers).
pub const PARALLEL_ENDPOINTS_MIN_BYTES: u64 = 256 * 1024;

/// Longest back-off: how late, at worst, a store notices that an endpoint is back.
pub const REDIAL_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// First back-off after an endpoint failed; doubled per consecutive failure.
pub const REDIAL_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// How long an endpoint found not to be shared on this host is not asked again.
pub const SHM_ABSENT_RECHECK: Duration = Duration::from_secs(5);

/// Most requests handed to one `TcpClient::submit` (its `BATCH_REQUESTS_MAX`).
pub const SUBMIT_REQUESTS_MAX: usize = dataplane::limits::BATCH_REQUESTS_MAX;

/// Requests larger than this are cut into slices of this size, so that one object uses several
/// lanes at once (upstream's TCP transport slices at 64 KiB; larger slices cost fewer headers).
pub const TRANSFER_SLICE_BYTES: usize = 1 << 20;

/// Ports tried for a client that gives no port (upstream's `MC_STORE_CLIENT_MIN/MAX_PORT`).
pub const CLIENT_PORT_MIN: u16 = 12300;
pub const CLIENT_PORT_MAX: u16 = 14300;

/// How long a store does not ask a master that refused reserved puts (an older master, or one
/// with tenant quotas) again (`store::reserve`).
pub const RESERVED_PUT_REFUSED_PAUSE: Duration = Duration::from_secs(60);

/// How long a store does not ask for reservations after the master had no room for one on its
/// host (`store::reserve`), at most: its puts go the usual way meanwhile, without a refused
/// call each. The first pause after a reservation was given is
/// [`RESERVED_PUT_FULL_PAUSE_FIRST`], each next one twice the last, up to this.
pub const RESERVED_PUT_FULL_PAUSE: Duration = Duration::from_secs(1);

/// The first of the pauses [`RESERVED_PUT_FULL_PAUSE`] bounds. Short, because the commonest
/// "no room" is a host whose storage node has not mounted its segment yet: a client started
/// beside a fresh node (a benchmark, a test) would otherwise put its first second of small
/// puts the usual way, at twice a get's time, though the segment came a few milliseconds
/// after.
pub const RESERVED_PUT_FULL_PAUSE_FIRST: Duration = Duration::from_millis(10);
