"""SIGUSR1, for the test drivers a test signals to misbehave on cue: the action runs on a thread.

A Python signal handler runs only once the main thread is back in the interpreter. These drivers'
main threads block reading stdin, and a signal that lands after the interpreter's last check but
before read(2) blocks is handled only when the next line arrives (PEP 475's window): on a busy
machine the test then waits out its timeout. So SIGUSR1 is blocked in every thread and taken by
one of its own with sigwait, which cannot miss it; the drivers' writes to stdout hold a lock.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


def on_sigusr1(action: Callable[[], None]) -> None:
    """Run ``action`` on its own thread at each SIGUSR1. Call it before any other thread starts
    (threads inherit the blocked signal)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

    def wait() -> None:
        while True:
            signal.sigwait({signal.SIGUSR1})
            action()

    threading.Thread(target=wait, name="sigusr1", daemon=True).start()
