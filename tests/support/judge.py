"""The releases the upstream judge's tests run: the oldest and the newest devshim carries by
default, every one with --full-matrix (the `judge` fixture of tests/compat/conftest.py builds them)."""

from __future__ import annotations

from shim.compat.upstream.releases import releases

RELEASES = releases()
DEFAULT = (RELEASES[0], RELEASES[-1])
