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
//! An op fails (its peer marked in the outcome) when the peer's process is dead or the op
//! has made no progress for `P2P_TIMEOUT_US`.

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

fn finished(op: &P2pOp) -> bool {
    op.total.is_some_and(|t| op.chunks >= t)
}

/// The point-to-point thread: runs until the communicator is dropped and nothing is pending.
pub(super) fn run(sh: &Shared, rx: Receiver<P2pOp>) {
    let n = sh.ranks;
    let mut ch = Channels {
        sent: vec![0; n],
        acked: vec![0; n],
    };
    // Queue 2p: sends to p; 2p+1: receives from p.
    let mut queues: Vec<VecDeque<P2pOp>> = (0..2 * n).map(|_| VecDeque::new()).collect();
    let mut pending = 0usize;
    let mut idle = 0u32;
    let mut last_check = Instant::now();
    let mut open = true;
    loop {
        if pending == 0 {
            if !open {
                return;
            }
            match rx.recv() {
                Ok(op) => {
                    queues[2 * op.peer + usize::from(!op.send)].push_back(op);
                    pending += 1;
                }
                Err(_) => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(op) => {
                    queues[2 * op.peer + usize::from(!op.send)].push_back(op);
                    pending += 1;
                }
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
        }
        let mut progressed = false;
        for q in queues.iter_mut() {
            while let Some(op) = q.front_mut() {
                if step(sh, &mut ch, op) {
                    progressed = true;
                }
                if !finished(op) {
                    break;
                }
                let op = q.pop_front().expect("front exists");
                pending -= 1;
                op.done.complete(Outcome {
                    error: op.error,
                    ..Outcome::default()
                });
                if let Some(next) = q.front_mut() {
                    // Its timeout runs from when it reaches the head of its queue.
                    next.last_progress = Instant::now();
                }
            }
        }
        if progressed {
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
            pending -= fail_stuck(sh, &mut queues, now);
        }
    }
}

/// Fails the head op of every queue whose peer is dead or that has not moved for the
/// point-to-point timeout. Returns how many ops it ended.
fn fail_stuck(sh: &Shared, queues: &mut [VecDeque<P2pOp>], now: Instant) -> usize {
    let timeout = Duration::from_micros(P2P_TIMEOUT_US.load(Ordering::Relaxed));
    let mut ended = 0;
    for q in queues.iter_mut() {
        let Some(op) = q.front() else { continue };
        let dead = !sh.alive(op.peer);
        if !dead && now - op.last_progress < timeout {
            continue;
        }
        let op = q.pop_front().expect("front exists");
        if let Some(next) = q.front_mut() {
            next.last_progress = now;
        }
        ended += 1;
        let failed = 1u64 << op.peer;
        if dead {
            sh.note_failures(failed);
        } else {
            sh.failures_seen.fetch_or(failed, Ordering::AcqRel);
        }
        op.done.complete(Outcome {
            failed,
            ..Outcome::default()
        });
    }
    ended
}
