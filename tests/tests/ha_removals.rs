//! The two windows versions and tombstones left open (`docs/ha.md`, "removals the owners have
//! not heard of"): removes acknowledged just before the leader dies stay removed after the
//! failover, even when the owners of the removed replicas have not been told yet.
//!
//! - `pattern_removes_survive_a_leader_kill`: `remove_by_regex` and `remove_all` free ranges
//!   at the master alone (no remover buries them in the owners' catalogs). The leader is
//!   SIGKILLed right after each is acknowledged, before the owners' next ping; the new leader
//!   rebuilds its index from the owners' re-reports and must not bring back what was removed,
//!   nor lose what was written after the removal or did not match it.
//! - `a_remove_whose_owner_is_stopped_survives_a_leader_kill`: the owner of a key's only
//!   replica is stopped (SIGSTOP) while the key is removed, so the remover cannot bury the
//!   key in its catalog (its write times out) and must hand the tombstone to the master
//!   (`KeepRemoved`, counted in the leader's metrics) before acknowledging; the leader is
//!   killed, a new one elected, the owner resumes and re-reports: the key stays removed.
//!   (The resumed owner may also apply the write it had buffered while stopped, so the last
//!   check alone would not always catch a missing hand-off; the metric does.)
//! - `a_key_of_an_owner_stopped_across_an_election_is_not_answered_missing` (the owners'
//!   registry, `docs/ha.md`): the owner of a key's only replica is stopped across an
//!   election, past the recovery fence; a get after the fence must wait for the owner's late
//!   re-report (the new leader knows it from the owners' registry in etcd) instead of
//!   answering `OBJECT_NOT_FOUND`.
//!
//! One etcd, three masters (HA), two storage nodes. Skips (passes, printing why) when
//! Debian's etcd-server is not installed.

use std::time::Duration;

use client::Store;
use mooncake_tests::{master_metric, try_http, wait_until, Etcd, Master, Node};
use protocol::{ErrorCode, ReplicateConfig};

/// Bound on the wait for a leader after a kill (the failover itself takes about 2.5 s).
const LEADER_BOUND: Duration = Duration::from_secs(20);
/// Past the owners' re-reports (a ping interval) and the recovery fence (2 s), with margin.
const SETTLE: Duration = Duration::from_secs(3);

fn ha_status(m: &Master) -> String {
    try_http("GET", m.metrics_port, "/ha_status", b"")
        .map(|r| r.text())
        .unwrap_or_default()
}

fn serving(masters: &[Master]) -> Option<usize> {
    (0..masters.len()).find(|&i| ha_status(&masters[i]) == "leading")
}

fn value(key: &str) -> Vec<u8> {
    let mut v = vec![0u8; 8192];
    for (i, b) in v.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31) ^ key.len() as u8;
    }
    v[..key.len()].copy_from_slice(key.as_bytes());
    v
}

struct Cluster {
    masters: Vec<Master>,
    args: Vec<String>,
    nodes: Vec<Node>,
    store: Store,
    _etcd: Etcd,
}

impl Cluster {
    fn start(cluster: &str) -> Option<Cluster> {
        let etcd = Etcd::start()?;
        let args = etcd.ha_master_flags(cluster, &["--default_kv_lease_ttl=200"]);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let masters: Vec<Master> = (0..3).map(|_| Master::start(&a)).collect();
        wait_until(Duration::from_secs(10), || serving(&masters).is_some())
            .expect("no master elected");
        let addr = format!("etcd://{}", etcd.addr());
        let env = [("MC_STORE_CLUSTER_ID", cluster)];
        let node_flags = ["--shards=1", "--global_segment_size=128 MB"];
        let nodes: Vec<Node> = (0..2)
            .map(|_| Node::start_at(&addr, &addr, &node_flags, &env))
            .collect();
        std::env::set_var("MC_STORE_CLUSTER_ID", cluster);
        // A write to a stopped owner fails after this many seconds, not the default 30.
        std::env::set_var("MC_TRANSFER_TIMEOUT", "2");
        let store = mooncake_tests::remote_store(&addr, &addr, 64 << 20).expect("store setup");
        wait_until(Duration::from_secs(20), || {
            store
                .put("warm-up", &value("warm-up"), &one(), true)
                .is_ok()
        })
        .expect("no put succeeded");
        Some(Cluster {
            masters,
            args,
            nodes,
            store,
            _etcd: etcd,
        })
    }

    fn kill_leader_and_replace(&mut self) {
        let leader = serving(&self.masters).expect("a leader before the kill");
        self.masters[leader].signal_and_wait(libc::SIGKILL, Duration::from_secs(5));
        self.masters.remove(leader);
        let a: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.masters.push(Master::start(&a));
    }

    fn wait_new_leader(&self) {
        wait_until(LEADER_BOUND, || serving(&self.masters).is_some()).expect("no new leader");
        std::thread::sleep(SETTLE);
    }

    /// The first key of `ks` whose only replica lives on node 0.
    fn a_key_only_on_node0(&self, ks: &[String]) -> String {
        let seg0 = &self.nodes[0].segments[0].name;
        ks.iter()
            .find(|k| {
                self.store
                    .replicas(k)
                    .expect("replicas")
                    .replicas
                    .iter()
                    .all(|r| &r.segment_name == seg0)
            })
            .expect("no key landed on node 0 alone")
            .clone()
    }

