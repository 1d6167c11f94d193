//! loom model of `MasterClient`'s leader/follower hand-over (`src/master.rs`): callers share
//! one connection; the caller that wins the read side (`Conn::reader.try_lock`) leads, reads
//! answers and delivers each to the caller waiting for its id; when its own answers are in,
//! it releases the read side and wakes one other pending caller (`Conn::hand_over`) to lead.
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p mooncake-client --release --test
//! loom_master_handover` (docs/HACKING.md).
//!
//! A model of the protocol, not the real types: the real code reads a `TcpStream` with a read
//! timeout and uses `parking_lot`, which loom cannot drive. Here the socket is a queue that the
//! master fills at once on every write (a leader therefore never waits for bytes that are not
//! coming), and a read returns one frame. The locks, the `lead` flag and the order of the steps
//! are `call_many_on`, `lead`, `deliver` and `hand_over`, minus deadlines and connection
//! failures. One difference is deliberate: a follower waits on its condvar without
//! `FOLLOWER_RECHECK`'s timeout. That timeout bounds the cost of a lost hand-over; without it a
//! lost hand-over leaves every caller asleep, which loom reports as a deadlock. So the model
//! checks that, when no call times out, the hand-over alone never strands a caller, and that
//! every answer reaches the caller that sent its request.
#![cfg(loom)]

use std::collections::{BTreeMap, VecDeque};

use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

struct Waiter {
    slots: Mutex<Slots>,
    ready: Condvar,
}

struct Slots {
    answers: Vec<Option<u64>>,
    missing: usize,
    /// Set by a leader stepping down: the read side is free, try to lead.
    lead: bool,
}

struct Conn {
    /// Answers the master sent and nobody read yet (ids; the answer to `id` is `answer(id)`).
    socket: Mutex<VecDeque<u64>>,
    /// The read side; holding it is leading.
    reader: Mutex<()>,
    /// A `BTreeMap`, not the real code's `HashMap`: loom replays recorded schedules, so the
    /// model must be deterministic, and a `HashMap`'s iteration order changes per instance.
    pending: Mutex<BTreeMap<u64, (Arc<Waiter>, usize)>>,
    /// false: a leader steps down without waking anyone (the bug the model must catch).
    hands_over: bool,
    /// Which other pending caller a leader wakes: the real code takes the first in its
    /// `HashMap`'s order, any of them. The models run once waking the lowest request id and
    /// once the highest, which with three callers covers every choice.
    wake_last: bool,
}

fn answer(id: u64) -> u64 {
    id * 1000 + 7
}

impl Conn {
    /// `Conn::hand_over`.
    fn hand_over(&self, me: &Arc<Waiter>) {
        if !self.hands_over {
            return;
        }
        let pending = self.pending.lock().unwrap();
        let mut others = pending.values().filter(|(w, _)| !Arc::ptr_eq(w, me));
        let next = if self.wake_last {
            others.next_back()
        } else {
            others.next()
        }
        .map(|(w, _)| w.clone());
        drop(pending);
        if let Some(w) = next {
            w.slots.lock().unwrap().lead = true;
            w.ready.notify_all();
        }
    }

    /// `deliver`.
    fn deliver(&self, id: u64) {
        let Some((w, i)) = self.pending.lock().unwrap().remove(&id) else {
            return;
        };
        let mut s = w.slots.lock().unwrap();
        if s.answers[i].is_none() {
            s.answers[i] = Some(answer(id));
            s.missing -= 1;
            if s.missing == 0 {
                w.ready.notify_all();
            }
        }
    }

    /// `lead`: read and deliver until `me` has all of its answers.
    fn lead(&self, me: &Waiter) {
        loop {
            if me.slots.lock().unwrap().missing == 0 {
                return;
            }
            let frame = self.socket.lock().unwrap().pop_front();
            match frame {
                Some(id) => self.deliver(id),
                None => thread::yield_now(), // the real read blocks for LEAD_READ_SLICE
            }
        }
    }

