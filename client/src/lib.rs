//! The store client: what the Python layer wraps.
//!
//! - [`master::MasterClient`]: a blocking, thread-safe, pipelined client of the master's control
//!   RPC. Many threads may call it at once; each call writes its frames under a short write lock
//!   and waits for its answers; whichever waiting caller holds the read side reads the socket
//!   and hands each answer to its caller by request id (no reader thread).
//! - [`store::Store`]: `MooncakeDistributedStore` in Rust: puts and gets that ask the master
//!   where, then move the bytes themselves over the data plane.
//! - [`node`]: the storage node behind the `mooncake_client` binary: N shards, each with its
//!   own segment and data port, mounted at the master as separate segments. Its flags are
//!   [`node::NodeConfig`], its `/metrics` endpoint is [`node::metrics`], and the program
//!   around it (signals, logging, the dummy-client service) is [`cli`].
//! - [`disk`]: an owner's disk store for the disk tier (files of a local directory) and the
//!   listener that serves them to readers (`docs/tiering.md`).

pub mod auth;
pub mod cli;
pub mod disk;
pub mod dummy;
pub mod http_endpoint;
pub mod master;
pub mod node;
pub mod rdma;
pub mod recovery;
pub mod store;
pub mod tier;

/// The data plane this client is built on, re-exported so that integration tests and tools
/// holding only this crate reach the same `TcpClient` and memory types.
pub use dataplane;
pub use master::{ClientError, MasterClient};
pub use store::{Store, StoreConfig};
