//! `mooncake_tune --dry-run` on this host: every check is reported, nothing is written.

use std::process::Command;

use mooncake_tests::bin_path;

#[test]
fn dry_run_reports_every_check_and_changes_nothing() {
    let before = std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap_or_default();
    let out = Command::new(bin_path("mooncake_tune"))
        .args(["--dry-run", "--hugepages", "1048576"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for check in [
        "hugepages (2 MiB) reserved",
        "transparent hugepages",
        "shared-memory transparent hugepages",
        "net.core.somaxconn",
        "io_uring",
    ] {
        assert!(text.contains(check), "{check} missing:\n{text}");
    }
    // Nobody has 2^20 hugepages: the check fails, the fix is printed, not applied.
    assert!(
        text.contains("would write 1048576 to /proc/sys/vm/nr_hugepages"),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1));
    let after = std::fs::read_to_string("/proc/sys/vm/nr_hugepages").unwrap_or_default();
    assert_eq!(before, after);
    let bad = Command::new(bin_path("mooncake_tune"))
        .arg("--bogus")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
