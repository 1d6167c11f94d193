//! The bottom layer: raw byte ranges and the system calls that take them. Nothing here
//! knows about segments, catalogs, servers or peers; every other folder of the crate may use
//! it, and it uses only [`crate::limits`].
//!
//! - [`bytes`]: [`Src`]/[`Dst`], a pointer and a length (laid out as `struct iovec`), and
//!   the copies between them; `mem` re-exports them, as the memory every layer moves;
//! - [`cma`]: copies to and from another process's memory (`process_vm_readv`/`writev`);
//! - [`mmap`]: `fstat`, shared mappings, sealed memfds;
//! - `rawio`: socket calls on raw descriptors (`sendmsg` of a gather list, `recv` into a
//!   [`Dst`], `poll`, buffer sizes, [`connect_first`], [`recv_spinning`]) and
//!   `process_exists`;
//! - [`unix`]: same-host unix sockets: peer credentials, liveness, a descriptor passed with a
//!   message.

pub mod bytes;
pub mod cma;
pub mod mmap;
pub(crate) mod rawio;
pub mod unix;

pub use bytes::{Dst, Src};
pub use rawio::{connect_first, recv_spinning};