    /// The key's value, `None` when it does not exist; retries through transient errors.
    fn read(&self, key: &str) -> Option<Vec<u8>> {
        let mut last = ErrorCode::InternalError;
        for _ in 0..100 {
            match self.store.get(key).map_err(ErrorCode::from) {
                Ok(v) => return Some(v),
                Err(ErrorCode::ObjectNotFound) => return None,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{key}: reads kept failing ({last:?})");
    }
}

fn one() -> ReplicateConfig {
    ReplicateConfig {
        replica_num: 1,
        ..Default::default()
    }
}

fn put_all(c: &Cluster, keys: &[String]) {
    for k in keys {
        c.store.put(k, &value(k), &one(), true).expect("put");
    }
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[test]
fn pattern_removes_survive_a_leader_kill() {
    let _env = mooncake_tests::env_lock();
    let Some(mut c) = Cluster::start("ha_removals_pattern") else {
        return;
    };
    let doomed = keys("doomed-", 40);
    let kept = keys("kept-", 40);
    put_all(&c, &doomed);
    put_all(&c, &kept);
    // Reads grant leases; a lease would make the non-forced removal skip the key.
    std::thread::sleep(Duration::from_millis(300));
    let n = c
        .store
        .remove_by_regex("^doomed-", false)
        .expect("remove_by_regex");
    assert_eq!(n, doomed.len() as u64);
    // Written after the removal with a matching name: newer than it, so it must survive.
    c.store
        .put("doomed-late", &value("doomed-late"), &one(), true)
        .expect("put after the removal");
    c.kill_leader_and_replace();
    c.wait_new_leader();
    let back: Vec<&String> = doomed.iter().filter(|k| c.read(k).is_some()).collect();
    assert!(
        back.is_empty(),
        "{} of {} keys removed by remove_by_regex came back after the failover: {:?}",
        back.len(),
        doomed.len(),
        &back[..back.len().min(5)]
    );
    for k in kept
        .iter()
        .chain(std::iter::once(&"doomed-late".to_string()))
    {
        assert_eq!(c.read(k).as_deref(), Some(&value(k)[..]), "{k} was lost");
    }

    std::thread::sleep(Duration::from_millis(300));
    let n = c.store.remove_all(false).expect("remove_all");
    assert!(n >= kept.len() as u64, "remove_all removed {n}");
    c.kill_leader_and_replace();
    c.wait_new_leader();
    let back: Vec<&String> = kept.iter().filter(|k| c.read(k).is_some()).collect();
    assert!(
        back.is_empty(),
        "{} of {} keys removed by remove_all came back after the failover: {:?}",
        back.len(),
        kept.len(),
        &back[..back.len().min(5)]
    );
    // The cluster still takes writes of removed names.
    c.store
        .put("kept-0", &value("again"), &one(), true)
        .expect("put after remove_all");
    assert_eq!(c.read("kept-0").as_deref(), Some(&value("again")[..]));
}

#[test]
fn a_remove_whose_owner_is_stopped_survives_a_leader_kill() {
    let _env = mooncake_tests::env_lock();
    let Some(mut c) = Cluster::start("ha_removals_stopped") else {
        return;
    };
    let ks = keys("k-", 40);
    put_all(&c, &ks);
    std::thread::sleep(Duration::from_millis(300));
    let victim = c.a_key_only_on_node0(&ks);
    // SAFETY: kill(2) on a child pid the harness owns; no memory is touched.
    unsafe { libc::kill(c.nodes[0].child.id() as i32, libc::SIGSTOP) };
    // Past the read lease `replicas` granted.
    std::thread::sleep(Duration::from_millis(300));
    let removed = c.store.remove(&victim, false);
    let leader = serving(&c.masters).expect("a leader");
    let handed = master_metric(&c.masters[leader], "master_keep_removed_requests_total");
    c.kill_leader_and_replace();
    wait_until(LEADER_BOUND, || serving(&c.masters).is_some()).expect("no new leader");
    // SAFETY: as above.
    unsafe { libc::kill(c.nodes[0].child.id() as i32, libc::SIGCONT) };
    c.wait_new_leader();
    assert_eq!(
        handed,
        Some(1.0),
        "the remover did not hand the unburied tombstone to the master ({removed:?})"
    );
    match removed {
        Ok(()) => assert_eq!(
            c.read(&victim),
            None,
            "{victim}: its acknowledged remove was undone by the failover"
        ),
        // Not acknowledged: either outcome is allowed, but say what happened.
        Err(e) => println!("{victim}: remove not acknowledged ({e:?}); not checked"),
    }
    for k in ks.iter().filter(|k| **k != victim) {
        assert_eq!(c.read(k).as_deref(), Some(&value(k)[..]), "{k} was lost");
    }
}

#[test]
fn a_key_of_an_owner_stopped_across_an_election_is_not_answered_missing() {
    let _env = mooncake_tests::env_lock();
    let Some(mut c) = Cluster::start("ha_owners_stopped") else {
        return;
    };
    let ks = keys("s-", 40);
    put_all(&c, &ks);
    let victim = c.a_key_only_on_node0(&ks);
    let pid = c.nodes[0].child.id() as i32;
    // SAFETY: kill(2) on a child pid the harness owns; no memory is touched.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    c.kill_leader_and_replace();
    c.wait_new_leader(); // past the recovery fence: node 0 has not re-reported
                         // The owner resumes two seconds into the get.
    let resume = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
    let got = c.store.get(&victim).map_err(ErrorCode::from);
    resume.join().expect("resume thread");
    match got {
        Ok(v) => assert!(v == value(&victim), "{victim}: read other bytes"),
        Err(e) => panic!("{victim}: a get while its owner had not re-reported answered {e:?}"),
    }
}
