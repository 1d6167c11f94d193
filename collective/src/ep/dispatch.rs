//! Dispatch: each token's row goes to the rank of every expert it is routed to.
//!
//! Send (source rank `s`, call `n`): group the tokens by expert (a token routed twice to the
//! same expert goes once; `-1` is skipped), then for every destination rank `r` whose data
//! set `n % 2` is free, write into `r`'s block `s`: the per-expert counts, each row's token
//! index, the rows (bf16, or fp8 + scales quantised once per token), the descriptor, and
//! last `d_posted[s] = n`.
//!
//! Receive (rank `r`, call `n`): wait for every source (see the module rules on timeouts),
//! then for each local expert pack the sources' rows in ascending source order:
//! `layout_range[l, s] = begin << 32 | count`, `src_info` = the token index at the source,
//! `recv_count[l]` = rows received; `src_info` beyond the count is -1. Then ack every source.

use std::time::Instant;

use super::fp8::quantize_row;
use super::layout::FP8_GROUP;
use super::{deadline, slice, EpDesc, EpPeer, EpRuntime, Phase, Shape};

/// Where a dispatch receive puts its results: addresses of CPU tensors the caller allocated
/// with the shapes of upstream's outputs (`N = ranks * tokens_max`, `L` local experts).
#[derive(Clone, Copy, Debug)]
pub struct DispatchOut {
    /// `[L, N, H]` bf16, or fp8 bytes when dispatching fp8.
    pub recv_x: usize,
    /// `[L, N, H/128]` f32 scales (fp8 only; else 0).
    pub scales: usize,
    /// `[L]` i32 rows received per local expert.
    pub count: usize,
    /// `[L, N]` i32 source token index of each row.
    pub src_info: usize,
    /// `[L, R]` i64 `begin << 32 | count` per (local expert, source).
    pub layout: usize,
}

/// Writes row `i` of local expert `l` into `peer`'s block of `me` in data set `set`: a bf16
/// row in its slot, an fp8 row's data and scales apart (layout.rs).
fn write_row(
    peer: &dyn EpPeer,
    shape: &Shape,
    (set, me, l, i): (usize, usize, usize, usize),
    row: &[u8],
    fp8: bool,
) {
    if fp8 {
        let (q, scales) = row.split_at(shape.hidden);
        peer.write(shape.fp8_data(set, me, l, i), q);
        peer.write(shape.fp8_scales(set, me, l, i), scales);
    } else {
        peer.write(shape.row(set, me, l, i), row);
    }
}

fn desc(shape: &Shape, fp8: bool) -> EpDesc {
    EpDesc {
        tokens_max: shape.tokens_max as u32,
        hidden: shape.hidden as u32,
        experts: shape.experts as u32,
        flags: u32::from(fp8),
    }
}

/// Token indices routed to each expert, ascending, one entry per (token, expert).
pub(crate) fn route(topk: &[i64], k: usize, experts: usize) -> Result<Vec<Vec<u32>>, String> {
    let mut lists = vec![Vec::new(); experts];
    for (t, row) in topk.chunks_exact(k.max(1)).enumerate() {
        for (j, &e) in row.iter().enumerate() {
            if e < 0 {
                if e != -1 {
                    return Err(format!(
                        "topk_idx[{t}, {j}] = {e}: expected -1 or an expert"
                    ));
                }
                continue;
            }
            if e as u64 >= experts as u64 {
                return Err(format!(
                    "topk_idx[{t}, {j}] = {e}: expected an expert in [0, {experts}) or -1"
                ));
            }
            if !row[..j].contains(&e) {
                lists[e as usize].push(t as u32);
            }
        }
    }
    Ok(lists)
}

