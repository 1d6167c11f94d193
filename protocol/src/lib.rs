//! Wire formats, identifiers and error codes shared by every mooncake-rs process.
//!
//! This crate owns no sockets or threads. It defines:
//! - [`ErrorCode`]: the store error codes with the numbers upstream Mooncake returns to Python,
//!   so that a code seen by a user means the same thing in both implementations;
//! - the value types of the object store ([`ReplicateConfig`], [`ReplicaDescriptor`],
//!   [`Segment`], ...);
//! - the control RPC between clients, storage nodes and the master: [`frame`] (the
//!   length-prefixed, versioned envelope with a request id) and [`message`] (one request and one
//!   response type per operation, with a batch form of every object operation);
//! - [`wire`]: the little-endian encoding those messages use;
//! - [`tenant`]: tenants' separate key spaces (the envelope and the scoped keys);
//! - [`tensor`]: the 304-byte header of tensor objects (`put_tensor`), upstream's layout;
//! - [`gflags`]: the command line of the programs, with gflags' `--flagfile`, `--fromenv`,
//!   `--tryfromenv` and `--undefok`;
//! - [`env`]: the one reading of boolean, size and microsecond values from flags and the
//!   environment;
//! - `log` (the `logging` feature): the one logging set-up of every program and the Python
//!   module, the only part of this crate that writes anywhere;
//! - [`auth`]: the optional cluster secret and the once-per-connection handshake that proves
//!   it (HMAC-SHA256 challenge-response; blocking helpers over `Read + Write`).
//!
//! Invariant: decoding never panics and never allocates more than the input could describe.
//! Every decoder returns [`wire::DecodeError`] on malformed input; `fuzz/` checks this.
//! Byte diagrams of every frame live in `docs/protocol.md`.

pub mod auth;
pub mod env;
pub mod error;
pub mod frame;
pub mod gflags;
pub mod limits;
#[cfg(feature = "logging")]
pub mod log;
pub mod message;
pub mod tenant;
pub mod tensor;
pub mod types;
pub mod wire;

pub use error::ErrorCode;

/// The cluster id used when none is configured (`MC_STORE_CLUSTER_ID`, `--cluster_id`), as
/// upstream: it names the etcd keys of the HA leader and the metadata of the default cluster.
pub const DEFAULT_CLUSTER_ID: &str = "mooncake_cluster";
pub use types::*;
