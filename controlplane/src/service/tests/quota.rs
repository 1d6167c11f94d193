//! Tenant quotas (`service/quota.rs`) and the ledger that charges them (`service/objects.rs`),
//! through requests in tenant envelopes, as a client set up with `tenant_id` sends them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use protocol::message::*;
use protocol::wire::Wire;
use protocol::*;

use super::quota::{parse_policy, QuotaPolicy};
use super::ServiceConfig;
use crate::model::{cfg, ScratchDir, T};
use crate::view::AdminView;

const C1: Uuid = Uuid { hi: 1, lo: 1 };

/// A policy file, and the directory holding it: keep the directory while the policy is used.
fn policy_file(name: &str, tenants: &[(&str, u64)]) -> (ScratchDir, QuotaPolicy) {
    let dir = ScratchDir::new(&format!("quota-{name}"));
    let tenants: BTreeMap<String, u64> = tenants.iter().map(|&(t, b)| (t.to_string(), b)).collect();
    let path: PathBuf = dir.0.join("quota.yaml");
    std::fs::write(&path, super::quota::render_policy(&tenants)).unwrap();
    (dir, QuotaPolicy { path, tenants })
}

fn quota_cfg(policy: QuotaPolicy) -> ServiceConfig {
    ServiceConfig {
        multi_tenants: true,
        tenant_quota: Some(policy),
        ..cfg()
    }
}

impl T {
    fn in_tenant<R: Rpc>(
        &self,
        tenant: &str,
        wrap: fn(R) -> Request,
        req: R,
    ) -> Result<R::Reply, ErrorCode> {
        let mut out = Vec::new();
        let env = InTenant {
            tenant: tenant.into(),
            inner: Box::new(wrap(req)),
        };
        self.svc.handle(Request::InTenant(env), &mut out);
        Result::<R::Reply, ErrorCode>::from_bytes(&out).expect("reply decodes exactly")
    }

    /// A whole put (or upsert) of `size` bytes with `replicas` replicas in `tenant`.
    fn put_in(
        &self,
        tenant: &str,
        key: &str,
        size: u64,
        replicas: u32,
        upsert: bool,
    ) -> Result<(), ErrorCode> {
        let config = ReplicateConfig {
            replica_num: replicas,
            ..Default::default()
        };
        if upsert {
            let req = UpsertStart {
                client_id: C1,
                key: key.into(),
                size,
                config,
            };
            self.in_tenant(tenant, Request::UpsertStart, req)?;
            let end = UpsertEnd {
                client_id: C1,
                key: key.into(),
            };
            self.in_tenant(tenant, Request::UpsertEnd, end)
        } else {
            let req = PutStart {
                client_id: C1,
                key: key.into(),
                size,
                config,
            };
            self.in_tenant(tenant, Request::PutStart, req)?;
            let end = PutEnd {
                client_id: C1,
                key: key.into(),
            };
            self.in_tenant(tenant, Request::PutEnd, end)
        }
    }

    fn exists_in(&self, tenant: &str, key: &str) -> bool {
        self.in_tenant(tenant, Request::ExistKey, ExistKey { key: key.into() })
            .unwrap()
    }

    fn charged(&self, tenant: &str) -> u64 {
        self.svc.state.lock().objects.charged(tenant)
    }

    /// The ledger kept along the way equals the one recomputed from the index.
    fn ledger_matches_the_index(&self) {
        let st = self.svc.state.lock();
        assert_eq!(st.objects.kept_ledger(), st.objects.recomputed());
        for obj in st.objects.values() {
            let memory = obj.replicas.iter().filter(|r| !r.on_disk).count();
            assert_eq!(obj.charge(), obj.size() * memory as u64);
        }
    }
}

