"""The DRA-manager judge in tests (shim.compat.upstream.dra_manager): its releases, each built
once per session with its control plane, and the resource.k8s.io version each reads claims in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shim.compat.dra_scenarios import claims_version
from shim.compat.upstream import releases as upstream
from shim.compat.upstream.dra_manager import dra_releases
from tests.support import control_plane
from tests.support.toolchains import toolchain

RELEASES = dra_releases()
# The resource.k8s.io version each release's DRA manager reads ResourceClaims through.
CLAIMS_VERSION = {r.minor: claims_version(r.minor) for r in RELEASES}
_built: set[upstream.Release] = set()


def param(release: upstream.Release, default: tuple[upstream.Release, ...]) -> Any:
    """A pytest parameter for `release`, outside the default run unless it is in `default`."""
    marks = () if release in default else (pytest.mark.full_matrix,)
    return pytest.param(release, marks=marks, id=f"1.{release.minor}")


def build(release: upstream.Release) -> Path:
    """The release's dramanager (and its control plane's binaries), built once per session."""
    if release not in _built:
        if not release.built(upstream.DRAMANAGER_PROGRAM):
            toolchain("go", f"the DRA manager judge ({release.name})")
        upstream.build(release, program=upstream.DRAMANAGER_PROGRAM, log=False)
        control_plane.build(release)
        _built.add(release)
    return release.binary(upstream.DRAMANAGER_PROGRAM)
