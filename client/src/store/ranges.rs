//! `get_into_ranges`: many ranged reads of many objects into many registered buffers.
//!
//! Shapes: `buffer_ptrs[b]`, `all_keys[b][k]`, and `all_dst_offsets` / `all_src_offsets` /
//! `all_sizes` as `[b][k][f]`. The result has the shape of `all_sizes`: per fragment the bytes
//! read or a negative code. A destination range must lie inside the registered buffer that
//! contains `buffer_ptrs[b]`; a source range inside the object.
//!
//! One planner for every client that can serve these reads ([`RangeSource`]): the store
//! client (below) and the Python dummy client (`python/src/dummy.rs`).

use super::Store;
use protocol::ErrorCode;

const INVALID: i64 = ErrorCode::InvalidParams as i64;

/// Upstream's answer for calls whose lists do not line up (observed on its 0.3.13 wheel): the
/// failure takes the shape of the *destination offsets*. A whole call that does not line up
/// gets one entry per buffer, each with one list per key of `all_dst_offsets[b]` as long as
/// that key's offsets (`[[-600]]` for a buffer with no offsets); a buffer whose keys do not
/// line up gets one list per key, as long as its offsets (1 where there are none).
fn failed_buffer(dsts: Option<&Vec<Vec<u64>>>) -> Vec<Vec<i64>> {
    match dsts {
        Some(d) => d.iter().map(|f| vec![INVALID; f.len()]).collect(),
        None => vec![vec![INVALID]],
    }
}

fn failed_keys(nkeys: usize, dsts: &[Vec<u64>]) -> Vec<Vec<i64>> {
    (0..nkeys)
        .map(|k| vec![INVALID; dsts.get(k).map_or(1, Vec::len)])
        .collect()
}

/// What `get_into_ranges` reads from: a store client or a dummy client.
pub trait RangeSource {
    /// What one lookup of a key gives.
    type Object;
    /// One lookup per key, in order (one round trip for them all).
    fn objects(&self, keys: &[String]) -> Vec<Result<Self::Object, ErrorCode>>;
    fn object_size(&self, o: &Self::Object) -> Result<u64, ErrorCode>;
    /// The registered buffer `(base, len)` that holds `addr`.
    fn bounds(&self, addr: u64) -> Option<(u64, u64)>;
    /// Reads every fragment (each checked to lie in its object and its buffer); per
    /// fragment `Ok(())` or a code.
    fn read(&self, frags: &[Fragment<'_, Self::Object>]) -> Vec<Result<(), ErrorCode>>;
}

/// Bytes `[src, src + len)` of `object` (looked up under `key`) into `[dst, dst + len)`.
pub struct Fragment<'a, O> {
    pub key: &'a str,
    pub object: &'a O,
    pub src: u64,
    pub dst: u64,
    pub len: u64,
}

impl RangeSource for Store {
    type Object = super::Lookup;

    fn objects(&self, keys: &[String]) -> Vec<Result<Self::Object, ErrorCode>> {
        // Ranged calls answer per-range codes; a failed lookup keeps only its code here.
        (self.batch_replicas(keys).into_iter())
            .map(|r| r.map_err(|e| e.code))
            .collect()
    }

    fn object_size(&self, o: &Self::Object) -> Result<u64, ErrorCode> {
        o.object_size()
    }

    fn bounds(&self, addr: u64) -> Option<(u64, u64)> {
        self.registered_buffer(addr)
    }

