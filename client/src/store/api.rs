//! [`StoreApi`]: the object operations upstream's Python store offers, over either backend a
//! Python store can have: a [`Store`] of its own, or a dummy client
//! ([`crate::dummy::DummyClient`]) that forwards to a standalone `mooncake_client`. The
//! Python binding writes each upstream method once against this trait (its macro generates
//! the methods of both classes), so the two backends cannot drift apart in argument checks,
//! batch splitting or return codes.
//!
//! Also here, because both backends need them and none of it is Python: the subset-and-scatter
//! of the per-key batch puts ([`put_accepted`], [`parts_of`]), the tensor-object check
//! ([`is_tensor_object`]) and [`Staging`], which says whether a put's bytes count against the
//! local buffer as upstream's staging copy would.

use dataplane::mem::{Dst, Src};
use protocol::tensor::{TensorMetadata, TENSOR_METADATA_BYTES};
use protocol::{ErrorCode, ReplicateConfig, TaskInfo, Uuid};

use super::{CallerRange, Store, StoreError};
use crate::dummy::DummyClient;

/// Where a put's bytes come from, which decides whether they count against the client's
/// local buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Staging {
    /// Bytes of Python objects, which upstream copies through its local buffer: the batch's
    /// size is reserved from the budget for the call, and a batch that does not fit fails
    /// (`budget` module docs).
    Budgeted,
    /// Registered or caller memory, sent from where it lies.
    Direct,
}

