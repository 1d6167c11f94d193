//! The node's flags: [`NodeConfig`], its defaults, the `--help` text ([`USAGE`]) and the
//! gflags-style parser of `mooncake_client`'s command line (upstream's flags plus
//! `--shards`/`--cores`, `--data_port`, `--metrics_port`, `--prefault`, `--populate`,
//! `--replica_tasks`).
//!
//! Invariants: a `NodeConfig` that [`NodeConfig::parse_args`] returns has 1..=[`SHARDS_MAX`]
//! shards, at least one byte of segment per shard, `--protocol` tcp, rdma or empty (every
//! shard serves tcp; with rdma also RDMA) and data ports that fit below 65536. Upstream flags whose features are
//! not built here are accepted and ignored. `--enable_offload=true` gives the node a disk tier
//! (`docs/tiering.md`), configured by the `MOONCAKE_OFFLOAD_*` variables as upstream's.
//! Sizes are read by [`protocol::env::parse_size`], booleans by
//! [`protocol::env::parse_flag_bool`], as in every other program of the workspace.

use std::net::IpAddr;

use protocol::env::parse_size;
use protocol::gflags::{self, Kind, Program};

use super::SHARDS_MAX;

/// The node's flags (upstream's `mooncake_client` gflags plus `--shards`/`--cores`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    pub host: String,
    pub port: u16,
    pub global_segment_size: u64,
    pub local_buffer_size: u64,
    pub master_server_address: String,
    pub metadata_server: String,
    pub protocol: String,
    pub device_names: String,
    pub threads: usize,
    pub shards: usize,
    /// First data port (shard i uses `data_port + i`); 0 picks ephemeral ports.
    pub data_port: u16,
    /// `/metrics` and `/health` port (0: off).
    pub metrics_port: u16,
    /// `--http_host` (default 127.0.0.1): the address the node's two HTTP endpoints
    /// (`--metrics_port`, `--enable_http_server`) bind; a name is resolved, never replaced by
    /// 0.0.0.0. Reaching them from another host needs this set (e.g. 0.0.0.0 for a scraper).
    pub http_host: String,
    /// `--enable_http_server` with `--http_port` (default 9300): upstream's client HTTP
    /// server (`/health` as JSON, `/metrics`, `/metrics/summary`); `None`: off.
    pub http_port: Option<u16>,
    /// Fault every segment page in at start-up.
    pub prefault: bool,
    /// `--populate` (default true): fault the segments' pages in after start-up, in a
    /// low-priority thread per shard (`dataplane::mem::populate`). Moot with `--prefault`.
    pub populate: bool,
    /// `--populate=eager`: the thread walks whether or not the CPUs are wanted (default: a
    /// chunk only while a CPU is free for it, `dataplane::mem::populate::Pace`).
    pub populate_eager: bool,
    /// `--replica_tasks` (default true): fetch and carry out the replica copy/move tasks the
    /// master assigns to this node (`store::tasks`).
    pub replica_tasks: bool,
    /// `--drain_timeout_sec` (default 30): on SIGTERM the node drains its shards' segments
    /// (`Node::drain`, `docs/fleet.md`) for at most this long before it unmounts them; 0
    /// unmounts at once.
    pub drain_timeout_s: u64,
    /// `--enable_offload` (default false): a disk tier under the node's memory, in the
    /// directory and within the limits of the `MOONCAKE_OFFLOAD_*` variables.
    pub enable_offload: bool,
    /// `--cluster_id` (default `MC_STORE_CLUSTER_ID`, else `mooncake_cluster`): which HA
    /// leader an `etcd://` master address follows, and the namespace of published descriptors
    /// (see [`dataplane::metadata::Keys::for_store`]).
    pub cluster_id: String,
    /// `--auth_token_file`: the cluster secret's file (`None`: `MC_AUTH_TOKEN` /
    /// `MC_AUTH_TOKEN_FILE` decide; see `protocol::auth`).
    pub auth_token_file: Option<std::path::PathBuf>,
    /// What the command line set that the node skips (flagfile lines gflags skips, flags
    /// `--undefok` excuses): printed at start.
    pub warnings: Vec<String>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            host: "0.0.0.0".into(),
            port: 50052,
            global_segment_size: 4 << 30,
            local_buffer_size: 0,
            master_server_address: "127.0.0.1:50051".into(),
            metadata_server: "http://127.0.0.1:8080/metadata".into(),
            protocol: "tcp".into(),
            device_names: String::new(),
            threads: 1,
            shards: 1,
            data_port: 0,
            metrics_port: 0,
            http_host: "127.0.0.1".into(),
            http_port: None,
            prefault: false,
            populate: true,
            populate_eager: false,
            replica_tasks: true,
            drain_timeout_s: 30,
            enable_offload: false,
            cluster_id: crate::store::cluster_id_from_env(),
            auth_token_file: None,
            warnings: Vec::new(),
        }
    }
}

