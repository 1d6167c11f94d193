//! Table-driven tests of the whole flag pipeline: syntax, values, files, precedence, errors.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

fn argv(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn run(args: &[&str]) -> (MasterConfig, Vec<String>) {
    match MasterConfig::from_args(argv(args)) {
        Ok(ParsedArgs::Run(config, warnings)) => (config, warnings),
        other => panic!("{args:?}: expected Run, got {other:?}"),
    }
}

fn error(args: &[&str]) -> String {
    match MasterConfig::from_args(argv(args)) {
        Err(e) => e.to_string(),
        Ok(other) => panic!("{args:?}: expected an error, got {other:?}"),
    }
}

/// A file under the temp dir, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, contents: &str) -> TempFile {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("mooncake-config-test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        TempFile(path)
    }

    fn arg(&self, flag: &str) -> String {
        format!("--{flag}={}", self.0.display())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[test]
fn no_arguments_gives_upstream_defaults() {
    let (config, warnings) = run(&[]);
    assert_eq!(config, MasterConfig::default());
    assert!(warnings.is_empty());
    assert_eq!(config.rpc_listen_port(), 50051);
    assert_eq!(config.service, ServiceConfig::default());
    assert_eq!(config.cluster_id(), "mooncake_cluster");
    assert_eq!(config.metrics_port, 9003);
    assert_eq!(config.http_metadata_server_port, 8080);
    assert!(!config.enable_http_metadata_server);
}

#[test]
fn accepted_syntax() {
    type Check = fn(&MasterConfig) -> bool;
    let cases: &[(&[&str], Check)] = &[
        (&["--port=1234"], |c| c.port == 1234),
        (&["--port", "1234"], |c| c.port == 1234),
        (&["-port=1234"], |c| c.port == 1234),
        (&["-port", "1234"], |c| c.port == 1234),
        (&["--port=1", "--port=2"], |c| c.port == 2),
        (&["--rpc_port=7000"], |c| {
            c.rpc_listen_port() == 7000 && c.port == 50051
        }),
        (&["--port=7001"], |c| c.rpc_listen_port() == 7001),
        (&["--port=0"], |c| c.rpc_listen_port() == 0),
        (&["--enable_http_metadata_server"], |c| {
            c.enable_http_metadata_server
        }),
        (&["--enable_http_metadata_server=true"], |c| {
            c.enable_http_metadata_server
        }),
        (&["--enable_http_metadata_server=1"], |c| {
            c.enable_http_metadata_server
        }),
        (&["--enable_http_metadata_server=yes"], |c| {
            c.enable_http_metadata_server
        }),
        (&["--enable_http_metadata_server", "true"], |c| {
            c.enable_http_metadata_server
        }),
        (&["--enable_http_metadata_server", "no"], |c| {
            !c.enable_http_metadata_server
        }),
        (&["--noenable_metric_reporting"], |c| {
            !c.enable_metric_reporting
        }),
        (&["-noenable_metric_reporting"], |c| {
            !c.enable_metric_reporting
        }),
        (&["--enable_metric_reporting=0"], |c| {
            !c.enable_metric_reporting
        }),
        (&["--enable_metric_reporting=false"], |c| {
            !c.enable_metric_reporting
        }),
        (&["--noallow_evict_soft_pinned_objects"], |c| {
            !c.service.allow_evict_soft_pinned_objects
        }),
        (&["--default_kv_lease_ttl=500"], |c| {
            c.service.default_kv_lease_ttl_ms == 500
        }),
        (&["--default_kv_lease_ttl", "2s"], |c| {
            c.service.default_kv_lease_ttl_ms == 2000
        }),
        (&["--default_kv_lease_ttl=0"], |c| {
            c.service.default_kv_lease_ttl_ms == 0
        }),
        (&["--default_kv_soft_pin_ttl=5m"], |c| {
            c.service.default_kv_soft_pin_ttl_ms == 300_000
        }),
        (&["--max_kv_soft_pin_ttl=48h"], |c| {
            c.service.max_kv_soft_pin_ttl_ms == 172_800_000
        }),
        (&["--default_kv_soft_pin_ttl=250ms"], |c| {
            c.service.default_kv_soft_pin_ttl_ms == 250
        }),
        (&["--eviction_ratio=0.2"], |c| {
            c.service.eviction_ratio == 0.2
        }),
        (&["--eviction_high_watermark_ratio=1"], |c| {
            c.service.eviction_high_watermark_ratio == 1.0
        }),
        (&["--eviction_ratio=0"], |c| c.service.eviction_ratio == 0.0),
        (&["--client_ttl=60"], |c| c.service.client_ttl_s == 60),
        (&["--admission_ramp_sec=0"], |c| {
            c.service.admission_ramp_ms == 0
        }),
        (&["--admission_ramp_sec=12"], |c| {
            c.service.admission_ramp_ms == 12_000
        }),
        (&["--quarantine_grace=5s"], |c| {
            c.service.quarantine_grace_ms == 5000
        }),
        (&["--allocation_strategy=free_ratio_first"], |c| {
            c.service.allocation_strategy == AllocationStrategy::FreeRatioFirst
        }),
        (&["--allocation_strategy", "random"], |c| {
            c.service.allocation_strategy == AllocationStrategy::Random
        }),
        (
            &[
                "--put_start_discard_timeout_sec=5",
                "--put_start_release_timeout_sec=5",
            ],
            |c| {
                c.service.put_start_discard_timeout_s == 5
                    && c.service.put_start_release_timeout_s == 5
            },
        ),
        (
            &[
                "--max_total_finished_tasks=3",
                "--max_total_pending_tasks=4",
                "--max_total_processing_tasks=5",
                "--pending_task_timeout_sec=0",
                "--processing_task_timeout_sec=7",
                "--max_retry_attempts=0",
            ],
            |c| {
                c.service.tasks
                    == crate::service::TaskConfig {
                        max_finished: 3,
                        max_pending: 4,
                        max_processing: 5,
                        pending_timeout_ms: 0,
                        processing_timeout_ms: 7000,
                        max_retry_attempts: 0,
                    }
            },
        ),
        (&["--cluster_id=ci_test_cluster"], |c| {
            c.cluster_id() == "ci_test_cluster"
        }),
        (&["--cluster_id="], |c| c.cluster_id().is_empty()),
        (&["--metrics_host=::"], |c| c.metrics_host == "::"),
        (&["--metrics_port", "0"], |c| c.metrics_port == 0),
        (
            &[
                "--http_metadata_server_host=127.0.0.1",
                "--http_metadata_server_port=18080",
            ],
            |c| c.http_metadata_server_host == "127.0.0.1" && c.http_metadata_server_port == 18080,
        ),
        (&["--rpc_address=10.0.0.1"], |c| c.rpc_address == "10.0.0.1"),
        (&["--auth_token_file=/etc/mc/token"], |c| {
            c.auth_token_file.as_deref() == Some(std::path::Path::new("/etc/mc/token"))
        }),
        (&["--auth_token_file="], |c| c.auth_token_file.is_none()),
        (&["--rpc_thread_num=3"], |c| c.rpc_threads() == 3),
        (&["--rpc_thread_num=0", "--max_threads=1"], |c| {
            c.rpc_threads() == 1
        }),
        (
            &["--enable_ha", "--etcd_endpoints=http://127.0.0.1:2379"],
            |c| c.enable_ha && c.ha_connstring() == Some("http://127.0.0.1:2379"),
        ),
        (
            &[
                "--enable_ha",
                "--ha_backend_connstring=127.0.0.1:2379;127.0.0.1:2381",
                "--ha_lease_ttl_sec=5",
            ],
            |c| c.ha_connstring() == Some("127.0.0.1:2379;127.0.0.1:2381") && c.ha_lease_ttl_s == 5,
        ),
        (&["--port", "50051", "--"], |c| c.port == 50051),
    ];
    for (args, check) in cases {
        let (config, warnings) = run(args);
        assert!(check(&config), "{args:?} gave {config:?}");
        assert!(warnings.is_empty(), "{args:?} warned {warnings:?}");
    }
}

#[test]
fn upstream_ci_invocation() {
    let (config, warnings) = run(&[
        "--default_kv_lease_ttl=500",
        "--eviction_high_watermark_ratio=0.95",
        "--cluster_id=ci_test_cluster",
        "--port",
        "50051",
        "--enable_http_metadata_server=true",
    ]);
    assert!(warnings.is_empty());
    assert_eq!(config.service.default_kv_lease_ttl_ms, 500);
    assert_eq!(config.service.eviction_high_watermark_ratio, 0.95);
    assert_eq!(config.cluster_id(), "ci_test_cluster");
    assert_eq!(config.port, 50051);
    assert!(config.enable_http_metadata_server);
}

#[test]
fn rejected_values_name_flag_expectation_and_input() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--eviction_ratio=1.5"],
            &["--eviction_ratio", "[0, 1]", "\"1.5\""],
        ),
        (
            &["--eviction_ratio=-0.1"],
            &["--eviction_ratio", "[0, 1]", "\"-0.1\""],
        ),
        (
            &["--eviction_high_watermark_ratio=abc"],
            &["--eviction_high_watermark_ratio", "\"abc\""],
        ),
        (&["--port=65536"], &["--port", "0..=65535", "\"65536\""]),
        (&["--port=-1"], &["--port", "\"-1\""]),
        (&["--metrics_port=http"], &["--metrics_port", "\"http\""]),
        (&["--rpc_port=99999"], &["--rpc_port"]),
        (
            &["--http_metadata_server_port=1e3"],
            &["--http_metadata_server_port"],
        ),
        (
            &["--default_kv_lease_ttl=10d"],
            &["--default_kv_lease_ttl", "ms|s|m|h", "\"10d\""],
        ),
        (
            &["--default_kv_lease_ttl=-5"],
            &["--default_kv_lease_ttl", "\"-5\""],
        ),
        (
            &["--default_kv_soft_pin_ttl=0"],
            &["--default_kv_soft_pin_ttl", "greater than 0"],
        ),
        (
            &["--max_kv_soft_pin_ttl=0s"],
            &["--max_kv_soft_pin_ttl", "greater than 0"],
        ),
        (
            &["--default_kv_soft_pin_ttl=2h", "--max_kv_soft_pin_ttl=1h"],
            &[
                "--default_kv_soft_pin_ttl",
                "--max_kv_soft_pin_ttl",
                "7200000",
            ],
        ),
        (&["--client_ttl=0"], &["--client_ttl", "\"0\""]),
        (
            &["--admission_ramp_sec=-1"],
            &["--admission_ramp_sec", "\"-1\""],
        ),
        (&["--client_ttl=-3"], &["--client_ttl", "\"-3\""]),
        (&["--client_ttl=ten"], &["--client_ttl", "\"ten\""]),
        (&["--quarantine_grace=0"], &["--quarantine_grace"]),
        (
            &["--pending_task_timeout_sec=-1"],
            &["--pending_task_timeout_sec", "\"-1\""],
        ),
        (
            &["--put_start_discard_timeout_sec=0"],
            &["--put_start_discard_timeout_sec"],
        ),
        (
            &[
                "--put_start_discard_timeout_sec=60",
                "--put_start_release_timeout_sec=30",
            ],
            &[
                "--put_start_release_timeout_sec",
                "--put_start_discard_timeout_sec",
            ],
        ),
        (
            &["--allocation_strategy=cxl"],
            &["unsupported", "--allocation_strategy", "cxl"],
        ),
        (
            &["--allocation_strategy=local_first"],
            &["unsupported", "local_first"],
        ),
        (
            &["--allocation_strategy=ssd_free_ratio_first"],
            &["unsupported"],
        ),
        (
            &["--allocation_strategy=fastest"],
            &[
                "--allocation_strategy",
                "random or free_ratio_first",
                "\"fastest\"",
            ],
        ),
        (
            &["--enable_metric_reporting=maybe"],
            &["--enable_metric_reporting", "boolean", "\"maybe\""],
        ),
        (&["--max_threads=0"], &["--max_threads", "1..=1024"]),
        (
            &["--rpc_thread_num=5000"],
            &["--rpc_thread_num", "0..=1024"],
        ),
        (&["--metrics_host="], &["--metrics_host", "address"]),
        (&["--enable_ha"], &["--enable_ha", "--etcd_endpoints"]),
        (
            &["--enable_ha", "--ha_backend_type=redis"],
            &["--ha_backend_type", "redis", "not supported"],
        ),
        (&["--ha_lease_ttl_sec=1"], &["--ha_lease_ttl_sec", "2..=60"]),
        // Flags accepted for compatibility are still type-checked.
        (
            &["--enable_kv_events=sometimes"],
            &["--enable_kv_events", "boolean"],
        ),
        (
            &["--enable_offload=sometimes"],
            &["--enable_offload", "boolean"],
        ),
        (
            &["--offloading_queue_limit=0"],
            &["--offloading_queue_limit", "1..=100000000", "\"0\""],
        ),
        (
            &["--offloading_queue_limit=100000001"],
            &["--offloading_queue_limit", "1..=100000000"],
        ),
        (
            &["--offload_cap_ratio=1.5"],
            &["--offload_cap_ratio", "[0, 1]", "1.5"],
        ),
        (
            &["--promotion_admission_threshold=0"],
            &["--promotion_admission_threshold", "1..="],
        ),
        (
            &["--promotion_max_per_heartbeat=0"],
            &["--promotion_max_per_heartbeat", "1..="],
        ),
        (
            &["--offload_total_bytes_limit=-5"],
            &["--offload_total_bytes_limit", "non-negative"],
        ),
        (&["--enable_ha"], &["invalid flag combination"]),
        (
            &["--offload_cap_ratio=x"],
            &["--offload_cap_ratio", "a number"],
        ),
        (&["--v=loud"], &["--v", "integer"]),
        (
            &["--promotion_queue_limit=-1"],
            &["--promotion_queue_limit", "0..=4294967295"],
        ),
    ];
    for (args, needles) in cases {
        let message = error(args);
        for needle in *needles {
            assert!(
                message.contains(needle),
                "{args:?}: {message:?} lacks {needle:?}"
            );
        }
    }
}

