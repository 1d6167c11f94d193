//! `get_into_ranges`: many ranged reads of many objects into many registered buffers.
//!
//! Shapes: `buffer_ptrs[b]`, `all_keys[b][k]`, and `all_dst_offsets` / `all_src_offsets` /
//! `all_sizes` as `[b][k][f]`. The result has the shape of `all_sizes`: per fragment the bytes
//! read or a negative code. A destination range must lie inside the registered buffer that
//! contains `buffer_ptrs[b]`; a source range inside the object.

use client::Store;
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

pub fn get_into_ranges(
    s: Option<&Store>,
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
    // One replica-list round trip for every key of every buffer.
    let flat: Vec<String> = all_keys.iter().flatten().cloned().collect();
    let mut lists = s.batch_replicas(&flat).into_iter();
    let mut out = Vec::with_capacity(nb);
    for b in 0..nb {
        let (keys, dsts, srcs, sizes) = (
            &all_keys[b],
            &all_dst_offsets[b],
            &all_src_offsets[b],
            &all_sizes[b],
        );
        let lists_b: Vec<_> = lists.by_ref().take(keys.len()).collect();
        if dsts.len() != keys.len() || srcs.len() != keys.len() || sizes.len() != keys.len() {
            out.push(failed_keys(keys.len(), dsts));
            continue;
        }
        let bounds = s.registered_buffer(buffer_ptrs[b]);
        let mut per_key = Vec::with_capacity(keys.len());
        for (k, list) in lists_b.into_iter().enumerate() {
            let (d, sr, sz) = (&dsts[k], &srcs[k], &sizes[k]);
            if d.len() != sz.len() || sr.len() != sz.len() {
                per_key.push(vec![INVALID; d.len()]);
                continue;
            }
            let list = match list {
                Ok(l) => l,
                Err(e) => {
                    per_key.push(vec![e.code() as i64; sz.len()]);
                    continue;
                }
            };
            let frags = (0..sz.len())
                .map(|f| {
                    read_fragment(s, &list, bounds, buffer_ptrs[b], d[f], sr[f], sz[f])
                        .map_or_else(|e| e.code() as i64, |n| n as i64)
                })
                .collect();
            per_key.push(frags);
        }
        out.push(per_key);
    }
    out
}

fn read_fragment(
    s: &Store,
    list: &client::store::Lookup,
    bounds: Option<(u64, u64)>,
    buffer: u64,
    dst_offset: u64,
    src_offset: u64,
    size: u64,
) -> Result<u64, ErrorCode> {
    let (base, len) = bounds.ok_or(ErrorCode::InvalidParams)?;
    let dst = buffer
        .checked_add(dst_offset)
        .filter(|d| d.checked_add(size).is_some_and(|end| end <= base + len))
        .ok_or(ErrorCode::InvalidParams)?;
    let object = list.object_size()?;
    if src_offset.checked_add(size).is_none_or(|end| end > object) {
        return Err(ErrorCode::InvalidParams);
    }
    if size == 0 {
        return Ok(0);
    }
    let dst = s.caller_range_mut(dst, size)?;
    // SAFETY: the caller-memory contract (`store.rs`'s module doc) gives us the destination
    // for this call; the view dies with the read.
    s.read_from(list, src_offset, unsafe { dst.into_mut_slice() })?;
    Ok(size)
}
