//! The collectives as phase sequences over the ranks' collective slots (see the module docs
//! of [`super`] for the protocol and its invariants).
//!
//! | op | phases (S = slot bytes, n = ranks) | each phase |
//! |---|---|---|
//! | all_reduce ≤ 64 KiB | 1 | post input; fold every contributor's slot into the buffer |
//! | all_reduce | 2 per S-byte chunk | post input; fold own 1/n section into the other slot and post it; copy every section |
//! | broadcast | per S-byte chunk | root posts; the others copy |
//! | all_gather / gather | per S-byte chunk | post input; copy each contributor's slot (gather: root only) |
//! | all_to_all / scatter | per S/n-byte sub-range | post n pieces; copy own piece from each (scatter: from root) |
//! | reduce_scatter | per S/n-byte sub-range | post n pieces; fold own piece of each |
//! | reduce | per S-byte chunk | post input; root folds |
//! | barrier | 1 | nothing to move |
//!
//! With direct reads ([`super::cma`], agreed by the whole group): all_reduce above 64 KiB
//! takes 3 phases (publish addresses; fold own section from every buffer into its own;
//! copy the other sections from their owners; +1 when a section has no live owner), and
//! all_gather / all_to_all pieces from 64 KiB take 2 (publish addresses; read; done).
//!
//! Addresses in a [`CollOp`] come from the Python layer, which keeps the tensors alive until
//! the op's completion fires ([`super::Comm::submit`] is `unsafe` for that reason).

use super::reduce::{self, DType, ReduceOp};
use super::seg::Desc;
use super::{wait_counter, Outcome, Shared};
use crate::limits::{PG_CHUNK_ALIGN_BYTES, PG_COLL_SLOT_BYTES};
use dataplane::mem::{Dst, Src};

/// All-reduces up to this size run in one phase (every rank folds everything).
const SMALL_ALL_REDUCE_BYTES: usize = 64 * 1024;
/// all_gather / all_to_all pieces from this size on are read straight out of the peers'
/// tensors when the group has [`super::cma`] (two phases, one copy).
const CMA_MIN_BYTES: usize = 64 * 1024;

/// Whether ops register destinations for the receive thread ([`super::redirect`]), in groups
/// whose peers are all on other hosts ([`Runner::expect`]).
const REDIRECT: bool = true;

/// A collective, with raw addresses of contiguous CPU buffers.
#[derive(Clone, Debug)]
pub enum CollOp {
    AllReduce {
        buf: usize,
        bytes: usize,
        dtype: DType,
        op: ReduceOp,
    },
    Broadcast {
        buf: usize,
        bytes: usize,
        dtype: DType,
        root: usize,
    },
    /// `outs[r]` receives rank `r`'s `bytes` bytes.
    AllGather {
        input: usize,
        bytes: usize,
        dtype: DType,
        outs: Vec<usize>,
    },
    /// `ins[j]` goes to rank `j`; `outs[r]` receives rank `r`'s piece; `bytes` per piece.
    AllToAll {
        ins: Vec<usize>,
        outs: Vec<usize>,
        bytes: usize,
        dtype: DType,
    },
    /// `ins[j]` is the piece reduced into rank `j`'s `out`.
    ReduceScatter {
        ins: Vec<usize>,
        out: usize,
        bytes: usize,
        dtype: DType,
        op: ReduceOp,
    },
    Reduce {
        buf: usize,
        bytes: usize,
        dtype: DType,
        op: ReduceOp,
        root: usize,
    },
    /// `outs` is read only at the root.
    Gather {
        input: usize,
        bytes: usize,
        dtype: DType,
        outs: Vec<usize>,
        root: usize,
    },
    /// `ins` is read only at the root.
    Scatter {
        ins: Vec<usize>,
        out: usize,
        bytes: usize,
        dtype: DType,
        root: usize,
    },
    Barrier,
}

impl CollOp {
    fn desc(&self) -> Desc {
        let d = |kind: u32, dtype: DType, op: u32, root: usize, bytes: usize| Desc {
            kind,
            dtype: dtype as u32,
            op,
            root: root as u32,
            bytes: bytes as u64,
        };
        match *self {
            CollOp::AllReduce {
                bytes, dtype, op, ..
            } => d(1, dtype, op as u32, 0, bytes),
            CollOp::Broadcast {
                bytes, dtype, root, ..
            } => d(2, dtype, 0, root, bytes),
            CollOp::AllGather { bytes, dtype, .. } => d(3, dtype, 0, 0, bytes),
            CollOp::AllToAll { bytes, dtype, .. } => d(4, dtype, 0, 0, bytes),
            CollOp::ReduceScatter {
                bytes, dtype, op, ..
            } => d(5, dtype, op as u32, 0, bytes),
            CollOp::Reduce {
                bytes,
                dtype,
                op,
                root,
                ..
            } => d(6, dtype, op as u32, root, bytes),
            CollOp::Gather {
                bytes, dtype, root, ..
            } => d(7, dtype, 0, root, bytes),
            CollOp::Scatter {
                bytes, dtype, root, ..
            } => d(8, dtype, 0, root, bytes),
            CollOp::Barrier => d(9, DType::Uint8, 0, 0, 0),
        }
    }
}