#[test]
fn syntax_errors() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--eviction_ration=0.1"],
            &[
                "unknown flag --eviction_ration",
                "did you mean --eviction_ratio?",
            ],
        ),
        (&["--portt=1"], &["--portt", "--port?"]),
        (&["--rpc-port=1"], &["--rpc-port", "--rpc_port"]),
        (&["--metric_port", "1"], &["--metrics_port"]),
        (&["--zzzzzzzzzzzzzzzzzzzzzzzz"], &["unknown flag", "--help"]),
        (&["--port"], &["--port needs a value"]),
        (&["--cluster_id"], &["--cluster_id needs a value"]),
        (&["--flagfile"], &["--flagfile needs a value"]),
        (&["--noport"], &["--port is not a boolean"]),
        (&["--noenable_ha=true"], &["--noenable_ha takes no value"]),
        (&["50051"], &["unexpected argument \"50051\""]),
        (&["--port=1", "extra"], &["unexpected argument \"extra\""]),
        (&["--", "x"], &["unexpected argument \"x\""]),
        (&["--"], &[]),
        (&["-"], &["unexpected argument \"-\""]),
        (
            &["--config_path=/nonexistent/mooncake.json"],
            &["/nonexistent/mooncake.json", "cannot read"],
        ),
        (&["--flagfile=/nonexistent/flags"], &["/nonexistent/flags"]),
    ];
    for (args, needles) in cases {
        if needles.is_empty() {
            run(args);
            continue;
        }
        let message = error(args);
        for needle in *needles {
            assert!(
                message.contains(needle),
                "{args:?}: {message:?} lacks {needle:?}"
            );
        }
    }
}

