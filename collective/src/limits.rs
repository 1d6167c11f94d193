//! Named maxima and sizes of the collectives (`mooncake.pg` and EP). Every group, slot and
//! timeout bound of this crate lives here; relationships between them are asserted at compile
//! time.

/// Largest process group `collective` serves (upstream's `MOONCAKE_PG_MAX_RANKS`): membership
/// masks are one `u64`.
pub const PG_MAX_RANKS: usize = 64;
/// Bytes of one collective slot; every rank's segment has two (double buffering), so one
/// phase of a collective moves at most this much per rank.
pub const PG_COLL_SLOT_BYTES: usize = 4 * 1024 * 1024;
/// Bytes of one point-to-point slot (two per ordered pair of ranks), before the slot header.
pub const PG_P2P_SLOT_BYTES: usize = 1024 * 1024;
/// Granule every collective chunk and sub-range is a multiple of: a cache line, and a
/// multiple of every element size, so chunk boundaries never split an element.
pub const PG_CHUNK_ALIGN_BYTES: usize = 64;
/// Segment header: the counters and per-slot descriptors (see `crate::seg`).
pub const PG_HEADER_BYTES: usize = 64 * 1024;

const _: () = assert!(PG_MAX_RANKS <= 64);
const _: () = assert!(PG_COLL_SLOT_BYTES.is_multiple_of(PG_CHUNK_ALIGN_BYTES));
const _: () = assert!(PG_COLL_SLOT_BYTES / PG_MAX_RANKS >= PG_CHUNK_ALIGN_BYTES);
const _: () = assert!(PG_P2P_SLOT_BYTES.is_multiple_of(PG_CHUNK_ALIGN_BYTES));
const _: () = assert!(PG_HEADER_BYTES >= 512 + 2 * 64 * PG_MAX_RANKS + 2 * 64 * PG_MAX_RANKS);

/// How long a `mooncake.pg` rank waits for its TCP links to the ranks on other hosts (connect
/// to each and be connected from each) when the group starts.
pub const PG_NET_CONNECT_TIMEOUT_MS: u64 = 60_000;
/// Receive buffer of one incoming `mooncake.pg` link; larger writes go straight into the
/// replica after the buffered part.
pub const PG_NET_RX_BUFFER_BYTES: usize = 256 * 1024;
/// Writes up to this size are copied into the outgoing frame buffer (one send per sync);
/// larger ones are sent from the segment with their own `sendmsg`.
pub const PG_NET_INLINE_BYTES: usize = 64 * 1024;
/// Bounds of the heartbeat period (a quarter of the collective timeout, clamped).
pub const PG_NET_HEARTBEAT_MIN_MS: u64 = 5;
pub const PG_NET_HEARTBEAT_MAX_MS: u64 = 500;

/// How long a `mooncake.pg` or EP listener gives one incoming connection to finish the
/// cluster-secret handshake (with a secret) and send its hello. Listeners serve connections
/// one at a time, so a silent stranger delays the next one by at most this much.
pub const PG_NET_HELLO_TIMEOUT_MS: u64 = 5_000;
/// Processes on other hosts a `mooncake.pg` rank keeps admitted at once (joiners whose link
/// is alive, waiting for activation or members since): each costs a replica memfd, a receive
/// thread and a link. One per other slot of the largest group, and one to spare (a
/// replacement retrying while its predecessor's link has not yet timed out).
pub const PG_NET_JOINERS_MAX: usize = PG_MAX_RANKS;
/// Destinations a `mooncake.pg` op registers at once with one replica, for the receive
/// thread to read a phase's bytes into (`redirect.rs`): an op registers one per phase and
/// peer, at most two phases ahead.
pub const PG_NET_REDIRECTS_MAX: usize = 16;

const _: () = assert!(PG_NET_INLINE_BYTES <= PG_NET_RX_BUFFER_BYTES);
const _: () = assert!(PG_NET_HELLO_TIMEOUT_MS < PG_NET_CONNECT_TIMEOUT_MS);
const _: () = assert!(PG_NET_JOINERS_MAX >= PG_MAX_RANKS - 1);
const _: () = assert!(PG_NET_HEARTBEAT_MIN_MS <= PG_NET_HEARTBEAT_MAX_MS);

/// Largest EP group: active masks are one `u64` (as `mooncake.pg`).
pub const EP_MAX_RANKS: usize = 64;
/// Header of an EP buffer (counters and descriptors, see [`seg`]).
pub const EP_HEADER_BYTES: usize = 64 * 1024;
/// Largest `num_max_dispatch_tokens_per_rank`; row indices travel as i32.
pub const EP_MAX_TOKENS_PER_RANK: usize = 1 << 20;
/// Largest number of local experts per rank (upstream's kernel limit).
pub const EP_MAX_LOCAL_EXPERTS: usize = 1024;

const _: () = assert!(EP_MAX_RANKS <= 64);
const _: () = assert!(EP_MAX_TOKENS_PER_RANK * EP_MAX_RANKS <= i32::MAX as usize);
