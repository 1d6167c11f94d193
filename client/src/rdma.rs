//! The RDMA side of a store process (`protocol="rdma"`): a storage node or a store client that
//! serves its segments to peers' one-sided RDMA READ and WRITE, and reaches theirs the same way.
//!
//! One [`RdmaSide`] per process holds the RDMA transport (`dataplane`'s, the one the transfer
//! engine runs: devices chosen as an engine's, `MOONCAKE_RDMA_SIM` for the software model) and
//! a handshake server answering peers' queue-pair requests. A served segment is registered
//! with every device and published in the metadata store under upstream's keys:
//!
//! | key | value |
//! |---|---|
//! | `mooncake/ram/<segment name>` | the RDMA descriptor: devices (GID, LID), the segment's buffer with its `rkey`s, and the TCP data port (an engine or a TCP peer still reaches it) |
//! | `mooncake/rpc_meta/<segment name>` | `{"ip_or_host_name", "rpc_port"}` of the handshake server |
//!
//! A peer learns from the master only a replica's segment name and address; it reads these two
//! keys once per segment (`store::rdma`). With `P2PHANDSHAKE` (no metadata server) nothing is
//! published: the handshake server answers a Metadata request naming a served segment with its
//! descriptor (`handshake::SegmentRequest`), and segments are named after the handshake
//! endpoint, `host:port` or `host:port#i` (upstream's P2P naming), so a peer knows whom to ask
//! from the name alone: a storage node's handshake server listens on its `--port`, a store
//! client's segment is named `host:<handshake port>`.
//!
//! Invariants: memory is registered only while it stays mapped: served segments are
//! deregistered by [`RdmaSide::withdraw`] (a store's close, a node's shutdown) before their
//! owner unmaps them, other ranges by their registrant; published keys are removed by
//! `withdraw` too. A served segment's keys change at every new term of the master
//! ([`RdmaSide::rekey`], before the re-mount), which fences RDMA writes of ended terms.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use dataplane::metadata::desc::{timestamp_now, RpcMeta};
use dataplane::metadata::handshake::{ConnectionHandler, HandshakeServer, HandshakeState};
use dataplane::metadata::{Keys, MetadataBackend, MetadataStore};
use dataplane::transport::rdma::transport::RdmaTransport;
use parking_lot::Mutex;

pub use dataplane::engine::rdma::{force_tcp, rdma_or_fallback, rdma_wanted, tcp_fallbacks};

/// A process's RDMA transport, handshake server and published segments.
pub struct RdmaSide {
    transport: Arc<RdmaTransport>,
    /// `None` with `P2PHANDSHAKE`: descriptors are served by the handshake server only.
    metadata: Option<Arc<dyn MetadataStore>>,
    keys: Keys,
    host: String,
    state: Arc<HandshakeState>,
    server: Mutex<Option<HandshakeServer>>,
    /// Served segments: name, start address and TCP data port.
    published: Mutex<Vec<(String, u64, u16)>>,
    /// Served segments whose new keys could not be published (the metadata store was
    /// unreachable): published again at each ping ([`RdmaSide::publish_pending`]).
    unpublished: Mutex<Vec<String>>,
}

impl RdmaSide {
    /// Opens the devices (`devices`: upstream's `device_name` / `rdma_devices` list, empty for
    /// auto-discovery) and starts the handshake server on `ip`, port `rpc_port` (0: any).
    /// `name` is this process's name in NIC paths. `metadata_server` is where descriptors are
    /// published, or `P2PHANDSHAKE` to serve them from the handshake server only. Every error
    /// is a sentence for the operator.
    pub fn open(
        name: &str,
        devices: &str,
        transfer_timeout: Duration,
        (ip, rpc_port): (IpAddr, u16),
        metadata_server: &str,
        keys: Keys,
    ) -> Result<Arc<RdmaSide>, String> {
        let backend = MetadataBackend::parse(metadata_server)
            .map_err(|e| format!("protocol \"rdma\": metadata server: {e}"))?;
        let store = backend.open().map(Arc::from);
        let transport = dataplane::engine::rdma::open_rdma(name, devices, transfer_timeout)?;
        let state = HandshakeState::new();
        let weak = Arc::downgrade(&transport);
        state.set_connection_handler(Some(ConnectionHandler(Arc::new(move |body| {
            match weak.upgrade() {
                Some(t) => t.handle_connect(body),
                None => b"{\"reply_msg\":\"RDMA transport shut down\"}".to_vec(),
            }
        }))));
        let at = SocketAddr::new(ip, rpc_port);
        let listener =
            TcpListener::bind(at).map_err(|e| format!("RDMA handshake server on {at}: {e}"))?;
        let server = HandshakeServer::start(listener, state.clone())
            .map_err(|e| format!("RDMA handshake server on {at}: {e}"))?;
        Ok(Arc::new(RdmaSide {
            transport,
            metadata: store,
            keys,
            host: ip.to_string(),
            state,
            server: Mutex::new(Some(server)),
            published: Mutex::new(Vec::new()),
            unpublished: Mutex::new(Vec::new()),
        }))
    }

    pub fn transport(&self) -> &Arc<RdmaTransport> {
        &self.transport
    }

