//! The io_uring thread-per-core runtime: one shard = one pinned thread, one ring, one
//! listener, its own connections.
//!
//! A shard serves the one-sided frames of [`crate::transport::header`] exactly as the
//! blocking [`crate::server::blocking::TcpServer`] does, but from a single thread driving
//! every connection through its own `io_uring`:
//!
//! - [`reactor`]: the event loop. Submits, waits (at most [`SHARD_TICK`]), dispatches each
//!   completion by `user_data` to the operation that owns it, checks I/O timeouts and records
//!   stalls.
//! - [`op`]: the in-flight operations. Each [`op::Op`] owns every buffer its submission
//!   entry points at (header bytes, drain scratch, `iovec`s, `msghdr`) until its completion
//!   arrives, and hands them back with the result (the monoio discipline). The only memory an
//!   entry points at that an operation does not own is registered memory, and that is covered
//!   by a [`view::MemoryLease`].
//! - [`conn`]: per-connection state: the receive state machine (header → WRITE payload or
//!   drain → header ...) and the queue of responses waiting to be sent.
//! - [`send`]: a batch of responses (headers and READ payloads) as one `sendmsg`, advanced
//!   over partial sends.
//! - [`view`]: the shard's own copy of the registration table and the gate that lets
//!   `ServedMemory::unregister` wait for the shard's in-flight payloads.
//! - [`stall`]: the stall detector.
//!
//! Invariants:
//! - Per connection at most one receive and one send are in flight, so bytes of the stream
//!   are consumed and produced strictly in order; requests overlap in that a READ's payload
//!   goes out while the next requests are received and WRITE payloads land.
//! - A connection's slot and descriptor live until it has no operation in flight: closing
//!   shuts the socket down (which completes its operations) and frees the slot on the last
//!   completion.
//! - Nothing here takes a lock on the data path. Registration lookups use the shard's copy
//!   of the table, refreshed only when the table's generation moves (choice documented in
//!   `server::blocking`): the alternative of one `RwLock` per request would put every
//!   shard's requests on one cache line.
//!
//! [`SHARD_TICK`]: crate::limits::SHARD_TICK

pub(crate) mod conn;
pub(crate) mod op;
pub(crate) mod reactor;
pub(crate) mod send;
pub(crate) mod stall;
pub(crate) mod view;
