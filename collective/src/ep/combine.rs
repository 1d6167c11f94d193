//! Combine: expert outputs go back to their tokens' source ranks and are summed there.
//!
//! Send (expert owner `o`, call `m`): for every destination rank `d` whose combine set
//! `m % 2` is free, and every local expert `l` (global `e = o*L + l`), the rows
//! `layout_range[l, d]` of the expert output are written into `d`'s combine set at
//! `(e, src_info[l, row])` together with a stamp `m`; then the descriptor and
//! `c_posted[o] = m`.
//!
//! Receive (source rank `d`, call `m`): wait for every owner, then for each of this rank's
//! tokens `t`: `out[t] = bf16(sum_k w[t,k] * row(topk[t,k], t))`, summed in f32 in `k` order,
//! over the `k` whose expert's owner is active and wrote a row for `t` in this call (stamp
//! `m`). Experts on inactive or timed-out ranks are dropped without renormalising the
//! weights; the stamps keep a row from an earlier call from being read as this call's.

use super::{bit, deadline, dispatch::route, slice, slice_mut, EpDesc, EpRuntime, Phase, Shape};
use crate::reduce::{bf16_to_f32, f32_to_bf16};

fn desc(shape: &Shape) -> EpDesc {
    EpDesc {
        tokens_max: shape.tokens_max as u32,
        hidden: shape.hidden as u32,
        experts: shape.experts as u32,
        flags: 2,
    }
}

/// `(begin, count)` of an upstream-packed `layout_range` entry.
fn unpack(v: i64) -> (usize, usize) {
    let v = v as u64;
    ((v >> 32) as usize, (v & 0xffff_ffff) as usize)
}

impl EpRuntime {
    fn check_tokens(shape: &Shape, tokens: usize) -> Result<(), String> {
        if tokens > shape.tokens_max {
            return Err(format!(
                "{tokens} tokens, more than num_max_dispatch_tokens_per_rank = {}",
                shape.tokens_max
            ));
        }
        Ok(())
    }

