//! The master's command line: upstream flag syntax, clear errors for bad input.

use std::process::Command;

use mooncake_tests::bin_path;

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(bin_path("mooncake_master"))
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[test]
fn version_and_help() {
    let (code, text) = run(&["--version"]);
    assert_eq!(code, Some(0));
    assert!(text.contains("mooncake"), "{text}");
    let (code, text) = run(&["--help"]);
    assert_eq!(code, Some(0));
    assert!(text.contains("--default_kv_lease_ttl"), "{text}");
}

#[test]
fn unknown_flag_names_the_closest_known_flag() {
    let (code, text) = run(&["--eviction_ratoi=0.1"]);
    assert_ne!(code, Some(0));
    assert!(text.contains("eviction_ratio"), "{text}");
}

#[test]
fn bad_values_are_refused_at_start_up() {
    for bad in [
        "--eviction_ratio=-0.1",
        "--eviction_high_watermark_ratio=1.5",
        "--default_kv_lease_ttl=soon",
    ] {
        let (code, text) = run(&[bad]);
        assert_ne!(code, Some(0), "{bad} accepted");
        let flag = bad.trim_start_matches("--").split('=').next().unwrap();
        assert!(
            text.contains(flag),
            "error for {bad} does not name the flag: {text}"
        );
    }
}
