//! Collectives and point-to-point messages among the ranks of a process group: the native
//! data path of `mooncake.pg` (shared memory on one host, TCP pushes between hosts).
//!
//! Every rank owns one shared segment ([`seg`]) that every other rank maps. A collective is a
//! fixed sequence of *phases*; in a phase each rank writes its part into its own collective
//! slot, publishes the phase number, waits for the peers' numbers and then reads (memcpy or
//! fold) straight out of their slots ([`coll`]). Point-to-point messages go through one
//! double-buffered channel per ordered pair of ranks ([`p2p`]). Reductions run in Rust
//! ([`reduce`]); Python hands over tensor addresses and never loops over elements.
//!
//! A rank on another host is a *replica* segment kept up to date by [`net`]: every rank
//! pushes its own segment's changes to its remote peers over TCP ([`Shared::publish`], called
//! after each counter store), so the algorithms above read remote and local peers alike.
//!
//! Invariants:
//! - the number of phases of an op depends only on its arguments and the group size, never on
//!   who is alive, so ranks stay in step after a failure; the first phase carries a
//!   descriptor of the call, and a rank that sees a peer's descriptor differ from its own fails
//!   the op (every rank sees every descriptor, so all fail it);
//! - a rank writes collective slot `s % 2` for phase `s` only after every live active peer has
//!   finished reading phase `s - 2`;
//! - a peer is *failed* for an op when its process is dead (its segment lock is gone, see
//!   [`seg`]) and it had not published the phase waited for; failed peers are excluded from
//!   the rest of the op, and (with auto-deactivation) from the active set afterwards;
//! - reductions fold contributors in ascending rank order, so every rank gets bit-identical
//!   floating-point results.
//!
//! The crate stands on `dataplane` for memory only (`mem::{Src, Dst}`, shared mappings and
//! the opening of a peer's file) and on `protocol` for the cluster-secret handshake of its
//! links; nothing in `dataplane` names it. Its bounds are in [`limits`]; [`ep`] is the
//! expert-parallel dispatch/combine engine that shares its links and liveness rules.

pub mod cma;
pub mod coll;
pub mod ep;
pub mod limits;
pub mod membership;
pub mod net;
pub mod p2p;
mod push;
mod redirect;
pub mod reduce;
pub mod seg;
mod send;
mod shmfile;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

pub use coll::CollOp;
pub use reduce::{DType, ReduceOp};
pub use seg::Segment;

/// Collective timeout (µs): a live peer that has been silent this long is reported in the log
/// (it is still waited for, as upstream does). Process-wide, read on every wait.
pub static COLLECTIVE_TIMEOUT_US: AtomicU64 = AtomicU64::new(10_000_000);
/// Point-to-point timeout (µs): a send or receive that makes no progress this long fails.
pub static P2P_TIMEOUT_US: AtomicU64 = AtomicU64::new(10_000_000);
/// Fault reconciliation window (µs). Death is observed directly here (the segment lock), so
/// no window is waited out; kept for the API and reported by `docs/pg.md`.
pub static RECONCILIATION_WINDOW_US: AtomicU64 = AtomicU64::new(30_000_000);

/// How an operation ended.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Ranks this rank saw fail during the op (bit `r` = rank `r`).
    pub failed: u64,
    /// Ranks that left the group gracefully before taking part (not failures).
    pub left: u64,
    /// Why the op failed as a whole (bad arguments, mismatched calls), if it did.
    pub error: Option<String>,
}

/// A one-shot completion an op's caller waits on.
#[derive(Default)]
pub struct Completion {
    state: Mutex<Option<Outcome>>,
    cv: Condvar,
}

