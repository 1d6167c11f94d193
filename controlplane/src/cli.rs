//! The `mooncake_master` program as a library function, so that the binary and the Python
//! console script (`mooncake_master` from `pip install`) run the same code.
//!
//! Parses upstream's flags, starts the RPC server, the admin/metrics server and (with
//! `--enable_http_metadata_server`) the HTTP metadata server, runs the service's periodic work,
//! and returns 0 on SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::SystemClock;
use crate::config::{MasterConfig, ParsedArgs};
use crate::ha::{self, HaConfig, HaState};
use crate::http::{admin, metadata};
use crate::rpc;
use crate::service::MasterService;
use crate::signals::Signals;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{error, info, warn};

/// Accept-queue depth of every listener (the kernel caps it at `net.core.somaxconn`).
const LISTEN_BACKLOG: u32 = 4096;
/// How often `--enable_metric_reporting` logs a one-line summary of the store.
const METRIC_REPORT_INTERVAL: Duration = Duration::from_secs(30);
/// How often the service's periodic work (liveness, stale puts, eviction) runs.
const TICK_INTERVAL: Duration = Duration::from_millis(20);

/// Runs the master with `args` (without the program name); returns the process exit code.
pub fn master_main(args: Vec<String>) -> i32 {
    let cfg = match MasterConfig::from_args(args) {
        Ok(ParsedArgs::Run(cfg, warnings)) => {
            init_logging();
            for w in warnings {
                warn!("{w}");
            }
            cfg
        }
        Ok(ParsedArgs::Help(text)) | Ok(ParsedArgs::Version(text)) => {
            println!("{text}");
            return 0;
        }
        Err(e) => {
            eprintln!("mooncake_master: {e}");
            eprintln!("Try --help for the list of flags.");
            return 2;
        }
    };
    // Many clients and storage nodes each hold a connection: lift the soft fd limit.
    let (before, after) = tuning::raise_nofile_limit();
    if after > before {
        info!("open-file limit raised from {before} to {after}");
    }
    // The cluster secret, before anything listens: a flag that names an empty or unreadable
    // file must stop the start, not leave the master open.
    match protocol::auth::init_process(cfg.auth_token_file.as_deref()) {
        Ok(Some(_)) => info!("cluster secret set: peers must authenticate"),
        Ok(None) => {}
        Err(e) => {
            eprintln!("mooncake_master: {e}");
            return 2;
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.rpc_threads().max(1))
        .thread_name("mc-master")
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(run(cfg)) {
        Ok(()) => 0,
        Err(e) => {
            error!("{e}");
            eprintln!("mooncake_master: {e}");
            1
        }
    }
}

/// The shared set-up ([`protocol::log`]: `RUST_LOG`, `MC_YLT_LOG_LEVEL`, `MC_LOG_LEVEL`),
/// default info, on stdout as the master always logged.
fn init_logging() {
    use protocol::log::{Ansi, Level, Writer};
    protocol::log::init_logging(Level::Default("info"), Writer::Stdout, Ansi::IfTerminal);
}

async fn bind(host: &str, port: u16, what: &str) -> Result<TcpListener, String> {
    let addr = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let fail = |e: std::io::Error| format!("cannot bind {what} on {addr}: {e}");
    let sock_addr = tokio::net::lookup_host(&addr)
        .await
        .map_err(fail)?
        .next()
        .ok_or_else(|| format!("cannot bind {what} on {addr}: the address resolves to nothing"))?;
    let socket = if sock_addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(fail)?;
    socket.set_reuseaddr(true).map_err(fail)?;
    socket.bind(sock_addr).map_err(fail)?;
    warn_if_open(what, sock_addr);
    // A deep accept queue: clients (re)connecting in a burst, e.g. every node after a master
    // restart, must not overflow it (an overflowed SYN costs the client a 1 s retransmit).
    socket.listen(LISTEN_BACKLOG).map_err(fail)
}

/// Says loudly that a port bound beyond loopback answers anyone, when no cluster secret is
/// set (the master's defaults bind every interface, as upstream's do).
fn warn_if_open(what: &str, addr: SocketAddr) {
    if addr.ip().is_loopback() || protocol::auth::process_token_or_none().is_some() {
        return;
    }
    warn!(
        "{what} on {addr} answers anyone who can reach it: no cluster secret is set \
         (--auth_token_file, MC_AUTH_TOKEN or MC_AUTH_TOKEN_FILE; docs/security.md)"
    );
}

/// Stops the KV event publisher when the master stops, after it sent what is queued (a
/// blocking wait of at most one poll interval, on the thread that runs `run`, not a worker).
struct KvEventsGuard(Option<Arc<crate::events::Publisher>>);

impl Drop for KvEventsGuard {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            p.stop();
        }
    }
}

/// The service, and with `--enable_kv_events` its event publisher, bound and started.
fn new_service(cfg: &MasterConfig) -> Result<(Arc<MasterService>, KvEventsGuard), String> {
    let clock = Arc::new(SystemClock::new());
    let service = Arc::new(MasterService::new(cfg.service.clone(), clock));
    if !cfg.kv_events.enabled {
        return Ok((service, KvEventsGuard(None)));
    }
    let publisher = Arc::new(crate::events::start(&cfg.kv_events)?);
    info!("KV events published on {}", publisher.endpoint());
    service.set_kv_events(publisher.clone());
    Ok((service, KvEventsGuard(Some(publisher))))
}

