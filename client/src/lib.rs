//! The store client: what the Python layer wraps.
//!
//! - [`master::MasterClient`]: a blocking, thread-safe, pipelined client of the master's control
//!   RPC. Many threads may call it at once; each call writes its frames under a short write lock
//!   and waits for its answers, which one reader thread hands back by request id.
//! - [`store::Store`]: `MooncakeDistributedStore` in Rust: puts and gets that ask the master
//!   where, then move the bytes themselves over the data plane.

pub mod master;
pub mod store;

pub use master::{ClientError, MasterClient};
pub use store::{Store, StoreConfig};
