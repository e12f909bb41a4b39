"""Fixtures of the compat tests (tests/conftest.py has those every directory shares): the
legacy plugins of tests/support/legacy_plugins, built in the run, the adapter's directory, the
upstream judge's harnesses, and the newest release's control plane of the DRA tests (a module
that needs another defines its own `plane`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from shim.compat.realnode import ControlPlane
from shim.compat.upstream import releases as upstream
from tests.support import control_plane
from tests.support.judge import DEFAULT, RELEASES
from tests.support.legacy import GO_PLUGIN, PYTHON_PLUGIN
from tests.support.toolchains import toolchain, unavailable
from tests.support.unix import short_temp_dir


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    """The newest release's kube-apiserver and etcd, one per test module."""
    with control_plane.running(control_plane.DEFAULT[0]) as running:
        yield running


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """The legacy adapter's --kubelet-dir: where its legacy plugin finds kubelet.sock."""
    with short_temp_dir("ds-priv-") as path:
        yield path


@pytest.fixture(scope="module")
def stubs() -> Iterator[Path]:
    """The Python legacy plugin's own generated stubs, as its vendor would build them."""
    with tempfile.TemporaryDirectory(prefix="ds-stubs-", ignore_cleanup_errors=True) as out:
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{PYTHON_PLUGIN}", f"--python_out={out}",
             f"--grpc_python_out={out}", "api.proto"],
            check=True,
        )  # fmt: skip
        yield Path(out)


@pytest.fixture(scope="module")
def goplug() -> Iterator[Path]:
    """The Go legacy plugin, built in the run; skipped where Go is missing unless CI requires it."""
    toolchain("go", "the Go legacy plugin (tests/support/legacy_plugins/go)")
    with tempfile.TemporaryDirectory(prefix="ds-go-", ignore_cleanup_errors=True) as out:
        binary = Path(out) / "goplug"
        subprocess.run(["bash", str(GO_PLUGIN / "build.sh"), str(binary)], check=True, timeout=900)
        yield binary


@pytest.fixture(scope="session")
def judge(request: pytest.FixtureRequest) -> dict[upstream.Release, Path]:
    """The upstream judge's harnesses of the run's releases (the default pair, or all with
    --full-matrix), built or found in the cache; cells upgrade and downgrade between these.
    test_upstream_judge.py's first test builds them under a timeout long enough for a cold Go
    cache."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        unavailable("the upstream judge needs root and unshare(1): its harnesses run in mount namespaces")
    toolchain("go", "the upstream judge's harnesses (src/shim/compat/upstream/judges)")
    chosen = RELEASES if request.config.getoption("--full-matrix") else DEFAULT
    return {release: upstream.build(release, log=False) for release in chosen}
