//! The data plane: memory that other processes read and write one-sided.
//!
//! Owns hugepage segments, the registration table of local buffers, the TCP transport and the
//! transfer engine, and the thread-per-core storage-node runtime. It never depends on the
//! control plane; the two meet only through `protocol` types. The collectives behind
//! `mooncake.pg` and EP are the crate `mooncake-collective`, which stands on this one's
//! memory; nothing here names it.
//!
//! Layout:
//! - [`mem`]: [`mem::Segment`] (hugepage mappings), [`mem::Registry`] (the registration
//!   table every remote access is checked against), [`mem::SlabAllocator`] (size-class
//!   allocation of local buffers and staging space);
//! - [`transport`]: the one-sided TCP protocol ([`transport::header`]), its server and its
//!   multi-lane client;
//! - [`shard`]: the io_uring thread-per-core runtime behind
//!   [`transport::uring_server::UringServer`];
//! - [`engine`]: the transfer engine (segments, batches, notifies) that `mooncake.engine`
//!   and the store client wrap;
//! - [`metadata`]: segment descriptors, the HTTP metadata store and the handshake channel;
//! - [`error`]: the transfer-engine error codes with upstream's numbers;
//! - [`limits`]: every named maximum of this crate.
//!
//! Invariant kept by the whole crate: a remote request touches memory only after the range was
//! found inside one registered buffer, and bytes from the network never cause a panic.

pub mod engine;
pub mod error;
pub mod limits;
pub mod mem;
pub mod metadata;
pub mod shard;
pub mod transport;

pub use error::TeError;
