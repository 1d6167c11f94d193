//! The engine's side of `protocol="rdma"`: choosing verbs and devices, and running a peer's
//! requests over the [`RdmaTransport`].
//!
//! Selection at `initialize` ([`rdma_wanted`], [`open_transport`]):
//! - `MC_FORCE_TCP` set (not `0`/`false`): TCP, as upstream;
//! - `MOONCAKE_RDMA_SIM=<dir>`: the software model ([`SimVerbs`], devices from
//!   `MOONCAKE_RDMA_SIM_DEVICES`, default `sim0,sim1`) instead of libibverbs;
//! - otherwise libibverbs (`dlopen`), devices from sysfs, `device_name`, `MC_MS_AUTO_DISC`,
//!   `MC_MS_FILTERS`. No library or no usable device is `ERR_DEVICE_NOT_FOUND` (-6) with a
//!   message that says why and that `MC_FORCE_TCP=1` runs TCP instead.
//!
//! A peer whose descriptor is an RDMA one is reached over RDMA when this engine runs RDMA;
//! otherwise over TCP (an RDMA engine still serves its TCP data port).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::error::EngineError;
use super::exec::Outcome;
use super::segments::RemoteSegment;
use super::{EngineOptions, Running, SegmentHandle, TransferRequest};
use crate::transport::header::Opcode;
use crate::transport::rdma::discovery::{self, DeviceRequest, HcaInfo};
use crate::transport::rdma::ibv::IbVerbs;
use crate::transport::rdma::sim::SimVerbs;
use crate::transport::rdma::transport::{Peer, RdmaConfig, RdmaTransport, Request};
use crate::transport::rdma::verbs::{RdmaOp, Verbs};
use crate::TeError;

/// `MC_FORCE_TCP` says TCP.
pub fn force_tcp() -> bool {
    std::env::var("MC_FORCE_TCP")
        .map(|v| {
            let v = v.trim().to_ascii_lowercase();
            !v.is_empty() && v != "0" && v != "false" && v != "off"
        })
        .unwrap_or(false)
}

/// Whether `protocol` asks for the RDMA transport (after `MC_FORCE_TCP`).
pub fn rdma_wanted(protocol: &str) -> bool {
    protocol.trim().eq_ignore_ascii_case("rdma") && !force_tcp()
}

fn no_device(why: impl std::fmt::Display) -> EngineError {
    EngineError::new(TeError::DeviceNotFound, no_device_text(why))
}

fn no_device_text(why: impl std::fmt::Display) -> String {
    format!("protocol \"rdma\": {why}; set MC_FORCE_TCP=1 to run over TCP instead")
}

/// Opens the verbs and devices the environment and `device_name` ask for.
pub(crate) fn open_transport(
    options: &EngineOptions,
    name: &str,
    device_name: &str,
) -> Result<Arc<RdmaTransport>, EngineError> {
    open_verbs(name, device_name, options.transfer_timeout).map_err(no_device)
}

/// The RDMA transport of a process that is not a transfer engine (a store client, a storage
/// node), chosen exactly as an engine's: `MOONCAKE_RDMA_SIM`, else libibverbs with
/// `device_name`, `MC_MS_AUTO_DISC` and `MC_MS_FILTERS`. `name` is the local segment name its
/// NIC paths carry. The error says why no device could be used and that `MC_FORCE_TCP=1` runs
/// TCP instead.
pub fn open_rdma(
    name: &str,
    device_name: &str,
    transfer_timeout: Duration,
) -> Result<Arc<RdmaTransport>, String> {
    open_verbs(name, device_name, transfer_timeout).map_err(no_device_text)
}

fn open_verbs(
    name: &str,
    device_name: &str,
    transfer_timeout: Duration,
) -> Result<Arc<RdmaTransport>, String> {
    let req = DeviceRequest::from_env(device_name);
    let cfg = RdmaConfig::from_env(transfer_timeout);
    let root = Path::new(discovery::SYSFS_ROOT);
    let (verbs, available): (Arc<dyn Verbs>, Vec<HcaInfo>) = match SimVerbs::from_env() {
        Some(sim) => {
            let sim = sim.map_err(|e| e.to_string())?;
            let names = sim.device_names().map_err(|e| e.to_string())?;
            let infos = names
                .iter()
                .map(|n| HcaInfo {
                    name: n.clone(),
                    numa_node: None,
                    ports: Vec::new(),
                })
                .collect();
            (Arc::new(sim), infos)
        }
        None => {
            let ib = IbVerbs::load().map_err(|e| e.to_string())?;
            let listed = ib.device_names().map_err(|e| e.to_string())?;
            let infos = listed
                .iter()
                .map(|n| discovery::hca_from_sysfs(root, n))
                .collect();
            (ib, infos)
        }
    };
    let chosen = discovery::choose(&available, &req).map_err(|e| e.to_string())?;
    let t = RdmaTransport::open(verbs, &chosen, name, cfg, &|dev, port| {
        discovery::roce_v2_gid_index(root, dev, port)
    })?;
    tracing::info!(
        verbs = t.verbs_kind(),
        devices = ?chosen.iter().map(|h| &h.name).collect::<Vec<_>>(),
        "RDMA transport ready"
    );
    Ok(Arc::new(t))
}

impl Running {
    /// Runs `reqs` (already checked locally, `out` holds those results) against a peer that
    /// published an RDMA descriptor. Returns false when this engine runs no RDMA (the caller
    /// uses TCP).
    pub(crate) fn run_rdma(
        &self,
        handle: SegmentHandle,
        seg: &RemoteSegment,
        reqs: &[TransferRequest],
        out: &mut [Outcome],
    ) -> bool {
        let (Some(t), Some(desc)) = (&self.rdma, &seg.rdma) else {
            return false;
        };
        let rpc = match self.directory.rpc_endpoint(&self.keys, &seg.name) {
            Ok(r) => r,
            Err(e) => {
                for (o, r) in out.iter_mut().zip(reqs) {
                    if o.is_ok() && r.length > 0 {
                        *o = Err(e.code().code());
                    }
                }
                return true;
            }
        };
        let mut idx = Vec::new();
        let mut rr = Vec::new();
        for (i, r) in reqs.iter().enumerate() {
            if out[i].is_err() || r.length == 0 {
                continue;
            }
            let op = match r.opcode {
                Opcode::Read => RdmaOp::Read,
                Opcode::Write => RdmaOp::Write,
                Opcode::CatalogPut | Opcode::Fence => continue, // refused in `execute`
            };
            idx.push(i);
            rr.push(Request {
                op,
                local: r.source,
                remote: r.target_offset,
                len: r.length,
            });
        }
        let peer = Peer {
            name: &seg.name,
            rpc: &rpc,
            desc,
        };
        let results = t.transfer(&peer, &rr);
        let mut lost = false;
        for (i, res) in idx.into_iter().zip(results) {
            if let Err(code) = res {
                lost |= code == TeError::Endpoint as i32;
                out[i] = Err(code);
            }
        }
        if lost {
            // The peer may have restarted with new keys: fetch its descriptor again.
            self.segments.invalidate(handle.0);
        }
        true
    }
}