#[test]
fn offload_flags_resolve() {
    let (config, warnings) = run(&[
        "--enable_offload",
        "--offload_on_evict=true",
        "--offload_force_evict",
        "--offloading_queue_limit=100",
        "--offload_cap_ratio=0.25",
        "--offload_total_bytes_limit=1073741824",
        "--promotion_on_hit",
        "--promotion_admission_threshold=3",
        "--promotion_max_per_heartbeat=4",
        "--promotion_queue_limit=7",
    ]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        config.service.offload,
        crate::service::OffloadConfig {
            enabled: true,
            on_evict: true,
            force_evict: true,
            queue_limit: 100,
            cap_ratio: 0.25,
            promotion_on_hit: true,
            promotion_threshold: 3,
            promotion_max_per_heartbeat: 4,
            promotion_queue_limit: 7,
            total_bytes_limit: 1 << 30,
        }
    );
    assert_eq!(
        run(&[]).0.service.offload,
        crate::service::OffloadConfig::default()
    );
}

#[test]
fn compat_flags_warn_only_when_set_away_from_default() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--enable_oplog"], &["enable_oplog"]),
        (&["--log_dir=/tmp/logs"], &["log_dir"]),
        // Upstream 0.3.13's launch lines: its mmap arena, and glog's file settings.
        (
            &[
                "--use_mmap_arena_allocator=true",
                "--max_log_size=100",
                "--nolog_prefix",
            ],
            &["use_mmap_arena_allocator", "max_log_size", "log_prefix"],
        ),
        (
            &["--stop_logging_if_full_disk", "--logbufsecs=0"],
            &["stop_logging_if_full_disk", "logbufsecs"],
        ),
        (
            &[
                "--v=2",
                "--logtostderr",
                "--alsologtostderr",
                "--minloglevel=1",
            ],
            &["v", "logtostderr", "alsologtostderr", "minloglevel"],
        ),
        (
            &["--memory_allocator=cachelib", "--rpc_interface=eth0"],
            &["memory_allocator", "rpc_interface"],
        ),
        (&["--nof_eviction_ratio", "0.3"], &["nof_eviction_ratio"]),
        (&["--noenable_disk_eviction"], &["enable_disk_eviction"]),
        (
            &[
                "--enable_offload=false",
                "--rpc_enable_tcp_no_delay=1",
                "--v=0",
            ],
            &[],
        ),
        (
            &[
                "--memory_allocator=offset",
                "--nof_eviction_high_watermark_ratio=0.9",
            ],
            &[],
        ),
    ];
    for (args, flagged) in cases {
        let (config, warnings) = run(args);
        assert_eq!(config, MasterConfig::default(), "{args:?}");
        let expected: Vec<String> = flagged
            .iter()
            .map(|f| format!("flag --{f} is accepted for compatibility but not supported"))
            .collect();
        let mut sorted = expected.clone();
        sorted.sort();
        let mut got = warnings.clone();
        got.sort();
        assert_eq!(got, sorted, "{args:?}");
    }
}

