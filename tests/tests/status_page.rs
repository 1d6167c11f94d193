//! The master's status page (`/` on the admin port, `docs/master.md`) in a real browser.
//!
//! A master, a storage node and a store client on 127.0.0.1. Headless Chromium (Debian's
//! `chromium-headless-shell`) loads the page, runs its script (which polls `/status.json`)
//! and dumps the resulting DOM; the test checks what it shows: first the empty cluster with
//! the node's segment, then, after puts, the key count, the used bytes, the segment's object
//! count, the client list and put/lookup latencies. With `MC_STATUS_SCREENSHOT=<path.png>` it
//! also writes a screenshot of the page after the puts (how `docs/status-page.png` is made).
//!
//! Skips (passes, printing why) when the browser is not installed; `scripts/setup.sh` installs
//! it for the test suite.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use mooncake_tests::{wait_until, Master, Node};
use protocol::ReplicateConfig;

const BROWSER: &str = "chromium-headless-shell";

/// Runs the browser on `url` and returns the DOM after its scripts ran (virtual time lets the
/// page's one-second refresh run twice, so rates are shown too).
fn dom(url: &str, screenshot: Option<&Path>) -> String {
    let profile = tempdir();
    let mut cmd = Command::new(BROWSER);
    cmd.args([
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--virtual-time-budget=2500",
        "--window-size=1280,1000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    match screenshot {
        Some(p) => cmd.arg(format!("--screenshot={}", p.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = cmd.arg(url).output().expect("run the browser");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        out.status.success(),
        "{BROWSER} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tempdir() -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!(
        "mc-status-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&p).expect("temp dir");
    p
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64)
}

/// The text of the card named `name` (`<div class="card" id="card-NAME">NAME<b>VALUE</b>`).
fn card(dom: &str, name: &str) -> String {
    let start = format!("id=\"card-{name}\">{name}<b>");
    let Some(i) = dom.find(&start) else {
        panic!("no {name} card in the page:\n{dom}");
    };
    let rest = &dom[i + start.len()..];
    rest[..rest.find("</b>").expect("card closes")].to_string()
}

#[test]
fn the_status_page_shows_the_cluster_in_a_browser() {
    if Command::new(BROWSER).arg("--version").output().is_err() {
        println!("skipped: {BROWSER} is not installed (apt-get install chromium-headless-shell)");
        return;
    }
    let master = Master::start(&[]);
    let node = Node::start(&master, &["--shards=1", "--global_segment_size=64 MB"]);
    let seg = node.segments[0].name.clone();
    let url = format!("http://127.0.0.1:{}/", master.metrics_port);

    let before = dom(&url, None);
    assert_eq!(card(&before, "keys"), "0");
    assert_eq!(card(&before, "segments"), "1");
    assert!(
        before.contains(&seg),
        "the node's segment {seg} is listed:\n{before}"
    );
    assert!(
        before.contains("<div id=\"error\"></div>"),
        "no fetch error: {before}"
    );

    let store = mooncake_tests::remote_store(&master.rpc_addr(), &master.metadata_url(), 16 << 20)
        .expect("store");
    let cfg = ReplicateConfig::default();
    let value = vec![7u8; 1 << 20];
    for i in 0..12 {
        store
            .put(&format!("k{i}"), &value, &cfg, true)
            .expect("put");
    }
    for i in 0..12 {
        assert_eq!(store.get(&format!("k{i}")).expect("get").len(), value.len());
    }
    // The client's first ping has reached the master.
    wait_until(Duration::from_secs(5), || {
        let d = dom(&url, None);
        card(&d, "clients") == "2"
    })
    .expect("the store client and the node are both listed as clients");

    let after = dom(&url, None);
    assert_eq!(card(&after, "keys"), "12");
    assert!(
        card(&after, "used").starts_with("12.0 MiB"),
        "{}",
        card(&after, "used")
    );
    assert_eq!(card(&after, "quarantined"), "0");
    // The segment row: its name, state and 12 objects.
    let row_start = after.find(&format!("<td>{seg}</td>")).expect("segment row");
    let row = &after[row_start..row_start + after[row_start..].find("</tr>").unwrap()];
    // A segment mounted seconds ago is still in its admission ramp (`docs/fleet.md`).
    assert!(row.contains(">ok<") || row.contains(">ramping<"), "{row}");
    assert!(
        row.contains("<td>12</td>"),
        "12 objects on the segment: {row}"
    );
    // Latencies were measured: 12 puts, 12+ lookups.
    assert!(
        after.contains("<td>put (start to end, ms)</td><td>12</td>"),
        "{after}"
    );
    assert!(after.contains("replica lookup"), "{after}");
    // The counter table shows the puts and the rates column.
    assert!(after.contains("<td>put</td>"), "{after}");
    assert!(after.contains("per second"), "{after}");

    if let Ok(path) = std::env::var("MC_STATUS_SCREENSHOT") {
        dom(&url, Some(Path::new(&path)));
        assert!(Path::new(&path).exists(), "screenshot written to {path}");
    }
}