fn describe(d: &Desc) -> String {
    const KINDS: [&str; 10] = [
        "?",
        "all_reduce",
        "broadcast",
        "all_gather",
        "all_to_all",
        "reduce_scatter",
        "reduce",
        "gather",
        "scatter",
        "barrier",
    ];
    let kind = KINDS.get(d.kind as usize).copied().unwrap_or("?");
    let dtype = DType::from_code(d.dtype).map_or("?".to_string(), |t| format!("{t:?}"));
    let mut s = format!("{kind} of {} bytes of {dtype}", d.bytes);
    if matches!(d.kind, 1 | 5 | 6) {
        let op = ReduceOp::from_code(d.op).map_or("?".to_string(), |o| format!("{o:?}"));
        s += &format!(" op {op}");
    }
    if matches!(d.kind, 2 | 6 | 7 | 8) {
        s += &format!(" root {}", d.root);
    }
    s
}

/// Whether `MC_PG_PROFILE` is set (read once): the direct-read all_gather / all_to_all then
/// print where each op's time went on stderr (see `docs/pg.md`).
fn profiling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MC_PG_PROFILE").is_some_and(|v| v != "0"))
}

/// Copies `len` bytes (as `memmove`: user buffers may alias each other). Every copy here is
/// read next by another rank or by the caller after the op, not by this thread, so large
/// ones skip the cache ([`Src::copy_uncached`]; `bench/README.md`, `mooncake.pg`).
///
/// # Safety
/// Both ranges must be valid for `len` bytes, and no Rust reference over them used meanwhile.
unsafe fn mv(src: *const u8, dst: *mut u8, len: usize) {
    if len > 0 && src != dst.cast_const() {
        // SAFETY: forwarded to the caller.
        let (from, mut to) = unsafe { (Src::from_raw(src, len), Dst::from_raw(dst, len)) };
        from.copy_uncached(&mut to);
    }
}

/// `dst = fold(op, srcs...)` in the order given, then the AVG division.
///
/// # Safety
/// Every source and `dst` must be valid for `len` bytes; `dst` must not overlap a source,
/// except that it may be the first one (then folded in place).
unsafe fn fold_into(dt: DType, op: ReduceOp, srcs: &[*const u8], dst: *mut u8, len: usize) {
    let Some((first, rest)) = srcs.split_first() else {
        return;
    };
    // SAFETY: forwarded to the caller.
    unsafe {
        mv(*first, dst, len);
        for s in rest {
            reduce::fold(dt, op, dst, *s, len);
        }
        if op == ReduceOp::Avg {
            reduce::divide(dt, dst, len, srcs.len());
        }
    }
}

/// Executes collectives for one communicator, one after another. Holds the phase counter.
pub struct Runner<'a> {
    sh: &'a Shared,
    seq: u64,
    active: u64,
    failed: u64,
    /// Peers that left the group gracefully (`deactivate_ranks([self])`) during this op.
    left: u64,
    /// What the coming phase writes into the own slot, `(stride, bytes)` as
    /// [`super::seg::Segment::set_extent`]: tells [`super::net`] which bytes to push.
    extent: (usize, usize),
    /// Adopted view ([`super::membership`]) and its phase base: phases restart at `base`.
    vid: u64,
    base: u64,
    /// Last phase and participants of the previous view: the first two phases of a view
    /// wait until those peers are done reading this rank's slots.
    prev_last: u64,
    prev_set: u64,
}

