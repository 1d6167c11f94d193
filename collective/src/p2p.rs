//! Point-to-point messages: one double-buffered channel per ordered pair of ranks, living in
//! the sender's segment ([`super::seg`]).
//!
//! A message of `m` bytes is `max(1, ceil(m / PG_P2P_SLOT_BYTES))` chunks. The sender writes
//! chunk `k` (counted per channel from 1) into slot `k % 2` with a header (message length,
//! chunk length) once the receiver has consumed chunk `k - 2` (`acked`), then publishes
//! `sent = k`; the receiver copies it out and publishes `acked = k`. Messages match in issue
//! order per peer and direction (tags are ignored, as upstream). A receive whose expected
//! length differs from the sent message consumes the whole message (the channel stays in
//! step) and fails with both lengths.
//!
//! One thread drives every pending send and receive of the communicator, so a rank may post
//! a large send and a large receive to the same peer in either order without deadlock.
//!
//! Every op reports its own outcome: only its peer can appear in its `failed` mask. A receive
//! succeeds once it has copied the whole message out. A send succeeds once the receiver has
//! acknowledged its last chunk, i.e. a matching receive took the message (upstream's sender
//! likewise needs the receiver's credit): publishing the chunks is not enough, since a peer
//! that dies with them unread never gets the message, and its sender must say so. The next
//! send to the same peer may publish while an earlier one waits for its acknowledgement, so
//! a stream of small sends is not serialised on round trips. An op fails (its peer marked in
//! its outcome) when the peer's process is dead, or when it has made no progress (no chunk
//! moved, no acknowledgement) for `P2P_TIMEOUT_US`.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::seg::{load, store};
use super::{Completion, Outcome, Shared, P2P_TIMEOUT_US};
use crate::limits::PG_P2P_SLOT_BYTES;

/// A pending send or receive.
pub struct P2pOp {
    send: bool,
    peer: usize,
    addr: usize,
    bytes: usize,
    done: Arc<Completion>,
    /// Chunks of this message moved so far.
    chunks: usize,
    /// Chunks of the message (a receive learns it from the first chunk's header).
    total: Option<usize>,
    error: Option<String>,
    last_progress: Instant,
    /// For a send: the channel sequence number of its last chunk, once published.
    last_seq: u64,
}

impl P2pOp {
    pub(super) fn new(
        send: bool,
        peer: usize,
        addr: usize,
        bytes: usize,
        done: Arc<Completion>,
    ) -> P2pOp {
        P2pOp {
            send,
            peer,
            addr,
            bytes,
            done,
            chunks: 0,
            total: send.then(|| chunks_of(bytes)),
            error: None,
            last_progress: Instant::now(),
            last_seq: 0,
        }
    }
}

fn chunks_of(bytes: usize) -> usize {
    bytes.div_ceil(PG_P2P_SLOT_BYTES).max(1)
}

struct Channels {
    /// Chunks this rank has published to each peer.
    sent: Vec<u64>,
    /// Chunks this rank has consumed from each peer.
    acked: Vec<u64>,
}

