//! Small puts committed in one master round trip (`client::store::reserve`), through real
//! processes: a master, a storage node and store clients on one host. The puts after a
//! client's first take one master call each; the first writer of a key still wins, and the
//! loser's reserved range serves its next put; and the objects come back, byte for byte,
//! after the master is killed and restarted (their owners' catalogs re-report them: the
//! provisional record became the object when its commit was published).

use std::time::Duration;

use mooncake_tests::{master_metric, Master, Node};
use protocol::{ErrorCode, ReplicateConfig};

/// Longer than the owners' ping interval, so freed ranges reached them before the kill.
const SETTLE: Duration = Duration::from_millis(1500);
const RECOVERY_BOUND: Duration = Duration::from_secs(10);

fn metric(m: &Master, name: &str) -> u64 {
    master_metric(m, name).unwrap_or(0.0) as u64
}

fn value(i: usize, salt: u8) -> Vec<u8> {
    // KV-page-like sizes, a tiny one, and the largest a reserved put takes.
    let len = match i % 4 {
        0..=1 => 4096,
        2 => 1 + i,
        _ => 1 << 20,
    };
    (0..len)
        .map(|k| (k as u8).wrapping_mul(31).wrapping_add(i as u8) ^ salt)
        .collect()
}

fn store(master: &Master) -> client::Store {
    mooncake_tests::remote_store(&master.rpc_addr(), &master.metadata_url(), 64 << 20)
        .expect("setup")
}

#[test]
fn small_puts_commit_in_one_round_trip_and_survive_a_master_restart() {
    let _env = mooncake_tests::env_lock();
    let master = Master::start(&[]);
    let (rpc, metrics, http) = (
        master.rpc_port,
        master.metrics_port,
        master.http_metadata_port,
    );
    let _node = Node::start(&master, &["--shards=1", "--global_segment_size=256 MB"]);
    let a = store(&master);
    let cfg = ReplicateConfig::default();
    let n = 120;
    for i in 0..n {
        assert_eq!(a.put(&format!("a/{i}"), &value(i, 0), &cfg, false), Ok(()));
    }
    // Sizes that repeat (4 KiB) commit in one round trip after the first put of the size
    // (which finds the node's segment), whose next reservation each commit hands out; sizes
    // that do not (the tiny ones) or are too large (1 MiB) go the usual way, reserving
    // nothing.
    let committed = metric(&master, "master_put_reservations_committed_total");
    let starts = metric(&master, "master_put_start_requests_total");
    let pages = (0..n).filter(|i| i % 4 <= 1).count() as u64;
    assert_eq!(
        committed + starts,
        n as u64,
        "every put is one or the other"
    );
    assert_eq!(committed, pages - 1, "every 4 KiB put but the first");
    assert_eq!(
        metric(&master, "master_put_reservations_total"),
        committed + 1,
        "one reservation asked for, the rest handed out with the commits"
    );
    for i in 0..n {
        let got = a.get(&format!("a/{i}")).expect("get");
        assert_eq!(got, value(i, 0), "a/{i}");
    }

    // A second client writing the same keys loses to the first; its reservation, refused,
    // takes its next key.
    let b = store(&master);
    assert_eq!(b.put("b/first", &value(0, 9), &cfg, false), Ok(()));
    for i in 0..8 {
        assert_eq!(b.put(&format!("a/{i}"), &value(i, 7), &cfg, false), Ok(()));
    }
    assert!(metric(&master, "master_put_reservations_refused_total") >= 1);
    for i in 0..8 {
        assert_eq!(
            b.get(&format!("a/{i}")).unwrap(),
            value(i, 0),
            "first write wins"
        );
        assert_eq!(b.put(&format!("b/{i}"), &value(i, 5), &cfg, false), Ok(()));
        assert_eq!(a.get(&format!("b/{i}")).unwrap(), value(i, 5), "b/{i}");
    }
    // Removed ones stay removed across the restart.
    for i in (0..n).step_by(10) {
        assert_eq!(a.remove(&format!("a/{i}"), true), Ok(()));
    }
    std::thread::sleep(SETTLE);

    let mut master = master;
    assert!(master
        .signal_and_wait(libc::SIGKILL, Duration::from_secs(5))
        .is_some());
    drop(master);
    std::thread::sleep(Duration::from_millis(5));
    let master = Master::start_on(rpc, metrics, http, &[]);
    let live: Vec<usize> = (0..n).filter(|i| i % 10 != 0).collect();
    let back = mooncake_tests::wait_until(RECOVERY_BOUND, || {
        live.iter()
            .all(|i| a.is_exist(&format!("a/{i}")) == Ok(true))
    });
    assert!(back.is_some(), "the reserved puts' objects came back");
    for &i in &live {
        assert_eq!(a.get(&format!("a/{i}")).unwrap(), value(i, 0), "a/{i}");
    }
    for i in 0..8 {
        assert_eq!(a.get(&format!("b/{i}")).unwrap(), value(i, 5), "b/{i}");
    }
    for i in (0..n).step_by(10) {
        assert_eq!(
            a.get(&format!("a/{i}")).map(|_| ()).map_err(|e| e.code),
            Err(ErrorCode::ObjectNotFound),
            "a/{i} was removed"
        );
    }
    // After the restart the clients' reservations are gone: their next puts find out, go
    // the usual way, and reserve again.
    for i in 0..20 {
        assert_eq!(
            a.put(&format!("after/{i}"), &value(i, 3), &cfg, false),
            Ok(())
        );
        assert_eq!(a.get(&format!("after/{i}")).unwrap(), value(i, 3));
    }
    let pages = (0..20).filter(|i| i % 4 <= 1).count() as u64;
    assert_eq!(
        metric(&master, "master_put_reservations_committed_total"),
        pages - 1,
        "all 4 KiB puts but the one that found its reservation gone"
    );
}

#[test]
fn a_store_told_not_to_puts_the_usual_way() {
    let _env = mooncake_tests::env_lock();
    std::env::set_var("MC_STORE_RESERVED_PUT", "0");
    let master = Master::start(&[]);
    let _node = Node::start(&master, &["--shards=1", "--global_segment_size=64 MB"]);
    let a = store(&master);
    std::env::remove_var("MC_STORE_RESERVED_PUT");
    for i in 0..10 {
        let v = value(i, 1);
        assert_eq!(
            a.put(&format!("k{i}"), &v, &ReplicateConfig::default(), false),
            Ok(())
        );
        assert_eq!(a.get(&format!("k{i}")).unwrap(), v);
    }
    assert_eq!(metric(&master, "master_put_reservations_total"), 0);
    assert_eq!(metric(&master, "master_put_start_requests_total"), 10);
}
