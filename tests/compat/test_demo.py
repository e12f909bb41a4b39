"""`devshim demo` end to end, as a new user runs it: a real process, a real sim driver."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_the_demo_shows_every_step_with_the_sims_own_values() -> None:
    """Register, list, health flip, per-call and declared allocation, pre-start: each line carries
    values only the demo's sim configuration produces, so canned output cannot pass; the demo
    cleans up its temporary directory."""
    result = subprocess.run(
        [sys.executable, "-m", "shim", "demo"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    expected = [
        "registered example.com/demo-gpu (v1beta1) on devshim-example.com_demo-gpu-",
        "preferred allocation: yes, pre-start: yes",
        "gpu-a Healthy (NUMA 0)  gpu-b Healthy (NUMA 0)  gpu-c Healthy (NUMA 1)",
        "nic-0 Healthy  nic-1 Healthy",
        "gpu-a Healthy (NUMA 0)  gpu-b Unhealthy (NUMA 0)  gpu-c Healthy (NUMA 1)",
        "devices gpu-a, gpu-c",
        "env DEMO_GPUS=gpu-a,gpu-c",
        "device /dev/null -> /dev/demo-gpu-c (rw)",
        "CDI example.com/demo-gpu=gpu-a",
        "env DEMO_NICS=nic-0,nic-1",
        "mount /opt/demo-nic -> /opt/demo-nic (ro)",
        "PreStartContainer for gpu-a answered in",
    ]
    for line in expected:
        assert line in out, f"missing {line!r} in demo output:\n{out}"
    workdir = re.search(r"in (/tmp/devshim-demo-\S+)", out)
    assert workdir is not None
    assert not Path(workdir.group(1)).exists()
