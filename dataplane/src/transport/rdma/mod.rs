//! The RDMA transport: one-sided RDMA WRITE and READ over RC queue pairs.
//!
//! - [`verbs`]: the narrow [`verbs::Verbs`] trait every verbs call goes through, and its types;
//! - [`discovery`]: devices from sysfs, `MC_MS_AUTO_DISC`, `MC_MS_FILTERS`, NUMA locality;
//! - [`ibv`]: the real implementation, libibverbs loaded with `dlopen` at run time (struct
//!   layouts it relies on are listed there);
//! - [`sim`]: `SimVerbs`, a software model of RC queue pairs across processes (tests);
//! - [`sq`]: send-queue accounting with selective signalling (pure logic);
//! - [`transport`]: [`transport::RdmaTransport`], per-shard CQs and QPs, batched READ/WRITE,
//!   QP error handling and device failover;
//!
//! Design, runbook and the layer plan: `docs/rdma.md`.

pub mod discovery;
pub mod ibv;
pub mod sim;
pub mod sq;
pub mod transport;
pub mod verbs;
