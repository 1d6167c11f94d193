//! Membership: group views, proposals (activate / deactivate), joins and replacement
//! processes, agreed through the shared segments.
//!
//! A *view* is `(vid, mask, prev, from_op, inc)`: the active ranks from collective op number
//! `from_op` on, and for every slot the pid of the process that holds it (`inc`, 0 = the
//! process that founded the group). Views are cumulative: each one names the whole active
//! set. Every rank runs collectives in the same order and counts them (`ops`), so "from op
//! `F`" is the same point of the program on every member.
//!
//! **The decider** is the lowest rank that is alive, active in the newest view and still in
//! the group (not left, not closed). It is not elected: every rank computes it from the
//! segments. Proposals are written by the proposer into its own segment (request slot); the
//! decider's membership thread answers them in its segment, one at a time:
//!
//! 1. it checks the proposal against the newest view (out-of-range ranks are refused by
//!    the caller; a target of an activation must be alive and waiting in `join_group`, for
//!    up to [`ADMISSION_TIMEOUT`]); no change needed ⇒ `Applied` at once;
//! 2. it stores `pending = vid + 1` and waits until every live member has *acknowledged*:
//!    a member's membership thread, under the member's op gate, stops the member from
//!    starting new collectives and publishes how many it has started (`ack_ops`);
//! 3. it commits the view with `from_op = max(ack_ops) + 1` into its own segment and clears
//!    `pending`; members queue it, resume, and adopt it when they start op `from_op` (or at
//!    once when they are idle or not active).
//!
//! No member can have started op `from_op` in the old view (it acked with fewer ops and was
//! held until the commit), and every member starts it in the new one, so all members switch
//! at the same op. Nobody waits on an op to acknowledge, so a member inside an op (waiting
//! for a slower peer) never blocks the proposal. On a view change every member restarts its
//! phase counter at `vid << 40` (a joiner's counters are stale or zero); the first two
//! phases of a view wait until the previous view's peers have finished reading.
//!
//! Decider death: the committed view lives in shared memory that outlives the process, and
//! every member copies the newest view into its own segment, so the next decider (the next
//! lowest live active rank) starts from it. A decider that dies between `pending` and the
//! commit leaves nothing committed: members see it dead and resume in the old view; the
//! proposer's request is still unanswered in its segment and the new decider answers it.
//!
//! A process joining the group (a replacement with `is_extension=True`) maps the live
//! members' segments on its host through `/proc/<pid>/fd/<fd>` (published through the torch
//! store), writes `(pid, fd)` of its own segment into its mailbox word in each of them, and
//! waits in `join_group`; members map the new segment when they adopt a view whose `inc`
//! names it. A member on another host learns of it through the network layer instead, which
//! writes `(pid, u32::MAX)` into the member's own mailbox word and holds a replica of the
//! joiner's segment ([`super::net::Net::join`]).
//!
//! Across hosts, a remote member's words are read from its replica (`net.rs`), which the
//! links keep up to date in publish order ([`member_changes`]).
//!
//! Word layout of the membership area ([`Segment::member_word`]), one owner writer each
//! except the mailbox:
//!
//! ```text
//! word 0        ops started (u64)          word 8   vid of the adopted view
//! word 16       awaiting activation (1)    word 24  pending vid (decider)
//! word 32..34   ack: vid, ops, decider     word 40  closed (1): the communicator is gone
//! word 48..50   request: id, kind, mask
//! word 64..104  newest view: seqlock, vid, mask, prev, from_op, inc (two u32 pids a word)
//! word 128+r    mailbox of slot r: pid << 32 | fd (written by the joining process)
//! word 256+8q   answer to rank q: id, status, vid, dropped mask, reason
//! ```

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::seg::{load, store, Segment, MEMBER_WORDS};
use super::Shared;
use crate::limits::PG_MAX_RANKS;

const W_OPS: usize = 0;
const W_ADOPTED: usize = 8;
const W_AWAIT: usize = 16;
const W_PENDING: usize = 24;
const W_ACK: usize = 32;
const W_ACK_OPS: usize = 33;
const W_ACK_BY: usize = 34;
const W_CLOSED: usize = 40;
const W_REQ_ID: usize = 48;
const W_REQ_KIND: usize = 49;
const W_REQ_MASK: usize = 50;
const W_VSEQ: usize = 64;
const W_VID: usize = 65;
const W_VMASK: usize = 66;
const W_VPREV: usize = 67;
const W_VFROM: usize = 68;
const W_VINC: usize = 72;
const W_MAIL: usize = 128;
const W_ANS: usize = 256;
const _: () = assert!(W_VINC + PG_MAX_RANKS / 2 <= W_MAIL);
const _: () = assert!(W_MAIL + PG_MAX_RANKS <= W_ANS);
const _: () = assert!(W_ANS + 8 * PG_MAX_RANKS <= MEMBER_WORDS);

