//! The data plane: memory that other processes read and write one-sided.
//!
//! Owns hugepage segments, the registration table of local buffers, the TCP transport and the
//! transfer engine, and the thread-per-core storage-node runtime. It never depends on the
//! control plane; the two meet only through `protocol` types. The collectives behind
//! `mooncake.pg` and EP are the crate `mooncake-collective`, which stands on this one's
//! memory; nothing here names it.
//!
//! Layout, bottom layer first; a folder uses only the ones above it in this list
//! (`scripts/tidy.py` refuses an import that closes a circle between folders):
//! - [`limits`], [`error`]: every named maximum of this crate; the transfer-engine error codes
//!   with upstream's numbers;
//! - [`sys`]: raw byte ranges ([`mem::Src`]/[`mem::Dst`]) and the system calls that take them
//!   (sockets, mappings, memfds);
//! - [`recovery`]: the owner's half of recovery: its catalog, the term fence, the write page
//!   of same-host writers;
//! - [`mem`]: memory: [`mem::Segment`] (hugepage mappings), [`mem::Registry`] (the
//!   registration table every remote access is checked against), [`mem::SlabAllocator`]
//!   (size-class allocation), the copy helpers, the memory a node serves (`served`) and its
//!   same-host offers (`shm`);
//! - [`metadata`]: segment descriptors (and the RDMA `Gid` they carry), the HTTP and etcd
//!   metadata stores and the handshake channel;
//! - [`transport`]: the one-sided TCP protocol ([`transport::header`]), its multi-lane
//!   client, and the RDMA verbs transport;
//! - [`shard`]: the io_uring thread-per-core runtime;
//! - [`server`]: both data-plane servers, the io_uring shard ([`server::uring::UringServer`])
//!   and the blocking fallback ([`server::blocking::TcpServer`]), and [`server::serve`],
//!   which picks one;
//! - [`engine`]: the transfer engine (segments, batches, notifies) that `mooncake.engine`
//!   and the store client wrap;
//! - [`test_env`], beside the layers: the environment lock that tests of this crate and of
//!   the crates above it take.
//!
//! Invariant kept by the whole crate: a remote request touches memory only after the range was
//! found inside one registered buffer, and bytes from the network never cause a panic.

pub mod engine;
pub mod error;
pub mod limits;
pub mod mem;
pub mod metadata;
pub mod recovery;
pub mod server;
pub mod shard;
pub mod sys;
pub mod test_env;
pub mod transport;

pub use error::TeError;
