//! Accepting for the blocking servers: one thread per connection, a cap on connections, and
//! a stop that closes them all.
//!
//! Two servers answer the data plane's frames on blocking sockets: the data-plane server of
//! a process without io_uring ([`super::blocking`]) and the disk tier's listener (the client
//! crate's `disk::listener`). Both accept the same way, so the way lives here once:
//!
//! - each accepted connection is tuned ([`crate::sys::rawio::tune_stream`]: no delay, buffer
//!   sizes, read and write timeouts), registered and served on a thread of its own, named
//!   `<name>-conn-<id>`;
//! - at most `max_connections` at once: one more is closed at accept and counted refused (as
//!   is one whose tuning or thread fails);
//! - a failed `accept` (EMFILE, ENFILE, ENOBUFS persist for a while) backs off 10 ms rather
//!   than spin;
//! - dropping the [`Acceptor`] stops accepting (a connection to itself wakes the blocking
//!   `accept`), shuts every live connection down and joins every thread.

use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::sys::rawio;

/// What a server does with its connections.
pub trait Connections: Send + Sync + 'static {
    /// Serves one connection until it ends; the acceptor shuts it down afterwards.
    fn serve(&self, stream: &TcpStream);
    /// A connection was accepted and is about to be served.
    fn accepted(&self) {}
    /// A connection was closed at once: the server was full, or tuning or spawning failed.
    fn refused(&self) {}
}

/// How an [`Acceptor`] accepts.
#[derive(Clone, Debug)]
pub struct AcceptPolicy {
    /// Thread names: `<name>-accept-<port>`, `<name>-conn-<id>`.
    pub name: &'static str,
    pub max_connections: usize,
    /// A connection's read and write timeout.
    pub io_timeout: Duration,
}

struct Shared<C> {
    handler: Arc<C>,
    policy: AcceptPolicy,
    stop: AtomicBool,
    /// Live connections by id, to shut them down at the stop.
    connections: Mutex<HashMap<u64, TcpStream>>,
}

impl<C> Shared<C> {
    fn connections(&self) -> std::sync::MutexGuard<'_, HashMap<u64, TcpStream>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A listener being accepted on; see the module docs.
pub struct Acceptor<C: Connections> {
    local_addr: SocketAddr,
    shared: Arc<Shared<C>>,
    thread: Option<JoinHandle<Vec<JoinHandle<()>>>>,
}

impl<C: Connections> Acceptor<C> {
    /// Accepts on `listener` from a thread of its own, serving each connection with `handler`.
    pub fn spawn(listener: TcpListener, policy: AcceptPolicy, handler: Arc<C>) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            handler,
            policy,
            stop: AtomicBool::new(false),
            connections: Mutex::new(HashMap::new()),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!(
                "{}-accept-{}",
                shared.policy.name,
                local_addr.port()
            ))
            .spawn(move || accept_loop(listener, s))?;
        Ok(Acceptor {
            local_addr,
            shared,
            thread: Some(thread),
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Connections being served now.
    pub fn connection_count(&self) -> usize {
        self.shared.connections().len()
    }

    /// The handler the connections are served with.
    pub fn handler(&self) -> &Arc<C> {
        &self.shared.handler
    }
}

impl<C: Connections> Drop for Acceptor<C> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept; failure means the listener is already gone.
        let _ = TcpStream::connect_timeout(&self.local_addr, Duration::from_secs(1));
        let handles = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        for stream in self.shared.connections().values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        for h in handles {
            let _ = h.join();
        }
    }
}

fn accept_loop<C: Connections>(
    listener: TcpListener,
    shared: Arc<Shared<C>>,
) -> Vec<JoinHandle<()>> {
    let mut handles: Vec<JoinHandle<()>> = Vec::new();
    let mut next_id = 0u64;
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            return handles;
        }
        let Ok((stream, _peer)) = accepted else {
            std::thread::sleep(crate::limits::ACCEPT_ERROR_BACKOFF);
            continue;
        };
        handles.retain(|h| !h.is_finished());
        let id = next_id;
        next_id += 1;
        let registered = {
            let mut conns = shared.connections();
            conns.len() < shared.policy.max_connections
                && rawio::tune_stream(&stream, shared.policy.io_timeout).is_ok()
                && stream.try_clone().map(|c| conns.insert(id, c)).is_ok()
        };
        if !registered {
            shared.handler.refused();
            continue;
        }
        shared.handler.accepted();
        let s = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name(format!("{}-conn-{id}", shared.policy.name))
            .spawn(move || {
                s.handler.serve(&stream);
                let _ = stream.shutdown(Shutdown::Both);
                s.connections().remove(&id);
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(_) => {
                shared.handler.refused();
                shared.connections().remove(&id);
            }
        }
    }
}
