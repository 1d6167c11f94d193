//! Offload takes only the CPU nobody else wants.
//!
//! An eager offload writes every put's object to disk in the background: per object a crc
//! pass over its bytes, a new file and a direct write. On a small machine that work competes
//! with the puts themselves for the cores. So a worker runs its writes under Linux's
//! `SCHED_IDLE` policy (a thread that runs only when no normal thread of the machine wants
//! the core) and its reads, which a reader waits for, under the normal one: during a burst
//! of puts offload falls behind, and catches up as soon as the cores idle (an object waiting
//! for its disk copy keeps its memory meanwhile, and the master's offload queue limit bounds
//! how many wait). Pings and the data plane run on other threads at normal priority, so
//! offload never starves them. Nice 10, the first try, still weighs about a tenth of a
//! normal thread on a contended core (the scheduler's weights: 110 against 1024; a
//! `SCHED_IDLE` thread weighs 3): `bench/README.md`, "Where eager offload's cost goes".
//!
//! Linux keeps a policy per thread. Entering `SCHED_IDLE` is always allowed; leaving it
//! needs `CAP_SYS_NICE` (or an `RLIMIT_NICE` that permits the thread's nice value). A
//! worker probes that once at start, on a throwaway thread: where it cannot come back, it
//! falls back to nice [`DISK_WRITE_NICE`] if it can leave that, else stays at normal
//! priority (reads must not be stuck at the writes' priority), and says so once in the log.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;

use super::config::WritePriority;
use super::limits::DISK_WRITE_NICE;

/// How a worker runs its background work.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Background {
    /// `SCHED_IDLE`.
    Idle,
    /// `SCHED_OTHER` at nice [`DISK_WRITE_NICE`].
    Nice,
    /// No switch: the thread's priority as it started.
    Same,
}

/// A worker thread's priority switch.
pub(super) struct Priority {
    mode: Background,
    /// Whether the thread may be at background priority now (a caller may have raised it
    /// since: [`Urgent::arrive`]).
    background: bool,
    /// The thread's nice value at start: its normal priority.
    normal: i32,
    urgent: Arc<Urgent>,
    tid: libc::pid_t,
}

/// What a worker's callers share with it: how many of them wait for something other than
/// a write, and which thread to raise when one arrives while a write runs in the
/// background (the queue is first come first served: a read behind a background write
/// would otherwise wait at the write's priority).
#[derive(Default)]
pub(super) struct Urgent {
    waiting: AtomicUsize,
    /// The worker's thread id while it may be at background priority, else 0.
    background_tid: AtomicI32,
    /// The worker's normal nice value.
    normal: AtomicI32,
}

impl Urgent {
    /// A caller is about to queue a read or a delete.
    pub(super) fn arrive(&self) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let tid = self.background_tid.load(Ordering::SeqCst);
        if tid != 0 {
            raise(tid, self.normal.load(Ordering::SeqCst));
        }
    }

    /// The worker took a read or a delete off its queue (or the caller could not queue it).
    pub(super) fn taken(&self) {
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    fn waiting(&self) -> bool {
        self.waiting.load(Ordering::SeqCst) > 0
    }
}

/// Puts thread `tid` of this process back at normal priority (`SCHED_OTHER`, nice
/// `nice`). Best effort: the worker also raises itself when it sees a caller waiting.
fn raise(tid: libc::pid_t, nice: i32) {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: syscalls on one thread of this process, reading one `sched_param` that lives
    // across the call. A thread that has exited meanwhile makes them fail with ESRCH.
    unsafe {
        libc::sched_setscheduler(tid, libc::SCHED_OTHER, &param);
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice);
    }
}

/// Sets the calling thread's nice value (Linux: `PRIO_PROCESS` with 0 is the calling
/// thread, not the process).
fn set_nice(nice: i32) -> bool {
    // SAFETY: a plain syscall on the calling thread; no memory is passed.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) == 0 }
}

fn nice_now() -> i32 {
    // SAFETY: as above. -1 is also a valid answer; errors are not expected for the caller.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }
}

