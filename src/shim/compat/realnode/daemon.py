"""What the real node's daemons (etcd, kube-apiserver, kube-scheduler) share: how each is
started in its own session with its output in a log, stopped, and used with ``with`` (``Started``,
which the node and the connected node follow too)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Self

# kube-apiserver does not exit on SIGTERM while a client holds a watch open (seen: still up after
# 15 s, devshim watching its slices); its state is etcd's, so killing it then loses nothing.
STOP_GRACE_S = 5.0


def spawn(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """``argv`` started in a session of its own (so its children go with it), output to ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def terminate(process: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, SIGKILL after STOP_GRACE_S; it has exited when this returns."""
    if process is None:
        return
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait()


class Started:
    """``start`` brings it up whole or not at all (on a failure what did start is stopped
    again); ``with`` starts it, and stops it however the block ends. ``stop`` may be called
    whatever has started."""

    def _start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
