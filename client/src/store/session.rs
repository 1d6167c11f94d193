//! Put and get sessions: upstream's `batch_{put,get}_session_*` and the ranged multi-buffer
//! calls that run inside them.
//!
//! A *put session* reserves objects at the master (`BatchPutStart`) without moving a byte;
//! `put_ranges` then fills byte ranges of each object from caller memory, in any order and in
//! as many calls as the caller likes; `put_session_end` writes every replica and commits
//! (`BatchPutEnd`), `put_session_revoke` gives the reservation back (`BatchPutRevoke`).
//! The ranges land in a staging copy of the object held by this client: a replica is written
//! once, whole, at the end, so its owner's catalog records it exactly as for a plain put and a
//! half-filled object is never readable. The staging copy costs one memcpy per byte and
//! `size` bytes of heap per open session; upstream writes the ranges straight to the replicas.
//!
//! A *get session* caches each key's replica list (granting a read lease once);
//! `get_ranges` reads byte ranges of the cached objects into caller memory without asking the
//! master again while the list's read window lasts (`Lookup`), and asks again for the lists
//! whose window has passed; `get_session_end` drops the cache.
//!
//! Invariants: a key has at most one open put session per store; every range is checked
//! against the object's size before any byte moves.

use std::collections::HashMap;

use parking_lot::Mutex;
use protocol::message::{BatchPutEnd, BatchPutRevoke, BatchPutStart};
use protocol::{ErrorCode, ReplicaDescriptor, ReplicateConfig};

use super::error::bytes;
use super::peers::WriteItem;
use super::{rpc, Lookup, ObjectRead, Store, StoreError};
use dataplane::mem::{Dst, Src};

/// One object reserved by a put session.
struct PutSession {
    replicas: Vec<ReplicaDescriptor>,
    hard_pin: bool,
    soft_pin_ttl_ms: Option<u64>,
    staged: Vec<u8>,
}

#[derive(Default)]
pub(super) struct Sessions {
    puts: Mutex<HashMap<String, PutSession>>,
    gets: Mutex<HashMap<String, Lookup>>,
}

/// `true` when `[offset, offset + len)` lies inside an object of `size` bytes.
fn in_object(offset: u64, len: u64, size: u64) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= size)
}

/// A zeroed staging buffer of `size` bytes, or `None` when this process cannot allocate it
/// (an allocation failure must not abort the process that asked).
fn staging(size: u64) -> Option<Vec<u8>> {
    let n = usize::try_from(size).ok()?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, 0);
    Some(v)
}

/// The per-key lists of a ranged call must agree in length.
fn shapes_agree(n: usize, a: &[Vec<u64>], b: &[Vec<u64>], c: &[Vec<u64>]) -> bool {
    a.len() == n && b.len() == n && c.len() == n
}

/// The refusal of a ranged call whose lists do not agree with its keys.
fn shapes_refused(op: &str, n: usize, a: usize, b: usize, c: usize) -> StoreError {
    StoreError::invalid(format!(
        "{op}: {n} keys but {a} pointer, {b} size and {c} offset lists"
    ))
}

/// The refusal of one key's range lists that do not agree in length.
fn key_shapes_refused(op: &str, key: &str, a: usize, b: usize, c: usize) -> StoreError {
    StoreError::invalid(format!(
        "{op} {key}: {a} pointers, {b} sizes and {c} offsets"
    ))
}

/// The refusal of a range outside its object.
fn outside(op: &str, key: &str, offset: u64, len: u64, size: u64) -> StoreError {
    StoreError::invalid(format!(
        "{op} {key}: range [{offset}, +{len}) is outside the object of {size} bytes"
    ))
}