    /// `call_many_on` for the requests `ids`.
    fn call(&self, ids: &[u64]) -> Vec<u64> {
        let waiter = Arc::new(Waiter {
            slots: Mutex::new(Slots {
                answers: vec![None; ids.len()],
                missing: ids.len(),
                lead: false,
            }),
            ready: Condvar::new(),
        });
        {
            let mut p = self.pending.lock().unwrap();
            for (i, &id) in ids.iter().enumerate() {
                p.insert(id, (waiter.clone(), i));
            }
        }
        // The write; the master answers at once.
        self.socket.lock().unwrap().extend(ids.iter().copied());
        let mut slots = waiter.slots.lock().unwrap();
        while slots.missing > 0 {
            slots.lead = false;
            drop(slots);
            if let Ok(side) = self.reader.try_lock() {
                self.lead(&waiter);
                drop(side);
                self.hand_over(&waiter);
                slots = waiter.slots.lock().unwrap();
                continue;
            }
            slots = waiter.slots.lock().unwrap();
            if slots.missing == 0 || slots.lead {
                continue;
            }
            slots = waiter.ready.wait(slots).unwrap();
        }
        let answers = std::mem::take(&mut slots.answers);
        answers.into_iter().map(|a| a.unwrap()).collect()
    }
}

/// Callers `calls[k]` run on their own threads (the first on the model's main thread).
/// `preemptions`: loom's bound on preemptions per execution; `None` explores every interleaving.
fn model(calls: &'static [&'static [u64]], preemptions: Option<usize>, hands_over: bool) {
    for wake_last in [false, true] {
        model_waking(calls, preemptions, hands_over, wake_last);
    }
}

fn model_waking(
    calls: &'static [&'static [u64]],
    preemptions: Option<usize>,
    hands_over: bool,
    wake_last: bool,
) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = preemptions;
    builder.check(move || {
        let conn = Arc::new(Conn {
            socket: Mutex::new(VecDeque::new()),
            reader: Mutex::new(()),
            pending: Mutex::new(BTreeMap::new()),
            hands_over,
            wake_last,
        });
        let others: Vec<_> = calls[1..]
            .iter()
            .map(|&ids| {
                let conn = conn.clone();
                thread::spawn(move || (ids, conn.call(ids)))
            })
            .collect();
        let mine = conn.call(calls[0]);
        assert_eq!(
            mine,
            calls[0].iter().map(|&id| answer(id)).collect::<Vec<_>>()
        );
        for t in others {
            let (ids, got) = t.join().unwrap();
            assert_eq!(got, ids.iter().map(|&id| answer(id)).collect::<Vec<_>>());
        }
        assert!(conn.pending.lock().unwrap().is_empty());
    });
}

#[test]
fn loom_master_handover_two_callers() {
    model(&[&[1], &[2]], None, true);
}

#[test]
fn loom_master_handover_a_batch_and_one_caller() {
    model(&[&[1, 2], &[3]], None, true);
}

/// A leader that steps down without waking a follower strands it, and loom finds that:
/// `hands_over: false` here reports a deadlock. Not a `should_panic` test: loom cannot unwind
/// out of a deadlock while model threads are alive, so the test binary aborts.
#[test]
#[ignore = "aborts the test binary by design; run alone to see loom report the deadlock"]
fn loom_master_handover_without_the_wake_up_is_caught() {
    model(&[&[1], &[2]], None, false);
}

/// Three callers: every choice of whom a leader wakes (see `Conn::wake_last`), up to three
/// preemptions per execution (0.5-0.8 s each; unbounded, `None`, did not finish in 15 minutes
/// on two cores). These were `#[ignore]`d for a deadlock report that was the
/// model's fault: `pending` was a `HashMap`, whose iteration order differs from one execution
/// to the next, so when loom replayed a recorded schedule the leader woke a different caller
/// than in the recorded run, and loom resumed a thread that was in fact parked (a wake-up with
/// no notify) and later found the threads stuck. With a `BTreeMap` the model is deterministic
/// and no interleaving strands a caller. These models can fail: swapping `drop(side)` and
/// `hand_over` in `call` (waking a follower before the read side is free, so its `try_lock`
/// fails and it parks again) makes loom report the stranded caller within a second.
#[test]
fn loom_master_handover_three_callers() {
    model(&[&[1], &[2], &[3]], Some(3), true);
}

#[test]
fn loom_master_handover_a_batch_and_two_callers() {
    model(&[&[1, 2], &[3], &[4]], Some(3), true);
}
