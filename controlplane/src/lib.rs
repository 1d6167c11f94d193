//! The control plane: `mooncake_master`.
//!
//! The master tracks which objects exist, where their replicas live (a segment and an address
//! range in it), who may still read them (leases), which clients and segments are alive, and
//! when to evict. It never touches object bytes: clients move bytes one-sided between their
//! buffers and segments, so the master is off the data path.
//!
//! Layout:
//! - [`service`]: the state machine of objects, segments and clients behind one lock per
//!   master, plus the eviction and liveness passes;
//! - [`alloc`]: per-segment allocators (slab classes for uniform KV blocks, extents for the rest);
//! - [`config`]: flags (`--flag=value`, `--flag value`, config files) and their validation;
//! - [`ha`]: leader election in etcd under a lease, and the "may this master serve" gate;
//! - [`rpc`]: the tokio server speaking the control frames of `protocol`;
//! - [`http`]: the HTTP metadata server and the admin/metrics server;
//! - [`events`]: KV-cache events for cache-aware routers, on a ZeroMQ PUB socket;
//! - [`limits`]: the numeric bounds of what a peer can make the master hold;
//! - [`clock`]: time enters through a trait so tests can move it by hand;
//! - [`cli`]: the `mooncake_master` program as a function (binary and Python entry point).

pub mod alloc;
pub mod cli;
pub mod clock;
pub mod config;
pub mod events;
pub mod ha;
pub mod http;
pub mod limits;
pub mod rpc;
pub mod service;
pub mod signals;
pub mod view;

/// A model of owners, writers and elections around the master, checked by a seeded unit test
/// and by the `master_model` fuzz target; see its docs. Tests and `--features model` only.
#[cfg(any(test, feature = "model"))]
#[path = "service/tests/model.rs"]
pub mod model;
