//! loom model of the `MemoryGate` handshake between `ServedMemory::unregister`
//! (`src/mem/served.rs`) and an io_uring shard's `MemoryView::check`/`release`
//! (`src/shard/view.rs`). Run: `RUSTFLAGS="--cfg loom" cargo test -p mooncake-dataplane
//! --release --test loom_memory_gate` (docs/HACKING.md).
//!
//! A model of the protocol, not the real types, for two reasons:
//! - `ServedMemory` keeps its gates as `Weak`s (loom's `Arc` has none) and polls them with
//!   `thread::sleep`; making that loom-buildable would reshape production code for a test.
//! - loom treats `SeqCst` loads and stores as `AcqRel` (tokio-rs/loom#180), and a Dekker
//!   handshake needs exactly what `SeqCst` adds: the store-then-load on each side must not
//!   both read stale values. loom does model `fence(SeqCst)`, so each side's store-then-load
//!   below has one between them. With `SeqCst` accesses, as the real code has, C++20/Rust
//!   give the same guarantee for this pattern; the fences only tell loom so.
//!
//! Otherwise the steps, atomics and orderings are the real ones, in the real order: the table's
//! generation (bumped under the write lock), the gate's "oldest generation in use" (`u64::MAX`:
//! none), the view's copy refreshed under the read lock. The registered buffer is a
//! `loom::cell::UnsafeCell`: the shard reads it while its lease is held, unregister writes it
//! once it returns (the memory is unmapped or reused). loom fails the test if the two are not
//! ordered by happens-before in some interleaving, i.e. if unregister could return while an
//! operation checked against the old table still touches the buffer.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU64, Ordering::SeqCst};
use loom::sync::{Arc, RwLock};
use loom::thread;

const NONE_IN_USE: u64 = u64::MAX;

/// `ServedMemory` with one buffer and one shard's gate.
struct Served {
    /// Whether the buffer is in the registry (`Served::registry`).
    registered: RwLock<bool>,
    generation: AtomicU64,
    /// The shard's `MemoryGate::oldest_in_use`.
    gate: AtomicU64,
    /// The buffer's bytes.
    buffer: UnsafeCell<u64>,
}

/// `MemoryView`: the shard's copy of the table.
struct View {
    generation: u64,
    registered: bool,
}

impl Served {
    /// `ServedMemory::snapshot_with_generation`.
    fn snapshot(&self) -> View {
        let registered = self.registered.read().unwrap();
        View {
            generation: self.generation.load(SeqCst),
            registered: *registered,
        }
    }

    /// `ServedMemory::unregister` then `wait_for_gates`, then the memory goes.
    fn unregister(&self) {
        let generation = {
            let mut registered = self.registered.write().unwrap();
            *registered = false;
            self.generation.fetch_add(1, SeqCst) + 1
        };
        fence(SeqCst); // loom only: see the module docs
        while self.gate.load(SeqCst) < generation {
            thread::yield_now(); // the real loop sleeps GATE_POLL_INTERVAL
        }
        self.buffer.with_mut(|b| unsafe { *b = 0xdead }); // SAFETY: what the model checks
    }
}

/// `MemoryView::check` (with `acquire`/`publish`), the operation's I/O, then `release`.
/// `second_look: false` drops the re-check of the generation after publishing: the bug the
/// handshake exists to prevent, to prove the model can fail.
fn serve_one(served: &Served, view: &mut View, second_look: bool) -> Option<u64> {
    loop {
        if served.generation.load(SeqCst) != view.generation {
            *view = served.snapshot();
        }
        if !view.registered {
            return None; // AddressNotRegistered
        }
        served.gate.store(view.generation, SeqCst); // acquire: the oldest in use is ours
        fence(SeqCst); // loom only: see the module docs
        if !second_look || served.generation.load(SeqCst) == view.generation {
            // SAFETY: what the model checks: the lease keeps the buffer registered.
            let got = served.buffer.with(|b| unsafe { *b });
            served.gate.store(NONE_IN_USE, SeqCst); // release
            return Some(got);
        }
        served.gate.store(NONE_IN_USE, SeqCst); // release, then start over
    }
}

fn model(second_look: bool, stale_view: bool) {
    loom::model(move || {
        let served = Arc::new(Served {
            registered: RwLock::new(true),
            generation: AtomicU64::new(1),
            gate: AtomicU64::new(NONE_IN_USE),
            buffer: UnsafeCell::new(7),
        });
        // A stale view starts one generation behind, so the shard refreshes its copy first.
        let mut view = served.snapshot();
        if stale_view {
            view.generation -= 1;
        }
        let shard = {
            let served = served.clone();
            thread::spawn(move || serve_one(&served, &mut view, second_look))
        };
        served.unregister();
        // Served before the unregister (the old bytes) or refused: never the freed bytes.
        let got = shard.join().unwrap();
        assert!(got.is_none() || got == Some(7), "read {got:?}");
    });
}

#[test]
fn loom_memory_gate_unregister_waits_for_operations_checked_before_it() {
    model(true, false);
}

#[test]
fn loom_memory_gate_holds_when_the_shard_refreshes_its_copy() {
    model(true, true);
}

/// Without the second look at the generation, an operation checked against the old table can
/// run after unregister returned: loom must find that interleaving.
#[test]
#[should_panic]
fn loom_memory_gate_without_the_second_look_is_caught() {
    model(false, false);
}