/// Moves as many chunks of `op` as the channel allows; true if any moved.
fn step(sh: &Shared, ch: &mut Channels, op: &mut P2pOp) -> bool {
    let (me, p) = (sh.rank, op.peer);
    let mut moved = false;
    while op.total.is_none_or(|t| op.chunks < t) {
        if op.send {
            let k = ch.sent[p] + 1;
            if k > load(sh.seg(p).acked(me)) + 2 {
                break;
            }
            let off = op.chunks * PG_P2P_SLOT_BYTES;
            let len = PG_P2P_SLOT_BYTES.min(op.bytes - off);
            let (hdr, data) = sh.own.channel_slot(p, (k & 1) as usize);
            // SAFETY: `addr` holds `bytes` bytes (caller's contract); the slot holds a chunk;
            // the receiver reads it only after the Release store below.
            unsafe {
                std::ptr::copy_nonoverlapping((op.addr as *const u8).add(off), data, len);
                hdr.write_volatile(op.bytes as u64);
                hdr.add(1).write_volatile(len as u64);
            }
            store(sh.own.sent(p), k);
            sh.publish();
            ch.sent[p] = k;
            op.last_seq = k;
        } else {
            let k = ch.acked[p] + 1;
            let seg = sh.seg(p);
            if load(seg.sent(me)) < k {
                break;
            }
            let (hdr, data) = seg.channel_slot(me, (k & 1) as usize);
            // SAFETY: the sender published chunk `k` (Acquire load above) and does not touch
            // this slot again before we ack it; `addr` holds `bytes` bytes and we copy only
            // inside it.
            unsafe {
                let msg = hdr.read_volatile() as usize;
                let len = (hdr.add(1).read_volatile() as usize).min(PG_P2P_SLOT_BYTES);
                if op.total.is_none() {
                    op.total = Some(chunks_of(msg));
                    if msg != op.bytes {
                        op.error = Some(format!(
                            "recv of {} bytes from rank {p} matched a send of {msg} bytes",
                            op.bytes
                        ));
                    }
                }
                let off = op.chunks * PG_P2P_SLOT_BYTES;
                let fit = len.min(op.bytes.saturating_sub(off));
                if fit > 0 {
                    std::ptr::copy_nonoverlapping(data, (op.addr as *mut u8).add(off), fit);
                }
            }
            store(sh.own.acked(p), k);
            sh.publish();
            ch.acked[p] = k;
        }
        op.chunks += 1;
        moved = true;
    }
    if moved {
        op.last_progress = Instant::now();
    }
    moved
}

/// Whether every chunk of `op` has moved (a send may still wait for its acknowledgement).
fn finished(op: &P2pOp) -> bool {
    op.total.is_some_and(|t| op.chunks >= t)
}

/// The ops of one communicator that have not ended yet.
struct Lanes {
    /// Queue 2p: sends to p whose chunks are not all published; 2p+1: receives from p. Only
    /// the head of a queue moves.
    queues: Vec<VecDeque<P2pOp>>,
    /// Per peer: sends whose chunks are all published, waiting for the receiver to
    /// acknowledge the last one (ascending `last_seq`).
    unacked: Vec<VecDeque<P2pOp>>,
    pending: usize,
}

impl Lanes {
    fn add(&mut self, op: P2pOp) {
        self.queues[2 * op.peer + usize::from(!op.send)].push_back(op);
        self.pending += 1;
    }

    /// Ends `op` with its own outcome: `failed` is 0 or its peer's bit, nothing else.
    fn end(&mut self, op: P2pOp, failed: u64) {
        self.pending -= 1;
        op.done.complete(Outcome {
            failed,
            error: if failed == 0 { op.error } else { None },
            ..Outcome::default()
        });
    }

    /// Moves the head ops of every queue as far as the channels allow: a receive that has
    /// its whole message ends, a send whose chunks are all out waits in `unacked`.
    fn step_queues(&mut self, sh: &Shared, ch: &mut Channels) -> bool {
        let mut progressed = false;
        for qi in 0..self.queues.len() {
            while let Some(op) = self.queues[qi].front_mut() {
                progressed |= step(sh, ch, op);
                if !finished(op) {
                    break;
                }
                let mut op = self.queues[qi].pop_front().expect("front exists");
                if let Some(next) = self.queues[qi].front_mut() {
                    // Its timeout runs from when it reaches the head of its queue.
                    next.last_progress = Instant::now();
                }
                if op.send {
                    op.last_progress = Instant::now();
                    self.unacked[op.peer].push_back(op);
                } else {
                    self.end(op, 0);
                }
            }
        }
        progressed
    }

    /// Ends the sends whose receiver has acknowledged their last chunk.
    fn take_acks(&mut self, sh: &Shared) -> bool {
        let mut progressed = false;
        for p in 0..self.unacked.len() {
            if self.unacked[p].is_empty() {
                continue;
            }
            let acked = load(sh.seg(p).acked(sh.rank));
            let mut any = false;
            while self.unacked[p]
                .front()
                .is_some_and(|op| op.last_seq <= acked)
            {
                let op = self.unacked[p].pop_front().expect("front exists");
                self.end(op, 0);
                any = true;
            }
            if any {
                progressed = true;
                if let Some(next) = self.unacked[p].front_mut() {
                    next.last_progress = Instant::now();
                }
            }
        }
        progressed
    }