#[test]
fn tenants_without_a_policy_are_refused_and_a_full_tenant_evicts_its_own_objects() {
    let (_dir, policy) = policy_file("admit", &[("t1", 1000), ("t2", 10_000)]);
    let t = T::with(quota_cfg(policy.clone()));
    t.mount_on(C1, 1, "seg1", 1 << 20, "h1");
    t.mount_on(C1, 2, "seg2", 1 << 20, "h2");

    // No policy: the default tenant and t3 are not registered (upstream's -1701).
    let plain = t.start_with(C1, "k", 10, ReplicateConfig::default());
    assert_eq!(plain, Err(ErrorCode::TenantNotRegistered));
    assert_eq!(
        t.put_in("t3", "k", 10, 1, false),
        Err(ErrorCode::TenantNotRegistered)
    );
    assert_eq!(t.put_in("t2", "x", 5000, 1, false), Ok(()));

    assert_eq!(t.put_in("t1", "a", 400, 1, false), Ok(()));
    t.advance(1);
    assert_eq!(t.put_in("t1", "b", 400, 1, false), Ok(()));
    assert_eq!(t.charged("t1"), 800);
    // Larger than the whole quota: refused, nothing evicted.
    assert_eq!(
        t.put_in("t1", "big", 1001, 1, false),
        Err(ErrorCode::TenantQuotaExceeded)
    );
    assert!(t.exists_in("t1", "a") && t.exists_in("t1", "b"));
    // Over the quota: the least recently read object of t1 goes, t2's stay.
    t.advance(1);
    assert_eq!(t.put_in("t1", "c", 400, 1, false), Ok(()));
    assert!(!t.exists_in("t1", "a"));
    assert!(t.exists_in("t1", "b") && t.exists_in("t1", "c") && t.exists_in("t2", "x"));
    assert_eq!(t.charged("t1"), 800);
    // Two replicas are charged twice.
    assert_eq!(t.put_in("t2", "y", 1000, 2, false), Ok(()));
    assert_eq!(t.charged("t2"), 7000);
    // An upsert is weighed without the value it replaces: 800 - 400 + 600 fits.
    assert_eq!(t.put_in("t1", "b", 600, 1, true), Ok(()));
    assert!(t.exists_in("t1", "c"));
    assert_eq!(t.charged("t1"), 1000);
    t.ledger_matches_the_index();

    // Nothing evictable (a read lease on each): refused.
    for k in ["b", "c"] {
        let r = t.in_tenant(
            "t1",
            Request::GetReplicaList,
            GetReplicaList { key: k.into() },
        );
        assert!(r.is_ok());
    }
    assert_eq!(
        t.put_in("t1", "d", 10, 1, false),
        Err(ErrorCode::TenantQuotaExceeded)
    );

    // The admin view and metrics.
    let rows = t.svc.tenant_quotas(None).unwrap();
    let t1 = &rows[0];
    assert_eq!(t1["tenant_id"], "t1");
    assert_eq!(t1["requested_quota_bytes"], 1000);
    assert_eq!(t1["effective_quota_bytes"], 1000);
    assert_eq!(t1["charged_bytes"], 1000);
    assert_eq!(t1["over_quota"], false);
    assert_eq!(t1["has_explicit_policy"], true);
    assert_eq!(rows.as_array().unwrap().len(), 2);
    let text = t.svc.render_metrics();
    assert!(text.contains("mooncake_tenant_quota_charged_bytes{tenant_id=\"t1\"} 1000\n"));
    assert!(text.contains("mooncake_tenant_evict_bytes_total{tenant_id=\"t1\"} 400\n"));
    assert!(
        text.contains("mooncake_tenant_quota_reject_total 4\n"),
        "{text}"
    );
    assert!(text.contains("mooncake_tenant_quota_allocatable_capacity_bytes 2097152\n"));
}

