//! From a decoded [`Request`] to the encoded `Result<Reply, ErrorCode>` bytes.
//!
//! Replies are written straight into the caller's buffer in the wire format of
//! `protocol::message` (an `i32` status, then the value when the status is 0), without
//! building the reply structs: replica descriptors are encoded from the object and segment
//! tables as they are. Tests decode every reply with the protocol types to hold this to the
//! format.

use protocol::message::{CommitReservedPut, Request, ReservePut};
use protocol::tenant::valid_plain_key;
use protocol::wire::{encode_str, Wire};
use protocol::{
    ClientStatus, ErrorCode, PingResponse, ReplicaDescriptorRef, ReplicaStatus, ReplicateConfig,
    ReservedCommit, Uuid, Version,
};

use super::clear::Cleared;
use super::metrics::{BatchOp, Metrics, Op};
use super::object::{check_key, Object, Start};
use super::removals::{Pick, Removal};
use super::segments::{PingNews, Segments};
use super::tenant;
use super::State;

/// What `ServiceReady` answers.
pub const VERSION: &str = concat!("mooncake-rs ", env!("CARGO_PKG_VERSION"));

/// Writes an OK status, lets `f` append the value, and on error replaces both with the error
/// code. Returns whether `f` succeeded.
#[inline]
fn reply(out: &mut Vec<u8>, f: impl FnOnce(&mut Vec<u8>) -> Result<(), ErrorCode>) -> bool {
    let pos = out.len();
    out.extend_from_slice(&0i32.to_le_bytes());
    match f(out) {
        Ok(()) => true,
        Err(e) => {
            out.truncate(pos);
            e.encode(out);
            false
        }
    }
}

/// A `Result<(), ErrorCode>`.
#[inline]
fn status(out: &mut Vec<u8>, r: Result<(), ErrorCode>) -> bool {
    r.encode(out);
    r.is_ok()
}

/// `Vec<ReplicaDescriptor>` of an object: all replicas, or only COMPLETE ones. Memory replicas
/// come before disk replicas (a memory read is the fast one; a disk replica is the fallback,
/// `docs/tiering.md`), and within each medium replicas in quarantined segments come last, so
/// a reader tries the reachable ones first.
pub(crate) fn encode_replicas(out: &mut Vec<u8>, obj: &Object, segs: &Segments, readable: bool) {
    let count_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut n = 0u32;
    let order = [(false, false), (false, true), (true, false), (true, true)];
    let ordered = order.into_iter().flat_map(|(disk, q)| {
        obj.replicas.iter().filter(move |r| {
            segs.get(r.seg)
                .is_some_and(|s| s.quarantined == q && s.is_disk() == disk)
        })
    });
    for r in ordered {
        if readable && r.status != ReplicaStatus::Complete {
            continue;
        }
        let Some(seg) = segs.get(r.seg) else {
            continue;
        };
        ReplicaDescriptorRef {
            status: r.status,
            medium: seg.medium,
            segment_name: &seg.name,
            transport_endpoint: &seg.te_endpoint,
            buffer_address: r.span.addr,
            size: obj.size(),
            version: obj.version,
        }
        .encode(out);
        n += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&n.to_le_bytes());
}

/// Runs a request as it came off the wire: one in a tenant envelope in its tenant
/// (`tenant.rs`), any other in the default tenant.
pub(crate) fn dispatch(st: &mut State, m: &Metrics, now: u64, mut req: Request, out: &mut Vec<u8>) {
    if let Request::InTenant(env) = req {
        return tenant::dispatch_in_tenant(st, m, now, env, out);
    }
    tenant::blank_scoped(&mut req);
    run(st, m, now, req, out)
}

/// Runs a request whose keys are the keys held (scoped for a named tenant).
/// The answer to a ping: whether the master knows `client`, the ranges freed in its segments,
/// and the term of this master's versions (the HA view version; without HA the start time in
/// ms), at which owners fence their catalogs (`Catalog::fence`).
fn ping(st: &mut State, now: u64, client: Uuid) -> PingResponse {
    let mut news = PingNews::default();
    let status = if st.ping(now, client, &mut news) {
        ClientStatus::Ok
    } else {
        ClientStatus::NeedRemount
    };
    PingResponse {
        view_version: i64::try_from(st.term).unwrap_or(i64::MAX),
        status,
        freed: news.freed,
        draining: news.draining,
    }
}

