//! The engine's side of `protocol="rdma"`: choosing verbs and devices, and running a peer's
//! requests over the [`RdmaTransport`].
//!
//! Selection at `initialize` ([`rdma_wanted`], [`open_transport`]):
//! - `MC_FORCE_TCP` set (not `0`/`false`): TCP, as upstream;
//! - `MOONCAKE_RDMA_SIM=<dir>`: the software model ([`SimVerbs`], devices from
//!   `MOONCAKE_RDMA_SIM_DEVICES`, default `sim0,sim1`) instead of libibverbs;
//! - otherwise libibverbs (`dlopen`), devices from sysfs, `device_name`, `MC_MS_AUTO_DISC`,
//!   `MC_MS_FILTERS`.
//!
//! No library, no device, or none of the named devices ([`rdma_or_fallback`]): TCP instead,
//! as upstream does, with one WARNING per setup that says what was missing, counted in
//! [`tcp_fallbacks`]. `MC_REQUIRE_RDMA=1` makes that an error (`ERR_DEVICE_NOT_FOUND`, -6)
//! instead. A device that exists but cannot be opened is always an error.
//!
//! A peer whose descriptor is an RDMA one is reached over RDMA when this engine runs RDMA;
//! otherwise over TCP (an RDMA engine still serves its TCP data port).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
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

/// `MC_REQUIRE_RDMA` makes "no RDMA device" an error instead of a fall-back to TCP.
pub fn require_rdma() -> bool {
    protocol::env::flag("MC_REQUIRE_RDMA", false)
}

static TCP_FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// How many setups in this process asked for `rdma`, found no RDMA device and ran TCP
/// (the metric `mooncake_rdma_tcp_fallbacks_total`).
pub fn tcp_fallbacks() -> u64 {
    TCP_FALLBACKS.load(Ordering::Relaxed)
}

/// Why `rdma` cannot run here: no device (TCP can stand in), or a broken setting.
enum Probe {
    Missing(String),
    Broken(String),
}

/// Whether `protocol` runs the RDMA transport on this host: `Ok(true)` when it asks for
/// `rdma` (and `MC_FORCE_TCP` is not set) and the devices `device_name` names (or
/// auto-discovery) exist; `Ok(false)` for TCP. `rdma` with no device is TCP, with one WARNING
/// naming what was missing and `who` (the setup, for the log), counted in [`tcp_fallbacks`];
/// with `MC_REQUIRE_RDMA` set it is an error that names the variable.
pub fn rdma_or_fallback(protocol: &str, device_name: &str, who: &str) -> Result<bool, String> {
    if !rdma_wanted(protocol) {
        return Ok(false);
    }
    let why = match probe(device_name) {
        Ok(_) => return Ok(true),
        Err(Probe::Broken(why)) => return Err(no_device_text(why)),
        Err(Probe::Missing(why)) => why,
    };
    if require_rdma() {
        return Err(format!(
            "protocol \"rdma\": {why}; MC_REQUIRE_RDMA is set, so this is an error rather \
             than a fall-back to TCP (unset it, or set MC_FORCE_TCP=1 to run over TCP)"
        ));
    }
    TCP_FALLBACKS.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(
        "{who}: protocol \"rdma\" asked for, but {why}: running over TCP instead. \
         Set MC_FORCE_TCP=1 to ask for TCP explicitly (no warning), or MC_REQUIRE_RDMA=1 to \
         make a missing RDMA device an error"
    );
    Ok(false)
}

/// The verbs and the devices `device_name` (or auto-discovery) chooses.
fn probe(device_name: &str) -> Result<(Arc<dyn Verbs>, Vec<HcaInfo>), Probe> {
    let req = DeviceRequest::from_env(device_name);
    let root = Path::new(discovery::SYSFS_ROOT);
    let (verbs, available): (Arc<dyn Verbs>, Vec<HcaInfo>) = match SimVerbs::from_env() {
        Some(sim) => {
            let sim = sim.map_err(|e| Probe::Broken(e.to_string()))?;
            let names = sim
                .device_names()
                .map_err(|e| Probe::Broken(e.to_string()))?;
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
            let ib = IbVerbs::load()
                .map_err(|e| Probe::Missing(format!("no RDMA device found ({e})")))?;
            let listed = ib
                .device_names()
                .map_err(|e| Probe::Missing(format!("no RDMA device found ({e})")))?;
            let infos = listed
                .iter()
                .map(|n| discovery::hca_from_sysfs(root, n))
                .collect();
            (ib, infos)
        }
    };
    if available.is_empty() && req.auto_discovery {
        return Err(Probe::Missing("no RDMA device found".into()));
    }
    let chosen = discovery::choose(&available, &req).map_err(Probe::Missing)?;
    Ok((verbs, chosen))
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
    let cfg = RdmaConfig::from_env(transfer_timeout);
    let root = Path::new(discovery::SYSFS_ROOT);
    let (verbs, chosen) = probe(device_name).map_err(|p| match p {
        Probe::Missing(why) | Probe::Broken(why) => why,
    })?;
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