    /// Sends the expert outputs `x` (`[L, N, H]` bf16) back to their sources, as the
    /// dispatch handle (`src_info` `[L, N]` i32, `layout` `[L, R]` i64) says. `topk`
    /// (`tokens * k` i64) is only checked here, so a bad one fails before anything is sent.
    /// Returns the call number and the updated active mask.
    ///
    /// # Safety
    /// Every address must point to a readable tensor of the documented shape for `shape`,
    /// valid for the duration of the call.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn combine_send(
        &self,
        x: usize,
        src_info: usize,
        layout: usize,
        topk: usize,
        tokens: usize,
        k: usize,
        shape: Shape,
        mut mask: u64,
        timeout_us: i64,
    ) -> Result<(u64, u64), String> {
        let _serial = self.serial();
        self.check_shape(&shape)?;
        Self::check_tokens(&shape, tokens)?;
        let deadline = deadline(timeout_us)?;
        let (lo, r_n, t_max, h) = (shape.local(), self.ranks, shape.tokens_max, shape.hidden);
        let n = r_n * t_max;
        // SAFETY: the caller guarantees these ranges (function contract).
        let (xs, si, lr, tk) = unsafe {
            (
                slice::<u8>(x, lo * n * 2 * h),
                slice::<i32>(src_info, lo * n),
                slice::<i64>(layout, lo * r_n),
                slice::<i64>(topk, tokens * k),
            )
        };
        route(tk, k, shape.experts)?;
        for l in 0..lo {
            for d in 0..r_n {
                let (b, c) = unpack(lr[l * r_n + d]);
                if c == 0 {
                    continue;
                }
                if c > t_max || b + c > n {
                    return Err(format!(
                        "layout_range[{l}, {d}] = rows [{b}, {}): expected at most {t_max} \
                         rows inside [0, {n})",
                        b + c
                    ));
                }
                if let Some(i) = (b..b + c).find(|&i| !(0..t_max as i32).contains(&si[l * n + i])) {
                    return Err(format!(
                        "src_info[{l}, {i}] = {}: expected a token index in [0, {t_max})",
                        si[l * n + i]
                    ));
                }
            }
        }
        let seq = Self::next_seq(&self.combine_seq);
        let set = (seq & 1) as usize;
        let me = self.rank;
        let stamp = (seq as u32).to_le_bytes();
        for d in 0..r_n {
            if !self.wait_free(Phase::Combine, d, seq, &mut mask, deadline) {
                continue;
            }
            let peer = self.peers[d].as_ref();
            for l in 0..lo {
                let e = me * lo + l;
                let (b, c) = unpack(lr[l * r_n + d]);
                for row in b..b + c {
                    let t = si[l * n + row] as usize;
                    let off = (l * n + row) * 2 * h;
                    peer.write(shape.combine_row(set, e, t), &xs[off..off + 2 * h]);
                    peer.write(shape.stamp(set, e, t), &stamp);
                }
            }
            peer.set_desc(Phase::Combine, set, me, desc(&shape));
            peer.post(Phase::Combine, me, seq);
        }
        Ok((seq, mask))
    }

    /// Receives combine call `seq` and reduces it into `out` (`tokens * H` bf16) with
    /// `topk` (`tokens * k` i64) and `weights` (`tokens * k` f32); returns the updated mask.
    ///
    /// # Safety
    /// As [`EpRuntime::combine_send`]; `out` is writable and touched by nobody else.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn combine_recv(
        &self,
        seq: u64,
        topk: usize,
        weights: usize,
        tokens: usize,
        k: usize,
        out: usize,
        shape: Shape,
        mut mask: u64,
        timeout_us: i64,
    ) -> Result<u64, String> {
        let _serial = self.serial();
        self.check_shape(&shape)?;
        Self::check_tokens(&shape, tokens)?;
        Self::check_seq(&self.combine_seq, seq, "combine")?;
        let deadline = deadline(timeout_us)?;
        let (lo, h) = (shape.local(), shape.hidden);
        // SAFETY: the caller guarantees these ranges (function contract).
        let (tk, w, out) = unsafe {
            (
                slice::<i64>(topk, tokens * k),
                slice::<f32>(weights, tokens * k),
                slice_mut::<u16>(out, tokens * h),
            )
        };
        let mut err = route(tk, k, shape.experts).err();
        let want = desc(&shape);
        for s in 0..self.ranks {
            if let Err(e) = self.wait_posted(Phase::Combine, s, seq, want, &mut mask, deadline) {
                err = Some(e);
            }
        }
        if let Some(e) = err {
            self.ack_all(Phase::Combine, seq);
            return Err(e);
        }
        let set = (seq & 1) as usize;
        let data = self.own.data();
        let mut acc = vec![0f32; h];
        for t in 0..tokens {
            acc.fill(0.0);
            for j in 0..k {
                let e = tk[t * k + j];
                if e < 0 || !bit(mask, e as usize / lo) {
                    continue;
                }
                let e = e as usize;
                // SAFETY: (e, t) is inside this rank's combine set (e < E checked by route,
                // t < tokens <= T); the owner published it before its Release post, which
                // wait_posted acquired (a mask bit is set only for owners that posted).
                let (st, row) = unsafe {
                    (
                        data.add(shape.stamp(set, e, t))
                            .cast::<u32>()
                            .read_unaligned(),
                        std::slice::from_raw_parts(
                            data.add(shape.combine_row(set, e, t)).cast::<u16>(),
                            h,
                        ),
                    )
                };
                if st != seq as u32 {
                    continue;
                }
                let wt = w[t * k + j];
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a += bf16_to_f32(v) * wt;
                }
            }
            for (o, &a) in out[t * h..(t + 1) * h].iter_mut().zip(&acc) {
                *o = f32_to_bf16(a);
            }
        }
        self.ack_all(Phase::Combine, seq);
        Ok(mask)
    }
}
