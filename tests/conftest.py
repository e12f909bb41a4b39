"""Fixtures shared by every test directory."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A fresh device-plugins directory with a short path.

    Unix socket paths must fit in sun_path (108 bytes with the NUL), and pytest's tmp_path is
    often longer than that once a socket name is appended.
    """
    path = Path(tempfile.mkdtemp(prefix="ds-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """devshim's own state directory for one test (never the real /var/lib/devshim)."""
    path = Path(tempfile.mkdtemp(prefix="ds-state-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
