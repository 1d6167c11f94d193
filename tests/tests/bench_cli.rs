//! The benchmark binaries answer `--help` with their usage and exit 0, and a bad flag with
//! one line and exit status 2, instead of a panic and a backtrace.

use std::process::Command;

use mooncake_tests::bin_path;

const BENCHES: [&str; 6] = [
    "master_bench",
    "client_swarm",
    "group_swarm",
    "copy_bench",
    "tcp_transport_bench",
    "mooncake_bench",
];

#[test]
fn every_benchmark_answers_help_and_refuses_a_bad_flag_without_a_panic() {
    for b in BENCHES {
        let help = Command::new(bin_path(b)).arg("--help").output().expect(b);
        let out = String::from_utf8_lossy(&help.stdout);
        assert!(help.status.success(), "{b} --help: {:?}", help.status);
        assert!(out.starts_with(b), "{b} --help printed {out:?}");
        let bad = Command::new(bin_path(b))
            .arg("--no-such-flag=1")
            .output()
            .expect(b);
        let err = String::from_utf8_lossy(&bad.stderr);
        assert_eq!(bad.status.code(), Some(2), "{b}: {err}");
        assert!(!err.contains("panicked"), "{b}: {err}");
    }
}