/// Upstream flags accepted and ignored (the features behind them are not built here; the
/// mmap arena is upstream 0.3.13's allocator for its buffers, ours maps segments its own way).
const IGNORED_FLAGS: &[&str] = &[
    "tenant_id",
    "start_offload_rpc_server",
    "use_mmap_arena_allocator",
    "mmap_arena_pool_size",
];

/// Usage text for `--help`.
pub const USAGE: &str = "mooncake_client: a storage node contributing memory to a Mooncake store,
and the standalone client that dummy clients on this host (setup_dummy) put and get through

flags (--flag=value or --flag value):
  --host=0.0.0.0                 address to bind and advertise
  --port=50052                   port in segment names (host:port, host:port#i) and of the
                                 dummy-client socket @mooncake-rs-dummy/<port> that
                                 setup_dummy(..., \"host:port\") attaches to
  --global_segment_size=\"4 GB\"   memory contributed, split evenly over the shards (B/KB/MB/GB/TB)
  --local_buffer_size=0          accepted for compatibility
  --master_server_address=127.0.0.1:50051   (or etcd://h1:p1;h2:p2: follow the HA leader)
  --cluster_id=mooncake_cluster  HA cluster to follow and descriptor namespace
                                 (default: MC_STORE_CLUSTER_ID, else mooncake_cluster)
  --metadata_server=http://127.0.0.1:8080/metadata   (or etcd://h:p, a bare h:p for etcd,
                                 or P2PHANDSHAKE: publish nothing)
  --protocol=tcp                 or rdma: peers read and write the segments with one-sided
                                 RDMA (with P2PHANDSHAKE the handshake server listens on
                                 --port; with no RDMA device runs TCP with a warning,
                                 MC_REQUIRE_RDMA=1 refuses to start instead; docs/rdma.md)
  --device_names=                RDMA devices, comma-separated (empty: auto-discovery)
  --threads=1                    accepted for compatibility
  --shards=1 (alias --cores)     shards, each with its own segment and data port
  --data_port=0                  first data port (shard i: data_port+i); 0 = ephemeral
  --metrics_port=0               serve /metrics and /health on this port; 0 = off
  --enable_http_server=false     upstream's client HTTP server on --http_port (default 9300):
                                 /health (JSON), /metrics, /metrics/summary
  --http_host=127.0.0.1          address both HTTP endpoints bind (0.0.0.0: every interface,
                                 e.g. for a Prometheus on another host)
  --prefault=false               fault segment pages in at start-up, before ready (as
                                 transparent hugepages where the kernel collapses them)
  --populate=true                the same from the segment's base upwards, where the next
                                 puts land: a head before ready (1 s per 16 GiB), the rest
                                 after it by an idle-priority thread while a CPU is free,
                                 and ahead of puts that reach it (eager: whatever else
                                 runs; false: pages are faulted in by the puts that first
                                 write them; docs/deploy.md)
  --drain_timeout_sec=30         on SIGTERM, drain the segments (no new puts, only copies
                                 moved to other nodes) for at most this long; 0 = unmount now
  --replica_tasks=true           carry out the replica copy/move tasks the master assigns
                                 to this node (false: leave them to store clients)
  --enable_offload=false         a disk tier under this node's memory: objects the master
                                 offloads live in files of MOONCAKE_OFFLOAD_FILE_STORAGE_PATH
                                 (default /data/file_storage) and are read back from there;
                                 limits from the other MOONCAKE_OFFLOAD_* variables
                                 (docs/tiering.md). Needs the master's --enable_offload.
  --auth_token_file=             file holding the cluster secret (default: env MC_AUTH_TOKEN,
                                 MC_AUTH_TOKEN_FILE); peers must prove it, see docs/security.md

gflags' own flags:
  --flagfile=F[,G]               more flags from these files, one --flag=value a line
  --fromenv=a,b / --tryfromenv=a,b   flags from FLAGS_a, FLAGS_b (try: skip unset ones)
  --undefok=a,b                  ignore the unknown flags --a, --b (written --a=value)
";

/// A gflags boolean: the words of [`protocol::env::parse_flag_bool`], or nothing (`--flag`).
fn parse_bool(v: &str) -> Result<bool, String> {
    if v.trim().is_empty() {
        return Ok(true);
    }
    protocol::env::parse_flag_bool(v).ok_or_else(|| format!("expected a boolean, got {v:?}"))
}

/// The node's flags that take a value (and [`IGNORED_FLAGS`]).
const VALUE_FLAGS: &[&str] = &[
    "host",
    "port",
    "global_segment_size",
    "local_buffer_size",
    "master_server_address",
    "metadata_server",
    "cluster_id",
    "auth_token_file",
    "protocol",
    "device_names",
    "device_name",
    "threads",
    "shards",
    "cores",
    "metrics_port",
    "http_host",
    "http_port",
    "data_port",
    "drain_timeout_sec",
];

/// The node's boolean flags.
const BOOL_FLAGS: &[&str] = &[
    "enable_offload",
    "prefault",
    "populate",
    "enable_http_server",
    "replica_tasks",
];

const HELP_FLAGS: [&str; 3] = ["help", "h", "helpfull"];

fn kind(name: &str) -> Option<Kind> {
    if BOOL_FLAGS.contains(&name) || HELP_FLAGS.contains(&name) {
        Some(Kind::Bool)
    } else if VALUE_FLAGS.contains(&name) || IGNORED_FLAGS.contains(&name) {
        Some(Kind::Value)
    } else {
        None
    }
}

const PROGRAM: Program<'static> = Program {
    name: "mooncake_client",
    kind: &kind,
    stops: &HELP_FLAGS,
};

/// Flags whose effect depends on others, settled after the whole command line.
struct Pending {
    shards_set: bool,
    http_on: bool,
    http_port: u16,
}

impl NodeConfig {
    /// Parses gflags-style arguments (without the program name), with gflags' `--flagfile`,
    /// `--fromenv`, `--tryfromenv` and `--undefok` ([`protocol::gflags`]). `Ok(None)` for
    /// `--help`.
    pub fn parse_args<I: IntoIterator<Item = String>>(
        args: I,
    ) -> Result<Option<NodeConfig>, String> {
        Self::parse_args_in(args, &gflags::System)
    }

    /// [`NodeConfig::parse_args`] reading the environment and flagfiles through `sources`.
    pub fn parse_args_in<I: IntoIterator<Item = String>>(
        args: I,
        sources: &dyn gflags::Sources,
    ) -> Result<Option<NodeConfig>, String> {
        let scan = gflags::scan_in(args.into_iter().collect(), &PROGRAM, sources);
        let (settings, positional, warnings) = match scan.map_err(|e| e.to_string())? {
            gflags::Scan::Stop(_) => return Ok(None),
            gflags::Scan::Flags {
                settings,
                positional,
                warnings,
            } => (settings, positional, warnings),
        };
        if let Some(arg) = positional.first() {
            return Err(format!("unexpected argument {arg:?}"));
        }
        let mut c = NodeConfig {
            warnings,
            ..NodeConfig::default()
        };
        let mut pending = Pending {
            shards_set: false,
            http_on: false,
            http_port: crate::http_endpoint::CLIENT_HTTP_PORT_DEFAULT,
        };
        for (name, value) in settings {
            c.set(&name, value, &mut pending)?;
        }
        c.http_port = pending.http_on.then_some(pending.http_port);
        c.check()?;
        Ok(Some(c))
    }

    /// One flag of the command line (a name [`kind`] knows).
    fn set(&mut self, name: &str, value: String, pending: &mut Pending) -> Result<(), String> {
        let num = |v: &str| -> Result<u64, String> {
            v.trim()
                .parse()
                .map_err(|_| format!("--{name}: expected a number, got {v:?}"))
        };
        let port = |v: &str| -> Result<u16, String> {
            num(v)?
                .try_into()
                .map_err(|_| format!("--{name} out of range"))
        };
        let c = self;
        match name {
            "enable_offload" => c.enable_offload = parse_bool(&value)?,
            "prefault" => c.prefault = parse_bool(&value)?,
            "populate" => {
                c.populate_eager = value == "eager";
                c.populate = c.populate_eager || parse_bool(&value)?;
            }
            "enable_http_server" => pending.http_on = parse_bool(&value)?,
            "replica_tasks" => c.replica_tasks = parse_bool(&value)?,
            "host" => c.host = value,
            "port" => c.port = port(&value)?,
            "global_segment_size" => c.global_segment_size = parse_size(&value)?,
            "local_buffer_size" => c.local_buffer_size = parse_size(&value)?,
            "master_server_address" => c.master_server_address = value,
            "metadata_server" => c.metadata_server = value,
            "cluster_id" if value.trim().is_empty() => {
                return Err("--cluster_id must not be empty".into())
            }
            "cluster_id" => c.cluster_id = value.trim().to_string(),
            "auth_token_file" if value.trim().is_empty() => c.auth_token_file = None,
            "auth_token_file" => c.auth_token_file = Some(value.into()),
            "protocol" => c.protocol = value,
            "device_names" | "device_name" => c.device_names = value,
            "threads" => c.threads = num(&value)? as usize,
            "drain_timeout_sec" => c.drain_timeout_s = num(&value)?,
            "shards" => {
                c.shards = num(&value)? as usize;
                pending.shards_set = true;
            }
            "cores" if !pending.shards_set => c.shards = num(&value)? as usize,
            "metrics_port" => c.metrics_port = port(&value)?,
            "http_host" if value.trim().is_empty() => {
                return Err("--http_host must not be empty".into())
            }
            "http_host" => c.http_host = value.trim().to_string(),
            "http_port" => {
                pending.http_port = Some(port(&value)?)
                    .filter(|&p| p != 0)
                    .ok_or("--http_port out of range")?;
            }
            "data_port" => c.data_port = port(&value)?,
            _ => {} // `cores` after `shards`, and IGNORED_FLAGS
        }
        Ok(())
    }

    /// The rules between flags.
    fn check(&self) -> Result<(), String> {
        let c = self;
        if c.shards == 0 || c.shards > SHARDS_MAX {
            return Err(format!("--shards={} must be 1..={SHARDS_MAX}", c.shards));
        }
        if c.global_segment_size < c.shards as u64 {
            return Err(format!(
                "--global_segment_size={} leaves nothing for {} shards",
                c.global_segment_size, c.shards
            ));
        }
        if !matches!(
            c.protocol.to_ascii_lowercase().as_str(),
            "tcp" | "rdma" | ""
        ) {
            return Err(format!(
                "--protocol={}: this build serves tcp only",
                c.protocol
            ));
        }
        if c.data_port != 0 && u32::from(c.data_port) + c.shards as u32 > 65536 {
            return Err("--data_port + --shards exceeds 65535".into());
        }
        Ok(())
    }

    /// The host used in segment names: `--host`, or the advertised address when `--host` is
    /// unspecified (`0.0.0.0`), so names differ between machines.
    pub(super) fn host_for_names(&self, advertised: IpAddr) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(ip) if ip.is_unspecified() => advertised.to_string(),
            _ => self.host.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Result<Option<NodeConfig>, String> {
        NodeConfig::parse_args(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn the_client_http_server_flags() {
        let port = |a: &[&str]| args(a).unwrap().unwrap().http_port;
        assert_eq!(port(&[]), None);
        assert_eq!(
            port(&["--http_port=5"]),
            None,
            "off without --enable_http_server"
        );
        assert_eq!(port(&["--enable_http_server"]), Some(9300));
        assert_eq!(
            port(&["--enable_http_server=true", "--http_port", "1234"]),
            Some(1234)
        );
        assert_eq!(port(&["--http_port=7", "--enable_http_server=false"]), None);
        assert!(args(&["--enable_http_server", "--http_port=0"]).is_err());
        assert!(args(&["--http_port=70000"]).is_err());
    }

    #[test]
    fn flags() {
        let c = args(&[
            "--host=127.0.0.1",
            "--port",
            "1234",
            "--global_segment_size=64 MB",
            "-shards=2",
            "--cores=8",
            "--metadata_server",
            "P2PHANDSHAKE",
            "--tenant_id=x",
            "--use_mmap_arena_allocator=true",
            "--mmap_arena_pool_size=1073741824",
            "--prefault",
            "--noreplica_tasks",
            "--drain_timeout_sec=7",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.host, "127.0.0.1");
        assert_eq!(c.port, 1234);
        assert_eq!(c.global_segment_size, 64 << 20);
        assert_eq!(c.shards, 2, "--shards wins over --cores");
        assert!(c.prefault);
        assert!(!c.replica_tasks);
        assert!(NodeConfig::default().replica_tasks);
        assert_eq!(c.drain_timeout_s, 7);
        assert_eq!(NodeConfig::default().drain_timeout_s, 30);
        assert_eq!(args(&["--cores", "3"]).unwrap().unwrap().shards, 3);
        assert_eq!(
            args(&["--cluster_id=prod-a"]).unwrap().unwrap().cluster_id,
            "prod-a"
        );
        assert_eq!(args(&[]).unwrap().unwrap(), NodeConfig::default());
        assert_eq!(args(&["--help"]).unwrap(), None);
        assert!(
            !args(&["--enable_offload=false"])
                .unwrap()
                .unwrap()
                .enable_offload
        );
        assert!(args(&["--enable_offload"]).unwrap().unwrap().enable_offload);
        assert!(
            args(&["--enable_offload=true"])
                .unwrap()
                .unwrap()
                .enable_offload
        );
        assert!(
            !args(&["--enable_offload", "--noenable_offload"])
                .unwrap()
                .unwrap()
                .enable_offload
        );
        for bad in [
            &["--nope=1"][..],
            &["--port"],
            &["--port=70000"],
            &["--shards=0"],
            &["--protocol=nvlink"],
            &["stray"],
            &["--global_segment_size=1", "--shards=2"],
            &["--global_segment_size=4 XB"],
            &["--local_buffer_size=50%"],
            &["--cluster_id="],
            &["--enable_offload=sometimes"],
        ] {
            assert!(args(bad).is_err(), "{bad:?}");
        }
    }

    /// gflags' meta flags, with an environment and files in memory.
    #[test]
    fn gflags_meta_flags() {
        struct Fake;
        impl gflags::Sources for Fake {
            fn env(&self, name: &str) -> Option<String> {
                (name == "FLAGS_port").then(|| "4321".to_string())
            }
            fn file(&self, path: &str) -> Result<String, String> {
                match path {
                    "node.flags" => Ok("mooncake_master\n--port=1\nmooncake_client\n\
                                        --shards=3\n--noreplica_tasks\n--bogus=1\n"
                        .into()),
                    _ => Err("No such file or directory".into()),
                }
            }
        }
        let parse = |a: &[&str]| NodeConfig::parse_args_in(a.iter().map(|s| s.to_string()), &Fake);
        let c = parse(&["--flagfile=node.flags", "--fromenv=port"])
            .unwrap()
            .unwrap();
        assert_eq!((c.port, c.shards, c.replica_tasks), (4321, 3, false));
        assert_eq!(c.warnings.len(), 1, "the unknown line: {:?}", c.warnings);
        assert!(parse(&["--fromenv=host"])
            .unwrap_err()
            .contains("FLAGS_host"));
        assert_eq!(
            parse(&["--tryfromenv=host"]).unwrap().unwrap().host,
            "0.0.0.0"
        );
        assert!(parse(&["--flagfile=gone"]).unwrap_err().contains("gone"));
        let c = parse(&["--undefok=old_flag", "--old_flag=2"])
            .unwrap()
            .unwrap();
        assert_eq!(c.warnings.len(), 1);
        assert!(parse(&["--old_flag=2"]).unwrap_err().contains("old_flag"));
        assert!(!parse(&["--prefault", "false"]).unwrap().unwrap().prefault);
        assert!(NodeConfig::default().populate);
        assert!(!parse(&["--populate=false"]).unwrap().unwrap().populate);
        assert!(!parse(&["--nopopulate"]).unwrap().unwrap().populate);
        assert!(!NodeConfig::default().populate_eager);
        let eager = parse(&["--populate=eager"]).unwrap().unwrap();
        assert!(eager.populate && eager.populate_eager);
        assert!(!parse(&["--populate=true"]).unwrap().unwrap().populate_eager);
        assert!(parse(&["--populate=sometimes"]).is_err());
    }
}