pub(crate) fn run(st: &mut State, m: &Metrics, now: u64, req: Request, out: &mut Vec<u8>) {
    match req {
        Request::InTenant(env) => {
            // Decoding refuses nested envelopes; one built in process runs as on the wire.
            tenant::dispatch_in_tenant(st, m, now, env, out)
        }
        Request::Ping(r) => {
            let resp = ping(st, now, r.client_id);
            m.op(Op::Ping, true);
            Ok::<_, ErrorCode>(resp).encode(out);
        }
        Request::MountSegment(r) => {
            let res = st.mount(now, r.client_id, r.segment).map(|_| ());
            m.op(Op::MountSegment, status(out, res));
        }
        Request::ReMountSegment(r) => {
            let res = st.remount(now, r.client_id, r.segments, r.held);
            m.op(Op::RemountSegment, status(out, res));
        }
        Request::ReMountDone(r) => {
            st.owner_reported(r.client_id, now);
            m.op(Op::RemountSegment, status(out, Ok(())));
        }
        Request::UnmountSegment(r) => {
            let res = st.unmount(r.client_id, r.segment_id);
            m.op(Op::UnmountSegment, status(out, res));
        }
        Request::GracefulUnmountSegment(r) => {
            let res = st.graceful_unmount(now, r.client_id, r.segment_id, r.grace_ms);
            m.op(Op::GracefulUnmountSegment, status(out, res));
        }
        Request::ReservePut(r) => reserve_put(st, m, now, r, out),
        Request::CommitReservedPut(r) => commit_reserved_put(st, m, now, r, out),
        Request::ServiceReady(_) => {
            0i32.encode(out);
            encode_str(VERSION, out);
            m.op(Op::ServiceReady, true);
        }
        Request::CreateCopyTask(r) => {
            let res = st.create_task(now, &r.key, None, r.targets);
            m.op(Op::CreateCopyTask, res.is_ok());
            res.encode(out);
        }
        Request::CreateMoveTask(r) => {
            let res = st.create_task(now, &r.key, Some(&r.source), vec![r.target]);
            m.op(Op::CreateMoveTask, res.is_ok());
            res.encode(out);
        }
        Request::QueryTask(r) => {
            let res = st.query_task(&r.task_id).map(|mut t| {
                // The master's clock is monotonic; upstream answers wall-clock times.
                let wall = crate::clock::wall_ms();
                t.created_at_ms_epoch =
                    wall.saturating_sub(now.saturating_sub(t.created_at_ms_epoch));
                t.last_updated_at_ms_epoch =
                    wall.saturating_sub(now.saturating_sub(t.last_updated_at_ms_epoch));
                t
            });
            m.op(Op::QueryTask, res.is_ok());
            res.encode(out);
        }
        Request::FetchTasks(r) => {
            let work = st.fetch_tasks(now, r.client_id);
            m.op(Op::FetchTasks, true);
            Ok::<_, ErrorCode>(work).encode(out);
        }
        Request::CompleteTask(r) => {
            let res = st.complete_task(now, r.client_id, r.task_id, r.ok, r.message);
            m.op(Op::CompleteTask, status(out, res));
        }
        Request::PutStart(r) => {
            let ok = put_start(
                st,
                m,
                now,
                r.client_id,
                r.key,
                r.size,
                &r.config,
                false,
                out,
            );
            m.op(Op::PutStart, ok);
        }
        Request::UpsertStart(r) => {
            let ok = put_start(st, m, now, r.client_id, r.key, r.size, &r.config, true, out);
            m.op(Op::UpsertStart, ok);
        }
        Request::PutEnd(r) => {
            let res = st.put_end(m, now, r.client_id, &r.key);
            m.op(Op::PutEnd, status(out, res));
        }
        Request::UpsertEnd(r) => {
            let res = st.put_end(m, now, r.client_id, &r.key);
            m.op(Op::UpsertEnd, status(out, res));
        }
        Request::PutRevoke(r) => {
            let res = st.put_revoke(r.client_id, &r.key);
            m.op(Op::PutRevoke, status(out, res));
        }
        Request::UpsertRevoke(r) => {
            let res = st.put_revoke(r.client_id, &r.key);
            m.op(Op::UpsertRevoke, status(out, res));
        }
        Request::GetReplicaList(r) => {
            let t = std::time::Instant::now();
            let ok = get_replica_list(st, now, &r.key, out);
            m.lookup_us.record(t.elapsed().as_micros() as u64);
            m.op(Op::GetReplicaList, ok);
        }
        Request::ExistKey(r) => {
            let exists = st.exist(now, &r.key);
            m.op(Op::ExistKey, exists.is_ok());
            exists.encode(out);
        }
        Request::Remove(r) => {
            let ok = remove(st, now, &r.key, r.force, out);
            m.op(Op::Remove, ok);
        }
        Request::RemoveByRegex(r) => {
            let ok = tenant::remove_by_regex(st, now, None, &r.pattern, r.force, out);
            m.op(Op::RemoveByRegex, ok);
        }
        Request::RemoveAll(r) => {
            let n = tenant::remove_all(st, now, None, r.force);
            m.op(Op::RemoveAll, n.is_ok());
            n.encode(out);
        }
        Request::KeepRemoved(r) => {
            let ok = reply(out, |o| {
                keep_removed(st, r.keys, r.versions)?;
                ().encode(o);
                Ok(())
            });
            m.op(Op::KeepRemoved, ok);
        }
        Request::BatchPutStart(r) => {
            batch_put_start(
                st,
                m,
                now,
                r.client_id,
                r.keys,
                r.sizes,
                &r.config,
                false,
                out,
            );
        }
        Request::BatchUpsertStart(r) => {
            batch_put_start(
                st,
                m,
                now,
                r.client_id,
                r.keys,
                r.sizes,
                &r.config,
                true,
                out,
            );
        }
        Request::BatchPutEnd(r) => {
            batch_status(m, BatchOp::PutEnd, &r.keys, out, |k| {
                st.put_end(m, now, r.client_id, k)
            });
        }
        Request::BatchUpsertEnd(r) => {
            batch_status(m, BatchOp::UpsertEnd, &r.keys, out, |k| {
                st.put_end(m, now, r.client_id, k)
            });
        }
        Request::BatchPutRevoke(r) => {
            batch_status(m, BatchOp::PutRevoke, &r.keys, out, |k| {
                st.put_revoke(r.client_id, k)
            });
        }
        Request::BatchUpsertRevoke(r) => {
            batch_status(m, BatchOp::UpsertRevoke, &r.keys, out, |k| {
                st.put_revoke(r.client_id, k)
            });
        }
        Request::BatchRemove(r) => {
            0i32.encode(out);
            (r.keys.len() as u32).encode(out);
            let mut failed = 0;
            for k in &r.keys {
                failed += !remove(st, now, k, r.force, out) as u64;
            }
            m.batch(BatchOp::Remove, r.keys.len() as u64, failed);
        }
        Request::BatchReplicaClear(r) => {
            0i32.encode(out);
            (r.keys.len() as u32).encode(out);
            // "" names every segment: the whole object goes.
            let segment = Some(r.segment_name.as_str()).filter(|s| !s.is_empty());
            let mut failed = 0;
            for k in &r.keys {
                let ok = reply(out, |o| {
                    match st.replica_clear(now, r.client_id, k, segment)? {
                        Cleared::Object(obj) => encode_replicas(o, &obj, &st.segs, false),
                        Cleared::Replica => 0u32.encode(o),
                    }
                    Ok(())
                });
                failed += !ok as u64;
            }
            m.batch(BatchOp::ReplicaClear, r.keys.len() as u64, failed);
        }
        Request::BatchGetReplicaList(r) => {
            let t = std::time::Instant::now();
            0i32.encode(out);
            (r.keys.len() as u32).encode(out);
            let mut failed = 0;
            for k in &r.keys {
                failed += !get_replica_list(st, now, k, out) as u64;
            }
            m.batch(BatchOp::GetReplicaList, r.keys.len() as u64, failed);
            m.lookup_us.record(t.elapsed().as_micros() as u64);
        }
        Request::BatchExistKey(r) => {
            out.reserve(8 + 5 * r.keys.len());
            0i32.encode(out);
            (r.keys.len() as u32).encode(out);
            let mut failed = 0;
            for k in &r.keys {
                failed += !exist_item(st, now, k, out) as u64;
            }
            m.batch(BatchOp::ExistKey, r.keys.len() as u64, failed);
        }
    }
}

