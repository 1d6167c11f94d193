//! A seeded model of the phase/slot protocol of `collective::coll` (`Runner::phase`,
//! `chunked`, `finish`), run under reordering and with a rank dying at every step.
//!
//! What it models, as the code does it for a small `all_reduce` (one phase per op):
//! 1. wait until every live peer's `done` reaches `s - 2` (the slot `s % 2` is free again;
//!    a dead peer is skipped);
//! 2. write the own contribution into collective slot `s % 2`;
//! 3. store `posted = s` ([`PUBLISH`]);
//! 4. wait until every live peer's `posted` reaches `s` ([`OBSERVE`]); a peer that is dead
//!    and has not published `s` is failed for the op, and left out of the ops after it
//!    (auto-deactivation);
//! 5. fold the live peers' slots `s % 2` into the result (ascending rank order);
//! 6. store `done = s` ([`PUBLISH`]).
//!
//! The memory is a store buffer per rank over the visible segments: a rank's plain writes
//! become visible to the others in any order; a store with release semantics only after
//! every write before it (two writes to one place never swap). A load without acquire
//! semantics lets the reads after it be served early: the slot values a rank folds are
//! then those of the op's start. A store without release semantics lets the reads before it
//! be performed late: the fold may read a slot after the `done` store became visible (after
//! its writer reused the slot). A rank dies between two of its steps; what it wrote is
//! visible before its lock goes (a process's stores drain before the kernel closes its
//! files), and the survivors see it dead from then on.
//!
//! What it checks, for every seed, every victim rank and every step it can die at (and no
//! death): the run ends (no survivor waits forever); every survivor's result of every op is
//! the sum of the contributions of exactly the ranks that published that op's phase, so the
//! survivors agree bit for bit and no slot was read before it was written or after it was
//! reused. The membership of each op (who failed) is agreed as a consequence; view changes
//! of `collective::membership` (joins, activation) are not modelled.
//!
//! The orderings are the production ones, [`PUBLISH`] and [`OBSERVE`] of `collective::seg`:
//! weakening either to `Relaxed` there makes this test fail. It is a model of the steps, not
//! the production types (as the loom models of `dataplane/tests/` are): a change to the
//! phase protocol changes this model in the same commit.

use std::sync::atomic::Ordering;

use collective::seg::{OBSERVE, PUBLISH};

const RANKS: usize = 3;
const OPS: usize = 4;
const SEEDS: u64 = 150;
/// Program steps of one rank for one op (the six above).
const STEPS_PER_OP: usize = 6;

fn releases(o: Ordering) -> bool {
    matches!(o, Ordering::Release | Ordering::AcqRel | Ordering::SeqCst)
}

fn acquires(o: Ordering) -> bool {
    matches!(o, Ordering::Acquire | Ordering::AcqRel | Ordering::SeqCst)
}

/// xorshift64*: deterministic, so a failing seed replays.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }
}

/// A rank's contribution to op `k`: distinct per (rank, op), so a stale or foreign slot value
/// changes the sum.
fn contribution(rank: usize, k: usize) -> u64 {
    let x = ((rank as u64) << 32 | k as u64).wrapping_add(0x51_7CC1_B727_220A);
    x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) | 1
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Loc {
    Slot(usize),
    Posted,
    Done,
}

#[derive(Clone, Copy, Debug)]
struct Write {
    loc: Loc,
    val: u64,
    /// A counter store ([`PUBLISH`]); a slot write is plain.
    publish: bool,
}

#[derive(Clone, Copy, Default)]
struct Mem {
    slots: [u64; 2],
    posted: u64,
    done: u64,
}

impl Mem {
    fn apply(&mut self, w: Write) {
        match w.loc {
            Loc::Slot(i) => self.slots[i] = w.val,
            Loc::Posted => self.posted = w.val,
            Loc::Done => self.done = w.val,
        }
    }
}

struct Rank {
    /// What the others see of this rank's segment.
    vis: Mem,
    /// Writes not yet visible, in program order.
    pending: Vec<Write>,
    dead: bool,
    /// Program counter: op `pc / STEPS_PER_OP`, step `pc % STEPS_PER_OP`.
    pc: usize,
    /// Peers left out: failed in an earlier op (auto-deactivation) or in this one.
    out: u64,
    /// The peers' slots as they were at this op's start (what an early read returns).
    early: [[u64; 2]; RANKS],
    /// Reads of a finished op not yet performed: (op, slot, peers), resolved later.
    late: Option<(usize, usize, Vec<usize>)>,
    results: Vec<Option<u64>>,
    /// Ops whose phase this rank published (step 3 ran).
    published: Vec<bool>,
}