async fn run(cfg: MasterConfig) -> Result<(), String> {
    // Handlers first: a SIGTERM that arrives once the ports are open must shut down cleanly,
    // not kill the process with the default action.
    let signals = Signals::install().map_err(|e| format!("cannot install signal handlers: {e}"))?;
    // The KV event socket before anything listens: a bad endpoint stops the start.
    let (service, _kv_events) = new_service(&cfg)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let ha_endpoints = if cfg.enable_ha {
        let conn = cfg.ha_connstring().unwrap_or_default();
        Some(ha::parse_endpoints(conn).map_err(|e| format!("--ha_backend_connstring: {e}"))?)
    } else {
        None
    };
    let mut tasks = tokio::task::JoinSet::new();
    let rpc_listener = bind(&cfg.rpc_address, cfg.rpc_listen_port(), "RPC").await?;
    let rpc_addr: SocketAddr = rpc_listener.local_addr().map_err(|e| e.to_string())?;
    // In HA mode the published address must be one clients can reach.
    let ha = match ha_endpoints {
        Some(endpoints) => {
            if rpc_addr.ip().is_unspecified() {
                return Err(format!(
                    "--enable_ha needs --rpc_address set to an address clients can reach \
                     (it is {}, which cannot be published as the leader's address)",
                    cfg.rpc_address
                ));
            }
            let ha_cfg = HaConfig {
                endpoints,
                cluster_id: cfg.cluster_id().to_string(),
                advertise: rpc_addr.to_string(),
                lease_ttl_s: cfg.ha_lease_ttl_s,
            };
            info!(
                "HA: campaigning for cluster {} in etcd {:?} (lease {} s); standby until elected",
                ha_cfg.cluster_id, ha_cfg.endpoints, ha_cfg.lease_ttl_s
            );
            let state = Arc::new(HaState::new(ha_cfg.advertise.clone()));
            let (st, svc, stop) = (state.clone(), service.clone(), stopped());
            tasks.spawn(async move { ha::run(ha_cfg, st, svc, stop).await });
            Some(state)
        }
        None => None,
    };
    let admin_listener = bind(&cfg.metrics_host, cfg.metrics_port, "admin/metrics").await?;
    if cfg.enable_http_metadata_server {
        let l = bind(
            &cfg.http_metadata_server_host,
            cfg.http_metadata_server_port,
            "HTTP metadata",
        )
        .await?;
        info!(
            "HTTP metadata server on http://{}/metadata",
            l.local_addr().map_err(|e| e.to_string())?
        );
        let store = Arc::new(metadata::MetadataStore::new());
        let stop = stopped();
        tasks.spawn(async move {
            if let Err(e) = metadata::serve_metadata(l, store, stop).await {
                error!("HTTP metadata server: {e}");
            }
        });
    }
    info!(
        "admin/metrics on http://{}",
        admin_listener.local_addr().map_err(|e| e.to_string())?
    );
    let view: Arc<dyn crate::view::AdminView> = service.clone();
    let stop = stopped();
    let admin_ha = ha.clone();
    tasks.spawn(async move {
        if let Err(e) = admin::serve_admin(admin_listener, view, admin_ha, stop).await {
            error!("admin server: {e}");
        }
    });
    let svc = service.clone();
    let stop_tick = stopped();
    let tick_gate = ha.clone();
    tasks.spawn(async move {
        tokio::pin!(stop_tick);
        let mut every = tokio::time::interval(TICK_INTERVAL);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut stop_tick => return,
                _ = every.tick() => {
                    // A master that may not serve refuses pings: its liveness pass would
                    // expire clients for that. Its state is reset or refreshed when it serves.
                    if !ha::serving(&tick_gate) {
                        continue;
                    }
                    let s = svc.clone();
                    // The pass may take a while under heavy eviction: keep it off the I/O workers.
                    let _ = tokio::task::spawn_blocking(move || s.tick()).await;
                }
            }
        }
    });
    let svc = service.clone();
    tasks.spawn(rpc::serve(rpc_listener, svc, ha.clone(), stopped()));
    if cfg.enable_metric_reporting {
        let svc = service.clone();
        let report_gate = ha.clone();
        let stop = stopped();
        tasks.spawn(async move {
            tokio::pin!(stop);
            let mut every = tokio::time::interval(METRIC_REPORT_INTERVAL);
            every.tick().await; // the first tick fires at once; report after one interval
            loop {
                tokio::select! {
                    _ = &mut stop => return,
                    _ = every.tick() => {
                        if !ha::serving(&report_gate) {
                            continue;
                        }
                        let g = svc.gauges();
                        info!(
                            "keys={} allocated={}B capacity={}B ({:.1}%) clients={} segments={} soft_pinned={}",
                            g.key_count,
                            g.allocated_bytes,
                            g.total_capacity_bytes,
                            100.0 * g.allocated_bytes as f64 / g.total_capacity_bytes.max(1) as f64,
                            g.active_clients,
                            g.segments,
                            g.soft_pin_key_count
                        );
                    }
                }
            }
        });
    }
    info!(
        "mooncake_master {} serving RPC on {rpc_addr} (cluster {})",
        env!("CARGO_PKG_VERSION"),
        cfg.cluster_id()
    );

    signals.wait().await;
    info!("shutting down");
    let _ = stop_tx.send(true);
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .is_err()
    {
        warn!("some tasks did not stop within 5 s");
    }
    Ok(())
}
