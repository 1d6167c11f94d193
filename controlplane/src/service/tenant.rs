//! Tenants' key spaces in the master (`protocol::tenant`).
//!
//! With `--enable_multi_tenants` a request in a tenant envelope works on that tenant's keys
//! only: its keys are rewritten to scoped keys before the request runs, and its pattern
//! removals (`RemoveByRegex`, `RemoveAll`) look at that tenant's keys only, matching the
//! pattern against the plain key. Without the flag every envelope is opened and its request
//! runs in the default tenant, as upstream shares one key space unless told otherwise.
//!
//! Invariants: a plain key never starts with NUL (such a key is blanked to `""`, which every
//! handler refuses as `INVALID_PARAMS` or reports missing), so no request reaches another
//! tenant's objects; the default tenant's pattern removals skip scoped keys; views that list
//! keys (`admin.rs`) list the default tenant's only, as upstream's HTTP views do, while counts
//! (metrics, eviction) cover every tenant.

use protocol::message::{InTenant, Request};
use protocol::tenant::{scoped_key, split_scoped, valid_plain_key, DEFAULT_TENANT};
use protocol::wire::Wire;
use protocol::ErrorCode;

use super::dispatch::run;
use super::metrics::{Metrics, Op};
use super::removals::Pick;
use super::State;

/// Runs a request that came in a tenant envelope.
pub(crate) fn dispatch_in_tenant(
    st: &mut State,
    m: &Metrics,
    now: u64,
    env: InTenant,
    out: &mut Vec<u8>,
) {
    let InTenant { tenant, inner } = env;
    let mut req = *inner;
    if !st.cfg.multi_tenants || tenant == DEFAULT_TENANT {
        blank_scoped(&mut req);
        return run(st, m, now, req, out);
    }
    match req {
        Request::RemoveByRegex(r) => {
            let ok = remove_by_regex(st, now, Some(tenant), &r.pattern, r.force, out);
            m.op(Op::RemoveByRegex, ok);
        }
        Request::RemoveAll(r) => {
            let n = remove_all(st, now, Some(tenant), r.force);
            m.op(Op::RemoveAll, n.is_ok());
            n.encode(out);
        }
        mut other => {
            for_each_key(&mut other, |k| {
                *k = if valid_plain_key(k) {
                    scoped_key(&tenant, k)
                } else {
                    String::new()
                }
            });
            run(st, m, now, other, out);
        }
    }
}

/// Blanks the keys of a default-tenant request that look scoped (see the invariants).
pub(crate) fn blank_scoped(req: &mut Request) {
    for_each_key(req, |k| {
        if !valid_plain_key(k) {
            k.clear()
        }
    });
}

/// `RemoveByRegex` in `tenant` (`None`: the default one).
pub(crate) fn remove_by_regex(
    st: &mut State,
    now: u64,
    tenant: Option<String>,
    pattern: &str,
    force: bool,
    out: &mut Vec<u8>,
) -> bool {
    let pos = out.len();
    let res = regex::Regex::new(pattern)
        .map_err(|_| ErrorCode::InvalidParams)
        .and_then(|re| {
            let want = tenant.clone();
            let pattern = pattern.to_string();
            st.remove_where(
                now,
                force,
                |k| in_tenant(k, want.as_deref()).is_some_and(|plain| re.is_match(plain)),
                |kept| Pick::Regex {
                    pattern,
                    kept,
                    tenant,
                },
            )
        });
    out.truncate(pos);
    res.encode(out);
    res.is_ok()
}

/// `RemoveAll` in `tenant` (`None`: the default one): upstream's multi-tenant master removes
/// the caller's tenant's objects only.
pub(crate) fn remove_all(
    st: &mut State,
    now: u64,
    tenant: Option<String>,
    force: bool,
) -> Result<u64, ErrorCode> {
    let want = tenant.clone();
    st.remove_where(
        now,
        force,
        |k| in_tenant(k, want.as_deref()).is_some(),
        |kept| Pick::All { kept, tenant },
    )
}

/// The plain key of held key `k` when it belongs to `tenant` (`None`: the default one).
pub(crate) fn in_tenant<'k>(k: &'k str, tenant: Option<&str>) -> Option<&'k str> {
    let (t, plain) = split_scoped(k);
    (t == tenant.unwrap_or(DEFAULT_TENANT)).then_some(plain)
}

/// The key a re-reported catalog entry is held under: scoped keys of a master without
/// tenants fold into the default tenant.
pub(crate) fn held_key(multi_tenants: bool, key: String) -> String {
    if multi_tenants {
        return key;
    }
    match split_scoped(&key) {
        (DEFAULT_TENANT, _) => key,
        (_, plain) => plain.to_string(),
    }
}

/// Calls `f` on every key a request names (patterns are not keys).
fn for_each_key(req: &mut Request, mut f: impl FnMut(&mut String)) {
    match req {
        Request::PutStart(r) => f(&mut r.key),
        Request::PutEnd(r) => f(&mut r.key),
        Request::PutRevoke(r) => f(&mut r.key),
        Request::UpsertStart(r) => f(&mut r.key),
        Request::UpsertEnd(r) => f(&mut r.key),
        Request::UpsertRevoke(r) => f(&mut r.key),
        Request::GetReplicaList(r) => f(&mut r.key),
        Request::ExistKey(r) => f(&mut r.key),
        Request::Remove(r) => f(&mut r.key),
        Request::BatchPutStart(r) => r.keys.iter_mut().for_each(&mut f),
        Request::BatchPutEnd(r) => r.keys.iter_mut().for_each(&mut f),
        Request::BatchPutRevoke(r) => r.keys.iter_mut().for_each(&mut f),
        Request::BatchUpsertStart(r) => r.keys.iter_mut().for_each(&mut f),
        Request::BatchUpsertEnd(r) => r.keys.iter_mut().for_each(&mut f),
        Request::BatchUpsertRevoke(r) => r.keys.iter_mut().for_each(&mut f),
        Request::BatchGetReplicaList(r) => r.keys.iter_mut().for_each(&mut f),
        Request::BatchExistKey(r) => r.keys.iter_mut().for_each(&mut f),
        Request::BatchRemove(r) => r.keys.iter_mut().for_each(&mut f),
        Request::BatchReplicaClear(r) => r.keys.iter_mut().for_each(&mut f),
        Request::KeepRemoved(r) => r.keys.iter_mut().for_each(&mut f),
        Request::CreateCopyTask(r) => f(&mut r.key),
        Request::CreateMoveTask(r) => f(&mut r.key),
        Request::CommitReservedPut(r) => f(&mut r.key),
        Request::ReservePut(_)
        | Request::Ping(_)
        | Request::MountSegment(_)
        | Request::ReMountSegment(_)
        | Request::ReMountDone(_)
        | Request::UnmountSegment(_)
        | Request::GracefulUnmountSegment(_)
        | Request::ServiceReady(_)
        | Request::QueryTask(_)
        | Request::FetchTasks(_)
        | Request::CompleteTask(_)
        | Request::RemoveByRegex(_)
        | Request::RemoveAll(_)
        | Request::InTenant(_) => {}
    }
}
