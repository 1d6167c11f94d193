//! Choosing the data-plane server: the io_uring shard where the kernel allows it, else the
//! blocking [`TcpServer`].
//!
//! [`serve`] asks [`probe::probe`] (`MC_DISABLE_IO_URING=1` forces the fallback;
//! EPERM/ENOSYS from `io_uring_setup` mean refused) and, if io_uring is available but the
//! shard's ring cannot be set up, falls back too. The reason is logged once per process
//! (warn) and kept on the [`Server`] for metrics: [`Server::backend`] and
//! [`Server::fallback_reason`].

pub mod acceptor;
pub mod blocking;
pub mod probe;
pub mod uring;

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::mem::served::{ServedMemory, ServerConfig, ServerStats};
use blocking::TcpServer;
use uring::{ShardStartError, UringServer};

/// A running data-plane server of either kind. Dropping it stops it and joins its threads.
pub enum Server {
    /// An io_uring shard.
    Uring(UringServer),
    /// The blocking thread-per-connection server, and why it was chosen.
    Blocking { server: TcpServer, reason: String },
}

/// `Server::backend()` of an io_uring shard.
pub const BACKEND_URING: &str = "io_uring";
/// `Server::backend()` of the blocking fallback.
pub const BACKEND_BLOCKING: &str = "blocking";

impl Server {
    /// The address actually bound.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        match self {
            Server::Uring(s) => s.local_addr(),
            Server::Blocking { server, .. } => server.local_addr(),
        }
    }

    /// The server's counters.
    pub fn stats(&self) -> &ServerStats {
        match self {
            Server::Uring(s) => s.stats(),
            Server::Blocking { server, .. } => server.stats(),
        }
    }

    /// Number of connections being served now.
    pub fn connection_count(&self) -> usize {
        match self {
            Server::Uring(s) => s.connection_count(),
            Server::Blocking { server, .. } => server.connection_count(),
        }
    }

    /// [`BACKEND_URING`] or [`BACKEND_BLOCKING`], for logs and metrics.
    pub fn backend(&self) -> &'static str {
        match self {
            Server::Uring(_) => BACKEND_URING,
            Server::Blocking { .. } => BACKEND_BLOCKING,
        }
    }

    /// Why the blocking path is used (`None` for io_uring).
    pub fn fallback_reason(&self) -> Option<&str> {
        match self {
            Server::Uring(_) => None,
            Server::Blocking { reason, .. } => Some(reason),
        }
    }
}

static FALLBACK_LOGGED: AtomicBool = AtomicBool::new(false);

fn log_fallback_once(reason: &str) {
    if !FALLBACK_LOGGED.swap(true, Ordering::Relaxed) {
        tracing::warn!(reason, "data plane uses the blocking TCP path");
    } else {
        tracing::debug!(reason, "data plane uses the blocking TCP path");
    }
}

/// Binds `addr` and serves `memory`: an io_uring shard pinned to `core` when io_uring is
/// available, else the blocking server (see the module docs). Errors: binding the address.
pub fn serve(
    addr: SocketAddr,
    memory: Arc<ServedMemory>,
    config: ServerConfig,
    core: Option<usize>,
) -> io::Result<Server> {
    let status = probe::probe();
    let reason = if status.is_available() {
        match UringServer::bind(addr, Arc::clone(&memory), config, core) {
            Ok(server) => return Ok(Server::Uring(server)),
            Err(ShardStartError::Bind(e)) => return Err(e),
            Err(e) => format!("{e}; using the blocking path"),
        }
    } else {
        status.to_string()
    };
    log_fallback_once(&reason);
    let server = TcpServer::bind(addr, memory, config)?;
    Ok(Server::Blocking { server, reason })
}