/// The operations both backends of a Python store serve; see the module docs. Results carry
/// a [`StoreError`] (its cause is empty where the backend gives none).
pub trait StoreApi: Send + Sync {
    /// `host:port` of this client (the standalone client's, for a dummy).
    fn api_hostname(&self) -> String;
    /// 0 while the backend answers, else a negative code.
    fn api_health(&self) -> i32;
    /// Caller memory `[addr, addr + len)`, checked readable (and writable with `write`):
    /// registered memory or the shared region, or mapped memory. `INVALID_PARAMS` otherwise.
    fn api_caller_range(&self, addr: u64, len: u64, write: bool) -> Result<CallerRange, ErrorCode>;
    /// One object, the concatenation of `parts`.
    fn api_put(
        &self,
        key: &str,
        parts: &[Src<'_>],
        cfg: &ReplicateConfig,
        upsert: bool,
        staging: Staging,
    ) -> Result<(), StoreError>;
    /// A batch of objects, each the concatenation of its parts; one result per key.
    fn api_put_many(
        &self,
        keys: &[String],
        objects: &[Vec<Src<'_>>],
        cfg: &ReplicateConfig,
        upsert: bool,
        staging: Staging,
    ) -> Vec<Result<(), StoreError>>;
    /// Object sizes.
    fn api_sizes(&self, keys: &[String]) -> Vec<Result<u64, StoreError>>;
    /// Whether each key exists.
    fn api_exist(&self, keys: &[String]) -> Vec<Result<bool, StoreError>>;
    /// Removes `key` (`force`: even while leased).
    fn api_remove_one(&self, key: &str, force: bool) -> Result<(), StoreError>;
    /// Removes each key (`force`: even while leased).
    fn api_remove(&self, keys: &[String], force: bool) -> Vec<Result<(), StoreError>>;
    /// Removes the keys matching `pattern`; how many.
    fn api_remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64, StoreError>;
    /// Removes every object; how many.
    fn api_remove_all(&self, force: bool) -> Result<u64, StoreError>;
    /// A copy task (`source` `None`) or a move task (one target).
    fn api_create_task(
        &self,
        key: &str,
        targets: &[String],
        source: Option<&str>,
    ) -> Result<Uuid, StoreError>;
    /// A task's state.
    fn api_query_task(&self, id: Uuid) -> Result<TaskInfo, StoreError>;
    /// Reads object `key` whole into caller memory `[addr, addr + len)`; its size.
    ///
    /// # Safety
    /// Until this returns, the range stays mapped and nothing else reads or writes it.
    unsafe fn api_get_into(&self, key: &str, addr: u64, len: u64) -> Result<u64, StoreError>;
    /// Reads object `keys[i]` whole into caller memory `[addrs[i], + lens[i])`; its size.
    ///
    /// # Safety
    /// Until this returns, every range stays mapped and nothing else reads or writes it.
    unsafe fn api_get_into_many(
        &self,
        keys: &[String],
        addrs: &[u64],
        lens: &[u64],
    ) -> Vec<Result<u64, StoreError>>;
    /// Scatters object `keys[i]` over its buffers `ptrs[i]` / `lens[i]` in order; its size.
    ///
    /// # Safety
    /// As [`StoreApi::api_get_into_many`], for every buffer.
    unsafe fn api_get_into_multi_buffers(
        &self,
        keys: &[String],
        ptrs: &[Vec<u64>],
        lens: &[Vec<u64>],
    ) -> Vec<Result<u64, StoreError>>;
}

impl StoreApi for Store {
    fn api_hostname(&self) -> String {
        self.hostname().to_string()
    }
    fn api_health(&self) -> i32 {
        self.health()
    }
    fn api_caller_range(&self, addr: u64, len: u64, write: bool) -> Result<CallerRange, ErrorCode> {
        if write {
            self.caller_range_mut(addr, len)
        } else {
            self.caller_range(addr, len)
        }
    }
    fn api_put(
        &self,
        key: &str,
        parts: &[Src<'_>],
        cfg: &ReplicateConfig,
        upsert: bool,
        staging: Staging,
    ) -> Result<(), StoreError> {
        match staging {
            Staging::Budgeted => self.put_copied(key, parts, cfg, upsert),
            Staging::Direct => self.put_parts(key, parts, cfg, upsert),
        }
    }
    fn api_put_many(
        &self,
        keys: &[String],
        objects: &[Vec<Src<'_>>],
        cfg: &ReplicateConfig,
        upsert: bool,
        staging: Staging,
    ) -> Vec<Result<(), StoreError>> {
        match staging {
            Staging::Budgeted => self.put_many_copied(keys, objects, cfg, upsert),
            Staging::Direct => self.put_many(keys, objects, cfg, upsert),
        }
    }
    fn api_sizes(&self, keys: &[String]) -> Vec<Result<u64, StoreError>> {
        keys.iter().map(|k| self.get_size(k)).collect()
    }
    fn api_exist(&self, keys: &[String]) -> Vec<Result<bool, StoreError>> {
        self.batch_is_exist(keys)
    }
    fn api_remove_one(&self, key: &str, force: bool) -> Result<(), StoreError> {
        self.remove(key, force)
    }
    fn api_remove(&self, keys: &[String], force: bool) -> Vec<Result<(), StoreError>> {
        self.batch_remove(keys, force)
    }
    fn api_remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64, StoreError> {
        self.remove_by_regex(pattern, force)
    }
    fn api_remove_all(&self, force: bool) -> Result<u64, StoreError> {
        self.remove_all(force)
    }
    fn api_create_task(
        &self,
        key: &str,
        targets: &[String],
        source: Option<&str>,
    ) -> Result<Uuid, StoreError> {
        match (source, targets) {
            (Some(src), [target]) => self.create_move_task(key, src, target),
            (Some(_), _) => Err(ErrorCode::InvalidParams.into()),
            (None, _) => self.create_copy_task(key, targets),
        }
    }
    fn api_query_task(&self, id: Uuid) -> Result<TaskInfo, StoreError> {
        self.query_task(id)
    }
    unsafe fn api_get_into(&self, key: &str, addr: u64, len: u64) -> Result<u64, StoreError> {
        // SAFETY: this function's contract is `get_into`'s.
        unsafe { self.get_into(key, addr, len) }
    }
    unsafe fn api_get_into_many(
        &self,
        keys: &[String],
        addrs: &[u64],
        lens: &[u64],
    ) -> Vec<Result<u64, StoreError>> {
        // SAFETY: this function's contract is `get_into_many`'s.
        unsafe { self.get_into_many(keys, addrs, lens) }
    }
    unsafe fn api_get_into_multi_buffers(
        &self,
        keys: &[String],
        ptrs: &[Vec<u64>],
        lens: &[Vec<u64>],
    ) -> Vec<Result<u64, StoreError>> {
        // SAFETY: this function's contract is `get_into_multi_buffers`'.
        unsafe { self.get_into_multi_buffers(keys, ptrs, lens) }
    }
}

/// A dummy client's code (negative) or count, as a result.
fn code_result(n: i64) -> Result<u64, StoreError> {
    if n < 0 {
        let code = ErrorCode::from_i32(n as i32).unwrap_or(ErrorCode::InternalError);
        Err(code.into())
    } else {
        Ok(n as u64)
    }
}

fn unit_result(n: i64) -> Result<(), StoreError> {
    code_result(n).map(|_| ())
}

impl StoreApi for DummyClient {
    fn api_hostname(&self) -> String {
        self.hostname().to_string()
    }
    fn api_health(&self) -> i32 {
        self.health()
    }
    fn api_caller_range(&self, addr: u64, len: u64, write: bool) -> Result<CallerRange, ErrorCode> {
        let ok =
            len == 0 || self.in_region(addr, len) || super::mapped::is_mapped(addr, len, write);
        ok.then(|| CallerRange::checked(addr, len, write))
            .flatten()
            .ok_or(ErrorCode::InvalidParams)
    }
    fn api_put(
        &self,
        key: &str,
        parts: &[Src<'_>],
        cfg: &ReplicateConfig,
        upsert: bool,
        _staging: Staging,
    ) -> Result<(), StoreError> {
        // The shared region bounds a dummy's puts; it has no budget of its own.
        unit_result(i64::from(self.put(key, parts, cfg, upsert)))
    }
    fn api_put_many(
        &self,
        keys: &[String],
        objects: &[Vec<Src<'_>>],
        cfg: &ReplicateConfig,
        upsert: bool,
        _staging: Staging,
    ) -> Vec<Result<(), StoreError>> {
        let objects: Vec<&[Src<'_>]> = objects.iter().map(Vec::as_slice).collect();
        self.put_many_parts(keys, &objects, cfg, upsert)
            .into_iter()
            .map(|c| unit_result(i64::from(c)))
            .collect()
    }
    fn api_sizes(&self, keys: &[String]) -> Vec<Result<u64, StoreError>> {
        self.get_sizes(keys).into_iter().map(code_result).collect()
    }
    fn api_exist(&self, keys: &[String]) -> Vec<Result<bool, StoreError>> {
        let found = |n| code_result(n).map(|n| n == 1);
        self.is_exist(keys).into_iter().map(found).collect()
    }
    fn api_remove_one(&self, key: &str, force: bool) -> Result<(), StoreError> {
        let r = self.remove(&[key.to_string()], force).pop();
        unit_result(r.unwrap_or(ErrorCode::InternalError.code().into()))
    }
    fn api_remove(&self, keys: &[String], force: bool) -> Vec<Result<(), StoreError>> {
        if keys.is_empty() {
            return Vec::new();
        }
        self.remove(keys, force)
            .into_iter()
            .map(unit_result)
            .collect()
    }
    fn api_remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64, StoreError> {
        code_result(self.remove_by_regex(pattern, force))
    }
    fn api_remove_all(&self, force: bool) -> Result<u64, StoreError> {
        code_result(self.remove_all(force))
    }
    fn api_create_task(
        &self,
        key: &str,
        targets: &[String],
        source: Option<&str>,
    ) -> Result<Uuid, StoreError> {
        Ok(self.create_task(key, targets, source)?)
    }
    fn api_query_task(&self, id: Uuid) -> Result<TaskInfo, StoreError> {
        Ok(self.query_task(id)?)
    }
    unsafe fn api_get_into(&self, key: &str, addr: u64, len: u64) -> Result<u64, StoreError> {
        let keys = [key.to_string()];
        // SAFETY: this function's contract covers the one range.
        let mut r = unsafe { self.api_get_into_many(&keys, &[addr], &[len]) };
        r.pop().unwrap_or(Err(ErrorCode::InternalError.into()))
    }
    unsafe fn api_get_into_many(
        &self,
        keys: &[String],
        addrs: &[u64],
        lens: &[u64],
    ) -> Vec<Result<u64, StoreError>> {
        // A dummy refuses the whole batch when one buffer is not caller memory, as before.
        let n = keys.len();
        let writable = addrs
            .iter()
            .zip(lens)
            .all(|(&a, &l)| self.api_caller_range(a, l, true).is_ok());
        if addrs.len() != n || lens.len() != n || !writable {
            return vec![Err(ErrorCode::InvalidParams.into()); n];
        }
        let reads: Vec<(String, u64, u64)> = (0..n)
            .map(|i| (keys[i].clone(), addrs[i], lens[i]))
            .collect();
        self.get_into_many(&reads)
            .into_iter()
            .map(code_result)
            .collect()
    }
    unsafe fn api_get_into_multi_buffers(
        &self,
        keys: &[String],
        ptrs: &[Vec<u64>],
        lens: &[Vec<u64>],
    ) -> Vec<Result<u64, StoreError>> {
        let n = keys.len();
        if ptrs.len() != n || lens.len() != n {
            return vec![Err(ErrorCode::InvalidParams.into()); n];
        }
        let sizes = self.get_sizes(keys);
        let mut out: Vec<Result<u64, StoreError>> = sizes.iter().map(|&s| code_result(s)).collect();
        // (key index, (key, offset in the object, destination, length))
        let mut pieces = Vec::new();
        for (i, &size) in sizes.iter().enumerate() {
            if size < 0 {
                continue;
            }
            match super::scatter(size as u64, &ptrs[i], &lens[i]) {
                Ok(p)
                    if p.iter()
                        .all(|&(_, ptr, len)| self.api_caller_range(ptr, len, true).is_ok()) =>
                {
                    let key = &keys[i];
                    pieces.extend(
                        p.into_iter()
                            .map(|(at, ptr, take)| (i, (key.clone(), at, ptr, take))),
                    );
                }
                _ => out[i] = Err(ErrorCode::InvalidParams.into()),
            }
        }
        let (owners, reads): (Vec<usize>, Vec<_>) = pieces.into_iter().unzip();
        // SAFETY: every destination was checked mapped writable above; this function's
        // contract keeps it so, and untouched, until we return.
        for (i, g) in owners.into_iter().zip(unsafe { self.read_ranges(&reads) }) {
            if g < 0 && out[i].is_ok() {
                out[i] = code_result(g).map(|_| 0);
            }
        }
        out
    }
}

/// A batch put of the keys whose objects `object` yields: a refused key gets its code, a key
/// with nothing to put (`Ok(None)`) gets 0, the rest go to `put` together, in order (with
/// their indices in `keys`), and each gets its code back. The one subset-and-scatter of the
/// per-key batch calls.
pub fn put_accepted<'a>(
    keys: &[String],
    mut object: impl FnMut(usize) -> Result<Option<Vec<Src<'a>>>, ErrorCode>,
    put: impl FnOnce(&[usize], &[String], &[Vec<Src<'a>>]) -> Vec<i32>,
) -> Vec<i32> {
    let mut out = vec![0i32; keys.len()];
    let (mut idx, mut ks, mut ps) = (Vec::new(), Vec::new(), Vec::new());
    for (i, key) in keys.iter().enumerate() {
        match object(i) {
            Ok(None) => {}
            Ok(Some(parts)) => {
                idx.push(i);
                ks.push(key.clone());
                ps.push(parts);
            }
            Err(e) => out[i] = e.code(),
        }
    }
    for (i, r) in idx.iter().copied().zip(put(&idx, &ks, &ps)) {
        out[i] = r;
    }
    out
}

/// One key's object for the multi-buffer puts: the `ptrs[j]` of `lens[j]` bytes in order,
/// each through `range` (the caller's check of its memory); the two lists must agree in length.
pub fn parts_of<'a>(
    ptrs: &[u64],
    lens: &[u64],
    mut range: impl FnMut(u64, u64) -> Result<Src<'a>, ErrorCode>,
) -> Result<Option<Vec<Src<'a>>>, ErrorCode> {
    if ptrs.len() != lens.len() {
        return Err(ErrorCode::InvalidParams);
    }
    ptrs.iter()
        .zip(lens)
        .map(|(&p, &l)| range(p, l))
        .collect::<Result<_, _>>()
        .map(Some)
}

/// Whether `data` (`size` bytes of caller memory) is a valid `[TensorMetadata][data]` object:
/// its header, copied out, decodes.
pub fn is_tensor_object(data: Src<'_>, size: u64) -> bool {
    let mut head = [0u8; TENSOR_METADATA_BYTES];
    let n = data.len().min(TENSOR_METADATA_BYTES);
    data.split_at(n).0.copy_to(&mut Dst::from(&mut head[..n]));
    TensorMetadata::decode(&head[..n], size).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_accepted_scatters_codes_back() {
        let keys: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
        let data = [1u8, 2, 3];
        let object = |i: usize| match i {
            0 => Err(ErrorCode::InvalidParams),
            1 => Ok(None),
            _ => Ok(Some(vec![Src::from(&data[..i - 1])])),
        };
        let out = put_accepted(&keys, object, |at, ks, ps| {
            assert_eq!(at, [2, 3]);
            assert_eq!(ks, ["c", "d"]);
            assert_eq!(ps[1][0].len(), 2);
            vec![0, ErrorCode::ObjectNotFound.code()]
        });
        let invalid = ErrorCode::InvalidParams.code();
        assert_eq!(out, [invalid, 0, 0, ErrorCode::ObjectNotFound.code()]);
    }

    #[test]
    fn parts_of_needs_matching_lists() {
        let ok = parts_of(&[1, 2], &[3, 4], |p, l| {
            assert!(p < 3 && l > 2);
            Ok(Src::from(&[][..]))
        });
        assert_eq!(ok.unwrap().unwrap().len(), 2);
        assert!(parts_of(&[1], &[], |_, _| unreachable!()).is_err());
    }
}
