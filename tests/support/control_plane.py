"""The control plane (shim.compat.realnode.controlplane) in tests: which releases run, their binaries
built once per session, a running control plane per test or module, and what "nothing left"
means for it.

Building kube-apiserver and etcd takes minutes cold (docs/real-node.md, "A control plane"); the
first test that needs a release builds it, later ones find it in the judge's cache. Where Go or
openssl is missing the tests skip, or fail under DEVSHIM_REQUIRE_TOOLS=1.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shim.compat.realnode import ControlPlane
from shim.compat.realnode.controlplane import apiserver_releases
from shim.compat.upstream import releases as upstream
from tests.support.toolchains import toolchain
from tests.support.unix import short_temp_dir

APISERVERS = apiserver_releases()
DEFAULT = (APISERVERS[-1],)  # the newest; --full-matrix adds the others
# The searches and storms of issue 42 run at both ends of the range by default.
BOTH_ENDS = (APISERVERS[0], APISERVERS[-1])
# The newest resource.k8s.io (DRA) version each release serves, as the fixture configures it.
NEWEST_DRA = {33: "v1beta2", 34: "v1", 37: "v1"}
_built: set[upstream.Release] = set()


def param(release: upstream.Release, default: Sequence[upstream.Release] = DEFAULT) -> Any:
    """A pytest parameter for `release`, outside the default run unless it is in `default`."""
    marks = () if release in default else (pytest.mark.full_matrix,)
    return pytest.param(release, marks=marks, id=f"1.{release.minor}")


def build(release: upstream.Release) -> None:
    """The release's kube-apiserver and its etcd, built (or found in the cache) once per session."""
    if release in _built:
        return
    etcd = upstream.etcd_for(release)
    if not (release.built(upstream.APISERVER_PROGRAM) and etcd.built()):
        toolchain("go", f"the control plane's kube-apiserver and etcd ({release.name}, etcd {etcd.version})")
    toolchain("openssl", "the control plane's certificates (shim.compat.realnode.certs)")
    upstream.build(release, program=upstream.APISERVER_PROGRAM, log=False)
    upstream.build_etcd(etcd, log=False)
    _built.add(release)


@contextmanager
def running(
    release: upstream.Release, prefix: str = "ds-cp-", gates_on: Sequence[str] = ()
) -> Iterator[ControlPlane]:
    """A control plane of `release` in a fresh folder, stopped (and the folder removed) after."""
    build(release)
    with short_temp_dir(prefix) as folder, ControlPlane(release.minor, folder, gates_on=gates_on) as plane:
        yield plane


def processes_naming(folder: Path) -> list[int]:
    """The processes whose command line names `folder` (the control plane's daemons do)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(folder) in (proc / "cmdline").read_bytes().decode(
                errors="replace"
            ):
                found.append(int(proc.name))
        except OSError:
            continue  # exited while we looked
    return found


def listening(port: int) -> bool:
    """Whether anything accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def resource_slice(version: str, name: str, node: str, driver: str = "gpu.example.com") -> dict[str, Any]:
    """A ResourceSlice of `driver`'s one device, `gpu-0`, in resource.k8s.io/`version`'s shape."""
    attributes = {"model": {"string": "sim-gpu"}}
    # v1beta1 wraps a device's fields in `basic`; v1beta2 and v1 do not.
    device = {
        "name": "gpu-0",
        **({"basic": {"attributes": attributes}} if version == "v1beta1" else {"attributes": attributes}),
    }
    return {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [device],
        },
    }
