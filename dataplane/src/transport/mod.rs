//! The one-sided TCP transport.
//!
//! - [`header`]: the fixed little-endian request and response headers (byte diagrams there
//!   and in `docs/protocol.md`, section "Data-plane TCP frames").
//! - [`client`]: N lanes per peer, batched submissions with a status per request.
//! - [`rdma`]: the RDMA verbs transport (`docs/rdma.md`).
//!
//! The servers that answer these frames are [`crate::server`], a layer above this one.
//!
//! Invariants: a request touches memory only after its whole range was found inside one
//! registered buffer; a malformed or truncated frame affects only its own connection.

pub mod client;
pub mod header;
pub mod rdma;