impl<'a> Runner<'a> {
    pub(super) fn new(sh: &'a Shared) -> Runner<'a> {
        Runner {
            sh,
            seq: 0,
            active: 0,
            failed: 0,
            left: 0,
            extent: (0, 0),
            vid: 0,
            base: 0,
            prev_last: 0,
            prev_set: 0,
        }
    }

    fn bit(r: usize) -> u64 {
        1u64 << r
    }

    /// Ranks out of the current op: failed or left.
    fn gone(&self) -> u64 {
        self.failed | self.left
    }

    /// Ranks taking part in the current phase (active, not gone), this one included.
    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.sh.ranks).filter(|&r| (self.active & !self.gone()) & Self::bit(r) != 0)
    }

    fn peers(&self) -> Vec<usize> {
        self.live().filter(|&r| r != self.sh.rank).collect()
    }

    fn slot(&self, r: usize, seq: u64) -> *mut u8 {
        self.sh.seg(r).coll_slot((seq & 1) as usize)
    }

    /// One phase: waits until the slot may be reused, lets `write` fill it, publishes, and
    /// waits for every live peer's publication. With `check`, compares the peers' descriptors.
    fn phase(
        &mut self,
        desc: Desc,
        check: bool,
        write: impl FnOnce(&Self, *mut u8),
    ) -> Result<u64, String> {
        let s = self.seq + 1;
        let own = &self.sh.own;
        if s < self.base + 3 {
            let prev: Vec<usize> = (0..self.sh.ranks)
                .filter(|&p| p != self.sh.rank && self.prev_set & Self::bit(p) != 0)
                .collect();
            for p in prev {
                let seg = self.sh.seg(p);
                let want = self.prev_last.min(s.saturating_sub(2));
                wait_counter(
                    &seg,
                    seg.done(),
                    want,
                    || seg.owner_alive() && !seg.has_left(),
                    p,
                );
            }
        } else {
            for p in self.peers() {
                let seg = self.sh.seg(p);
                // A peer that died is skipped; the phase wait below marks it failed.
                wait_counter(
                    &seg,
                    seg.done(),
                    s - 2,
                    || seg.owner_alive() && !seg.has_left(),
                    p,
                );
            }
        }
        write(self, own.coll_slot((s & 1) as usize));
        own.set_desc((s & 1) as usize, desc);
        own.set_extent((s & 1) as usize, self.extent.0, self.extent.1);
        own.store_counter(own.posted(), s);
        self.sh.publish_phase(s);
        self.seq = s;
        for p in self.peers() {
            let seg = self.sh.seg(p);
            let here = || seg.owner_alive() && !seg.has_left();
            if !wait_counter(&seg, seg.posted(), s, here, p) {
                if seg.has_left() {
                    self.left |= Self::bit(p);
                } else {
                    self.failed |= Self::bit(p);
                }
            }
        }
        if check {
            for p in self.peers() {
                let theirs = self.sh.seg(p).desc((s & 1) as usize);
                if theirs != desc {
                    own.store_counter(own.done(), s);
                    self.sh.publish();
                    return Err(format!(
                        "mismatched collective: rank {p} called {}, rank {} called {}",
                        describe(&theirs),
                        self.sh.rank,
                        describe(&desc)
                    ));
                }
            }
        }
        Ok(s)
    }

    fn finish(&self, s: u64) {
        self.sh.own.store_counter(self.sh.own.done(), s);
        self.sh.publish();
    }

    /// Runs one op to its outcome.
    pub fn execute(&mut self, op: CollOp) -> Outcome {
        let (vid, base) = self.sh.member.view_base();
        if vid != self.vid {
            // A new view starts here on every member: restart the phases at its base.
            self.prev_set = self.active & !self.gone();
            self.prev_last = self.seq;
            self.seq = base;
            self.base = base;
            self.vid = vid;
        }
        self.active = self.sh.active();
        self.failed = 0;
        self.left = 0;
        self.extent = (0, 0);
        let me = self.sh.rank;
        let error = if self.active & Self::bit(me) == 0 {
            Some("rank is not active in this group".to_string())
        } else {
            self.run(&op).err()
        };
        self.forget_expected();
        Outcome {
            failed: self.failed,
            left: self.left,
            error,
        }
    }

    fn check_root(&self, root: usize) -> Result<(), String> {
        if root >= self.sh.ranks || self.active & Self::bit(root) == 0 {
            return Err(format!(
                "root rank {root} is not an active rank of this group of {}",
                self.sh.ranks
            ));
        }
        Ok(())
    }

    fn run(&mut self, op: &CollOp) -> Result<(), String> {
        let desc = op.desc();
        let me = self.sh.rank;
        let piece =
            (PG_COLL_SLOT_BYTES / self.sh.ranks) / PG_CHUNK_ALIGN_BYTES * PG_CHUNK_ALIGN_BYTES;
        match op {
            CollOp::AllReduce {
                buf,
                bytes,
                dtype,
                op,
            } => {
                reduce::check_reducible(*dtype, *op)?;
                if self.sh.cma() && *bytes > SMALL_ALL_REDUCE_BYTES {
                    return self.cma_all_reduce(desc, *buf as *mut u8, *bytes, *dtype, *op);
                }
                self.all_reduce(desc, *buf as *mut u8, *bytes, *dtype, *op)
            }
            CollOp::Broadcast {
                buf, bytes, root, ..
            } => self.broadcast(desc, *buf as *mut u8, *bytes, *root),
            CollOp::AllGather {
                input, bytes, outs, ..
            } if self.sh.cma() && *bytes >= CMA_MIN_BYTES => {
                let ptrs = [*input];
                self.cma_exchange(desc, &ptrs, *bytes, |_, r, remote| {
                    (remote[0] as usize, outs[r] as *mut u8)
                })
            }
            CollOp::AllToAll {
                ins, outs, bytes, ..
            } if self.sh.cma() && *bytes >= CMA_MIN_BYTES => {
                self.cma_exchange(desc, ins, *bytes, |me, r, remote| {
                    (remote[me] as usize, outs[r] as *mut u8)
                })
            }
            CollOp::AllGather {
                input, bytes, outs, ..
            }
            | CollOp::Gather {
                input, bytes, outs, ..
            } => {
                let root = match op {
                    CollOp::Gather { root, .. } => Some(*root),
                    _ => None,
                };
                self.gather_into(desc, *input as *const u8, *bytes, outs, root)
            }
            CollOp::AllToAll {
                ins, outs, bytes, ..
            } => self.pieces(desc, ins, None, outs, 0, *bytes),
            CollOp::Scatter {
                ins,
                out,
                bytes,
                root,
                ..
            } => {
                self.check_root(*root)?;
                self.pieces(desc, ins, Some(*root), &[], *out, *bytes)
            }
            CollOp::ReduceScatter {
                ins,
                out,
                bytes,
                dtype,
                op: rop,
            } => {
                reduce::check_reducible(*dtype, *rop)?;
                let out = *out as *mut u8;
                self.chunked(desc, *bytes, piece, &|_, _, _| None, |r, off, len, w| {
                    if w {
                        let slot = r.slot(me, r.seq + 1);
                        for (j, src) in ins.iter().enumerate() {
                            // SAFETY: each piece holds `bytes` bytes; the slot n pieces.
                            unsafe { mv((*src as *const u8).add(off), slot.add(j * piece), len) };
                        }
                    } else {
                        let srcs: Vec<*const u8> = r
                            .live()
                            .map(|x| r.slot(x, r.seq).wrapping_add(me * piece).cast_const())
                            .collect();
                        // SAFETY: `out` holds `bytes` bytes, disjoint from the slots.
                        unsafe { fold_into(*dtype, *rop, &srcs, out.add(off), len) };
                    }
                })
            }
            CollOp::Reduce {
                buf,
                bytes,
                dtype,
                op: rop,
                root,
            } => {
                reduce::check_reducible(*dtype, *rop)?;
                self.check_root(*root)?;
                let buf = *buf as *mut u8;
                self.chunked(
                    desc,
                    *bytes,
                    PG_COLL_SLOT_BYTES,
                    &|_, _, _| None,
                    |r, off, len, w| {
                        if w {
                            // SAFETY: `buf` holds `bytes` bytes.
                            unsafe { mv(buf.add(off), r.slot(me, r.seq + 1), len) };
                        } else if me == *root {
                            let srcs: Vec<*const u8> =
                                r.live().map(|x| r.slot(x, r.seq).cast_const()).collect();
                            // SAFETY: as above; the slots hold `len` published bytes each.
                            unsafe { fold_into(*dtype, *rop, &srcs, buf.add(off), len) };
                        }
                    },
                )
            }
            CollOp::Barrier => self.chunked(
                desc,
                0,
                PG_COLL_SLOT_BYTES,
                &|_, _, _| None,
                |_, _, _, _| {},
            ),
        }
    }

    /// broadcast through the slots: the root posts each chunk, the others copy it (or
    /// receive it straight into `buf`, from a root on another host).
    fn broadcast(
        &mut self,
        desc: Desc,
        buf: *mut u8,
        bytes: usize,
        root: usize,
    ) -> Result<(), String> {
        let me = self.sh.rank;
        self.check_root(root)?;
        let direct = self.remote_only();
        let land = |src: usize, off: usize, _| {
            (src == root && me != root).then(|| (0, buf.wrapping_add(off)))
        };
        self.chunked(desc, bytes, PG_COLL_SLOT_BYTES, &land, |r, off, len, w| {
            if w {
                if me == root && direct {
                    // SAFETY: `buf` holds `bytes` bytes (Python checked the tensor).
                    r.push_from(|_| (unsafe { buf.add(off) }.cast_const(), len));
                } else if me == root {
                    // SAFETY: `buf` holds `bytes` bytes (Python checked the tensor).
                    unsafe { mv(buf.add(off), r.slot(me, r.seq + 1), len) };
                }
            } else if me != root && r.gone() & Self::bit(root) == 0 && !r.received(r.seq, root, 0) {
                // SAFETY: as above; the root's slot holds `len` published bytes.
                unsafe { mv(r.slot(root, r.seq), buf.add(off), len) };
            }
        })
    }

    /// all_gather (`root` `None`) and gather through the slots, chunked: every rank posts
    /// its input, the readers copy each contributor's slot (or receive it straight into
    /// `outs`, from a peer on another host).
    fn gather_into(
        &mut self,
        desc: Desc,
        input: *const u8,
        bytes: usize,
        outs: &[usize],
        root: Option<usize>,
    ) -> Result<(), String> {
        let me = self.sh.rank;
        if let Some(x) = root {
            self.check_root(x)?;
        }
        let direct = self.remote_only();
        let land = |src: usize, off: usize, _| {
            let out = outs.get(src).filter(|_| root.is_none_or(|x| x == me))?;
            Some((0, (*out as *mut u8).wrapping_add(off)))
        };
        self.chunked(desc, bytes, PG_COLL_SLOT_BYTES, &land, |r, off, len, w| {
            if w && direct {
                // SAFETY: `input` holds `bytes` bytes.
                r.push_from(|_| (unsafe { input.add(off) }, len));
            } else if w {
                // SAFETY: `input` holds `bytes` bytes.
                unsafe { mv(input.add(off), r.slot(me, r.seq + 1), len) };
            } else if root.is_none_or(|x| x == me) {
                for src in r.live().filter(|&x| !r.received(r.seq, x, 0)) {
                    let from = match direct && src == me {
                        // SAFETY: `input` holds `bytes` bytes.
                        true => unsafe { input.add(off) },
                        false => r.slot(src, r.seq).cast_const(),
                    };
                    // SAFETY: `outs[src]` holds `bytes` bytes; the source `len`.
                    unsafe { mv(from, (outs[src] as *mut u8).add(off), len) };
                }
            }
        })
    }

    /// all_to_all (`root` `None`: every rank posts `ins`, `outs[r]` gets rank `r`'s piece)
    /// and scatter (only `root` posts `ins`; `out` gets this rank's piece).
    fn pieces(
        &mut self,
        desc: Desc,
        ins: &[usize],
        root: Option<usize>,
        outs: &[usize],
        out: usize,
        bytes: usize,
    ) -> Result<(), String> {
        let me = self.sh.rank;
        let piece =
            (PG_COLL_SLOT_BYTES / self.sh.ranks) / PG_CHUNK_ALIGN_BYTES * PG_CHUNK_ALIGN_BYTES;
        let direct = root.is_none() && self.remote_only();
        // Rank j's piece at `off` (null, i.e. pushed from the slot, for a missing entry).
        let at = |j: usize, off: usize| {
            ins.get(j)
                .map_or(std::ptr::null(), |&p| (p as *const u8).wrapping_add(off))
        };
        let land = |src: usize, off: usize, _| {
            let dst = match root {
                None => *outs.get(src)?,
                Some(x) => Some(out).filter(|_| src == x)?,
            };
            Some((me * piece, (dst as *mut u8).wrapping_add(off)))
        };
        self.chunked(desc, bytes, piece, &land, |r, off, len, w| {
            // The write side only fills (or names) the coming phase's bytes. It must not fall
            // through to the copies below: those read the *previous* phase's replica (r.seq is
            // not advanced yet) into the outputs, where a peer's bytes of this phase may
            // already be arriving (`super::redirect`).
            if w && direct {
                r.push_from(|q| (at(q, off), len));
                return;
            } else if w {
                if root.is_none_or(|x| x == me) {
                    let slot = r.slot(me, r.seq + 1);
                    for (j, src) in ins.iter().enumerate() {
                        // SAFETY: each piece holds `bytes` bytes; the slot holds n pieces.
                        unsafe { mv((*src as *const u8).add(off), slot.add(j * piece), len) };
                    }
                }
                return;
            }
            let from: Vec<usize> = match root {
                None => r.live().collect(),
                Some(x) if r.gone() & Self::bit(x) == 0 => vec![x],
                Some(_) => Vec::new(),
            };
            for src in from
                .into_iter()
                .filter(|&x| !r.received(r.seq, x, me * piece))
            {
                let dst = if root.is_some() { out } else { outs[src] };
                let from = match direct && src == me {
                    true => at(me, off),
                    // SAFETY: the source slot holds piece `me` of `len` published bytes.
                    false => unsafe { r.slot(src, r.seq).add(me * piece) }.cast_const(),
                };
                // SAFETY: `dst` holds `bytes` bytes; the source `len` (own input: `bytes`).
                unsafe { mv(from, (dst as *mut u8).add(off), len) };
            }
        })
    }

    /// The single-copy exchange: publish `ptrs` (this rank's tensor addresses), then for
    /// every live rank `r` (this one included) copy `bytes` bytes from the address
    /// `pick(me, r, r's published addresses)` chooses into the local destination it names,
    /// then a second phase so that no rank leaves (and lets its tensors change) while a peer
    /// still reads them. A peer whose memory cannot be read (it died) is marked failed.
    fn cma_exchange(
        &mut self,
        desc: Desc,
        ptrs: &[usize],
        bytes: usize,
        pick: impl Fn(usize, usize, &[u64]) -> (usize, *mut u8),
    ) -> Result<(), String> {
        let me = self.sh.rank;
        let t0 = std::time::Instant::now();
        let profile = profiling();
        let mut prof = String::new();
        let s = self.phase(desc, true, |_, slot| {
            for (i, p) in ptrs.iter().enumerate() {
                // SAFETY: the slot holds far more than PG_MAX_RANKS addresses; aligned.
                unsafe { slot.cast::<u64>().add(i).write(*p as u64) };
            }
        })?;
        let t1 = std::time::Instant::now();
        // Each rank starts with the next one up, so the readers spread over the owners
        // instead of all reading rank 0's memory, then rank 1's, at the same time.
        let mut order: Vec<usize> = self.live().collect();
        let at = order.iter().position(|&r| r > me).unwrap_or(0);
        order.rotate_left(at);
        for r in order {
            // SAFETY: rank `r` published `ptrs.len()` addresses at the start of its slot.
            let remote: &[u64] =
                unsafe { std::slice::from_raw_parts(self.slot(r, s).cast::<u64>(), ptrs.len()) };
            let (src, dst) = pick(me, r, remote);
            let tr = std::time::Instant::now();
            if r == me {
                // SAFETY: both are this rank's tensors of `bytes` bytes.
                unsafe { mv(src as *const u8, dst, bytes) };
                if profile {
                    prof += &format!(" own {}", tr.elapsed().as_micros());
                }
                continue;
            }
            let pid = self.sh.seg(r).owner_pid();
            // SAFETY: `dst` is this rank's output of `bytes` bytes; the remote range is
            // rank r's tensor, alive until the phase below (module invariant of `cma`).
            if unsafe { super::cma::read(pid, src, dst, bytes) }.is_err() {
                self.failed |= Self::bit(r);
            }
            if profile {
                prof += &format!(" from {r} {}", tr.elapsed().as_micros());
            }
        }
        let t2 = std::time::Instant::now();
        let s2 = self.phase(desc, false, |_, _| {})?;
        self.finish(s2);
        if profile {
            use std::io::Write;
            let line = format!(
                "mooncake.pg profile: rank {me} {}: addresses {} us, reads{prof} us, readers done {} us, total {} us\n",
                describe(&desc),
                (t1 - t0).as_micros(),
                t2.elapsed().as_micros(),
                t0.elapsed().as_micros(),
            );
            // One write, so that the ranks' lines do not interleave.
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
        Ok(())
    }

    /// Runs `max(1, ceil(bytes / step))` one-phase rounds over `[off, off + len)` ranges:
    /// `f(self, off, len, true)` fills the slot of the coming phase, `f(self, off, len, false)`
    /// reads after it.
    fn chunked(
        &mut self,
        desc: Desc,
        bytes: usize,
        step: usize,
        land: &dyn Fn(usize, usize, usize) -> Option<(usize, *mut u8)>,
        mut f: impl FnMut(&Self, usize, usize, bool),
    ) -> Result<(), String> {
        // Registers where the peers' bytes of the chunk at `off` land, for phase `s`.
        let expect_chunk = |r: &Self, s: u64, off: usize| {
            let len = step.min(bytes.saturating_sub(off));
            for src in r.peers().into_iter().filter(|_| len > 0) {
                if let Some((at, dst)) = land(src, off, len) {
                    r.expect(s, src, at, len, dst);
                }
            }
        };
        expect_chunk(self, self.seq + 1, 0);
        expect_chunk(self, self.seq + 2, step);
        let mut off = 0;
        let mut first = true;
        loop {
            let len = step.min(bytes - off);
            // A step below a slot is the pieces layout: one piece per rank at `r * step`.
            self.extent = (if step < PG_COLL_SLOT_BYTES { step } else { 0 }, len);
            let s = self.phase(desc, first, |r, _| f(r, off, len, true))?;
            first = false;
            f(self, off, len, false);
            // Before `done = s` lets the peers push phase s + 2.
            expect_chunk(self, s + 2, off + 2 * step);
            self.finish(s);
            off += len;
            if off >= bytes {
                return Ok(());
            }
        }
    }

    /// Reads `[off, off + len)` of every rank in `from` (rank, pid, address; this rank's own
    /// buffer directly) and folds them in that order into `dst`. A rank whose memory cannot
    /// be read is left out and returned in the failed mask.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes and not overlap this rank's buffer range read.
    unsafe fn cma_fold(
        &self,
        from: &[(usize, u32, usize)],
        off: usize,
        len: usize,
        dt: DType,
        op: ReduceOp,
        dst: *mut u8,
    ) -> u64 {
        const PIECE: usize = 256 * 1024;
        let mut failed = 0u64;
        let mut tmp = vec![0u64; PIECE / 8];
        let t = tmp.as_mut_ptr().cast::<u8>();
        let mut p = 0;
        while p < len {
            let l = PIECE.min(len - p);
            let mut count = 0;
            for &(r, pid, addr) in from {
                if failed & Self::bit(r) != 0 {
                    continue;
                }
                // SAFETY: `p < len`, inside `dst`.
                let target = if count == 0 { unsafe { dst.add(p) } } else { t };
                let ok = if r == self.sh.rank {
                    // SAFETY: own buffer, `off + p + l` is inside it.
                    unsafe { mv((addr + off + p) as *const u8, target, l) };
                    true
                } else {
                    // SAFETY: `target` holds `l` bytes; the remote range is alive (phases).
                    unsafe { super::cma::read(pid, addr + off + p, target, l) }.is_ok()
                };
                if !ok {
                    failed |= Self::bit(r);
                    continue;
                }
                if count > 0 {
                    // SAFETY: `dst + p` and `tmp` hold `l` bytes each, disjoint.
                    unsafe { reduce::fold(dt, op, dst.add(p), t, l) };
                }
                count += 1;
            }
            if op == ReduceOp::Avg {
                // SAFETY: `dst + p` holds `l` bytes.
                unsafe { reduce::divide(dt, dst.add(p), l, count) };
            }
            p += l;
        }
        failed
    }

    /// all_reduce by direct reads: publish the buffer's address; each rank folds its 1/n
    /// section out of every buffer into its own; then copies every other section from its
    /// owner's buffer. Sections nobody owns (inactive or dead owner) are folded by every
    /// rank into a side buffer first and written only after an extra phase, so that no rank
    /// reads a section another has already overwritten. A last phase keeps every buffer
    /// alive until all readers are done.
    fn cma_all_reduce(
        &mut self,
        desc: Desc,
        buf: *mut u8,
        bytes: usize,
        dt: DType,
        op: ReduceOp,
    ) -> Result<(), String> {
        let (n, me, e) = (self.sh.ranks, self.sh.rank, dt.size());
        let sa = self.phase(desc, true, |_, slot| {
            // SAFETY: the slot is far larger than 8 bytes and aligned.
            unsafe { slot.cast::<u64>().write(buf as u64) }
        })?;
        let from: Vec<(usize, u32, usize)> = self
            .live()
            .map(|r| {
                // SAFETY: rank r published one address at the start of its slot.
                let addr = unsafe { self.slot(r, sa).cast::<u64>().read() } as usize;
                (r, self.sh.seg(r).owner_pid(), addr)
            })
            .collect();
        self.finish(sa); // the addresses are read; the slots carry nothing else
        let sec = (bytes / e).div_ceil(n) * e;
        let section = |r: usize| ((r * sec).min(bytes), ((r + 1) * sec).min(bytes));
        let (lo, hi) = section(me);
        // The own section is folded in place, so this rank's input goes first (it is the
        // first thing overwritten); only this rank computes the section, so the order does
        // not have to match anyone else's.
        let mut own_first = from.clone();
        own_first.sort_by_key(|&(r, _, _)| r != me);
        // SAFETY: the own section is written only by this rank and read by the others only
        // after the phase below.
        self.failed |= unsafe { self.cma_fold(&own_first, lo, hi - lo, dt, op, buf.add(lo)) };
        let sb = self.phase(desc, false, |_, _| {})?;
        self.finish(sb);
        let owners: Vec<usize> = self.live().collect();
        let orphans: Vec<usize> = (0..n)
            .filter(|r| !owners.contains(r) && section(*r).0 < section(*r).1)
            .collect();
        let mut side: Vec<(usize, Vec<u64>)> = Vec::new();
        for &r in &orphans {
            let (lo, hi) = section(r);
            let mut v = vec![0u64; (hi - lo).div_ceil(8)];
            let live: Vec<(usize, u32, usize)> = from
                .iter()
                .copied()
                .filter(|(x, _, _)| owners.contains(x))
                .collect();
            // SAFETY: `v` holds `hi - lo` bytes and is not part of any buffer.
            self.failed |=
                unsafe { self.cma_fold(&live, lo, hi - lo, dt, op, v.as_mut_ptr().cast()) };
            side.push((r, v));
        }
        if !side.is_empty() {
            let s = self.phase(desc, false, |_, _| {})?;
            self.finish(s);
        }
        for &(r, pid, addr) in &from {
            if r == me || !owners.contains(&r) {
                continue;
            }
            let (lo, hi) = section(r);
            // SAFETY: `buf + lo` holds `hi - lo` bytes; rank r's section is final (it
            // posted phase sb) and alive until the last phase.
            if unsafe { super::cma::read(pid, addr + lo, buf.add(lo), hi - lo) }.is_err() {
                self.failed |= Self::bit(r);
            }
        }
        for (r, v) in side {
            let (lo, hi) = section(r);
            // SAFETY: `v` holds `hi - lo` bytes; `buf + lo` too.
            unsafe { mv(v.as_ptr().cast(), buf.add(lo), hi - lo) };
        }
        let s = self.phase(desc, false, |_, _| {})?;
        self.finish(s);
        Ok(())
    }

    fn all_reduce(
        &mut self,
        desc: Desc,
        buf: *mut u8,
        bytes: usize,
        dt: DType,
        op: ReduceOp,
    ) -> Result<(), String> {
        if bytes <= SMALL_ALL_REDUCE_BYTES {
            return self.chunked(
                desc,
                bytes,
                PG_COLL_SLOT_BYTES,
                &|_, _, _| None,
                |r, _, len, w| {
                    if w {
                        // SAFETY: `buf` holds `bytes` bytes.
                        unsafe { mv(buf, r.slot(r.sh.rank, r.seq + 1), len) };
                    } else {
                        let srcs: Vec<*const u8> =
                            r.live().map(|x| r.slot(x, r.seq).cast_const()).collect();
                        // SAFETY: the slots hold `len` published bytes; `buf` is disjoint.
                        unsafe { fold_into(dt, op, &srcs, buf, len) };
                    }
                },
            );
        }
        let mut off = 0;
        let mut first = true;
        let at = |off: usize| (buf.wrapping_add(off), PG_COLL_SLOT_BYTES.min(bytes - off));
        // Chunk k's phase B is phase seq + 2k + 2: register it at least two phases ahead,
        // before this rank's `done` lets the peers push it.
        self.expect_sections(self.seq + 2, buf, at(0).1, dt.size());
        while off < bytes {
            let len = PG_COLL_SLOT_BYTES.min(bytes - off);
            if off + len < bytes {
                let (next, next_len) = at(off + len);
                self.expect_sections(self.seq + 4, next, next_len, dt.size());
            }
            // SAFETY: `buf` holds `bytes` bytes, so `off + len` of them.
            unsafe { self.all_reduce_chunk(desc, first, buf.add(off), len, dt, op) }?;
            first = false;
            off += len;
        }
        Ok(())
    }

    /// Whether every live peer of this op is on another host, so nobody maps this rank's
    /// collective slot: phases then push straight from the caller's buffers
    /// ([`super::push`]) instead of copying them into the slot first.
    fn remote_only(&self) -> bool {
        self.sh.net.is_some() && self.peers().iter().all(|&p| self.sh.seg(p).is_remote())
    }

    /// Pushes reader `q`'s bytes of the coming phase from `src(q)` (`(address, bytes)`).
    fn push_from(&self, src: impl Fn(usize) -> (*const u8, usize)) {
        let slot = ((self.seq + 1) & 1) as usize;
        for q in 0..self.sh.ranks {
            let (p, len) = src(q);
            self.sh.push_from.set(slot, q, p, len);
        }
    }

    /// Asks the receive thread to read remote rank `src`'s `len` bytes of phase `s` at slot
    /// offset `off` straight into `dst` ([`super::redirect`]; refused when too late).
    ///
    /// Only when every live peer is on another host ([`Runner::remote_only`]): a mixed
    /// group copies out of the replica as before (it was switched off there while a bug of
    /// the all_to_all write side, since fixed, was unexplained; `tests/tcp_redirect.rs`
    /// covers groups whose ranks are all on different hosts).
    fn expect(&self, s: u64, src: usize, off: usize, len: usize, dst: *mut u8) {
        if !REDIRECT || !self.remote_only() {
            return;
        }
        let seg = self.sh.seg(src);
        if let Some(r) = seg.redirect().filter(|_| src != self.sh.rank) {
            r.register(s, off, len, dst);
        }
    }

    /// Whether rank `src`'s bytes of phase `s` at slot offset `off` went to the destination
    /// registered for them (no copy out of the replica needed).
    fn received(&self, s: u64, src: usize, off: usize) -> bool {
        let seg = self.sh.seg(src);
        src != self.sh.rank && seg.redirect().is_some_and(|r| r.delivered(s, off))
    }

    /// Drops this op's registrations (at its end, whatever happened), waiting for a receive
    /// thread still writing into one of its destinations.
    fn forget_expected(&self) {
        if self.sh.net.is_none() {
            return;
        }
        for r in (0..self.sh.ranks).filter(|&r| r != self.sh.rank) {
            if let Some(x) = self.sh.seg(r).redirect() {
                x.clear();
            }
        }
    }

    /// Registers where each remote peer's reduced section of the all_reduce chunk of `len`
    /// bytes at `chunk` lands when it arrives in phase `s` (that chunk's second phase).
    fn expect_sections(&self, s: u64, chunk: *mut u8, len: usize, e: usize) {
        let sec = (len / e).div_ceil(self.sh.ranks) * e;
        for r in self.peers() {
            let (lo, hi) = ((r * sec).min(len), ((r + 1) * sec).min(len));
            if lo < hi {
                self.expect(s, r, 0, hi - lo, chunk.wrapping_add(lo));
            }
        }
    }

    /// Phase A of an all_reduce chunk of `len` bytes at `chunk` (sections of `sec` bytes):
    /// each remote reader gets its own section, or the whole chunk when this rank sees a
    /// section without a live owner (`full`, returned with the phase).
    fn all_reduce_post(
        &mut self,
        desc: Desc,
        first: bool,
        chunk: *mut u8,
        len: usize,
        sec: usize,
        direct: bool,
    ) -> Result<(u64, bool), String> {
        let section = |r: usize| ((r * sec).min(len), ((r + 1) * sec).min(len));
        // A dead rank that is still active (no auto-deactivation) owns no section either.
        let live_at_start: Vec<usize> = self.live().filter(|&r| self.sh.alive(r)).collect();
        let full =
            (0..self.sh.ranks).any(|r| section(r).0 < section(r).1 && !live_at_start.contains(&r));
        self.extent = if full { (0, len) } else { (sec, sec) };
        let sa = self.phase(desc, first, |r, slot| {
            if direct {
                r.push_from(|q| match full {
                    true => (chunk.cast_const(), len),
                    // SAFETY: section bounds lie inside the chunk.
                    false => (
                        unsafe { chunk.add(section(q).0) },
                        section(q).1 - section(q).0,
                    ),
                });
            } else {
                // SAFETY: `chunk` holds `len` bytes; the slot at least that.
                unsafe { mv(chunk, slot, len) }
            }
        })?;
        Ok((sa, full))
    }

    /// One slot-sized chunk of the two-phase all_reduce. Phase A posts the chunk, of which
    /// each peer on another host gets only its own 1/n section pushed (the section it
    /// reduces), unless this rank sees a section without a live owner: then the whole chunk,
    /// so every reader can fold that section itself. Each rank folds its section (in place
    /// when every peer is remote: own input first, the others in rank order) and posts it in
    /// phase B; every rank copies the sections. A section whose owner died between the
    /// phases is folded by every survivor from the data it holds: all of it from peers on
    /// this host, only what was pushed from peers on another host (see `docs/pg.md`).
    ///
    /// # Safety
    /// `chunk` is valid for `len` bytes (at most a slot) of the caller's buffer.
    unsafe fn all_reduce_chunk(
        &mut self,
        desc: Desc,
        first: bool,
        chunk: *mut u8,
        len: usize,
        dt: DType,
        op: ReduceOp,
    ) -> Result<(), String> {
        let (n, me, e) = (self.sh.ranks, self.sh.rank, dt.size());
        let sec = (len / e).div_ceil(n) * e;
        let section = |r: usize| ((r * sec).min(len), ((r + 1) * sec).min(len));
        let direct = self.remote_only();
        let (sa, full) = self.all_reduce_post(desc, first, chunk, len, sec, direct)?;
        let contrib: Vec<usize> = self.live().collect();
        // Rank `x`'s phase-A bytes at `lo`: this rank's own input when it posted none.
        let src_at = |r: &Self, x: usize, lo: usize| -> *const u8 {
            let at = if direct && x == me {
                chunk
            } else {
                r.slot(x, sa)
            };
            at.wrapping_add(lo)
        };
        let (lo, hi) = section(me);
        self.extent = (0, hi - lo);
        let sb = self.phase(desc, false, |r, slot| {
            let mut srcs: Vec<*const u8> = contrib.iter().map(|&x| src_at(r, x, lo)).collect();
            if direct {
                // In place: own input first (the first source is only copied, a no-op here).
                srcs.retain(|&p| p != src_at(r, me, lo));
                srcs.insert(0, src_at(r, me, lo));
                // SAFETY: `chunk + lo` holds `hi - lo` bytes; the other sources are slots.
                unsafe { fold_into(dt, op, &srcs, chunk.add(lo), hi - lo) };
                // SAFETY: as above.
                r.push_from(|_| (unsafe { chunk.add(lo) }.cast_const(), hi - lo));
            } else {
                // SAFETY: the phase-A slots hold `len` bytes; the own phase-B slot is disjoint.
                unsafe { fold_into(dt, op, &srcs, slot, hi - lo) }
            }
        })?;
        let posted: Vec<usize> = self.live().collect();
        for r in (0..n).filter(|&r| section(r).0 < section(r).1) {
            let (lo, hi) = section(r);
            if posted.contains(&r) {
                let in_place = (direct && r == me) || self.received(sb, r, 0);
                if !in_place {
                    // SAFETY: `chunk` holds `len` bytes; rank r's B slot its section.
                    unsafe { mv(self.slot(r, sb), chunk.add(lo), hi - lo) };
                }
                continue;
            }
            // The section's owner is inactive or died: fold it here, in rank order, from
            // every contributor whose bytes of it this rank holds.
            let srcs: Vec<*const u8> = contrib
                .iter()
                .filter(|&&x| full || x == me || !self.sh.seg(x).is_remote())
                .map(|&x| src_at(self, x, lo))
                .collect();
            let mut tmp = vec![0u64; (hi - lo).div_ceil(8)];
            // SAFETY: `tmp` holds `hi - lo` bytes, disjoint from every source; `chunk` too.
            unsafe {
                fold_into(dt, op, &srcs, tmp.as_mut_ptr().cast(), hi - lo);
                mv(tmp.as_ptr().cast(), chunk.add(lo), hi - lo);
            }
        }
        self.finish(sb);
        Ok(())
    }
}