/// Proposal kinds.
pub const KIND_ACTIVATE: u64 = 1;
/// See [`KIND_ACTIVATE`].
pub const KIND_DEACTIVATE: u64 = 2;

/// How long an activation waits for its targets to be alive and in `join_group`.
pub const ADMISSION_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the decider waits for every live member to acknowledge a pending view.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Period of the membership thread.
const TICK: Duration = Duration::from_millis(2);

/// A committed view of the group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// View id: 0 at bootstrap, +1 per committed change.
    pub vid: u64,
    /// Active ranks (bit r = rank r).
    pub mask: u64,
    /// The mask of the view before.
    pub prev: u64,
    /// First collective op (1-based count) that runs in this view.
    pub from_op: u64,
    /// Pid holding each slot (0 = the founding process).
    pub inc: [u32; PG_MAX_RANKS],
}

impl View {
    /// The bootstrap view: `mask` active, founding processes.
    pub fn initial(mask: u64) -> View {
        View {
            vid: 0,
            mask,
            prev: mask,
            from_op: 0,
            inc: [0; PG_MAX_RANKS],
        }
    }
}

fn w(seg: &Segment, i: usize) -> &AtomicU64 {
    seg.member_word(i)
}

fn bit(r: usize) -> u64 {
    1u64 << r
}

/// Writes `v` as `seg`'s newest view (seqlock; only the owner calls this).
fn write_view(seg: &Segment, v: &View) {
    let seq = w(seg, W_VSEQ).load(Ordering::Relaxed);
    w(seg, W_VSEQ).store(seq + 1, Ordering::Relaxed);
    fence(Ordering::Release);
    w(seg, W_VID).store(v.vid, Ordering::Relaxed);
    w(seg, W_VMASK).store(v.mask, Ordering::Relaxed);
    w(seg, W_VPREV).store(v.prev, Ordering::Relaxed);
    w(seg, W_VFROM).store(v.from_op, Ordering::Relaxed);
    for i in 0..PG_MAX_RANKS / 2 {
        let word = u64::from(v.inc[2 * i]) | u64::from(v.inc[2 * i + 1]) << 32;
        w(seg, W_VINC + i).store(word, Ordering::Relaxed);
    }
    w(seg, W_VSEQ).store(seq + 2, Ordering::Release);
}

/// Reads `seg`'s newest view; `None` if it was being rewritten on every try.
pub fn read_view(seg: &Segment) -> Option<View> {
    read_view_seq(seg).map(|(_, v)| v)
}

/// [`read_view`] with the (even, non-zero) sequence number it was read at.
fn read_view_seq(seg: &Segment) -> Option<(u64, View)> {
    for _ in 0..10_000 {
        let s1 = w(seg, W_VSEQ).load(Ordering::Acquire);
        if s1 % 2 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let mut v = View::initial(0);
        v.vid = w(seg, W_VID).load(Ordering::Relaxed);
        v.mask = w(seg, W_VMASK).load(Ordering::Relaxed);
        v.prev = w(seg, W_VPREV).load(Ordering::Relaxed);
        v.from_op = w(seg, W_VFROM).load(Ordering::Relaxed);
        for i in 0..PG_MAX_RANKS / 2 {
            let word = w(seg, W_VINC + i).load(Ordering::Relaxed);
            v.inc[2 * i] = word as u32;
            v.inc[2 * i + 1] = (word >> 32) as u32;
        }
        fence(Ordering::Acquire);
        if w(seg, W_VSEQ).load(Ordering::Relaxed) == s1 {
            return (s1 > 0).then_some((s1, v));
        }
    }
    None
}