/// `ReservePut` (`reserve.rs`).
fn reserve_put(st: &mut State, m: &Metrics, now: u64, r: ReservePut, out: &mut Vec<u8>) {
    let res = st.reserve_put(m, now, r.client_id, r.size, &r.host_id);
    m.op(Op::ReservePut, res.is_ok());
    res.encode(out);
}

/// `CommitReservedPut` (`reserve.rs`).
fn commit_reserved_put(
    st: &mut State,
    m: &Metrics,
    now: u64,
    r: CommitReservedPut,
    out: &mut Vec<u8>,
) {
    let res = st.commit_reserved_put(m, now, r.client_id, r.key, &r.reserved, &r.next_host_id);
    m.op(Op::CommitReservedPut, res.is_ok());
    res.map(|(version, next)| ReservedCommit { version, next })
        .encode(out);
}

/// The answer to a started put (`Vec<ReplicaDescriptor>`) or upsert (`UpsertStarted`: the
/// replicas, then the soft pin its writer records, `Object::soft_pin_left_ms`).
fn encode_started(out: &mut Vec<u8>, obj: &Object, segs: &Segments, now: u64, upsert: bool) {
    encode_replicas(out, obj, segs, false);
    if upsert {
        obj.soft_pin_left_ms(now).encode(out);
    }
}

