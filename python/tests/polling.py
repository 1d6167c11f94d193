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
