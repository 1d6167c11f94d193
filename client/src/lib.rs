//! The store client: what the Python layer wraps.
//!
//! Today it holds [`master::MasterClient`], a blocking, thread-safe, pipelined client of the
//! master's control RPC. Many threads may call it at once; each call writes its frames under a
//! short write lock and waits for its answers, which one reader thread hands back by request id.

pub mod master;

pub use master::{ClientError, MasterClient};
