"""The Kubernetes API client (kr8s, and httpx under it: 36 MB of a process's RSS here) is
imported only by what talks to the API server: DRA and the per-node configs. `devshim run`
without them pays none of it (a regression the nodecost row found: the per-node configs'
module, imported by the CLI, once took an idle devshim from 59 to 80 MB)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import shim.cli, shim.runtime, shim.bootstrap, shim.nodeconfig
print(sorted(m for m in ("kr8s", "httpx", "shim.dra.kube") if m in sys.modules))
"""


def test_devshim_run_loads_no_api_client_until_it_needs_one() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
