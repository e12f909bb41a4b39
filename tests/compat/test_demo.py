"""`devshim demo` end to end, as a new user runs it: a real process, a real sim driver."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def run_demo() -> str:
    result = subprocess.run(
        [sys.executable, "-m", "shim", "demo"], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_demo_shows_every_step_with_the_sims_own_values() -> None:
    """Register, list, health flip, per-call and declared allocation, pre-start: each line carries
    values only the demo's sim configuration produces, so canned output cannot pass; the demo
    cleans up its temporary directory."""
    out = run_demo()
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


# A term as the demo's steps first show it, and how the line explaining it begins.
EXPLAINED = {
    "ListAndWatch": "* ListAndWatch: ",
    "NUMA": "* NUMA: ",
    "pre-start": "* pre-start: PreStartContainer, ",
    "Unhealthy": "* Unhealthy: ",
    "Allocate": "* Allocate: ",
    "grant": "* grant: ",
    "CDI": "* CDI: ",
    "device /": "* device HOST -> CONTAINER: ",
    "mount /": "* mount HOST -> CONTAINER: ",
}


def test_the_demo_explains_each_term_once_under_the_step_that_first_shows_it() -> None:
    """A newcomer meets ListAndWatch, Allocate, PreStartContainer, grants, CDI and NUMA here:
    each is explained in one line, once, in the step where it first appears (not before, not
    later); the device and mount lines say which side is the host's; the step that allocates
    says why the Unhealthy gpu-b was not chosen; and the demo warns that its host paths are
    stand-ins before any step shows one."""
    out = run_demo()
    lines = out.splitlines()
    steps = [i for i, line in enumerate(lines) if re.match(r"\d+\. ", line)]

    def step_of(index: int) -> int:
        return max(i for i in steps if i <= index)

    for term, head in EXPLAINED.items():
        explanations = [i for i, line in enumerate(lines) if line.strip().startswith(head)]
        assert len(explanations) == 1, f"{term!r} explained {len(explanations)} times:\n{out}"
        shown = next(
            i
            for i, line in enumerate(lines)
            if i >= steps[0] and term in line and not line.strip().startswith("*")
        )
        assert step_of(explanations[0]) == step_of(shown) and explanations[0] > shown, (term, out)
    assert "left, the host's" in out and "right, where the container sees it" in out

    allocated = next(i for i, line in enumerate(lines) if "devices gpu-a, gpu-c" in line)
    why = [line.strip() for line in lines[step_of(allocated) : allocated + 3] if "gpu-b" in line]
    assert why == ["gpu-b not chosen: it is Unhealthy, and the kubelet allocates only Healthy devices"], out

    warning = next(i for i, line in enumerate(lines) if "Nothing on this machine is touched" in line)
    assert warning < steps[0] and "stand-ins" in lines[warning] and "/dev/null" in lines[warning]
