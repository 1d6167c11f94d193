//! The `mooncake_client` program as a library function, so that the binary and the Python
//! console script (`mooncake_client` from `pip install`) run the same code.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::node::{Node, NodeConfig, USAGE};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: `sigaction` is plain data, zero is a valid initial value; the handler only
        // stores to an atomic, which is async-signal-safe; the pointers are to live locals.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The `mooncake_client` program: runs a storage node with `args` (without the program name)
/// until SIGTERM or SIGINT; returns the exit code (0 stopped cleanly, 1 could not start, 2 bad
/// flags). Prints one line per mounted segment, then `mooncake_client ready`.
pub fn node_main(args: Vec<String>) -> i32 {
    let cfg = match NodeConfig::parse_args(args) {
        Ok(Some(c)) => c,
        Ok(None) => {
            print!("{USAGE}");
            return 0;
        }
        Err(e) => {
            eprintln!("mooncake_client: {e}\n\n{USAGE}");
            return 2;
        }
    };
    init_logging();
    cfg.warnings.iter().for_each(|w| tracing::warn!("{w}"));
    // The cluster secret, before any port opens: a bad setting must stop the start.
    match protocol::auth::init_process(cfg.auth_token_file.as_deref()) {
        Ok(Some(_)) => tracing::info!("cluster secret set: peers must authenticate"),
        Ok(None)
            if !cfg
                .host
                .parse()
                .is_ok_and(|ip: std::net::IpAddr| ip.is_loopback()) =>
        {
            tracing::warn!(
                "--host={}: this node's data ports answer anyone who can reach them (read and \
                 write of its segments): no cluster secret is set (--auth_token_file, \
                 MC_AUTH_TOKEN or MC_AUTH_TOKEN_FILE; docs/security.md)",
                cfg.host
            )
        }
        Ok(None) => {}
        Err(e) => {
            eprintln!("mooncake_client: {e}");
            return 2;
        }
    }
    // Every peer holds connections to every shard: lift the soft fd limit.
    let (before, after) = tuning::raise_nofile_limit();
    if after > before {
        tracing::info!("open-file limit raised from {before} to {after}");
    }
    install_signal_handlers();
    let node = match Node::start(&cfg) {
        Ok(n) => std::sync::Arc::new(n),
        Err(e) => {
            eprintln!("mooncake_client: {e}");
            return 1;
        }
    };
    let _metrics = if cfg.metrics_port != 0 {
        let n = node.clone();
        let render: crate::node::metrics::Render = std::sync::Arc::new(move || n.render_metrics());
        let bind = match http_bind(&cfg.http_host, cfg.metrics_port) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("mooncake_client: --metrics_port: {e}");
                node.shutdown();
                return 1;
            }
        };
        match crate::node::metrics::MetricsServer::start(bind, render) {
            Ok(m) => {
                println!("metrics http://{}/metrics", m.local_addr());
                Some(m)
            }
            Err(e) => {
                eprintln!("mooncake_client: cannot serve metrics on {bind}: {e}");
                node.shutdown();
                return 1;
            }
        }
    } else {
        None
    };
    let _http = match cfg.http_port {
        None => None,
        Some(port) => {
            let bind = match http_bind(&cfg.http_host, port) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("mooncake_client: --http_port: {e}");
                    node.shutdown();
                    return 1;
                }
            };
            match crate::node::metrics::serve_client_http(bind, node.clone()) {
                Ok(h) => {
                    println!("client http http://{}/health", h.local_addr());
                    Some(h)
                }
                Err(e) => {
                    eprintln!(
                        "mooncake_client: cannot serve the client HTTP server on {bind}: {e}"
                    );
                    node.shutdown();
                    return 1;
                }
            }
        }
    };
    for (i, (s, (backend, why))) in node.segments().iter().zip(node.backends()).enumerate() {
        let why = why.map(|w| format!(" ({w})")).unwrap_or_default();
        println!(
            "shard {i} segment {} te_endpoint {} base {:#x} size {} backend {backend}{why}",
            s.name, s.te_endpoint, s.base, s.size
        );
    }
    // The dummy-client service (`setup_dummy` in other processes on this host): a store client
    // of this process, without a segment of its own, serves their puts and gets.
    let _dummies = start_dummy_service(&cfg, &node);
    println!("mooncake_client ready");
    node.run(&STOP);
    node.stop(std::time::Duration::from_secs(cfg.drain_timeout_s));
    eprintln!("mooncake_client: stopped");
    0
}

/// Starts serving dummy clients on `@mooncake-rs-dummy/<--port>`; `None` (reason printed) when
/// the name is taken: the node still serves its segments. The store client dummies go through
/// is set up when the first one attaches.
fn start_dummy_service(cfg: &NodeConfig, node: &Node) -> Option<crate::dummy::DummyServer> {
    let host = node
        .segments()
        .first()
        .map(|s| s.host_id.clone())
        .unwrap_or_else(|| "127.0.0.1".into());
    let store_cfg = crate::StoreConfig {
        local_hostname: host,
        metadata_server: cfg.metadata_server.clone(),
        global_segment_size: 0,
        local_buffer_size: cfg.local_buffer_size,
        protocol: "tcp".into(),
        rdma_devices: String::new(),
        master_server_addr: cfg.master_server_address.clone(),
        tenant_id: String::new(),
        ssd_offload: None,
    };
    let store: crate::dummy::server::StoreFactory = Box::new(move || {
        crate::Store::setup(store_cfg.clone()).inspect_err(|e| {
            tracing::error!("dummy clients: store client setup failed: {e}");
        })
    });
    match crate::dummy::DummyServer::start(cfg.port, store) {
        Ok(d) => {
            println!(
                "dummy clients @{}",
                crate::dummy::wire::socket_name(cfg.port)
            );
            Some(d)
        }
        Err(e) => {
            eprintln!(
                "mooncake_client: not serving dummy clients: cannot listen on @{}: {e}",
                crate::dummy::wire::socket_name(cfg.port)
            );
            None
        }
    }
}

/// The shared set-up ([`protocol::log`]: `RUST_LOG`, `MC_YLT_LOG_LEVEL`, `MC_LOG_LEVEL`),
/// default info; logs go to stderr so stdout keeps the machine-readable start-up lines.
fn init_logging() {
    use protocol::log::{Ansi, Level, Writer};
    protocol::log::init_logging(Level::Default("info"), Writer::Stderr, Ansi::IfTerminal);
}

/// The address an HTTP endpoint of the node binds: `--http_host` (an address, or a name
/// resolved here) with `port`. A name that does not resolve is an error, never 0.0.0.0.
fn http_bind(host: &str, port: u16) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("--http_host={host}: {e}"))?
        .next()
        .ok_or_else(|| format!("--http_host={host} resolves to no address"))
}