struct World {
    ranks: Vec<Rank>,
    rng: Rng,
    /// The orderings of the counter stores and loads (production: [`PUBLISH`], [`OBSERVE`]).
    publish: Ordering,
    observe: Ordering,
}

impl World {
    fn new(seed: u64, publish: Ordering, observe: Ordering) -> World {
        let ranks = (0..RANKS)
            .map(|_| Rank {
                vis: Mem::default(),
                pending: Vec::new(),
                dead: false,
                pc: 0,
                out: 0,
                early: [[0; 2]; RANKS],
                late: None,
                results: vec![None; OPS],
                published: vec![false; OPS],
            })
            .collect();
        World {
            ranks,
            rng: Rng::new(seed),
            publish,
            observe,
        }
    }

    fn finished(&self, r: usize) -> bool {
        self.ranks[r].dead || self.ranks[r].pc >= OPS * STEPS_PER_OP
    }

    fn peers(&self, r: usize) -> Vec<usize> {
        (0..RANKS)
            .filter(|&p| p != r && self.ranks[r].out & (1 << p) == 0)
            .collect()
    }

    /// Whether rank `r`'s next step can run now (its wait, if any, is over).
    fn ready(&self, r: usize) -> bool {
        if self.finished(r) {
            return false;
        }
        let s = (self.ranks[r].pc / STEPS_PER_OP + 1) as u64;
        let peers = self.peers(r);
        match self.ranks[r].pc % STEPS_PER_OP {
            0 => peers
                .iter()
                .all(|&p| self.ranks[p].dead || self.ranks[p].vis.done >= s.saturating_sub(2)),
            3 => peers
                .iter()
                .all(|&p| self.ranks[p].dead || self.ranks[p].vis.posted >= s),
            _ => true,
        }
    }

    /// The value rank `r` reads from peer `p`'s slot now, for an op whose reads may have
    /// been served at its start.
    fn read(&self, r: usize, p: usize, slot: usize, early: bool) -> u64 {
        if early {
            self.ranks[r].early[p][slot]
        } else {
            self.ranks[p].vis.slots[slot]
        }
    }

    fn perform_late(&mut self, r: usize) {
        if let Some((k, slot, peers)) = self.ranks[r].late.take() {
            let mut sum = contribution(r, k);
            for p in peers {
                sum = sum.wrapping_add(self.ranks[p].vis.slots[slot]);
            }
            self.ranks[r].results[k] = Some(sum);
        }
    }

    fn step(&mut self, r: usize) {
        let k = self.ranks[r].pc / STEPS_PER_OP;
        let s = (k + 1) as u64;
        let slot = (s % 2) as usize;
        match self.ranks[r].pc % STEPS_PER_OP {
            0 => {
                // The op starts: what an early read would return is fixed here.
                for p in 0..RANKS {
                    self.ranks[r].early[p] = self.ranks[p].vis.slots;
                }
            }
            1 => self.ranks[r].pending.push(Write {
                loc: Loc::Slot(slot),
                val: contribution(r, k),
                publish: false,
            }),
            2 => {
                self.ranks[r].pending.push(Write {
                    loc: Loc::Posted,
                    val: s,
                    publish: true,
                });
                self.ranks[r].published[k] = true;
            }
            3 => {
                // Reads of the previous op left late are done by now at the latest.
                self.perform_late(r);
                for p in self.peers(r) {
                    if self.ranks[p].dead && self.ranks[p].vis.posted < s {
                        self.ranks[r].out |= 1 << p;
                    }
                }
            }
            4 => {
                let peers = self.peers(r);
                if releases(self.publish) || self.rng.below(2) == 0 {
                    let early = !acquires(self.observe) && self.rng.below(2) == 0;
                    let mut sum = contribution(r, k);
                    for &p in &peers {
                        sum = sum.wrapping_add(self.read(r, p, slot, early));
                    }
                    self.ranks[r].results[k] = Some(sum);
                } else {
                    self.ranks[r].late = Some((k, slot, peers));
                }
            }
            _ => self.ranks[r].pending.push(Write {
                loc: Loc::Done,
                val: s,
                publish: true,
            }),
        }
        self.ranks[r].pc += 1;
    }

