//! Settings of a transfer engine: named limits and what the environment says.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `MC_TRANSFER_TIMEOUT` | seconds a transfer may take before it reports `Timeout`, plus 1 s per GiB; at least 5 | 30 |
//! | `MC_MIN_RPC_PORT` / `MC_MAX_RPC_PORT` (typo aliases `MC_MIN_PRC_PORT` / `MC_MAX_PRC_PORT`) | range of the random handshake port | 15000 / 17000 |
//! | `MC_LEGACY_RPC_PORT_BINDING` | the handshake port is the port of `local_server_name` | unset |
//! | `MC_TCP_BIND_ADDRESS` | address advertised (and bound) for the handshake and data ports | host of `local_server_name` |
//! | `MC_METADATA_CLUSTER_ID` | metadata key prefix `mooncake/<id>/` | unset |
//! | `MC_TCP_LANES_PER_PEER` | TCP connections per peer, 1..=16 | 4 |
//! | `MC_TE_SAME_HOST` | a peer on this host is reached by cross-memory attach (`samehost`); a false word (`0`, `false`, `off`) keeps it on TCP | on |

use std::time::Duration;

use crate::limits::{CLIENT_LANES_DEFAULT, CLIENT_LANES_MAX};

/// Smallest `MC_TRANSFER_TIMEOUT` honoured (upstream's Python layer).
pub const TRANSFER_TIMEOUT_MIN: Duration = Duration::from_secs(5);
/// `MC_TRANSFER_TIMEOUT` when unset or unparsable.
pub const TRANSFER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default handshake port range (upstream's `MC_MIN_RPC_PORT`, `MC_MAX_RPC_PORT`).
pub const RPC_PORT_MIN_DEFAULT: u16 = 15000;
pub const RPC_PORT_MAX_DEFAULT: u16 = 17000;
/// Random ports tried before giving up (upstream's `findAvailableTcpPort`).
pub const RPC_PORT_ATTEMPTS: usize = 500;
/// Requests larger than this are cut into slices spread over the peer's lanes, so a single
/// 1 MiB transfer already uses two connections (and two server threads or shards) at once:
/// measured 3.8 -> 5.1 GB/s for 1 MiB sync writes from Python (bench/README.md).
pub const SLICE_BYTES: u64 = 512 << 10;
/// Worker threads that run asynchronous batches.
pub const WORKER_THREADS: usize = 4;
/// Batches alive at once per engine.
pub const BATCHES_MAX: usize = 65536;
/// Requests one batch may hold (upstream has no fixed limit; this bounds memory).
pub const BATCH_CAPACITY_MAX: usize = 1 << 20;
/// Bytes of one managed-buffer pool (a registered segment cut by the slab allocator).
pub const MANAGED_POOL_BYTES: usize = 64 << 20;
/// Managed-buffer pools one engine may create.
pub const MANAGED_POOLS_MAX: usize = 64;

const _: () = assert!(SLICE_BYTES <= crate::limits::REQUEST_PAYLOAD_MAX_BYTES);
const _: () = assert!(MANAGED_POOL_BYTES.is_multiple_of(crate::limits::SLAB_BYTES));
const _: () = assert!(RPC_PORT_MIN_DEFAULT <= RPC_PORT_MAX_DEFAULT);

/// Engine settings; [`EngineOptions::from_env`] reads the table above.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Base of the per-transfer timeout (`MC_TRANSFER_TIMEOUT`).
    pub transfer_timeout: Duration,
    /// Inclusive range of the random handshake port.
    pub rpc_port_range: (u16, u16),
    /// Use this handshake port instead of a random one (0: random).
    pub rpc_port: u16,
    /// Take the handshake port from `local_server_name` (`MC_LEGACY_RPC_PORT_BINDING`).
    pub legacy_rpc_port_binding: bool,
    /// Address to advertise and bind (`MC_TCP_BIND_ADDRESS`).
    pub bind_address: Option<String>,
    /// Metadata cluster id (`MC_METADATA_CLUSTER_ID`).
    pub cluster_id: Option<String>,
    /// TCP connections per peer.
    pub lanes: usize,
    /// Reach same-host peers by cross-memory attach (`MC_TE_SAME_HOST`, see `samehost`).
    pub same_host: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            transfer_timeout: TRANSFER_TIMEOUT_DEFAULT,
            rpc_port_range: (RPC_PORT_MIN_DEFAULT, RPC_PORT_MAX_DEFAULT),
            rpc_port: 0,
            legacy_rpc_port_binding: false,
            bind_address: None,
            cluster_id: None,
            lanes: CLIENT_LANES_DEFAULT,
            same_host: true,
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

impl EngineOptions {
    /// Settings from the environment (see the module table).
    pub fn from_env() -> EngineOptions {
        let d = EngineOptions::default();
        let port = |a: &str, b: &str, dflt: u16| {
            env(a)
                .or_else(|| env(b))
                .and_then(|v| v.parse::<u16>().ok())
                .unwrap_or(dflt)
        };
        let min = port("MC_MIN_RPC_PORT", "MC_MIN_PRC_PORT", RPC_PORT_MIN_DEFAULT);
        let max = port("MC_MAX_RPC_PORT", "MC_MAX_PRC_PORT", RPC_PORT_MAX_DEFAULT);
        EngineOptions {
            transfer_timeout: parse_transfer_timeout(env("MC_TRANSFER_TIMEOUT").as_deref()),
            rpc_port_range: if min <= max {
                (min, max)
            } else {
                d.rpc_port_range
            },
            rpc_port: 0,
            legacy_rpc_port_binding: env("MC_LEGACY_RPC_PORT_BINDING").is_some(),
            bind_address: env("MC_TCP_BIND_ADDRESS"),
            cluster_id: env("MC_METADATA_CLUSTER_ID"),
            lanes: env("MC_TCP_LANES_PER_PEER")
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|n| (1..=CLIENT_LANES_MAX).contains(n))
                .unwrap_or(d.lanes),
            same_host: super::samehost::enabled(),
        }
    }

    /// The deadline budget of a transfer of `len` bytes: the base plus 1 ns per byte
    /// (1 s per GiB), as upstream's Python layer computes it.
    pub fn timeout_for(&self, len: u64) -> Duration {
        self.transfer_timeout + Duration::from_nanos(len)
    }
}

/// `MC_TRANSFER_TIMEOUT` in seconds: at least 5, 30 when unset or not a number.
pub fn parse_transfer_timeout(value: Option<&str>) -> Duration {
    match value.and_then(|v| v.trim().parse::<u64>().ok()) {
        Some(s) => Duration::from_secs(s).max(TRANSFER_TIMEOUT_MIN),
        None => TRANSFER_TIMEOUT_DEFAULT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_timeout_rules() {
        assert_eq!(parse_transfer_timeout(None), Duration::from_secs(30));
        assert_eq!(parse_transfer_timeout(Some("x")), Duration::from_secs(30));
        assert_eq!(parse_transfer_timeout(Some("1")), Duration::from_secs(5));
        assert_eq!(
            parse_transfer_timeout(Some(" 60 ")),
            Duration::from_secs(60)
        );
        let o = EngineOptions::default();
        assert_eq!(o.timeout_for(1_000_000_000), Duration::from_secs(31));
    }
}