impl Completion {
    fn complete(&self, o: Outcome) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *g = Some(o);
        self.cv.notify_all();
    }

    /// The outcome, if the op has ended.
    pub fn poll(&self) -> Option<Outcome> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits for the outcome (`None` waits forever); `None` if the time ran out.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Outcome> {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        while g.is_none() {
            match deadline {
                None => g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return None;
                    }
                    g = self
                        .cv
                        .wait_timeout(g, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        g.clone()
    }
}

/// State shared by a communicator's two worker threads and its owner.
pub struct Shared {
    /// This rank.
    pub rank: usize,
    /// Group size (slots; never changes).
    pub ranks: usize,
    own: Arc<Segment>,
    /// Every rank's segment (this rank's too); a slot is replaced when a new process takes
    /// the rank over ([`membership`]), only by the collective thread between ops.
    segs: Vec<RwLock<Arc<Segment>>>,
    active: AtomicU64,
    epoch: AtomicU64,
    failures_seen: AtomicU64,
    auto_deactivate: bool,
    /// Whether the group reads peers' tensors directly ([`cma`]); the same on every rank.
    cma: AtomicBool,
    /// `(address, elements)` of the caller's int32 `active_ranks` tensor, rewritten on every
    /// change of the active set.
    mirror: Mutex<Option<(usize, usize)>>,
    /// Links to the ranks on other hosts, if any.
    net: Option<net::Net>,
    /// Where a phase's pushes read from when not from the own slot ([`push`]).
    push_from: push::PushFrom,
    /// Views, proposals and joins ([`membership`]).
    pub member: membership::State,
}

impl Shared {
    fn seg(&self, r: usize) -> Arc<Segment> {
        self.segs[r]
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether rank `r`'s process is alive (always true for this rank).
    pub fn alive(&self, r: usize) -> bool {
        r == self.rank || self.seg(r).owner_alive()
    }

    /// Current active set (bit `r` = rank `r`).
    pub fn active(&self) -> u64 {
        self.active.load(Ordering::Acquire)
    }

    /// Epoch: +1 per change of the active set.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Records failures seen by an op and, with auto-deactivation, drops them from the set.
    fn note_failures(&self, failed: u64) {
        if failed == 0 {
            return;
        }
        self.failures_seen.fetch_or(failed, Ordering::AcqRel);
        if self.auto_deactivate {
            let now = self.active() & !failed;
            self.set_active(now);
        }
    }

    /// Replaces the active set, bumps the epoch if it changed and rewrites the mirror.
    pub fn set_active(&self, mask: u64) {
        let g = self.mirror.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.active.swap(mask, Ordering::AcqRel);
        if old != mask {
            self.epoch.fetch_add(1, Ordering::AcqRel);
        }
        if let Some((addr, len)) = *g {
            let p = addr as *mut i32;
            for i in 0..len {
                let v = i32::from(i < 64 && mask >> i & 1 == 1);
                // SAFETY: the owner registered `len` int32 elements at `addr` and keeps that
                // tensor alive while the communicator lives (`Comm::set_mirror`).
                unsafe { p.add(i).write_volatile(v) };
            }
        }
    }

    /// Whether this rank can read every peer's memory directly ([`cma::probe`]); never with
    /// a peer on another host.
    pub fn cma_probe(&self) -> bool {
        (0..self.ranks)
            .filter(|&r| r != self.rank && self.alive(r))
            .all(|r| {
                let seg = self.seg(r);
                !seg.is_remote()
                    && cma::probe(seg.owner_pid(), seg.owner_base() as usize, Segment::magic())
            })
    }

    /// Turns the direct-read path on or off; every rank must pass the same value before the
    /// first op (`mooncake.pg` agrees on it through the store). Stays off when a peer is on
    /// another host: those algorithms pull from every peer, and a remote one can only push.
    pub fn set_cma(&self, on: bool) {
        let linked = self.net.as_ref().is_some_and(|n| n.has_links());
        self.cma.store(on && !linked, Ordering::Release);
    }

    /// The replica of process `pid` on another host asking to take slot `r` over.
    pub(crate) fn remote_joiner(&self, r: usize, pid: u32) -> Option<Arc<Segment>> {
        self.net.as_ref()?.joiner(r, pid)
    }

    /// Pushes this rank's segment changes to its peers on other hosts (no-op without any).
    /// Called after every store of an own counter (`posted`, `done`, `left`, `sent`, `acked`).
    pub(crate) fn publish(&self) {
        if let Some(n) = &self.net {
            n.publish(&self.own, &self.push_from);
        }
    }

    /// [`Shared::publish`] after the store of `posted = s`: every live link pushes phase `s`
    /// in that call, so the phase's [`push`] sources are cleared after it (none outlives it).
    pub(crate) fn publish_phase(&self, s: u64) {
        self.publish();
        self.push_from.clear((s & 1) as usize);
    }

    /// Pushes this rank's changed membership words to its peers on other hosts (no-op
    /// without any). Called by the membership code after it stores them.
    pub(crate) fn publish_member(&self) {
        if let Some(n) = &self.net {
            n.publish_member(&self.own);
        }
    }

    fn cma(&self) -> bool {
        self.cma.load(Ordering::Acquire)
    }

    /// Leaves the group gracefully: this rank's collectives fail from now on ("not active")
    /// and peers exclude it from their next op without counting it as a failure.
    pub fn leave(&self) {
        self.own.set_left();
        self.publish();
        self.set_active(self.active() & !(1u64 << self.rank));
    }

    /// Descriptor number of this rank's segment file.
    pub fn own_fd(&self) -> i32 {
        self.own.raw_fd()
    }

    /// Failures seen since the last call, cleared.
    pub fn take_failures(&self) -> u64 {
        self.failures_seen.swap(0, Ordering::AcqRel)
    }
}

enum Job {
    Coll(CollOp, Arc<Completion>),
}

/// A communicator: this rank's view of one process group, with a collective worker thread
/// (ops run one after another, in issue order) and a point-to-point thread (all pending sends
/// and receives progress together, FIFO per peer and direction).
pub struct Comm {
    shared: Arc<Shared>,
    coll_tx: mpsc::Sender<Job>,
    p2p_tx: mpsc::Sender<p2p::P2pOp>,
}

impl Comm {
    /// Starts a communicator over this rank's segment `own` and the peers' segments
    /// (`peers[rank]` is `None`). All ranks start active.
    pub fn start(
        own: Segment,
        rank: usize,
        peers: Vec<Option<Segment>>,
        auto_deactivate: bool,
    ) -> std::io::Result<Comm> {
        Self::start_with_net(own, rank, peers, None, auto_deactivate)
    }

    /// As [`Comm::start`], with `net` linking this rank to the peers whose `peers` entries
    /// are replicas ([`Segment::replica`]).
    pub fn start_with_net(
        own: Segment,
        rank: usize,
        peers: Vec<Option<Segment>>,
        net: Option<net::Net>,
        auto_deactivate: bool,
    ) -> std::io::Result<Comm> {
        let ranks = peers.len();
        let all = if ranks == 64 {
            u64::MAX
        } else {
            (1u64 << ranks) - 1
        };
        Self::start_with(own, rank, peers, net, auto_deactivate, all, None)
    }

    /// As [`Comm::start_with_net`], with the initial active set `active` and, for a process
    /// joining an existing group, the group's latest view ([`membership::View`]); a joining
    /// process reaches the members on other hosts through a `net` made by [`net::Net::join`].
    pub fn start_with(
        own: Segment,
        rank: usize,
        peers: Vec<Option<Segment>>,
        net: Option<net::Net>,
        auto_deactivate: bool,
        active: u64,
        joining: Option<membership::View>,
    ) -> std::io::Result<Comm> {
        let ranks = peers.len();
        let own = Arc::new(own);
        let segs = peers
            .into_iter()
            .map(|p| RwLock::new(p.map_or_else(|| own.clone(), Arc::new)))
            .collect();
        let shared = Arc::new(Shared {
            rank,
            ranks,
            own,
            segs,
            active: AtomicU64::new(active),
            epoch: AtomicU64::new(0),
            failures_seen: AtomicU64::new(0),
            auto_deactivate,
            cma: AtomicBool::new(false),
            mirror: Mutex::new(None),
            net,
            push_from: push::PushFrom::new(ranks),
            member: membership::State::new(
                joining.unwrap_or(membership::View::initial(active)),
                joining.is_some(),
            ),
        });
        if let Some(n) = &shared.net {
            n.attach(Arc::downgrade(&shared));
        }
        let (coll_tx, coll_rx) = mpsc::channel::<Job>();
        let sh = shared.clone();
        std::thread::Builder::new()
            .name(format!("mc-pg-coll-{rank}"))
            .spawn(move || {
                let mut run = coll::Runner::new(&sh);
                while let Ok(Job::Coll(op, done)) = coll_rx.recv() {
                    membership::begin_op(&sh);
                    let o = run.execute(op);
                    membership::end_op(&sh);
                    sh.note_failures(o.failed);
                    if o.left != 0 {
                        sh.set_active(sh.active() & !o.left);
                    }
                    done.complete(o);
                }
            })?;
        let (p2p_tx, p2p_rx) = mpsc::channel();
        let sh = shared.clone();
        std::thread::Builder::new()
            .name(format!("mc-pg-p2p-{rank}"))
            .spawn(move || p2p::run(&sh, p2p_rx))?;
        membership::spawn(&shared)?;
        Ok(Comm {
            shared,
            coll_tx,
            p2p_tx,
        })
    }

    /// The state shared with the workers.
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Registers the caller's `active_ranks` mirror (int32, `len` elements) and writes the
    /// current set into it.
    ///
    /// # Safety
    /// `addr` must stay valid for `len` int32 writes until the communicator is dropped or the
    /// mirror replaced.
    pub unsafe fn set_mirror(&self, addr: usize, len: usize) {
        *self.shared.mirror.lock().unwrap_or_else(|e| e.into_inner()) = Some((addr, len));
        self.shared.set_active(self.shared.active());
    }

    /// Queues a collective.
    ///
    /// # Safety
    /// Every address in `op` must stay valid (and not be touched by the caller) for the
    /// bytes the op moves until the returned completion has an outcome.
    pub unsafe fn submit(&self, op: CollOp) -> Arc<Completion> {
        let done = Arc::new(Completion::default());
        if self.coll_tx.send(Job::Coll(op, done.clone())).is_err() {
            done.complete(Outcome {
                error: Some("the collective worker has stopped".into()),
                ..Outcome::default()
            });
        }
        done
    }

    /// Queues a send (`send = true`) or receive of `bytes` bytes at `addr` to/from `peer`.
    ///
    /// # Safety
    /// As [`Comm::submit`].
    pub unsafe fn p2p(
        &self,
        send: bool,
        peer: usize,
        addr: usize,
        bytes: usize,
    ) -> Arc<Completion> {
        let done = Arc::new(Completion::default());
        if peer >= self.shared.ranks || peer == self.shared.rank {
            done.complete(Outcome {
                left: 0,
                failed: 0,
                error: Some(format!(
                    "peer rank {peer} is not another rank of this group of {}",
                    self.shared.ranks
                )),
            });
            return done;
        }
        let op = p2p::P2pOp::new(send, peer, addr, bytes, done.clone());
        if self.p2p_tx.send(op).is_err() {
            done.complete(Outcome {
                error: Some("the point-to-point worker has stopped".into()),
                ..Outcome::default()
            });
        }
        done
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        membership::close(&self.shared);
    }
}

/// How long a waiter spins and yields before it parks on a local peer's counter.
const YIELD_FOR: Duration = Duration::from_micros(200);

/// Waits until peer `seg`'s `counter` (its `posted` or `done`) reaches `want`: spinning
/// briefly, then yielding, then blocking. Every millisecond of waiting it asks `alive` and
/// gives up (returning the condition one last time) when that says no. `who` names the peer
/// for the log.
///
/// Past the first [`YIELD_FOR`] the waiter parks on the counter ([`Segment::park`], woken by
/// [`Segment::store_counter`]): with more ranks than cores, a waiter that wakes up every few
/// microseconds to look takes the core from the rank it waits for, and a sleep step adds its
/// length to every wait. A mapped peer's counter is stored by its owner; a replica's (a peer
/// on another host) by the receive thread of [`super::net`], which wakes the same way. (Replicas
/// were waited for with sleeps of 20-200 µs before: up to 200 µs lost per phase.)
pub(crate) fn wait_counter(
    seg: &Segment,
    counter: &AtomicU64,
    want: u64,
    alive: impl Fn() -> bool,
    who: usize,
) -> bool {
    let cond = || seg::load(counter) >= want;
    let start = std::time::Instant::now();
    let mut next_probe = start + Duration::from_millis(1);
    let mut warned = false;
    let mut i = 0u32;
    let mut parking = false;
    loop {
        if cond() {
            return true;
        }
        i = i.saturating_add(1);
        if i < 200 {
            std::hint::spin_loop();
            continue;
        }
        if !parking && i < 2000 && start.elapsed() < YIELD_FOR {
            std::thread::yield_now();
        } else {
            parking = true;
            // Parked until the next liveness probe at most, so a death is noticed as fast.
            let left = next_probe.saturating_duration_since(std::time::Instant::now());
            let seen = seg::load(counter);
            if seen < want {
                seg.park(counter, seen, left.max(Duration::from_micros(50)));
            }
        }
        if i.is_multiple_of(16) || i >= 2000 || parking {
            let now = std::time::Instant::now();
            if now >= next_probe {
                next_probe = now + Duration::from_millis(1);
                if !alive() {
                    return cond();
                }
                let waited_us = (now - start).as_micros() as u64;
                if !warned && waited_us > COLLECTIVE_TIMEOUT_US.load(Ordering::Relaxed) {
                    warned = true;
                    tracing::warn!(
                        "mooncake.pg: rank {who} is alive but has not answered for {} ms",
                        waited_us / 1000
                    );
                }
            }
        }
    }
}
