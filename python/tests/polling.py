"""Waiting for a condition instead of sleeping for a guess.

A test that needs something to have happened (a peer to exit, a thread to block, bytes to
land) polls that condition with a deadline and fails naming it, rather than sleeping a fixed
time and hoping. Plain module (no pytest import) so the `*_worker.py` scripts use it too.
"""

import os
import time


def wait_until(pred, timeout, what, interval=0.01):
    """Polls `pred()` until it is true; raises AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def process_gone(pid):
    """True once `pid` has exited: no such process, or a zombie (its files, locks and sockets
    are already closed; only the parent's wait is missing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")


def process_stopped(pid):
    """True once every thread of `pid` is stopped (SIGSTOP). `kill` only queues the stop: a
    thread spinning in user space (a storage node's polling shard) runs on until its next
    entry into the kernel, so it may still answer a request sent right after the signal."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        states = []
        for t in tasks:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return bool(states) and all(s in ("T", "t") for s in states)