/// The membership words of `own` that changed since `last` (what the peer's replica
/// holds), in the order a remote peer must receive them; `last` is updated.
///
/// Shared memory lets a reader see every word as soon as it is stored; a replica receives
/// STOREs in order over the link (`net.rs`), so each word that *publishes* others must
/// arrive after them: `ack` after its op count and decider, a request's id after its kind
/// and mask, an answer's id after its fields, the view under its seqlock (odd, fields,
/// even), and `pending` after the view (a member that sees `pending` cleared reads the
/// committed view next). To get that from one snapshot, the publishing word is *read*
/// before the words it publishes (the writer stores it after them), and *sent* after.
pub(crate) fn member_changes(own: &Segment, last: &mut [u64], out: &mut Vec<(usize, u64)>) {
    debug_assert_eq!(last.len(), MEMBER_WORDS);
    let pending = load(w(own, W_PENDING));
    let view = read_view_seq(own);
    let ack = load(w(own, W_ACK));
    let req = load(w(own, W_REQ_ID));
    fn push(last: &mut [u64], i: usize, v: u64, out: &mut Vec<(usize, u64)>) {
        if last[i] != v {
            last[i] = v;
            out.push((i, v));
        }
    }
    let mut answers = [0u64; PG_MAX_RANKS];
    for (q, a) in answers.iter_mut().enumerate() {
        *a = load(w(own, W_ANS + 8 * q));
    }
    for i in [W_OPS, W_ADOPTED, W_AWAIT, W_CLOSED] {
        push(last, i, load(w(own, i)), out);
    }
    for i in W_MAIL..W_MAIL + PG_MAX_RANKS {
        push(last, i, load(w(own, i)), out);
    }
    push(last, W_ACK_OPS, load(w(own, W_ACK_OPS)), out);
    push(last, W_ACK_BY, load(w(own, W_ACK_BY)), out);
    push(last, W_ACK, ack, out);
    push(last, W_REQ_KIND, load(w(own, W_REQ_KIND)), out);
    push(last, W_REQ_MASK, load(w(own, W_REQ_MASK)), out);
    push(last, W_REQ_ID, req, out);
    for (q, id) in answers.into_iter().enumerate() {
        let base = W_ANS + 8 * q;
        for i in base + 1..base + 5 {
            push(last, i, load(w(own, i)), out);
        }
        push(last, base, id, out);
    }
    if let Some((seq, v)) = view {
        if last[W_VSEQ] != seq {
            // Odd first: a reader of the replica retries until the closing even store.
            out.push((W_VSEQ, seq - 1));
            push(last, W_VID, v.vid, out);
            push(last, W_VMASK, v.mask, out);
            push(last, W_VPREV, v.prev, out);
            push(last, W_VFROM, v.from_op, out);
            for i in 0..PG_MAX_RANKS / 2 {
                let word = u64::from(v.inc[2 * i]) | u64::from(v.inc[2 * i + 1]) << 32;
                push(last, W_VINC + i, word, out);
            }
            last[W_VSEQ] = seq;
            out.push((W_VSEQ, seq));
        }
    }
    push(last, W_PENDING, pending, out);
}

/// What the decider answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// 0 rejected, 1 applied, 2 applied with dropped ranks (upstream's `ProposalStatus`).
    pub status: u64,
    /// The view id after the proposal.
    pub vid: u64,
    /// Ranks dropped because they died while the view was decided.
    pub dropped: u64,
    /// Why it was rejected.
    pub reason: String,
}

const R_ADMISSION: u64 = 1;
const R_NO_ACK: u64 = 2;
const R_EMPTY: u64 = 3;
const R_LEFT: u64 = 4;

fn reason_text(code: u64) -> String {
    let arg = code >> 8;
    match code & 0xff {
        0 => String::new(),
        R_ADMISSION => format!(
            "proposal admission timed out: rank {arg} is not alive and waiting in join_group"
        ),
        R_NO_ACK => format!("rank {arg} did not acknowledge the view change"),
        R_EMPTY => "the proposal would leave the group without an active rank".into(),
        R_LEFT => format!("rank {arg} left the group; a rank that left cannot be reactivated"),
        c => format!("reason {c}"),
    }
}

struct Gate {
    /// Collective ops started.
    ops: u64,
    in_op: bool,
    /// Adopted view: id, mask, phase base.
    vid: u64,
    mask: u64,
    base: u64,
    /// Joined by extension and not activated yet: collectives run on this rank alone.
    isolated: bool,
    /// Acknowledged pending view `(vid, decider)`: no new op starts until it is resolved.
    frozen: Option<(u64, usize)>,
    /// Committed views not adopted yet, oldest first.
    queue: VecDeque<View>,
    /// Newest committed view seen.
    latest: View,
}

/// Per-communicator membership state (lives in [`Shared`]).
pub struct State {
    gate: Mutex<Gate>,
    cv: Condvar,
    /// Slots whose channel counters must restart (their process was replaced).
    p2p_reset: AtomicU64,
    /// Serialises this process's proposals (one request slot).
    proposing: Mutex<()>,
}

