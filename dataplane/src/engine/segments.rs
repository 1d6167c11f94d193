//! Peers: how a segment name becomes a descriptor and a data endpoint, and the cache of
//! opened segments.
//!
//! A [`Directory`] answers "what does segment N look like" and "where is N's handshake
//! port": from the metadata store (`mooncake/ram/<N>`, `mooncake/rpc_meta/<N>`), or in
//! P2PHANDSHAKE mode from the peer itself (N is `host:rpc_port`).
//!
//! The [`SegmentCache`] gives each name a stable handle (1, 2, ...; 0 is the local segment)
//! and keeps the peer's descriptor and its [`TcpClient`]. A handle outlives a failed peer:
//! when a transfer fails at the connection level the entry is invalidated and the next use
//! fetches the descriptor again (the peer may have restarted on another port).
//!
//! Invariants: the cache lock is never held across network I/O; a handle, once given out,
//! names the same segment name for the engine's life.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, MutexGuard};

use super::error::EngineError;
use crate::metadata::desc::{RpcMeta, SegmentDesc};
use crate::metadata::handshake::{self, FrameType};
use crate::metadata::rdma_desc::RdmaSegmentDesc;
use crate::metadata::{host_of, split_host_port, Keys, MetadataStore};
use crate::transport::client::{ClientConfig, TcpClient};
use crate::TeError;

/// Where descriptors come from.
pub(crate) enum Directory {
    /// Ask the peer over its handshake port.
    P2p,
    /// Read the metadata store.
    Store(Box<dyn MetadataStore>),
}

fn unknown(name: &str, why: impl std::fmt::Display) -> EngineError {
    EngineError::new(TeError::Metadata, format!("segment {name:?}: {why}"))
}

impl Directory {
    /// The descriptor of `name`, and the host its ports are on. `my_desc` is sent to the
    /// peer in P2P mode, as upstream does.
    pub(crate) fn fetch(
        &self,
        keys: &Keys,
        name: &str,
        my_desc: &[u8],
    ) -> Result<(SegmentDesc, String, Vec<u8>), EngineError> {
        match self {
            Directory::P2p => {
                let (host, _) = split_host_port(name)
                    .ok_or_else(|| unknown(name, "in P2PHANDSHAKE mode a name is host:rpc_port"))?;
                let raw = handshake::call(name, FrameType::Metadata, my_desc)
                    .map_err(|e| unknown(name, e))?;
                let desc = SegmentDesc::from_json(&raw)
                    .map_err(|e| unknown(name, format!("bad descriptor: {e}")))?;
                Ok((desc, host.to_string(), raw))
            }
            Directory::Store(store) => {
                let key = keys.ram(name);
                let raw = store
                    .get(&key)
                    .map_err(|e| unknown(name, e))?
                    .ok_or_else(|| unknown(name, format!("no descriptor under {key:?}")))?;
                let desc = SegmentDesc::from_json(&raw)
                    .map_err(|e| unknown(name, format!("bad descriptor under {key:?}: {e}")))?;
                // The peer's address: its rpc_meta entry, else the host part of its name
                // (storage-node shards publish no handshake endpoint).
                let host = match store.get(&keys.rpc_meta(name)) {
                    Ok(Some(raw)) => {
                        RpcMeta::from_json(&raw)
                            .map_err(|e| unknown(name, format!("bad rpc_meta: {e}")))?
                            .ip_or_host_name
                    }
                    _ => host_of(name).to_string(),
                };
                Ok((desc, host, raw))
            }
        }
    }

    /// The `host:port` of `name`'s handshake server.
    pub(crate) fn rpc_endpoint(&self, keys: &Keys, name: &str) -> Result<String, EngineError> {
        match self {
            Directory::P2p => split_host_port(name)
                .map(|_| name.to_string())
                .ok_or_else(|| unknown(name, "in P2PHANDSHAKE mode a name is host:rpc_port")),
            Directory::Store(store) => {
                let key = keys.rpc_meta(name);
                let raw = store
                    .get(&key)
                    .map_err(|e| unknown(name, e))?
                    .ok_or_else(|| unknown(name, format!("no handshake endpoint under {key:?}")))?;
                let meta = RpcMeta::from_json(&raw)
                    .map_err(|e| unknown(name, format!("bad rpc_meta: {e}")))?;
                Ok(format!("{}:{}", meta.ip_or_host_name, meta.rpc_port))
            }
        }
    }
}