    /// Indices of rank `r`'s pending writes that may become visible next.
    fn flushable(&self, r: usize) -> Vec<usize> {
        let pend = &self.ranks[r].pending;
        (0..pend.len())
            .filter(|&i| {
                let w = pend[i];
                // A release store waits for every write before it; any write waits for
                // the earlier ones to its own place.
                let waits_for_all = w.publish && releases(self.publish);
                let blocked = if waits_for_all {
                    i > 0
                } else {
                    pend[..i].iter().any(|e| e.loc == w.loc)
                };
                !blocked
            })
            .collect()
    }

    fn flush(&mut self, r: usize, i: usize) {
        let w = self.ranks[r].pending.remove(i);
        self.ranks[r].vis.apply(w);
    }

    /// The victim dies: its writes drain, then the others see it dead.
    fn kill(&mut self, r: usize) {
        while !self.ranks[r].pending.is_empty() {
            self.flush(r, 0);
        }
        self.perform_late(r);
        self.ranks[r].dead = true;
    }

    /// Runs to the end; `death` = (victim, the step count at which it dies).
    fn run(&mut self, death: Option<(usize, usize)>) -> Result<(), String> {
        for _ in 0..100_000 {
            if let Some((v, at)) = death {
                if !self.ranks[v].dead && self.ranks[v].pc == at {
                    self.kill(v);
                }
            }
            // Every choice the world has: a ready rank steps, a write becomes visible, late
            // reads are performed.
            let mut choices = Vec::new();
            for r in 0..RANKS {
                if self.ready(r) {
                    choices.push((0, r, 0));
                }
                for i in self.flushable(r) {
                    choices.push((1, r, i));
                }
                if self.ranks[r].late.is_some() {
                    choices.push((2, r, 0));
                }
            }
            if choices.is_empty() {
                if (0..RANKS).all(|r| self.finished(r)) {
                    return Ok(());
                }
                let stuck: Vec<usize> = (0..RANKS).filter(|&r| !self.finished(r)).collect();
                return Err(format!("no step possible, ranks {stuck:?} wait forever"));
            }
            match choices[self.rng.below(choices.len())] {
                (0, r, _) => self.step(r),
                (1, r, i) => self.flush(r, i),
                (_, r, _) => self.perform_late(r),
            }
        }
        Err("no end after 100000 steps".into())
    }

    /// Every survivor's result of op `k` is the sum over the ranks that published op `k`.
    fn check(&self) -> Result<(), String> {
        for k in 0..OPS {
            let want = (0..RANKS)
                .filter(|&r| self.ranks[r].published[k])
                .fold(0u64, |a, r| a.wrapping_add(contribution(r, k)));
            for (r, rank) in self.ranks.iter().enumerate() {
                if rank.dead {
                    continue;
                }
                if rank.results[k] != Some(want) {
                    let who: Vec<usize> =
                        (0..RANKS).filter(|&x| self.ranks[x].published[k]).collect();
                    return Err(format!(
                        "op {k}: rank {r} got {:?}, the sum over the publishers {who:?} is {want}",
                        rank.results[k]
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Runs every seed, victim and death step with the given orderings; the first failure.
fn explore(publish: Ordering, observe: Ordering) -> Result<usize, String> {
    let mut runs = 0;
    for seed in 0..SEEDS {
        let mut deaths = vec![None];
        for victim in 0..RANKS {
            for at in 0..=OPS * STEPS_PER_OP {
                deaths.push(Some((victim, at)));
            }
        }
        for death in deaths {
            let mut w = World::new(seed.wrapping_mul(1000).wrapping_add(runs), publish, observe);
            w.run(death)
                .and_then(|()| w.check())
                .map_err(|e| format!("seed {seed}, death {death:?}: {e}"))?;
            runs += 1;
        }
    }
    Ok(runs as usize)
}

#[test]
fn every_survivor_folds_exactly_the_published_slots_whoever_dies_whenever() {
    match explore(PUBLISH, OBSERVE) {
        Ok(runs) => eprintln!("phase model: {runs} runs of {RANKS} ranks x {OPS} ops, consistent"),
        Err(e) => panic!("orderings publish {PUBLISH:?}, observe {OBSERVE:?}: {e}"),
    }
}

/// The model has the power to fail: with either ordering weakened to `Relaxed` it finds a
/// survivor that folded a slot not yet written or already reused.
#[test]
fn the_model_fails_when_an_ordering_is_weakened() {
    for (publish, observe) in [
        (Ordering::Relaxed, Ordering::Acquire),
        (Ordering::Release, Ordering::Relaxed),
    ] {
        let found = explore(publish, observe).expect_err("a weakened ordering went unnoticed");
        eprintln!("publish {publish:?}, observe {observe:?}: {found}");
    }
}
