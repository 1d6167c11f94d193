//! The store client: what the Python layer wraps, the storage node, and the owner's side of
//! the disk tier.
//!
//! - [`master`]: [`master::MasterClient`], a blocking, thread-safe, pipelined client of the
//!   master's control RPC. Many threads may call it at once; each call writes its frames under
//!   a short write lock and waits for its answers; whichever waiting caller holds the read side
//!   reads the socket and hands each answer to its caller by request id (no reader thread).
//! - [`store`]: [`store::Store`], `MooncakeDistributedStore` in Rust: puts and gets that ask
//!   the master where, then move the bytes themselves over the data plane, by the replica
//!   paths of `store::paths`.
//! - [`node`]: the storage node behind the `mooncake_client` binary: N shards, each with its
//!   own segment and data port, mounted at the master as separate segments. Its flags are
//!   [`node::NodeConfig`], its `/metrics` endpoint is [`node::metrics`], and the program
//!   around it (signals, logging, the dummy-client service) is [`cli`].
//! - [`recovery`]: the owner's side of index recovery (catalogs, freed ranges, re-mounts),
//!   shared by the node and a store with a segment.
//! - [`disk`] and [`tier`]: the disk tier's files and listener, and the owner that mounts them
//!   as a disk segment (`docs/tiering.md`).
//! - [`rdma`]: the RDMA side of a store or node (devices, handshake, published keys).
//! - [`dummy`]: the dummy-client service of a node and the client of `setup_dummy`.
//! - [`auth`]: the cluster secret on this crate's connections to the master.
//! - [`http_endpoint`]: the small HTTP server of the node's `/metrics` and the client HTTP
//!   server.
//! - [`limits`]: every timeout, pause, size and count the crate holds to, in one place (the
//!   disk tier's are in `disk::limits`).

pub mod auth;
pub mod cli;
pub mod disk;
pub mod dummy;
pub mod http_endpoint;
pub mod limits;
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
