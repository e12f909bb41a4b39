"""`devshim demo`: the whole path on a machine with no kubelet.

The fake kubelet (shim.compat.fakekubelet) and the simulated driver (devshim_adapters.sim,
a real subprocess) meet devshim over real unix sockets in a temporary directory;
each step prints what the kubelet saw, and a line for each term it shows first.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from shim.bootstrap import Shim
from shim.compat.fakekubelet import FakeKubelet
from shim.settings import Settings

GPU = "example.com/demo-gpu"
NIC = "example.com/demo-nic"
SIM_CONFIG: dict[str, Any] = {
    "resources": [
        {
            "name": GPU,
            "devices": [
                {"id": "gpu-a", "numa_nodes": [0]},
                {"id": "gpu-b", "numa_nodes": [0]},
                {"id": "gpu-c", "numa_nodes": [1]},
            ],
            "grant_mode": "per_call",
            "grant": {
                "envs": {"DEMO_GPUS": "{ids}"},
                # Each simulated GPU is /dev/null here: the grant policy wants a character device.
                "device_nodes": [{"container_path": "/dev/demo-{id}", "host_path": "/dev/null"}],
                "cdi_devices": ["example.com/demo-gpu={id}"],
            },
            "preferred_allocation": True,
            "prestart": True,
        },
        {
            "name": NIC,
            "count": 2,
            "id_prefix": "nic-",
            "grant_mode": "declared",
            "grant": {
                "envs": {"DEMO_NICS": "{ids}"},
                "mounts": [
                    {"container_path": "/opt/demo-nic", "host_path": "/opt/demo-nic", "read_only": True}
                ],
            },
        },
    ],
}


# The demo is often a newcomer's first sight of the device-plugin API: each term it shows is
# explained in one line, under the step where it first appears (pattern -> explanation).
TERMS = {
    "registered": "registered: devshim called Register on kubelet.sock, naming the resource and its socket",
    "v1beta1": "v1beta1: the device-plugin API version that the kubelet and devshim agreed on",
    "preferred allocation": "preferred allocation: the kubelet asks which free devices the plugin prefers",
    "pre-start": "pre-start: PreStartContainer, a call just before a container starts, to ready its devices",
    "ListAndWatch": "ListAndWatch: the stream on which the kubelet gets every device, again at each change",
    "NUMA": "NUMA: the memory node a device is nearest; the kubelet can keep a pod's devices on one",
    "Unhealthy": "Unhealthy: still counted in the node's capacity, but given to no pod until Healthy again",
    "Allocate": "Allocate: the kubelet asks what a container needs to use the devices it has chosen",
    "grant": "grant: the answer to Allocate (env, device nodes, mounts, CDI devices) for the runtime",
    "^device ": "device HOST -> CONTAINER: left, the host's device node; right, where the container sees it",
    "^mount ": "mount HOST -> CONTAINER: left, the host's directory; right, where the container sees it",
    "^CDI ": "CDI: a Container Device Interface name the runtime looks up in the node's specs (/etc/cdi)",
}
STAND_INS = (
    "Nothing on this machine is touched: the host paths below are stand-ins (each GPU is /dev/null, "
    "/opt/demo-nic is never mounted), and no container starts."
)


def show_devices(devices: Sequence[Any]) -> str:
    return "  ".join(
        f"{d.id} {d.health}" + (f" (NUMA {','.join(map(str, d.numa_nodes))})" if d.numa_nodes else "")
        for d in devices
    )


def show_grant(grant: Any) -> list[str]:
    lines = [f"env {k}={v}" for k, v in grant.envs.items()]
    lines += [f"device {host} -> {container} ({perms})" for container, host, perms in grant.device_nodes]
    lines += [f"mount {host} -> {container}{' (ro)' if ro else ''}" for container, host, ro in grant.mounts]
    lines += [f"CDI {name}" for name in grant.cdi_devices]
    return lines


class Steps:
    """Numbered steps, each term of TERMS explained under the first step that shows it."""

    def __init__(self, out: Callable[[str], None]) -> None:
        self._out = out
        self._n = 0
        self._unexplained = dict(TERMS)

    def step(self, title: str, *details: str) -> None:
        self._n += 1
        self._out(f"{self._n}. {title}")
        for line in details:
            self._out(f"     {line}")
        lines = [title, *details]
        found = []
        for pattern in list(self._unexplained):
            where = [(i, m.start()) for i, line in enumerate(lines) if (m := re.search(pattern, line))]
            if where:
                found.append((where[0], self._unexplained.pop(pattern)))
        for _, explanation in sorted(found):
            self._out(f"     * {explanation}")


async def demo(out: Callable[[str], None] = print) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="devshim-demo-", dir="/tmp"))
    plugin_dir = workdir / "device-plugins"
    control = workdir / "sim-control"
    control.touch()
    config = workdir / "sim.yaml"
    config.write_text(yaml.safe_dump({**SIM_CONFIG, "control_file": str(control)}))
    settings = Settings.load(
        device_plugins_dir=plugin_dir,
        state_dir=workdir / "state",
        drivers=[
            {
                "name": "sim",
                "command": [sys.executable, "-m", "devshim_adapters.sim", "--config", str(config)],
                "resources": [GPU, NIC],
                # As the caller: its files are in a folder of the caller's alone (on a node, a
                # root devshim runs a driver as nobody unless told, docs/configuration.md).
                **({"user": "root"} if os.geteuid() == 0 else {}),
                # What each resource's grants may hold: nothing is allowed unless declared.
                "resource_policies": {
                    GPU: {
                        "envs": ["DEMO_GPUS"],
                        "device_nodes": ["/dev/null"],
                        "cdi_kinds": [GPU],
                    },
                    NIC: {"envs": ["DEMO_NICS"], "mounts": ["/opt/demo-nic"]},
                },
            }
        ],
    )
    steps = Steps(out)
    out(f"devshim demo: fake kubelet + simulated driver in {workdir}")
    out(STAND_INS)
    out("Lines starting with * explain a term where it first appears.")
    try:
        async with FakeKubelet(plugin_dir) as kubelet, Shim(settings):
            for resource in (GPU, NIC):
                record = await kubelet.wait_for_registration(resource)
                session = await kubelet.wait_for_plugin(resource)
                opts = session.options
                steps.step(
                    f"registered {resource} ({record.version}) on {record.endpoint}",
                    f"preferred allocation: {'yes' if opts.get_preferred_allocation_available else 'no'}, "
                    f"pre-start: {'yes' if opts.pre_start_required else 'no'}",
                )
            gpu, nic = kubelet.plugin(GPU), kubelet.plugin(NIC)
            steps.step(f"ListAndWatch {GPU}", show_devices(await gpu.wait_for_list()))
            steps.step(f"ListAndWatch {NIC}", show_devices(await nic.wait_for_list()))
            with control.open("a") as commands:
                commands.write(f"health {GPU} gpu-b Unhealthy\n")
            flipped = await gpu.wait_for_list(lambda ds: any(d.id == "gpu-b" and not d.healthy for d in ds))
            steps.step("driver flipped gpu-b to Unhealthy: a new full list arrived", show_devices(flipped))
            chosen, grant = await gpu.admit(2)
            passed_over = [
                f"{d.id} not chosen: it is Unhealthy, and the kubelet allocates only Healthy devices"
                for d in flipped
                if not d.healthy and d.id not in chosen
            ]
            steps.step(
                f"admitted a pod needing 2 of {GPU}: preferred allocation, then Allocate; the grant:",
                f"devices {', '.join(chosen)}",
                *passed_over,
                *show_grant(grant),
            )
            chosen, grant = await nic.admit(2)
            steps.step(
                f"admitted a pod needing 2 of {NIC}: declared grants, so devshim answers without the driver",
                f"devices {', '.join(chosen)}",
                *show_grant(grant),
            )
            start = time.perf_counter()
            await gpu.prestart(["gpu-a"])
            steps.step(
                f"PreStartContainer for gpu-a answered in {(time.perf_counter() - start) * 1000:.1f} ms"
            )
        out("done: sockets removed, driver stopped.")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    asyncio.run(demo())