impl EpRuntime {
    /// Sends this rank's tokens; returns the call number (for [`EpRuntime::dispatch_recv`])
    /// and the updated active mask.
    ///
    /// # Safety
    /// `x` must point to `tokens * shape.hidden` bf16 values and `topk` to `tokens * k` i64
    /// values, both readable for the duration of the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dispatch_send(
        &self,
        x: usize,
        tokens: usize,
        topk: usize,
        k: usize,
        shape: Shape,
        fp8: bool,
        mut mask: u64,
        timeout_us: i64,
    ) -> Result<(u64, u64), String> {
        let _serial = self.serial();
        self.check_shape(&shape)?;
        if tokens > shape.tokens_max {
            return Err(format!(
                "{tokens} tokens, more than num_max_dispatch_tokens_per_rank = {}",
                shape.tokens_max
            ));
        }
        let deadline = deadline(timeout_us)?;
        let h = shape.hidden;
        // SAFETY: the caller guarantees both ranges (function contract).
        let (xs, topk) = unsafe { (slice::<u16>(x, tokens * h), slice::<i64>(topk, tokens * k)) };
        let lists = route(topk, k, shape.experts)?;
        let quantised;
        let (rows, row_bytes): (&[u8], usize) = if fp8 {
            let rb = shape.fp8_row_bytes();
            let mut q = vec![0u8; tokens * rb];
            for (src, dst) in xs.chunks_exact(h).zip(q.chunks_exact_mut(rb)) {
                quantize_row(src, dst);
            }
            quantised = q;
            (&quantised, rb)
        } else {
            // SAFETY: the same memory as `xs`, viewed as bytes.
            let b = unsafe { slice::<u8>(x, tokens * 2 * h) };
            (b, 2 * h)
        };
        let seq = Self::next_seq(&self.dispatch_seq);
        let set = (seq & 1) as usize;
        let me = self.rank;
        let lo = shape.local();
        for r in 0..self.ranks {
            if !self.wait_free(Phase::Dispatch, r, seq, &mut mask, deadline) {
                continue;
            }
            let peer = self.peers[r].as_ref();
            let mut counts = Vec::with_capacity(4 * lo);
            for l in 0..lo {
                let list = &lists[r * lo + l];
                counts.extend_from_slice(&(list.len() as u32).to_le_bytes());
                let src: Vec<u8> = list.iter().flat_map(|t| t.to_le_bytes()).collect();
                peer.write(shape.src(set, me, l, 0), &src);
                for (i, &t) in list.iter().enumerate() {
                    let t = t as usize;
                    let row = &rows[t * row_bytes..(t + 1) * row_bytes];
                    write_row(peer, &shape, (set, me, l, i), row, fp8);
                }
            }
            peer.write(shape.counts(set, me), &counts);
            peer.set_desc(Phase::Dispatch, set, me, desc(&shape, fp8));
            peer.post(Phase::Dispatch, me, seq);
        }
        Ok((seq, mask))
    }

    /// Receives call `seq` into `out`; returns the updated active mask.
    ///
    /// # Safety
    /// Every address in `out` must point to a writable tensor of the shape
    /// [`DispatchOut`] documents for `shape`, not touched by anyone else during the call.
    pub unsafe fn dispatch_recv(
        &self,
        seq: u64,
        out: DispatchOut,
        shape: Shape,
        fp8: bool,
        mut mask: u64,
        timeout_us: i64,
    ) -> Result<u64, String> {
        let _serial = self.serial();
        self.check_shape(&shape)?;
        Self::check_seq(&self.dispatch_seq, seq, "dispatch")?;
        let deadline: Option<Instant> = deadline(timeout_us)?;
        let set = (seq & 1) as usize;
        let (lo, r_n, t_max) = (shape.local(), self.ranks, shape.tokens_max);
        let want = desc(&shape, fp8);
        let mut counts = vec![0u32; r_n * lo];
        let mut err = None;
        for s in 0..r_n {
            match self.wait_posted(Phase::Dispatch, s, seq, want, &mut mask, deadline) {
                Ok(true) => {
                    for l in 0..lo {
                        // SAFETY: inside this rank's data area (check_shape), published by
                        // the Acquire load in wait_posted.
                        let c = unsafe {
                            self.own
                                .data()
                                .add(shape.counts(set, s) + 4 * l)
                                .cast::<u32>()
                                .read_unaligned()
                        };
                        if c as usize > t_max {
                            err = Some(format!(
                                "rank {s} sent {c} rows for local expert {l}, at most {t_max}"
                            ));
                        }
                        counts[s * lo + l] = c.min(t_max as u32);
                    }
                }
                Ok(false) => {}
                Err(e) => err = Some(e),
            }
        }
        if let Some(e) = err {
            self.ack_all(Phase::Dispatch, seq);
            return Err(e);
        }
        // SAFETY: the caller's tensors have the documented shapes (function contract), and
        // every source offset is inside this rank's data area (check_shape).
        unsafe { self.pack(set, &counts, out, shape, fp8) };
        self.ack_all(Phase::Dispatch, seq);
        Ok(mask)
    }

    /// Copies the received blocks of data set `set` into the caller's tensors.
    ///
    /// # Safety
    /// As [`EpRuntime::dispatch_recv`]; `counts[s * L + l] <= tokens_max`.
    unsafe fn pack(&self, set: usize, counts: &[u32], out: DispatchOut, shape: Shape, fp8: bool) {
        let (lo, r_n, h) = (shape.local(), self.ranks, shape.hidden);
        let n = r_n * shape.tokens_max;
        let groups = h / FP8_GROUP;
        let data = self.own.data();
        for l in 0..lo {
            let mut begin = 0usize;
            for s in 0..r_n {
                let c = counts[s * lo + l] as usize;
                let range = if c == 0 {
                    0i64
                } else {
                    ((begin as i64) << 32) | c as i64
                };
                // SAFETY: (whole block) destinations are rows `begin..begin + c` of expert
                // `l`, inside the caller's tensors since the rows of one expert total at most
                // `R * T = N`; sources are inside this rank's data area.
                unsafe {
                    (out.layout as *mut i64).add(l * r_n + s).write(range);
                    if c > 0 {
                        std::ptr::copy_nonoverlapping(
                            data.add(shape.src(set, s, l, 0)),
                            (out.src_info as *mut u8).add(4 * (l * n + begin)),
                            4 * c,
                        );
                    }
                    if !fp8 {
                        std::ptr::copy_nonoverlapping(
                            data.add(shape.row(set, s, l, 0)),
                            (out.recv_x as *mut u8).add(2 * h * (l * n + begin)),
                            2 * h * c,
                        );
                    } else {
                        // the block holds the c rows' data, then their scales (layout.rs)
                        std::ptr::copy_nonoverlapping(
                            data.add(shape.fp8_data(set, s, l, 0)),
                            (out.recv_x as *mut u8).add(h * (l * n + begin)),
                            h * c,
                        );
                        std::ptr::copy_nonoverlapping(
                            data.add(shape.fp8_scales(set, s, l, 0)),
                            (out.scales as *mut u8).add(4 * groups * (l * n + begin)),
                            4 * groups * c,
                        );
                    }
                }
                begin += c;
            }
            // SAFETY: `begin <= N`; the tail of expert l's src_info row and its count.
            unsafe {
                let si = (out.src_info as *mut i32).add(l * n);
                for i in begin..n {
                    si.add(i).write(-1);
                }
                (out.count as *mut i32).add(l).write(begin as i32);
            }
        }
    }
}