impl State {
    /// State starting in view `v`; `joining` for a process that joins by extension.
    pub fn new(v: View, joining: bool) -> State {
        State {
            gate: Mutex::new(Gate {
                ops: 0,
                in_op: false,
                vid: v.vid,
                mask: v.mask,
                base: 0,
                isolated: joining,
                frozen: None,
                queue: VecDeque::new(),
                latest: v,
            }),
            cv: Condvar::new(),
            p2p_reset: AtomicU64::new(0),
            proposing: Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Gate> {
        self.gate.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `(adopted view id, phase base)` for the collective thread.
    pub fn view_base(&self) -> (u64, u64) {
        let g = self.lock();
        (g.vid, g.base)
    }

    /// Slots whose point-to-point channels restart, cleared.
    pub fn take_p2p_reset(&self) -> u64 {
        self.p2p_reset.swap(0, Ordering::AcqRel)
    }

    /// Id of the newest committed view this rank has seen.
    pub fn latest_vid(&self) -> u64 {
        self.lock().latest.vid
    }
}

/// The decider of view `v`: its lowest serving active rank.
fn decider(sh: &Shared, v: &View) -> Option<usize> {
    (0..sh.ranks).find(|&r| v.mask & bit(r) != 0 && serving_in(sh, r, v))
}

/// Called by the collective thread before each op: waits while a pending view is
/// acknowledged, adopts due views, counts the op.
pub(super) fn begin_op(sh: &Shared) {
    let m = &sh.member;
    let mut g = m.lock();
    while g.frozen.is_some() {
        g =
            m.cv.wait_timeout(g, Duration::from_millis(1))
                .unwrap_or_else(|e| e.into_inner())
                .0;
    }
    adopt_due(sh, &mut g);
    g.ops += 1;
    g.in_op = true;
    store(w(&sh.own, W_OPS), g.ops);
}

/// Called by the collective thread after each op.
pub(super) fn end_op(sh: &Shared) {
    sh.member.lock().in_op = false;
}

/// Adopts every queued view that is due at the next op (`ops + 1`); a rank that is not an
/// active member adopts at once, and one that becomes active continues at `from_op`.
fn adopt_due(sh: &Shared, g: &mut Gate) {
    while let Some(v) = g.queue.front().copied() {
        let member = g.mask & bit(sh.rank) != 0 && !g.isolated;
        if member && v.from_op > g.ops + 1 {
            return;
        }
        g.queue.pop_front();
        apply(sh, g, &v);
        if !member && v.mask & bit(sh.rank) != 0 {
            g.ops = v.from_op.saturating_sub(1);
        }
    }
}

fn apply(sh: &Shared, g: &mut Gate, v: &View) {
    for r in (0..sh.ranks).filter(|&r| r != sh.rank) {
        if v.inc[r] != 0 && v.inc[r] != sh.seg(r).owner_pid() {
            if let Some(seg) = map_mailbox(sh, r, v.inc[r]) {
                *sh.segs[r].write().unwrap_or_else(|e| e.into_inner()) = seg;
                store(sh.own.sent(r), 0);
                store(sh.own.acked(r), 0);
                sh.member.p2p_reset.fetch_or(bit(r), Ordering::AcqRel);
            }
        }
    }
    g.vid = v.vid;
    g.mask = v.mask;
    g.base = v.vid << 40;
    if v.mask & bit(sh.rank) != 0 {
        g.isolated = false;
        store(w(&sh.own, W_AWAIT), 0);
    }
    let mut act = v.mask;
    if sh.auto_deactivate {
        for r in 0..sh.ranks {
            if act & bit(r) != 0 && r != sh.rank {
                let seg = sh.seg(r);
                if !seg.owner_alive() || seg.has_left() {
                    act &= !bit(r);
                }
            }
        }
    }
    if g.isolated {
        act = bit(sh.rank);
    }
    sh.set_active(act);
    store(w(&sh.own, W_ADOPTED), v.vid);
}

/// Maps the segment a joining process announced in this rank's mailbox for slot `r`, if
/// it belongs to process `pid`, is alive and is rank `r` of this group.
fn map_mailbox(sh: &Shared, r: usize, pid: u32) -> Option<Arc<Segment>> {
    let word = load(w(&sh.own, W_MAIL + r));
    if word == 0 || (word >> 32) as u32 != pid {
        return None;
    }
    if word as u32 == REMOTE_FD {
        return sh.remote_joiner(r, pid);
    }
    let path = format!("/proc/{pid}/fd/{}", word as u32);
    let seg = Segment::open(&path, sh.ranks, r).ok()?;
    (seg.owner_pid() == pid && seg.owner_alive()).then(|| Arc::new(seg))
}

/// The segment that would hold slot `r` if activated now: a joining process's (announced in
/// the mailbox, different from the mapped one) or the mapped one (in-place rejoin).
fn candidate(sh: &Shared, r: usize) -> Arc<Segment> {
    let cur = sh.seg(r);
    let word = load(w(&sh.own, W_MAIL + r));
    let pid = (word >> 32) as u32;
    if word != 0 && pid != cur.owner_pid() {
        if let Some(seg) = map_mailbox(sh, r, pid) {
            return seg;
        }
    }
    cur
}

/// The segment of the process view `v` puts in slot `r` (this rank may not have switched
/// to it yet).
fn holder(sh: &Shared, r: usize, v: &View) -> Arc<Segment> {
    let cur = sh.seg(r);
    if r != sh.rank && v.inc[r] != 0 && v.inc[r] != cur.owner_pid() {
        if let Some(seg) = map_mailbox(sh, r, v.inc[r]) {
            return seg;
        }
    }
    cur
}

/// Whether the holder of slot `r` in view `v` is alive and still in the group.
fn serving_in(sh: &Shared, r: usize, v: &View) -> bool {
    let seg = holder(sh, r, v);
    !seg.has_left() && load(w(&seg, W_CLOSED)) == 0 && (r == sh.rank || seg.owner_alive())
}

/// Whether rank `r` is alive and either active in the newest view or waiting to be
/// activated (upstream's `get_peer_state`).
pub fn peer_ready(sh: &Shared, r: usize) -> bool {
    if r == sh.rank {
        return true;
    }
    let latest = sh.member.lock().latest;
    if latest.mask & bit(r) != 0 && serving_in(sh, r, &latest) {
        return true;
    }
    let c = candidate(sh, r);
    c.owner_alive() && load(w(&c, W_AWAIT)) == 1
}

/// Queues every view committed since the last look (the newest among the mapped segments).
fn scan_views(sh: &Shared) {
    let mut best: Option<View> = None;
    for r in 0..sh.ranks {
        let seg = sh.seg(r);
        if load(w(&seg, W_VID)) == 0 && load(w(&seg, W_VSEQ)) == 0 {
            continue;
        }
        if let Some(v) = read_view(&seg) {
            if best.is_none_or(|b| v.vid > b.vid) {
                best = Some(v);
            }
        }
    }
    let Some(v) = best else { return };
    let m = &sh.member;
    let mut g = m.lock();
    if v.vid <= g.latest.vid {
        return;
    }
    g.latest = v;
    g.queue.push_back(v);
    if g.frozen.is_some_and(|(pv, _)| pv <= v.vid) {
        g.frozen = None;
    }
    // Under the gate: several threads of this process may scan, one writer at a time.
    write_view(&sh.own, &v);
    drop(g);
    m.cv.notify_all();
}

/// Acknowledges a pending view of decider `d`: holds new ops and publishes the op count.
fn ack(sh: &Shared, pv: u64, d: usize) {
    let mut g = sh.member.lock();
    if g.latest.vid >= pv || g.frozen.is_some_and(|(f, fd)| f == pv && fd == d) {
        return;
    }
    g.frozen = Some((pv, d));
    store(w(&sh.own, W_ACK_OPS), g.ops);
    store(w(&sh.own, W_ACK_BY), d as u64);
    store(w(&sh.own, W_ACK), pv);
}

/// One round of the membership thread.
fn tick(sh: &Shared, dec: &mut Decider) {
    scan_views(sh);
    let m = &sh.member;
    // A frozen rank resumes when the view is committed (above) or abandoned.
    let frozen = m.lock().frozen;
    if let Some((pv, d)) = frozen {
        let seg = sh.seg(d);
        if load(w(&seg, W_PENDING)) != pv || (d != sh.rank && !seg.owner_alive()) {
            scan_views(sh); // the commit is written before `pending` is cleared
            let mut g = m.lock();
            if g.frozen == Some((pv, d)) {
                g.frozen = None;
            }
            drop(g);
            m.cv.notify_all();
        }
    }
    for d in 0..sh.ranks {
        let seg = sh.seg(d);
        let pv = load(w(&seg, W_PENDING));
        if pv != 0 && (d == sh.rank || seg.owner_alive()) {
            ack(sh, pv, d);
        }
    }
    {
        let mut g = m.lock();
        if !g.in_op && g.frozen.is_none() && !g.queue.is_empty() {
            adopt_due(sh, &mut g);
        }
    }
    let (latest, isolated) = {
        let g = m.lock();
        (g.latest, g.isolated)
    };
    // A process that has not been activated yet (a joiner) is not in any member's view:
    // even in slot 0 it must not decide (the members pick the next live rank).
    if !isolated && decider(sh, &latest) == Some(sh.rank) {
        dec.step(sh, &latest);
    }
    // Whatever this round wrote reaches the peers on other hosts.
    sh.publish_member();
}

/// Starts the membership thread; it ends once the communicator and its workers are gone.
pub(super) fn spawn(sh: &Arc<Shared>) -> io::Result<()> {
    let weak = Arc::downgrade(sh);
    std::thread::Builder::new()
        .name(format!("mc-pg-member-{}", sh.rank))
        .spawn(move || {
            let mut dec = Decider::default();
            loop {
                std::thread::sleep(TICK);
                let Some(sh) = weak.upgrade() else { return };
                if load(w(&sh.own, W_CLOSED)) != 0 {
                    return;
                }
                tick(&sh, &mut dec);
            }
        })?;
    Ok(())
}

/// Marks this rank's communicator as gone (it stops deciding and acknowledging).
pub(super) fn close(sh: &Shared) {
    store(w(&sh.own, W_CLOSED), 1);
    sh.publish_member();
}

/// The decider's bookkeeping: when each waiting request was first seen, and where the
/// next round starts (round robin, so no proposer waits behind another's stream).
#[derive(Default)]
struct Decider {
    first_seen: HashMap<(usize, u64), Instant>,
    next: usize,
}

fn answered(sh: &Shared, q: usize, id: u64) -> bool {
    (0..sh.ranks).any(|r| load(w(&sh.seg(r), W_ANS + 8 * q)) >= id)
}

fn write_answer(sh: &Shared, q: usize, id: u64, status: u64, vid: u64, dropped: u64, why: u64) {
    let base = W_ANS + 8 * q;
    store(w(&sh.own, base + 1), status);
    store(w(&sh.own, base + 2), vid);
    store(w(&sh.own, base + 3), dropped);
    store(w(&sh.own, base + 4), why);
    store(w(&sh.own, base), id);
}

impl Decider {
    /// Answers every request that needs no new view, and at most one that does.
    fn step(&mut self, sh: &Shared, latest: &View) {
        let start = self.next;
        for q in (0..sh.ranks).map(|i| (start + i) % sh.ranks) {
            let seg = sh.seg(q);
            let id = load(w(&seg, W_REQ_ID));
            if id == 0 || answered(sh, q, id) {
                continue;
            }
            let kind = load(w(&seg, W_REQ_KIND));
            let mask = load(w(&seg, W_REQ_MASK));
            if let Some((status, vid, dropped, why)) = self.decide(sh, q, id, kind, mask, latest) {
                write_answer(sh, q, id, status, vid, dropped, why);
                self.first_seen.remove(&(q, id));
                if vid != latest.vid {
                    // A new view: the next request is decided against it, next round.
                    self.next = (q + 1) % sh.ranks;
                    return;
                }
            }
        }
    }

    /// `None` while an activation waits for its targets.
    fn decide(
        &mut self,
        sh: &Shared,
        q: usize,
        id: u64,
        kind: u64,
        targets: u64,
        latest: &View,
    ) -> Option<(u64, u64, u64, u64)> {
        let mut cur = 0u64;
        for r in (0..sh.ranks).filter(|&r| latest.mask & bit(r) != 0) {
            if serving_in(sh, r, latest) {
                cur |= bit(r);
            }
        }
        let mut want = cur;
        let mut inc = latest.inc;
        if kind == KIND_ACTIVATE {
            for t in (0..sh.ranks).filter(|&t| targets & bit(t) != 0 && cur & bit(t) == 0) {
                let c = candidate(sh, t);
                if c.has_left() && c.owner_alive() {
                    return Some((0, latest.vid, 0, R_LEFT | (t as u64) << 8));
                }
                if t != sh.rank && c.owner_alive() && load(w(&c, W_AWAIT)) == 1 {
                    want |= bit(t);
                    inc[t] = c.owner_pid();
                    continue;
                }
                let first = *self.first_seen.entry((q, id)).or_insert_with(Instant::now);
                if first.elapsed() > ADMISSION_TIMEOUT {
                    return Some((0, latest.vid, 0, R_ADMISSION | (t as u64) << 8));
                }
                return None;
            }
        } else {
            if latest.mask & targets == 0 {
                return Some((1, latest.vid, 0, 0));
            }
            want &= !targets;
        }
        if want == cur && kind == KIND_ACTIVATE {
            return Some((1, latest.vid, 0, 0));
        }
        if want == 0 {
            return Some((0, latest.vid, 0, R_EMPTY));
        }
        Some(commit(sh, latest, cur, want, inc))
    }
}

/// Steps 2 and 3 of the module docs: pending, acknowledgements, commit.
fn commit(sh: &Shared, latest: &View, cur: u64, want: u64, inc: [u32; 64]) -> (u64, u64, u64, u64) {
    let pv = latest.vid + 1;
    let me = sh.rank;
    w(&sh.own, W_PENDING).store(pv, Ordering::SeqCst);
    ack(sh, pv, me);
    sh.publish_member();
    let deadline = Instant::now() + ACK_TIMEOUT;
    let mut dead = 0u64;
    let max_ops = loop {
        let mut missing = None;
        let mut ops = 0u64;
        let dead_now = dead;
        for r in (0..sh.ranks).filter(|&r| cur & bit(r) != 0 && dead_now & bit(r) == 0) {
            let seg = holder(sh, r, latest);
            if load(w(&seg, W_ACK)) == pv && load(w(&seg, W_ACK_BY)) == me as u64 {
                ops = ops.max(load(w(&seg, W_ACK_OPS)));
            } else if r != me && !seg.owner_alive() {
                dead |= bit(r);
            } else {
                missing = Some(r);
            }
        }
        match missing {
            None => break ops,
            Some(r) if Instant::now() > deadline => {
                w(&sh.own, W_PENDING).store(0, Ordering::SeqCst);
                sh.publish_member();
                let mut g = sh.member.lock();
                if g.frozen == Some((pv, me)) {
                    g.frozen = None;
                }
                drop(g);
                sh.member.cv.notify_all();
                return (0, latest.vid, 0, R_NO_ACK | (r as u64) << 8);
            }
            Some(_) => {
                // Acknowledgements of remote members arrive through the links; this
                // rank's own ack and pending went out above (a retry is a no-op).
                sh.publish_member();
                std::thread::sleep(Duration::from_micros(200))
            }
        }
    };
    let want = want & !dead;
    let v = View {
        vid: pv,
        mask: want,
        prev: latest.mask,
        from_op: (max_ops + 1).max(latest.from_op),
        inc,
    };
    {
        let _g = sh.member.lock();
        write_view(&sh.own, &v);
    }
    w(&sh.own, W_PENDING).store(0, Ordering::SeqCst);
    sh.publish_member();
    scan_views(sh);
    let status = if dead != 0 { 2 } else { 1 };
    (status, pv, dead, 0)
}

/// Proposes activating (`KIND_ACTIVATE`) or deactivating `targets`; blocks until the decider
/// answers or `timeout` passes.
pub fn propose(sh: &Shared, kind: u64, targets: u64, timeout: Duration) -> Answer {
    let m = &sh.member;
    let _one = m.proposing.lock().unwrap_or_else(|e| e.into_inner());
    let id = load(w(&sh.own, W_REQ_ID)) + 1;
    store(w(&sh.own, W_REQ_KIND), kind);
    store(w(&sh.own, W_REQ_MASK), targets);
    store(w(&sh.own, W_REQ_ID), id);
    sh.publish_member();
    let deadline = Instant::now() + timeout;
    let me = sh.rank;
    loop {
        for r in 0..sh.ranks {
            let seg = sh.seg(r);
            let base = W_ANS + 8 * me;
            if load(w(&seg, base)) == id {
                let a = Answer {
                    status: load(w(&seg, base + 1)),
                    vid: load(w(&seg, base + 2)),
                    dropped: load(w(&seg, base + 3)),
                    reason: reason_text(load(w(&seg, base + 4))),
                };
                settle(sh, a.vid);
                return a;
            }
        }
        if Instant::now() > deadline {
            return Answer {
                status: 0,
                vid: m.latest_vid(),
                dropped: 0,
                reason: format!(
                    "no decision within {} s (no live active rank to decide?)",
                    timeout.as_secs()
                ),
            };
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// After a decision: waits briefly until view `vid` is known here and adopts it if this rank
/// is idle, so `active_ranks` shows it when the call returns (when no peer is ahead).
fn settle(sh: &Shared, vid: u64) {
    let until = Instant::now() + Duration::from_millis(500);
    while sh.member.latest_vid() < vid && Instant::now() < until {
        scan_views(sh);
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut g = sh.member.lock();
    if !g.in_op && g.frozen.is_none() {
        adopt_due(sh, &mut g);
    }
}

/// `join_group`: announces that this rank waits for activation and blocks until a view
/// makes it active (then it is, from that view's first op on).
pub fn join(sh: &Shared, timeout: Duration) -> Result<(), String> {
    {
        let g = sh.member.lock();
        if g.mask & bit(sh.rank) != 0 && !g.isolated && sh.active() & bit(sh.rank) != 0 {
            return Err(format!("rank {} is already active in this group", sh.rank));
        }
    }
    if sh.own.has_left() {
        return Err("this rank left the group; it cannot rejoin in place".into());
    }
    if (0..sh.ranks).all(|r| r == sh.rank || !sh.seg(r).owner_alive()) {
        return Err("no live member of this group to join (extension target not found)".into());
    }
    store(w(&sh.own, W_AWAIT), 1);
    sh.publish_member();
    let deadline = Instant::now() + timeout;
    loop {
        scan_views(sh);
        {
            let mut g = sh.member.lock();
            if !g.in_op && g.frozen.is_none() {
                adopt_due(sh, &mut g);
            }
            if g.mask & bit(sh.rank) != 0 && !g.isolated {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            store(w(&sh.own, W_AWAIT), 0);
            sh.publish_member();
            return Err(format!(
                "join_group: not activated within {} s (a member must call activate_ranks / \
                 recover_ranks for rank {})",
                timeout.as_secs(),
                sh.rank
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Mailbox word low half naming a joiner on another host: its segment is the replica the
/// network layer made when it admitted it ([`super::net::Net::joiner`]), not a file.
const REMOTE_FD: u32 = u32::MAX;

/// Announces, in this rank's own mailbox for slot `r`, the process `pid` on another host
/// that asks to take the slot over (the network layer admitted it and holds its replica).
pub(crate) fn announce_remote(sh: &Shared, r: usize, pid: u32) {
    store(
        w(&sh.own, W_MAIL + r),
        u64::from(pid) << 32 | u64::from(REMOTE_FD),
    );
}

/// Announces this process (a joiner) in every mapped live peer's mailbox for its slot.
pub fn announce(sh: &Shared) {
    let word = u64::from(std::process::id()) << 32 | sh.own.raw_fd() as u32 as u64;
    for r in (0..sh.ranks).filter(|&r| r != sh.rank) {
        let seg = sh.seg(r);
        // A member on another host learnt of this process when it admitted its link.
        if seg.owner_alive() && !seg.is_remote() {
            store(w(&seg, W_MAIL + sh.rank), word);
        }
    }
}

/// The newest view among `segs` (a joiner's starting point).
pub fn newest_view(segs: &[&Segment]) -> Option<View> {
    segs.iter()
        .filter_map(|s| read_view(s))
        .max_by_key(|v| v.vid)
}

/// Whether rank `r` waits in `join_group` (on the segment that would hold the slot).
pub fn awaiting(sh: &Shared, r: usize) -> bool {
    let c = candidate(sh, r);
    c.owner_alive() && load(w(&c, W_AWAIT)) == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_round_trips_through_a_segment() {
        let seg = Segment::tombstone(4, 1).expect("anonymous segment");
        assert_eq!(read_view(&seg), None, "no view before the first write");
        let mut v = View::initial(0b1011);
        v.vid = 7;
        v.prev = 0b1111;
        v.from_op = 42;
        v.inc[2] = 1234;
        v.inc[63] = u32::MAX;
        write_view(&seg, &v);
        assert_eq!(read_view(&seg), Some(v));
        v.vid = 8;
        write_view(&seg, &v);
        assert_eq!(newest_view(&[&seg]).map(|v| v.vid), Some(8));
    }

    /// The order a replica receives membership words in: every publishing word after the
    /// words it publishes, the view under its seqlock and before `pending`; nothing twice.
    #[test]
    fn member_changes_order() {
        let seg = Segment::tombstone(4, 0).expect("anonymous segment");
        let mut last = vec![0u64; MEMBER_WORDS];
        let mut out = Vec::new();
        member_changes(&seg, &mut last, &mut out);
        assert!(out.is_empty(), "nothing changed yet");
        store(w(&seg, W_ACK_OPS), 9);
        store(w(&seg, W_ACK_BY), 1);
        store(w(&seg, W_ACK), 3);
        store(w(&seg, W_REQ_KIND), KIND_ACTIVATE);
        store(w(&seg, W_REQ_MASK), 0b100);
        store(w(&seg, W_REQ_ID), 1);
        write_answer_words(&seg, 2, 5);
        let mut v = View::initial(0b111);
        v.vid = 3;
        write_view(&seg, &v);
        store(w(&seg, W_PENDING), 4);
        member_changes(&seg, &mut last, &mut out);
        let pos = |i: usize, val: u64| {
            out.iter()
                .position(|&x| x == (i, val))
                .unwrap_or_else(|| panic!("word {i} = {val} not pushed: {out:?}"))
        };
        assert!(pos(W_ACK_OPS, 9) < pos(W_ACK, 3) && pos(W_ACK_BY, 1) < pos(W_ACK, 3));
        assert!(pos(W_REQ_KIND, 1) < pos(W_REQ_ID, 1) && pos(W_REQ_MASK, 4) < pos(W_REQ_ID, 1));
        let ans = W_ANS + 8 * 2;
        assert!(pos(ans + 1, 1) < pos(ans, 5));
        let (odd, even) = (pos(W_VSEQ, 1), pos(W_VSEQ, 2));
        assert!(odd < pos(W_VID, 3) && pos(W_VID, 3) < even && pos(W_VMASK, 0b111) < even);
        assert!(even < pos(W_PENDING, 4), "the view before pending");
        // The replica now equals the segment: a second look sends nothing.
        out.clear();
        member_changes(&seg, &mut last, &mut out);
        assert!(out.is_empty(), "sent twice: {out:?}");
        // A replica applying the frames in order reads the same view.
        let rep = Segment::tombstone(4, 0).expect("anonymous segment");
        let mut last = vec![0u64; MEMBER_WORDS];
        member_changes(&seg, &mut last, &mut out);
        for &(i, val) in &out {
            store(w(&rep, i), val);
        }
        assert_eq!(read_view(&rep), Some(v));
    }

    fn write_answer_words(seg: &Segment, q: usize, id: u64) {
        let base = W_ANS + 8 * q;
        store(w(seg, base + 1), 1);
        store(w(seg, base), id);
    }

    #[test]
    fn reasons_name_the_rank() {
        assert!(reason_text(R_ADMISSION | 3 << 8).contains("rank 3"));
        assert!(reason_text(R_NO_ACK | 5 << 8).contains("rank 5"));
        assert!(reason_text(R_EMPTY).contains("without an active rank"));
    }
}