#[test]
fn help_and_version() {
    for flag in ["--help", "-help", "--helpfull", "-h"] {
        match MasterConfig::from_args(argv(&["--port=1", flag])) {
            Ok(ParsedArgs::Help(text)) => {
                assert!(text.contains("--default_kv_lease_ttl (duration; default: \"10000\")"));
                assert!(text.contains("--enable_http_metadata_server (bool; default: \"false\")"));
                assert!(text.contains("--log_dir"));
            }
            other => panic!("{flag}: {other:?}"),
        }
    }
    match MasterConfig::from_args(argv(&["--version"])) {
        Ok(ParsedArgs::Version(text)) => {
            assert_eq!(
                text,
                format!(
                    "mooncake_master (mooncake-rs) {}",
                    env!("CARGO_PKG_VERSION")
                )
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn json_config_file_and_command_line_precedence() {
    let file = TempFile::new(
        "master.json",
        r#"{
            "rpc_port": 50052,
            "metrics_port": 9100,
            "default_kv_lease_ttl": 2000,
            "default_kv_soft_pin_ttl": "10m",
            "eviction_ratio": 0.1,
            "eviction_high_watermark_ratio": 1.0,
            "client_live_ttl_sec": 60,
            "enable_http_metadata_server": true,
            "http_metadata_server_host": "127.0.0.1",
            "cluster_id": "from_file",
            "rpc_interface": "",
            "allocation_strategy": "free_ratio_first",
            "etcd_endpoints": null
        }"#,
    );
    let (config, warnings) = run(&[&file.arg("config_path")]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.config_path.as_deref(), Some(file.0.as_path()));
    assert_eq!(config.rpc_listen_port(), 50052);
    assert_eq!(config.metrics_port, 9100);
    assert_eq!(config.service.default_kv_lease_ttl_ms, 2000);
    assert_eq!(config.service.default_kv_soft_pin_ttl_ms, 600_000);
    assert_eq!(config.service.eviction_ratio, 0.1);
    assert_eq!(config.service.eviction_high_watermark_ratio, 1.0);
    assert_eq!(config.service.client_ttl_s, 60);
    assert!(config.enable_http_metadata_server);
    assert_eq!(config.http_metadata_server_host, "127.0.0.1");
    assert_eq!(config.cluster_id(), "from_file");
    assert_eq!(
        config.service.allocation_strategy,
        AllocationStrategy::FreeRatioFirst
    );

    // Explicit command-line flags win over the file, before or after --config_path.
    let (config, _) = run(&[
        "--rpc_port=6000",
        &file.arg("config_path"),
        "--client_ttl",
        "5",
        "--noenable_http_metadata_server",
    ]);
    assert_eq!(config.rpc_listen_port(), 6000);
    assert_eq!(config.service.client_ttl_s, 5);
    assert!(!config.enable_http_metadata_server);
    assert_eq!(config.metrics_port, 9100, "file values not overridden stay");
}

#[test]
fn yaml_config_file() {
    let file = TempFile::new(
        "master.yml",
        "# comment\nrpc_port: 50053\nrpc_address: 0.0.0.0\neviction_ratio: 0.2\n\
         default_kv_lease_ttl: 1s\nenable_ha: false\nmemory_allocator: offset\n",
    );
    let (config, warnings) = run(&[&file.arg("config_path")]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.rpc_port, 50053);
    assert_eq!(config.service.eviction_ratio, 0.2);
    assert_eq!(config.service.default_kv_lease_ttl_ms, 1000);
}

/// YAML details where parsers disagree (YAML 1.1 vs 1.2, strictness), pinned so that a change
/// of YAML crate that reads our config files differently fails here.
#[test]
fn yaml_config_file_details() {
    let file = TempFile::new(
        "master.yaml",
        "port: &p 40000\nmetrics_port: *p\nrpc_port: \"50053\"\ncluster_id: !!str 017\n\
         rpc_thread_num: 0x10\n",
    );
    let (config, warnings) = run(&[&file.arg("config_path")]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.port, 40000);
    assert_eq!(
        config.metrics_port, 40000,
        "an alias takes its anchor's value"
    );
    assert_eq!(
        config.rpc_port, 50053,
        "a quoted integer is a string a flag parses"
    );
    assert_eq!(
        config.cluster_id(),
        "017",
        "!!str keeps the digits as written"
    );
    assert_eq!(
        config.rpc_thread_num, 16,
        "0x10 is an integer, as YAML 1.2 reads it"
    );
    for (contents, needle) in [
        ("rpc_port: 1\nrpc_port: 2\n", "duplicate entry"),
        ("rpc_port: 1\n---\nrpc_port: 2\n", "more than one document"),
        ("rpc_port: !custom 5\n", "list or mapping"),
    ] {
        let file = TempFile::new("m.yaml", contents);
        let message = error(&[&file.arg("config_path")]);
        assert!(message.contains(needle), "{contents:?}: {message}");
    }
}

#[test]
fn config_format_detected_from_content_without_extension() {
    let json = TempFile::new("master.conf", r#"  {"metrics_port": 9200}"#);
    assert_eq!(run(&[&json.arg("config_path")]).0.metrics_port, 9200);
    let yaml = TempFile::new("master.conf", "metrics_port: 9300\n");
    assert_eq!(run(&[&yaml.arg("config_path")]).0.metrics_port, 9300);
}

#[test]
fn config_file_warnings_and_errors() {
    // Ok(needles in the warnings) or Err(needles in the error).
    type Expect = Result<&'static [&'static str], &'static [&'static str]>;
    let cases: &[(&str, &str, Expect)] = &[
        // Unknown keys and compat keys set away from default warn; upstream configs keep loading.
        (
            "a.json",
            r#"{"tenant_eviction_high_watermark_ratio": 0.9}"#,
            Ok(&["tenant_eviction_high_watermark_ratio", "ignored"]),
        ),
        (
            "a.json",
            r#"{"evicton_ratio": 0.2}"#,
            Ok(&["did you mean eviction_ratio?"]),
        ),
        (
            "a.json",
            r#"{"enable_oplog": true}"#,
            Ok(&["flag --enable_oplog is accepted for compatibility but not supported"]),
        ),
        (
            "a.json",
            r#"{"config_path": "other.json"}"#,
            Ok(&["config_path"]),
        ),
        ("a.yaml", "", Ok(&[])),
        // Errors name the file and what was wrong.
        (
            "a.json",
            r#"{"eviction_ratio": 2}"#,
            Err(&["a.json", "--eviction_ratio", "[0, 1]", "\"2\""]),
        ),
        (
            "a.json",
            r#"{"rpc_port": "x"}"#,
            Err(&["--rpc_port", "\"x\""]),
        ),
        (
            "a.json",
            r#"{"rpc_port": [1, 2]}"#,
            Err(&["a.json", "rpc_port", "list or mapping"]),
        ),
        (
            "a.json",
            r#"{"rpc_port": 1,"#,
            Err(&["a.json", "invalid JSON"]),
        ),
        ("a.json", r#"[1, 2]"#, Err(&["a.json", "JSON object"])),
        ("a.yaml", "rpc_port: [1\n", Err(&["a.yaml", "invalid YAML"])),
        ("a.yaml", "- 1\n- 2\n", Err(&["a.yaml", "YAML mapping"])),
        (
            "a.json",
            r#"{"enable_offload": "perhaps"}"#,
            Err(&["--enable_offload", "boolean"]),
        ),
        (
            "a.json",
            r#"{"allocation_strategy": "cxl"}"#,
            Err(&["unsupported", "cxl"]),
        ),
    ];
    for (name, contents, expect) in cases {
        let file = TempFile::new(name, contents);
        let args = [file.arg("config_path")];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match expect {
            Ok(needles) => {
                let (_, warnings) = run(&args);
                let joined = warnings.join("\n");
                if needles.is_empty() {
                    assert!(warnings.is_empty(), "{contents}: {warnings:?}");
                }
                for needle in *needles {
                    assert!(
                        joined.contains(needle),
                        "{contents}: {joined:?} lacks {needle:?}"
                    );
                }
            }
            Err(needles) => {
                let message = error(&args);
                for needle in *needles {
                    assert!(
                        message.contains(needle),
                        "{contents}: {message:?} lacks {needle:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn upstream_sample_configs_load() {
    // Abridged from upstream mooncake-store/conf/master.{json,yaml}.
    let json = TempFile::new(
        "master.json",
        r#"{"enable_metric_reporting": true, "metrics_port": 9003, "rpc_port": 50051,
            "rpc_thread_num": 16, "rpc_address": "0.0.0.0", "rpc_interface": "",
            "rpc_conn_timeout_seconds": 0, "rpc_enable_tcp_no_delay": true,
            "default_kv_lease_ttl": 10000, "default_kv_soft_pin_ttl": 1800000,
            "max_kv_soft_pin_ttl": 86400000, "allow_evict_soft_pinned_objects": true,
            "eviction_ratio": 0.1, "eviction_high_watermark_ratio": 1.0,
            "dynamic_replication_mode": "off", "enable_ha": false, "enable_oplog": false,
            "etcd_endpoints": "http://localhost:2379", "root_fs_dir": "",
            "cluster_id": "mooncake_cluster", "memory_allocator": "offset",
            "client_live_ttl_sec": 60, "enable_http_metadata_server": false,
            "http_metadata_server_host": "0.0.0.0", "http_metadata_server_port": 8080,
            "kv_events_tenant_id": "default", "kv_events_queue_capacity": 65536}"#,
    );
    let (config, warnings) = run(&[&json.arg("config_path")]);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(config.service.client_ttl_s, 60);
    assert_eq!(config.rpc_thread_num, 16);

    let yaml = TempFile::new(
        "master.yaml",
        "enable_metric_reporting: true\nmetrics_port: 9003\nrpc_port: 50051\n\
         rpc_address: \"0.0.0.0\"\neviction_ratio: 0.1\neviction_high_watermark_ratio: 1.0\n\
         dynamic_replication_mode: \"off\"\nclient_active_ttl_sec: 60\n\
         client_suspicion_ttl_sec: 60\nhttp_metadata_server_port: 8080\n",
    );
    let (config, warnings) = run(&[&yaml.arg("config_path")]);
    assert_eq!(config.service.client_ttl_s, 60);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("client_suspicion_ttl_sec"));
}

#[test]
fn flagfile_lines_are_command_line_flags() {
    let inner = TempFile::new("inner.flags", "--metrics_port=9500\n");
    let outer = TempFile::new(
        "outer.flags",
        &format!(
            "# master flags\n--port=40000\n\n--cluster_id=mine\n--rpc_address 10.0.0.1\n\
             --enable_http_metadata_server\nmooncake_client\n--port=1\nmooncake_m*\n{}\n",
            inner.arg("flagfile")
        ),
    );
    let (config, warnings) = run(&[&outer.arg("flagfile"), "--port=40001"]);
    assert_eq!(config.port, 40001, "later command-line flags win");
    assert_eq!(config.cluster_id(), "mine");
    assert!(config.enable_http_metadata_server);
    assert_eq!(config.metrics_port, 9500);
    // gflags skips a `--flag value` line; we say so.
    assert_eq!(config.rpc_address, MasterConfig::default().rpc_address);
    assert!(
        warnings.iter().any(|w| w.contains("rpc_address 10.0.0.1")),
        "{warnings:?}"
    );

    let looping = TempFile::new("loop.flags", "");
    std::fs::write(&looping.0, looping.arg("flagfile")).unwrap();
    let message = error(&[&looping.arg("flagfile")]);
    assert!(message.contains("nested"), "{message}");
}

#[test]
fn undefok_and_fromenv_as_gflags() {
    let (config, warnings) = run(&[
        "--undefok=nosuch,gone",
        "--nosuch=1",
        "--nogone",
        "--port=7",
    ]);
    assert_eq!(config.port, 7);
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    let message = error(&["--undefok=nosuch", "--other=1"]);
    assert!(message.contains("unknown flag --other"), "{message}");
    // A name in --fromenv that is no flag is an unknown flag, which --undefok excuses.
    let message = error(&["--fromenv=no_such_flag"]);
    assert!(message.contains("no_such_flag"), "{message}");
    run(&["--undefok=no_such_flag", "--fromenv=no_such_flag"]);

    struct Env;
    impl protocol::gflags::Sources for Env {
        fn env(&self, name: &str) -> Option<String> {
            (name == "FLAGS_client_ttl").then(|| "33".to_string())
        }
        fn file(&self, path: &str) -> Result<String, String> {
            Err(format!("no file {path}"))
        }
    }
    let scan = |args: &[&str]| super::args::scan_in(argv(args), &Env);
    let Ok(super::args::Scan::Flags(settings, _)) = scan(&["--fromenv=client_ttl"]) else {
        panic!()
    };
    assert_eq!(settings[0].0.name, "client_ttl");
    assert_eq!(settings[0].1, "33");
    let Err(message) = scan(&["--fromenv=client_ttl,port"]) else {
        panic!()
    };
    assert!(
        message.to_string().contains("FLAGS_port not found"),
        "{message}"
    );
}

#[test]
fn config_text_resolves_like_a_config_path() {
    let json = r#"{"client_live_ttl_sec": 7, "eviction_ratio": 0.1, "nope": 1}"#;
    let Ok(ParsedArgs::Run(config, warnings)) = MasterConfig::from_config_text("m.json", json)
    else {
        panic!("a valid JSON config resolves");
    };
    assert_eq!(config.service.client_ttl_s, 7);
    assert_eq!(config.service.eviction_ratio, 0.1);
    assert_eq!(
        config.config_path.as_deref(),
        Some(std::path::Path::new("m.json"))
    );
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    for (name, text) in [
        ("m.yaml", "eviction_ratio: 2\n"),
        ("m.yaml", "- a\n"),
        ("m.json", "{"),
        ("m.conf", "client_ttl: [1]\n"),
    ] {
        assert!(
            matches!(
                MasterConfig::from_config_text(name, text),
                Err(ConfigError::File { .. })
            ),
            "{name}: {text:?}"
        );
    }
}

#[test]
fn tenant_quota_policy_file() {
    let file = TempFile::new(
        "quota.yaml",
        "version: 1\ntenants:\n  - name: t1\n    quota: 2GB\n",
    );
    let uri = format!("--tenant_quota_connector_uri={}", file.0.display());
    let (c, warnings) = run(&["--enable_multi_tenants", &uri]);
    assert!(warnings.is_empty(), "{warnings:?}");
    let policy = c.service.tenant_quota.expect("policy loaded");
    assert_eq!(policy.tenants.get("t1"), Some(&(2 << 30)));
    // Read only with tenants on; without a URI there are no quotas.
    assert_eq!(run(&[&uri]).0.service.tenant_quota, None);
    assert_eq!(
        run(&["--enable_multi_tenants"]).0.service.tenant_quota,
        None
    );
    // A bad file, or another connector, stops the master with the reason.
    let bad = TempFile::new("bad.yaml", "version: 2\n");
    let e = error(&[
        "--enable_multi_tenants",
        &format!("--tenant_quota_connector_uri={}", bad.0.display()),
    ]);
    assert!(
        e.contains("unsupported tenant quota policy version: 2"),
        "{e}"
    );
    let e = error(&[
        "--enable_multi_tenants",
        "--tenant_quota_connector_uri=/nonexistent/q.yaml",
    ]);
    assert!(e.contains("failed to open tenant quota policy file"), "{e}");
    let e = error(&[
        "--enable_multi_tenants",
        &uri,
        "--tenant_quota_connector_type=etcd",
    ]);
    assert!(
        e.contains("tenant_quota_connector_type") && e.contains("file"),
        "{e}"
    );
}

#[test]
fn kv_event_flags_resolve() {
    let (config, warnings) = run(&[
        "--enable_kv_events",
        "--kv_events_bind_endpoint=tcp://127.0.0.1:6000",
        "--kv_events_backend_id=pool-7",
        "--kv_events_tenant_id=acme",
        "--kv_events_dp_rank=2",
        "--nokv_events_emit_legacy_compat",
        "--kv_events_emit_object_key=false",
        "--kv_events_queue_capacity=8",
    ]);
    assert!(warnings.is_empty(), "{warnings:?}");
    let k = &config.kv_events;
    assert!(k.enabled);
    assert_eq!(k.endpoint, "tcp://127.0.0.1:6000");
    assert_eq!(k.backend_id, "pool-7");
    assert_eq!(k.tenant_id, "acme");
    assert_eq!(k.dp_rank, 2);
    assert!(!k.emit_legacy_compat && !k.emit_object_key);
    assert_eq!(k.queue_capacity, 8);
    assert_eq!(
        run(&[]).0.kv_events,
        crate::events::KvEventsConfig::default()
    );
    for bad in [
        "--kv_events_queue_capacity=0",
        "--kv_events_queue_capacity=16777217",
    ] {
        let message = error(&[bad]);
        assert!(message.contains("1..=16777216"), "{message}");
    }
}