/// PutStart / UpsertStart. `prefer_alloc_in_same_node` is refused on the single form as
/// upstream's `Put` refuses it.
#[allow(clippy::too_many_arguments)]
fn put_start(
    st: &mut State,
    m: &Metrics,
    now: u64,
    client: Uuid,
    key: String,
    size: u64,
    cfg: &ReplicateConfig,
    upsert: bool,
    out: &mut Vec<u8>,
) -> bool {
    reply(out, |o| {
        if cfg.prefer_alloc_in_same_node {
            return Err(ErrorCode::InvalidParams);
        }
        // A single put names one group or none (upstream refuses an empty list too; the
        // wire cannot tell it from none, so the client refuses it).
        let group = match cfg.group_ids.as_slice() {
            [] => None,
            [g] => Some(g.as_str()),
            _ => return Err(ErrorCode::InvalidParams),
        };
        let (obj, segs) =
            st.put_start(m, now, client, key, size, cfg, group, upsert, Start::Call)?;
        encode_started(o, obj, segs, now, upsert);
        Ok(())
    })
}

/// Remove: the freed replicas (with the removed version), for the remover to bury.
fn remove(st: &mut State, now: u64, key: &str, force: bool, out: &mut Vec<u8>) -> bool {
    reply(out, |o| {
        let obj = st.remove(now, key, force)?;
        encode_replicas(o, &obj, &st.segs, false);
        Ok(())
    })
}

/// One item of a batch existence probe: a missing or unready key is `false`; the only error
/// is the recovery fence after an election.
fn exist_item(st: &mut State, now: u64, key: &str, out: &mut Vec<u8>) -> bool {
    match st.exist(now, key) {
        Ok(e) => {
            out.extend_from_slice(&[0, 0, 0, 0, e as u8]);
            true
        }
        Err(e) => {
            e.encode(out);
            false
        }
    }
}

fn get_replica_list(st: &mut State, now: u64, key: &str, out: &mut Vec<u8>) -> bool {
    reply(out, |o| {
        let (obj, segs) = st.read(now, key, true)?;
        encode_replicas(o, obj, segs, true);
        // The reader's window (`object.rs`, "Read windows").
        super::object::told_window_ms(obj.read_window_until().saturating_sub(now)).encode(o);
        Ok(())
    })
}

