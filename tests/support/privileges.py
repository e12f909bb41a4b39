"""Running things as another user: user nobody, and root without the capabilities to switch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.support import DRIVERS

HARDENED = DRIVERS / "hardened.py"
NOBODY, NOGROUP = 65534, 65534


def python_for_nobody() -> str | None:
    """A Python that user nobody can run the test driver (drivers/hardened.py) with (devshim's own
    may sit in a directory nobody cannot enter), or None."""
    if os.geteuid() != 0:
        return None
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        # The child drops to nobody itself (see connect_as_nobody in test_sockets_hardening.py),
        # then runs the same interpreter again as nobody.
        check = f"open({str(HARDENED)!r}).close()"
        drop = f"import os\nos.setgroups([])\nos.setgid({NOGROUP})\nos.setuid({NOBODY})\n"
        run = f"os.execv({candidate!r}, [{candidate!r}, '-I', '-c', {check!r}])"
        probe = [candidate, "-I", "-c", drop + run]
        try:
            done = subprocess.run(probe, capture_output=True)
        except OSError:
            continue
        if done.returncode == 0:
            return candidate
    return None


NOBODY_PYTHON = python_for_nobody()
needs_nobody = pytest.mark.skipif(
    NOBODY_PYTHON is None, reason="needs root and a Python that user nobody can run the driver with"
)


def can_drop_capabilities() -> bool:
    """Root, with setpriv allowed to drop capabilities from the bounding set (CAP_SETPCAP)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return False
    probe = [setpriv, "--bounding-set=-setuid,-setgid,-chown", "--", sys.executable, "-c", "pass"]
    return subprocess.run(probe, capture_output=True).returncode == 0