/// Sets the calling thread's scheduling policy (`SCHED_IDLE` or `SCHED_OTHER`; pid 0 is the
/// calling thread). The nice value is kept.
fn set_policy(policy: libc::c_int) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a syscall on the calling thread reading one `sched_param` that lives across it.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

/// The calling thread's scheduling policy.
pub(super) fn policy_now() -> libc::c_int {
    // SAFETY: a plain syscall on the calling thread.
    unsafe { libc::sched_getscheduler(0) }
}

/// Whether a thread could enter `mode` and come back, tried on a throwaway thread of the
/// caller's priority (so a failed way back strands nobody).
fn can_switch(mode: Background, normal: i32) -> bool {
    std::thread::spawn(move || match mode {
        Background::Idle => {
            policy_now() == libc::SCHED_OTHER
                && set_policy(libc::SCHED_IDLE)
                && set_policy(libc::SCHED_OTHER)
        }
        Background::Nice => {
            normal < DISK_WRITE_NICE && set_nice(DISK_WRITE_NICE) && set_nice(normal)
        }
        Background::Same => true,
    })
    .join()
    .unwrap_or(false)
}

impl Priority {
    /// Probes how the calling (worker) thread can step aside for background work as
    /// `asked` and come back: `SCHED_IDLE`, else nice, else not at all.
    pub(super) fn probe(asked: WritePriority, urgent: Arc<Urgent>) -> Priority {
        let normal = nice_now();
        let tries: &[Background] = match asked {
            WritePriority::Idle => &[Background::Idle, Background::Nice],
            WritePriority::Nice => &[Background::Nice],
            WritePriority::Normal => &[],
        };
        let mode = tries
            .iter()
            .copied()
            .find(|&m| can_switch(m, normal))
            .unwrap_or(Background::Same);
        static SAID: std::sync::Once = std::sync::Once::new();
        if mode != Background::Idle && asked == WritePriority::Idle {
            SAID.call_once(|| {
                tracing::info!(
                    "disk tier: offload writes run {} (a thread cannot leave SCHED_IDLE \
                     without CAP_SYS_NICE)",
                    if mode == Background::Nice {
                        "at nice 10, not SCHED_IDLE"
                    } else {
                        "at the same CPU priority as reads"
                    }
                )
            });
        }
        urgent.normal.store(normal, Ordering::SeqCst);
        Priority {
            mode,
            background: false,
            normal,
            urgent,
            // SAFETY: a plain syscall without arguments.
            tid: unsafe { libc::gettid() },
        }
    }

    /// How this worker steps aside.
    #[cfg(test)]
    pub(super) fn mode(&self) -> Background {
        self.mode
    }

    /// Runs the next operation in the background (a write) or not (a read, a delete). A
    /// write runs in the foreground while a caller waits behind it.
    pub(super) fn set_background(&mut self, background: bool) {
        if self.mode == Background::Same {
            return;
        }
        if !background || self.urgent.waiting() {
            self.foreground();
            return;
        }
        // Published before stepping aside, so that a caller arriving from here on raises
        // us; one that arrived before is seen by the check after.
        self.urgent.background_tid.store(self.tid, Ordering::SeqCst);
        let done = match self.mode {
            Background::Idle => set_policy(libc::SCHED_IDLE),
            _ => set_nice(DISK_WRITE_NICE),
        };
        self.background = true;
        if !done {
            // Lost the right to switch (a changed limit): stay where we are, and do not try
            // again with every operation.
            self.foreground();
            self.mode = Background::Same;
        } else if self.urgent.waiting() {
            self.foreground();
        }
    }

    /// Back to normal priority.
    fn foreground(&mut self) {
        self.urgent.background_tid.store(0, Ordering::SeqCst);
        if !self.background {
            return;
        }
        let done = match self.mode {
            Background::Idle => set_policy(libc::SCHED_OTHER),
            _ => set_nice(self.normal),
        };
        self.background = !done;
    }
}
