//! The io_uring data-plane server: one shard (see [`crate::shard`]) behind the same surface
//! as [`TcpServer`](super::blocking::TcpServer): `bind`, `local_addr`, `stats`,
//! `connection_count`, and Drop = stop and join.
//!
//! A storage node runs one `UringServer` per configured core, each with its own port and
//! segment; [`super::serve`] picks this server or the blocking fallback.
//!
//! Invariants: the shard thread owns the ring, the listener and every connection; the owner
//! shares only atomic counters, the stop flag and the eventfd that wakes the loop. Dropping
//! the server returns only after the shard thread has exited, and the shard exits only once
//! every operation it submitted has completed (or been abandoned with the ring, see
//! [`crate::shard::reactor`]), so no kernel access to registered memory outlives it.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use crate::limits::SEND_ZC_MIN_BYTES_DEFAULT;
use crate::mem::served::{ServedMemory, ServerConfig, ServerStats};
use crate::shard::reactor::{build_ring, Reactor, ReactorConfig, ShardShared};
use crate::sys::rawio;

/// Shard placement and transport knobs beyond [`ServerConfig`].
#[derive(Clone, Copy, Debug)]
pub struct ShardOptions {
    /// Which of the cores this process may run on (its affinity mask, in order; wraps
    /// around) to pin the shard's thread to (`None`: not pinned). An index into the allowed
    /// set, not a CPU number, so that `CPUAffinity=2-5` or a CPU manager's cpuset gets one
    /// shard per allowed core.
    pub core: Option<usize>,
    /// READ batches with at least this many payload bytes are sent with
    /// `IORING_OP_SENDMSG_ZC`; `u64::MAX` never uses it.
    pub send_zc_min_bytes: u64,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            core: None,
            send_zc_min_bytes: SEND_ZC_MIN_BYTES_DEFAULT,
        }
    }
}

/// Why a shard did not start.
#[derive(Debug, thiserror::Error)]
pub enum ShardStartError {
    /// The listening socket could not be bound (the blocking path would fail the same way).
    #[error("binding the listener: {0}")]
    Bind(#[source] io::Error),
    /// The ring or the eventfd could not be created: a reason to fall back.
    #[error("io_uring setup failed: {0}")]
    Ring(#[source] io::Error),
    /// The shard thread could not be spawned.
    #[error("spawning the shard thread: {0}")]
    Spawn(#[source] io::Error),
}

impl From<ShardStartError> for io::Error {
    fn from(e: ShardStartError) -> io::Error {
        match e {
            ShardStartError::Bind(e) | ShardStartError::Ring(e) | ShardStartError::Spawn(e) => e,
        }
    }
}

/// A running io_uring shard. Dropping it stops the shard and joins its thread.
pub struct UringServer {
    local_addr: SocketAddr,
    shared: Arc<ShardShared>,
    thread: Option<JoinHandle<()>>,
    pinned: bool,
}

impl UringServer {
    /// Binds `addr` and serves `memory` from a shard pinned to `core` (if given).
    pub fn bind(
        addr: SocketAddr,
        memory: Arc<ServedMemory>,
        config: ServerConfig,
        core: Option<usize>,
    ) -> Result<UringServer, ShardStartError> {
        let options = ShardOptions {
            core,
            ..Default::default()
        };
        UringServer::bind_with(addr, memory, config, options)
    }

    /// [`UringServer::bind`] with every shard option.
    pub fn bind_with(
        addr: SocketAddr,
        memory: Arc<ServedMemory>,
        config: ServerConfig,
        options: ShardOptions,
    ) -> Result<UringServer, ShardStartError> {
        if config.io_timeout.is_zero() {
            return Err(ShardStartError::Bind(io::Error::new(
                io::ErrorKind::InvalidInput,
                "io_timeout must be > 0",
            )));
        }
        let listener = TcpListener::bind(addr).map_err(ShardStartError::Bind)?;
        rawio::tune_listener(listener.as_raw_fd());
        let local_addr = listener.local_addr().map_err(ShardStartError::Bind)?;
        // SAFETY: eventfd takes no pointers; the result is checked before use.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(ShardStartError::Ring(io::Error::last_os_error()));
        }
        // SAFETY: `wake` is a descriptor just created and owned by nobody else.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let shared = Arc::new(ShardShared {
            stats: ServerStats::default(),
            stop: AtomicBool::new(false),
            wake,
            live_connections: AtomicUsize::new(0),
            zero_copy_bytes: AtomicU64::new(0),
        });
        let reactor_config = ReactorConfig {
            server: config,
            send_zc_min_bytes: options.send_zc_min_bytes,
        };
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<bool, io::Error>>(1);
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("dp-shard-{}", local_addr.port()))
            .spawn(move || {
                let pinned = options.core.is_some_and(pin_to_core);
                // The ring is created on the shard's thread: it is a single-issuer ring.
                match build_ring() {
                    Ok(ring) => {
                        let _ = ready_tx.send(Ok(pinned));
                        Reactor::new(ring, listener, memory, thread_shared, reactor_config).run();
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(ShardStartError::Spawn)?;
        let started = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(io::Error::other("shard thread exited before reporting")));
        match started {
            Ok(pinned) => {
                if let (Some(core), false) = (options.core, pinned) {
                    tracing::warn!(
                        core,
                        "could not pin the shard to its core; running unpinned"
                    );
                }
                Ok(UringServer {
                    local_addr,
                    shared,
                    thread: Some(thread),
                    pinned,
                })
            }
            Err(e) => {
                let _ = thread.join();
                Err(ShardStartError::Ring(e))
            }
        }
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The shard's counters, including the stall detector's.
    pub fn stats(&self) -> &ServerStats {
        &self.shared.stats
    }

    /// Number of connections being served now.
    pub fn connection_count(&self) -> usize {
        self.shared.live_connections.load(Ordering::Relaxed)
    }

    /// READ payload bytes sent with `SENDMSG_ZC` so far.
    pub fn zero_copy_bytes(&self) -> u64 {
        self.shared.zero_copy_bytes.load(Ordering::Relaxed)
    }

    /// True when the shard's thread is pinned to the requested core.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }
}

impl Drop for UringServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let one = 1u64;
        // SAFETY: writes the 8 bytes of `one` to the eventfd the shard reads; a failure only
        // means the shard is already gone.
        unsafe {
            libc::write(
                self.shared.wake.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Pins the calling thread to the `nth` core of the process's affinity mask (modulo its
/// size); false when the mask cannot be read or pinning failed.
fn pin_to_core(nth: usize) -> bool {
    let allowed = core_affinity::get_core_ids().unwrap_or_default();
    if allowed.is_empty() {
        return false;
    }
    core_affinity::set_for_current(allowed[nth % allowed.len()])
}
