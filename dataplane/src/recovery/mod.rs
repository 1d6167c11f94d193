//! The owner's half of recovery: what lets a node's index survive a master that forgot it
//! (`docs/recovery.md`). Kept apart from `mem`, which is memory only.
//!
//! - [`catalog`]: the owner's catalog of the objects in its segment (records, tombstones,
//!   versions), what a restarted master is re-taught from;
//! - [`fence`]: the term fence: a write of an old term is refused before its bytes land;
//! - [`inflight`]: the write page of same-host writers (intents and claims), so that an
//!   owner knows which writes are under way and which writer died.
//!
//! It stands on [`crate::sys`], `limits` and `error` only; `mem::served` and `mem::shm`
//! (the memory an owner serves) and the servers use it.

pub mod catalog;
pub mod fence;
pub mod inflight;

pub use catalog::{Catalog, CatalogEntry, CatalogRecord, PendingWrites, RecordKind};
pub use fence::{Declared, Fence};
