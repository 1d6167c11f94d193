//! Moving bytes between local memory and replicas.
//!
//! A replica in this process's own segment is copied with memcpy (after a range check against
//! the segment); any other replica is reached through a pooled [`TcpClient`] per data-plane
//! endpoint. Transfers of one object to several replicas run one after another per replica;
//! each replica's parts go out as one pipelined batch.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use dataplane::transport::client::{ClientConfig, TcpClient, TransferOp};
use parking_lot::Mutex;
use protocol::{ErrorCode, ReplicaDescriptor};

/// This process's own segment, for the memcpy path.
#[derive(Clone, Copy, Debug)]
pub struct OwnSegment {
    pub base: u64,
    pub len: u64,
}

impl OwnSegment {
    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base + self.len)
    }
}

pub struct Peers {
    own_endpoint: Option<String>,
    own: Option<OwnSegment>,
    clients: Mutex<HashMap<String, Arc<TcpClient>>>,
    config: ClientConfig,
}

impl Peers {
    pub fn new(own_endpoint: Option<String>, own: Option<OwnSegment>) -> Peers {
        Peers {
            own_endpoint,
            own,
            clients: Mutex::new(HashMap::new()),
            config: ClientConfig::default(),
        }
    }

    fn is_local(&self, r: &ReplicaDescriptor) -> bool {
        self.own_endpoint.as_deref() == Some(r.transport_endpoint.as_str())
    }

    fn client(&self, endpoint: &str) -> Result<Arc<TcpClient>, ErrorCode> {
        if let Some(c) = self.clients.lock().get(endpoint) {
            return Ok(c.clone());
        }
        let addr: SocketAddr = endpoint
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or(ErrorCode::TransferFail)?;
        let c =
            Arc::new(TcpClient::connect(addr, self.config).map_err(|_| ErrorCode::TransferFail)?);
        Ok(self
            .clients
            .lock()
            .entry(endpoint.to_string())
            .or_insert(c)
            .clone())
    }

    fn forget(&self, endpoint: &str) {
        self.clients.lock().remove(endpoint);
    }

    /// Writes `parts`, concatenated, to the start of replica `r`.
    pub fn write(&self, r: &ReplicaDescriptor, parts: &[&[u8]]) -> Result<(), ErrorCode> {
        let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if total != r.size {
            return Err(ErrorCode::InvalidParams);
        }
        if self.is_local(r) {
            let own = self.own.ok_or(ErrorCode::TransferFail)?;
            if !own.contains(r.buffer_address, total) {
                return Err(ErrorCode::InvalidWrite);
            }
            let mut at = r.buffer_address;
            for p in parts {
                // SAFETY: [at, at + p.len()) lies inside our own mapped segment (checked above
                // for the whole object), and `p` is a live slice that cannot overlap it mutably.
                unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), at as *mut u8, p.len()) };
                at += p.len() as u64;
            }
            return Ok(());
        }
        let client = self.client(&r.transport_endpoint)?;
        let mut at = r.buffer_address;
        let mut ops: Vec<TransferOp<'_>> = Vec::with_capacity(parts.len());
        for p in parts.iter().filter(|p| !p.is_empty()) {
            ops.push(TransferOp::Write {
                remote_addr: at,
                src: p,
            });
            at += p.len() as u64;
        }
        self.finish(&r.transport_endpoint, client.submit(&mut ops))
    }

    /// Reads `dst.len()` bytes from replica `r` at `offset`.
    pub fn read(
        &self,
        r: &ReplicaDescriptor,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), ErrorCode> {
        let len = dst.len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > r.size) {
            return Err(ErrorCode::InvalidParams);
        }
        if len == 0 {
            return Ok(());
        }
        let src = r.buffer_address + offset;
        if self.is_local(r) {
            let own = self.own.ok_or(ErrorCode::TransferFail)?;
            if !own.contains(src, len) {
                return Err(ErrorCode::InvalidRead);
            }
            // SAFETY: [src, src + len) lies inside our own mapped segment (checked above) and
            // `dst` is an exclusive borrow of caller memory, so the ranges do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
            return Ok(());
        }
        let client = self.client(&r.transport_endpoint)?;
        let mut ops = [TransferOp::Read {
            remote_addr: src,
            dst,
        }];
        self.finish(&r.transport_endpoint, client.submit(&mut ops))
    }

    fn finish(
        &self,
        endpoint: &str,
        results: Vec<dataplane::transport::client::TransferResult>,
    ) -> Result<(), ErrorCode> {
        match results.into_iter().find_map(Result::err) {
            None => Ok(()),
            Some(e) => {
                tracing::warn!("transfer with {endpoint} failed: {e}");
                if e.code() == dataplane::TeError::Socket.code() {
                    self.forget(endpoint);
                }
                Err(ErrorCode::TransferFail)
            }
        }
    }
}
