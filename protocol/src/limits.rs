//! Named maxima of the control protocol. Every pool, buffer and decoder bound lives here.

/// Largest control frame (header excluded) a peer may send. Bounds the memory one frame costs.
pub const FRAME_PAYLOAD_MAX_BYTES: usize = 64 * 1024 * 1024;
/// Largest key accepted by the master. Upstream has no explicit bound; 1 MiB keys must be
/// refused cleanly rather than crash anything.
pub const KEY_MAX_BYTES: usize = 64 * 1024;
/// Largest number of items in one batch request.
pub const BATCH_MAX_ITEMS: usize = 1 << 20;
/// Largest decoded string (segment names, endpoints, patterns).
pub const STRING_MAX_BYTES: usize = 1024 * 1024;

const _: () = assert!(KEY_MAX_BYTES <= STRING_MAX_BYTES);
const _: () = assert!(STRING_MAX_BYTES <= FRAME_PAYLOAD_MAX_BYTES);
