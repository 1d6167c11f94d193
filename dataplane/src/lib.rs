//! The data plane: memory that other processes read and write one-sided.
//!
//! Owns hugepage segments, the registration table of local buffers, the TCP transport and the
//! transfer engine, and the thread-per-core storage-node runtime. It never depends on the
//! control plane; the two meet only through `protocol` types. (Built out by issue 3.)