    fn read(&self, frags: &[Fragment<'_, Self::Object>]) -> Vec<Result<(), ErrorCode>> {
        // One at a time: the caller's destinations may overlap, and reads in order leave the
        // last fragment's bytes where they do.
        frags
            .iter()
            .map(|f| {
                let dst = self.caller_range_mut(f.dst, f.len)?;
                // SAFETY: the caller-memory contract (`store.rs`'s module doc) keeps the
                // destination mapped for this call; the range dies with the read.
                Ok(self.read_from(f.object, f.src, unsafe { dst.into_dst() })?)
            })
            .collect()
    }
}

/// Per fragment the bytes read or a negative code, in the shape of `all_sizes` (or of the
/// destination offsets where the lists do not line up; see [`failed_buffer`]).
pub fn get_into_ranges<S: RangeSource>(
    s: Option<&S>,
    buffer_ptrs: &[u64],
    all_keys: &[Vec<String>],
    all_dst_offsets: &[Vec<Vec<u64>>],
    all_src_offsets: &[Vec<Vec<u64>>],
    all_sizes: &[Vec<Vec<u64>>],
) -> Vec<Vec<Vec<i64>>> {
    let nb = buffer_ptrs.len();
    let all_failed = || -> Vec<Vec<Vec<i64>>> {
        (0..nb)
            .map(|b| failed_buffer(all_dst_offsets.get(b)))
            .collect()
    };
    let Some(s) = s else {
        return all_failed();
    };
    if all_keys.len() != nb
        || all_dst_offsets.len() != nb
        || all_src_offsets.len() != nb
        || all_sizes.len() != nb
    {
        tracing::error!("get_into_ranges: top-level size mismatch");
        return all_failed();
    }
    // One lookup round trip for every key of every buffer.
    let flat: Vec<String> = all_keys.iter().flatten().cloned().collect();
    let objects = s.objects(&flat);
    let mut next = 0usize;
    let mut out = Vec::with_capacity(nb);
    // The fragments to read, and where each one's result goes: (b, k, f).
    let mut frags = Vec::new();
    let mut slots = Vec::new();
    for b in 0..nb {
        let (keys, dsts, srcs, sizes) = (
            &all_keys[b],
            &all_dst_offsets[b],
            &all_src_offsets[b],
            &all_sizes[b],
        );
        let first = next;
        next += keys.len();
        if dsts.len() != keys.len() || srcs.len() != keys.len() || sizes.len() != keys.len() {
            out.push(failed_keys(keys.len(), dsts));
            continue;
        }
        let bounds = s.bounds(buffer_ptrs[b]);
        let mut per_key = Vec::with_capacity(keys.len());
        for k in 0..keys.len() {
            let (d, sr, sz) = (&dsts[k], &srcs[k], &sizes[k]);
            if d.len() != sz.len() || sr.len() != sz.len() {
                per_key.push(vec![INVALID; d.len()]);
                continue;
            }
            let object = match &objects[first + k] {
                Ok(o) => o,
                Err(e) => {
                    per_key.push(vec![e.code() as i64; sz.len()]);
                    continue;
                }
            };
            let mut results = Vec::with_capacity(sz.len());
            for f in 0..sz.len() {
                let planned = plan(s, object, bounds, buffer_ptrs[b], d[f], sr[f], sz[f]);
                match planned {
                    Ok(0) => results.push(0),
                    Ok(_) => {
                        results.push(sz[f] as i64);
                        slots.push((b, k, f));
                        frags.push(Fragment {
                            key: &keys[k],
                            object,
                            src: sr[f],
                            dst: buffer_ptrs[b] + d[f],
                            len: sz[f],
                        });
                    }
                    Err(e) => results.push(e.code() as i64),
                }
            }
            per_key.push(results);
        }
        out.push(per_key);
    }
    if !frags.is_empty() {
        for ((b, k, f), r) in slots.into_iter().zip(s.read(&frags)) {
            if let Err(e) = r {
                out[b][k][f] = e.code() as i64;
            }
        }
    }
    out
}

/// Checks one fragment: its destination inside the buffer's registered range, its source
/// inside the object. The bytes to read, or the code.
fn plan<S: RangeSource>(
    s: &S,
    object: &S::Object,
    bounds: Option<(u64, u64)>,
    buffer: u64,
    dst_offset: u64,
    src_offset: u64,
    size: u64,
) -> Result<u64, ErrorCode> {
    let (base, len) = bounds.ok_or(ErrorCode::InvalidParams)?;
    buffer
        .checked_add(dst_offset)
        .filter(|d| *d >= base && d.checked_add(size).is_some_and(|end| end <= base + len))
        .ok_or(ErrorCode::InvalidParams)?;
    let object = s.object_size(object)?;
    if src_offset.checked_add(size).is_none_or(|end| end > object) {
        return Err(ErrorCode::InvalidParams);
    }
    Ok(size)
}
