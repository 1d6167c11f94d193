//! Dummy clients: processes that put and get through a standalone `mooncake_client` on the
//! same host instead of owning a segment and a master connection (upstream's
//! `MooncakeDistributedStore.setup_dummy`).
//!
//! ```text
//! dummy process (Python)                       standalone mooncake_client (--port=P)
//! map a memfd region (pool + local buffer)
//! export it: "\0mooncake-shm/dummy/<pid>/<id>" ─▶ (maps it on Hello)
//! connect "\0mooncake-rs-dummy/P" ───────────────▶ DummyServer: one thread per dummy
//! Hello{region} ─────────────────────────────────▶ map, register with its Store
//! ◀─────────────────────────────────────────────── Welcome{hostname}
//! Put{key, ranges of the region} ────────────────▶ Store::put_parts from the mapping
//! GetInto{key, range} ───────────────────────────▶ Store::get_into the mapping
//! ```
//!
//! [`wire`] is the framing and messages, [`server`] the standalone client's side, [`client`]
//! the dummy's side. `docs/dummy-client.md` describes the design, `docs/protocol.md` the wire.

pub mod client;
pub mod server;
pub mod wire;

pub use client::DummyClient;
pub use server::DummyServer;