/// An opened peer segment.
#[derive(Debug)]
pub(crate) struct RemoteSegment {
    pub(crate) name: String,
    pub(crate) desc: SegmentDesc,
    /// The TCP data endpoint (`None` for an RDMA-only peer, e.g. an upstream engine).
    pub(crate) data_addr: Option<SocketAddr>,
    /// The RDMA view of the descriptor, when the peer runs the RDMA transport.
    pub(crate) rdma: Option<RdmaSegmentDesc>,
    /// The peer's registration table and the right to copy its memory, when it runs on this
    /// host and cross-memory attach is permitted (`engine::samehost`).
    pub(crate) same_host: Option<super::samehost::Peer>,
    client: Mutex<Option<Arc<TcpClient>>>,
}

impl RemoteSegment {
    /// A peer from its descriptor; refuses TCP descriptors of upstream engines, whose TCP
    /// wire format this crate does not speak (their RDMA descriptors are fine).
    pub(crate) fn new(
        name: &str,
        desc: SegmentDesc,
        host: &str,
        rdma: Option<RdmaSegmentDesc>,
    ) -> Result<RemoteSegment, EngineError> {
        if desc.mooncake_rs_data_port.is_none() && rdma.is_some() {
            return Ok(RemoteSegment {
                name: name.to_string(),
                desc,
                data_addr: None,
                rdma,
                same_host: None,
                client: Mutex::new(None),
            });
        }
        let port = desc.mooncake_rs_data_port.ok_or_else(|| {
            EngineError::new(
                TeError::NotImplemented,
                format!(
                    "segment {name:?} was published by an upstream Mooncake engine; its TCP \
                     wire format is not spoken by mooncake-rs"
                ),
            )
        })?;
        let data_addr = (host, port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                EngineError::new(TeError::Dns, format!("cannot resolve {host}:{port}"))
            })?;
        Ok(RemoteSegment {
            name: name.to_string(),
            desc,
            data_addr: Some(data_addr),
            rdma,
            same_host: None,
            client: Mutex::new(None),
        })
    }

    /// The data-plane client of this peer, connected on first use.
    pub(crate) fn client(&self, config: ClientConfig) -> Result<Arc<TcpClient>, EngineError> {
        let mut slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let addr = self.data_addr.ok_or_else(|| {
            EngineError::new(
                TeError::NotImplemented,
                format!("segment {:?} has no TCP data port (RDMA only)", self.name),
            )
        })?;
        let c = TcpClient::connect(addr, config).map_err(|e| {
            EngineError::new(
                TeError::from_i32(e.code()).unwrap_or(TeError::Socket),
                format!("segment {:?} at {addr}: {e}", self.name),
            )
        })?;
        let c = Arc::new(c);
        *slot = Some(c.clone());
        Ok(c)
    }
}

#[derive(Debug)]
struct Entry {
    name: String,
    remote: Option<Arc<RemoteSegment>>,
}

#[derive(Debug, Default)]
struct Inner {
    by_name: HashMap<String, u64>,
    entries: HashMap<u64, Entry>,
    next_id: u64,
}

/// Opened segments by handle; see the module docs.
#[derive(Debug, Default)]
pub(crate) struct SegmentCache {
    inner: Mutex<Inner>,
}

impl SegmentCache {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The handle of an already opened name.
    pub(crate) fn handle_of(&self, name: &str) -> Option<u64> {
        self.lock().by_name.get(name).copied()
    }

    /// Stores `remote` under its name; returns the name's handle (reused if known).
    pub(crate) fn insert(&self, remote: Arc<RemoteSegment>) -> u64 {
        let mut inner = self.lock();
        if let Some(&h) = inner.by_name.get(&remote.name) {
            if let Some(e) = inner.entries.get_mut(&h) {
                e.remote = Some(remote);
            }
            return h;
        }
        inner.next_id += 1;
        let h = inner.next_id;
        inner.by_name.insert(remote.name.clone(), h);
        inner.entries.insert(
            h,
            Entry {
                name: remote.name.clone(),
                remote: Some(remote),
            },
        );
        h
    }

    /// The name of a handle and its cached peer (`None` when invalidated).
    pub(crate) fn get(&self, handle: u64) -> Option<(String, Option<Arc<RemoteSegment>>)> {
        self.lock()
            .entries
            .get(&handle)
            .map(|e| (e.name.clone(), e.remote.clone()))
    }

    /// Forgets the cached descriptor and connections of `handle` (it stays valid).
    pub(crate) fn invalidate(&self, handle: u64) {
        if let Some(e) = self.lock().entries.get_mut(&handle) {
            e.remote = None;
        }
    }

    /// Forgets `handle` entirely.
    pub(crate) fn close(&self, handle: u64) -> bool {
        let mut inner = self.lock();
        match inner.entries.remove(&handle) {
            Some(e) => {
                inner.by_name.remove(&e.name);
                true
            }
            None => false,
        }
    }
}