/// Batch PutStart / UpsertStart: one `Result` of the single form's answer per key. Mismatched
/// `keys`/`sizes` lengths, `group_ids` neither empty nor one per key, or
/// `prefer_alloc_in_same_node` with more than one replica, fail every item with
/// `INVALID_PARAMS`.
#[allow(clippy::too_many_arguments)]
fn batch_put_start(
    st: &mut State,
    m: &Metrics,
    now: u64,
    client: Uuid,
    keys: Vec<String>,
    sizes: Vec<u64>,
    cfg: &ReplicateConfig,
    upsert: bool,
    out: &mut Vec<u8>,
) {
    let op = if upsert {
        BatchOp::UpsertStart
    } else {
        BatchOp::PutStart
    };
    let n = keys.len();
    0i32.encode(out);
    (n as u32).encode(out);
    let mut failed = 0u64;
    let grouped = !cfg.group_ids.is_empty();
    if keys.len() != sizes.len()
        || (cfg.prefer_alloc_in_same_node && cfg.replica_num != 1)
        || (grouped && cfg.group_ids.len() != n)
    {
        for _ in 0..n {
            ErrorCode::InvalidParams.encode(out);
        }
        m.batch(op, n as u64, n as u64);
        return;
    }
    let mut named = std::collections::HashSet::with_capacity(n);
    for (i, (key, size)) in keys.into_iter().zip(sizes).enumerate() {
        let group = cfg.group_ids.get(i).map(String::as_str);
        let start = match named.insert(key.clone()) {
            true => Start::Call,
            false => Start::Repeat,
        };
        let ok = reply(out, |o| {
            let (obj, segs) = st.put_start(m, now, client, key, size, cfg, group, upsert, start)?;
            encode_started(o, obj, segs, now, upsert);
            Ok(())
        });
        failed += !ok as u64;
    }
    m.batch(op, n as u64, failed);
}

/// A batch whose items are `Result<(), ErrorCode>`.
fn batch_status(
    m: &Metrics,
    op: BatchOp,
    keys: &[String],
    out: &mut Vec<u8>,
    mut f: impl FnMut(&str) -> Result<(), ErrorCode>,
) {
    0i32.encode(out);
    (keys.len() as u32).encode(out);
    let mut failed = 0u64;
    for k in keys {
        failed += !status(out, f(k)) as u64;
    }
    m.batch(op, keys.len() as u64, failed);
}

/// `BatchExistKey` straight from its frame body (keys borrowed, not allocated). Decodes exactly
/// as `Request::decode` would (at most `BATCH_MAX_ITEMS` keys); on a decode error nothing is appended to `out`.
pub(crate) fn batch_exist_borrowed(
    st: &mut State,
    m: &Metrics,
    now: u64,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), protocol::wire::DecodeError> {
    let mut r = protocol::wire::Reader::with_count_max(body, protocol::limits::BATCH_MAX_ITEMS);
    let n = r.count("vec", <String as Wire>::MIN_BYTES)?;
    let start = out.len();
    out.reserve(8 + 5 * n);
    0i32.encode(out);
    (n as u32).encode(out);
    let mut failed = 0;
    for _ in 0..n {
        let key = match r.str_ref() {
            Ok(k) => k,
            Err(e) => {
                out.truncate(start);
                return Err(e);
            }
        };
        let key = if valid_plain_key(key) { key } else { "" };
        failed += !exist_item(st, now, key, out) as u64;
    }
    if let Err(e) = r.finish() {
        out.truncate(start);
        return Err(e);
    }
    m.batch(BatchOp::ExistKey, n as u64, failed);
    Ok(())
}

/// `ExistKey` straight from its frame body (the key borrowed, not allocated).
pub(crate) fn exist_borrowed(
    st: &mut State,
    m: &Metrics,
    now: u64,
    body: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), protocol::wire::DecodeError> {
    let mut r = protocol::wire::Reader::new(body);
    let key = r.str_ref()?;
    r.finish()?;
    let key = if valid_plain_key(key) { key } else { "" };
    let exists = st.exist(now, key);
    m.op(Op::ExistKey, exists.is_ok());
    exists.encode(out);
    Ok(())
}

/// Keys removed earlier that their remover could not bury in an owner's catalog: kept as
/// tombstones, and under HA stored in etcd before the answer goes out (`removals.rs`).
fn keep_removed(
    st: &mut State,
    keys: Vec<String>,
    versions: Vec<Version>,
) -> Result<(), ErrorCode> {
    if keys.len() != versions.len() || keys.len() > protocol::limits::BATCH_MAX_ITEMS {
        return Err(ErrorCode::InvalidParams);
    }
    for k in &keys {
        check_key(k)?;
    }
    let at = st.next_version();
    let removal = Removal {
        term: at.term,
        seq: at.seq,
        pick: Pick::Keys {
            keys: keys
                .into_iter()
                .zip(versions)
                .map(|(k, v)| (k, v.term, v.seq))
                .collect(),
        },
    };
    let State {
        removals,
        tombstones,
        ..
    } = st;
    removals.learn(&removal, tombstones);
    if st.durable_on {
        st.durable.push(removal);
    }
    Ok(())
}