    /// Where descriptors are published; `None` with `P2PHANDSHAKE` (peers ask the handshake
    /// server named by the segment, `crate::store::rdma`).
    pub fn metadata(&self) -> Option<&Arc<dyn MetadataStore>> {
        self.metadata.as_ref()
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The handshake server's port.
    pub fn rpc_port(&self) -> u16 {
        self.server
            .lock()
            .as_ref()
            .map_or(0, |s| s.local_addr().port())
    }

    /// Registers `[addr, addr + len)` with every device for this process's own transfers
    /// (staging memory, a caller's registered buffer): no remote access, not published.
    ///
    /// # Safety
    /// The range stays mapped until [`RdmaSide::unregister`]; the device writes into it for
    /// this process's reads.
    pub unsafe fn register(&self, addr: u64, len: u64) -> Result<(), String> {
        // SAFETY: forwarded from this function's contract.
        unsafe {
            self.transport
                .register_private(addr, len, &numa_location(addr))
        }
    }

    pub fn unregister(&self, addr: u64) -> bool {
        self.transport.unregister(addr)
    }

    /// Registers a segment and publishes it as `name` (its descriptor lists only this
    /// segment's buffer; `data_port` is its TCP data port).
    ///
    /// # Safety
    /// As [`RdmaSide::register`]: the segment stays mapped while this side lives, and peers
    /// write into it, as they do over TCP.
    pub unsafe fn serve(
        &self,
        name: &str,
        addr: u64,
        len: u64,
        data_port: u16,
    ) -> Result<(), String> {
        // SAFETY: forwarded from this function's contract (served: peers read and write it).
        unsafe { self.transport.register(addr, len, &numa_location(addr))? };
        self.published
            .lock()
            .push((name.to_string(), addr, data_port));
        self.publish(name, addr, data_port)
    }

    /// Writes the descriptor of the served segment `name` (its current keys) and its
    /// handshake endpoint to the metadata store, and has the handshake server answer
    /// requests naming the segment with it (with `P2PHANDSHAKE`, only that).
    fn publish(&self, name: &str, addr: u64, data_port: u16) -> Result<(), String> {
        let desc = self
            .transport
            .segment_desc_of(name, data_port, timestamp_now(), addr)
            .to_json();
        if let Some(store) = &self.metadata {
            let meta = RpcMeta {
                ip_or_host_name: self.host.clone(),
                rpc_port: self.rpc_port(),
            }
            .to_json();
            let put = store
                .put(&self.keys.ram(name), &desc)
                .and_then(|()| store.put(&self.keys.rpc_meta(name), &meta));
            put.map_err(|e| format!("publishing the RDMA descriptor of {name}: {e}"))?;
        }
        self.state.set_segment_descriptor(name, desc.clone());
        // An engine's P2P request (no segment named) gets the last segment served.
        self.state.set_descriptor(desc);
        Ok(())
    }

    /// Gives every served segment new memory keys and publishes them; returns how many
    /// segments changed keys. Called when the master's term changes, after the catalogs'
    /// fences rose and before the re-mount (`crate::recovery::ping`): an RDMA WRITE of an
    /// ended term whose intent was answered before the fence names an old key, so it fails
    /// and none of its bytes land once this returns (`docs/ha.md`, "The bytes, by RDMA").
    /// Writers of the new term find their old keys refused, read the new descriptor and
    /// announce their write again (`crate::store::rdma`). A segment whose new registration
    /// failed keeps its keys (an error naming it); a failed publication is an error too, the
    /// old keys being gone all the same: peers' RDMA transfers to the segment fail until
    /// [`RdmaSide::publish_pending`] gets it through.
    pub fn rekey(&self) -> Result<usize, String> {
        let published = self.published.lock().clone();
        let mut first_err = None;
        let mut changed = 0;
        for (name, addr, port) in published {
            // Published before the old keys go, so a peer they refuse finds the new ones.
            let done = match self
                .transport
                .rekey(addr, || self.publish(&name, addr, port))
            {
                Ok(Some(published)) => published.map(|()| true),
                Ok(None) => Ok(false),
                Err(e) => Err(format!("segment {name}: {e}")),
            };
            match done {
                Ok(c) => changed += usize::from(c),
                Err(e) => {
                    let mut unpublished = self.unpublished.lock();
                    if !unpublished.contains(&name) {
                        unpublished.push(name);
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(changed), Err)
    }

    /// Publishes again the descriptors whose publication failed after a change of keys
    /// ([`RdmaSide::rekey`]); called at every ping. Returns how many went through.
    pub fn publish_pending(&self) -> usize {
        let pending = std::mem::take(&mut *self.unpublished.lock());
        if pending.is_empty() {
            return 0;
        }
        let published = self.published.lock().clone();
        let mut done = 0;
        for name in pending {
            let Some(&(_, addr, port)) = published.iter().find(|p| p.0 == name) else {
                continue; // withdrawn meanwhile
            };
            match self.publish(&name, addr, port) {
                Ok(()) => {
                    tracing::info!("segment {name}: new RDMA keys published");
                    done += 1;
                }
                Err(e) => {
                    tracing::debug!("segment {name}: still not published: {e}");
                    self.unpublished.lock().push(name);
                }
            }
        }
        done
    }

    /// Removes the published keys, deregisters the served segments (peers' work requests on
    /// them fail from now on, as their TCP transfers would on a stopped server) and stops the
    /// handshake server. Idempotent.
    pub fn withdraw(&self) {
        for (name, addr, _) in std::mem::take(&mut *self.published.lock()) {
            if let Some(store) = &self.metadata {
                let _ = store.remove(&self.keys.ram(&name));
                let _ = store.remove(&self.keys.rpc_meta(&name));
            }
            self.state.remove_segment_descriptor(&name);
            self.transport.unregister(addr);
        }
        self.state.set_connection_handler(None);
        self.server.lock().take();
    }
}

impl Drop for RdmaSide {
    fn drop(&mut self) {
        self.server.lock().take();
    }
}

/// The `cpu:N` location of the memory at `addr` (its NUMA node; `cpu:0` when unknown).
fn numa_location(addr: u64) -> String {
    match dataplane::transport::rdma::discovery::numa_node_of(addr) {
        Some(n) => format!("cpu:{n}"),
        None => "cpu:0".to_string(),
    }
}