#[test]
fn the_admin_api_changes_the_policy_and_its_file() {
    let (_dir, policy) = policy_file("admin", &[("t1", 1000)]);
    let path = policy.path.clone();
    let t = T::with(quota_cfg(policy));
    t.mount_on(C1, 1, "seg1", 1 << 20, "h1");

    assert_eq!(t.svc.tenant_quotas(Some("nope")).unwrap_err().status, 404);
    let bad = t.svc.set_tenant_quota("t2", 0).unwrap_err();
    assert_eq!((bad.status, bad.code), (400, ErrorCode::InvalidParams));
    let row = t.svc.set_tenant_quota("t2", 5000).unwrap();
    assert_eq!(row["requested_quota_bytes"], 5000);
    let on_disk = parse_policy(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        on_disk,
        BTreeMap::from([("t1".into(), 1000), ("t2".into(), 5000)])
    );
    assert_eq!(t.put_in("t2", "k", 100, 1, false), Ok(()));

    // A tenant that holds objects keeps its policy.
    let busy = t.svc.delete_tenant_quota("t2").unwrap_err();
    assert_eq!((busy.status, busy.code), (409, ErrorCode::TenantNotEmpty));
    let r = t.in_tenant(
        "t2",
        Request::Remove,
        Remove {
            key: "k".into(),
            force: true,
        },
    );
    assert!(r.is_ok());
    assert_eq!(t.svc.delete_tenant_quota("t2"), Ok(serde_json::Value::Null));
    assert_eq!(t.svc.delete_tenant_quota("t2").unwrap_err().status, 404);
    let on_disk = parse_policy(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(on_disk, BTreeMap::from([("t1".into(), 1000)]));
    assert_eq!(
        t.put_in("t2", "k", 100, 1, false),
        Err(ErrorCode::TenantNotRegistered)
    );

    // Without a policy file the API is unavailable in this mode, as upstream's.
    let off = T::new();
    assert_eq!(off.svc.tenant_quotas(None).unwrap_err().status, 409);
}

#[test]
fn policies_asking_for_more_than_the_cluster_holds_are_scaled_down() {
    let (_dir, policy) = policy_file("scale", &[("t1", 3 << 20), ("t2", 1 << 20)]);
    let t = T::with(quota_cfg(policy));
    assert_eq!(
        t.svc.tenant_quotas(Some("t1")).unwrap()["effective_quota_bytes"],
        0
    );
    t.mount_on(C1, 1, "seg1", 2 << 20, "h1");
    assert_eq!(
        t.svc.tenant_quotas(Some("t1")).unwrap()["effective_quota_bytes"],
        3 << 19
    );
    assert_eq!(
        t.svc.tenant_quotas(Some("t2")).unwrap()["effective_quota_bytes"],
        1 << 19
    );
}

/// Every path that adds, drops or changes objects keeps the ledger equal to the index: a
/// seeded mix of puts, upserts, removes, clears, in-flight puts, evictions, unmounts and
/// re-mounts in three tenants.
#[test]
fn the_ledger_follows_every_path() {
    let (_dir, policy) = policy_file(
        "ledger",
        &[("t1", 1 << 20), ("t2", 2 << 20), ("t3", 4 << 20)],
    );
    let t = T::with(ServiceConfig {
        eviction_high_watermark_ratio: 0.5,
        ..quota_cfg(policy)
    });
    let segs = [(1u64, "s1"), (2, "s2"), (3, "s3")];
    for (n, name) in segs {
        t.mount_on(C1, n, name, 3 << 20, &format!("h{n}"));
    }
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut below = |n: u64| {
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        rng.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    };
    let (mut puts, mut cleared) = (0, 0);
    for _ in 0..3000 {
        let tenant = ["t1", "t2", "t3"][below(3) as usize];
        let key = format!("k{}", below(24));
        match below(10) {
            0..=3 => {
                let size = 1 + below(256 << 10);
                let replicas = 1 + below(2) as u32;
                puts += u32::from(
                    t.put_in(tenant, &key, size, replicas, below(2) == 0)
                        .is_ok(),
                );
            }
            4 => {
                // A put left in flight (discarded later by the tick).
                let req = PutStart {
                    client_id: C1,
                    key: key.clone(),
                    size: 1 + below(64 << 10),
                    config: ReplicateConfig::default(),
                };
                let _ = t.in_tenant(tenant, Request::PutStart, req);
            }
            5 => {
                let _ = t.in_tenant(
                    tenant,
                    Request::Remove,
                    Remove {
                        key,
                        force: below(2) == 0,
                    },
                );
            }
            6 => {
                let (_, seg) = segs[below(3) as usize];
                let req = BatchReplicaClear {
                    client_id: C1,
                    keys: vec![key],
                    segment_name: if below(2) == 0 {
                        String::new()
                    } else {
                        seg.into()
                    },
                };
                let r = t.in_tenant(tenant, Request::BatchReplicaClear, req);
                cleared += r.map_or(0, |v| v.iter().filter(|x| x.is_ok()).count());
            }
            7 => {
                let r = t.in_tenant(tenant, Request::GetReplicaList, GetReplicaList { key });
                let _ = r;
            }
            8 => {
                t.advance(below(40_000));
                t.svc.tick();
            }
            _ => {
                // A segment goes and comes back empty.
                let (n, name) = segs[below(3) as usize];
                let id = Uuid::from_parts(100, n);
                let r = t.call(
                    Request::UnmountSegment,
                    UnmountSegment {
                        client_id: C1,
                        segment_id: id,
                    },
                );
                assert_eq!(r, Ok(()));
                t.mount_on(C1, n, name, 3 << 20, &format!("h{n}"));
            }
        }
        t.ledger_matches_the_index();
    }
    // The schedule did exercise the paths.
    assert!(puts > 500, "{puts} puts");
    assert!(cleared > 20, "{cleared} clears");
    let text = t.svc.render_metrics();
    assert!(
        !text.contains("mooncake_tenant_evict_bytes_total{tenant_id=\"t1\"} 0\n"),
        "{text}"
    );
}

#[test]
fn disk_replicas_are_not_charged_and_disk_only_objects_are_not_evicted_for_a_quota() {
    let (_dir, policy) = policy_file("disk", &[("t1", 1000)]);
    let mut c = quota_cfg(policy);
    c.offload.enabled = true;
    let t = T::with(c);
    t.mount_on(C1, 1, "seg1", 1 << 20, "h1");
    let disk = Segment {
        id: Uuid::from_parts(200, 1),
        name: "seg1/disk".into(),
        base: 1 << 60,
        size: 1 << 20,
        te_endpoint: "seg1-disk".into(),
        protocol: "tcp".into(),
        host_id: "h1".into(),
        medium: ReplicaMedium::LocalDisk,
        disk: DiskPolicy::default(),
    };
    let r = t.call(
        Request::MountSegment,
        MountSegment {
            client_id: C1,
            segment: disk,
        },
    );
    assert_eq!(r, Ok(()));
    assert_eq!(t.put_in("t1", "a", 600, 1, false), Ok(()));
    let w = t
        .call(Request::FetchTasks, FetchTasks { client_id: C1 })
        .unwrap();
    assert_eq!(w.len(), 1, "the offload");
    let done = CompleteTask {
        client_id: C1,
        task_id: w[0].task_id,
        ok: true,
        message: String::new(),
    };
    assert_eq!(t.call(Request::CompleteTask, done), Ok(()));
    assert_eq!(t.charged("t1"), 600, "memory only");
    t.ledger_matches_the_index();
    // Its writer drops the memory replica: on disk only, charged nothing.
    let clear = BatchReplicaClear {
        client_id: C1,
        keys: vec!["a".into()],
        segment_name: "seg1".into(),
    };
    let r = t
        .in_tenant("t1", Request::BatchReplicaClear, clear)
        .unwrap();
    assert!(r[0].is_ok());
    assert_eq!(t.charged("t1"), 0);
    // Past the quota, the charged object goes, not the disk-only one (it frees nothing).
    assert_eq!(t.put_in("t1", "b", 600, 1, false), Ok(()));
    t.advance(1);
    assert_eq!(t.put_in("t1", "c", 600, 1, false), Ok(()));
    assert!(t.exists_in("t1", "a"));
    assert!(!t.exists_in("t1", "b"));
    assert_eq!(t.charged("t1"), 600);
    t.ledger_matches_the_index();
}
