//! Offload yields the CPU to the work a user waits for.
//!
//! An eager offload writes every put's object to disk in the background: per object a crc
//! pass over its bytes, a new file and a direct write. On a small machine that work competes
//! with the puts themselves for the cores. So a worker runs its writes at a lower CPU
//! priority (nice [`DISK_WRITE_NICE`]) and its reads, which a reader waits for, at the
//! normal one: under contention offload falls behind and catches up when the puts pause
//! (an object waiting for its disk copy keeps its memory meanwhile). Measured on this
//! project's 2-core VM during a burst of 900 4 MiB puts into a prefaulted node: the node's
//! CPU time inside the burst went from 0.22-0.26 s to 0.14-0.15 s.
//!
//! Linux keeps a nice value per thread. Raising it is always allowed; lowering it back
//! needs `CAP_SYS_NICE` (or an `RLIMIT_NICE` that permits it). A worker probes that once at
//! start, on a throwaway thread: where it cannot come back, it never lowers its priority at
//! all (reads must not be stuck at the writes' priority), and says so once in the log.

use super::limits::DISK_WRITE_NICE;

/// A worker thread's priority switch.
pub(super) struct Priority {
    /// Whether this thread can go back from background to normal priority.
    can_switch: bool,
    background: bool,
    /// The thread's nice value at start: its normal priority.
    normal: i32,
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

impl Priority {
    /// Probes whether the calling (worker) thread could lower its priority and raise it
    /// back, on a short-lived thread of the same priority (so a failed way back strands
    /// nobody).
    pub(super) fn probe() -> Priority {
        let normal = nice_now();
        let can_switch = std::thread::spawn(move || {
            normal < DISK_WRITE_NICE && set_nice(DISK_WRITE_NICE) && set_nice(normal)
        })
        .join()
        .unwrap_or(false);
        static SAID: std::sync::Once = std::sync::Once::new();
        if !can_switch {
            SAID.call_once(|| {
                tracing::info!(
                    "disk tier: offload writes run at the same CPU priority as reads (a \
                     thread cannot raise its priority back without CAP_SYS_NICE)"
                )
            });
        }
        Priority {
            can_switch,
            background: false,
            normal,
        }
    }

    /// Runs the next operation in the background (a write) or not (a read, a delete).
    pub(super) fn set_background(&mut self, background: bool) {
        if !self.can_switch || background == self.background {
            return;
        }
        let nice = if background {
            DISK_WRITE_NICE
        } else {
            self.normal
        };
        if set_nice(nice) {
            self.background = background;
        } else {
            // Lost the right to switch (a changed limit): stay where we are, and do not try
            // again with every operation.
            self.can_switch = false;
        }
    }
}