    /// A new process holds slot `r`: sends still unacknowledged were for the old one, which
    /// never took them; they fail (the new process is not counted as failed).
    fn reset(&mut self, r: usize) {
        while let Some(op) = self.unacked[r].pop_front() {
            self.end(op, 1u64 << r);
        }
    }
}

/// The point-to-point thread: runs until the communicator is dropped and nothing is pending.
pub(super) fn run(sh: &Shared, rx: Receiver<P2pOp>) {
    let n = sh.ranks;
    let mut ch = Channels {
        sent: vec![0; n],
        acked: vec![0; n],
    };
    let mut lanes = Lanes {
        queues: (0..2 * n).map(|_| VecDeque::new()).collect(),
        unacked: (0..n).map(|_| VecDeque::new()).collect(),
        pending: 0,
    };
    let mut idle = 0u32;
    let mut last_check = Instant::now();
    let mut open = true;
    loop {
        if lanes.pending == 0 {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(op) => lanes.add(op),
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(op) => lanes.add(op),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let reset = sh.member.take_p2p_reset();
        for r in (0..n).filter(|&r| reset >> r & 1 == 1) {
            // A new process holds slot r: its channels start from zero.
            ch.sent[r] = 0;
            ch.acked[r] = 0;
            lanes.reset(r);
        }
        let moved = lanes.step_queues(sh, &mut ch);
        if lanes.take_acks(sh) || moved {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if idle < 200 {
            std::hint::spin_loop();
        } else if idle < 2000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
        let now = Instant::now();
        if now - last_check >= Duration::from_millis(1) {
            last_check = now;
            fail_stuck(sh, &mut ch, &mut lanes, now);
        }
    }
}

/// Records that `op`'s peer failed it: a dead peer is a failure of the group (dropped from
/// the active set with auto-deactivation); a timeout is only reported.
fn note(sh: &Shared, peer: usize, dead: bool) -> u64 {
    let failed = 1u64 << peer;
    if dead {
        sh.note_failures(failed);
    } else {
        sh.failures_seen.fetch_or(failed, Ordering::AcqRel);
    }
    failed
}

/// Fails the head op of every queue whose peer is dead or that has not moved for the
/// point-to-point timeout, and the unacknowledged sends to a dead peer (or the oldest one,
/// after the timeout).
///
/// Death is read before the channel's last state: a dead process moves nothing more, so
/// what it published (a receive's last chunks) or acknowledged (a send's) before dying
/// still counts, and only what it never will fails.
fn fail_stuck(sh: &Shared, ch: &mut Channels, lanes: &mut Lanes, now: Instant) {
    let timeout = Duration::from_micros(P2P_TIMEOUT_US.load(Ordering::Relaxed));
    for qi in 0..lanes.queues.len() {
        let Some(op) = lanes.queues[qi].front_mut() else {
            continue;
        };
        let dead = !sh.alive(op.peer);
        if !dead && now - op.last_progress < timeout {
            continue;
        }
        if dead && (step(sh, ch, op) || finished(op)) {
            continue; // moved on what the peer left behind; the main loop carries on
        }
        let op = lanes.queues[qi].pop_front().expect("front exists");
        if let Some(next) = lanes.queues[qi].front_mut() {
            next.last_progress = now;
        }
        let failed = note(sh, op.peer, dead);
        lanes.end(op, failed);
    }
    for p in 0..lanes.unacked.len() {
        let Some(head) = lanes.unacked[p].front() else {
            continue;
        };
        let dead = !sh.alive(p);
        if !dead && now - head.last_progress < timeout {
            continue;
        }
        let acked = load(sh.seg(p).acked(sh.rank));
        if head.last_seq <= acked {
            continue; // taken before the peer died: the main loop ends it as a success
        }
        let failed = note(sh, p, dead);
        // A dead peer acknowledges nothing more; after a timeout only the oldest send fails.
        let n = if dead { lanes.unacked[p].len() } else { 1 };
        for _ in 0..n {
            let op = lanes.unacked[p].pop_front().expect("counted");
            lanes.end(op, failed);
        }
        if let Some(next) = lanes.unacked[p].front_mut() {
            next.last_progress = now;
        }
    }
}