impl Store {
    /// `batch_put_session_start`: reserves `keys[i]` of `sizes[i]` bytes; one result per key
    /// (`OBJECT_ALREADY_EXISTS` for a key that exists, as upstream: a session cannot be a no-op).
    pub fn put_session_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        cfg: &ReplicateConfig,
    ) -> Vec<Result<(), StoreError>> {
        const OP: &str = "put session start";
        let n = keys.len();
        if let Err(e) = self.check_open() {
            return vec![Err(e.context(OP)); n];
        }
        if n != sizes.len() {
            let cause = format!("{OP}: {n} keys but {} sizes", sizes.len());
            return vec![Err(StoreError::invalid(cause)); n];
        }
        if keys.is_empty() {
            return Vec::new();
        }
        if cfg.prefer_alloc_in_same_node {
            let cause = format!("{OP}: prefer_alloc_in_same_node is not supported for sessions");
            return vec![Err(StoreError::invalid(cause)); n];
        }
        {
            let puts = self.sessions.puts.lock();
            if let Some(k) = keys.iter().find(|k| puts.contains_key(*k)) {
                let cause = format!("{OP}: {k} already has an open put session");
                return vec![Err(StoreError::invalid(cause)); n];
            }
        }
        let started = rpc(self.master.call(&BatchPutStart {
            client_id: self.client_id,
            keys: keys.to_vec(),
            sizes: sizes.to_vec(),
            config: cfg.clone(),
        }));
        let started = match started {
            Ok(s) if s.len() == n => s,
            Ok(s) => {
                let cause = format!("{OP}: the master answered {} of {n} keys", s.len());
                return vec![Err(StoreError::new(ErrorCode::RpcFail, cause)); n];
            }
            Err(e) => return vec![Err(e.context(format_args!("{OP} of {n} keys"))); n],
        };
        let mut unstaged: Vec<String> = Vec::new();
        let results = {
            let mut puts = self.sessions.puts.lock();
            keys.iter()
                .zip(sizes)
                .zip(started)
                .map(|((k, &size), s)| {
                    let replicas = s.map_err(|c| {
                        StoreError::new(
                            c,
                            format!("{OP} {k}: the master reserved no {}", bytes(size)),
                        )
                    })?;
                    let Some(staged) = staging(size) else {
                        unstaged.push(k.clone());
                        let cause =
                            format!("{OP} {k}: cannot allocate {} to stage it", bytes(size));
                        return Err(StoreError::invalid(cause));
                    };
                    puts.insert(
                        k.clone(),
                        PutSession {
                            replicas,
                            hard_pin: cfg.with_hard_pin,
                            soft_pin_ttl_ms: super::catalog::soft_pin_of(cfg),
                            staged,
                        },
                    );
                    Ok(())
                })
                .collect()
        };
        if !unstaged.is_empty() {
            let _ = self.master.call_settling(&BatchPutRevoke {
                client_id: self.client_id,
                keys: unstaged,
            });
        }
        results
    }

    /// `batch_put_from_multi_buffer_ranges`: copies `sizes[i][j]` bytes at `ptrs[i][j]` to
    /// offset `dst_offsets[i][j]` of key `i`'s reserved object; bytes copied per key, or
    /// `INVALID_PARAMS` (no session, ranges outside the object, unmapped memory, lists of
    /// different lengths). A key's ranges are all checked before any is copied.
    ///
    /// # Safety
    /// Until this returns, every `[ptrs[i][j], + sizes[i][j])` stays mapped and nothing writes
    /// it (another thread, Python, another call over the same bytes).
    pub unsafe fn put_ranges(
        &self,
        keys: &[String],
        ptrs: &[Vec<u64>],
        sizes: &[Vec<u64>],
        dst_offsets: &[Vec<u64>],
    ) -> Vec<Result<u64, StoreError>> {
        const OP: &str = "ranged put";
        let n = keys.len();
        if let Err(e) = self.check_open() {
            return vec![Err(e.context(OP)); n];
        }
        if !shapes_agree(n, ptrs, sizes, dst_offsets) {
            let e = shapes_refused(OP, n, ptrs.len(), sizes.len(), dst_offsets.len());
            return vec![Err(e); n];
        }
        let mut puts = self.sessions.puts.lock();
        (0..n)
            .map(|i| {
                let key = &keys[i];
                let s = puts
                    .get_mut(key)
                    .ok_or_else(|| StoreError::invalid(format!("{OP} {key}: no open put session")))?;
                let (p, l, o) = (&ptrs[i], &sizes[i], &dst_offsets[i]);
                if p.len() != l.len() || p.len() != o.len() {
                    return Err(key_shapes_refused(OP, key, p.len(), l.len(), o.len()));
                }
                let size = s.staged.len() as u64;
                let srcs = p
                    .iter()
                    .zip(l)
                    .zip(o)
                    .map(|((&ptr, &len), &off)| {
                        if !in_object(off, len, size) {
                            return Err(outside(OP, key, off, len, size));
                        }
                        let src = self.caller_range(ptr, len).map_err(|c| {
                            StoreError::new(c, format!("{OP} {key}: {len} bytes at {ptr:#x} are not readable caller memory"))
                        })?;
                        Ok((src, off as usize))
                    })
                    .collect::<Result<Vec<_>, StoreError>>()?;
                let mut total = 0u64;
                for (src, off) in srcs {
                    // SAFETY: our caller keeps every source range mapped and away from Rust
                    // references until we return, and the range lives for this one copy.
                    let src = unsafe { src.src() };
                    src.copy_to(&mut Dst::from(&mut s.staged[off..off + src.len()]));
                    total += src.len() as u64;
                }
                Ok(total)
            })
            .collect()
    }

    /// `batch_put_session_end`: writes each session's object to its replicas and commits it;
    /// `INVALID_PARAMS` for a key without a session. A failed write revokes that key.
    pub fn put_session_end(&self, keys: &[String]) -> Vec<Result<(), StoreError>> {
        const OP: &str = "put session end";
        let taken = self.take_put_sessions(keys);
        let mut results: Vec<Result<(), StoreError>> = Vec::with_capacity(keys.len());
        let mut items: Vec<WriteItem<'_>> = Vec::new();
        let mut owners: Vec<usize> = Vec::new();
        let parts: Vec<Option<[Src<'_>; 1]>> = taken
            .iter()
            .map(|t| t.as_ref().map(|s| [Src::from(&s.staged[..])]))
            .collect();
        let catalog_keys: Vec<_> = keys.iter().map(|k| self.master.catalog_key(k)).collect();
        for (i, t) in taken.iter().enumerate() {
            match (t, &parts[i]) {
                (Some(s), Some(p)) => {
                    results.push(Ok(()));
                    for replica in &s.replicas {
                        items.push(WriteItem {
                            replica,
                            parts: p,
                            key: catalog_keys[i].as_ref(),
                            hard_pin: s.hard_pin,
                            soft_pin_ttl_ms: s.soft_pin_ttl_ms,
                            provisional: false,
                        });
                        owners.push(i);
                    }
                }
                _ => results.push(Err(StoreError::invalid(format!(
                    "{OP} {}: no open put session",
                    keys[i]
                )))),
            }
        }
        for (&i, r) in owners.iter().zip(self.peers.write_many(&items)) {
            if results[i].is_ok() {
                results[i] = r.map_err(|e| e.context(format_args!("{OP} {}: write", keys[i])));
            }
        }
        let pick = |ok: bool| -> Vec<usize> {
            (0..keys.len())
                .filter(|&i| taken[i].is_some() && results[i].is_ok() == ok)
                .collect()
        };
        let (commit, revoke) = (pick(true), pick(false));
        let names = |idx: &[usize]| idx.iter().map(|&i| keys[i].clone()).collect::<Vec<_>>();
        if !commit.is_empty() {
            let ended = rpc(self.master.call_settling(&BatchPutEnd {
                client_id: self.client_id,
                keys: names(&commit),
            }));
            let commit_of = |i: usize| format!("{OP} {}: commit", keys[i]);
            match ended {
                Ok(per) => commit.iter().zip(per).for_each(|(&i, r)| {
                    results[i] = r.map_err(|c| StoreError::new(c, commit_of(i)))
                }),
                Err(e) => commit
                    .iter()
                    .for_each(|&i| results[i] = Err(e.clone().context(commit_of(i)))),
            }
        }
        if !revoke.is_empty() {
            let _ = self.master.call_settling(&BatchPutRevoke {
                client_id: self.client_id,
                keys: names(&revoke),
            });
        }
        results
    }

    /// `batch_put_session_revoke`: gives the reservations back; `INVALID_PARAMS` for a key
    /// without a session.
    pub fn put_session_revoke(&self, keys: &[String]) -> Vec<Result<(), StoreError>> {
        const OP: &str = "put session revoke";
        let taken = self.take_put_sessions(keys);
        let open: Vec<String> = keys
            .iter()
            .zip(&taken)
            .filter(|(_, t)| t.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        let mut answers = if open.is_empty() {
            Vec::new()
        } else {
            match rpc(self.master.call_settling(&BatchPutRevoke {
                client_id: self.client_id,
                keys: open.clone(),
            })) {
                Ok(v) if v.len() == open.len() => {
                    v.into_iter().map(|r| r.map_err(StoreError::from)).collect()
                }
                Ok(v) => {
                    let cause = format!(
                        "{OP}: the master answered {} of {} keys",
                        v.len(),
                        open.len()
                    );
                    vec![Err(StoreError::new(ErrorCode::RpcFail, cause)); open.len()]
                }
                Err(e) => vec![Err(e); open.len()],
            }
        }
        .into_iter();
        keys.iter()
            .zip(&taken)
            .map(|(k, t)| match t {
                Some(_) => answers
                    .next()
                    .unwrap_or_else(|| Err(ErrorCode::RpcFail.into()))
                    .map_err(|e| e.context(format_args!("{OP} {k}"))),
                None => Err(StoreError::invalid(format!(
                    "{OP} {k}: no open put session"
                ))),
            })
            .collect()
    }

    fn take_put_sessions(&self, keys: &[String]) -> Vec<Option<PutSession>> {
        let mut puts = self.sessions.puts.lock();
        keys.iter().map(|k| puts.remove(k)).collect()
    }

    /// `batch_get_session_start`: asks for every key's replica list once and caches it; one
    /// result per key (`OBJECT_NOT_FOUND` for a miss).
    pub fn get_session_start(&self, keys: &[String]) -> Vec<Result<(), StoreError>> {
        const OP: &str = "get session start";
        let lists = self.batch_replicas(keys);
        let mut gets = self.sessions.gets.lock();
        keys.iter()
            .zip(lists)
            .map(|(k, l)| {
                let l = l.map_err(|e| e.context(format_args!("{OP} {k}: lookup")))?;
                if l.replicas.is_empty() {
                    let cause = format!("{OP} {k}: the object has no replica");
                    return Err(StoreError::new(ErrorCode::InvalidReplica, cause));
                }
                gets.insert(k.clone(), l);
                Ok(())
            })
            .collect()
    }

    /// `batch_get_into_multi_buffer_ranges`: reads `sizes[i][j]` bytes at `src_offsets[i][j]`
    /// of key `i` (which must be in a get session) into `ptrs[i][j]`; bytes read per key, or a
    /// negative code (`INVALID_PARAMS` without a session or for a range outside the object).
    ///
    /// # Safety
    /// Until this returns, every `[ptrs[i][j], + sizes[i][j])` stays mapped and nothing else
    /// reads or writes it (another thread, Python, another range of this call).
    pub unsafe fn get_ranges(
        &self,
        keys: &[String],
        ptrs: &[Vec<u64>],
        sizes: &[Vec<u64>],
        src_offsets: &[Vec<u64>],
    ) -> Vec<Result<u64, StoreError>> {
        const OP: &str = "ranged read";
        let n = keys.len();
        if let Err(e) = self.check_open() {
            return vec![Err(e.context(OP)); n];
        }
        if !shapes_agree(n, ptrs, sizes, src_offsets) {
            let e = shapes_refused(OP, n, ptrs.len(), sizes.len(), src_offsets.len());
            return vec![Err(e); n];
        }
        let lists = self.session_lists(keys);
        let mut out: Vec<Result<u64, StoreError>> = Vec::with_capacity(n);
        let mut reads: Vec<ObjectRead<'_>> = Vec::new();
        let mut owners: Vec<usize> = Vec::new();
        for i in 0..n {
            let key = &keys[i];
            let planned = (|| {
                let list = lists[i].as_ref().ok_or_else(|| {
                    StoreError::invalid(format!("{OP} {key}: no open get session"))
                })?;
                let size = list.replicas.first().map(|r| r.size).unwrap_or(0);
                let (p, l, o) = (&ptrs[i], &sizes[i], &src_offsets[i]);
                if p.len() != l.len() || p.len() != o.len() {
                    return Err(key_shapes_refused(OP, key, p.len(), l.len(), o.len()));
                }
                let mut pieces = Vec::with_capacity(p.len());
                for ((&ptr, &len), &off) in p.iter().zip(l).zip(o) {
                    if !in_object(off, len, size) {
                        return Err(outside(OP, key, off, len, size));
                    }
                    let dst = self.caller_range_mut(ptr, len).map_err(|c| {
                        StoreError::new(c, format!("{OP} {key}: {len} bytes at {ptr:#x} are not writable caller memory"))
                    })?;
                    // SAFETY: our caller keeps the range mapped and away from Rust references
                    // until we return; the range dies with `reads`, before we return.
                    let dst = unsafe { dst.into_dst() };
                    pieces.push(ObjectRead {
                        list,
                        offset: off,
                        dst,
                    });
                }
                Ok(pieces)
            })();
            match planned {
                Ok(pieces) => {
                    out.push(Ok(pieces.iter().map(|r| r.dst.len() as u64).sum()));
                    for piece in pieces.into_iter().filter(|r| !r.dst.is_empty()) {
                        owners.push(i);
                        reads.push(piece);
                    }
                }
                Err(e) => out.push(Err(e)),
            }
        }
        for (i, r) in owners.into_iter().zip(self.read_many_from(reads)) {
            if let Err(e) = r {
                out[i] = Err(e.context(format_args!("{OP} {}", keys[i])));
            }
        }
        out
    }

    /// The cached lists of `keys` (`None` outside a session), each looked up again when its
    /// read window has passed: reading a list after its window could return another key's
    /// bytes, since the master may have handed its buffers on.
    fn session_lists(&self, keys: &[String]) -> Vec<Option<Lookup>> {
        let mut lists: Vec<Option<Lookup>> = {
            let gets = self.sessions.gets.lock();
            keys.iter().map(|k| gets.get(k).cloned()).collect()
        };
        let stale: Vec<usize> = (0..keys.len())
            .filter(|&i| lists[i].as_ref().is_some_and(|l| !l.readable()))
            .collect();
        if stale.is_empty() {
            return lists;
        }
        let again: Vec<String> = stale.iter().map(|&i| keys[i].clone()).collect();
        let fresh = self.batch_replicas(&again);
        let mut gets = self.sessions.gets.lock();
        for (i, r) in stale.into_iter().zip(fresh) {
            // A key gone since keeps its stale list: its reads fail with LEASE_EXPIRED.
            if let Ok(l) = r {
                if gets.contains_key(&keys[i]) {
                    gets.insert(keys[i].clone(), l.clone());
                }
                lists[i] = Some(l);
            }
        }
        lists
    }

    /// `batch_get_session_end`: drops the cached replica lists of `keys`.
    pub fn get_session_end(&self, keys: &[String]) {
        let mut gets = self.sessions.gets.lock();
        for k in keys {
            gets.remove(k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_refuses_what_cannot_be_allocated() {
        assert_eq!(staging(16).map(|v| v.len()), Some(16));
        assert!(staging(u64::MAX).is_none());
    }

    #[test]
    fn ranges_inside_objects_only() {
        assert!(in_object(0, 10, 10));
        assert!(in_object(10, 0, 10));
        assert!(!in_object(5, 6, 10));
        assert!(!in_object(u64::MAX, 2, 10));
    }
}
