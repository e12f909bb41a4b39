"""A device plugin that leaves a process behind, out of reach of a kill of its process group.

    leaving.py PID_FILE setsid|daemon

``setsid``: its child calls setsid() (a session and process group of its own) and sleeps; the
plugin stays its parent until stopped. ``daemon``: that child forks the sleeper and exits at once,
so the sleeper is an orphan while the plugin still runs (a classic double-fork daemon). The
sleeper appends its pid to PID_FILE, then sleeps. The plugin itself never serves: it waits to be
stopped, which is all a compat cell needs to start and stop it.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def sleeper(pid_file: str) -> None:
    with open(pid_file, "a") as out:
        out.write(f"{os.getpid()}\n")
    while True:
        time.sleep(3600)


def main() -> None:
    pid_file, how = sys.argv[1:]
    if how not in ("setsid", "daemon"):
        sys.exit(f"leaving.py: setsid or daemon, not {how!r}")
    if os.fork() == 0:
        os.setsid()
        if how == "setsid" or os.fork() == 0:
            sleeper(pid_file)
        os._exit(0)
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
