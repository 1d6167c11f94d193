//! The one-sided TCP transport.
//!
//! - [`header`]: the fixed little-endian request and response headers (byte diagrams there
//!   and in `docs/protocol.md`, section "Data-plane TCP frames").
//! - [`server`]: serves READ and WRITE against a [`crate::mem::served::ServedMemory`] table
//!   with the blocking thread-per-connection path, the fallback when io_uring is refused.
//! - [`client`]: N lanes per peer, batched submissions with a status per request.
//! - [`uring`]: whether io_uring may be used (`MC_DISABLE_IO_URING`, kernel refusal).
//! - [`uring_server`]: the io_uring shard server (one pinned thread, one ring).
//! - [`backend`]: [`serve`] picks the io_uring shard or the blocking fallback.
//! - [`rdma`]: the RDMA verbs transport (`docs/rdma.md`).
//!
//! Invariants: a request touches memory only after its whole range was found inside one
//! registered buffer; a malformed or truncated frame affects only its own connection.

pub mod acceptor;
pub mod backend;
pub mod client;
pub mod header;
pub(crate) mod rawio;
pub mod rdma;
pub mod server;
pub mod uring;
pub mod uring_server;

pub use backend::{serve, Server};
pub use rawio::{connect_first, recv_spinning};
